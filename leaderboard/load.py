"""Loading and shaping results for the leaderboard. Reads JSON only (no torch): a view over
validated result files, never a calculator. Means and spreads across seeds come from each file's
stored metric values; nothing is scored here.

Sources: every *.json under leaderboard/results/ (committed) plus result_*.json in the run folders
given with `dare leaderboard --runs` or $DARE_LEADERBOARD_RUNS. Benchmark reports
(`"kind": "bench.<what>"`, written by `dare bench`) are read separately for the speed view.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path

from dare.results import Result, load_results

HERE = Path(__file__).resolve().parent
RUNS_ENV = "DARE_LEADERBOARD_RUNS"
COMMITTED_ENV = "DARE_LEADERBOARD_RESULTS"  # another committed-results folder (tests, forks)


def committed() -> Path:
    return Path(os.environ.get(COMMITTED_ENV) or HERE / "results")
BASE_INITS = (None, "scratch", "pretrained")
TOLERANCE = 0.02  # a reproduction within 2 points of the paper (metric units are fractions)


def run_dirs_from_env() -> list[Path]:
    return [Path(p) for p in os.environ.get(RUNS_ENV, "").split(os.pathsep) if p.strip()]


def _bench_kind(path: Path) -> str | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    kind = data.get("kind") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) and kind.startswith("bench.") else None


def load_all(extra_runs: list[Path] | None = None) -> tuple[list[tuple[Path, Result]], list[tuple[Path, str]]]:
    """(valid results, one per run_id; [(file, reason)] for every invalid file). Never raises."""
    valid, invalid = load_results(committed())
    for d in (extra_runs if extra_runs is not None else run_dirs_from_env()):
        v, i = load_results(d, pattern="**/result_*.json")
        valid += v
        invalid += i
    invalid = [(p, why) for p, why in invalid if _bench_kind(p) is None]  # bench reports are not results
    seen, unique = set(), []
    for path, r in valid:  # the same run can be both committed and in a run folder
        if r.run_id not in seen:
            seen.add(r.run_id)
            unique.append((path, r))
    return unique, invalid


def load_bench(extra_runs: list[Path] | None = None) -> list[tuple[Path, dict]]:
    """`dare bench` reports (train: packing, loss memory, RL step) from the same sources."""
    out = []
    roots = [committed(), *(extra_runs if extra_runs is not None else run_dirs_from_env())]
    for root in roots:
        for path in sorted(Path(root).glob("**/*.json")) if Path(root).is_dir() else []:
            if _bench_kind(path):
                out.append((path, json.loads(path.read_text())))
    return out


# ---------------------------------------------------------------------------------------------
# Labels and filters
# ---------------------------------------------------------------------------------------------


def main_metric(result: Result) -> str:
    return result.metrics[0].name


def method_label(r: Result) -> str:
    return r.method.baseline if r.method.init in BASE_INITS else f"{r.method.baseline} (from {r.method.init})"


def benchmark_label(r: Result) -> str:
    """A column per benchmark, engine and decoding setting: scores under different decodings, or
    from OpenCompass' prompts and our embedded ones, never mix."""
    d = r.decoding
    engine = " (OpenCompass)" if r.benchmark.version.startswith("opencompass") else ""
    return f"{r.benchmark.name}{engine} [{d.gen_length}/{d.block_length}/{d.steps}, T={d.temperature:g}]"


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


def format_cell(values: list[float]) -> str:
    mean, std, n = stats(values)
    return f"{100 * mean:.1f} (1 seed)" if n == 1 else f"{100 * mean:.1f} ± {100 * std:.1f} ({n} seeds)"


def _cells(results, row_key, col_key):
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    rows, cols = [], []
    for r in results:
        a, b = row_key(r), col_key(r)
        cells[(a, b)].append(r.metric(main_metric(r)).value)
        rows += [a] if a not in rows else []
        cols += [b] if b not in cols else []
    return cells, rows, cols


def base_method(results: list[Result]) -> str | None:
    """The row the others are compared with: the model before post-training (an untrained base,
    or the run trained from scratch that the others start from)."""
    for r in results:
        if r.method.init in BASE_INITS:
            return method_label(r)
    return None


def table(results: list[Result], base: str | None = None) -> tuple[list[str], list[dict], list[dict]]:
    """Methods as rows, benchmarks as columns: (columns, `mean ± std (n seeds)` rows, delta rows
    in points against the `base` method)."""
    cells, methods, benchmarks = _cells(results, method_label, benchmark_label)
    rows, deltas = [], []
    for m in methods:
        rows.append({"method": m, **{b: format_cell(cells[(m, b)]) if cells.get((m, b)) else "" for b in benchmarks}})
        if base and m != base:
            d = {"method": m}
            for b in benchmarks:
                if cells.get((m, b)) and cells.get((base, b)):
                    d[b] = round(100 * (stats(cells[(m, b)])[0] - stats(cells[(base, b)])[0]), 1)
                else:
                    d[b] = None
            deltas.append(d)
    return benchmarks, rows, deltas


