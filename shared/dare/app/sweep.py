"""Sweeps: a grid of training runs (+ evaluation) launched through submitit, idempotently.

A sweep file (`reproductions/<name>/sweep.yaml`):

    baseline: d1                      # a folder under baselines/
    config: gsm8k.yaml                # optional base config, relative to the sweep file
    overrides: {train.steps: 100}     # optional dotted-key overrides for every run
    grid: {run.seed: [0, 1, 2]}       # the product of these values is the set of runs
    eval: {config: ../demo/eval.yaml} # optional: evaluate every final model (embedded evaluator)
    slurm: {nodes: 1, gpus_per_node: 8, cpus_per_task: 16, mem_gb: 400, time_min: 1440,
            partition: gpu, account: mylab, qos: high, constraint: a100, exclude: "node[01-02]",
            setup: ["module load cuda/12.1", "source ~/envs/dare/bin/activate"],
            additional_parameters: {reservation: mine}}

`slurm:` takes any parameter of submitit's SlurmExecutor (the arguments of its sbatch script writer,
`submitit.slurm.slurm._make_sbatch_string`: partition, account, qos, constraint, exclude, nodelist,
gres, mem_per_gpu, mail_user, setup / teardown (shell lines run before / after srun), srun_args,
additional_parameters ({option: value}, written as `#SBATCH --option=value`), ...), its shared names
(mem_gb, tasks_per_node, timeout_min, name) and our time_min; null leaves a key unset. An unknown
key or a value of the wrong type is refused before anything is submitted. Unset: nodes 1,
cpus_per_task 2, mem_gb 8, time_min 60, signal_delay_s 120, array_parallelism 64, one task per GPU
(at least one). `dare sweep --dry-run` prints the sbatch script submitit will write.

Several methods side by side (`reproductions/tiny/sweep.yaml`) name each with its config instead of
`baseline`/`config`, and may start every run from one checkpoint trained first:

    methods: {d1: d1.yaml, wd1: wd1.yaml}   # baseline -> config (null: its defaults); the grid runs per method
    init: {config: ../demo/sft.yaml}       # trained (or reused) before the runs; each run starts from its
                                           # final checkpoint (model.path), evaluated like the runs

The paper's numbers are not repeated here: `targets.yaml` beside the sweep file is their one source
(`dare.app.targets`); evaluation writes the matching target into each result's `reference`, and
`dare sweep collect` prints ours against it.

Every run has a deterministic id (a hash of the baseline, the base config's content, the init
config's content and its overrides) and folder `<sweep out>/<id>/` (`train/` holds the run, `eval/` its results). A launch
skips runs whose results exist and validate and runs that are queued or running, and (re)submits
the rest as one job array (after the init job, which it depends on). A failing run fails alone. A preempted run (SIGTERM/SIGUSR1: the training
trainer checkpoints and exits 128+signal) requeues itself under SLURM and resumes from its
checkpoint; submitit's own timeout signal takes the same path (`Job.checkpoint`).
"""

from __future__ import annotations

import collections.abc
import difflib
import hashlib
import itertools
import json
import math
import os
import shlex
import subprocess
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dare.app import targets
from dare.config import ConfigError, read_yaml
from dare.eval import evaluate_checkpoint, load_eval_config
from dare.results import publish, read_result, write_result
from dare.utils import UserError, YAMLAliasError, atomic_write_json, load_yaml, runs_dir, shown_value

KEYS = {"baseline", "config", "methods", "init", "overrides", "grid", "eval", "slurm", "out_dir"}
MAX_RUNS = 10_000
"""The most runs one sweep may hold (methods x the product of the grid's list lengths), checked before the
grid is expanded: a typo of a grid (or a hostile file) never hangs `dare sweep` building 10^8 runs.
`dare sweep --max-runs N` raises it."""
SLURM_DEFAULTS = {"nodes": 1, "cpus_per_task": 2, "mem": "8GB", "time": 60, "signal_delay_s": 120,
                  "array_parallelism": 64}
