"""MDPO's sampler (autonomousvision/mdpo @e6ae439, `src/mdlm_generation_utils.py::diffusion_generate`),
batched and pad-aware, with its running-confidence remasking (RCR), for the bidirectional families.

    x = [prompt | MASK * gen_length]; blocks of `block_length` left to right, steps / n_blocks steps
    each. The block's masks are committed on MaskGIT's floor schedule (`maskgit_quota`: after step t,
    m - floor(m * max(1 - (t + 1) / steps, 1e-6)) of the m masks are committed; 10 over 4 steps:
    3, 2, 3, 2). Each step: the logits are divided by the temperature, filtered by top-p / top-k,
    and x0 is sampled from their softmax (its argmax at temperature 0); the confidence is the
    probability of x0 under that filtered distribution (so top-p renormalises it even at T = 0).
    Without RCR the quota's most confident masked positions of the block are committed.

RCR (`rcr=true`, "as the code does it"): each step fills EVERY masked position up to the end of the
block (earlier blocks' re-masked positions included) and stores its confidence; committed tokens
keep the confidence they were last committed with. Unless it is the block's last step, it then
re-masks the positions with the lowest stored confidence, as many as the schedule still has to
commit (the sum of the remaining quotas), ranking the whole row with every position that holds no
stored confidence (prompt, padding, later blocks) counted as 1.0. Committed tokens can so be revised,
earlier blocks' too; `step_map` gives each position's LAST commit.

With `record` predictions the output also keeps, per step, MDPO's `intermediate_results` (x0-hat: the
canvas with every masked position replaced by its prediction, later blocks included) as `predictions`
and its `intermediate_confidence` as `confidences` (without RCR the confidence of each position's
prediction; with RCR the stored confidences after the step, 0 where none).

Differences from the reference: randomness comes from an explicit generator (`torch.multinomial`
instead of `Categorical.sample`, same distribution); the reference decodes one prompt at a time,
here rows are batched with left padding hidden from attention (positions from each prompt's first
token); the reference computes in its autocast dtype (bf16 on GPU), here in the model's.
"""

from __future__ import annotations

import math

import torch

from dare.models import facts, token_logits
from dare.rollout.core import RolloutOutput, canvas, commit_quota, response_mask
from dare.rollout.dream import sample_tokens
from dare.utils import UserError


def maskgit_quota(masks: int, steps: int) -> list[int]:
    """MaskGIT's linear floor schedule (`get_num_transfer_tokens_maskgit`, mode "linear"): how many of
    `masks` tokens each of `steps` steps commits."""
    done = [masks - math.floor(masks * max(1 - (t + 1) / steps, 1e-6)) for t in range(steps)]
    return [done[0]] + [done[t] - done[t - 1] for t in range(1, steps)]


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, decoding,
             generator: torch.Generator | None = None) -> RolloutOutput:
    f, o = facts(model), decoding.maskgit  # o: this sampler's options (`dare.decoding.maskgit`)
    G, BL = decoding.gen_length, decoding.block_length
    n_blocks = G // BL
    if G % BL or decoding.steps % n_blocks:
        raise UserError(f"decoding: gen_length ({G}) must be a multiple of block_length ({BL}) and steps "
                        f"({decoding.steps}) a multiple of the number of blocks ({n_blocks}) for the maskgit sampler")
    spb, mask_id = decoding.steps // n_blocks, f.mask_token_id
    x, attention_mask, prompt_ids, prompt_mask = canvas(model, prompt_ids, prompt_mask, G, mask_id)
    (B, P), device = prompt_ids.shape, x.device
    L = P + G
    step_map = torch.full((B, G), -1, dtype=torch.long, device=device)
    stored = torch.zeros(B, L, dtype=torch.float64, device=device)  # RCR: each token's last commit confidence
    trajectory, predictions, confidences, nfe, step = [], [], [], 0, 0

    for b in range(n_blocks):
        hi = P + (b + 1) * BL
        quota = maskgit_quota(BL, spb)
        for i in range(spb):
            masked = x == mask_id
            logits = token_logits(model, x, attention_mask)[:, P:]
            nfe += 1
            predicted, x0 = sample_tokens(logits.reshape(-1, logits.shape[-1]), decoding.temperature, o,
                                          generator)
            predicted, x0 = predicted.view(B, G).double(), x0.view(B, G)
            conf = torch.full((B, L), -torch.inf, dtype=torch.float64, device=device)
            conf[:, P:hi] = predicted[:, :hi - P]
            conf = torch.where(masked, conf, -torch.inf)
            proposal = torch.cat([x[:, :P], torch.where(masked[:, P:], x0, x[:, P:])], dim=1)
            if "predictions" in decoding.record:  # MDPO's x0-hat at this step: every masked position predicted
                predictions.append(proposal[:, P:].clone())
            k = sum(quota[i:]) if o.rcr else quota[i]
            chosen = commit_quota(conf, torch.full((B,), k, device=device))
            x = torch.where(chosen, proposal, x)
            step_map[chosen[:, P:]] = step
            if o.rcr:
                stored = torch.where(chosen, conf, stored)
                if i < spb - 1:
                    ranked = torch.where(stored == 0, 1.0, stored)
                    again = sum(quota[i + 1:])
                    if again > 0:
                        rows = torch.arange(B, device=device)[:, None]
                        x[rows, ranked.topk(again, dim=1, largest=False).indices] = mask_id
            step += 1
            if "states" in decoding.record:
                trajectory.append(x[:, P:].clone())
            if "predictions" in decoding.record:
                confidences.append((stored[:, P:] if o.rcr else predicted).float())

    responses = x[:, P:]
    return RolloutOutput(sequences=x, attention_mask=attention_mask, prompt_length=P,
                         response_mask=response_mask(responses, f.stop_ids), step_map=step_map, nfe=nfe,
                         sampler="maskgit", trajectory=torch.stack(trajectory, dim=1) if trajectory else None,
                         predictions=torch.stack(predictions, dim=1) if predictions else None,
                         confidences=torch.stack(confidences, dim=1) if confidences else None)
