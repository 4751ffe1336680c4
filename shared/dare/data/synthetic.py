"""Synthetic tasks that are generated offline with a fixed seed (no download), for the demo
and the tests. Generation uses Python's `random.Random(seed)`, whose sequence is stable across
Python versions and platforms, so the parquet bytes are reproducible."""

from __future__ import annotations

import random

from dare.data.base import Task
from dare.data.puzzles import random_expression, all_grids, make_puzzle
from dare.rewards import arithmetic, puzzles


class Taught:
    """A task's SFT demonstrations from a flawed teacher (mixed in before the task's class): `demonstrate(row, rng)`
    writes each train row's demonstration, in order, from one generator (the task's seed + 3); `target`, the SFT
    response, is that demonstration. Ground truth, the test split and rewards stay the task's."""

    def generate(self, split: str) -> list[dict]:
        rng = random.Random(self.seed + 3)
        rows = super().generate(split)
        if split == "train":
            for row in rows:
                row["extra"]["demonstration"] = self.demonstrate(row, rng)
        return rows

    def demonstrate(self, row: dict, rng: random.Random) -> str:
        raise NotImplementedError

    def target(self, row: dict) -> str:
        return row["extra"]["demonstration"]


class Addition(Task):
    """`a+b=` -> `a+b` with a, b uniform in [0, 10^digits). The test split is a fixed random
    sample of n_test pairs; the train split is every other pair (disjoint from test)."""

    name = "addition"
    splits = ("train", "test")
    offline = True
    seed = 1234

    def __init__(self, digits: int, n_test: int):
        self.digits, self.n_test = digits, n_test
        self.version = f"d{digits}.n{n_test}.r{arithmetic.VERSION}.1"
        self.alphabet = "0123456789+="

    def generate(self, split: str) -> list[dict]:
        n = 10 ** self.digits
        pairs = [(a, b) for a in range(n) for b in range(n)]
        random.Random(self.seed).shuffle(pairs)
        chosen = pairs[: self.n_test] if split == "test" else sorted(pairs[self.n_test:])
        if split == "train":
            random.Random(self.seed + 1).shuffle(chosen)
        return [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "ground_truth": str(a + b),
                 "extra": {"a": a, "b": b}} for a, b in chosen]

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        return arithmetic.exact_match(completion, row["ground_truth"])

    def score(self, completion: str, row: dict) -> dict[str, float]:
        return {"accuracy": arithmetic.exact_match(completion, row["ground_truth"])}


class AdditionPreference(Addition):
    """Preference pairs on the addition prompts, for the preference recipe on tiny models:
    chosen = the correct sum, rejected = a near miss (off by 1, 2 or 10, never negative). Same
    train/test split as `addition`."""

    name = "addition_pairs"

    def __init__(self, digits: int, n_test: int):
        super().__init__(digits, n_test)
        self.version = f"{self.version}.p1"

    def generate(self, split: str) -> list[dict]:
        rng = random.Random(self.seed + 2 + (split == "test"))
        rows = []
        for row in super().generate(split):
            right = int(row["ground_truth"])
            wrong = right + rng.choice([d for d in (-10, -2, -1, 1, 2, 10) if right + d >= 0])
            rows.append({**row, "extra": {**row["extra"], "chosen": str(right), "rejected": str(wrong)}})
        return rows


