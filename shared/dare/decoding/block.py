"""The block sampler's options (`<decoding>.block.*`, e.g. `rl.decoding.block.editing_threshold=0.9`): SDAR's
and LLaDA2.0/2.1's block diffusion on block-causal models (the sampler: `dare.rollout.block`; `steps` are per
block, the block is the model's own, `block_length` is not used). `dynamic`: b1's dynamic-size blocks (the
model ends each block with a marker token; `dare.rollout.dynamic`)."""

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
    dynamic: bool = False
    """b1's dynamic-size blocks (arXiv 2605.02263; `YanJiangJerry/Block-R1@fd7a1b8`
    `rl/trainers/dynamic_generate.py`): each row decodes a window of up to `dynamic_max_block` tokens in `steps`
    steps and ends its block right after the first `dynamic_marker` token it commits there (the rest of the window
    is masked again); the row's block layout is recorded (`RolloutOutput.segments`) and the block estimators'
    draws follow it (`dare.train.noise.rollout_segments`). Off: the model's fixed blocks."""
    dynamic_max_block: int = 0
    """The window, the longest block (the reference's `initial_length`); 0 = gen_length // 2, the reference's."""
    dynamic_marker: str = "block"
    """The text whose single token ends a block (the reference: `tokenizer.encode("block")`, the word of the
    prompt's `\\block` tag); resolved with the run's tokenizer (`dare.rollout.dynamic.marker_id`)."""
    dynamic_min_offset: int = 1
    """A marker ends the block only at this offset in it or later, and the marker is looked for every this many
    steps (the reference's `dynamic`, 1)."""
    dynamic_reward: float = 0.0
    """Weight of b1's block-entropy reward added to the task's reward in RL (0.5 entropy trend + 0.5 block
    count, `RolloutOutput.block_reward`); the reference's b1 wd1 adds it with weight 1."""
    dynamic_target_blocks: int = 10
    """The block count at which the reward's count term saturates (the reference's `target_num_blocks`)."""


def check(o: BlockOptions, d):
    """The rules of the block sampler's options given the common settings `d` (a `DecodingConfig`), as
    (holds, message, *keys) with keys relative to the decoding section."""
    yield (o.remasking != "left_to_right" or not o.threshold, "left-to-right order commits a fixed count per "
           "step: no threshold rule", "block.remasking", "block.threshold")
    yield 0 <= o.threshold <= 1, "must be in [0, 1]", "block.threshold"
    yield 0 < o.top_p <= 1, "must be in (0, 1]", "block.top_p"
    yield o.top_k >= 0, "must be >= 0", "block.top_k"
    yield 0 <= o.editing_threshold <= 1, "must be in [0, 1]", "block.editing_threshold"
    if o.dynamic:
        yield o.dynamic_max_block >= 0, "must be >= 0 (0: gen_length // 2)", "block.dynamic_max_block"
        yield o.dynamic_min_offset >= 1, "must be >= 1", "block.dynamic_min_offset"
        yield o.dynamic_target_blocks >= 1, "must be >= 1", "block.dynamic_target_blocks"
        yield bool(o.dynamic_marker), "the marker text must not be empty", "block.dynamic_marker"
        yield (not o.threshold and not o.editing_threshold and o.remasking == "low_confidence",
               "dynamic blocks commit the step's quota of most confident tokens (b1's rule): no threshold, "
               "editing or left-to-right order", "block.dynamic", "block.threshold", "block.editing_threshold",
               "block.remasking")
        yield (o.cache in ("auto", "none"), "dynamic blocks recompute the prefix every step (their windows cross "
               "the model's blocks): cache auto or none", "block.dynamic", "block.cache")
    else:
        yield not o.dynamic_reward, "the block-entropy reward needs block.dynamic=true", "block.dynamic_reward"
