"""Exact-match reward for the synthetic arithmetic tasks (the demo's addition)."""

from __future__ import annotations

import re

VERSION = 1
_INTEGER = re.compile(r"-?\d+")


def parse_answer(completion: str) -> str | None:
    """The completion must be exactly an integer (surrounding whitespace allowed)."""
    text = completion.strip()
    return text if _INTEGER.fullmatch(text) else None


def exact_match(completion: str, ground_truth: str) -> float:
    answer = parse_answer(completion)
    return 1.0 if answer is not None and int(answer) == int(ground_truth) else 0.0