class AdditionTeacher(Taught, Addition):
    """The addition prompts with SFT demonstrations from a flawed teacher: the teacher adds correctly
    except for the carry into the highest column, which it forgets with probability `forget` (drawn
    once per training row, fixed seed), writing 0 there: 57+68 -> 025 instead of 125. Its answer
    keeps the correct sum's length and every other digit, so the flaw is one token on the problems
    whose sum has digits + 1 digits (about half of them). `ground_truth` stays the correct sum
    (rewards and evaluation score against it); only the SFT target (`target`) is the teacher's.

    With forget > 0.5 a model that imitates the teacher writes 0 there at temperature 0 (greedy
    accuracy: the share of sums below 10^digits, once the other digits are learned) but 1 with
    probability about 1 - forget when it samples: the case RL with a verifiable reward is for (the
    demo). A teacher whose slips change the answer's length instead (dropping the digit, or forgetting
    lower carries) shifts every later digit, and the demo's tiny model then does not learn the sums
    in its budget. Same train/test split as `addition`."""

    name = "addition_teacher"

    def __init__(self, digits: int, n_test: int, forget: float):
        super().__init__(digits, n_test)
        self.forget = forget
        self.version = f"{self.version}.top{forget}"

    def demonstrate(self, row: dict, rng: random.Random) -> str:
        return self.teach(row["extra"]["a"], row["extra"]["b"], rng)

    def teach(self, a: int, b: int, rng: random.Random) -> str:
        total = str(a + b)
        if a + b >= 10 ** self.digits and rng.random() < self.forget:
            return "0" + total[1:]  # the carry into the top column forgotten: 0 written in its place
        return total


class Chain(Task):
    """Long answers for the decoding and RL speed benchmarks (`dare bench rollout`, `dare bench train`):
    a chain of additions modulo 10^4 with every step written out. The prompt gives the start and a
    letter; the answer is one term per letter from that letter down to `a`, each the term before plus
    that term's last digit plus 1, written as the letter, the term's 4 digits least significant first
    (as one adds by hand: each carry goes to the digit after it) and a comma:

        prompt `8500,c`  ->  answer `c7600,b5700,a1800,`   (58 -> 67, 75, 81: 58 + 8 + 1 = 67, ...)

    Every token reads its inputs at a fixed distance (the term before it; the prompt for the first),
    the letters say where the answer ends, and no term can be read off the others (a step is not
    undone uniquely, nor repeated in the answer), so a model has to read the prompt: a tiny RoPE model
    of any family learns it in minutes. Each term follows from the one before, so decoding is neither
    one token per step by necessity nor all at once. Answers are 6 x count tokens: 102-156 for counts
    in [17, 26] (letters q..z). `accuracy` is the whole answer right; the reward is `term_accuracy`, the
    share of terms right. Train rows are `n_train` draws, test rows `n_test` draws from another seed."""

    name = "chain"
    splits = ("train", "test")
    offline = True
    seed = 4040
    alphabet = "0123456789,abcdefghijklmnopqrstuvwxyz"
    digits = 4

    def __init__(self, counts: tuple[int, int], n_train: int, n_test: int):
        self.counts, self.sizes = counts, {"train": n_train, "test": n_test}
        self.version = f"c{counts[0]}-{counts[1]}.n{n_train}.{n_test}.r{arithmetic.VERSION}.1"

    def generate(self, split: str) -> list[dict]:
        rng = random.Random(self.seed + (1 if split == "train" else 2))
        rows = []
        for _ in range(self.sizes[split]):
            start, count = rng.randrange(10 ** self.digits), rng.randint(*self.counts)
            prompt = f"{arithmetic.lsb(start, self.digits)},{chr(ord('a') + count - 1)}"
            rows.append({"prompt": [{"role": "user", "content": prompt}],
                         "ground_truth": arithmetic.chain_trace(start, count, self.digits),
                         "extra": {"start": start, "count": count}})
        return rows

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        return arithmetic.trace_scores(completion, row["ground_truth"])["term_accuracy"]

    def score(self, completion: str, row: dict) -> dict[str, float]:
        return arithmetic.trace_scores(completion, row["ground_truth"])


