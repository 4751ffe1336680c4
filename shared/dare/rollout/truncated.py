"""AGRPO's sampler (probablyabot/agrpo @98f1182, `generate.py::generate`), batched and pad-aware, for the
bidirectional families: LLaDA's semi-autoregressive decoding with a fixed number of tokens per step
that records what AGRPO's policy gradient needs.

    x = [prompt | MASK * gen_length]; U = gen_length / steps tokens are committed per step, blocks of
    `block_length` left to right (block_length / U steps each). Each step: the block's logits are
    divided by the temperature and filtered by top-k, then top-p (at T = 0 they are left as they are);
    x0 is a Gumbel-max sample in float64 (the argmax at T = 0); its log-probability under that
    distribution and the distribution's entropy are computed; the U masked positions with the highest
    score are committed: the log-prob (`remasking=low_confidence`), a uniform draw (`random`, AGRPO's
    default) or the negative entropy (`entropy`). After a block, a row whose block is all EOS stops:
    the rest of its answer is EOS, committed at the current step, and it is not decoded further.

Recorded: `step_map` (AGRPO's unmask steps), `logps` (the log-prob each token was drawn with),
`entropies`, with `record` supports `supports` (B, G, V): the top-k/top-p support each token was
drawn from (AGRPO's sampling masks), so the trainer scores the same truncated distribution.

Differences from the reference: randomness comes from an explicit generator; rows are batched with left
padding hidden from attention; the reference also checks the prompt's last `block_length` tokens before
the first block (for a prompt shorter than the block that slice is empty, so every row ends at once);
here the all-EOS check starts after the first block.
"""

from __future__ import annotations

import torch

from dare.models import facts, token_logits
from dare.rollout.core import RolloutOutput, any_rank, canvas, response_mask, sharded
from dare.utils import UserError


def truncate(logits: torch.Tensor, decoding) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits / T with everything outside the top-k, then the top-p, set to -inf; the support kept),
    AGRPO's `gumbel_sample` filters; unchanged at T = 0."""
    support = torch.ones_like(logits, dtype=torch.bool)
    if decoding.temperature == 0:
        return logits, support
    logits = logits / decoding.temperature
    o = decoding.truncated  # this sampler's options (`dare.decoding.truncated`)
    if o.top_k and o.top_k < logits.shape[-1]:  # a k beyond the vocabulary keeps it all
        remove = logits < logits.topk(o.top_k)[0][..., -1, None]
        logits = logits.masked_fill(remove, -torch.inf)
        support &= ~remove
    if o.top_p < 1.0:
        ranked, order = logits.sort(descending=True)
        drop = ranked.softmax(dim=-1).cumsum(dim=-1) > o.top_p
        drop[..., 0] = False
        remove = torch.zeros_like(support).scatter(-1, order, drop)
        logits = logits.masked_fill(remove, -torch.inf)
        support &= ~remove
    return logits, support


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, decoding,
             generator: torch.Generator | None = None) -> RolloutOutput:
    f = facts(model)
    G, BL, steps = decoding.gen_length, decoding.block_length, decoding.steps
    U = G // steps if G % steps == 0 else 0
    if not U or G % BL or BL % U:
        raise UserError(f"decoding: the truncated sampler commits gen_length / steps tokens per step: gen_length ({G}) "
                        f"must be a multiple of steps ({steps}) and of block_length ({BL}), and block_length a "
                        f"multiple of the tokens per step ({G / steps:g})")
    mask_id, eos = f.mask_token_id, f.eos_token_id
    x, attention_mask, prompt_ids, prompt_mask = canvas(model, prompt_ids, prompt_mask, G, mask_id)
    (B, P), device = prompt_ids.shape, x.device
    collective = sharded(model)  # FSDP: every rank makes the same forwards
    step_map = torch.full((B, G), -1, dtype=torch.long, device=device)
    logps = torch.zeros(B, G, dtype=torch.float32, device=device)
    entropies = torch.zeros(B, G, dtype=torch.float32, device=device)
    supports = None  # (B, G, V), allocated at the first step when recording
    trajectory, removed, nfe, step = [], torch.zeros(B, dtype=torch.bool, device=device), 0, 0

    for block in range(G // BL):
        lo, hi = block * BL, (block + 1) * BL
        if block > 0:
            ended = ~removed & (x[:, P + lo - BL:P + lo] == eos).all(dim=1)
            removed |= ended
            x[ended, P + lo:] = eos
            step_map[ended, lo:] = step
        if not any_rank(not removed.all(), device, collective):
            break
        while step < hi // U:
            rows = (~removed).nonzero().squeeze(1)
            raw = token_logits(model, x[rows], attention_mask[rows], at=slice(P + lo, P + hi)).float()
            nfe += 1
            logits, support = truncate(raw, decoding)
            if decoding.temperature == 0:
                x0 = logits.argmax(dim=-1)
            else:
                u = torch.rand(logits.shape, dtype=torch.float64, device=device, generator=generator)
                x0 = (logits.double() - torch.log(-torch.log(u))).argmax(dim=-1)
            logp = torch.log_softmax(logits, dim=-1)
            entropy = -torch.where(logp.isfinite(), logp.exp() * logp, 0.0).sum(dim=-1)
            drawn = logp.gather(-1, x0[..., None]).squeeze(-1)
            if decoding.truncated.remasking == "low_confidence":
                score = drawn.clone()
            elif decoding.truncated.remasking == "random":
                score = torch.rand(drawn.shape, device=device, generator=generator).to(drawn.dtype)
            else:
                score = -entropy
            score[step_map[rows, lo:hi] != -1] = -torch.inf  # committed positions stay
            cols = score.topk(U, dim=1, sorted=False).indices
            r = rows[:, None].expand_as(cols)
            x[r, P + lo + cols] = x0.gather(1, cols)
            step_map[r, lo + cols] = step
            logps[r, lo + cols] = drawn.gather(1, cols)
            entropies[r, lo + cols] = entropy.gather(1, cols)
            if "supports" in decoding.record:
                if supports is None:
                    supports = torch.ones(B, G, raw.shape[-1], dtype=torch.bool, device=device)
                supports[r, lo + cols] = support.gather(1, cols[..., None].expand(-1, -1, support.shape[-1]))
            if "states" in decoding.record:
                trajectory.append(x[:, P:].clone())
            step += 1

    responses = x[:, P:]
    return RolloutOutput(sequences=x, attention_mask=attention_mask, prompt_length=P,
                         response_mask=response_mask(responses, f.stop_ids), step_map=step_map, nfe=nfe,
                         sampler="truncated", trajectory=torch.stack(trajectory, dim=1) if trajectory else None,
                         logps=logps, entropies=entropies, supports=supports)
