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
    C_k   = min(rho_k A_i, clip(rho_k, 1 - eps, 1 + eps) A_i)

Block-causal models (rl_sdar.py), the targets k: the completion up to its first EOS:
    L = 1/B sum_i 1/L1 sum_k [ -C_k + beta KL_k ]
L1 = `gen_length` (rl_sdar.py divides by the rollout's longest response). Groups whose accuracy
is above `filter_high` or below `filter_low` (rl_reward.py: 0.8, 0.2) get zero advantages.

Masked models (rl_llada.py, rl_dream.py): a trace row j is one trace step of one completion of a kept
group; its targets T_j are that step's tokens except EOS (the padding token, `post_num: 0`), every
other token of the completion after it too; a row without a target is no row. With N the step's rows:
    L = 1/N sum_j [ -1/|T_j| sum_{k in T_j} C_k + beta sum_{k in T_j} KL_k ]
(`algo.micro_batch_rows` = b, the reference's weighting: 1/N becomes 1/(M |m_j|), m_j row j's micro-batch of b rows.)

With the diffusion value model (`algo.value_model`, configs/rl_sdar_with_value.yaml;
train_sdar_value.py), V_k is a value head on the hidden state that predicts o_k at o_k's own trace
step (the policy's input for that token), and the advantage is per token, from step-level GAE over
the trace steps 1..S of the completion in decoding order (blocks in order, trace steps within):

    r_k  = A_i on the tokens of the last trace step S, 0 elsewhere  (A_i: the group z-score above)
    r*_s = mean of r_k over step s's tokens       V*_s = mean of V_k over step s's tokens
    R*_s = r*_s + gamma R*_{s+1}                  A*_s = r*_s - V*_s + gamma V*_{s+1} + gamma lam A*_{s+1}
    R_k  = r_k + gamma R*_{s(k)+1}                A_k  = r_k - V_k + gamma V*_{s(k)+1} + gamma lam A*_{s(k)+1}
                                                  (gamma = lam = 1: R_k = A_i, A_k = A_i - V_k)
    L_V  = 1/B sum_i 1/L1 sum_k 1/2 max((V_k - R_k)^2, (V_old,k + clip(V_k - V_old,k, +-c) - R_k)^2)

and A_k replaces A_i in L. The value model is updated first, on advantages from its values before
the update; both on the kept groups only.

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout (step map) -> rewards -> advantages(rewards, cfg) -> prepare: the trace rounds, targets, kept groups
    -> [value model: token_values (old values) -> prepare: token advantages, returns -> mu x value_loss]
    -> old token_logps (one forward per round) -> mu x [token_logps -> loss -> optimizer step]

Deviations (README.md): one optimizer step per rollout batch (the value model: mu); on block models
rows of filtered groups stay in the batch with zero advantage; the trainer's blocks are the rollout's
(rl_sdar.py aligns them at the padded prompt end); left padding is hidden from attention (rl_llada.py
attends it); the log-ratio is clamped to +-10 on every family; masked models weight every trace row the same
(the reference's micro-batch means weigh a partial last micro-batch's rows more: `algo.micro_batch_rows`).
"""

from dataclasses import replace

import torch

from dare.models import facts
from dare.rollout.core import sharded
from dare.train import noise
from dare.train.critic import diffusion_values
from dare.train.estimators import check_replayable, per_round, trajectory_logps
from dare.train.objectives import clipped_token_objective, group_advantages

RECIPE = "rl"
SCORE = "token"  # what token_logps returns: (B, G) (dare.train.hooks.SCORES)


def check_config(cfg) -> None:
    check_replayable(cfg.rl.decoding, "TraceRL")


def kept(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, 1) bool: groups whose accuracy, the mean reward, lies in [filter_low, filter_high] (the loop's
    `batch.kept_groups`: a step that keeps none makes no update, as the reference then trains on nothing). With binary
    rewards this is the share correct; with partial credit (Sudoku) the share > 0 would be about 1 and drop all."""
    accuracy = rewards.float().mean(dim=1, keepdim=True)
    return (accuracy >= cfg.algo.filter_low) & (accuracy <= cfg.algo.filter_high)


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G): the group z-score (population std), 0 for a group whose rewards are all equal and for the groups
    `kept` drops. A uniform group is found by comparing its rewards, not by its std: with rewards such as 1/3 or 2/7
    the float rounding of the group's mean leaves an ulp, which a z-score turns into +-1 (or, where the std rounds to
    0, +-inf)."""
    adv = group_advantages(rewards, baseline="mean", std="population", eps=0.0)
    uniform = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)
    return torch.where(kept(rewards, cfg) & ~uniform, adv, 0.0)


def value_model(cfg):
    """The diffusion value model's settings when `algo.value_model` is on (`dare.train.critic`)."""
    return {"lr": cfg.algo.value_lr, "path": cfg.algo.value_model_path} if cfg.algo.value_model else None


