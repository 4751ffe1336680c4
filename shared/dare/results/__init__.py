"""Result JSON, schema version 3 (versions 1 and 2 still load): one file per (run x benchmark), validated on write and on load.

Fields (all required unless marked optional):
    schema_version  "1"
    run_id          "<baseline>__<model>__<benchmark>__s<seed>__<run key[:8]>-<eval hash[:8]>"; the run
                    key hashes the training config and the checkpoint it started from
    created_at      ISO-8601 UTC
    method          baseline name, variant, paper id, and what it started from (`init`)
    model           name, family, revision, kind (masked | block), dtype, parameter count
    benchmark       name, split, version (task + parser version), n_shot, sample counts
                    (original size of the split, effective number evaluated)
    decoding        sampler, gen_length, block_length, steps, remasking, temperature, cfg_scale,
                    threshold (optional), extra (optional dict of sampler-specific settings)
    metrics         list of {name, value, count, sum, sum_sq, stderr, higher_is_better}; `value`
                    must equal sum / count, so means, stderr and seed spread can be recomputed
    reference       optional: the paper's value, its source, and whether the decoding matches
    training        optional (absent for an untrained base model): seed, steps, config hash,
                    recipe hash (the config hash without the seed: seeds of one recipe share it),
                    the hashed config itself, data identity (task, split, version, sha256), wall
                    time, the run it started from, the training command, and (v3, RL runs) the compute
                    it spent: rollout tokens, forward passes (NFE) of rollout and training, the tokens
                    the updates trained on, wall time
    throughput      evaluation samples/s; tokens/s of responses (up to and including EOS);
                    forward passes (NFE) per sample; positions committed per forward pass
    provenance      git commit and dirty flag, package versions, hardware fingerprint (CPU model,
                    the ISA torch dispatches to, threads, BLAS; GPU, capability, driver, CUDA,
                    cuDNN, NCCL; deterministic flags), the environment's lock file and its hash,
                    the command line
    artifacts       optional: per-sample outputs file and its sha256, resolved config path; a
                    published copy keeps the first 64 samples and records the whole file's line
                    count and sha256 (the whole file stays in the run folder)

The writer is atomic; `load_results` never raises on a bad file, it reports (file, reason). A results
folder may be a shared or downloaded one, so every reader here is guarded (`load_json`): only regular
files of at most `MAX_FILE_BYTES`, nested at most `MAX_DEPTH` deep, numbers finite and within
`MAX_NUMBER`, strings without control or format characters (bidi overrides, zero-width).
This module imports no torch: the leaderboard uses it directly.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
import unicodedata
from itertools import accumulate
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dare.utils import atomic_write

SCHEMA_VERSION = "3"
READABLE_VERSIONS = ("1", "2", "3")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, protected_namespaces=())


ROLLOUT_BENCHMARK = "rollout:"
"""The start of `method.variant` in a result `dare bench rollout` wrote (`rollout:<strategy>`): a benchmark of the
decoding, not of a training method (the leaderboard shows it in the Speed tab only)."""


class Method(_Strict):
    baseline: str
    variant: str | None = None
    """A variant of the method; `rollout:<strategy>` (`ROLLOUT_BENCHMARK`) for a benchmark of the rollout."""
    paper: str | None = None
    """arXiv id or URL of the method's paper."""
    init: str | None = None
    """What training started from: `scratch`, a baseline name (e.g. `sft`), or `pretrained`."""


class ModelInfo(_Strict):
    name: str
    family: str
    revision: str | None = None
    kind: Literal["masked", "block"]
    dtype: str
    n_params: int = Field(ge=0)


class SampleCounts(_Strict):
    original: int = Field(ge=0)
    effective: int = Field(ge=0)


class Benchmark(_Strict):
    name: str
    split: str
    version: str
    n_shot: int = Field(default=0, ge=0)
    n_samples: SampleCounts


class Decoding(_Strict):
    sampler: str
    gen_length: int = Field(gt=0)
    block_length: int = Field(gt=0)
    steps: int = Field(gt=0)
    remasking: str
    temperature: float = Field(ge=0)
    cfg_scale: float = Field(default=0.0, ge=0)
    threshold: float | None = None
    extra: dict[str, str | int | float | bool | None] = Field(default_factory=dict)


