"""Baselines are discovered by convention: every folder `baselines/<name>/` holding a README.md
(with YAML front matter), an `algorithm.py` and a `config.py`. Nothing registers itself at
import time; `dare train <name>` imports `baselines.<name>.algorithm` and `.config` on demand.

`algorithm.py` names the training recipe it plugs into (`RECIPE = "sft"` or `"rl"`, see
`dare.train.RECIPES`) and defines the functions that recipe calls; `config.py` defines `Config`,
the run's dataclass config with the paper's defaults.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import yaml

from dare.utils import UserError

REQUIRED_FILES = ("README.md", "algorithm.py", "config.py")


def root() -> Path:
    import baselines

    return Path(list(baselines.__path__)[0])


def names() -> list[str]:
    return sorted(p.name for p in root().iterdir()
                  if p.is_dir() and not p.name.startswith(("_", ".")) and (p / "algorithm.py").is_file())


def front_matter(name: str) -> dict:
    """The YAML front matter of `baselines/<name>/README.md` (torch-free; the leaderboard reads it)."""
    text = (root() / name / "README.md").read_text()
    if not text.startswith("---\n"):
        raise UserError(f"baselines/{name}/README.md: no YAML front matter (a leading '---' block)")
    end = text.find("\n---", 4)
    if end < 0:
        raise UserError(f"baselines/{name}/README.md: front matter is not closed by '---'")
    meta = yaml.safe_load(text[4:end]) or {}
    if not isinstance(meta, dict):
        raise UserError(f"baselines/{name}/README.md: front matter must be a mapping")
    return meta


@dataclass
class Baseline:
    name: str
    folder: Path
    algorithm: ModuleType
    Config: type


def load(name: str) -> Baseline:
    available = names()
    if name not in available:
        close = difflib.get_close_matches(name, available, n=1, cutoff=0.5)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UserError(f"unknown baseline {name!r}{hint}; available: {', '.join(available)}")
    folder = root() / name
    missing = [f for f in REQUIRED_FILES if not (folder / f).is_file()]
    if missing:
        raise UserError(f"baselines/{name}: missing {', '.join(missing)}")
    config = importlib.import_module(f"baselines.{name}.config")
    algorithm = importlib.import_module(f"baselines.{name}.algorithm")
    if not hasattr(config, "Config"):
        raise UserError(f"baselines/{name}/config.py defines no `Config` dataclass")
    return Baseline(name, folder, algorithm, config.Config)