def uses_reference(cfg) -> bool:
    return False  # the KL is taken against pi_old


def prepare(batch, cfg):
    """The trace (nothing is drawn): extras "rounds", each position's trace round (B, P + G; -1 on the prompt,
    `noise.NEVER` where no step committed: masked in every round), "targets" (B, G) the tokens the loss scores
    (`targets`), "kept" (B,) the rows of kept groups; and `kept_groups`. With a value model the loop adds
    `value_targets` once its values are in `batch.old_values`."""
    rounds, groups = noise.rollout_rounds(batch, cfg.algo.shrink), kept(batch.rewards.view(-1, batch.group_size), cfg)
    on = targets(batch, rounds, cfg)
    extras = {"rounds": rounds, "targets": on, "kept": groups.expand(-1, batch.group_size).reshape(-1)}
    if cfg.algo.micro_batch_rows:
        extras["micro_rows"] = micro_batch_sizes(batch, rounds, on, cfg)
    return replace(batch, kept_groups=groups, extras=extras)


def targets(batch, rounds: torch.Tensor, cfg) -> torch.Tensor:
    """(B, G) bool, the committed tokens the loss scores. Block models (rl_sdar.py): the completion up to and
    including its first EOS. Masked models (rl_llada.py, rl_dream.py, `post_num: 0`): every token but the
    padding token (EOS in both released models), after the first EOS too, of the groups `kept` keeps
    (the reference drops the others before training). `batch` holds whole groups (a process's rows)."""
    committed = rounds[:, batch.prompt_length:] < noise.NEVER
    if batch.block_size is not None:
        return batch.response_mask & committed
    rows = kept(batch.rewards.view(-1, batch.group_size), cfg).expand(-1, batch.group_size).reshape(-1, 1)
    return committed & (batch.responses != batch.eos_token_id) & rows


def trace_rows(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked models' trace rows: ((B, G) the number of targets of each target's row, 1 elsewhere;
    (B,) the number of rows of each completion), a row being a (completion, trace round) with targets."""
    rounds, on = batch.extras["rounds"], batch.extras["targets"]
    per_token, rows = noise.transition_sizes(rounds[:, -on.shape[1]:], on)
    return per_token, rows[:, 0]


def micro_batch_sizes(batch, rounds: torch.Tensor, on: torch.Tensor, cfg) -> torch.Tensor:
    """(B, G) each target's trace-row micro-batch size, 1 elsewhere: rows in the reference's order (completions in turn,
    rounds ascending) cut into b = `algo.micro_batch_rows` rows (the last: the rest), per process and mini-batch."""
    if batch.block_size is not None:
        raise ValueError("algo.micro_batch_rows weights the trace rows of masked models; leave it 0 on block models")
    b, B, k = cfg.algo.micro_batch_rows, on.shape[0], cfg.rl.mini_batches
    r = torch.where(on, rounds[:, -on.shape[1]:], 0)
    present = torch.zeros(B, int(r.max()) + 1, dtype=torch.long, device=r.device).scatter_add_(1, r, on.long()) > 0
    rank, per = present.long().cumsum(1).gather(1, r) - 1, present.sum(1)  # a row's rank in its completion; rows
    mini, before = torch.arange(B, device=r.device) // (B // k), per.cumsum(0) - per  # rows before each completion
    index = (before - before[mini * (B // k)])[:, None] + rank  # each target's row in its mini-batch
    total = torch.zeros(k, dtype=per.dtype, device=r.device).index_add_(0, mini, per)[mini, None]
    last = total // b * b  # where the partial last micro-batch starts
    return torch.where(on & (index >= last), total - last, torch.where(on, b, 1)).float()


def loss_units(batch, z, cfg) -> float:
    """Masked models: this process's trace rows, or (`algo.micro_batch_rows`) its micro-batches; block models: 0."""
    if batch.block_size is not None:
        return 0.0
    (per_token, rows), micro = trace_rows(batch), batch.extras.get("micro_rows")
    return float(rows.sum() if micro is None else round((batch.extras["targets"] / (per_token * micro)).sum().item()))


def token_logps(model, batch, z, cfg) -> torch.Tensor:
    """(B, G) log pi(o_k | the trajectory state before o_k's trace step) at the targets, 0 elsewhere."""
    return trajectory_logps(model, batch, batch.extras["rounds"], targets=batch.extras["targets"])


def token_values(value_model, batch, z, cfg) -> torch.Tensor:
    """(B, G) V(o_k | the same state): the value head where the policy scores o_k."""
    mask_id = facts(value_model).mask_token_id
    return per_round(lambda where, masked: diffusion_values(
        value_model, torch.where(masked, mask_id, batch.sequences), batch.sequences, where, batch.attention_mask),
        batch, batch.extras["rounds"], targets=batch.extras["targets"], collective=sharded(value_model))


