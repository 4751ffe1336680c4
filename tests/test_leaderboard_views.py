"""The leaderboard's views as a researcher reads them (issue 58, item 8): what counts as a run, charts whose labels
sit on their dots, gains against each run's own start, the Published and Speed tables readable from their first
columns, the Run detail's defaults, rollout benchmarks kept to the Speed tab, and tabs that compute only when
opened. The fixture and helpers are tests/test_leaderboard.py's."""

import json

from dare.results import write_result
from test_leaderboard import _app, _load, _open, _result, runs  # noqa: F401  (runs: the fixture)


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
