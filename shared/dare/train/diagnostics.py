"""What an RL step reports about itself besides its reward and loss, and what stops it.

- Rollout/trainer agreement (`agreement_sums`): the sampler's log-prob of each committed token under
  the model's untempered distribution at its commit step (`RolloutOutput.commit_logps`) against the
  trainer's: an exact replay of the state the sampler decoded from (`estimators.trajectory_logps` on
  the rollout's step map, no cache), on the first `rl.agreement_rows` rows of every logged step
  (`agree/logp_gap`, `agree/logp_abs_gap`, `agree/logp_max_abs_gap`); and the algorithm's own estimate
  at the first update (`agree/estimate_gap`, ...: how far its likelihood is from the sampling policy's
  conditionals), with the importance ratio there (`agree/ratio_mean`, `agree/ratio_max_dev`: 1 and 0
  when mu = 1, where the old log-probs are the current ones by construction).
- Estimator noise (`sequence_estimate`, with `estimators.spread`): every `rl.diag_every` steps, the first `rl.diag_rows` rows
  re-estimated with `rl.diag_draws` independent noise draws: the standard deviation of each sequence's
  log-prob estimate (`diag/logp_std`) and its ratio to the spread of the sequence advantages
  (`diag/logp_std_to_adv_std`), the signal-to-noise that decides whether an ELBO method learns.
- Diversity and degeneration (`diversity_sums`): groups whose G completions are identical, distinct
  completions per group, where the first stop token falls, rows without one, the share of tokens that
  repeat the one before them, non-finite values.
- Compute (`ForwardCounter`): sequence forward passes per phase (rollout, training, diagnostics,
  validation), counted by a hook on every model the loop runs.
- Guards (`CollapseGuard`, `nonfinite`): a non-finite loss or gradient norm, or a configured metric's
  windowed mean falling below a floor or a share of its best, hand the step to `Loop.rollback`.

Every `*_sums` function returns sums (and counts) of one process's rows, to be added over processes
(`Dist.sum`) and divided by `ratios`, and calls no collective; the step's diagnostic passes, `replay_agreement`
and `estimator_noise`, run the model on every process and sum over them (collective), and `step_diagnostics`
turns the summed checks into the logged values.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict, deque

import torch

from dare.train.batches import take
from dare.train.estimators import spread, trajectory_logps
from dare.train.noise import rollout_rounds, trace_rounds
from dare.utils import derive_seed



def ratios(sums: dict[str, float], spec: dict[str, tuple[str, str]]) -> dict[str, float]:
    """{name: sums[numerator] / sums[denominator]} for each (numerator, denominator) in spec, where the
    denominator is positive (a metric with nothing to average over is left out, never logged as 0)."""
    return {name: sums[num] / sums[den] for name, (num, den) in spec.items() if sums.get(den, 0) > 0}


def agreement_sums(sampler: torch.Tensor, trainer: torch.Tensor, where: torch.Tensor, prefix: str) -> dict:
    """Sums of (sampler - trainer) log-probs, their absolute values and the count at `where`, (B, G) each;
    `{prefix}max_abs` is a maximum (add it over processes with `Dist.max`)."""
    gap = (sampler.float() - trainer.float())[where]
    gap = gap[torch.isfinite(gap)]
    return {f"{prefix}n": float(gap.numel()), f"{prefix}gap": float(gap.sum()), f"{prefix}abs": float(gap.abs().sum()),
            f"{prefix}max_abs": float(gap.abs().max()) if gap.numel() else 0.0}


AGREEMENT = {"agree/logp_gap": ("replay/gap", "replay/n"), "agree/logp_abs_gap": ("replay/abs", "replay/n"),
             "agree/estimate_gap": ("estimate/gap", "estimate/n"),
             "agree/estimate_abs_gap": ("estimate/abs", "estimate/n"),
             "agree/ratio_mean": ("ratio/sum", "ratio/n"), "train/nonfinite_logps": ("nonfinite/n", "logps/n")}


def first_update_sums(logps: torch.Tensor, old: torch.Tensor | None, batch) -> dict:
    """The first update's log-probs of a micro-batch against the sampler (`batch.commit_logps`, when the
    estimate is per completion token, (B, G)) and the old log-probs (the importance ratio; exactly 1 without
    them, mu = 1), and their non-finite share, at the loss tokens (response_mask, broadcast over a draw
    dimension: (B, n, G) estimates)."""
    logps = logps.detach().float()
    where = batch.response_mask
    if logps.dim() == 3 and (logps.shape[0], logps.shape[2]) == tuple(where.shape):
        where = where[:, None, :].expand_as(logps)
    elif logps.shape != where.shape:  # an estimate of another shape: all of it is checked
        where = torch.ones_like(logps, dtype=torch.bool)
    finite = torch.isfinite(logps) & where
    out = {"logps/n": float(where.sum()), "nonfinite/n": float((where & ~torch.isfinite(logps)).sum())}
    ratio = torch.exp(logps - old.float())[finite] if old is not None else torch.ones(int(finite.sum()))
    ratio = ratio[torch.isfinite(ratio)]
    out.update({"ratio/n": float(ratio.numel()), "ratio/sum": float(ratio.sum()),
                "ratio/max_dev": float((ratio - 1).abs().max()) if ratio.numel() else 0.0})
    if batch.commit_logps is not None and logps.shape == batch.response_mask.shape:
        committed = batch.response_mask & (batch.step_map >= 0)
        out.update(agreement_sums(batch.commit_logps, logps, committed, "estimate/"))
    return out


def merge_first_update(first: dict, sums: dict) -> None:
    """Adds a micro-batch's `first_update_sums` to the step's: sums add up, maxima (`*max_abs`, `*max_dev`) take
    the larger."""
    for k, v in sums.items():
        first[k] = max(first.get(k, 0.0), v) if k.endswith(MAXIMA) else first.get(k, 0.0) + v


def reduce_first_update(dist, first: dict) -> dict:
    """The step's first-update checks over all processes: sums summed, maxima the largest (two collectives)."""
    maxima = {k: first.pop(k) for k in list(first) if k.endswith(MAXIMA)}
    return {**dist.sum(first), **dist.max(maxima)}


