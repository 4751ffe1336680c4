"""The leaderboard app through Streamlit's AppTest, on valid and invalid result files."""

import json
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dare.results import metric_from_values, write_result
from test_results import make_result

APP = str(Path(__file__).resolve().parent.parent / "leaderboard" / "app.py")


@pytest.fixture
def runs(tmp_path, monkeypatch):
    for seed, acc in [(0, [1, 1, 0, 1]), (1, [1, 0, 0, 1])]:
        r = make_result(run_id=f"d1__tiny__addition__s{seed}__x")
        r["training"]["seed"] = seed
        r["metrics"] = [metric_from_values("accuracy", acc).model_dump()]
        write_result(r, tmp_path / f"d1_{seed}" / "result_addition.json")
    sft = make_result(run_id="sft__tiny__addition__s0__x", method={"baseline": "sft", "init": "scratch"})
    write_result(sft, tmp_path / "sft" / "result_addition.json")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "result_addition.json").write_text('{"schema_version": "1", "run_id": ')
    (tmp_path / "broken" / "result_other.json").write_text(json.dumps(make_result(schema_version="7")))
    monkeypatch.setenv("DARE_LEADERBOARD_RUNS", str(tmp_path))
    return tmp_path


def test_app_shows_methods_seeds_and_invalid_files(runs):
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    expander = at.expander[0]
    assert "2 invalid result file(s)" in expander.label
    reasons = expander.dataframe[0].value
    assert set(reasons["reason"].str.slice(0, 14)) == {"not valid JSON", "schema_version"}
    frames = [d.value for d in at.dataframe]
    column = "addition [4/4/4, T=0]"  # benchmark and decoding (gen/block/steps, temperature)
    table = next(f for f in frames if column in f.columns)  # methods x benchmarks
    cells = dict(zip(table["method"], table[column]))
    assert cells["d1 (from sft)"] == "62.5 ± 17.7 (2 seeds)"
    assert cells["sft"] == "75.0 (1 seed)"
    runs_table = next(f for f in frames if "run_id" in f.columns)
    assert set(runs_table["run_id"]) >= {"d1__tiny__addition__s0__x", "d1__tiny__addition__s1__x",
                                         "sft__tiny__addition__s0__x"}


def test_leaderboard_loader_is_torch_free(runs):
    import subprocess

    code = ("import sys; sys.path.insert(0, 'leaderboard'); import load; items, bad = load.load_all(); "
            "assert items and bad; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(APP).parent.parent)
