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


# d1's GSM8K terms, transcribed from running d1's own functions (dllm-reasoning/d1@837888f
# diffu-grpo/reward_func.py: xmlcount, soft_format, strict_format, int, correctness_reward_func)
# on these completions and ground truths.
D1_GSM8K = [
    ("<reasoning>\nStep one.\nStep two.\n</reasoning>\n<answer>\n72\n</answer>\n", "72",
     {"xmlcount": 0.5, "soft_format": 0.0, "strict_format": 0.0, "int": 0.5, "correctness": 2.0}),  # multi-line: 3.0
    ("<reasoning>\n9 + 9 = 18\n</reasoning>\n<answer>\n18\n</answer>\n", "18",
     {"xmlcount": 0.5, "soft_format": 0.0, "strict_format": 0.5, "int": 0.5, "correctness": 2.0}),  # soft never fires here
    ("<reasoning>\n9 + 9 = 18\n</reasoning>\n<answer>\n18\n</answer>", "18",
     {"xmlcount": 0.444, "soft_format": 0.0, "strict_format": 0.0, "int": 0.5, "correctness": 2.0}),  # no final newline
    ("72", "72", {"xmlcount": 0.0, "soft_format": 0.0, "strict_format": 0.0, "int": 0.5, "correctness": 2.0}),
    ("The answer is 72", "72",
     {"xmlcount": 0.0, "soft_format": 0.0, "strict_format": 0.0, "int": 0.0, "correctness": 0.0}),
    ("<reasoning>9+9</reasoning> <answer>18</answer> trailing", "18",
     {"xmlcount": 0.0, "soft_format": 0.5, "strict_format": 0.0, "int": 0.5, "correctness": 2.0}),
    ("<reasoning>\nx\n</reasoning>\n<answer>\n1000\n</answer>\n", "1,000",
     {"xmlcount": 0.5, "soft_format": 0.0, "strict_format": 0.5, "int": 0.5, "correctness": 0.0}),  # commas kept
    ("<reasoning>\nx\n</reasoning>\n<answer>\n1,000\n</answer>\n", "1,000",
     {"xmlcount": 0.5, "soft_format": 0.0, "strict_format": 0.5, "int": 0.0, "correctness": 2.0}),
    ("<answer>3</answer><answer>4</answer>", "4",
     {"xmlcount": 0.0, "soft_format": 0.0, "strict_format": 0.0, "int": 0.5, "correctness": 2.0}),
    ("<answer>\n-5\n</answer>\n", "-5",
     {"xmlcount": 0.125, "soft_format": 0.0, "strict_format": 0.0, "int": 0.0, "correctness": 2.0}),
    ("<reasoning>\na\n</reasoning>\n<answer>\n7\n</answer>\n\nextra text", "7",
     {"xmlcount": 0.478, "soft_format": 0.0, "strict_format": 0.0, "int": 0.5, "correctness": 2.0}),
]


@pytest.mark.parametrize("completion, truth, expected", D1_GSM8K, ids=range(len(D1_GSM8K)))
def test_d1_gsm8k_terms_equal_d1s_own_functions(completion, truth, expected):
    terms = formats.gsm8k_d1(completion, truth)
    assert terms == pytest.approx(expected)


def test_gsm8k_d1_format_reward_uses_d1s_ground_truth_with_commas():
    from dare.data import TASKS

    row = TASKS["gsm8k"].convert({"question": "How many?", "answer": "1000 + 250 = 1250\n#### 1,250"}, "train")
    assert row["ground_truth"] == "1250" and row["extra"]["answer"] == "1,250"
    layout = "<reasoning>\nx\n</reasoning>\n<answer>\n{}\n</answer>\n"
    assert TASKS["gsm8k"].reward(layout.format("1,250"), row, style="d1_format") == pytest.approx(3.0)  # not .isdigit()
    assert TASKS["gsm8k"].reward(layout.format("1250"), row, style="d1_format") == pytest.approx(1.5)
    assert TASKS["gsm8k"].reward(layout.format("1250"), row) == 1.0  # the numeric reward: 1,250 = 1250


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


