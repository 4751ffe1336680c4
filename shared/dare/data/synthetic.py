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
    """The addition prompts with SFT demonstrations from a flawed teacher: the teacher adds digit by
    digit and forgets each carry with probability `forget` (drawn once per training row, fixed seed),
    as a weaker model's distilled answers would be wrong in one systematic way. `ground_truth` stays
    the correct sum (rewards and evaluation score against it); only the SFT target (`target`) is the
    teacher's. With forget > 0.5 a model that imitates the teacher answers carry problems wrongly at
    temperature 0 but correctly at temperature 1 with probability about (1 - forget) per carry: the
    case RL with a verifiable reward is for (the demo). Same train/test split as `addition`."""

    name = "addition_teacher"

    def __init__(self, digits: int, n_test: int, forget: float):
        super().__init__(digits, n_test)
        self.forget = forget
        self.version = f"{self.version}.t{forget}"

    def generate(self, split: str) -> list[dict]:
        rng = random.Random(self.seed + 3)
        rows = super().generate(split)
        if split == "train":
            for row in rows:
                row["extra"]["demonstration"] = str(self.teach(row["extra"]["a"], row["extra"]["b"], rng))
        return rows

    def teach(self, a: int, b: int, rng: random.Random) -> int:
        total, carry, place = 0, 0, 1
        for _ in range(self.digits):
            s = a % 10 + b % 10 + carry
            total += (s % 10) * place
            carry = int(s >= 10 and rng.random() >= self.forget)
            a, b, place = a // 10, b // 10, place * 10
        return total + carry * place

    def target(self, row: dict) -> str:
        return row["extra"]["demonstration"]
