"""Evaluation of a checkpoint: one result JSON per benchmark, with per-sample outputs beside it.

Two engines (`eval.engine`):
  embedded     decode a task's split with the rollout engine and score every sample with the task's
               metric (`dare.data` tasks, `dare.rewards`), in this process (train environment; the
               demo and validation during training use it);
  opencompass  the benchmarks of DARE's suite (`dare.eval.suite`) through the released OpenCompass
               in the eval environment, with our `DiffusionLM` model class
               (`dare.eval.opencompass_model`); results are read from its files
               (`dare.eval.opencompass_run`). Benchmarks it does not cover run embedded.

    dare eval <checkpoint> [config.yaml] [key=value ...] [--engine opencompass] [--benchmarks a,b]
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path


from dare import decoding as decoding_options
from dare.config import (ConfigError, DecodingConfig, EvalRunConfig, config_hash, did_you_mean, parse_override,
                         read_yaml, to_dict)
from dare.config import load as load_config
from dare.config import save as save_config
from dare.data import TASKS, load_split
from dare.eval import suite
from dare.models import encode_chat, facts, load_pretrained, load_tokenizer
from dare.models.api import check_checkpoint, checkpoint_fingerprint, checkpoint_meta, count_parameters, meta_model
from dare.results import SCHEMA_VERSION, metric_from_values, read_result, write_result
from dare.utils import (UserError, atomic_write, command_line, environment_lock, git_state, hardware, make_generator,
                        now, package_versions, runs_dir, sha256_file, shown_path)


class _ProgressLines:
    """Progress as plain lines on stderr (a log, not a terminal): one at every tenth of the samples."""

    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.done, self.tenths, self.t0 = total, desc, 0, 0, time.perf_counter()

    def update(self, n: int) -> None:
        self.done += n
        if 10 * self.done // self.total > self.tenths or self.done == self.total:
            self.tenths = 10 * self.done // self.total
            seconds = time.perf_counter() - self.t0
            print(f"[eval] {self.desc}: {self.done}/{self.total} samples ({100 * self.done // self.total}%), "
                  f"{seconds:.0f}s, {self.done / max(seconds, 1e-9):.1f} samples/s", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str):
    """Progress over `total` samples on stderr: a tqdm bar on a terminal, plain periodic lines otherwise."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=f"[eval] {desc}", unit="sample", file=sys.stderr, dynamic_ncols=True)
    return _ProgressLines(total, desc)


def evaluate_model(model, tokenizer, task_name: str, split: str, decoding, batch_size: int,
                   n_samples: int | None, seed: int, progress: bool = False) -> dict:
    """Decode and score; returns per-sample records, per-metric values and timing. `progress`: show
    the samples decoded so far (`progress_bar`)."""
    import torch

    from dare.rollout import decode_responses, generate, left_pad

    task = TASKS[task_name]
    rows = load_split(task_name, split)
    original = len(rows)
    rows = rows[:n_samples] if n_samples else rows
    if not rows:
        raise UserError(f"{task_name}/{split} has no examples to evaluate")
    f = facts(model)
    from dare.rollout import sampler_name

    prompts = encode_chat(tokenizer, [r["prompt"] for r in rows])
    generator = make_generator(seed, f"eval:{task_name}:{split}")
    from dare.rollout.dynamic import marker_id

    marker = marker_id(tokenizer, decoding)  # dynamic blocks' marker token (None: fixed blocks)
    samples, values = [], defaultdict(list)
    nfe_total, tokens_total, committed_total = 0, 0, 0
    model.eval()
    bar = progress_bar(len(rows), f"{task_name}/{split}") if progress else None
    t0 = time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            ids, mask = left_pad(prompts[start:start + batch_size], f.pad_token_id)
            out = generate(model, ids, mask, decoding, generator, marker)
            texts = decode_responses(tokenizer, out.responses, f.stop_ids)
            nfe_total += out.nfe * len(chunk)
            tokens_total += int(out.response_mask.sum())
            committed_total += out.responses.numel()
            for row, text, scores in zip(chunk, texts, task.scores(texts, chunk)):
                for name, v in scores.items():
                    values[name].append(float(v))
                samples.append({"index": row["index"], "prompt": row["prompt"], "target": row["ground_truth"],
                                "response": text, "scores": scores})
            if bar is not None:
                bar.update(len(chunk))
    seconds = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    n = len(rows)
    return {"samples": samples, "values": dict(values), "n_original": original, "n_effective": n,
            "sampler": sampler_name(model, decoding),
            "seconds": seconds, "throughput": {
                "eval_samples_per_s": n / seconds, "eval_tokens_per_s": tokens_total / seconds,
                "nfe_per_sample": nfe_total / n, "tokens_per_forward": committed_total / max(1, nfe_total)}}


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in text).strip("-").lower()