"""What a job gets unless the sweep's slurm: section says otherwise (submitit's SlurmExecutor names)."""
SLURM_EXCLUSIVE = {"mem": {"mem_per_cpu", "mem_per_gpu"}, "cpus_per_task": {"cpus_per_gpu"}}
"""A default left out when the section sets one of these instead (sbatch refuses both at once)."""


@dataclass
class Run:
    id: str
    name: str
    overrides: list[str]
    dir: Path
    baseline: str = ""
    config: Path | None = None


@dataclass
class Init:
    """The run every sweep run starts from: its baseline (the config's `baseline:` key) and config."""
    baseline: str
    config: Path
    dir: Path
    """Where its evaluation and status are kept (the run itself is content-addressed under runs/)."""


@dataclass
class Sweep:
    path: Path
    methods: dict  # baseline -> config path or None
    init: Init | None
    overrides: dict
    grid: dict
    eval_config: Path | None
    slurm: dict  # submitit SlurmExecutor parameters (`slurm_parameters`)
    targets: targets.Targets | None  # the reproduction folder's targets.yaml, when it has one
    out: Path
    runs: list[Run] = field(default_factory=list)


def _fail(path, msg):
    raise UserError(f"{path}: {msg}")


def load_sweep(path: str | Path, max_runs: int = MAX_RUNS) -> Sweep:
    """Parse and validate a sweep file, and every run's config (before anything is submitted); a sweep of
    more than `max_runs` runs is refused before its grid is expanded."""
    from dare.app import baselines
    from dare.app.runs import resolve

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: sweep file not found")
    try:
        data = load_yaml(path.read_text(), str(path)) or {}
    except YAMLAliasError:
        raise
    except yaml.YAMLError as e:
        _fail(path, f"not valid YAML: {e}")
    if not isinstance(data, dict):
        _fail(path, "must be a mapping")
    if "expect" in data:
        _fail(path, "expect: the paper's numbers live in targets.yaml beside the sweep file (one source, in percent); "
                    "remove expect: from the sweep")
    unknown = sorted(set(data) - KEYS)
    if unknown:
        _fail(path, f"unknown key(s) {unknown}; known: {sorted(KEYS)}")
    if ("methods" in data) == ("baseline" in data) or ("methods" in data and "config" in data):
        _fail(path, "give either baseline (+ optional config) or methods: {baseline: config, ...}")
    methods = data["methods"] if "methods" in data else {data["baseline"]: data.get("config")}
    if not isinstance(methods, dict) or not methods:
        _fail(path, "methods: a mapping of baseline name -> config file (or null)")
    for baseline, config in list(methods.items()):
        if baseline not in baselines.names():
            _fail(path, f"baseline: unknown baseline {shown_value(baseline)}; "
                        f"available: {', '.join(baselines.names())}")
        methods[baseline] = (path.parent / config).resolve() if config else None
        if methods[baseline] and not methods[baseline].is_file():
            _fail(path, f"config: {methods[baseline]} not found")
    grid = data.get("grid") or {}
    if not isinstance(grid, dict) or not grid:
        _fail(path, "grid: empty (give at least one key with a list of values, e.g. run.seed: [0, 1, 2])")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            _fail(path, f"grid.{key}: must be a non-empty list")
    count = len(methods) * math.prod(len(values) for values in grid.values())
    if count > max_runs:
        sizes = " x ".join(str(len(v)) for v in grid.values())
        _fail(path, f"{count:,} runs ({len(methods)} method(s) x grid {sizes}) "
                    f"exceed the cap of {max_runs:,} runs per sweep; shrink the grid or split the sweep "
                    f"(or raise the cap: dare sweep --max-runs N)")
    overrides = data.get("overrides") or {}
    if not isinstance(overrides, dict):
        _fail(path, "overrides: must be a mapping of dotted keys to values")
    slurm = slurm_parameters(path, data.get("slurm") or {})
    eval_cfg = data.get("eval") or {}
    eval_config = (path.parent / eval_cfg["config"]).resolve() if eval_cfg.get("config") else None
    if eval_config and not eval_config.is_file():
        _fail(path, f"eval.config: {eval_config} not found")
    if eval_config:
        load_eval_config(eval_config)  # benchmark names checked before anything is submitted
    out = Path(data.get("out_dir") or runs_dir() / "sweeps" / sweep_folder(path))
    init = None
    if data.get("init"):
        init_config = (path.parent / (data["init"].get("config") or "")).resolve()
        if not data["init"].get("config") or not init_config.is_file():
            _fail(path, f"init.config: {init_config} not found")
        init_baseline = read_yaml(init_config).get("baseline")
        if init_baseline not in baselines.names():
            _fail(path, f"init.config: {init_config} names no known baseline (baseline: {shown_value(init_baseline)})")
        try:
            resolve(init_baseline, init_config)
        except ConfigError as e:
            _fail(path, f"init: {e}")
        init = Init(init_baseline, init_config, out / "init")
    sweep = Sweep(path, methods, init, overrides, grid, eval_config, slurm, targets.beside(path), out)
    start = "" if init is None else init.config.read_text()
    keys = list(grid)
    for baseline, config in methods.items():
        base = "" if config is None else config.read_text()
        for values in itertools.product(*(grid[k] for k in keys)):
            chosen = dict(zip(keys, values))
            ov = [f"{k}={_fmt(v)}" for k, v in {**overrides, **chosen}.items()]
            key = [baseline, base, sorted(ov)] + ([start] if init else [])
            run_id = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12]
            shown = ({"baseline": baseline} if len(methods) > 1 else {}) | chosen
            name = ",".join(f"{k}={_fmt(v)}" for k, v in shown.items())
            try:
                resolve(baseline, config, ov)
            except ConfigError as e:
                _fail(path, f"run {name}: {e}")
            sweep.runs.append(Run(run_id, name, ov, out / run_id, baseline, config))
    return sweep


