"""The hook contract: what a baseline's `algorithm.py` defines, per recipe, in one place.

A baseline names its recipe (`RECIPE = "sft" | "preference" | "rl"`) and defines that recipe's
hooks as plain module-level functions. `bind(module)` reads them into the recipe's typed record
below (`SFTHooks`, `PreferenceHooks`, `RLHooks`), filling the optional ones with the defaults
written here, so a recipe calls `hooks.loss(...)` and go-to-definition lands on this file.

Three rules hold for every hook:

- `cfg` is always the whole run config (`cfg.algo` is the algorithm's own section, next to
  `cfg.rl`, `cfg.train`, `cfg.model`, ...), and it is always the last argument.
- `noise` is exactly what the algorithm's `sample_noise` returned (restricted to the micro-batch's
  rows by `dare.train.batches.take`), and every hook that computes on noised inputs receives the
  draw it was computed with: `token_logps`/`logps` build the noised input from it, and `loss`
  gets it too, so an objective can average over the masked positions or weight by t.
  `dare.train.noise.Draw` (masked positions, ratio t per draw or t_at per position, weight) is the usual shape
  of a draw; each field has one shape (`Draw.check`).
- A draw comes from the `generator` handed to `sample_noise`, never from the global RNG, so the
  policy, old and reference log-probs of an update see the same noise.

    recipe       hook                                                 returns
    all          check_config(cfg)                       optional     None; raise ValueError for a forbidden combination
    sft          sample_noise(batch, generator, cfg)                  noise (drawn once per step)
                 loss(model, batch, noise, cfg)                       (loss, metrics)
    preference   sample_noise(batch, generator, cfg)                  noise (drawn once per step)
                 logps(model, batch, noise, cfg)                      (B, K) log-likelihoods of each row's responses:
                                                                      K = 2 chosen/rejected, K = 1 for unpaired
                                                                      examples (`data.unpaired`, `batch.labels`)
                 loss(policy, reference, batch, noise, cfg)           (loss, metrics)
                 draw_parts(noise, cfg)                  optional     None; parts of the draw whose `logps` add up
                                                                      to the whole draw's: the policy's gradient is
                                                                      then backpropagated part by part (memory-
                                                                      bounded; `dare.train.preference.replayed_loss`)
    rl           advantages(rewards, cfg)                             (P, G) from (P, G) rewards
                 prepare(batch, cfg)                     optional     the batch (`dare.train.rl.RLBatch`) with what the
                                                                      algorithm derives from the rollout, once per step and
                                                                      deterministically, in `batch.extras` (trace rounds,
                                                                      step advantages, tree weights) and, when it trains on
                                                                      some groups only, `batch.kept_groups` ((P, 1) bool;
                                                                      a step that keeps none makes no update)
                 sample_noise(batch, generator, cfg)     optional     a `dare.train.noise.Draw`, per update (rl.noise_draws;
                                                                      `batch.draw_index`: which update's draw);
                                                                      the default `Draw()` draws nothing: the rollout fixes
                                                                      the inputs (then one draw serves the mu updates, and
                                                                      the old and reference log-probs are computed once)
                 token_logps(model, batch, noise, cfg)                the baseline's likelihood terms, in the shape its
                                                                      `SCORE` declares (`SCORES`: per token (B, G), per
                                                                      sequence (B,), per draw (B, D), per draw and token
                                                                      (B, D, G)); checked on every call
                 loss(logps, old_logps, ref_logps, batch, noise, cfg) (loss, metrics)
                 reference_logps(model, batch, noise,    optional     token_logps; the reference model's terms when its
                                 cfg)                                 input is not the policy's (a teacher that sees more:
                                                                      d-OPSD), in the same shape
                 uses_reference(cfg)                     optional     False: no reference model is kept
                 uses_old_logps(cfg)                     optional     True: False skips the old log-probs
                 rollout_options(cfg)                    optional     {}: decoding settings the algorithm needs
                 draw_parts(noise, cfg)                  optional     None; a list of parts of the draw (split along its
                                                                      draw dimension): the update's gradient is then
                                                                      backpropagated part by part (memory-bounded;
                                                                      `dare.train.rl.replayed_loss`), token_logps of a
                                                                      part returning its columns (dim 1) of the whole
                                                                      draw's log-probs
                 loss_units(batch, noise, cfg)           optional     0.0; this process's count of the units a loss
                                                                      averages over when they are neither tokens nor
                                                                      completions (TraceRL's trace rows on masked
                                                                      models), on the update's draw: the loop sums it
                                                                      over processes into `batch.num_units`
                 hints(rewards, references, gen_length,  optional     None; (B, gen_length) long, tokens given to a
                       generator, cfg)                                second rollout of the step's prompts (-1: decoded;
                                                                      IGPO's hints): rows with a given token are decoded
                                                                      again with them fixed (`dare.train.hints`), from
                                                                      the (P, G) rewards and each prompt's reference
                                                                      solution (the task's target, token ids); then:
                 hinted(rewards, hinted_rewards,                      (B,) long, the hinted row that replaces each row
                        generator, cfg)                               (-1: kept), from both rollouts' (P, G) rewards
                                                                      (NaN where a row was not decoded again); required
                                                                      with `hints`
                 value_model(cfg)                        optional     None; {"lr": ..., "path": ...} trains a value
                                                                      model beside the policy (`dare.train.critic`),
                                                                      and then the three hooks below are required:
                 token_values(value_model, batch, noise, cfg)         (B, G) values of the completion tokens; the loop
                                                                      keeps those before the update in `batch.old_values`
                                                                      (whole batch, after `prepare`)
                 value_targets(batch, cfg)                            what the algorithm derives from them, added to
                                                                      `batch.extras` (token advantages, returns), once
                                                                      per step on the whole batch
                 value_loss(values, batch, noise, cfg)                (loss, metrics) (a micro-batch's rows)

Each hook has one meaning: `prepare` (from the rollout) and `value_targets` (from the values) derive, once a step
each; `sample_noise` draws, `token_logps`/`token_values` score, `loss`/`value_loss` reduce. Hooks that an earlier contract had and that `prepare` now covers
(`random_noise`, `kept_groups`, `value_advantages`, `rewards_per_step`) are refused by `bind` with
a line saying so.

Losses and metrics are normalized by the step's totals carried in the batch (`num_tokens`,
`num_sequences`, `num_pairs`, `num_units`), so they add up over micro-batches and processes.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable


def _no_check(cfg) -> None:
    return None


def _no_reference(cfg) -> bool:
    return False


def _old_logps(cfg) -> bool:
    return True


def _as_is(batch, cfg):
    return batch


def _no_noise(batch, generator, cfg):
    from dare.train.noise import Draw

    return Draw()


def _no_rollout_options(cfg) -> dict:
    return {}


def _whole_draw(noise, cfg) -> None:
    return None


def _no_units(batch, noise, cfg) -> float:
    return 0.0


def _no_value_model(cfg) -> None:
    return None


def _no_hints(rewards, references, gen_length, generator, cfg) -> None:
    return None


def _needs_hinted(*args):
    raise ValueError("hints(...) gives tokens for a second rollout but the algorithm does not define hinted(...), "
                     "which chooses the hinted rows that replace the first rollout's (see dare.train.hooks)")


def _needs_value_hooks(*args):
    raise ValueError("value_model(cfg) asks for a value model but the algorithm does not define "
                     "token_values, value_targets and value_loss (see dare.train.hooks)")


@dataclass(frozen=True)
class SFTHooks:
    sample_noise: Callable[..., Any]
    loss: Callable[..., Any]
    check_config: Callable[[Any], None] = _no_check


@dataclass(frozen=True)
class PreferenceHooks:
    sample_noise: Callable[..., Any]
    logps: Callable[..., Any]
    loss: Callable[..., Any]
    check_config: Callable[[Any], None] = _no_check
    draw_parts: Callable[..., Any] = _whole_draw


@dataclass(frozen=True)
class RLHooks:
    advantages: Callable[..., Any]
    token_logps: Callable[..., Any]
    loss: Callable[..., Any]
    check_config: Callable[[Any], None] = _no_check
    prepare: Callable[..., Any] = _as_is
    sample_noise: Callable[..., Any] = _no_noise
    reference_logps: Callable[..., Any] | None = None
    """None: the reference's terms come from `token_logps` (`bind` fills it in)."""
    uses_reference: Callable[[Any], bool] = _no_reference
    uses_old_logps: Callable[[Any], bool] = _old_logps
    rollout_options: Callable[[Any], dict] = _no_rollout_options
    draw_parts: Callable[..., Any] = _whole_draw
    loss_units: Callable[..., Any] = _no_units
    hints: Callable[..., Any] = _no_hints
    hinted: Callable[..., Any] = _needs_hinted
    value_model: Callable[[Any], dict | None] = _no_value_model
    token_values: Callable[..., Any] = _needs_value_hooks
    value_targets: Callable[..., Any] = _needs_value_hooks
    value_loss: Callable[..., Any] = _needs_value_hooks

    @property
    def draws_noise(self) -> bool:
        """Whether `sample_noise` draws anything (the default draws nothing: one draw serves every update)."""
        return self.sample_noise is not _no_noise

    @property
    def gives_hints(self) -> bool:
        """Whether `hints` may ask for a second, hinted rollout (the default never does)."""
        return self.hints is not _no_hints


