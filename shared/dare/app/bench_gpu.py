"""Speed at the sizes people run: `dare bench experts` (grouped experts against the former per-expert loop)
and `dare bench gpu` (the one GPU acceptance command: gpu-marked tests, then per family at its released
shape with random weights: forward times at batch 1 and 8, eager and captured; decoding tokens/s per cache
strategy; grouped vs loop experts; whether any attention call needed the math kernel; peak memory; one d1 RL step
at the LLaDA-8B shape with LoRA through the real training loop, its time and peak memory per phase beside
`dare plan`'s prediction (issue 48); a verdict per target). `--device cpu` runs the same stages at shrunk shapes
(the suite runs it so it cannot rot between GPU runs); its numbers say nothing about a GPU.
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
LLADA2_FORWARD_S, LLADA2_SPEEDUP = 0.025, 40.0  # issue 62: <= 25 ms at batch 8 and >= 40x the former loop
WEIGHT_READ_FACTOR = 1.3  # issue 62: LLaDA-8B cached block step at batch 1 within 1.3x one read of the weights
DUAL_CACHE_SPEEDUP, BLOCK_CACHE_SPEEDUP = 5.0, 3.0
GPU_TIME_S = 480  # the whole command, gpu tests included, on one H100 or H200
# the rollouts timed again with their step captured: only where a target reads them (compiling an 8B forward takes
# one to two minutes)
COMPILED = {"llada": ("dual_cache",), "sdar": ("block_cache",)}
LATE = ("dream",)  # families no target reads: measured after the RL step, with what the budget leaves
PROMPT, GEN, QUERY = 128, 256, 32  # the rollouts' shapes: prompt, generation, one block of queries
# issue 48: one d1 step at the LLaDA-8B shape, LoRA r128, bf16 base, micro-batch 6, 6 rows, prompt 200 + gen 256,
# gradient checkpointing; its peak under 70 GiB (one 80 GB card with 10 GiB to spare), the planner within 10%
RL_STEP = {"prompt": 200, "gen": 256}
RL_STEP_SHRUNK = {"prompt": 16, "gen": 16}
RL_STEP_STEPS = 2  # the first a warm-up (cuBLAS, kernels' first calls); times from the last, peaks over both
RL_STEP_MIN_S = 200  # budget left under which the stage is skipped on a GPU (writing 16 GB, two runs of two steps)
TRACERL_STEP_MIN_S = 120  # the same for TraceRL's step on SDAR-8B (one run of two steps)
RL_PEAK_GIB, PLAN_TOLERANCE = 70.0, 0.10
GPU_TESTS_MIN_S = 120  # kept for the gpu tests: 55 s on their own on an H200, timed out at 60 s after the stages (2026-11-27)
RL_PHASES = {"rollout": "rollout", "logp": "log-probs", "update": "update"}  # metrics.jsonl's name -> the planner's
ACCELERATED = ["rl.decoding.masked.cache=dual", "rl.decoding.masked.threshold=0.9"]
"""The accelerated rollout the d1 step is also timed with (issue 62, item 4): Fast-dLLM's dual cache and its
confidence threshold, the step captured on CUDA; beside d1's own protocol (no cache, fixed steps), same rows."""
ACCELERATED_STEP_SPEEDUP = 4.0  # DARE reports about 4x end to end on masked models


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


def rollout_step(model, ids, cache, start, device: str):
    """The cached step exactly as the samplers run it on CUDA (`StepForward`, compiled: inductor with CUDA graphs, the
    cache's tensors static): -> (step, None), or (None, why not). Its first two calls compile and record it."""
    import torch

    from dare.rollout.core import BACKEND, StepForward

    if not device.startswith("cuda"):
        return None, "not compiled on cpu"
    run, mask = StepForward(model, compiled=True), torch.ones_like(ids)

    def step():
        return run(ids, mask, cache, start)

    step(), step()
    if not model.__dict__.get("_dare_steps", {}).get(BACKEND):
        return None, "the compiled step fell back to eager (its stderr line says why)"
    return step, None


