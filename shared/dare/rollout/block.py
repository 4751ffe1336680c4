"""Block diffusion for block-causal models (SDAR, LLaDA2.x): SDAR's `block_diffusion_generate`
(`JetAstra/SDAR:generate.py`) and LLaDA2's `generate`, with a KV cache of committed blocks,
batched over prompts of different lengths.

    Blocks are the model's own (`block_size` from its config), counted from each prompt's first
    token. Complete prompt blocks are prefilled into the cache; the block holding the prompt's
    tail is the first decoded block (its prompt tokens stay fixed, as in the originals). Each
    block is denoised on top of the cache (read only) in at most `steps` steps:
      static  (threshold = 0): commit the quota's most confident masked tokens, the quota being
              an even split of the block's masked tokens over `steps`;
      dynamic (threshold > 0): commit every masked token with p > threshold if there are at least
              the quota of them, else the quota's most confident (SDAR's `low_confidence_dynamic`,
              LLaDA2's rule);
    then one more forward appends the finished block's keys to the cache (SDAR's `store_kv`).
    Tokens: argmax at temperature 0, else sampled after temperature/top-p/top-k, with p the
    probability of the chosen token. `eos_early_stop`: once every row has an EOS and nothing is
    masked before it, decoding stops and the rest is filled with EOS.
    LLaDA2.1 token editing (`editing_threshold` > 0): at every step, already generated tokens of
    the current block whose prediction differs with p > editing_threshold are overwritten; after
    the block is unmasked, up to `max_post_steps` more steps run while edits happen.

Batching: each row's prompt is placed so that its first token starts a block column (left
padding by whole blocks), so one column chunk is one block for every row; rows with longer
prompts simply have more prompt tokens in the chunk. The output is repacked to the usual layout
(left-padded prompt, then `gen_length` tokens). `block_length` is not used: the block is the
model's. The cache of committed blocks is exact; `cache=none` recomputes the whole prefix every
step instead (as LLaDA2's HF `generate`), which the tests use as the reference.

Differences from the originals: batch > 1 (both originals decode one prompt at a time);
LLaDA2's HF `generate` recomputes the whole prefix every step (no cache) and LLaDA2.0 samples
even at temperature 0; we cache (exact for block-causal attention) and take the argmax.
"""

from __future__ import annotations

import torch