SCORES = {
    "token": "(B, G): one log-prob per completion position (d1, wd1, cj_grpo, coupled_grpo, tracerl, ...)",
    "sequence": "(B,): one score per completion, its ELBO (espo, gdpo)",
    "draw": "(B, D): one term per completion and noise draw or Monte-Carlo pair (bgpo, ebpo, gdsd)",
    "draw_token": "(B, D, G): per completion, draw (a time, a state, a path) and completion position (spg, mdpo, ...)",
    "draw_vocab": "(B, D, S, V): per completion, draw (a replayed state), scored position and vocabulary entry: the "
                  "model's logits, for a loss over whole distributions (d_opsd's distillation)",
}
"""What an RL baseline's `token_logps` returns, by the name its `SCORE` gives (B completions of G positions; the
loss reads the same shape from `old_logps` and `ref_logps`). `bind` refuses a baseline without a known `SCORE`, and
the bound `token_logps` checks each result's shape against it (metadata only: no device sync)."""


def check_score(kind: str, logps, batch) -> None:
    """ValueError when `logps` (what `token_logps` returned for `batch`) is not of the shape `kind` declares."""
    B, G = batch.sequences.shape[0], batch.sequences.shape[1] - batch.prompt_length
    shape = tuple(logps.shape)
    fits = {"token": shape == (B, G), "sequence": shape == (B,), "draw": len(shape) == 2 and shape[0] == B,
            "draw_token": len(shape) == 3 and shape[0] == B and shape[2] == G,
            "draw_vocab": len(shape) == 4 and shape[0] == B}[kind]
    if not fits:
        raise ValueError(f"token_logps returned shape {shape} for {B} completions of {G} positions, but the baseline "
                         f"declares SCORE = {kind!r}: {SCORES[kind]}")


