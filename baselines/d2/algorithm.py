"""d2-StepMerge (Wang, Schiff, Turok, Kuleshov, "d2: Improved Techniques for Training Reasoning Diffusion
Language Models", arXiv:2509.21474; reference code `kuleshov-group/d2` @381b9f1,
`diffu-grpo/diffu_grpo_trainer.py` `d2StepMergeTrainer`).

diffu-GRPO's objective with the rollout's own trajectory likelihood in place of the one-step mean-field
estimate. The sampler's steps are cut into N segments of steps/N consecutive steps (segment k: steps
int(k steps / N) .. int((k + 1) steps / N) - 1, over the whole rollout); a token's log-prob is read where it
was decoded: from the canvas as it was at the start of its segment (the tokens of earlier segments clean,
the rest masked), with the prompt masked at random (p_mask_prompt, a fresh mask per inner update, shared
by the policy, old and reference log-probs). N = steps is the exact trajectory likelihood of the
low-confidence sampler's transitions; N = 1 is d1's estimate without its prompt-free completion.

    log pi(o^k | q) ~= log softmax(f_theta(q' + z_s(k)))_k [o^k]    (z_s: the canvas before segment s)
    A_i   = r_i - mean(r_group)                                      (no std)
    rho   = exp(logp - logp_old);  KL = k3(ref - logp)
    L     = -sum_{i,k} [min(rho A, clip(rho, 1-eps, 1+eps) A) - beta KL] / sum_i |o_i|

One forward per segment that holds a scored token (at most N), each scoring its own segment's tokens.

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout (step map) -> rewards -> advantages(rewards, cfg) -> prepare: each token's segment
    -> mu x sample_noise(batch, generator, cfg) -> old/ref token_logps (one forward per segment)
    -> mu x [token_logps -> loss -> optimizer step]

Deviations (README.md): d1's (full fine-tuning with a frozen reference, token normalisation over the step,
float64 Gumbel noise, padding hidden); the segments' forwards are backpropagated together (the reference
accumulates one segment per micro-step).
"""

from dataclasses import replace

import torch

from dare.train import noise
from dare.train.estimators import check_replayable, trajectory_logps
from dare.train.objectives import clipped_token_loss, group_advantages

RECIPE = "rl"
SCORE = "token"  # what token_logps returns: (B, G) (dare.train.hooks.SCORES)


def check_config(cfg) -> None:
    check_replayable(cfg.rl.decoding, "d2-StepMerge")
    if cfg.rl.decoding.masked.threshold or cfg.rl.decoding.masked.factor:
        raise ValueError("rl.decoding.masked.threshold/factor: d2-StepMerge cuts the rollout's fixed schedule of "
                         "rl.decoding.steps steps into segments; a parallel rule makes the steps vary")
    if cfg.algo.segments > cfg.rl.decoding.steps:
        raise ValueError(f"algo.segments = {cfg.algo.segments} > rl.decoding.steps = {cfg.rl.decoding.steps}: "
                         "a segment holds at least one step")


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G) rewards -> (P, G) advantages: the group mean is the baseline, no std division."""
    return group_advantages(rewards, baseline="mean", std="none")


def uses_reference(cfg) -> bool:
    return cfg.algo.beta > 0


def segments(step_map: torch.Tensor, steps: int, n: int) -> torch.Tensor:
    """(B, G) the segment of each committed position, `noise.NEVER` where no step committed: step s lies in
    segment k when int(k steps / n) <= s < int((k + 1) steps / n) (the reference's boundaries)."""
    return torch.where(step_map >= 0, ((step_map + 1) * n - 1) // steps, noise.NEVER)


def prepare(batch, cfg):
    """extras "rounds" (B, P + G): -1 on the prompt, each completion token's segment (`segments`)."""
    if batch.block_size is not None:
        raise ValueError("d2-StepMerge replays a masked model's rollout (LLaDA, Dream); block models decode per block")
    seg = segments(batch.step_map, cfg.rl.decoding.steps, cfg.algo.segments)
    rounds = torch.cat([torch.full_like(batch.sequences[:, :batch.prompt_length], -1), seg], dim=1)
    return replace(batch, extras={"rounds": rounds})


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """The prompt mask of this inner update: each prompt token masked with probability p_mask_prompt (d1's draw,
    `noise.full_completion`, less its completion). masked: (B, P + G) bool"""
    completion = noise.completion(batch.attention_mask, batch.prompt_length)
    prompt = ~completion & batch.attention_mask.bool()
    return noise.Draw(noise.full_completion(completion, prompt, cfg.algo.p_mask_prompt, generator) & prompt)


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B, G) log pi(o_k | q', the canvas before o_k's segment) on the completion up to its first EOS, 0 after."""
    return trajectory_logps(model, batch, batch.extras["rounds"], targets=batch.response_mask, noised=draw.masked)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    return clipped_token_loss(logps, old_logps, ref_logps, batch, cfg.algo.epsilon, cfg.algo.beta)
