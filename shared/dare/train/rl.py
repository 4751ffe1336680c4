"""The RL recipe (GRPO family). One step:

    prompts -> rollout (G completions each, `dare.rollout`) -> rewards (the task's reward)
      -> advantages                                   advantages(rewards (P, G), cfg)
      -> what the algorithm derives from the rollout  prepare(batch, cfg)
      -> mu noise draws                               sample_noise(batch, generator, cfg)
      -> old and reference log-probs on those draws   token_logps(model, batch, noise, cfg)
      -> mu policy updates                            loss(logps, old, ref, batch, noise, cfg)

With a value model (the algorithm's `value_model(cfg)` hook returns its settings; `dare.train.critic`),
after the noise draws: the values before the update on the first draw (token_values, on the whole batch,
into `batch.old_values`; then `prepare` once more, deriving the token advantages and returns from them),
then mu value-model updates (value_loss), then the policy's as above: the order of TraceRL's
`rl.py` (value step, then policy step, both on the advantages of the values before the update).

Block-causal models (SDAR, LLaDA2.x) run the same loop: the block sampler rolls out with the model's
block size and a canvas that ends at `gen_length` (`whole_last_block=False`), and the estimators
score each block given the clean blocks before it through the `[x_t ; x_0]` layout
(`dare.train.estimators.diffusion_logps`), blocks counted from each row's first prompt token as
the sampler counts them; `batch.block_size` lets a noise sampler draw per block.

The loop knows nothing about any particular algorithm: what noise an estimator needs, how
log-probs are estimated and what the loss is all come from the baseline's `algorithm.py`, read
into `RLHooks` (the contract and the optional hooks' defaults: `dare.train.hooks`).
An algorithm that filters groups (`batch.kept_groups`, set in `prepare`: TraceRL's accuracy filter) still
sees the whole batch in its hooks; a step where it keeps none makes no update at all (no forward for the old
log-probs, no optimizer step: Adam's moments would otherwise move the weights on a zero gradient), and every
step logs the share kept (`rollout/kept_groups`). An algorithm that rewards intermediate states (MDPO)
scores the sampler's predictions after every step with `batch.score` (the task's reward of any completions
of the batch's prompts) in its `prepare`. The same noise draw is used for the policy, old and reference
log-probs of an update, so their ratio compares like with like; an algorithm that draws no noise (no
`sample_noise`: trajectory replays, tree levels) gets one empty draw, scored once, for its mu updates.
Validation decodes each prompt once (greedy, no tree). With one update per batch (mu = 1) the old log-probs equal the current ones by
construction, so they are not recomputed: `old = logps.detach()` (ratio = 1).

Processes: each takes `prompts_per_step / world` prompts (whole groups), rolls out, scores
and computes its advantages locally; log-prob passes and updates run in micro-batches of
`train.micro_batch_size` rows. Losses and metrics are normalized by the step's totals over all
processes (`batch.num_tokens`, `batch.num_sequences`), so they add up over micro-batches and
processes and the gradient does not depend on how the batch is split.

Validation (`rl.eval_every` steps, `rl.eval_every_forwards` forwards: `validation_due`): the embedded
evaluator's metrics on held-out prompts, greedy with the rollout's lengths, every rank decoding its share (collective under FSDP), logged as
`val/<metric>`; after the last step of a float32 run it equals `dare eval` of the exported
checkpoint (with bf16 the validation decodes under autocast, `dare eval` in its own dtype).

Memory: on CUDA each phase (rollout, log-probs, update) starts with `torch.cuda.reset_peak_memory_stats` and logs
the allocator's peak in it, `memory/<phase>_peak_gib` (`PhasePeaks`: host-side allocator queries, no device sync;
this process's device; nothing on other devices).

Randomness: the rollout and noise generators of step s on rank r are derived from
(run seed, s, r), so a resumed run draws exactly what the uninterrupted run would have.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from dare.data import TASKS, load_split
from dare.models import encode_chat, facts
from dare.rollout import decode_responses, generate, left_pad
from dare.rollout.dynamic import marker_id
from dare.train.batches import backward_by_parts, micro_slices, take, updates
from dare.train.checkpoint import save_final
from dare.train.loop import Loop, build_model
from dare.train.dist import gathered, setup_dist
from dare.train.trainer import Trainer
from dare.train.validation import validate, validation_due, validation_rows
from dare.train.metrics import PhasePeaks, compute_metrics, step_metrics
from dare.train.diagnostics import estimator_noise, replay_agreement, step_diagnostics
from dare.train.estimators import Compute
from dare.train import diagnostics as diag
from dare.train.critic import build_critic
from dare.train.hooks import RLHooks, missing_value_hooks
from dare.train.noise import Draw
from dare.utils import UserError, make_generator

@dataclass(kw_only=True)
class RLBatch:
    """One step's rollout as the hooks see it (row-major: dim 0 is the completion, B = prompts x group size),
    built by keyword in `run`; `prepare` adds what an algorithm derives from it (`extras`, `kept_groups`)."""

    # --- the rollout (`dare.rollout.RolloutOutput`, row-major)
    sequences: torch.Tensor
    """(B, P + G) left-padded prompts and their sampled completions."""
    attention_mask: torch.Tensor
    """(B, P + G) 0 on prompt padding."""
    prompt_length: int
    response_mask: torch.Tensor
    """(B, G) bool: completion tokens up to and including the first EOS (the loss mask)."""
    step_map: torch.Tensor
    """(B, G) the decoding step that committed each completion token."""
    decoding: object = None
    """The `DecodingConfig` the rollout used (the run's `rl.decoding` with the algorithm's rollout options)."""
    trajectory: torch.Tensor | None = None
    """(B, steps, G) the completion after every decoding step, when the algorithm asks for it."""
    rollout_logps: torch.Tensor | None = None
    """(B, G) each token's log-probability under the distribution the sampler drew it from (block sampler)."""
    rollout_entropies: torch.Tensor | None = None
    """(B, G) the entropy of that distribution (the truncated sampler; AGRPO's importance sampling)."""
    supports: torch.Tensor | None = None
    """(B, G, V) bool: the top-k/top-p support each token was drawn from (the truncated sampler)."""
    commit_logps: torch.Tensor | None = None
    """(B, G) each committed token's log-prob under the untempered distribution at its commit step."""
    predictions: torch.Tensor | None = None
    """(B, S, G) the sampler's full prediction x0-hat after each of its S steps (maskgit)."""
    confidences: torch.Tensor | None = None
    """(B, S, G) the sampler's confidences at each step, beside them."""
    # --- the model's facts (`dare.models.facts`)
    block_size: int | None = None
    """The model's block (block-causal models), counted from each row's first prompt token as the sampler counts
    it (`dare.train.noise.blocks`); None for bidirectional models."""
    segments: torch.Tensor | None = None
    """(B, G) long: each completion position's block as the rollout decoded it (dynamic blocks,
    `decoding.block.dynamic`: each row's own layout, 0 = the first); None: the model's fixed blocks.
    `dare.train.noise.rollout_segments` returns it, so the block estimators' draws follow each row's layout."""
    mask_token_id: int | None = None
    eos_token_id: int | None = None
    # --- rewards and advantages
    rewards: torch.Tensor | None = None
    """(B,)"""
    advantages: torch.Tensor | None = None
    """(B,)"""
    group_size: int = 1
    score: Callable[[torch.Tensor], torch.Tensor] | None = None
    """The task's rewards (B,) of any (B, G) completions of these prompts (MDPO scores intermediate states)."""
    # --- the step's totals over all processes, its compute options and its place in the run
    num_tokens: float = 0.0
    """Loss tokens (response_mask) in the whole step: the token-level normalizer."""
    num_sequences: int = 0
    """Completions in the whole step."""
    num_active: int = 0
    """Completions with a nonzero advantage in the whole step (JustGRPO's normalizer)."""
    num_units: float = 0.0
    """The algorithm's own loss units in the whole step (`loss_units`: TraceRL's trace rows on masked models)."""
    compute: Compute = Compute()
    progress: float = 0.0
    """The share of the run's steps done before this one (step / train.steps), for schedules inside a loss."""
    # --- what the algorithm derives (`prepare`) and the value model's values
    extras: dict = field(default_factory=dict)
    """What `prepare` derives from the rollout (row-major tensors are sliced with the batch)."""
    kept_groups: torch.Tensor | None = None
    """(P, 1) bool, from `prepare`: the groups trained on; None: all of them."""
    old_values: torch.Tensor | None = None
    """(B, G) the value model's values before this step's update; None without one."""

    @property
    def responses(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_length:]


