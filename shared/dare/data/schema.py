"""The data folder's layout and its one parquet schema: where a split lives
(`data/<task>/<split>.parquet`), its columns, and the row check that names file, row and field."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dare.utils import UserError


class DataError(UserError, ValueError):
    """A data file that does not follow the schema; the message names file, row and field."""


def data_dir() -> Path:
    """`$DARE_DATA`, else `data/` in the working directory (in the checkout: tracked by `data.dvc`)."""
    return Path(os.environ.get("DARE_DATA") or Path.cwd() / "data")


def split_path(task: str, split: str, root: Path | None = None) -> Path:
    return (root or data_dir()) / task / f"{split}.parquet"


def _schema():
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    return pa.schema([
        ("index", pa.int64()), ("task", pa.string()), ("split", pa.string()),
        ("prompt", pa.list_(message)), ("ground_truth", pa.string()), ("extra", pa.string()),
    ])


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
