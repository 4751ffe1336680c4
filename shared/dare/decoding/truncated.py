"""The truncated sampler's options (`<decoding>.truncated.*`, e.g. `rl.decoding.truncated.top_k=150`): AGRPO's
sampler, gen_length / steps tokens per step over semi-AR blocks, the drawn log-probs, entropies and
top-k/top-p supports recorded (the sampler: `dare.rollout.truncated`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

NAME = "truncated"


@dataclass
class TruncatedOptions:
    remasking: Literal["low_confidence", "random", "entropy"] = "low_confidence"
    """Which masked positions a step commits: the highest drawn log-prob, random ones (AGRPO's default) or the
    lowest-entropy ones."""
    top_k: int = 0
    """Sampling (T > 0): keep the k most probable tokens; 0 (or a k beyond the vocabulary) = all."""
    top_p: float = 1.0
    """Sampling (T > 0): keep the smallest set of tokens whose probability exceeds p (the reference also drops
    the token that crosses it); 1 = all."""


def check(o: TruncatedOptions, d):
    """The rules of the truncated sampler's options given the common settings `d`, as (holds, message, *keys)."""
    yield 0 < o.top_p <= 1, "must be in (0, 1]", "truncated.top_p"
    yield o.top_k >= 0, "must be >= 0", "truncated.top_k"