def model_forwards(model, device: str, repeats: int, shapes=(PROMPT, GEN, QUERY), compiled: tuple = ()) -> dict:
    """Per-forward seconds (median of `repeats`, with min and max) at batch 1 and 8: the whole sequence (a
    vanilla step: prompt + generation), and one step of a block's queries on a static cache, as the samplers run
    it (masked models: the dual cache of the whole sequence, the block's `query` positions replaced; block
    models: one block of the model's block size reading the committed prefix), eager and replayed from a CUDA
    graph, and at the batch sizes in `compiled` compiled as the rollouts run it (`rollout_step`: a target reads it;
    compiling an 8B forward takes about a minute); whether every call ran without the math attention kernel; the
    cache's bytes."""
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
            for label, make in (("captured", lambda: captured(step, device)), ("compiled", lambda: (
                    rollout_step(model, q_ids, cache, None if block_model else start, device) if batch in compiled
                    else (None, "not compiled here (no target reads it)")))):
                fn, why = make()  # the step replayed from a CUDA graph; compiled as the rollouts run it
                row[f"cached_step_{label}_s"] = None
                if fn is None:
                    row[f"{label}_note"] = why
                    continue
                times = _timed(fn, sync, repeats)
                row[f"cached_step_{label}_s"], row[f"cached_step_{label}_spread_s"] = (
                    statistics.median(times), [min(times), max(times)])
            fn = None
            row["cache_bytes"] = sum(t.numel() * t.element_size() for t in (*cache.keys, *cache.values))
            rows.append(row)
            cache = None  # freed before the next batch size
    return {"rows": rows, "math_kernel_needed": math_needed}


def entry_ids(model, batch: int, length: int, device: str):
    """Random token ids below every special id of the model."""
    import torch

    from dare.models import facts

    f = facts(model)
    low = min(i for i in (f.mask_token_id, f.eos_token_id, f.eot_token_id, f.pad_token_id) if i is not None)
    return torch.randint(10, min(low, 30000), (batch, length), generator=torch.Generator().manual_seed(0)).to(device)


def release(model=None) -> None:
    """Free a benchmarked model's GPU memory now: its compiled steps (whose closures hold the model) and kept
    caches, then (also without a model: what nothing references any more) a garbage collection, dynamo's caches
    and the allocator's."""
    import gc

    import torch

    for key in ("_dare_steps", "_dare_caches"):
        if model is not None:
            model.__dict__.pop(key, None)
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def chain_tokenizer(prompt_tokens: int, family: str = "llada"):
    """A character tokenizer for `family` over `chain`'s alphabet whose chat template opens with a system turn of
    worked `chain` examples, cut so that every `chain` prompt (always 6 characters) is `prompt_tokens` tokens long.
    Ids the tokenizer does not know (a random model samples any id of its vocabulary) decode to nothing."""
    from dare.data.synthetic import Chain
    from dare.models.api import encode_chat
    from dare.models.tokenizer import CHAT_TEMPLATE, char_tokenizer
    from dare.rewards.arithmetic import chain_trace, lsb

    tokenizer = char_tokenizer(Chain.alphabet, family)
    plain = len(encode_chat(tokenizer, [[{"role": "user", "content": "0000,a"}]])[0])
    n = max(0, prompt_tokens - plain - 1)  # the system turn's role token, then n characters
    examples, start = "", 1234
    while len(examples) < n:
        examples += f"{lsb(start, 4)},z{chain_trace(start, 26)}"
        start = (start * 7 + 1) % 10000
    tokenizer.chat_template = "{{ '<|system|>" + examples[:n] + "' }}" + CHAT_TEMPLATE if n else CHAT_TEMPLATE
    return tokenizer


def rl_step_overrides(folder, run_dir, gen: int, steps: int = RL_STEP_STEPS, accelerated: bool = False,
                      cuda: bool = False) -> list[str]:
    """d1 at issue 48's one-card 8B setting: LoRA r128 on a bf16 base, micro-batch 6, one prompt x 6 completions,
    one update (mu = 1), gradient checkpointing, d1's rollout (no cache, block 32, steps = gen / 2) uncompiled, the
    diagnostics off (they measure the run; they are not the step), `chain`'s test prompts. `accelerated`: the
    rollout with `ACCELERATED`'s dual cache and threshold, its step captured on CUDA."""
    block = min(32, gen)
    rollout = [*ACCELERATED, f"rl.decoding.compile={str(cuda).lower()}"] if accelerated else [
        "rl.decoding.compile=false"]
    return [f"model.path={folder}", "model.family=llada", "model.dtype=bfloat16", "model.lora.rank=128",
            "data.task=chain", "data.split=test", f"train.steps={steps}", "train.micro_batch_size=6",
            "train.gradient_checkpointing=true", "rl.prompts_per_step=1", "rl.group_size=6", "rl.num_iterations=1",
            f"rl.decoding.gen_length={gen}", f"rl.decoding.block_length={block}", f"rl.decoding.steps={gen // 2}",
            *rollout, "rl.agreement_rows=0", "rl.diag_every=0", "run.log_every=1", "run.save_every=0",
            f"run.out_dir={run_dir}"]


