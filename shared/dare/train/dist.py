"""Processes, as the data sees them (`Dist`), and how they are formed (`setup_dist`).

One code path from a laptop to a cluster; only the launch differs: one process (`dare train ...`), or
several (`torchrun --nproc-per-node N -m dare.app.cli train ...`, `dare train ... --workers N` for a Ray
worker group, or SLURM). Several processes form a torch process group (NCCL on GPU, gloo on CPU); each
rank takes its contiguous slice of every batch.

Sequence parallelism (`train.sequence_parallel=P`, Ulysses: `dare.models.core.sequence_parallel`): the
processes form groups of P; a group shares one data-parallel share of every batch (`Dist.rank`/`world`
count shares, not processes), and the trained model's gradient-taking forwards run with each process
computing 1/P of the positions; forwards without gradients (rollouts and their caches, old and reference
log-probs) run whole. Packed log-prob passes are off under it (`train.packing=false`)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from dare.utils import UserError


@dataclass
class Dist:
    """The processes, as the data sees them: `rank`/`world` say which share of every batch this process
    holds (its data-parallel rank and their number); with sequence parallelism over groups of `sp`
    processes, the processes of one group hold the same rows, seeds and totals, each computing 1/sp of
    the positions. `process`/`processes` count every process (FSDP shards over all of them)."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    process: int | None = None
    processes: int | None = None
    sp: int = 1
    sp_group: object = None
    """This process's sequence-parallel group (None: no sequence parallelism)."""
    dp_group: object = None
    """The processes at this one's place in every sequence-parallel group: `sum` reduces over them."""

    def __post_init__(self):
        self.process = self.rank if self.process is None else self.process
        self.processes = self.world if self.processes is None else self.processes

    @property
    def main(self) -> bool:
        return self.process == 0

    def shard(self, n: int) -> slice:
        """This rank's contiguous rows of an n-row batch (n divisible by the world size)."""
        k = n // self.world
        return slice(self.rank * k, (self.rank + 1) * k)

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """Sum scalars over the data-parallel ranks (identity in one process): batch totals counted once
        per share of the data, however many processes of a sequence-parallel group hold it."""
        if self.world == 1 or not values:
            return values
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, group=self.dp_group)
        return dict(zip(keys, t.tolist()))

    def max(self, values: dict[str, float]) -> dict[str, float]:
        """The maximum of scalars over every process (identity in one process)."""
        if self.processes == 1 or not values:
            return values
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return dict(zip(keys, t.tolist()))

    def any(self, flag: bool) -> bool:
        return bool(self.max({"f": float(flag)})["f"]) if self.processes > 1 else flag

    def barrier(self) -> None:
        if self.processes > 1:
            torch.distributed.barrier()


@contextlib.contextmanager
def gathered(model, enabled: bool = True):
    """Within: the FSDP2-sharded `model` (`dare.train.trainer.shard`) gathered once and kept whole, so that a
    rollout's many forwards (~130 at LLaDA-8B's d1 settings) make one all-gather per FSDP unit in all instead of
    one per unit per forward; after, every unit resharded and each back to FSDP's default, the one `shard`
    gives (every unit reshards after its forward, the root does not). The first forward inside gathers each
    unit as it reaches it; nothing is gathered when no forward runs. Forwards only, no backward inside.

    Memory: while inside, each process holds the whole model in FSDP's compute dtype (`param_dtype`: 2 bytes a
    parameter under bfloat16 mixed precision, 16 GB at 8B; 4 in float32), on top of its shards and of what the
    rollout itself needs (KV cache, one forward's activations and logits); it is freed on leaving, so training
    memory is what it was. Where that does not fit, `enabled=False` (`rl.gather_rollout=false`) keeps FSDP's
    per-forward gathering: one unit whole at a time, a unit's all-gather in every forward. (Not built: a middle
    way that keeps only the first k decoder layers gathered, `set_reshard_after_forward(False)` on those alone,
    k/L of the model's memory for k/L fewer gathers.) An unsharded model, or `enabled=False`: nothing changes.
    The model is yielded; under LoRA the adapter-disabled reference is the same gathered network."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not enabled or not units:
        yield model
        return
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield model
    finally:
        for unit in units:  # the defaults back first: a unit left mid-forward reshards only when it may
            unit.set_reshard_after_forward(unit is not units[0], recurse=False)
        for unit in units:
            unit.reshard()


def sequence_parallel_training(model, base, dist: Dist) -> list:
    """Run the trained model's (`model`, wrapping the transformers model `base`) gradient-taking forwards sequence-parallel over `dist.sp_group` (a forward
    hook: forwards without gradients, such as rollouts with their caches, run whole on every process); ->
    the parameters applied after the positions are gathered (output head, value head), whose gradients
    `Trainer.step` divides by the group size. Refuses what it cannot split: heads that do not divide by
    the group size, an output head tied to the input embedding (used before and after the gather)."""
    from dare.models.core import sequence_parallel

    config = base.config
    heads = sorted({getattr(config, k) for k in ("num_attention_heads", "n_heads", "num_key_value_heads", "n_kv_heads")
                    if getattr(config, k, None)})  # query and key/value heads
    bad = [h for h in heads if h % dist.sp]
    if bad:
        raise UserError(f"train.sequence_parallel={dist.sp}: the model's attention heads ({heads}) must divide by it")
    head = base.get_output_embeddings()
    if head.weight is base.get_input_embeddings().weight:
        raise UserError(f"train.sequence_parallel={dist.sp}: the model ties its output head to the input "
                        "embedding, which sequence parallelism splits differently; untie it or train without")
    active = []

    def enter(module, args, kwargs):
        plain = kwargs.get("past_key_values") is None and not kwargs.get("use_cache") and kwargs.get("cu_seqlens") is None
        context = sequence_parallel(dist.sp_group) if torch.is_grad_enabled() and plain else contextlib.nullcontext()
        context.__enter__()
        active.append(context)

    def leave(module, args, kwargs, output):
        active.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter, with_kwargs=True)
    model.register_forward_hook(leave, with_kwargs=True, always_call=True)
    value = getattr(base, "value_head", None)
    return [*head.parameters(), *(value.parameters() if value is not None else [])]


def setup_dist(sequence_parallel: int = 1) -> Dist:
    """Join the process group a launcher described in the environment (torchrun, Ray, SLURM set
    RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT); one process otherwise. `sequence_parallel` = P > 1
    groups the processes P by P (ranks 0..P-1, P..2P-1, ...): each group shares one share of the data."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if processes % sequence_parallel:
        raise UserError(f"train.sequence_parallel={sequence_parallel} must divide the number of processes "
                        f"({processes})")
    cuda = torch.cuda.is_available()
    if processes == 1:
        return Dist(0, 1, torch.device("cuda", 0) if cuda else torch.device("cpu"))
    process, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    P = sequence_parallel
    if P == 1:
        return Dist(process, processes, device)
    sp_group = dp_group = None
    for g in range(processes // P):  # every process creates every group, in the same order
        group = torch.distributed.new_group(list(range(g * P, (g + 1) * P)))
        sp_group = group if process // P == g else sp_group
    for j in range(P):
        group = torch.distributed.new_group(list(range(j, processes, P)))
        dp_group = group if process % P == j else dp_group
    return Dist(process // P, processes // P, device, process, processes, P, sp_group, dp_group)
