"""The task registry: name -> task object (see `dare.data` for the task interface)."""

from __future__ import annotations

from dare.data.code import MBPP, HumanEval
from dare.data.mathtasks import GSM8K, MATH, MATH500, S1K, GSM8KB1, GSM8KThink, MATHB1
from dare.data.preference import UltraFeedback
from dare.data.puzzles import Countdown, CountdownB1, Sudoku, SudokuB1
from dare.data.synthetic import (Addition, AdditionPreference, AdditionTeacher, Chain, ChainCarry,
                                 ChainCarryTeacher, CountdownTiny, CountdownTinyPairs, CountdownTinyTeacher,
                                 SudokuFill, SudokuFillTeacher)

TASKS = {
    "addition": Addition(digits=2, n_test=500),
    "addition_pairs": AdditionPreference(digits=2, n_test=500),
    "addition_teacher": AdditionTeacher(digits=2, n_test=500, forget=0.8),
    "chain": Chain(counts=(17, 26), n_train=20000, n_test=500),
    "sudoku_fill": SudokuFill(blanks=4, n_train=50000, n_test=500),
    "sudoku_fill_teacher": SudokuFillTeacher(blanks=4, n_train=50000, n_test=500, ascending=0.6),
    # the headline suite (reproductions/suite/): long answers, harder constraints, search
    "chain_carry": ChainCarry(counts=(6, 7), n_train=50000, n_test=500),
    "chain_carry_teacher": ChainCarryTeacher(counts=(6, 7), n_train=50000, n_test=500, forget=0.8),
    "sudoku_hard": SudokuFill(blanks=8, n_train=50000, n_test=500, name="sudoku_hard"),
    "sudoku_hard_teacher": SudokuFillTeacher(blanks=8, n_train=50000, n_test=500, ascending=0.6,
                                             name="sudoku_hard_teacher"),
    "countdown_tiny": CountdownTiny(n_numbers=3, n_train=50000, n_test=500),
    "countdown_tiny_teacher": CountdownTinyTeacher(n_numbers=3, n_train=50000, n_test=500, slip=0.7),
    "countdown_tiny_pairs": CountdownTinyPairs(n_numbers=3, n_train=50000, n_test=500),
    "gsm8k": GSM8K(),
    "gsm8k_think": GSM8KThink(),
    "gsm8k_b1": GSM8KB1(),
    "math": MATH(),
    "math500": MATH500(),
    "math_b1": MATHB1(),
    "countdown": Countdown(n_numbers=3),
    "countdown4": Countdown(n_numbers=4),
    "countdown_b1": CountdownB1(),
    "sudoku": Sudoku(),
    "sudoku_b1": SudokuB1(),
    "humaneval": HumanEval(),
    "mbpp": MBPP(),
    "ultrafeedback": UltraFeedback(),
    "s1k": S1K(),
}
