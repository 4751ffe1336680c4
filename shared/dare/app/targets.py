"""A baseline's paper numbers. `reproductions/<name>/targets.yaml`, the one place they are kept:

    paper: {arxiv: "2504.12216", table: "d1 Table 1 (+ diffu-GRPO)"}
    base_model: LLaDA-8B-Instruct
    eval: {split: test, block_length: 32, steps_per_token: 0.5, temperature: 0.0, n_shot: 0}  # the paper's protocol
                                  # (temperature may list the values a best-of report chose from; an optional
                                  # `decoding: {schedule: ass, ...}` names other decoding settings it fixes,
                                  # by the flat names of a result's decoding record: `dare.decoding.FLAT`)
    tolerance: 2.0                # points
    targets:
      - {config: gsm8k.yaml, benchmark: gsm8k, gen_length: 256, value: 79.8}   # percent, as printed
    published:                    # optional: every other number printed for this method (the Published view)
      - {model: LLaDA-8B-Instruct, benchmark: gsm8k, value: 83.7, source: "DARE README, Algorithm comparison"}
      - {model: LLaDA-8B-Instruct, benchmark: gsm8k, value: 73.2, gen_length: 128, steps: 64, block_length: 32,
         n_shot: 0, init: peft, source: "d1 Table 1 (d1-LLaDA), arXiv 2504.12216", note: "SFT, then diffu-GRPO"}

Values are in percent, as the papers print them; `result.reference.value` is a fraction like every
metric in a result. A result matches a target by the training config it was made from, the
benchmark and the generation length; `same_decoding` says whether it was evaluated with the
paper's protocol (split, block length, steps = gen_length x steps_per_token, temperature, shots, and
the decoding fields `eval.decoding` lists).

Published numbers (`load_published`, `all_published`): every number printed for a baseline, by model,
benchmark and protocol, each with its source. A baseline's numbers live in one file: its
reproduction's `targets.yaml` (whose `targets:` rows are published numbers too, with `paper.table` as
their source and `eval:` as their protocol: they are not repeated under `published:`), or, for a
baseline without one (no sweep reproduces it), `reproductions/<name>/published.yaml`, holding only

    paper: {arxiv: "2510.04019"}
    published: [...]              # entries as above
    missing: "why no number is written"   # instead of `published:`, when the sources give none

A `published:` entry: `model` (the model trained, as a result's `model.name` names it), `benchmark` (a
task of `dare.data.TASKS`, or one of `OTHER_BENCHMARKS`: shown, never compared), `value` (percent, in
[0, 100]), `source` (the paper's arXiv id and table, `DARE README <table>`, or the compilation quoting
it); optional `gen_length`, `steps`, `block_length`, `n_shot` (0 when absent), `temperature` (a number
or the list a best-of report chose from), `init` (what the method was trained from when not the
released model: the baseline a result's `method.init` names, e.g. `peft` for SFT then RL) and `note`.
A protocol field the source does not state is left out, never guessed: a number is compared with
ours (`matches`) only when its generation length, block length and steps are all stated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from dare.decoding import FLAT
from dare.utils import UserError, load_yaml, shown_value

KEYS = {"paper", "base_model", "eval", "tolerance", "targets"}
OPTIONAL_KEYS = {"published"}
EVAL_KEYS = {"split", "block_length", "steps_per_token", "temperature", "n_shot", "decoding"}
TARGET_KEYS = {"config", "benchmark", "gen_length", "value"}


@dataclass(frozen=True)
class Targets:
    path: Path
    paper: dict
    base_model: str
    protocol: dict
    tolerance: float
    rows: list[dict]
    published: tuple[dict, ...] = ()  # the file's `published:` entries, checked (`check_published`)

    def find(self, config: str | Path | None, benchmark: str, gen_length: int) -> dict | None:
        name = Path(config).name if config else None
        for row in self.rows:
            if row["benchmark"] == benchmark and row["gen_length"] == gen_length and (
                    name is None or row["config"] == name):
                return row
        return None

    def source(self) -> str:
        return f"{self.paper['table']} (arXiv {self.paper['arxiv']})"

    def same_protocol(self, benchmark: dict, decoding: dict) -> bool:
        """Whether an evaluation used the paper's protocol. `decoding` is either the flat form (every setting by
        its name, as evaluation passes it) or a result's decoding record (the settings off their default under
        `extra`, as `dare sweep collect` passes it): both read as the flat form, defaults filled in."""
        decoding = {**FLAT, **decoding, **(decoding.get("extra") or {})}
        p = self.protocol
        steps = round(decoding["gen_length"] * p["steps_per_token"])
        temperatures = p["temperature"] if isinstance(p["temperature"], list) else [p["temperature"]]  # best of
        return (benchmark.get("split") == p["split"] and decoding.get("block_length") == p["block_length"]
                and decoding.get("steps") == steps and float(decoding.get("temperature") or 0.0) in temperatures
                and benchmark.get("n_shot", 0) == p.get("n_shot", 0)
                and all(decoding.get(k) == v for k, v in (p.get("decoding") or {}).items()))

    def reference(self, config: str | Path | None, benchmark: dict, decoding: dict) -> dict | None:
        """The result's `reference` section for this evaluation, or None when no target matches."""
        row = self.find(config, benchmark["name"], decoding["gen_length"])
        if row is None:
            return None
        return {"value": row["value"] / 100, "source": self.source(),
                "same_decoding": self.same_protocol(benchmark, decoding)}


