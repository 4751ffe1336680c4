"""The leaderboard: `dare leaderboard` or `make leaderboard` (Streamlit, 127.0.0.1).

A read-only view over validated result JSONs: committed ones under leaderboard/results/ and any
run folders given with `--runs` (or $DARE_LEADERBOARD_RUNS). Invalid files are listed with their
reason, never fatal. A row is one training recipe (method, start, config without the seed): only
the seeds of one recipe are pooled, and a mean or delta over runs made on different hardware or
from different lock files is marked ⚠. Views (tabs):

- Overview (the landing view): what the results are (scope), one task and decoding (the headline suite's
  first, `load.HEADLINE`) with its methods in rank classes on one model (`rank.board`: Welch over seeds with
  Holm's correction, ties shown as ties), each cell a 95% bootstrap interval over seeds and problems, the
  scores at equal forward passes, stability under leaving a seed out, paper and code links; the summary
  across families (only methods run on the same models averaged), the proxy check against the papers'
  LLaDA-8B rankings, and the method glossary (from the baselines' front matter);
- Leaderboard: every recipe on one model, benchmarks as columns, with deltas to a pinned row (to the start:
  each run against the start it trained from, `load.own_start`, as in the Families tab);
- Families: every method on every family of one task (deltas to each family's start, links to runs);
- Compute: the same task's recipes at equal steps and at equal forward passes (the score, what each
  spent from `training.compute`, a curve metric interpolated at the common forward budget), and each
  run's curve against compute/total_forwards;
- By method: one method across models and families; Published: every number the papers report, ours
  beside it where the protocol matches; Speed: decoding throughput per task, one point per model and decoding
  (the median of its runs, their spread as bars) with each model's accuracy-speed Pareto front, training
  throughput and the GPU acceptance targets; the benchmarks of the rollout (`load.rollout_benchmark`) are
  shown there only, never beside the methods;
- Run detail (opened directly by a `?run=<id>` link): one run's config, provenance and samples, and the
  training curves (reward, val accuracy, KL, diagnostics, ...) of several runs and seeds overlaid, against
  steps or compute, the raw records last.

Only the open tab runs (a click on another reruns the script for it; `?tab=<label>` opens one), and what
does not change between reruns is cached on the results' stamp. Views say what is missing (older results
have no compute record and no compute/* curves). Every
name or path from a file is shown as plain text (`plain`): a Markdown image in a model's name is text,
never an image the browser fetches.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import altair as alt
import pandas as pd
import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load  # noqa: E402  (leaderboard/load.py)
import published  # noqa: E402  (leaderboard/published.py)
import rank  # noqa: E402  (leaderboard/rank.py)
from dare.app.baselines import glossary  # noqa: E402  (torch-free: the baselines' front matter)
from dare.results import printable  # noqa: E402

st.set_page_config(page_title="dLLM post-training leaderboard", layout="wide")
st.title("dLLM post-training leaderboard")


def plain(text) -> str:
    """`text` as itself where Streamlit renders Markdown (captions, headers, st.table cells): every ASCII
    punctuation character backslash-escaped, so `![x](http://evil/beacon.png)` in a name is text, not an
    image the browser fetches."""
    return re.sub(r"([!-/:-@\[-`{-~])", r"\\\1", str(text))


def static_table(df: pd.DataFrame) -> None:
    """`st.table` (a static HTML table: readable, printable, its text in the page) with its cells, row and
    column names as plain text."""
    df = df.map(lambda v: plain(v) if isinstance(v, str) else v)
    st.table(df.set_axis(df.index.map(plain)).set_axis(df.columns.map(plain), axis=1))


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:  # a dangling link (listed among the invalid files)
        return 0


def _stamp(roots: tuple[str, ...], pattern: str = "**/*.json") -> tuple:
    """Changes when a file matching `pattern` (default: a JSON file) under the sources is added, removed or
    rewritten."""
    files = [p for root in roots if Path(root).is_dir() for p in Path(root).glob(pattern)]
    return len(files), max((_mtime(p) for p in files), default=0)


@st.cache_data(show_spinner="Loading results")
def _load(roots: tuple[str, ...], stamp: tuple):
    runs = [Path(r) for r in roots[1:]]
    return load.load_all(runs), load.load_bench(runs)


roots = (str(load.committed()), *map(str, load.run_dirs_from_env()))
stamp = _stamp(roots)
(items, invalid), bench = _load(roots, stamp)
if invalid:
    with st.expander(f"⚠ {len(invalid)} invalid result file(s) skipped", expanded=True):
        st.dataframe(pd.DataFrame([{"file": printable(str(p)), "reason": why} for p, why in invalid]),
                     hide_index=True)
if not items and not bench:
    st.info("No results yet. Run `make demo`, then `make leaderboard`.")
    st.stop()

# --- filters (empty selection = everything)
opts = load.options(items)
st.sidebar.header("Filters")
selected = {key: st.sidebar.multiselect(label, opts[key], key=f"filter_{key}")
            for key, label in [("family", "Model family"), ("model", "Model"), ("method", "Method"),
                               ("benchmark", "Benchmark"), ("gen_length", "Generation length")]}
filtered = load.apply_filters(items, **selected)
compared = [(p, r) for p, r in items if not load.rollout_benchmark(r)]  # benchmarks of the rollout: the Speed tab's
shown = load.apply_filters(compared, **selected)  # what the views that compare methods show
rollout_benchmarks = len(filtered) - len(shown)
KEY = (roots, stamp, tuple((k, tuple(v)) for k, v in selected.items()))  # which results `shown` holds: a cache key


@st.cache_data(show_spinner=False, max_entries=64)
def published_tables(key: tuple, numbers: tuple, _items) -> tuple[list[dict], list[dict]]:
    """(the Published tab's rows, every baseline's count of published numbers and why it has none), computed once
    per results and filters (`key`: `_items` are those) and papers' numbers (`numbers`: the stamp of the YAML files
    under reproductions/), not again on each rerun."""
    return published.published_rows(_items), published.published_methods()


@st.cache_data(show_spinner=False, max_entries=64)
def compute_table(key: tuple, pick: str, metric: str | None, reach: float | None, _items):
    """`load.compute_table` of `_items` (the results `key` says), computed once per choice, not again on each
    rerun (the Compute tab asks it for its budget, then with the forwards to reach)."""
    return load.compute_table(_items, pick, metric, reach)
st.sidebar.caption(f"{len(filtered)} of {len(items)} results shown" + (
    f" ({rollout_benchmarks} of them benchmarks of the rollout, in the Speed tab only)" if rollout_benchmarks else ""))
st.sidebar.caption("⚠ marks a mean or delta over runs from different hardware or lock files.")


def download(df: pd.DataFrame, name: str, key: str) -> None:
    safe = df.map(load.csv_safe).rename(columns=load.csv_safe)
    st.download_button("Download CSV", safe.to_csv(index=False).encode(), file_name=name, mime="text/csv", key=key)


def curve_chart(rows: list[dict], x: str, y: str, budget: float | None = None) -> alt.Chart:
    """One line per run (colored by method, dashed by seed), with a rule at the forward budget."""
    lines = alt.Chart(pd.DataFrame(rows)).mark_line(point=True).encode(
        x=alt.X("x:Q", title=x), y=alt.Y("y:Q", title=y, scale=alt.Scale(zero=False)),
        color=alt.Color("method:N", legend=alt.Legend(orient="bottom", columns=2, labelLimit=400)),
        strokeDash=alt.StrokeDash("seed:N"), detail="run_id:N",
        tooltip=["run_id", "method", "seed", alt.Tooltip("x:Q", title=x), alt.Tooltip("y:Q", title=y)])
    if budget is None:
        return lines
    rule = alt.Chart(pd.DataFrame({"budget": [budget]})).mark_rule(strokeDash=[4, 4]).encode(x="budget:Q")
    return lines + rule


DOT_LINE = 22  # pixels per line of a dot plot: room for every label (Vega drops labels that overlap)


def dot_lines(df: pd.DataFrame, y: str, color: str, order: list[str]) -> tuple[pd.Series, list[str]]:
    """(each row's line in a dot plot, the lines in order): the `y` label, or `label · color` where a label has
    dots of several colors, so that every dot has a line of its own and its label beside it; by `order`, then
    the labels it does not name."""
    several = df.groupby(y)[color].nunique().max() > 1
    lines = df[y] + " · " + df[color].astype(str) if several else df[y]
    labels = list(dict.fromkeys([*order, *df[y]]))
    return lines, [line for label in labels for line in sorted(set(lines[df[y] == label]))]


def dot_plot(rows: list[dict], y: str, color: str, title: str, order: list[str],
             interval: str = "95% interval over seeds") -> alt.Chart:
    """Means as dots with their 95% intervals as bars, one line per dot (`dot_lines`: every label drawn, in full,
    beside its dot; no offset within a line), the axis fitted to the values (not 0-100), full width."""
    df = pd.DataFrame(rows)
    df["line"], lines = dot_lines(df, y, color, order)
    y_enc = alt.Y("line:N", title=None, sort=lines, axis=alt.Axis(labelLimit=600, labelOverlap=False))
    x_title = f"{title}, % (mean and {interval})"
    base = alt.Chart(df).encode(y=y_enc, color=alt.Color(f"{color}:N", legend=alt.Legend(
        orient="bottom", columns=4, labelLimit=400)), tooltip=[y, color, "mean", "low", "high", "n"])
    dots = base.mark_point(filled=True, size=90).encode(x=alt.X("mean:Q", title=x_title, scale=alt.Scale(zero=False)))
    bars = base.transform_filter("isValid(datum.low)").mark_rule(strokeWidth=2).encode(
        x=alt.X("low:Q", title=x_title), x2="high:Q")
    return alt.layer(bars, dots).properties(height=alt.Step(DOT_LINE))


HEAT = ("#f7fbff", "#08306b")  # the heatmap's colours, lowest to highest mean (white to navy), interpolated in RGB


def ink(value: float, low: float, high: float) -> str:
    """The text colour readable on a heatmap cell of `value` (the `HEAT` colour at its place between `low` and
    `high`): white on a dark cell, black on a light one, whichever contrasts more with the cell's relative
    luminance (WCAG: the two contrasts are equal at 0.179)."""
    t = (value - low) / (high - low) if high > low else 0.0
    rgb = [(1 - t) * int(a[i:i + 2], 16) + t * int(b[i:i + 2], 16) for a, b in [(HEAT[0][1:], HEAT[1][1:])]
           for i in (0, 2, 4)]
    linear = [c / 255 / 12.92 if c / 255 <= 0.04045 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return "white" if luminance < 0.179 else "black"


def heatmap(cells: pd.DataFrame) -> alt.Chart:
    """Recipes (rows) x families (columns), each cell its mean with the text in the colour its fill needs (`ink`);
    every label in full."""
    low, high = cells["mean"].min(), cells["mean"].max()
    cells = cells.assign(ink=[ink(v, low, high) for v in cells["mean"]])
    base = alt.Chart(cells).encode(
        x=alt.X("where:N", title="family", axis=alt.Axis(orient="top", labelAngle=0, labelLimit=300)),
        y=alt.Y("method:N", title=None, axis=alt.Axis(labelLimit=600, labelOverlap=False)))
    rects = base.mark_rect().encode(
        color=alt.Color("mean:Q", title="%", scale=alt.Scale(domain=[low, high], range=list(HEAT), interpolate="rgb")),
        tooltip=["family", "model", "method", "mean", "n"])
    text = base.mark_text(fontSize=12).encode(text=alt.Text("mean:Q", format=".1f"), color=alt.condition(
        "datum.ink == 'white'", alt.value("white"), alt.value("black")))
    return (rects + text).properties(height=alt.Step(DOT_LINE), width=alt.Step(110))


def overview() -> None:
    """The landing view: scope, the ranking of one task and decoding, the method glossary."""
    s = load.scope(shown)
    size = (f", {s['params'][0]:,} to {s['params'][1]:,} parameters" if s["params"] and s["params"][0] != s["params"][1]
            else f", {s['params'][0]:,} parameters" if s["params"] else "")
    tiny = s["params"] is not None and s["params"][1] < 100_000_000
    st.markdown(
        f"**What is here.** {s['results']} results ({s['runs']} distinct runs) on the tasks "
        f"{plain(', '.join(s['tasks']))}, with the models {plain(', '.join(s['models']))}{size}, of the families "
        f"{plain(', '.join(s['families']))}, made on {plain('; '.join(s['hardware']))}."
        + (" These are **tiny models trained from scratch on synthetic tasks on CPUs**: they show that every "
           "method runs and learns on every family, and how the methods rank at this scale, not at 8B. What "
           "the papers report at 8B is in the Published tab." if tiny else ""))
    columns = sorted({load.benchmark_label(r) for _, r in shown})
    task = {load.benchmark_label(r): r.benchmark.name for _, r in shown}
    smoke = lambda c: task[c] in load.SMOKE  # noqa: E731
    column = st.selectbox("Task and decoding", columns, index=columns.index(load.landing_column(shown)),
                          key="overview_column", format_func=lambda c: c + (" (smoke test)" if smoke(c) else ""))
    metric = rank.column_metric(shown, column)
    cells = rank.column_cells(shown, column, metric)
    models = rank.models_of(cells)
    model = st.selectbox("Rank on the model", models, index=models.index(rank.default_model(cells)),
                         key="overview_model")
    b = rank.board(shown, column, model, metric)
    tested, separated = b.ranking.pairs, b.ranking.separated
    if smoke(column):
        st.warning(f"Smoke test: {plain(task[column])} shows that every method runs and learns"
                   + (f"; it cannot separate methods ({separated} of {tested} pairs differ on {plain(model)})."
                      if b.cannot_separate else "."))
    budget = b.compute.budget
    st.caption(
        f"**{plain(metric)}** on {plain(column)}, methods in rank classes on **{plain(model)}**. A method's class is 1 + "
        f"the number of methods significantly better than it: Welch's t-test over seeds (two-sided), Holm's "
        f"correction over the model's {tested} tested pairs, 5% level ({separated} pairs differ); methods not "
        "separated share a class, and ★ marks the best only where it is significantly better than every other "
        f"({'here: ' + plain(b.ranking.best) if b.ranking.best else 'none here: the best is tied'}). Each model's "
        f"cell: mean {plain(metric)} [95% interval], in %, from a hierarchical bootstrap over seeds and each seed's "
        "problems. " + (f"At equal compute: {plain(b.compute.metric)} at {budget:,.0f} forward passes (the Compute "
                        f"tab's common budget) and its mean from {b.compute.start:,.0f} to it (the normalised area "
                        "under the validation curve), with the classes at that budget. " if budget else
                        "No run of this column logged validation curves against forward passes: no equal-compute "
                        "score. ") + "stable: the class stays the same when any one of the method's seeds is left "
        f"out (too few seeds: fewer than three, so the one left would be untestable). A (start) row is the model the methods trained from: not ranked. Last updated "
        f"{max(r.created_at for _, r in shown)[:10]}.")
    search = st.text_input("Search methods", key="overview_search", placeholder="a method's name")
    rows = [row for row in b.rows if search.strip().lower() in row["method"].lower()]
    link = st.column_config.LinkColumn
    number = st.column_config.NumberColumn
    st.dataframe(pd.DataFrame(rows, columns=list(b.rows[0]) if b.rows else None), hide_index=True,
                 key="overview_table", width="stretch", column_config={
                     "class": number(f"class ({metric})", format="%d"),
                     **{m: f"{m}: {metric}, % [95%]" for m in b.models},
                     "mean": number(f"{metric} on {model}, %", format="%.2f"),
                     "at budget": number(f"{b.compute.metric or metric} at equal forwards, %", format="%.2f"),
                     "area": number(f"{b.compute.metric or metric}, mean to the budget, %", format="%.2f"),
                     "class at budget": number("class at equal forwards", format="%d"),
                     "paper": link("paper", display_text=r"abs/(.*)$"),
                     "code": link("code", display_text=r"github\.com/(.*)$")})
    download(pd.DataFrame(b.numbers), "ranking.csv", "csv_ranking")
    st.altair_chart(dot_plot(b.numbers, "method", "model", metric, order=b.order,
                             interval="95% bootstrap interval over seeds and problems"), width="stretch")
    st.subheader(f"Across families: {plain(metric)}")
    _, across = rank.across(shown, column, metric)
    st.caption(f"{plain(metric)} on {plain(column)}, in %: a mean over models only for the methods run on every "
               f"model of the column ({len(models)}); a method run on fewer has none (models: on how many), so "
               "methods run on different sets of models are never ranked by an average. The classes are each "
               "model's own (Welch over seeds, Holm), never pooled.")
    st.dataframe(pd.DataFrame(across), hide_index=True, key="overview_across", width="stretch",
                 column_config={"across": number(f"{metric}, mean over the {len(models)} models, %", format="%.2f")})
    st.subheader(f"Proxy check: the papers' {rank.PROXY_MODEL} rankings against ours ({plain(metric)})")
    proxy = rank.proxy(shown, column, metric)
    st.caption(f"Kendall's tau-b (ties handled) between a published ranking ({rank.PROXY_MODEL}, one benchmark of "
               f"{', '.join(rank.PROXY_BENCHMARKS)} under one stated protocol, {rank.PROXY_MIN} methods or more: "
               "the Published tab's numbers) and our ranking of the same methods on this column's LLaDA model, with "
               "a 95% bootstrap interval over our seeds. No target: it says how far the small suite stands in for "
               f"the 8B rankings; under {rank.PROXY_MIN} methods in both, the row says so.")
    if proxy:
        st.dataframe(pd.DataFrame(proxy), hide_index=True, key="overview_proxy", width="stretch")
    else:
        st.caption("No LLaDA model in this column: no proxy correlation.")
    st.subheader("Methods")
    st.caption("Every baseline in this repository, from its README's front matter (baselines/<name>/README.md).")
    st.dataframe(pd.DataFrame([{"method": g["name"], "paper": g["title"], "arXiv": g["url"], "objective": g["summary"],
                                "families": ", ".join(g["families"]), "status": g["status"]} for g in glossary()]),
                 hide_index=True, key="glossary", width="stretch",
                 column_config={"arXiv": st.column_config.LinkColumn("arXiv", display_text=r"abs/(.*)$")})


def compute_view() -> None:
    """One task and decoding (the Families tab's columns): each recipe at equal steps and at equal forward passes,
    and its curves."""
    columns = sorted({load.benchmark_label(r) for _, r in shown})
    if not columns:
        st.info("No result matches the filters.")
        return
    ready = [c for c in columns if any(load.has_compute(p, r) for p, r in shown if load.benchmark_label(r) == c)]
    pick = st.selectbox("Task and decoding", columns, index=columns.index(ready[0]) if ready else 0,
                        key="compute_benchmark")
    metrics, default = load.compute_metrics(shown, pick)
    metric = st.selectbox("Curve metric at equal forwards", metrics, key="compute_metric",
                          index=metrics.index(default)) if metrics else None
    budget, _ = compute_table(KEY, pick, metric, None, _items=shown)
    reach = None
    if budget is not None:
        reach = st.number_input(f"Forwards to reach this {metric} (the first point at or above it)",
                                value=float(load.reach_default(shown, pick, metric)), step=0.01, format="%.3f",
                                key="compute_reach")
    budget, rows = compute_table(KEY, pick, metric, reach, _items=shown)
    if budget is None:
        st.caption(f"{plain(pick)}: no run here logged compute curves ({load.FORWARDS}), so there is no comparison "
                   "at equal forward passes; the scores at equal steps and the compute records are below.")
    else:
        st.caption(f"{plain(pick)}: equal steps = the final score, % (mean ± sample std over seeds); compute = means "
                   f"over seeds of rollout + training sequence forwards, update tokens, wall time; equal forwards = "
                   f"{plain(metric)} at {budget:,.0f} forwards (the smallest last {load.FORWARDS} at which a run "
                   "logged it), interpolated linearly between each run's logged points; mean ± std over seeds.")
    recorded = [row for row in rows if row["forwards"]]
    others = [row for row in rows if not row["forwards"]]
    if recorded:
        static_table(pd.DataFrame(recorded).set_index("method"))
    if others:
        with st.expander(f"{len(others)} recipe(s) without a compute record: results before schema 3 and supervised "
                         "runs (SFT, preference, and base models) count no forwards; their score and wall time:",
                         expanded=not recorded):
            static_table(pd.DataFrame(others).drop(columns=["forwards", "update tokens", "equal forwards"])
                         .set_index("method"))
    download(pd.DataFrame(rows), "compute.csv", "csv_compute")
    if budget is not None:
        ids = [r.run_id for _, r in shown if load.benchmark_label(r) == pick]
        points, _ = load.overlay_rows(shown, ids, metric, load.FORWARDS)
        st.altair_chart(curve_chart(points, load.FORWARDS, metric, budget))


def _new_run() -> None:
    st.session_state.pop("overlay", None)  # the overlay starts again from the new run's seeds


def overlay_view(run_id: str) -> None:
    """The training curves of the run and of the runs picked with it, one line each."""
    ids = [r.run_id for _, r in shown]
    picked = st.multiselect("Overlay the training curves of (default: this run and its recipe's other seeds)",
                            ids, default=load.overlay_default(shown, run_id), key="overlay")
    curves = [load.read_curve(load.curve_file(p)) for p, r in shown if r.run_id in picked]
    if not load.read_curve(load.curve_file(next(p for p, r in shown if r.run_id == run_id))):
        st.caption(f"This run ({plain(run_id)}) logged no training curves (no metrics.jsonl beside its result)"
                   + ("; the curves below are the other runs picked." if any(curves) else
                      "; pick other runs above to see theirs."))
    if not any(curves):
        st.caption("No training metrics (metrics.jsonl) beside the chosen results.")
        return
    metrics = load.curve_metrics(curves)
    y = st.selectbox("Training curve", metrics, key="curve",
                     index=metrics.index("rollout/reward_mean") if "rollout/reward_mean" in metrics else 0)
    x = st.selectbox("Against", load.x_options(curves), key="curve_x")
    rows, left_out = load.overlay_rows(shown, picked, y, x)
    if rows:
        st.altair_chart(curve_chart(rows, x, y))
    if left_out:
        st.caption("Left out: " + plain("; ".join(left_out)))


def leaderboard_view() -> None:
    families = sorted({r.model.family for _, r in shown})
    if not families:
        st.info("No result matches the filters.")
    else:
        family = st.selectbox("Model family", families, key="family")
        models = sorted({r.model.name for _, r in shown if r.model.family == family})
        model = st.selectbox("Model", models, key="model")
        mine = [(p, r) for p, r in shown if r.model.family == family and r.model.name == model]
        if selected["method"]:  # the model's start stays as the row the deltas are taken against
            kept = {r.run_id for _, r in mine}
            starts = [(p, r) for p, r in load.apply_filters(compared, **{**selected, "method": ()})
                      if r.model.name == model and r.method.init in load.BASE_INITS and r.run_id not in kept]
            mine += starts
            if starts:
                st.caption(f"The start ({plain(load.method_label(starts[0][1]))}) is kept as the first row, for the "
                           "deltas, although the method filter leaves it out.")
        results = [r for _, r in mine]
        st.subheader(f"{plain(model)} ({plain(family)})")
        long = pd.DataFrame(load.long_rows(results))
        methods = list(dict.fromkeys(long["method"]))
        base_default = load.base_method(results)
        base = st.selectbox("Deltas against (pinned first)", methods,
                            index=methods.index(base_default) if base_default in methods else 0, key="base")
        benchmarks, rows, deltas = load.table(mine, base, pool=compared)
        sort_by = st.selectbox("Sort rows by", ["method", *benchmarks], key="sort")
        df = pd.DataFrame(rows)
        if sort_by != "method":  # by the mean, highest first; the base row stays on top
            means = long[long["benchmark"] == sort_by].set_index("method")["mean"]
            df = df.assign(_pin=df["method"] != base, _key=df["method"].map(means)).sort_values(
                ["_pin", "_key"], ascending=[True, False], na_position="last").drop(columns=["_pin", "_key"])
        metric = load.main_metric(results[0])
        st.caption(f"{plain(metric)}, %: mean ± sample std over seeds (n seeds); one row per training recipe (only "
                   "seeds of one config are pooled). Columns are benchmark [gen length/block/steps, temperature]: "
                   "different decodings never share a column.")
        static_table(df.set_index("method"))
        download(long, f"leaderboard_{model}.csv", "csv_main")
        if deltas and base_default is None:
            st.caption(f"The selection holds no start of this model (the model its methods were trained from: a "
                       f"filter removes it), so the differences below are to {plain(base)}, in points:")
        elif deltas and base == base_default:
            st.caption(f"Difference to the start, {plain(base)}, in points: each run against the start it was trained "
                       "from (a start trained again from the same config is a rerun in its row, and each run is "
                       "compared with its own), as in the Families tab.")
        elif deltas:
            st.caption(f"Difference to {plain(base)}, in points:")
        if deltas:
            order = [m for m in df["method"] if m != base]
            static_table(pd.DataFrame(deltas).set_index("method").loc[order])
        shown_column = st.selectbox("Chart the column", benchmarks, key="dot_benchmark")
        st.altair_chart(dot_plot(long[long["benchmark"] == shown_column].to_dict("records"), "method", "benchmark",
                                 metric, order=list(df["method"])), width="stretch")
        st.subheader("Runs")
        st.dataframe(pd.DataFrame(load.run_rows([(p, r) for p, r in shown if r.model.family == family
                                                 and r.model.name == model])), hide_index=True)


def families_view() -> None:
    columns = sorted({load.benchmark_label(r) for _, r in shown})
    if not columns:
        st.info("No result matches the filters.")
    else:
        pick = st.selectbox("Task and decoding", columns, key="family_benchmark")
        fams, rows, family_runs = load.family_table(shown, pick, pool=compared)
        st.caption(f"{plain(pick)}: every method on every model family, % (mean ± sample std over seeds, n seeds), "
                   "and its difference in points to the start its runs were trained from (the first row; a start "
                   "trained again from the same config is a rerun there, and each run is compared with its own). "
                   "Open a run from the table below it (the detail link) or in the Run detail tab.")
        static_table(pd.DataFrame(rows).set_index("method"))
        st.dataframe(pd.DataFrame(family_runs), hide_index=True, key="family_runs",
                     column_config={"detail": st.column_config.LinkColumn("detail", display_text="open")})
        download(pd.DataFrame(rows), "families.csv", "csv_families")


def by_method_view() -> None:
    methods = load.options(shown)["method"]
    if not methods:
        st.info("No result matches the filters.")
    else:
        heat = pd.DataFrame(load.family_method_rows(shown))
        bench_names = sorted(heat["benchmark"].unique())
        bench_pick = st.selectbox("Benchmark (family x method)", bench_names, key="heat_benchmark")
        cells = heat[heat["benchmark"] == bench_pick]
        st.caption(f"Mean {plain(bench_pick)} score of every recipe on every family, % over its seeds: one cell per "
                   "recipe (labelled as in the Families tab) and model (`family: model` where a family has several), "
                   "never pooled.")
        st.altair_chart(heatmap(cells), width="content")
        method = st.selectbox("Method", methods, key="method_view")
        df = pd.DataFrame(load.method_rows(shown, method))
        st.caption(f"{plain(method)} on every model and family (mean ± std over seeds, in %).")
        st.dataframe(df, hide_index=True, key="method_table")
        download(df, f"method_{method}.csv", "csv_method")


def published_view() -> None:
    numbers, methods = published_tables(KEY, _stamp((str(published.reproductions()),), "**/*.yaml"), _items=shown)
    published_rows = pd.DataFrame(numbers)
    st.caption("Every number the papers report for the methods here (and DARE's README, and the compilations in "
               "JustGRPO and d-TreeRPO), by model, benchmark and protocol, with its source table (one file per "
               "baseline: reproductions/<name>/targets.yaml or published.yaml). Where one of our results was "
               "evaluated with the same protocol, ours (mean over distinct seeds) and the difference in points "
               "stand beside it; otherwise the row says why not.")
    if len(published_rows):
        pick = st.selectbox("Method", ["every method", *sorted(published_rows["method"].unique())],
                            key="published_method")
        mine = published_rows if pick == "every method" else published_rows[published_rows["method"] == pick]
        columns = ["method", "ours", "delta", "status", "published", "model", "benchmark", "protocol", "seeds",
                   "source", "note"]  # ours, its difference and why not first: readable without scrolling
        shown_rows = mine[[c for c in columns if c in mine.columns]].astype(object).where(mine.notna(), "")
        shown_rows["published"] = [f"{v:g}" for v in mine["published"]]  # as the papers print them
        shown_rows["seeds"] = [n or "" for n in mine["seeds"]]
        # a data frame, not a static table: its 200-odd rows drew in over 2 s as Markdown cells, in 1 s here
        st.dataframe(shown_rows, hide_index=True, key="published_numbers", column_config={
            "method": st.column_config.TextColumn("method", pinned=True),
            "protocol": st.column_config.TextColumn("protocol", width="large"),
            "source": st.column_config.TextColumn("source", width="large"),
            "note": st.column_config.TextColumn("note", width="large")})
        download(mine, "published.csv", "csv_published")
    none = [m for m in methods if m["why none"]]
    if none:
        st.caption("No published number: " + plain("; ".join(f"{m['method']} ({m['why none']})" for m in none)))
    rows = load.reproduction_rows(shown)
    st.subheader("Our reproductions")
    st.caption("Results that carry the paper's number (the 8B reproductions of reproductions/): ours (mean over "
               "seeds) against it. ✓ reproduced only when the decoding matches the paper's protocol, the whole test "
               "split was evaluated and ours is within 2 points of the paper.")
    if not rows:
        st.info("No result carries a paper reference yet (the 8B reproductions in reproductions/ need GPUs).")
    else:
        df = pd.DataFrame(rows)
        st.dataframe(df, hide_index=True, key="repro_table")
        download(df, "reproduction.csv", "csv_repro")


def speed_view() -> None:
    st.caption("Decoding throughput recorded with each evaluation (dare bench rollout writes one result per "
               "strategy), and the training-side comparisons of dare bench train.")
    rollout = pd.DataFrame(load.rollout_speed_rows(filtered))
    if len(rollout):
        tasks = sorted(rollout["benchmark"].unique())
        task = st.selectbox("Task", tasks, key="speed_task")
        mine = rollout[rollout["benchmark"] == task]
        points = pd.DataFrame(load.decoding_points(mine.to_dict("records")))
        st.caption(f"{plain(task)}: one row and one point per model and decoding: the **median** tokens/s and "
                   "accuracy of its runs (its reruns, seeds and the methods evaluated with it), the bars from its "
                   "slowest to its fastest run and from its lowest to its highest accuracy (a rerun's speed varies "
                   "with the machine's load). A line joins each model's Pareto front of the medians on one machine "
                   "(no other decoding of it is both faster and more accurate). Speeds compare only on one machine "
                   "(the hardware column).")
        st.dataframe(points, hide_index=True, key="rollout_speed")
        with st.expander(f"Every run ({len(mine)})"):
            st.dataframe(mine.drop(columns=["benchmark"]), hide_index=True, key="rollout_runs")
        front = pd.DataFrame([row for _, same in points.groupby(["model", "hardware"])  # a front per model and machine
                              for row in load.pareto(same.to_dict("records"))])
        timed = points.dropna(subset=["tokens/s"])
        base = alt.Chart(timed).encode(
            color=alt.Color("decoding:N", legend=alt.Legend(orient="bottom", columns=2, labelLimit=500)),
            tooltip=["model", "decoding", "runs", "tokens/s", "slowest", "fastest", "accuracy", "lowest", "highest",
                     "NFE/sample", "tokens/forward"])
        x = alt.X("tokens/s:Q", scale=alt.Scale(type="log"), title="tokens/s (log), median of the runs")
        y = alt.Y("accuracy:Q", title="accuracy, % (median of the runs)", scale=alt.Scale(zero=False))
        chart = alt.layer(
            base.mark_rule(opacity=0.5).encode(x=alt.X("slowest:Q", scale=alt.Scale(type="log")), x2="fastest:Q", y=y),
            base.mark_rule(opacity=0.5).encode(x=x, y=alt.Y("lowest:Q"), y2="highest:Q"),
            base.mark_point(filled=True, size=80).encode(
                x=x, y=y, shape=alt.Shape("model:N", legend=alt.Legend(orient="bottom", labelLimit=300))))
        if len(front):
            chart += alt.Chart(front).mark_line(color="gray", strokeDash=[4, 3]).encode(
                x="tokens/s:Q", y="accuracy:Q", detail=["model:N", "hardware:N"], order=alt.Order("tokens/s:Q"))
        st.altair_chart(chart.properties(height=420), width="stretch")
    training = pd.DataFrame(load.training_speed_rows(bench))
    if len(training):
        st.dataframe(training, hide_index=True, key="train_speed")
        st.caption("gain: how many times better the accelerated pipeline is (faster, less memory); on the mean-reward "
                   "row, its reward over the naive one's: below 1, the speed cost rollout quality.")
    gpu = pd.DataFrame(load.gpu_target_rows(bench))
    if len(gpu):
        st.markdown("**GPU acceptance** (`dare bench gpu --device cuda`, released shapes with random weights, bf16): "
                    "each target's verdict, what was measured and what it needs (`<=` at most, `>=` at least)")
        st.dataframe(gpu, hide_index=True, key="gpu_targets", column_config={
            "verdict": st.column_config.TextColumn("verdict", width="medium", pinned=True),
            "target": st.column_config.TextColumn("target", width="large")})
    if max(len(training), len(gpu)) >= load.MAX_BENCH_ROWS:
        st.caption(f"Bench reports: only the first {load.MAX_BENCH_ROWS:,} rows of a table are shown (and "
                   f"{load.MAX_BENCH_BYTES // 2**20} MiB of reports read in all).")
    if not len(rollout) and not len(training) and not len(gpu):
        st.info("No throughput results yet: run `dare bench rollout` or `dare bench train`.")


def detail_view() -> None:
    ids = [r.run_id for _, r in shown]
    if not ids:
        st.info("No result matches the filters.")
    else:
        names = {r.run_id: load.run_label(r) for _, r in shown}
        run_id = st.selectbox("Run (method · family · task · seed · date · run id)", ids,
                              index=ids.index(linked if linked in ids else load.best_run(shown, load.landing_column(
                                  shown))), key="run", on_change=_new_run,
                              format_func=lambda i: names[i])
        path, r = next((p, r) for p, r in shown if r.run_id == run_id)
        info = load.run_detail(path, r)
        st.markdown(f"**{plain(load.method_label(r))}** on **{plain(r.model.name)}** ({plain(r.model.family)}), "
                    f"{plain(r.benchmark.name)} ({r.benchmark.n_samples.effective} of "
                    f"{r.benchmark.n_samples.original} samples): {plain(r.metrics[0].name)} = "
                    f"{100 * r.metrics[0].value:.1f}%")
        shown_path = os.path.relpath(path) if Path(path).is_relative_to(Path.cwd()) else path
        st.markdown(f"Result file: {plain(printable(str(shown_path)))}")
        prov = info["provenance"]
        lock = prov.get("lock") or {}
        st.markdown(f"Commit {plain((prov['git_commit'] or '?')[:12])}{' (dirty)' if prov['git_dirty'] else ''}; "
                    f"hardware: {plain(load.environment(r)[0])}; lock: "
                    f"{plain(lock.get('lock', 'none'))} {plain(lock.get('sha256', '')[:12])}")
        if prov.get("command"):
            st.code(prov["command"], language="bash")
        if info["config"]:
            with st.expander(f"Resolved config: {plain(printable(info['config_path']))}"):
                st.code(info["config"], language="yaml")
        elif info["config_note"]:
            st.caption(f"Resolved config: {plain(info['config_note'])}")
        if info["samples"]:
            st.caption(f"Samples (first {len(info['samples'])}): {plain(printable(info['samples_path']))}")
            st.dataframe(pd.DataFrame(info["samples"]), hide_index=True, key="samples")
        elif info["samples_note"]:
            st.caption(f"Samples: {plain(info['samples_note'])}")
        st.subheader("Training curves")
        overlay_view(run_id)
        raw = st.expander("Raw records: fingerprint (hardware, environment, packages), decoding, training",
                          key="raw_records", on_change="rerun")
        if raw.open:  # drawn when opened: the package list is long
            raw.json({"hardware": prov["hardware"], "lock": prov.get("lock"), "packages": prov["packages"]})
            raw.json({"decoding": info["decoding"], "training": info["training"]}, expanded=False)


def overview_view() -> None:
    if not shown:
        st.info("No result matches the filters.")
    else:
        overview()


VIEWS = {"Overview": overview_view, "Leaderboard": leaderboard_view, "Families": families_view,
         "Compute": compute_view, "By method": by_method_view, "Published": published_view, "Speed": speed_view,
         "Run detail": detail_view}
linked = st.query_params.get("run")  # a link to one run (the families table's, a shared URL): ?run=<id>
tabs = st.tabs(list(VIEWS), default="Run detail" if linked else "Overview", key="tab", on_change="rerun",
               bind="query-params")  # ?tab=Speed opens that tab
for tab, view in zip(tabs, VIEWS.values()):
    with tab:
        if tab.open:  # only the open tab runs (a click on another reruns the script for it)
            view()
