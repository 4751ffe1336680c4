"""The leaderboard app through Streamlit's AppTest (every view, every filter, the invalid-file
panel), its torch-free loader, and an end-to-end check in a real headless Chromium."""

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dare.results import metric_from_values, write_result
from test_results import make_result

REPO = Path(__file__).resolve().parent.parent
APP = str(REPO / "leaderboard" / "app.py")


def _curve(forwards, rewards, **every_step):
    """A compute curve (metrics.jsonl records): step s has `forwards[s-1]` sequence forwards so far and
    reward `rewards[s-1]`, 4 rollout tokens per forward, 10 update tokens, 2 s and a loss of 1/s per
    step, and `every_step`'s values."""
    return [{"step": s, "time_s": 2.0 * s, "rollout/reward_mean": y, "loss/total": 1.0 / s, "loss/kl": 0.01 * s,
             "compute/total_forwards": f, "compute/total_rollout_tokens": 4 * f, "compute/total_update_tokens": 10 * s,
             "compute/wall_s": 2.0 * s, **every_step} for s, (f, y) in enumerate(zip(forwards, rewards), 1)]


def _compute(rollout, train, tokens, wall):
    return {"rollout_tokens": 4 * rollout, "rollout_forwards": rollout, "train_forwards": train,
            "update_tokens": tokens, "wall_time_s": wall}


# the RL runs on tiny with compute records and curves: (rollout, train forwards, update tokens, wall time),
# (total forwards, rewards) at steps 1-3. At the budget of 300 forwards (d1 s0's final point), d1 s0 logged
# 0.6 there, d1 s1 interpolates 0.5 + 0.4 x 140/160 = 0.85, wd1 s0 logged 0.65, wd1 s1 0.6 + 0.3 x 50/150 = 0.7
D1 = {0: ((200, 100, 1000, 30.0), ([100, 200, 300], [0.2, 0.4, 0.6])),
      1: ((220, 100, 1200, 34.0), ([80, 160, 320], [0.3, 0.5, 0.9]))}
WD1 = {0: ((300, 150, 2000, 50.0), ([150, 300, 450], [0.5, 0.65, 0.8])),
       1: ((260, 140, 1800, 40.0), ([100, 250, 400], [0.4, 0.6, 0.9]))}


def _rl(tmp, name, method, seed, acc, **kwargs):
    """An RL run on tiny from sft with its compute record and compute curve (`D1`, `WD1`)."""
    spent, (forwards, rewards) = (D1 if method == "d1" else WD1)[seed]
    _result(tmp, name, method=method, init="sft", seed=seed, acc=acc, compute=_compute(*spent),
            curve=_curve(forwards, rewards), **kwargs)


def _result(tmp, name, *, method, init, seed, acc, model="tiny", family="llada", gen=4, reference=None,
            throughput=None, extra_files=False, steps=10, cpu=None, run_id=None, compute=None, curve=None):
    """A result JSON in `tmp/name/`, optionally with a config, samples and a loss curve (`extra_files`),
    a compute record (`training.compute`) and a metrics.jsonl of `curve`'s records."""
    r = make_result(run_id=run_id or f"{method}__{model}__addition__s{seed}__g{gen}",
                    method={"baseline": method, "init": init})
    r["model"].update(name=model, family=family)
    r["training"].update(seed=seed, recipe_hash=f"{method}-{steps}", config={"run": {"seed": seed},
                                                                             "train": {"steps": steps, "lr": 1e-3}})
    if compute:
        r["training"]["compute"] = compute
    if cpu:
        r["provenance"]["hardware"].update(cpu_model=cpu, cpu_capability="AVX512")
    r["decoding"]["gen_length"] = gen
    r["decoding"]["sampler"] = "block" if family in ("sdar", "llada2") else "masked"  # what `auto` picks
    r["metrics"] = [metric_from_values("accuracy", acc).model_dump()]
    if reference:
        r["reference"] = reference
    if throughput:
        r["throughput"] = throughput
    folder = tmp / name
    if extra_files:
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text("baseline: d1\ntrain:\n  lr: 5.0e-05\n")
        (folder / "samples_addition.jsonl").write_text(
            "".join(json.dumps({"prompt": "1+2=", "completion": "3", "score": 1.0}) + "\n" for _ in range(3)))
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss/total": 1.0 / s, "time_s": s})
                                                      + "\n" for s in (1, 2, 3)))
        r["artifacts"] = {"samples": "samples_addition.jsonl", "config": "config.yaml"}
    if curve is not None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in curve))
    write_result(r, folder / "result_addition.json")


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """Two families, two models, three methods with seeds, a reproduction, throughput results, a
    bench report, run artifacts, compute records and curves (the RL runs on tiny; an older run's
    curve without compute/* keys) and four kinds of broken files."""
    _result(tmp_path, "sft", method="sft", init="scratch", seed=0, acc=[1, 1, 0, 1])
    for seed, acc in [(0, [1, 1, 0, 1]), (1, [1, 0, 0, 1])]:
        _rl(tmp_path, f"d1_{seed}", "d1", seed, acc, extra_files=seed == 0)
    _rl(tmp_path, "wd1", "wd1", 0, [1, 1, 1, 1])
    _result(tmp_path, "d1_long", method="d1", init="sft", seed=0, acc=[0, 1, 0, 1], gen=8,
            curve=[{"step": s, "time_s": s, "rollout/reward_mean": 0.1 * s} for s in (1, 2)])
    _result(tmp_path, "sdar_sft", method="sft", init="scratch", seed=0, acc=[0, 0, 1, 1], model="tiny-sdar",
            family="sdar")
    _result(tmp_path, "sdar_d1", method="d1", init="sft", seed=0, acc=[0, 1, 1, 1], model="tiny-sdar",
            family="sdar", throughput={"eval_tokens_per_s": 2441.0, "nfe_per_sample": 22.0, "tokens_per_forward": 1.4})
    _result(tmp_path, "repro_ok", method="d1", init="pretrained", seed=0, acc=[1, 1, 1, 0], model="LLaDA-8B",
            reference={"value": 0.74, "source": "d1 Table 1", "same_decoding": True})
    _result(tmp_path, "repro_other", method="wd1", init="pretrained", seed=0, acc=[1, 1, 1, 1], model="LLaDA-8B",
            reference={"value": 0.80, "source": "wd1 Table 1", "same_decoding": False})
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "train-1.json").write_text(json.dumps({"kind": "bench.train", "schema_version": 1,
        "hardware": {"cpu": "test cpu"}, "results": {
            "packing": {"padded_tokens_per_s": 100.0, "packed_tokens_per_s": 205.0, "speedup": 2.05},
            "rl_step": {"naive": {"step_s": 93.4, "reward_mean": 0.8}, "accelerated": {"step_s": 21.8, "reward_mean": 0.6},
                        "speedup": 4.29}}}))
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "result_truncated.json").write_text('{"schema_version": "1", "run_id": ')
    (bad / "result_version.json").write_text(json.dumps(make_result(schema_version="7")))
    missing = make_result()
    del missing["model"]
    (bad / "result_missing.json").write_text(json.dumps(missing))
    nan = json.dumps(make_result()).replace('"value": 0.75', '"value": NaN')
    (bad / "result_nan.json").write_text(nan)
    monkeypatch.setenv("DARE_LEADERBOARD_RUNS", str(tmp_path))
    empty = tmp_path.parent / f"{tmp_path.name}-committed"
    empty.mkdir()
    monkeypatch.setenv("DARE_LEADERBOARD_RESULTS", str(empty))  # only this fixture's files
    return tmp_path


def _app(tab: str | None = None):
    """The app opened on `tab`'s link (`?tab=<label>`; default: the Overview). Only the open tab runs (`st.tabs(
    on_change="rerun")`): a test reads the widgets and tables of the tab it opened."""
    at = AppTest.from_file(APP, default_timeout=60)
    if tab:
        at.query_params["tab"] = tab
    at.run()
    assert not at.exception, at.exception
    return at


def _open(at, tab: str):
    """`at` run again with `tab` open: a click on the tab (the tab's state and the link it binds)."""
    at.session_state["tab"] = at.query_params["tab"] = tab
    at.run()
    assert not at.exception, at.exception
    return at


