"""The leaderboard's views as a researcher reads them (issue 58, item 8): what counts as a run, charts whose labels
sit on their dots, gains against each run's own start, the Published and Speed tables readable from their first
columns, the Run detail's defaults, rollout benchmarks kept to the Speed tab, and tabs that compute only when
opened. The fixture and helpers are tests/test_leaderboard.py's."""

import json

from dare.results import write_result
from streamlit.testing.v1 import AppTest
from test_leaderboard import (APP, _app, _captions, _load, _open, _result, _tab, _tables,  # noqa: F401  (runs: the fixture)
                              runs)


def _samples(folder, sha: str) -> None:
    """The result in `folder` records `sha` as its samples' hash."""
    path = folder / "result_addition.json"
    r = json.loads(path.read_text())
    r["artifacts"]["samples_sha256"] = sha
    path.write_text(json.dumps(r))


def test_two_seeds_with_identical_samples_are_two_runs_and_a_copy_is_one(runs, monkeypatch):
    """peft on LLaDA showed 2 seeds where 3 ran: seeds 1 and 2 wrote identical samples and one was dropped as a copy.
    A copy is the same training (seed, config hash, checkpoint) with the same samples, not the same samples."""
    load = _load(monkeypatch)
    _samples(runs / "d1_0", "ab" * 32)
    _samples(runs / "d1_1", "ab" * 32)  # seed 1 answers every prompt as seed 0 did
    twin = json.loads((runs / "d1_0" / "result_addition.json").read_text())  # seed 0 published again
    twin["run_id"] = "d1__tiny__addition__s0__published-elsewhere"
    write_result(twin, runs / "elsewhere" / "result_addition.json")
    items, _ = load.load_all()
    d1 = [r for _, r in items if r.method.baseline == "d1" and r.model.name == "tiny" and r.decoding.gen_length == 4]
    assert len(d1) == 3 and len(load.distinct_runs(d1)) == 2  # seeds 0 and 1; the twin is seed 0's copy
    assert load.format_cell(d1) == "62.5 ± 17.7 (2 seeds)"


def test_only_the_open_tab_runs(runs):
    """Every tab took 3.8-10 s to its first table: the whole app ran for each. Now a tab's content is computed when
    it is open (`st.tabs(on_change="rerun")`): the Overview's run draws no other tab's widget, and opening the Speed
    tab draws its tables and nothing of the Overview's."""
    at = _app()
    assert at.selectbox(key="overview_column") and not [s for s in at.selectbox if s.key in ("run", "family")]
    _open(at, "Speed")
    assert at.selectbox(key="speed_task").options == ["addition"]
    assert not [s for s in at.selectbox if s.key == "overview_column"]
    assert [t.label for t in at.tabs if t.children] == ["Speed"]


def _rollout_benchmark(runs, strategy="dual_cache", tokens_per_s=3000.0, seed=0, acc=(0, 0, 0, 1)):
    """A result as `dare bench rollout` writes it: one decoding strategy of the tiny SFT checkpoint, its speed
    beside its score (`method.variant` is `rollout:<strategy>`)."""
    name = f"bench_{strategy}_{seed}"
    _result(runs, name, method="sft", init="scratch", seed=seed, acc=list(acc), run_id=f"sft__tiny__bench__{name}",
            throughput={"eval_tokens_per_s": tokens_per_s, "nfe_per_sample": 2.0, "tokens_per_forward": 2.0})
    path = runs / name / "result_addition.json"
    r = json.loads(path.read_text())
    r["method"]["variant"] = f"rollout:{strategy}"
    r["decoding"]["extra"] = {"cache": "dual"}
    path.write_text(json.dumps(r))


BENCH_COLUMN = "addition [4/4/4, T=0, cache=dual]"