from dare.models import facts
from dare.models.core import KVCache
from dare.rollout.core import RolloutOutput, commit_quota, num_transfer_tokens, response_mask
from dare.rollout.dream import sample_tokens


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, params,
             generator: torch.Generator | None = None) -> RolloutOutput:
    f = facts(model)
    if f.block_size is None:
        raise ValueError("the block sampler needs a block-causal model (SDAR, LLaDA2); use sampler=masked")
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device).bool()
    bs, G, mask_id = f.block_size, params.gen_length, f.mask_token_id
    B, P = prompt_ids.shape
    lengths = prompt_mask.sum(dim=1)

    # canvas: [pad (whole blocks) | prompt | MASK * G | filler], every prompt starting a block
    C = -(-int(lengths.max()) // bs) * bs
    W = -(-(C + G) // bs) * bs
    pads = ((C - lengths) // bs) * bs
    x = torch.full((B, W), f.pad_token_id, dtype=torch.long, device=device)
    valid = torch.zeros((B, W), dtype=torch.bool, device=device)
    gen_start = pads + lengths
    for r in range(B):
        p0, n = int(pads[r]), int(lengths[r])
        x[r, p0:p0 + n] = prompt_ids[r][prompt_mask[r]]
        x[r, p0 + n:p0 + n + G] = mask_id
        valid[r, p0:p0 + n + G] = True
    gen_cols = gen_start[:, None] + torch.arange(G, device=device)[None, :]  # (B, G) canvas columns
    generated = torch.zeros_like(valid)
    generated.scatter_(1, gen_cols, True)
    step_canvas = torch.full((B, W), -1, dtype=torch.long, device=device)

    cache, nfe, step, done_cols = KVCache(), 0, 0, 0
    trajectory = []
    for c in range(W // bs):
        cols = slice(c * bs, (c + 1) * bs)
        if not (x[:, cols] == mask_id).any():
            continue  # nothing to decode here yet: prefilled together with the next block
        cached = params.cache != "none"
        if cached and done_cols < c * bs:  # prefill the complete blocks before this one
            model(x[:, done_cols:c * bs], valid[:, done_cols:c * bs], past_key_values=cache, use_cache=True)
            nfe += 1
        quota = num_transfer_tokens((x[:, cols] == mask_id).sum(dim=1), params.steps)
        i = post = 0
        while True:
            masked = x[:, cols] == mask_id
            editing = params.editing_threshold > 0
            if not masked.any() and (not editing or post >= params.max_post_steps):
                break
            if cached:
                logits = model(x[:, cols], valid[:, cols], past_key_values=cache).logits
            else:  # recompute everything up to the end of the block (LLaDA2's HF `generate`)
                logits = model(x[:, :cols.stop], valid[:, :cols.stop]).logits[:, cols]
            nfe += 1
            flat = logits.reshape(-1, logits.shape[-1]).float()
            flat[:, mask_id] = -torch.inf  # never predict MASK (the loop runs until the block is clean)
            conf, x0 = sample_tokens(flat, params, generator)
            conf, x0 = conf.view(B, bs).double(), x0.view(B, bs)
            k = quota[:, min(i, params.steps - 1)]
            masked_conf = torch.where(masked, conf, torch.tensor(-torch.inf, dtype=conf.dtype, device=device))
            commit = commit_quota(masked_conf, k)
            if params.threshold > 0:
                above = masked & (conf > params.threshold)
                enough = above.sum(dim=1) >= k
                commit = torch.where(enough[:, None], above, commit)
            if editing:
                gen_block = generated[:, cols] & ~masked
                edit = gen_block & (conf > params.editing_threshold) & (x0 != x[:, cols])
                if not masked.any():
                    post += 1
                    if not edit.any():
                        break
                commit = commit | edit
            x[:, cols] = torch.where(commit, x0, x[:, cols])
            step_canvas[:, cols][commit] = step
            step += 1
            i += 1
            if params.record_trajectory:
                trajectory.append(x.gather(1, gen_cols).clone())
        if cached:
            model(x[:, cols], valid[:, cols], past_key_values=cache, use_cache=True)  # commit the block's keys
            nfe += 1
        done_cols = (c + 1) * bs
        if params.eos_early_stop and _all_finished(x.gather(1, gen_cols), mask_id, f.eos_token_id):
            response = x.gather(1, gen_cols)
            x.scatter_(1, gen_cols, torch.where(response == mask_id, f.eos_token_id, response))
            break

    responses = x.gather(1, gen_cols)
    sequences = torch.cat([prompt_ids, responses], dim=1)
    attention_mask = torch.cat([prompt_mask.long(), torch.ones(B, G, dtype=torch.long, device=device)], dim=1)
    return RolloutOutput(sequences=sequences, attention_mask=attention_mask, prompt_length=P,
                         response_mask=response_mask(responses, f.eos_token_id),
                         step_map=step_canvas.gather(1, gen_cols), nfe=nfe, sampler="block",
                         trajectory=torch.stack(trajectory) if trajectory else None)


def _all_finished(responses: torch.Tensor, mask_id: int, eos_id: int) -> bool:
    """Every row has an EOS with nothing masked before it."""
    is_eos = responses == eos_id
    if not is_eos.any(dim=1).all():
        return False
    first = is_eos.float().argmax(dim=1)
    before = torch.arange(responses.shape[1], device=responses.device)[None, :] < first[:, None]
    return not ((responses == mask_id) & before).any()
