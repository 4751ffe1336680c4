"""Countdown (3 and 4 numbers) and 4x4 Sudoku, generated offline with fixed seeds, with d1's
prompts (d1:diffu-grpo/data_utils.py). Generation uses `random.Random(seed)`, whose sequence is
stable across Python versions, so the parquet bytes are reproducible (hashes in `hashes.json`).

Countdown (TinyZero's generator settings: numbers uniform in [1, 100], target up to 1000): the
numbers are combined in a random order with random operations, keeping every intermediate a
positive integer; the value is the target and the expression is kept as a reference solution.
Test and train are drawn from one stream and never share a (numbers, target) pair. `--from`
reads TinyZero's `Jiayi-Pan/Countdown-Tasks-3to4` parquet (`nums`, `target`) or d1's test jsonl
(`{"input": "30,100,93", "output": "23"}`).

Sudoku 4x4: all 288 solution grids are enumerated; a puzzle removes cells from a random grid in
random order while the solution stays unique, down to 6-11 empty cells. Train and test use
disjoint solution grids (200 / 88), as SPG's split does to avoid d1's train/test leakage.
The distribution of d1's CSV (from an external generator) is not documented; ours is our own.
`--from` reads d1's CSV (`Puzzle`, `Solution`).
"""

from __future__ import annotations

import functools
import itertools
import random

from dare.data.base import REASONING_FORMAT, Task
from dare.rewards import puzzles
from dare.rewards.math import answer_tag

COUNTDOWN_PROMPT = (
    "{fmt}\nUsing only the numbers {nums}, create an arithmetic expression that evaluates to exactly {target}. "
    "You must use all numbers from the list, and each number must be used exactly once. You may use the "
    "operations +, -, *, and / as needed. After reasoning, provide only your final expression inside "
    "<answer></answer> tags without including an equals sign or the target number. For example, if the numbers "
    "are [2, 3, 4] and the target is 5, a valid answer is: <answer>\n2*4-3\n</answer>")

SUDOKU_PROMPT = """
Please solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character string reading left-to-right, top-to-bottom, where '0' represents empty cells.

Rules:
- Fill empty cells with digits 1-4
- Each row must contain digits 1-4 exactly once
- Each column must contain digits 1-4 exactly once
- Each 2x2 box must contain digits 1-4 exactly once

Important: Your solution must be a COMPLETE 16-character string with only the digits 1-4, representing your final solved grid.

Respond in this exact format:
<reasoning>
Your step-by-step solving process
</reasoning>
<answer>
[16-character solution string with no spaces or separators]
</answer>
"""  # noqa: E501  (d1's prompt, verbatim)

# Block-R1's b1 prompts for Countdown and Sudoku (YanJiangJerry/Block-R1@fd7a1b8, rl/data_utils.py, CTD_SYSTEM_PROMPT and
# SUDOKU_SYSTEM_PROMPT under a "b1" trainer type), word for word (sha256 pinned in tests/test_rewards.py): every
# reasoning step ends with the tag \block, the marker b1's dynamic blocks end a block after.
B1_COUNTDOWN_FORMAT = r"""You are a mathematical expert solving Countdown questions.
Your Task: Given a list of numbers and a target integer, construct an arithmetic expression that evaluates exactly to the target.

STRICT CONSTRAINTS ON NUMBER USAGE:
1. **NO EXTERNAL NUMBERS**: You must use ONLY and ALL the numbers provided in the input list. Do not introduce any other integers (e.g., do not use 1 or 2 unless they are explicitly in the provided list).
2. **EXACTLY ONCE**: You must use EACH number from the provided list EXACTLY ONCE. You cannot skip any number, and you cannot reuse any number multiple times.
3. **NO SPACES OR SEPARATORS**: You may use the operations +, -, *, and / as needed. After reasoning, provide only your final expression inside <answer></answer> tags without including an equals sign or the target number. For example, if the numbers are [2, 3, 4] and the target is 5, a valid answer is: <answer>
2*4-3
</answer>"

You should provide clear, logical reasoning step by step. Append the tag \block directly to the end of the last sentence of each reasoning step without starting a new line. Respond exactly in the following format:
<reasoning>
Step 1, ... \block
...
Step n, ... \block
</reasoning>
<answer>
...
</answer>"""  # noqa: E501

B1_SUDOKU_FORMAT = r"""
Please solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character string reading left-to-right, top-to-bottom, where '0' represents empty cells.

**Rules:**
- Fill empty cells with digits 1-4.
- Each row must contain digits 1-4 exactly once.
- Each column must contain digits 1-4 exactly once.
- Each 2x2 box must contain digits 1-4 exactly once.

**Important:** Your solution must be a COMPLETE 16-character string with only the digits 1-4, representing your final solved grid.

Append the tag \block directly to the end of the last sentence of each reasoning step without starting a new line. Respond in this exact format:
<reasoning>
Step 1, ... \block
Step 2, ... \block
...
Step n, ... \block
</reasoning>
<answer>
[16-character solution string with no spaces or separators]
</answer>
"""  # noqa: E501


