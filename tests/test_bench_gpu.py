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
            assert r["cached_step_compiled_s"] is None and r["compiled_note"] == (
                "not compiled on cpu" if (family, r["batch"]) == ("llada", 1) else "not compiled here (no target reads it)")
        strategies = [r["strategy"] for r in entry["rollout"]]
        assert strategies[0] == "vanilla" and len(strategies) >= 2, family
        assert entry["weight_read_s"] > 0 and entry["weight_bytes_read_per_forward"] > 0
    assert families["llada2"]["loop_whole_b8_s"] > 0
    step = report["stages"]["rl_step"]  # issue 48: one d1 step with LoRA through the RL loop, beside the planner
    assert "error" not in step and "skipped" not in step, step
    assert step["steps_logged"] == bench_gpu.RL_STEP_STEPS and step["setting"]["prompt_tokens"] == [16]
    assert "model.lora.rank=128" in step["overrides"] and "train.micro_batch_size=6" in step["overrides"]
    assert list(step["phases"]) == ["rollout", "logp", "update"]
    trace = report["stages"]["tracerl_step"]  # issue 62: TraceRL's step on SDAR with the block sampler's cache
    assert "error" not in trace and "skipped" not in trace, trace
    assert trace["steps_logged"] == bench_gpu.RL_STEP_STEPS and trace["family"] == "sdar"
    assert trace["step_s"] > 0 and 0 < trace["rollout_share"] < 1 and "rl.decoding.compile=false" in trace["overrides"]
    fast = step["accelerated"]  # issue 62: the same step with the dual cache and threshold decoding, same rows
    assert fast["overrides"] == [*bench_gpu.ACCELERATED, "rl.decoding.compile=false"]  # captured on CUDA only
    assert fast["step_s"] > 0 and 0 < fast["rollout_share"] < 1 and 0 < step["rollout_share"] < 1
    assert step["accelerated_speedup"] == pytest.approx(step["step_s"] / fast["step_s"])
    assert any(v["target"].startswith("... the same step with the accelerated rollout") and v["met"] is None
               for v in report["targets"])  # shrunk: not judged
    for phase, p in step["phases"].items():
        assert p["time_s"] > 0 and len(p["time_s_each"]) == bench_gpu.RL_STEP_STEPS, (phase, p)
        assert p["planned_gib"] > 0 and p["planned_items_gib"], (phase, p)
        assert p["peak_gib"] is None and p["ratio"] is None, (phase, p)  # no memory measured on CPU
    assert step["memory_keys"] == []  # the RL loop logs memory/ keys on CUDA only
    assert step["planned_peak_gib"] > 0 and step["planned_peak_phase"] in ("rollout", "log-probs", "update")
    assert step["peak_gib"] is None and step["card_peak_gib"] is None and step["plan_ratio"] is None
    targets = report["targets"]
    assert len(targets) == 10 and all(t["met"] is None for t in targets)  # shrunk shapes: no verdict
    assert next(t for t in targets if "dual cache" in t["target"])["measured"] > 0
    printed = capsys.readouterr().out
    assert "not judged" in printed and "MISSED" not in printed


