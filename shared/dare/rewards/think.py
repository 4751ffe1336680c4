"""AGRPO's think/answer rewards (`probablyabot/agrpo` @98f1182, `rewards.py`), for the `*_think` tasks.

Completions are expected as `<think>...</think>` then `<answer>\\boxed{...}</answer>`. Three terms,
summed (at most 4.0):
- think_format: 0.5 when a `<think>...</think>` pair occurs anywhere (case-insensitive);
- answer_format: 0.5 when an `<answer>...</answer>` pair occurs anywhere;
- correctness: 3.0 when math-verify finds the answer equal to the reference. The answer is the FIRST
  `<answer>` block's content (the whole completion without one), then the first `\\boxed{}` inside it
  when there is one; both sides are parsed as `$...$` LaTeX, so a bare number in running text counts
  too ("the result is 9" against 9).

Evaluation grades GSM8K differently (`eval.py` grade_completion): the same answer text, cut to its FIRST
run of digits (so `1,250` reads 1, `-5` reads 5 and `2.5` reads 2), then math-verify against the reference
as written after "####": `gsm8k_graded`.
"""

from __future__ import annotations

import re

from dare.rewards.math import verified

VERSION = 1

THINK = re.compile(r"<think>\s*(.*?)\s*</think>", re.S | re.I)
ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S | re.I)


def first_boxed(text: str) -> str | None:
    """Content of the first `\\boxed{...}` (braces balanced), or None when absent or unclosed."""
    m = re.search(r"\\boxed\{", text)
    if m is None:
        return None
    depth = 1
    for j in range(m.end(), len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[m.end():j]
    return None


def final_answer(completion: str) -> str:
    tag = ANSWER.search(completion)
    text = tag.group(1).strip() if tag else completion
    return first_boxed(text) or text  # an empty or unclosed box: the text itself, as the reference


def correct(completion: str, truth: str) -> bool:
    """The reward's correctness: the answer text against the reference, both as `$...$` LaTeX."""
    return verified(f"${truth}$", f"${final_answer(completion)}$")


def gsm8k_graded(completion: str, truth: str) -> bool:
    """AGRPO's GSM8K evaluation: the answer text's first run of digits against the reference."""
    answer = final_answer(completion)
    digits = re.search(r"\d+", answer)
    return verified(f"${truth}$", f"${digits.group(0) if digits else answer}$")


def terms(completion: str, truth: str) -> dict[str, float]:
    return {"think_format": 0.5 * bool(THINK.search(completion)),
            "answer_format": 0.5 * bool(ANSWER.search(completion)),
            "correctness": 3.0 * correct(completion, truth)}