def per_micro(fn, batch: RLBatch, noise, size: int) -> list:
    """fn(micro_batch, micro_noise) for each micro-batch of `batch`."""
    n = batch.sequences.shape[0]
    return [fn(take(batch, rows, n), take(noise, rows, n)) for rows in micro_slices(n, size)]


def run(cfg, hooks: RLHooks, run_dir, label: str = "rl") -> dict:
    if not cfg.model.path:
        raise UserError("RL starts from a trained checkpoint: set model.path=<folder>")
    dist = setup_dist(cfg.train.sequence_parallel)
    n_prompts, G, mu = cfg.rl.prompts_per_step, cfg.rl.group_size, cfg.rl.num_iterations
    if n_prompts % dist.world:
        raise UserError(f"rl.prompts_per_step={n_prompts} must be divisible by the {dist.world} processes")
    if (n_prompts // dist.world) % cfg.rl.mini_batches:
        raise UserError(f"rl.mini_batches={cfg.rl.mini_batches} must divide the {n_prompts // dist.world} prompts each "
                        f"of the {dist.world} processes rolls out per step (whole groups per mini-batch)")
    task = TASKS[cfg.data.task]
    critic_spec = hooks.value_model(cfg)  # checked before any model is built
    if critic_spec is not None and missing_value_hooks(hooks):
        raise UserError(f"the algorithm asks for a value model but does not define {missing_value_hooks(hooks)}")
    rows = load_split(cfg.data.task, cfg.data.split)
    val_rows = validation_rows(cfg, task, dist.world) if cfg.rl.eval_every or cfg.rl.eval_every_forwards else None
    model, tokenizer, model_name, init = build_model(cfg.model, task, cfg.run.seed)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    f = facts(model)
    prompts = encode_chat(tokenizer, [r["prompt"] for r in rows])
    rollout_cfg = replace(cfg.rl.decoding, **hooks.rollout_options(cfg))
    if f.block_size is not None:  # the sampler's canvas ends where the trainer's batch does
        rollout_cfg = replace(rollout_cfg, whole_last_block=False)
    marker = marker_id(tokenizer, rollout_cfg)  # the token that ends a dynamic block (None: fixed blocks)
    compute = Compute(cfg.train.packing, cfg.train.logit_chunk)
    micro = cfg.train.micro_batch_size

    use_ref = hooks.uses_reference(cfg)
    optimizer_steps = cfg.train.steps * mu * cfg.rl.mini_batches  # per batch: mu draws x the mini-batches
    trainer = Trainer(model, cfg.model, cfg.train, dist, optimizer_steps, reference=use_ref, seed=cfg.run.seed)
    uses_old = hooks.uses_old_logps(cfg)  # objectives without a ratio skip them
    policy = trainer.model
    critic = build_critic(cfg, task, dist, critic_spec, optimizer_steps) if critic_spec is not None else None

    counter = diag.ForwardCounter([trainer.base, trainer.ref, critic.base if critic else None])
    guard = diag.CollapseGuard(cfg.rl.collapse_metric, cfg.rl.collapse_window, cfg.rl.collapse_below,
                               cfg.rl.collapse_drop)
    no_diversity = 0
    peaks = PhasePeaks(dist.device)
    with Loop(cfg, run_dir, label, trainer, len(rows), companions={"value": critic} if critic else None) as loop:
        for step in loop.steps():
            rollout_gen = make_generator(cfg.run.seed, f"rollout/{step}/{dist.rank}")
            noise_gen = make_generator(cfg.run.seed, f"noise/{step}/{dist.rank}")
            # --- rollout: G completions per prompt, sampled by the current policy
            peaks.take()  # a step rolled back leaves nothing behind
            peaks.start()
            tic = time.perf_counter()
            mine = loop.sampler.next(n_prompts)[dist.shard(n_prompts)]
            row_of = [i for i in mine for _ in range(G)]  # each prompt G times, grouped
            ids, mask = left_pad([prompts[i] for i in row_of], f.pad_token_id)
            policy.eval()
            counter.take()  # what ran between steps (checkpoints, a rollback) is not this step's
            with trainer.autocast(), counter.phase("rollout"), gathered(policy, cfg.rl.gather_rollout):
                out = generate(policy, ids.to(dist.device), mask.to(dist.device), rollout_cfg, rollout_gen, marker)
            texts = decode_responses(tokenizer, out.responses, f.stop_ids)
            rewards = torch.tensor(task.rewards(texts, [rows[i] for i in row_of], style=cfg.data.reward),
                                   dtype=torch.float32, device=out.sequences.device)
            if out.block_reward is not None and rollout_cfg.block.dynamic_reward:  # b1's block-entropy reward
                rewards = rewards + rollout_cfg.block.dynamic_reward * out.block_reward.to(rewards.device)
            advantages = hooks.advantages(rewards.view(-1, G), cfg).reshape(-1)
            totals = dist.sum({"tokens": float(out.response_mask.sum()), "rows": float(len(row_of)),
                               "active": float((advantages != 0).sum())})
            rows_of = [rows[i] for i in row_of]

            def score(completions: torch.Tensor) -> torch.Tensor:  # any completions of these prompts
                return torch.tensor(task.rewards(decode_responses(tokenizer, completions, f.stop_ids), rows_of,
                                                 style=cfg.data.reward), dtype=torch.float32, device=completions.device)

            batch = RLBatch(
                sequences=out.sequences, attention_mask=out.attention_mask, prompt_length=out.prompt_length,
                response_mask=out.response_mask, step_map=out.step_map, decoding=rollout_cfg, segments=out.segments,
                trajectory=None if out.trajectory is None else out.trajectory.transpose(0, 1),
                rollout_logps=out.logps, rollout_entropies=out.entropies, supports=out.supports,
                commit_logps=out.commit_logps,
                predictions=None if out.predictions is None else out.predictions.transpose(0, 1),
                confidences=None if out.confidences is None else out.confidences.transpose(0, 1),
                block_size=f.block_size, mask_token_id=f.mask_token_id, eos_token_id=f.eos_token_id,
                rewards=rewards, advantages=advantages, group_size=G, score=score,
                num_tokens=totals["tokens"], num_sequences=int(totals["rows"]), num_active=int(totals["active"]),
                compute=compute, progress=step / cfg.train.steps)
            batch = hooks.prepare(batch, cfg)
            t_rollout = time.perf_counter() - tic
            peaks.end("rollout")

            # --- diagnostics on the policy that sampled (before any update); they leave every generator as it was
            with counter.phase("diag"):
                checks = dist.sum(diag.diversity_sums(out.responses, out.response_mask, G, f.stop_ids))
                checks.update(dist.sum(diag.nonfinite_sums(rewards, out.commit_logps)))
                if cfg.rl.agreement_rows and out.commit_logps is not None and loop.due(step + 1):
                    checks.update(replay_agreement(policy, trainer, batch, cfg.rl.agreement_rows))
                if cfg.rl.diag_every and (step + 1) % cfg.rl.diag_every == 0:
                    checks.update(estimator_noise(policy, trainer, hooks, batch, cfg, step))

            keep = batch.kept_groups if batch.kept_groups is not None else rewards.new_ones(len(mine), 1, dtype=bool)
            kept = dist.sum({"groups": float(keep.sum())})["groups"]
            sums, t_value, t_logp, t_update = {"rollout/kept_groups": kept / n_prompts}, 0.0, 0.0, 0.0
            if kept:  # a step whose groups the algorithm all drops trains on nothing: no optimizer step
                draws = mu if hooks.draws_noise else 1  # an empty draw is made (and scored) once
                unique = [hooks.sample_noise(batch, noise_gen, cfg) for _ in range(draws)]
                if not all(isinstance(z, Draw) for z in unique):
                    raise TypeError(f"sample_noise returned {type(unique[0]).__name__}, not a dare.train.noise.Draw "
                                    "(what an algorithm derives from the rollout goes in batch.extras: prepare)")
                noises = unique * (mu // draws)  # one per update, of the policy and of a value model
                batch = replace(batch, num_units=dist.sum({"u": float(hooks.loss_units(batch, unique[0], cfg))})["u"])

                # --- the value model: its values before the update (the algorithm's token advantages), its mu updates
                tic = time.perf_counter()
                value_sums = {}
                if critic is not None:
                    critic.model.eval()
                    with torch.no_grad(), critic.autocast():
                        old_values = torch.cat(per_micro(lambda b, z: hooks.token_values(critic.model, b, z, cfg),
                                                         batch, noises[0], micro))
                    batch = hooks.prepare(replace(batch, old_values=old_values), cfg)  # again, with the values
                n = batch.sequences.shape[0]
                minis = mini_batches(batch, cfg.rl.mini_batches, dist,
                                     lambda mb, rows: float(hooks.loss_units(mb, take(unique[0], rows, n), cfg)))
                if critic is not None:
                    def value_loss(mb, z, it, rows):
                        loss, metrics = hooks.value_loss(hooks.token_values(critic.model, mb, z, cfg), mb, z, cfg)
                        return loss, {f"value/{k}": v for k, v in metrics.items()}

                    value_sums = updates(critic, minis, noises, micro, value_loss, "value/loss", "value/grad_norm")
                t_value = time.perf_counter() - tic

                # --- old and reference log-probs, on the same noise draws the updates will use
                peaks.start()
                tic = time.perf_counter()
                with torch.no_grad():
                    old = ref = None
                    if (mu > 1 or cfg.rl.recompute_old_logps) and uses_old:
                        with trainer.autocast():
                            old = [torch.cat(per_micro(lambda b, z: hooks.token_logps(policy, b, z, cfg), batch, z,
                                                       micro)) for z in unique] * (mu // draws)
                    if use_ref:
                        with trainer.reference() as ref_model:
                            ref = [torch.cat(per_micro(lambda b, z: hooks.token_logps(ref_model, b, z, cfg), batch, z,
                                                       micro)) for z in unique] * (mu // draws)
                t_logp = time.perf_counter() - tic
                peaks.end("logp")

                # --- mu policy updates on this batch, each accumulated over the micro-batches
                peaks.start()
                tic = time.perf_counter()
                first: dict[str, float] = {}  # the first update against the sampler and the old log-probs

                def policy_loss(mb, z, it, rows):
                    o, r = old[it][rows] if old else None, ref[it][rows] if ref else None
                    parts = hooks.draw_parts(z, cfg)
                    if parts is not None:  # memory-bounded: one draw's graph alive at a time
                        loss, metrics, logps = replayed_loss(trainer, hooks, policy, mb, z, parts, o, r, cfg)
                    else:
                        logps = hooks.token_logps(policy, mb, z, cfg)
                        loss, metrics = hooks.loss(logps, o if o is not None else logps.detach(), r, mb, z, cfg)
                    if it == 0:
                        for k, v in diag.first_update_sums(logps, o, mb).items():
                            first[k] = max(first.get(k, 0.0), v) if k.endswith("max_abs") or k.endswith("max_dev") \
                                else first.get(k, 0.0) + v
                    return loss, metrics

                sums.update(updates(trainer, minis, noises, micro, policy_loss))
                maxima = {k: first.pop(k) for k in list(first) if k.endswith(("max_abs", "max_dev"))}
                checks.update({**dist.sum(first), **dist.max(maxima)})
                sums.update(value_sums)
                t_update = time.perf_counter() - tic
                peaks.end("update")
            times = {"time/rollout_s": t_rollout, "time/logp_s": t_logp, "time/update_s": t_update,
                     **({"time/value_s": t_value} if critic is not None else {})}
            used = dist.sum({**counter.take(), "rollout_tokens": float(out.responses.numel()),
                             "update_tokens": float((out.response_mask & keep.repeat_interleave(G, 0)).sum()) * mu
                             if kept else 0.0})
            spent = compute_metrics(loop, used, out.nfe)
            val = {}
            if val_rows is not None and validation_due(cfg.rl, step + 1, loop.total, spent["compute/total_forwards"]
                                                       - used["rollout/forwards"] - used["train/forwards"],
                                                       spent["compute/total_forwards"]):
                greedy = replace(cfg.rl.decoding, temperature=0.0, tree=())
                with counter.phase("eval"):
                    val = validate(policy, trainer, tokenizer, task, val_rows, greedy,
                                   make_generator(cfg.run.seed, f"val/{step}/{dist.rank}"), cfg.rl.gather_rollout)
                spent["compute/eval_forwards"] += dist.sum(counter.take())["eval/forwards"]
            metrics = {**step_metrics(dist, batch, out, mu, sums, trainer.lr, times), **peaks.take(), **val,
                       **step_diagnostics(checks), **spent}

            # --- guards: a non-finite update or a collapse rolls back (or stops); a run without diversity warns
            problem = diag.nonfinite(sums) or guard.check(metrics)
            if problem:
                before = None if diag.nonfinite(sums) else step + 1 - cfg.rl.collapse_window
                loop.rollback(step + 1, problem, cfg.rl.on_collapse, cfg.rl.max_rollbacks, before)
                guard.reset()
                continue
            no_diversity = no_diversity + 1 if metrics.get("rollout/identical_groups") == 1.0 and G > 1 else 0
            if cfg.rl.warn_no_diversity and no_diversity and no_diversity % cfg.rl.warn_no_diversity == 0 and dist.main:
                print(f"[{label}] warning: no sampling diversity for {no_diversity} steps: all {G} completions of every "
                      f"group are identical (rollout temperature {rollout_cfg.temperature}); their advantages are 0 and "
                      "nothing is learned", file=sys.stderr, flush=True)
            loop.end_step(step + 1, tokenizer, lambda: metrics, bool(val) or "diag/logp_std" in metrics)
    counter.close()
    if critic is not None:  # the trained value model, loadable as a checkpoint (its head: `value_head.weight`)
        save_final(critic, tokenizer, run_dir, {"value_model": True, "model_name": model_name}, name="value")
    return loop.outcome(tokenizer, model_name, init)


def replayed_loss(trainer, hooks: RLHooks, policy, batch, draw, parts: list, old, ref, cfg):
    """The loss of `draw` with its gradient backpropagated one part at a time (`backward_by_parts`): `token_logps`
    of each part returns that part's columns of the whole draw's log-probs (dim 1). Returns the loss, detached
    (already backpropagated), its metrics and the log-probs."""
    return backward_by_parts(
        lambda part: hooks.token_logps(policy, batch, part, cfg), parts, lambda leaves: torch.cat(leaves, dim=1),
        lambda logps: hooks.loss(logps, old if old is not None else logps.detach(), ref, batch, draw, cfg),
        trainer.backward)


def mini_batches(batch: RLBatch, k: int, dist, units) -> list[tuple[slice, RLBatch]]:
    """The step's rows in `k` consecutive slices of whole groups (`rl.mini_batches`, verl's `ppo_mini_batch_size`),
    each with its own totals over processes (`num_tokens`, `num_sequences`, `num_active`, `num_units` from
    `units(mini_batch, rows)`), so each optimizer step's loss is normalized by its mini-batch, as verl's is;
    one slice, the batch itself, when k = 1."""
    n = batch.sequences.shape[0]
    if k == 1:
        return [(slice(0, n), batch)]
    size, out = n // k, []
    for m in range(k):
        rows = slice(m * size, (m + 1) * size)
        mini = take(batch, rows, n)
        t = dist.sum({"tokens": float(mini.response_mask.sum()), "rows": float(size),
                      "active": float((mini.advantages != 0).sum()), "units": units(mini, rows)})
        out.append((rows, replace(mini, num_tokens=t["tokens"], num_sequences=int(t["rows"]),
                                  num_active=int(t["active"]), num_units=t["units"])))
    return out


