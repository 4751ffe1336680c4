"""The embedded default (`make demo` / `dare demo`).

1. build the synthetic addition tasks (train / held-out test) under ./data;
2. train a tiny LLaDA-architecture model from scratch with the `sft` baseline on demonstrations
   from a flawed teacher (`addition_teacher`: the carry into the hundreds forgotten with probability
   0.8, 0 written there), to its plateau: at temperature 0 it answers the sums below 100 and writes
   0 for the hundreds digit of the others;
3. continue from the SFT checkpoint with the `d1` baseline (reward: the correct sum), for each seed;
4. evaluate every checkpoint on the held-out split with the same decoding;
5. print the comparison and the command that opens the leaderboard.

Every stage is keyed by its config (./runs/<baseline>/<key>), so a rerun reuses what is finished
and resumes what is not. Configs: reproductions/demo/{sft,d1,eval}.yaml.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from dare.data import TASKS, load_split
from dare.eval import evaluate_checkpoint
from dare.results import read_result
from dare.utils import REPO_ROOT, runs_dir, shown_path

DEMO = REPO_ROOT / "reproductions" / "demo"

# --smoke: the same path at a size that runs in seconds (used by the tests).
SMOKE = {
    "sft": ["train.steps=30", "train.batch_size=32", "train.warmup_steps=5", "run.log_every=10",
            "model.scratch.d_model=32", "model.scratch.n_heads=2", "model.scratch.n_layers=1",
            "model.scratch.mlp_hidden_size=64"],
    "d1": ["train.steps=2", "rl.prompts_per_step=4", "run.log_every=1"],
    "eval": ["eval.n_samples=40"],
}


def _by_size(result_path: Path) -> tuple[float, float]:
    """Accuracy on the sums below 100 and on those of 100 and more (where the teacher slips), from
    the samples beside the result (the run folder's whole file: a published copy keeps 64)."""
    import json

    rows = [json.loads(line) for line in (result_path.parent / "samples_addition.jsonl").read_text().splitlines()]
    split = ([r["scores"]["accuracy"] for r in rows if int(r["target"]) < 100],
             [r["scores"]["accuracy"] for r in rows if int(r["target"]) >= 100])
    return tuple(sum(v) / len(v) if v else float("nan") for v in split)


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, std


def comparison(sft_result: Path, d1_results: list[Path]) -> list[str]:
    """The demo's comparison table, read from result files alone (`read_result`): the SFT run's and one per
    d1 seed, in a run folder or their committed copies in leaderboard/results/demo/, from which
    `python -m dare.app.docs --write-readme` writes it into README.md and docs/getting-started.md."""
    sft, d1 = read_result(sft_result), [read_result(p) for p in d1_results]
    sft_acc = sft.metric("accuracy")
    d1_accs = [r.metric("accuracy").value for r in d1]
    d1_mean, d1_std = _mean_std(d1_accs)
    spread = f"{d1_mean:.3f} ± {d1_std:.3f}" if len(d1) > 1 else f"{d1_mean:.3f}"
    per_seed = sum(r.training.wall_time_s for r in d1) / len(d1)
    return [
        f"Held-out addition accuracy ({sft_acc.count} problems, greedy, identical decoding: reproductions/demo/eval.yaml)",
        f"  {'method':8s} {'init':8s} {'seeds':>5s}  {'accuracy':>16s}  {'train time':>12s}",
        f"  {sft.method.baseline:8s} {sft.method.init:8s} {1:>5d}  {sft_acc.value:>16.3f}  "
        f"{sft.training.wall_time_s:>11.0f}s",
        f"  {d1[0].method.baseline:8s} {d1[0].method.init:8s} {len(d1):>5d}  {spread:>16s}  {per_seed:>8.0f}s/seed",
        f"  d1 - sft: {d1_mean - sft_acc.value:+.3f}   (per seed: {', '.join(f'{a:.3f}' for a in d1_accs)})",
    ]


def main(smoke: bool = False, seeds: int = 3) -> int:
    from dare.app.runs import train

    t0 = time.perf_counter()
    extra = SMOKE if smoke else {"sft": [], "d1": [], "eval": []}
    for task in ("addition_teacher", "addition"):
        for split in TASKS[task].splits:
            print(f"[demo] {task}/{split}: {len(load_split(task, split))} examples", flush=True)

    sft_run = train("sft", DEMO / "sft.yaml", extra["sft"])
    sft_result = evaluate_checkpoint(sft_run / "final", DEMO / "eval.yaml", extra["eval"])[0]

    d1_results = []
    for seed in range(seeds):
        run = train("d1", DEMO / "d1.yaml", [f"model.path={shown_path(sft_run / 'final')}", f"run.seed={seed}",
                                             *extra["d1"]])
        d1_results.append(evaluate_checkpoint(run / "final", DEMO / "eval.yaml", extra["eval"])[0])

    print()
    print("\n".join(comparison(sft_result, d1_results)))
    (sft_low, sft_high), *d1_sizes = [_by_size(p) for p in [sft_result, *d1_results]]
    d1_low, d1_high = (sum(v) / len(v) for v in zip(*d1_sizes))
    print(f"  sums < 100 / >= 100: sft {sft_low:.3f} / {sft_high:.3f}, d1 {d1_low:.3f} / {d1_high:.3f} (mean of the seeds)")
    print()
    print(f"Result JSONs: {sft_result}")
    for p in d1_results:
        print(f"              {p}")
    print(f"Demo wall time: {time.perf_counter() - t0:.0f}s (this invocation; finished stages are reused)")
    print()
    runs = runs_dir()
    print("Publish them to the committed leaderboard (then commit leaderboard/results/demo):")
    print(f"  .venv/train/bin/dare results publish {' '.join(str(p) for p in [sft_result, *d1_results])} "
          "--to leaderboard/results/demo")
    print("Open the leaderboard with these results:")
    print(f"  make leaderboard        # or: .venv/train/bin/dare leaderboard --runs {runs}")
    return 0
