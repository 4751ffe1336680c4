"""The objectives baselines share: group advantages, PPO's clipped surrogate (per token and per sequence),
self-normalised clipped importance weights and the clipped log-ratio regression.
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
                               eps_high: float, dual_clip: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) PPO's min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) for sequence-level log-ratios, taken in log space
    so exp never overflows (A >= 0: A exp(min(log r, log(1 + eps_high))); A < 0: A exp(max(log r, log(1 - eps_low))),
    the same value and gradient), and (B,) bool: where the clip bites. ESPO, GDPO, EBPO.

    dual_clip c > 1 (dual-clip PPO, Ye et al. 2020, arXiv:1912.09729, as verl's `compute_policy_loss` takes it with
    `clip_ratio_c`): for A < 0 the objective is also bounded below by c A, i.e. log r is capped at log c there
    (the same value and a zero gradient where it bites). BridgeRatio-GRPO."""
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip={dual_clip}: the dual clip needs c > 1")
    low = math.log1p(-eps_low) if eps_low < 1 else -math.inf
    cap = math.log(dual_clip) if dual_clip is not None else math.inf
    clipped = torch.where(adv >= 0, log_ratio.clamp(max=math.log1p(eps_high)),
                          log_ratio.clamp(min=low).clamp(max=cap))
    return torch.exp(clipped) * adv, clipped != log_ratio


def clipped_elbo_loss(logps: torch.Tensor, old_logps: torch.Tensor, kl: torch.Tensor, batch, epsilon: float,
                      beta: float) -> tuple[torch.Tensor, dict]:
    """ESPO's and GDPO's loss from (B,) sequence ELBOs: PPO's clip (epsilon both sides) on the per-token log-ratio
    (logps - old_logps) / L, one ratio per completion, plus beta x the (B,) KL the baseline computes; summed over
    the completions and divided by the step's `batch.num_sequences`."""
    L = batch.sequences.shape[1] - batch.prompt_length
    policy, clipped = clipped_sequence_objective((logps - old_logps) / L, batch.advantages, epsilon, epsilon)
    n = batch.num_sequences
    loss = (-policy + beta * kl).sum() / n
    return loss, {"loss/policy": -policy.sum().item() / n, "loss/kl": kl.sum().item() / n,
                  "stats/elbo_per_token": logps.detach().sum().item() / L / n,
                  "stats/clip_ratio": clipped.float().sum().item() / n}


def bridge_log_ratio(scores: torch.Tensor, old_scores: torch.Tensor, correction: str = "none",
                     detach_correction: bool = True, eps: float = 1e-8) -> tuple[torch.Tensor, torch.Tensor]:
    """The BridgeRatio estimate of a sequence's log policy ratio log p_theta(y) / p_old(y) from K denoising paths
    tau_k shared by both policies (DARE pull request #21, `estimate_bridge_log_ratio`): scores (B, K, ...) the
    paths' log-weights l_theta(tau_k), old_scores the same paths under the old policy.

        log rho = logsumexp_k l_theta(tau_k) - logsumexp_k l_old(tau_k)

    the ratio of the two path-sum estimates of the likelihood, rather than the difference of two averaged ELBOs.
    `correction`, for the bias of the log of a K-sample mean:
      none      as above;
      delta     + 1/(2K) [CV^2(w_theta) - CV^2(w_old)], CV^2 the squared coefficient of variation of the paths'
                weights w = exp(l) over k (the delta method; detached with `detach_correction`);
      jackknife K log rho - (K - 1) x the mean of the K leave-one-path-out estimates (none for K = 1);
      cumulant  E_q[d] + Var_q[d] / 2 with d_k = l_theta(tau_k) - l_old(tau_k) and q = softmax_k l_old (the
                second-order cumulant expansion of log E_q exp d; q detached with `detach_correction`).
    -> (log rho (B, ...), the correction: log rho minus the uncorrected estimate)."""
    if scores.shape != old_scores.shape or scores.dim() < 2:
        raise ValueError(f"scores {tuple(scores.shape)} and old_scores {tuple(old_scores.shape)}: two (B, K, ...) "
                         "tensors of the same shape expected")
    K = scores.shape[1]
    plain = torch.logsumexp(scores, dim=1) - torch.logsumexp(old_scores, dim=1)
    if correction == "none":
        return plain, torch.zeros_like(plain)
    if correction == "delta":
        def cv2(logw):
            w = torch.exp(logw - logw.amax(dim=1, keepdim=True))
            return w.var(dim=1, unbiased=False) / w.mean(dim=1).square().clamp(min=eps)

        term = (cv2(scores) - cv2(old_scores)) / (2 * K)
        term = term.detach() if detach_correction else term
        return plain + term, term
    if correction == "jackknife":
        if K < 2:
            return plain, torch.zeros_like(plain)
        drop = [torch.logsumexp(torch.cat([scores[:, :k], scores[:, k + 1:]], dim=1), dim=1)
                - torch.logsumexp(torch.cat([old_scores[:, :k], old_scores[:, k + 1:]], dim=1), dim=1)
                for k in range(K)]
        out = K * plain - (K - 1) * torch.stack(drop, dim=1).mean(dim=1)
        return out, out - plain
    if correction == "cumulant":
        d = scores - old_scores
        q = torch.softmax(old_scores, dim=1)
        q = q.detach() if detach_correction else q
        mean = (q * d).sum(dim=1)
        out = mean + 0.5 * (q * (d - mean.unsqueeze(1)).square()).sum(dim=1)
        return out, out - plain
    raise ValueError(f"correction={correction!r}: expected none, delta, jackknife or cumulant")


