"""Masked-diffusion SFT (LLaDA, arXiv:2502.09992 §2.3, Eq. 5; `LLaDA:GUIDELINES.md`).

For each sequence: t ~ U(0, 1), p = (1 - eps) t + eps; every response token (answer and its EOS
padding) is replaced by the mask token independently with probability p; the prompt is never
masked. The loss is the cross-entropy on masked tokens weighted by 1/p, normalised per sequence
by the response length (EOS padding included), averaged over the batch:

    L = 1/B sum_b 1/|r_b| sum_{i masked} -log p_theta(x_i | x_t) / p_b

The cross-entropy is taken from hidden states in chunks (no B x L x V logits) and, with
`train.packing`, without compute on the prompts' left padding (`dare.train.estimators`).

Block-diffusion models (SDAR, LLaDA2.x; BD3-LM's objective): the same noise and weights, and the
log-probs come from one forward over [x_t ; x_0] with the three-rule block mask (a noisy block
sees itself and the clean blocks before it), so each block is a masked diffusion conditioned on
the clean past: -log p(x) <= sum_b E_t[1/t sum_{i in b, masked} -log p(x_i | x_t^b, x^{<b})].
"""

import torch

from dare.models import facts
from dare.train import noise
from dare.train.estimators import diffusion_logps

RECIPE = "sft"


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """Per row: the masking probability p = (1 - eps) t + eps (B,) and the response tokens
    masked i.i.d. at p (B, L); the prompt is never masked."""
    ids = batch.input_ids
    t = torch.rand(ids.shape[0], generator=generator).to(ids.device)
    p = (1 - cfg.algo.eps) * t + cfg.algo.eps
    return noise.Draw(noise.iid(batch.response_mask, p, generator), t=p)


def loss(model, batch, draw: noise.Draw, cfg):
    ids, response, masked, p = batch.input_ids, batch.response_mask, draw.masked, draw.t
    noisy = torch.where(masked, facts(model).mask_token_id, ids)
    logps = diffusion_logps(model, noisy, ids, masked, batch.attention_mask, compute=batch.compute)
    n_resp, n_masked = response.sum(1).clamp(min=1), masked.sum(1).clamp(min=1)  # a row cut to no response adds 0
    per_seq = -(logps.sum(1) / p) / n_resp  # (B,)
    loss = per_seq.sum() / batch.num_sequences  # normalized by the whole step's rows
    return loss, {"loss/masked_ce": (-(logps.sum(1) / n_masked)).sum().item() / batch.num_sequences,
                  "stats/mask_ratio": (masked.sum(1) / n_resp).sum().item() / batch.num_sequences}
