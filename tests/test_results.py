import json
import subprocess
import sys
from pathlib import Path

import pytest

from dare.results import SCHEMA_VERSION, Result, load_results, metric_from_values, read_result, write_result

REPO = Path(__file__).resolve().parent.parent


def make_result(**changes) -> dict:
    r = {
        "schema_version": SCHEMA_VERSION, "run_id": "d1__tiny__addition__s0__abcd1234", "created_at": "2026-11-21T00:00:00Z",
        "method": {"baseline": "d1", "paper": "2504.12216", "init": "sft"},
        "model": {"name": "tiny", "family": "llada", "kind": "masked", "dtype": "float32", "n_params": 1000},
        "benchmark": {"name": "addition", "split": "test", "version": "1",
                      "n_samples": {"original": 4, "effective": 4}},
        "decoding": {"sampler": "masked", "gen_length": 4, "block_length": 4, "steps": 4,
                     "remasking": "low_confidence", "temperature": 0.0},
        "metrics": [metric_from_values("accuracy", [1, 0, 1, 1]).model_dump()],
        "training": {"seed": 0, "steps": 10, "config_hash": "ab", "wall_time_s": 1.5, "recipe_hash": "r-ab",
                     "config": {"run": {"seed": 0}, "train": {"steps": 10, "lr": 1e-3}}, "command": "dare train d1"},
        "throughput": {"eval_samples_per_s": 10.0},
        "provenance": {"git_commit": "abc", "git_dirty": False, "packages": {"torch": "2.13.0"},
                       "hardware": {"cpu": "x86_64", "n_cpus": 2, "cpu_model": "AMD EPYC", "cpu_capability": "AVX2",
                                    "threads": 2, "blas": "mkl"},
                       "lock": {"lock": "locks/train.txt", "sha256": "0" * 64}, "command": "dare eval runs/x"},
    }
    r.update(changes)
    return r


def test_metric_sufficient_statistics():
    m = metric_from_values("accuracy", [1, 0, 1, 1])
    assert (m.count, m.sum, m.sum_sq, m.value) == (4, 3.0, 3.0, 0.75)
    assert m.stderr == pytest.approx((0.75 * 0.25 * 4 / 3 / 4) ** 0.5)
    with pytest.raises(ValueError, match="sum / count"):
        Result.model_validate(make_result(metrics=[{"name": "accuracy", "value": 0.9, "count": 4, "sum": 3.0}]))


