"""BGPO (Lin et al., "Boundary-Guided Policy Optimization for Memory-efficient RL of Diffusion Large
Language Models", arXiv:2510.11683, §2-3; the reference code THU-KEG/BGPO could not be read here: the
objective follows the paper, the estimator DARE's port `yjyddq/DARE` `llada_dp_actor_bgpo.py` at 83ae8a3).

A sequence-level ratio of ELBOs, exp(B_theta - B_old) A, needs every Monte Carlo draw's graph at once to
differentiate the exponential. BGPO maximizes a lower bound that is linear in the draws instead, so each
draw can be backpropagated alone (memory constant in n_t), and on-policy its value and gradient equal the
ratio's:

    l_j    = (L / l_j) sum_{l_j masked} log pi(o_i | z_j)            (LLaDA's stratified count draws, n_t of them)
    d_j    = l_j(theta) - l_j(theta_old)
    g_j    = (1 + d_j) A / n_t  if A >= 0      (tangent: e^d >= 1 + d)
             exp(d_j) A / n_t   if A < 0       (Jensen: e^{mean d} <= mean e^d)
    L      = -mean_i sum_j g_j,     A = (r - mean(r_group)) / std(r_group)

The draws score the completion tokens up to and including the first EOS. With `memory_bounded` the loop
backpropagates one draw at a time (`draw_parts`: `dare.train.rl.replayed_loss`).

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout -> rewards -> advantages(rewards, cfg) -> mu x sample_noise(batch, generator, cfg)
    -> [old token_logps when mu > 1] -> mu x [per draw: token_logps -> loss(..., draw, cfg) -> backward]
    -> optimizer step

Deviations (README.md): the per-draw backward replays each draw after a pass without graphs (the bound's
linearity would allow skipping that pass); d_j is not divided by the response length (DARE divides by the
padded length; the paper does not); no PPO clip (DARE adds 0.2 and a dual clip of 3).
"""

import torch

from dare.train import noise
from dare.train.estimators import elbo_terms
from dare.train.objectives import group_advantages

RECIPE = "rl"
SCORE = "draw"  # what token_logps returns: (B, D) (dare.train.hooks.SCORES)


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    return group_advantages(rewards, baseline="mean", std="sample", eps=1e-6)


def uses_old_logps(cfg) -> bool:
    return cfg.rl.num_iterations > 1  # on-policy (one update per batch): old = current, d = 0


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """n_t draws over each completion's tokens up to its first EOS: LLaDA's stratified counts, weight L / l."""
    scored = torch.cat([torch.zeros_like(batch.attention_mask[:, :batch.prompt_length], dtype=torch.bool),
                        batch.response_mask], dim=1)
    return noise.elbo_draws(scored, cfg.algo.n_t, generator, "count")


def draw_parts(draw: noise.Draw, cfg) -> list | None:
    return noise.single_draws(draw) if cfg.algo.memory_bounded else None


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B, n) each draw's ELBO term l_j."""
    return elbo_terms(model, batch.sequences, batch.attention_mask, draw, compute=batch.compute)


def bound(logps, old_logps, adv) -> torch.Tensor:
    """(B,) sum_j g_j, the linear lower bound of exp(mean_j d_j) A."""
    n = logps.shape[1]
    d = logps - old_logps
    g = torch.where(adv[:, None] >= 0, (1 + d) * adv[:, None], torch.exp(d) * adv[:, None]) / n
    return g.sum(dim=1)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    r = bound(logps, old_logps, batch.advantages)
    n = batch.num_sequences
    loss = -r.sum() / n
    return loss, {"loss/policy": loss.item(),
                  "stats/elbo": logps.detach().mean(dim=1).sum().item() / n}
