"""d1 / diffu-GRPO (Zhao et al., "d1: Scaling Reasoning in Diffusion Large Language Models via
Reinforcement Learning", arXiv:2504.12216, §3; reference code `dllm-reasoning/d1`
`diffu-grpo/diffu_grpo_trainer.py`).

Per-token log-probs come from ONE forward pass of the mask predictor on q' + [MASK]^L: every
completion token is masked and each prompt token is masked independently with p_mask_prompt
(q'). log pi(o^k | q) ~= log softmax(f(q' + M..M))_k[o^k] (mean-field; §3.1). A fresh prompt
mask is drawn for every inner iteration and shared by the policy, old and reference log-probs.

    A_i   = r_i - mean(r_group)                                  (Eq. 2, no std scaling)
    rho   = exp(logp - logp_old)
    KL    = exp(ref - logp) - (ref - logp) - 1                   (k3 estimator)
    L     = -sum_{i,k} [min(rho A, clip(rho, 1-eps, 1+eps) A) - beta KL] / sum_i |o_i|   (Eq. 4)

|o_i| counts completion tokens up to and including the first EOS; the sum runs over the whole
rollout batch (token-level normalisation, `batch.num_tokens`; the reference code applies it per
micro-batch of 6, so there the gradient depends on how the batch is split).

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout -> rewards -> advantages(rewards, cfg) -> mu x sample_noise(batch, generator, cfg)
    -> old/ref token_logps(model, batch, draw, cfg) -> mu x [token_logps -> loss(..., draw, cfg)
    -> optimizer step]

Deviations from the reference code (all listed in README.md):
1. Full fine-tuning of the policy with a frozen copy as reference (the paper uses a 4-bit base
   with LoRA and the adapter-disabled base as reference; LoRA arrives with the peft baseline).
2. mu = 1 is supported: the old log-probs are then the current ones (ratio 1) instead of
   the reference code's crash on an undefined variable.
3. Token normalisation over the whole step rather than per micro-batch (see above).
"""

import torch

from dare.train import noise
from dare.train.estimators import completion_logps
from dare.train.objectives import clipped_token_loss, group_advantages

RECIPE = "rl"
SCORE = "token"  # what token_logps returns: (B, G) (dare.train.hooks.SCORES)


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G) rewards -> (P, G) advantages: the group mean is the baseline, no std division."""
    return group_advantages(rewards, baseline="mean", std="none")


def uses_reference(cfg) -> bool:
    return cfg.algo.beta > 0


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """q' + [MASK]^L for this inner iteration: every completion token masked, each prompt token
    with probability p_mask_prompt. masked: (B, P + G) bool"""
    completion = noise.completion(batch.attention_mask, batch.prompt_length)
    prompt = ~completion & batch.attention_mask.bool()
    return noise.Draw(noise.full_completion(completion, prompt, cfg.algo.p_mask_prompt, generator))


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """One-step per-token log-probs of the completion. (B, G)"""
    return completion_logps(model, batch, draw.masked)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    return clipped_token_loss(logps, old_logps, ref_logps, batch, cfg.algo.epsilon, cfg.algo.beta)
