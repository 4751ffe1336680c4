"""BridgeRatio-GRPO (DARE's own method, pull request #21 of yjyddq/DARE, head 6d4791f "Add BridgeRatio GRPO
support": `verl/trainer/ppo/dllm_core_algos.py` (`estimate_bridge_log_ratio`, `compute_policy_loss_bridgeratio`),
`verl/workers/actor/llada_dp_actor_bridgeratio_grpo.py`; no paper).

Coupled-GRPO's three denoising paths of a completion o (the fully masked completion, a mask M at one ratio t and
its complement within the completion; the prompt never masked) are read as K = 3 importance-weighted paths tau_k
shared by the current and the old policy, and the PPO ratio is taken directly from the path sums:

    l(tau_k) = 1/|o|_pad sum_{i masked in tau_k} log p(o^i | tau_k) / p_k,   p = (1, t, 1 - t)   (score_scale token)
    log rho  = logsumexp_k l_theta(tau_k) - logsumexp_k l_old(tau_k)        (`objectives.bridge_log_ratio`)
    A        = (r - mean_group r) / (std_group r + 1e-6)                      (verl's GRPO advantage)
    L        = -sum_i |o_i| max(c A_i, min(rho_i A_i, clip(rho_i, 1 - eps_l, 1 + eps_h) A_i)) / sum_i |o_i|
               (the dual clip c only where A < 0; token-mean over the step's loss tokens)

instead of coupled-GRPO's exp(pi_theta - pi_old) per token of the averaged estimate. On policy rho = 1 and the
gradient is sum_k softmax_k(l_theta) grad l_theta(tau_k) A: each path weighted by its share of the path sum.

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout -> rewards -> advantages(rewards, cfg) -> sample_noise(batch, generator, cfg) (t, M: 3 paths)
    -> old token_logps(model, batch, draw, cfg) when mu > 1 -> mu x [token_logps -> loss(..., draw, cfg)
    -> optimizer step]

Deviations (README.md): t is drawn per step from the run's generator (the reference's forward process calls
set_seed(42) every time: one constant t); the paths score the completion positions only (the reference's full
mask also covers the prompt's left padding, scored against all-zero logits); the loss averages over the loss
tokens up to the first EOS (the reference: the whole padded completion); no KL term (the recipe's
use_kl_loss=False); at mu = 1 the old scores are the current ones detached (the reference recomputes them).
"""

import torch

from dare.train import noise
from dare.train.estimators import draw_logps
from dare.train.objectives import bridge_log_ratio, clipped_sequence_objective, group_advantages

RECIPE = "rl"
SCORE = "draw_token"  # what token_logps returns: (B, D, G) (dare.train.hooks.SCORES)
PATHS = 3  # the full mask, M, its complement


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """verl's `compute_grpo_outcome_advantage`: (r - mean) / (sample std + 1e-6) within the group."""
    return group_advantages(rewards, baseline="mean", std="sample", eps=1e-6)


def uses_reference(cfg) -> bool:
    return False  # the recipe's use_kl_loss=False, kl_loss_coef=0


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """The three paths of every row, masked (B, 3, P + G): the whole completion, a mask M at one ratio t ~ U(t_min,
    t_max) drawn for the batch, and its complement; t (B, 3) = (1, t, 1 - t), weight 1 / t."""
    if batch.block_size is not None:
        raise ValueError("BridgeRatio-GRPO scores bidirectional (masked) models only: LLaDA and Dream")
    completion = noise.completion(batch.attention_mask, batch.prompt_length)
    B = completion.shape[0]
    t = cfg.algo.t_min + (cfg.algo.t_max - cfg.algo.t_min) * torch.rand((), generator=generator)
    first, second = noise.complementary(completion, t.expand(B), generator)
    ratios = torch.stack([torch.ones(()), t, 1 - t]).expand(B, PATHS).to(completion.device)
    return noise.Draw(torch.stack([completion, first, second], dim=1), ratios, 1.0 / ratios)


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B, 3, G) each path's weighted terms log p(o^i | tau_k) / p_k at its masked completion positions, 0 elsewhere
    (one forward over the B x 3 rows). Their sum over a path is its ELBO term; half the sum over the paths is
    coupled-GRPO's per-token estimate (Eq. 13)."""
    return draw_logps(model, batch, draw.masked) * draw.weight[:, :, None]


def path_scores(terms: torch.Tensor, batch, cfg) -> torch.Tensor:
    """(B, 3) l(tau_k) on `algo.score_scale` (the reference's `_scale_bridge_path_scores` of its per-path sums
    divided by the padded completion length)."""
    total = terms.sum(dim=2)
    if cfg.algo.score_scale == "sequence":
        return total
    per_token = total / terms.shape[2]
    if cfg.algo.score_scale == "token":
        return per_token
    return per_token * batch.response_mask.sum(dim=1, keepdim=True).clamp(min=1).to(per_token.dtype)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    a = cfg.algo
    log_ratio, correction = bridge_log_ratio(path_scores(logps, batch, cfg), path_scores(old_logps, batch, cfg),
                                             a.correction, a.detach_correction)
    if a.ratio_log_clip is not None:
        log_ratio = log_ratio.clamp(-a.ratio_log_clip, a.ratio_log_clip)
    adv = batch.advantages
    policy, _ = clipped_sequence_objective(log_ratio, adv, a.eps_low, a.eps_high, dual_clip=a.clip_ratio_c)
    tokens = batch.response_mask.sum(dim=1).to(policy.dtype)  # each completion's loss tokens
    n = max(batch.num_tokens, 1.0)  # loss tokens of the whole step
    loss = -(policy * tokens).sum() / n
    lr = log_ratio.detach()
    ratio = torch.exp(lr.clamp(-30, 30))
    clipped = ((adv > 0) & (ratio > 1 + a.eps_high)) | ((adv < 0) & (ratio < 1 - a.eps_low))  # verl's pg_clipfrac
    dual = (adv < 0) & (ratio.clamp(min=1 - a.eps_low) > a.clip_ratio_c)  # pg_clipfrac_lower
    return loss, {"loss/policy": loss.item(),
                  "stats/clip_ratio": (clipped.float() * tokens).sum().item() / n,
                  "stats/dual_clip_ratio": (dual.float() * tokens).sum().item() / n,
                  "stats/ppo_kl": ((torch.exp(-lr) + lr - 1) * tokens).sum().item() / n,
                  "stats/log_ratio": (lr * tokens).sum().item() / n,
                  "stats/correction": (correction.detach() * tokens).sum().item() / n,
                  "stats/path_weight_full": (torch.softmax(path_scores(logps.detach(), batch, cfg), dim=1)[:, 0]
                                             * tokens).sum().item() / n}