def test_write_is_atomic_and_round_trips(tmp_path):
    path = write_result(make_result(), tmp_path / "r.json")
    assert read_result(path).metric("accuracy").value == 0.75
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left behind
    with pytest.raises(ValueError):  # invalid results are never written
        write_result(make_result(metrics=[]), tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()


def test_loader_reports_bad_files_and_never_raises(tmp_path):
    write_result(make_result(), tmp_path / "good.json")
    good = json.dumps(make_result())
    (tmp_path / "truncated.json").write_text(good[: len(good) // 2])
    (tmp_path / "version.json").write_text(json.dumps(make_result(schema_version="0")))
    missing = make_result()
    del missing["model"]
    (tmp_path / "missing.json").write_text(json.dumps(missing))
    (tmp_path / "nan.json").write_text(good.replace('"value": 0.75', '"value": NaN'))
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    extra = make_result(unknown_field=1)
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    valid, invalid = load_results(tmp_path, tmp_path / "nonexistent")
    assert [p.name for p, _ in valid] == ["good.json"]
    reasons = {p.name: why for p, why in invalid}
    assert "not valid JSON" in reasons["truncated.json"]
    assert "schema_version is '0'" in reasons["version.json"]
    assert reasons["missing.json"].startswith("model:")
    assert "NaN" in reasons["nan.json"]
    assert "expected an object" in reasons["list.json"]
    assert "unknown_field" in reasons["extra.json"]
    assert "unreadable" in reasons["binary.json"] or "JSON" in reasons["binary.json"]
    assert "no such file" in reasons["nonexistent"]


def test_every_committed_result_is_valid():
    import json

    files = sorted((REPO / "leaderboard" / "results").rglob("*.json"))
    reports = [f for f in files if str(json.loads(f.read_text()).get("kind", "")).startswith("bench.")]
    assert files, "leaderboard/results/ holds no result JSONs"
    # `dare bench` reports, not results: their numbers under "results" (train, rollout) or "stages" (gpu)
    assert all(any(json.loads(f.read_text()).get(k) for k in ("results", "stages")) for f in reports)
    valid, invalid = load_results(REPO / "leaderboard" / "results")
    assert [p for p, _ in invalid] == reports, invalid
    assert len(valid) == len(files) - len(reports)


def test_results_module_does_not_import_torch():
    code = "import sys, dare.results, dare.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_publishing_twice_adds_nothing(tmp_path):
    """The same result (same run id) published again, e.g. the SFT start every method of a tiny-task
    comparison starts from, is left as it is: one folder, one row on the leaderboard."""
    from dare.results import load_results, publish

    src = tmp_path / "run" / "result_addition.json"
    write_result(make_result(), src)
    first = publish(src, tmp_path / "board")
    stamp = first.stat().st_mtime_ns
    again = publish(src, tmp_path / "board")
    assert again == first and first.stat().st_mtime_ns == stamp
    valid, invalid = load_results(tmp_path / "board")
    assert len(valid) == 1 and not invalid


def test_a_published_result_keeps_64_samples_and_names_the_whole_file(tmp_path):
    """Committed results stay light: the published copy holds the first 64 samples, its sha256 is the
    excerpt's, and the result records the whole file's count and sha256; a short file is copied whole."""
    import json

    from dare.results import PUBLISHED_SAMPLES, publish
    from dare.utils import sha256_file

    for n, run in ((500, "long"), (20, "short")):
        src = tmp_path / run / "result_addition.json"
        src.parent.mkdir()
        samples = src.parent / "samples_addition.jsonl"
        samples.write_text("".join(json.dumps({"index": i, "response": str(i)}) + "\n" for i in range(n)))
        write_result(make_result(run_id=f"d1__tiny__addition__s0__{run}",
                                 artifacts={"samples": samples.name, "samples_sha256": sha256_file(samples)}), src)
        out = read_result(publish(src, tmp_path / "board"))
        copied = tmp_path / "board" / out.run_id / samples.name
        kept = [json.loads(line)["index"] for line in copied.read_text().splitlines()]
        assert out.artifacts.samples_sha256 == sha256_file(copied)
        if n > PUBLISHED_SAMPLES:
            assert kept == list(range(64)) and out.artifacts.samples_total == 500
            assert out.artifacts.samples_total_sha256 == sha256_file(samples)
        else:
            assert kept == list(range(20)) and out.artifacts.samples_total is None
        assert samples.read_text().count("\n") == n  # the run folder's file is untouched


def test_the_eval_hash_changes_only_with_what_changes_the_numbers():
    from dare.config import DecodingConfig, EvalRunConfig, load
    from dare.eval import result_hash

    base = load(EvalRunConfig, overrides=["eval.decoding.gen_length=4", "eval.decoding.block_length=4"])
    h = result_hash(base, "addition", base.eval.decoding)
    same = [  # other benchmarks in the call, output paths, logging, a setting spelled out at its default
        load(EvalRunConfig, overrides=["eval.decoding.gen_length=4", "eval.decoding.block_length=4",
                                       "eval.benchmarks=[addition,gsm8k]", "run.out_dir=/tmp/x", "run.log_every=3",
                                       f"eval.decoding.masked.cache={DecodingConfig().masked.cache}"])]
    for cfg in same:
        assert result_hash(cfg, "addition", cfg.eval.decoding) == h
    steps = load(EvalRunConfig, overrides=["eval.decoding.gen_length=4", "eval.decoding.block_length=4",
                                           "eval.decoding.steps=2"])
    assert result_hash(steps, "addition", steps.eval.decoding) != h
    assert result_hash(base, "gsm8k", base.eval.decoding) != h
    seeded = load(EvalRunConfig, overrides=["eval.decoding.gen_length=4", "eval.decoding.block_length=4",
                                            "run.seed=1"])
    assert result_hash(seeded, "addition", seeded.eval.decoding) != h


def test_schema_1_results_still_load(tmp_path):
    """Results written before the fingerprint (schema 1: no recipe hash, config, lock or ISA) load."""
    old = make_result(schema_version="1")
    for key in ("recipe_hash", "config", "command"):
        del old["training"][key]
    del old["provenance"]["lock"]
    old["provenance"]["hardware"] = {"cpu": "x86_64", "n_cpus": 2}
    (tmp_path / "old.json").write_text(json.dumps(old))
    r = read_result(tmp_path / "old.json")
    assert r.schema_version == "1" and r.training.recipe_hash is None
    assert r.provenance.hardware.hardware_class() == "x86_64 (?)"
    assert read_result(write_result(make_result(), tmp_path / "new.json")).schema_version == SCHEMA_VERSION == "3"


def test_a_published_result_names_run_folders_as_runs_not_machine_paths(tmp_path, monkeypatch):
    """A run made with DARE_RUNS=/somewhere/runs publishes its command and config with `runs/...`
    (the folder a default checkout uses), so the committed copy names no machine path."""
    from dare.results import publish

    monkeypatch.setenv("DARE_RUNS", str(tmp_path / "scratch" / "runs"))
    root = tmp_path / "scratch" / "runs"
    src = root / "sweeps" / "x" / "eval" / "result_addition.json"
    src.parent.mkdir(parents=True)
    (src.parent / "config.yaml").write_text(f"# dare eval {root}/sweeps/x/train/final\nmodel: {{path: {root}/sft/a/final}}\n")
    command = f"dare train d1 model.path={root}/sft/a/final run.out_dir={root}/sweeps/x/train"
    result = make_result(artifacts={"config": "config.yaml"})
    result["training"]["command"] = command
    write_result(result, src)
    out = publish(src, tmp_path / "board")
    text = out.read_text() + (out.parent / "config.yaml").read_text()
    assert str(tmp_path) not in text
    assert read_result(out).training.command == "dare train d1 model.path=runs/sft/a/final run.out_dir=runs/sweeps/x/train"
    assert "model: {path: runs/sft/a/final}" in (out.parent / "config.yaml").read_text()


def test_publishing_a_result_from_a_dirty_tree_or_an_unlocked_environment_warns(tmp_path, capsys):
    """`dare results publish` names a result that cannot be traced to a commit and a lock (the
    committed-results test refuses it in leaderboard/results); a clean, locked one publishes quietly."""
    from dare.app.cli import main

    cases = {"clean": {}, "dirty": {"git_dirty": True}, "unlocked": {"lock": None}}
    for name, change in cases.items():
        src = tmp_path / name / "result_addition.json"
        prov = {**make_result()["provenance"], **change}
        write_result(make_result(run_id=f"d1__tiny__addition__s0__{name}", provenance=prov), src)
        assert main(["results", "publish", str(src), "--to", str(tmp_path / "board")]) == 0
        err = capsys.readouterr().err
        assert ("uncommitted changes" in err) == (name == "dirty") and ("no recorded lock" in err) == (name == "unlocked")
        assert (tmp_path / "board" / f"d1__tiny__addition__s0__{name}" / src.name).is_file()
