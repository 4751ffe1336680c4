"""TraceRL (Wang et al., "Revolutionizing Reinforcement Learning Framework for Diffusion Large
Language Models", arXiv:2509.06949, §4; reference code `Gen-Verse/dLLM-RL` @10b4fd1,
`train/rl_sdar.py`, `train/rl_llada.py`, `reward/rl_reward.py`).

Trajectory-aware RL: the policy is scored on its own decoding trajectory. The rollout records which
step committed each token (the step map). Within each block (block-causal models; the whole
completion for masked ones) every `shrink` consecutive distinct steps form one trace step
tau^s(t); the training input for trace step t is the completion with every token of trace step
>= t masked, and the scored tokens are those of trace step t (`dare.train.noise.trace_rounds`).
Block models score trace step t of every block in one forward through the `[x_t ; x_0]` layout
(each block sees only the clean blocks before it, exactly what it saw while being decoded).

    A_i   = (r_i - mean(r_group)) / std(r_group)   (population std; 0 when std = 0)
    rho_k = exp(clamp(logp_k - logp_old_k, -10, 10))          (logp_k at o_k's own trace step)
    KL_k  = exp(clamp(old_k - logp_k, -10, 10)) - 1 - (old_k - logp_k)   (k3, against pi_old)
    L     = 1/B sum_i 1/L1 sum_{k <= EOS} [ -min(rho A_i, clip(rho, 1 - eps, 1 + eps) A_i) + beta KL_k ]

L1 = `gen_length` (rl_sdar.py divides by the rollout's longest response). Groups whose accuracy
is above `filter_high` or below `filter_low` (rl_reward.py: 0.8, 0.2) get zero advantages.

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout (step map) -> rewards -> advantages(rewards, cfg) -> sample_noise: the trace rounds
    -> old token_logps (one forward per round) -> mu x [token_logps -> loss -> optimizer step]

Deviations (README.md): the optional value model is not built yet (group-relative advantages
only); one optimizer step per rollout batch; rows of filtered groups stay in the batch with zero
advantage; the trainer's blocks are the rollout's (rl_sdar.py aligns them at the padded prompt end).
"""

import torch

from dare.models import facts
from dare.train import noise
from dare.train.estimators import diffusion_logps
from dare.train.rl import group_advantages

RECIPE = "rl"


def check_config(cfg) -> None:
    if cfg.rl.decoding.editing_threshold > 0:
        raise ValueError("rl.decoding.editing_threshold > 0: token editing rewrites committed tokens, so the step "
                         "map no longer gives the states the sampler saw; TraceRL needs each token committed once")
    if cfg.rl.group_size < 2:
        raise ValueError(f"rl.group_size={cfg.rl.group_size}: the group z-score needs at least 2 completions")


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G): the group z-score (population std, 0 for a group whose rewards are all equal), and
    0 for groups whose accuracy (share of reward > 0) lies outside [filter_low, filter_high]."""
    adv = group_advantages(rewards, baseline="mean", std="population", eps=0.0).nan_to_num(0.0)
    accuracy = (rewards > 0).float().mean(dim=1, keepdim=True)
    kept = (accuracy >= cfg.algo.filter_low) & (accuracy <= cfg.algo.filter_high)
    return torch.where(kept, adv, 0.0)


def uses_reference(cfg) -> bool:
    return False  # the KL is taken against pi_old


def sample_noise(batch, generator: torch.Generator, cfg) -> torch.Tensor:
    """No randomness: the trace round of every position (B, P + G); -1 on the prompt (never
    masked), `noise.NEVER` for completion positions no step committed (masked in every round)."""
    P = batch.prompt_length
    if batch.block_size is None:  # masked models: the whole completion is one segment
        segment = torch.zeros_like(batch.step_map)
    else:
        segment = noise.blocks(batch.attention_mask, batch.block_size)[:, P:]
    rounds = noise.trace_rounds(batch.step_map, segment, cfg.algo.shrink)
    prompt = torch.full_like(batch.sequences[:, :P], -1)
    return torch.cat([prompt, rounds], dim=1)


def token_logps(model, batch, rounds: torch.Tensor, cfg) -> torch.Tensor:
    """(B, G) log pi(o_k | the trajectory state before o_k's trace step), one forward per round."""
    P, mask_id = batch.prompt_length, facts(model).mask_token_id
    scored = rounds[:, P:]
    out = torch.zeros(scored.shape, dtype=torch.float32, device=scored.device)
    n_rounds = int(torch.where(scored < noise.NEVER, scored, -1).max()) + 1
    for r in range(n_rounds):
        x = torch.where(rounds >= r, mask_id, batch.sequences)
        where = rounds == r
        out = out + diffusion_logps(model, x, batch.sequences, where, batch.attention_mask,
                                    compute=batch.compute)[:, P:]
    return out


def loss(logps, old_logps, ref_logps, batch, rounds, cfg):
    eps, beta = cfg.algo.epsilon, cfg.algo.beta
    mask = batch.response_mask.float()
    adv = batch.advantages[:, None]
    log_ratio = (logps - old_logps).clamp(-10.0, 10.0)
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1 - eps, 1 + eps)
    policy = torch.min(ratio * adv, clipped * adv)
    kl = torch.exp(-log_ratio) - 1 + log_ratio  # k3 of pi_old against pi_theta
    norm = batch.responses.shape[1] * max(batch.num_sequences, 1)  # L1 per response, mean over responses
    loss = ((-policy + beta * kl) * mask).sum() / norm
    n = max(batch.num_tokens, 1.0)
    return loss, {"loss/policy": (-(policy * mask).sum() / norm).item(), "loss/kl": ((kl * mask).sum() / norm).item(),
                  "stats/clip_ratio": (((ratio - clipped).abs() > 0).float() * mask).sum().item() / n}