class SudokuFill(Task):
    """4x4 Sudoku in a form a from-scratch character model reads: the prompt is the 16-cell puzzle
    (reading order, 0 = empty) and `=`, the answer is the digits of the empty cells in reading order
    (`1230402131040312=` -> `413`). Every puzzle has exactly `blanks` empty cells and a unique
    solution (`dare.data.puzzles.make_puzzle`). Train and test use disjoint solution grids (200 / 88
    of the 288, as `sudoku`), so a model must learn the rules, not the grids. The reward and metric
    are d1's Sudoku metric, the fraction of empty cells right (`cell_accuracy`), with `solved` beside
    it. Train rows are `n_train` draws (puzzles may repeat), test rows `n_test`."""

    name = "sudoku_fill"
    splits = ("train", "test")
    offline = True
    seed = 5151
    alphabet = "01234="

    def __init__(self, blanks: int, n_train: int, n_test: int, name: str | None = None):
        self.blanks, self.sizes = blanks, {"train": n_train, "test": n_test}
        self.version = f"b{blanks}.n{n_train}.{n_test}.r{puzzles.VERSION}.1"
        self.name = name or self.name

    def generate(self, split: str) -> list[dict]:
        grids = all_grids()
        random.Random(self.seed).shuffle(grids)
        pool = grids[:200] if split == "train" else grids[200:]
        rng = random.Random(self.seed + (1 if split == "train" else 2))
        rows = []
        for _ in range(self.sizes[split]):
            solution = rng.choice(pool)
            puzzle = make_puzzle(solution, grids, rng, empty=(self.blanks, self.blanks))
            while puzzle.count("0") < self.blanks:  # a removal order that stopped short: another one
                puzzle = make_puzzle(solution, grids, rng, empty=(self.blanks, self.blanks))
            answer = "".join(s for p, s in zip(puzzle, solution) if p == "0")
            rows.append({"prompt": [{"role": "user", "content": f"{puzzle}="}], "ground_truth": answer,
                         "extra": {"puzzle": puzzle, "solution": solution}})
        return rows

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        return puzzles.sudoku_fill_scores(completion, row["ground_truth"])["cell_accuracy"]

    def score(self, completion: str, row: dict) -> dict[str, float]:
        return puzzles.sudoku_fill_scores(completion, row["ground_truth"])


class SudokuFillTeacher(Taught, SudokuFill):
    """`sudoku_fill` with SFT demonstrations from a teacher that reasons about rows only: in a row with
    two or more empty cells it writes the row's missing digits in ascending order, ignoring columns
    and boxes, with probability `ascending` (drawn per row, fixed seed), and the right digits
    otherwise; a row with one empty cell it always fills right (its missing digit). So the teacher's
    answers are always valid rows, right on single-blank rows and on rows where ascending order
    happens to be the solution, and wrong on the others. `ground_truth` stays the solution (rewards
    and evaluation score against it); only the SFT target is the teacher's.

    With ascending > 0.5 a model that imitates the teacher writes the ascending order at temperature
    0, and the solution with probability about 1 - ascending when it samples: room for RL with d1's
    cell-accuracy reward, which has to find the column and box reasoning the teacher skipped. Same
    train/test split as `sudoku_fill`."""

    name = "sudoku_fill_teacher"

    def __init__(self, blanks: int, n_train: int, n_test: int, ascending: float, name: str | None = None):
        super().__init__(blanks, n_train, n_test, name)
        self.ascending = ascending
        self.version = f"{self.version}.asc{ascending}"

    def demonstrate(self, row: dict, rng: random.Random) -> str:
        return self.teach(row["extra"]["puzzle"], row["extra"]["solution"], rng)

    def teach(self, puzzle: str, solution: str, rng: random.Random) -> str:
        filled = list(solution)
        for r in range(4):
            empty = [c for c in range(4 * r, 4 * r + 4) if puzzle[c] == "0"]
            if len(empty) >= 2 and rng.random() < self.ascending:
                for c, digit in zip(empty, sorted(solution[c] for c in empty)):
                    filled[c] = digit  # the row's missing digits, smallest first
        return "".join(filled[c] for c in range(16) if puzzle[c] == "0")


