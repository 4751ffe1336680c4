"""EBPO (ELBO-based Block-level Policy Optimization; the LLaDA2.1 technical report, arXiv:2602.08676, §3.2,
Eq. 4-5; no public code: the estimator as DARE ports it, `yjyddq/DARE` `_forward_process_ebpo`,
`compute_policy_loss_ebpo` at 83ae8a3).

PPO at the sequence level for block-diffusion models, the ratio from a composite ELBO: each draw z_n is the
noisy copy of the completion beside its clean copy, [y_t ; y_0], under the block-causal mask, so one forward
scores every block given the clean blocks before it (vectorized over blocks):

    l_n    = sum_b (L_b / l_b) sum_{l_b masked in block b} log pi(y_i | z_n)   (per-block levels, stratified)
    log r  = mean_n l_n(theta) - mean_n l_n(theta_old)                       (no length normalization)
    L      = -mean_i min(r_i A_i, clip(r_i, 1 - eps_low, 1 + eps_high) A_i),   A = (r - mean) / std

The clip is taken in log space (min(log r, log(1 + eps_high)) for A >= 0, max(log r, log(1 - eps_low)) for
A < 0), the same value as PPO's min without overflowing exp. The draws are `dare.train.noise.block_stratified`
over the model's blocks; `estimators.draw_logps` scores them through the `[x_t ; x_0]` layout.

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout -> rewards -> advantages(rewards, cfg) -> mu x sample_noise(batch, generator, cfg)
    -> [old token_logps when mu > 1] -> mu x [per draw: token_logps -> loss(..., draw, cfg) -> backward]
    -> optimizer step

Deviations (README.md): the report gives no hyperparameters (DARE's recipe); the noise level is drawn per
block (DARE) where the report's notation shares t_n across the blocks of a draw.
"""

import torch

from dare.train import noise
from dare.train.estimators import draw_logps
from dare.train.objectives import clipped_sequence_objective, group_advantages

RECIPE = "rl"
SCORE = "draw"  # what token_logps returns: (B, D) (dare.train.hooks.SCORES)


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    return group_advantages(rewards, baseline="mean", std="sample", eps=1e-6)


def uses_old_logps(cfg) -> bool:
    return cfg.rl.num_iterations > 1  # one update per batch: old = current


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """n_t composite draws over the model's blocks (counted as the sampler counts them)."""
    if batch.block_size is None:
        raise ValueError("EBPO's composite ELBO is block-level: it needs a block-diffusion model (LLaDA2.x, SDAR)")
    return noise.block_stratified(batch.response_mask, noise.rollout_segments(batch).clamp(min=0),
                                  batch.prompt_length, cfg.algo.n_t, generator)


def draw_parts(draw: noise.Draw, cfg) -> list | None:
    return noise.single_draws(draw) if cfg.algo.memory_bounded else None


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B, n) each composite draw's l_n (one forward for all blocks of all n draws)."""
    logps = draw_logps(model, batch, draw.masked)  # (B, n, G)
    return (logps * draw.weight[:, :, batch.prompt_length:]).sum(dim=2)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    a, adv = cfg.algo, batch.advantages
    policy, clipped = clipped_sequence_objective(logps.mean(dim=1) - old_logps.mean(dim=1), adv, a.eps_low, a.eps_high)
    n = batch.num_sequences
    loss = -policy.sum() / n
    return loss, {"loss/policy": loss.item(), "stats/elbo": logps.detach().mean(dim=1).sum().item() / n,
                  "stats/clip_ratio": clipped.float().sum().item() / n}
