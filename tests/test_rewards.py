"""Answer parsers and rewards: cases that trip naive code, d1's format rewards, countdown's safe
evaluator, sudoku's metric."""

import pytest

from dare.rewards import formats, puzzles
from dare.rewards import math as mathr


@pytest.mark.parametrize("text, want", [
    ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("\\boxed{\\left\\{1, 2\\right\\}} then", "\\left\\{1, 2\\right\\}"),  # escaped braces inside
    ("first \\boxed{3} then \\boxed{\\sqrt{\\frac{a}{b}}}", "\\sqrt{\\frac{a}{b}}"),  # the last one, nested
    ("\\fbox{42}", "42"),
    ("\\boxed {7}", "7"),
    ("no box here", None),
    ("\\boxed{unbalanced", None),
])
def test_last_boxed_balances_nested_braces(text, want):
    assert mathr.last_boxed(text) == want


@pytest.mark.parametrize("answer, truth, same", [
    ("1/2", "0.5", True),
    ("\\frac{1}{2}", "0.5", True),
    ("\\dfrac{3}{4}", "\\frac{3}{4}", True),
    ("2\\sqrt{3}", "\\sqrt{12}", True),
    ("(1, 2]", "(1,2]", True),
    ("x^2+2x+1", "(x+1)^2", True),
    ("1,000", "1000", True),
    ("7", "8", False),
    ("\\pi", "3.14", False),
])
def test_math_equivalence_through_math_verify(answer, truth, same):
    assert mathr.equivalent(answer, truth) is same


def test_math_reward_reads_the_last_boxed_answer():
    assert mathr.math_reward("try \\boxed{3}, no wait: \\boxed{\\frac{6}{4}}", "1.5") == 1.0
    assert mathr.math_reward("The answer is 1.5", "1.5") == 0.0  # no boxed answer
    assert mathr.math_reward("\\boxed{3}", "1.5") == 0.0


@pytest.mark.parametrize("completion, truth, reward", [
    ("... so she pays $1,234.", "1234", 1.0),  # thousands separator and $
    ("The total is 18 dollars. Check: 9 + 9 = 18", "18", 1.0),  # trailing text: the last number
    ("<answer>\n72\n</answer> and later 5 more words 3", "72", 1.0),  # the answer tag wins over later numbers
    ("\\boxed{0.50}", ".5", 1.0),
    ("\\boxed{1/2}", "0.5", 1.0),
    ("\\boxed{12} <answer>13</answer>", "12", 1.0),  # a numeric boxed answer first (d1's order)
    ("It is 3.", "4", 0.0),
    ("no number at all", "4", 0.0),
    ("-5 degrees", "-5", 1.0),
])
def test_gsm8k_numeric_answers(completion, truth, reward):
    assert mathr.gsm8k_reward(completion, truth) == reward


def test_d1_gsm8k_terms_add_up_to_four_for_a_perfect_answer():
    perfect = "<reasoning>\n9 + 9 = 18\n</reasoning>\n<answer>\n18\n</answer>\n"
    terms = formats.gsm8k_d1(perfect, "18")
    assert terms == {"xmlcount": 0.5, "soft_format": 0.5, "strict_format": 0.5, "int": 0.5, "correctness": 2.0}
    sloppy = "<reasoning>9+9</reasoning> <answer>18</answer> trailing"
    t = formats.gsm8k_d1(sloppy, "18")
    assert t["soft_format"] == 0.5 and t["strict_format"] == 0.0 and t["correctness"] == 2.0
    assert t["xmlcount"] == 0.0  # no tag on its own line
    # 10 characters after the answer cost 0.001 each in both closing-tag terms (d1's formula)
    assert formats.gsm8k_d1(perfect + "x" * 10, "18")["xmlcount"] == pytest.approx(0.5 - 0.02)


def test_d1_math_format_levels():
    boxed_in_answer = "<answer>\\boxed{2}</answer>"
    assert formats.math_d1(boxed_in_answer, "2") == {"correctness": 2.0, "format": 1.0}
    assert formats.math_d1("<answer>2</answer>", "2")["format"] == 0.75
    assert formats.math_d1("\\boxed{2}", "2")["format"] == 0.5
    assert formats.math_d1("2", "2") == {"correctness": 0.0, "format": 0.25}


def test_countdown_reward_levels_and_number_use():
    nums, target = [2, 3, 4], 5
    assert puzzles.countdown_reward("<answer>\n2*4-3\n</answer>", nums, target) == 1.0
    assert puzzles.countdown_reward("<answer>(4 - 2) * 3 - 1</answer>", nums, target) == 0.1  # an extra number
    assert puzzles.countdown_reward("<answer>2*4</answer>", nums, target) == 0.1  # 3 unused
    assert puzzles.countdown_reward("<answer>2+3+4</answer>", nums, target) == 0.1  # wrong value
    assert puzzles.countdown_reward("<answer>2*4-3 = 5</answer>", nums, target) == 1.0  # "= target" tolerated
    assert puzzles.countdown_reward("2*4-3", nums, target) == 0.0  # no answer
    assert puzzles.countdown_reward("<answer>\\boxed{(3*4)/2 - 4 + 3}</answer>", [3, 4, 2, 4, 3], 5) == 1.0
    assert puzzles.countdown_reward("<answer>4/(3-3)*2</answer>", [4, 3, 3, 2], 1) == 0.1  # division by zero


@pytest.mark.parametrize("expr", [
    "__import__('os').system('echo pwned')", "2**100000", "(lambda: 1)()", "open('/etc/passwd')",
    "[1,2][0]", "2 if 1 else 3", "9" * 300, "1e308*10", "2.5*2",
])
def test_countdown_evaluator_refuses_anything_but_integer_arithmetic(expr):
    with pytest.raises(ValueError):
        puzzles.safe_arithmetic(expr)


def test_countdown_evaluator_is_exact():
    assert puzzles.safe_arithmetic("(1/3)*3") == 1
    assert puzzles.safe_arithmetic("-(2-5)*4") == 12


def test_sudoku_cell_accuracy_and_whole_puzzle():
    puzzle, solution = "3014002020004130", "3214142323414132"
    assert puzzles.sudoku_scores(f"<answer>\n{solution}\n</answer>", puzzle, solution) == {
        "cell_accuracy": 1.0, "solved": 1.0, "correct_cells": 8.0, "empty_cells": 8.0}
    one_wrong = solution[:1] + "1" + solution[2:]  # cell 1 is empty in the puzzle
    s = puzzles.sudoku_scores(f"<answer>{one_wrong}</answer>", puzzle, solution)
    assert s["cell_accuracy"] == pytest.approx(7 / 8) and s["solved"] == 0.0
    spaced = " ".join(solution[i:i + 4] for i in range(0, 16, 4))  # separators are dropped
    assert puzzles.sudoku_reward(f"<answer>{spaced}</answer>", puzzle, solution) == 1.0
    # "32" is padded with zeros: only empty cell 1 gets a digit, and it is right
    assert puzzles.sudoku_reward("<answer>32</answer>", puzzle, solution) == pytest.approx(1 / 8)
