"""GDPO (Rojas et al., "Group Diffusion Policy Optimization", arXiv:2510.08554, ICLR 2026; reference code
`KevinRojas1499/GDPO` `gdpo/gdpo_trainer.py`, `gdpo/likelihood_estimators.py` at 1918683).

GRPO at the sequence level with a low-variance ELBO: the time integral of the ELBO by Gauss-Legendre
quadrature (a few fixed masking ratios, one random mask each: "semi-deterministic" Monte Carlo), and a
length-normalized sequence ratio:

    ELBO   = sum_k (w_k / 2) (1 / t_k) sum_{int(t_k L) masked} log pi(o_i | z_k)   (t_k the nodes in (0, 1))
    A_i    = r_i - mean(r_group)                                       (no std)
    rho_i  = exp((ELBO_theta - ELBO_old) / L)                          (L = the generation length)
    KL_i   = exp(ELBO_ref - ELBO_theta) - (ELBO_ref - ELBO_theta) - 1  (k3 on the raw ELBO; beta = 0 by default)
    L      = mean_i [ -min(rho_i A_i, clip(rho_i, 1 - eps, 1 + eps) A_i) + beta KL_i ]

Every completion position counts (L = the generation length, after the first EOS too), as the reference's
estimator. The draws are `dare.train.noise.quadrature`, the estimate `dare.train.estimators.elbo`.

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout -> rewards -> advantages(rewards, cfg) -> mu x sample_noise(batch, generator, cfg)
    -> old/ref token_logps(model, batch, draw, cfg) -> mu x [token_logps -> loss(..., draw, cfg) -> optimizer step]

Deviations (README.md): the old, reference and current ELBOs of an update share its masks (the reference
draws the old ones with another seed, so its ratio carries estimator noise at theta = theta_old).
"""

import torch

from dare.train import noise
from dare.train.estimators import elbo
from dare.train.objectives import clipped_elbo_loss, group_advantages, k3

RECIPE = "rl"
SCORE = "sequence"  # what token_logps returns: (B,) (dare.train.hooks.SCORES)


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    return group_advantages(rewards, baseline="mean", std="none")


def uses_reference(cfg) -> bool:
    return cfg.algo.beta > 0


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """One draw per quadrature node over every completion position: masked (B, nodes, P + G), weights."""
    completion = noise.completion(batch.attention_mask, batch.prompt_length)
    return noise.quadrature(completion, cfg.algo.nodes, generator)


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B,) the quadrature ELBO of each completion."""
    completion = noise.completion(batch.attention_mask, batch.prompt_length)
    return elbo(model, batch.sequences, batch.attention_mask, completion, draw, compute=batch.compute)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    kl = k3(ref_logps - logps) if ref_logps is not None else torch.zeros_like(logps)
    return clipped_elbo_loss(logps, old_logps, kl, batch, cfg.algo.epsilon, cfg.algo.beta)
