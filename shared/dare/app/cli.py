"""The `dare` command. Every subcommand has `--help`.

    dare --version
    dare demo                                   the embedded default: tiny SFT -> d1 -> eval -> table
    dare train <baseline> [config.yaml] [key=value ...]
    dare train <config.yaml> [key=value ...]    the YAML's `baseline:` key names the baseline
    dare eval <checkpoint> [config.yaml] [key=value ...] [--benchmarks a,b] [--engine opencompass]
    dare leaderboard [--runs DIR ...]
    dare data list | build [TASK ...]
    dare models [list | released | show <checkpoint>]
    dare bench rollout | experts | gpu | train | rewards | estimators [key=value ...]
    dare plan <baseline> [config.yaml] [key=value ...] [--gpus N] [--gpu-memory GiB]   peak memory per GPU
    dare results publish <result.json ...> --to leaderboard/results/<name>
    dare sweep <sweep.yaml> [--cluster slurm|local|debug] [--dry-run]
    dare sweep status | collect <sweep.yaml> [--to DIR]
    dare checklist [NAME ...]                   what a baseline folder lacks before it can be merged
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shlex
import sys
from pathlib import Path

from dare.utils import UserError
from dare import config as config_mod
from dare.app.baselines import TINY_RESULTS, TINY_SWEEP, tiny_commands
from dare.app.demo import main as demo_main
from dare.app.sweep import (MAX_RUNS as SWEEP_MAX_RUNS, check_traceable, collect, default_destination, launch,
                             load_sweep, matches, state)
from dare.data import TASKS, build, recorded_hashes, split_path
from dare.eval import evaluate_checkpoint
from dare.models import ATTENTION, FAMILIES, facts, family_module, load_pretrained
from dare.models.api import count_parameters, meta_model
from dare.results import SCHEMA_VERSION, publish, publish_destination, read_result
from dare.utils import REPO_ROOT, sha256_file

PLACEHOLDERS = {"name": "<name>", "family": "<family>"}
"""How the tiny-task route is printed for any baseline (`dare.app.baselines.tiny_commands`)."""


def _version() -> str:
    """The installed distribution's version (pyproject.toml's `name`)."""
    try:
        return importlib.metadata.version("dare-dllm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _command_line() -> str:
    return "dare " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _split_config_args(args: list[str]) -> tuple[str | None, list[str]]:
    """`[config.yaml] [key=value ...]`: the first argument without '=' is the config file."""
    path, overrides = None, []
    for a in args:
        if "=" in a:
            overrides.append(a)
        elif path is None:
            path = a
        else:
            raise UserError(f"unexpected argument {a!r}: give at most one config file, then key=value overrides")
    return path, overrides


def _is_yaml(arg: str) -> bool:
    return Path(arg).suffix in (".yaml", ".yml")


def _check_ranges(command: str, ns, rules: dict[str, tuple[float, bool]]) -> None:
    """One line for the first option out of its range, before any work: `rules` maps an option's dest to (its
    bound, whether the bound itself is allowed); every number given must be finite (`--gpu-memory nan` compared
    false with everything and passed)."""
    import math

    for dest, (low, inclusive) in rules.items():
        value = getattr(ns, dest, None)
        if value is not None and not (math.isfinite(value) and (value >= low if inclusive else value > low)):
            raise UserError(f"{command}: --{dest.replace('_', '-')}={value!r}: must be a finite number "
                            f"{'>=' if inclusive else '>'} {low:g}")


PLAN_RANGES = {"gpus": (1, True), "gpu_memory": (0, False), "prompt_length": (1, True), "length": (1, True)}
BENCH_RANGES = {"n": (1, True), "workers": (1, True), "draws": (1, True), "prompts": (1, True), "budget": (0, False),
                "repeats": (1, True), "batch_size": (1, True), "prompt_length": (1, True), "min_seconds": (0, True)}


def _train_args(ns) -> tuple[str, str | None, list[str]]:
    """(baseline, config file, overrides) of `dare train <baseline> [config.yaml] [key=value ...]` or
    `dare train <config.yaml> [key=value ...]`, where the YAML's `baseline:` key names the baseline
    (`dare.app.runs.resolve` rejects a file whose `baseline:` differs from a named one)."""
    if not _is_yaml(ns.baseline):
        return ns.baseline, *_split_config_args(ns.args)
    path, (extra, overrides) = ns.baseline, _split_config_args(ns.args)
    if extra is not None:
        raise UserError(f"unexpected argument {extra!r}: the config file is {path}; give key=value overrides after it")
    baseline = config_mod.read_yaml(path).get("baseline")
    if not isinstance(baseline, str) or not baseline:
        raise UserError(f"{path}: no `baseline:` key naming the baseline; add one, or name it: "
                        f"dare train <baseline> {path}")
    return baseline, path, overrides


# ---------------------------------------------------------------------------------------------


def cmd_train(ns) -> int:
    from dare.app.runs import resolve, run_dir_of, train

    baseline, path, overrides = _train_args(ns)
    if ns.dry_run:
        _, cfg, _ = resolve(baseline, path, overrides)
        print(config_mod.to_yaml(cfg), end="")
        print(f"# config_hash: sha256:{config_mod.config_hash(cfg)}")
        print(f"# run_dir: {run_dir_of(baseline, cfg)}")
        return 0
    if ns.workers > 1:
        from dare.app.ray_group import train_with_workers

        run_dir = train_with_workers(baseline, path, overrides, ns.workers, force=ns.force)
    else:
        run_dir = train(baseline, path, overrides, force=ns.force)
    if os.environ.get("RANK", "0") == "0":
        print(run_dir / "final")
    return 0


def cmd_eval(ns) -> int:
    path, overrides = _split_config_args(ns.args)
    if ns.benchmarks:
        overrides.append(f"eval.benchmarks=[{ns.benchmarks}]")
    if ns.engine:
        overrides.append(f"eval.engine={ns.engine}")
    for p in evaluate_checkpoint(ns.checkpoint, path, overrides, out_dir=ns.out, command=_command_line()):
        print(p)
    return 0


def cmd_leaderboard(ns) -> int:
    app = REPO_ROOT / "leaderboard" / "app.py"
    env = dict(os.environ)
    runs = [str(Path(r).resolve()) for r in ns.runs or []]
    if runs:
        env["DARE_LEADERBOARD_RUNS"] = os.pathsep.join(runs)
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.address", ns.address,
           "--server.port", str(ns.port), "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    print(f"leaderboard on http://{ns.address}:{ns.port}  (Ctrl-C to stop)", flush=True)
    # this process becomes the server, so a signal to `dare leaderboard` (Ctrl-C, a scheduler's or a
    # test's SIGTERM) stops the server itself instead of leaving an orphaned streamlit behind
    os.execve(sys.executable, cmd, env)


def cmd_data(ns) -> int:
    if ns.action == "list":
        print(f"{'task':14s} {'version':16s} {'source':22s} splits")
        for name, task in TASKS.items():
            have = ", ".join(f"{s}{'' if split_path(name, s).is_file() else ' (not built)'}" for s in task.splits)
            source = "offline" if task.offline else "--from / hub / dvc pull"
            print(f"{name:14s} {task.version:16s} {source:22s} {have}")
        return 0
    names = ns.tasks or [n for n, t in TASKS.items() if t.offline]
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise UserError(f"unknown task(s) {unknown}; known: {sorted(TASKS)}")
    source = Path(ns.source) if ns.source else None
    if source is not None:
        if len(names) != 1:
            raise UserError("--from reads one task's original files: name exactly one task")
        if not source.exists():
            raise UserError(f"--from {source}: no such file or folder")
    recorded = recorded_hashes()
    for name in names:
        for split in TASKS[name].splits:
            path = build(name, split, source=source)
            digest = sha256_file(path)
            want = recorded.get(f"{name}/{split}") if source is None else None
            note = "" if want is None else ("  (= recorded hash)" if want == digest else
                                            f"  DIFFERS from the recorded hash {want[:12]}: bump the task version")
            print(f"{path}  sha256 {digest[:12]}{note}")
    return 0


def _billions(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n:,}"


def cmd_models(ns) -> int:
    """`list`: the torch-free family table (seconds); `released`: the released checkpoints' facts and
    sizes (built on the meta device); `show`: one checkpoint's facts and size."""
    if ns.action == "show":
        return _models_show(ns.checkpoint)
    if ns.action == "released":
        return _models_released()
    print(f"{'family':9s} {'model_type':11s} {'attention':13s} module")
    for family, (module, model_type) in FAMILIES.items():
        print(f"{family:9s} {model_type:11s} {ATTENTION[family]:13s} {module}")
    print("\n`dare models released`: each family's released checkpoint, its facts (mask id, logit shift, block size)\n"
          "and parameter counts (configs built on the meta device; imports torch, tens of seconds).\n"
          "`dare models show <folder|config.json>`: one checkpoint's facts.")
    return 0


