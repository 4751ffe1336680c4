"""DMPO, Distribution Matching Policy Optimization (Zhu et al., "Enhancing Reasoning for Diffusion LLMs via
Distribution Matching Policy Optimization", arXiv:2510.08233; reference code `yuchen-zhu-zyc/DMPO` @96af1a4,
`DMPO/dmpo_trainer.py`, `DMPO/run_dmpo.sh`).

Not a policy gradient: the policy is fitted to the reward-tilted target p*(x) ~ p_ref(x) exp(r(x) / alpha) by
forward KL, through weighted denoising cross-entropy (WDCE) on the group's own completions. Each completion's
importance weight toward p* is a softmax over its group of log_rnd + r / alpha, log_rnd = log p_ref - log p_theta
estimated by ELBOs; the weights of the opposite tilt (r -> -r) are subtracted as a baseline, so the weights of a
group sum to 0. The cross-entropy is the masked mean log-prob under antithetic masks (ratio 0.1 + 0.9 U, and its
complement).

    log_rnd_i = ELBO_ref(x_i) - ELBO_old(x_i)            (ELBO: mean over the R masks of (G / m) sum_masked log p)
    w_i   = softmax_group(coeff (log_rnd_i + r_i / alpha));   w-_i = softmax_group(coeff (log_rnd_i - r_i / alpha))
    A_i   = w_i - centering w-_i
    L     = - sum_i A_i (1 / R) sum_d (1 / m_d) sum_{k masked in d} log p_theta(x_i^k | x_i masked by d) / #groups

`algo.loss=ddo` is the reference's other objective: -A log sigmoid(beta (ELBO_theta - ELBO_old)) on the first half
of the masks and -ddo_alpha log sigmoid(-beta (...)) on the second, A the uncentered weights, averaged over rows.

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout -> rewards -> advantages (logged only) -> mu x sample_noise (R antithetic masks)
    -> old/ref token_logps (per draw) -> mu x [token_logps -> loss (the weights from old and ref) -> step]

Deviations (README.md): log_rnd is estimated on each update's own masks, not on masks drawn at rollout time; the
loss is normalised per group of the step (the reference: per micro-batch of 4 completions); full fine-tuning
with a frozen reference by default.
"""

import torch
import torch.nn.functional as F

from dare.train import noise
from dare.train.estimators import draw_logps

RECIPE = "rl"
SCORE = "draw"  # (B, R): per completion and mask, the sum of the masked completion positions' log-probs


def check_config(cfg) -> None:
    micro, G = cfg.train.micro_batch_size, cfg.rl.group_size
    if micro and micro % G:
        raise ValueError(f"train.micro_batch_size = {micro}: DMPO's weights are a softmax over each group of "
                         f"rl.group_size = {G} completions, so a micro-batch holds whole groups (a multiple of {G}, "
                         "or 0: the whole batch)")


def uses_reference(cfg) -> bool:
    return True  # the target is p_ref exp(r / alpha)


def group_weights(rewards: torch.Tensor, log_rnd: torch.Tensor, group_size: int, cfg) -> tuple:
    """((B,), (B,)): the importance weights toward p_ref exp(r / alpha) and toward p_ref exp(-r / alpha), each a
    softmax over its group (the reference's `coeff` form, alpha > 0)."""
    a = cfg.algo
    z, r = log_rnd.view(-1, group_size), rewards.view(-1, group_size) / a.alpha
    return ((a.coeff * (z + r)).softmax(dim=1).reshape(-1), (a.coeff * (z - r)).softmax(dim=1).reshape(-1))


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G): the weights at log_rnd = 0 (the policy at the reference), logged; the loss computes them with the
    estimated log_rnd."""
    w, neg = group_weights(rewards.reshape(-1), torch.zeros(rewards.numel()), rewards.shape[1], cfg)
    return (w - cfg.algo.centering * neg).view_as(rewards) if cfg.algo.loss == "wdce" else w.view_as(rewards)


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """R antithetic masks per completion: R / 2 masks at ratio 0.1 + 0.9 U, then their complements within the
    completion (the prompt is never masked). masked (B, R, P + G), t the masked share, weight G / m."""
    completion = noise.completion(batch.attention_mask, batch.prompt_length)
    t = 0.1 + 0.9 * torch.rand((completion.shape[0], cfg.algo.replicates // 2), generator=generator)
    first = noise.iid(completion, t.to(completion.device), generator)
    masked = torch.cat([first, completion[:, None] & ~first], dim=1)
    m = masked.sum(dim=-1)
    G = completion.sum(dim=-1, keepdim=True)
    return noise.Draw(masked, t=m / G, weight=G / m.clamp(min=1))


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B, R) sum over the masked completion positions of log p(x^k | x masked by draw d)."""
    return draw_logps(model, batch, draw.masked).sum(dim=-1)


def elbo(logps: torch.Tensor, draw: noise.Draw) -> torch.Tensor:
    """(B,) the ELBO: mean over the draws of (G / m) x the masked log-probs."""
    return (draw.weight * logps).mean(dim=1)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    a = cfg.algo
    log_rnd = elbo(ref_logps, draw) - elbo(old_logps, draw)
    w, neg = group_weights(batch.rewards, log_rnd, batch.group_size, cfg)
    m = draw.masked.sum(dim=-1).clamp(min=1)
    if a.loss == "wdce":
        A = w - a.centering * neg
        ce = (logps / m).mean(dim=1)  # the masked mean log-prob, mean over the draws
        n = max(batch.num_sequences / batch.group_size, 1.0)
        loss = -(A * ce).sum() / n
        extra = {"stats/masked_logp": ce.detach().sum().item() / batch.num_sequences}
    else:
        half = a.replicates // 2
        gap = torch.stack([(draw.weight * logps)[:, :half].mean(dim=1), (draw.weight * logps)[:, half:].mean(dim=1)],
                          dim=1) - elbo(old_logps, draw)[:, None]
        n = max(batch.num_sequences, 1)
        loss = -(w * F.logsigmoid(a.ddo_beta * gap[:, 0])).sum() / n \
            - a.ddo_alpha * F.logsigmoid(-a.ddo_beta * gap[:, 1]).sum() / n
        extra = {"stats/elbo_gap": gap.detach()[:, 0].sum().item() / n}
    ess = 1.0 / w.view(-1, batch.group_size).square().sum(dim=1) / batch.group_size
    return loss, {"stats/log_rnd": log_rnd.detach().sum().item() / batch.num_sequences,
                  "stats/ess": ess.sum().item() / max(batch.num_sequences / batch.group_size, 1.0), **extra}
