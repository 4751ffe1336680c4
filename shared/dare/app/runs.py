"""Running a baseline by name: `train("d1", "reproductions/d1/gsm8k.yaml", ["run.seed=1"])`.

Resolves the name to `baselines/<name>/` (`dare.app.baselines`), loads its config (defaults ->
YAML -> overrides), picks the run folder (`run.out_dir`, else `runs/<name>/<key>` where the key
hashes the config and the starting checkpoint, so a rerun reuses or resumes it) and hands
everything to the library's `dare.train.fit.fit`.
"""

from __future__ import annotations

from pathlib import Path

from dare.app import baselines
from dare.config import ConfigError, read_yaml
from dare.config import load as load_config
from dare.train.fit import fit, hooks_of, run_key
from dare.utils import runs_dir, shown_argument, shown_path


def resolve(name: str, config_path: str | Path | None = None, overrides=()):
    """Load and validate the baseline and its config (no model is built): (baseline, cfg, hooks)."""
    b = baselines.load(name)
    data = read_yaml(config_path) if config_path else {}
    declared = data.pop("baseline", None)
    if declared is not None and declared != name:
        raise ConfigError(f"{config_path}: baseline: {declared!r} does not match the requested baseline {name!r}")
    cfg = load_config(b.Config, config_path, overrides, data=data)
    return b, cfg, hooks_of(b.algorithm, cfg, f"baselines/{name}")


def run_dir_of(name: str, cfg) -> Path:
    return Path(cfg.run.out_dir) if cfg.run.out_dir else runs_dir() / name / run_key(cfg)[2][:12]


def train(name: str, config_path: str | Path | None = None, overrides=(), *, force: bool = False) -> Path:
    """Run baseline `name`; returns its run directory (see `dare.train.fit.fit`)."""
    b, cfg, _ = resolve(name, config_path, overrides)
    shown = shown_path(config_path) if config_path else ""
    command = " ".join(["dare", "train", name, *([shown] if shown else []), *map(shown_argument, overrides)])
    return fit(b.algorithm, cfg, run_dir_of(name, cfg), name=name, force=force, command=command,
               config_path=shown, method={"arxiv": baselines.front_matter(name).get("arxiv")})