def clipped_token_objective(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float,
                            eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) per token (to be maximised), and the clipped ratio
    (for the clip statistics). GRPO-style baselines: d1, coupled-GRPO, CJ-GRPO, TraceRL, MDPO, JustGRPO, AGRPO,
    D-TreeRPO."""
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
    return torch.min(ratio * adv, clipped * adv), clipped


def clipped_token_loss(logps: torch.Tensor, old_logps: torch.Tensor, ref_logps: torch.Tensor | None, batch,
                       epsilon: float, beta: float) -> tuple[torch.Tensor, dict]:
    """diffu-GRPO's loss (d1 Eq. 4) from (B, G) per-token log-probs: PPO's clip (epsilon both sides) on each token's
    ratio, minus beta x k3 against the reference (none when `ref_logps` is None), summed over the completions' tokens
    up to their first EOS (`batch.response_mask`) and divided by those of the whole step (`batch.num_tokens`, all
    micro-batches and processes). d1, coupled-GRPO and d2 (each with its own log-probs)."""
    mask = batch.response_mask.float()
    ratio = torch.exp(logps - old_logps)
    policy, clipped = clipped_token_objective(ratio, batch.advantages[:, None], epsilon, epsilon)
    kl = k3(ref_logps - logps) if ref_logps is not None else torch.zeros_like(logps)
    n = max(batch.num_tokens, 1.0)
    loss = (-(policy - beta * kl) * mask).sum() / n
    return loss, {  # token means over the step: they add up over micro-batches
        "loss/policy": (-(policy * mask).sum() / n).item(),
        "loss/kl": ((kl * mask).sum() / n).item(),
        "stats/clip_ratio": (((ratio - clipped).abs() > 0).float() * mask).sum().item() / n,
    }


def k3(delta: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimate of KL(pi || pi_ref) per token, exp(delta) - delta - 1 with delta = log pi_ref - log pi
    (unbiased, >= 0). d1, coupled-GRPO, CJ-GRPO, GDPO, AGRPO, D-TreeRPO."""
    return torch.exp(delta) - delta - 1


def clipped_self_normalized_weights(log_ratio: torch.Tensor, max_ratio: float) -> torch.Tensor:
    """(..., G) -> (..., G) self-normalised importance weights of clipped ratios along the last dimension:
    w_i = min(r_i, max_ratio) / sum_j min(r_j, max_ratio), from log-ratios as a softmax of min(log r, log
    max_ratio) (no exp overflows). The clip is unconditional (it ignores the advantage's sign) and the weights of
    a group sum to 1, so the update lies in the convex hull of the per-sample updates. StableDRL."""
    return torch.softmax(log_ratio.clamp(max=math.log(max_ratio)), dim=-1)


def clipped_log_ratio_regression(log_ratio: torch.Tensor, target: torch.Tensor, eps_low: float, eps_high: float,
                                 scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(...) the squared error (scale x clip(log r, log(1 - eps_low), log(1 + eps_high)) - target)^2 of a sequence
    log-ratio regressed onto a target, and (...) bool: where the clip bites (the clip is two-sided, whatever the
    target's sign, and the term has no gradient there). Unclipped, its minimum is log r = target / scale: the old
    policy tilted by exp(target / scale), the closed-form optimum of a KL-regularised objective with that reward.
    GDSD (target psi x A, scale 1 / generation length)."""
    low = math.log1p(-eps_low) if eps_low < 1 else -math.inf
    clipped = log_ratio.clamp(min=low, max=math.log1p(eps_high))
    return (scale * clipped - target) ** 2, clipped != log_ratio