class Countdown(Task):
    splits = ("train", "test")
    offline = True
    seed = 2024
    sizes = {"test": 256, "train": 20000}
    files = {"train": ["train-00000-of-00001.parquet", "train.parquet", "countdown_train.jsonl"],
             "test": ["countdown_cd3_test.jsonl", "test.jsonl", "test.parquet"]}

    def __init__(self, n_numbers: int):
        self.n = n_numbers
        self.name = "countdown" if n_numbers == 3 else f"countdown{n_numbers}"
        self.version = f"n{n_numbers}.g1.r{puzzles.VERSION}"

    def generate(self, split: str) -> list[dict]:
        rng = random.Random(self.seed * 10 + self.n)
        seen: set = set()
        out: dict[str, list] = {s: [] for s in self.sizes}
        for s in ("test", "train"):  # one stream: test first, train never repeats a test pair
            while len(out[s]) < self.sizes[s]:
                nums = [rng.randint(1, 100) for _ in range(self.n)]
                expr, value = random_expression(nums, rng)
                key = (tuple(sorted(nums)), value)
                if value is None or not 1 <= value <= 1000 or key in seen:
                    continue
                seen.add(key)
                out[s].append(self._row(nums, value, expr))
        return out[split]

    def _row(self, nums: list[int], target: int, solution: str | None) -> dict:
        content = COUNTDOWN_PROMPT.format(fmt=REASONING_FORMAT, nums=list(nums), target=target)
        extra = {"numbers": list(nums), "target": target}
        if solution is not None:
            extra["solution"] = solution
        return {"prompt": [{"role": "user", "content": content}], "ground_truth": str(target), "extra": extra}

    def convert(self, record: dict, split: str) -> dict | None:
        if "nums" in record:  # TinyZero parquet
            nums, target = [int(x) for x in record["nums"]], int(record["target"])
        else:  # d1 jsonl
            nums, target = [int(x) for x in str(record["input"]).split(",")], int(record["output"])
        return self._row(nums, target, None) if len(nums) == self.n else None

    def target(self, row: dict) -> str:
        expr = row["extra"].get("solution", "")
        return f"<reasoning>\n{expr} = {row['ground_truth']}\n</reasoning>\n<answer>\n{expr}\n</answer>"

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        return puzzles.countdown_reward(completion, row["extra"]["numbers"], row["extra"]["target"])

    def score(self, completion: str, row: dict) -> dict[str, float]:
        return {"accuracy": float(self.reward(completion, row) == 1.0)}


class CountdownB1(Countdown):
    """Countdown as Block-R1 trains b1 on it (`get_countdown_questions` under a b1 trainer type): b1's prompt,
    then "The provided input list is [..] and the target number is N." and one more line, as the user turn; the
    reference's data, read with `--from` (no generated split): the train split of TinyZero's
    `Jiayi-Pan/Countdown-Tasks-3to4` parquet (rows of 3 numbers) and d1's `countdown_cd3_test.jsonl` (Block-R1 ships
    it in dataset/). The reward is the reference's `countdown_reward_func` (rl/reward_func.py compute_score): 1.0 /
    0.1 / 0 on the last `<answer>` block as written (Countdown's reward also reads a `\\boxed{}` inside or without
    it and drops an "= target" tail); the metric is Countdown's `accuracy` of this reward."""

    offline = False

    def __init__(self):
        super().__init__(n_numbers=3)
        self.name = "countdown_b1"
        self.version = f"{self.version}.b1"

    def _row(self, nums: list[int], target: int, solution: str | None) -> dict:
        row = super()._row(nums, target, solution)
        content = (f"{B1_COUNTDOWN_FORMAT}\nThe provided input list is {list(nums)} and the target number is "
                   f"{target}.\nPlease solve it according to the strict constraints above.")
        row["prompt"] = [{"role": "user", "content": content}]
        return row

    def target(self, row: dict) -> str:
        expr = row["extra"].get("solution", "")
        return f"<reasoning>\n{expr} = {row['ground_truth']} \\block\n</reasoning>\n<answer>\n{expr}\n</answer>"

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        return puzzles.countdown_expression_reward(answer_tag(completion), row["extra"]["numbers"],
                                                   row["extra"]["target"])


