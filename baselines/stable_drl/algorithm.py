"""StableDRL (Zhong et al., "Stabilizing Reinforcement Learning for Diffusion Language Models",
arXiv:2603.06743, ICML 2026), as the Block-R1 benchmark runs it (`YanJiangJerry/Block-R1@fd7a1b8`,
`rl/trainers/stable_drl_trainer.py` and `rl/trainers/stable_drl_svpo.py`, `reproduce/stable_drl/`).

A dLLM's sequence likelihood is only estimated, so its importance ratios are noisy; GRPO's conditional clip lets
an outlier through (the clip binds on one side of the advantage only) and its fixed 1/G scale passes the ratio's
spread into the gradient. StableDRL clips every ratio from above, whatever the advantage, and self-normalises
the clipped ratios of a group, so each group's update is a convex combination of its per-sample updates. The
reference builds it on SPG's sandwiched likelihood:

    A_i     = r_i - mean(r_group)                                             (no std, `advantage: center`)
    ELBO_i  = mean_j [ sum_{k masked in draw j} log pi(o_k | z_j) / #masked_j ]  (num_t draws, SPG's blocks)
    EUBO_i  = (1/beta) mean_{k masked} log( mean_j 1[k masked in j] pi^beta(o_k | z_j) / t_j )
    S_i     = ELBO_i if A_i > 0 else omega EUBO_i + (1 - omega) ELBO_i                   (SPG's sandwich)
    log r_i = sg[ ELBO_i(theta) - ELBO_i(theta_old) ]                       (the sequence ratio, on the ELBO)
    w_i     = min(r_i, C) / sum_{j in group} min(r_j, C)       (unconditional clip + self-normalisation, C = 5)
    L       = -(1 / #groups) sum_groups sum_{i in group} w_i A_i S_i

The weights carry no gradient (the reference detaches them): the update is a self-normalised importance-
weighted SPG gradient. With snis = False the loss is SPG's length-weighted one,
-sum_i A_i |o_i| S_i / sum_i |o_i| (the reference's fallback).

Block models (SDAR, LLaDA2.x): the "staircase" attention is the library's `[x_t ; x_0]` layout (each noisy block
attends to itself and to the clean blocks before it; `dare.train.estimators.draw_logps`), the draws' blocks the
model's own (`batch.block_size`). Masked models (LLaDA, Dream): the rollout's blocks (`rl.decoding.block_length`).

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout -> rewards -> advantages(rewards, cfg) -> mu x sample_noise(batch, generator, cfg)
    -> old log-probs on those draws (token_logps) -> mu x [token_logps(model, batch, draw, cfg)
    -> loss(logps, old, ref, batch, draw, cfg) -> optimizer step]

Deviations (README.md): the old ELBO is scored on the update's own draw (the reference scores it once at rollout
on an independent mask); the weights are normalised per group (the reference: over each GPU's micro-batch of
12 completions, two groups); the EUBO in log space (as `baselines/spg`); the anti-short-boxed shaping reward
is not added; fixed blocks (no Block-R1 per-sample block size).
"""

import math

import torch

from dare.train import noise
from dare.train.estimators import draw_logps, sandwiched_likelihood, token_mean_elbo
from dare.train.objectives import clipped_self_normalized_weights, group_advantages

RECIPE = "rl"
SCORE = "draw_token"  # what token_logps returns: (B, D, G) (dare.train.hooks.SCORES)


def check_config(cfg) -> None:
    G, micro = cfg.rl.group_size, cfg.train.micro_batch_size
    if cfg.algo.snis and micro % G:
        raise ValueError(f"train.micro_batch_size={micro} is not a multiple of rl.group_size={G}: the "
                         "self-normalised weights need every completion of a group in the same micro-batch")


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G): r - mean of the group (the reference's "center"), or GRPO's std-scaled form."""
    return group_advantages(rewards, baseline="mean", std="sample" if cfg.algo.advantage == "grpo_std" else "none")


def uses_old_logps(cfg) -> bool:
    return cfg.algo.snis  # the ratio's denominator, theta_old's ELBO on the same draw


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """SPG's block-wise draws (`forward_type: block_random`): masked (B, num_t, P + G), t (B, num_t)."""
    a, P = cfg.algo, batch.prompt_length
    prompt = batch.attention_mask[:, :P].bool()
    if batch.block_size is None:  # masked models: the rollout's semi-autoregressive blocks
        G = batch.response_mask.shape[1]
        segment = (torch.arange(G, device=prompt.device) // batch.decoding.block_length).expand_as(batch.response_mask)
    else:  # block models: the model's blocks as the sampler counts them, the completion's first block = 0
        segment = noise.rollout_segments(batch)
        segment = segment - segment[:, :1]
    return noise.block_random(batch.response_mask, segment, prompt, a.num_t, generator, a.min_t, a.max_t,
                              a.p_mask_prompt)


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B, num_t, G) log-probs of the completion tokens each draw masks (0 elsewhere); block models through the
    staircase `[x_t ; x_0]` layout."""
    return draw_logps(model, batch, draw.masked)


def sandwich(logps, batch, draw, cfg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B,) SPG's sandwiched likelihood S_i (ELBO for A > 0, the negative bound otherwise), the ELBO and EUBO."""
    a, P = cfg.algo, batch.prompt_length
    scored = draw.masked[:, :, P:] & batch.response_mask[:, None, :]
    return sandwiched_likelihood(logps, scored, draw.t, batch.advantages, a.beta, a.omega, a.negative)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    a, G, P = cfg.algo, cfg.rl.group_size, batch.prompt_length
    score, elbo, eubo = sandwich(logps, batch, draw, cfg)
    n_seq = batch.num_sequences
    stats = {"stats/elbo": elbo.detach().sum().item() / n_seq, "stats/eubo": eubo.detach().sum().item() / n_seq}
    if not a.snis:  # the reference's fallback: SPG's loss, each completion weighted by its length |o_i|
        lengths = batch.response_mask.sum(dim=1).float()
        loss = -(batch.advantages * score * lengths).sum() / max(batch.num_tokens, 1.0)
        return loss, {"loss/policy": loss.item(), **stats}

    # the sequence log-ratio on the ELBO, old and current on the same draw; no gradient through the weights
    scored = draw.masked[:, :, P:] & batch.response_mask[:, None, :]
    log_ratio = (elbo - token_mean_elbo(old_logps, scored)).detach()
    weights = clipped_self_normalized_weights(log_ratio.view(-1, G), a.max_ratio).view(-1)
    n_groups = n_seq / G  # each group's weights sum to 1: the step's loss is the mean over its groups
    loss = -(weights * batch.advantages * score).sum() / n_groups
    return loss, {"loss/policy": loss.item(), **stats,
                  "stats/log_ratio": log_ratio.sum().item() / n_seq,
                  "stats/clipped_share": (log_ratio > math.log(a.max_ratio)).float().sum().item() / n_seq,
                  "stats/max_weight": weights.view(-1, G).max(dim=1).values.sum().item() / n_groups}
