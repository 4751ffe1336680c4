"""wd1 (Tang et al., "wd1: Weighted Policy Optimization for Reasoning in Diffusion Language
Models", arXiv:2507.08838, §3; reference code `xiaohangt/wd1` `trainers/rev_grpo_trainer.py`,
variant `wll_d1_neg`).

From the closed form of reverse-KL-regularised policy improvement, a weighted log-likelihood with
negative-sample unlearning and NO importance ratio, clipping or reference likelihood:

    A_i   = r_i - mean(r_group)
    w+_i  = softmax_group(psi A)_i,   w-_i = softmax_group(-psi A)_i
    S_i   = sum_k log pi(o_i^k | q')                      (d1's one-step estimate, summed over |o_i|)
    L     = mean_groups sum_{i in group} (-w+_i + w-_i) S_i

The log-likelihood is d1's: every completion token masked, each prompt token masked with
p_mask_prompt, a fresh prompt mask per inner iteration. If all rewards of a group are equal then
w+ = w- and the group contributes no gradient.

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout -> rewards -> advantages(rewards, cfg) -> mu x [sample_noise(batch, generator, cfg)
    -> token_logps(model, batch, draw, cfg) -> loss(..., draw, cfg) -> optimizer step]
    (no old or reference log-probs: uses_old_logps is False, uses_reference keeps its default)

Deviations (README.md): the softmax runs over each group (the code takes it over the per-device
batch, which is one group of 6 in its configuration); the mean over groups replaces the
implicit averaging of DDP and gradient accumulation.
"""

import torch

from dare.train import noise
from dare.train.estimators import completion_logps
from dare.train.objectives import group_advantages

RECIPE = "rl"
SCORE = "token"  # what token_logps returns: (B, G) (dare.train.hooks.SCORES)


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    return group_advantages(rewards, baseline="mean", std="none")


def uses_old_logps(cfg) -> bool:
    return False  # no importance ratio (and beta = 0: no reference either, the default of uses_reference)


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """d1's q' + [MASK]^L: every completion token masked, each prompt token with p_mask_prompt."""
    completion = noise.completion(batch.attention_mask, batch.prompt_length)
    prompt = ~completion & batch.attention_mask.bool()
    return noise.Draw(noise.full_completion(completion, prompt, cfg.algo.p_mask_prompt, generator))


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """d1's one-step per-token log-probs of the completion. (B, G)"""
    return completion_logps(model, batch, draw.masked)


def weights(adv: torch.Tensor, group_size: int, psi: float) -> torch.Tensor:
    """-w+ + w- per completion, the softmaxes taken within each group. (B,)"""
    a = psi * adv.view(-1, group_size)
    return (-torch.softmax(a, dim=1) + torch.softmax(-a, dim=1)).reshape(-1)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    seq = (logps * batch.response_mask).sum(dim=1)  # S_i
    w = weights(batch.advantages, batch.group_size, cfg.algo.psi)
    n_groups = batch.num_sequences / batch.group_size  # groups in the whole step
    loss = (w * seq).sum() / n_groups
    return loss, {"loss/weighted_ll": loss.item(),
                  "stats/seq_logp": seq.detach().sum().item() / batch.num_sequences}