class Metric(_Strict):
    name: str
    value: float
    count: int = Field(gt=0)
    sum: float
    sum_sq: float | None = None
    stderr: float | None = Field(default=None, ge=0)
    higher_is_better: bool = True

    @model_validator(mode="after")
    def _consistent(self):
        if not math.isclose(self.value, self.sum / self.count, rel_tol=1e-9, abs_tol=1e-12):
            raise ValueError(f"metric {self.name!r}: value {self.value} != sum / count = {self.sum / self.count}")
        return self


class Reference(_Strict):
    value: float
    source: str
    same_decoding: bool | None = None


class DataInfo(_Strict):
    task: str
    split: str
    version: str
    sha256: str


class Compute(_Strict):
    """What a training run spent (v3; RL runs), totals over the run and all processes, so methods can be
    compared at equal compute as well as at equal steps. A forward pass is counted per sequence (a forward
    over a batch of B rows counts B; the dLLM papers' NFE per sample, summed over samples); compute spent
    on steps a guard rolled back is included."""

    rollout_tokens: int = Field(ge=0)
    """Completion positions decoded (rows x gen_length per rollout)."""
    rollout_forwards: int = Field(ge=0)
    """Sequence forward passes of the rollouts (cached steps count as forwards too)."""
    train_forwards: int = Field(ge=0)
    """Sequence forward passes of the log-prob passes and updates (policy, reference and value model;
    backward passes and gradient-checkpointing recomputation are not counted)."""
    update_tokens: int = Field(ge=0)
    """Loss tokens times the updates that trained on them (trainable-token updates)."""
    wall_time_s: float = Field(ge=0)


class Training(_Strict):
    seed: int
    steps: int = Field(ge=0)
    config_hash: str
    config_path: str | None = None
    data: DataInfo | None = None
    wall_time_s: float = Field(ge=0)
    init_config_hash: str | None = None
    """Config hash of the run whose checkpoint this one started from (e.g. the SFT run for d1)."""
    recipe_hash: str | None = None
    """Config hash without `run.seed`: runs that differ only by seed share it (v2)."""
    config: dict | None = None
    """The hashed fields of the resolved training config (v2), to say how two recipes differ."""
    command: str | None = None
    """The training command (v2)."""
    compute: Compute | None = None
    """The compute the run spent (v3; RL runs)."""
    checkpoint: str | None = None
    """The evaluated checkpoint's fingerprint (`dare.models.checkpoint_fingerprint`; v3, 2026-11-27 on): two runs
    of one config (a start retrained) are told apart by it."""
    init_checkpoint: str | None = None
    """The fingerprint of the checkpoint this run started from (its run.json's `init_fingerprint`): the start
    result it is compared with is the one whose `checkpoint` this is."""


class Throughput(_Strict):
    eval_samples_per_s: float | None = Field(default=None, ge=0)
    eval_tokens_per_s: float | None = Field(default=None, ge=0)
    nfe_per_sample: float | None = Field(default=None, ge=0)
    tokens_per_forward: float | None = Field(default=None, ge=0)


class Hardware(_Strict):
    cpu: str
    n_cpus: int = Field(ge=0)
    gpu: str | None = None
    n_gpus: int = Field(default=0, ge=0)
    nodes: int = Field(default=1, ge=1)
    cpu_model: str | None = None
    cpu_capability: str | None = None
    """The instruction set torch dispatches its CPU kernels to (AVX2, AVX512, ...)."""
    threads: int | None = None
    blas: str | None = None
    deterministic: bool | None = None
    gpu_capability: str | None = None
    driver: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    cudnn_deterministic: bool | None = None
    cudnn_benchmark: bool | None = None
    nccl: str | None = None

    def hardware_class(self) -> str:
        """What decides float rounding: the accelerator (name, capability) or the CPU model and the
        kernels' instruction set; used to mark comparisons across machines."""
        if self.gpu:
            return f"{self.gpu} (sm {self.gpu_capability or '?'})"
        return f"{self.cpu_model or self.cpu} ({self.cpu_capability or '?'})"