class ChainCarry(Chain):
    """`chain` with shorter answers (counts 6-7: 36-42 tokens) on its own seed, the answer that
    `chain_carry_teacher` demonstrates with a flaw: the long-answer task of the headline suite."""

    name = "chain_carry"
    seed = 4141


class ChainCarryTeacher(Taught, ChainCarry):
    """`chain_carry` (`chain` with short answers (counts 6-7: 36-42 tokens) and SFT demonstrations from a teacher that
    forgets the carry out of the ones digit (a last digit of 5 or more: about half the steps) with
    probability `forget` at each such step, drawn per step (fixed seed), and goes on from the term it
    wrote: one slip makes every later term wrong. `ground_truth` stays the correct chain (rewards and
    evaluation score against it); only the SFT target is the teacher's.

    With forget > 0.5 a model that imitates the teacher forgets every carry at temperature 0, so its
    terms are right only up to the first carry (the start's whole-chain accuracy is the share of chains
    without one, about 1%), and it writes the carry with probability about 1 - forget when it samples.
    The reward is `term_accuracy` (the share of terms right at their place, which after a slip is the
    share before it), which the suite also ranks on; `accuracy`, the whole chain right, needs every one
    of the three or four carries of a typical chain right. The answers are long enough (36+ tokens)
    for per-token, sequence and trajectory likelihoods to part. Same splits as `chain` with its own
    sizes and seed."""

    name = "chain_carry_teacher"

    def __init__(self, counts: tuple[int, int], n_train: int, n_test: int, forget: float):
        super().__init__(counts, n_train, n_test)
        self.forget = forget
        self.version = f"{self.version}.fc{forget}"

    def demonstrate(self, row: dict, rng: random.Random) -> str:
        return self.teach(row["extra"]["start"], row["extra"]["count"], rng)

    def teach(self, start: int, count: int, rng: random.Random) -> str:
        out, value, mod = [], start, 10 ** self.digits
        for k in range(count, 0, -1):
            last = value % 10
            step = last + 1
            if 2 * last + 1 >= 10 and rng.random() < self.forget:
                step -= 10  # the ones digit written right, its carry into the tens forgotten
            value = (value + step) % mod
            out.append(f"{chr(ord('a') + k - 1)}{arithmetic.lsb(value, self.digits)},")
        return "".join(out)


class CountdownTiny(Task):
    """Countdown in a form a from-scratch character model reads, with the papers' reward rule: the
    prompt is the numbers and the target (`3,7,2:17=`), the answer an arithmetic expression that uses
    each number exactly once and evaluates to the target (`7*2+3`). Numbers are uniform in [1, 9];
    the target is built as `countdown`'s (TinyZero's generator): the numbers combined in a random order
    with random operations (+ - * /, every intermediate a positive integer), the expression kept as a
    reference solution; targets in [1, 99]. Test and train never share a (numbers, target) pair (one
    stream, test first). Reward (d1 / TinyZero, `puzzles.countdown_expression_reward`): 1.0 right, 0.1
    for a well-formed expression (only digits, `+-*/()`) that is wrong or uses other numbers, 0.0
    otherwise; the metric `accuracy` is the reward being 1."""

    name = "countdown_tiny"
    splits = ("train", "test")
    offline = True
    seed = 6262
    alphabet = "0123456789+-*/(),:="
    symbols = set("0123456789+-*/()")

    def __init__(self, n_numbers: int, n_train: int, n_test: int):
        self.n, self.sizes = n_numbers, {"train": n_train, "test": n_test}
        self.version = f"n{n_numbers}.n{n_train}.{n_test}.r{puzzles.VERSION}.1"

    def generate(self, split: str) -> list[dict]:
        rng = random.Random(self.seed)
        test: list[dict] = []
        seen: set = set()
        while len(test) < self.sizes["test"]:  # test first: distinct problems
            row = self._draw(rng)
            if row is not None and row["extra"]["key"] not in seen:
                seen.add(row["extra"]["key"])
                test.append(row)
        if split == "test":
            return [self._strip(r) for r in test]
        train: list[dict] = []
        rng = random.Random(self.seed + 1)
        while len(train) < self.sizes["train"]:
            row = self._draw(rng)
            if row is not None and row["extra"]["key"] not in seen:
                train.append(row)
        return [self._strip(r) for r in train]

    def _draw(self, rng: random.Random) -> dict | None:
        nums = [rng.randint(1, 9) for _ in range(self.n)]
        expr, value = random_expression(nums, rng)
        if value is None or not 1 <= value <= 99:
            return None
        expr = expr.replace(" ", "")
        prompt = ",".join(map(str, nums)) + f":{value}="
        return {"prompt": [{"role": "user", "content": prompt}], "ground_truth": str(value),
                "extra": {"numbers": nums, "target": value, "solution": expr, "key": (tuple(sorted(nums)), value)}}

    @staticmethod
    def _strip(row: dict) -> dict:
        row["extra"].pop("key")
        return row

    def target(self, row: dict) -> str:
        return row["extra"]["solution"]

    def expression(self, completion: str) -> str | None:
        text = completion.strip()
        return text if text and set(text) <= self.symbols else None

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        return puzzles.countdown_expression_reward(self.expression(completion), row["extra"]["numbers"],
                                                   row["extra"]["target"])

    def score(self, completion: str, row: dict) -> dict[str, float]:
        r = self.reward(completion, row)
        return {"accuracy": float(r == 1.0), "well_formed": float(r > 0.0)}


