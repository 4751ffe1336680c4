"""Math answers: extraction (last `\\boxed{}`, `<answer>` tags, last number) and equivalence.

- `last_boxed(text)`: the content of the last `\\boxed{...}` / `\\fbox{...}`, with nested braces
  balanced (`\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`); None when absent or unbalanced.
- `equivalent(answer, truth)`: math-verify (sympy-backed: `1/2` == `0.5` == `\\frac12`, sets,
  intervals, units stripped), after an exact-string fast path.
- GSM8K: `gsm8k_answer(text)` reads `\\boxed{}` first, then the `<answer>` tag, then the last
  number in the text (d1's parse order); numbers compare as exact fractions after removing
  thousands separators, `$` and trailing units/punctuation (`1,234.50` == `1234.5`).

Rewards (binary 1.0 / 0.0): `math_reward` (MATH, MATH500: math-verify on the last boxed answer),
`gsm8k_reward` (numeric). The d1 format-shaped rewards are in `dare.rewards.formats`.
"""

from __future__ import annotations

import re
from fractions import Fraction

VERSION = 1

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_NUMBER = re.compile(r"-?\$?\s*\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (braces balanced), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth, i = 1, start
        while i < len(text):
            c = text[i]
            if c == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
                i += 2  # an escaped brace does not count
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
            i += 1
    return None


def answer_tag(text: str) -> str | None:
    """Content of the last `<answer>...</answer>`, stripped, or None."""
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else None


def to_fraction(text: str) -> Fraction | None:
    """A plain number (`-1,234.5`, `$12`, `3/4`, `50%` is not a number) as an exact fraction."""
    t = text.strip().replace("$", "").replace(",", "").replace("\\!", "").rstrip(".")
    t = re.sub(r"^\\text\{(.*)\}$", r"\1", t).strip()
    if not re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)(/\d+)?", t):
        return None
    try:
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1].replace(" ", "") if found else None


def gsm8k_answer(text: str) -> str | None:
    """d1's order: a numeric `\\boxed{}`, else the `<answer>` content, else the last number."""
    boxed = last_boxed(text)
    if boxed is not None and to_fraction(boxed) is not None:
        return boxed
    tag = answer_tag(text)
    if tag is not None:
        return last_number(tag) or tag
    return last_number(text)


def gsm8k_opencompass(completion: str, ground_truth: str) -> float:
    """OpenCompass' GSM8K accuracy (`gsm8k_postprocess` + `Gsm8kEvaluator`): the last number of
    the text before any "Question:", equal to the reference as written or as a float within 1e-6
    of the integer reference. Evaluation uses it so both engines agree; RL rewards keep d1's parser."""
    numbers = re.findall(r"\-?\d+\.\d+|\-?\d+", completion.split("Question:")[0])
    if not numbers:
        return 0.0
    pred = numbers[-1]
    try:
        return 1.0 if pred == ground_truth or abs(float(pred) - int(ground_truth)) < 1e-6 else 0.0
    except ValueError:
        return 0.0


def gsm8k_reward(completion: str, ground_truth: str) -> float:
    answer = gsm8k_answer(completion)
    if answer is None:
        return 0.0
    a, b = to_fraction(answer), to_fraction(ground_truth)
    return 1.0 if a is not None and a == b else 0.0


def equivalent(answer: str, truth: str, timeout_seconds: int | None = 5) -> bool:
    """Mathematical equivalence of two LaTeX answers through math-verify (exact match first)."""
    if answer.strip() == truth.strip():
        return True
    return verified(f"\\boxed{{{truth}}}", f"\\boxed{{{answer}}}", timeout_seconds)


def verified(gold_latex: str, answer_latex: str, timeout_seconds: int | None = 5) -> bool:
    """math-verify's parse of both texts, then its verify (gold first). Its timeout uses SIGALRM, which
    only the main thread may set: in other threads it is off (`dare.rewards.score_batch` bounds time
    with worker processes)."""
    import threading

    from math_verify import parse, verify

    if threading.current_thread() is not threading.main_thread():
        timeout_seconds = None
    gold = parse(gold_latex, parsing_timeout=timeout_seconds)
    pred = parse(answer_latex, parsing_timeout=timeout_seconds)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout_seconds))


def math_reward(completion: str, ground_truth: str, timeout_seconds: int | None = 5) -> float:
    """1.0 when the last `\\boxed{}` of the completion equals the reference answer."""
    answer = last_boxed(completion)
    if answer is None:
        return 0.0
    return 1.0 if equivalent(answer, ground_truth, timeout_seconds) else 0.0
