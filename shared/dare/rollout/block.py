"""Block diffusion for block-causal models (SDAR, LLaDA2.x): SDAR's `block_diffusion_generate`
(`JetAstra/SDAR:generate.py`) and LLaDA2.0/2.1's `generate` (HF remote code, mirrored in
`ZHZisZZ/dllm:dllm/pipelines/llada2*/models/`), with a KV cache of committed blocks, batched over
prompts of different lengths.

    Blocks are the model's own (`block_size` from its config), counted from each prompt's first
    token; the canvas is [prompt | MASK ...] up to ceil((P + G) / block) * block, so the last block
    is decoded whole, as in both originals, and `gen_length` tokens are returned. Complete prompt
    blocks are prefilled into the cache; the block holding the prompt's tail is the first decoded
    block (its prompt tokens stay fixed). Each block is denoised on top of the cache (read only);
    step i commits up to k_i = min(q_i, still masked) tokens, q being `block_size` split evenly
    over `steps` (the remainder to the first steps; `get_num_transfer_tokens(block_length, steps)`):
      static  (threshold = 0): the k_i most confident masked tokens (SDAR `low_confidence_static`);
      dynamic (threshold > 0): every masked token with p > threshold if there are at least k_i of
              them, else the k_i most confident (SDAR `low_confidence_dynamic`, LLaDA2's rule);
      left to right (remasking=left_to_right): the k_i leftmost masked tokens (autoregressive
              order with one token per step: JustGRPO's rollouts on block models);
    then one more forward appends the finished block's keys to the cache (SDAR's `store_kv`).
    `whole_last_block=False` ends the canvas at `gen_length` instead (the last block is partial), so
    an RL trainer scoring the `gen_length` tokens sees exactly the blocks that were decoded. The
    output's `logps` hold each committed token's log-probability under the distribution it was
    drawn from (the rollout side of the rollout/trainer agreement).
    Tokens: at temperature 0 the argmax, with p its probability under the unfiltered softmax (both
    originals); otherwise sampled after temperature, top-k, then top-p, p its probability under
    that filtered distribution. `eos_early_stop`: once every row has a stop token (EOS or end of
    turn) and nothing is masked before it, decoding stops and the rest is filled with EOS.
    LLaDA2.1 token editing (`editing_threshold` > 0): at every step, already generated tokens of
    the current block whose prediction differs with p > editing_threshold are overwritten; once a
    row's block is unmasked, it runs up to `max_post_steps` more steps while edits happen. The
    post-step counter and the stop are per row: a row decodes the same in a batch as alone.

The options named here are `decoding.block`'s (defined and checked by `dare.decoding.block`).

Batching: each row's prompt is placed so that its first token starts a block column (left
padding by whole blocks), so one column chunk is one block for every row; rows with longer
prompts simply have more prompt tokens in the chunk, and a row whose canvas ends earlier is done
in the later chunks. The output is repacked to the usual layout (left-padded prompt, then
`gen_length` tokens). `block_length` is not used: the block is the model's. The cache of
committed blocks is exact; `cache=none` recomputes the whole prefix every step instead (as
LLaDA2's HF `generate`), which the tests use as the reference.

Differences from the originals (outputs at temperature 0 are the same, pinned in the tests):
1. Batch > 1 (both originals decode one prompt at a time); LLaDA2's HF `generate` recomputes the
   whole prefix every step (no cache) and SDAR's divides by the temperature (T = 0 is undefined
   there; we take the argmax as LLaDA2 does).
2. The mask token is never chosen (its logit is excluded from the argmax and from sampling; its
   probability stays in the T = 0 confidence, as in the originals). Trained checkpoints never
   predict it; on a model that did, the originals would commit MASK and loop.
3. The quota is capped by what is still masked: SDAR's `topk(confidence, q_i)` with fewer than q_i
   masked positions also picks -inf positions and overwrites already decoded (or prompt) tokens
   of the block with their predictions, a bug we do not reproduce. LLaDA2 caps as we do.
4. LLaDA2 caps `steps` at `gen_length // minimal_topk` (1): with steps > gen_length ours keeps
   `steps` (SDAR's behaviour). LLaDA2.1 commits masked tokens with a fixed quota
   (`num_to_transfer` = 1) rather than the schedule: the same as ours with steps = block size.
5. LLaDA2 stops after the first block whose generated part holds an EOS, SDAR after any stop id;
   ours decodes to `gen_length` unless `eos_early_stop`. The response up to its first EOS is the
   same either way (later blocks never change earlier ones).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dare.models import facts, read_at
import dare.rollout.core as rollout_core
from dare.rollout.core import (RolloutOutput, StepForward, any_left, any_rank, commit_quota, compiles,
                               max_rank, place_prompts, response_mask, sharded)
from dare.rollout.dream import top_k_logits, top_p_logits


def schedule(block_size: int, steps: int) -> list[int]:
    """`block_size` tokens split evenly over `steps`, the remainder to the first steps
    (`get_num_transfer_tokens(block_length, steps)` in SDAR and LLaDA2)."""
    return [block_size // steps + (1 if i < block_size % steps else 0) for i in range(steps)]


def choose(logits: torch.Tensor, decoding, mask_id: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, V) logits -> (token, p): the argmax and its unfiltered probability at T = 0, else a
    sample after temperature, top-k and top-p with its probability under that distribution.
    The mask token is never chosen."""
    logits = logits.float()
    allowed = logits.clone()
    allowed[:, mask_id] = -torch.inf
    if decoding.temperature == 0:
        token = allowed.argmax(dim=-1)
        return token, F.softmax(logits, dim=-1).gather(1, token[:, None]).squeeze(1)
    allowed = allowed / decoding.temperature
    o = decoding.block  # this sampler's options (`dare.decoding.block`)
    if o.top_k > 0:
        allowed = top_k_logits(allowed, o.top_k)
    if o.top_p < 1:
        allowed = top_p_logits(allowed, o.top_p)
    probs = F.softmax(allowed, dim=-1)
    token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return token, probs.gather(1, token[:, None]).squeeze(1)


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, decoding,
             generator: torch.Generator | None = None) -> RolloutOutput:
    f, o = facts(model), decoding.block  # o: this sampler's options (`dare.decoding.block`)
    if f.block_size is None:
        raise ValueError("the block sampler needs a block-causal model (SDAR, LLaDA2); use sampler=masked")
    if o.dynamic:  # b1's dynamic-size blocks: `dare.rollout.generate` runs them (`dare.rollout.dynamic`)
        raise ValueError("decoding.block.dynamic: decode through dare.rollout.generate (dare.rollout.dynamic)")
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device).bool()
    bs, G, mask_id = f.block_size, decoding.gen_length, f.mask_token_id
    B, P = prompt_ids.shape
    lengths = prompt_mask.sum(dim=1)

    # canvas: [pad (whole blocks) | prompt | MASK up to the end of the last block | pad], every
    # prompt starting a block column; row r's canvas ends at ends[r]
    cached = o.cache != "none"
    captured = cached and compiles(decoding, device)
    unit = math.lcm(bs, rollout_core.BUCKET) if captured else bs  # captured: prompt widths in buckets, fewer compiles
    C = -(-int(lengths.max()) // unit) * unit
    pads = ((C - lengths) // bs) * bs
    if decoding.whole_last_block:  # the canvas runs to the end of the block holding the last token
        ends = pads + (-(-(lengths + G) // bs)) * bs
    else:  # it ends at gen_length: the last block is partial (its other positions hidden padding)
        ends = pads + lengths + G
    collective = sharded(model)  # FSDP: every rank makes the same forwards (as many column chunks, ...)
    W = max_rank(-(-int(ends.max()) // bs) * bs, device, collective)
    gen_start = pads + lengths
    col = torch.arange(W, device=device)[None, :]
    x = place_prompts(torch.full((B, W), f.pad_token_id, dtype=torch.long, device=device), prompt_ids,
                      prompt_mask, pads)
    x = torch.where((col >= gen_start[:, None]) & (col < ends[:, None]), mask_id, x)
    valid = (col >= pads[:, None]) & (col < ends[:, None])
    decoded = x == mask_id  # every position the sampler writes (the generated part and the last block's tail)
    gen_cols = gen_start[:, None] + torch.arange(G, device=device)[None, :]  # (B, G) canvas columns
    step_canvas = torch.full((B, W), -1, dtype=torch.long, device=device)
    logp_canvas = torch.zeros((B, W), dtype=torch.float32, device=device)
    model_logp_canvas = torch.zeros((B, W), dtype=torch.float32, device=device)  # untempered (commit_logps)
    quota = schedule(bs, decoding.steps)
    editing = o.editing_threshold > 0

    # The host looks at the canvas (a sync) once per block, or every LOOK_EVERY steps while a rule may finish a
    # block early (threshold, token editing); the step counters stay on the device. What each block holds to
    # decode is read once: its most masked row says after how many steps every row is done.
    nb = W // bs
    work = (x == mask_id).view(B, nb, bs).sum(dim=2).amax(dim=0)
    if collective:
        import torch.distributed as dist

        dist.all_reduce(work, op=dist.ReduceOp.MAX)
    work = work.tolist()
    spent = [sum(quota[:s]) for s in range(len(quota) + 1)]  # masks committed after s steps, at the latest

    run = StepForward(model, captured)  # the step's forward, captured or eager
    cache, nfe, done_cols = run.cache(W, B), 0, 0
    step = torch.zeros((), dtype=torch.long, device=device)  # the steps that had work (the step map's numbers)
    idle = torch.zeros((), dtype=torch.long, device=device)  # step forwards run once every row was done
    trajectory, kept = [], []
    for c in range(nb):
        cols = slice(c * bs, (c + 1) * bs)
        if not work[c]:
            continue  # nothing to decode here yet: prefilled together with the next block
        if cached and done_cols < c * bs:  # prefill the complete blocks before this one
            model(x[:, done_cols:c * bs], valid[:, done_cols:c * bs], past_key_values=cache, use_cache=True)
            nfe += 1
        done = ~(x[:, cols] == mask_id).any(dim=1)  # rows with nothing to decode in this block
        post = torch.zeros(B, dtype=torch.long, device=device)
        # without editing every row is done after `limit` steps; the fixed quota needs no look before that
        limit = None if editing else next(s for s, n in enumerate(spent) if n >= work[c])
        i = todo = 0
        while True:
            masked = x[:, cols] == mask_id
            unmasked = ~masked.any(dim=1)
            if editing:  # LLaDA2.1: count the steps after unmasking, per row
                post += (unmasked & ~done).long()
                done |= post > o.max_post_steps
            else:
                done |= unmasked
            if limit is not None and i >= limit:
                break
            if todo <= 0:
                if limit is not None and o.threshold == 0:
                    todo = limit - i
                else:  # look
                    if not any_rank(not done.all(), device, collective):
                        break
                    todo = rollout_core.LOOK_EVERY if limit is None else min(rollout_core.LOOK_EVERY, limit - i)
            live = any_left((~done).any(), collective)
            if cached:
                logits = run(x[:, cols], valid[:, cols], cache)
            else:  # recompute everything up to the end of the block (LLaDA2's HF `generate`)
                logits = model(x[:, :cols.stop], valid[:, :cols.stop], logits_at=read_at(model, cols)).logits
            nfe += 1
            x0, conf = choose(logits.reshape(B * bs, -1), decoding, mask_id, generator)
            x0, conf = x0.view(B, bs), conf.view(B, bs).double()
            q = quota[min(i, decoding.steps - 1)]
            k = masked.sum(dim=1).clamp(max=q)
            order = conf if o.remasking != "left_to_right" else -torch.arange(bs, device=device).double()
            commit = commit_quota(torch.where(masked, order, -torch.inf), k, q)
            if o.threshold > 0:
                above = masked & (conf > o.threshold)
                commit = torch.where((above.sum(dim=1) >= k)[:, None], above, commit)
            if editing:
                edit = decoded[:, cols] & ~masked & (conf > o.editing_threshold) & (x0 != x[:, cols])
                commit |= edit
                finished = unmasked & ~edit.any(dim=1)  # nothing left to unmask or edit: this row stops
            commit &= ~done[:, None]
            x[:, cols] = torch.where(commit, x0, x[:, cols])
            raw = logits.float()
            model_logp = raw.gather(-1, x0[..., None]).squeeze(-1) - raw.logsumexp(dim=-1)
            for canvas_, value in ((step_canvas, step), (logp_canvas, conf.log().float()),
                                   (model_logp_canvas, model_logp)):
                here = canvas_[:, cols]
                here.copy_(torch.where(commit, value, here))
            del logits, raw
            if editing:
                done |= finished
            step.add_(live.long())
            idle += (~live).long()
            i += 1
            todo -= 1
            if "states" in decoding.record:
                trajectory.append(x.gather(1, gen_cols).clone())
                kept.append(live)
        if cached:
            model(x[:, cols], valid[:, cols], past_key_values=cache, use_cache=True)  # commit the block's keys
            nfe += 1
        done_cols = (c + 1) * bs
        if o.eos_early_stop and not any_rank(not _all_finished(x.gather(1, gen_cols), mask_id, f.stop_ids),
                                                    device, collective):
            response = x.gather(1, gen_cols)
            x.scatter_(1, gen_cols, torch.where(response == mask_id, f.eos_token_id, response))
            break

    nfe -= int(idle)  # the one look at the counter
    if trajectory:
        trajectory = [t for t, k in zip(trajectory, torch.stack(kept).tolist()) if k]
    responses = x.gather(1, gen_cols)
    sequences = torch.cat([prompt_ids, responses], dim=1)
    attention_mask = torch.cat([prompt_mask.long(), torch.ones(B, G, dtype=torch.long, device=device)], dim=1)
    return RolloutOutput(sequences=sequences, attention_mask=attention_mask, prompt_length=P,
                         response_mask=response_mask(responses, f.stop_ids),
                         step_map=step_canvas.gather(1, gen_cols), nfe=nfe, sampler="block",
                         logps=logp_canvas.gather(1, gen_cols), commit_logps=model_logp_canvas.gather(1, gen_cols),
                         trajectory=torch.stack(trajectory, dim=1) if trajectory else None)


def _all_finished(responses: torch.Tensor, mask_id: int, stop_ids) -> bool:
    """Every row has a stop token (EOS or end of turn) with nothing masked before it."""
    is_eos = torch.isin(responses, torch.tensor(stop_ids, device=responses.device))
    if not is_eos.any(dim=1).all():
        return False
    first = is_eos.float().argmax(dim=1)
    before = torch.arange(responses.shape[1], device=responses.device)[None, :] < first[:, None]
    return not ((responses == mask_id) & before).any()
