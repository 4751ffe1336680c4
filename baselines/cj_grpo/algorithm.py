"""CJ-GRPO (Yang et al., "Taming Masked Diffusion Language Models via Consistency Trajectory
Reinforcement Learning with Fewer Decoding Step", arXiv:2509.23924, §3; reference code
`yjyddq/EOSER-ASS-RL` @5affb4e, `cj-grpo/cj_grpo_trainer_*.py`).

Consistency-trajectory GRPO: the policy ratio is taken on the rollout's own denoising transitions
x_s -> x_{s+1} instead of a one-step estimate from a fully masked answer. The rollout records which
step committed each token (the step map); each token is committed once, so the state x_s is the final
completion with every token of step >= s masked, and one forward per step scores the tokens U_s that
step s unmasked (`dare.train.estimators.trajectory_logps`; no prompt masking, no random masking).
Block models (SDAR, LLaDA2.x; DARE's extension): a transition is (block, local step), and one forward
through the `[x_t ; x_0]` layout scores local step s of every block (each block sees the clean blocks
before it, as the block sampler showed it).

    A_i    = r_i - mean(r_group)                               (no std scaling, as d1)
    rho    = exp(log pi(x_{s+1}^k | x_s) - log pi_old(x_{s+1}^k | x_s))     for k in U_s
    KL     = exp(ref - logp) - (ref - logp) - 1               (k3, against the reference model)
    L      = 1/B sum_i 1/S_i sum_s 1/|U_s,i| sum_{k in U_s,i} [ -min(rho A_i, clip(rho, 1 - eps, 1 + eps) A_i)
                                                               + beta KL ]

S_i is the number of transitions of sequence i. The reference pools each step's mean over the
micro-batch (`(loss * U_s).sum() / U_s.sum() / steps`): with a fixed schedule every row commits the
same number of tokens per step, so the two agree; with threshold decoding they weight differently.
As the code does it, every completion position is in the loss, tokens after EOS included
(`completion_mask` is never applied). The paper's decoding companions, EOSER and the ascending
step-size schedule (ASS), are sampler options (`rl.decoding.masked.eos_gamma_min`, `rl.decoding.masked.schedule=ass`)
usable by any method and by evaluation (`dare.rollout.llada`).

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout (step map) -> rewards -> advantages -> prepare: the rounds (no randomness)
    -> old/ref token_logps (one forward per step) -> mu x [token_logps -> loss -> optimizer step]
"""

from dataclasses import replace

import torch

from dare.train import noise
from dare.train.estimators import check_replayable, trajectory_logps
from dare.train.objectives import clipped_token_objective, group_advantages, k3

RECIPE = "rl"
SCORE = "token"  # what token_logps returns: (B, G) (dare.train.hooks.SCORES)


def check_config(cfg) -> None:
    check_replayable(cfg.rl.decoding, "CJ-GRPO")


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G) rewards -> (P, G) advantages: the group mean is the baseline, no std division."""
    return group_advantages(rewards, baseline="mean", std="none")


def uses_reference(cfg) -> bool:
    return cfg.algo.beta > 0


def prepare(batch, cfg):
    """No randomness: extras "rounds", the step (within its block, for block models) that committed each
    position, (B, P + G); -1 on the prompt, `noise.NEVER` where no step committed."""
    return replace(batch, extras={"rounds": noise.rollout_rounds(batch, shrink=1)})


def token_logps(model, batch, draw, cfg) -> torch.Tensor:
    """(B, G) log pi(x_{s+1}^k | x_s) for each completion token k, s its commit step."""
    return trajectory_logps(model, batch, batch.extras["rounds"])


def transition_weights(batch, rounds: torch.Tensor) -> torch.Tensor:
    """(B, G) float64 1 / (|U_s,i| S_i) on every committed completion token, 0 elsewhere: the
    per-transition mean, then the mean over the sequence's transitions (a transition: (block, step)).
    In float64, so that the reduction is exact to the reference's tolerance (DARE's tests: 1e-12)."""
    r = rounds[:, batch.prompt_length:]
    on = r < noise.NEVER
    per_transition, transitions = noise.transition_sizes(r, on, noise.rollout_segments(batch), torch.float64)
    return on.double() / per_transition / transitions.clamp(min=1)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    eps, beta = cfg.algo.epsilon, cfg.algo.beta
    weight = transition_weights(batch, batch.extras["rounds"]) / max(batch.num_sequences, 1)  # sums to 1 over the step's rows
    adv = batch.advantages[:, None]
    ratio = torch.exp(logps - old_logps)
    policy, clipped = clipped_token_objective(ratio, adv, eps, eps)
    kl = k3(ref_logps - logps) if ref_logps is not None else torch.zeros_like(logps)
    loss = ((-policy + beta * kl) * weight).sum().to(logps.dtype)  # reduced in float64, returned in the loss's dtype
    return loss, {"loss/policy": (-(policy * weight).sum()).item(), "loss/kl": (kl * weight).sum().item(),
                  "stats/clip_ratio": ((((ratio - clipped).abs() > 0).double()) * weight).sum().item()}
