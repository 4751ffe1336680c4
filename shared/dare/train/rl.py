"""The RL recipe (GRPO family). One step:

    prompts -> rollout (G completions each, `dare.rollout`) -> rewards (the task's reward)
      -> a hinted rollout, where the algorithm gives hints   hints(...), hinted(...) (`dare.train.hints`)
      -> advantages                                   advantages(rewards (P, G), cfg)
      -> what the algorithm derives from the rollout  prepare(batch, cfg)
      -> noise draws (mu, or one: rl.noise_draws)     sample_noise(batch, generator, cfg)
      -> old and reference log-probs on those draws   token_logps(model, batch, noise, cfg)
      -> mu policy updates                            loss(logps, old, ref, batch, noise, cfg)

In the code: `setup` builds the run once (an `RLRun`); `run` then makes each step of four phases, `roll_out`
(prompts to a prepared `RLBatch`), `diagnose`, `learn` (draws, `value_phase`, `scored`, the updates) and `account`
(metrics, validation), and guards and logs it (docs/architecture.md, "One RL step, in order").

With a value model (the algorithm's `value_model(cfg)` hook returns its settings; `dare.train.critic`),
after the noise draws: the values before the update on the first draw (token_values, on the whole batch,
into `batch.old_values`; then `value_targets`, deriving the token advantages and returns from them),
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
log-probs of an update, so their ratio compares like with like; `rl.noise_draws` says whether each of the mu
updates gets a fresh draw (per_update) or one draw serves them all (once). An algorithm that draws no noise (no
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
from dare.config import DecodingConfig
from dare.models import ModelFacts, encode_chat, facts
from dare.rollout import RolloutOutput, decode_responses, generate, left_pad
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
from dare.train.hints import hinted_rollout
from dare.train.hooks import RLHooks, missing_value_hooks
from dare.train.noise import Draw
from dare.utils import UserError, make_generator

@dataclass(frozen=True)
class Totals:
    """A step's (or a mini-batch's) totals over all processes: the normalizers that make losses and metrics add up
    over micro-batches and processes."""
    num_tokens: float = 0.0
    """Loss tokens (response_mask): the token-level normalizer."""
    num_sequences: int = 0
    """Completions."""
    num_active: int = 0
    """Completions with a nonzero advantage (JustGRPO's normalizer)."""
    num_units: float = 0.0
    """The algorithm's own loss units (`loss_units`: TraceRL's trace rows on masked models)."""


@dataclass(frozen=True)
class StepAt:
    """Where in the run an RL batch stands."""
    progress: float = 0.0
    """The share of the run's steps done before this one (step / train.steps), for schedules inside a loss."""
    draw_index: int = 0
    """Which of the step's noise draws `sample_noise` is making (0 .. draws - 1: update i's with
    rl.noise_draws=per_update), for draws that follow a schedule over the updates (MaskGRPO's rising mask ratio,
    EGSPO's chosen steps in turn)."""


@dataclass(kw_only=True)
class RLBatch:
    """One step's rollout as the hooks see it (row-major: dim 0 is the completion, B = prompts x group size): the
    rollout and the model's facts as they are, and what the step adds; `prepare` adds what an algorithm derives
    (`extras`, `kept_groups`). The rollout's, the facts' and the totals' fields read through the batch
    (`batch.response_mask` is `batch.rollout.response_mask`, `batch.mask_token_id` is `batch.facts.mask_token_id`,
    `batch.num_tokens` is `batch.totals.num_tokens`, `batch.progress` is `batch.at.progress`)."""

    rollout: RolloutOutput
    """What the sampler returned (`dare.rollout.RolloutOutput`: sequences, masks, step map, the decoding settings,
    and the trajectory, predictions, log-probs or supports an algorithm asks for)."""
    facts: ModelFacts | None = None
    """The model's facts (`dare.models.facts`): mask and EOS ids, and `block_size`, the block of block-causal
    models counted from each row's first prompt token as the sampler counts it (`dare.train.noise.blocks`)."""
    rewards: torch.Tensor | None = None
    """(B,)"""
    advantages: torch.Tensor | None = None
    """(B,)"""
    group_size: int = 1
    score: Callable[[torch.Tensor], torch.Tensor] | None = None
    """The task's rewards (B,) of any (B, G) completions of these prompts (MDPO scores intermediate states)."""
    totals: Totals = Totals()
    """The step's totals over all processes (a mini-batch's own in `mini_batches`)."""
    compute: Compute = Compute()
    at: StepAt = StepAt()
    """Where in the run it stands (`batch.progress`, `batch.draw_index` read through)."""
    extras: dict = field(default_factory=dict)
    """What `prepare` derives from the rollout (row-major tensors are sliced with the batch)."""
    kept_groups: torch.Tensor | None = None
    """(P, 1) bool, from `prepare`: the groups trained on; None: all of them."""
    old_values: torch.Tensor | None = None
    """(B, G) the value model's values before this step's update; None without one."""

    def __getattr__(self, name: str):
        part = _READ_THROUGH.get(name)
        if part is None or part not in self.__dict__:
            raise AttributeError(f"RLBatch has no field {name!r}")
        owner = self.__dict__[part]
        return None if owner is None else getattr(owner, name)

    def drawing(self, i: int) -> "RLBatch":
        """The batch as the step's noise draw `i` sees it (`sample_noise`; `batch.draw_index` is i)."""
        return replace(self, at=replace(self.at, draw_index=i))


_READ_THROUGH = {**{name: "rollout" for name in (
    "sequences", "attention_mask", "prompt_length", "response_mask", "responses", "step_map", "decoding", "trajectory",
    "predictions", "confidences", "supports", "commit_logps", "segments", "given", "entropies", "greedy")},
    **{name: "facts" for name in ("block_size", "mask_token_id", "eos_token_id")},
    **{name: "totals" for name in ("num_tokens", "num_sequences", "num_active", "num_units")},
    **{name: "at" for name in ("progress", "draw_index")}}
"""The fields an `RLBatch` reads through from its rollout, its model's facts and its totals."""


def per_micro(fn, batch: RLBatch, noise, size: int) -> list:
    """fn(micro_batch, micro_noise) for each micro-batch of `batch`."""
    n = batch.sequences.shape[0]
    return [fn(take(batch, rows, n), take(noise, rows, n)) for rows in micro_slices(n, size)]


@dataclass
class RLRun:
    """What an RL run builds once (`setup`) and every step uses."""
    cfg: object
    hooks: RLHooks
    dist: object
    task: object
    rows: list
    """The training split's rows; `prompts`, their chat-encoded prompts."""
    prompts: list
    val_rows: list | None
    tokenizer: object
    facts: ModelFacts
    rollout_cfg: DecodingConfig
    """`rl.decoding` with the algorithm's rollout options (block models: the canvas ends at `gen_length`)."""
    marker: int | None
    """The token that ends a dynamic block (None: fixed blocks)."""
    trainer: Trainer
    critic: Trainer | None
    counter: diag.ForwardCounter
    peaks: PhasePeaks
    model_name: str
    init: object


def run(cfg, hooks: RLHooks, run_dir, label: str = "rl") -> dict:
    r = setup(cfg, hooks)
    G = cfg.rl.group_size
    guard = diag.CollapseGuard(cfg.rl.collapse_metric, cfg.rl.collapse_window, cfg.rl.collapse_below,
                               cfg.rl.collapse_drop)
    no_diversity = 0
    with Loop(cfg, run_dir, label, r.trainer, len(r.rows), companions={"value": r.critic} if r.critic else None) as loop:
        for step in loop.steps():
            r.peaks.take()  # a step rolled back leaves nothing behind
            r.counter.take()  # what ran between steps (checkpoints, a rollback) is not this step's
            tic = time.perf_counter()
            batch = roll_out(r, loop.sampler.next(cfg.rl.prompts_per_step), step)
            times = {"time/rollout_s": time.perf_counter() - tic}
            checks = diagnose(r, batch, step, loop.due(step + 1))
            sums, first, phase_times = learn(r, batch, step)
            checks.update(first)
            metrics, validated = account(r, loop, batch, sums, checks, {**times, **phase_times}, step)

            # --- guards: a non-finite update or a collapse rolls back (or stops); a run without diversity warns
            problem = diag.nonfinite(sums) or guard.check(metrics)
            if problem:
                before = None if diag.nonfinite(sums) else step + 1 - cfg.rl.collapse_window
                loop.rollback(step + 1, problem, cfg.rl.on_collapse, cfg.rl.max_rollbacks, before)
                guard.reset()
                continue
            no_diversity = no_diversity + 1 if metrics.get("rollout/identical_groups") == 1.0 and G > 1 else 0
            if cfg.rl.warn_no_diversity and no_diversity and no_diversity % cfg.rl.warn_no_diversity == 0 \
                    and r.dist.main:
                print(f"[{label}] warning: no sampling diversity for {no_diversity} steps: all {G} completions of every "
                      f"group are identical (rollout temperature {r.rollout_cfg.temperature}); their advantages are 0 "
                      "and nothing is learned", file=sys.stderr, flush=True)
            loop.end_step(step + 1, r.tokenizer, lambda: metrics, validated or "diag/logp_std" in metrics)
    r.counter.close()
    if r.critic is not None:  # the trained value model, loadable as a checkpoint (its head: `value_head.weight`)
        save_final(r.critic, r.tokenizer, run_dir, {"value_model": True, "model_name": r.model_name}, name="value")
    return loop.outcome(r.tokenizer, r.model_name, r.init)


def setup(cfg, hooks: RLHooks) -> RLRun:
    """The run's checks (before any model is built), data, models, trainers and counters."""
    if not cfg.model.path:
        raise UserError("RL starts from a trained checkpoint: set model.path=<folder>")
    dist = setup_dist(cfg.train.sequence_parallel)
    n_prompts, mu = cfg.rl.prompts_per_step, cfg.rl.num_iterations
    if n_prompts % dist.world:
        raise UserError(f"rl.prompts_per_step={n_prompts} must be divisible by the {dist.world} processes")
    if (n_prompts // dist.world) % cfg.rl.mini_batches:
        raise UserError(f"rl.mini_batches={cfg.rl.mini_batches} must divide the {n_prompts // dist.world} prompts each "
                        f"of the {dist.world} processes rolls out per step (whole groups per mini-batch)")
    task = TASKS[cfg.data.task]
    critic_spec = hooks.value_model(cfg)
    if critic_spec is not None and missing_value_hooks(hooks):
        raise UserError(f"the algorithm asks for a value model but does not define {missing_value_hooks(hooks)}")
    rows = load_split(cfg.data.task, cfg.data.split)
    val_rows = validation_rows(cfg, task, dist.world) if cfg.rl.eval_every or cfg.rl.eval_every_forwards else None
    model, tokenizer, model_name, init = build_model(cfg.model, task, cfg.run.seed)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    f = facts(model)
    rollout_cfg = replace(cfg.rl.decoding, **hooks.rollout_options(cfg))
    if f.block_size is not None:  # the sampler's canvas ends where the trainer's batch does
        rollout_cfg = replace(rollout_cfg, whole_last_block=False)
    optimizer_steps = cfg.train.steps * mu * cfg.rl.mini_batches  # per batch: mu updates x the mini-batches
    trainer = Trainer(model, cfg.model, cfg.train, dist, optimizer_steps, reference=hooks.uses_reference(cfg),
                      seed=cfg.run.seed)
    critic = build_critic(cfg, task, dist, critic_spec, optimizer_steps) if critic_spec is not None else None
    return RLRun(cfg=cfg, hooks=hooks, dist=dist, task=task, rows=rows, val_rows=val_rows, tokenizer=tokenizer,
                 prompts=encode_chat(tokenizer, [row["prompt"] for row in rows]), facts=f, rollout_cfg=rollout_cfg,
                 marker=marker_id(tokenizer, rollout_cfg), trainer=trainer, critic=critic,
                 counter=diag.ForwardCounter([trainer.base, trainer.ref, critic.base if critic else None]),
                 peaks=PhasePeaks(dist.device), model_name=model_name, init=init)


def roll_out(r: RLRun, order: list, step: int) -> RLBatch:
    """This rank's prompts of the step (whole groups), G completions each sampled by the current policy, their
    rewards and advantages, the step's totals, and what the algorithm derives from them (`prepare`)."""
    cfg, dist, f, G = r.cfg, r.dist, r.facts, r.cfg.rl.group_size
    r.peaks.start()
    mine = order[dist.shard(cfg.rl.prompts_per_step)]  # whole groups
    row_of = [i for i in mine for _ in range(G)]  # each prompt G times, grouped
    ids, mask = left_pad([r.prompts[i] for i in row_of], f.pad_token_id)
    policy = r.trainer.model
    policy.eval()
    with r.trainer.autocast(), r.counter.phase("rollout"), gathered(policy, cfg.rl.gather_rollout):
        out = generate(policy, ids.to(dist.device), mask.to(dist.device), r.rollout_cfg,
                       make_generator(cfg.run.seed, f"rollout/{step}/{dist.rank}"), r.marker)
    rows_of = [r.rows[i] for i in row_of]

    def score(completions: torch.Tensor, rows: list | None = None) -> torch.Tensor:
        """The task's rewards of any completions of these prompts (of some `rows` of them)."""
        of = rows_of if rows is None else [rows_of[i] for i in rows]
        return torch.tensor(r.task.rewards(decode_responses(r.tokenizer, completions, f.stop_ids), of,
                                           style=cfg.data.reward), dtype=torch.float32, device=completions.device)

    rewards = score(out.responses)
    out, rewards = hinted_rollout(r, out, rewards, (ids, mask), rows_of, score, step)  # IGPO's hints, when given
    if out.block_reward is not None and out.decoding.block.dynamic_reward:  # b1's block-entropy reward
        rewards = rewards + out.decoding.block.dynamic_reward * out.block_reward.to(rewards.device)
    advantages = r.hooks.advantages(rewards.view(-1, G), cfg).reshape(-1)
    t = dist.sum({"tokens": float(out.response_mask.sum()), "rows": float(len(row_of)),
                  "active": float((advantages != 0).sum())})
    batch = RLBatch(rollout=out, facts=f, rewards=rewards, advantages=advantages, group_size=G, score=score,
                    totals=Totals(num_tokens=t["tokens"], num_sequences=int(t["rows"]), num_active=int(t["active"])),
                    compute=Compute(cfg.train.packing, cfg.train.logit_chunk), at=StepAt(progress=step / cfg.train.steps))
    batch = r.hooks.prepare(batch, cfg)
    r.peaks.end("rollout")
    return batch


def diagnose(r: RLRun, batch: RLBatch, step: int, saving: bool) -> dict:
    """Sums over processes of the step's checks on the policy that sampled (before any update): diversity,
    non-finite values, the rollout/trainer agreement (on a step that saves) and the estimators' noise
    (`rl.diag_every`). They leave every generator as it was."""
    cfg, dist, G = r.cfg, r.dist, r.cfg.rl.group_size
    with r.counter.phase("diag"):
        checks = dist.sum(diag.diversity_sums(batch.responses, batch.response_mask, G, r.facts.stop_ids))
        checks.update(dist.sum(diag.nonfinite_sums(batch.rewards, batch.commit_logps)))
        if cfg.rl.agreement_rows and batch.commit_logps is not None and saving:
            checks.update(replay_agreement(r.trainer.model, r.trainer, batch, cfg.rl.agreement_rows))
        if cfg.rl.diag_every and (step + 1) % cfg.rl.diag_every == 0:
            checks.update(estimator_noise(r.trainer.model, r.trainer, r.hooks, batch, cfg, step))
    return checks


def learn(r: RLRun, batch: RLBatch, step: int) -> tuple[dict, dict, dict]:
    """The step's updates on the groups the algorithm keeps: the noise draws (mu, or one: rl.noise_draws); the value
    model's phase; the old and
    reference log-probs on those draws; mu policy updates. Returns (the updates' metrics summed over processes,
    the first update's checks, the phases' times). A step whose groups the algorithm all drops trains on nothing:
    no forward and no optimizer step (Adam's moments would otherwise move the weights on a zero gradient)."""
    cfg, hooks, dist, mu = r.cfg, r.hooks, r.dist, r.cfg.rl.num_iterations
    keep = kept_groups(batch)
    kept = dist.sum({"groups": float(keep.sum())})["groups"]
    sums = {"rollout/kept_groups": kept / cfg.rl.prompts_per_step}
    times = {"time/logp_s": 0.0, "time/update_s": 0.0, **({"time/value_s": 0.0} if r.critic is not None else {})}
    if not kept:
        return sums, {}, times
    draws = mu if cfg.rl.noise_draws == "per_update" and hooks.draws_noise else 1  # an empty draw is scored once
    noise_gen = make_generator(cfg.run.seed, f"noise/{step}/{dist.rank}")
    unique = [hooks.sample_noise(batch.drawing(i), noise_gen, cfg) for i in range(draws)]
    if not all(isinstance(z, Draw) for z in unique):
        raise TypeError(f"sample_noise returned {type(unique[0]).__name__}, not a dare.train.noise.Draw "
                        "(what an algorithm derives from the rollout goes in batch.extras: prepare)")
    unique[0].check()
    noises = unique * (mu // draws)  # one per update, of the policy and of a value model
    units = dist.sum({"u": float(hooks.loss_units(batch, unique[0], cfg))})["u"]
    batch = replace(batch, totals=replace(batch.totals, num_units=units))

    tic = time.perf_counter()
    batch, minis, value_sums = value_phase(r, batch, unique, noises)
    if r.critic is not None:
        times["time/value_s"] = time.perf_counter() - tic

    r.peaks.start()
    tic = time.perf_counter()
    old, ref = scored(r, batch, unique, mu // draws)
    times["time/logp_s"] = time.perf_counter() - tic
    r.peaks.end("logp")

    r.peaks.start()
    tic = time.perf_counter()
    first: dict[str, float] = {}  # the first update against the sampler and the old log-probs

    def policy_loss(mb, z, it, rows):
        o, rf = old[it][rows] if old else None, ref[it][rows] if ref else None
        parts = hooks.draw_parts(z, cfg)
        if parts is not None:  # memory-bounded: one draw's graph alive at a time
            loss, metrics, logps = replayed_loss(r.trainer, hooks, r.trainer.model, mb, z, parts, o, rf, cfg)
        else:
            logps = hooks.token_logps(r.trainer.model, mb, z, cfg)
            loss, metrics = hooks.loss(logps, o if o is not None else logps.detach(), rf, mb, z, cfg)
        if it == 0:
            diag.merge_first_update(first, diag.first_update_sums(logps, o, mb))
        return loss, metrics

    sums.update(updates(r.trainer, minis, noises, cfg.train.micro_batch_size, policy_loss))
    sums.update(value_sums)
    times["time/update_s"] = time.perf_counter() - tic
    r.peaks.end("update")
    return sums, diag.reduce_first_update(dist, first), times


def kept_groups(batch: RLBatch) -> torch.Tensor:
    """(P, 1) bool: the groups the algorithm trains on (`prepare`'s `kept_groups`; all of them by default)."""
    if batch.kept_groups is not None:
        return batch.kept_groups
    return batch.rewards.new_ones(batch.rewards.shape[0] // batch.group_size, 1, dtype=torch.bool)


def value_phase(r: RLRun, batch: RLBatch, unique: list, noises: list) -> tuple[RLBatch, list, dict]:
    """With a value model: its values before the update on the first draw (`token_values`, into
    `batch.old_values`; then `value_targets`, what the algorithm derives from them, into `batch.extras`) and its mu
    updates (`value_loss`). Returns the batch, its mini-batches and the value updates' metrics."""
    cfg, hooks, critic, micro = r.cfg, r.hooks, r.critic, r.cfg.train.micro_batch_size
    if critic is not None:
        critic.model.eval()
        with torch.no_grad(), critic.autocast():
            old_values = torch.cat(per_micro(lambda b, z: hooks.token_values(critic.model, b, z, cfg),
                                             batch, noises[0], micro))
        batch = replace(batch, old_values=old_values)
        batch = replace(batch, extras={**batch.extras, **hooks.value_targets(batch, cfg)})
    n = batch.sequences.shape[0]
    minis = mini_batches(batch, cfg.rl.mini_batches, r.dist,
                         lambda mb, rows: float(hooks.loss_units(mb, take(unique[0], rows, n), cfg)))
    if critic is None:
        return batch, minis, {}

    def value_loss(mb, z, it, rows):
        loss, metrics = hooks.value_loss(hooks.token_values(critic.model, mb, z, cfg), mb, z, cfg)
        return loss, {f"value/{k}": v for k, v in metrics.items()}

    return batch, minis, updates(critic, minis, noises, micro, value_loss, "value/loss", "value/grad_norm")


def scored(r: RLRun, batch: RLBatch, unique: list, repeat: int) -> tuple[list | None, list | None]:
    """The old (before the update) and reference log-probs on each noise draw, `repeat` times over (one per
    update); None where the objective needs none. With one update per batch (mu = 1) the old log-probs equal the
    current ones by construction and are not computed."""
    cfg, hooks, trainer, micro = r.cfg, r.hooks, r.trainer, r.cfg.train.micro_batch_size
    old = ref = None
    with torch.no_grad():
        if (cfg.rl.num_iterations > 1 or cfg.rl.recompute_old_logps) and hooks.uses_old_logps(cfg):
            with trainer.autocast():
                old = [torch.cat(per_micro(lambda b, z: hooks.token_logps(trainer.model, b, z, cfg), batch, z,
                                           micro)) for z in unique] * repeat
        if hooks.uses_reference(cfg):
            with trainer.reference() as ref_model:
                ref = [torch.cat(per_micro(lambda b, z: hooks.reference_logps(ref_model, b, z, cfg), batch, z,
                                           micro)) for z in unique] * repeat
    return old, ref


def account(r: RLRun, loop, batch: RLBatch, sums: dict, checks: dict, times: dict, step: int) -> tuple[dict, bool]:
    """The step's metrics: the updates', the compute spent (forwards, tokens), the phases' peaks and times,
    the diagnostics, and the validation when it is due (`validation_due`); and whether it validated."""
    cfg, dist, mu = r.cfg, r.dist, r.cfg.rl.num_iterations
    keep = kept_groups(batch).repeat_interleave(cfg.rl.group_size, 0)
    used = dist.sum({**r.counter.take(), "rollout_tokens": float(batch.responses.numel()),
                     "update_tokens": float((batch.response_mask & keep).sum()) * mu
                     if sums["rollout/kept_groups"] else 0.0})
    spent = compute_metrics(loop, used, batch.rollout.nfe)
    val = {}
    after = spent["compute/total_forwards"]
    if r.val_rows is not None and validation_due(cfg.rl, step + 1, loop.total,
                                                 after - used["rollout/forwards"] - used["train/forwards"], after):
        greedy = replace(cfg.rl.decoding, temperature=0.0, tree=())
        with r.counter.phase("eval"):
            val = validate(r.trainer.model, r.trainer, r.tokenizer, r.task, r.val_rows, greedy,
                           make_generator(cfg.run.seed, f"val/{step}/{dist.rank}"), cfg.rl.gather_rollout)
        spent["compute/eval_forwards"] += dist.sum(r.counter.take())["eval/forwards"]
    return {**step_metrics(dist, batch, mu, sums, r.trainer.lr, times), **r.peaks.take(), **val,
            **step_diagnostics(checks), **spent}, bool(val)


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
        out.append((rows, replace(mini, totals=Totals(num_tokens=t["tokens"], num_sequences=int(t["rows"]),
                                                     num_active=int(t["active"]), num_units=t["units"]))))
    return out