def _fmt(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


# ---------------------------------------------------------------------------------------------
# SLURM parameters (submitit's own, checked against its sbatch script writer)
# ---------------------------------------------------------------------------------------------


def slurm_options() -> dict[str, tuple[str, object]]:
    """Every key a sweep's slurm: section accepts -> (the SlurmExecutor parameter it sets, the type it
    takes): submitit's own parameters (the arguments of `_make_sbatch_string`, with their annotations),
    its shared names (`AutoExecutor._typed_parameters`: mem_gb, tasks_per_node, timeout_min, ...,
    renamed by `SlurmExecutor._equivalence_dict`) and our time_min."""
    import submitit
    from submitit.slurm import slurm

    hints = typing.get_type_hints(slurm._make_sbatch_string)
    renamed = slurm.SlurmExecutor._equivalence_dict()
    options = {k: (k, hints[k]) for k in slurm._get_default_parameters()}
    options |= {k: (renamed.get(k, k), t) for k, t in submitit.AutoExecutor._typed_parameters().items()}
    return options | {"time_min": (renamed["timeout_min"], int)}


def slurm_parameters(path: Path, section) -> dict:
    """A sweep's slurm: section as submitit SlurmExecutor parameters, with our defaults; a clear error
    for a key submitit does not know, a value of the wrong type, or one parameter given twice."""
    from submitit.slurm import slurm

    if not isinstance(section, dict):
        _fail(path, "slurm: must be a mapping of submitit SlurmExecutor parameters")
    options, params, given = slurm_options(), {}, {}
    for key, value in section.items():
        if key not in options:
            close = difflib.get_close_matches(str(key), options, n=3)
            guess = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
            _fail(path, f"slurm: unknown key {key!r} ({guess}known: {', '.join(sorted(options))})")
        name, hint = options[key]
        if value is None:
            continue
        if not _admits(hint, value):
            _fail(path, f"slurm.{key}: expected {_type_name(hint)}, got {type(value).__name__} {shown_value(value)}")
        if name in given:
            _fail(path, f"slurm: {given[name]} and {key} both set submitit's {name}; give one")
        given[name] = key
        params[name] = slurm._convert_mem(value) if key == "mem_gb" else value
    for name, value in SLURM_DEFAULTS.items():
        if name not in params and not SLURM_EXCLUSIVE.get(name, set()) & set(params):
            params[name] = value
    if not params.get("ntasks_per_node"):  # one training process per GPU; they form one process group
        params["ntasks_per_node"] = max(1, params.get("gpus_per_node") or 0)
    return params


def _admits(hint, value) -> bool:
    """Whether a YAML value fits a submitit annotation (a float: any number; an iterable: a list)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        return any(_admits(a, value) for a in args)
    if origin in (list, collections.abc.Iterable):
        return isinstance(value, list) and all(_admits(args[0], v) for v in value)
    if hint is typing.Any:
        return True
    if hint in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float) if hint is float else origin or hint)


def _type_name(hint) -> str:
    """A submitit annotation as the error shows it: `a list of str`, `bool or str`, `int`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        return " or ".join(_type_name(a) for a in args if a is not type(None))
    if origin in (list, collections.abc.Iterable):
        return f"a list of {_type_name(args[0])}"
    if origin is dict:
        return "a mapping"
    return getattr(hint, "__name__", str(hint))


def _submitit_folder(sweep: Sweep) -> Path:
    """Where submitit keeps the jobs' scripts, pickles and logs (%j: the job id)."""
    return (sweep.out / "submitit" / "%j").absolute()


def sbatch_script(sweep: Sweep, array_size: int) -> str:
    """The sbatch script submitit writes for the runs' job (a job array when `array_size` > 1)."""
    from submitit.slurm import slurm

    folder = _submitit_folder(sweep)
    # the command SlurmExecutor submits (its `_submitit_command_str`)
    command = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    return slurm._make_sbatch_string(command=command, folder=folder, map_count=array_size if array_size > 1 else None,
                                     **sweep.slurm)


# ---------------------------------------------------------------------------------------------
# One run (what a job executes)
# ---------------------------------------------------------------------------------------------


def results_of(run: Run) -> list[Path]:
    out = []
    for p in sorted((run.dir / "eval").glob("result_*.json")) if (run.dir / "eval").is_dir() else []:
        try:
            read_result(p)
            out.append(p)
        except ValueError:
            pass
    return out


def execute(sweep_path: str, run_id: str) -> list[str]:
    """Train (resuming if a checkpoint exists) and evaluate one run; returns its result files.
    Exit code 128+signal after a preemption, after asking SLURM to requeue the job."""
    from dare.app.runs import train

    sweep = load_sweep(sweep_path, max_runs=sys.maxsize)  # the launch that submitted it checked the run count
    if run_id == "init":
        return execute_init(sweep)
    run = next(r for r in sweep.runs if r.id == run_id)
    main = dist_env_from_slurm()
    if main:
        atomic_write_json(run.dir / "status.json", {"state": "running", "started": time.time(),
                                                    "job": os.environ.get("SLURM_JOB_ID")})
    try:
        start = [f"model.path={train(sweep.init.baseline, sweep.init.config) / 'final'}"] if sweep.init else []
        done = train(run.baseline, run.config, [*start, *run.overrides, f"run.out_dir={run.dir / 'train'}"])
    except SystemExit as stop:
        if isinstance(stop.code, int) and stop.code >= 128:  # preempted; the checkpoint is written
            if main:
                atomic_write_json(run.dir / "status.json", {"state": "preempted", "code": stop.code})
                _requeue()
        raise
    if not main:
        return []
    if sweep.eval_config is None:
        atomic_write_json(run.dir / "status.json", {"state": "done", "finished": time.time()})
        return []

    reference = (lambda benchmark, decoding: sweep.targets.reference(run.config, benchmark, decoding)) \
        if sweep.targets else None
    paths = evaluate_checkpoint(done / "final", sweep.eval_config, out_dir=run.dir / "eval", reference=reference)
    atomic_write_json(run.dir / "status.json", {"state": "done", "finished": time.time()})
    return [str(p) for p in paths]


def execute_init(sweep: Sweep) -> list[str]:
    """Train (or reuse) the run every sweep run starts from, and evaluate it like them."""
    from dare.app.runs import train

    init = sweep.init
    init.dir.mkdir(parents=True, exist_ok=True)
    done = train(init.baseline, init.config)
    paths = []
    if sweep.eval_config is not None and int(os.environ.get("RANK", "0")) == 0:
        paths = evaluate_checkpoint(done / "final", sweep.eval_config, out_dir=init.dir / "eval")
    atomic_write_json(init.dir / "status.json", {"state": "done", "finished": time.time(), "run": str(done)})
    return [str(p) for p in paths]


def dist_env_from_slurm() -> bool:
    """Several tasks in this job (nodes x tasks_per_node): give each the environment torch's
    `env://` rendezvous reads, from what SLURM provides (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
    the job's first host as MASTER_ADDR, a port derived from the job id). srun has already started
    one process per GPU on every node, so no torchrun or Ray cluster is needed inside the
    allocation. Returns True on the main process (rank 0)."""
    ntasks = int(os.environ.get("SLURM_NTASKS", "1"))
    if ntasks <= 1 or "RANK" in os.environ:
        return int(os.environ.get("RANK", "0")) == 0
    nodes = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                           capture_output=True, text=True, check=True).stdout.split()
    job = int(os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ["SLURM_JOB_ID"])
    task = int(os.environ.get("SLURM_ARRAY_TASK_ID", "0"))
    os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=str(ntasks),
                      LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"), MASTER_ADDR=nodes[0],
                      MASTER_PORT=str(20000 + (job * 97 + task) % 20000))
    return os.environ["RANK"] == "0"


