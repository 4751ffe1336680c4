"""AGRPO's think/answer rewards (`probablyabot/agrpo` @98f1182, `rewards.py`), for the `*_think` tasks.

Completions are expected as `<think>...</think>` then `<answer>\\boxed{...}</answer>`. Three terms,
summed (at most 4.0):
- think_format: 0.5 when a `<think>...</think>` pair occurs anywhere (case-insensitive);
- answer_format: 0.5 when an `<answer>...</answer>` pair occurs anywhere;
- correctness: 3.0 when math-verify finds the answer equal to the reference. The answer is the FIRST
  `<answer>` block's content (the whole completion without one), then the first `\\boxed{}` inside it
  when there is one; both sides are parsed as `$...$` LaTeX, so a bare number in running text counts
  too ("the result is 9" against 9).
"""

from __future__ import annotations

import re
import threading

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
    from math_verify import parse, verify

    timeout = 5 if threading.current_thread() is threading.main_thread() else None  # SIGALRM: main thread only
    gold = parse(f"${truth}$", parsing_timeout=timeout)
    pred = parse(f"${final_answer(completion)}$", parsing_timeout=timeout)
    return bool(verify(gold, pred, timeout_seconds=timeout))


def terms(completion: str, truth: str) -> dict[str, float]:
    return {"think_format": 0.5 * bool(THINK.search(completion)),
            "answer_format": 0.5 * bool(ANSWER.search(completion)),
            "correctness": 3.0 * correct(completion, truth)}