MAX_YAML_BYTES = 2**20
"""The largest targets.yaml or published.yaml read (the committed ones are a few KiB): a larger one is refused by
its size, before it is parsed."""


def read_yaml(path: Path, what: str):
    """The parsed YAML of a targets or published file, refused in one line naming the file (and the field)
    unless it is a regular file of at most `MAX_YAML_BYTES` reached through no link out of its folder
    (`dare.results.read_bounded`), without anchors, of plain values only (mappings with string keys, lists,
    strings, numbers, booleans, null: no `!!set`, date or binary), each number finite within ±1e18 and no string
    with a control or format character (`dare.results.check_values`: a bidi override would make a name read as
    another)."""
    from dare.results import check_values, printable, read_bounded

    try:
        data = load_yaml(read_bounded(path, MAX_YAML_BYTES, folder=path.parent).decode(), str(path))
    except ValueError as e:  # unreadable, a link out, not a regular file, too large, not UTF-8
        raise UserError(f"{path}: cannot read {what} ({e})") from None
    except yaml.YAMLError as e:  # one line, and none of the file's text (yaml's own message quotes it)
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(f"{path}: not valid YAML{where}: {printable(str(getattr(e, 'problem', None) or e), 100)}") from None
    except RecursionError:
        raise UserError(f"{path}: nested too deep") from None
    stack = [((), data)]
    while stack:
        where, value = stack.pop()
        field = ".".join(map(str, where)) or "(top level)"
        if isinstance(value, dict):
            bad = [k for k in value if not isinstance(k, str)]
            if bad:
                raise UserError(f"{path}: {field}: the key {shown_value(bad[0])} is not a string")
            stack += [((*where, k), v) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [((*where, i), v) for i, v in enumerate(value)]
        elif value is not None and not isinstance(value, (str, int, float)):
            raise UserError(f"{path}: {field}: a {type(value).__name__}; {what} hold mappings, lists, strings, "
                            "numbers, booleans and null only")
    try:
        check_values(data)
    except ValueError as e:
        raise UserError(f"{path}: {e}") from None
    return data


def _mapping(path: Path, key: str, value, needs: tuple[str, ...]) -> dict:
    """`value` when it is a mapping whose `needs` are strings; else one line naming the file and the key."""
    if not isinstance(value, dict) or not all(isinstance(value.get(k), str) and value[k].strip() for k in needs):
        raise UserError(f"{path}: {key}={shown_value(value)}: needs {' and '.join(needs)} (strings)")
    return value


def load_targets(path: str | Path) -> Targets:
    """Parse and check a targets.yaml; the error names the file and the entry."""
    path = Path(path)
    data = read_yaml(path, "targets")
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise UserError(f"{path}: a mapping of {sorted(KEYS)} expected; got a {type(data).__name__}")
    missing = KEYS - set(data)
    if missing:
        raise UserError(f"{path}: missing {sorted(missing)}")
    unknown = set(data) - KEYS - OPTIONAL_KEYS
    if unknown:
        raise UserError(f"{path}: unknown keys {sorted(unknown)}; a targets.yaml has {sorted(KEYS | OPTIONAL_KEYS)}")
    _mapping(path, "paper", data["paper"], ("arxiv", "table"))
    _mapping(path, "eval", data["eval"], ("split",))
    if not isinstance(data["base_model"], str) or not data["base_model"].strip():
        raise UserError(f"{path}: base_model={shown_value(data['base_model'])}: a model name")
    p = data["eval"]
    if not EVAL_KEYS - {"n_shot", "decoding"} <= set(p):
        raise UserError(f"{path}: eval needs {sorted(EVAL_KEYS - {'n_shot', 'decoding'})} (the paper's protocol)")
    unknown = set(p) - EVAL_KEYS
    if unknown:
        raise UserError(f"{path}: eval: unknown keys {sorted(unknown)}; eval has {sorted(EVAL_KEYS)}")
    for key, ok, why in (("block_length", _int(p["block_length"], 1) and p["block_length"] <= MAX_TOKENS,
                          f"a positive integer up to {MAX_TOKENS:,}"),
                         ("steps_per_token", _number(p["steps_per_token"]) and 0 < p["steps_per_token"] <= 1,
                          "a number in (0, 1]"),
                         ("temperature", _temperature(p["temperature"]), TEMPERATURE),
                         ("n_shot", _int(p.get("n_shot", 0), 0), "an integer >= 0"),
                         ("decoding", isinstance(p.get("decoding") or {}, dict), "a mapping of decoding fields")):
        if not ok:
            raise UserError(f"{path}: eval.{key}={shown_value(p.get(key))}: {why}")
    fields = set(FLAT)  # a result's decoding record names every setting flat (`threshold`, not `masked.threshold`)
    unknown = set((p.get("decoding") or {})) - fields
    if unknown:
        raise UserError(f"{path}: eval.decoding: unknown decoding fields {sorted(unknown)}")
    if not _number(data["tolerance"]) or not 0 <= data["tolerance"] <= 100:
        raise UserError(f"{path}: tolerance={shown_value(data['tolerance'])}: points, a number in [0, 100]")
    if not isinstance(data["targets"] or [], list):
        raise UserError(f"{path}: targets={shown_value(data['targets'])}: a list of rows expected")
    for i, row in enumerate(data["targets"] or []):
        if not isinstance(row, dict) or set(row) != TARGET_KEYS:
            raise UserError(f"{path}: targets[{i}]: needs exactly {sorted(TARGET_KEYS)}; got {shown_value(row)}")
        for key, ok, why in (("benchmark", isinstance(row["benchmark"], str), "a benchmark's name"),
                             ("gen_length", _int(row["gen_length"], 1) and row["gen_length"] <= MAX_TOKENS,
                              f"a positive integer up to {MAX_TOKENS:,}"),
                             ("value", _number(row["value"]) and 0 <= row["value"] <= 100, "a percentage in [0, 100]"),
                             ("config", isinstance(row["config"], str) and Path(row["config"]).name == row["config"]
                              and (path.parent / row["config"]).is_file(), "no such file beside it")):
            if not ok:
                raise UserError(f"{path}: targets[{i}].{key}={shown_value(row[key])}: {why}")
    published = check_published(path, data.get("published"))
    return Targets(path, data["paper"], data["base_model"], data["eval"], float(data["tolerance"]),
                   list(data["targets"] or []), tuple(published))


def beside(sweep_or_config: str | Path) -> Targets | None:
    """The targets.yaml in the same reproduction folder, if there is one."""
    path = Path(sweep_or_config).parent / "targets.yaml"
    return load_targets(path) if path.is_file() else None


# ---------------------------------------------------------------------------------------------
# Published numbers: every number printed for a baseline, each with its source
# ---------------------------------------------------------------------------------------------

PUBLISHED_FILE = "published.yaml"
PUBLISHED_FILE_KEYS = {"paper", "published", "missing"}
ENTRY_REQUIRED = ("model", "benchmark", "value", "source")
PROTOCOL = ("gen_length", "steps", "block_length", "n_shot", "temperature")
ENTRY_KEYS = (*ENTRY_REQUIRED, *PROTOCOL, "init", "note")
OTHER_BENCHMARKS = {
    "humaneval_plus": "HumanEval+ (EvalPlus)", "mbpp_plus": "MBPP+ (EvalPlus)",
    "bigcodebench_complete_full": "BigCodeBench-Complete, full", "bigcodebench_complete_hard": "BigCodeBench-Complete, hard",
    "bigcodebench_instruct_full": "BigCodeBench-Instruct, full", "bigcodebench_instruct_hard": "BigCodeBench-Instruct, hard",
    "gpqa": "GPQA", "ifeval": "IFEval", "arena_hard": "Arena-Hard", "aime24": "AIME 2024",
    "livecodebench_v2": "LiveCodeBench v2", "sudoku_spg": "Sudoku on SPG's own split (3-shot), not the registry's d1 split",
    "kto_mix_14k_winrate": "adjusted win rate against the base model on kto-mix-14k prompts (LLM judge)",
    "ultrafeedback_binary_winrate": "adjusted win rate against the base model on UltraFeedback-Binary prompts (LLM judge)",
    "amc": "AMC (American Mathematics Competitions problems)", "minerva_math": "Minerva Math"}
"""Benchmarks papers report that the task registry (`dare.data.TASKS`) lacks: their numbers are shown, never
compared with ours."""


def _shown(path: Path, i: int, key: str, value, why: str) -> UserError:
    return UserError(f"{path}: published[{i}].{key}={shown_value(value)}: {why}")


MAX_TOKENS = 1_000_000
"""The longest generation length, block or step count a protocol states (a paper's are a few thousand)."""
TEMPERATURE = "a number >= 0 and at most 100, or the list a best-of report chose from"


def _int(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _temperature(t) -> bool:
    """A temperature as a protocol states it: a number in [0, 100], or a non-empty list of them (best of)."""
    return all(_number(x) and 0 <= x <= 100 for x in (t if isinstance(t, list) else [t])) and t != []


def check_published(path: Path, entries) -> list[dict]:
    """The `published:` entries of `path`, checked; the error is one line naming the file, the entry's index,
    the field and its value."""
    from dare.app.baselines import names
    from dare.data import TASKS

    if entries is None:
        return []
    if not isinstance(entries, list):
        raise UserError(f"{path}: published={shown_value(entries)}: a list of entries expected")
    seen: dict[tuple, int] = {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise UserError(f"{path}: published[{i}]={shown_value(e)}: a mapping with {list(ENTRY_REQUIRED)} expected")
        for key in e:
            if key not in ENTRY_KEYS:
                raise _shown(path, i, key, e[key], f"unknown field (an entry has {', '.join(ENTRY_KEYS)})")
        for key in ENTRY_REQUIRED:
            if key not in e or e[key] is None:
                why = "every number carries its source" if key == "source" else "every entry has one"
                raise UserError(f"{path}: published[{i}].{key}: missing ({why})")
        for key in ("model", "benchmark", "source", "init", "note"):
            if key in e and (not isinstance(e[key], str) or not e[key].strip()):
                raise _shown(path, i, key, e[key], "a non-empty string")
        if e["benchmark"] not in TASKS and e["benchmark"] not in OTHER_BENCHMARKS:
            raise _shown(path, i, "benchmark", e["benchmark"], "not a task of dare.data.TASKS nor one of "
                         "dare.app.targets.OTHER_BENCHMARKS")
        if not _number(e["value"]) or not 0 <= e["value"] <= 100:
            raise _shown(path, i, "value", e["value"], "a percentage in [0, 100], as printed")
        for key in ("gen_length", "steps", "block_length"):
            if key in e and not (_int(e[key], 1) and e[key] <= MAX_TOKENS):
                raise _shown(path, i, key, e[key], f"a positive integer up to {MAX_TOKENS:,}")
        if "n_shot" in e and not _int(e["n_shot"], 0):
            raise _shown(path, i, "n_shot", e["n_shot"], "an integer >= 0")
        if "temperature" in e and not _temperature(e["temperature"]):
            raise _shown(path, i, "temperature", e["temperature"], TEMPERATURE)
        if "init" in e and e["init"] not in names():
            raise _shown(path, i, "init", e["init"], f"not a baseline ({', '.join(names())})")
        key = (e["model"], e["benchmark"], e.get("init"), e["source"], e.get("note"), *(repr(e.get(k)) for k in PROTOCOL))
        if key in seen:
            raise UserError(f"{path}: published[{i}]: the same number as published[{seen[key]}] (model, benchmark, "
                            f"protocol, init, source and note)")
        seen[key] = i
    return [dict(e) for e in entries]


@dataclass(frozen=True)
class Published:
    """A baseline's published numbers: `numbers` are entries as in `published:` (the `targets:` rows first,
    made into entries with the file's `eval:` protocol), with `split` and, for a target, the `decoding`
    fields its protocol fixes."""
    baseline: str
    path: Path
    paper: dict
    numbers: tuple[dict, ...]
    missing: str | None = None


def target_entries(t: Targets) -> list[dict]:
    """`t`'s `targets:` rows as published entries: the paper's protocol (`eval:`) stated in full."""
    p = t.protocol
    return [{"model": t.base_model, "benchmark": row["benchmark"], "value": row["value"], "source": t.source(),
             "gen_length": row["gen_length"], "steps": round(row["gen_length"] * p["steps_per_token"]),
             "block_length": p["block_length"], "n_shot": p.get("n_shot", 0), "temperature": p["temperature"],
             "split": p["split"], "decoding": dict(p.get("decoding") or {}), "target": True} for row in t.rows]


def load_published(path: str | Path) -> Published:
    """A baseline's published numbers from its `targets.yaml` or `published.yaml` (the folder names the
    baseline); the error names the file, the entry and the field."""
    from dare.app.baselines import names

    path = Path(path)
    baseline = path.parent.name
    if baseline not in names():
        raise UserError(f"{path}: unknown baseline {baseline!r} (the folder names it; baselines: {', '.join(names())})")
    if path.name == "targets.yaml":
        t = load_targets(path)
        return Published(baseline, path, t.paper, tuple(target_entries(t) + [{**e, "split": "test"} for e in t.published]))
    if path.name != PUBLISHED_FILE:
        raise UserError(f"{path}: published numbers live in targets.yaml or {PUBLISHED_FILE}")
    data = read_yaml(path, "published numbers")
    if not isinstance(data, dict):
        raise UserError(f"{path}: a mapping of {sorted(PUBLISHED_FILE_KEYS)} expected; got a {type(data).__name__}")
    unknown = set(data) - PUBLISHED_FILE_KEYS
    if unknown:
        raise UserError(f"{path}: unknown keys {sorted(unknown)}; a {PUBLISHED_FILE} has {sorted(PUBLISHED_FILE_KEYS)}")
    if not isinstance(data.get("paper"), dict) or not isinstance(data["paper"].get("arxiv"), str):
        raise UserError(f"{path}: paper={shown_value(data.get('paper'))}: needs arxiv")
    entries, missing = data.get("published"), data.get("missing")
    if bool(entries) == bool(missing):
        raise UserError(f"{path}: either published (the numbers) or missing (why the sources give none), not "
                        f"{'both' if entries else 'neither'}")
    if missing is not None and not isinstance(missing, str):
        raise UserError(f"{path}: missing={shown_value(missing)}: a sentence saying why no number is written")
    numbers = [{**e, "split": "test"} for e in check_published(path, entries)]
    return Published(baseline, path, data["paper"], tuple(numbers), missing)


def published_files(root: str | Path) -> dict[str, Path | None]:
    """Each baseline's file of published numbers under the reproductions folder `root` (None: it has none);
    a baseline with both a targets.yaml and a published.yaml is refused (one file per baseline)."""
    from dare.app.baselines import names

    out = {}
    for name in names():
        files = [f for f in (Path(root) / name / "targets.yaml", Path(root) / name / PUBLISHED_FILE) if f.is_file()]
        if len(files) > 1:
            raise UserError(f"{files[1]}: {name} has a targets.yaml; its numbers go under its `published:`")
        out[name] = files[0] if files else None
    return out


def comparable(entry: dict) -> bool:
    """The number's protocol is stated in full (generation length, block length, steps) on a registry task."""
    from dare.data import TASKS

    return entry["benchmark"] in TASKS and all(entry.get(k) is not None for k in ("gen_length", "block_length", "steps"))


def matches(entry: dict, benchmark: dict, decoding: dict) -> bool:
    """A result (its benchmark record and its decoding, flat: `decoding.extra` merged in) was evaluated on the
    number's benchmark with its protocol: split, shots, lengths, steps, temperature and the decoding fields
    a target's protocol fixes. Never for a number whose protocol is not stated in full (`comparable`)."""
    if not comparable(entry):
        return False
    t = entry.get("temperature")
    temperatures = None if t is None else [float(x) for x in (t if isinstance(t, list) else [t])]
    return (benchmark.get("name") == entry["benchmark"] and benchmark.get("split") == entry.get("split", "test")
            and benchmark.get("n_shot", 0) == entry.get("n_shot", 0)
            and all(decoding.get(k) == entry[k] for k in ("gen_length", "block_length", "steps"))
            and (temperatures is None or float(decoding.get("temperature") or 0.0) in temperatures)
            and all(decoding.get(k) == v for k, v in (entry.get("decoding") or {}).items()))


def protocol_text(entry: dict) -> str:
    """The number's protocol in one readable string, `?` for what the source does not state:
    `gen 256 / block 32 / 128 steps, 0-shot, T=0`."""
    g, b, s = (entry.get(k) for k in ("gen_length", "block_length", "steps"))
    if g is None and b is None and s is None:
        text = "gen / block / steps not stated"
    else:
        text = f"gen {g or '?'} / block {b or '?'} / {s or '?'} steps"
    text += f", {entry.get('n_shot', 0)}-shot"
    t = entry.get("temperature")
    if t is not None:
        text += f", T∈{{{', '.join(f'{x:g}' for x in t)}}}" if isinstance(t, list) else f", T={t:g}"
    extra = ", ".join(f"{k}={v}" for k, v in sorted((entry.get("decoding") or {}).items()))
    return text + (f", {extra}" if extra else "")
