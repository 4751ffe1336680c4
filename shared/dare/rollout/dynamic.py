"""b1's dynamic-size blocks on block-causal models (SDAR, LLaDA2.x): `decoding.block.dynamic` (Jiang et al., "Break
the Block: Dynamic-size Reasoning Blocks for Diffusion Large Language Models via Monotonic Entropy Descent with
Reinforcement Learning", arXiv 2605.02263; `YanJiangJerry/Block-R1@fd7a1b8`, `rl/trainers/dynamic_generate.py`).

The block size is not chosen from a menu, drawn, nor predicted by a head: the model ends each block itself by
committing a marker token (the prompt asks it to end every reasoning step with `\\block`; the marker is the token of
the word "block", `dynamic_marker`). Per row, vectorised over the batch (per-row window tensors, no loop over rows or
tokens in a step):

    a window of up to M = `dynamic_max_block` tokens (default gen_length // 2) starts where the row's last block
    ended; it is decoded in `steps` steps, step i committing the row's quota q_i of its most confident masked
    window tokens (M split evenly over the steps, the remainder to the first ones);
    after every `dynamic_min_offset` (d) steps: the first marker at offset >= d in the window ends the block
    there (its length: offset + 1); the window's tokens after it are masked again and the row's remaining masked
    tokens of the block are spread evenly over the remaining steps;
    a step in which no row has a quota ends the window (the reference's `break`);
    the block's mean entropy (each position's predictive entropy at the last step it was in the window) is
    recorded; a block that holds a stop token ends the row, else the next window starts after it.

The rollout records each row's layout, `segments` (B, G): the block of every generated position (0 = the first;
positions after the row stopped form one more block), which the RL batch carries so that the block estimators'
draws follow each row's own blocks (`dare.train.noise.rollout_segments`); attention stays the model's own
(block-causal over its `block_size`), as in the reference, whose windows run over the model's attention blocks too.
b1's reward (`block_reward`, (B,)): with n blocks, count = 1 if n >= T else log(n + 1) / log(T + 1)
(T = `dynamic_target_blocks`, 10), trend = the share of consecutive blocks whose mean entropy decreases;
0.5 trend + 0.5 count for n >= 2, else 0; the RL loop adds `dynamic_reward` times it to the task's reward.

Cost: no cache (a window crosses the model's blocks; the reference recomputes the whole sequence every step too):
each step is one forward over the canvas up to the model block holding the furthest window's end (the block's
masked tail is seen, as the reference's forward over the whole canvas sees it), logits (B, E, V) of it; the state is a
few (B, W) canvases and the window's (B, M) slices. The host looks once per window and every `LOOK_EVERY` steps
(whether any row still has a quota).

Differences from the reference: batched prompts of different lengths (left padding by whole model blocks, as the
block sampler); the mask token is never chosen (as the block sampler); a block ends the row at any stop id (EOS or
end of turn; the reference: EOS) and the positions after it are filled with EOS (the reference leaves them
masked; both are after the response's end); the canvas ends at `gen_length`; LLaDA2-mini's pre-filled answer
tags are not written; sampling (T > 0) draws from the block sampler's `choose` (the reference: float64 Gumbel-max).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import dare.rollout.core as rollout_core
from dare.models import facts
from dare.rollout.block import choose
from dare.rollout.core import RolloutOutput, any_rank, commit_quota, place_prompts, response_mask, sharded
from dare.utils import UserError


def marker_id(tokenizer, decoding) -> int | None:
    """The token id of `decoding.block.dynamic_marker` in `tokenizer` when dynamic blocks are on (else None): the
    text must be one token, as the reference requires (it decodes without dynamic blocks otherwise)."""
    o = decoding.block
    if not o.dynamic:
        return None
    ids = tokenizer.encode(o.dynamic_marker, add_special_tokens=False)
    if len(ids) != 1:
        raise UserError(f"decoding.block.dynamic_marker={o.dynamic_marker!r} is {len(ids)} tokens in this tokenizer; "
                        "dynamic blocks end at a single marker token")
    return int(ids[0])


def block_reward(entropies: torch.Tensor, counts: torch.Tensor, target: int) -> torch.Tensor:
    """b1's normalized block-entropy reward (`dynamic_generate`, the end): entropies (B, K) each row's blocks' mean
    entropies in order (the first counts[b] valid), counts (B,) -> (B,) float32."""
    n = counts.float()
    quantity = torch.where(counts >= target, torch.ones_like(n), torch.log(n + 1) / math.log(target + 1))
    K = entropies.shape[1]
    if K < 2:
        return torch.zeros_like(n)
    pairs = torch.arange(1, K, device=entropies.device)[None, :] < counts[:, None]
    down = ((entropies[:, 1:] < entropies[:, :-1]) & pairs).sum(dim=1).float()
    trend = down / (n - 1).clamp(min=1)
    return torch.where(counts >= 2, 0.5 * trend + 0.5 * quantity, torch.zeros_like(n))


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, decoding, generator=None,
             marker_id: int | None = None) -> RolloutOutput:
    f, o = facts(model), decoding.block
    if marker_id is None:
        raise UserError("decoding.block.dynamic: the marker's token id is needed (dare.rollout.dynamic.marker_id)")
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device).bool()
    bs, G, mask_id, S = f.block_size, decoding.gen_length, f.mask_token_id, decoding.steps
    M = min(o.dynamic_max_block or max(1, G // 2), G)
    d = o.dynamic_min_offset
    B, P = prompt_ids.shape
    lengths = prompt_mask.sum(dim=1)
    collective = sharded(model)

    # canvas as the block sampler's: prompts start a model block (left padding by whole blocks); M spare columns at
    # the end so that every window's columns exist (they are padding, never attended)
    C = -(-int(lengths.max()) // bs) * bs
    pads = ((C - lengths) // bs) * bs
    gen_start = pads + lengths
    W = C + G + M
    col = torch.arange(W, device=device)[None, :]
    x = place_prompts(torch.full((B, W), f.pad_token_id, dtype=torch.long, device=device), prompt_ids,
                      prompt_mask, pads)
    gen_end = gen_start + G
    gen = (col >= gen_start[:, None]) & (col < gen_end[:, None])
    x = torch.where(gen, mask_id, x)
    valid = (col >= pads[:, None]) & (col < gen_end[:, None])
    gen_cols = gen_start[:, None] + torch.arange(G, device=device)[None, :]

    step_canvas = torch.full((B, W), -1, dtype=torch.long, device=device)
    logp_canvas = torch.zeros((B, W), dtype=torch.float32, device=device)
    model_logp_canvas = torch.zeros((B, W), dtype=torch.float32, device=device)
    entropy_canvas = torch.zeros((B, W), dtype=torch.float32, device=device)
    seg_canvas = torch.full((B, W), -1, dtype=torch.long, device=device)
    stop = torch.tensor(f.stop_ids, device=device)
    offs = torch.arange(M, device=device)[None, :]  # (1, M) window offsets

    start = gen_start.clone()  # each row's window start
    finished = start >= gen_end
    n_blocks = torch.zeros(B, dtype=torch.long, device=device)
    entropies = []  # per window round: (B,) each row's block mean entropy (valid where the row was active)
    step = torch.zeros((), dtype=torch.long, device=device)
    nfe = 0
    for _ in range(G):  # at most gen_length blocks (the reference's MAX_LOOPS)
        if not any_rank(not bool(finished.all()), device, collective):
            break
        active = ~finished
        L = torch.where(active, (gen_end - start).clamp(max=M), 0)  # the window's length per row
        cols = start[:, None] + offs  # (B, M), inside the canvas thanks to the spare columns
        # the forward's extent: the furthest window end, rounded up to the model's block (canvas blocks start at
        # multiples of bs), so every row sees its window's whole last block, masks included, as the reference's
        # forward over the whole canvas and an exact replay do (a cut block hid its masked tail: issue 59.4)
        E = max(min(-(-int((start + L).max()) // bs) * bs, W), 1)
        in_win = offs < L[:, None]
        m0 = ((x.gather(1, cols) == mask_id) & in_win).sum(dim=1)  # the quota schedule: m0 over R steps from `first`
        first = torch.zeros(B, dtype=torch.long, device=device)
        alive = torch.ones((), dtype=torch.bool, device=device)
        for i in range(S):
            R = S - first
            quota = torch.where(i >= first, m0 // R + ((i - first) < m0 % R).long(), 0)
            alive = alive & (quota * active).sum().gt(0)  # no row has a quota: the window ends (reference: break)
            if i and i % rollout_core.LOOK_EVERY == 0 and not any_rank(bool(alive), device, collective):
                break
            logits = model(x[:, :E], valid[:, :E]).logits
            nfe += 1
            V = logits.shape[-1]
            wl = logits.gather(1, cols.clamp(max=E - 1)[..., None].expand(B, M, V))  # (B, M, V) the window's
            del logits
            probs = F.softmax(wl.float(), dim=-1)
            ent = -(probs * torch.log(probs + 1e-9)).sum(dim=-1)
            del probs
            keep = alive & in_win
            entropy_canvas.scatter_(1, cols, torch.where(keep, ent, entropy_canvas.gather(1, cols)))
            x0, conf = choose(wl.reshape(B * M, V), decoding, mask_id, generator)
            x0, conf = x0.view(B, M), conf.view(B, M).double()
            raw = wl.float()
            model_logp = raw.gather(-1, x0[..., None]).squeeze(-1) - raw.logsumexp(dim=-1)
            del wl, raw
            xw = x.gather(1, cols)
            masked = (xw == mask_id) & in_win
            k = torch.minimum(quota, masked.sum(dim=1))
            commit = commit_quota(torch.where(masked, conf, -torch.inf), k, M) & keep
            for canvas_, value in ((x, x0), (step_canvas, step.expand(B, M)), (logp_canvas, conf.log().float()),
                                   (model_logp_canvas, model_logp)):
                canvas_.scatter_(1, cols, torch.where(commit, value, canvas_.gather(1, cols)))
            step.add_(alive.long())
            if (i + 1) % d == 0:
                L, first, m0 = _truncate(x, step_canvas, logp_canvas, model_logp_canvas, cols, L, offs, d, marker_id,
                                         mask_id, alive & active, first, m0, i + 1, S)
                in_win = offs < L[:, None]
        L, _, _ = _truncate(x, step_canvas, logp_canvas, model_logp_canvas, cols, L, offs, d, marker_id, mask_id,
                            active, first, m0, S, S)  # the reference's look after the block's steps
        in_win = offs < L[:, None]
        # the block is done: its layout, its mean entropy, whether it ends the row
        seg_canvas.scatter_(1, cols, torch.where(in_win & active[:, None], n_blocks[:, None],
                                                 seg_canvas.gather(1, cols)))
        ent_mean = (entropy_canvas.gather(1, cols) * in_win).sum(dim=1) / L.clamp(min=1)
        entropies.append(torch.where(active, ent_mean, 0.0))
        n_blocks += active.long()
        ended = (torch.isin(x.gather(1, cols), stop) & in_win).any(dim=1)
        start = torch.where(active, start + L, start)
        finished = finished | (active & (ended | (start >= gen_end)))

    responses = x.gather(1, gen_cols)
    responses = torch.where(responses == mask_id, f.eos_token_id, responses)  # after a row's stop: EOS
    segments = seg_canvas.gather(1, gen_cols)
    segments = torch.where(segments < 0, n_blocks[:, None], segments)  # undecoded tail: one more block
    ent = torch.stack(entropies, dim=1) if entropies else torch.zeros(B, 0, device=device)
    sequences = torch.cat([prompt_ids, responses], dim=1)
    attention_mask = torch.cat([prompt_mask.long(), torch.ones(B, G, dtype=torch.long, device=device)], dim=1)
    return RolloutOutput(sequences=sequences, attention_mask=attention_mask, prompt_length=P,
                         response_mask=response_mask(responses, f.stop_ids), step_map=step_canvas.gather(1, gen_cols),
                         nfe=nfe, sampler="block", logps=logp_canvas.gather(1, gen_cols),
                         commit_logps=model_logp_canvas.gather(1, gen_cols), segments=segments,
                         block_reward=block_reward(ent, n_blocks, o.dynamic_target_blocks))


def _truncate(x, step_canvas, logp_canvas, model_logp_canvas, cols, L, offs, d, marker, mask_id, rows, first, m0,
              done_steps: int, S: int):
    """End each of `rows`' blocks right after its first marker at offset >= d: the window's later tokens masked
    again, and (while steps remain) the block's masked tokens spread over the remaining steps. -> (L, first, m0)."""
    xw = x.gather(1, cols)
    hit = (xw == marker) & (offs >= d) & (offs < L[:, None])
    pos = torch.where(hit, offs, offs.shape[1]).amin(dim=1)  # the first marker's offset (M where none)
    new_L = pos + 1
    cut = rows & hit.any(dim=1) & (new_L < L)
    drop = cut[:, None] & (offs >= new_L[:, None]) & (offs < L[:, None])
    for canvas_, value in ((x, mask_id), (step_canvas, -1), (logp_canvas, 0.0), (model_logp_canvas, 0.0)):
        canvas_.scatter_(1, cols, torch.where(drop, value, canvas_.gather(1, cols)))
    L = torch.where(cut, new_L, L)
    if done_steps < S:
        left = ((x.gather(1, cols) == mask_id) & (offs < L[:, None])).sum(dim=1)
        first = torch.where(cut, done_steps, first)
        m0 = torch.where(cut, left, m0)
    return L, first, m0