def _models_show(checkpoint: str | None) -> int:
    """One checkpoint's (or a config.json's, built on the meta device) class, size and facts."""
    if not checkpoint:
        raise UserError("dare models show <checkpoint folder or config.json>")
    target = Path(checkpoint)
    if target.name == "config.json" or (target.is_dir() and not any(target.glob("*.safetensors"))):
        model = meta_model(target)  # a config alone: built on the meta device for its facts and size
        shown = target if target.name == "config.json" else target / "config.json"
    else:
        model, shown = load_pretrained(checkpoint), checkpoint
    f = facts(model)
    total, active = count_parameters(type(model), model.config)
    print(f"{shown}: {type(model).__name__}, {_billions(total)} parameters ({_billions(active)} active)")
    for k, v in vars(f).items():
        print(f"  {k:14s} {v}")
    return 0


def _models_released() -> int:
    """Each family's released checkpoint: its facts and parameter counts, from its config built on the meta device."""
    import torch

    print(f"{'family':9s} {'model_type':11s} {'attention':13s} {'shift':5s} {'block':5s} {'mask id':>7s} "
          f"{'params':>7s} {'active':>7s}  released checkpoint")
    for family, (_, model_type) in FAMILIES.items():
        module = family_module(family)
        name, kwargs = module.RELEASED
        config = module.MODEL_CLASS.config_class(**kwargs)
        with torch.device("meta"):
            f = module.MODEL_CLASS(config).dllm_facts()
        total, active = count_parameters(module.MODEL_CLASS, config)
        print(f"{family:9s} {model_type:11s} {f.attention:13s} {'yes' if f.logits_shift else 'no':5s} "
              f"{str(f.block_size or '-'):5s} {f.mask_token_id:>7d} {_billions(total):>7s} {_billions(active):>7s}"
              f"  {name}")
    print("\nFacts are read from each checkpoint's config.json; `dare models show <folder|config.json>` prints them "
          "for one checkpoint. Tiny configs for tests: `scratch_config` in each family's module.")
    return 0


