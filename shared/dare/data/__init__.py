"""Tasks and the one parquet schema every baseline trains and evaluates on.

`TASKS` is an explicit dict: name -> task object with
    splits        the split names it provides
    version       bumped with any change to data, prompt or reward (recorded in results)
    build(split)  the rows of a split (offline-buildable tasks only)
    target(row)   the supervised response text (SFT)
    reward(completion, row) -> float    RL reward, from `dare.rewards`
    score(completion, row) -> dict      evaluation metrics (sufficient statistics: per-sample values)
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

from dare.data.synthetic import Addition

TASKS = {
    "addition": Addition(digits=2, n_test=500),
}

from dare.data.store import build, data_dir, load_split, split_path  # noqa: E402

__all__ = ["TASKS", "build", "data_dir", "load_split", "split_path"]
