"""The task registry: name -> task object (see `dare.data` for the task interface)."""

from __future__ import annotations

from dare.data.code import MBPP, HumanEval
from dare.data.mathtasks import GSM8K, MATH, MATH500, S1K, GSM8KB1, GSM8KThink
from dare.data.preference import UltraFeedback
from dare.data.puzzles import Countdown, Sudoku
from dare.data.synthetic import (Addition, AdditionPreference, AdditionTeacher, Chain, SudokuFill,
                                 SudokuFillTeacher)

TASKS = {
    "addition": Addition(digits=2, n_test=500),
    "addition_pairs": AdditionPreference(digits=2, n_test=500),
    "addition_teacher": AdditionTeacher(digits=2, n_test=500, forget=0.8),
    "chain": Chain(counts=(17, 26), n_train=20000, n_test=500),
    "sudoku_fill": SudokuFill(blanks=4, n_train=50000, n_test=500),
    "sudoku_fill_teacher": SudokuFillTeacher(blanks=4, n_train=50000, n_test=500, ascending=0.6),
    "gsm8k": GSM8K(),
    "gsm8k_think": GSM8KThink(),
    "gsm8k_b1": GSM8KB1(),
    "math": MATH(),
    "math500": MATH500(),
    "countdown": Countdown(n_numbers=3),
    "countdown4": Countdown(n_numbers=4),
    "sudoku": Sudoku(),
    "humaneval": HumanEval(),
    "mbpp": MBPP(),
    "ultrafeedback": UltraFeedback(),
    "s1k": S1K(),
}