def random_expression(nums: list[int], rng: random.Random) -> tuple[str | None, int | None]:
    order = nums[:]
    rng.shuffle(order)
    expr, value = str(order[0]), order[0]
    for x in order[1:]:
        options = [("+", value + x), ("*", value * x)]
        if value - x > 0:
            options.append(("-", value - x))
        if x - value > 0:
            options.append(("r-", x - value))
        if value % x == 0:
            options.append(("/", value // x))
        op, new = rng.choice(options)
        inner = f"({expr})" if not expr.isdigit() else expr
        expr = f"{x} - {inner}" if op == "r-" else f"{inner} {op} {x}"
        value = new
    return expr, value


def all_grids() -> list[str]:
    """The 288 valid 4x4 Sudoku grids, in lexicographic order."""
    grids = []
    for rows in itertools.product(itertools.permutations("1234"), repeat=4):
        cols_ok = all(len({r[c] for r in rows}) == 4 for c in range(4))
        boxes_ok = all(len({rows[r + i][c + j] for i in (0, 1) for j in (0, 1)}) == 4 for r in (0, 2) for c in (0, 2))
        if cols_ok and boxes_ok:
            grids.append("".join("".join(r) for r in rows))
    return grids


class Sudoku(Task):
    name = "sudoku"
    splits = ("train", "test")
    offline = True
    seed = 4242
    sizes = {"test": 256, "train": 20000}
    version = f"g1.r{puzzles.VERSION}"
    files = {"train": ["4x4_sudoku_unique_puzzles.csv", "train_sudoku_split_new.csv", "train.csv"],
             "test": ["4x4_test_sudoku.csv", "test_sudoku_split_new.csv", "test.csv"]}

    def generate(self, split: str) -> list[dict]:
        grids = all_grids()
        rng = random.Random(self.seed)
        rng.shuffle(grids)
        pool = grids[:200] if split == "train" else grids[200:]
        rng = random.Random(self.seed + (1 if split == "train" else 2))
        rows = []
        for _ in range(self.sizes[split]):
            solution = rng.choice(pool)
            rows.append(self._row(make_puzzle(solution, grids, rng), solution))
        return rows

    def _row(self, puzzle: str, solution: str) -> dict:
        content = f"{SUDOKU_PROMPT}\n\nSolve the following Sudoku puzzle: {puzzle}\n"
        return {"prompt": [{"role": "user", "content": content}], "ground_truth": solution,
                "extra": {"puzzle": puzzle, "solution": solution}}

    def convert(self, record: dict, split: str) -> dict:
        return self._row(str(record["Puzzle"]).zfill(16), str(record["Solution"]))

    def target(self, row: dict) -> str:
        return f"<reasoning>\n{row['extra']['puzzle']}\n</reasoning>\n<answer>\n{row['ground_truth']}\n</answer>"

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        return puzzles.sudoku_reward(completion, row["extra"]["puzzle"], row["extra"]["solution"])

    def score(self, completion: str, row: dict) -> dict[str, float]:
        s = puzzles.sudoku_scores(completion, row["extra"]["puzzle"], row["extra"]["solution"])
        return {"cell_accuracy": s["cell_accuracy"], "solved": s["solved"]}


class SudokuB1(Sudoku):
    """4x4 Sudoku as Block-R1 trains b1 on it (`get_sudoku_questions` under a b1 trainer type): b1's prompt, then
    "Solve the following Sudoku puzzle: <16 digits>" and a newline, as the user turn; the reference's data, read with
    `--from` Block-R1's dataset/ folder (no generated split): 4x4_sudoku_unique_puzzles.csv (train) and
    4x4_test_sudoku.csv (test). The reward is the reference's `sudoku_reward_func`: the fraction of the empty cells
    right in the digits of the last `<answer>` block, 0 without one (Sudoku's reward reads the whole completion
    then); the metrics are Sudoku's."""

    name = "sudoku_b1"
    version = f"{Sudoku.version}.b1"
    offline = False

    def _row(self, puzzle: str, solution: str) -> dict:
        row = super()._row(puzzle, solution)
        content = f"{B1_SUDOKU_FORMAT}\nSolve the following Sudoku puzzle: {puzzle}\n"
        row["prompt"] = [{"role": "user", "content": content}]
        return row

    def target(self, row: dict) -> str:
        return (f"<reasoning>\n{row['extra']['puzzle']} \\block\n</reasoning>\n<answer>\n{row['ground_truth']}\n"
                "</answer>")

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        if answer_tag(completion) is None:  # the reference's extract_answer_sudoku finds no answer: 0.0
            return 0.0
        return super().reward(completion, row, style)


def make_puzzle(solution: str, grids: list[str], rng: random.Random, empty: tuple[int, int] = (6, 11)) -> str:
    """`solution` with between empty[0] and empty[1] cells set to 0 (drawn uniformly), removed in
    a random order and only while the solution stays unique."""
    masks = _cell_masks(tuple(grids))
    want_empty = rng.randint(*empty)
    cells = list(range(16))
    rng.shuffle(cells)
    puzzle = list(solution)
    for c in cells:
        if puzzle.count("0") == want_empty:
            break
        keep = puzzle[c]
        puzzle[c] = "0"
        if _n_solutions(puzzle, masks) != 1:
            puzzle[c] = keep  # removing it would allow a second solution
    return "".join(puzzle)


@functools.cache
def _cell_masks(grids: tuple[str, ...]) -> list[list[int]]:
    """masks[cell][digit]: bitset of the grids with `digit` at `cell`."""
    masks = [[0] * 5 for _ in range(16)]
    for gi, g in enumerate(grids):
        for c in range(16):
            masks[c][int(g[c])] |= 1 << gi
    return masks


def _n_solutions(puzzle: list[str], masks: list[list[int]]) -> int:
    match = -1
    for c, p in enumerate(puzzle):
        if p != "0":
            match &= masks[c][int(p)]
    return (match & ((1 << 288) - 1)).bit_count()