def chart_rows(results: list[Result]) -> list[dict]:
    """One row per (method, benchmark): mean and std in points, for bar charts with error bars."""
    cells, methods, benchmarks = _cells(results, method_label, benchmark_label)
    out = []
    for (m, b), vals in cells.items():
        mean, std, n = stats(vals)
        out.append({"method": m, "benchmark": b, "mean": 100 * mean, "low": 100 * (mean - std),
                    "high": 100 * (mean + std), "seeds": n})
    return out


def method_rows(items, method: str) -> list[dict]:
    """One method across models and families: rows (model, family), columns benchmarks."""
    results = [r for _, r in items if method_label(r) == method]
    cells, models, benchmarks = _cells(results, lambda r: (r.model.name, r.model.family), benchmark_label)
    return [{"model": m, "family": f, **{b: format_cell(cells[((m, f), b)]) if cells.get(((m, f), b)) else ""
                                         for b in benchmarks}} for m, f in models]


def reproduction_rows(items) -> list[dict]:
    """Results that carry the paper's number: ours (mean over seeds) vs the paper, with the delta.
    `reproduced` only when the decoding matches the paper's protocol, the whole test split was
    evaluated, and ours is within 2 points of (or above) the paper."""
    groups: dict[tuple, list[Result]] = defaultdict(list)
    for _, r in items:
        if r.reference is not None:
            groups[(method_label(r), r.model.name, benchmark_label(r))].append(r)
    out = []
    for (method, model, bench), rs in groups.items():
        mean, std, n = stats([r.metric(main_metric(r)).value for r in rs])
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
    """Decoding throughput recorded with each evaluation (tokens/s, NFE, tokens per forward)."""
    out = []
    for _, r in items:
        t = r.throughput
        if t.eval_tokens_per_s is None and t.tokens_per_forward is None:
            continue
        extra = ", ".join(f"{k}={v}" for k, v in sorted(r.decoding.extra.items()))
        out.append({"model": r.model.name, "method": method_label(r), "benchmark": r.benchmark.name,
                    "sampler": r.decoding.sampler, "gen/block/steps":
                        f"{r.decoding.gen_length}/{r.decoding.block_length}/{r.decoding.steps}",
                    "settings": extra, "tokens/s": t.eval_tokens_per_s, "NFE/sample": t.nfe_per_sample,
                    "tokens/forward": t.tokens_per_forward, "hardware": r.provenance.hardware.cpu
                    if not r.provenance.hardware.gpu else r.provenance.hardware.gpu})
    return out


def training_speed_rows(reports) -> list[dict]:
    """`dare bench train` reports: each comparison's baseline, accelerated value and gain."""
    out = []
    for path, rep in reports:
        res = rep.get("results", {})
        hw = (rep.get("hardware") or {}).get("gpu") or (rep.get("hardware") or {}).get("cpu", "")
        if "packing" in res:
            p = res["packing"]
            out.append({"comparison": "packing vs padding (tokens/s)", "baseline": p.get("padded_tokens_per_s"),
                        "accelerated": p.get("packed_tokens_per_s"), "gain": p.get("speedup"), "hardware": hw,
                        "report": path.name})
        if "loss_memory" in res:
            m = res["loss_memory"]
            out.append({"comparison": f"loss peak memory, MiB (vocab {m.get('vocab')})",
                        "baseline": m.get("full_peak_mib"), "accelerated": m.get("chunked_peak_mib"),
                        "gain": m.get("peak_memory_ratio"), "hardware": hw, "report": path.name})
        if "rl_step" in res:
            s = res["rl_step"]
            out.append({"comparison": "end-to-end RL step, s", "baseline": (s.get("naive") or {}).get("step_s"),
                        "accelerated": (s.get("accelerated") or {}).get("step_s"), "gain": s.get("speedup"),
                        "hardware": hw, "report": path.name})
    return out


def run_rows(items) -> list[dict]:
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


def run_detail(path: Path, r: Result, max_samples: int = 20) -> dict:
    """Everything the run-detail view shows: config text, provenance, sample preview, curves."""
    folder = Path(path).parent
    config = folder / r.artifacts.config if r.artifacts.config else None
    samples = folder / r.artifacts.samples if r.artifacts.samples else None
    preview = []
    if samples and samples.is_file():
        with open(samples) as f:
            for line, _ in zip(f, range(max_samples)):
                try:
                    preview.append(json.loads(line))
                except ValueError:
                    break
    curves = []
    for candidate in (folder / "metrics.jsonl", folder.parent.parent / "metrics.jsonl"):
        if candidate.is_file():
            for line in candidate.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("step"), int):
                    curves.append({k: v for k, v in rec.items() if isinstance(v, (int, float))
                                   and not isinstance(v, bool) and math.isfinite(v)})
            break
    return {"config": config.read_text() if config and config.is_file() else None,
            "config_path": str(config) if config else None, "samples_path": str(samples) if samples else None,
            "samples": preview, "curves": curves,
            "provenance": r.provenance.model_dump(), "training": r.training.model_dump() if r.training else None,
            "decoding": r.decoding.model_dump()}