def rl_step_benchmark(device: str, shrink: bool = False) -> dict:
    """Issue 48's d1 step at the LLaDA-8B shape (SHRUNK on CPU): the model with random weights written as a
    checkpoint (bf16, a `chain_tokenizer`) to a temporary folder, then `RL_STEP_STEPS` steps of d1 through the RL
    loop itself (`dare.train.rl.run`: the Trainer, LoRA, the fused loss; the final export is not part of a step and
    is not run); per phase (rollout, log-probs, update) the last step's seconds and, on CUDA, its peak memory
    (`memory/<phase>_peak_gib`: the allocator's, max over the steps), beside `dare plan`'s prediction for the same
    config (`plan_run`, one GPU, the real prompt length) and their ratio. The planner's figures include its fixed
    CUDA context and fragmentation allowance (`OVERHEAD_GIB`); a phase's `ratio` compares the allocator's peak to the
    planner without it, and the whole step's `plan_ratio` compares the card's peak (the allocator's reserved
    high-water mark plus what the CUDA context holds beside it) to the planner's peak as `dare plan` prints it."""
    import json
    import tempfile

    import torch

    from dare.app.runs import resolve
    from dare.data import load_split
    from dare.models.api import encode_chat, meta_model
    from dare.train import plan as planner
    from dare.train import rl
    from dare.train.checkpoint import save_model

    cuda = device.startswith("cuda")
    shape = RL_STEP_SHRUNK if shrink else RL_STEP
    entry: dict = {"family": "llada", "setting": {**shape, "lora_rank": 128, "micro_batch": 6, "rows": 6,
                                                  "gradient_checkpointing": True, "steps": RL_STEP_STEPS,
                                                  "task": "chain", "baseline": "d1", "num_iterations": 1}}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dare-rl-step-") as tmp:
        folder, run_dir = Path(tmp) / "model", Path(tmp) / "run"
        run_dir.mkdir()
        name, model = build_released("llada", device, "bfloat16", shrink)  # the frozen base stays bf16
        entry["released"], entry["parameters"] = name, sum(p.numel() for p in model.parameters())
        tokenizer = chain_tokenizer(shape["prompt"])
        save_model(model, tokenizer, folder)
        model = None
        release()
        entry["checkpoint_write_s"] = time.perf_counter() - start

        overrides = rl_step_overrides(folder, run_dir, shape["gen"])
        _, cfg, hooks = resolve("d1", None, overrides)
        lengths = {len(ids) for ids in encode_chat(tokenizer, [r["prompt"] for r in load_split("chain", "test")])}
        prompt = max(lengths)
        entry["setting"]["prompt_tokens"] = sorted(lengths)
        entry["overrides"] = [o for o in overrides if not o.startswith(("model.path=", "run.out_dir="))]

        # the planner, as `dare plan d1 <overrides> --gpus 1 --prompt-length <prompt>` computes it
        meta = meta_model(folder)
        shapes = planner.shapes_of(meta, cfg.model.lora.rank, cfg.model.lora.targets)
        per_token, per_forward = planner.layer_activation_bytes(type(meta), meta.config, "bfloat16")
        plan = planner.plan_run(cfg, bool(hooks.uses_reference(cfg)), shapes, per_token, per_forward, recipe="rl",
                                gpus=1, prompt_length=prompt, device=device)
        overhead = planner.OVERHEAD_GIB if cuda else 0.0

        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            entry["allocated_before_gib"] = torch.cuda.memory_allocated() / 2**30  # left by earlier stages: ~0
        tic = time.perf_counter()
        rl.run(cfg, hooks, run_dir, label="d1")  # its outcome (the trainer) is dropped: freed below
        entry["run_s"] = time.perf_counter() - tic
        if cuda:
            torch.cuda.synchronize()
            free, total = torch.cuda.mem_get_info()
            reserved = max(torch.cuda.memory_reserved(), torch.cuda.max_memory_reserved())
            entry["reserved_gib"] = reserved / 2**30  # the allocator's high-water mark (nothing emptied its cache)
            entry["context_gib"] = max(0, total - free - torch.cuda.memory_reserved()) / 2**30
            entry["card_gib"] = total / 2**30
        records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        release()  # the trainer's model, LoRA and optimizer: unreferenced since the run returned
        # the same steps (same rows: same seed and prompts) with the accelerated rollout
        fast_dir = Path(tmp) / "run-accelerated"
        fast_dir.mkdir()
        fast_overrides = rl_step_overrides(folder, fast_dir, shape["gen"], accelerated=True, cuda=cuda)
        _, fast_cfg, fast_hooks = resolve("d1", None, fast_overrides)
        tic = time.perf_counter()
        rl.run(fast_cfg, fast_hooks, fast_dir, label="d1")
        fast_run_s = time.perf_counter() - tic
        fast = [json.loads(x) for x in (fast_dir / "metrics.jsonl").read_text().splitlines()]
        release()
    entry["steps_logged"] = len(records)
    last = records[-1]
    phases = {}
    for key, plan_name in RL_PHASES.items():
        planned = plan.peak(plan_name) / 2**30
        row = {"time_s": last[f"time/{key}_s"], "time_s_each": [r[f"time/{key}_s"] for r in records],
               "planned_gib": planned, "planned_items_gib": {k: b / 2**30 for k, b in plan.phases[plan_name]}}
        peaks = [r[f"memory/{key}_peak_gib"] for r in records if f"memory/{key}_peak_gib" in r]
        row["peak_gib"] = max(peaks) if peaks else None
        row["ratio"] = row["peak_gib"] / (planned - overhead) if peaks else None
        phases[key] = row
    entry["phases"] = phases
    entry["step_s"] = sum(p["time_s"] for p in phases.values())
    entry["memory_keys"] = sorted({k for r in records for k in r if k.startswith("memory/")})
    worst_phase, worst = plan.worst
    entry["planned_peak_gib"], entry["planned_peak_phase"] = worst / 2**30, worst_phase
    measured = [p["peak_gib"] for p in phases.values() if p["peak_gib"] is not None]
    entry["peak_gib"] = max(measured) if measured else None
    entry["card_peak_gib"] = entry["reserved_gib"] + entry["context_gib"] if cuda else None
    entry["plan_ratio"] = entry["card_peak_gib"] / entry["planned_peak_gib"] if cuda else None
    entry["reward_mean"] = last.get("rollout/reward_mean")
    entry["response_tokens"] = last.get("rollout/response_tokens")
    entry["rollout_share"] = phases["rollout"]["time_s"] / entry["step_s"] if entry["step_s"] else None
    quick = {key: fast[-1][f"time/{key}_s"] for key in RL_PHASES}
    fast_step = sum(quick.values())
    entry["accelerated"] = {
        "overrides": [o for o in fast_overrides if o in ACCELERATED or o.startswith("rl.decoding.compile=")],
        "run_s": fast_run_s,
        "phases_s": quick, "step_s": fast_step, "rollout_share": quick["rollout"] / fast_step if fast_step else None,
        "response_tokens": fast[-1].get("rollout/response_tokens"), "reward_mean": fast[-1].get("rollout/reward_mean"),
        "peak_gib": max((r[k] for r in fast for k in r if k.startswith("memory/") and k.endswith("_peak_gib")),
                        default=None)}
    entry["accelerated_speedup"] = entry["step_s"] / fast_step if fast_step else None
    entry["seconds"] = time.perf_counter() - start
    return entry