def _requeue() -> None:
    """Put this SLURM job back in the queue (it resumes from its checkpoint when it runs again)."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job else os.environ.get("SLURM_JOB_ID")
    if job:
        subprocess.run(["scontrol", "requeue", job], check=False)


class Job:
    """The submitit callable; checkpointable, so submitit's timeout/preemption signal requeues it."""

    def __init__(self, sweep_path: str, run_id: str):
        self.sweep_path, self.run_id = sweep_path, run_id

    def __call__(self) -> list[str]:
        return execute(self.sweep_path, self.run_id)

    def checkpoint(self, *args, **kwargs):
        import submitit

        return submitit.helpers.DelayedSubmission(Job(self.sweep_path, self.run_id))


# ---------------------------------------------------------------------------------------------
# Launch, status, collect
# ---------------------------------------------------------------------------------------------


def _queued_jobs() -> set[str]:
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def sweep_folder(path: Path) -> Path:
    """Where a sweep's runs go under `runs/sweeps/`: its path below `reproductions/` without the suffix
    (`reproductions/sudoku/sdar/sweep.yaml` -> `sudoku/sdar/sweep`), so two sweeps that share a folder
    name and a file name (`tiny/sdar/sweep.yaml`) never share an init run; elsewhere `<folder>/<stem>`."""
    parts = path.resolve().parts
    if "reproductions" in parts[:-1]:
        return Path(*parts[len(parts) - parts[::-1].index("reproductions"):]).with_suffix("")
    return Path(path.parent.name) / path.stem


