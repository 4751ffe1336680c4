"""The block sampler's options (`<decoding>.block.*`, e.g. `rl.decoding.block.editing_threshold=0.9`): SDAR's
and LLaDA2.0/2.1's block diffusion on block-causal models (the sampler: `dare.rollout.block`; `steps` are per
block, the block is the model's own, `block_length` is not used)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

NAME = "block"


@dataclass
class BlockOptions:
    remasking: Literal["low_confidence", "left_to_right"] = "low_confidence"
    """Which masked positions a step commits: the most confident, or the leftmost ones (with one token per
    step that is autoregressive order: JustGRPO's rollouts on block models)."""
    cache: Literal["auto", "none", "prefix", "dual"] = "auto"
    """auto (prefix and dual, the masked sampler's names, mean the same): the exact cache of committed blocks;
    none: recompute the whole prefix every step (LLaDA2's HF `generate`)."""
    threshold: float = 0.0
    """The dynamic rule: every masked token above it if there are at least the step's quota of them, else the
    quota's most confident (SDAR `low_confidence_dynamic`, LLaDA2's rule); 0 = static (the quota)."""
    top_k: int = 0
    """Sampling (T > 0): keep the k most probable tokens; 0 = all."""
    top_p: float = 1.0
    """Sampling (T > 0): keep the smallest set of tokens whose probability reaches p; 1 = all."""
    eos_early_stop: bool = False
    """Stop once every row has committed an EOS (the rest is filled with EOS)."""
    editing_threshold: float = 0.0
    """LLaDA2.1 token editing: re-write a committed token of the current block whose prediction changed with
    probability above this; 0 = off."""
    max_post_steps: int = 16
    """Token editing: at most this many steps after a row's block is unmasked, while edits happen."""


def check(o: BlockOptions, d):
    """The rules of the block sampler's options given the common settings `d` (a `DecodingConfig`), as
    (holds, message, *keys) with keys relative to the decoding section."""
    yield (o.remasking != "left_to_right" or not o.threshold, "left-to-right order commits a fixed count per "
           "step: no threshold rule", "block.remasking", "block.threshold")
    yield 0 <= o.threshold <= 1, "must be in [0, 1]", "block.threshold"
    yield 0 < o.top_p <= 1, "must be in (0, 1]", "block.top_p"
    yield o.top_k >= 0, "must be >= 0", "block.top_k"
    yield 0 <= o.editing_threshold <= 1, "must be in [0, 1]", "block.editing_threshold"
