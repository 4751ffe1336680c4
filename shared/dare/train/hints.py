"""Hinted rollouts: a second rollout of some of the step's prompts with tokens given to the sampler (inpainting,
`dare.rollout.generate(fixed=)`), whose completions may replace the first rollout's (IGPO: when every completion
of a group fails, chunks of the reference solution are given as hints).

The algorithm decides both halves (`dare.train.hooks`): `hints(rewards, references, gen_length, generator, cfg)`
gives the tokens, from the first rollout's (P, G) rewards and each prompt's reference solution (the task's
`target`, as token ids); the rows with a given token are decoded again, the others are not; `hinted(rewards,
hinted_rewards, generator, cfg)` says which hinted row replaces each row. The merged rollout records where tokens
were given (`RolloutOutput.given`), and its forwards count as rollout forwards (the equal-compute ranking charges
them). Under FSDP the second rollout is collective: it runs on every process when any asks for it, a process with
no hinted row decoding one stand-in row that it drops.

Cost: one more rollout of the hinted rows, on the steps that ask for one (host work: the references of the step's
prompts are tokenized, and each hinted row's layout is built by the algorithm, a few chunks a row)."""

from __future__ import annotations

from dataclasses import replace

import torch

from dare.rollout import generate
from dare.train.batches import put, take
from dare.train.dist import gathered
from dare.utils import make_generator


def hinted_rollout(r, out, rewards: torch.Tensor, prompts: tuple, rows_of: list, score, step: int):
    """The step's rollout and rewards (B,) after the algorithm's hinted rollout (`r`: the run, `dare.train.rl.RLRun`;
    `prompts`: the rollout's (ids, mask); `rows_of`: each row's data row; `score(completions, rows)`: the task's
    rewards of completions of some rows); as they were when the algorithm gives no hints."""
    cfg, dist, G = r.cfg, r.dist, r.cfg.rl.group_size
    if not r.hooks.gives_hints:
        return out, rewards
    if out.given is None:  # every step of an algorithm that gives hints says where tokens were given (none: all False)
        out = replace(out, given=torch.zeros_like(out.response_mask, dtype=torch.bool))
    generator = make_generator(cfg.run.seed, f"hints/{step}/{dist.rank}")
    targets = [r.task.target(row) for row in rows_of[::G]]
    references = r.tokenizer(targets, add_special_tokens=False)["input_ids"]
    B, L = out.responses.shape
    fixed = r.hooks.hints(rewards.view(-1, G), references, L, generator, cfg)
    if fixed is not None and tuple(fixed.shape) != (B, L):
        raise ValueError(f"hints returned shape {tuple(fixed.shape)}; the rollout is ({B}, {L}): one row a completion, "
                         "one column a generated position (-1 where decoded)")
    wanted = fixed is not None and bool((fixed >= 0).any())
    if not dist.any(wanted):
        return out, rewards
    ids, mask = prompts
    rows = (fixed >= 0).any(dim=1).nonzero()[:, 0].cpu() if wanted else torch.zeros(1, dtype=torch.long)
    given = fixed[rows] if wanted else torch.full((1, L), -1, dtype=torch.long)
    policy = r.trainer.model
    with r.trainer.autocast(), r.counter.phase("rollout"), gathered(policy, cfg.rl.gather_rollout):
        second = generate(policy, ids[rows].to(dist.device), mask[rows].to(dist.device), r.rollout_cfg, generator,
                          r.marker, fixed=given)
    if not wanted:
        return out, rewards
    hinted_rewards = torch.full_like(rewards, torch.nan)
    hinted_rewards[rows.to(rewards.device)] = score(second.responses, rows.tolist())
    source = r.hooks.hinted(rewards.view(-1, G), hinted_rewards.view(-1, G), generator, cfg).reshape(-1).cpu()
    dest = (source >= 0).nonzero()[:, 0]
    at = torch.full((B,), -1, dtype=torch.long)
    at[rows] = torch.arange(len(rows))
    picked = at[source[dest]]
    if (picked < 0).any():
        raise ValueError("hinted returned a row that was not decoded again (its hinted reward is NaN)")
    merged = put(out, dest.to(out.sequences.device), take(second, picked.to(out.sequences.device), len(rows)), B)
    rewards = rewards.clone()
    rewards[dest.to(rewards.device)] = hinted_rewards[source[dest].to(rewards.device)]
    return replace(merged, nfe=out.nfe + second.nfe), rewards