class CountdownTinyTeacher(Taught, CountdownTiny):
    """`countdown_tiny` with SFT demonstrations from a teacher that guesses: with probability `slip` (drawn per
    row, fixed seed) it writes a random well-formed expression over the numbers (each once, drawn as the targets
    are: random order and operations, every intermediate a positive integer), which reaches the target only by
    chance, and a reference solution otherwise. A model that imitates it writes guesses, varied ones when it
    samples, and reaches the target where its guess or its share of solving does: RL has to turn the guessing
    into search from the reward alone. (A teacher whose mistake is one fixed answer, the numbers joined by `+`,
    gave a start that wrote that answer in every sample at temperature 0.9: no group had two rewards, nothing to
    learn.) `ground_truth` stays the target."""

    name = "countdown_tiny_teacher"

    def __init__(self, n_numbers: int, n_train: int, n_test: int, slip: float):
        super().__init__(n_numbers, n_train, n_test)
        self.slip = slip
        self.version = f"{self.version}.guess{slip}"

    def demonstrate(self, row: dict, rng: random.Random) -> str:
        guess = random_expression(row["extra"]["numbers"], rng)[0].replace(" ", "")
        return guess if rng.random() < self.slip else row["extra"]["solution"]


class CountdownTinyPairs(CountdownTiny):
    """Preference pairs on `countdown_tiny`'s prompts, for VRPO as the suite's preference reference: chosen = the
    reference solution, rejected = the teacher's sloppy answer (the numbers joined by `+`), or where that reaches
    the target the numbers joined by `*`, else by `-` (well-formed, every number once, wrong: the papers' 0.1).
    Same splits as `countdown_tiny`."""

    name = "countdown_tiny_pairs"

    def __init__(self, n_numbers: int, n_train: int, n_test: int):
        super().__init__(n_numbers, n_train, n_test)
        self.version = f"{self.version}.p1"

    def generate(self, split: str) -> list[dict]:
        rows = super().generate(split)
        for row in rows:
            nums, target = row["extra"]["numbers"], row["extra"]["target"]
            wrong = next(e for e in ("+".join(map(str, nums)), "*".join(map(str, nums)), "-".join(map(str, nums)))
                         if puzzles.countdown_expression_reward(e, nums, target) < 1.0)
            row["extra"].update(chosen=row["extra"]["solution"], rejected=wrong)
        return rows
