"""AGRPO (Zhan, "Simple Policy Gradients for Reasoning with Diffusion Language Models", arXiv:2510.04019;
reference code `probablyabot/agrpo` @98f1182, `agrpo_trainer.py::compute_loss`).

Amortized GRPO: the rollout is a Markov chain of decoding steps, and the log-probability of the
completion is the sum over steps s of the log-probs of the U tokens step s committed, given the state
x_s before it (every token of step >= s masked). Instead of scoring every step, AGRPO scores M steps
per completion drawn at random (an unbiased Monte Carlo estimate of the sum over steps), with the
draws spread by a low-discrepancy sequence and, optionally, importance-sampled by the entropy each
step's tokens were drawn with. The log-probs are those of the distribution the sampler drew from:
logits / T restricted to its top-k/top-p support (the truncated sampler records both, `dare.rollout.truncated`).

    A_i        = r_i - mean(r_group)                                      (no std scaling)
    last_i     = the last step that committed a non-EOS token of completion i
    s_im       ~ p_i(s) over s <= last_i:   uniform, or  p_i(s) ∝ 1e-8 + sum_{k in U_s} H_k   (entropy)
    w_im       = (1 / (last_i + 1)) / p_i(s_im)                           (1 for uniform draws)
    rho_k      = exp(log pi(o_k | x_s) - log pi_sampler(o_k | x_s))       for k in U_s
    KL_k       = rho_k (exp(ref - logp) - (ref - logp) - 1)               (k3 with DeepSeek-V3.2's ratio)
    L          = 1/(M N) sum_i sum_m w_im sum_{k in U_s_im} [ -min(rho A_i, clip(rho, 1 - eps, 1 + eps) A_i) + beta KL_k ]

N is the number of completions in the step. The ratio's denominator is the log-prob the sampler drew the
token with (no old-policy pass): with one update per rollout it is 1 up to the rollout/trainer numerical gap.

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout (truncated sampler: step map, drawn log-probs, entropies, supports) -> rewards -> advantages
    -> sample_noise: M steps per completion and their weights -> ref token_logps (beta > 0)
    -> mu x [token_logps (one forward per draw) -> loss -> optimizer step]
"""

import torch

from dare.train import noise
from dare.train.estimators import masked_logps
from dare.train.objectives import clipped_token_objective, group_advantages, k3

RECIPE = "rl"
SCORE = "draw_token"  # what token_logps returns: (B, D, G) (dare.train.hooks.SCORES)