# AGRPO's own reward functions (probablyabot/agrpo @98f1182 rewards.py: thinking_format_reward,
# answer_format_reward, correctness_reward), run on these completions and references in a scratch folder
# with this environment's math-verify: (think, answer, correctness).
AGRPO_GSM8K = [
    ("<think>\n3 + 4 = 7\n</think>\n<answer>\n\\boxed{7}\n</answer>", "7", (0.5, 0.5, 3.0)),
    ("<think>x</think><answer>7</answer>", "7", (0.5, 0.5, 3.0)),
    ("<answer>\\boxed{1,250}</answer>", "1,250", (0.0, 0.5, 3.0)),
    ("<answer>\\boxed{1250}</answer>", "1,250", (0.0, 0.5, 3.0)),
    ("<think>\nwork\n</think>\nThe answer is \\boxed{12}", "12", (0.5, 0.0, 3.0)),  # no tag: the first boxed
    ("<THINK>a</THINK><Answer> 0.5 </Answer>", "1/2", (0.5, 0.5, 3.0)),  # tags case-insensitive
    ("<think>a</think> no answer tag, the result is 9", "9", (0.5, 0.0, 3.0)),  # math-verify finds the number
    ("<answer>\\boxed{\\frac{1}{2}}</answer>", "0.5", (0.0, 0.5, 3.0)),
    ("<answer>\\boxed{3}</answer><answer>\\boxed{4}</answer>", "4", (0.0, 0.5, 0.0)),  # the FIRST answer block
    ("<think>unclosed <answer>5</answer>", "5", (0.0, 0.5, 3.0)),
    ("", "5", (0.0, 0.0, 0.0)),
    ("<answer>\\boxed{-5}</answer>", "-5", (0.0, 0.5, 3.0)),
    ("<think>7</think><answer>8</answer>", "7", (0.5, 0.5, 0.0)),
    ("<answer>\\boxed{7} apples</answer>", "72", (0.0, 0.5, 0.0)),
    ("<answer>\\boxed{} 7</answer>", "7", (0.0, 0.5, 3.0)),  # an empty box: the block's text
    ("<answer>\\boxed{7</answer>", "7", (0.0, 0.5, 0.0)),  # unclosed: the block's text, which math-verify rejects
]


@pytest.mark.parametrize("completion, truth, expected", AGRPO_GSM8K, ids=range(len(AGRPO_GSM8K)))
def test_think_terms_equal_agrpos_own_functions(completion, truth, expected):
    from dare.rewards import think

    terms = think.terms(completion, truth)
    assert (terms["think_format"], terms["answer_format"], terms["correctness"]) == expected


# AGRPO's GSM8K evaluation (probablyabot/agrpo @98f1182, eval.py grade_completion on rewards.py's parse_ans),
# the original function run in a scratch folder on these completions and references: is it graded correct.
AGRPO_GSM8K_EVAL = [
    ("<think>\n3 + 4 = 7\n</think>\n<answer>\n\\boxed{7}\n</answer>", "7", True),
    ("<answer>\\boxed{1,250}</answer>", "1,250", False),  # the first run of digits: 1
    ("<answer>\\boxed{1250}</answer>", "1,250", True),
    ("<answer>\\boxed{1250}</answer>", "1250", True),
    ("<answer>\\boxed{-5}</answer>", "-5", False),  # the sign is dropped
    ("<answer>\\boxed{2.5}</answer>", "2.5", False),  # 2
    ("<think>a</think> no answer tag, the result is 9", "9", True),
    ("<think>7</think><answer>8</answer>", "7", False),
    ("<answer>\\boxed{7} apples</answer>", "7", True),
    ("<answer>\\boxed{} 7</answer>", "7", True),
    ("<answer>x</answer>", "7", False),
    ("", "7", False),
]


@pytest.mark.parametrize("completion, truth, expected", AGRPO_GSM8K_EVAL, ids=range(len(AGRPO_GSM8K_EVAL)))
def test_gsm8k_think_accuracy_equals_agrpos_own_grading(completion, truth, expected):
    from dare.rewards import think

    assert think.gsm8k_graded(completion, truth) is expected


def test_gsm8k_think_row_prompt_reward_and_accuracy():
    from dare.data import TASKS

    task = TASKS["gsm8k_think"]
    row = task.convert({"question": "How many?", "answer": "1000 + 250 = 1250\n#### 1,250"}, "train")
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and row["prompt"][1]["content"] == "How many?"
    assert "<think> tags" in row["prompt"][0]["content"] and "\\boxed{...}" in row["prompt"][0]["content"]
    assert task.reward(task.target(row), row) == 4.0  # the SFT layout earns every term
    assert task.reward("<answer>\\boxed{1250}</answer>", row) == 3.5
    assert task.score("<answer>\\boxed{1250}</answer>", row) == {"accuracy": 1.0}
    assert task.score("<think>1250</think><answer>\\boxed{125}</answer>", row) == {"accuracy": 0.0}
    assert task.score("<answer>\\boxed{1,250}</answer>", row) == {"accuracy": 0.0}  # graded as 1, as eval.py
    assert task.reward("<answer>\\boxed{1,250}</answer>", row) == 3.5  # while the reward's term accepts it
    with pytest.raises(Exception, match="d1_format"):
        task.rewards(["x"], [row], style="d1_format")


