"""Validation during RL (`rl.eval_every` steps, `rl.eval_every_forwards` forwards): when a step validates
(`validation_due`), which rows (`validation_rows`: the same number on every rank), and the embedded evaluator's
metrics on them (`validate`, greedy with the rollout's lengths; collective under FSDP), logged as `val/<metric>`."""

from __future__ import annotations

import torch

from dare.data import load_split
from dare.models import encode_chat, facts
from dare.rollout import decode_responses, generate, left_pad
from dare.rollout.dynamic import marker_id
from dare.train.dist import gathered
from dare.utils import UserError


def validation_due(rl, done: int, total: int, before: float, after: float) -> bool:
    """Whether the step that ends with `done` steps of `total` validates: every `rl.eval_every` steps, at each
    multiple of `rl.eval_every_forwards` that the run's forwards passed during the step (from `before` to
    `after`), and after the last step when either schedule is on."""
    every, budget = rl.eval_every, rl.eval_every_forwards
    return ((every > 0 and (done % every == 0 or done == total))
            or (budget > 0 and (after // budget > before // budget or done == total)))


def validation_rows(cfg, task, world: int) -> list[dict]:
    """The first `rl.eval_samples` rows of `rl.eval_split` (a multiple of the process count, so
    every rank decodes the same number: generation under FSDP is collective)."""
    if cfg.rl.eval_split not in task.splits:
        raise UserError(f"rl.eval_split={cfg.rl.eval_split!r}: task {task.name!r} has splits {task.splits}")
    rows = load_split(task.name, cfg.rl.eval_split)[:cfg.rl.eval_samples]
    rows = rows[:len(rows) - len(rows) % world]
    if not rows:
        raise UserError(f"rl.eval_samples={cfg.rl.eval_samples}: fewer validation rows than the {world} processes")
    return rows


def validate(policy, trainer, tokenizer, task, rows: list[dict], decoding, generator, gather: bool = True) -> dict:
    """The embedded evaluator's metrics on this rank's share of the validation rows, averaged over
    all ranks (collective): {"val/<metric>": mean}. `gather`: the sharded policy gathered once for the
    rollout (`dist.gathered`, `rl.gather_rollout`)."""
    dist, f = trainer.dist, facts(policy)
    mine = rows[dist.shard(len(rows))]
    ids, mask = left_pad(encode_chat(tokenizer, [r["prompt"] for r in mine]), f.pad_token_id)
    policy.eval()
    with torch.no_grad(), trainer.autocast(), gathered(policy, gather):
        out = generate(policy, ids.to(dist.device), mask.to(dist.device), decoding, generator,
                       marker_id(tokenizer, decoding))
    sums: dict[str, float] = {"count": float(len(mine))}
    for scores in task.scores(decode_responses(tokenizer, out.responses, f.stop_ids), mine):
        for k, v in scores.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    totals = dist.sum(sums)
    return {f"val/{k}": v / totals["count"] for k, v in totals.items() if k != "count"}
