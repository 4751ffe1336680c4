"""Rollout: one sampling interface that RL, evaluation and benchmarks all share.

    out = generate(model, prompt_ids, prompt_mask, decoding, generator)

`prompt_ids` are left-padded (B, P) with `prompt_mask` marking real tokens; padded positions are
never attended, so a row decodes exactly as it would alone at temperature 0 (sampled decoding
draws the batch's noise from one generator). `decoding` is a `DecodingConfig`; its `sampler`
chooses the algorithm ("auto": the block sampler for block-causal models, the masked-diffusion
sampler otherwise), and each sampler reads its own options section (`decoding.masked`, `decoding.block`, ...,
defined and checked at config load by `dare.decoding`):

    masked   LLaDA's reference sampler + Fast-dLLM prefix/dual cache, threshold/factor parallel
             decoding (`dare.rollout.llada`); Dream runs here too through its aligned logits
    dream    Dream's own algorithms: origin, maskgit_plus, topk_margin, entropy (`dare.rollout.dream`)
    block    SDAR / LLaDA2 block diffusion with a cache of committed blocks (`dare.rollout.block`); with
             `block.dynamic` b1's dynamic-size blocks ended by a marker token (`dare.rollout.dynamic`)
    maskgit  MDPO's sampler: MaskGIT schedule, top-p/top-k confidences, running-confidence
             remasking (`rcr`, `dare.rollout.maskgit`)
    truncated AGRPO's sampler: a fixed count per step, top-k/top-p truncation, the drawn log-probs,
             entropies and supports recorded (`dare.rollout.truncated`)

With `decoding.tree` (masked sampler) the rows' G completions grow as one tree per prompt whose
siblings share their parent's partial canvas (`dare.rollout.tree`, d-TreeRPO); `tree.branch`
continues any partial masked-sampler rollout as k children.

The output (`RolloutOutput`) carries the sequences (prompt + `gen_length` tokens), the response
mask (up to and including the first EOS), the number of forward passes (NFE), the step that
committed each generated position and, with `record` states, the response after every step.
"""

from dataclasses import replace

import torch

from dare.rollout import block, dream, dynamic, llada, maskgit, tree, truncated
import dare.rollout.core as rollout_core
from dare.rollout.core import RolloutOutput, compiles, decode_responses, left_pad, response_mask
from dare.models import facts
from dare.utils import UserError

SAMPLERS = {"masked": llada.generate, "dream": dream.generate, "block": block.generate, "maskgit": maskgit.generate,
            "truncated": truncated.generate}
"""Sampler name -> its `generate`; each reads the common settings of `decoding` and its own options section
(`decoding.<name>`, defined and checked at config load by `dare.decoding.<name>`)."""


def sampler_name(model, decoding) -> str:
    """The sampler `generate` runs for this model and these decoding settings."""
    if decoding.sampler != "auto":
        return decoding.sampler

    return "block" if facts(model).attention == "block_causal" else "masked"


def on_device(generator, device) -> torch.Generator | None:
    """A generator on the model's device: the given one, or (e.g. a CPU generator with a CUDA
    model) one seeded by a draw from it, so sampling stays reproducible from the caller's seed."""
    if generator is None or generator.device == torch.device(device):
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    return torch.Generator(device=device).manual_seed(seed)


def bucketed(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, pad_id: int):
    """(ids, mask, extra): the prompts left-padded to the next multiple of `rollout_core.BUCKET` columns, and how
    many columns were added."""
    B, P = prompt_ids.shape
    extra = -P % rollout_core.BUCKET
    if not extra:
        return prompt_ids, prompt_mask, 0
    ids = torch.cat([torch.full((B, extra), pad_id, dtype=prompt_ids.dtype, device=prompt_ids.device), prompt_ids], 1)
    mask = torch.cat([torch.zeros((B, extra), dtype=prompt_mask.dtype, device=prompt_mask.device), prompt_mask], 1)
    return ids, mask, extra


BIDIRECTIONAL_ONLY = ("maskgit", "truncated")
"""Samplers that decode bidirectional (masked) models only."""


def generate(model, prompt_ids, prompt_mask, decoding, generator=None, marker_id=None, fixed=None) -> RolloutOutput:
    """`marker_id`: the token that ends a block under the block sampler's dynamic blocks (`decoding.block.dynamic`;
    `dare.rollout.dynamic.marker_id(tokenizer, decoding)`). `fixed` (B, gen_length): inpainting, the masked sampler's
    given tokens (-1 where decoded; `dare.rollout.llada.generate`)."""
    name = sampler_name(model, decoding)
    if fixed is not None and (name != "masked" or decoding.tree):
        raise UserError(f"inpainting (given tokens) is the masked sampler's, without a tree; this rollout decodes with "
                        f"the {name} sampler{' and a tree' if decoding.tree else ''}")
    if name in BIDIRECTIONAL_ONLY and facts(model).attention == "block_causal":
        raise UserError(f"decoding.sampler={name}: this sampler decodes bidirectional (masked) models; this model is "
                        "block-causal: use sampler=block")
    if decoding.tree and name != "masked":
        raise UserError(f"decoding.tree: tree rollouts branch the masked sampler's canvas (LLaDA-style); this model "
                        f"decodes with the {name} sampler")
    device = next(model.parameters()).device
    generator = on_device(generator, device)
    extra = 0
    cache = decoding.masked.cache  # the masked sampler's captured step is its cached one (block pads its own canvas)
    captured = cache in ("prefix", "dual") and compiles(decoding, device, static=cache == "dual")
    if name == "masked" and not decoding.tree and captured:
        prompt_ids, prompt_mask, extra = bucketed(prompt_ids, prompt_mask, facts(model).pad_token_id)
    if decoding.tree:
        out = tree.generate(model, prompt_ids, prompt_mask, decoding, generator)
    elif name == "block" and decoding.block.dynamic:
        out = dynamic.generate(model, prompt_ids, prompt_mask, decoding, generator, marker_id)
    else:  # given tokens reach the masked sampler only (checked above)
        out = SAMPLERS[name](model, prompt_ids, prompt_mask, decoding, generator,
                             **({} if fixed is None else {"fixed": fixed}))
    if extra:  # the caller's layout: its own prompt width
        out = replace(out, sequences=out.sequences[:, extra:], attention_mask=out.attention_mask[:, extra:],
                      prompt_length=out.prompt_length - extra)
    return replace(out, decoding=decoding)


def replay(out: RolloutOutput) -> torch.Tensor:
    """The final response rebuilt from the step map and the trajectory's per-step states: each
    position takes the token it held right after the step that (last) committed it."""
    if out.trajectory is None:
        raise ValueError("no trajectory: decode with record=[states]")
    steps = out.step_map.clamp(min=0)
    states = out.trajectory  # (B, T, G)
    rebuilt = torch.gather(states.transpose(1, 2), 2, steps[..., None]).squeeze(-1)
    return torch.where(out.step_map >= 0, rebuilt, out.responses)


__all__ = ["RolloutOutput", "SAMPLERS", "decode_responses", "generate", "left_pad", "replay", "response_mask",
           "sampler_name"]