def _plain(text: str) -> str:
    """What a string the app escaped for Markdown (its `plain`: names show as text) reads as."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text)


def _tables(at):
    """The app's static tables as they read: cells, row and column names unescaped (`_plain`)."""
    out = []
    for t in at.table:
        df = t.value.map(lambda v: _plain(v) if isinstance(v, str) else v)
        out.append(df.set_axis(df.index.map(_plain)).set_axis(df.columns.map(_plain), axis=1))
    return out


def _tab(at, label: str):
    return next(tab for tab in at.tabs if tab.label == label)


def _table(at, index=0):
    """The `index`-th static table of the Leaderboard tab (one model's recipes, then the deltas)."""
    return _tables(_tab(at, "Leaderboard"))[index]


def _run_ids(at) -> set[str]:
    """The run ids the run picker offers (each option reads `method · family · task · seed · date · run id`)."""
    return {option.rsplit(" · ", 1)[-1] for option in at.selectbox(key="run").options}


def _captions(at) -> list[str]:
    return [_plain(c.value) for c in at.caption]


def test_invalid_files_are_listed_and_the_rest_works(runs):
    at = _app()
    expander = at.expander[0]
    assert "4 invalid result file(s)" in expander.label
    reasons = dict(zip(expander.dataframe[0].value["file"].map(lambda f: Path(f).name),
                       expander.dataframe[0].value["reason"]))
    assert reasons["result_truncated.json"].startswith("not valid JSON")
    assert reasons["result_version.json"].startswith("schema_version is '7'")
    assert reasons["result_missing.json"].startswith("model: Field required")
    assert "NaN" in reasons["result_nan.json"]
    assert "train-1.json" not in " ".join(reasons)  # a bench report is not an invalid result
    assert [t.label for t in at.tabs] == ["Overview", "Leaderboard", "Families", "Compute", "By method", "Published",
                                          "Speed", "Run detail"]


def test_main_view_cells_deltas_and_sorting(runs):
    at = _app("Leaderboard")
    at.selectbox(key="family").select("llada").run()
    assert at.selectbox(key="model").options == ["LLaDA-8B", "tiny"]
    at.selectbox(key="model").select("tiny").run()
    table = _table(at)
    assert table.loc["d1 (from sft)", "addition [4/4/4, T=0]"] == "62.5 ± 17.7 (2 seeds)"
    assert table.loc["sft", "addition [4/4/4, T=0]"] == "75.0 (1 seed)"
    assert table.loc["d1 (from sft)", "addition [8/4/4, T=0]"] == "50.0 (1 seed)"  # another decoding, own column
    deltas = _table(at, 1)
    assert deltas.loc["d1 (from sft)", "addition [4/4/4, T=0]"] == "-12.5"  # signed, one decimal
    assert deltas.loc["wd1 (from sft)", "addition [4/4/4, T=0]"] == "+25.0"
    assert list(_table(at).index)[0] == "sft"  # the base row is pinned first
    at.selectbox(key="sort").select("addition [4/4/4, T=0]").run()
    assert list(_table(at).index) == ["sft", "wd1 (from sft)", "d1 (from sft)"]  # base pinned, then best first
    at.selectbox(key="base").select("wd1 (from sft)").run()
    assert list(_table(at).index) == ["wd1 (from sft)", "sft", "d1 (from sft)"]
    assert _table(at, 1).loc["sft", "addition [4/4/4, T=0]"] == "-25.0"
    assert len(at.get("download_button")) >= 1
    # the dot plot: every recipe on its own line, the mean and its 95% interval, the axis fitted to the values
    chart = next(c for c in _tab(at, "Leaderboard").get("vega_lite_chart"))
    assert "95% interval over seeds" in chart.proto.spec and '"zero": false' in chart.proto.spec
    assert {r["method"] for r in _chart_rows(chart)} == {"sft", "wd1 (from sft)", "d1 (from sft)"}
    assert '"labelLimit": 600' in chart.proto.spec  # labels are not cut


def test_two_configs_of_one_method_are_two_rows_and_only_seeds_pool(runs):
    """A 40-step SFT beside the 10-step one: two labelled rows, never one pooled `2 seeds` row; the
    csv keeps numeric mean/std/n per row."""
    import load

    _result(runs, "sft_short", method="sft", init="scratch", seed=0, acc=[0, 0, 0, 1], steps=40,
            run_id="sft__tiny__addition__s0__short")
    _result(runs, "sft_short_s1", method="sft", init="scratch", seed=1, acc=[0, 0, 1, 1], steps=40,
            run_id="sft__tiny__addition__s1__short")
    at = _app("Leaderboard")
    at.selectbox(key="family").select("llada").run()
    at.selectbox(key="model").select("tiny").run()
    table = _table(at)
    assert table.loc["sft (steps=10)", "addition [4/4/4, T=0]"] == "75.0 (1 seed)"
    assert table.loc["sft (steps=40)", "addition [4/4/4, T=0]"] == "37.5 ± 17.7 (2 seeds)"
    items, _ = load.load_all()
    rows = {(r["method"], r["benchmark"]): r for r in load.long_rows([r for _, r in items if r.model.name == "tiny"])}
    short = rows[("sft (steps=40)", "addition [4/4/4, T=0]")]
    assert (short["mean"], short["std"], short["n"]) == (37.5, 17.68, 2)


def test_means_and_deltas_over_different_machines_are_marked(runs):
    _result(runs, "d1_other_cpu", method="d1", init="sft", seed=2, acc=[1, 1, 1, 1], cpu="Intel Xeon",
            run_id="d1__tiny__addition__s2__xeon")
    at = _app("Leaderboard")
    at.selectbox(key="family").select("llada").run()
    at.selectbox(key="model").select("tiny").run()
    assert _table(at).loc["d1 (from sft)", "addition [4/4/4, T=0]"] == "75.0 ± 25.0 (3 seeds) ⚠"
    assert _table(at).loc["sft", "addition [4/4/4, T=0]"] == "75.0 (1 seed)"  # one machine: no mark
    assert _table(at, 1).loc["d1 (from sft)", "addition [4/4/4, T=0]"] == "+0.0 ⚠"
    assert _table(at, 1).loc["wd1 (from sft)", "addition [4/4/4, T=0]"] == "+25.0"
    runs_table = next(d.value for d in at.dataframe if "run_id" in d.value.columns)
    assert "Intel Xeon (AVX512)" in set(runs_table["hardware"]) and "AMD EPYC (AVX2)" in set(runs_table["hardware"])


ALL_RUNS = {"sft__tiny__addition__s0__g4", "d1__tiny__addition__s0__g4", "d1__tiny__addition__s1__g4",
            "wd1__tiny__addition__s0__g4", "d1__tiny__addition__s0__g8", "sft__tiny-sdar__addition__s0__g4",
            "d1__tiny-sdar__addition__s0__g4", "d1__LLaDA-8B__addition__s0__g4", "wd1__LLaDA-8B__addition__s0__g4"}


@pytest.mark.parametrize("key,value,kept", [
    ("filter_family", "sdar", {"sft__tiny-sdar__addition__s0__g4", "d1__tiny-sdar__addition__s0__g4"}),
    ("filter_model", "LLaDA-8B", {"d1__LLaDA-8B__addition__s0__g4", "wd1__LLaDA-8B__addition__s0__g4"}),
    ("filter_method", "wd1 (from sft)", {"wd1__tiny__addition__s0__g4"}),
    ("filter_benchmark", "addition", ALL_RUNS),
    ("filter_gen_length", 8, {"d1__tiny__addition__s0__g8"}),
])
def test_every_filter_narrows_the_views(runs, key, value, kept):
    at = _app("Run detail")
    assert _run_ids(at) == ALL_RUNS
    at.multiselect(key=key).select(value).run()
    assert not at.exception
    assert _run_ids(at) == kept  # every view draws from the filtered results
    assert f"{len(kept)} of {len(ALL_RUNS)} results shown" in [c.value for c in at.sidebar.caption]
    families = {r.split("__")[1] for r in kept}
    assert _open(at, "Leaderboard").selectbox(key="model").value in families  # the leaderboard view follows too