def tracerl_step_benchmark(device: str, shrink: bool = False) -> dict:
    """Issue 62: TraceRL's step at the SDAR-8B shape (SHRUNK on CPU), `RL_STEP_STEPS` steps through the RL loop as
    the d1 step is run (LoRA r128 on a bf16 base, micro-batch 6, one prompt x 6 completions, `chain`'s prompts), the
    block sampler with its cache and TraceRL's own decoding (4 steps a block, threshold 0.9), the step captured on
    CUDA; the accuracy filter opened (a random model's groups all fail: the step would otherwise make no update).
    Per phase the last step's seconds and the peak memory; the rollout's share of the step."""
    import json
    import tempfile

    import torch

    from dare.app.runs import resolve
    from dare.train import rl
    from dare.train.checkpoint import save_model

    cuda = device.startswith("cuda")
    shape = RL_STEP_SHRUNK if shrink else RL_STEP
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dare-tracerl-step-") as tmp:
        folder, run_dir = Path(tmp) / "model", Path(tmp) / "run"
        run_dir.mkdir()
        name, model = build_released("sdar", device, "bfloat16", shrink)
        entry: dict = {"family": "sdar", "released": name, "parameters": sum(p.numel() for p in model.parameters())}
        save_model(model, chain_tokenizer(shape["prompt"], "sdar"), folder)
        model = None
        release()
        overrides = [f"model.path={folder}", "model.family=sdar", "model.dtype=bfloat16", "model.lora.rank=128",
                     "data.task=chain", "data.split=test", f"train.steps={RL_STEP_STEPS}", "train.micro_batch_size=6",
                     "train.gradient_checkpointing=true", "rl.prompts_per_step=1", "rl.group_size=6",
                     "rl.num_iterations=1", f"rl.decoding.gen_length={shape['gen']}",
                     f"rl.decoding.compile={str(cuda).lower()}", "algo.filter_low=0", "algo.filter_high=1",
                     "rl.agreement_rows=0", "rl.diag_every=0", "run.log_every=1", "run.save_every=0",
                     f"run.out_dir={run_dir}"]
        _, cfg, hooks = resolve("tracerl", None, overrides)
        entry["overrides"] = [o for o in overrides if not o.startswith(("model.path=", "run.out_dir="))]
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        rl.run(cfg, hooks, run_dir, label="tracerl")
        records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        release()
    last = records[-1]
    entry["steps_logged"] = len(records)
    entry["phases_s"] = {key: last[f"time/{key}_s"] for key in RL_PHASES}
    entry["step_s"] = sum(entry["phases_s"].values())
    entry["rollout_share"] = entry["phases_s"]["rollout"] / entry["step_s"] if entry["step_s"] else None
    peaks = [r[k] for r in records for k in r if k.startswith("memory/") and k.endswith("_peak_gib")]
    entry["peak_gib"] = max(peaks) if peaks else None
    entry["response_tokens"] = last.get("rollout/response_tokens")
    entry["seconds"] = time.perf_counter() - start
    return entry


