"""Batches as the recipes cut them: `take` (a batch or a noise draw restricted to some rows),
`micro_slices`, and `backward_by_parts` (a loss backpropagated one part of its noise draw at a time)."""

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