def test_method_view_spans_models_and_families(runs):
    at = _app("By method")
    at.selectbox(key="method_view").select("d1 (from sft)").run()
    table = next(d.value for d in at.dataframe if "family" in d.value.columns and "model" in d.value.columns
                 and "run_id" not in d.value.columns)
    assert set(zip(table["model"], table["family"])) == {("tiny", "llada"), ("tiny-sdar", "sdar")}
    heat = at.selectbox(key="heat_benchmark")
    assert heat.options == ["addition [4/4/4, T=0]", "addition [8/4/4, T=0]"]  # decodings never pool
    specs = [c.proto.spec for c in at.get("vega_lite_chart")]
    assert any('"rect"' in spec and '"family"' in spec for spec in specs)  # the heatmap is drawn


def test_family_view_compares_every_method_on_every_family_with_deltas_to_each_start(runs):
    """tiny (llada): sft 75.0, d1 62.5 ± 17.7 over 2 seeds (-12.5), wd1 100.0 (+25.0); tiny-sdar: sft
    50.0, d1 75.0 (+25.0); LLaDA-8B (also llada) has rows of its own; each run links to its detail
    (`?run=<id>` preselects it there)."""
    at = _app("Families")
    column = "addition [4/4/4, T=0]"
    at.selectbox(key="family_benchmark").select(column).run()
    table = next(t for t in _tables(at) if "sdar Δ" in t.columns)
    assert list(table.index)[:3] == ["d1 [LLaDA-8B]", "sft [tiny]", "sft"]  # the starts first
    assert set(table.index[3:]) == {"wd1 [LLaDA-8B]", "d1 (from sft) [tiny]", "wd1 (from sft) [tiny]", "d1 (from sft)"}
    assert table.loc["sft [tiny]", "llada"] == "75.0 (1 seed)" and table.loc["sft", "sdar"] == "50.0 (1 seed)"
    assert table.loc["d1 (from sft) [tiny]", "llada"] == "62.5 ± 17.7 (2 seeds)"
    assert table.loc["d1 (from sft) [tiny]", "llada Δ"] == "-12.5" and table.loc["d1 (from sft)", "sdar Δ"] == "+25.0"
    assert table.loc["wd1 (from sft) [tiny]", "llada Δ"] == "+25.0" and table.loc["wd1 (from sft) [tiny]", "sdar"] == ""
    runs_table = next(d.value for d in at.dataframe if "detail" in d.value.columns)
    assert len(runs_table) == 8 and set(runs_table["family"]) == {"llada", "sdar"}
    assert "?run=d1__tiny__addition__s1__g4" in set(runs_table["detail"])
    linked = AppTest.from_file(APP, default_timeout=60)
    linked.query_params["run"] = "wd1__tiny__addition__s0__g4"
    linked.run()
    assert linked.selectbox(key="run").value == "wd1__tiny__addition__s0__g4"  # Run detail opens on it


def test_reproduction_view_marks_only_matching_protocols(runs):
    at = _app("Published")
    table = next(d.value for d in _tab(at, "Published").dataframe if "paper" in d.value.columns)
    rows = {r["method"]: r for r in table.to_dict("records")}
    assert rows["d1"]["status"] == "✓ reproduced" and rows["d1"]["delta"] == 1.0
    assert rows["wd1"]["status"] == "protocol differs"  # even though ours is above the paper


def test_speed_view_shows_rollout_and_training_results(runs):
    at = _app("Speed")
    frames = [d.value for d in at.dataframe]
    rollout = next(f for f in frames if "tokens/forward" in f.columns)
    assert rollout["tokens/s"].tolist() == [2441.0] and rollout["accuracy"].tolist() == [75.0]
    specs = [c.proto.spec for c in at.get("vega_lite_chart")]
    assert any('"tokens/s"' in spec and '"log"' in spec for spec in specs)  # accuracy against speed
    training = next(f for f in frames if "comparison" in f.columns)
    assert dict(zip(training["comparison"], training["gain"])) == {"packing vs padding (tokens/s)": 2.05,
                                                                   "end-to-end RL step, s": 4.29,
                                                                   "end-to-end RL step, mean reward": 0.75}


def test_run_detail_shows_config_provenance_samples_and_curves(runs):
    at = _app("Run detail")
    at.selectbox(key="run").select("d1__tiny__addition__s0__g4").run()
    assert any("lr: 5.0e-05" in c.value for c in at.code)
    samples = next(d.value for d in at.dataframe if "completion" in d.value.columns)
    assert len(samples) == 3
    assert at.selectbox(key="curve").options == ["compute/total_forwards", "compute/total_rollout_tokens",
                                                 "compute/total_update_tokens", "compute/wall_s", "loss/kl",
                                                 "loss/total", "rollout/reward_mean"]
    assert any("Commit" in m.value and "AMD EPYC (AVX2)" in _plain(m.value) for m in at.markdown)
    at.session_state["raw_records"] = True  # the raw records, opened
    assert any(json.loads(j.value).get("hardware", {}).get("cpu_capability") == "AVX2" for j in at.run().json)


# ---------------------------------------------------------------------------------------------
# Training curves overlaid, and methods at equal forward passes
# ---------------------------------------------------------------------------------------------

FORWARDS = "compute/total_forwards"
D1_S0, D1_S1, WD1_S0 = "d1__tiny__addition__s0__g4", "d1__tiny__addition__s1__g4", "wd1__tiny__addition__s0__g4"


def _load(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "leaderboard"))
    import load

    return load


def _chart_rows(chart) -> list[dict]:
    """The data rows an Altair chart sent to the page (Streamlit ships them as Arrow)."""
    import pyarrow as pa

    frames = [pa.ipc.open_stream(d.data.data).read_pandas() for d in chart.proto.datasets]
    return [row for frame in frames for row in frame.to_dict("records")]


def _overlay_chart(at):
    """The run detail's chart: lines dashed by seed, no budget rule (the Compute tab's has one)."""
    return next(c for c in _tab(at, "Run detail").get("vega_lite_chart") if '"strokeDash"' in c.proto.spec)


def test_value_at_uses_a_logged_point_or_interpolates_between_the_two_around_the_budget(monkeypatch):
    load = _load(monkeypatch)
    curve = [{"step": 1, "f": 100, "m": 0.2}, {"step": 2, "f": 200}, {"step": 3, "f": 300, "m": 0.5},
             {"step": 4, "f": 400, "m": 0.9}]
    assert load.value_at(curve, "f", 300, "m") == 0.5  # a point at the budget, as it is
    assert load.value_at(curve, "f", 150, "m") == pytest.approx(0.2 + 0.3 * 50 / 200)  # step 2 logged no m
    assert load.value_at(curve, "f", 375, "m") == pytest.approx(0.8)
    assert load.value_at(curve, "f", 50, "m") is None and load.value_at(curve, "f", 401, "m") is None
    assert load.value_at(curve, "compute/total_forwards", 150, "m") is None  # an older curve: no compute keys


def test_overlay_rows_put_several_runs_and_seeds_against_steps_or_compute(runs, monkeypatch):
    load = _load(monkeypatch)
    items, _ = load.load_all()
    assert load.overlay_default(items, D1_S0) == [D1_S0, D1_S1]  # not the 8-token column, not tiny-sdar
    chosen = [D1_S0, D1_S1, WD1_S0, "d1__tiny__addition__s0__g8", "sft__tiny__addition__s0__g4"]
    rows, left_out = load.overlay_rows(items, chosen, "rollout/reward_mean", FORWARDS)
    points = {(r["run_id"], r["seed"], r["method"]): [] for r in rows}
    for r in rows:
        points[(r["run_id"], r["seed"], r["method"])].append((r["x"], r["y"]))
    assert points == {(D1_S0, 0, "d1 (from sft)"): [(100, 0.2), (200, 0.4), (300, 0.6)],
                      (D1_S1, 1, "d1 (from sft)"): [(80, 0.3), (160, 0.5), (320, 0.9)],
                      (WD1_S0, 0, "wd1 (from sft)"): [(150, 0.5), (300, 0.65), (450, 0.8)]}
    assert left_out == ["d1__tiny__addition__s0__g8 (no compute curves)",
                        "sft__tiny__addition__s0__g4 (no training curves)"]
    rows, left_out = load.overlay_rows(items, chosen, "rollout/reward_mean", "step")
    assert {r["run_id"] for r in rows} == set(chosen[:4]) and len(left_out) == 1  # the older run has steps
    curves = [load.read_curve(load.curve_file(p)) for p, r in items if r.run_id in chosen]
    assert load.x_options(curves) == ["step", FORWARDS, "compute/total_rollout_tokens", "compute/total_update_tokens",
                                      "compute/wall_s", "time_s"]
    older = next(p for p, r in items if r.run_id == "d1__tiny__addition__s0__g8")
    assert load.x_options([load.read_curve(load.curve_file(older))]) == ["step", "time_s"]