def test_benchmarks_of_the_rollout_are_in_the_speed_tab_only(runs):
    """14 of the 16 "Task and decoding" choices were chain decodings of `dare bench rollout` (benchmarks of the
    rollout, not of methods). A result whose variant is `rollout:<strategy>` is shown in the Speed tab only."""
    _rollout_benchmark(runs)
    at = _app()
    assert BENCH_COLUMN not in at.selectbox(key="overview_column").options
    assert "1 of them benchmarks of the rollout" in " ".join(c.value for c in at.sidebar.caption)
    for tab, key in [("Families", "family_benchmark"), ("Compute", "compute_benchmark"),
                     ("By method", "heat_benchmark")]:
        assert _open(at, tab).selectbox(key=key).options == ["addition [4/4/4, T=0]", "addition [8/4/4, T=0]"], tab
    _open(at, "Leaderboard").selectbox(key="family").select("llada").run()
    at.selectbox(key="model").select("tiny").run()
    assert BENCH_COLUMN not in at.selectbox(key="dot_benchmark").options
    assert "sft__tiny__bench__bench_dual_cache_0" not in " ".join(_open(at, "Run detail").selectbox(key="run").options)
    speed = _open(at, "Speed")
    assert 3000.0 in next(d.value for d in speed.dataframe if "tokens/forward" in d.value.columns)["tokens/s"].tolist()


def test_the_committed_chain_decodings_are_benchmarks_of_the_rollout(monkeypatch):
    """On the committed results the method views offer the two tasks' columns, not the 26 chain decodings that
    `dare bench rollout` measured (leaderboard/results/bench-rollout-*/): the result's variant says so, not its
    folder's name."""
    load = _load(monkeypatch)
    monkeypatch.delenv("DARE_LEADERBOARD_RUNS", raising=False)
    monkeypatch.delenv("DARE_LEADERBOARD_RESULTS", raising=False)
    items, _ = load.load_all([])
    benchmarks = {p.relative_to(load.committed()).parts[0] for p, r in items if load.rollout_benchmark(r)}
    assert benchmarks == {f"bench-rollout-chain-{f}" for f in ("dream", "llada", "llada2", "sdar")}
    assert sorted({load.benchmark_label(r) for _, r in items if not load.rollout_benchmark(r)}) == [
        "addition [4/4/4, T=0]", "countdown_tiny [8/8/8, T=0]", "sudoku_fill [5/5/5, T=0]"]


def test_the_leaderboard_compares_each_run_with_its_own_start_as_the_families_tab_does(tmp_path, monkeypatch):
    """LLaDA Sudoku's SFT start was trained twice (75.5 and 78.25, one config): the Leaderboard tab took its gains
    against their mean (76.9), so they disagreed with the Families tab's and flipped orders. Both tabs now compare
    each run with the start it trained from (`own_start`): GDSD's runs beside the first start, RLDF's beside the
    second (`test_start_identity`'s layout)."""
    from test_start_identity import START
    from test_start_identity import _result as result
    from test_start_identity import _write as write

    root = tmp_path / "committed"
    write(root, "first", result("sft", 0.755, run_id=START, samples="a"))
    for seed in range(3):
        write(root, "first", result("gdsd", 0.86, seed=seed, samples=f"b{seed}"))
    write(root, "second", result("sft", 0.783, run_id=START, samples="c"))  # retrained: other samples
    write(root, "second", result("rldf", 0.88, samples="d"))
    monkeypatch.setenv("DARE_LEADERBOARD_RESULTS", str(root))
    monkeypatch.setenv("DARE_LEADERBOARD_RUNS", "")
    load = _load(monkeypatch)
    items, _ = load.load_all()
    column = load.benchmark_label(items[0][1])
    at = _app("Leaderboard")
    assert _tables(_tab(at, "Leaderboard"))[0].loc["sft", column] == "76.9 (1 seed, 2 runs)"  # it ran twice
    table = _tables(_tab(at, "Leaderboard"))[1]
    gains = {"gdsd (from sft)": "+10.5", "rldf (from sft)": "+9.7"}  # 86.0 - 75.5; 88.0 - 78.3
    assert table[column].to_dict() == gains
    assert any("each run against the start it was trained from" in c for c in _captions(_tab(at, "Leaderboard")))
    _, family_rows, _ = load.family_table(items, column)
    assert {row["method"]: row["llada Δ"] for row in family_rows if row["method"] != "sft"} == gains


def test_the_published_table_starts_with_ours_the_difference_and_the_status(runs):
    """The ours / delta / status columns started past the visible edge of the Published table."""
    at = _app("Published")
    table = next(d.value for d in _tab(at, "Published").dataframe if "published" in d.value.columns)
    assert list(table.columns)[:5] == ["method", "ours", "delta", "status", "published"]