def state(run: Run, queued: set[str] | None = None) -> tuple[str, str]:
    """(done | running | failed | pending, log path)."""
    status = json.loads((run.dir / "status.json").read_text()) if (run.dir / "status.json").is_file() else {}
    if status.get("state") == "done" and (results_of(run) or not (run.dir / "eval").exists()):
        return "done", ""
    job_file = run.dir / "job.json"
    if not job_file.is_file():
        return "pending", ""
    job = json.loads(job_file.read_text())
    log = job.get("log", "")
    if job.get("cluster") == "slurm":
        queued = _queued_jobs() if queued is None else queued
        if job["job_id"] in queued or job["job_id"].split("_")[0] in queued:
            return "running", log
    return "failed", log


def _local(sweep: Sweep, run) -> int:
    """Execute one run (or the init, `run.id` "init") in a child process; its output goes to local.log."""
    run.dir.mkdir(parents=True, exist_ok=True)
    log = run.dir / "local.log"
    atomic_write_json(run.dir / "job.json", {"cluster": "local", "job_id": "local", "log": str(log)})
    with open(log, "w") as out:
        return subprocess.run([sys.executable, "-m", "dare.app.sweep", str(sweep.path), getattr(run, "id", "init")],
                              stdout=out, stderr=subprocess.STDOUT).returncode


