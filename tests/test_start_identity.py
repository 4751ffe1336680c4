"""A start is its weights, not its config: a start trained again from the same config (same run id, other
weights) is kept beside the first, and each trained run is compared with the start it really trained from
(`training.init_checkpoint` = the start's `training.checkpoint`; for older results, the start published in the
same results folder). Built on a committed result's JSON, its numbers and identities changed."""

import copy
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDER = REPO / "leaderboard" / "results" / "tiny-llada-gdsd"


def _template(baseline: str) -> dict:
    path = next(FOLDER.glob(f"{baseline}__*/result_addition.json"))
    return json.loads(path.read_text())


def _result(baseline: str, value: float, *, seed: int = 0, run_id: str | None = None, samples: str,
            checkpoint: str | None = None, init_checkpoint: str | None = None, made: str = "2026-11-27T12:00:00Z") -> dict:
    r = copy.deepcopy(_template("sft" if baseline == "sft" else "gdsd"))
    r["method"]["baseline"] = baseline
    r["created_at"] = made
    r["run_id"] = run_id or f"{baseline}__tiny-llada-addition__addition__s{seed}__{samples[:8]}-369ebda0"
    r["metrics"][0].update(value=value, sum=value * 500, sum_sq=value * 500)
    r["training"].update(seed=seed, checkpoint=checkpoint, init_checkpoint=init_checkpoint)
    r["artifacts"]["samples_total_sha256"] = samples * 64
    return r


def _write(root: Path, folder: str, result: dict) -> None:
    run = root / folder / result["run_id"]
    run.mkdir(parents=True)
    (run / "result_addition.json").write_text(json.dumps(result))


@pytest.fixture
def load(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "leaderboard"))
    monkeypatch.setenv("DARE_LEADERBOARD_RESULTS", str(tmp_path / "committed"))
    monkeypatch.setenv("DARE_LEADERBOARD_RUNS", str(tmp_path / "runs"))
    (tmp_path / "runs").mkdir()
    import load

    return load


def _gains(load) -> dict[str, str]:
    items, invalid = load.load_all()
    assert not invalid, invalid
    column = load.benchmark_label(items[0][1])
    _, rows, _ = load.family_table(items, column)
    return {row["method"]: (row["llada"], row["llada Δ"]) for row in rows}


START = "sft__tiny-llada-addition__addition__s0__5440979f-369ebda0"  # one config, one run id, trained twice


def test_older_results_pair_with_the_start_published_beside_them(load, tmp_path):
    """No checkpoint fingerprints (results before 2026-11-27): each folder's runs against its own start copy."""
    root = tmp_path / "committed"
    _write(root, "first", _result("sft", 0.755, run_id=START, samples="a"))
    for seed in range(3):
        _write(root, "first", _result("gdsd", 0.86, seed=seed, samples=f"b{seed}"))
    _write(root, "second", _result("sft", 0.783, run_id=START, samples="c"))  # retrained: other samples
    _write(root, "second", _result("rldf", 0.88, samples="d"))  # another method: its own row

    items, _ = load.load_all()
    assert sorted(load.value(r) for _, r in items if r.run_id == START) == [0.755, 0.783]  # both kept
    gains = _gains(load)
    assert gains["gdsd (from sft)"][1] == "+10.5"  # 86.0 - 75.5
    assert gains["rldf (from sft)"][1] == "+9.7"  # 88.0 - 78.3, not 88.0 - 75.5
    assert gains["sft"][0].startswith("76.9 (1 seed, 2 runs)")  # the start row says it ran twice


def test_a_recorded_start_fingerprint_wins_over_the_folder(load, tmp_path):
    root = tmp_path / "committed"
    _write(root, "one", _result("sft", 0.755, run_id=START, samples="a", checkpoint="w1"))
    _write(root, "two", _result("sft", 0.783, run_id=START, samples="c", checkpoint="w2"))
    _write(root, "one", _result("rldf", 0.88, samples="d", init_checkpoint="w2"))  # beside w1, trained from w2
    assert _gains(load)["rldf (from sft)"][1] == "+9.7"


def test_a_start_that_is_not_published_gives_no_gain(load, tmp_path):
    """A run trained from weights no result names: no difference is made up from another start."""
    root = tmp_path / "committed"
    _write(root, "one", _result("sft", 0.755, run_id=START, samples="a", checkpoint="w1"))
    _write(root, "one", _result("rldf", 0.88, samples="d", init_checkpoint="w3"))
    assert _gains(load)["rldf (from sft)"][1] == ""


def test_the_same_evaluation_in_two_folders_is_one_result(load, tmp_path):
    root = tmp_path / "committed"
    for folder in ("one", "two"):
        _write(root, folder, _result("sft", 0.755, run_id=START, samples="a"))
    items, _ = load.load_all()
    assert [r.run_id for _, r in items] == [START]