class Lock(_Strict):
    lock: str
    sha256: str


class Provenance(_Strict):
    git_commit: str | None
    git_dirty: bool | None
    packages: dict[str, str]
    hardware: Hardware
    command: str | None = None
    lock: Lock | None = None
    """The lock file the environment was installed from (v2; None: installed otherwise)."""


class Artifacts(_Strict):
    samples: str | None = None
    samples_sha256: str | None = None
    """The sha256 of the samples file beside the result."""
    samples_total: int | None = Field(default=None, ge=0)
    """When that file is an excerpt (a published result keeps the first `PUBLISHED_SAMPLES`): the
    number of samples in the whole file; None: the file is whole."""
    samples_total_sha256: str | None = None
    """The whole file's sha256 (it stays in the run folder), when the file here is an excerpt."""
    config: str | None = None


class Result(_Strict):
    schema_version: Literal["1", "2", "3"]
    run_id: str
    created_at: str
    method: Method
    model: ModelInfo
    benchmark: Benchmark
    decoding: Decoding
    metrics: list[Metric] = Field(min_length=1)
    reference: Reference | None = None
    training: Training | None = None
    throughput: Throughput
    provenance: Provenance
    artifacts: Artifacts = Field(default_factory=Artifacts)

    def metric(self, name: str) -> Metric:
        for m in self.metrics:
            if m.name == name:
                return m
        raise KeyError(f"{self.run_id}: no metric {name!r}")


def metric_from_values(name: str, values: list[float], higher_is_better: bool = True) -> Metric:
    """Sufficient statistics of per-sample values, with the standard error of their mean."""
    n = len(values)
    total = float(sum(values))
    sum_sq = float(sum(v * v for v in values))
    mean = total / n
    var = max(0.0, sum_sq / n - mean * mean) * n / (n - 1) if n > 1 else 0.0
    return Metric(name=name, value=mean, count=n, sum=total, sum_sq=sum_sq, stderr=math.sqrt(var / n),
                  higher_is_better=higher_is_better)


def write_result(result: Result | dict, path: str | Path) -> Path:
    """Validate, then write atomically (a reader never sees a partial file). What `read_result` would
    refuse (`load_json`'s guards) is not written either: ValueError naming the file and the field."""
    if isinstance(result, dict):
        result = Result.model_validate(result)
    text = result.model_dump_json(indent=2) + "\n"
    size = len(text.encode())
    try:
        if size > MAX_FILE_BYTES:
            raise ValueError(f"{size} bytes, over the {MAX_FILE_BYTES // 2**20} MiB cap")
        checked_json(text)
    except ValueError as e:
        raise ValueError(f"{path}: {e}; not written") from None
    return atomic_write(path, text)


# ---------------------------------------------------------------------------------------------
# Reading files that may be hostile (a shared or downloaded results folder)
# ---------------------------------------------------------------------------------------------

MAX_FILE_BYTES = 4 * 2**20
"""The largest result or bench report read (a result is a few KiB: its samples live beside it)."""
MAX_LOG_BYTES = 64 * 2**20
"""The largest training log (metrics.jsonl) read."""
MAX_DEPTH = 32
"""The deepest nesting of a JSON document read (a result nests 4 levels, its training config a few more)."""
MAX_NUMBER = 1e18
"""The largest magnitude of a number in a result or bench report (sums of squares stay far from overflow)."""
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFDIR: "a folder", stat.S_IFSOCK: "a socket"}


def inside(path: str | Path, folder: str | Path) -> Path:
    """`path` resolved (its symlinks followed), when that stays inside `folder` (resolved too); ValueError
    naming where it leads otherwise: a link out of its folder (to /proc/self/environ, ~/.netrc) is never
    read."""
    try:
        target, root = Path(path).resolve(), Path(folder).resolve()
    except (OSError, RuntimeError, ValueError) as e:  # a symlink loop, a NUL byte
        raise ValueError(f"unreadable: {e}") from None
    if not target.is_relative_to(root):
        raise ValueError(f"a link to {printable(str(target))}, outside {printable(str(root))}: not read")
    return target