DECODING_MAIN = ("gen_length", "block_length", "steps", "remasking", "temperature", "cfg_scale")


def decoding_record(decoding, sampler: str) -> dict:
    """The result's `decoding` section: the sampler that ran, the main settings, and every other
    setting that differs from its default under `extra` (so results stay comparable); every setting by its
    flat name (`dare.decoding.flat`: `threshold`, not `masked.threshold`), the options those of the sampler
    that ran."""
    d, default = decoding_options.flat(decoding, runs=sampler), decoding_options.flat(DecodingConfig())
    extra = {k: v for k, v in d.items() if k not in DECODING_MAIN and k not in ("sampler", "threshold")
             and v != default[k]}
    return {"sampler": sampler, **{k: d[k] for k in DECODING_MAIN}, "threshold": d["threshold"] or None,
            "extra": extra}


def build_result(*, meta: dict, model_info: dict, benchmark: dict, decoding, outcome: dict, eval_hash: str,
                 seed: int, samples_path: Path, command: str | None, reference: dict | None = None,
                 checkpoint: str | None = None) -> dict:
    """The result JSON (as a dict) of one benchmark evaluation of one checkpoint. `benchmark`:
    name, split, version, n_shot; `outcome`: values per metric, sample counts, throughput; `checkpoint`: the
    evaluated checkpoint's fingerprint (`checkpoint_fingerprint`), recorded for a model we trained with its
    start's (`training.init_checkpoint`), so that a result is paired with the start it really trained from."""
    baseline = meta.get("baseline", "base")
    paper = (meta.get("method") or {}).get("arxiv")  # recorded at training time by whoever named the method
    init = meta.get("init")
    if not meta:
        init_name = None  # a checkpoint we did not train: the base model itself
    elif not init:
        init_name = "scratch"
    else:
        init_name = init.get("baseline", "pretrained")
    training = None
    if meta.get("config_hash"):
        training = {"seed": meta["seed"], "steps": meta["steps"], "config_hash": meta["config_hash"],
                    "config_path": meta.get("config_path") or None, "data": meta.get("data"),
                    "wall_time_s": meta["wall_time_s"],
                    "init_config_hash": init.get("config_hash") if init else None,
                    "recipe_hash": meta.get("recipe_hash"), "config": meta.get("config"),
                    "command": meta.get("command"), "compute": meta.get("compute"),
                    "checkpoint": checkpoint, "init_checkpoint": meta.get("init_fingerprint")}
    commit, dirty = git_state()
    run_seed = meta.get("seed", seed)
    train_hash = meta.get("run_key", meta.get("config_hash", "base"))[:8]  # config + starting checkpoint
    name = benchmark["name"]
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": f"{baseline}__{_slug(model_info['name'])}__{name}__s{run_seed}__{train_hash}-{eval_hash[:8]}",
        "created_at": now(),
        "method": {"baseline": baseline, "variant": None, "paper": paper, "init": init_name},
        "model": model_info,
        "benchmark": {"name": name, "split": benchmark["split"], "version": benchmark["version"],
                      "n_shot": benchmark.get("n_shot", 0),
                      "n_samples": {"original": outcome["n_original"], "effective": outcome["n_effective"]}},
        "decoding": decoding_record(decoding, outcome.get("sampler", "masked")),
        "metrics": [metric_from_values(m, vals).model_dump() for m, vals in outcome["values"].items()],
        "reference": reference,
        "training": training,
        "throughput": {k: round(v, 4) for k, v in outcome["throughput"].items() if v is not None},
        "provenance": {"git_commit": commit, "git_dirty": dirty, "packages": package_versions(),
                       "hardware": hardware(), "command": command or command_line(), "lock": environment_lock()},
        "artifacts": {"samples": samples_path.name, "samples_sha256": sha256_file(samples_path),
                      "config": "config.yaml"},
    }


def task_benchmark(task_name: str, split: str) -> dict:
    return {"name": task_name, "split": split, "version": TASKS[task_name].version, "n_shot": 0}


def _changed(values: dict, defaults: dict) -> dict:
    """The entries of a config dict that differ from the defaults (nested sections alike)."""
    out = {}
    for k, v in values.items():
        d = defaults.get(k)
        if isinstance(v, dict) and isinstance(d, dict):
            if _changed(v, d):
                out[k] = _changed(v, d)
        elif v != d:
            out[k] = v
    return out