def print_tracerl_step(entry: dict) -> None:
    if "skipped" in entry or "error" in entry:
        print(f"  TraceRL step: {entry.get('skipped') or entry.get('error')}")
        return
    p = entry["phases_s"]
    peak = "" if entry["peak_gib"] is None else f", peak {entry['peak_gib']:.2f} GiB"
    print(f"  TraceRL step, {entry['released']} shape: {entry['step_s']:.3f} s (rollout {p['rollout']:.3f} s, "
          f"{entry['rollout_share']:.0%}; log-probs {p['logp']:.3f} s; update {p['update']:.3f} s){peak}")


def print_rl_step(entry: dict) -> None:
    if "skipped" in entry or "error" in entry:
        print(f"  d1 step: {entry.get('skipped') or entry.get('error')}")
        return
    s = entry["setting"]
    print(f"  d1 step, {entry['released']} shape, LoRA r{s['lora_rank']}, {s['rows']} rows, micro-batch "
          f"{s['micro_batch']}, prompt {max(s['prompt_tokens'])} + gen {s['gen']} ({entry['seconds']:.0f} s, "
          f"checkpoint written in {entry['checkpoint_write_s']:.0f} s)")
    for key, p in entry["phases"].items():
        peak = "-" if p["peak_gib"] is None else f"{p['peak_gib']:.2f} GiB"
        ratio = "" if p["ratio"] is None else f", measured/planned {p['ratio']:.2f}"
        print(f"    {RL_PHASES[key]:9s} {p['time_s']:8.3f} s  peak {peak:>10s}  planned {p['planned_gib']:.3g} GiB"
              f"{ratio}")
    fast = entry["accelerated"]
    settings = " ".join(o.split(".", 2)[2] for o in fast["overrides"])
    print(f"    accelerated rollout ({settings}): step {fast['step_s']:.3f} s (rollout {fast['phases_s']['rollout']:.3f} s, "
          f"{fast['rollout_share']:.0%} of it) against {entry['step_s']:.3f} s (rollout {entry['rollout_share']:.0%}): "
          f"{entry['accelerated_speedup']:.2f}x")
    if entry["card_peak_gib"] is not None:
        print(f"    card peak {entry['card_peak_gib']:.2f} GiB (reserved {entry['reserved_gib']:.2f} + context "
              f"{entry['context_gib']:.2f}) against the planner's {entry['planned_peak_gib']:.2f} GiB "
              f"({entry['planned_peak_phase']}): {entry['plan_ratio']:.2f}")


