"""Building blocks shared by the training recipes: the data sampler, the
optimizer and LR schedule, atomic checkpoints with exact resume, and the metrics log."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from dare.utils import NO_SPACE, UserError, atomic_write, derive_seed, replace_dir, umask_permissions
from dare.data import TASKS, split_path
from dare.models import facts, load_pretrained, load_tokenizer, new_model
from dare.models.api import checkpoint_meta
from dare.models.tokenizer import char_tokenizer
from dare.utils import make_generator, sha256_file


class EpochSampler:
    """Draws example indices without replacement, reshuffling each epoch with its own generator."""

    def __init__(self, n: int, generator: torch.Generator):
        if n <= 0:
            raise ValueError("cannot sample from an empty split")
        self.n, self.generator = n, generator
        self.perm: list[int] = []
        self.pos, self.epoch = 0, 0

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos >= len(self.perm):
                self.perm = torch.randperm(self.n, generator=self.generator).tolist()
                self.pos = 0
                self.epoch += 1
            take = min(k - len(out), len(self.perm) - self.pos)
            out += self.perm[self.pos:self.pos + take]
            self.pos += take
        return out

    def state_dict(self) -> dict:
        return {"perm": self.perm, "pos": self.pos, "epoch": self.epoch, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.perm, self.pos, self.epoch = state["perm"], state["pos"], state["epoch"]
        self.generator.set_state(state["generator"])


# ---------------------------------------------------------------------------------------------
# Optimizer and schedule
# ---------------------------------------------------------------------------------------------


def make_optimizer(model: torch.nn.Module, train) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on norms, biases or other vectors)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=train.lr, betas=tuple(train.betas))


def lr_factor(step: int, total: int, train) -> float:
    """Multiplier of `train.lr` for optimizer step `step` (0-based) out of `total`.

    Warmup: (step + 1) / warmup, so the first step already moves (HF's ramp starts at 0); warmup is
    `warmup_steps` or ceil(`warmup_ratio` x total).
    Decay, as transformers' `get_linear_schedule_with_warmup` / `get_cosine_with_min_lr_schedule_with_warmup`
    (what the TRL/HF references use): progress = (step - warmup) / (total - warmup), so the last step
    runs at floor + (1 - floor) / (total - warmup) (linear) and the floor would be reached one step later."""
    warmup = train.warmup_steps or math.ceil(train.warmup_ratio * total)
    if step < warmup:
        return (step + 1) / warmup
    if train.schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    floor = train.min_lr_ratio
    if train.schedule == "linear":
        return floor + (1 - floor) * max(0.0, 1 - progress)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))  # cosine


# ---------------------------------------------------------------------------------------------
# Checkpoints: written to a temporary folder and renamed into place, so a crash never leaves a
# half-written checkpoint; resume restores weights, optimizer, schedule, sampler and generators.
# ---------------------------------------------------------------------------------------------


class Preempted(Exception):
    """Raised by a training loop after it checkpointed on SIGTERM/SIGUSR1; `train` exits with
    128 + signal so that SLURM (submitit) requeues the job, which then resumes."""

    def __init__(self, step: int, signum: int):
        super().__init__(f"stopped by signal {signum} after step {step} (checkpoint written)")
        self.step, self.signum = step, signum


class StopSignals:
    """SIGTERM and SIGUSR1 (SLURM's preemption and `--signal` warnings) only set a flag here; the
    loop checks it after each step, writes a checkpoint and raises `Preempted`."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.signum: int | None = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False

    def _handle(self, signum, frame):
        self.signum = signum

    def check(self, step: int, save, dist=None) -> None:
        """After a step: if a stop was asked for (on any rank), `save()` a checkpoint and raise `Preempted`."""
        asked = self.signum is not None
        if dist is not None:
            asked = dist.any(asked)
        if asked:
            save()
            raise Preempted(step, self.signum or signal.SIGTERM)


class Checkpointer:
    """`checkpoints/step_N/`: the sharded tensors (`Trainer.save`: weights and optimizer state, every rank
    writing its own shards into `dcp/`) and `trainer_state.pt` (schedule, sampler, generators, RNG,
    elapsed time, running totals), written into `step_N.tmp` and renamed into place by rank 0 once every
    rank has written, so a crash never leaves a half-written checkpoint. Models trained beside
    the policy (`companions`, e.g. a value model: {"value": its Trainer}) are saved in
    `step_N/<name>/`, their weights and optimizer state, in the same atomic rename."""

    def __init__(self, run_dir: Path, dist, keep: int = 1, companions: dict | None = None):
        self.dir = Path(run_dir) / "checkpoints"
        self.dist, self.keep = dist, keep
        self.companions = companions or {}

    def complete(self) -> list[Path]:
        return sorted(p for p in self.dir.glob("step_*")
                      if p.name[5:].isdigit() and (p / "trainer_state.pt").is_file())

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    CHECKSUMS = "checksums.json"

    def record_checksums(self, folder: Path) -> None:
        """sha256 of every file of a written checkpoint (every rank's shards included), so a resume can tell
        a complete checkpoint from a truncated or corrupted one (`damage`)."""
        sums = {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}
        atomic_write(folder / self.CHECKSUMS, json.dumps(sums, indent=1) + "\n")

    def damage(self, folder: Path) -> str | None:
        """Why checkpoint `folder` cannot be trusted (a file missing or not what was written), or None. A
        checkpoint from before checksums were recorded is trusted as it is."""
        path = folder / self.CHECKSUMS
        if not path.is_file():
            return None
        for name, digest in json.loads(path.read_text()).items():
            file = folder / name
            if not file.is_file():
                return f"{name} is missing"
            if sha256_file(file) != digest:
                return f"{name} is not the file that was written (sha256 differs: truncated or corrupted)"
        return None

    def save(self, step: int, trainer, tokenizer, state: dict) -> Path:
        """Write checkpoint `step` (atomically: `step_N.tmp`, renamed into place). A full disk removes the
        partial folder and stops with one line naming it; the checkpoints before stay as they were."""
        tmp = self.dir / f"step_{step:07d}.tmp"
        try:
            return self._save(step, tmp, trainer, tokenizer, state)
        except BaseException as raised:  # torch.distributed.checkpoint wraps a rank's error in a BaseException
            e = _no_space(raised)
            if e is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            kept = self.complete()
            raise UserError(f"checkpoint {tmp}: {e.strerror} ({e.filename or tmp}); removed the partial folder; "
                            f"the last complete checkpoint is {kept[-1] if kept else 'none'}: free space and rerun "
                            f"the same command to resume") from None

    def _save(self, step: int, tmp: Path, trainer, tokenizer, state: dict) -> Path:
        final = self.dir / f"step_{step:07d}"
        if self.dist.main:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            for name in self.companions:
                (tmp / name).mkdir()
        self.dist.barrier()  # the folders exist before any rank writes its shards
        trainer.save(tmp, tokenizer)  # collective: every rank writes its own shards
        optim = trainer.optimizer_state()
        for name, other in self.companions.items():
            other.save(tmp / name, tokenizer)
            if self.dist.main:
                torch.save(other.optimizer_state(), tmp / name / "trainer_state.pt")
        self.dist.barrier()  # every rank's shards are written before the folder is renamed into place
        if self.dist.main:
            torch.save({"step": step, **optim, **state}, tmp / "trainer_state.pt")
            self.record_checksums(tmp)
            umask_permissions(tmp)
            replace_dir(tmp, final)
            for old in (self.complete()[:-self.keep] if self.keep else []):
                shutil.rmtree(old, ignore_errors=True)
        self.dist.barrier()
        return final

    def after_step(self, done: int, total: int, save_every: int, stop: "StopSignals", trainer, tokenizer,
                   state) -> None:
        """The end of every training step: a periodic checkpoint, then the preemption check (which
        checkpoints this step and stops). `state()` builds `training_state(...)` when one is saved."""
        def save():
            return self.save(done, trainer, tokenizer, state())

        if save_every and done % save_every == 0 and done < total:
            save()
        stop.check(done, save, self.dist)


def _no_space(e: BaseException | None, depth: int = 0) -> OSError | None:
    """The full-disk OSError behind `e` (itself, its cause, or a rank's failure that
    torch.distributed.checkpoint collected), or None."""
    if e is None or depth > 8:
        return None
    if isinstance(e, OSError) and e.errno in NO_SPACE:
        return e
    for failure in getattr(e, "failures", {}).values():
        found = _no_space(failure[0] if isinstance(failure, tuple) else failure, depth + 1)
        if found is not None:
            return found
    return _no_space(e.__cause__ or e.__context__, depth + 1)


def training_state(sampler: EpochSampler, generators: dict, elapsed_s: float, totals: dict | None = None) -> dict:
    """Everything besides the weights and optimizer that an exact resume needs (and the run's running
    totals: its compute so far)."""
    return {"sampler": sampler.state_dict(), "generators": {k: g.get_state() for k, g in generators.items()},
            "torch_rng": torch.get_rng_state(), "elapsed_s": elapsed_s, "totals": dict(totals or {})}


def restore(folder: Path, ckpt: Checkpointer, trainer, sampler: EpochSampler, generators: dict) -> dict:
    """Load checkpoint `folder` (weights, optimizer, schedule, companions, sampler, generators, RNG) into
    the run; returns its state (`step`, `elapsed_s`, `totals`, ...)."""
    for name in ckpt.companions:
        if not (folder / name / "trainer_state.pt").is_file():
            raise UserError(f"{folder}: this run trains a {name} model beside the policy but the checkpoint has "
                            f"no {name}/ (it was written by a run without one): resume with the config that wrote "
                            "it, or start a new run folder")
    state = torch.load(folder / "trainer_state.pt", weights_only=False)
    trainer.load(folder, state)
    for name, other in ckpt.companions.items():
        other.load(folder / name, torch.load(folder / name / "trainer_state.pt", weights_only=False))
    sampler.load_state_dict(state["sampler"])
    for name, g in generators.items():
        g.set_state(state["generators"][name])
    if "torch_rng" in state:
        torch.set_rng_state(state["torch_rng"])
    return state


def resume(run_dir: Path, trainer, sampler: EpochSampler, generators: dict,
           label: str, keep: int = 1, companions: dict | None = None) -> tuple[Checkpointer, dict]:
    """Restore the latest complete checkpoint, if any, with its companions (`Checkpointer`):
    (checkpointer keeping the latest `keep`, or all with 0; the checkpoint's state, {} when none)."""
    ckpt = Checkpointer(run_dir, trainer.dist, keep, companions)
    kept = ckpt.complete()
    if not kept:
        return ckpt, {}
    choice = -1  # rank 0 checks the checkpoints, newest first; every rank restores the one it picked
    if trainer.dist.main:
        problems = []
        for i in range(len(kept) - 1, -1, -1):
            why = ckpt.damage(kept[i])
            if why is None:
                choice = i
                break
            problems.append(f"{kept[i].name}: {why}")
            print(f"[{label}] checkpoint {kept[i]} is damaged ({why}); trying the one before it", file=sys.stderr,
                  flush=True)
        if choice < 0:
            raise UserError(f"{ckpt.dir}: no checkpoint can be resumed ({'; '.join(problems)}); start over with "
                            "--force or restore the folder")
    choice = int(trainer.dist.max({"i": float(choice)})["i"])
    state = restore(kept[choice], ckpt, trainer, sampler, generators)
    if trainer.dist.main:
        print(f"[{label}] resuming from {kept[choice]} (step {state['step']})", flush=True)
    return ckpt, state


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


# ---------------------------------------------------------------------------------------------
# Metrics: one JSON line per logged step, and a short progress line on the terminal
# ---------------------------------------------------------------------------------------------


class MetricsLog:
    """`metrics.jsonl` (one JSON line per logged step), a progress bar with ETA on a terminal (a
    line per logged step otherwise), and wandb / tensorboard when `run.report_to` names them.
    Only rank 0 logs; the values it gets are already summed over ranks."""

    def __init__(self, run_dir: Path, total_steps: int, resume_step: int = 0, label: str = "",
                 report_to=(), config=None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.total, self.label = total_steps, label
        self.t0, self.step0 = time.perf_counter(), resume_step
        if self.path.exists():  # drop lines logged after the checkpoint we resume from
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            atomic_write(self.path, "".join(line + "\n" for line in kept))
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=resume_step, desc=label, dynamic_ncols=True)
        self.sinks = [open_sink(name, Path(run_dir), label, config) for name in report_to]

    def truncate(self, step: int) -> None:
        """Drop the lines logged after `step` (a rollback to it)."""
        if self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= step]
            atomic_write(self.path, "".join(line + "\n" for line in kept))
        self.step0 = step

    def log(self, step: int, metrics: dict[str, float]) -> None:
        elapsed = time.perf_counter() - self.t0
        record = {"step": step, "time_s": round(elapsed, 3), **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        for sink in self.sinks:
            sink(step, {k: v for k, v in record.items() if isinstance(v, (int, float))})
        shown = {k.split("/")[-1]: v for k, v in metrics.items() if shown_on_terminal(k)}
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix({k: _fmt(v) for k, v in list(shown.items())[:4]}, refresh=True)
            return
        done = step - self.step0
        eta = elapsed / done * (self.total - step) if done > 0 else float("nan")
        line = "  ".join(f"{k}={_fmt(v)}" for k, v in shown.items())
        print(f"[{self.label}] step {step}/{self.total}  {line}  ({elapsed:.0f}s, eta {eta:.0f}s)",
              file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


QUIET = ("time/", "perf/", "compute/", "agree/estimate_abs", "agree/estimate_max", "agree/logp_abs", "agree/logp_max",
         "agree/ratio_mean", "diag/adv_std", "rollout/eos_position")
"""Metrics that metrics.jsonl (and wandb, tensorboard) get but the terminal line leaves out, to stay readable."""


def shown_on_terminal(key: str) -> bool:
    return not key.startswith(QUIET) or key == "compute/total_forwards"


def check_sinks(report_to) -> None:
    """Refuse (before any model is built) a metric sink whose package is missing."""
    import importlib.util

    for name in report_to:
        if importlib.util.find_spec(name) is None:
            raise UserError(f"run.report_to includes {name!r} but the {name!r} package is not installed "
                            f"(pip install {name})")


def open_sink(name: str, run_dir: Path, label: str, config):
    """A `(step, metrics)` callable for an optional tracker (wandb or tensorboard)."""
    check_sinks([name])
    if name == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(run_dir / "tensorboard"))
        return lambda step, m: [writer.add_scalar(k, v, step) for k, v in m.items()] and writer.flush()
    import wandb

    from dataclasses import asdict

    run = wandb.init(project="dare", name=f"{label}-{run_dir.name}", dir=str(run_dir), resume="allow",
                     id=run_dir.name, config=asdict(config) if config is not None else None)
    return lambda step, m: run.log(m, step=step)


def _plain(v):
    return float(v) if isinstance(v, (torch.Tensor, float)) else v


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def save_final(trainer, tokenizer, run_dir: Path, meta: dict, base: str | Path | None = None,
               name: str = "final") -> Path:
    """The run's final model (`Trainer.export`) in `<run_dir>/<name>/` (a value model: `value`), with
    `dare.json` describing how it was made, moved into place whole; a `base` checkpoint's remote code
    comes along (`carry_remote_code`). Collective; rank 0 writes."""
    tmp, final = Path(run_dir) / f"{name}.tmp", Path(run_dir) / name
    if trainer.dist.main:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    trainer.export(tmp, tokenizer, meta)
    if trainer.dist.main:
        if base:
            carry_remote_code(Path(base), tmp)
        umask_permissions(tmp)
        replace_dir(tmp, final)
    trainer.dist.barrier()
    return final


def carry_remote_code(base: Path, export: Path) -> None:
    """Make an export load the way its base checkpoint does: the base's `auto_map` (config and
    tokenizer) and the Python files it names (modeling_*.py, ...) are copied into the export, so
    `AutoModel.from_pretrained(export, trust_remote_code=True)` works without this package, as it
    does for the released checkpoint. Our parameter and config names are the originals'."""
    for name in ("config.json", "tokenizer_config.json"):
        src, dst = base / name, export / name
        if not (src.is_file() and dst.is_file()):
            continue
        auto_map = json.loads(src.read_text()).get("auto_map")
        if auto_map:
            data = json.loads(dst.read_text())
            atomic_write(dst, json.dumps({**data, "auto_map": auto_map}, indent=2) + "\n")
    for code in base.glob("*.py"):
        if not (export / code.name).exists():
            shutil.copyfile(code, export / code.name)


# ---------------------------------------------------------------------------------------------
# Model and data setup
# ---------------------------------------------------------------------------------------------


def build_model(model_cfg, task, seed: int):
    """(model, tokenizer, display name, meta of the checkpoint it starts from or None)."""
    if model_cfg.path:
        model = load_pretrained(model_cfg.path, "float32")  # master weights; bfloat16 is a compute dtype
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



# ---------------------------------------------------------------------------------------------
# The loop scaffolding every recipe shares
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Row slicing: data parallelism and gradient accumulation
# ---------------------------------------------------------------------------------------------


def take(obj, rows: slice, n: int):
    """`obj` restricted to `rows` of an n-row batch: every tensor whose first dimension is n is
    sliced (in dataclasses, dicts, lists and tuples); everything else (prompt length, batch
    totals, options) is kept. Batches and noise draws are row-major by convention."""
    if isinstance(obj, torch.Tensor):
        return obj[rows] if obj.dim() > 0 and obj.shape[0] == n else obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: take(getattr(obj, f.name), rows, n)
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, dict):
        return {k: take(v, rows, n) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(take(v, rows, n) for v in obj)
    return obj


def micro_slices(n: int, size: int) -> list[slice]:
    """Consecutive row slices of at most `size` rows (size 0: one slice)."""
    size = size or n
    return [slice(s, min(s + size, n)) for s in range(0, n, size)]


def backward_by_parts(forward, parts: list, combine, loss_of, backward) -> tuple:
    """A loss whose gradient is backpropagated one part of its noise draw at a time (memory-bounded, exact for
    deterministic forwards): each part's values without graphs (`forward(part)`), combined into the whole draw's
    (`combine(values)`: concatenated, or summed when the parts' values add up); the loss on them
    (`loss_of(whole) -> (loss, metrics)`) and its gradient with respect to each part's values; then per part one
    forward with its graph and `backward((values * gradient).sum())`. Every part runs on every process, so the
    forwards stay collective under FSDP; a part whose forward has no graph (it scores nothing) is skipped.
    Returns (the loss, detached: already backpropagated; its metrics; the whole draw's values, detached)."""
    with torch.no_grad():
        values = [forward(part) for part in parts]
    leaves = [v.detach().requires_grad_() for v in values]
    whole = combine(leaves)
    loss, metrics = loss_of(whole)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    for part, value, grad in zip(parts, values, grads):
        out = forward(part)
        if out.requires_grad:
            backward((out * (torch.zeros_like(value) if grad is None else grad)).sum())
    return loss.detach(), metrics, whole.detach()
