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
with `memory_bounded` (default) the policy's n_t draws are backpropagated one at a time (`draw_parts`:
the recipe's `replayed_loss`), so one draw's activations are alive instead of n_t (the same loss and
gradient; one more forward per draw).
"""

from dataclasses import replace

import torch
import torch.nn.functional as F

from dare.train import noise
from dare.train.estimators import elbo

RECIPE = "preference"


def check_config(cfg) -> None:
    if cfg.data.unpaired:
        raise ValueError("data.unpaired: VRPO compares each chosen response with its rejected one; leave data.unpaired "
                         "false (unpaired examples are for ELBO-KTO)")


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """Per pair and side (chosen, rejected): n_t stratified timesteps, one i.i.d. mask each over
    the response. masked: (B, 2, n_t, L); t, weight = 1/t: (B, 2, n_t)."""
    B, _, L = batch.input_ids.shape
    draw = noise.elbo_draws(batch.response_mask.flatten(0, 1), cfg.algo.n_t, generator, "time", cfg.algo.eps)
    return noise.Draw(draw.masked.view(B, 2, -1, L), draw.t.view(B, 2, -1), draw.weight.view(B, 2, -1))


def draw_parts(draw: noise.Draw, cfg) -> list | None:
    """With `memory_bounded`: one part per timestep, its weight divided by n_t, so that the parts' ELBOs
    (each the mean over its one draw) add up to B(y), the mean over all n_t."""
    if not cfg.algo.memory_bounded:
        return None
    n = draw.t.shape[-1]
    return [replace(part, weight=part.weight / n) for part in noise.single_draws(draw, dim=2)]


def logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """The ELBO estimate B(y) of every chosen and rejected response. (B, 2)"""
    flat = noise.Draw(draw.masked.flatten(0, 1), draw.t.flatten(0, 1), draw.weight.flatten(0, 1))
    ids, attn = batch.input_ids.flatten(0, 1), batch.attention_mask.flatten(0, 1)  # (2B, L)
    return elbo(model, ids, attn, batch.response_mask.flatten(0, 1), flat, compute=batch.compute).view(-1, 2)


def loss(policy, reference, batch, draw, cfg):
    """policy, reference: (B, 2) ELBOs of [chosen, rejected]; normalized by the step's pairs."""
    chosen, rejected = policy[:, 0] - reference[:, 0], policy[:, 1] - reference[:, 1]
    margin = cfg.algo.beta * (chosen - rejected)
    dpo = -F.logsigmoid(margin)
    sft = -policy[:, 0] / batch.response_mask[:, 0].sum(-1)
    n = batch.num_pairs
    total = (dpo + cfg.algo.sft_weight * sft).sum() / n
    return total, {"loss/dpo": dpo.sum().item() / n, "loss/sft": sft.sum().item() / n,
                   "rewards/accuracy": (margin > 0).float().sum().item() / n,
                   "rewards/margin": margin.sum().item() / n}
