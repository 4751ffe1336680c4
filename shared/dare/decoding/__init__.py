"""Each sampler's own decoding options, one module per sampler, torch-free so that configs load and
validate without torch (the samplers themselves live in `dare.rollout`).

A decoding section (`rl.decoding`, `eval.decoding`, the `decoding` of `dare.rollout.generate`: a
`dare.config.DecodingConfig`) holds the settings every sampler reads (`sampler`, `gen_length`,
`block_length`, `steps`, `temperature`), the rollout's shape that the RL loop sets (`record`,
`tree`, `whole_last_block`), and one options section per sampler, named after it
(`rl.decoding.masked.threshold`, `rl.decoding.block.editing_threshold`, `rl.decoding.maskgit.rcr`,
`rl.decoding.truncated.top_k`, `eval.decoding.dream.alg`). Each module here defines its sampler's options
dataclass and `check(options, decoding)`, the rules of those options given the common settings;
`DecodingConfig.validate` runs the check of the sampler that runs (for sampler=auto the one the config's
`model.family` picks, both of `AUTO` while no family is known), and the config loader rejects an option set
for a sampler that does not run (`unused_options`).

`compile` (a common setting, `RUNTIME`) captures the masked and block samplers' cached step with `torch.compile`
(None = auto: on CUDA where the step's shapes are static, the dual cache and the block sampler's, with CUDA
graphs; off on a CPU); it changes how fast a rollout runs, not what it decodes.

The flat form (`flat`) is the layout before the options moved to their samplers: one mapping of every
setting by its old name, each option read from the section of the sampler that runs. It is what the config
hash covers (so runs keep their hash and their folder) and what a result's `decoding` record is written
from; `from_flat` reads it back into the new layout.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from dare.decoding import block, dream, masked, maskgit, truncated
from dare.decoding.block import BlockOptions
from dare.decoding.dream import DreamOptions
from dare.decoding.masked import MaskedOptions
from dare.decoding.maskgit import MaskgitOptions
from dare.decoding.truncated import TruncatedOptions
from dare.models.registry import ATTENTION

SAMPLERS = {m.NAME: m for m in (masked, block, dream, maskgit, truncated)}
"""Sampler name -> its options module (the options dataclass and `check`, its rules)."""
OPTIONS = {"masked": MaskedOptions, "block": BlockOptions, "dream": DreamOptions, "maskgit": MaskgitOptions,
           "truncated": TruncatedOptions}
"""Sampler name -> its options dataclass, in the order of the decoding section's fields."""
AUTO = ("masked", "block")
"""What sampler=auto runs: the block sampler on block-causal models, the masked sampler on the others."""

COMMON = ("sampler", "gen_length", "block_length", "steps", "temperature", "record", "tree", "whole_last_block")
"""The decoding section's own fields besides the option sections: the settings every sampler reads, and the
rollout's shape that the RL loop sets for the sampler (`record`, `tree`, `whole_last_block`)."""
RECORDED = {"maskgit": ("states", "predictions"), "truncated": ("states", "supports")}
"""What the flat form's one flag `record_trajectory` (any `record`) kept, per sampler (else the states): what
`from_flat` reads it back as."""

RUNTIME = ("compile",)
"""Common settings of how the samplers run, never of what they decode (`compile`): outside the flat form, so
neither the config hash nor a result's decoding record holds them."""
CAPTURED = ("masked", "block")
"""The samplers whose cached step `compile` captures (the masked sampler's prefix and dual cache, the block
sampler's cache of committed blocks)."""

FLAT = {"sampler": "auto", "gen_length": 256, "block_length": 32, "steps": 128, "remasking": "low_confidence",
        "temperature": 0.0, "cfg_scale": 0.0, "cache": "auto", "threshold": 0.0, "factor": 0.0,
        "alg": "maskgit_plus", "alg_temp": 0.0, "top_p": 1.0, "top_k": 0, "eps": 1e-3, "logits_eos_inf": False,
        "confidence_eos_eot_inf": False, "eos_early_stop": False, "editing_threshold": 0.0, "max_post_steps": 16,
        "record_trajectory": False, "schedule": "even", "ass_blocks": 1, "eos_gamma_min": 1.0,
        "eos_gamma_max": 1.0, "rcr": False, "tree": (), "further_horizon": None, "whole_last_block": True,
        "dynamic": False, "dynamic_max_block": 0, "dynamic_marker": "block", "dynamic_min_offset": 1,
        "dynamic_reward": 0.0, "dynamic_target_blocks": 10}
