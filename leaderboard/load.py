"""Loading and shaping results for the leaderboard. Reads JSON only (no torch): a view over
validated result files, never a calculator. Means and spreads across seeds come from each file's
stored metric values; nothing is scored here.

Sources: every *.json under leaderboard/results/ (committed) plus result_*.json in the run folders
given with `dare leaderboard --runs` or $DARE_LEADERBOARD_RUNS. Benchmark reports
(`"kind": "bench.<what>"`, written by `dare bench`) are read separately for the speed view.
Those folders may be shared or downloaded ones: every file is read through `dare.results`' guarded
readers (regular files under a size cap, bounded nesting, finite numbers, no control characters), and
a result's config and samples only from inside its own folder.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path
from urllib.parse import quote

from dare.app.bench_gpu import at_most  # torch-free to import, like the registry
from dare.models.registry import ATTENTION  # torch-free
from dare.results import (MAX_LOG_BYTES, MAX_NUMBER, ROLLOUT_BENCHMARK, Hardware, Result, load_json, load_results,
                          parse_json, printable, read_bounded, unsafe_char)

HERE = Path(__file__).resolve().parent
RUNS_ENV = "DARE_LEADERBOARD_RUNS"
COMMITTED_ENV = "DARE_LEADERBOARD_RESULTS"  # another committed-results folder (tests, forks)


def committed() -> Path:
    return Path(os.environ.get(COMMITTED_ENV) or HERE / "results")
BASE_INITS = (None, "scratch", "pretrained")
TOLERANCE = 0.02  # a reproduction within 2 points of the paper (metric units are fractions)


def run_dirs_from_env() -> list[Path]:
    return [Path(p) for p in os.environ.get(RUNS_ENV, "").split(os.pathsep) if p.strip()]


def _bench(path: Path) -> dict | None:
    """The `dare bench` report in `path` (`"kind": "bench.<what>"`), None for any other file."""
    try:
        data = load_json(path)
    except ValueError:
        return None
    kind = data.get("kind") if isinstance(data, dict) else None
    return data if isinstance(kind, str) and kind.startswith("bench.") else None


def _dict(value) -> dict:
    """`value` when it is a dict, else {}: a report's parts are read without trusting their shape."""
    return value if isinstance(value, dict) else {}


