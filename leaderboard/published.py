"""The Published view's rows: every number a baseline's paper (and DARE's README, and the compilations of
JustGRPO and d-TreeRPO) prints, by model, benchmark and protocol, with its source; ours beside it where a
result of ours was evaluated with that protocol, else "not run here". Torch-free, like `load`.

The numbers live in one file per baseline (`reproductions/<name>/targets.yaml`, or `published.yaml` for a
baseline without one; format and checks in `dare.app.targets`). Ours is the mean over distinct seeds
(`load.per_seed`) of the results of that baseline on that model, trained from the released model (or from
the number's `init`), evaluated on the benchmark's test split with the number's protocol
(`dare.app.targets.matches`); one row per our recipe and decoding column (`load.benchmark_label`) that
matches, so different recipes or decodings are never pooled.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import load
from dare.app import targets
from dare.app.baselines import root as baselines_root
from dare.results import Result
from dare.utils import UserError

NOT_RUN = "not run here"
NOT_COMPARABLE = "not run here (the source does not state the whole protocol)"
OTHER = "not run here (the task registry has no such benchmark)"


def reproductions() -> Path:
    return baselines_root().parent / "reproductions"


def _load(root: Path | None) -> tuple[list[targets.Published], dict[str, str]]:
    """(every baseline's published numbers that load, {baseline: the error} for those whose file does not)."""
    root = Path(root) if root is not None else reproductions()
    try:
        files = targets.published_files(root)
    except UserError as e:
        return [], {"(reproductions)": str(e)}
    loaded, errors = [], {}
    for name, path in files.items():
        if path is None:
            errors[name] = f"{root / name}: no targets.yaml or {targets.PUBLISHED_FILE}"
            continue
        try:
            loaded.append(targets.load_published(path))
        except UserError as e:
            errors[name] = str(e)
    return loaded, errors


def flat_decoding(r: Result) -> dict:
    """A result's decoding record with its `extra` settings at the top level (`dare.decoding.FLAT`'s names)."""
    d = r.decoding.model_dump()
    return {**{k: v for k, v in d.items() if k != "extra"}, **d["extra"]}


def _ours(entry: dict, baseline: str, items) -> list[Result]:
    """The results of `baseline` that `entry`'s number is comparable with (see the module's docstring)."""
    init_ok = (lambda i: i == entry["init"]) if entry.get("init") else (lambda i: i in load.BASE_INITS)
    return [r for _, r in items
            if r.method.baseline == baseline and init_ok(r.method.init) and r.model.name == entry["model"]
            and targets.matches(entry, r.benchmark.model_dump(), flat_decoding(r))]


def _status(entry: dict) -> str:
    from dare.data import TASKS

    if entry["benchmark"] not in TASKS:
        return OTHER
    return NOT_RUN if targets.comparable(entry) else NOT_COMPARABLE


def published_rows(items, root: str | Path | None = None) -> list[dict]:
    """One row per published number (and per our recipe and decoding column that matches it): method, model,
    benchmark, protocol (`gen 256 / block 32 / 128 steps, 0-shot, T=0`, `?` for what the source leaves
    unstated), published (percent, as printed), source, note, target (a number the reproduction's sweep
    aims at), ours (percent, mean over distinct seeds; None when not run), seeds, runs, ours_column (our
    decoding column, `load.benchmark_label`), delta (ours - published, points; None when not run) and
    status ("" when ours is beside it, else `NOT_RUN`, `NOT_COMPARABLE` or `OTHER`). `items` are
    `load.load_all()`'s (path, Result) pairs. A baseline whose file does not load has no rows
    (`published_methods` says why)."""
    out = []
    for pub in _load(root)[0]:
        for entry in pub.numbers:
            method = pub.baseline + (f" (from {entry['init']})" if entry.get("init") else "")
            row = {"method": method, "model": entry["model"], "benchmark": entry["benchmark"],
                   "protocol": targets.protocol_text(entry), "published": entry["value"], "source": entry["source"],
                   "note": entry.get("note", ""), "target": bool(entry.get("target"))}
            ours = _ours(entry, pub.baseline, items)
            if not ours:
                out.append({**row, "ours": None, "seeds": 0, "runs": 0, "ours_column": "", "delta": None,
                            "status": _status(entry)})
                continue
            labels = load.row_labels(ours)
            groups: dict[tuple, list[Result]] = defaultdict(list)
            for r in ours:
                groups[(labels[load.recipe(r)], load.benchmark_label(r))].append(r)
            several = len({label for label, _ in groups}) > 1
            for (label, column), rs in groups.items():
                mean, _, n = load.stats(load.per_seed(rs))
                ours_pct = round(100 * mean, 1)
                out.append({**row, "method": label if several else method, "ours": ours_pct, "seeds": n,
                            "runs": len(load.distinct_runs(rs)),
                            "ours_column": column + (load.MIXED if load.mixed(rs) else ""),
                            "delta": round(100 * mean - entry["value"], 1), "status": ""})
    return out


def published_methods(root: str | Path | None = None) -> list[dict]:
    """Every baseline: method, its paper (arXiv id), file, how many numbers it has published, how many of them
    state their whole protocol (so ours can be put beside them), and why it has none (the file's `missing:`,
    or the error of a file that does not load) -- "" when it has numbers."""
    loaded, errors = _load(root)
    rows = [{"method": p.baseline, "paper": p.paper.get("arxiv", ""), "file": "/".join(p.path.parts[-3:]),
             "numbers": len(p.numbers), "comparable": sum(targets.comparable(e) for e in p.numbers),
             "why none": p.missing or ""} for p in loaded]
    rows += [{"method": name, "paper": "", "file": "", "numbers": 0, "comparable": 0, "why none": why}
             for name, why in errors.items()]
    return sorted(rows, key=lambda r: r["method"])