def launch(sweep: Sweep, cluster: str = "slurm", dry_run: bool = False, only: dict | None = None) -> list[Run]:
    """Submit the runs that are not done and not queued (those matching `only`, {key: value} on the
    run's baseline and grid values, when given); returns them. The init run goes first: in order
    here, as its own job that the array depends on under SLURM."""
    queued = _queued_jobs() if cluster == "slurm" else set()
    runs = [r for r in sweep.runs if matches(r, only)]
    todo = [r for r in runs if state(r, queued)[0] in ("pending", "failed")]
    init_todo = sweep.init is not None and todo and state(sweep.init, queued)[0] in ("pending", "failed")
    if dry_run:
        print(f"{sweep.path}: {len(runs)} runs, {len(todo)} to submit ({cluster})")
        if sweep.init:
            print(f"  init      {state(sweep.init, queued)[0]:8s} {sweep.init.baseline} {sweep.init.config}")
        for r in runs:
            print(f"  {r.id}  {state(r, queued)[0]:8s} {r.name}  ->  {r.dir}")
        if cluster == "slurm":
            after = " (it waits for the init job: --dependency=afterok:<its id>)" if init_todo else ""
            print(f"sbatch script submitit writes for the runs{after}:")
            print(sbatch_script(sweep, len(todo)))
        return todo
    if not todo:
        print(f"{sweep.path}: nothing to submit ({len(runs)} runs done or queued)")
        return todo
    for r in todo:
        r.dir.mkdir(parents=True, exist_ok=True)
    if cluster == "local":  # in this process, one after another; a failing run does not stop the others
        if init_todo:
            code = _local(sweep, sweep.init)
            print(f"  init {sweep.init.baseline}: {'done' if code == 0 else f'failed (exit {code})'}")
            if code:
                print(f"  the runs start from it: not started (log {sweep.init.dir / 'local.log'})")
                return todo
        for r in todo:
            code, log = _local(sweep, r), r.dir / "local.log"
            print(f"  {r.id} {r.name}: {'done' if code == 0 else f'failed (exit {code}), log {log}'}")
        return todo
    import submitit

    executor = submitit.AutoExecutor(folder=_submitit_folder(sweep), cluster=cluster)
    if cluster == "slurm":
        executor.update_parameters(**{f"slurm_{k}": v for k, v in sweep.slurm.items()})
    if init_todo:
        sweep.init.dir.mkdir(parents=True, exist_ok=True)
        init_job = executor.submit(Job(str(sweep.path), "init"))
        atomic_write_json(sweep.init.dir / "job.json", {"cluster": cluster, "job_id": str(init_job.job_id),
                                                        "log": str(init_job.paths.stderr)})
        print(f"  init {sweep.init.baseline}: submitted as {init_job.job_id}")
        if cluster == "debug":
            init_job.result()
        else:
            executor.update_parameters(slurm_dependency=f"afterok:{init_job.job_id}")
    with executor.batch():
        jobs = [executor.submit(Job(str(sweep.path), r.id)) for r in todo]
    for r, job in zip(todo, jobs):
        atomic_write_json(r.dir / "job.json", {"cluster": cluster, "job_id": str(job.job_id),
                                               "log": str(job.paths.stderr)})
        print(f"  {r.id} {r.name}: submitted as {job.job_id}")
    if cluster == "debug":
        for r, job in zip(todo, jobs):
            try:
                job.result()
            except Exception as e:  # noqa: BLE001  one failing run does not stop the others
                print(f"  {r.id} {r.name}: failed: {e}")
    return todo