def _number(value) -> bool:
    """A number (not a bool) that is finite and within ±`MAX_NUMBER`."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= MAX_NUMBER


def load_all(extra_runs: list[Path] | None = None) -> tuple[list[tuple[Path, Result]], list[tuple[Path, str]]]:
    """(valid results, one per run_id; [(file, reason)] for every invalid file). Never raises."""
    valid, invalid = load_results(committed())
    for d in (extra_runs if extra_runs is not None else run_dirs_from_env()):
        v, i = load_results(d, pattern="**/result_*.json")
        valid += v
        invalid += i
    invalid = [(p, why) for p, why in invalid if _bench(p) is None]  # bench reports are not results
    kept: dict[tuple, int] = {}  # result_key -> its place in `unique`
    unique = []
    _FOLDERS.clear()
    _FIRST.clear()
    for path, r in valid:  # the same run can be both committed and in a run folder
        key = result_key(r)
        _FOLDERS.setdefault(key, set()).add(path.parent.parent)
        _FIRST[key] = min(_FIRST.get(key, r.created_at), r.created_at)
        if key not in kept:
            kept[key] = len(unique)
            unique.append((path, r))
        elif r.training and r.training.checkpoint and not (unique[kept[key]][1].training or r.training).checkpoint:
            unique[kept[key]] = (path, r)  # the copy evaluated again by code that names its checkpoint
    return unique, invalid


_FOLDERS: dict[tuple, set[Path]] = {}  # result_key -> every results folder holding a copy (`load_all`; `own_start`)
_FIRST: dict[tuple, str] = {}  # result_key -> when its first copy was made (`load_all`; `own_start`)


def folders(path: Path, r: Result) -> set[Path]:
    """The results folders that hold a copy of `r` (one copy is kept, `path`; a start is published in every
    comparison that trained from it)."""
    return _FOLDERS.get(result_key(r), set()) | {Path(path).parent.parent}


def result_key(r: Result) -> tuple[str, str | None]:
    """What makes two result files one: the run id and the evaluation (the samples' hash). A config trained
    again (a start retrained on another day) has the same run id and other weights, so other samples: both
    are kept, where keeping one per run id would show one start's score beside runs trained from the other."""
    a = r.artifacts
    return r.run_id, a.samples_total_sha256 or a.samples_sha256


MAX_BENCH_BYTES = 16 * 2**20
"""The most bytes of `dare bench` reports read in all (a report is tens of KiB; ten hostile 4 MiB ones made 600,000
rows, 48 s and 830 MB): the reports past it, in path order, are left out."""
MAX_BENCH_ROWS = 1000
"""The most rows a Speed table makes from bench reports (`training_speed_rows`, `gpu_target_rows`)."""


def load_bench(extra_runs: list[Path] | None = None) -> list[tuple[Path, dict]]:
    """`dare bench` reports (train: packing, loss memory, RL step) from the same sources, `MAX_BENCH_BYTES` in
    all."""
    out, left = [], MAX_BENCH_BYTES
    roots = [committed(), *(extra_runs if extra_runs is not None else run_dirs_from_env())]
    for root in roots:
        for path in sorted(Path(root).glob("**/*.json")) if Path(root).is_dir() else []:
            try:
                size = path.stat().st_size
            except OSError:  # a dangling link
                continue
            report = _bench(path) if size <= left else None
            if report:
                out.append((path, report))
                left -= size
    return out


# ---------------------------------------------------------------------------------------------
# Labels and filters
# ---------------------------------------------------------------------------------------------


def csv_safe(value):
    """A text cell as a spreadsheet shows it, not runs it: a leading `=`, `+`, `-`, `@`, tab or carriage
    return (a formula) gets a `'` in front, unless the text is a number (`-0.5`, `+1.2`)."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        try:
            float(value)
            return value
        except ValueError:
            return "'" + value
    return value


def rollout_benchmark(r: Result) -> bool:
    """`r` benchmarks the rollout (`dare bench rollout`: one decoding strategy of one checkpoint, its speed beside its
    score), not a training method: the Speed tab's, kept out of the views that compare methods."""
    return (r.method.variant or "").startswith(ROLLOUT_BENCHMARK)


def main_metric(result: Result) -> str:
    return result.metrics[0].name


def method_label(r: Result) -> str:
    return r.method.baseline if r.method.init in BASE_INITS else f"{r.method.baseline} (from {r.method.init})"


def benchmark_label(r: Result) -> str:
    """A column per benchmark, engine and the whole decoding: lengths, steps, temperature, and every setting that
    differs from the family's default decoding (the sampler when it is not the family's own, remasking, the
    commit rule and its parameters, the cache, ...: `decoding.extra`). Scores under different decodings, or from
    OpenCompass' prompts and our embedded ones, never share a column; the default decoding of every family shares
    one, so families can be compared in it."""
    d = r.decoding
    engine = " (OpenCompass)" if r.benchmark.version.startswith("opencompass") else ""
    parts = [] if d.sampler == DEFAULT_SAMPLER.get(ATTENTION.get(r.model.family)) else [f"sampler={d.sampler}"]
    parts += [] if d.remasking == "low_confidence" else [f"remasking={d.remasking}"]
    parts += [] if d.threshold is None else [f"threshold={d.threshold:g}"]
    parts += [] if not d.cfg_scale else [f"cfg={d.cfg_scale:g}"]
    parts += [f"{k}={v}" for k, v in sorted(d.extra.items())]
    return (f"{r.benchmark.name}{engine} [{d.gen_length}/{d.block_length}/{d.steps}, T={d.temperature:g}"
            + "".join(f", {p}" for p in parts) + "]")


DEFAULT_SAMPLER = {"bidirectional": "masked", "block_causal": "block"}
"""The sampler `sampler=auto` picks for a family's attention kind (`dare.models.registry.ATTENTION`)."""


def options(items) -> dict[str, list]:
    rs = [r for _, r in items]
    return {"family": sorted({r.model.family for r in rs}), "model": sorted({r.model.name for r in rs}),
            "method": sorted({method_label(r) for r in rs}), "benchmark": sorted({r.benchmark.name for r in rs}),
            "gen_length": sorted({r.decoding.gen_length for r in rs})}


def apply_filters(items, family=(), model=(), method=(), benchmark=(), gen_length=()):
    """Keep the results matching every non-empty selection."""
    keep = []
    for p, r in items:
        if family and r.model.family not in family or model and r.model.name not in model:
            continue
        if method and method_label(r) not in method or benchmark and r.benchmark.name not in benchmark:
            continue
        if gen_length and r.decoding.gen_length not in gen_length:
            continue
        keep.append((p, r))
    return keep


# ---------------------------------------------------------------------------------------------
# Views
# ---------------------------------------------------------------------------------------------


def stats(values: list[float]) -> tuple[float, float, int]:
    """(mean, sample std (0 for one seed), n) of per-seed values."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std, n


def value(r: Result, metric: str | None = None) -> float:
    """`r`'s score on `metric` (default: its main metric, the first it records)."""
    return r.metric(metric or main_metric(r)).value


def distinct_runs(results: list[Result]) -> list[Result]:
    """`results` without the copies of one run: the same run published in two folders (under two run ids) is the
    same training (seed, config hash, checkpoint) evaluated into the same samples (`artifacts.samples_sha256`, or
    the whole file's hash for an excerpt), and counts once. Identical samples alone make no copy: two seeds (or two
    methods) that answer every prompt alike are two runs."""
    seen, out = set(), []
    for r in results:
        a, t = r.artifacts, r.training
        training = (t.seed, t.config_hash, t.checkpoint) if t else None
        key = (training, a.samples_total_sha256 or a.samples_sha256, r.benchmark.name, r.model.name)
        key = key if key[1] else r.run_id
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def seed_groups(results: list[Result], copies: bool = False) -> list[list[Result]]:
    """The distinct runs (`distinct_runs`; with `copies`, every result) of `results` grouped by distinct seed: a
    model, a recipe with its start (the row) and a seed; the same seed run again is one group."""
    runs: dict[tuple, list[Result]] = defaultdict(list)
    for r in (results if copies else distinct_runs(results)):
        runs[(r.model.name, recipe(r), r.training.seed if r.training else r.run_id)].append(r)
    return list(runs.values())


def per_seed(results: list[Result], metric: str | None = None) -> list[float]:
    """One value per distinct seed (`seed_groups`): the mean of its distinct runs' `metric` (default: the main
    metric). Means, standard deviations and `n` are taken over these, never over runs."""
    return [sum(value(r, metric) for r in runs) / len(runs) for runs in seed_groups(results)]


def environment(r: Result) -> tuple[str, str | None]:
    """(hardware class, lock hash): runs that differ in either can differ in float rounding."""
    lock = r.provenance.lock
    return r.provenance.hardware.hardware_class(), lock.sha256 if lock else None


def mixed(results: list[Result]) -> bool:
    """The results were made on different hardware classes or from different lock files."""
    return len({environment(r) for r in results}) > 1


MIXED = " ⚠"  # marks a mean or a delta over runs from different hardware or environments


def format_cell(results: list[Result]) -> str:
    mean, std, n = stats(per_seed(results))
    count = "1 seed" if n == 1 else f"{n} seeds"
    runs = len(distinct_runs(results))
    count += f", {runs} runs" if runs > n else ""  # reruns of a seed are said, never counted as seeds
    text = f"{100 * mean:.1f} ({count})" if n == 1 else f"{100 * mean:.1f} ± {100 * std:.1f} ({count})"
    return text + (MIXED if mixed(results) else "")


# ---------------------------------------------------------------------------------------------
# Rows: one per training recipe; only the seeds of one recipe are pooled
# ---------------------------------------------------------------------------------------------


def recipe(r: Result) -> tuple:
    """What a leaderboard row pools over: the method, what it started from, and the training config
    without its seed (`training.recipe_hash`; results of schema 1 have only the seed's config hash,
    so each of their seeds is a row of its own)."""
    t = r.training
    if t is None:
        return (method_label(r), None, None)
    return (method_label(r), t.init_config_hash, t.recipe_hash or t.config_hash)


def _flat(config: dict | None, prefix: str = "") -> dict:
    out = {}
    for k, v in (config or {}).items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def row_labels(results: list[Result], within=None) -> dict[tuple, str]:
    """A readable label per recipe: the method name alone when it has one recipe here, else the
    method with the settings that tell its recipes apart (`sft (steps=40)`). With `within` (a key of a
    result, e.g. its model), only settings that tell apart recipes sharing that key count, and every
    recipe of the method is labelled by them: the same recipe gets the same label on every model."""
    within = within or (lambda r: None)
    by_method: dict[str, dict[tuple, Result]] = defaultdict(dict)
    for r in results:
        by_method[method_label(r)].setdefault(recipe(r), r)
    labels = {}
    for method, recipes in by_method.items():
        groups: dict = defaultdict(list)
        for key, r in recipes.items():
            groups[within(r)].append(key)
        if all(len(keys) == 1 for keys in groups.values()):
            labels.update({key: method for key in recipes})
            continue
        flats = {key: _flat(r.training.config if r.training else None) for key, r in recipes.items()}
        keys = sorted({k for f in flats.values() for k in f} - {"run.seed"})
        differ = [k for k in keys if any(len({repr(flats[x].get(k)) for x in group}) > 1
                                         for group in groups.values())]
        leaves = [k.rsplit(".", 1)[-1] for k in differ]
        short = {k: (leaf if leaves.count(leaf) == 1 else k) for k, leaf in zip(differ, leaves)}
        for key, r in recipes.items():
            parts = [f"{short[k]}={flats[key].get(k)}" for k in differ]
            if not parts:  # same config: they differ in their start, or are schema-1 results
                t = r.training
                parts = [f"from {t.init_config_hash[:8]}" if t and t.init_config_hash else
                         f"seed {t.seed}" if t and not t.recipe_hash else f"run {r.run_id[-17:]}"]
            labels[key] = f"{method} ({', '.join(parts)})"
    return labels


def _cells(results, row_key, col_key):
    cells: dict[tuple[str, str], list[Result]] = defaultdict(list)
    rows, cols = [], []
    for r in results:
        a, b = row_key(r), col_key(r)
        cells[(a, b)].append(r)
        rows += [a] if a not in rows else []
        cols += [b] if b not in cols else []
    return cells, rows, cols


def base_method(results: list[Result]) -> str | None:
    """The row the others are compared with: the model before post-training (an untrained base,
    or the run trained from scratch that the others start from)."""
    labels = row_labels(results)
    for r in results:
        if r.method.init in BASE_INITS:
            return labels[recipe(r)]
    return None


def signed(points: float) -> str:
    return f"{points:+.1f}"


def own_start(item: tuple[Path, Result], items) -> list[Result]:
    """The results (of `items`) of the checkpoint `item`'s run trained from, on its task and decoding: the start
    whose `training.checkpoint` is its `training.init_checkpoint`; for results recorded before those fields, the
    start of the same config published in the same results folder (a sweep's collect publishes its start beside
    its runs), else those evaluated before it was (a start evaluated later cannot be the one it trained from) and,
    of those, the ones made on its hardware class and lock when there are such (a guess the record cannot
    check, taken only where it says nothing), else every result of that config. [] for a result that started
    from no run of ours."""
    path, r = item
    t = r.training
    if t is None or not t.init_config_hash:
        return []
    same = [(p, s) for p, s in items if s.training and s.training.config_hash == t.init_config_hash
            and s.model.name == r.model.name and benchmark_label(s) == benchmark_label(r)]
    exact = [s for _, s in same if t.init_checkpoint and s.training.checkpoint == t.init_checkpoint]
    if exact or t.init_checkpoint and any(s.training.checkpoint for _, s in same):
        return exact
    beside = [s for p, s in same if folders(p, s) & folders(path, r)]
    before = [s for _, s in same if _FIRST.get(result_key(s), s.created_at) <= r.created_at]
    here = [s for s in before if environment(s) == environment(r)]
    return beside or here or before or [s for _, s in same]


def gain_over_start(cell: list[tuple[Path, Result]], items) -> tuple[float, list[Result]] | None:
    """(mean over the cell's seeds minus the mean of the starts its runs trained from (`own_start`), those
    starts), or None when no start of theirs is in `items`."""
    starts = {result_key(s): s for item in cell for s in own_start(item, items)}
    if not starts:
        return None
    return stats(per_seed([r for _, r in cell]))[0] - stats(per_seed(list(starts.values())))[0], list(starts.values())


def delta_to_start(cell: list[tuple[Path, Result]], start: list[Result] | None, pool) -> str:
    """The signed difference in points of a cell's mean to its start: each run against the start it trained from
    (`gain_over_start`, looked up in `pool`), or, for runs trained from no run of ours (a base model), against
    `start` (the start row's results of the cell's column); '' when there is neither. ⚠ over mixed machines."""
    mine = [r for _, r in cell]
    gain = gain_over_start(cell, pool)
    ours = any(r.training and r.training.init_config_hash for r in mine)  # else trained from a base model
    if gain is None and not ours and start:
        gain = stats(per_seed(mine))[0] - stats(per_seed(start))[0], start
    return "" if gain is None else signed(100 * gain[0]) + (MIXED if mixed(mine + gain[1]) else "")


def table(items, base: str | None = None, pool=None) -> tuple[list[str], list[dict], list[dict]]:
    """Recipes of `items` ((path, result) pairs) as rows (the base first), benchmarks as columns: (columns,
    `mean ± std (n seeds)` rows, signed delta rows in points against the `base` row). Against the start row
    (`base_method`), each run is compared with the start it trained from (`delta_to_start`, the starts looked up
    in `pool`, default `items`), as in the Families tab: a start trained again pools its reruns in its row, and
    the runs of each are compared with their own. A cell or delta over runs from different hardware classes or
    lock files carries ⚠."""
    results = [r for _, r in items]
    labels = row_labels(results)
    cells, rows_, benchmarks = _cells(results, lambda r: labels[recipe(r)], benchmark_label)
    paired, _, _ = _cells(items, lambda pr: labels[recipe(pr[1])], lambda pr: benchmark_label(pr[1]))
    start = base_method(results)
    if base in rows_:
        rows_ = [base] + [m for m in rows_ if m != base]
    rows, deltas = [], []
    for m in rows_:
        rows.append({"method": m, **{b: format_cell(cells[(m, b)]) if cells.get((m, b)) else "" for b in benchmarks}})
        if base and m != base:
            d = {"method": m}
            for b in benchmarks:
                mine, theirs = cells.get((m, b)), cells.get((base, b))
                if mine and base == start:
                    d[b] = delta_to_start(paired[(m, b)], theirs, items if pool is None else pool)
                elif mine and theirs:
                    diff = stats(per_seed(mine))[0] - stats(per_seed(theirs))[0]
                    d[b] = signed(100 * diff) + (MIXED if mixed(mine + theirs) else "")
                else:
                    d[b] = ""
            deltas.append(d)
    return benchmarks, rows, deltas


def long_rows(results: list[Result]) -> list[dict]:
    """One row per (recipe, benchmark) with numeric columns, in points: mean, std, n, the 95% interval's ends
    (`interval`; none for one seed), and whether the runs mix machines (for CSV downloads, charts and sorting)."""
    labels = row_labels(results)
    cells, _, _ = _cells(results, lambda r: labels[recipe(r)], benchmark_label)
    out = []
    for (m, b), rs in cells.items():
        seeds = per_seed(rs)
        mean, std, n = stats(seeds)
        _, low, high, _ = interval(seeds)
        out.append({"method": m, "benchmark": b, "mean": round(100 * mean, 2), "std": round(100 * std, 2), "n": n,
                    "low": None if low is None else round(100 * low, 2),
                    "high": None if high is None else round(100 * high, 2),
                    "hardware": "; ".join(sorted({environment(r)[0] for r in rs})), "mixed": mixed(rs)})
    return out


def family_method_rows(items) -> list[dict]:
    """Mean of each recipe on each family and benchmark column (`benchmark_label`, so decodings never pool), in
    points, over distinct seeds (`per_seed`), for the family x method heatmap: one cell per recipe, never pooled
    (its label as the Families tab's: `row_labels` within a model, the same recipe the same label on every
    family), and per model where a family has several on the column (`where`: `family: model`, else the
    family)."""
    results = [r for _, r in items]
    groups: dict[tuple, list[Result]] = defaultdict(list)
    for column in sorted({benchmark_label(r) for r in results}):
        mine = [r for r in results if benchmark_label(r) == column]
        labels = row_labels(mine, within=lambda r: r.model.name)
        models = defaultdict(set)
        for r in mine:
            models[r.model.family].add(r.model.name)
        for r in mine:
            f, model = r.model.family, r.model.name
            groups[(f, model, f"{f}: {model}" if len(models[f]) > 1 else f, labels[recipe(r)], column)].append(r)
    out = []
    for (f, model, where, label, b), rs in sorted(groups.items()):
        seeds = per_seed(rs)
        out.append({"family": f, "model": model, "where": where, "method": label, "benchmark": b,
                    "mean": round(100 * stats(seeds)[0], 1), "n": len(seeds)})
    return out


def family_table(items, benchmark: str, pool=None) -> tuple[list[str], list[dict], list[dict]]:
    """The cross-family comparison on one benchmark column (`benchmark_label`: task and decoding):
    (families, one row per recipe label with each family's `mean ± std (n seeds)` cell and its
    signed delta in points to that model's own start (`base_method`: the run the others were trained
    from), one row per run with a `?run=<id>` link to its detail). A family with several models on
    the benchmark gets a row per model (`label [model]`). Cells and deltas over runs from different
    machines carry ⚠. The starts are looked up in `pool` (default `items`): a filter that hides the
    start rows keeps the differences."""
    column = [(p, r) for p, r in items if benchmark_label(r) == benchmark]
    starts_pool = column if pool is None else [(p, r) for p, r in pool if benchmark_label(r) == benchmark]
    results = [r for _, r in column]
    families = sorted({r.model.family for r in results})
    cells: dict[tuple[str, str], list[Result]] = defaultdict(list)
    paired: dict[tuple[str, str], list[tuple[Path, Result]]] = defaultdict(list)  # the same cells, with paths
    start_of: dict[tuple[str, str], str | None] = {}  # (row label, family) -> the label of its start
    starts, order = [], []
    labels = row_labels(results, within=lambda r: r.model.name)  # one label per recipe across the families
    for family in families:
        models = sorted({r.model.name for r in results if r.model.family == family})
        for model in models:
            mine = [(p, r) for p, r in column if r.model.family == family and r.model.name == model]
            name = (lambda label: f"{label} [{model}]") if len(models) > 1 else (lambda label: label)
            base = base_method([r for _, r in mine])
            starts += [name(base)] if base and name(base) not in starts else []
            for p, r in mine:
                label = name(labels[recipe(r)])
                cells[(label, family)].append(r)
                paired[(label, family)].append((p, r))
                start_of[(label, family)] = name(base) if base else None
                order += [label] if label not in order else []
    order = starts + [m for m in order if m not in starts]
    rows = []
    for label in order:
        row = {"method": label}
        for family in families:
            mine = cells.get((label, family))
            row[family] = format_cell(mine) if mine else ""
            row[f"{family} Δ"] = ""
            if not mine or label in starts:
                continue
            row[f"{family} Δ"] = delta_to_start(paired[(label, family)],  # each run against the start it trained from
                                                cells.get((start_of.get((label, family)), family)), starts_pool)
        rows.append(row)
    runs = [{"family": f, "method": label, "seed": r.training.seed if r.training else None,
             "value": round(100 * value(r), 2), "model": r.model.name, "run_id": r.run_id,
             "detail": f"?run={quote(r.run_id, safe='')}"}
            for label in order for f in families for r in cells.get((label, f), [])]
    return families, rows, runs


def method_rows(items, method: str) -> list[dict]:
    """One method across models and families: rows (model, family), columns benchmarks."""
    results = [r for _, r in items if method_label(r) == method]
    labels = row_labels(results)
    cells, rows, benchmarks = _cells(results, lambda r: (r.model.name, r.model.family, labels[recipe(r)]),
                                     benchmark_label)
    return [{"model": m, "family": f, "recipe": label,
             **{b: format_cell(cells[((m, f, label), b)]) if cells.get(((m, f, label), b)) else "" for b in benchmarks}}
            for m, f, label in rows]


def reproduction_rows(items) -> list[dict]:
    """Results that carry the paper's number: ours (mean over seeds) vs the paper, with the delta.
    `reproduced` only when the decoding matches the paper's protocol, the whole test split was
    evaluated, and ours is within 2 points of (or above) the paper."""
    groups: dict[tuple, list[Result]] = defaultdict(list)
    referenced = [r for _, r in items if r.reference is not None]
    labels = row_labels(referenced)
    for r in referenced:
        groups[(labels[recipe(r)], r.model.name, benchmark_label(r))].append(r)
    out = []
    for (method, model, bench), rs in groups.items():
        mean, std, n = stats(per_seed(rs))
        ref = rs[0].reference
        protocol = bool(ref.same_decoding) and all(r.benchmark.n_samples.effective == r.benchmark.n_samples.original
                                                   for r in rs)
        delta = mean - ref.value
        status = ("reproduced" if delta >= -TOLERANCE else "below the paper") if protocol else "protocol differs"
        out.append({"method": method, "model": model, "benchmark": bench, "ours": round(100 * mean, 1),
                    "seeds": n, "paper": round(100 * ref.value, 1), "delta": round(100 * delta, 1),
                    "status": ("✓ " if status == "reproduced" else "") + status, "source": ref.source})
    return out


def rollout_speed_rows(items) -> list[dict]:
    """Decoding throughput recorded with each evaluation (tokens/s, NFE, tokens per forward), one row per run;
    its decoding is its column's (`benchmark_label` without the task's name: every setting that differs)."""
    out = []
    for _, r in items:
        t = r.throughput
        if t.eval_tokens_per_s is None and t.tokens_per_forward is None:
            continue
        out.append({"model": r.model.name, "decoding": benchmark_label(r).removeprefix(r.benchmark.name).strip(),
                    "method": method_label(r), "benchmark": r.benchmark.name,
                    "accuracy": round(100 * value(r), 1), "tokens/s": _round(t.eval_tokens_per_s),
                    "NFE/sample": _round(t.nfe_per_sample), "tokens/forward": _round(t.tokens_per_forward, 2),
                    "hardware": environment(r)[0], "run_id": r.run_id})
    return out


def _median(values: list[float]) -> float | None:
    values = sorted(v for v in values if _number(v))
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def decoding_points(rows: list[dict]) -> list[dict]:
    """One point per model, decoding and machine (`rollout_speed_rows`' rows grouped): the median tokens/s and
    accuracy of its runs (reruns, seeds and the methods evaluated with it: their speeds differ with the machine's
    load, up to 6x), with the slowest and fastest run and the lowest and highest accuracy as its spread, and the
    median NFE and tokens per forward."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["model"], row["decoding"], row["hardware"])].append(row)
    out = []
    for (model, decoding, hardware), rs in groups.items():
        speeds = [r["tokens/s"] for r in rs if _number(r["tokens/s"])]
        scores = [r["accuracy"] for r in rs]
        out.append({"model": model, "decoding": decoding, "runs": len(rs), "tokens/s": _round(_median(speeds)),
                    "slowest": min(speeds, default=None), "fastest": max(speeds, default=None),
                    "accuracy": round(_median(scores), 1), "lowest": min(scores), "highest": max(scores),
                    "NFE/sample": _round(_median([r["NFE/sample"] for r in rs])),
                    "tokens/forward": _round(_median([r["tokens/forward"] for r in rs]), 2), "hardware": hardware})
    return out


def _round(x: float | None, digits: int = 1) -> float | None:
    """Speed numbers to a sensible precision: 3 significant digits, at most `digits` decimals."""
    if x is None:
        return None
    if not x:  # a zero has no magnitude (log10 fails)
        return 0.0
    return round(x, min(digits, max(0, 2 - int(math.floor(math.log10(abs(x)))))))


def report_hardware(report: dict) -> str:
    """A bench report's machine as the result rows name theirs (`Hardware.hardware_class`): the GPU and
    its capability, else the CPU model and the instruction set torch dispatched to."""
    hardware = {k: v for k, v in _dict(report.get("hardware")).items() if k in Hardware.model_fields}
    return Hardware.model_construct(**{"cpu": "?", "n_cpus": 0, **hardware}).hardware_class()



def training_speed_rows(reports) -> list[dict]:
    """`dare bench train` reports: each comparison's baseline, accelerated value and gain (`MAX_BENCH_ROWS` rows at
    most)."""
    out = []
    for path, rep in reports:
        if len(out) >= MAX_BENCH_ROWS:
            break
        res = _dict(rep.get("results"))
        hw = report_hardware(rep)
        if "packing" in res:
            p = _dict(res["packing"])
            out.append({"comparison": "packing vs padding (tokens/s)", "baseline": p.get("padded_tokens_per_s"),
                        "accelerated": p.get("packed_tokens_per_s"), "gain": p.get("speedup"), "hardware": hw,
                        "report": path.name})
        if "loss_memory" in res:
            m = _dict(res["loss_memory"])
            out.append({"comparison": f"loss peak memory, MiB (vocab {m.get('vocab')})",
                        "baseline": m.get("full_peak_mib"), "accelerated": m.get("chunked_peak_mib"),
                        "gain": m.get("peak_memory_ratio"), "hardware": hw, "report": path.name})
        if "rl_step" in res:
            s = _dict(res["rl_step"])
            out.append({"comparison": "end-to-end RL step, s", "baseline": _dict(s.get("naive")).get("step_s"),
                        "accelerated": _dict(s.get("accelerated")).get("step_s"), "gain": s.get("speedup"),
                        "hardware": hw, "report": path.name})
            naive, fast = (_dict(s.get(k)).get("reward_mean") for k in ("naive", "accelerated"))
            if _number(naive) and _number(fast):  # what the speed cost: the rollouts' quality, side by side
                out.append({"comparison": "end-to-end RL step, mean reward", "baseline": naive, "accelerated": fast,
                            "gain": fast / naive if naive else None, "hardware": hw, "report": path.name})
    return [{**row, **{k: _round(row[k], 2) if _number(row[k]) else None for k in ("baseline", "accelerated", "gain")}}
            for row in out[:MAX_BENCH_ROWS]]


def quantity(value, unit) -> str:
    """A target's number as read: seconds under one in ms, a ratio as `20x`, a relative error in %, else the value
    and its unit (3 significant digits); '' for no number."""
    if not _number(value):
        return ""
    if unit == "s":
        return f"{1000 * value:.3g} ms" if value < 1 else f"{value:.3g} s"
    if unit == "x":
        return f"{value:.3g}x"
    if unit == "rel":
        return f"{100 * value:.3g}%"
    return f"{value:.3g} {unit}" if isinstance(unit, str) else f"{value:.3g}"


def gpu_target_rows(reports) -> list[dict]:
    """`dare bench gpu` reports at the released shapes (shrunk CPU runs left out): one row per target, the newest
    report first: its verdict (met, missed, not measured; the gpu-marked tests' target says when they timed out,
    from the report's `stages.gpu_tests`), what was measured against what was asked, each in its unit, the need
    with its direction (`<= 40 ms`, `>= 20x`: `dare.app.bench_gpu.at_most`); `MAX_BENCH_ROWS` rows at most."""
    out = []
    for path, rep in reports:
        if rep.get("kind") != "bench.gpu" or rep.get("shrunk") is not False or not isinstance(rep.get("targets"), list):
            continue
        tests = _dict(_dict(rep.get("stages")).get("gpu_tests"))
        for t in (x for x in rep["targets"] if isinstance(x, dict)):
            if len(out) >= MAX_BENCH_ROWS:
                break
            verdict = {True: "met", False: "missed"}.get(t.get("met"), "not measured")
            measured = quantity(t.get("measured"), t.get("unit"))
            if t.get("unit") == "failed" and tests.get("rc") == "timeout":  # the count of failed gpu-marked tests
                seconds = tests.get("seconds")
                verdict += f" (timed out{f' after {seconds:.0f} s' if _number(seconds) else ''})"
                measured = "not counted"  # the run was stopped before pytest's summary
            need = quantity(t.get("need"), t.get("unit"))
            out.append({"verdict": verdict, "target": t.get("target"), "measured": measured,
                        "need": f"{'<=' if at_most(t) else '>='} {need}" if need else "",
                        "card": rep.get("card"), "date": str(rep.get("created", ""))[:10],
                        "commit": str(_dict(rep.get("git")).get("commit", ""))[:7], "report": path.name})
    return sorted(out, key=lambda r: r["date"], reverse=True)


def run_rows(items) -> list[dict]:
    out = []
    for path, r in items:
        m = r.metric(main_metric(r))
        out.append({
            "run_id": r.run_id, "method": method_label(r), "model": r.model.name, "family": r.model.family,
            "benchmark": r.benchmark.name, "metric": m.name, "value": round(100 * m.value, 2), "n": m.count,
            "seed": r.training.seed if r.training else None,
            "gen/block/steps": f"{r.decoding.gen_length}/{r.decoding.block_length}/{r.decoding.steps}",
            "hardware": environment(r)[0], "lock": (environment(r)[1] or "")[:12],
            "commit": (r.provenance.git_commit or "")[:8] + ("+dirty" if r.provenance.git_dirty else ""),
            "created": r.created_at, "file": printable(str(path)),
        })
    return out


def artifact(path: Path, name: str | None) -> tuple[Path | None, str | None]:
    """(the file `name` that a result in `path` names, None), or (None, why it is not shown): an artifact
    is read only from inside the result's own folder, so a file naming `/etc/shadow`, `../../x` or a
    symlink leaving the folder shows nothing else."""
    if not name:
        return None, None
    folder = Path(path).parent.resolve()
    try:
        target = (folder / name).resolve()
    except (OSError, RuntimeError, ValueError) as e:  # a symlink loop, a NUL byte
        return None, f"{printable(name)}: {e}"
    if not target.is_relative_to(folder):
        return None, f"{printable(name)} is outside the result's folder, not shown"
    return target, None


def run_detail(path: Path, r: Result, max_samples: int = 20) -> dict:
    """Everything the run-detail view shows: config text, provenance, sample preview, curves; a config or
    samples file that is not shown has its reason in `config_note` or `samples_note`."""
    config, config_note = artifact(path, r.artifacts.config)
    samples, samples_note = artifact(path, r.artifacts.samples)
    text, preview = None, []
    if config and config.exists():
        try:
            text = read_bounded(config).decode(errors="replace")
        except ValueError as e:
            config_note = f"{printable(str(config))}: {e}"
    if samples and samples.exists():
        try:  # the first lines are enough: a whole samples file can be large
            lines = read_bounded(samples, prefix=True).decode(errors="replace").splitlines()
        except ValueError as e:
            samples_note, lines = f"{printable(str(samples))}: {e}", []
        for line in lines[:max_samples]:
            try:
                preview.append(parse_json(line, nan=True))
            except ValueError:
                break
    return {"config": text, "config_path": str(config) if config else None, "config_note": config_note,
            "samples_path": str(samples) if samples else None, "samples_note": samples_note,
            "samples": preview, "curves": read_curve(curve_file(path)),
            "provenance": r.provenance.model_dump(), "training": r.training.model_dump() if r.training else None,
            "decoding": r.decoding.model_dump()}


# ---------------------------------------------------------------------------------------------
# Training curves: several runs overlaid, and methods compared at equal forward passes
# ---------------------------------------------------------------------------------------------

FORWARDS = "compute/total_forwards"  # rollout + training sequence forward passes so far
X_AXES = ("step", FORWARDS, "compute/total_rollout_tokens", "compute/total_update_tokens", "compute/wall_s",
          "time_s")  # the cumulative values a curve can be drawn against
_CURVES: dict[Path, tuple[tuple[int, int], list[dict]]] = {}  # file -> ((mtime, size), records)


def curve_file(path: Path) -> Path | None:
    """The training curves (metrics.jsonl) of the run a result evaluated: beside a published result,
    in the `dare train` run of a result in `<run>/eval/<hash>/`, or in `<run>/train/` for a sweep's
    result in `<run>/eval/`; None when there are none."""
    folder = Path(path).parent
    candidates = [folder / "metrics.jsonl"]
    if folder.parent.name == "eval":
        candidates.append(folder.parent.parent / "metrics.jsonl")
    if folder.name == "eval":
        candidates.append(folder.parent / "train" / "metrics.jsonl")
    return next((c for c in candidates if c.is_file()), None)


def read_curve(path: Path | None) -> list[dict]:
    """The logged steps of a metrics.jsonl, each with its numeric values within ±`MAX_NUMBER` only (NaN
    and infinities dropped) under names without control characters (lines that are not JSON, nest too
    deep or have no integer `step` are skipped; [] without a file or for one that is not a regular file
    of at most `MAX_LOG_BYTES`, or a link out of its folder). A file is read again only when it changes;
    the records returned are shared, not to be modified."""
    if path is None:
        return []
    try:
        info = path.stat()
    except OSError:  # a dangling link
        return []
    stamp = (info.st_mtime_ns, info.st_size)
    if path in _CURVES and _CURVES[path][0] == stamp:
        return _CURVES[path][1]
    try:
        text = read_bounded(path, MAX_LOG_BYTES, folder=path.parent).decode(errors="replace")  # no link out
    except ValueError:
        text = ""
    records = []
    for line in text.splitlines():
        try:
            rec = parse_json(line, nan=True)
        except ValueError:
            continue
        values = {k: v for k, v in rec.items() if _number(v) and not unsafe_char(k)} if isinstance(rec, dict) else {}
        if isinstance(values.get("step"), int):
            records.append(values)
    _CURVES[path] = (stamp, records)
    return records


def seed(r: Result) -> int | None:
    return r.training.seed if r.training else None


def overlay_default(items, run_id: str) -> list[str]:
    """The runs the detail view overlays first: the run and the other seeds of its recipe on the same
    model and benchmark column (a run evaluated on several benchmarks would repeat its curves); the run alone
    when it logged no curves (its recipe's other seeds' would read as its own)."""
    path, run = next((p, r) for p, r in items if r.run_id == run_id)
    if not read_curve(curve_file(path)):
        return [run_id]
    key = (recipe(run), run.model.name, benchmark_label(run))
    return [run_id] + [r.run_id for _, r in items
                       if r.run_id != run_id and (recipe(r), r.model.name, benchmark_label(r)) == key]


def best_run(items, column: str | None) -> str | None:
    """The run id of the best result (the highest main metric; the first of a tie) in `column` (`benchmark_label`):
    the run the detail view opens on, in the landing view's column."""
    results = [r for _, r in items if benchmark_label(r) == column]
    return max(results, key=value).run_id if results else None


def curve_metrics(curves: list[list[dict]]) -> list[str]:
    """The metrics logged in any of the curves (all but `step` and `time_s`), sorted."""
    return sorted({k for curve in curves for rec in curve for k in rec} - {"step", "time_s"})


def x_options(curves: list[list[dict]]) -> list[str]:
    """`step`, then each cumulative x axis (`X_AXES`) that at least one of the curves logs."""
    logged = {k for curve in curves for rec in curve for k in rec}
    return [x for x in X_AXES if x == "step" or x in logged]


def _missing(curve: list[dict], metric: str | None, x: str) -> str:
    """Why a curve has no point of `metric` against `x`."""
    if not curve:
        return "no training curves"
    if not any(x in rec for rec in curve):
        return "no compute curves" if x.startswith("compute/") else f"no {x}"
    if metric is None or not any(metric in rec for rec in curve):
        return f"no {metric or 'metric'}"
    return f"no {metric} logged with {x}"


def overlay_rows(items, run_ids: list[str], metric: str, x: str = "step") -> tuple[list[dict], list[str]]:
    """`metric` against `x` for each run of `run_ids`, one line each: (points as rows with run_id, method
    (its recipe label, with the model when the runs span several), seed, x, y; the runs left out, each
    `run_id (why)`: no curves, no `x` (older runs log no compute/*) or no `metric`)."""
    by_id = {r.run_id: (p, r) for p, r in items}
    chosen = [by_id[i] for i in run_ids if i in by_id]
    labels = row_labels([r for _, r in chosen], within=lambda r: r.model.name)
    several = len({r.model.name for _, r in chosen}) > 1
    rows, left_out = [], []
    for path, r in chosen:
        curve = read_curve(curve_file(path))
        points = [(rec[x], rec[metric]) for rec in curve if x in rec and metric in rec]
        if not points:
            left_out.append(f"{r.run_id} ({_missing(curve, metric, x)})")
            continue
        label = labels[recipe(r)] + (f" [{r.model.name}]" if several else "")
        rows += [{"run_id": r.run_id, "method": label, "seed": seed(r), "x": px, "y": py} for px, py in points]
    return rows, left_out


def value_at(curve: list[dict], x_key: str, budget: float, metric: str) -> float | None:
    """`metric` where `x_key` reaches `budget`: the value logged at a point exactly there, else the linear
    interpolation between the logged points just before and just after it; None outside the logged
    range (or when the curve never logs both keys at once)."""
    points = sorted(((rec[x_key], rec[metric]) for rec in curve if x_key in rec and metric in rec),
                    key=lambda p: p[0])
    exact = [y for x, y in points if x == budget]
    if exact:
        return exact[0]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 < budget < x1:
            return y0 + (y1 - y0) * (budget - x0) / (x1 - x0)
    return None


def _final(curve: list[dict], x_key: str, metric: str) -> float | None:
    """The last `x_key` at which `metric` was logged (None if never)."""
    return max((rec[x_key] for rec in curve if x_key in rec and metric in rec), default=None)


def common_budget(curves, metric: str | None) -> float | None:
    """The forward budget every curve reaches: the smallest, over the curves that log `metric` against
    `FORWARDS`, of the last `FORWARDS` at which they logged it (None: no curve does)."""
    finals = [f for f in (_final(c, FORWARDS, metric) for c in curves) if f is not None] if metric else []
    return min(finals) if finals else None


def has_compute(path: Path, r: Result) -> bool:
    """The run recorded what it spent (`training.compute`) or logged compute curves."""
    return bool(r.training and r.training.compute) or any(FORWARDS in rec for rec in read_curve(curve_file(path)))


def compute_metrics(items, benchmark: str) -> tuple[list[str], str | None]:
    """(the curve metrics the compute view can compare on one benchmark column: those logged by runs
    with compute curves, compute/* aside; the default: `val/<main metric>` when a curve has it, else
    `rollout/reward_mean`, else the first; None when no run logged compute curves)."""
    results = [(p, r) for p, r in items if benchmark_label(r) == benchmark]
    curves = [c for c in (read_curve(curve_file(p)) for p, _ in results) if any(FORWARDS in rec for rec in c)]
    names = [m for m in curve_metrics(curves) if not m.startswith("compute/")]
    preferred = sorted({f"val/{main_metric(r)}" for _, r in results}) + ["rollout/reward_mean"]
    return names, next((m for m in preferred if m in names), names[0] if names else None)


def spread(values: list[float]) -> str:
    """`mean ± std (n seeds)` of raw curve values (3 decimals); '' for none."""
    if not values:
        return ""
    mean, std, n = stats(values)
    return f"{mean:.3f} (1 seed)" if n == 1 else f"{mean:.3f} ± {std:.3f} ({n} seeds)"


def _spent(results: list[Result]) -> dict:
    """The compute columns of a row: forwards and update tokens as means over the seeds that recorded
    `training.compute`; wall time as the mean over every seed that trained (the compute record's, else the
    result's `training.wall_time_s`, which every trained result has)."""
    spent = [r.training.compute for r in results if r.training and r.training.compute]
    walls = [r.training.compute.wall_time_s if r.training.compute else r.training.wall_time_s
             for r in results if r.training]
    wall = f"{stats(walls)[0]:.1f} s" if walls else ""
    if not spent:
        return {"forwards": "", "update tokens": "", "wall time": wall}
    return {"forwards": f"{stats([c.rollout_forwards + c.train_forwards for c in spent])[0]:,.0f}",
            "update tokens": f"{stats([c.update_tokens for c in spent])[0]:,.0f}", "wall time": wall}


def _notes(results: list[Result], curves: dict[str, list[dict]], metric: str | None, budget: float | None) -> str:
    """What a compute row lacks: a compute record, and each reason a seed has no value at the budget."""
    notes = []
    recorded = sum(1 for r in results if r.training and r.training.compute)
    if not recorded:
        notes.append("no compute record")
    elif recorded < len(results):
        notes.append(f"compute recorded by {recorded} of {len(results)} seeds")
    reasons = []
    for r in results:
        curve = curves[r.run_id]
        if budget is None or metric is None or value_at(curve, FORWARDS, budget, metric) is None:
            points = [rec for rec in curve if FORWARDS in rec and metric in rec]
            reasons.append(_missing(curve, metric, FORWARDS) if not points else "budget before its first point")
    if reasons:
        why = ", ".join(sorted(set(reasons)))
        notes.append(why if len(reasons) == len(results) else f"{len(reasons)} of {len(results)} seeds: {why}")
    return "; ".join(notes)


def _reached(results: list[Result], curves: dict[str, list[dict]], metric: str | None, target: float) -> str:
    """`mean ± std (n seeds)` of the forwards at which each seed's curve first reached `target`; the seeds
    that never did are said ('' without curves of `metric` against forwards)."""
    logged = [r for r in results if metric and any(FORWARDS in rec and metric in rec for rec in curves[r.run_id])]
    hits = [x for x in (forwards_to_reach(curves[r.run_id], metric, target) for r in logged) if x is not None]
    if not logged:
        return ""
    if not hits:
        return "not reached"
    mean, std, n = stats(hits)
    text = f"{mean:,.0f}" + (f" ± {std:,.0f}" if n > 1 else "") + f" ({n} seed{'s' if n > 1 else ''})"
    return text + (f", {len(logged) - n} not reached" if len(logged) > n else "")


def compute_table(items, benchmark: str, metric: str | None = None,
                  reach: float | None = None) -> tuple[float | None, list[dict]]:
    """Methods at equal steps and at equal forward passes on one benchmark column (`benchmark_label`):
    (the forward budget, one row per family x recipe: the final score (`mean ± std (n seeds)`, %), the
    compute spent (means over the seeds that recorded it: rollout + training sequence forwards, update
    tokens; wall time over every seed), `metric` (default: `compute_metrics`') at the budget, mean ± std
    over seeds, with `reach` the sequence forwards at which `metric` first reached it (`forwards_to_reach`;
    over the seeds that reached it, `not reached` when none did), and a note on what is missing). The budget is the smallest, over the runs with compute curves, of the
    last `compute/total_forwards` at which `metric` was logged; each run's value there is `value_at`
    (linear interpolation between its logged points). None: no run logged compute curves."""
    metric = metric or compute_metrics(items, benchmark)[1]
    results = [(p, r) for p, r in items if benchmark_label(r) == benchmark]
    curves = {r.run_id: read_curve(curve_file(p)) for p, r in results}
    budget = common_budget(curves.values(), metric)
    labels = row_labels([r for _, r in results], within=lambda r: r.model.name)
    groups: dict[tuple, list[Result]] = defaultdict(list)
    for _, r in sorted(results, key=lambda pr: (pr[1].model.family, pr[1].model.name)):
        groups[(r.model.family, r.model.name, labels[recipe(r)])].append(r)
    rows = []
    for (family, model, label), rs in groups.items():
        at_budget = [value_at(curves[r.run_id], FORWARDS, budget, metric) for r in rs] if budget is not None else []
        rows.append({"family": family, "model": model, "method": label, "equal steps": format_cell(rs),
                     "steps": ", ".join(str(s) for s in sorted({r.training.steps for r in rs if r.training})),
                     **_spent(rs), "equal forwards": spread([v for v in at_budget if v is not None]),
                     **({} if reach is None else {f"forwards to reach {reach:g}": _reached(rs, curves, metric, reach)}),
                     "note": _notes(rs, curves, metric, budget)})
    return budget, rows


# ---------------------------------------------------------------------------------------------
# The landing view's column (its ranking: leaderboard/rank.py), t intervals over distinct seeds
# ---------------------------------------------------------------------------------------------


def t_975(df: int) -> float:
    """The two-sided 95% t quantile for `df` >= 1 degrees of freedom, to three decimals as t tables print it
    (`rank.t_quantile`, Student's t computed)."""
    from rank import t_quantile  # leaderboard/rank.py, which imports this module

    return round(t_quantile(0.975, df), 3)


def interval(values: list[float]) -> tuple[float, float | None, float | None, int]:
    """(mean, low, high, n) of per-seed values: the 95% t interval of the mean, mean ± t(n-1) s / sqrt(n);
    no interval (None, None) for one seed."""
    mean, std, n = stats(values)
    if n < 2:
        return mean, None, None, n
    half = t_975(n - 1) * std / math.sqrt(n)
    return mean, mean - half, mean + half, n


HEADLINE = [("countdown_tiny", "accuracy"), ("sudoku_hard", "cell_accuracy"), ("chain_carry", "term_accuracy")]
"""The headline suite (reproductions/suite/): its tasks and the metric each is ranked on, in the order the landing
view looks for them (it opens on the first with a result): Countdown first, the task whose protocol mirrors a
published one (d1's Countdown: 3 numbers, TinyZero's reward) and so the proxy check's. The chain is ranked on its
share of terms right: no run measured so far wrote a whole chain right (reproductions/suite/README.md)."""

SMOKE = ("addition", "sudoku_fill")
"""Smoke tasks: they show that every method runs and learns, and are labelled as such on the landing view."""


def default_column(items) -> str | None:
    """The task and decoding the landing view opens on: the column with the most (family, method) cells."""
    cells: dict[str, set] = defaultdict(set)
    for _, r in items:
        cells[benchmark_label(r)].add((r.model.family, method_label(r)))
    return max(sorted(cells), key=lambda c: len(cells[c])) if cells else None


def landing_column(items) -> str | None:
    """The column the landing view opens on: the fullest column (`default_column`) of the first headline task
    (`HEADLINE`) with a result, else of every task."""
    for task, _ in HEADLINE:
        column = default_column([(p, r) for p, r in items if r.benchmark.name == task])
        if column:
            return column
    return default_column(items)


def scope(items) -> dict:
    """What the shown results are: tasks, families and models (with their parameter counts when recorded),
    machines, result count and distinct runs, for the landing view's scope note."""
    rs = [r for _, r in items]
    sizes = sorted({r.model.n_params for r in rs if r.model.n_params})
    return {"results": len(rs), "runs": len(distinct_runs(rs)), "tasks": sorted({r.benchmark.name for r in rs}),
            "families": sorted({r.model.family for r in rs}), "models": sorted({r.model.name for r in rs}),
            "params": (sizes[0], sizes[-1]) if sizes else None,
            "hardware": sorted({environment(r)[0] for r in rs})}


# ---------------------------------------------------------------------------------------------
# Speed and compute: the Pareto front, forwards to reach a score, labels of runs
# ---------------------------------------------------------------------------------------------


def pareto(rows: list[dict], x: str = "tokens/s", y: str = "accuracy") -> list[dict]:
    """The rows no other row beats on both `x` and `y` (higher is better on both), by `x` descending: the
    accuracy-versus-speed front. Rows without both values are left out."""
    points = sorted((row for row in rows if _number(row.get(x)) and _number(row.get(y))),
                    key=lambda row: (-row[x], -row[y]))
    front, best = [], -math.inf
    for row in points:
        if row[y] > best:
            front.append(row)
            best = row[y]
    return front


def forwards_to_reach(curve: list[dict], metric: str, target: float, x_key: str = FORWARDS) -> float | None:
    """The `x_key` (sequence forwards) at which `metric` first reaches `target`: the logged point, or the linear
    interpolation between the last point below and the first at or above it; None if never reached."""
    points = sorted(((rec[x_key], rec[metric]) for rec in curve if x_key in rec and metric in rec),
                    key=lambda p: p[0])
    for i, (x1, y1) in enumerate(points):
        if y1 >= target:
            if i == 0:
                return x1
            x0, y0 = points[i - 1]
            return x0 + (x1 - x0) * (target - y0) / (y1 - y0)
    return None


def reach_default(items, benchmark: str, metric: str | None) -> float:
    """The score the compute view asks "forwards to reach" by default: the smallest, over the runs of the
    column with compute curves, of the best `metric` each logged (so every such run reached it); 0 without."""
    bests = [max(rec[metric] for rec in c if FORWARDS in rec and metric in rec)
             for c in (read_curve(curve_file(p)) for p, r in items if benchmark_label(r) == benchmark)
             if metric and any(FORWARDS in rec and metric in rec for rec in c)]
    return round(min(bests), 3) if bests else 0.0


def run_label(r: Result) -> str:
    """How the run picker names a run: method, family, task, seed, date, and the run id last."""
    seed_text = f"seed {r.training.seed}" if r.training else "no training"
    return (f"{method_label(r)} · {r.model.family} · {r.benchmark.name} · {seed_text} · {r.created_at[:10]}"
            f" · {r.run_id}")
