"""Speed at the sizes people run: `dare bench experts` (grouped experts against the former per-expert loop)
and `dare bench gpu` (the one GPU acceptance command: gpu-marked tests, then per family at its released
shape with random weights: forward times at batch 1 and 8, eager and captured; decoding tokens/s per cache
strategy; grouped vs loop experts; whether any attention call needed the math kernel; peak memory; a
verdict per target). `--device cpu` runs the same stages at shrunk shapes (the suite runs it so it cannot
rot between GPU runs); its numbers say nothing about a GPU.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from dare.app.released import build_released, released_config

# The families measured per model, in this order (the targets' models first); the MoE ones' layers are also
# measured by the experts stage
FAMILIES = ("llada2", "llada", "sdar", "dream")
MOE_FAMILIES = ("llada2", "sdar_moe", "lladamoe")
HIDDEN_KEY = {"llada": "d_model"}
WIDTH_KEY = {"llada2": "moe_intermediate_size", "sdar_moe": "moe_intermediate_size",
             "lladamoe": "expert_intermediate_size"}


def moe_layer(family: str, device: str, dtype: str, **shrink):
    """(the first sparse MoE layer of the family's released config, narrowed by `shrink`, with random weights
    (normal, std 0.02; buffers zero), the released name); the rest of the model is never allocated."""
    import torch

    name, model_class, config = released_config(family, **shrink)
    with torch.device("meta"):
        model = model_class(config)
    block = next(m for m in model.modules() if hasattr(m, "experts") and hasattr(m, "gate"))
    block = block.to_empty(device=device).to(getattr(torch, dtype)).eval()
    g = torch.Generator(device).manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.02, generator=g)
        for b in block.buffers():
            b.zero_()
    return block, name


def _timed(fn, sync, repeats: int) -> list[float]:
    fn()  # warm-up: kernels, allocator, packing
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return times


def _sync_for(device: str):
    import torch

    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def experts_benchmark(device: str = "cpu", dtype: str = "float32", *, hidden: int | None = 256,
                      expert_width: int | None = 64, tokens: int = 256, repeats: int = 5) -> dict:
    """One sparse MoE layer of each MoE family at its released expert count and top-k (LLaDA2.1-mini 256/8,
    SDAR-30B-A3B 128/8, LLaDA-MoE 64/8), `tokens` random tokens (256: one block step of 32 tokens at batch 8),
    widths `hidden` and `expert_width` (None: the released ones): the grouped
    experts against the former per-expert loop (`Experts.impl = "loop"`), median seconds of `repeats` forwards,
    the spread (min, max) and the speedup; the outputs of the two are compared too."""
    import torch

    sync, rows = _sync_for(device), []
    for family in MOE_FAMILIES:
        shrink = {HIDDEN_KEY.get(family, "hidden_size"): hidden, WIDTH_KEY[family]: expert_width} if hidden else {}
        block, name = moe_layer(family, device, dtype, **shrink)
        x = torch.randn(tokens, block.gate.weight.shape[1], device=device, dtype=getattr(torch, dtype))
        timed, outputs = {}, {}
        with torch.no_grad():
            for impl in ("loop", "grouped"):
                block.experts.impl = impl
                timed[impl] = _timed(lambda: block(x), sync, repeats)
                outputs[impl] = block(x)[0]
        block.experts.impl = "grouped"
        loop, grouped = statistics.median(timed["loop"]), statistics.median(timed["grouped"])
        rows.append({"family": family, "released": name, "experts": len(block.experts), "top_k": block.gate.top_k
                     if hasattr(block.gate, "top_k") else block.top_k, "tokens": tokens, "hidden": x.shape[1],
                     "expert_width": block.experts[0].gate_proj.weight.shape[0], "loop_s": loop, "grouped_s": grouped, "speedup": loop / grouped,
                     "loop_spread_s": [min(timed["loop"]), max(timed["loop"])],
                     "grouped_spread_s": [min(timed["grouped"]), max(timed["grouped"])],
                     "max_abs_diff": float((outputs["loop"].float() - outputs["grouped"].float()).abs().max())})
    return {"kind": "bench.experts", "benchmark": "experts", "device": device, "dtype": dtype, "repeats": repeats, "rows": rows}


def print_experts(report: dict) -> None:
    print(f"grouped experts vs the per-expert loop, one MoE layer, {report['device']} {report['dtype']}, "
          f"median of {report['repeats']}")
    print(f"  {'family':9s} {'experts':>7s} {'top-k':>5s} {'tokens':>6s} {'loop ms':>9s} {'grouped ms':>10s} "
          f"{'speedup':>8s} {'max |diff|':>10s}")
    for r in report["rows"]:
        print(f"  {r['family']:9s} {r['experts']:7d} {r['top_k']:5d} {r['tokens']:6d} {1e3 * r['loop_s']:9.2f} "
              f"{1e3 * r['grouped_s']:10.2f} {r['speedup']:7.1f}x {r['max_abs_diff']:10.2e}")


# ------------------------------------------------------------------------------------------------
# dare bench gpu

# issue 47's targets (one card, bf16, released shapes)
LLADA2_LOOP_FORWARD_S = 0.8  # LLaDA2.1-mini, batch 8, per-expert loop (H200, measured before the grouped experts)
LLADA2_SPEEDUP = 20.0
WEIGHT_READ_FACTOR = 1.5  # LLaDA-8B cached block step at batch 1 within 1.5x one read of the weights
DUAL_CACHE_SPEEDUP, BLOCK_CACHE_SPEEDUP = 5.0, 3.0
GPU_TIME_S = 480  # the whole command, gpu tests included, on one H100 or H200
# the rollouts timed again with their step captured: only where a target reads them (compiling an 8B forward takes
# one to two minutes)
COMPILED = {"llada": ("dual_cache",), "sdar": ("block_cache",)}
PROMPT, GEN, QUERY = 128, 256, 32  # the rollouts' shapes: prompt, generation, one block of queries


def gpu_test_files() -> list[str]:
    from dare.utils import REPO_ROOT

    return sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "tests").glob("test_*.py")
                  if "mark.gpu" in p.read_text())


def run_gpu_tests(timeout_s: float) -> dict:
    """`pytest -m gpu` on the files that hold gpu-marked tests, in a fresh process: counts and the failures."""
    import re
    import subprocess
    import sys

    from dare.utils import REPO_ROOT

    start = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rfE", *gpu_test_files()]
    try:
        r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)
        text, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", text)}
    return {"command": " ".join(cmd[2:]), "rc": rc, "seconds": time.perf_counter() - start, **counts,
            "failures": [line for line in text.splitlines() if line.startswith(("FAILED", "ERROR"))][:20]}


def no_math_attention(device: str):
    """On CUDA, `dare.models.core.fused_attention_only` (a call that would need SDPA's math kernel raises);
    elsewhere no restriction (the CPU has no fused kernel for masked calls)."""
    import contextlib

    from dare.models.core import fused_attention_only

    return fused_attention_only() if device.startswith("cuda") else contextlib.nullcontext()


def captured(step, device: str):
    """`step` (no arguments, fixed shapes, no host reads) replayed from a CUDA graph: -> (replay, None), or
    (None, the reason it could not be captured). On CPU nothing is captured (torch.compile of the same step is
    the suite's test of `decoding.compile`)."""
    import torch

    if not device.startswith("cuda"):
        return None, "not captured on cpu"
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return graph.replay, None
    except Exception as e:  # noqa: BLE001 - recorded in the report: what stopped the capture
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def model_forwards(model, device: str, repeats: int, shapes=(PROMPT, GEN, QUERY)) -> dict:
    """Per-forward seconds (median of `repeats`, with min and max) at batch 1 and 8: the whole sequence (a
    vanilla step: prompt + generation), and one step of a block's queries on a static cache, as the samplers run
    it (masked models: the dual cache of the whole sequence, the block's `query` positions replaced; block
    models: one block of the model's block size reading the committed prefix), eager and replayed from a CUDA
    graph; whether every call ran without the math attention kernel; the cache's bytes."""
    import torch

    from dare.models import facts
    from dare.models.core import KVCache

    prompt, gen, query = shapes
    f = facts(model)
    block_model = f.attention == "block_causal"
    if block_model:
        query = f.block_size
    sync, rows, math_needed = _sync_for(device), [], []
    for batch in (1, 8):
        ids = entry_ids(model, batch, prompt + gen, device)
        q_ids = ids[:, prompt:prompt + query]
        with torch.no_grad():
            def whole():
                return model(ids).logits

            if block_model:  # the committed prefix in a static cache; the next block's queries read it
                cache = KVCache(capacity=prompt + query)
                model(ids[:, :prompt], past_key_values=cache, use_cache=True)

                def step():
                    return model(q_ids, past_key_values=cache).logits
            else:  # the dual cache of the whole sequence; the block's queries replace their positions
                cache = KVCache(capacity=prompt + gen)
                model(ids, past_key_values=cache, use_cache=True)
                start = torch.tensor(prompt, device=device)

                def step():
                    return model(q_ids, past_key_values=cache, replace_position=start).logits
            row = {"batch": batch, "tokens": prompt + gen, "query_tokens": query}
            for label, fn in (("whole", whole), ("cached_step", step)):
                try:
                    with no_math_attention(device):
                        fn()
                except RuntimeError as e:
                    math_needed.append(f"{label} batch {batch}: {str(e).splitlines()[0][:160]}")
                times = _timed(fn, sync, repeats)
                row[f"{label}_s"], row[f"{label}_spread_s"] = statistics.median(times), [min(times), max(times)]
            replay, why = captured(step, device)
            if replay is not None:
                times = _timed(replay, sync, repeats)
                row["cached_step_captured_s"], row["cached_step_captured_spread_s"] = (
                    statistics.median(times), [min(times), max(times)])
            else:
                row["cached_step_captured_s"], row["captured_note"] = None, why
            row["cache_bytes"] = sum(t.numel() * t.element_size() for t in (*cache.keys, *cache.values))
            rows.append(row)
            cache = replay = None  # freed before the next batch size
    return {"rows": rows, "math_kernel_needed": math_needed}


def entry_ids(model, batch: int, length: int, device: str):
    """Random token ids below every special id of the model."""
    import torch

    from dare.models import facts

    f = facts(model)
    low = min(i for i in (f.mask_token_id, f.eos_token_id, f.eot_token_id, f.pad_token_id) if i is not None)
    return torch.randint(10, min(low, 30000), (batch, length), generator=torch.Generator().manual_seed(0)).to(device)


def release(model) -> None:
    """Free a benchmarked model's GPU memory now: its compiled steps (whose closures hold the model) and kept
    caches, then a garbage collection, dynamo's caches and the allocator's."""
    import gc

    import torch

    for key in ("_dare_steps", "_dare_caches"):
        model.__dict__.pop(key, None)
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def read_seconds(n_bytes: int, device: str) -> tuple[float, float]:
    """(seconds to read `n_bytes` once at this device's measured read bandwidth, the bandwidth in bytes/s):
    the median of 5 sums over a 2 GiB buffer (64 MiB on CPU)."""
    import torch

    size = (2 << 30) if device.startswith("cuda") else (64 << 20)
    buf = torch.ones(size // 2, dtype=torch.bfloat16, device=device)
    times = _timed(lambda: buf.sum(dtype=torch.float32), _sync_for(device), 5)
    bandwidth = size / statistics.median(times)
    return n_bytes / bandwidth, bandwidth


def gpu_benchmark(device: str = "cuda", dtype: str = "bfloat16", *, shrink: bool = False, out: str | None = None,
                  families=FAMILIES, repeats: int = 5, run_tests: bool = True, budget_s: float = GPU_TIME_S) -> dict:
    """`dare bench gpu`: see the module docstring. Stages run while `budget_s` lasts (a stage that would start
    after it is recorded as skipped); the report is written after each stage, so a run cut short keeps what it
    measured."""
    import torch

    from dare.app.bench import released_benchmark
    from dare.utils import REPO_ROOT, atomic_write_json, command_line, fingerprint, now, shown_path

    start = time.perf_counter()
    card = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    stamp = now().replace(":", "")
    path = Path(out) if out else REPO_ROOT / "leaderboard" / "results" / "bench-gpu" / (
        f"gpu-{card.replace(' ', '_')}-{stamp}.json")
    report = {"kind": "bench.gpu", "benchmark": "gpu", "card": card, "device": device, "dtype": dtype, "shrunk": shrink,
              "command": command_line(), "created": now(), **fingerprint(), "stages": {}, "targets": []}

    def left() -> float:
        return budget_s - (time.perf_counter() - start)

    def save():
        report["seconds"] = time.perf_counter() - start
        report["targets"] = verdicts(report)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, report)

    print(f"dare bench gpu: {card}, {dtype}, {'shrunk' if shrink else 'released'} shapes, budget {budget_s:.0f} s")
    cuda = device.startswith("cuda")
    exp = experts_benchmark(device, dtype, hidden=64 if shrink else None, expert_width=32 if shrink else None,
                            tokens=8 * QUERY if shrink else 8 * (PROMPT + GEN), repeats=repeats)
    report["stages"]["experts"] = exp
    print_experts(exp)
    save()
    per_family = report["stages"]["families"] = {}
    for family in families:
        if left() < (30 if shrink else 90):
            per_family[family] = {"skipped": f"budget: {left():.0f} s left"}
            continue
        name, model = build_released(family, device, dtype, shrink)
        n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        if model.get_input_embeddings().weight is not model.get_output_embeddings().weight:
            n_bytes -= model.get_input_embeddings().weight.nbytes  # a step reads only the looked-up rows of it
        entry = per_family[family] = {"released": name, "parameters": sum(p.numel() for p in model.parameters()),
                                      "weight_bytes_read_per_forward": n_bytes}
        entry["weight_read_s"], entry["read_bandwidth"] = read_seconds(n_bytes, device)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        shapes = (16, 32, 8) if shrink else (PROMPT, GEN, QUERY)
        entry["forwards"] = model_forwards(model, device, repeats, shapes)
        if family == "llada2":  # the whole forward at batch 8 with the former per-expert loop, once
            experts = [m for m in model.modules() if type(m).__name__ == "Experts"]
            for m in experts:
                m.impl = "loop"
            ids = entry_ids(model, 8, shapes[0] + shapes[1], device)
            with torch.no_grad():
                entry["loop_whole_b8_s"] = statistics.median(_timed(lambda: model(ids), _sync_for(device), 1))
            for m in experts:
                m.impl = "grouped"
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        # captured rollouts where a target needs them and the budget has room for compiling (~1-2 min at 8B)
        compiled = COMPILED.get(family, ()) if cuda and left() > 240 else ()
        gen = 16 if shrink else GEN
        entry["rollout"] = released_benchmark(family, [f"gen_length={gen}", f"block_length={shapes[2]}"],
                                              device=device, dtype=dtype, batch_size=8, prompt_length=shapes[0],
                                              model=model, write=False, compiled=compiled)["rows"]
        if cuda:
            entry["peak_gib"] = max([peak, *(r["peak_gib"] or 0 for r in entry["rollout"])])
        release(model)
        model = None
        save()
    if run_tests:  # last: what is left of the budget, at least a minute
        report["stages"]["gpu_tests"] = t = run_gpu_tests(timeout_s=max(60.0, left() - 10))
        print(f"  gpu tests: {t.get('passed', 0)} passed, {t.get('failed', 0)} failed, {t.get('skipped', 0)} skipped "
              f"({t['seconds']:.0f} s)")
    save()
    print_verdicts(report)
    print(f"  -> {shown_path(path)}")
    return report


def _forward_row(report: dict, family: str, batch: int) -> dict | None:
    entry = report["stages"].get("families", {}).get(family, {})
    return next((r for r in entry.get("forwards", {}).get("rows", []) if r["batch"] == batch), None)


def _speedup(report: dict, family: str, strategy: str) -> float | None:
    rows = report["stages"].get("families", {}).get(family, {}).get("rollout", [])
    found = [r["speedup_vs_vanilla"] for r in rows if r["strategy"] in (strategy, strategy + "+compiled")]
    return max(found) if found else None  # eager or captured, whichever is faster


def verdicts(report: dict) -> list[dict]:
    """One line per target: what was measured against what was asked, `met` True/False, or None (not measured,
    or shrunk shapes: the targets are for a GPU at the released shapes)."""
    out = []

    def add(target, measured, need, met, unit=""):
        out.append({"target": target, "measured": measured, "need": need, "met": None if report["shrunk"] else met,
                    "unit": unit})

    fam = report["stages"].get("families", {})
    row = _forward_row(report, "llada2", 8)
    loop = fam.get("llada2", {}).get("loop_whole_b8_s")
    grouped = row["whole_s"] if row else None
    add("LLaDA2.1-mini forward, batch 8, grouped experts", grouped, LLADA2_LOOP_FORWARD_S / LLADA2_SPEEDUP,
        None if grouped is None else grouped <= LLADA2_LOOP_FORWARD_S / LLADA2_SPEEDUP, "s")
    add("... the former loop over the same run's grouped forward", None if not (loop and grouped) else loop / grouped,
        LLADA2_SPEEDUP, None if not (loop and grouped) else loop / grouped >= LLADA2_SPEEDUP, "x")
    row = _forward_row(report, "llada", 1)
    read = fam.get("llada", {}).get("weight_read_s")
    step = row and (row.get("cached_step_captured_s") or None)
    add("LLaDA-8B cached block step, batch 1, captured, over one read of the weights",
        None if not (step and read) else step / read, WEIGHT_READ_FACTOR,
        None if not (step and read) else step / read <= WEIGHT_READ_FACTOR, "x")
    s = _speedup(report, "llada", "dual_cache")
    add("LLaDA-8B dual cache over vanilla, batch 8", s, DUAL_CACHE_SPEEDUP, None if s is None else s >= DUAL_CACHE_SPEEDUP,
        "x")
    s = _speedup(report, "sdar", "block_cache")
    add("SDAR-8B block cache over vanilla, batch 8", s, BLOCK_CACHE_SPEEDUP,
        None if s is None else s >= BLOCK_CACHE_SPEEDUP, "x")
    measured = {f: e["forwards"]["math_kernel_needed"] for f, e in fam.items() if "forwards" in e}
    checked = report["device"].startswith("cuda") and bool(measured)
    add("no forward on the math attention kernel", sum(len(v) for v in measured.values()) if checked else None, 0,
        None if not checked else not any(measured.values()), "calls")
    tests = report["stages"].get("gpu_tests")
    add("gpu-marked tests pass", None if tests is None else tests.get("failed", 0) + tests.get("error", 0)
        + tests.get("errors", 0), 0, None if tests is None else tests["rc"] in (0, 5), "failed")
    return out


def print_verdicts(report: dict) -> None:
    print("  targets:")
    for v in report["targets"]:
        mark = {True: "met", False: "MISSED", None: "not judged" if report["shrunk"] else "not measured"}[v["met"]]
        got = "-" if v["measured"] is None else f"{v['measured']:.4g} {v['unit']}"
        print(f"    {mark:12s} {v['target']}: {got} (need {'<=' if v['unit'] in ('s', 'calls', 'failed') or 'read' in v['target'] else '>='} {v['need']:.4g})")
