"""Checkpoints and export: atomic sharded checkpoints with exact resume (`Checkpointer`, `restore`,
`resume`), the run's final `save_pretrained` folder (`save_final`, `save_model`) and the export of a sharded
checkpoint into a loadable folder (`export_checkpoint`, `dare export`).

Checkpoints are sharded: `torch.distributed.checkpoint` writes the trained parameters (all, or the LoRA
adapter), the optimizer's state and a moving reference into `step_N/dcp/`, every rank its own shards (no
gather on rank 0: an 8B model with its optimizer state never passes through one host's memory), and
loads them back on any number of processes (resharded; tested 2 -> 1 and 1 -> 2). Rank 0 adds the small
files: the model's config, the tokenizer, `checkpoint.json`. A loadable `save_pretrained` folder is written
only at the end (`export`, the run's `final/`) or on demand from a checkpoint (`export_checkpoint`,
`dare export`). Checkpoints of the earlier format (full tensors in `model.safetensors` and
`trainer_state.pt`) still load."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import sys
import threading
from pathlib import Path

import torch

from dare.models.tokenizer import save_tokenizer
from dare.train.lora import add_lora, merge_lora, save_adapter
from dare.train.sampler import EpochSampler
from dare.utils import NO_SPACE, UserError, atomic_write, replace_dir, sha256_file, umask_permissions


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


@contextlib.contextmanager
def _single_process_quiet():
    """torch.distributed.checkpoint warns that it assumes one process when no process group exists, which is
    what a one-process run means: that warning only is silenced."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def export_checkpoint(folder: str | Path, dest: str | Path | None = None) -> Path:
    """A loadable `save_pretrained` folder (`dest`, default `<folder>/export/`) from a sharded checkpoint
    folder (`step_N/`), in one process: the model built from the folder's config (LoRA: its base checkpoint
    with the adapter added), its trained tensors read from `dcp/`, LoRA merged into the weights (the adapter
    kept in `adapter/`). Only the model's tensors are read, not the optimizer's."""
    import json

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from transformers import AutoConfig, AutoModel

    from torch.distributed.checkpoint.state_dict import StateDictOptions

    from dare.config import LoraConfig
    from dare.models import load_pretrained, load_tokenizer, register_all
    from dare.utils import replace_dir

    folder = Path(folder)
    if not (folder / "dcp").is_dir() or not (folder / "checkpoint.json").is_file():
        raise UserError(f"{folder}: not a sharded checkpoint (no dcp/ and checkpoint.json); checkpoints are the "
                        "step_N/ folders under a run's checkpoints/")
    info = json.loads((folder / "checkpoint.json").read_text())
    register_all()
    if info.get("lora"):
        if not info.get("base") or not Path(info["base"]).is_dir():
            raise UserError(f"{folder}: a LoRA checkpoint needs its base model, {info.get('base')!r}, which is not a "
                            "folder here")
        lora = info["lora"]
        model = add_lora(load_pretrained(info["base"]), LoraConfig(rank=lora["rank"], alpha=lora["alpha"],
                                                                    dropout=lora["dropout"], targets=lora["targets"]))
    else:
        model = AutoModel.from_config(AutoConfig.from_pretrained(folder))
    options = StateDictOptions(ignore_frozen_params=bool(info.get("lora")))
    state = {"model": get_model_state_dict(model, options=options)}
    with _single_process_quiet():
        dcp.load(state, checkpoint_id=str(folder / "dcp"), no_dist=True)
    model.load_state_dict(state["model"], strict=not info.get("lora"))
    dest = Path(dest) if dest else folder / "export"
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tokenizer = load_tokenizer(folder)
    if info.get("lora"):
        full = model.state_dict()
        save_adapter(model, {k: v for k, v in full.items() if ".lora_" in k}, tmp / "adapter")
        save_model(model.get_base_model(), tokenizer, tmp, state_dict=merge_lora(full, model.peft_config["default"]))
    else:
        save_model(model, tokenizer, tmp)
    replace_dir(tmp, dest)
    return dest


def save_model(model, tokenizer, folder: Path, meta: dict | None = None, state_dict: dict | None = None) -> None:
    import json

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(folder, state_dict=state_dict)
    save_tokenizer(tokenizer, folder)
    if meta is not None:
        atomic_write(Path(folder) / "dare.json", json.dumps(meta, indent=2) + "\n")