def test_compute_table_compares_methods_at_equal_steps_and_equal_forwards(runs, monkeypatch):
    """d1 (2 seeds) and wd1 (2 seeds) on tiny: the budget is d1 s0's final 300 forwards; d1 is 0.6 and
    0.85 there, wd1 0.65 and 0.7 (`D1`, `WD1`); the SFT start and the other models recorded no compute."""
    load = _load(monkeypatch)
    _rl(runs, "wd1_1", "wd1", 1, [1, 1, 0, 1])
    items, _ = load.load_all()
    column = "addition [4/4/4, T=0]"
    assert load.compute_metrics(items, column) == (["loss/kl", "loss/total", "rollout/reward_mean"],
                                                   "rollout/reward_mean")
    budget, rows = load.compute_table(items, column)
    assert budget == 300
    by = {(r["model"], r["method"]): r for r in rows}
    assert set(by) == {("LLaDA-8B", "d1"), ("LLaDA-8B", "wd1"), ("tiny", "sft"), ("tiny", "d1 (from sft)"),
                       ("tiny", "wd1 (from sft)"), ("tiny-sdar", "sft"), ("tiny-sdar", "d1 (from sft)")}
    d1, wd1, sft = by[("tiny", "d1 (from sft)")], by[("tiny", "wd1 (from sft)")], by[("tiny", "sft")]
    assert d1["equal steps"] == "62.5 ± 17.7 (2 seeds)" and wd1["equal steps"] == "87.5 ± 17.7 (2 seeds)"
    assert (d1["forwards"], d1["update tokens"], d1["wall time"]) == ("310", "1,100", "32.0 s")  # (300 + 320) / 2
    assert (wd1["forwards"], wd1["update tokens"], wd1["wall time"]) == ("425", "1,900", "45.0 s")
    assert d1["equal forwards"] == "0.725 ± 0.177 (2 seeds)"  # (0.6 + 0.85) / 2, |0.85 - 0.6| / sqrt 2
    assert wd1["equal forwards"] == "0.675 ± 0.035 (2 seeds)"  # (0.65 + 0.7) / 2
    assert d1["note"] == wd1["note"] == "" and d1["steps"] == "10"
    assert sft["equal steps"] == "75.0 (1 seed)" and sft["forwards"] == sft["equal forwards"] == ""
    assert sft["note"] == "no compute record; no training curves"  # reported, not a crash
    assert by[("tiny-sdar", "d1 (from sft)")]["family"] == "sdar"
    budget, rows = load.compute_table(items, column, "loss/total")  # 1/s: d1 s1 at 300 is 1/2 - (1/6) 140/160
    d1 = next(r for r in rows if r["model"] == "tiny" and r["method"] == "d1 (from sft)")
    assert budget == 300 and d1["equal forwards"] == "0.344 ± 0.015 (2 seeds)"
    # an older seed of wd1: a compute record but no curves; an older column: neither
    _result(runs, "wd1_2", method="wd1", init="sft", seed=2, acc=[1, 1, 1, 1], compute=_compute(300, 100, 10, 5.0))
    items, _ = load.load_all()
    wd1 = next(r for r in load.compute_table(items, column)[1]
               if r["model"] == "tiny" and r["method"] == "wd1 (from sft)")
    assert wd1["equal forwards"] == "0.675 ± 0.035 (2 seeds)" and wd1["forwards"] == "417"  # (450 + 400 + 400) / 3
    assert wd1["note"] == "1 of 3 seeds: no training curves"
    assert load.compute_table(items, "addition [8/4/4, T=0]") == (None, [
        {"family": "llada", "model": "tiny", "method": "d1 (from sft)", "equal steps": "50.0 (1 seed)", "steps": "10",
         "forwards": "", "update tokens": "", "wall time": "1.5 s", "equal forwards": "",
         "note": "no compute record; no compute curves"}])  # every trained result records its wall time


def test_compute_metric_defaults_to_the_validation_score_when_logged(runs, monkeypatch):
    """wd1 s1 validates at steps 2 and 3 (250 and 400 forwards): val/accuracy is the default, and its
    last validation is the budget (the other runs have no val/accuracy)."""
    load = _load(monkeypatch)
    curve = _curve(*WD1[1][1])
    curve[1]["val/accuracy"], curve[2]["val/accuracy"] = 0.5, 0.75
    _result(runs, "wd1_1", method="wd1", init="sft", seed=1, acc=[1, 1, 0, 1], curve=curve)
    items, _ = load.load_all()
    names, default = load.compute_metrics(items, "addition [4/4/4, T=0]")
    assert default == "val/accuracy" and "rollout/reward_mean" in names
    budget, rows = load.compute_table(items, "addition [4/4/4, T=0]")
    by = {(r["model"], r["method"]): r for r in rows}
    assert budget == 400 and by[("tiny", "wd1 (from sft)")]["equal forwards"] == "0.750 (1 seed)"
    assert by[("tiny", "wd1 (from sft)")]["note"] == "compute recorded by 1 of 2 seeds; 1 of 2 seeds: no val/accuracy"
    assert by[("tiny", "d1 (from sft)")]["note"] == "no val/accuracy"


def test_run_detail_overlays_runs_and_seeds_against_steps_and_forwards(runs):
    at = _app("Run detail")
    at.selectbox(key="run").select(D1_S0).run()
    assert at.multiselect(key="overlay").value == [D1_S0, D1_S1]  # the run and its recipe's other seed
    assert at.selectbox(key="curve").value == "rollout/reward_mean" and at.selectbox(key="curve_x").value == "step"
    at.multiselect(key="overlay").select(WD1_S0).select("d1__tiny__addition__s0__g8").run()
    chart = _overlay_chart(at)
    assert {(r["run_id"], r["x"]) for r in _chart_rows(chart) if r["x"] == 2} == {
        (D1_S0, 2), (D1_S1, 2), (WD1_S0, 2), ("d1__tiny__addition__s0__g8", 2)}
    at.selectbox(key="curve_x").select(FORWARDS).run()
    assert not at.exception
    chart = _overlay_chart(at)
    rows = _chart_rows(chart)
    assert sorted((r["run_id"], r["seed"], r["x"], r["y"]) for r in rows if r["run_id"] != D1_S0) == [
        (D1_S1, 1, 80, 0.3), (D1_S1, 1, 160, 0.5), (D1_S1, 1, 320, 0.9),
        (WD1_S0, 0, 150, 0.5), (WD1_S0, 0, 300, 0.65), (WD1_S0, 0, 450, 0.8)]
    assert {r["method"] for r in rows} == {"d1 (from sft)", "wd1 (from sft)"}
    assert f'"title": "{FORWARDS}"' in chart.proto.spec
    assert "Left out: d1__tiny__addition__s0__g8 (no compute curves)" in _captions(at)
    at.selectbox(key="run").select(WD1_S0).run()  # another run starts its own overlay
    assert at.multiselect(key="overlay").value == [WD1_S0]
    at.selectbox(key="run").select("sft__tiny__addition__s0__g4").run()
    assert "No training metrics (metrics.jsonl) beside the chosen results." in _captions(at)


