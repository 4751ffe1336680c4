"""d-TreeRPO (arXiv:2512.09675; reference code `THU-BPM/d-TreeRPO` @3eb6f21, `dtreerpo/dtreerpo_trainer.py`).

Tree rollouts: the decoding steps are split into H levels; each prompt's root (the empty canvas) has
w_0 children that decode level 0's steps, each of them w_1 children that continue its canvas through
level 1, and so on (`rl.decoding.tree`, `dare.rollout.tree`); the prod(w) = G leaves are the group.
Every (parent -> child) transition is a training segment: the child's level tokens, scored in one
forward on the parent's canvas. A node's value is the mean of its children's (a leaf's: its reward),
and a child's advantage is its value against its siblings' (leave-one-out, as the code does it):

    V(leaf) = r,  V(node) = mean_children V,   A(c) = V(c) - mean_{c' sibling of c, c' != c} V(c')
    rho_k   = exp(log pi(o_k | parent) - log pi_old(o_k | parent))       k: the child's tokens up to its first EOS
    L_pg    = 1/S sum_segments 1/|seg| sum_k -min(rho_k A(c), clip(rho_k, 1 - eps, 1 + eps) A(c))
    L_kl    = 1/S sum_segments 1/|seg| sum_k (exp(ref_k - logp_k) - (ref_k - logp_k) - 1)
    L_sd    = mean over (parent, position j) of KL(q_j || pi(. | parent)),  q_j = sum_{c: A(c) > 0, c decoded j}
              softmax(A(c) / tau)_renormalized over those c * onehot(o_j^c)
    L       = L_pg + beta L_kl + lambda(t) L_sd,   lambda(t) = lambda_max (e^{gamma t} - 1) / (e^gamma - 1),
              tau(t) = max(tau_max (1 - t)^power, 1e-6),  t = the share of training done

S is the number of segments in the step. The self-distillation target q_j is built from the positive
siblings' tokens; pi(u | parent) for a sibling's token u is that sibling's own log-prob (the siblings
share the parent's canvas), so L_sd = -sum_j sum_c q_j(c) log pi(o_j^c | parent) + const, linear in the
per-token log-probs: the noise hook precomputes its weights over the whole batch and the loss never
needs two rows at once. The logged `loss/self_distill` is that cross-entropy (the KL without q's
constant entropy). Leaves share their ancestors' segments: each segment is counted once, on the
first leaf of the child's subtree.

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    tree rollout -> leaf rewards -> prepare: levels, tree advantages and the segment and
    self-distillation weights (no randomness) -> old/ref token_logps (one forward per level)
    -> mu x [token_logps -> loss -> optimizer step]
"""

import math
from dataclasses import replace

import torch

from dare.rollout.tree import level_bounds
from dare.train import noise
from dare.train.estimators import trajectory_logps
from dare.train.objectives import clipped_token_objective, k3

RECIPE = "rl"
SCORE = "token"  # what token_logps returns: (B, G) (dare.train.hooks.SCORES)


