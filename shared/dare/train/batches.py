"""Batches as the recipes cut them: `take` (a batch or a noise draw restricted to some rows), `put` (its inverse:
some rows replaced), `micro_slices`, `backward_by_parts` (a loss backpropagated one part of its noise draw at a time), and
`updates`, the one update loop of every recipe (SFT, preference, RL's policy and value model): micro-batches
accumulated into one optimizer step, with the every-process backward guard (`every_rank_backward`)."""

from __future__ import annotations

import dataclasses

import torch


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


def put(obj, rows: torch.Tensor, part, n: int):
    """`obj` (an n-row batch) with its `rows` (k,) replaced by the k rows of `part`, the inverse of `take`: every
    tensor whose first dimension is n (in dataclasses, dicts, lists and tuples) is copied and written at `rows`;
    everything else (prompt length, counts, options) is `obj`'s. A field that one side has and the other lacks
    (None) is refused."""
    if isinstance(obj, torch.Tensor):
        if obj.dim() == 0 or obj.shape[0] != n:
            return obj
        if not isinstance(part, torch.Tensor) or part.shape[1:] != obj.shape[1:]:
            raise ValueError(f"put: rows of shape {tuple(obj.shape[1:])} cannot take "
                             f"{'nothing' if part is None else tuple(part.shape[1:])}")
        out = obj.clone()
        out[rows] = part.to(out.dtype)
        return out
    if obj is None:
        if isinstance(part, torch.Tensor):
            raise ValueError("put: a field that one batch has and the other lacks (None)")
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: put(getattr(obj, f.name), rows, getattr(part, f.name), n)
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, dict):
        return {k: put(v, rows, part[k], n) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(put(v, rows, w, n) for v, w in zip(obj, part))
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


def updates(trainer, minis: list[tuple[slice, object]], noises: list, micro: int, loss_of,
            loss_key: str = "loss/total", norm_key: str = "optim/grad_norm") -> dict:
    """One optimizer step of `trainer` per noise draw and mini-batch (`minis`: (its rows of the step's batch,
    the mini-batch), in order; RL's `mini_batches`, else the whole batch as one), each accumulated over the
    mini-batch's micro-batches: `loss_of(micro_batch, micro_noise, draw, rows) -> (loss, metrics)`, `rows` the
    micro-batch's slice of the step's rows. Returns the metrics (the loss as `loss_key`, the gradient norm
    before clipping as `norm_key`) summed over micro-batches and processes and averaged over the optimizer
    steps. SFT, preference, and RL's policy and value model all update through it."""
    n = minis[-1][0].stop
    steps = len(noises) * len(minis)
    trainer.model.train()
    sums: dict[str, float] = {}
    for it, z_all in enumerate(noises):
        for span, mini in minis:
            step_sums: dict[str, float] = {}
            size = span.stop - span.start
            for j, part in enumerate(micro_slices(size, micro)):
                rows = slice(span.start + part.start, span.start + part.stop)
                with trainer.autocast():
                    loss, metrics = loss_of(take(mini, part, size), take(z_all, rows, n), it, rows)
                if every_rank_backward(trainer.dist, loss.requires_grad, j):
                    trainer.backward(loss)
                for k, v in {loss_key: loss.item(), **metrics}.items():
                    step_sums[k] = step_sums.get(k, 0.0) + v
            step_sums = trainer.dist.sum(step_sums)
            step_sums[norm_key] = trainer.step()
            for k, v in step_sums.items():
                sums[k] = sums.get(k, 0.0) + v / steps
    return sums


def every_rank_backward(dist, graph: bool, micro_index: int) -> bool:
    """Whether this micro-batch's loss is backpropagated: when it has a graph. A loss without one is a replayed
    loss (`replayed_loss`, already backpropagated) or one whose forwards scored nothing. Under FSDP every process
    must run every backward (the reduce-scatters pair up), and the estimators see to it: their forwards are
    collective (`estimators.per_round`, `head_chunks`), so a process that scores nothing still gets a zero loss
    with a graph through the model. The processes check that they agree (one all-reduce per micro-batch) and
    stop with an error, instead of waiting forever, when a loss hook breaks that."""
    if dist.processes > 1 and dist.any(graph) != graph:
        raise RuntimeError(f"micro-batch {micro_index}: the loss on process {dist.process} has no graph while other "
                           "processes backpropagate theirs; under FSDP every process must run the same forwards and "
                           "backwards (compute the loss from the estimators' outputs, even when nothing is scored)")
    return graph
