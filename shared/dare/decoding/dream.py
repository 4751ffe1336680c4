"""The Dream sampler's options (`<decoding>.dream.*`, e.g. `eval.decoding.dream.alg=entropy`): Dream's
`diffusion_generate` algorithms (the sampler: `dare.rollout.dream`; Dream has no blocks: `block_length` is
not used)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

NAME = "dream"


@dataclass
class DreamOptions:
    alg: Literal["origin", "maskgit_plus", "topk_margin", "entropy"] = "maskgit_plus"
    """Which confidence orders the unmasking."""
    alg_temp: float = 0.0
    """0: the n most confident positions; > 0: a sample of n from softmax(confidence / alg_temp)."""
    top_p: float = 1.0
    """Keep the smallest set of tokens whose probability reaches p; 1 = all."""
    top_k: int = 0
    """Keep the k most probable tokens; 0 = all."""
    eps: float = 1e-3
    """The timestep schedule: linspace(1, eps, steps + 1)."""


def check(o: DreamOptions, d):
    """The rules of the Dream sampler's options given the common settings `d`, as (holds, message, *keys)."""
    yield 0 < o.top_p <= 1, "must be in (0, 1]", "dream.top_p"
    yield o.top_k >= 0, "must be >= 0", "dream.top_k"
    yield 0 < o.eps < 1, "must be in (0, 1)", "dream.eps"