def test_gsm8k_b1_is_block_r1s_prompt_with_gsm8ks_answers():
    """b1's GSM8K (`gsm8k_b1`): Block-R1's b1 prompt word for word (YanJiangJerry/Block-R1@fd7a1b8,
    rl/data_utils.py SYSTEM_PROMPT under a b1 trainer type: its sha256, taken from the reference's own string),
    the question after one newline, every reasoning step ending in the `\\block` tag that b1's dynamic blocks end
    a block after; GSM8K's answers, rewards and metrics."""
    import hashlib

    from dare.data import TASKS
    from dare.data.mathtasks import B1_FORMAT

    assert hashlib.sha256(B1_FORMAT.encode()).hexdigest() == \
        "68e8fdd115b6698ece390f9ce94a0b8e1f88cdd5462ed1ef0bc07e21533a1aa9"
    assert "Step 1, ... \\block\n" in B1_FORMAT and "\\\\" not in B1_FORMAT  # one backslash, as the reference's
    task, plain = TASKS["gsm8k_b1"], TASKS["gsm8k"]
    record = {"question": "How many?", "answer": "a = 1\nb = 2\n#### 1250"}
    row = task.convert(record, "train")
    assert row["prompt"] == [{"role": "user", "content": B1_FORMAT + "\nHow many?"}]
    assert {k: row[k] for k in ("ground_truth", "extra")} == {k: plain.convert(record, "train")[k]
                                                              for k in ("ground_truth", "extra")}
    target = task.target(row)
    assert target == "<reasoning>\na = 1 \\block\nb = 2 \\block\n</reasoning>\n<answer>\n1250\n</answer>\n"
    assert task.reward(target, row, "d1_format") == plain.reward(plain.target(row), row, "d1_format")
    assert task.score(target, row) == {"accuracy": 1.0, "accuracy_answer": 1.0}
    assert task.version != plain.version  # its parquet is another file


def test_math_b1_is_block_r1s_prompt_and_reward():
    """b1's MATH (`math_b1`): GSM8K's b1 prompt (Block-R1@fd7a1b8 rl/data_utils.py: MATH_SYSTEM_PROMPT =
    GSM_SYSTEM_PROMPT = SYSTEM_PROMPT under a b1 trainer type, pinned above), the problem after one newline
    (get_math_questions); reward style `b1`: rl/reward_func.py correctness_reward_func_math (2.0 when the answer
    block, not a \\boxed{}, is equivalent) + boxed_and_answer_tags_format_reward (d1's format term)."""
    import hashlib

    from dare.data import TASKS
    from dare.data.mathtasks import B1_FORMAT

    assert hashlib.sha256(B1_FORMAT.encode()).hexdigest() == \
        "68e8fdd115b6698ece390f9ce94a0b8e1f88cdd5462ed1ef0bc07e21533a1aa9"
    task, plain = TASKS["math_b1"], TASKS["math"]
    record = {"problem": "Half of 1?", "solution": "One half.\nIt is $\\boxed{\\frac{1}{2}}$.", "level": "Level 1",
              "type": "Algebra"}
    row = task.convert(record, "train")
    assert row["prompt"] == [{"role": "user", "content": B1_FORMAT + "\nHalf of 1?"}]
    assert {k: row[k] for k in ("ground_truth", "extra")} == {k: plain.convert(record, "train")[k]
                                                              for k in ("ground_truth", "extra")}
    assert task.convert({"problem": "x", "solution": "none"}, "train") is None  # MATH's rule: no boxed answer
    target = task.target(row)
    assert target.startswith("<reasoning>\nOne half. \\block\n") and "<answer>\n\\frac{1}{2}\n</answer>" in target
    # the reference's terms: 2.0 + 0.5 * (answer block 1 + no \boxed in it 0.5)
    assert task.reward(target, row, "b1") == pytest.approx(2.75)
    # a \boxed{} in the block: math-verify reads it (the reference's is_equiv keeps the \boxed: 0 correctness there)
    assert task.reward("<answer>\n\\boxed{\\frac{1}{2}}\n</answer>", row, "b1") == pytest.approx(3.0)
    assert task.reward("<answer>\n0.3\n</answer>", row, "b1") == pytest.approx(0.75)
    assert task.reward("1/2", row, "b1") == pytest.approx(2.25)  # no block: the whole text is the answer
    bare = "<answer>\n\\frac{1}{2}\n</answer>"  # the answer b1's prompt asks for: d1's terms read a \boxed{} only
    assert task.reward(bare, row, "d1_format") == plain.reward(bare, row, "d1_format") == pytest.approx(0.75)
    assert task.reward(bare, row, "b1") == pytest.approx(2.75)
    assert task.score(target, row) == {"accuracy": 1.0} == task.score("\\boxed{1/2}", row)
    assert task.version != plain.version and "b1" in task.reward_styles and "b1" not in plain.reward_styles


