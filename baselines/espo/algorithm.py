"""ESPO (Ou et al., "Principled RL for Diffusion LLMs Emerges from a Sequence-Level Perspective",
arXiv:2512.03759, ICLR 2026; reference code `ML-GSAI/ESPO` `espo/espo_trainer.py` at b5f2dac).

The policy is a sequence-level action: its likelihood is the ELBO, and the importance ratio is taken at the
sequence level, normalized by the generation length so that it stays near 1:

    ELBO   = mean over num_mc coupled pairs of 1/2 [ (L+1)/x sum_{masked} log pi + (L+1)/(L-x) sum_{complement} log pi ]
             (x ~ U{0..L} stratified over the rows; L = the generation length, every completion position)
    A_i    = r_i - mean_{j != i} r_j                                   (leave-one-out, no std)
    rho_i  = exp((ELBO_theta - ELBO_old) / L)
    KL_i   = 1/2 (ELBO_theta - ELBO_ref)^2 / L                         (k2 on the raw ELBO)
    L      = mean_i [ -min(rho_i A_i, clip(rho_i, 1 - eps, 1 + eps) A_i) + beta KL_i ]

The policy, old and reference ELBOs of an inner update share its draws (a fresh set per update); the draws
are `dare.train.noise.complementary_pairs` and the estimate `dare.train.estimators.elbo`.

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout -> rewards -> advantages(rewards, cfg) -> mu x sample_noise(batch, generator, cfg)
    -> old/ref token_logps(model, batch, draw, cfg) -> mu x [token_logps -> loss(..., draw, cfg) -> optimizer step]

Deviations (README.md): the count's stratification runs over the rows of a step on a process (the reference:
over each micro-batch); the draws come from the run's generator (the reference reseeds every global RNG).
"""

import torch

from dare.train import noise
from dare.train.estimators import elbo
from dare.train.objectives import clipped_elbo_loss, group_advantages

RECIPE = "rl"
SCORE = "sequence"  # what token_logps returns: (B,) (dare.train.hooks.SCORES)


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    return group_advantages(rewards, baseline="loo", std="none")


def uses_reference(cfg) -> bool:
    return cfg.algo.beta > 0


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """num_mc coupled pairs over every completion position: masked (B, 2 num_mc, P + G), weights."""
    completion = noise.completion(batch.attention_mask, batch.prompt_length)
    return noise.complementary_pairs(completion, cfg.algo.num_mc, generator)


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B,) the ELBO of each completion (a sum over its tokens, not a mean)."""
    completion = noise.completion(batch.attention_mask, batch.prompt_length)
    return elbo(model, batch.sequences, batch.attention_mask, completion, draw, compute=batch.compute)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    L = batch.sequences.shape[1] - batch.prompt_length
    kl = 0.5 * (logps - ref_logps) ** 2 / L if ref_logps is not None else torch.zeros_like(logps)  # k2 / L
    return clipped_elbo_loss(logps, old_logps, kl, batch, cfg.algo.epsilon, cfg.algo.beta)