def test_compute_view_shows_scores_at_equal_steps_and_forwards(runs):
    _rl(runs, "wd1_1", "wd1", 1, [1, 1, 0, 1])
    at = _app("Compute")
    assert at.selectbox(key="compute_benchmark").value == "addition [4/4/4, T=0]"
    assert at.selectbox(key="compute_metric").value == "rollout/reward_mean"
    compute = _tab(at, "Compute")
    table = next(t for t in _tables(compute) if "equal forwards" in t.columns)
    tiny = table[table["model"] == "tiny"]
    assert tiny.loc["d1 (from sft)", "equal forwards"] == "0.725 ± 0.177 (2 seeds)"
    assert tiny.loc["wd1 (from sft)", "equal forwards"] == "0.675 ± 0.035 (2 seeds)"
    assert tiny.loc["wd1 (from sft)", "equal steps"] == "87.5 ± 17.7 (2 seeds)"
    assert tiny.loc["wd1 (from sft)", "forwards"] == "425"
    assert "sft" not in tiny.index  # rows without a compute record are collapsed, with their wall time
    collapsed = compute.expander[0]
    assert "without a compute record" in collapsed.label
    other = _tables(collapsed)[0]
    assert other[other["model"] == "tiny"].loc["sft", "note"] == "no compute record; no training curves"
    assert other[other["model"] == "tiny"].loc["sft", "wall time"] == "1.5 s"
    assert any("rollout/reward_mean at 300 forwards" in c for c in _captions(at))
    # forwards to reach: by default the lowest best reward among the runs (d1 s0's 0.6), so every run reaches it
    assert at.number_input(key="compute_reach").value == 0.6
    assert tiny.loc["d1 (from sft)", "forwards to reach 0.6"] == "250 ± 71 (2 seeds)"  # 300; 160 + 160 x 0.1/0.4
    chart = next(c for c in compute.get("vega_lite_chart") if '"rule"' in c.proto.spec)
    assert {r["run_id"] for r in _chart_rows(chart) if "run_id" in r and isinstance(r["run_id"], str)} == {
        D1_S0, D1_S1, WD1_S0, "wd1__tiny__addition__s1__g4"}
    at.selectbox(key="compute_metric").select("loss/total").run()
    assert any("loss/total at 300 forwards" in c for c in _captions(at))
    at.selectbox(key="compute_benchmark").select("addition [8/4/4, T=0]").run()  # an older run: no compute at all
    assert not at.exception
    assert any("no run here logged compute curves" in c.value for c in at.caption)
    table = _tables(_tab(at, "Compute").expander[0])[0]  # no row with a record: the collapsed table, open
    assert table.loc["d1 (from sft)", "note"] == "no compute record; no compute curves"