def _bench_models(ns) -> int:
    from dare.app import bench_gpu
    from dare.utils import atomic_write_json, command_line, fingerprint, now, runs_dir, shown_path

    dtype = ns.dtype or ("bfloat16" if ns.device.startswith("cuda") else "float32")
    if ns.what == "experts":
        shrunk = not ns.device.startswith("cuda")
        report = bench_gpu.experts_benchmark(ns.device, dtype, hidden=64 if shrunk else None,
                                             expert_width=32 if shrunk else None, repeats=max(ns.repeats, 5))
        bench_gpu.print_experts(report)
        path = Path(ns.out) if ns.out else runs_dir() / "bench" / f"experts-{ns.device}-{now().replace(':', '')}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {**report, "command": command_line(), "created": now(), **fingerprint()})
        print(f"  -> {shown_path(path)}")
        return 0
    shrink = not ns.device.startswith("cuda")
    report = bench_gpu.gpu_benchmark(ns.device, dtype, shrink=shrink, out=ns.out, budget_s=ns.budget,
                                     run_tests=not ns.no_tests, repeats=max(ns.repeats, 3 if shrink else 5))
    return 1 if any(v["met"] is False for v in report["targets"]) and not shrink else 0


def cmd_plan(ns) -> int:
    import torch

    from dare.app.runs import resolve
    from dare.models.api import meta_model
    from dare.train import plan as planner

    _check_ranges("dare plan", ns, PLAN_RANGES)
    baseline, path, overrides = _train_args(ns)
    b, cfg, hooks = resolve(baseline, path, overrides)
    folder = Path(cfg.model.path) if cfg.model.path else None
    if folder is not None and (folder / "config.json").is_file() and not ns.released:
        model = meta_model(folder)
        source = str(folder)
    elif ns.released:
        from dare.app.released import released_config

        name, model_class, config = released_config(cfg.model.family)
        with torch.device("meta"):
            model = model_class(config)
        source = f"{name} (the released config of model.family={cfg.model.family})"
    else:
        raise UserError(f"dare plan: model.path={cfg.model.path!r} has no config.json here; give --released to plan "
                        f"with the released shape of model.family={cfg.model.family}")
    recipe = getattr(b.algorithm, "RECIPE", "rl")
    uses_reference = bool(getattr(hooks, "uses_reference", lambda c: False)(cfg))
    shapes = planner.shapes_of(model, cfg.model.lora.rank, cfg.model.lora.targets)
    dtype = "bfloat16" if cfg.model.dtype == "bfloat16" else "float32"
    print(f"dare plan: {baseline} on {source}: {shapes.params / 1e9:.2f}B parameters, {ns.gpus} GPU(s) of "
          f"{ns.gpu_memory:g} GiB; measuring what one layer of each kind saves for backward (CPU, real widths) ...",
          flush=True)
    per_token, per_forward = planner.layer_activation_bytes(type(model), model.config, dtype)
    plan = planner.plan_run(cfg, uses_reference, shapes, per_token, per_forward, recipe=recipe, gpus=ns.gpus,
                            gpu_memory_gib=ns.gpu_memory, prompt_length=ns.prompt_length, length=ns.length)
    tips = planner.advice(plan, lora=cfg.model.lora.rank > 0, gradient_checkpointing=cfg.train.gradient_checkpointing,
                          micro_batch=cfg.train.micro_batch_size, processes=ns.gpus,
                          reference_offload=cfg.train.reference_offload,
                          optimizer_offload=cfg.train.optimizer == "adamw_offload")
    print(planner.format_plan(plan, tips))
    return 0 if plan.fits else 1