MAXIMA = ("max_abs", "max_dev")
"""The suffixes of the checks that are maxima, not sums."""


def diversity_sums(responses: torch.Tensor, response_mask: torch.Tensor, group_size: int, stop_ids) -> dict:
    """Per-process sums over the rows (groups of `group_size` consecutive rows): identical groups, distinct
    completions (a completion is its tokens up to and including the first stop token), rows with a stop
    token and the sum of its first position, and tokens equal to the token before them (inside the
    completion, after its first token)."""
    B, G = responses.shape
    stops = torch.tensor([stop_ids] if isinstance(stop_ids, int) else list(stop_ids), device=responses.device)
    is_stop = torch.isin(responses, stops)
    has_stop = is_stop.any(dim=1)
    first = is_stop.float().argmax(dim=1)
    texts = [tuple(row[mask].tolist()) for row, mask in zip(responses, response_mask)]
    groups = [texts[g:g + group_size] for g in range(0, B, group_size)]
    repeat = (responses[:, 1:] == responses[:, :-1]) & response_mask[:, 1:]
    return {"groups": float(len(groups)), "identical": float(sum(len(set(g)) == 1 for g in groups)),
            "distinct": float(sum(len(set(g)) / len(g) for g in groups)), "rows": float(B),
            "stop_rows": float(has_stop.sum()), "stop_pos": float(first[has_stop].sum()),
            "repeat": float(repeat.sum()), "pairs": float(response_mask[:, 1:].sum())}


DIVERSITY = {"rollout/identical_groups": ("identical", "groups"), "rollout/distinct_ratio": ("distinct", "groups"),
             "rollout/eos_position": ("stop_pos", "stop_rows"), "rollout/repeat_rate": ("repeat", "pairs")}


def nonfinite_sums(*tensors: torch.Tensor | None) -> dict:
    """Non-finite entries and all entries of the given tensors (rewards, the sampler's log-probs)."""
    present = [t.float() for t in tensors if t is not None]
    return {"nonfinite": float(sum((~torch.isfinite(t)).sum() for t in present)),
            "values": float(sum(t.numel() for t in present))}


