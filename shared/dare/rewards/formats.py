"""d1's format-shaped rewards (`d1:diffu-grpo/reward_func.py`, summed with weight 1.0 each),
as an option next to the plain correctness rewards. Completions are expected as

    <reasoning>
    ...
    </reasoning>
    <answer>
    ...
    </answer>

GSM8K (Unsloth recipe, maximum 4.0): xmlcount (+0.125 per correctly placed tag line, minus
0.001 per character after `</answer>`), soft format (+0.5), strict format (+0.5), integer answer
(+0.5), correctness (+2.0 on exact string match of the `<answer>` content).
MATH (maximum 3.0): correctness (+2.0 when the last `\\boxed{}` is equivalent to the reference)
plus format 0.5 x [(1 if an `<answer>` block exists) + (1.0 if `\\boxed` is inside it (inside the
whole completion when there is none), else 0.5)]: 1.0 / 0.75 / 0.5 / 0.25 as wd1 B.2 states.

Deviation, listed in the baselines that use it: d1's MATH format check tests the Python string
`"\\boxed"` in which `\\b` is a backspace escape, so it never matches and every answer block
scores 0.75; we test the literal `\\boxed` as the paper describes (wd1 B.2: 1.0/0.75/0.5/0.25).
"""

from __future__ import annotations

import re

from dare.rewards.math import answer_tag, equivalent, last_boxed

VERSION = 1

_SOFT = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", re.S)
_STRICT = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n?$", re.S)


def xmlcount(text: str) -> float:
    score = 0.0
    if text.count("<reasoning>\n") == 1:
        score += 0.125
    if text.count("\n</reasoning>\n") == 1:
        score += 0.125
    if text.count("\n<answer>\n") == 1:
        score += 0.125
        score -= len(text.split("\n</answer>\n")[-1]) * 0.001
    if text.count("\n</answer>") == 1:
        score += 0.125
        score -= (len(text.split("\n</answer>")[-1]) - 1) * 0.001
    return score


def soft_format(text: str) -> float:
    return 0.5 if _SOFT.search(text) else 0.0


def strict_format(text: str) -> float:
    return 0.5 if _STRICT.match(text) else 0.0


def int_answer(text: str) -> float:
    answer = answer_tag(text)
    return 0.5 if answer is not None and answer.isdigit() else 0.0


def gsm8k_d1(completion: str, ground_truth: str) -> dict[str, float]:
    """The five d1 GSM8K terms; the reward is their sum."""
    answer = answer_tag(completion)
    return {"xmlcount": xmlcount(completion), "soft_format": soft_format(completion),
            "strict_format": strict_format(completion), "int": int_answer(completion),
            "correctness": 2.0 if answer is not None and answer == ground_truth.strip() else 0.0}


def math_d1(completion: str, ground_truth: str) -> dict[str, float]:
    """d1's MATH terms: correctness (2.0) and format (up to 1.0)."""
    boxed = last_boxed(completion)
    correct = 2.0 if boxed is not None and equivalent(boxed, ground_truth) else 0.0
    answer = answer_tag(completion)
    segment = completion if answer is None else answer
    fmt = 0.5 * ((1.0 if answer is not None else 0.0) + (1.0 if "\\boxed" in segment else 0.5))
    return {"correctness": correct, "format": fmt}