def check_config(cfg) -> None:
    widths = tuple(cfg.rl.decoding.tree)
    if not widths or math.prod(widths) != cfg.rl.group_size or min(widths) < 2:
        raise ValueError(f"rl.decoding.tree={list(widths)}: d-TreeRPO needs tree rollouts whose leaves are the group "
                         f"(product of the widths = rl.group_size = {cfg.rl.group_size}), every width >= 2 (a child's "
                         f"advantage is against its siblings)")


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G) -> (P, G) each leaf against its siblings (the last level's advantage; logged). The loss
    uses every level's (`tree_advantages`)."""
    return tree_advantages(rewards, tuple(cfg.rl.decoding.tree))[-1]


def tree_advantages(rewards: torch.Tensor, widths: tuple) -> list[torch.Tensor]:
    """(P, G) leaf rewards -> per level l, (P, G): the advantage of each leaf's level-l ancestor, its value
    (mean reward of its leaves) minus the mean value of its siblings."""
    P, G = rewards.shape
    out = []
    for level, w in enumerate(widths):
        below = math.prod(widths[level + 1:])  # leaves under a level-l node
        values = rewards.view(P, -1, w, below).mean(dim=-1)  # (P, parents, w)
        adv = values - (values.sum(dim=-1, keepdim=True) - values) / (w - 1)
        out.append(adv.reshape(P, -1).repeat_interleave(below, dim=1))
    return out


def schedule(progress: float, cfg) -> tuple[float, float]:
    """(lambda, tau) of the self-distillation at this point of training."""
    a = cfg.algo
    lam = a.sd_lambda_max * (math.exp(a.sd_gamma * progress) - 1) / (math.exp(a.sd_gamma) - 1)
    return lam, max(a.sd_tau_max * (1 - progress) ** a.sd_tau_power, 1e-6)


def prepare(batch, cfg):
    """No randomness: extras "levels" (B, P + G): each token's tree level, -1 on the prompt, NEVER where nothing
    was committed; "advantages", "pg_weight", "sd_weight": each token's advantage, policy and self-distillation
    weights (B, G)."""
    widths, P = tuple(batch.decoding.tree), batch.prompt_length
    n, (B, L) = math.prod(widths), batch.responses.shape
    bounds = torch.tensor(level_bounds(batch.decoding.steps, len(widths)), device=batch.step_map.device)
    level = torch.where(batch.step_map >= 0, torch.bucketize(batch.step_map, bounds, right=True), noise.NEVER)
    leaf = torch.arange(B, device=level.device)
    is_eos = batch.responses == batch.eos_token_id
    pos = torch.arange(L, device=level.device).expand(B, -1)
    adv_levels = [a.reshape(-1) for a in tree_advantages(batch.rewards.view(-1, n), widths)]
    segments = batch.num_sequences * sum(1 / math.prod(widths[l + 1:]) for l in range(len(widths)))
    _, tau = schedule(batch.progress, cfg)
    adv, pg_weight, sd_weight = (torch.zeros(B, L, device=level.device) for _ in range(3))
    pairs = 0
    for l in range(len(widths)):
        below, parent_size = math.prod(widths[l + 1:]), math.prod(widths[l:])
        first_eos = torch.where(is_eos & (level <= l), pos, L).min(dim=1, keepdim=True).values
        active = (level == l) & (pos <= first_eos)  # the child's tokens up to its first EOS
        rep = (leaf % below == 0)[:, None]  # the segment counted on the first leaf of the child's subtree
        a = adv_levels[l][:, None]
        adv = torch.where(level == l, a, adv)
        pg_weight += (rep & active) / active.sum(dim=1, keepdim=True).clamp(min=1) / segments
        # self-distillation: per (parent, position), softmax(A / tau) over the positive children decoding it
        group = leaf // parent_size
        positive = rep[:, 0] & (a[:, 0] > 0)
        top = torch.full((int(group.max()) + 1,), -torch.inf, device=a.device).scatter_reduce(
            0, group, torch.where(positive, a[:, 0], -torch.inf), "amax")  # each group's largest, for stability
        e = torch.where(positive, torch.exp((a[:, 0] - top[group]) / tau), 0.0)
        mass = e[:, None] * active
        denom = torch.zeros(len(top), L, device=a.device).index_add_(0, group, mass)
        sd_weight += mass / denom[group].clamp(min=1e-30)
        pairs += int((denom > 0).sum())
    sd_weight = sd_weight / max(pairs * batch.num_sequences / B, 1)  # the step's pairs (this process's share, scaled)
    return replace(batch, extras={"levels": level_pad(level, P), "advantages": adv, "pg_weight": pg_weight,
                                  "sd_weight": sd_weight})


def level_pad(level: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """(B, G) levels -> (B, P + G) rounds for `trajectory_logps`, -1 on the prompt."""
    return torch.cat([torch.full((level.shape[0], prompt_length), -1, device=level.device), level], dim=1)


def uses_reference(cfg) -> bool:
    return cfg.algo.beta > 0


def token_logps(model, batch, draw, cfg) -> torch.Tensor:
    """(B, G) log pi(o_k | the parent's canvas) for each token, its parent the node before its level
    (one forward per level: every token of that level and later masked)."""
    return trajectory_logps(model, batch, batch.extras["levels"])


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    adv, pg_weight, sd_weight = (batch.extras[k] for k in ("advantages", "pg_weight", "sd_weight"))
    eps, beta = cfg.algo.epsilon, cfg.algo.beta
    lam, _ = schedule(batch.progress, cfg)
    on = pg_weight > 0
    ratio = torch.exp(torch.where(on, logps - old_logps, 0.0))
    surrogate, clipped = clipped_token_objective(ratio, adv, eps, eps)
    policy = -(surrogate * pg_weight).sum()
    kl = torch.zeros((), device=logps.device)
    if ref_logps is not None:
        delta = torch.where(on, ref_logps - logps, 0.0)
        kl = (k3(delta) * pg_weight).sum()
    distill = -(sd_weight * logps).sum()
    loss = policy + beta * kl + lam * distill
    return loss, {"loss/policy": policy.item(), "loss/kl": kl.item(), "loss/self_distill": distill.item(),
                  "stats/clip_ratio": ((ratio != clipped) * pg_weight).sum().item()}  # segment-averaged
