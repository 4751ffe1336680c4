"""Where raw task data comes from: local files in the original formats (`--from PATH`), or the
Hugging Face hub when it is reachable. Both give plain dict records to a task's `convert`.

Readers: `.jsonl` / `.json` (a list, or {"data": [...]}), `.jsonl.gz`, `.parquet`, `.csv`. A
`--from` folder is searched for the file names the task expects (its `files[split]`).
"""

from __future__ import annotations

import csv
import gzip
import json
import socket
from pathlib import Path

from dare.data.schema import DataError


def read_records(path: Path) -> list[dict]:
    """Records of one file in any supported format, in file order."""
    name = path.name.lower()
    try:
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        if name.endswith(".csv"):
            with open(path, newline="", encoding="utf-8") as f:
                return list(csv.DictReader(f))
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            if ".jsonl" in name:
                return [json.loads(line) for line in f if line.strip()]
            data = json.load(f)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a list of records")
    return data


def find_file(source: Path, candidates: list[str], task: str, split: str) -> Path:
    """`source` itself if it is a file, else the first of `candidates` inside the folder."""
    if source.is_file():
        return source
    for name in candidates:
        if (source / name).is_file():
            return source / name
    raise DataError(f"{task}/{split}: none of {candidates} in {source} (give the folder holding the original files, "
                    f"or the file itself)")


def hub_reachable(timeout: float = 3.0) -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def hub_file(repo: str, pattern: str, task: str) -> Path:
    """The dataset file of `repo` matching the glob `pattern`, downloaded from the Hugging Face hub
    (cached by huggingface_hub), or a clear error saying what to do instead."""
    if not hub_reachable():
        raise DataError(
            f"{task}: the Hugging Face hub is not reachable, so {repo} ({pattern}) cannot be downloaded. Either "
            f"`dvc pull` the preprocessed data (see docs/concepts/data.md), or download the original files elsewhere and "
            f"run `dare data build {task} --from <folder>`.")
    import fnmatch

    from huggingface_hub import HfApi, hf_hub_download

    names = sorted(f for f in HfApi().list_repo_files(repo, repo_type="dataset") if fnmatch.fnmatch(f, pattern))
    if len(names) != 1:
        raise DataError(f"{task}: {repo} has {len(names)} files matching {pattern!r} ({names[:5]}); expected one")
    return Path(hf_hub_download(repo, names[0], repo_type="dataset"))
