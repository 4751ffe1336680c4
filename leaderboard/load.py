"""Loading and shaping results for the leaderboard. Reads JSON only (no torch): a view over
validated result files, never a calculator; means and spreads across seeds are recomputed from
each file's stored metric values."""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path

from dare.results import Result, load_results

HERE = Path(__file__).resolve().parent
COMMITTED = HERE / "results"
RUNS_ENV = "DARE_LEADERBOARD_RUNS"


def run_dirs_from_env() -> list[Path]:
    return [Path(p) for p in os.environ.get(RUNS_ENV, "").split(os.pathsep) if p.strip()]


def load_all(extra_runs: list[Path] | None = None) -> tuple[list[tuple[Path, Result]], list[tuple[Path, str]]]:
    """Committed results (every *.json under leaderboard/results) plus result_*.json in run folders."""
    valid, invalid = load_results(COMMITTED)
    for d in (extra_runs if extra_runs is not None else run_dirs_from_env()):
        v, i = load_results(d, pattern="**/result_*.json")
        valid += v
        invalid += i
    # The same run can be both committed and in a run folder: keep one copy per run_id.
    seen, unique = set(), []
    for path, r in valid:
        if r.run_id not in seen:
            seen.add(r.run_id)
            unique.append((path, r))
    return unique, invalid


def main_metric(result: Result) -> str:
    return result.metrics[0].name


def method_label(r: Result) -> str:
    return r.method.baseline if r.method.init in (None, "scratch") else f"{r.method.baseline} (from {r.method.init})"


def benchmark_label(r: Result) -> str:
    """A column per benchmark and decoding setting: scores under different decodings never mix."""
    d = r.decoding
    return f"{r.benchmark.name} [{d.gen_length}/{d.block_length}/{d.steps}, T={d.temperature:g}]"


def table(results: list[Result]) -> tuple[list[str], list[dict]]:
    """Methods as rows, benchmarks as columns; a cell is `mean ± std (n seeds)` of the main metric."""
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    methods, benchmarks = [], []
    for r in results:
        m, b = method_label(r), benchmark_label(r)
        cells[(m, b)].append(r.metric(main_metric(r)).value)
        methods += [m] if m not in methods else []
        benchmarks += [b] if b not in benchmarks else []
    rows = []
    for m in methods:
        row = {"method": m}
        for b in benchmarks:
            vals = cells.get((m, b))
            row[b] = format_cell(vals) if vals else ""
        rows.append(row)
    return benchmarks, rows


def format_cell(values: list[float]) -> str:
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{100 * mean:.1f} (1 seed)"
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return f"{100 * mean:.1f} ± {100 * std:.1f} ({len(values)} seeds)"


def run_rows(items: list[tuple[Path, Result]]) -> list[dict]:
    out = []
    for path, r in items:
        m = r.metric(main_metric(r))
        out.append({
            "run_id": r.run_id, "method": method_label(r), "model": r.model.name, "family": r.model.family,
            "benchmark": r.benchmark.name, "metric": m.name, "value": round(100 * m.value, 2), "n": m.count,
            "seed": r.training.seed if r.training else None,
            "gen/block/steps": f"{r.decoding.gen_length}/{r.decoding.block_length}/{r.decoding.steps}",
            "commit": (r.provenance.git_commit or "")[:8] + ("+dirty" if r.provenance.git_dirty else ""),
            "created": r.created_at, "file": str(path),
        })
    return out