def test_leaderboard_loader_is_torch_free(runs):
    code = ("import sys; sys.path.insert(0, 'leaderboard'); import load; items, bad = load.load_all(); "
            "assert items and bad and load.load_bench(); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# ---------------------------------------------------------------------------------------------
# End to end: `dare leaderboard` on loopback, opened in headless Chromium
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_browser_shows_the_leaderboard(runs, tmp_path):
    """Installs Chromium and its driver through the Makefile (`make browser`) when missing, starts the app with
    `dare leaderboard` (`dare.app.screenshot`'s machinery, which `make screenshot` uses too), and reads in the
    page: the landing ranking (rank classes, the test named, the tie said), the Leaderboard tab's table (a mean over two
    machines marked ⚠), a Published row with its source, the Compute tab's scores at equal forwards, and a
    Run detail opened by a `?run=` link. Then checks the docs' pictures show the committed results."""
    from dare.app import screenshot

    _result(runs, "repro_other_xeon", method="wd1", init="pretrained", seed=1, acc=[1, 1, 1, 1], model="LLaDA-8B",
            cpu="Intel Xeon", run_id="wd1__LLaDA-8B__addition__s1__xeon",
            reference={"value": 0.80, "source": "wd1 Table 1", "same_decoding": False})
    r = subprocess.run(["make", "-s", "browser"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with screenshot.leaderboard([runs]) as url, screenshot.chromium(1400, 1800) as driver:
        port = int(url.rsplit(":", 1)[1])
        driver.get(url)
        # the landing view: scope, the ranking of addition [4/4/4], the glossary
        text = screenshot.wait_for(driver, "Welch's t-test over seeds (two-sided), Holm's correction")
        for expected in ("dLLM post-training leaderboard", "What is here.", "10 results", "addition [4/4/4, T=0]",
                         "4 invalid result file(s) skipped", "Smoke test: addition", "none here: the best is tied",
                         "Across families: accuracy", "Proxy check",
                         "⚠ marks a mean or delta over runs from different hardware or lock files"):
            assert expected in text, expected
        shot = tmp_path / "landing.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        # the Leaderboard tab: one model's recipes (family llada, model LLaDA-8B: sorted first)
        screenshot.open_tab(driver, "Leaderboard")
        text = screenshot.wait_for(driver, "LLaDA-8B (llada)")
        # only the open tab runs: its table may be drawn after its header (and the page's first rows are then the
        # invalid files' list), so wait for the recipes' rows themselves
        screenshot.wait_until(driver, lambda d: any(r.startswith("wd1") for r in screenshot.table_rows(d)))
        rows = screenshot.table_rows(driver)
        assert any(r.startswith("d1") and "75.0 (1 seed)" in r and "⚠" not in r for r in rows), rows
        assert any(r.startswith("wd1") and "100.0 ± 0.0 (2 seeds) ⚠" in r for r in rows), rows  # AVX2 + Xeon
        # the Published tab: a data frame, whose rows in view (the first methods', their first columns) are read
        screenshot.open_tab(driver, "Published")
        screenshot.wait_for(driver, "No published number")
        screenshot.wait_until(driver, lambda d: any("not run here" in r and "LLaDA-8B-Instruct" in r and "gen " in r
                                                    for r in screenshot.grid_rows(d)))
        # the Compute tab: d1 and wd1 at 300 forwards
        screenshot.open_tab(driver, "Compute")
        text = screenshot.wait_for(driver, "0.725 ± 0.177", 30)
        for expected in ("0.725 ± 0.177 (2 seeds)", "0.650 (1 seed)", "rollout/reward_mean at 300 forwards",
                         "without a compute record"):
            assert expected in text, expected
        # a link to one run opens Run detail on it
        driver.get(f"{url}/?run={D1_S1}")
        text = screenshot.wait_for(driver, "Result file:")
        assert "d1 (from sft) on tiny (llada)" in text and "Training curves" in text
    with pytest.raises(OSError):  # stopping `dare leaderboard` stops its server (no orphaned streamlit)
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    # the docs' pictures (make screenshot) show the results committed now
    assert screenshot.stale(REPO / "docs" / "img") is None, screenshot.stale(REPO / "docs" / "img")


def test_the_docs_pictures_are_checked_against_the_committed_results(tmp_path):
    """`screenshot.stale` names a missing picture and a changed result set (the check the browser test makes)."""
    from dare.app import screenshot

    results = tmp_path / "results"
    (results / "tiny").mkdir(parents=True)
    (results / "tiny" / "a.json").write_text("{}")
    img = tmp_path / "img"
    img.mkdir()
    assert "landing.png, published.png missing: run `make screenshot`" in screenshot.stale(img, results)
    for name in screenshot.PICTURES:
        (img / name).write_bytes(b"png")
    (img / screenshot.RECORD).write_text(json.dumps({"results": screenshot.results_fingerprint(results)}))
    assert screenshot.stale(img, results) is None
    (results / "tiny" / "b.json").write_text("{}")  # a result committed after the pictures
    assert "older results than leaderboard/results/ holds now" in screenshot.stale(img, results)
    first = screenshot.results_fingerprint(results)
    (results / "tiny" / "b.json").write_text('{"x": 1}')  # rewritten: another fingerprint
    assert screenshot.results_fingerprint(results) != first


def test_committed_demo_and_baseline_results_appear(monkeypatch):
    """The committed results (the demo and the tiny-task comparison of every baseline) load without
    an invalid file, and the leaderboard's cells are the seed statistics of those files."""
    monkeypatch.syspath_prepend(str(REPO / "leaderboard"))
    import load

    monkeypatch.delenv("DARE_LEADERBOARD_RUNS", raising=False)
    monkeypatch.delenv("DARE_LEADERBOARD_RESULTS", raising=False)
    items, invalid = load.load_all([])
    assert not invalid, invalid
    # demo and tiny-task runs with the same run id are one run, shown once, and so are runs with the same samples
    # (one run published in two folders: demo and tiny) when counted; the sweep's runs and their reruns with
    # compute records (tiny-llada-compute) are one config whose starts were trained on different machines
    # (AVX-512 and AVX2 kernels): one row, six distinct runs of three seeds, counted as three seeds (a rerun is
    # not a seed), its mean marked as mixing hardware
    tiny = [r for p, r in items if r.model.name == "tiny-llada-addition"]
    assert len({load.result_key(r) for r in tiny}) == len(tiny)
    # one run id more than once: only an SFT start, trained again from its config on other days (in tiny/, in the
    # folders of the comparisons that trained from it, in demo/), other weights and other samples; all are kept,
    # each beside the runs that trained from it (read from the files: a contributor's start reused from runs/ adds
    # one more, and nothing here names its score)
    twice = {i for i in {r.run_id for r in tiny} if sum(r.run_id == i for r in tiny) > 1}
    assert {i.split("__")[0] for i in twice} == {"sft"}
    starts = [r for r in tiny if r.run_id in twice]
    assert len({load.result_key(r) for r in starts}) == len(starts) >= 2
    assert {r.method.baseline for r in tiny} >= {"sft", "peft", "vrpo", "d1", "coupled_grpo", "wd1"}
    at = _app("Leaderboard")
    at.selectbox(key="family").select("llada").run()
    model = tiny[0].model.name
    at.selectbox(key="model").select(model).run()
    table = _table(at)
    for method in ("d1", "coupled_grpo", "wd1", "peft", "vrpo"):
        runs = [r for r in tiny if r.method.baseline == method]
        distinct = load.distinct_runs(runs)
        # three seeds each run twice (d1: three times, the demo's at b8575d7 from its own retrained start); peft's
        # seeds 1 and 2 wrote identical samples and are still two seeds
        assert len(distinct) == (9 if method == "d1" else 6) and len({r.training.recipe_hash for r in runs}) == 1
        seeds = 3
        column = load.benchmark_label(runs[0])
        cell = table.loc[f"{method} (from sft)", column]
        assert cell == load.format_cell(runs) and cell.endswith(load.MIXED) == load.mixed(runs), method
        assert f"({seeds} seeds, {len(distinct)} runs)" in cell, (method, cell)
    assert load.mixed([r for r in tiny if r.method.baseline == "d1"])


def test_every_committed_result_says_which_machine_and_commit_made_it():
    """Schema 2 with the fingerprint (CPU model, torch's ISA, threads, BLAS), the lock the environment
    came from, the exact command, a clean tree, one commit per comparison (each folder under
    leaderboard/results/), no machine path, and at most 64 samples beside each."""
    from dare.results import load_results
    from dare.utils import sha256_file

    valid, invalid = load_results(REPO / "leaderboard" / "results", pattern="**/result_*.json")
    assert valid and not invalid
    commits: dict[str, set] = {}  # folder -> the commits its results came from
    for path, r in valid:
        hw = r.provenance.hardware
        assert r.schema_version in ("2", "3") and hw.cpu_model and hw.cpu_capability and hw.threads and hw.blas, path
        assert r.provenance.lock and r.provenance.lock.lock == "locks/train.txt", path
        assert r.provenance.command and r.training.command and r.training.recipe_hash and r.training.config, path
        assert r.provenance.git_dirty is False, path
        folder = path.relative_to(REPO / "leaderboard" / "results").parts[0]
        commits.setdefault(folder, set()).add(r.provenance.git_commit)
        for f in [path, *path.parent.glob("*.yaml")]:
            text = f.read_text()
            assert "/work/" not in text and "/home/" not in text and "/tmp/" not in text, f
        samples = path.parent / r.artifacts.samples  # a light repository: at most 64 samples per result
        assert samples.read_text().count("\n") <= 64 and sha256_file(samples) == r.artifacts.samples_sha256, path
    assert all(len(c) == 1 for c in commits.values()), commits


def test_committed_results_fill_the_family_table(monkeypatch):
    """The tiny comparison on the committed results: every RL method on LLaDA, SDAR and LLaDA2.x,
    3 seeds or more each, above each family's own SFT start."""
    monkeypatch.syspath_prepend(str(REPO / "leaderboard"))
    import load

    monkeypatch.delenv("DARE_LEADERBOARD_RUNS", raising=False)
    monkeypatch.delenv("DARE_LEADERBOARD_RESULTS", raising=False)
    items, _ = load.load_all([])
    addition = [(p, r) for p, r in items if r.benchmark.name == "addition" and r.model.name.startswith("tiny-")]
    families, rows, runs = load.family_table(addition, "addition [4/4/4, T=0]")
    assert {"llada", "sdar", "llada2"} <= set(families)
    by_method = {row["method"]: row for row in rows}
    assert rows[0]["method"] == "sft"
    # TraceRL also has a value-model recipe, wd1 a b1 one (dynamic blocks) on SDAR, GDSD its TLC variant: each
    # recipe keeps one label (one row) on every family
    plain = {name: [m for m in by_method if m.startswith(f"{name} (from sft)") and other not in m]
             for name, other in (("tracerl", "value_model=True"), ("wd1", "dynamic=True"))}
    assert all(len(labels) == 1 for labels in plain.values()), plain
    assert any("value_model=True" in m for m in by_method) and any("dynamic=True" in m for m in by_method)
    assert {"gdsd (from sft) (variant=gdsd)", "gdsd (from sft) (variant=tlc)"} <= set(by_method)
    for method in ("d1", "coupled_grpo", "wd1", "tracerl", "peft"):
        for family in ("llada", "sdar", "llada2"):
            row = by_method[plain[method][0] if method in plain else f"{method} (from sft)"]
            assert re.search(r"\((\d+) seeds", row[family]) and row[f"{family} Δ"].startswith("+"), (method, family)
    assert all(re.search(r"\((\d+) seeds", by_method["vrpo (from sft)"][f]) for f in ("llada", "sdar", "llada2"))
    assert {r["detail"] for r in runs} == {f"?run={r['run_id']}" for r in runs}


def test_a_seed_run_again_or_published_twice_counts_once(runs, monkeypatch):
    """Issue 49's first defect: d1's seeds 0-2 run three times (two folders of the same runs and one of reruns)
    showed as "9 seeds". A seed is a distinct (recipe, start, seed): reruns are averaged into their seed and
    said ("3 runs"), the same samples published in two folders count once."""
    monkeypatch.syspath_prepend(str(REPO / "leaderboard"))
    import load

    for seed, acc in [(0, [1, 1, 1, 1]), (1, [0, 0, 1, 1])]:  # reruns of d1's seeds 0 and 1, other numbers
        _rl(runs, f"d1_rerun_{seed}", "d1", seed, acc, run_id=f"d1__tiny__addition__s{seed}__rerun")
    twin = json.loads((runs / "d1_0" / "result_addition.json").read_text())  # seed 0 published again
    twin["run_id"] = "d1__tiny__addition__s0__published-elsewhere"
    (runs / "elsewhere").mkdir()
    write_result(twin, runs / "elsewhere" / "result_addition.json")
    for name in ("d1_0", "elsewhere"):  # identical samples beside both copies
        r = json.loads((runs / name / "result_addition.json").read_text())
        r["artifacts"]["samples_sha256"] = "ab" * 32
        (runs / name / "result_addition.json").write_text(json.dumps(r))
    items, _ = load.load_all()
    d1 = [r for _, r in items if r.method.baseline == "d1" and r.model.name == "tiny" and r.decoding.gen_length == 4]
    assert len(d1) == 5 and len(load.distinct_runs(d1)) == 4  # seeds 0 and 1 run twice; the twin is no run
    assert load.per_seed(d1) == [0.875, 0.5]  # seed 0: (0.75 + 1) / 2, seed 1: (0.5 + 0.5) / 2
    assert load.format_cell(d1) == "68.8 ± 26.5 (2 seeds, 4 runs)"
    rows = {(r["method"], r["benchmark"]): r for r in load.long_rows(d1)}
    assert rows[("d1 (from sft)", "addition [4/4/4, T=0]")]["n"] == 2
    at = _app("Leaderboard")
    at.selectbox(key="family").select("llada").run()
    at.selectbox(key="model").select("tiny").run()
    assert _table(at).loc["d1 (from sft)", "addition [4/4/4, T=0]"] == "68.8 ± 26.5 (2 seeds, 4 runs)"


def test_every_setting_of_the_decoding_keys_its_own_column_and_heatmap_cell(runs, monkeypatch):
    """Issue 49's second defect: on chain one cell pooled nine decoders (maskgit+RCR 79.7, parallel 17.2, ...).
    The cache, the commit rule and its threshold, the sampler and any other setting key the column; each
    family's default decoding shares one, so families still compare."""
    monkeypatch.syspath_prepend(str(REPO / "leaderboard"))
    import load

    for name, change in [("dual", {"extra": {"cache": "dual"}}), ("parallel", {"threshold": 0.9}),
                         ("maskgit", {"sampler": "maskgit", "extra": {"rcr": True}})]:
        _result(runs, f"sft_{name}", method="sft", init="scratch", seed=0, acc=[0, 0, 0, 1],
                run_id=f"sft__tiny__addition__s0__{name}")
        r = json.loads((runs / f"sft_{name}" / "result_addition.json").read_text())
        r["decoding"].update(change)
        (runs / f"sft_{name}" / "result_addition.json").write_text(json.dumps(r))
    items, _ = load.load_all()
    sft = [r for _, r in items if r.method.baseline == "sft" and r.model.name == "tiny"]
    assert sorted(load.benchmark_label(r) for r in sft) == [
        "addition [4/4/4, T=0, cache=dual]", "addition [4/4/4, T=0, sampler=maskgit, rcr=True]",
        "addition [4/4/4, T=0, threshold=0.9]", "addition [4/4/4, T=0]"]
    sdar = next(r for _, r in items if r.model.family == "sdar")
    assert load.benchmark_label(sdar) == "addition [4/4/4, T=0]"  # the block sampler is SDAR's default
    heat = [row for row in load.family_method_rows(items) if row["method"] == "sft" and row["family"] == "llada"]
    assert sorted((row["benchmark"], row["mean"]) for row in heat) == [
        ("addition [4/4/4, T=0, cache=dual]", 25.0), ("addition [4/4/4, T=0, sampler=maskgit, rcr=True]", 25.0),
        ("addition [4/4/4, T=0, threshold=0.9]", 25.0), ("addition [4/4/4, T=0]", 75.0)]


# ---------------------------------------------------------------------------------------------
# The landing view, charts a reader can use, and usability (issue 49, items 2, 4, 5)
# ---------------------------------------------------------------------------------------------


def test_t_quantiles_and_the_95_percent_interval(monkeypatch):
    load = _load(monkeypatch)
    assert load.t_975(1) == 12.706 and load.t_975(2) == 4.303 and load.t_975(30) == 2.042
    for df, exact in [(31, 2.0395), (40, 2.0211), (60, 2.0003), (120, 1.9799), (1000, 1.9623)]:
        assert abs(load.t_975(df) - exact) < 0.001, df  # beyond the table, within 0.001
    mean, low, high, n = load.interval([0.97, 0.99, 0.98])  # s = 0.01: half-width 4.303 x 0.01 / sqrt 3
    assert n == 3 and mean == pytest.approx(0.98) and high - mean == pytest.approx(0.024843, abs=1e-6)
    assert low == pytest.approx(2 * mean - high)
    assert load.interval([0.5]) == (0.5, None, None, 1)  # one seed: no interval


def test_overview_ranks_methods_in_classes_with_bootstrap_intervals(runs, monkeypatch):
    """On addition [4/4/4] ranked on tiny: sft (start) 75, d1 62.5 (2 seeds), wd1 100 (1 seed: never tested, so
    never separated from d1: one class, no star). At equal forwards (rollout/reward_mean at 300, the Compute tab's
    budget): d1 0.6 and 0.85, wd1 0.65; the mean from 150 (wd1's first point) to 300: d1 s0 (0.3 to 0.6 through
    0.4 at 200) 0.45, d1 s1 (0.475 to 0.85 through 0.5 at 160) 0.6625, wd1 (0.5 to 0.65) 0.575."""
    load = _load(monkeypatch)
    import rank

    items, _ = load.load_all()
    column = "addition [4/4/4, T=0]"
    assert load.landing_column(items) == column  # no headline task here: the fullest column
    b = rank.board(items, column, "tiny")
    assert (b.models, b.metric, b.model) == (["LLaDA-8B", "tiny", "tiny-sdar"], "accuracy", "tiny")
    assert [row["method"] for row in b.rows] == ["wd1 (from sft)", "d1 (from sft)", "sft (start)"]
    by = {row["method"]: row for row in b.rows}
    assert by["wd1 (from sft)"]["class"] == by["d1 (from sft)"]["class"] == 1 and b.ranking.best is None
    assert by["sft (start)"]["class"] is None and by["sft (start)"]["stable"] == "start"
    d1 = [r for _, r in items if r.method.baseline == "d1" and r.model.name == "tiny" and r.decoding.gen_length == 4]
    low, high = rank.bootstrap_interval(rank.evaluations(d1, "accuracy"))
    assert by["d1 (from sft)"]["tiny"] == rank.cell_text(0.625, low, high) and low < 0.5 and high > 0.75
    assert by["d1 (from sft)"]["tiny-sdar"].startswith("75.0 [") and by["d1 (from sft)"]["LLaDA-8B"] == ""
    assert (by["d1 (from sft)"]["mean"], by["d1 (from sft)"]["seeds"], by["wd1 (from sft)"]["seeds"]) == (62.5, 2, 1)
    assert by["d1 (from sft)"]["stable"] == by["wd1 (from sft)"]["stable"] == "too few seeds"  # 2 and 1 seeds
    assert (b.compute.metric, b.compute.budget, b.compute.start) == ("rollout/reward_mean", 300, 150)
    assert by["d1 (from sft)"]["at budget"] == pytest.approx(72.5) and by["wd1 (from sft)"]["at budget"] == 65.0
    assert by["d1 (from sft)"]["area"] == pytest.approx(55.625, abs=0.01) and by["wd1 (from sft)"]["area"] == 57.5
    assert by["d1 (from sft)"]["class at budget"] == 1 and by["sft (start)"]["at budget"] is None
    assert by["d1 (from sft)"]["paper"] == "https://arxiv.org/abs/2504.12216"
    assert by["d1 (from sft)"]["code"] == "https://github.com/dllm-reasoning/d1"
    numbers = {(x["method"], x["model"]): x for x in b.numbers}
    assert numbers[("d1 (from sft)", "tiny")]["low"] == pytest.approx(100 * low, abs=0.01)
    assert rank.default_model(rank.column_cells(items, column)) == "LLaDA-8B"  # two ranked methods, first
    s = load.scope(items)
    assert s["models"] == ["LLaDA-8B", "tiny", "tiny-sdar"] and s["tasks"] == ["addition"] and s["runs"] == 9


def test_overview_tab_shows_the_classes_the_summaries_and_the_glossary(runs):
    """The landing view: the smoke-test label, the table (sortable, its headers naming the metric), its search,
    the caption naming the test and the correction, the last update, the summary across families (no mean for a
    method run on fewer models than the column has), the proxy check and the glossary."""
    at = _app()
    assert at.selectbox(key="overview_column").value == "addition [4/4/4, T=0]"
    assert at.selectbox(key="overview_column").options == ["addition [4/4/4, T=0] (smoke test)",
                                                           "addition [8/4/4, T=0] (smoke test)"]
    at.selectbox(key="overview_model").select("tiny").run()
    overview = _tab(at, "Overview")
    text = " ".join(_plain(m.value) for m in overview.markdown)
    assert "9 results (9 distinct runs)" in text and "tiny-sdar" in text
    assert [_plain(w.value) for w in overview.warning] == [
        "Smoke test: addition shows that every method runs and learns; it cannot separate methods (0 of 0 pairs "
        "differ on tiny)."]
    caption = _captions(overview)[0]
    for expected in ("**accuracy** on addition [4/4/4, T=0]", "Welch's t-test over seeds (two-sided), Holm's "
                     "correction", "none here: the best is tied", "hierarchical bootstrap over seeds",
                     "rollout/reward_mean at 300 forward passes", "Last updated 2026-11-21"):
        assert expected in caption, expected
    tables = {tuple(d.value.columns)[:2]: d for d in overview.dataframe}
    board = tables[("class", "method")]
    assert list(board.value["method"]) == ["wd1 (from sft)", "d1 (from sft)", "sft (start)"]
    headers = json.loads(board.proto.columns)
    assert headers["class"]["label"] == "class (accuracy)" and headers["tiny"] == {"label": "tiny: accuracy, % [95%]"}
    at.text_input(key="overview_search").input("WD1").run()
    board = next(d for d in _tab(at, "Overview").dataframe if "class" in d.value.columns)
    assert list(board.value["method"]) == ["wd1 (from sft)"]
    across = next(d.value for d in _tab(at, "Overview").dataframe if "across" in d.value.columns)
    assert across["across"].isna().all() and "2 of 3" in list(across["models"])  # nothing ran on all three
    proxy = next(d.value for d in _tab(at, "Overview").dataframe if "tau" in d.value.columns)
    assert set(proxy["model"]) == {"LLaDA-8B", "tiny"} and (proxy["overlap"] < 5).all()
    chart = _tab(at, "Overview").get("vega_lite_chart")[0]
    assert "95% bootstrap interval over seeds and problems" in chart.proto.spec  # the table's intervals, named
    assert '"yOffset"' not in chart.proto.spec  # a line per dot
    glossary = next(d.value for d in _tab(at, "Overview").dataframe if "objective" in d.value.columns)
    from dare.app.baselines import names
    assert sorted(glossary["method"]) == names()  # every baseline, from its front matter
    d1 = glossary[glossary["method"] == "d1"].iloc[0]
    assert d1["arXiv"] == "https://arxiv.org/abs/2504.12216" and "mean-field" in d1["objective"]
    assert d1["paper"].startswith("d1: Scaling Reasoning")


def test_the_start_row_stays_under_a_method_filter(runs):
    """Filtering to wd1 used to drop the sft start and with it every delta, silently."""
    at = _app("Leaderboard")
    at.multiselect(key="filter_method").select("wd1 (from sft)").run()
    at.selectbox(key="family").select("llada").run()
    at.selectbox(key="model").select("tiny").run()
    assert list(_table(at).index) == ["sft", "wd1 (from sft)"]
    assert _table(at, 1).loc["wd1 (from sft)", "addition [4/4/4, T=0]"] == "+25.0"
    assert any("The start (sft) is kept" in c for c in _captions(_tab(at, "Leaderboard")))
    # a filter that leaves no start (the sft start was evaluated at gen 4): the deltas say what they are against
    _result(runs, "wd1_long", method="wd1", init="sft", seed=0, acc=[1, 1, 0, 1], gen=8)
    at = _app("Leaderboard")
    at.multiselect(key="filter_gen_length").select(8).run()
    at.selectbox(key="family").select("llada").run()
    assert list(_table(at).index) == ["d1 (from sft)", "wd1 (from sft)"]
    assert any("holds no start of this model" in c for c in _captions(_tab(at, "Leaderboard")))


def test_a_run_link_opens_run_detail_with_that_run(runs):
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["run"] = D1_S1
    at.run()
    assert not at.exception
    tabs = next(b for b in _blocks(at) if b.proto.HasField("tab_container"))
    labels = [t.label for t in at.tabs]
    assert labels[tabs.proto.tab_container.default_tab_index] == "Run detail"
    assert at.selectbox(key="run").value == D1_S1
    assert at.selectbox(key="run").format_func(D1_S1) == f"d1 (from sft) · llada · addition · seed 1 · " \
        f"{at.selectbox(key='run').format_func(D1_S1).split(' · ')[4]} · {D1_S1}"
    plain_at = _app()  # without a link the Overview opens
    tabs = next(b for b in _blocks(plain_at) if b.proto.HasField("tab_container"))
    assert [t.label for t in plain_at.tabs][tabs.proto.tab_container.default_tab_index] == "Overview"


def _blocks(at):
    stack, out = [at._tree], []
    while stack:
        node = stack.pop()
        out.append(node)
        children = getattr(node, "children", None)
        stack += list(children.values()) if isinstance(children, dict) else []
    return [b for b in out if type(b).__name__ == "Block"]


def test_run_detail_puts_the_raw_records_last_in_an_expander(runs):
    at = _app("Run detail")
    at.selectbox(key="run").select(D1_S0).run()
    detail = _tab(at, "Run detail")
    raw = next(e for e in detail.expander if e.label.startswith("Raw records"))
    assert not detail.json  # drawn when opened
    at.session_state["raw_records"] = True
    detail = _tab(at.run(), "Run detail")
    raw = next(e for e in detail.expander if e.label.startswith("Raw records"))
    assert len(detail.json) == len(raw.json) == 2 and '"hardware"' in raw.json[0].value  # none outside it
    order = list(detail.children.values())
    curves = next(i for i, c in enumerate(order) if c in detail.subheader and c.value == "Training curves")
    assert next(i for i, c in enumerate(order) if c is raw) > curves  # after the curves
    assert next(e for e in detail.expander if e.label.startswith("Resolved config")).code[0].language == "yaml"


def test_pareto_front_and_forwards_to_reach(monkeypatch):
    load = _load(monkeypatch)
    rows = [{"s": "a", "tokens/s": 10.0, "accuracy": 90.0}, {"s": "b", "tokens/s": 50.0, "accuracy": 80.0},
            {"s": "c", "tokens/s": 40.0, "accuracy": 70.0}, {"s": "d", "tokens/s": 100.0, "accuracy": 60.0},
            {"s": "e", "tokens/s": None, "accuracy": 99.0}, {"s": "f", "tokens/s": 10.0, "accuracy": 85.0}]
    assert [r["s"] for r in load.pareto(rows)] == ["d", "b", "a"]  # c is beaten by b, f by a; e has no speed
    curve = _curve(*D1[1][1])  # forwards 80, 160, 320; rewards 0.3, 0.5, 0.9
    assert load.forwards_to_reach(curve, "rollout/reward_mean", 0.3) == 80
    assert load.forwards_to_reach(curve, "rollout/reward_mean", 0.7) == pytest.approx(240)
    assert load.forwards_to_reach(curve, "rollout/reward_mean", 0.95) is None


def test_speed_view_is_per_task_with_its_pareto_front(runs):
    _result(runs, "sdar_fast", method="d1", init="sft", seed=1, acc=[0, 1, 0, 0], model="tiny-sdar", family="sdar",
            gen=8, throughput={"eval_tokens_per_s": 9000.0, "nfe_per_sample": 4.0, "tokens_per_forward": 4.0})
    at = _app("Speed")
    assert at.selectbox(key="speed_task").options == ["addition"]
    chart = _tab(at, "Speed").get("vega_lite_chart")[0]
    front = [r for r in _chart_rows(chart) if r.get("tokens/s") is not None]
    assert '"line"' in chart.proto.spec and {9000.0, 2441.0} <= {r["tokens/s"] for r in front}


def test_published_tab_lists_the_papers_numbers_with_sources(runs):
    """The Published tab replaces the empty Reproduction tab: d1's Table 1 at 256 tokens is there with its source
    and, with no result of ours under that protocol, says so; the baselines with no number say why."""
    at = _app("Published")
    published = _tab(at, "Published")
    table = next(d.value for d in published.dataframe if "published" in d.value.columns)
    d1 = table[(table["method"] == "d1") & (table["benchmark"] == "gsm8k") & (table["published"] == "79.8")].iloc[0]
    assert "d1 Table 1" in d1["source"] and "gen 256" in d1["protocol"] and d1["status"] == "not run here"
    assert d1["ours"] == "" and d1["delta"] == ""  # nothing to put beside it
    assert {"d1", "wd1", "spg", "tracerl"} <= set(table["method"])
    assert any("No published number: agrpo" in c for c in _captions(published))
    at.selectbox(key="published_method").select("wd1").run()
    table = next(d.value for d in _tab(at, "Published").dataframe if "published" in d.value.columns)
    assert set(table["method"]) == {"wd1"}