def cmd_bench(ns) -> int:
    from dare.app.bench import BENCH_FAMILIES, rewards_benchmark, rollout_benchmark

    _check_ranges(f"dare bench {ns.what}", ns, BENCH_RANGES)
    if ns.what == "train":
        from dare.app.bench import train_benchmark

        train_benchmark(out=ns.out, repeats=ns.repeats if ns.repeats > 1 else 3, checkpoint=ns.checkpoint)
        return 0
    if ns.what in ("experts", "gpu"):
        if ns.args:
            raise UserError(f"dare bench {ns.what} takes no key=value arguments ({ns.args})")
        if ns.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise UserError(f"dare bench {ns.what} --device {ns.device}: no CUDA device here (use --device cpu "
                                "for the shrunk shapes)")
        return _bench_models(ns)
    if ns.what == "estimators":
        from dare.app.bench_estimators import estimators_benchmark

        estimators_benchmark(ns.checkpoint, draws=ns.draws, out=ns.out)
        return 0
    if ns.what == "rewards":
        if ns.args:
            raise UserError(f"dare bench rewards takes no key=value arguments ({ns.args})")
        rewards_benchmark(n=ns.n, workers=ns.workers, out=ns.out)
        return 0
    path, overrides = _split_config_args(ns.args)
    if path:
        raise UserError(f"dare bench {ns.what} takes key=value decoding overrides, not a file ({path!r})")
    if ns.released:
        from dare.app.bench import released_benchmark

        if ns.released not in FAMILIES:
            raise UserError(f"dare bench rollout --released {ns.released}: unknown family; one of {sorted(FAMILIES)}")
        if ns.checkpoint:
            raise UserError("dare bench rollout: --released (random weights at a released size) and --checkpoint "
                            "exclude each other")
        released_benchmark(ns.released, overrides, device=ns.device, dtype=ns.dtype or "bfloat16",
                           batch_size=ns.batch_size,
                           prompt_length=ns.prompt_length, repeats=ns.repeats, out=ns.out)
        return 0
    families = tuple(ns.family or BENCH_FAMILIES)
    unknown = [f for f in families if f not in BENCH_FAMILIES]
    if unknown:
        raise UserError(f"dare bench rollout --family {unknown[0]}: no bench checkpoint; one of {BENCH_FAMILIES}")
    rollout_benchmark(ns.checkpoint, overrides, repeats=ns.repeats, batch_size=ns.batch_size, n_prompts=ns.prompts,
                      device=ns.device, out=ns.out, task=ns.task, families=families, min_seconds=ns.min_seconds)
    return 0


def cmd_results(ns) -> int:
    bad = [p for p in ns.files if not Path(p).is_file()]
    if bad:
        raise UserError(f"no such result file: {', '.join(bad)}")
    for p in ns.files:  # every file's paths are checked before the first one is copied
        try:
            publish_destination(Path(p), read_result(p), ns.to)
        except ValueError as e:
            raise UserError(f"{p}: not a valid result: {e}") from None
    for p in ns.files:
        try:
            print(publish(p, ns.to))
        except ValueError as e:
            raise UserError(f"{p}: not a valid result: {e}") from None
        check_traceable(p, read_result(p), copied="published")  # warned, as collect --allow-dirty does
    return 0


