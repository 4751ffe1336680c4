"""`fit`: run one algorithm in one run folder, from start or from its last checkpoint.

The caller (`dare.app.runs.train`, or any script) hands over the algorithm module (its hooks),
the loaded config and the run folder; `fit` knows no baseline names and no repository folders.
A finished run with the same config and starting checkpoint is reused; an interrupted one resumes
from its last checkpoint; `force` starts over. The folder holds `run.json` (status), the resolved
config, checkpoints, metrics and, at the end, `final/` (the exported model with `dare.json`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType

from dare.config import ConfigError, config_hash, recipe_hash, to_dict
from dare.config import save as save_config
from dare.models.api import checkpoint_fingerprint
from dare.train import preference, rl, sft
from dare.train.checkpoint import Preempted, save_final
from dare.train.loop import Collapsed
from dare.train.metrics import check_sinks
from dare.train.hooks import bind
from dare.utils import UserError, atomic_write_json, environment_fingerprint, git_state, now

RECIPES = {"sft": sft.run, "preference": preference.run, "rl": rl.run}
"""The loop of each recipe a baseline can name in `RECIPE` (hooks: `dare.train.hooks.HOOKS`)."""


def hooks_of(algorithm: ModuleType, cfg, where: str):
    """The algorithm's hooks, with its `check_config` applied to `cfg` (before any model is built)."""
    try:
        hooks = bind(algorithm, where)
    except ValueError as e:
        raise UserError(str(e)) from None
    if cfg.data.unpaired and algorithm.RECIPE != "preference":
        raise ConfigError(f"{where}: data.unpaired: only the preference recipe reads unpaired examples; this is an "
                          f"{algorithm.RECIPE} baseline (leave data.unpaired false)")
    try:
        hooks.check_config(cfg)
    except (ValueError, AssertionError) as e:
        raise ConfigError(f"{where}: invalid config: {e}") from None
    return hooks


def run_key(cfg) -> tuple[str, str | None, str]:
    """(config hash, fingerprint of the starting checkpoint or None, the run's key): a run is
    identified by its config and by the contents of the checkpoint it starts from (the same
    model.path can hold a different checkpoint later)."""
    import hashlib

    digest = config_hash(cfg)
    init = checkpoint_fingerprint(cfg.model.path) if cfg.model.path else None
    return digest, init, hashlib.sha256(f"{digest}:{init}".encode()).hexdigest() if init else digest