def test_an_older_result_with_no_start_beside_it_pairs_with_the_start_made_before_it(load, tmp_path):
    """TraceRL's Sudoku runs (2026-11-25) were published without their start; the start was retrained on
    2026-11-27: a start evaluated after a run cannot be the one it trained from."""
    root = tmp_path / "committed"
    _write(root, "first", _result("sft", 0.755, run_id=START, samples="a", made="2026-11-25T13:40:51Z"))
    _write(root, "tracerl", _result("tracerl", 0.814, samples="b", made="2026-11-25T14:40:25Z"))
    _write(root, "later", _result("sft", 0.783, run_id=START, samples="c", made="2026-11-27T16:03:09Z"))
    _write(root, "later", _result("rldf", 0.879, samples="d", made="2026-11-27T16:28:27Z"))
    _write(root, "copy", _result("sft", 0.783, run_id=START, samples="c", made="2026-11-27T18:37:31Z"))  # again
    gains = _gains(load)
    assert gains["tracerl (from sft)"][1] == "+5.9" and gains["rldf (from sft)"][1] == "+9.6"


def test_a_filter_that_hides_the_start_keeps_the_gain(load, tmp_path):
    """The Families tab filters by method; the starts are looked up among all results (`pool`)."""
    root = tmp_path / "committed"
    _write(root, "one", _result("sft", 0.755, run_id=START, samples="a", checkpoint="w1"))
    _write(root, "one", _result("rldf", 0.88, samples="d", init_checkpoint="w1"))
    items, _ = load.load_all()
    shown = [(p, r) for p, r in items if r.method.baseline == "rldf"]
    column = load.benchmark_label(items[0][1])
    assert load.family_table(shown, column)[1][0]["llada Δ"] == ""  # nothing to compare with in the shown rows
    assert load.family_table(shown, column, pool=items)[1][0]["llada Δ"] == "+12.5"


@pytest.mark.parametrize("same_run", [True, False])
def test_a_checkpoint_trained_before_dare_json_named_its_start_takes_it_from_run_json(sft_checkpoint, tmp_path,
                                                                                       same_run):
    """Checkpoints written before 2026-11-27 have no `init_fingerprint` in dare.json; their run folder's run.json
    has it (`fit` wrote it there), and the evaluation takes it from there when run.json is that run's."""
    import shutil

    from dare.eval import evaluate_checkpoint
    from dare.models.api import checkpoint_fingerprint
    from dare.results import read_result

    final = tmp_path / "run" / "final"
    shutil.copytree(sft_checkpoint("llada"), final)
    meta = json.loads((final / "dare.json").read_text())
    meta.pop("init_fingerprint", None)
    (final / "dare.json").write_text(json.dumps(meta))
    status = {"config_hash": meta["config_hash"] if same_run else "another", "init_fingerprint": "f" * 64}
    (final.parent / "run.json").write_text(json.dumps(status))
    [path] = evaluate_checkpoint(final, None, ["eval.n_samples=4"], out_dir=tmp_path / "eval")
    training = read_result(path).training
    assert training.checkpoint == checkpoint_fingerprint(final)
    assert training.init_checkpoint == ("f" * 64 if same_run else None)


def test_a_start_evaluated_again_by_newer_code_still_pairs_with_the_older_runs(load, tmp_path):
    """The Sudoku start retrained at 5452cc2, published beside GDSD without a checkpoint fingerprint and later
    beside BridgeRatio-GRPO with one (the same samples): one result, kept as the copy that names its checkpoint;
    the older runs beside the first copy and the newer runs that name it both pair with it."""
    root = tmp_path / "committed"
    _write(root, "a-older", _result("sft", 0.755, run_id=START, samples="a", made="2026-11-25T13:40:51Z"))
    _write(root, "b-newer", _result("sft", 0.7825, run_id=START, samples="c", checkpoint="w2",
                                    made="2026-11-27T20:00:00Z"))
    _write(root, "b-newer", _result("bridgeratio_grpo", 0.879, samples="e", init_checkpoint="w2",
                                    made="2026-11-27T20:01:00Z"))
    _write(root, "c-gdsd", _result("sft", 0.7825, run_id=START, samples="c", made="2026-11-27T18:37:31Z"))
    _write(root, "c-gdsd", _result("gdsd", 0.880, samples="d", made="2026-11-27T16:24:54Z"))
    items, _ = load.load_all()
    kept = [r for _, r in items if r.run_id == START and load.value(r) == 0.7825]
    assert len(kept) == 1 and kept[0].training.checkpoint == "w2"
    gains = _gains(load)
    assert gains["gdsd (from sft)"][1] == "+9.8" and gains["bridgeratio_grpo (from sft)"][1] == "+9.7"