READS = 12  # the bandwidth probe's timed reads, after its warm-ups: the best of them is the device's read speed


def read_seconds(n_bytes: int, device: str) -> tuple[float, float]:
    """(seconds to read `n_bytes` once at this device's measured read bandwidth, the bandwidth in bytes/s):
    the best of `READS` sums over a 2 GiB buffer (64 MiB on CPU) after three warm-up sums (issue 62: the median of
    five had read 2.53 TB/s in one stage and 2.99 in the others on the same H100)."""
    import torch

    size = (2 << 30) if device.startswith("cuda") else (64 << 20)
    buf = torch.ones(size // 2, dtype=torch.bfloat16, device=device)
    for _ in range(2):
        buf.sum(dtype=torch.float32)  # (and `_timed`'s own warm-up: three)
    times = _timed(lambda: buf.sum(dtype=torch.float32), _sync_for(device), READS)
    bandwidth = size / min(times)
    return n_bytes / bandwidth, bandwidth


def gpu_benchmark(device: str = "cuda", dtype: str = "bfloat16", *, shrink: bool = False, out: str | None = None,
                  families=FAMILIES, repeats: int = 5, run_tests: bool = True, budget_s: float = GPU_TIME_S) -> dict:
    """`dare bench gpu`: see the module docstring. Stages run while `budget_s` lasts (a stage that would start
    after it is recorded as skipped); the report is written after each stage, so a run cut short keeps what it
    measured."""
    import torch

    from dare.app.bench import released_benchmark
    from dare.utils import atomic_write_json, command_line, fingerprint, now, runs_dir, shown_path

    start = time.perf_counter()
    card = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    stamp = now().replace(":", "")
    name = f"gpu-{card.replace(' ', '_')}-{stamp}.json"
    # a report is published by choice (make gpu-check: --out leaderboard/results/bench-gpu/), never by default
    path = (Path(out) / name if out.endswith("/") or Path(out).is_dir() else Path(out)) if out else (
        runs_dir() / "bench" / name)
    report = {"kind": "bench.gpu", "benchmark": "gpu", "card": card, "device": device, "dtype": dtype, "shrunk": shrink,
              "command": command_line(), "created": now(), **fingerprint(), "stages": {}, "targets": []}

    def left() -> float:
        return budget_s - (time.perf_counter() - start)

    def stage_left() -> float:  # what the stages may use: the gpu tests keep their share of the budget
        return left() - (GPU_TESTS_MIN_S if run_tests and not shrink else 0)

    def save():
        report["seconds"] = time.perf_counter() - start
        report["targets"] = verdicts(report)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, report)

    print(f"dare bench gpu: {card}, {dtype}, {'shrunk' if shrink else 'released'} shapes, budget {budget_s:.0f} s; "
          f"report -> {shown_path(path)}")
    cuda = device.startswith("cuda")
    exp = experts_benchmark(device, dtype, hidden=64 if shrink else None, expert_width=32 if shrink else None,
                            tokens=8 * QUERY if shrink else 8 * (PROMPT + GEN), repeats=repeats)
    report["stages"]["experts"] = exp
    print_experts(exp)
    save()
    per_family = report["stages"]["families"] = {}

    def family_stage(family: str) -> None:
        if stage_left() < (30 if shrink else 90):
            per_family[family] = {"skipped": f"budget: {stage_left():.0f} s left"}
            return
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
        entry["forwards"] = model_forwards(model, device, repeats, shapes, compiled=(1,) if family == "llada" else ())
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
        compiled = COMPILED.get(family, ()) if cuda and stage_left() > 240 else ()
        gen = 16 if shrink else GEN
        entry["rollout"] = released_benchmark(family, [f"gen_length={gen}", f"block_length={shapes[2]}"],
                                              device=device, dtype=dtype, batch_size=8, prompt_length=shapes[0],
                                              model=model, write=False, compiled=compiled)["rows"]
        if cuda:
            entry["peak_gib"] = max([peak, *(r["peak_gib"] or 0 for r in entry["rollout"])])

    def rl_stage(name: str, benchmark, printer, min_s: float) -> None:
        if stage_left() < (20 if shrink else min_s):
            report["stages"][name] = {"skipped": f"budget: {stage_left():.0f} s left"}
        else:
            report["stages"][name] = benchmark(device, shrink)
        printer(report["stages"][name])

    def rl_step_stage() -> None:
        rl_stage("rl_step", rl_step_benchmark, print_rl_step, RL_STEP_MIN_S)

    def tracerl_step_stage() -> None:
        rl_stage("tracerl_step", tracerl_step_benchmark, print_tracerl_step, TRACERL_STEP_MIN_S)

    # the targets' families, the RL steps (issues 48 and 62), then the families no target reads
    stages = [(f, lambda f=f: family_stage(f)) for f in families if f not in LATE]
    stages += [("rl_step", rl_step_stage), ("tracerl_step", tracerl_step_stage)]
    stages += [(f, lambda f=f: family_stage(f)) for f in families if f in LATE]
    for label, stage in stages:
        try:
            stage()
        except Exception as e:  # noqa: BLE001 - recorded: one stage's failure must not cost the stages after it
            import traceback

            failed = {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}",
                      "traceback": traceback.format_exc().splitlines()[-12:]}
            if label in ("rl_step", "tracerl_step"):
                report["stages"][label] = failed
            else:
                per_family[label] = {**per_family.get(label, {}), **failed}
            print(f"  {label}: {failed['error']}")
        release()  # after the except block, whose traceback held the stage's frames (its model, its trainer)
        save()
    if run_tests:  # last: what is left of the budget, at least GPU_TESTS_MIN_S
        report["stages"]["gpu_tests"] = t = run_gpu_tests(timeout_s=max(GPU_TESTS_MIN_S, left() - 10))
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
    add("LLaDA2.1-mini forward, batch 8, grouped experts", grouped, LLADA2_FORWARD_S,
        None if grouped is None else grouped <= LLADA2_FORWARD_S, "s")
    add("... the former loop over the same run's grouped forward", None if not (loop and grouped) else loop / grouped,
        LLADA2_SPEEDUP, None if not (loop and grouped) else loop / grouped >= LLADA2_SPEEDUP, "x")
    row = _forward_row(report, "llada", 1)
    read = fam.get("llada", {}).get("weight_read_s")
    step = row and (row.get("cached_step_compiled_s") or row.get("cached_step_captured_s") or None)  # as rollouts run
    add("LLaDA-8B cached block step, batch 1, compiled as the rollouts run it, over one read of the weights",
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
    step = report["stages"].get("rl_step", {})
    peak, planned = step.get("card_peak_gib"), step.get("planned_peak_gib")
    add("LLaDA-8B d1 step (LoRA r128, micro-batch 6, prompt 200 + gen 256): peak memory on the card", peak, RL_PEAK_GIB,
        None if peak is None else peak < RL_PEAK_GIB, "GiB")
    error = None if not (peak and planned) else abs(planned - peak) / peak
    add("... dare plan's peak for it, off the measured peak by", error, PLAN_TOLERANCE,
        None if error is None else error <= PLAN_TOLERANCE, "rel")
    fast = step.get("accelerated_speedup")
    add("... the same step with the accelerated rollout (dual cache, captured, threshold 0.9) over d1's protocol", fast,
        ACCELERATED_STEP_SPEEDUP, None if fast is None else fast >= ACCELERATED_STEP_SPEEDUP, "x")
    tests = report["stages"].get("gpu_tests")
    add("gpu-marked tests pass", None if tests is None else tests.get("failed", 0) + tests.get("error", 0)
        + tests.get("errors", 0), 0, None if tests is None else tests["rc"] in (0, 5), "failed")
    return out


def at_most(target: dict) -> bool:
    """A target (`verdicts`' row) is met at or below its need (a time, calls or failures, memory, a relative error, a
    step over one read of the weights), else at or above it (a speedup). Reads a report's row without trusting it."""
    return target.get("unit") in ("s", "calls", "failed", "GiB", "rel") or "read" in str(target.get("target"))


def print_verdicts(report: dict) -> None:
    print("  targets:")
    for v in report["targets"]:
        mark = {True: "met", False: "MISSED", None: "not judged" if report["shrunk"] else "not measured"}[v["met"]]
        got = "-" if v["measured"] is None else f"{v['measured']:.4g} {v['unit']}"
        print(f"    {mark:12s} {v['target']}: {got} (need {'<=' if at_most(v) else '>='} {v['need']:.4g})")
