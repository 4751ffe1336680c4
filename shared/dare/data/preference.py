"""UltraFeedback preference pairs (VRPO / DPO): prompt, chosen and rejected responses.

Source: `HuggingFaceH4/ultrafeedback_binarized` (`train_prefs` / `test_prefs` parquet, columns
prompt, prompt_id, chosen, rejected (message lists), score_chosen, score_rejected), from the hub
or `--from <folder>`. Rows keep the pair in `extra` (`chosen`, `rejected`: the assistant texts);
`ground_truth` is the chosen response, which is also the SFT target.
"""

from __future__ import annotations

from dare.data.base import Task


def _assistant_text(messages) -> str:
    if isinstance(messages, str):
        return messages
    return next(m["content"] for m in reversed(list(messages)) if m["role"] == "assistant")


class UltraFeedback(Task):
    name = "ultrafeedback"
    splits = ("train", "test")
    version = "p1"
    files = {"train": ["train_prefs-00000-of-00001.parquet", "train_prefs.parquet", "train_prefs.jsonl"],
             "test": ["test_prefs-00000-of-00001.parquet", "test_prefs.parquet", "test_prefs.jsonl"]}
    hub = {"train": ("HuggingFaceH4/ultrafeedback_binarized", "data/train_prefs-*.parquet"),
           "test": ("HuggingFaceH4/ultrafeedback_binarized", "data/test_prefs-*.parquet")}

    def convert(self, record: dict, split: str) -> dict | None:
        chosen, rejected = _assistant_text(record["chosen"]), _assistant_text(record["rejected"])
        if not record["prompt"] or chosen == rejected:
            return None
        extra = {"chosen": chosen, "rejected": rejected}
        for k in ("prompt_id", "score_chosen", "score_rejected"):
            if k in record:
                extra[k] = record[k]
        return {"prompt": [{"role": "user", "content": record["prompt"]}], "ground_truth": chosen, "extra": extra}

    def score(self, completion: str, row: dict) -> dict[str, float]:
        raise NotImplementedError("ultrafeedback holds preference pairs; evaluate a preference-tuned model on "
                                  "the benchmark tasks instead")