def test_countdown_b1_is_block_r1s_prompt_and_reward():
    """b1's Countdown (`countdown_b1`): Block-R1's CTD_SYSTEM_PROMPT under a b1 trainer type word for word
    (YanJiangJerry/Block-R1@fd7a1b8 rl/data_utils.py; its sha256 from the reference's own string), then the
    input line of get_countdown_questions; the reward is rl/reward_func.py countdown_reward_func (the last answer
    block as written: 1.0 / 0.1 / 0)."""
    import hashlib

    from dare.data import TASKS
    from dare.data.puzzles import B1_COUNTDOWN_FORMAT

    assert hashlib.sha256(B1_COUNTDOWN_FORMAT.encode()).hexdigest() == \
        "8a68e4aeda65fa673a0184bb9e4bb1936212a19704cdccebde6dd3ffb1bd2b92"
    assert "Step 1, ... \\block\n" in B1_COUNTDOWN_FORMAT and "\\\\" not in B1_COUNTDOWN_FORMAT
    assert "<answer>\n2*4-3\n</answer>\"\n" in B1_COUNTDOWN_FORMAT  # the reference's newlines and stray quote
    task, plain = TASKS["countdown_b1"], TASKS["countdown"]
    assert not task.offline and task.splits == plain.splits
    row = task.convert({"nums": [30, 100, 93], "target": 23}, "train")
    assert row["prompt"] == [{"role": "user", "content": B1_COUNTDOWN_FORMAT + "\nThe provided input list is "
                              "[30, 100, 93] and the target number is 23.\nPlease solve it according to the strict "
                              "constraints above."}]
    assert {k: row[k] for k in ("ground_truth", "extra")} == {
        k: plain.convert({"nums": [30, 100, 93], "target": 23}, "train")[k] for k in ("ground_truth", "extra")}
    assert task.convert({"input": "30,100,93", "output": "23"}, "test")["extra"] == row["extra"]  # d1's test jsonl
    assert task.convert({"nums": [1, 2, 3, 4], "target": 10}, "train") is None  # 3 numbers, as the reference
    assert task.reward("<answer>\n30 - (100 - 93)\n</answer>", row) == 1.0
    assert task.reward("<answer>30 - (100 - 93) = 23</answer>", row) == 0.1  # "23" is a number it does not have
    assert task.reward("<answer>\\boxed{30 - (100 - 93)}</answer>", row) == 0.1  # not the allowed characters
    assert task.reward("\\boxed{30 - (100 - 93)}", row) == 0.0  # no answer block
    assert plain.reward("<answer>30 - (100 - 93) = 23</answer>", row) == 1.0  # where Countdown's reward differs
    assert task.score("<answer>30-(100-93)</answer>", row) == {"accuracy": 1.0}
    assert task.version != plain.version


def test_sudoku_b1_is_block_r1s_prompt_and_reward():
    """b1's Sudoku (`sudoku_b1`): Block-R1's SUDOKU_SYSTEM_PROMPT under a b1 trainer type word for word
    (YanJiangJerry/Block-R1@fd7a1b8 rl/data_utils.py; its sha256 from the reference's own string), then the puzzle
    line of get_sudoku_questions; the reward is rl/reward_func.py sudoku_reward_func (the empty cells right in the
    digits of the last answer block; 0 without one)."""
    import hashlib

    from dare.data import TASKS
    from dare.data.puzzles import B1_SUDOKU_FORMAT

    assert hashlib.sha256(B1_SUDOKU_FORMAT.encode()).hexdigest() == \
        "ebfde8ea87a051f7cbfdf2c519f4d0473ec7a9938acd69209070526bd145c6dc"
    assert "Step 1, ... \\block\n" in B1_SUDOKU_FORMAT and "\\\\" not in B1_SUDOKU_FORMAT
    task, plain = TASKS["sudoku_b1"], TASKS["sudoku"]
    assert not task.offline and task.splits == plain.splits
    record = {"Puzzle": "3014002020004130", "Solution": "3214142323414132"}
    row = task.convert(record, "test")
    assert row["prompt"] == [{"role": "user", "content": B1_SUDOKU_FORMAT +
                              "\nSolve the following Sudoku puzzle: 3014002020004130\n"}]
    assert {k: row[k] for k in ("ground_truth", "extra")} == {k: plain.convert(record, "test")[k]
                                                              for k in ("ground_truth", "extra")}
    assert task.reward(task.target(row), row) == 1.0
    assert task.reward("<answer>\n3214 1423 2341 4132\n</answer>", row) == 1.0
    assert task.reward("3214142323414132", row) == 0.0 and plain.reward("3214142323414132", row) == 1.0
    assert task.reward("<answer>3014002020004130</answer>", row) == 0.0
    assert task.score(task.target(row), row) == plain.score(task.target(row), row)
    assert task.version != plain.version