def result_hash(cfg, benchmark: str, decoding, family: str | None = None) -> str:
    """What one benchmark's numbers depend on: the benchmark, and every evaluation setting (split,
    samples, batch size, engine, dtype, seed) and decoding setting that differs from its default.
    Left out: output paths and logging, the other benchmarks evaluated in the same call, and every
    setting at its default, so adding a setting whose default keeps the old behaviour leaves
    existing hashes (and the results' run ids) as they were. The decoding enters in its flat form
    (`dare.decoding.flat`, sampler=auto's options those of the sampler the checkpoint's `family` runs)."""
    given = _changed(to_dict(cfg, hashed_only=True), to_dict(EvalRunConfig(), hashed_only=True))
    for key in ("benchmarks", "decoding", "preset"):  # the decoding enters resolved, per benchmark
        given.get("eval", {}).pop(key, None)
    resolved = _changed(decoding_options.flat(decoding, family), decoding_options.flat(DecodingConfig()))
    canonical = json.dumps({"eval": given, "benchmark": benchmark, "decoding": resolved}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def default_out_dir(checkpoint: Path, digest: str) -> Path:
    """Beside our own final checkpoints (`<run>/eval/<hash>`, the run folder is content-addressed),
    else under `runs/eval/<folder>-<fingerprint>/<hash>` so two folders of the same name never share
    results."""
    if (checkpoint / "dare.json").is_file():
        return checkpoint.parent / "eval" / digest[:12]
    return runs_dir() / "eval" / f"{_slug(checkpoint.name)}-{checkpoint_fingerprint(checkpoint)[:8]}" / digest[:12]


def _leaf_keys(data, prefix: str = "") -> set[str]:
    """The dotted keys of the leaves of a (nested) mapping: {"masked": {"cache": ...}} -> {"masked.cache"}."""
    if not isinstance(data, dict):
        return {prefix.rstrip(".")}
    return set().union(*(_leaf_keys(v, f"{prefix}{k}.") for k, v in data.items())) if data else set()


def explicit_decoding(config_path, overrides) -> set[str]:
    """The `eval.decoding` fields the user set, dotted below the section (`gen_length`, `masked.threshold`): in
    the config file or as `eval.decoding.X=` overrides (a section given as a mapping: each of its keys)."""
    keys = set()
    for o in overrides:
        key, value, _ = parse_override(o)
        if key.startswith("eval.decoding."):
            keys |= _leaf_keys(value if isinstance(value, dict) else None, key[len("eval.decoding."):] + ".")
    if config_path is not None:
        keys |= _leaf_keys((read_yaml(config_path).get("eval") or {}).get("decoding") or {})
    return keys


def decoding_for(cfg, family: str, name: str, explicit: set[str] = frozenset()):
    """(DecodingConfig, the preset's settings or None) of one benchmark: DARE's settings for the
    family under `eval.preset` dare (auto with the opencompass engine), with the `eval.decoding`
    fields the user set (`explicit`) applied on top; otherwise `eval.decoding` as given. An option the
    user set for a sampler this checkpoint does not run (sampler=auto picks it from the family) is an error."""
    from dare.eval import suite

    preset = cfg.eval.preset if cfg.eval.preset != "auto" else ("dare" if cfg.eval.engine == "opencompass" else "none")
    protocol = suite.protocol_decoding(family, name) if preset == "dare" else None
    sampler = (cfg.eval.decoding.sampler if protocol is None or "sampler" in explicit
               else protocol.get("sampler", "auto"))
    given = replace(cfg.eval.decoding, sampler=sampler)  # the user's settings with the sampler that will run
    unused = decoding_options.unused_options(given, family, lambda k: k in explicit)
    if unused:
        raise ConfigError(f"eval.decoding.{unused[0][0]} is an option of the {unused[0][1]} sampler; a {family} "
                          f"checkpoint decodes {name} with the {decoding_options.resolve(sampler, family)} sampler "
                          f"(sampler={sampler}): set eval.decoding.sampler or drop the option")
    if protocol is None:
        return cfg.eval.decoding, None
    values, merged = to_dict(cfg.eval.decoding), copy.deepcopy(protocol)
    for key in explicit:
        *sections, leaf = key.split(".")
        source, target = values, merged
        for part in sections:
            source, target = source[part], target.setdefault(part, {})
        target[leaf] = source[leaf]
    return load_config(DecodingConfig, data=merged), protocol


def _same_decoding(decoding, protocol: dict | None) -> bool:
    return protocol is not None and to_dict(decoding) == to_dict(load_config(DecodingConfig, data=protocol))


def _model_info(checkpoint: Path, meta: dict, dtype: str) -> dict:
    """What the result says about the model, from its config alone (the OpenCompass engine never
    loads the weights in this process)."""
    model = meta_model(checkpoint)
    f = facts(model)
    return {"name": meta.get("model_name") or checkpoint.name, "family": f.family, "revision": meta.get("config_hash"),
            "kind": "block" if f.attention == "block_causal" else "masked", "dtype": dtype,
            "n_params": count_parameters(type(model), model.config)[0]}


def load_eval_config(config_path=None, overrides=()) -> EvalRunConfig:
    """An evaluation config, with every benchmark name checked against the embedded tasks and the
    OpenCompass suite (one ConfigError listing each bad `eval.benchmarks` name, with the closest known
    one, and `eval.split`), before any model is loaded."""
    cfg = load_config(EvalRunConfig, config_path, overrides)
    where = config_path or "command line"
    found = (_benchmark_problem(name, cfg.eval) for name in cfg.eval.benchmarks)
    problems = [f"{where}: {p}" for p in found if p]
    if not problems:
        return cfg
    if not any("unknown benchmark" in p for p in problems):
        raise ConfigError.of(problems)
    known = suite.benchmarks()
    raise ConfigError(f"{ConfigError.of(problems)}\n  embedded tasks: {sorted(TASKS)}\n  OpenCompass "
                      f"(engine=opencompass): {sorted(n for n in known if known[n].opencompass)}")


def _benchmark_problem(name: str, e) -> str | None:
    """What is wrong with benchmark `name` under the eval settings `e` (engine, split), if anything."""
    known = suite.benchmarks()
    on_opencompass = name in known and bool(known[name].opencompass)
    embedded = TASKS.get(known[name].embedded) if name in known and known[name].embedded else TASKS.get(name)
    covered = e.engine == "opencompass" and on_opencompass
    if not covered and embedded is None:
        runnable = [*TASKS, *(n for n in known if known[n].embedded or e.engine == "opencompass")]
        hint = " (OpenCompass runs it: eval.engine=opencompass)" if on_opencompass else did_you_mean(name, runnable)
        return f"eval.benchmarks: unknown benchmark {name!r}{hint} for the {e.engine} engine"
    if not covered and e.split not in embedded.splits:
        return f"eval.split: {name!r} has splits {embedded.splits}"
    return None


def consolidated(checkpoint: Path) -> Path:
    """A sharded training checkpoint (`checkpoints/step_N/`, tensors in `dcp/`) is evaluated through its export,
    `<step_N>/export/` (`dare export`; written once, then reused); any other folder as it is."""
    if (checkpoint / "dcp").is_dir() and not (checkpoint / "model.safetensors").is_file():
        export = checkpoint / "export"
        if not (export / "config.json").is_file():
            from dare.train.checkpoint import export_checkpoint

            export_checkpoint(checkpoint, export)
        return export
    return checkpoint


def evaluate_checkpoint(checkpoint: str | Path, config_path: str | Path | None = None, overrides=(),
                        *, out_dir: str | Path | None = None, command: str | None = None,
                        opencompass_model: dict | None = None, reference=None) -> list[Path]:
    """Evaluate a checkpoint folder on every benchmark in the config; returns the result files.
    Results that already exist and validate are reused (the folder is keyed by the eval config).
    `opencompass_model` replaces our OpenCompass model class (a config dict with a dotted `type`;
    the tests' oracle). `reference(benchmark, decoding) -> dict | None` gives the paper's number for a
    trained model's result (a reproduction's targets, `dare.app.targets`); base models get DARE's
    table (`dare.eval.suite.reference`)."""
    from dare.eval import suite

    cfg = load_eval_config(config_path, overrides)
    checkpoint = consolidated(Path(checkpoint).resolve())  # OpenCompass runs in its own working directory
    check_checkpoint(checkpoint)  # config, tokenizer and weights, before any decoding (one line each)
    family = suite.checkpoint_family(checkpoint)
    meta = checkpoint_meta(checkpoint)
    if meta and "init_fingerprint" not in meta:  # trained before dare.json held it: its run folder's run.json
        run = checkpoint.parent / "run.json"
        status = json.loads(run.read_text()) if run.is_file() else {}
        if status.get("config_hash") == meta.get("config_hash") and "init_fingerprint" in status:
            meta = {**meta, "init_fingerprint": status["init_fingerprint"]}
    fingerprint = checkpoint_fingerprint(checkpoint) if meta else None
    explicit = explicit_decoding(config_path, overrides)
    plans = {n: decoding_for(cfg, family, n, explicit) for n in cfg.eval.benchmarks}  # all checked up front
    digest = config_hash(cfg)
    if any(preset for _, preset in plans.values()):  # a preset edited since must not reuse old results
        resolved = json.dumps({n: decoding_options.flat(d, family) for n, (d, _) in plans.items()}, sort_keys=True)
        digest = hashlib.sha256((digest + resolved).encode()).hexdigest()
    out = Path(out_dir or cfg.run.out_dir or default_out_dir(checkpoint, digest)).resolve()
    targets = {name: out / f"result_{name}.json" for name in cfg.eval.benchmarks}
    todo = []
    weights = [p.stat().st_mtime for p in checkpoint.glob("*.safetensors")]
    for name, path in targets.items():
        try:
            read_result(path)
            if weights and path.stat().st_mtime < max(weights):  # the checkpoint was rewritten since
                raise ValueError("stale")
            print(f"[eval] reusing {path}", file=sys.stderr, flush=True)
        except ValueError:
            todo.append(name)
    if not todo:
        return list(targets.values())

    bench = suite.benchmarks()
    on_oc = [n for n in todo if cfg.eval.engine == "opencompass" and n in bench and bench[n].opencompass]
    embedded = [n for n in todo if n not in on_oc]
    model_info = _model_info(checkpoint, meta, cfg.dtype)

    def reference_of(name, benchmark):
        if meta:  # a model we trained: the reproduction's paper number, when the caller has one
            return reference(benchmark, decoding_options.flat(plans[name][0], family)) if reference else None
        ref = suite.reference(family, model_info["name"], name)
        # DARE ran its table through OpenCompass: our embedded prompts are another protocol, and so
        # is a benchmark whose config differs from DARE's (`deviation`)
        same_protocol = (name in on_oc or not (name in bench and bench[name].opencompass)) and not (
            name in bench and bench[name].deviation)
        return ref and {**ref, "same_decoding": same_protocol and _same_decoding(plans[name][0], plans[name][1])}

    def finish(name, benchmark, outcome, samples):
        samples_path = out / f"samples_{name}.jsonl"
        atomic_write(samples_path, "".join(json.dumps(s) + "\n" for s in samples))
        result = build_result(meta=meta, model_info=model_info, benchmark=benchmark, decoding=plans[name][0],
                              outcome=outcome, eval_hash=result_hash(cfg, name, plans[name][0], family),
                              seed=cfg.run.seed, samples_path=samples_path,
                              command=command, reference=reference_of(name, benchmark), checkpoint=fingerprint)
        write_result(result, targets[name])
        acc = ", ".join(f"{m['name']}={m['value']:.4f}" for m in result["metrics"])
        print(f"[eval] {name}: {acc} ({outcome['n_effective']} samples) -> {targets[name]}",
              file=sys.stderr, flush=True)

    def task_of(name):
        return bench[name].embedded if name in bench and bench[name].embedded else name

    if on_oc:  # the embedded tasks' data too, before the long OpenCompass runs

        for name in embedded:
            load_split(task_of(name), cfg.eval.split)
    save_config(cfg, out, header=f"dare eval {shown_path(checkpoint)}")
    if on_oc:
        from dare.eval import opencompass_run

        opencompass_run.check(on_oc, cfg.eval.n_samples)  # data, environment: before any model is loaded
        for name in on_oc:
            outcome, samples = opencompass_run.run_benchmark(
                bench[name], checkpoint=checkpoint, decoding=to_dict(plans[name][0]), batch_size=cfg.eval.batch_size,
                dtype=cfg.dtype, seed=cfg.run.seed, n_samples=cfg.eval.n_samples, threads=cfg.run.threads,
                workdir=out / "opencompass" / name, model=opencompass_model)
            version = f"opencompass-{opencompass_run.oc_version()}:{bench[name].opencompass['config']}"
            finish(name, {"name": name, "split": "test", "version": version, "n_shot": bench[name].n_shot},
                   outcome, samples)
    if embedded:
        import torch

        model = load_pretrained(checkpoint, cfg.dtype)
        tokenizer = load_tokenizer(checkpoint)
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        for name in embedded:
            task_name = task_of(name)
            outcome = evaluate_model(model, tokenizer, task_name, cfg.eval.split, plans[name][0], cfg.eval.batch_size,
                                     cfg.eval.n_samples, cfg.run.seed, progress=True)
            finish(name, {**task_benchmark(task_name, cfg.eval.split), "name": name}, outcome, outcome["samples"])
    return list(targets.values())