def check_config(cfg) -> None:
    d = cfg.rl.decoding
    if d.sampler != "truncated":
        raise ValueError(f"rl.decoding.sampler={d.sampler!r}: AGRPO scores the distribution each token was drawn from "
                         "(its top-k/top-p support and entropy), which the truncated sampler records: set "
                         "rl.decoding.sampler=truncated")
    if d.temperature <= 0:
        raise ValueError(f"rl.decoding.temperature={d.temperature}: AGRPO's log-probs are those of logits / T, "
                         "so rollouts must sample (T > 0)")


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G) rewards -> (P, G) advantages: the group mean is the baseline, no std division."""
    return group_advantages(rewards, baseline="mean", std="none")


def uses_reference(cfg) -> bool:
    return cfg.algo.beta > 0


def uses_old_logps(cfg) -> bool:
    return False  # the ratio's denominator is the sampler's own log-prob (batch.rollout.logps)


def rollout_options(cfg) -> dict:
    return {"record": ("states", "supports")}


def last_steps(batch) -> torch.Tensor:
    """(B,) the last step that committed a non-EOS token (0 for a completion of EOS only)."""
    non_eos = torch.where(batch.responses == batch.eos_token_id, -1, batch.step_map)
    return non_eos.max(dim=1).values.clamp(min=0)


def step_probs(batch, steps: int) -> torch.Tensor:
    """(B, steps) AGRPO's entropy importance distribution over the steps s <= last: proportional to
    1e-8 + the summed entropies of the tokens step s drew."""
    last = last_steps(batch)[:, None]
    mass = torch.full((len(last), steps), 1e-8, device=last.device)
    mass = mass.scatter_add(1, batch.step_map.clamp(0, steps - 1), batch.rollout.entropies.float())
    mass = torch.where(torch.arange(steps, device=last.device)[None] <= last, mass, 0.0)
    return mass / mass.sum(dim=1, keepdim=True)


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """Draw(steps (B, M), weight (B, M)): M decoding steps s <= last per completion from uniforms u, made
    low-discrepancy by a random permutation of the B*M strata plus a uniform jitter within each
    (arXiv:2409.02908 G.2): floor(u (last + 1)), or by the inverse CDF of `step_probs` with the importance weights
    (1 / (last + 1)) / p(s) (`importance_sampling: entropy`; uniform draws weigh 1)."""
    B, M = batch.step_map.shape[0], cfg.algo.mc_samples
    u = torch.rand(B * M, generator=generator, device=generator.device)
    if cfg.algo.low_discrepancy:
        u = (torch.randperm(B * M, generator=generator, device=generator.device) + u) / (B * M)
    u = u.view(B, M).to(batch.step_map.device)
    last = last_steps(batch)[:, None]
    if cfg.algo.importance_sampling == "entropy":
        probs = step_probs(batch, batch.decoding.steps)
        steps = torch.searchsorted(probs.cumsum(dim=1), u).clamp(max=last)  # rounding can land past the last step
        return noise.Draw(steps=steps, weight=(1.0 / (last + 1)) / probs.gather(1, steps))
    steps = torch.floor(u * (last + 1)).long().clamp(max=last)  # float32 u can round up to 1
    return noise.Draw(steps=steps, weight=torch.ones(steps.shape, device=steps.device))


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B, M, G) log pi(o_k | x_s) for the tokens k step s = steps[:, m] committed (0 elsewhere): one
    forward per draw on the sampler's recorded state before step s, with its temperature and the
    support each token was drawn from."""
    steps = draw.steps
    (B, M), P = steps.shape, batch.prompt_length
    states, _ = noise.trajectory_states(batch.trajectory, steps, batch.mask_token_id)  # (B, M, G)
    x = torch.cat([batch.sequences[:, None, :P].expand(-1, M, -1), states], dim=2).flatten(0, 1)
    at = batch.step_map[:, None, :] == steps[..., None]  # (B, M, G) the tokens of each drawn step
    where = torch.cat([torch.zeros(B, M, P, dtype=torch.bool, device=at.device), at], dim=2).flatten(0, 1)
    rows, cols = where.nonzero(as_tuple=True)  # row b*M + m: draw m of completion b
    support = batch.supports[rows // M, cols - P] if batch.supports is not None else None
    logps = masked_logps(model, x, batch.sequences.repeat_interleave(M, dim=0), where,
                         batch.attention_mask.repeat_interleave(M, dim=0), compute=batch.compute,
                         temperature=batch.decoding.temperature, support=support)
    return logps[:, P:].view(B, M, -1)


def loss(logps, old_logps, ref_logps, batch, draw: noise.Draw, cfg):
    steps, weights = draw.steps, draw.weight
    eps, beta, M = cfg.algo.epsilon, cfg.algo.beta, steps.shape[1]
    at = batch.step_map[:, None, :] == steps[..., None]  # (B, M, G) the tokens of each drawn step
    ratio = torch.exp(torch.where(at, logps - batch.rollout.logps[:, None, :], 0.0))
    adv = batch.advantages[:, None, None]
    policy, clipped = clipped_token_objective(ratio, adv, eps, eps)
    per_token = -policy
    kl = torch.zeros_like(logps)
    if ref_logps is not None:
        delta = torch.where(at, ref_logps - logps, 0.0)
        kl = ratio * k3(delta)
    weight = at * weights[..., None] / (M * max(batch.num_sequences, 1))
    loss = ((per_token + beta * kl) * weight).sum()
    # token shares over the step: each draw scores gen_length / steps tokens
    share = at / (M * max(batch.num_sequences, 1) * (batch.decoding.gen_length // batch.decoding.steps))
    return loss, {"loss/policy": (per_token * weight).sum().item(), "loss/kl": (kl * share).sum().item(),
                  "stats/clip_low": (((ratio < 1 - eps) & (adv < 0)) * share).sum().item(),
                  "stats/clip_high": (((ratio > 1 + eps) & (adv > 0)) * share).sum().item()}