def _declared(token_logps: Callable[..., Any], kind: str) -> Callable[..., Any]:
    @functools.wraps(token_logps)
    def checked(model, batch, noise, cfg):
        logps = token_logps(model, batch, noise, cfg)
        check_score(kind, logps, batch)
        return logps

    return checked


HOOKS: dict[str, type] = {"sft": SFTHooks, "preference": PreferenceHooks, "rl": RLHooks}
"""The recipes, by the name a baseline gives in `RECIPE`."""


def required(recipe: str) -> list[str]:
    return [f.name for f in dataclasses.fields(HOOKS[recipe]) if f.default is dataclasses.MISSING]


def optional(recipe: str) -> list[str]:
    return [f.name for f in dataclasses.fields(HOOKS[recipe]) if f.default is not dataclasses.MISSING]


RETIRED = {"random_noise": "leave sample_noise undefined when nothing is drawn",
           "kept_groups": "set batch.kept_groups in prepare(batch, cfg)",
           "value_advantages": "derive token advantages from batch.old_values in value_targets(batch, cfg)",
           "rewards_per_step": "score the sampler's predictions with batch.score in prepare(batch, cfg)"}
"""Hooks of an earlier contract, each with what replaces it."""


def bind(module: ModuleType, where: str | None = None):
    """The module's hooks as its recipe's record; a ValueError names what is missing or wrong."""
    where = where or getattr(module, "__file__", None) or module.__name__
    recipe = getattr(module, "RECIPE", None)
    if recipe not in HOOKS:
        raise ValueError(f"{where}: RECIPE = {recipe!r}; expected one of {sorted(HOOKS)}")
    retired = [name for name in RETIRED if callable(getattr(module, name, None))]
    if retired:
        raise ValueError(f"{where}: the hook {retired[0]} is gone: {RETIRED[retired[0]]} (see dare.train.hooks)")
    absent = [name for name in required(recipe) if not callable(getattr(module, name, None))]
    if absent:
        raise ValueError(f"{where}: the {recipe!r} recipe needs {', '.join(absent)} (see dare.train.hooks)")
    not_callable = [name for name in optional(recipe) if hasattr(module, name) and not callable(getattr(module, name))]
    if not_callable:
        raise ValueError(f"{where}: {', '.join(not_callable)} must be functions (see dare.train.hooks)")
    fields = [f.name for f in dataclasses.fields(HOOKS[recipe])]
    hooks = {name: getattr(module, name) for name in fields if hasattr(module, name)}
    if recipe == "rl":
        kind = getattr(module, "SCORE", None)
        if kind not in SCORES:
            raise ValueError(f"{where}: SCORE = {kind!r}; declare what token_logps returns, one of "
                             + "; ".join(f"{k!r} {v.split(':')[0]}" for k, v in SCORES.items()) + " (see dare.train.hooks)")
        hooks["token_logps"] = _declared(module.token_logps, kind)
        own = getattr(module, "reference_logps", None)
        hooks["reference_logps"] = _declared(own, kind) if callable(own) else hooks["token_logps"]
        if callable(getattr(module, "hints", None)) and not callable(getattr(module, "hinted", None)):
            raise ValueError(f"{where}: hints needs hinted, the rule that chooses which hinted rows replace the first "
                             "rollout's (see dare.train.hooks)")
    return HOOKS[recipe](**hooks)


def missing_value_hooks(hooks: RLHooks) -> list[str]:
    """The value hooks an algorithm whose `value_model(cfg)` asks for a value model has not defined."""
    return [name for name in ("token_values", "value_targets", "value_loss")
            if getattr(hooks, name) is _needs_value_hooks]
