"""VRPO (Zhu et al., "LLaDA 1.5: Variance-Reduced Preference Optimization for Large Language
Diffusion Models", arXiv:2505.19223, §3 and App. D).

DPO with ELBO estimates in place of the intractable log-likelihoods:

    B(y)  = 1/n_t sum_j 1/t_j sum_{i: y_t^i = M} log pi(y^i | y_t_j, x)      (one mask per t_j)
    L_DPO = -log sigmoid( beta [B_th(y_w) - B_ref(y_w)] - beta [B_th(y_l) - B_ref(y_l)] )
    L     = mean_pairs( L_DPO + lambda * (-B_th(y_w) / |y_w|) )

Variance reduction (all unbiased, Theorem 1): a budget of n_t masked samples per response;
optimal allocation (n_t timesteps, one mask each, n_yt = 1) with the timesteps stratified over
(0, 1]; antithetic sampling: policy and reference see the SAME timesteps and masks for the same
response (the preference recipe draws the noise once per step and hands it to both), while
y_w and y_l get independent draws. The prompt is never masked. lambda weights the SFT term on
the chosen response that the paper adds for stability; |y_w| counts the response and its EOS.

Deviations (README.md): the ELBO is the sum over masked tokens weighted by 1/t (the paper's
definition) rather than one third-party re-implementation's extra division by the answer length;
n_t graphs are kept alive for the backward (a memory-bounded variant would need a second pass).
"""

import torch
import torch.nn.functional as F

from dare.models import facts
from dare.train.estimators import masked_logps

RECIPE = "preference"


def sample_noise(batch, cfg, generator: torch.Generator) -> dict:
    """Per pair, side (chosen, rejected) and sample j: a stratified t_j and its mask.
    t: (B, 2, n_t); masked: (B, 2, n_t, L) bool (response tokens only)."""
    B, _, L = batch.input_ids.shape
    u = torch.rand(B, 2, cfg.n_t, generator=generator)
    t = ((torch.arange(cfg.n_t) + u) / cfg.n_t).clamp(min=cfg.eps).to(batch.input_ids.device)
    draw = torch.rand(B, 2, cfg.n_t, L, generator=generator).to(batch.input_ids.device)
    return {"t": t, "masked": (draw < t[..., None]) & batch.response_mask[:, :, None]}


def logps(model, batch, noise) -> torch.Tensor:
    """The ELBO estimate B(y) of every chosen and rejected response. (B, 2)"""
    ids, attn = batch.input_ids.flatten(0, 1), batch.attention_mask.flatten(0, 1)  # (2B, L)
    mask_id = facts(model).mask_token_id
    total = 0.0
    for j in range(noise["t"].shape[-1]):
        masked = noise["masked"][:, :, j].flatten(0, 1)  # (2B, L)
        x = torch.where(masked, mask_id, ids)
        lp = masked_logps(model, x, ids, masked, attn, compute=batch.compute)
        total = total + lp.sum(-1) / noise["t"][:, :, j].flatten()
    return (total / noise["t"].shape[-1]).view(-1, 2)


def loss(policy, reference, batch, cfg):
    """policy, reference: (B, 2) ELBOs of [chosen, rejected]; normalized by the step's pairs."""
    chosen, rejected = policy[:, 0] - reference[:, 0], policy[:, 1] - reference[:, 1]
    margin = cfg.beta * (chosen - rejected)
    dpo = -F.logsigmoid(margin)
    sft = -policy[:, 0] / batch.response_mask[:, 0].sum(-1)
    n = batch.num_pairs
    total = (dpo + cfg.sft_weight * sft).sum() / n
    return total, {"loss/dpo": dpo.sum().item() / n, "loss/sft": sft.sum().item() / n,
                   "rewards/accuracy": (margin > 0).float().sum().item() / n,
                   "rewards/margin": margin.sum().item() / n}