def matches(run: Run, only: dict | None) -> bool:
    """`only` ({"baseline": "d1", "run.seed": "0"}, from `--only baseline=d1`) selects runs by their
    baseline and grid values (compared as written in the run's name)."""
    if not only:
        return True
    values = dict(part.split("=", 1) for part in run.name.split(",") if "=" in part)
    values["baseline"] = run.baseline
    return all(values.get(k) == v for k, v in only.items())


def collect(sweep: Sweep, dest: str | Path, only: dict | None = None) -> list[Path]:
    """Publish the valid results of finished runs (and of the init run they start from) to `dest`,
    each with the paper's number of its reproduction in `reference` (targets.yaml beside the sweep
    file); print ours against the paper and, per method, the mean and spread over the grid. A result
    already in `dest` (same run id) is left as it is."""
    import math

    copied, by_target, by_method = [], {}, {}
    sources = ([("init", sweep.init.baseline, None, sweep.init)] if sweep.init else []) + [
        (r.name, r.baseline, r.config, r) for r in sweep.runs if matches(r, only)]
    for _, baseline, config, run in sources:
        for p in results_of(run):
            path = publish(p, dest)
            res = read_result(path)
            if sweep.targets and run is not sweep.init:
                ref = sweep.targets.reference(config, res.benchmark.model_dump(), res.decoding.model_dump())
                if ref != (res.reference.model_dump() if res.reference else None):
                    res = res.model_copy(update={"reference": ref})
                    write_result(res, path)
                if ref:
                    key = (res.benchmark.name, res.decoding.gen_length, ref["value"], ref["same_decoding"])
                    by_target.setdefault(key, []).append(res.metrics[0].value)
            label = f"{baseline} (start)" if run is sweep.init else baseline
            by_method.setdefault((label, res.benchmark.name, res.metrics[0].name), []).append(res.metrics[0].value)
            copied.append(path)
    print(f"{len(copied)} result(s) -> {dest}")
    for (label, bench, metric), values in by_method.items():
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        print(f"  {label:22s} {bench} {metric}: {mean:.4f} ± {std:.4f} over {len(values)} run(s)  "
              f"({', '.join(f'{v:.3f}' for v in values)})")
    if sweep.targets is None:
        print("  (no targets.yaml beside the sweep file: no paper numbers to compare with)")
    for (bench, gen, value, same), values in sorted(by_target.items()):
        mean, tol = sum(values) / len(values), sweep.targets.tolerance / 100
        verdict = "within tolerance" if mean >= value - tol else "below"
        protocol = "" if same else "; NOT the paper's decoding protocol"
        print(f"  {bench} (gen {gen}): ours {mean:.4f} over {len(values)} run(s) vs paper {value:.4f} "
              f"({sweep.targets.source()}): {mean - value:+.4f}, {verdict}{protocol}")
    return copied


if __name__ == "__main__":  # `python -m dare.app.sweep <sweep.yaml> <run id>`: one run, for local launches
    execute(sys.argv[1], sys.argv[2])