def cmd_sweep(ns) -> int:
    action, path = (ns.args[0], ns.args[1]) if ns.args[0] in ("status", "collect") and len(ns.args) > 1 \
        else ("launch", ns.args[0])
    if ns.max_runs < 1:
        raise UserError(f"--max-runs {ns.max_runs}: must be at least 1")
    sweep = load_sweep(path, max_runs=ns.max_runs)
    only = {}
    for item in ns.only or []:
        key, eq, value = item.partition("=")
        if not eq:
            raise UserError(f"--only {item!r}: expected KEY=VALUE (e.g. baseline=d1 or run.seed=0)")
        only[key] = value
    if action == "launch":
        launch(sweep, cluster=ns.cluster, dry_run=ns.dry_run, only=only)
    elif action == "status":
        counts: dict[str, int] = {}
        for r in [r for r in sweep.runs if matches(r, only)]:
            st, log = state(r)
            counts[st] = counts.get(st, 0) + 1
            print(f"  {r.id}  {st:8s} {r.name}" + (f"  log: {log}" if log and st != "done" else ""))
        print("  " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    else:
        collect(sweep, ns.to or default_destination(sweep), only=only, allow_dirty=ns.allow_dirty)
    return 0


def cmd_checklist(ns) -> int:
    from dare.app import baselines

    if ns.blocks:
        print(baselines.blocks_markdown())
        return 0
    names = ns.names or baselines.folders()
    failed = 0
    for name in names:
        problems = baselines.checklist(name)
        print(f"{name}: {'ok' if not problems else f'{len(problems)} missing'}")
        for problem in problems:
            print(f"  - {problem}")
        failed += bool(problems)
    return 1 if failed else 0


def cmd_demo(ns) -> int:
    if ns.compare:
        launch_command, collect_command = tiny_commands(**PLACEHOLDERS)
        raise UserError("dare demo --compare is a sweep now: a method's tiny-task result is a sweep of its own, run and "
                        f"collected from a clean committed tree (CONTRIBUTING.md section 6; dare checklist <name> prints "
                        f"the commands): {launch_command}, then {collect_command}. reproductions/tiny/sweep.yaml is an "
                        f"earlier commit's comparison, in leaderboard/results/tiny/")
    return demo_main(smoke=ns.smoke, seeds=ns.seeds)


# ---------------------------------------------------------------------------------------------


def cmd_export(ns) -> int:
    from dare.train.checkpoint import export_checkpoint

    print(export_checkpoint(ns.checkpoint, ns.to))
    return 0


def cmd_env(ns) -> int:
    """The fingerprint results carry (hardware, the ISA torch dispatches to, packages, lock, git)."""
    import json

    from dare.utils import fingerprint, record_lock, shown_path

    if ns.record_lock:
        print(f"{shown_path(record_lock(ns.record_lock))}: installed from {ns.record_lock}")
        return 0
    try:
        import torch  # noqa: F401  (the torch-dependent fields are filled only once it is imported)
    except ImportError:
        pass
    print(json.dumps(fingerprint(), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dare", description="Post-training diffusion language models.")
    p.add_argument("--version", action="version", version=f"dare {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("train", help="train a baseline", description=(
        "Train baselines/<baseline>. Config precedence: the baseline's defaults, then config.yaml, "
        "then key=value overrides (dotted keys, e.g. train.lr=3e-6 rl.decoding.steps=64). A finished run with "
        "the same config hash is reused; an interrupted one resumes. `dare train <config.yaml>` takes the "
        "baseline from the file's `baseline:` key."))
    s.add_argument("baseline", metavar="baseline | config.yaml",
                   help="a folder name under baselines/ (e.g. sft, d1), or a config file whose `baseline:` names it")
    s.add_argument("args", nargs="*", metavar="[config.yaml] [key=value]")
    s.add_argument("--dry-run", action="store_true",
                   help="print the resolved config, its hash and the run directory, then exit")
    s.add_argument("--force", action="store_true", help="retrain even if a finished run exists")
    s.add_argument("--workers", type=int, default=1, help=(
        "train as a Ray worker group of N processes (FSDP2 over gloo on CPU, NCCL on GPU; joins RAY_ADDRESS when "
        "set). Under torchrun or SLURM, launch `dare train` itself once per process instead"))
    s.set_defaults(func=cmd_train)

    s = sub.add_parser("env", help="print this machine's and environment's fingerprint (for bug reports)",
                       description="The fingerprint every result records: CPU model and the instruction set torch "
                       "dispatches to, threads, BLAS; GPU, capability, driver, CUDA/cuDNN/NCCL; package versions; "
                       "the lock file the environment was installed from; the git state; this command.")
    s.add_argument("--record-lock", metavar="LOCK", help=(
        "record that this environment was installed from LOCK (after checking that every package it pins is "
        "installed at that version) instead of printing; `make setup` and the conda files' last step run it"))
    s.set_defaults(func=cmd_env)

    s = sub.add_parser("export", help="write a loadable model folder from a sharded training checkpoint",
                       description="A run's periodic checkpoints (runs/<baseline>/<key>/checkpoints/step_N/) hold "
                       "sharded tensors (torch.distributed.checkpoint, every rank its own shards). This writes a "
                       "save_pretrained folder from one, in one process (LoRA merged into its base, the adapter "
                       "kept in adapter/); `dare eval` does it by itself when given a checkpoint folder.")
    s.add_argument("checkpoint", help="a checkpoints/step_N/ folder")
    s.add_argument("--to", default=None, help="the folder to write (default: <checkpoint>/export)")
    s.set_defaults(func=cmd_export)

    s = sub.add_parser("eval", help="evaluate a checkpoint (embedded evaluator or OpenCompass)", description=(
        f"Evaluate a checkpoint on benchmarks and write result_<benchmark>.json (schema v{SCHEMA_VERSION}) and "
        "samples_<benchmark>.jsonl. --engine embedded decodes our tasks in this process; --engine opencompass "
        "runs DARE's suite (gsm8k math humaneval mbpp mmlu mmlu_pro hellaswag arc_c gpqa aime24 aime25 "
        "olympiadbench) through OpenCompass in the eval environment with DARE's decoding settings for the "
        "checkpoint's family, from local data ($COMPASS_DATA_CACHE, default data/opencompass)."))
    s.add_argument("checkpoint", help="a checkpoint folder (config.json + weights + tokenizer)")
    s.add_argument("args", nargs="*", metavar="[config.yaml] [key=value]")
    s.add_argument("--benchmarks", help="comma-separated benchmark names (sets eval.benchmarks)")
    s.add_argument("--engine", choices=["embedded", "opencompass"], help="sets eval.engine (default: embedded)")
    s.add_argument("--out", help="output folder (default: beside the checkpoint, keyed by the eval config hash)")
    s.set_defaults(func=cmd_eval)

    s = sub.add_parser("leaderboard", help="open the Streamlit leaderboard on 127.0.0.1", description=(
        "Shows every result JSON under leaderboard/results/ plus result_*.json files under the given run "
        "folders (also read from $DARE_LEADERBOARD_RUNS, separated by ':')."))
    s.add_argument("--runs", action="append", metavar="DIR", help="a run folder to include (repeatable)")
    s.add_argument("--port", type=int, default=8501)
    s.add_argument("--address", default="127.0.0.1")
    s.set_defaults(func=cmd_leaderboard)

    s = sub.add_parser("data", help="list or build task datasets", description=(
        "Tasks live in data/<task>/<split>.parquet (one schema; see dare.data). `dare data build` with no "
        "task builds every offline task (generated or shipped by a package), byte-deterministically; other "
        "tasks are built from their original files (--from PATH) or downloaded when the hub is reachable. "
        "`dvc pull` fetches the preprocessed data instead."))
    s.add_argument("action", choices=["list", "build"])
    s.add_argument("tasks", nargs="*", metavar="TASK")
    s.add_argument("--from", dest="source", metavar="PATH",
                   help="a file or folder with the task's original files (e.g. gsm8k's train.jsonl/test.jsonl)")
    s.set_defaults(func=cmd_data)

    s = sub.add_parser("models", help="list model families and their facts", description=(
        "`dare models` lists the families (model_type, attention kind, module) in seconds, without torch; "
        "`dare models released` the facts and parameter counts of each family's released checkpoint (configs "
        "built on the meta device); `dare models show <checkpoint folder | config.json>` prints one "
        "checkpoint's facts (mask id, logit shift, attention kind, block size, LoRA targets) and size."))
    s.add_argument("action", nargs="?", default="list", choices=["list", "released", "show"])
    s.add_argument("checkpoint", nargs="?")
    s.set_defaults(func=cmd_models)

    s = sub.add_parser("plan", help="the peak memory per GPU of a training run, before it runs", description=(
        "dare plan <baseline> [config.yaml] [key=value ...]: the run's peak memory per GPU at its real shapes, "
        "computed without a GPU (the model built on the meta device; what one decoder layer of each kind saves "
        "for backward measured on the CPU at its real widths): a table per phase (rollout, log-probs, update), "
        "whether it fits --gpu-memory, and the settings that would make it fit. Exit status 1 when it does not "
        "fit."))
    s.add_argument("baseline", help="a baseline name or a YAML whose baseline: key names one")
    s.add_argument("args", nargs="*", metavar="[config.yaml] key=value")
    s.add_argument("--gpus", type=int, default=1, help="processes (one GPU each) the run is sharded over")
    s.add_argument("--gpu-memory", type=float, default=80.0, help="GiB per GPU (default 80)")
    s.add_argument("--released", action="store_true", help="plan with the released config of model.family "
                   "(when model.path is not on this machine)")
    s.add_argument("--prompt-length", type=int, default=256, help="RL: prompt tokens (default 256)")
    s.add_argument("--length", type=int, default=1024, help="SFT and preference: tokens per row (default 1024)")
    s.set_defaults(func=cmd_plan)

    s = sub.add_parser("bench", help="benchmarks (rollout, rewards, train, estimators)", description=(
        "dare bench rollout: every decoding strategy (vanilla, Fast-dLLM caches, parallel decoding, both) side by "
        "side on each family's bench checkpoint (a tiny model trained on the long-answer task chain on first use, "
        "then reused; --family picks families), or on --checkpoint: "
        "tokens/s, speedup, NFE, tokens per forward, accuracy; result JSONs under runs/bench/; key=value "
        "overrides set the decoding (default gen_length=256 block_length=32). "
        "dare bench rewards: rewards per second for --n completions per task, serial vs --workers processes "
        "(sandboxes for code), written as a JSON report (--out, default runs/bench/). "
        "dare bench train: packing vs padding tokens/s on a length-skewed batch, the loss's peak memory with "
        "chunked vs full logits at a 126k vocabulary, and the end-to-end d1 RL step (accelerated vs naive "
        "pipeline, on the LLaDA bench checkpoint or --checkpoint) (JSON report). "
        "dare bench experts: one MoE layer of each MoE family at its released expert count and top-k, grouped "
        "experts vs the former per-expert loop (--device cpu: narrowed widths). "
        "dare bench gpu: the GPU acceptance command (make gpu-check): the gpu-marked tests, then per family at its "
        "released shape with random weights: forwards at batch 1 and 8 (eager and captured), decoding tokens/s per "
        "cache strategy, grouped vs loop experts, the attention kernels, peak memory, and a verdict per target; the "
        "report goes to runs/bench/ (make gpu-check: --out leaderboard/results/bench-gpu/, the committed folder; --device "
        "cpu: shrunk shapes, the suite's check)."))
    s.add_argument("what", choices=["rollout", "rewards", "train", "estimators", "experts", "gpu"])
    s.add_argument("args", nargs="*", metavar="key=value")
    s.add_argument("--checkpoint")
    s.add_argument("--repeats", type=int, default=1, help="rollout: timing repeats (median)")
    s.add_argument("--min-seconds", type=float, default=20.0, help=(
        "rollout: time a strategy again until this many seconds are measured (at most 5 decodes, the median "
        "counts): a decode of a few seconds alone is noisy"))
    s.add_argument("--batch-size", type=int, default=8)
    s.add_argument("--prompts", type=int, default=64, help="rollout: test prompts decoded per strategy")
    s.add_argument("--task", help="rollout --checkpoint: the task to decode (default: the checkpoint's training task)")
    s.add_argument("--family", action="append", help="rollout: only this family's bench checkpoint (repeatable)")
    s.add_argument("--device", default="cpu", help="rollout: cpu or cuda")
    s.add_argument("--released", metavar="FAMILY", help="rollout: the family's released size with random weights "
                   "(cache speed and peak memory only; no accuracy)")
    s.add_argument("--dtype", default=None, help="rollout --released, experts, gpu: parameter dtype (default "
                   "bfloat16 on CUDA, float32 on CPU for experts and gpu)")
    s.add_argument("--budget", type=float, default=480.0, help="gpu: seconds for the whole command (stages that "
                   "would start later are recorded as skipped)")
    s.add_argument("--no-tests", action="store_true", help="gpu: skip the gpu-marked tests")
    s.add_argument("--prompt-length", type=int, default=128, help="rollout --released: random prompt tokens")
    s.add_argument("--n", type=int, default=1000, help="rewards: completions per task")
    s.add_argument("--draws", type=int, default=64, help="estimators: independent draws per estimator")
    s.add_argument("--workers", type=int, default=None, help="rewards: parallel workers (default: CPU count)")
    s.add_argument("--out", help="where to write the report (rollout: a folder of result JSONs; gpu: a file, or a "
                   "folder ending in /; default under runs/bench/, never the committed results)")
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("results", help="publish result JSONs to the leaderboard", description=(
        "dare results publish FILE... --to leaderboard/results/<name>: validate each result and copy it, with its "
        "samples and config, to <dir>/<run_id>/ (commit that folder to show it on the leaderboard)."))
    s.add_argument("action", choices=["publish"])
    s.add_argument("files", nargs="+", metavar="result_X.json")
    s.add_argument("--to", required=True, metavar="DIR")
    s.set_defaults(func=cmd_results)

    s = sub.add_parser("sweep", help="launch, inspect or collect a sweep (submitit: SLURM, local, debug)",
                       description=(
        "dare sweep <sweep.yaml>: submit the runs of the grid that are not done or queued, as one SLURM job "
        "array through submitit (--cluster local: one after another on this machine, no cluster; debug: "
        "submitit's in-process executor). dare sweep status <sweep.yaml>: done/running/failed/pending with logs. "
        f"dare sweep collect <sweep.yaml> [--to DIR]: copy valid results (default: a baseline's tiny sweep "
        f"{TINY_SWEEP.format(**PLACEHOLDERS)} to {TINY_RESULTS.format(**PLACEHOLDERS)}, any other "
        "reproductions/<a>/<b>/<c>.yaml to leaderboard/results/<a>-<b>-<c>, a folder's sweep*.yaml left out) "
        "with the paper's numbers from targets.yaml beside the sweep file in `reference`, and print ours against "
        "them. Format: shared/dare/app/sweep.py."))
    s.add_argument("args", nargs="+", metavar="[status|collect] sweep.yaml")
    s.add_argument("--cluster", default="slurm", choices=["slurm", "local", "debug"])
    s.add_argument("--dry-run", action="store_true", help="print the runs and the sbatch script submitit writes, submit nothing")
    s.add_argument("--to", help="collect: destination folder (default: the sweep's own, above)")
    s.add_argument("--allow-dirty", action="store_true",
                   help="collect: copy results made from a tree with uncommitted changes (warned; the tests refuse them)")
    s.add_argument("--only", action="append", metavar="KEY=VALUE",
                   help="only the runs with this baseline or grid value (repeatable), e.g. --only baseline=d1")
    s.add_argument("--max-runs", type=int, default=SWEEP_MAX_RUNS, metavar="N",
                   help=f"refuse a sweep of more than N runs, before expanding its grid (default {SWEEP_MAX_RUNS:,})")
    s.set_defaults(func=cmd_sweep)

    s = sub.add_parser("checklist", help="what a baseline folder still lacks before it can be merged", description=(
        "CONTRIBUTING.md's checklist for baselines/<name>/ (all folders when no name is given): front matter, "
        "sections, the hooks of its recipe, a test that runs it, a valid result JSON. Exit 1 when anything is "
        "missing; needs only the train environment."))
    s.add_argument("names", nargs="*", metavar="NAME")
    s.add_argument("--blocks", action="store_true",
                   help="print the shared building blocks a baseline may call (as CONTRIBUTING.md lists them)")
    s.set_defaults(func=cmd_checklist)

    s = sub.add_parser("demo", help="the embedded default: tiny SFT -> d1 -> eval -> comparison table",
                       description="Trains a tiny LLaDA on 2-digit addition with sft, continues with d1, evaluates "
                                   "both on the held-out split and prints the comparison. Finished stages are reused.")
    s.add_argument("--seeds", type=int, default=3, help="d1 seeds (default 3)")
    s.add_argument("--smoke", action="store_true", help="a seconds-long run at reduced size (for tests)")
    s.add_argument("--compare", action="store_true", help=argparse.SUPPRESS)  # moved: reproductions/tiny/sweep.yaml
    s.set_defaults(func=cmd_demo)
    return p


ERROR_LINE_CHARS, ERROR_LINES = 1000, 100
"""The most an error message prints: characters per line, lines (a hostile input can make either huge)."""


def _clipped(message: str) -> str:
    """`message` with each line cut to `ERROR_LINE_CHARS` and at most `ERROR_LINES` lines."""
    lines = message.splitlines() or [""]
    if len(lines) > ERROR_LINES:
        lines = lines[:ERROR_LINES] + [f"... and {len(lines) - ERROR_LINES} more lines"]
    return "\n".join(line if len(line) <= ERROR_LINE_CHARS else f"{line[:ERROR_LINE_CHARS]}... ({len(line)} characters)"
                     for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns, extra = parser.parse_known_args(argv)
    if extra:  # key=value overrides given after an option (`dare train d1 --dry-run rl.group_size=4`)
        if hasattr(ns, "args") and not any(e.startswith("-") for e in extra):
            ns.args += extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return ns.func(ns)
    except UserError as e:  # bad input: one line, no traceback
        print(f"error: {_clipped(str(e))}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        if type(e).__name__ != "OpenCompassError":
            raise
        print(f"error: OpenCompass failed: {e}", file=sys.stderr)  # its own exit code is 0 even then
        return 1


if __name__ == "__main__":
    sys.exit(main())
