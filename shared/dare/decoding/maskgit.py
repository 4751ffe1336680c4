"""The maskgit sampler's options (`<decoding>.maskgit.*`, e.g. `rl.decoding.maskgit.rcr=true`): MDPO's
sampler, MaskGIT's floor schedule over semi-AR blocks with top-p/top-k confidences (the sampler:
`dare.rollout.maskgit`)."""

from __future__ import annotations

from dataclasses import dataclass

from dare.decoding.masked import semi_ar_blocks

NAME = "maskgit"


@dataclass
class MaskgitOptions:
    rcr: bool = False
    """Running-confidence remasking: committed tokens whose confidence falls behind are re-masked and decoded
    again (`dare.rollout.maskgit`)."""
    top_p: float = 1.0
    """Keep the smallest set of tokens whose probability reaches p (the confidence renormalised over it, even
    at T = 0); 1 = all."""
    top_k: int = 0
    """Keep the k most probable tokens; 0 = all."""


def check(o: MaskgitOptions, d):
    """The rules of the maskgit sampler's options given the common settings `d`, as (holds, message, *keys)."""
    yield 0 < o.top_p <= 1, "must be in (0, 1]", "maskgit.top_p"
    yield o.top_k >= 0, "must be >= 0", "maskgit.top_k"
    yield from semi_ar_blocks(d)
