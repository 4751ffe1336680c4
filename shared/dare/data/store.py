"""Building and loading task splits as parquet files under `data/<task>/<split>.parquet`."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from dare.utils import REPO_ROOT, UserError, atomic_write


class DataError(UserError, ValueError):
    """A data file that does not follow the schema; the message names file, row and field."""


def data_dir() -> Path:
    """`$DARE_DATA`, else `data/` in the checkout (tracked by `data.dvc`)."""
    return Path(os.environ.get("DARE_DATA", REPO_ROOT / "data"))


def split_path(task: str, split: str, root: Path | None = None) -> Path:
    return (root or data_dir()) / task / f"{split}.parquet"


def _schema():
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    return pa.schema([
        ("index", pa.int64()), ("task", pa.string()), ("split", pa.string()),
        ("prompt", pa.list_(message)), ("ground_truth", pa.string()), ("extra", pa.string()),
    ])


HASHES = Path(__file__).with_name("hashes.json")


def recorded_hashes() -> dict[str, str]:
    """sha256 of every offline-buildable split as built by this code ("task/split" -> hex)."""
    return json.loads(HASHES.read_text()) if HASHES.is_file() else {}


def build(task: str, split: str, root: Path | None = None, source: Path | None = None) -> Path:
    """Build a split (generated, from `source`, or downloaded) and write it atomically; the same
    input gives the same bytes, so the DVC hash of `data/` is reproducible."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dare.data import TASKS

    rows = TASKS[task].build(split, source)
    table = pa.Table.from_pylist([
        {"index": i, "task": task, "split": split, "prompt": r["prompt"], "ground_truth": r["ground_truth"],
         "extra": json.dumps(r.get("extra", {}), sort_keys=True)}
        for i, r in enumerate(rows)], schema=_schema())
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=False)
    return atomic_write(split_path(task, split, root), buf.getvalue())


def load_split(task: str, split: str, root: Path | None = None, *, build_missing: bool = True) -> list[dict]:
    """Rows of a split as dicts (with `extra` decoded), validated against the schema."""
    import pyarrow.parquet as pq

    path = split_path(task, split, root)
    if not path.is_file():
        if not build_missing:
            raise DataError(f"{path}: missing; run `dare data build {task}` or `dvc pull`")
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


def _row_problem(row: dict, i: int, task: str, split: str) -> tuple[str, str] | None:
    """(field, what is wrong) for a row that breaks the schema; decodes `extra` in place."""
    if row["index"] != i:
        return "index", f"is {row['index']}, expected {i}"
    if row["task"] != task or row["split"] != split:
        return "task", f"says {row['task']}/{row['split']}, expected {task}/{split}"
    if not row["prompt"] or any(not m or m["role"] is None or m["content"] is None for m in row["prompt"]):
        return "prompt", "must be a non-empty list of {role, content} messages"
    if row["ground_truth"] is None:
        return "ground_truth", "is null"
    try:
        row["extra"] = json.loads(row["extra"]) if row["extra"] else {}
    except json.JSONDecodeError as e:
        return "extra", f"is not JSON ({e})"
    return None