def trace_steps(batch) -> torch.Tensor:
    """(B, G) each target's trace step over the whole completion, in decoding order (blocks in
    order, rounds within a block), ranked 0..S-1 per row; -1 elsewhere."""
    r, on = batch.extras["rounds"][:, batch.prompt_length:], batch.extras["targets"]
    segment = noise.rollout_segments(batch)
    key = torch.where(on, segment * (int(r[on].max()) + 1 if on.any() else 1) + r, -1)
    steps = torch.full_like(key, -1)
    for i in range(key.shape[0]):
        steps[i, on[i]] = torch.unique(key[i][on[i]], return_inverse=True)[1]
    return steps


def value_targets(batch, cfg):
    """{"token_advantages", "returns", "value_mask"}, all (B, G), from the values before the update
    (`batch.old_values`): step-level GAE over the trace steps (module docstring; train_sdar_value.py
    `compute_returns_and_advantages_from_fragments`), 0 outside the loss and on the rows of dropped groups;
    the mask: the kept groups' targets. The value model's hook: once per step, on the whole batch, after `prepare`."""
    gamma, lam, values = cfg.algo.gamma, cfg.algo.lam, batch.old_values
    steps = trace_steps(batch)
    kept = batch.extras["kept"]
    adv, ret = torch.zeros_like(values), torch.zeros_like(values)
    for i in range(values.shape[0]):
        on = steps[i] >= 0
        if not kept[i] or not on.any():
            continue
        s, v = steps[i][on], values[i][on]
        S = int(s.max()) + 1
        r = torch.where(s == S - 1, batch.advantages[i], 0.0)  # the sequence's reward on its last trace step
        count = torch.zeros(S, device=v.device).index_add_(0, s, torch.ones_like(v))
        r_star = torch.zeros(S, device=v.device).index_add_(0, s, r) / count
        v_star = torch.zeros(S, device=v.device).index_add_(0, s, v) / count
        v_star = torch.cat([v_star, v_star.new_zeros(1)])  # V*_{S+1} = 0, as are R* and A* past the end
        R_star, A_star = torch.zeros(S + 1, device=v.device), torch.zeros(S + 1, device=v.device)
        for t in range(S - 1, -1, -1):
            R_star[t] = r_star[t] + gamma * R_star[t + 1]
            A_star[t] = r_star[t] - v_star[t] + gamma * v_star[t + 1] + gamma * lam * A_star[t + 1]
        ret[i, on] = r + gamma * R_star[s + 1]
        adv[i, on] = r - v + gamma * v_star[s + 1] + gamma * lam * A_star[s + 1]
    return {"token_advantages": adv, "returns": ret, "value_mask": batch.extras["targets"] & kept[:, None]}


def value_loss(values, batch, z, cfg):
    """TraceRL's clipped value loss on the kept groups' loss tokens, normalized like the policy's."""
    c, old, target = cfg.algo.value_clip, batch.old_values, batch.extras["returns"]
    mask = batch.extras["value_mask"].float()
    clipped = old + (values - old).clamp(-c, c)
    per_token = 0.5 * torch.maximum((values - target) ** 2, (clipped - target) ** 2)
    norm = batch.responses.shape[1] * max(batch.num_sequences, 1)
    n = max(batch.num_tokens, 1.0)
    return (per_token * mask).sum() / norm, {
        "mean": (values.detach() * mask).sum().item() / n,
        "clip_ratio": ((((values - old).abs() > c).float()) * mask).sum().item() / n}


def loss(logps, old_logps, ref_logps, batch, z, cfg):
    eps, beta = cfg.algo.epsilon, cfg.algo.beta
    mask = batch.extras["targets"].float()
    adv = batch.extras.get("token_advantages", batch.advantages[:, None])
    log_ratio = (logps - old_logps).clamp(-10.0, 10.0)
    ratio = torch.exp(log_ratio)
    policy, clipped = clipped_token_objective(ratio, adv, eps, eps)
    kl = torch.exp(-log_ratio) - 1 + log_ratio  # k3 of pi_old against pi_theta
    bites = ((ratio - clipped).abs() > 0).float()
    if batch.block_size is None:  # rl_llada.py: each trace row's policy term over its targets, the KL summed
        row_targets, _ = trace_rows(batch)
        w = 1 / batch.extras.get("micro_rows", 1.0)  # algo.micro_batch_rows: a row's share of its micro-batch
        policy, kl, share = policy * w / row_targets, kl * w, bites * w / row_targets
        norm = clip_norm = max(batch.num_units, 1.0)  # means over the step's trace rows (or micro-batches)
    else:
        norm = batch.responses.shape[1] * max(batch.num_sequences, 1)  # L1 per response, mean over responses
        share, clip_norm = bites, max(batch.num_tokens, 1.0)
    loss = ((-policy + beta * kl) * mask).sum() / norm
    return loss, {"loss/policy": (-(policy * mask).sum() / norm).item(), "loss/kl": ((kl * mask).sum() / norm).item(),
                  "stats/clip_ratio": (share * mask).sum().item() / clip_norm}
