"""Masked-diffusion SFT (LLaDA, arXiv:2502.09992 §2.3, Eq. 5; `LLaDA:GUIDELINES.md`).

For each sequence: t ~ U(0, 1), p = (1 - eps) t + eps; every response token (answer and its EOS
padding) is replaced by the mask token independently with probability p; the prompt is never
masked. The loss is the cross-entropy on masked tokens weighted by 1/p, normalised per sequence
by the response length (EOS padding included), averaged over the batch:

    L = 1/B sum_b 1/|r_b| sum_{i masked} -log p_theta(x_i | x_t) / p_b

Deviations: none for masked models. Block-diffusion SFT (SDAR, LLaDA2) is not implemented yet.
"""

import torch
import torch.nn.functional as F

from dare.models import facts, token_logits

RECIPE = "sft"


def loss(model, batch, cfg, generator: torch.Generator):
    ids, response = batch.input_ids, batch.response_mask  # (B, L), (B, L)
    B, L = ids.shape
    t = torch.rand(B, generator=generator).to(ids.device)
    p = (1 - cfg.eps) * t + cfg.eps  # (B,)
    u = torch.rand(B, L, generator=generator).to(ids.device)
    masked = (u < p[:, None]) & response  # the prompt is never masked
    noisy = torch.where(masked, facts(model).mask_token_id, ids)

    logits = token_logits(model, noisy, batch.attention_mask)  # (B, L, V)
    rows = torch.arange(B, device=ids.device)[:, None].expand(B, L)[masked]
    ce = F.cross_entropy(logits[masked].float(), ids[masked], reduction="none")  # (n_masked,)
    per_seq = torch.zeros(B, device=ids.device).index_add_(0, rows, ce / p[rows])
    loss = (per_seq / response.sum(1)).mean()
    n_masked = int(masked.sum())
    return loss, {"loss/masked_ce": ce.mean().item() if n_masked else 0.0,
                  "stats/mask_ratio": n_masked / int(response.sum())}
