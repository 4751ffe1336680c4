"""MaskGRPO (Ma et al., "Consolidating Reinforcement Learning for Multimodal Discrete Diffusion Models",
arXiv:2510.02880; reference code `martian422/MaskGRPO` @b74ba3c, `grpo/mask_grpo_trainer.py`, the text tasks
(`task: t2t`, `version: uni`), `scripts/train/t2t_grpo_train.sh`).

GRPO whose importance ratio is estimated on partly masked completions, with the mask ratio rising over the mu
updates of a rollout (from min_mask_rate to 1): the first updates see most of the completion (a low-variance,
near-AR estimate), the last ones almost none. The masks are "AR-like reversing": the later a position, the more
likely it is masked, so the estimate conditions each token on the visible tokens before it. Every completion
position is scored (masked or not), and the loss is d1's per-token clipped objective.

    r_i      = min(m + (1 - m)(i + 1) / mu, 0.999)                         (update i of mu; m = min_mask_rate)
    keep_k   = min(1, (1 - r_i) n (1 - j / (n - 1)) / sum_j' (1 - j' / (n - 1)))   (arlike, position j of the n the
               curve spans: the sequence after its first position, as the code does it; random: keep 1 - r_i)
    log pi(o^k | q) ~= log softmax(f_theta(q + o masked where u_k > keep_k))_k [o^k]    (every completion position)
    A_i      = (r_i - mean_group r) / (std_group r + 1e-5)
    L        = -sum_{i,k} [min(rho A, clip(rho, 1 - eps, 1 + eps) A) - beta k3] / sum_i |o_i|

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout -> rewards -> advantages -> mu x sample_noise (update i's mask at ratio r_i: `batch.draw_index`)
    -> old/ref token_logps on each -> mu x [token_logps -> loss -> optimizer step]

Deviations (README.md): d1's (full fine-tuning with a frozen reference, token normalisation over the step,
float64 Gumbel noise, padding hidden); update i uses ratio r_i in order (the reference advances its index per
micro-batch); the image tasks (MMaDA) are out of scope.
"""

import torch

from dare.train import noise
from dare.train.estimators import completion_logps
from dare.train.objectives import clipped_token_loss, group_advantages

RECIPE = "rl"
SCORE = "token"  # (B, G)
MAX_RATIO = 0.999  # the reference caps the last update's mask ratio below 1
STD_EPS = 1e-5  # (r - mean) / (std + 1e-5)


def check_config(cfg) -> None:
    if cfg.rl.noise_draws != "per_update":
        raise ValueError("rl.noise_draws=once: MaskGRPO's mask ratio rises over the updates (one draw each)")


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G) rewards -> (P, G): the group mean as baseline, divided by the group's sample std + 1e-5."""
    return group_advantages(rewards, baseline="mean", std="sample", eps=STD_EPS)


def uses_reference(cfg) -> bool:
    return cfg.algo.beta > 0


def mask_ratio(update: int, cfg) -> float:
    """Update i's mask ratio: min(m + (1 - m)(i + 1) / mu, 0.999)."""
    m, mu = cfg.algo.min_mask_rate, cfg.rl.num_iterations
    return min(m + (1 - m) * (update + 1) / mu, MAX_RATIO)


def keep_probabilities(length: int, ratio: float, device=None) -> torch.Tensor:
    """(length,) the AR-like probability that each of `length` positions stays visible: decreasing linearly along
    them, scaled so that their expected masked share is `ratio` (each capped at 1)."""
    curve = torch.linspace(1, 0, length, device=device)
    return (curve * ((1 - ratio) * length) / curve.sum()).clamp(max=1.0)


def completion_keep(prompt_length: int, length: int, ratio: float, cfg, device=None) -> torch.Tensor:
    """(G,) the AR-like keep probabilities of the completion's positions: the curve over the completion
    (ar_span=completion), or over the sequence after its first position, read at the completion (ar_span=sequence,
    the reference's code: its masked share over the completion is then above `ratio`)."""
    if cfg.algo.ar_span == "completion":
        return keep_probabilities(length - prompt_length, ratio, device)
    return keep_probabilities(length - 1, ratio, device)[prompt_length - 1:]


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """Update `batch.draw_index`'s mask over the completion (the prompt stays clean): masked (B, P + G), t (B,) its
    ratio."""
    P, (B, L) = batch.prompt_length, batch.sequences.shape
    ratio = mask_ratio(batch.draw_index, cfg)
    u = torch.rand((B, L - P), generator=generator).to(batch.sequences.device)
    if cfg.algo.remasking == "arlike":
        masked = u > completion_keep(P, L, ratio, cfg, u.device)
    else:
        masked = u < ratio
    prompt = torch.zeros((B, P), dtype=torch.bool, device=masked.device)
    return noise.Draw(torch.cat([prompt, masked], dim=1), t=torch.full((B,), ratio, device=masked.device))


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B, G) log-probs of every completion token, masked or not, given the completion masked by the draw."""
    return completion_logps(model, batch, draw.masked)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    return clipped_token_loss(logps, old_logps, ref_logps, batch, cfg.algo.epsilon, cfg.algo.beta)
