"""The masked sampler's options (`<decoding>.masked.*`, e.g. `rl.decoding.masked.threshold=0.9`): LLaDA's
semi-autoregressive sampler with Fast-dLLM's caches and parallel rules, CJ-GRPO's schedule and EOSER and
TraceRL's window (the sampler: `dare.rollout.llada`; the tree rollouts of `decoding.tree` run it too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

NAME = "masked"


@dataclass
class MaskedOptions:
    remasking: Literal["low_confidence", "random", "left_to_right", "margin"] = "low_confidence"
    """Which masked positions a step commits: the most confident, random ones, the leftmost ones (with one
    token per step that is autoregressive order: JustGRPO's rollouts), or those with the largest margin
    between their two most probable tokens (TraceRL's `margin_confidence` target, `llada_rl_rollout.py`)."""
    cache: Literal["auto", "none", "prefix", "dual"] = "auto"
    """Fast-dLLM's KV cache: prefix (before the block) or dual (prefix and suffix); auto = none (the reference)."""
    threshold: float = 0.0
    """Parallel decoding: commit every masked token whose confidence reaches it (at least one per step, every
    block decoded until it is clean); 0 = off (the fixed quota)."""
    factor: float = 0.0
    """Fast-dLLM's factor rule: commit the n most confident with c_m >= 1 - f/(m+1); 0 = off."""
    cfg_scale: float = 0.0
    """Classifier-free guidance (LLaDA's `cfg_scale`); 0 = off."""
    logits_eos_inf: bool = False
    """LLaDA option: never predict EOS."""
    confidence_eos_eot_inf: bool = False
    """LLaDA option: EOS/EoT predictions get confidence -inf (committed last)."""
    schedule: Literal["even", "ass"] = "even"
    """How many tokens each step commits. even: each block's masks split evenly over its steps (LLaDA); ass:
    CJ-GRPO's ascending step size, step i commits 2^i tokens and the last step the rest, with steps =
    floor(log2 gen_length) and `ass_blocks` blocks carved from the largest powers of two (`block_length` is
    not used then; `dare.rollout.llada.ass_plan`)."""
    ass_blocks: int = 1
    """ASS: the number of blocks (CJ-GRPO's `block_num`)."""
    eos_gamma_min: float = 1.0
    """EOSER (CJ-GRPO's EOS early rejection): the confidence of a position whose prediction is EOS is multiplied
    by gamma, which rises from `eos_gamma_min` to `eos_gamma_max` over the steps (`dare.rollout.llada.eos_gamma`);
    1 and 1 = off. CJ-GRPO trains with 0.01."""
    eos_gamma_max: float = 1.0
    further_horizon: int | None = None
    """With the prefix cache: every step after a block's first forward runs the block and only this many
    positions after it on the cache (the rest of the canvas is not seen: TraceRL's LLaDA rollout,
    `llada_rl_rollout.py`, `further_horizon`, 128 in `rl_llada.yaml`); 0 = the block alone (the original's
    window `x[:, s:min(e + 0, L)]`); None (unset) = no window, everything after the block (Fast-dLLM).
    Configs saved before this option took None for "no window" recorded 0 there."""


def check(o: MaskedOptions, d, layout: bool = True):
    """The rules of the masked sampler's options given the common settings `d` (a `DecodingConfig`), as
    (holds, message, *keys) with keys relative to the decoding section. `layout`: also the semi-AR block
    layout (off for sampler=auto until the model's family says the masked sampler runs)."""
    parallel = o.threshold or o.factor
    yield (o.remasking != "left_to_right" or not parallel, "left-to-right order commits a fixed count per step: "
           "no threshold or factor rule", "masked.remasking", "masked.threshold")
    yield (o.remasking != "left_to_right" or (o.eos_gamma_min, o.eos_gamma_max) == (1.0, 1.0), "left-to-right "
           "order ranks positions, not confidences: EOSER (eos_gamma_min/max) would reorder it", "masked.remasking",
           "masked.eos_gamma_min")
    window = o.further_horizon is not None
    yield (not window or o.further_horizon >= 0, "must be >= 0 (0: the block alone; unset: everything after "
           "the block)", "masked.further_horizon")
    yield (not window or o.cache == "prefix", "the horizon is a window on the masked sampler's prefix cache: set "
           "masked.cache=prefix, or unset it (null: no window; 0 is the block alone, and configs saved before "
           "that wrote 0 for no window)", "masked.further_horizon", "masked.cache")
    yield o.cfg_scale >= 0, "must be >= 0", "masked.cfg_scale"
    yield 0 <= o.threshold <= 1, "must be in [0, 1]", "masked.threshold"
    yield o.factor >= 0, "must be >= 0", "masked.factor"
    yield not (o.threshold and o.factor), "choose one parallel rule: threshold or factor", "masked.threshold", \
        "masked.factor"
    yield (not (o.cfg_scale and o.cache in ("prefix", "dual")), "classifier-free guidance is not combined with a "
           "KV cache", "masked.cfg_scale", "masked.cache")
    yield (0 <= o.eos_gamma_min <= o.eos_gamma_max, "need 0 <= eos_gamma_min <= eos_gamma_max",
           "masked.eos_gamma_min", "masked.eos_gamma_max")
    yield (not ({"greedy", "entropies"} & set(d.record)) or (o.cache in ("auto", "none") and not parallel
                                                             and not d.tree),
           "record greedy/entropies: the argmax completion of the whole canvas and the committed tokens' entropies "
           "at every step come from the fixed schedule without a cache (every step's full forward), no tree",
           "record", "masked.cache")
    if d.tree:
        yield (o.cache in ("auto", "none") and not parallel, "tree rollouts continue the masked sampler's fixed "
               "schedule: no KV cache, no parallel rule (threshold, factor)", "tree", "masked.cache",
               "masked.threshold")
    if o.schedule == "ass":
        yield (d.gen_length >= 2 and d.steps == d.gen_length.bit_length() - 1, f"the ascending schedule commits 1, "
               f"2, 4, ... tokens: steps must be floor(log2 gen_length) = {max(d.gen_length.bit_length() - 1, 1)} "
               f"for gen_length {d.gen_length}, got {d.steps}", "steps", "masked.schedule")
        yield 1 <= o.ass_blocks <= d.steps, f"must be in [1, steps = {d.steps}]", "masked.ass_blocks"
        yield (not parallel, "the ascending schedule fixes each step's count: no parallel rule (threshold, factor)",
               "masked.schedule", "masked.threshold", "masked.factor")
    if layout:
        yield from blocks(o, d)


def blocks(o: MaskedOptions, d):
    """The semi-AR layout: `gen_length` a multiple of `block_length`, `steps` of the number of blocks (the
    ascending schedule makes its own blocks). Checked at config load for sampler=masked, and for sampler=auto
    where the config names a bidirectional `model.family`; otherwise by the sampler once the model is loaded."""
    if o.schedule == "ass":
        return
    yield from semi_ar_blocks(d)


def semi_ar_blocks(d):
    """`gen_length` a multiple of `block_length` and `steps` a positive multiple of the number of blocks."""
    yield (d.gen_length % d.block_length == 0, f"gen_length ({d.gen_length}) must be a multiple of block_length "
           f"({d.block_length})", "gen_length", "block_length")
    n_blocks = d.gen_length // d.block_length
    yield (d.steps > 0 and d.steps % n_blocks == 0, f"steps ({d.steps}) must be a positive "
           f"multiple of the number of blocks ({n_blocks})", "steps", "gen_length", "block_length")