def test_run_detail_opens_on_the_best_run_of_the_landing_column(runs, monkeypatch):
    """It opened on the first run (on the committed results an SFT chain benchmark at 0%): now on the best result of
    the column the Overview opens on (`load.landing_column`), here a 100% one of addition [4/4/4]."""
    load = _load(monkeypatch)
    at = _app("Run detail")
    items, _ = load.load_all()
    opened = next(r for _, r in items if r.run_id == at.selectbox(key="run").value)
    assert load.benchmark_label(opened) == load.landing_column(items) == "addition [4/4/4, T=0]"
    assert load.value(opened) == 1.0 == max(load.value(r) for _, r in items)


def test_a_linked_run_without_curves_shows_no_other_runs_curves(runs):
    """A linked run without curves showed its recipe's other seeds' curves as if they were its own. It now overlays
    itself alone and says it has none; the curves of runs picked with it are theirs."""
    _result(runs, "d1_2", method="d1", init="sft", seed=2, acc=[1, 0, 1, 1])  # d1's seeds 0 and 1 have curves
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["run"] = "d1__tiny__addition__s2__g4"
    at.run()
    assert not at.exception and at.multiselect(key="overlay").value == ["d1__tiny__addition__s2__g4"]
    detail = _tab(at, "Run detail")
    assert not [c for c in detail.get("vega_lite_chart") if '"strokeDash"' in c.proto.spec]  # no curve drawn
    assert any("logged no training curves" in c and "pick other runs above" in c for c in _captions(detail))
    at.multiselect(key="overlay").select("d1__tiny__addition__s0__g4").run()  # picked: its curves, said as such
    assert any("the curves below are the other runs picked" in c for c in _captions(_tab(at, "Run detail")))


def _chart_data(chart) -> list[dict]:
    from test_leaderboard import _chart_rows

    return _chart_rows(chart)


def test_the_dot_plot_draws_every_label_beside_its_dot(runs):
    """The dot plot drew every other label, offset from its dot (vrpo's dot beside a tracerl label): a yOffset by
    colour shifted the dots against the labels, on lines too short for them. Now each dot has a line of its own,
    labelled (`method · model` where a method has several dots), every label drawn."""
    at = _app("Leaderboard")
    at.selectbox(key="family").select("llada").run()
    at.selectbox(key="model").select("tiny").run()
    chart = _tab(at, "Leaderboard").get("vega_lite_chart")[0]
    spec = json.loads(chart.proto.spec)
    assert '"yOffset"' not in chart.proto.spec and spec["height"] == {"step": 22}
    assert spec["layer"][1]["encoding"]["y"]["axis"] == {"labelLimit": 600, "labelOverlap": False}
    rows = _chart_data(chart)
    assert sorted(r["line"] for r in rows) == sorted(r["method"] for r in rows) == ["d1 (from sft)", "sft",
                                                                                    "wd1 (from sft)"]
    overview = _tab(_open(at, "Overview"), "Overview").get("vega_lite_chart")[0]  # several models a method
    rows = _chart_data(overview)
    assert '"yOffset"' not in overview.proto.spec and len({r["line"] for r in rows}) == len(rows)
    assert all(r["line"] == f"{r['method']} · {r['model']}" for r in rows)


def test_the_heatmap_has_a_cell_per_recipe_with_readable_text_and_labels(runs):
    """wd1 on SDAR showed 89.5, the mix of plain wd1 (97.5) and wd1 with b1's recipe (81.4); its text was black on
    navy and its labels cut. Now one cell per recipe (and model), the text white on dark cells and black on light
    ones, the labels uncut."""
    _result(runs, "wd1_40", method="wd1", init="sft", seed=0, acc=[0, 0, 0, 1], steps=40,
            run_id="wd1__tiny__addition__s0__steps40")
    at = _app("By method")
    chart = next(c for c in _tab(at, "By method").get("vega_lite_chart") if '"rect"' in c.proto.spec)
    cells = {(r["where"], r["method"]): r for r in _chart_data(chart) if "where" in r}
    assert cells[("llada: tiny", "wd1 (from sft) (steps=10)")]["mean"] == 100.0  # never pooled with steps=40's 25
    assert cells[("llada: tiny", "wd1 (from sft) (steps=40)")]["mean"] == 25.0
    assert cells[("llada: LLaDA-8B", "wd1")]["mean"] == 100.0 and ("sdar", "d1 (from sft)") in cells
    assert cells[("llada: tiny", "wd1 (from sft) (steps=10)")]["ink"] == "white"  # the darkest cell
    assert cells[("llada: tiny", "wd1 (from sft) (steps=40)")]["ink"] == "black"  # the lightest
    spec = json.loads(chart.proto.spec)
    assert spec["layer"][0]["encoding"]["y"]["axis"] == {"labelLimit": 600, "labelOverlap": False}
    assert spec["layer"][0]["encoding"]["x"]["axis"]["labelLimit"] == 300