"""The flat layout's names and defaults, in its order (every option's default is its section's)."""
FLAT_ADDED = ("schedule", "ass_blocks", "eos_gamma_min", "eos_gamma_max", "rcr", "tree", "further_horizon",
              "whole_last_block", "dynamic", "dynamic_max_block", "dynamic_marker", "dynamic_min_offset",
              "dynamic_reward", "dynamic_target_blocks")
"""Flat settings added after results were published: hashed only when they differ from their default."""

OWNERS: dict[str, tuple[str, ...]] = {}
"""Option name -> the samplers that have it (`top_k`: block, dream, maskgit, truncated)."""
for _name, _cls in OPTIONS.items():
    for _f in dataclasses.fields(_cls):
        OWNERS.setdefault(_f.name, ())
        OWNERS[_f.name] += (_name,)


def resolve(sampler: str, family: str | None = None) -> str | None:
    """The sampler that runs: `sampler` itself, or for auto the one the model family's attention picks
    (None when the family is not known)."""
    if sampler != "auto":
        return sampler
    attention = ATTENTION.get(family) if family else None
    if attention is None:
        return None
    return "block" if attention == "block_causal" else "masked"


def used(sampler: str, family: str | None = None) -> tuple[str, ...]:
    """The samplers whose options may apply: the one that runs, or both of `AUTO` while it is not known."""
    name = resolve(sampler, family)
    return (name,) if name else AUTO


def rules(d, family: str | None = None):
    """The option rules of decoding section `d` (a `DecodingConfig`) for the sampler that runs (both of `AUTO`
    for sampler=auto without a family), as (holds, message, *keys); the masked sampler's block layout only
    once it is known to run."""
    yield from runtime_rules(d, family)
    for name in used(d.sampler, family):
        if name == "masked":
            yield from masked.check(d.masked, d, layout=resolve(d.sampler, family) == "masked")
        else:
            yield from SAMPLERS[name].check(getattr(d, name), d)


def runtime_rules(d, family: str | None = None):
    """The rules of `compile`: asked for (True), the sampler that runs must capture its step (`CAPTURED`) with
    its cache on."""
    if not d.compile:
        return
    runs = resolve(d.sampler, family)
    yield (all(s in CAPTURED for s in used(d.sampler, family)), "captures the masked and block samplers' cached "
           f"step; sampler {d.sampler} decodes eagerly: leave compile unset (auto) or false", "compile", "sampler")
    if runs == "masked":
        yield (d.masked.cache in ("prefix", "dual"), "the masked sampler's captured step is the cached one: set "
               "masked.cache=prefix or dual", "compile", "masked.cache")
    if runs == "block":
        yield (not d.block.dynamic, "dynamic blocks decode eagerly (no captured step): leave compile unset",
               "compile", "block.dynamic")
        yield (d.block.cache != "none", "the block sampler's captured step reads its cache: block.cache=none "
               "recomputes the prefix eagerly", "compile", "block.cache")


def unused_options(d, family: str | None, given) -> list[tuple[str, str]]:
    """(key, sampler) of every option of `d` that `given(key)` says was set (in a file or on the command line),
    to something other than its default, in the section of a sampler that does not run; keys relative to
    the decoding section."""
    runs = used(d.sampler, family)
    out = []
    for name, cls in OPTIONS.items():
        if name in runs:
            continue
        default = cls()
        for f in dataclasses.fields(cls):
            key = f"{name}.{f.name}"
            if given(key) and getattr(getattr(d, name), f.name) != getattr(default, f.name):
                out.append((key, name))
    return out


