"""The whole demo path at reduced size: data -> sft -> d1 (2 seeds) -> eval -> results -> leaderboard."""

import sys
import time
from pathlib import Path

from conftest import dare_cli
from dare.results import load_results

REPO = Path(__file__).resolve().parent.parent


def test_demo_smoke_end_to_end(tmp_path):
    env = {"DARE_RUNS": str(tmp_path / "runs"), "DARE_DATA": str(tmp_path / "data")}
    r = dare_cli("demo", "--smoke", "--seeds", "2", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "Held-out addition accuracy" in out and "make leaderboard" in out and "sums < 100" in out
    sft_line = next(line for line in out.splitlines() if line.strip().startswith("sft "))
    d1_line = next(line for line in out.splitlines() if line.strip().startswith("d1 "))
    assert " 1 " in sft_line and " 2 " in d1_line and "±" in d1_line

    valid, invalid = load_results(tmp_path / "runs", pattern="**/result_*.json")
    assert not invalid
    by_method = {}
    for _, res in valid:
        by_method.setdefault(res.method.baseline, []).append(res)
    assert len(by_method["sft"]) == 1 and len(by_method["d1"]) == 2
    sft, d1 = by_method["sft"][0], by_method["d1"]
    assert sft.method.init == "scratch" and all(x.method.init == "sft" for x in d1)
    assert {x.training.seed for x in d1} == {0, 1}
    assert all(x.training.init_config_hash == sft.training.config_hash for x in d1)
    # the start is its weights: each run names the checkpoint it trained from, the start's result its own
    assert sft.training.checkpoint and sft.training.init_checkpoint is None
    assert all(x.training.init_checkpoint == sft.training.checkpoint for x in d1)
    assert len({x.training.checkpoint for x in d1} | {sft.training.checkpoint}) == 3
    assert all(x.decoding == sft.decoding for x in d1)  # identical decoding for every checkpoint
    assert sft.model.name == d1[0].model.name == "tiny-llada-addition"
    assert sft.benchmark.n_samples.effective == 40 and sft.benchmark.n_samples.original == 500
    assert sft.provenance.git_commit and sft.throughput.nfe_per_sample == 4
    assert sft.provenance.command.startswith("dare demo") and sft.provenance.hardware.cpu_model
    assert sft.training.config_path == "reproductions/demo/sft.yaml"  # relative to the checkout
    assert d1[0].training.command.startswith("dare train d1 reproductions/demo/d1.yaml model.path=")
    assert len({x.training.recipe_hash for x in d1}) == 1  # seeds of one recipe
    for path, _ in valid:  # no machine path in what gets committed (the JSONs and the copied configs)
        for f in (path, path.parent / "config.yaml"):
            assert str(REPO) not in f.read_text(), f

    # The leaderboard's loader shows them (run folders given as the app receives them).
    sys.path.insert(0, str(REPO / "leaderboard"))
    import load

    items, bad = load.load_all([tmp_path / "runs"])
    run_ids = {res.run_id for _, res in items}
    assert {x.run_id for x in d1} | {sft.run_id} <= run_ids

    # A rerun reuses every finished stage.
    t0 = time.perf_counter()
    again = dare_cli("demo", "--smoke", "--seeds", "2", env=env)
    assert again.returncode == 0
    assert again.stdout.count("reusing finished run") == 3
    assert time.perf_counter() - t0 < 60