def test_the_speed_plot_has_one_point_per_decoding_with_its_spread(runs):
    """The Pareto plot drew every rerun as a point (one decoding's runs at 882 to 5,029 tokens/s with the machine's
    load). Now one point per model and decoding: the median of its runs, the slowest and fastest as its spread."""
    for seed, speed in enumerate([900.0, 3000.0, 5000.0]):  # one decoding benchmarked three times
        _rollout_benchmark(runs, tokens_per_s=speed, seed=seed)
    at = _app("Speed")
    table = next(d.value for d in _tab(at, "Speed").dataframe if "slowest" in d.value.columns)
    row = table[table["decoding"] == "[4/4/4, T=0, cache=dual]"].to_dict("records")
    assert len(row) == 1 and (row[0]["runs"], row[0]["tokens/s"], row[0]["slowest"], row[0]["fastest"]) == (
        3, 3000.0, 900.0, 5000.0)
    chart = _tab(at, "Speed").get("vega_lite_chart")[0]
    dual = [r for r in _chart_data(chart) if r.get("decoding") == "[4/4/4, T=0, cache=dual]"]
    assert {r["tokens/s"] for r in dual} == {3000.0} and '"x2"' in chart.proto.spec and '"y2"' in chart.proto.spec
    assert any("median" in c for c in _captions(_tab(at, "Speed")))


def test_gpu_targets_say_their_direction_and_the_timed_out_tests(monkeypatch):
    """The GPU targets had no direction, the verdict column was cut, and the H200's "tests failed" row did not say
    the tests timed out (the report's stages.gpu_tests.rc). Now the verdict comes first, the need reads `<= 40 ms`
    or `>= 20x`, and the tests' verdict says they timed out."""
    load = _load(monkeypatch)
    rows = load.gpu_target_rows(load.load_bench([]))
    h200 = {r["target"]: r for r in rows if r["report"].startswith("gpu-NVIDIA_H200")}
    forward = h200["LLaDA2.1-mini forward, batch 8, grouped experts"]
    assert (forward["measured"], forward["need"], forward["verdict"]) == ("68 ms", "<= 40 ms", "missed")
    assert h200["... the former loop over the same run's grouped forward"]["need"] == ">= 20x"
    assert h200["LLaDA-8B d1 step (LoRA r128, micro-batch 6, prompt 200 + gen 256): peak memory on the card"][
        "need"] == "<= 70 GiB"
    assert h200["gpu-marked tests pass"]["verdict"] == "missed (timed out after 60 s)"
    h100 = next(r for r in rows if r["report"].startswith("gpu-NVIDIA_H100") and r["target"] == "gpu-marked tests pass")
    assert h100["verdict"] == "met" and h100["measured"] == "0 failed"
    assert list(rows[0])[0] == "verdict"


def test_a_rerun_does_not_compute_the_published_rows_again(runs, monkeypatch):
    """Every rerun (a choice in a tab) read every paper's numbers again. They are kept (st.cache_data) while the
    results, the filters and the papers' files are unchanged."""
    _load(monkeypatch)
    import published

    calls = []
    rows = published.published_rows
    monkeypatch.setattr(published, "published_rows", lambda items, *a: calls.append(1) or rows(items, *a))
    at = _app("Published")
    at.selectbox(key="published_method").select("wd1").run()
    assert not at.exception and len(calls) == 1
    at.multiselect(key="filter_family").select("sdar").run()  # other results shown: computed for them
    assert len(calls) == 2
