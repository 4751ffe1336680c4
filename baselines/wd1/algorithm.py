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

Deviations (README.md): the softmax runs over each group (the code takes it over the per-device
batch, which is one group of 6 in its configuration); the mean over groups replaces the
implicit averaging of DDP and gradient accumulation.
"""

import torch

from dare.models import facts
from dare.train.estimators import masked_logps
from dare.train.rl import group_advantages

RECIPE = "rl"


def check_config(cfg) -> None:
    if cfg.rl.group_size < 2:
        raise ValueError(f"rl.group_size={cfg.rl.group_size}: the group weights need at least 2 completions")


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    return group_advantages(rewards, baseline="mean", std="none")


def uses_reference(cfg) -> bool:
    return False  # beta = 0 in wd1: no reference likelihood


def uses_old_logps(cfg) -> bool:
    return False  # no importance ratio


def sample_noise(batch, cfg, generator: torch.Generator) -> torch.Tensor:
    """Which prompt tokens to mask in this inner iteration (d1's q'). (B, P) bool"""
    u = torch.rand(batch.prompt_mask.shape, generator=generator).to(batch.prompt_mask.device)
    return (u < cfg.p_mask_prompt) & batch.prompt_mask


def token_logps(model, batch, prompt_noise: torch.Tensor) -> torch.Tensor:
    """d1's one-step per-token log-probs of the completion. (B, G)"""
    mask_id, P = facts(model).mask_token_id, batch.prompt_length
    x = batch.sequences.clone()
    x[:, :P] = torch.where(prompt_noise, mask_id, x[:, :P])
    x[:, P:] = mask_id
    where = torch.zeros_like(x, dtype=torch.bool)
    where[:, P:] = True
    return masked_logps(model, x, batch.sequences, where, batch.attention_mask, compute=batch.compute)[:, P:]


def weights(adv: torch.Tensor, group_size: int, psi: float) -> torch.Tensor:
    """-w+ + w- per completion, the softmaxes taken within each group. (B,)"""
    a = psi * adv.view(-1, group_size)
    return (-torch.softmax(a, dim=1) + torch.softmax(-a, dim=1)).reshape(-1)


def loss(logps, old_logps, ref_logps, batch, cfg):
    seq = (logps * batch.response_mask).sum(dim=1)  # S_i
    w = weights(batch.advantages, batch.group_size, cfg.psi)
    n_groups = batch.num_sequences / batch.group_size  # groups in the whole step
    loss = (w * seq).sum() / n_groups
    return loss, {"loss/weighted_ll": loss.item(),
                  "stats/seq_logp": seq.detach().sum().item() / batch.num_sequences}