def read_bounded(path: str | Path, limit: int = MAX_FILE_BYTES, *, prefix: bool = False,
                 folder: str | Path | None = None) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (symlinks followed; with `folder`, only while they
    stay inside it: `inside`); with `prefix`, the first `limit` bytes of a longer one. ValueError with the
    reason otherwise: a link out of `folder`, a FIFO (which would block), a device such as /dev/zero
    (endless), a folder, a larger file, an unreadable one."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
    if folder is not None:  # the resolved target itself is opened, and must not have become a link since
        path, flags = inside(path, folder), flags | os.O_NOFOLLOW
    try:  # non-blocking, so opening a FIFO returns at once; the checks are on what was opened
        fd = os.open(path, flags)
    except OSError as e:
        raise ValueError(f"unreadable: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"not a regular file ({_KINDS.get(stat.S_IFMT(info.st_mode), 'a special file')})")
        if info.st_size > limit and not prefix:
            raise ValueError(f"{info.st_size} bytes, over the {limit // 2**20} MiB cap")
        data = f.read(limit + 1)
    if len(data) > limit and not prefix:  # it grew while being read
        raise ValueError(f"over the {limit // 2**20} MiB cap")
    return data[:limit]


def parse_json(text: str, *, nan: bool = False):
    """`text` as JSON nested at most `MAX_DEPTH` deep (measured before parsing, so no parser or later
    walk recurses deeper); NaN and Infinity only with `nan` (a training log may log them). ValueError
    otherwise."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if max(accumulate(1 if b in "[{" else -1 for b in brackets), default=0) > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text, parse_constant=None if nan else _reject_constant)
    except ValueError as e:
        raise ValueError(f"not valid JSON: {e}") from None


_STRING = re.compile(r'"(?:[^"\\]|\\.)*+"?', re.DOTALL)
"""A JSON string (an unterminated one runs to the end: one pass, no backtracking)."""
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def check_values(data) -> None:
    """ValueError naming the first field (or key) of a parsed JSON document holding a number that is not
    finite or beyond ±`MAX_NUMBER`, or a string with a control or format character (`unsafe_char`)."""
    for where, value in _nodes(data):
        if where and isinstance(where[-1], str) and unsafe_char(where[-1]):
            problem = f"key has {unsafe_char(where[-1])}"
        elif isinstance(value, str) and unsafe_char(value):
            problem = unsafe_char(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and not abs(value) <= MAX_NUMBER:
            shown = repr(value) if len(repr(value)) <= 24 else f"a {len(repr(value))}-digit number"
            problem = f"{shown} is not a finite number within ±{MAX_NUMBER:g}"
        else:
            continue
        raise ValueError(f"{printable(_dotted(where))}: {problem}")


def load_json(path: str | Path, limit: int = MAX_FILE_BYTES):
    """A JSON file read safely: `read_bounded`, then `checked_json`; ValueError with the reason otherwise."""
    try:
        text = read_bounded(path, limit).decode()
    except UnicodeDecodeError as e:
        raise ValueError(f"unreadable: {e}") from None
    return checked_json(text)


def checked_json(text: str):
    """`parse_json` (no NaN), then `check_values`."""
    data = parse_json(text)
    check_values(data)
    return data


def unsafe_char(text: str) -> str | None:
    """What makes `text` unsafe to show, or None: a control character other than newline and tab, a
    format character (bidi overrides such as U+202E that make `\\u202e1dw` read `wd1`, zero-width
    characters) or a lone surrogate."""
    if text.isprintable():
        return None
    bad = next((c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Cs") and c not in "\n\t"), None)
    return None if bad is None else f"control or format character U+{ord(bad):04X}"


def printable(text: str, limit: int = 200) -> str:
    """`text` with its non-printable characters escaped (`\\u202e`), cut to `limit` characters: for
    showing a file name or a field in a message."""
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return text if len(text) <= limit else text[:limit] + "..."


def _dotted(where: tuple) -> str:
    return ".".join(map(str, where)) or "(top level)"


def _nodes(data):
    """(path, value) of every value of a parsed JSON document, containers included, depth first."""
    stack = [((), data)]
    while stack:
        where, value = stack.pop()
        yield where, value
        if isinstance(value, dict):
            stack += [((*where, k), v) for k, v in reversed(value.items())]
        elif isinstance(value, list):
            stack += [((*where, i), v) for i, v in reversed(list(enumerate(value)))]


def read_result(path: str | Path) -> Result:
    """One result file; raises ValueError with the reason when it is not valid (`load_json`'s guards,
    then the schema)."""
    data = load_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"top level is {type(data).__name__}, expected an object")
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise ValueError(f"schema_version is {version!r}; this reader understands {list(READABLE_VERSIONS)}")
    try:
        return Result.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise ValueError(f"{where}: {first['msg']}{more}") from None


PUBLISHED_SAMPLES = 64
"""Samples a published (committed) result keeps beside it: hundreds of results live in the repository."""


def publish(result_path: str | Path, dest_root: str | Path) -> Path:
    """Copy a valid result, with its config and its first `PUBLISHED_SAMPLES` samples (the result
    records the whole file's count and sha256), to `dest_root/<run_id>/`, run-folder paths in its
    commands and config written as `runs/...` (`portable`); the training run's metrics.jsonl
    (`training_curves`) comes along for the leaderboard's training curves. A result already there (same
    run id: the same training run and the same evaluation) is left as it is, so publishing twice adds
    nothing but the curves an older copy lacks. Every path it would write is checked first: the run id
    must be a plain folder name and each artifact a file inside the result's folder, and every destination
    must stay under `dest_root` (a `UserError` naming the file, the field and the value otherwise)."""
    from dare.utils import sha256_file

    result_path = Path(result_path)
    result = read_result(result_path)
    dest = publish_destination(result_path, result, dest_root)
    existing = dest / result_path.name
    curves = training_curves(result_path)
    if existing.is_file() and existing.resolve() != result_path.resolve():
        try:
            read_result(existing)
            if curves and not (dest / "metrics.jsonl").is_file():  # an older copy gets its curves
                atomic_write(dest / "metrics.jsonl", read_curves(curves))
            return existing
        except ValueError:
            pass  # a broken copy is replaced
    dest.mkdir(parents=True, exist_ok=True)
    art = result.artifacts
    if art.config and (result_path.parent / art.config).is_file():
        atomic_write(dest / art.config, portable((result_path.parent / art.config).read_text()))
    if art.samples and (result_path.parent / art.samples).is_file():
        whole = result_path.parent / art.samples
        lines = whole.read_text().splitlines(keepends=True)
        if len(lines) > PUBLISHED_SAMPLES and art.samples_total is None:
            atomic_write(dest / art.samples, "".join(lines[:PUBLISHED_SAMPLES]))
            result = result.model_copy(update={"artifacts": art.model_copy(update={
                "samples_sha256": sha256_file(dest / art.samples), "samples_total": len(lines),
                "samples_total_sha256": sha256_file(whole)})})
        else:
            shutil.copyfile(whole, dest / art.samples)
    if curves:
        atomic_write(dest / "metrics.jsonl", read_curves(curves))
    write_result(result, dest / result_path.name)
    atomic_write(dest / result_path.name, portable((dest / result_path.name).read_text()))  # its commands
    return dest / result_path.name


def publish_destination(result_path: Path, result: Result, dest_root: str | Path) -> Path:
    """`dest_root/<run_id>`, once every path `publish` reads or writes is known to stay where it belongs:
    the run id is a plain name (no separator, not '.'/'..'), each artifact resolves (symlinks followed)
    to a file inside the result's folder, and each destination resolves inside `dest_root`."""
    from dare.utils import UserError, shown_value

    def refuse(field: str, value, why: str):
        raise UserError(f"{result_path}: {field}={shown_value(value)}: {why}; nothing was published")

    run_id = result.run_id
    if (not run_id or run_id in (".", "..") or "/" in run_id or "\\" in run_id or "\0" in run_id
            or Path(run_id).is_absolute()):
        refuse("run_id", run_id, "not a plain folder name (no '/', '\\', '.' or '..')")
    root = Path(dest_root).resolve()
    dest = root / run_id
    if not dest.resolve().is_relative_to(root):
        refuse("run_id", run_id, f"its folder {dest} resolves outside --to {root}")
    source = result_path.parent.resolve()
    for field in ("config", "samples"):
        name = getattr(result.artifacts, field)
        if not name:
            continue
        if "\0" in name or Path(name).is_absolute() or not (source / name).resolve().is_relative_to(source):
            refuse(f"artifacts.{field}", name, f"not a file inside the result's folder {source}")
        target = (dest / name).resolve()
        if not target.is_relative_to(dest.resolve()) or target == dest.resolve():
            refuse(f"artifacts.{field}", name, f"its copy {dest / name} resolves outside {dest}")
    for name in (result_path.name, "metrics.jsonl"):
        if not (dest / name).resolve().is_relative_to(root):
            refuse("destination", str(dest / name), f"resolves outside --to {root}")
    curves = training_curves(result_path)
    if curves:
        try:
            read_curves(curves)
        except ValueError as e:
            raise UserError(f"{result_path}: its training curves {curves}: {e}; nothing was published") from None
    return Path(dest_root) / run_id


def read_curves(path: Path) -> bytes:
    """A run's metrics.jsonl, to copy: a regular file of at most `MAX_LOG_BYTES`, read only from inside its own
    folder (`read_bounded`); ValueError otherwise. Refused rather than skipped, as an artifact symlinked out
    of the result's folder is: a published result without its curves would look complete."""
    return read_bounded(path, MAX_LOG_BYTES, folder=Path(path).parent)


def training_curves(result_path: Path) -> Path | None:
    """The metrics.jsonl of the training run a result evaluated, where the run folders put it: a `dare
    train` run's `<run>/metrics.jsonl` for results in `<run>/eval/<hash>/`, a sweep run's
    `<run>/train/metrics.jsonl` for results in `<run>/eval/`; None when there is none."""
    folder = Path(result_path).parent
    candidates = []
    if folder.parent.name == "eval":
        candidates.append(folder.parent.parent / "metrics.jsonl")
    if folder.name == "eval":
        candidates.append(folder.parent / "train" / "metrics.jsonl")
    return next((c for c in candidates if c.is_file()), None)


def portable(text: str) -> str:
    """`text` with paths under this machine's runs folder (`$DARE_RUNS`, e.g. /scratch/me/runs/sft/...)
    written as `runs/...`, the folder a default checkout uses: a published result names no machine
    path, and its command reruns from a checkout."""
    from dare.utils import runs_dir

    return text.replace(str(runs_dir().resolve()) + "/", "runs/")


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed in result files")


def load_results(*sources: str | Path, pattern: str = "**/*.json") -> tuple[list[tuple[Path, Result]], list[tuple[Path, str]]]:
    """Every file matching `pattern` under each source folder (or each file given directly).
    Returns ([(path, result)], [(path, reason)]); never raises on a bad file."""
    valid, invalid = [], []
    for source in sources:
        source = Path(source)
        if source.is_dir():
            files = sorted(source.glob(pattern))
        elif source.exists() or source.is_symlink():  # read_result says what it is (a FIFO, a device, a dangling link)
            files = [source]
        else:
            invalid.append((source, "no such file or folder"))
            continue
        for path in files:
            try:
                valid.append((path, read_result(path)))
            except ValueError as e:
                invalid.append((path, str(e)))
    return valid, invalid


__all__ = ["SCHEMA_VERSION", "Result", "Method", "ModelInfo", "Benchmark", "SampleCounts", "Decoding", "Metric",
           "Reference", "Training", "Compute", "DataInfo", "Throughput", "Provenance", "Hardware", "Artifacts",
           "metric_from_values", "write_result", "read_result", "load_results", "publish", "MAX_FILE_BYTES",
           "MAX_LOG_BYTES", "MAX_DEPTH", "MAX_NUMBER", "read_bounded", "parse_json", "check_values", "checked_json",
           "load_json", "unsafe_char", "printable"]
