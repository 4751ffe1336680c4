"""Dream's sampler (`diffusion_generate` / `_sample` of Dream-org's `generation_utils.py`),
batched and pad-aware; the logit shift is undone by the model adapter (`token_logits`).

    x = [prompt | MASK * gen_length]; timesteps = linspace(1, eps, steps + 1)
    step i (t = timesteps[i], s = timesteps[i + 1]):
      origin:       each masked position is revealed with probability 1 - s/t (1 at the last
                    step), its token sampled from the (tempered, top-p/top-k) distribution;
      maskgit_plus: confidence = probability of the sampled/argmax token,
      topk_margin:  confidence = top-1 minus top-2 probability,
      entropy:      confidence = sum p log p (negative entropy);
                    n = int(mean masks per row * (1 - s/t)) (all at the last step) positions are
                    committed: the n most confident, or a sample of n from softmax(conf / alg_temp).

Differences from the reference: randomness comes from an explicit generator
(`torch.multinomial` instead of `Categorical.sample`, same distribution); padding is hidden
from attention with positions from each prompt's first token (the reference builds the same
4-D mask and `cumsum - 1` positions itself); `gen_length`/`block_length` are ours (Dream has no
blocks: the block length is ignored); the mask token is never predicted (the reference can
reveal a position as MASK, which trained checkpoints never do).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dare.models import facts, token_logits
from dare.rollout.core import RolloutOutput, any_rank, canvas, response_mask, sharded


def top_p_logits(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, sorted_idx = torch.sort(logits, descending=True)
    cumulative = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    remove = cumulative > top_p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, sorted_idx, remove)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def top_k_logits(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    top_k = min(top_k, logits.size(-1))
    remove = logits < torch.topk(logits, top_k)[0][..., -1, None]
    return logits.masked_fill(remove, torch.finfo(logits.dtype).min)


def sample_tokens(logits, temperature: float, options, generator, margin=False, neg_entropy=False):
    """Dream's `sample_tokens`: (confidence, x0) for each row of `logits` (N, V); `options` the calling
    sampler's (its `top_p`, `top_k`: `decoding.dream` or `decoding.maskgit`)."""
    if temperature > 0:
        logits = logits / temperature
    if options.top_p < 1:
        logits = top_p_logits(logits, options.top_p)
    if options.top_k > 0:
        logits = top_k_logits(logits, options.top_k)
    probs = F.softmax(logits, dim=-1)
    if temperature > 0:
        x0 = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        confidence = torch.gather(probs, -1, x0[:, None]).squeeze(-1)
    else:
        confidence, x0 = probs.max(dim=-1)
    if margin:
        top2 = torch.sort(probs, dim=-1, descending=True)[0][:, :2]
        confidence = top2[:, 0] - top2[:, 1]
    if neg_entropy:
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return confidence, x0


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, decoding,
             generator: torch.Generator | None = None) -> RolloutOutput:
    f, o = facts(model), decoding.dream  # o: this sampler's options (`dare.decoding.dream`)
    G, mask_id = decoding.gen_length, f.mask_token_id
    x, attention_mask, prompt_ids, prompt_mask = canvas(model, prompt_ids, prompt_mask, G, mask_id)
    (B, P), device = prompt_ids.shape, x.device
    collective = sharded(model)  # FSDP: every rank makes the same forwards
    step_map = torch.full((B, G), -1, dtype=torch.long, device=device)
    timesteps = torch.linspace(1, o.eps, decoding.steps + 1, device=device)
    trajectory, nfe = [], 0

    for i in range(decoding.steps):
        masked = x == mask_id
        if not any_rank(masked.any(), device, collective):
            break
        logits = token_logits(model, x, attention_mask)
        nfe += 1
        mask_logits = logits[masked]
        mask_logits[:, mask_id] = -torch.inf  # never "reveal" a MASK (trained checkpoints never predict it)
        t, s = timesteps[i], timesteps[i + 1]
        before = x.clone()
        if o.alg == "origin":
            p_transfer = float(1 - s / t) if i < decoding.steps - 1 else 1.0
            x0 = torch.full_like(x[masked], mask_id)
            reveal = torch.rand(x0.shape, device=device, generator=generator) < p_transfer
            if reveal.any():
                x0[reveal] = sample_tokens(mask_logits[reveal], decoding.temperature, o, generator)[1]
            x[masked] = x0
        else:
            confidence, x0 = sample_tokens(mask_logits, decoding.temperature, o, generator,
                                           margin=o.alg == "topk_margin", neg_entropy=o.alg == "entropy")
            n_masked = masked.sum() / masked.shape[0]  # the batch average, as the reference
            n = int(n_masked * (1 - s / t)) if i < decoding.steps - 1 else int(n_masked)
            full = torch.full(x.shape, -torch.inf, dtype=logits.dtype, device=device)
            full[masked] = confidence
            if n > 0:
                if o.alg_temp == 0:
                    chosen = torch.topk(full, n).indices
                else:
                    chosen = torch.multinomial(F.softmax(full / o.alg_temp, dim=-1), n, generator=generator)
                proposal = torch.full_like(x, mask_id)
                proposal[masked] = x0
                rows = torch.arange(B, device=device)[:, None].expand_as(chosen)
                x[rows, chosen] = proposal[rows, chosen]
        newly = (before == mask_id) & (x != mask_id)
        step_map[newly[:, P:]] = i
        if "states" in decoding.record:
            trajectory.append(x[:, P:].clone())

    responses = x[:, P:]
    return RolloutOutput(sequences=x, attention_mask=attention_mask, prompt_length=P,
                         response_mask=response_mask(responses, f.stop_ids), step_map=step_map,
                         nfe=nfe, sampler="dream",
                         trajectory=torch.stack(trajectory, dim=1) if trajectory else None)
