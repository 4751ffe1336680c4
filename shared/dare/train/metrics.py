"""The metrics log (`metrics.jsonl`, the terminal line) and the optional sinks (TensorBoard, W&B); an RL step's
logged metrics (`step_metrics`, `compute_metrics`: collective sums over processes) and each phase's peak memory
on CUDA (`PhasePeaks`)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from dare.utils import UserError, atomic_write



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


class PhasePeaks:
    """Each phase's peak memory on a CUDA device: `start()` resets the allocator's peak statistics, `end(phase)`
    records `memory/<phase>_peak_gib` (max_memory_allocated / 2**30). Host-side allocator queries (no device
    sync); on any other device it records nothing."""

    def __init__(self, device: torch.device):
        self.device, self.cuda = device, torch.device(device).type == "cuda"
        self.values: dict[str, float] = {}

    def start(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def end(self, phase: str) -> None:
        if self.cuda:
            self.values[f"memory/{phase}_peak_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30

    def take(self) -> dict[str, float]:
        values, self.values = self.values, {}
        return values


def compute_metrics(loop, used: dict, nfe: int) -> dict:
    """This step's compute, summed over processes (sequence forward passes of the rollout and of the training
    passes, completion positions decoded, loss tokens x updates; the diagnostics' and validation's forwards
    apart) and the run's totals so far (`Loop.totals`, kept in checkpoints), for plots against compute."""
    spent = {"rollout_forwards": used["rollout/forwards"], "train_forwards": used["train/forwards"],
             "rollout_tokens": used["rollout_tokens"], "update_tokens": used["update_tokens"]}
    for k, v in spent.items():
        loop.totals[k] = loop.totals.get(k, 0.0) + v
    totals = loop.totals
    return {**{f"compute/{k}": v for k, v in spent.items()}, "compute/rollout_nfe": nfe,
            "compute/diag_forwards": used["diag/forwards"], "compute/eval_forwards": used["eval/forwards"],
            **{f"compute/total_{k}": v for k, v in totals.items()},
            "compute/total_forwards": totals["rollout_forwards"] + totals["train_forwards"],
            "compute/wall_s": loop.elapsed()}


def dynamic_stats(dist, out, rows: int) -> dict:
    """Dynamic blocks (`decoding.block.dynamic`): the mean block-entropy reward and number of blocks decoded
    per completion (collective where there are any; nothing with the model's fixed blocks)."""
    if out.segments is None:
        return {}
    blocks = (out.segments.masked_fill(~out.response_mask.bool(), -1).amax(dim=1) + 1).float()
    s = dist.sum({"reward": float(out.block_reward.sum()), "blocks": float(blocks.sum())})
    return {"rollout/block_reward": s["reward"] / rows, "rollout/blocks": s["blocks"] / rows}


def step_metrics(dist, batch, mu: int, sums: dict, lr: float, times: dict) -> dict:
    """The logged metrics of an RL step (`batch`: its `rl.RLBatch`), summed over processes (collective)."""
    G, out = batch.group_size, batch.rollout
    grouped = batch.rewards.view(-1, G)
    stats = dist.sum({"reward_sum": float(batch.rewards.sum()), "reward_sq": float((batch.rewards ** 2).sum()),
                      "zero_std": float((grouped.std(dim=1) == 0).sum()) if G > 1 else 0.0,
                      "seq_tokens": float(out.attention_mask.sum()), "new_tokens": float(out.response_mask.sum())})
    rows = batch.num_sequences
    mean = stats["reward_sum"] / rows
    var = max(0.0, stats["reward_sq"] / rows - mean ** 2) * rows / max(1, rows - 1)
    return {"rollout/reward_mean": mean, "rollout/reward_std": var ** 0.5,
            "rollout/zero_std_groups": stats["zero_std"] / (rows / G),
            "rollout/response_tokens": batch.num_tokens / rows, **sums, "optim/lr": lr, **dynamic_stats(dist, out, rows),
            **({} if out.given is None else {"rollout/hinted_rows": dist.sum({"h": float(out.given.any(1).sum())})["h"]
                                             / rows}),
            "perf/rollout_tokens_per_s": stats["new_tokens"] / times["time/rollout_s"],
            "perf/train_tokens_per_s": stats["seq_tokens"] * mu / max(times["time/logp_s"] + times["time/update_s"], 1e-9),
            **times}