def fit(algorithm: ModuleType, cfg, run_dir: str | Path, *, name: str, force: bool = False,
        command: str = "", config_path: str = "", method: dict | None = None) -> Path:
    """Train `algorithm` (a module with the hooks of its recipe) with `cfg` in `run_dir`; returns
    `run_dir`. `name` labels logs and results; `method` (e.g. {"arxiv": ...}) is recorded in the
    exported checkpoint's `dare.json` for the results to cite."""
    hooks = hooks_of(algorithm, cfg, name)
    check_sinks(cfg.run.report_to)
    digest, init, key = run_key(cfg)
    run_dir = Path(run_dir)
    main = int(os.environ.get("RANK", "0")) == 0  # under torchrun/Ray only rank 0 writes run files
    created = _missing_folders(run_dir)  # removed again when the run fails before it has trained
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = hold_run_folder(run_dir, name) if main else None  # before anything in the folder is read or removed
    try:
        status_path = run_dir / "run.json"
        status = json.loads(status_path.read_text()) if status_path.is_file() else {}
        if status and (status.get("config_hash"), status.get("init_fingerprint")) != (digest, init):
            def short(v):
                return v[:12] if v else "none (from scratch)"
            what = ("config" if status.get("config_hash") != digest else "starting checkpoint")
            raise ConfigError(f"{run_dir}: holds a run with another {what} (config hash "
                              f"{short(status.get('config_hash'))}, this one {short(digest)}; starting checkpoint "
                              f"{short(status.get('init_fingerprint'))}, this one {short(init)}); choose another "
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

        status = {"baseline": name, "config_hash": digest, "init_fingerprint": init, "status": "running",
                  "started_at": status.get("started_at", now()), "config_path": config_path,
                  "world_size": int(os.environ.get("WORLD_SIZE", "1")),
                  **({"guards": status["guards"]} if status.get("guards") else {})}  # a resumed run keeps its events
        if main:
            save_config(cfg, run_dir, header=command or f"dare train {name}")
            atomic_write_json(status_path, status)

        t0 = time.perf_counter()
        try:
            outcome = RECIPES[algorithm.RECIPE](cfg, hooks, run_dir, label=name)
        except Preempted as stop:  # checkpointed; a relaunch (SLURM requeue) resumes from it
            if main:
                atomic_write_json(status_path, {**status, "status": "preempted", "preempted_at": now(),
                                                "step": stop.step})
                print(f"[{name}] {stop}; rerun the same command to resume", file=sys.stderr, flush=True)
            raise SystemExit(128 + stop.signum) from None
        except Collapsed as stop:  # a guard stopped it (its event is in run.json's `guards`)
            if main:
                atomic_write_json(status_path, {**_current(status_path, status), "status": "collapsed",
                                                "stopped_at": now(), "reason": str(stop)})
            raise UserError(f"{name}: stopped by a guard at {stop} (run folder {run_dir}: run.json lists the events; "
                            "resuming starts again from its last checkpoint)") from None
        commit, dirty = git_state()
        meta = {
            "baseline": name, "config_hash": digest, "run_key": key, "seed": cfg.run.seed, "steps": outcome["steps"],
            "model_name": outcome["model_name"], "family": cfg.model.family,
            "data": outcome["data"], "init": outcome["init"], "init_fingerprint": init, "method": method or {},
            "wall_time_s": round(outcome["elapsed_s"], 2), "git_commit": commit, "git_dirty": dirty,
            "created_at": now(), "config_path": config_path, "recipe_hash": recipe_hash(cfg),
            "config": to_dict(cfg, hashed_only=True), "command": command or None,
            "fingerprint": environment_fingerprint(),  # hardware, torch's ISA, threads, BLAS, GPU stack, packages, lock
        }
        totals = outcome.get("totals") or {}
        if "rollout_forwards" in totals:  # what an RL run spent (`dare.results.Compute`)
            meta["compute"] = {**{k: int(round(totals[k])) for k in ("rollout_tokens", "rollout_forwards",
                                                                     "train_forwards", "update_tokens")},
                               "wall_time_s": meta["wall_time_s"]}
        save_final(outcome["trainer"], outcome["tokenizer"], run_dir, meta, base=cfg.model.path)
        if main:
            status = _current(status_path, status)  # with what the run added (its guards' events)
            status.update(status="done", finished_at=now(), wall_time_s=meta["wall_time_s"],
                          session_time_s=round(time.perf_counter() - t0, 2))
            atomic_write_json(status_path, status)
            print(f"[{name}] done in {meta['wall_time_s']:.0f}s -> {run_dir / 'final'}", flush=True)
        return run_dir
    except BaseException:
        if main and created and not _trained(run_dir):  # a bad model path, data, ...: leave no empty run behind
            if lock is not None:
                lock.close()
                lock = None
            _remove_folders(created)
        raise
    finally:
        if lock is not None:
            lock.close()


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first ([] when it exists)."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _trained(run_dir: Path) -> bool:
    """Whether a run has anything a rerun resumes from or a person reads: a logged step, a checkpoint, a
    final model. A run that failed before that (while loading its model or data) has none."""
    return ((run_dir / "metrics.jsonl").exists() or (run_dir / "final").exists()
            or any((run_dir / "checkpoints").glob("step_*")))


def _remove_folders(created: list[Path]) -> None:
    """Remove the run folder this call created, then each parent it created if that is empty now (another
    run may have started in one meanwhile)."""
    shutil.rmtree(created[0], ignore_errors=True)
    for parent in created[1:]:
        try:
            parent.rmdir()
        except OSError:
            break


def _current(path: Path, status: dict) -> dict:
    """run.json as the run left it (a guard appends its events there), over `status`."""
    try:
        return {**status, **json.loads(path.read_text())}
    except (OSError, ValueError):
        return status


def hold_run_folder(run_dir: Path, name: str):
    """An exclusive lock on `run_dir/.lock` (flock) for as long as this process lives, so two `dare train`
    never write one run folder at once: the second refuses, naming the holder's pid. The kernel drops the
    lock when the holder exits, however it exits (a `kill -9` leaves nothing stuck). Returns the open file
    (keep it). flock is per machine: processes on other nodes of a shared filesystem are not seen."""
    import fcntl

    handle = open(run_dir / ".lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise UserError(f"{run_dir}: another `dare train` is running in this run folder (pid {holder}); wait for it, "
                        f"stop it, or give {name} another run.out_dir") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle
