"""EGSPO, entropy-guided step-wise policy optimization (arXiv:2603.12554; reference code
`vishnutez/egspo-dllm-rl` @a7d618b, `egspo/egspo_trainer.py`, `egspo/train.sh`; no license: ported from the paper
and the code's behaviour, its outputs pinned).

The exact policy gradient of a masked diffusion model runs over its denoising steps: each step is an action (the
tokens it commits, given the state before it), and its log-prob is exact (one forward on that state). EGSPO trains
on the K steps per rollout where the sampler was least certain (highest mean entropy of the committed tokens'
distributions) and gives each step its own advantage: how much better the final completion is than the step's
one-step denoising completion (the argmax fill of the canvas before the step), mixed with the final reward.

    H_t    = mean_{k committed at t} entropy(p_theta(. | x_t)_k)            (the rollout's; x_t: the state before t)
    t_1..t_K = the K steps with the highest H_t
    R_ik   = (r_i + lambda1 (r_i - r(argmax fill of x_{t_k}))) / (1 + lambda1)
    A_ik   = R_ik - mean_group R_.k
    log pi_ik = sum_{k committed at t_k} log p_theta(o^k | x_{t_k})
    L      = mean_i [-min(rho A, clip(rho, 1 - eps, 1 + eps_high) A) + beta k3(log pi_ref - log pi)] / (gen_length / steps)

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout (step map, entropies, greedy fills) -> rewards -> advantages (logged) -> prepare (the K steps, their
    rewards and advantages) -> mu x sample_noise (the next s chosen steps, in the reference's order)
    -> old/ref token_logps -> mu x [update]

Deviations (README.md): the loss is averaged over the step's completions (the reference: per micro-batch of 6);
d1's deviations (full fine-tuning with a frozen reference, float64 Gumbel noise, padding hidden).
"""

from dataclasses import replace

import torch

from dare.train import noise
from dare.train.estimators import check_masked_schedule, draw_logps
from dare.train.objectives import clipped_token_objective, group_advantages, k3

RECIPE = "rl"
SCORE = "draw"  # (B, s): each replayed step's log-prob, the sum over the tokens it committed


def check_config(cfg) -> None:
    d = cfg.rl.decoding
    check_masked_schedule(cfg, "EGSPO's step replay", cache=False)
    if cfg.rl.noise_draws != "per_update":
        raise ValueError("rl.noise_draws=once: EGSPO's updates replay the chosen steps in turn (one draw each)")
    if cfg.algo.num_steps > d.steps:
        raise ValueError(f"algo.num_steps = {cfg.algo.num_steps} > rl.decoding.steps = {d.steps}: K chosen steps "
                         "of the rollout's")


def rollout_options(cfg) -> dict:
    return {"record": ("entropies", "greedy")}


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G): the final rewards' group advantages (logged); the loss reads the steps' own (`prepare`)."""
    return group_advantages(rewards, baseline="mean", std="none")


def uses_reference(cfg) -> bool:
    return cfg.algo.beta > 0


def step_entropies(step_map: torch.Tensor, entropies: torch.Tensor, steps: int) -> torch.Tensor:
    """(B, steps) the mean entropy of the tokens each step committed (-inf for a step that committed none)."""
    at = step_map.clamp(min=0)
    on = (step_map >= 0).float()
    total = torch.zeros(step_map.shape[0], steps, device=step_map.device).scatter_add_(1, at, entropies * on)
    count = torch.zeros_like(total).scatter_add_(1, at, on)
    return torch.where(count > 0, total / count.clamp(min=1), -torch.inf)


def step_returns(final: torch.Tensor, at_steps: torch.Tensor, group_size: int, cfg) -> torch.Tensor:
    """(B, K) the steps' advantages from the final rewards (B,) and the steps' one-step rewards (B, K)."""
    a = cfg.algo
    returns = final[:, None] + a.lambda1 * (final[:, None] - at_steps)
    if a.normalize_returns:
        returns = returns / (1 + a.lambda1)
    grouped = returns.view(-1, group_size, returns.shape[1])
    return (grouped - grouped.mean(dim=1, keepdim=True)).view_as(returns)


def prepare(batch, cfg):
    """extras: "steps" (B, K) the chosen steps (highest entropy first), "step_advantages" (B, K)."""
    if batch.block_size is not None:
        raise ValueError("egspo replays a masked model's steps (LLaDA, Dream); block models decode per block")
    K, steps = cfg.algo.num_steps, batch.greedy.shape[1]
    chosen = step_entropies(batch.step_map, batch.entropies, steps).topk(K, dim=1).indices
    fills = batch.greedy.gather(1, chosen[..., None].expand(-1, -1, batch.greedy.shape[2]))  # (B, K, G)
    B = chosen.shape[0]
    at_steps = batch.score(fills.reshape(B * K, -1), [b for b in range(B) for _ in range(K)]).view(B, K)
    adv = step_returns(batch.rewards, at_steps.to(batch.rewards.device), batch.group_size, cfg)
    return replace(batch, extras={"steps": chosen, "step_advantages": adv})


def update_steps(update: int, cfg) -> list[int]:
    """The indices k of the chosen steps update `update` replays: (update s + j + 1) mod K for j < s (s =
    steps_per_update), the reference's counter (`self._step % K`, advanced once before the first loss), one per
    micro-batch."""
    a = cfg.algo
    return [(update * a.steps_per_update + j + 1) % a.num_steps for j in range(a.steps_per_update)]


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """The chosen steps this update replays (`update_steps`, the same k for every completion): masked
    (B, s, P + G), the states before those steps; steps (B, s)."""
    steps = batch.extras["steps"][:, update_steps(batch.draw_index, cfg)]
    masked, _ = noise.step_states(batch.step_map, steps)
    prompt = torch.zeros_like(masked[:, :, :1]).expand(-1, -1, batch.prompt_length)
    return noise.Draw(masked=torch.cat([prompt, masked], dim=2), steps=steps)


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B, s) log p(the tokens each replayed step committed | the state before it)."""
    committed = noise.step_states(batch.step_map, draw.steps)[1]
    return (draw_logps(model, batch, draw.masked) * committed).sum(dim=-1)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    a = cfg.algo
    match = batch.extras["steps"][:, None, :] == draw.steps[:, :, None]  # (B, s, K)
    adv = (batch.extras["step_advantages"][:, None, :] * match).sum(dim=2)  # (B, s)
    ratio = torch.exp(logps - old_logps)
    policy, clipped = clipped_token_objective(ratio, adv, a.epsilon, a.epsilon_high)
    kl = k3(ref_logps - logps) if ref_logps is not None else torch.zeros_like(ratio)
    per_step = batch.decoding.gen_length / batch.decoding.steps  # tokens a step commits
    rows = max(batch.num_sequences, 1) * draw.steps.shape[1]  # completions x replayed steps (the micro-batches)
    n = rows * per_step
    loss = (-policy + a.beta * kl).sum() / n
    return loss, {"loss/policy": -policy.sum().item() / n, "loss/kl": kl.sum().item() / n,
                  "stats/clip_ratio": (ratio != clipped).float().sum().item() / rows,
                  "stats/step_advantage": adv.abs().sum().item() / rows}
