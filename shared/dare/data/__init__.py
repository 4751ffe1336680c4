"""Tasks and the one parquet schema every baseline trains and evaluates on.

`TASKS` is an explicit dict: name -> task object (`dare.data.base.Task`) with
    splits        the split names it provides
    version       bumped with any change to data, prompt or reward (recorded in results)
    offline       True when `build` needs no download (generated, or shipped by a package)
    build(split, source=None)   the rows of a split: generated, read from `source` (original
                  files, `dare data build --from`), or downloaded from the hub when reachable
    target(row)   the supervised response text (SFT)
    reward(completion, row, style) -> float     RL reward from `dare.rewards` (`rewards` batched)
    score(completion, row) -> dict              evaluation metrics per sample (`scores` batched)
    alphabet      characters a from-scratch character tokenizer needs (synthetic tasks)

Parquet schema (one row per example; `load_split` validates it and names file, row and field):
    index         int64    position in the split, 0..n-1
    task          string   task name
    split         string   split name
    prompt        list<struct<role: string, content: string>>   chat messages
    ground_truth  string   the reference answer the reward compares against
    extra         string   JSON object of task-specific fields
"""

from __future__ import annotations

from dare.data.schema import DataError, data_dir, split_path
from dare.data.store import build, load_split, recorded_hashes
from dare.data.tasks import TASKS

__all__ = ["TASKS", "DataError", "build", "data_dir", "load_split", "recorded_hashes", "split_path"]
