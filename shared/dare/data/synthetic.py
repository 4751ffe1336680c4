"""Synthetic tasks that are generated offline with a fixed seed (no download), for the demo
and the tests. Generation uses Python's `random.Random(seed)`, whose sequence is stable across
Python versions and platforms, so the parquet bytes are reproducible."""

from __future__ import annotations

import random

from dare.data.base import Task
from dare.rewards import arithmetic


class Addition(Task):
    """`a+b=` -> `a+b` with a, b uniform in [0, 10^digits). The test split is a fixed random
    sample of n_test pairs; the train split is every other pair (disjoint from test)."""

    name = "addition"
    splits = ("train", "test")
    offline = True
    seed = 1234

    def __init__(self, digits: int, n_test: int):
        self.digits, self.n_test = digits, n_test
        self.version = f"d{digits}.n{n_test}.r{arithmetic.VERSION}.1"
        self.alphabet = "0123456789+="

    def generate(self, split: str) -> list[dict]:
        n = 10 ** self.digits
        pairs = [(a, b) for a in range(n) for b in range(n)]
        random.Random(self.seed).shuffle(pairs)
        chosen = pairs[: self.n_test] if split == "test" else sorted(pairs[self.n_test:])
        if split == "train":
            random.Random(self.seed + 1).shuffle(chosen)
        return [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "ground_truth": str(a + b),
                 "extra": {"a": a, "b": b}} for a, b in chosen]

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        return arithmetic.exact_match(completion, row["ground_truth"])

    def score(self, completion: str, row: dict) -> dict[str, float]:
        return {"accuracy": arithmetic.exact_match(completion, row["ground_truth"])}


class AdditionPreference(Addition):
    """Preference pairs on the addition prompts, for the preference recipe on tiny models:
    chosen = the correct sum, rejected = a near miss (off by 1, 2 or 10, never negative). Same
    train/test split as `addition`."""

    name = "addition_pairs"

    def __init__(self, digits: int, n_test: int):
        super().__init__(digits, n_test)
        self.version = f"{self.version}.p1"

    def generate(self, split: str) -> list[dict]:
        rng = random.Random(self.seed + 2 + (split == "test"))
        rows = []
        for row in super().generate(split):
            right = int(row["ground_truth"])
            wrong = right + rng.choice([d for d in (-10, -2, -1, 1, 2, 10) if right + d >= 0])
            rows.append({**row, "extra": {**row["extra"], "chosen": str(right), "rejected": str(wrong)}})
        return rows


class AdditionTeacher(Addition):
    """The addition prompts with SFT demonstrations from a flawed teacher: the teacher adds correctly
    except for the carry into the highest column, which it forgets with probability `forget` (drawn
    once per training row, fixed seed), writing 0 there: 57+68 -> 025 instead of 125. Its answer
    keeps the correct sum's length and every other digit, so the flaw is one token on the problems
    whose sum has digits + 1 digits (about half of them). `ground_truth` stays the correct sum
    (rewards and evaluation score against it); only the SFT target (`target`) is the teacher's.

    With forget > 0.5 a model that imitates the teacher writes 0 there at temperature 0 (greedy
    accuracy: the share of sums below 10^digits, once the other digits are learned) but 1 with
    probability about 1 - forget when it samples: the case RL with a verifiable reward is for (the
    demo). A teacher whose slips change the answer's length instead (dropping the digit, or forgetting
    lower carries) shifts every later digit, and the demo's tiny model then does not learn the sums
    in its budget. Same train/test split as `addition`."""

    name = "addition_teacher"

    def __init__(self, digits: int, n_test: int, forget: float):
        super().__init__(digits, n_test)
        self.forget = forget
        self.version = f"{self.version}.top{forget}"

    def generate(self, split: str) -> list[dict]:
        rng = random.Random(self.seed + 3)
        rows = super().generate(split)
        if split == "train":
            for row in rows:
                row["extra"]["demonstration"] = self.teach(row["extra"]["a"], row["extra"]["b"], rng)
        return rows

    def teach(self, a: int, b: int, rng: random.Random) -> str:
        total = str(a + b)
        if a + b >= 10 ** self.digits and rng.random() < self.forget:
            return "0" + total[1:]  # the carry into the top column forgotten: 0 written in its place
        return total

    def target(self, row: dict) -> str:
        return row["extra"]["demonstration"]
