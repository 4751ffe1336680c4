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

`slurm:` takes any parameter of submitit's SlurmExecutor (`SlurmSection` lists them with their types: partition,
account, qos, constraint, exclude, nodelist, gres, mem_per_gpu, mail_user, setup / teardown (shell lines run
before / after srun), srun_args, additional_parameters ({option: value}, written as `#SBATCH --option=value`),
...), its shared names (mem_gb, tasks_per_node, timeout_min, name) and our time_min; null leaves a key unset.
The file is a typed config (`SweepFile`) read by the configs' loader (`dare.config.load`): an unknown key gets a
"did you mean", a value of the wrong type or a non-finite number names its key, YAML aliases are refused, all
before anything is submitted. Unset: nodes 1, cpus_per_task 2, mem_gb 8, time_min 60, signal_delay_s 120,
array_parallelism 64, one task per GPU (at least one). `dare sweep --dry-run` prints the sbatch script submitit
will write (`render_sbatch`, which tests/test_sweep.py keeps equal to submitit's own writer).

Several methods side by side (`reproductions/tiny/sweep.yaml`) name each with its config instead of
`baseline`/`config`, and may start every run from one checkpoint trained first:

    methods: {d1: d1.yaml, wd1: wd1.yaml}   # baseline -> config (null: its defaults); the grid runs per method
    method_overrides: {cj_grpo: {rl.decoding.steps: 3}}  # optional: one method's own, after `overrides`
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

import hashlib
import itertools
import json
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dare.app import targets
from dare.config import ConfigError, load, read_yaml
from dare.eval import evaluate_checkpoint, load_eval_config
from dare.results import publish, publish_destination, read_result, write_result
from dare.utils import UserError, atomic_write_json, runs_dir, shown_value

MAX_RUNS = 10_000
"""The most runs one sweep may hold (methods x the product of the grid's list lengths), checked before the
grid is expanded: a typo of a grid (or a hostile file) never hangs `dare sweep` building 10^8 runs.
`dare sweep --max-runs N` raises it."""
SLURM_DEFAULTS = {"nodes": 1, "cpus_per_task": 2, "mem": "8GB", "time": 60, "signal_delay_s": 120,
                  "array_parallelism": 64}
"""What a job gets unless the sweep's slurm: section says otherwise (submitit's SlurmExecutor names)."""
SLURM_EXCLUSIVE = {"mem": {"mem_per_cpu", "mem_per_gpu"}, "cpus_per_task": {"cpus_per_gpu"}}
"""A default left out when the section sets one of these instead (sbatch refuses both at once)."""


# ---------------------------------------------------------------------------------------------
# The sweep file: a typed config, read by dare.config's loader
# ---------------------------------------------------------------------------------------------


@dataclass
class SlurmSection:
    """A sweep's `slurm:` section; null (None) leaves a key unset. The fields up to `use_srun` are submitit's
    SlurmExecutor parameters (the arguments of its sbatch script writer, with their types); the rest are
    other names of them (`SLURM_RENAMED`). tests/test_sweep.py keeps this table equal to submitit's."""

    job_name: str | None = None
    partition: str | None = None
    time: int | None = None
    """Minutes (`time_min`, `timeout_min`)."""
    nodes: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    cpus_per_gpu: int | None = None
    num_gpus: int | None = None
    """submitit's legacy name of gpus_per_node."""
    gpus_per_node: int | None = None
    gpus_per_task: int | None = None
    qos: str | None = None
    setup: list[str] | None = None
    """Shell lines run before srun (`module load ...`, `source .../activate`)."""
    teardown: list[str] | None = None
    """Shell lines run after srun."""
    mem: str | None = None
    mem_per_gpu: str | None = None
    mem_per_cpu: str | None = None
    signal_delay_s: int | None = None
    """Seconds before the time limit at which submitit's timeout signal (USR2) arrives."""
    comment: str | None = None
    constraint: str | None = None
    exclude: str | None = None
    account: str | None = None
    gres: str | None = None
    mail_type: str | None = None
    mail_user: str | None = None
    nodelist: str | None = None
    dependency: str | None = None
    exclusive: bool | str | None = None
    array_parallelism: int | None = None
    """How many runs of the job array run at once."""
    wckey: str | None = None
    stderr_to_stdout: bool | None = None
    additional_parameters: dict[str, Any] | None = None
    """Raw sbatch options: {option: value} -> `#SBATCH --option=value` (true: `#SBATCH --option`)."""
    srun_args: list[str] | None = None
    use_srun: bool | None = None
    # other names of the parameters above
    name: str | None = None
    timeout_min: int | None = None
    mem_gb: float | None = None
    """GB; written as submitit writes `mem` (`480GB`, or MB when fractional)."""
    tasks_per_node: int | None = None
    time_min: int | None = None


SLURM_RENAMED = {"name": "job_name", "timeout_min": "time", "time_min": "time", "mem_gb": "mem",
                 "tasks_per_node": "ntasks_per_node"}
"""The SlurmSection fields that are other names of a submitit parameter: submitit's shared (AutoExecutor) names
and our time_min."""


@dataclass
class PathSection:
    config: str | None = None
    """A config file, relative to the sweep file."""


@dataclass
class SweepFile:
    """A sweep file as written (`load_sweep` resolves it into a `Sweep`); see the module docstring."""

    baseline: str | None = None
    config: str | None = None
    methods: dict[str, str | None] | None = None
    """baseline -> its config file (null: its defaults), instead of baseline/config."""
    method_overrides: dict[str, dict[str, Any]] | None = None
    """baseline -> dotted keys -> values for that method's runs only, applied after `overrides` (a setting the
    task fixes for every method, such as a step count that one method's sampler derives from the length)."""
    init: PathSection = field(default_factory=PathSection)
    overrides: dict[str, Any] | None = None
    """Dotted config keys -> values, for every run."""
    grid: dict[str, list[Any]] = field(default_factory=dict)
    """Dotted config keys -> the values to run; the runs are the product of the lists."""
    eval: PathSection = field(default_factory=PathSection)
    slurm: SlurmSection = field(default_factory=SlurmSection)
    out_dir: str | None = None


SECTIONS = {"init", "eval", "slurm"}
"""The sweep file's sections: null is the same as leaving one out (the loader wants a mapping for a section)."""


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
    data = read_yaml(path)
    if "expect" in data:
        _fail(path, "expect: the paper's numbers live in targets.yaml beside the sweep file (one source, in percent); "
                    "remove expect: from the sweep")
    spec = load(SweepFile, path, data={k: v for k, v in data.items() if not (k in SECTIONS and v is None)})
    if ("methods" in data) == ("baseline" in data) or ("methods" in data and "config" in data):
        _fail(path, "give either baseline (+ optional config) or methods: {baseline: config, ...}")
    methods = spec.methods if "methods" in data else {spec.baseline: spec.config}
    if not methods:
        _fail(path, "methods: a mapping of baseline name -> config file (or null)")
    for baseline, config in list(methods.items()):
        if baseline not in baselines.names():
            _fail(path, f"baseline: unknown baseline {shown_value(baseline)}; "
                        f"available: {', '.join(baselines.names())}")
        methods[baseline] = (path.parent / config).resolve() if config else None
        if methods[baseline] and not methods[baseline].is_file():
            _fail(path, f"config: {methods[baseline]} not found")
    grid = spec.grid
    if not grid:
        _fail(path, "grid: empty (give at least one key with a list of values, e.g. run.seed: [0, 1, 2])")
    for key, values in grid.items():
        if not values:
            _fail(path, f"grid.{key}: must be a non-empty list")
    count = len(methods) * math.prod(len(values) for values in grid.values())
    if count > max_runs:
        sizes = " x ".join(str(len(v)) for v in grid.values())
        _fail(path, f"{count:,} runs ({len(methods)} method(s) x grid {sizes}) "
                    f"exceed the cap of {max_runs:,} runs per sweep; shrink the grid or split the sweep "
                    f"(or raise the cap: dare sweep --max-runs N)")
    overrides = spec.overrides or {}
    own = spec.method_overrides or {}
    for baseline in own:
        if baseline not in methods:
            _fail(path, f"method_overrides.{shown_value(baseline)}: not one of the sweep's methods ({', '.join(methods)})")
    slurm = slurm_parameters(path, spec.slurm)
    eval_config = (path.parent / spec.eval.config).resolve() if spec.eval.config else None
    if eval_config and not eval_config.is_file():
        _fail(path, f"eval.config: {eval_config} not found")
    if eval_config:
        load_eval_config(eval_config)  # benchmark names checked before anything is submitted
    out = Path(spec.out_dir or runs_dir() / "sweeps" / sweep_folder(path))
    init = None
    if data.get("init"):  # a section without its config is a mistake, not "no init"
        init_config = (path.parent / (spec.init.config or "")).resolve()
        if not spec.init.config or not init_config.is_file():
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
            ov = [f"{k}={_fmt(v)}" for k, v in {**overrides, **own.get(baseline, {}), **chosen}.items()]
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
# SLURM parameters and the sbatch script submitit writes for them
# ---------------------------------------------------------------------------------------------


def slurm_parameters(path: Path, section: SlurmSection) -> dict:
    """A sweep's (type-checked) slurm: section as submitit SlurmExecutor parameters, with our defaults; a clear
    error for one parameter given twice (`mem` and `mem_gb`)."""
    params, given = {}, {}
    for f in fields(section):
        value = getattr(section, f.name)
        if value is None:
            continue
        name = SLURM_RENAMED.get(f.name, f.name)
        if name in given:
            first, second = sorted([given[name], f.name])
            _fail(path, f"slurm: {first} and {second} both set submitit's {name}; give one")
        given[name] = f.name
        params[name] = _mem(value) if f.name == "mem_gb" else value
    for name, value in SLURM_DEFAULTS.items():
        if name not in params and not SLURM_EXCLUSIVE.get(name, set()) & set(params):
            params[name] = value
    if not params.get("ntasks_per_node"):  # one training process per GPU; they form one process group
        params["ntasks_per_node"] = max(1, params.get("gpus_per_node") or 0)
    return params


def _mem(gb: float) -> str:
    """`mem_gb` as submitit writes `mem`: whole gigabytes as `480GB`, otherwise megabytes (`1536MB`)."""
    return f"{int(gb)}GB" if gb == int(gb) else f"{int(gb * 1024)}MB"


def _submitit_folder(sweep: Sweep) -> Path:
    """Where submitit keeps the jobs' scripts, pickles and logs (%j: the job id)."""
    return (sweep.out / "submitit" / "%j").absolute()


def sbatch_script(sweep: Sweep, array_size: int) -> str:
    """The sbatch script submitit writes for the runs' job (a job array when `array_size` > 1)."""
    folder = _submitit_folder(sweep)
    # the command SlurmExecutor submits: the current python running submitit's job entry point on the folder
    command = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    return render_sbatch(sweep.slurm, command, folder, array_size if array_size > 1 else None)


SBATCH_UNSET = {"job_name": "submitit", "time": 5, "nodes": 1, "signal_delay_s": 90, "array_parallelism": 256,
                "wckey": "submitit", "stderr_to_stdout": False, "use_srun": True}
"""submitit's values of the SlurmExecutor parameters a job leaves unset (the others are not written)."""
NOT_SBATCH_OPTIONS = {"array_parallelism", "additional_parameters", "setup", "teardown", "signal_delay_s",
                      "stderr_to_stdout", "srun_args", "use_srun"}
"""SlurmExecutor parameters that shape the script, not `#SBATCH` lines of their own."""


def render_sbatch(params: dict, command: str, folder: str | Path, map_count: int | None = None) -> str:
    """The sbatch script submitit's SlurmExecutor writes for `params` (its parameter names) to run `command`,
    keeping its logs in `folder`, as a job array of `map_count` tasks when given: written here, so that a dry run
    shows it without a cluster and without submitit's private writer (tests/test_sweep.py compares the two)."""
    import submitit

    params = {**SBATCH_UNSET, **params}
    options = {k: v for k, v in params.items() if v is not None and k not in NOT_SBATCH_OPTIONS}
    options["signal"] = f"{submitit.JobEnvironment.USR_SIG}@{params['signal_delay_s']}"
    if "num_gpus" in options:  # the legacy name
        options["gpus_per_node"] = options.pop("num_gpus")
    folder = Path(folder).expanduser().absolute()
    stdout, stderr = str(folder / "%j_%t_log.out"), str(folder / "%j_%t_log.err")
    if map_count is not None:
        options["array"] = f"0-{map_count - 1}%{min(map_count, params['array_parallelism'])}"
        stdout, stderr = stdout.replace("%j", "%A_%a"), stderr.replace("%j", "%A_%a")
    options["output"] = stdout.replace("%t", "0")
    if not params["stderr_to_stdout"]:
        options["error"] = stderr.replace("%t", "0")
    options["open-mode"] = "append"
    options.update(params.get("additional_parameters") or {})
    lines = ["#!/bin/bash", "", "# Parameters"]
    for key in sorted(options):
        flag, value = key.replace("_", "-"), options[key]
        lines.append(f"#SBATCH --{flag}" if value is True else f"#SBATCH --{flag}={shlex.quote(str(value))}")
    if params.get("setup") is not None:
        lines += ["", "# setup", *params["setup"]]
    if params["use_srun"]:
        srun = ["srun", "--unbuffered", "--output", stdout, *([] if params["stderr_to_stdout"] else ["--error", stderr]),
                *(params.get("srun_args") or [])]
        command = " ".join(shlex.quote(arg) for arg in srun) + " " + command
    lines += ["", "# command", "export SUBMITIT_EXECUTOR=slurm", command, ""]
    if params.get("teardown") is not None:
        lines += ["", "# teardown", *params["teardown"]]
    return "\n".join(lines)


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
    """Execute one run (or the init, `run.id` "init") in a child process; its output goes to local.log. The
    child gets the threads a job of the sweep's `slurm:` section gets (`cpus_per_task` as OMP_NUM_THREADS, unless
    the environment sets it): torch's default of one thread a core oversubscribes a machine that runs several
    sweeps at once, and its spinning threads then slowed a suite seed tenfold (2 runs x 2 threads on 2 cores)."""
    run.dir.mkdir(parents=True, exist_ok=True)
    log = run.dir / "local.log"
    atomic_write_json(run.dir / "job.json", {"cluster": "local", "job_id": "local", "log": str(log)})
    env = dict(os.environ)
    if sweep.slurm.get("cpus_per_task") and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(sweep.slurm["cpus_per_task"])
    with open(log, "w") as out:
        return subprocess.run([sys.executable, "-m", "dare.app.sweep", str(sweep.path), getattr(run, "id", "init")],
                              stdout=out, stderr=subprocess.STDOUT, env=env).returncode


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


def untraced(result) -> str | None:
    """Why a result cannot be traced to one commit (None when it can): made from a tree with uncommitted
    changes, or outside a git checkout. tests/test_leaderboard.py refuses such a result under leaderboard/results/."""
    prov = result.provenance
    if prov.git_dirty:
        return "was made from a tree with uncommitted changes (provenance.git_dirty)"
    if prov.git_dirty is None or not prov.git_commit:
        return "was made outside a git checkout (no commit in its provenance)"
    return None


def check_traceable(path: str | Path, result, run: str = "", refuse: str | None = None, copied: str = "copied") -> None:
    """The one check of a result on its way under leaderboard/results/ (`dare sweep collect`, `dare results
    publish`), against what tests/test_leaderboard.py refuses there. A result that cannot be traced to one commit
    (`untraced`) raises, naming `path` (and `run`, e.g. "run run.seed=1 of <sweep>"), followed by `refuse`, the
    way out, when that is given; else it is warned on stderr as `copied` anyway. A result made in an environment
    with no recorded lock is warned."""
    who = f"{path}: " + (f"{run} " if run else "")
    why = untraced(result)
    if why and refuse:
        raise UserError(f"{who}{why}: {refuse}")
    if why:
        print(f"WARNING: {who}{why}; {copied} anyway: the tests refuse it under leaderboard/results/, do not commit "
              f"it (rerun it from a clean committed tree)", file=sys.stderr)
    if not result.provenance.lock:
        print(f"WARNING: {who}was made in an environment with no recorded lock (install it with make, or dare env "
              f"--record-lock <lock>): the tests refuse it under leaderboard/results/", file=sys.stderr)


def default_destination(sweep: Sweep) -> str:
    """`dare sweep collect`'s folder when `--to` is not given. A baseline's tiny-task sweep (`TINY_SWEEP`,
    running that one baseline) goes to its own folder (`TINY_RESULTS`), as CONTRIBUTING.md section 6 and
    `dare checklist` say; any other sweep under reproductions/ to its path there joined by "-", the file's name
    left out when it is a folder's sweep (`sweep*.yaml`): reproductions/d1/sweep.yaml -> leaderboard/results/d1
    and reproductions/justgrpo/sweep_math.yaml -> leaderboard/results/justgrpo, as before;
    reproductions/tiny/sdar/sweep.yaml -> tiny-sdar, reproductions/tiny/sdar/supervised.yaml ->
    tiny-sdar-supervised, reproductions/sudoku/dream/sweep.yaml -> sudoku-dream, as they were collected (the
    former default, the sweep file's folder name, gave `dream` for the last). A sweep outside reproductions/
    goes to its folder's name."""
    import re
    import string

    from dare.app.baselines import TINY_RESULTS, TINY_SWEEP

    parts = sweep.path.resolve().parts
    if "reproductions" not in parts:
        return "leaderboard/results/" + sweep.path.resolve().parent.name
    start = len(parts) - 1 - parts[::-1].index("reproductions")
    where = "/".join(parts[start:])
    pattern = "".join(re.escape(text) + (f"(?P<{field}>[^/]+)" if field else "")
                      for text, field, _, _ in string.Formatter().parse(TINY_SWEEP))
    tiny = re.fullmatch(pattern, where)
    if tiny and list(sweep.methods) == [tiny["name"]]:
        return TINY_RESULTS.format(**tiny.groupdict())
    folders = list(parts[start + 1:-1]) + ([] if sweep.path.stem.startswith("sweep") else [sweep.path.stem])
    return "leaderboard/results/" + "-".join(folders)


def collect(sweep: Sweep, dest: str | Path, only: dict | None = None, allow_dirty: bool = False) -> list[Path]:
    """Publish the valid results of finished runs (and of the init run they start from) to `dest`,
    each with the paper's number of its reproduction in `reference` (targets.yaml beside the sweep
    file); print ours against the paper and, per method, the mean and spread over the grid. A result
    already in `dest` (same run id) is left as it is.

    Before anything is copied, what the repository's tests would refuse later is refused here: a result
    made from a dirty tree (or outside a checkout; `allow_dirty` copies it with a warning on stderr), and a
    `dest` that would hold results of more than one commit (a results folder is one commit's runs: collect
    into a folder of its own)."""
    import math

    from dare.results import load_results

    copied, by_target, by_method = [], {}, {}
    sources = ([("init", sweep.init.baseline, None, sweep.init)] if sweep.init else []) + [
        (r.name, r.baseline, r.config, r) for r in sweep.runs if matches(r, only)]
    found = [(name, baseline, config, run, p, read_result(p)) for name, baseline, config, run in sources
             for p in results_of(run)]
    for name, _, _, run, p, res in found:
        check_traceable(p, res, run=f"run {name} of {sweep.path}", copied="collected (--allow-dirty)",
                        refuse=None if allow_dirty else f"commit, delete {run.dir} and run the sweep again from the "
                        f"clean tree (or pass --allow-dirty; the tests refuse it under leaderboard/results/)")
    present = {(r.run_id, path.name): r.provenance.git_commit for path, r in
               load_results(dest, pattern="*/result_*.json")[0]} if Path(dest).is_dir() else {}
    commits: dict[str | None, list[str]] = {}
    for commit in present.values():
        commits.setdefault(commit, []).append("already there")
    for *_, p, res in found:
        if (res.run_id, p.name) not in present:
            commits.setdefault(res.provenance.git_commit, []).append("from this sweep")
    if len(commits) > 1:
        shown = "; ".join(f"{(c or 'no commit')[:7]}: "
                          + ", ".join(f"{where.count(w)} {w}" for w in dict.fromkeys(where))
                          for c, where in commits.items())
        starts = {res.provenance.git_commit for _, _, _, run, _, res in found if run is sweep.init}
        others = {res.provenance.git_commit for _, _, _, run, _, res in found if run is not sweep.init}
        hint = ""
        if len(others) == 1 and starts and starts != others and not present:  # only the start is of another commit
            hint = (f"; only the start was evaluated at another commit ({', '.join(c[:7] for c in starts if c)}): "
                    f"from a clean checkout of {next(iter(others))[:7]}, move {sweep.init.dir / 'eval'} aside and run "
                    f"`python -m dare.app.sweep {sweep.path} init` (its training is reused; the evaluation takes "
                    f"seconds), then collect again")
        raise UserError(f"{dest}: would hold results of {len(commits)} commits ({shown}); a results folder holds "
                        f"one commit's runs: collect into a folder of its own (--to), or delete {sweep.out} and run the "
                        f"sweep again from one commit{hint}")
    for *_, p, res in found:  # every file `publish` would read or write checked before the first copy
        publish_destination(p, res, dest)
    for _, baseline, config, run, p, res in found:
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
