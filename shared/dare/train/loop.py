"""The training loop's parts every recipe shares: the epoch sampler of training rows, stop signals
(preemption), the collapse record, building the model a run starts from, and `Loop`, which runs the steps,
logs, checkpoints and resumes."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch

from dare.data import TASKS, split_path
from dare.models import facts, load_pretrained, load_tokenizer, new_model
from dare.models.api import checkpoint_meta
from dare.models.tokenizer import char_tokenizer
from dare.train.checkpoint import StopSignals, restore, resume, training_state
from dare.train.metrics import MetricsLog
from dare.train.sampler import EpochSampler
from dare.train.trainer import bf16_base
from dare.utils import UserError, derive_seed, make_generator, sha256_file


class Collapsed(Exception):
    """A guard stopped the run (`rl.on_collapse=stop`, its rollbacks used up, or nothing to roll back to);
    the reason is the message and run.json records it."""


def record_guard(run_dir: Path, event: dict) -> None:
    """Append a guard's event to run.json's `guards` (rank 0; the file is rewritten atomically)."""
    from dare.utils import atomic_write_json

    path = Path(run_dir) / "run.json"
    status = json.loads(path.read_text()) if path.is_file() else {}
    status["guards"] = [*status.get("guards", []), event]
    atomic_write_json(path, status)


def build_model(model_cfg, task, seed: int):
    """(model, tokenizer, display name, meta of the checkpoint it starts from or None)."""
    if model_cfg.path:
        # float32 master weights (bfloat16 is a compute dtype), but a frozen LoRA base in bfloat16 (`bf16_base`)
        model = load_pretrained(model_cfg.path, "bfloat16" if bf16_base(model_cfg) else "float32")
        tokenizer = load_tokenizer(model_cfg.path)
        family = facts(model).family
        if family != model_cfg.family:
            raise UserError(f"model.path {model_cfg.path} holds a {family!r} model but model.family is "
                             f"{model_cfg.family!r}")
        meta = checkpoint_meta(model_cfg.path)
        name = model_cfg.name or meta.get("model_name") or Path(model_cfg.path).name
        return model, tokenizer, name, meta or {"pretrained": str(model_cfg.path)}
    alphabet = getattr(task, "alphabet", None)
    if not alphabet:
        raise UserError("model.path is empty (train from scratch) but the task has no character alphabet; "
                         "give a checkpoint with model.path=...")
    tokenizer = char_tokenizer(alphabet, model_cfg.family)
    s = model_cfg.scratch
    model = new_model(model_cfg.family, tokenizer, s, derive_seed(seed, "init"), "float32")
    name = model_cfg.name or f"{model_cfg.family}-scratch-d{s.d_model}-l{s.n_layers}"
    return model, tokenizer, name, None


def data_identity(task_name: str, split: str) -> dict:
    return {"task": task_name, "split": split, "version": TASKS[task_name].version,
            "sha256": sha256_file(split_path(task_name, split))}


class Loop:
    """The data sampler, the run's checkpointed generators (one per name in `streams`), resume,
    the metrics log, stop signals and the end-of-step routine; a recipe writes only its step:

        with Loop(cfg, run_dir, label, trainer, len(rows), streams=("noise",)) as loop:
            for step in loop.steps():
                ...
                loop.end_step(step + 1, tokenizer, lambda: {...metrics...})
        return loop.outcome(tokenizer, model_name, init)
    """

    def __init__(self, cfg, run_dir, label: str, trainer, n_rows: int, streams=(), companions: dict | None = None):
        self.cfg, self.label, self.trainer, self.dist = cfg, label, trainer, trainer.dist
        self.run_dir, self.total = Path(run_dir), cfg.train.steps
        self.sampler = EpochSampler(n_rows, make_generator(cfg.run.seed, "data"))
        self.generators = {name: make_generator(cfg.run.seed, name) for name in streams}
        self.ckpt, state = resume(run_dir, trainer, self.sampler, self.generators, label,
                                  cfg.run.keep_checkpoints, companions)
        self.start, self.elapsed0 = state.get("step", 0), state.get("elapsed_s", 0.0)
        self.totals: dict[str, float] = dict(state.get("totals", {}))
        """Running totals a recipe keeps across resumes (the RL loop's compute), saved in every checkpoint."""
        self.rollbacks = 0
        self._rewind: int | None = None
        self.log = (MetricsLog(run_dir, self.total, self.start, label, cfg.run.report_to, cfg)
                    if self.dist.main else None)
        self.t0 = time.perf_counter()
        self.stop = StopSignals()

    def __enter__(self):
        self.stop.__enter__()
        # The global RNG (dropout, e.g. LoRA's) is forked for the loop and seeded per step from the
        # run seed: runs are reproducible and resumable, and the caller's global RNG is left as it was.
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        self._rng = torch.random.fork_rng(devices=devices)
        self._rng.__enter__()
        return self

    def __exit__(self, *exc):
        self._rng.__exit__(*exc)
        self.stop.__exit__(*exc)
        if self.log:
            self.log.close()
        return False

    def steps(self):
        """The steps still to run (from the resumed one, and again from a rolled-back one), with the
        forked global RNG seeded from (run seed, step, rank) before each."""
        step = self.start
        while step < self.total:
            torch.manual_seed(derive_seed(self.cfg.run.seed, f"global/{step}/{self.dist.rank}"))
            yield step
            step, self._rewind = (self._rewind, None) if self._rewind is not None else (step + 1, None)

    def due(self, done: int) -> bool:
        """Step `done` (1-based) writes its metrics (`run.log_every`, and the last step)."""
        return done % self.cfg.run.log_every == 0 or done == self.total

    def rollback(self, done: int, reason: str, action: str = "rollback", limit: int = 3,
                 before: int | None = None) -> None:
        """A guard found step `done` bad (`reason`): record it in run.json, then restore the latest complete
        checkpoint at or before step `before` (default: the latest), drop the checkpoints and metrics after
        it, halve the learning rate and continue from there (`steps` yields the restored step next). Raises
        `Collapsed` with `action="stop"`, after `limit` rollbacks, or when there is no checkpoint (set
        `run.save_every`). Every rank calls it (restoring is collective)."""
        kept = self.ckpt.complete()
        eligible = [p for p in kept if before is None or int(p.name[5:]) <= before]
        target = eligible[-1] if eligible else (kept[0] if kept else None)
        event = {"step": done, "reason": reason, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        stop = None
        if action == "stop":
            stop = f"step {done}: {reason} (rl.on_collapse=stop)"
        elif self.rollbacks >= limit:
            stop = f"step {done}: {reason}, after {self.rollbacks} rollback(s) (rl.max_rollbacks={limit})"
        elif target is None:
            stop = (f"step {done}: {reason}, and no checkpoint to roll back to (set run.save_every to keep "
                    "checkpoints, or rl.on_collapse=stop)")
        if stop is not None:
            if self.dist.main:
                record_guard(self.run_dir, {**event, "action": "stop"})
            raise Collapsed(stop)
        scale = self.trainer.lr_scale
        state = restore(target, self.ckpt, self.trainer, self.sampler, self.generators)
        self.trainer.lr_scale = scale
        self.trainer.scale_lr(0.5)
        self.rollbacks += 1
        restored = state["step"]
        if self.dist.main:
            for later in [p for p in kept if int(p.name[5:]) > restored]:  # the bad trajectory's checkpoints
                shutil.rmtree(later, ignore_errors=True)
            if self.log:
                self.log.truncate(restored)
            record_guard(self.run_dir, {**event, "action": "rollback", "restored_step": restored,
                                        "checkpoint": target.name, "lr_scale": self.trainer.lr_scale})
            print(f"[{self.label}] guard: step {done}: {reason}; restored {target.name}, learning rate x "
                  f"{self.trainer.lr_scale:g}", file=sys.stderr, flush=True)
        self.dist.barrier()
        self._rewind = restored

    def elapsed(self) -> float:
        return self.elapsed0 + time.perf_counter() - self.t0

    def end_step(self, done: int, tokenizer, metrics, force_log: bool = False) -> None:
        """Log `metrics()` when due or forced (every rank calls it: it may sum over ranks), then the
        periodic checkpoint and the preemption check."""
        if force_log or self.due(done):
            values = metrics()
            if self.log:
                self.log.log(done, values)
        self.ckpt.after_step(done, self.total, self.cfg.run.save_every, self.stop, self.trainer, tokenizer,
                             lambda: training_state(self.sampler, self.generators, self.elapsed(), self.totals))

    def outcome(self, tokenizer, model_name: str, init) -> dict:
        data = self.cfg.data
        return {"trainer": self.trainer, "tokenizer": tokenizer, "model_name": model_name, "init": init,
                "steps": self.total, "data": data_identity(data.task, data.split), "elapsed_s": self.elapsed(),
                "totals": dict(self.totals)}
