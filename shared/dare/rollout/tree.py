"""Tree rollouts and the branching primitive (d-TreeRPO, THU-BPM/d-TreeRPO @3eb6f21,
`dtreerpo_trainer.py::_perform_tree_search_and_compute_advantages`, `_generate_partial`).

    branch(model, partial, k, decoding, generator, until)   every row of a partial rollout becomes k
                                                             children that continue its canvas to step `until`
    generate(model, prompt_ids, prompt_mask, decoding, generator)   with decoding.tree = (w_0, ..., w_{H-1})

A tree splits the sampler's `steps` into H levels at the steps T (l + 1) / H (the reference's branch
points T - int(k T / H)); the root (the empty canvas) has w_0 children, each decoding level 0's
steps from it; each node of level l has w_{l+1} children decoding level l + 1's steps from its canvas.
Children share their parent's canvas, step map and trajectory exactly and differ only by the noise
they draw next. The leaves (prod(w) per prompt) come out in path order: leaf j's ancestor at level l
is node j // prod(w_{l+1:}) of that level. The masked sampler runs each level (`dare.rollout.llada`,
fixed schedule; a level boundary inside a semi-AR block keeps that block's quotas).

`generate` takes rows in groups of prod(w) identical prompts (how the RL loop lays out a prompt's G
completions) and grows one tree per group. Differences from the reference: children are decoded
together (one batch per level) instead of one sibling after another; their noise comes from the
caller's generator.
"""

from __future__ import annotations

import math
from dataclasses import fields, replace

import torch

from dare.rollout import llada
from dare.rollout.core import RolloutOutput
from dare.utils import UserError


def branch(model, partial: RolloutOutput, k: int, decoding, generator=None, until: int | None = None) -> RolloutOutput:
    """Each row of `partial` (a masked-sampler rollout stopped after `partial.steps_done` steps) repeated
    k times (a row's children adjacent), every copy decoded on from the shared canvas to step `until`
    (default: the end)."""
    rows = partial.sequences.shape[0]
    per_row = {f.name: getattr(partial, f.name).repeat_interleave(k, dim=0) for f in fields(partial)
               if isinstance(getattr(partial, f.name), torch.Tensor) and getattr(partial, f.name).shape[0] == rows}
    return llada.generate(model, None, None, decoding, generator, start=replace(partial, **per_row), until=until)


def level_bounds(steps: int, levels: int) -> list[int]:
    """The step at which each level ends: T (l + 1) / H, floored (the reference's branch points)."""
    return [steps * (level + 1) // levels for level in range(levels)]


def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, decoding, generator=None) -> RolloutOutput:
    widths = tuple(decoding.tree)
    leaves = math.prod(widths)
    n = prompt_ids.shape[0]
    if n % leaves or not all(torch.equal(prompt_ids[g * leaves:(g + 1) * leaves], prompt_ids[g * leaves].expand(
            leaves, -1)) for g in range(n // leaves)):
        raise UserError(f"decoding.tree={list(widths)}: rows must come in groups of {leaves} identical prompts (one "
                        f"tree per group, its {leaves} leaves fill the group); got {n} rows")
    out = llada.generate(model, prompt_ids[::leaves], prompt_mask[::leaves], decoding, generator, until=0)
    for width, until in zip(widths, level_bounds(decoding.steps, len(widths))):
        out = branch(model, out, width, decoding, generator, until)
    return out
