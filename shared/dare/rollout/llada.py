"""LLaDA's reference sampler (`ML-GSAI/LLaDA:generate.py`), batched and pad-aware.

    x = [prompt | MASK * gen_length]; the response is split into blocks of `block_length`,
    decoded left to right; each block gets steps / n_blocks steps and its masked tokens are
    committed in an even split over them (the remainder goes to the first steps).
    At each step: x0 = Gumbel-max sample of the logits (argmax at temperature 0);
    confidence = softmax probability of x0 ("low_confidence") or U(0,1) ("random");
    positions after the current block and already committed positions get -inf;
    the k most confident positions of each row are committed.

Differences from the reference, none of which change its greedy outputs:
1. Gumbel-max is computed in log space, `argmax(logits - T * log(-log u))`, in float64; the
   reference's `exp(logits) / (-log u)^T` has the same argmax but can overflow for large logits.
2. Sampling and confidences are computed for the current block only: every other position gets
   confidence -inf in the reference and is never committed, so this changes nothing but memory
   (float64 (B, block, V) instead of (B, L, V)).
3. Randomness comes from an explicit `torch.Generator` (the reference uses the global RNG), so
   sampled outputs match the reference in distribution, not draw for draw.
4. Left padding is masked out of attention (see `dare.models.llada`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dare.models import facts, token_logits
from dare.rollout.core import RolloutOutput, response_mask


def num_transfer_tokens(masked_count: torch.Tensor, steps: int) -> torch.Tensor:
    """(B,) masked tokens of a block -> (B, steps) tokens to commit per step."""
    base = masked_count // steps
    remainder = masked_count % steps
    k = base[:, None].repeat(1, steps)
    k += (torch.arange(steps, device=masked_count.device)[None, :] < remainder[:, None]).long()
    return k


def sample_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """Gumbel-max sample from softmax(logits / T) in float64; argmax at T = 0."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    u = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
    return (logits.to(torch.float64) - temperature * torch.log(-torch.log(u))).argmax(dim=-1)


def _logits(model, x, attention_mask, prompt_positions, mask_id: int, cfg_scale: float):
    if cfg_scale <= 0:
        return token_logits(model, x, attention_mask)
    # Unsupervised classifier-free guidance: the unconditional pass sees the prompt masked.
    uncond = torch.where(prompt_positions, torch.full_like(x, mask_id), x)
    both = token_logits(model, torch.cat([x, uncond]), torch.cat([attention_mask, attention_mask]))
    cond, un = both.chunk(2)
    return un + (cfg_scale + 1) * (cond - un)


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, params,
             generator: torch.Generator | None = None) -> RolloutOutput:
    f = facts(model)
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    B, P = prompt_ids.shape
    G, BL = params.gen_length, params.block_length
    n_blocks = G // BL
    steps_per_block = params.steps // n_blocks

    x = torch.full((B, P + G), f.mask_token_id, dtype=torch.long, device=device)
    x[:, :P] = prompt_ids
    attention_mask = torch.cat([prompt_mask.long(), torch.ones(B, G, dtype=torch.long, device=device)], dim=1)
    prompt_positions = torch.zeros_like(x, dtype=torch.bool)
    prompt_positions[:, :P] = True
    step_map = torch.full((B, G), -1, dtype=torch.long, device=device)
    nfe, step = 0, 0

    for b in range(n_blocks):
        lo, hi = P + b * BL, P + (b + 1) * BL
        k_per_step = num_transfer_tokens((x[:, lo:hi] == f.mask_token_id).sum(dim=1), steps_per_block)
        for i in range(steps_per_block):
            block = x[:, lo:hi]  # (B, BL)
            masked = block == f.mask_token_id
            logits = _logits(model, x, attention_mask, prompt_positions, f.mask_token_id, params.cfg_scale)
            logits = logits[:, lo:hi]  # positions outside the block are never committed
            nfe += 1
            x0 = sample_tokens(logits, params.temperature, generator)
            if params.remasking == "low_confidence":
                probs = F.softmax(logits, dim=-1)
                conf = torch.gather(probs, -1, x0.unsqueeze(-1)).squeeze(-1).to(torch.float64)
            else:  # "random"
                conf = torch.rand(x0.shape, dtype=torch.float64, device=device, generator=generator)
            conf = torch.where(masked, conf, torch.tensor(-torch.inf, dtype=conf.dtype, device=device))

            k = k_per_step[:, i]
            kmax = int(k.max())
            commit = torch.zeros_like(masked)
            if kmax > 0:
                top = conf.topk(kmax, dim=1).indices  # (B, kmax), most confident first
                keep = torch.arange(kmax, device=device)[None, :] < k[:, None]
                commit.scatter_(1, top, keep)
            x[:, lo:hi] = torch.where(commit, x0, block)
            step_map[:, lo - P:hi - P][commit] = step
            step += 1

    responses = x[:, P:]
    return RolloutOutput(sequences=x, attention_mask=attention_mask, prompt_length=P,
                         response_mask=response_mask(responses, f.eos_token_id), step_map=step_map, nfe=nfe)
