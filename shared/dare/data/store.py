"""Building and loading task splits as parquet files under `data/<task>/<split>.parquet`."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from dare.data.schema import DataError, _row_problem, _schema, split_path
from dare.data.tasks import TASKS
from dare.utils import atomic_write, sha256_file


HASHES = Path(__file__).with_name("hashes.json")


def recorded_hashes() -> dict[str, str]:
    """sha256 of every offline-buildable split as built by this code ("task/split" -> hex)."""
    return json.loads(HASHES.read_text()) if HASHES.is_file() else {}


def build(task: str, split: str, root: Path | None = None, source: Path | None = None) -> Path:
    """Build a split (generated, from `source`, or downloaded) and write it atomically; the same
    input gives the same bytes, so the DVC hash of `data/` is reproducible."""
    return atomic_write(split_path(task, split, root), encode(task, split, source))


def encode(task: str, split: str, source: Path | None = None) -> bytes:
    """The parquet bytes of a split as this code builds it. They also depend on the pyarrow that
    writes them (its version is in the file's footer): the recorded hashes hold for the pinned one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = TASKS[task].build(split, source)
    table = pa.Table.from_pylist([
        {"index": i, "task": task, "split": split, "prompt": r["prompt"], "ground_truth": r["ground_truth"],
         "extra": json.dumps(r.get("extra", {}), sort_keys=True)}
        for i, r in enumerate(rows)], schema=_schema())
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=False)
    return buf.getvalue()


def stale(task: str, split: str, path: Path) -> bool:
    """A split that only code builds (offline, no original files to build it from instead) whose
    bytes differ from its recorded sha256 and from what this code builds here. The second check
    keeps a file this code wrote with another pyarrow (whose footer differs, so its sha256 does)
    from being rebuilt at every load."""
    t, recorded = TASKS[task], recorded_hashes().get(f"{task}/{split}")
    only_code = t.offline and not (getattr(t, "files", None) or {}).get(split)
    return bool(only_code and recorded and sha256_file(path) != recorded
                and path.read_bytes() != encode(task, split))


def how_to_get(task: str) -> str:
    """The one line that says how to get a missing split (docs/concepts/data.md): offline tasks rebuild from
    code; the others come from their original files, the hub, or a lab's own DVC remote (the project
    has none)."""
    if task in TASKS and TASKS[task].offline:
        return f"run `dare data build {task}` (rebuilt from code, byte-identical)"
    return (f"run `dare data build {task} --from <folder>` (or without --from where the Hugging Face hub is "
            f"reachable), or `dvc remote add -d lab <url>` then `dvc pull` from your lab's remote (docs/concepts/data.md)")


def load_split(task: str, split: str, root: Path | None = None, *, build_missing: bool = True) -> list[dict]:
    """Rows of a split as dicts (with `extra` decoded), validated against the schema."""
    import pyarrow.parquet as pq

    path = split_path(task, split, root)
    if not path.is_file():
        if not build_missing:
            raise DataError(f"{path}: missing; {how_to_get(task)}")
        build(task, split, root)
    elif stale(task, split, path):  # built by another version of the task's code (a parquet file
        if not build_missing:       # does not name its version): rebuild it from this code
            raise DataError(f"{path}: built by another version of {task!r} (sha256 differs from the recorded "
                            f"one); {how_to_get(task)}")
        print(f"[data] {path}: built by another version of {task!r}; rebuilding", file=sys.stderr, flush=True)
        build(task, split, root)
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise DataError(f"{path}: not a readable parquet file ({e})") from None
    want = _schema()
    for f in want:
        if f.name not in table.column_names:
            raise DataError(f"{path}: missing column {f.name!r}")
        if not table.schema.field(f.name).type.equals(f.type):
            raise DataError(f"{path}: column {f.name!r} has type {table.schema.field(f.name).type}, expected {f.type}")
    rows = table.to_pylist()
    for i, row in enumerate(rows):
        problem = _row_problem(row, i, task, split)
        if problem:
            field, why = problem
            raise DataError(f"{path}: row {i}: field {field!r} {why}")
    return rows


