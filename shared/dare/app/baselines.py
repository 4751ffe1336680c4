"""Baselines are discovered by convention: every folder `baselines/<name>/` holding a README.md
(with YAML front matter), an `algorithm.py` and a `config.py`. Nothing registers itself at
import time; `dare train <name>` imports `baselines.<name>.algorithm` and `.config` on demand.

`algorithm.py` names the training recipe it plugs into (`RECIPE = "sft"`, `"preference"` or
`"rl"`) and defines the hooks that recipe calls (the contract: `dare.train.hooks`); `config.py`
defines `Config`, the run's dataclass config with the paper's defaults.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from dare.utils import UserError, load_yaml
from dare.models import FAMILIES
from dare.results import load_results

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
    meta = load_yaml(text[4:end], f"baselines/{name}/README.md front matter") or {}
    if not isinstance(meta, dict):
        raise UserError(f"baselines/{name}/README.md: front matter must be a mapping")
    return meta


def glossary() -> list[dict]:
    """One entry per baseline from its README's front matter (torch-free: the leaderboard's method
    glossary and the docs' method table read it): name, title, summary (the one-line objective), arxiv,
    its link, families, status and the reference code."""
    rows = []
    for name in names():
        meta = front_matter(name)
        arxiv = str(meta.get("arxiv", ""))
        rows.append({"name": name, "title": meta.get("title", ""), "summary": meta.get("summary", ""),
                     "arxiv": arxiv, "url": f"https://arxiv.org/abs/{arxiv}" if arxiv else "",
                     "families": list(meta.get("families") or []), "status": meta.get("status", ""),
                     "reference_code": meta.get("reference_code", "")})
    return rows


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


REQUIRED_FRONT_MATTER = ("name", "title", "summary", "arxiv", "reference_code", "families", "status")
STATUSES = ("verified", "partial", "wip", "stale")
REQUIRED_SECTIONS = ("## Deviations", "## Results")
MAX_ALGORITHM_LINES = 250
TINY_SWEEP = "reproductions/tiny/{family}/{name}.yaml"
"""A baseline's tiny-task sweep (CONTRIBUTING.md section 6): a file of its own, as every baseline since ESPO."""
TINY_RESULTS = "leaderboard/results/tiny-{family}-{name}"
"""Where that sweep is collected: a folder of its own, since a results folder holds one commit's runs."""
BLOCK_MODULES = ("dare.train.noise", "dare.train.estimators", "dare.train.objectives")
"""The shared building blocks' modules; CONTRIBUTING.md lists what they define (`blocks_markdown`)."""


def tiny_family(families) -> str:
    """The family a baseline's tiny-task result is made on: LLaDA (the demo's SFT start) if it applies."""
    families = families if isinstance(families, list) and families else ["llada"]
    return "llada" if "llada" in families else families[0]


def tiny_commands(name: str, family: str) -> list[str]:
    """The two commands that make and collect a baseline's tiny-task result, from a clean committed tree."""
    sweep = TINY_SWEEP.format(family=family, name=name)
    return [f"dare sweep {sweep} --cluster local",
            f"dare sweep collect {sweep} --to {TINY_RESULTS.format(family=family, name=name)}"]


def blocks() -> dict[str, list[str]]:
    """The shared building blocks a baseline may call: per module of `BLOCK_MODULES`, the public functions
    and classes it defines, in its order (what it imports from elsewhere is not its block)."""
    import inspect

    found = {}
    for module in BLOCK_MODULES:
        mod = importlib.import_module(module)
        found[module] = [n for n, obj in vars(mod).items() if not n.startswith("_")
                         and (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == module]
    return found


def blocks_markdown() -> str:
    """`blocks()` as CONTRIBUTING.md lists them (`dare checklist --blocks` prints it)."""
    return "\n".join(f"- `{module}`: " + ", ".join(f"`{n}`" for n in defined) for module, defined in blocks().items())


def folders() -> list[str]:
    """Every folder under baselines/ that looks like a baseline (even an incomplete one)."""
    return sorted(p.name for p in root().iterdir()
                  if p.is_dir() and not p.name.startswith(("_", ".")))


def checklist(name: str, repo: Path | None = None) -> list[str]:
    """What `baselines/<name>/` still lacks before it can be merged (CONTRIBUTING.md); empty when
    complete. Each entry names the file and the missing piece."""
    import re

    repo = repo or root().parent
    folder, problems = root() / name, []
    for f in REQUIRED_FILES:
        if not (folder / f).is_file():
            problems.append(f"baselines/{name}/{f}: missing")
    if problems:
        return problems
    try:
        meta = front_matter(name)
    except UserError as e:
        return [str(e)]
    missing = [k for k in REQUIRED_FRONT_MATTER if k not in meta]
    if missing:
        problems.append(f"baselines/{name}/README.md: front matter lacks {', '.join(missing)}")
    if meta.get("name") != name:
        problems.append(f"baselines/{name}/README.md: front matter name {meta.get('name')!r} is not the folder name")
    if meta.get("status") not in STATUSES:
        problems.append(f"baselines/{name}/README.md: status {meta.get('status')!r} is not one of {list(STATUSES)}")
    families = meta.get("families")
    if not isinstance(families, list) or not families or set(families) - set(FAMILIES):
        problems.append(f"baselines/{name}/README.md: families {families!r} must be a non-empty list of "
                        f"{sorted(FAMILIES)}")
    readme = (folder / "README.md").read_text()
    problems += [f"baselines/{name}/README.md: no '{s}' section" for s in REQUIRED_SECTIONS if s not in readme]
    n_lines = len((folder / "algorithm.py").read_text().splitlines())
    if n_lines > MAX_ALGORITHM_LINES:
        problems.append(f"baselines/{name}/algorithm.py: {n_lines} lines (at most {MAX_ALGORITHM_LINES}: move "
                        "general capabilities into dare)")
    try:
        from dare.train.hooks import bind

        bind(load(name).algorithm, f"baselines/{name}/algorithm.py")
    except ValueError as e:
        problems.append(str(e))
    except Exception as e:  # an import error is a finding, not a crash of the checklist
        problems.append(f"baselines/{name}: cannot be loaded: {e}")
    mention = re.compile(rf"baselines\.{name}\b|[\"']{name}[\"']")
    if not any(mention.search(p.read_text()) for p in (repo / "tests").glob("test_*.py")):
        problems.append(f"baselines/{name}: no test under tests/ imports baselines.{name} or runs it by name")

    valid, _ = load_results(repo / "leaderboard" / "results")
    if not any(r.method.baseline == name for _, r in valid):
        family = tiny_family(meta.get("families"))
        launch, collect = tiny_commands(name, family)
        problems.append(f"baselines/{name}: no valid result JSON for it under leaderboard/results/ (CONTRIBUTING.md "
                        f"section 6: write {TINY_SWEEP.format(family=family, name=name)}, commit, then from the "
                        f"clean tree: {launch}, then {collect})")
    return problems
