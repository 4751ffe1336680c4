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



def lsb(n: int, width: int) -> str:
    """`n` written least significant digit first, zero-padded to `width` digits."""
    return str(n).zfill(width)[::-1]


def chain_trace(start: int, count: int, digits: int = 4) -> str:
    """The answer of `chain`: `count` terms after `start`, each the one before plus its own last digit
    plus 1, modulo 10^digits, written `<letter><digits, least significant first>,` with the letters
    counting down to `a` (the last term)."""
    out, value = [], start
    for k in range(count, 0, -1):
        value = (value + value % 10 + 1) % 10 ** digits
        out.append(f"{chr(ord('a') + k - 1)}{lsb(value, digits)},")
    return "".join(out)


def trace_scores(completion: str, ground_truth: str) -> dict[str, float]:
    """`accuracy`: the whole trace is right (every term, nothing after the last); `term_accuracy`:
    the share of the ground truth's terms (comma-terminated) written right at their place.
    Surrounding whitespace is ignored."""
    text = completion.strip()
    want, got = ground_truth.split(","), text.split(",")
    right = sum(w == g for w, g in zip(want[:-1], got))
    return {"accuracy": float(text == ground_truth), "term_accuracy": right / (len(want) - 1)}
