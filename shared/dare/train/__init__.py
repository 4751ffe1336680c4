"""Training: recipes that baselines plug into, and `train(name, config, overrides)`.

A recipe is a generic loop that knows nothing about any particular algorithm:

- `sft`: supervised batches (prompt + response) -> `algorithm.sample_noise` (once per step) ->
  `algorithm.loss(model, micro_batch, noise, cfg.algo)`.
- `preference`: (prompt, chosen, rejected) pairs -> `algorithm.logps` of policy and reference on shared
  noise -> `algorithm.loss`.
- `rl`:  prompts -> rollout -> rewards -> `algorithm.advantages` -> noise draws shared by the policy,
  old and reference log-probs -> `algorithm.loss` for `rl.num_iterations` updates per batch.

The baseline's `algorithm.py` sets `RECIPE` to one of the keys of `RECIPES` and defines the
functions listed in that recipe's `REQUIRED`. Optional hooks: `check_config(cfg)` raises
ValueError for combinations the algorithm forbids (checked before any model is built), and the
RL recipe's `rollout_options(algo_cfg)` (decoding settings the algorithm needs, e.g.
`{"record_trajectory": True}`) and `uses_old_logps(algo_cfg)` (False for objectives without an
importance ratio: the old log-probs are then never computed).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from dare.config import ConfigError, config_hash, read_yaml
from dare.config import load as load_config
from dare.config import save as save_config
from dare.models.api import checkpoint_fingerprint
from dare.utils import REPO_ROOT, UserError, atomic_write_json, git_state

RECIPES = {"sft": "dare.train.sft", "preference": "dare.train.preference", "rl": "dare.train.rl"}


def runs_dir() -> Path:
    return Path(os.environ.get("DARE_RUNS", REPO_ROOT / "runs"))


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def resolve(name: str, config_path: str | Path | None = None, overrides=()):
    """Load and validate the baseline and its config (no model is built): (baseline, cfg, recipe)."""
    import importlib

    from dare import baselines

    b = baselines.load(name)
    data = read_yaml(config_path) if config_path else {}
    declared = data.pop("baseline", None)
    if declared is not None and declared != name:
        raise ConfigError(f"{config_path}: baseline: {declared!r} does not match the requested baseline {name!r}")
    cfg = load_config(b.Config, config_path, overrides, data=data)
    recipe_name = getattr(b.algorithm, "RECIPE", None)
    if recipe_name not in RECIPES:
        raise UserError(f"baselines/{name}/algorithm.py: RECIPE = {recipe_name!r}; expected one of {sorted(RECIPES)}")
    recipe = importlib.import_module(RECIPES[recipe_name])
    missing = [fn for fn in recipe.REQUIRED if not callable(getattr(b.algorithm, fn, None))]
    if missing:
        raise UserError(f"baselines/{name}/algorithm.py: the {recipe_name!r} recipe needs {', '.join(missing)}")
    check = getattr(b.algorithm, "check_config", None)  # optional: cross-field rules of the algorithm
    if check is not None:
        try:
            check(cfg)
        except (ValueError, AssertionError) as e:
            raise ConfigError(f"baselines/{name}: invalid config: {e}") from None
    return b, cfg, recipe


def train(name: str, config_path: str | Path | None = None, overrides=(), *, force: bool = False) -> Path:
    """Run baseline `name`; returns its run directory. A finished run with the same config hash (and
    the same starting checkpoint) is reused; an interrupted one resumes from its last checkpoint;
    `force` starts over."""
    from dare.train.common import check_sinks

    b, cfg, recipe = resolve(name, config_path, overrides)
    check_sinks(cfg.run.report_to)
    digest = config_hash(cfg)
    # A run is identified by its config and by the contents of the checkpoint it starts from
    # (the same model.path can hold a different checkpoint later).
    init = cfg.model.path and checkpoint_fingerprint(cfg.model.path)
    key = hashlib.sha256(f"{digest}:{init or ''}".encode()).hexdigest() if init else digest
    run_dir = Path(cfg.run.out_dir) if cfg.run.out_dir else runs_dir() / name / key[:12]
    status_path = run_dir / "run.json"
    status = json.loads(status_path.read_text()) if status_path.is_file() else {}
    if status and (status.get("config_hash"), status.get("init_fingerprint")) != (digest, init or None):
        raise ConfigError(f"{run_dir}: holds a run with another config or starting checkpoint (config hash "
                          f"{status.get('config_hash', '?')[:12]}, this one {digest[:12]}); choose another "
                          f"run.out_dir or delete it")
    if status.get("status") == "done" and (run_dir / "final" / "dare.json").is_file() and not force:
        print(f"[{name}] reusing finished run {run_dir}", flush=True)
        return run_dir
    if force:  # start over: no resuming from the old checkpoints
        for old in ("checkpoints", "final", "metrics.jsonl", "eval"):  # evaluations of the old final model too
            target = run_dir / old
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        status = {}

    main = int(os.environ.get("RANK", "0")) == 0  # under torchrun/Ray only rank 0 writes run files
    run_dir.mkdir(parents=True, exist_ok=True)
    status = {"baseline": name, "config_hash": digest, "init_fingerprint": init or None, "status": "running",
              "started_at": status.get("started_at", now()), "config_path": str(config_path or ""),
              "world_size": int(os.environ.get("WORLD_SIZE", "1"))}
    if main:
        save_config(cfg, run_dir, header=f"dare train {name}" + (f" {config_path}" if config_path else "")
                    + "".join(f" {o}" for o in overrides))
        atomic_write_json(status_path, status)

    t0 = time.perf_counter()
    from dare.train.common import Preempted

    try:
        outcome = recipe.run(cfg, b.algorithm, run_dir, label=name)
    except Preempted as stop:  # checkpointed; a relaunch (SLURM requeue) resumes from it
        if main:
            atomic_write_json(status_path, {**status, "status": "preempted", "preempted_at": now(),
                                            "step": stop.step})
            print(f"[{name}] {stop}; rerun the same command to resume", file=sys.stderr, flush=True)
        raise SystemExit(128 + stop.signum) from None
    commit, dirty = git_state()
    meta = {
        "baseline": name, "config_hash": digest, "run_key": key, "seed": cfg.run.seed, "steps": outcome["steps"],
        "model_name": outcome["model_name"], "family": cfg.model.family,
        "data": outcome["data"], "init": outcome["init"],
        "wall_time_s": round(outcome["elapsed_s"], 2), "git_commit": commit, "git_dirty": dirty,
        "created_at": now(), "config_path": str(config_path or ""),
    }
    from dare.train.common import save_final

    save_final(outcome["engine"], outcome["tokenizer"], run_dir, meta)
    if main:
        status.update(status="done", finished_at=now(), wall_time_s=meta["wall_time_s"],
                      session_time_s=round(time.perf_counter() - t0, 2))
        atomic_write_json(status_path, status)
        print(f"[{name}] done in {meta['wall_time_s']:.0f}s -> {run_dir / 'final'}", flush=True)
    return run_dir