def sequence_estimate(logps: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(b,) each sequence's log-prob estimate from what an algorithm's `token_logps` returns: per-token
    log-probs (b, G) summed over the completion tokens (response_mask); per-draw ones (b, n, G) the same,
    averaged over the draws; a sequence-level estimate (b,) as it is; per-draw sequence terms (b, n)
    averaged over the draws."""
    mask = response_mask.to(logps.dtype)
    if logps.shape == mask.shape:
        return (logps * mask).sum(dim=-1)
    if logps.dim() == 3 and logps.shape[2] == mask.shape[1]:
        return (logps * mask[:, None, :]).sum(dim=-1).mean(dim=1)
    return logps.reshape(logps.shape[0], -1).mean(dim=1)


class ForwardCounter:
    """Sequence forward passes (a forward over B rows counts B; a packed row counts its sequences) and the
    positions they ran, per phase, on every given model: a forward pre-hook on each, so every forward
    the loop and the algorithm's hooks make is counted whatever calls it. `with counter.phase("rollout"):`
    attributes the forwards inside; the default phase is "train"."""

    def __init__(self, modules):
        self.counts: dict[str, float] = defaultdict(float)
        self.current = "train"
        self.handles = [m.register_forward_pre_hook(self._count, with_kwargs=True) for m in modules if m is not None]

    def _count(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            return
        cu = kwargs.get("cu_seqlens")
        self.counts[f"{self.current}/forwards"] += len(cu) - 1 if cu is not None else ids.shape[0]
        self.counts[f"{self.current}/positions"] += ids.numel()

    @contextlib.contextmanager
    def phase(self, name: str):
        previous, self.current = self.current, name
        try:
            yield
        finally:
            self.current = previous

    PHASES = ("rollout", "train", "diag", "eval")

    def take(self) -> dict[str, float]:
        """The counts since the last call (every phase's keys, 0 where nothing ran: the same keys on every
        process, to be summed over them), and reset."""
        out = {f"{p}/{what}": self.counts.get(f"{p}/{what}", 0.0) for p in self.PHASES for what in ("forwards", "positions")}
        self.counts = defaultdict(float)
        return out

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def nonfinite(sums: dict[str, float]) -> str | None:
    """The reason a step's update must not stand: a non-finite loss or gradient norm, or None."""
    bad = [k for k, v in sums.items() if k.startswith(("loss/", "optim/grad_norm", "value/loss", "value/grad_norm"))
           and not math.isfinite(v)]
    return f"non-finite {', '.join(sorted(bad))}" if bad else None


class CollapseGuard:
    """`metric`'s mean over the last `window` steps (the metric as logged, e.g. rollout/reward_mean or
    val/accuracy; steps that do not log it are skipped) is a collapse when it falls below `below`, or
    below (1 - `drop`) x the best such mean seen so far in this process (the best is not carried over a
    resume). Off when `metric` is empty."""

    def __init__(self, metric: str, window: int, below: float | None, drop: float | None):
        self.metric, self.window, self.below, self.drop = metric, window, below, drop
        self.reset()

    def reset(self) -> None:
        self.values: deque = deque(maxlen=self.window)
        self.best = -math.inf

    def check(self, metrics: dict) -> str | None:
        if not self.metric or self.metric not in metrics:
            return None
        self.values.append(float(metrics[self.metric]))
        if len(self.values) < self.window:
            return None
        mean = sum(self.values) / self.window
        if self.below is not None and mean < self.below:
            return f"{self.metric} averaged {mean:.4g} over the last {self.window} steps, below rl.collapse_below={self.below}"
        if self.drop is not None and self.best > 0 and mean < (1 - self.drop) * self.best:
            return (f"{self.metric} averaged {mean:.4g} over the last {self.window} steps, more than "
                    f"rl.collapse_drop={self.drop} below its best {self.best:.4g}")
        self.best = max(self.best, mean)
        return None


def replay_agreement(policy, trainer, batch, rows: int) -> dict:
    """The rollout/trainer agreement on the first `rows` rows of `batch` (an `rl.RLBatch`): each committed token's log-prob in the state
    the sampler decoded it from, replayed by the trainer's forward without a cache (`trajectory_logps` on
    the step map, one forward per decoding round), against the sampler's own (`batch.commit_logps`).
    Dynamic blocks (`batch.segments`): the rounds are the row's steps and each state one plain forward of the
    canvas (a window crosses the model's blocks); exact but where a block cut at its marker re-masked tokens
    the sampler had shown to the model (docs/training.md, b1).
    Summed over processes (collective: every rank runs the largest round count of any rank)."""
    n = batch.sequences.shape[0]
    sub = take(batch, slice(0, min(rows, n)), n)
    canvas = sub.segments is not None
    if canvas:  # every distinct step of a row is a round, across its blocks
        steps = trace_rounds(sub.step_map, torch.zeros_like(sub.step_map))
        rounds = torch.cat([torch.full_like(sub.sequences[:, :sub.prompt_length], -1), steps], dim=1)
    else:
        rounds = rollout_rounds(sub)
    with torch.no_grad(), trainer.autocast():
        replayed = trajectory_logps(policy, sub, rounds, canvas=canvas)  # collective under FSDP
    sums = agreement_sums(sub.commit_logps, replayed, sub.response_mask & (sub.step_map >= 0), "replay/")
    worst = {"replay/max_abs": sums.pop("replay/max_abs")}
    return {**trainer.dist.sum(sums), **trainer.dist.max(worst)}


def estimator_noise(policy, trainer, hooks, batch, cfg, step: int) -> dict:
    """The algorithm's log-prob estimator re-run on the first `rl.diag_rows` rows with `rl.diag_draws`
    independent noise draws (generators of their own): the mean standard deviation of a sequence's estimate
    (`sequence_estimate`) and the spread of the batch's sequence advantages. An estimator without
    noise (no `sample_noise`: trajectory replays) has none. Collective."""
    dist, n = trainer.dist, batch.sequences.shape[0]
    sub = take(batch, slice(0, min(cfg.rl.diag_rows, n)), n)
    if hooks.draws_noise:
        def estimate(generator):
            z = hooks.sample_noise(sub, generator, cfg)
            with torch.no_grad(), trainer.autocast():
                return sequence_estimate(hooks.token_logps(policy, sub, z, cfg).float(), sub.response_mask)

        _, std = spread(estimate, cfg.rl.diag_draws, derive_seed(cfg.run.seed, f"diag/{step}/{dist.rank}"))
    else:
        std = torch.zeros(sub.sequences.shape[0])
    adv = batch.advantages.float()
    sums = dist.sum({"spread/std": float(std.sum()), "spread/n": float(std.numel()), "adv/n": float(adv.numel()),
                     "adv/sum": float(adv.sum()), "adv/sq": float((adv ** 2).sum())})
    mean = sums["adv/sum"] / sums["adv/n"]
    return {**sums, "adv/std": max(0.0, sums["adv/sq"] / sums["adv/n"] - mean ** 2) ** 0.5}


def step_diagnostics(checks: dict) -> dict:
    """The logged diagnostics from their sums over processes (`dare.train.diagnostics`)."""
    out = ratios(checks, {**DIVERSITY, **AGREEMENT, "rollout/nonfinite": ("nonfinite", "values"),
                               "diag/logp_std": ("spread/std", "spread/n")})
    out["rollout/no_eos"] = 1 - checks["stop_rows"] / checks["rows"]
    for key, name, count in [("replay/max_abs", "agree/logp_max_abs_gap", "replay/n"),
                             ("estimate/max_abs", "agree/estimate_max_abs_gap", "estimate/n"),
                             ("ratio/max_dev", "agree/ratio_max_dev", "ratio/n")]:
        if checks.get(count):
            out[name] = checks[key]
    if "adv/std" in checks:
        out["diag/adv_std"] = checks["adv/std"]
        if checks["adv/std"] > 0 and "diag/logp_std" in out:
            out["diag/logp_std_to_adv_std"] = out["diag/logp_std"] / checks["adv/std"]
    return out