def test_verdicts_at_released_shapes_judge_each_target():
    """The verdict logic on a hand-made report (what a GPU run writes): met, missed, not measured."""
    report = {"shrunk": False, "device": "cuda", "stages": {
        "gpu_tests": {"rc": 0, "passed": 9},
        "families": {
            "llada2": {"loop_whole_b8_s": 0.8, "forwards": {"rows": [{"batch": 8, "whole_s": 0.02}],
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
        "LLaDA-8B cached block step, batch 1, compiled as the rollouts run it, over one read of the weights": False,
        "LLaDA-8B dual cache over vanilla, batch 8": True,
        "SDAR-8B block cache over vanilla, batch 8": None,  # not measured
        "no forward on the math attention kernel": False,
        "LLaDA-8B d1 step (LoRA r128, micro-batch 6, prompt 200 + gen 256): peak memory on the card": None,
        "... dare plan's peak for it, off the measured peak by": None,  # no rl_step stage in this report
        "... the same step with the accelerated rollout (dual cache, captured, threshold 0.9) over d1's protocol": None,
        "gpu-marked tests pass": True,
    }


def test_verdicts_judge_the_8b_rl_step_and_the_planner():
    """Issue 48's targets on hand-made reports: the d1 step's peak on the card under 70 GiB, `dare plan` within 10%
    of it; not measured where the stage was skipped."""
    def judged(stage):
        report = {"shrunk": False, "device": "cuda", "stages": {"rl_step": stage}}
        return [(t["measured"], t["met"]) for t in bench_gpu.verdicts(report) if "d1 step" in t["target"]
                or "dare plan" in t["target"]]

    (peak, fits), (error, close) = judged({"card_peak_gib": 30.0, "planned_peak_gib": 32.0})
    assert (peak, fits, close) == (30.0, True, True) and abs(error - 2 / 30) < 1e-12
    (_, fits), (error, close) = judged({"card_peak_gib": 75.0, "planned_peak_gib": 60.0})
    assert (fits, close) == (False, False) and abs(error - 0.2) < 1e-12
    assert judged({"card_peak_gib": 50.0, "planned_peak_gib": 56.0})[1][1] is False  # 12% off
    assert judged({"skipped": "budget: 100 s left"}) == [(None, None), (None, None)]

    def accelerated(speedup):  # issue 62: the accelerated rollout's d1 step against the protocol's, >= 4x
        report = {"shrunk": False, "device": "cuda", "stages": {"rl_step": {"accelerated_speedup": speedup}}}
        return [t["met"] for t in bench_gpu.verdicts(report) if "accelerated rollout" in t["target"]]

    assert accelerated(4.5) == [True] and accelerated(3.9) == [False] and accelerated(None) == [None]


def test_rl_loop_records_phase_peaks_on_cuda_only(monkeypatch):
    """`dare.train.metrics.PhasePeaks`: on a CUDA device each phase's allocator peak after a reset at its start (GiB);
    on CPU nothing, and no CUDA call."""
    import torch

    from dare.train.metrics import PhasePeaks

    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    cpu = PhasePeaks(torch.device("cpu"))
    cpu.start()
    cpu.end("rollout")
    assert cpu.take() == {} and calls == []
    cuda = PhasePeaks(torch.device("cuda", 0))
    for phase in ("rollout", "logp", "update"):
        cuda.start()
        cuda.end(phase)
    assert cuda.take() == {"memory/rollout_peak_gib": 3.0, "memory/logp_peak_gib": 3.0, "memory/update_peak_gib": 3.0}
    assert calls == [("reset", torch.device("cuda", 0))] * 3 and cuda.take() == {}


def test_bench_gpu_on_a_machine_without_cuda_says_so(capsys):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["bench", "gpu", "--device", "cuda"]) != 0
    assert "no CUDA device here" in capsys.readouterr().err


def test_a_stage_that_fails_is_recorded_and_the_next_ones_still_run(tmp_path, monkeypatch):
    """One GPU run, no second chance: a family whose stage raises (out of memory, a failed capture) is recorded
    with its error, and the stages after it run."""
    real = bench_gpu.build_released

    def build(family, *a, **kw):
        if family == "sdar":
            raise RuntimeError("CUDA out of memory (simulated)")
        return real(family, *a, **kw)

    monkeypatch.setattr(bench_gpu, "build_released", build)
    report = bench_gpu.gpu_benchmark("cpu", "float32", shrink=True, families=("sdar", "llada", "dream"),
                                     run_tests=False, out=str(tmp_path / "gpu.json"), repeats=1)
    families = report["stages"]["families"]
    assert families["sdar"]["error"] == "RuntimeError: CUDA out of memory (simulated)"
    assert families["llada"]["forwards"]["rows"] and families["dream"]["forwards"]["rows"]
    assert "phases" in report["stages"]["rl_step"]
    assert list(json.loads((tmp_path / "gpu.json").read_text())["stages"]["families"]) == ["sdar", "llada", "dream"]