def flat(d, family: str | None = None, *, runs: str | None = None) -> dict[str, Any]:
    """Decoding section `d` in the flat layout (`FLAT`'s names and order): the common settings, and each
    option from the section of the sampler that runs (`runs`, else resolved from `family`; its default where
    that sampler has no such option). With sampler=auto and no known family, an option both `AUTO` samplers
    have is one value where their sections agree, else {sampler: value} for each."""
    runs = runs or resolve(d.sampler, family)
    out = {}
    for name, default in FLAT.items():
        if name == "record_trajectory":  # the one flag before `record` said what to keep
            value = bool(d.record)
        elif name in COMMON:
            value = getattr(d, name)
        elif runs is not None:
            value = getattr(getattr(d, runs), name) if runs in OWNERS[name] else default
        else:
            values = {s: getattr(getattr(d, s), name) for s in AUTO if s in OWNERS[name]}
            distinct = set(values.values())
            value = default if not values else distinct.pop() if len(distinct) == 1 else values
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def hashed(d, family: str | None = None) -> dict[str, Any]:
    """What the config hash covers of decoding section `d`: its flat form without the later settings
    (`FLAT_ADDED`) at their default, exactly the dict hashed before the options moved to their samplers."""
    return {k: v for k, v in flat(d, family).items()
            if k not in FLAT_ADDED or v != (list(FLAT[k]) if isinstance(FLAT[k], tuple) else FLAT[k])}


def from_flat(values: Mapping[str, Any], family: str | None = None) -> dict[str, Any]:
    """A decoding mapping in the flat layout (a run's recorded config, an old YAML) in the new one: the
    common settings as they are, each option in the section of every sampler that may run and has it
    (`used`: for sampler=auto and no `family` both of `AUTO`, as the option applied to whichever ran),
    where that section accepts the value. An option no such sampler has was ignored by the sampler; it is
    kept, in its first owner's section, when it is not its default. The runtime settings (`RUNTIME`: a recorded
    run's saved config has them beside the flat decoding) stay as they are."""
    values = without_record_trajectory(values, family)
    out: dict[str, Any] = {k: v for k, v in values.items() if k in COMMON or k in RUNTIME}
    runs = used(values.get("sampler", "auto"), family)
    for name, value in values.items():
        if name in COMMON or name in RUNTIME:
            continue
        if name not in OWNERS:
            raise KeyError(name)
        targets = [s for s in runs if s in OWNERS[name] and _accepts(s, name, value)]
        if not targets and value != FLAT[name]:
            targets = [OWNERS[name][0]]
        for s in targets:
            out.setdefault(s, {})[name] = value
    return out


def without_record_trajectory(values: Mapping[str, Any], family: str | None = None,
                              sampler: str = "auto") -> Mapping[str, Any]:
    """A decoding mapping saved before `record` (flat, or a run's config.yaml in sections) with its one flag
    `record_trajectory` read as `record`: true is what the sampler kept (`RECORDED`; the states where it is not
    known), false nothing. The sampler is the mapping's own, else `sampler` (the section's it is merged into)."""
    if "record_trajectory" not in values:
        return values
    out = {k: v for k, v in values.items() if k != "record_trajectory"}
    if values["record_trajectory"] and "record" not in out:
        runs = used(values.get("sampler", sampler), family)
        out["record"] = RECORDED.get(runs[0], ("states",)) if len(runs) == 1 else ("states",)
    return out


def _accepts(sampler: str, name: str, value) -> bool:
    """Whether the option's type in that sampler's section admits the value (a Literal's choices)."""
    import typing

    hint = typing.get_type_hints(OPTIONS[sampler])[name]
    return typing.get_origin(hint) is not typing.Literal or value in typing.get_args(hint)


def renamed(key: str, name: str, sampler: str) -> str:
    """The one-line message for old flat option `name` given as `key` (`rl.decoding.top_k`): its new key in the
    section of the config's `sampler` (for auto: of the samplers auto may run; otherwise of every sampler that
    has the option)."""
    prefix = key[:len(key) - len(name)]
    owners = [s for s in used(sampler) if s in OWNERS[name]] or list(OWNERS[name])
    new = " or ".join(f"'{prefix}{s}.{name}'" for s in owners)
    if len(owners) == 1:
        return (f"'{key}' was renamed to {new}; rename it in the config (YAML `{name}:` under `decoding:` -> "
                f"under `{owners[0]}:` in `decoding:`)")
    auto = " (sampler=auto: masked on bidirectional models, block on block-causal ones)" if sampler == "auto" else ""
    return f"'{key}' was renamed to {new}: the section of the sampler that decodes{auto}; rename it in the config"
