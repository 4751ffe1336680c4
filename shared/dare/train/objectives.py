"""The objectives baselines share: group advantages, PPO's clipped surrogate (per token and per sequence) and
self-normalised clipped importance weights.
Small functions a baseline's `algorithm.py` imports instead of writing them again."""

from __future__ import annotations

import math

import torch


def group_advantages(rewards: torch.Tensor, baseline: str = "mean", std: str = "none",
                     eps: float = 1e-4) -> torch.Tensor:
    """(P, G) rewards -> (P, G) advantages. baseline: "mean" (r - mean of the group) or "loo"
    (r - mean of the other G - 1); std: "none", "sample" (unbiased) or "population" scaling,
    A / (std + eps). The leave-one-out baseline and std scaling need G >= 2."""
    G = rewards.shape[1]
    if baseline not in ("mean", "loo") or std not in ("none", "sample", "population"):
        raise ValueError(f"unknown advantage settings baseline={baseline!r} std={std!r}")
    if G < 2 and (baseline == "loo" or std != "none"):
        raise ValueError(f"group size {G}: the leave-one-out baseline and std scaling need at least 2 completions")
    if baseline == "mean":
        adv = rewards - rewards.mean(dim=1, keepdim=True)
    else:
        adv = rewards - (rewards.sum(dim=1, keepdim=True) - rewards) / (G - 1)
    if std != "none":
        adv = adv / (rewards.std(dim=1, keepdim=True, correction=1 if std == "sample" else 0) + eps)
    return adv


def clipped_sequence_objective(log_ratio: torch.Tensor, adv: torch.Tensor, eps_low: float,
                               eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) PPO's min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) for sequence-level log-ratios, taken in log space
    so exp never overflows (A >= 0: A exp(min(log r, log(1 + eps_high))); A < 0: A exp(max(log r, log(1 - eps_low))),
    the same value and gradient), and (B,) bool: where the clip bites. ESPO, GDPO, EBPO."""
    clipped = torch.where(adv >= 0, log_ratio.clamp(max=math.log1p(eps_high)),
                          log_ratio.clamp(min=math.log1p(-eps_low) if eps_low < 1 else -math.inf))
    return torch.exp(clipped) * adv, clipped != log_ratio


def clipped_token_objective(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float,
                            eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) per token (to be maximised), and the clipped ratio
    (for the clip statistics). GRPO-style baselines: d1, coupled-GRPO, CJ-GRPO, TraceRL, MDPO, JustGRPO, AGRPO,
    D-TreeRPO."""
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
    return torch.min(ratio * adv, clipped * adv), clipped


def clipped_self_normalized_weights(log_ratio: torch.Tensor, max_ratio: float) -> torch.Tensor:
    """(..., G) -> (..., G) self-normalised importance weights of clipped ratios along the last dimension:
    w_i = min(r_i, max_ratio) / sum_j min(r_j, max_ratio), from log-ratios as a softmax of min(log r, log
    max_ratio) (no exp overflows). The clip is unconditional (it ignores the advantage's sign) and the weights of
    a group sum to 1, so the update lies in the convex hull of the per-sample updates. StableDRL."""
    return torch.softmax(log_ratio.clamp(max=math.log(max_ratio)), dim=-1)
