"""Countdown and 4x4 Sudoku rewards (d1 / TinyZero, `dllm_rm` in DARE).

Countdown: the last `<answer>` (or `\\boxed{}`) expression must use each given number exactly
once and evaluate to the target (|value - target| < 1e-5): 1.0; a well-formed answer that is
wrong, uses other numbers or cannot be evaluated: 0.1; no answer: 0.0. Expressions are
evaluated by walking the Python AST of `+ - * /`, parentheses, unary minus and integer
literals only: never `eval` of model text; huge intermediate values are refused.

Sudoku: the digits of the last `<answer>` (non-digits dropped, padded with 0 or cut to 16) are
compared with the solution on the puzzle's empty cells: the reward and the papers' metric is
the fraction of empty cells filled correctly; `solved` is whole-puzzle accuracy.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction

from dare.rewards.math import answer_tag, last_boxed

VERSION = 1
FORMAT_SCORE = 0.1
_LIMIT = 10 ** 12  # refuse intermediate values beyond this (no 9**9**9)


class _Unsafe(ValueError):
    pass


def safe_arithmetic(expr: str) -> Fraction:
    """Exact value of an arithmetic expression (+ - * / parentheses, integers); raises ValueError."""
    if len(expr) > 200:
        raise _Unsafe("expression too long")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise _Unsafe(f"not an expression: {e.msg}") from None

    def ev(node) -> Fraction:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div):
                if b == 0:
                    raise _Unsafe("division by zero")
                v = a / b
            else:
                v = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}[type(node.op)]
            if abs(v) > _LIMIT:
                raise _Unsafe("value too large")
            return v
        raise _Unsafe(f"{type(node).__name__} is not allowed")

    return ev(tree)


def countdown_answer(text: str) -> str | None:
    tag = answer_tag(text)
    if tag is not None:
        inner = last_boxed(tag)
        tag = inner if inner is not None else tag
        return tag.split("=")[0].strip()  # "2*4-3 = 5" -> "2*4-3"
    boxed = last_boxed(text)
    return boxed.split("=")[0].strip() if boxed is not None else None


def countdown_reward(completion: str, numbers: list[int], target: int) -> float:
    return countdown_expression_reward(countdown_answer(completion), numbers, target)


def countdown_expression_reward(expr: str | None, numbers: list[int], target: int) -> float:
    """The papers' rule on an extracted expression: 1.0 right, 0.1 well-formed but wrong, 0.0 none."""
    if expr is None:
        return 0.0
    used = [int(n) for n in re.findall(r"\d+", expr)]
    if Counter(used) != Counter(int(n) for n in numbers):
        return FORMAT_SCORE
    try:
        value = safe_arithmetic(expr)
    except ValueError:
        return FORMAT_SCORE
    return 1.0 if abs(float(value) - target) < 1e-5 else FORMAT_SCORE


def sudoku_digits(text: str) -> str:
    """16 digits from the last `<answer>` (or the whole text without one), zero-padded or cut."""
    tag = answer_tag(text)
    digits = re.sub(r"\D", "", text if tag is None else tag)
    return (digits + "0" * 16)[:16]


def sudoku_scores(completion: str, puzzle: str, solution: str) -> dict[str, float]:
    """`cell_accuracy`: fraction of the puzzle's empty cells (0) filled correctly; `solved`: 1.0
    when every empty cell is right. Also the counts, so a corpus metric sums them."""
    got = sudoku_digits(completion)
    empty = [i for i, c in enumerate(puzzle) if c == "0"]
    right = sum(got[i] == solution[i] for i in empty)
    return {"cell_accuracy": right / len(empty) if empty else 1.0, "solved": float(right == len(empty)),
            "correct_cells": float(right), "empty_cells": float(len(empty))}


def sudoku_reward(completion: str, puzzle: str, solution: str) -> float:
    return sudoku_scores(completion, puzzle, solution)["cell_accuracy"]


def sudoku_fill_scores(completion: str, answer: str) -> dict[str, float]:
    """The fill-in form of the Sudoku metric (the tiny task `sudoku_fill`): `answer` is the digits of
    the puzzle's empty cells in reading order; the completion's digits (non-digits dropped, cut or
    padded to the answer's length) are compared position by position. `cell_accuracy` is the
    fraction right, as `sudoku_scores`' on the full grid; `solved` is 1.0 when all are."""
    got = (re.sub(r"\D", "", completion) + "0" * len(answer))[: len(answer)]
    right = sum(g == a for g, a in zip(got, answer))
    return {"cell_accuracy": right / len(answer) if answer else 1.0, "solved": float(right == len(answer))}
