"""`dare bench gpu` at shrunk shapes on CPU (the same command the GPU acceptance run uses, so it cannot rot
between GPU runs): every stage runs and lands in the report; its numbers say nothing about a GPU, and no
verdict is given on CPU."""

from __future__ import annotations

import json

import pytest

from dare.app import bench_gpu
from dare.app.cli import main


def test_bench_gpu_runs_every_stage_at_shrunk_shapes_on_cpu(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert main(["bench", "gpu", "--device", "cpu", "--no-tests", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["kind"] == "bench.gpu" and report["shrunk"] and report["command"] and report["git"]["commit"]
    experts = report["stages"]["experts"]["rows"]
    assert [(r["family"], r["experts"], r["top_k"]) for r in experts] == [
        ("llada2", 256, 8), ("sdar_moe", 128, 8), ("lladamoe", 64, 8)]
    assert all(r["max_abs_diff"] == 0.0 and r["loop_s"] > 0 and r["grouped_s"] > 0 for r in experts)
    families = report["stages"]["families"]
    assert list(families) == list(bench_gpu.FAMILIES)
    for family, entry in families.items():
        rows = entry["forwards"]["rows"]
        assert [r["batch"] for r in rows] == [1, 8], family
        for r in rows:
            assert r["whole_s"] > 0 and r["cached_step_s"] > 0 and r["cache_bytes"] > 0, (family, r)
            assert r["cached_step_captured_s"] is None and r["captured_note"] == "not captured on cpu"
        strategies = [r["strategy"] for r in entry["rollout"]]
        assert strategies[0] == "vanilla" and len(strategies) >= 2, family
        assert entry["weight_read_s"] > 0 and entry["weight_bytes_read_per_forward"] > 0
    assert families["llada2"]["loop_whole_b8_s"] > 0
    targets = report["targets"]
    assert len(targets) == 7 and all(t["met"] is None for t in targets)  # shrunk shapes: no verdict
    assert next(t for t in targets if "dual cache" in t["target"])["measured"] > 0
    printed = capsys.readouterr().out
    assert "not judged" in printed and "MISSED" not in printed


def test_verdicts_at_released_shapes_judge_each_target():
    """The verdict logic on a hand-made report (what a GPU run writes): met, missed, not measured."""
    report = {"shrunk": False, "device": "cuda", "stages": {
        "gpu_tests": {"rc": 0, "passed": 9},
        "families": {
            "llada2": {"loop_whole_b8_s": 0.8, "forwards": {"rows": [{"batch": 8, "whole_s": 0.03}],
                                                          "math_kernel_needed": []}},
            "llada": {"weight_read_s": 0.0048, "forwards": {"rows": [{"batch": 1, "cached_step_captured_s": 0.0080}],
                                                          "math_kernel_needed": ["whole batch 8: no kernel"]},
                      "rollout": [{"strategy": "vanilla", "speedup_vs_vanilla": 1.0},
                                  {"strategy": "dual_cache", "speedup_vs_vanilla": 5.5}]},
        }}}
    got = {t["target"]: t["met"] for t in bench_gpu.verdicts(report)}
    assert got == {
        "LLaDA2.1-mini forward, batch 8, grouped experts": True,
        "... the former loop over the same run's grouped forward": True,
        "LLaDA-8B cached block step, batch 1, captured, over one read of the weights": False,  # 1.67x
        "LLaDA-8B dual cache over vanilla, batch 8": True,
        "SDAR-8B block cache over vanilla, batch 8": None,  # not measured
        "no forward on the math attention kernel": False,
        "gpu-marked tests pass": True,
    }


def test_bench_gpu_on_a_machine_without_cuda_says_so(capsys):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["bench", "gpu", "--device", "cuda"]) != 0
    assert "no CUDA device here" in capsys.readouterr().err
