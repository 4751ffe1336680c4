"""The task registry: offline tasks rebuild to their recorded hashes, file-sourced tasks read the
original formats, bad records are named, generators hold their invariants, DVC round-trips."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import dare_cli
from dare.data import TASKS, DataError, build, load_split, recorded_hashes
from dare.rewards.puzzles import safe_arithmetic
from dare.utils import sha256_file

OFFLINE = [n for n, t in TASKS.items() if t.offline]


def test_registry_has_the_tasks_of_the_papers():
    assert set(TASKS) >= {"gsm8k", "math", "math500", "countdown", "countdown4", "sudoku", "humaneval", "mbpp",
                          "ultrafeedback", "addition", "s1k"}
    assert set(OFFLINE) == {"addition", "addition_pairs", "addition_teacher", "countdown", "countdown4", "sudoku", "humaneval",
                            "sudoku_fill", "sudoku_fill_teacher", "chain", "chain_carry", "chain_carry_teacher",
                            "sudoku_hard", "sudoku_hard_teacher", "countdown_tiny", "countdown_tiny_teacher",
                            "countdown_tiny_pairs"}
    assert set(recorded_hashes()) == {f"{n}/{s}" for n in OFFLINE for s in TASKS[n].splits}


@pytest.mark.parametrize("name", OFFLINE)
def test_offline_tasks_rebuild_to_their_recorded_hashes(name, tmp_path):
    for split in TASKS[name].splits:
        path = build(name, split, tmp_path)
        assert sha256_file(path) == recorded_hashes()[f"{name}/{split}"], f"{name}/{split}: bump its version"
        rows = load_split(name, split, tmp_path, build_missing=False)
        assert rows and all(r["prompt"][0]["role"] == "user" for r in rows)


def test_countdown_generator_invariants():
    for name, n in [("countdown", 3), ("countdown4", 4)]:
        train, test = TASKS[name].build("train"), TASKS[name].build("test")
        assert (len(train), len(test)) == (20000, 256)
        keys = {(tuple(sorted(r["extra"]["numbers"])), r["extra"]["target"]) for r in train}
        assert not keys & {(tuple(sorted(r["extra"]["numbers"])), r["extra"]["target"]) for r in test}
        for r in test[:50] + train[:50]:
            nums, expr = r["extra"]["numbers"], r["extra"]["solution"]
            assert len(nums) == n and all(1 <= x <= 100 for x in nums)
            assert safe_arithmetic(expr) == r["extra"]["target"] and 1 <= r["extra"]["target"] <= 1000
            assert Counter(int(t) for t in re.findall(r"\d+", expr)) == Counter(nums)
            assert TASKS[name].reward(TASKS[name].target(r), r) == 1.0  # the SFT target earns the reward


def test_sudoku_generator_invariants():
    from dare.data.puzzles import all_grids, _cell_masks, _n_solutions

    grids = all_grids()
    masks = _cell_masks(tuple(grids))
    train, test = TASKS["sudoku"].build("train"), TASKS["sudoku"].build("test")
    assert not {r["ground_truth"] for r in train} & {r["ground_truth"] for r in test}  # disjoint solution grids
    for r in test + train[:300]:
        puzzle, solution = r["extra"]["puzzle"], r["ground_truth"]
        assert solution in grids and 6 <= puzzle.count("0") <= 11
        assert all(p in ("0", s) for p, s in zip(puzzle, solution))
        assert _n_solutions(list(puzzle), masks) == 1
        assert TASKS["sudoku"].reward(f"<answer>{solution}</answer>", r) == 1.0


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_from_original_files_for_every_file_sourced_task(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src"
    src.mkdir()
    _write_jsonl(src / "test.jsonl", [{"question": "Tom has 3 apples and buys 4. How many?",
                                       "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
                                      {"question": "Big?", "answer": "ok\n#### 1,250"}])
    (gsm, math_dir, m500, mbpp, uf, cd, sd) = (tmp_path / d for d in ("gsm", "math", "m500", "mbpp", "uf", "cd", "sd"))
    for d in (gsm, math_dir, m500, mbpp, uf, cd, sd):
        d.mkdir()
    shutil.copy(src / "test.jsonl", gsm / "test.jsonl")
    _write_jsonl(gsm / "train.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    _write_jsonl(math_dir / "train.jsonl", [{"problem": "Half of 1?", "solution": "It is $\\boxed{\\frac{1}{2}}$.",
                                             "level": "Level 1", "type": "Algebra"},
                                            {"problem": "No answer", "solution": "none", "level": "Level 1",
                                             "type": "Algebra"}])
    _write_jsonl(math_dir / "test.jsonl", [{"problem": "2+2?", "solution": "$\\boxed{4}$", "level": "Level 1",
                                            "type": "Prealgebra"}])
    _write_jsonl(m500 / "test.jsonl", [{"problem": "3*3?", "solution": "\\boxed{9}", "answer": "9",
                                        "subject": "Prealgebra", "level": 1, "unique_id": "test/x.json"}])
    _write_jsonl(mbpp / "mbpp.jsonl", [
        {"task_id": tid, "text": "Write a function to add two numbers.", "code": "def add(a, b):\n    return a + b",
         "test_list": ["assert add(1, 2) == 3"], "test_setup_code": "", "challenge_test_list": []}
        for tid in (2, 11, 12, 520, 700)])
    chosen = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    rejected = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Go away."}]
    table = pa.Table.from_pylist([{"prompt": "Hi", "prompt_id": "p1", "chosen": chosen, "rejected": rejected,
                                   "score_chosen": 8.0, "score_rejected": 2.0}])
    for split in ("train", "test"):
        pq.write_table(table, uf / f"{split}_prefs-00000-of-00001.parquet")
    _write_jsonl(cd / "countdown_cd3_test.jsonl", [{"input": "30,100,93", "output": "23"}])
    with open(sd / "4x4_test_sudoku.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Puzzle", "Solution"])
        w.writerow(["3014002020004130", "3214142323414132"])

    built = {}
    for name, folder, split in [("gsm8k", gsm, "test"), ("gsm8k", gsm, "train"), ("math", math_dir, "train"),
                                ("math", math_dir, "test"), ("math500", m500, "test"), ("mbpp", mbpp, "test"),
                                ("mbpp", mbpp, "train"), ("ultrafeedback", uf, "train"), ("countdown", cd, "test"),
                                ("sudoku", sd, "test")]:
        out = tmp_path / "data"
        path = build(name, split, out, source=folder)
        again = build(name, split, tmp_path / "again", source=folder)
        assert path.read_bytes() == again.read_bytes()  # same input, same bytes
        built[(name, split)] = load_split(name, split, out, build_missing=False)
    g = built[("gsm8k", "test")]
    assert [r["ground_truth"] for r in g] == ["7", "1250"] and "Respond in the following format" in \
        g[0]["prompt"][0]["content"]
    assert TASKS["gsm8k"].reward("<answer>\n7\n</answer>", g[0]) == 1.0
    assert TASKS["gsm8k"].reward(TASKS["gsm8k"].target(g[0]), g[0], style="d1_format") == pytest.approx(3.5)  # soft never fires on it
    m = built[("math", "train")]
    assert len(m) == 1 and m[0]["ground_truth"] == "\\frac{1}{2}"  # the record without a boxed answer is dropped
    assert TASKS["math"].reward("so \\boxed{0.5}", m[0]) == 1.0
    assert built[("math500", "test")][0]["ground_truth"] == "9"
    assert [r["extra"]["task_id"] for r in built[("mbpp", "test")]] == [11, 12]  # ids 11-510
    assert [r["extra"]["task_id"] for r in built[("mbpp", "train")]] == [700]
    assert TASKS["mbpp"].rewards([TASKS["mbpp"].target(r) for r in built[("mbpp", "test")]],
                                 built[("mbpp", "test")]) == [1.0, 1.0]
    u = built[("ultrafeedback", "train")][0]
    assert u["extra"]["chosen"] == "Hello!" and u["extra"]["rejected"] == "Go away." and u["ground_truth"] == "Hello!"
    c = built[("countdown", "test")][0]
    assert c["extra"] == {"numbers": [30, 100, 93], "target": 23}
    assert TASKS["countdown"].reward("<answer>100 - 93 + 30 - 14</answer>", c) == 0.1
    assert TASKS["countdown"].reward("<answer>30 - (100 - 93)</answer>", c) == 1.0
    assert built[("sudoku", "test")][0]["extra"]["puzzle"] == "3014002020004130"


def test_b1_tasks_build_from_block_r1s_files_only(tmp_path):
    """b1's Countdown and Sudoku read the reference's data (Block-R1@fd7a1b8 dataset/: countdown_cd3_test.jsonl,
    4x4_sudoku_unique_puzzles.csv; TinyZero's train parquet) with `--from`; nothing is generated for them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "block_r1"
    src.mkdir()
    _write_jsonl(src / "countdown_cd3_test.jsonl", [{"input": "30,100,93", "output": "23"}])
    pq.write_table(pa.Table.from_pylist([{"nums": [1, 2, 3], "target": 6}, {"nums": [1, 2, 3, 4], "target": 10}]),
                   src / "train-00000-of-00001.parquet")
    with open(src / "4x4_sudoku_unique_puzzles.csv", "w", newline="") as f:
        csv.writer(f).writerows([["Puzzle", "Solution"], ["3014002020004130", "3214142323414132"]])
    for name, split, n in [("countdown_b1", "test", 1), ("countdown_b1", "train", 1), ("sudoku_b1", "train", 1)]:
        build(name, split, tmp_path / "data", source=src)
        rows = load_split(name, split, tmp_path / "data", build_missing=False)
        assert len(rows) == n and "\\block" in rows[0]["prompt"][0]["content"]
    for name in ("countdown_b1", "sudoku_b1"):
        with pytest.raises(DataError, match=f"dare data build {name} --from"):
            TASKS[name].build("test")


def test_bad_source_records_name_file_record_and_field(tmp_path):
    _write_jsonl(tmp_path / "test.jsonl", [{"question": "ok", "answer": "#### 1"}, {"question": "no answer"}])
    with pytest.raises(DataError, match=r"test\.jsonl: record 1: missing field 'answer'"):
        build("gsm8k", "test", tmp_path / "out", source=tmp_path)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "test.jsonl").write_text('{"question": "x", "answer": "#### 1"}\n{not json\n')
    with pytest.raises(DataError, match=r"broken/test\.jsonl: cannot read"):
        build("gsm8k", "test", tmp_path / "out", source=tmp_path / "broken")
    with pytest.raises(DataError, match=r"none of \['train\.jsonl'"):
        build("gsm8k", "train", tmp_path / "out", source=tmp_path / "broken")
    assert not (tmp_path / "out" / "gsm8k" / "test.parquet").exists()  # nothing half-written


def test_unreachable_hub_says_what_to_do(tmp_path):
    r = dare_cli("data", "build", "gsm8k", env={"DARE_DATA": str(tmp_path)}, timeout=120)
    assert r.returncode == 2
    assert "dvc pull" in r.stderr and "--from" in r.stderr and "gsm8k" in r.stderr
    r = dare_cli("data", "build", "gsm8k", "sudoku", "--from", str(tmp_path), env={"DARE_DATA": str(tmp_path)})
    assert r.returncode == 2 and "exactly one task" in r.stderr


def test_dare_data_build_prints_hashes_and_checks_them(tmp_path):
    r = dare_cli("data", "build", "sudoku", "countdown", env={"DARE_DATA": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("(= recorded hash)") == 4


def test_dvc_add_push_pull_round_trip_through_a_local_remote(tmp_path):
    dvc = str(Path(sys.executable).with_name("dvc"))
    repo, remote = tmp_path / "repo", tmp_path / "remote"
    repo.mkdir()
    env = {**os.environ, "DARE_DATA": str(repo / "data")}

    def run(*args):
        r = subprocess.run([dvc, *args], cwd=repo, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout

    run("init", "--no-scm")
    run("config", "core.analytics", "false")
    run("remote", "add", "-d", "local", str(remote))
    for name in ("sudoku", "addition"):
        for split in TASKS[name].splits:
            build(name, split, repo / "data")
    original = {p.relative_to(repo): p.read_bytes() for p in sorted((repo / "data").rglob("*.parquet"))}
    run("add", "data")
    run("push")
    dvc_file = (repo / "data.dvc").read_text()
    shutil.rmtree(repo / "data")
    shutil.rmtree(repo / ".dvc" / "cache")
    run("pull")
    assert {p.relative_to(repo): p.read_bytes() for p in sorted((repo / "data").rglob("*.parquet"))} == original
    # rebuilding gives the same DVC hash: `dvc status` sees no change
    for name in ("sudoku", "addition"):
        for split in TASKS[name].splits:
            build(name, split, repo / "data")
    assert "up to date" in run("status").lower() or run("status").strip() == ""
    assert (repo / "data.dvc").read_text() == dvc_file


def test_project_data_dvc_tracks_the_offline_tasks():
    text = (Path(__file__).parents[1] / "data.dvc").read_text()
    assert "path: data" in text and f"nfiles: {len(recorded_hashes())}" in text  # every offline split


def test_bench_rewards_writes_a_report(tmp_path, monkeypatch):
    out = tmp_path / "bench.json"
    r = dare_cli("bench", "rewards", "--n", "20", "--workers", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert set(report["tasks"]) == {"gsm8k", "math", "countdown", "sudoku", "humaneval"}
    for name, entry in report["tasks"].items():
        assert entry["serial_per_s"] > 0 and entry["parallel_per_s"] > 0
        assert 0.3 < entry["mean_reward"] < 0.9, name  # about half of the inputs are right
    assert report["workers"] == 2 and report["n"] == 20
    # the fingerprint every committed report carries (the leaderboard's speed view names the machine)
    assert report["hardware"]["cpu_model"] and {"packages", "lock", "git", "command"} <= set(report)
    assert report["command"].startswith("dare bench rewards --n 20")
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "leaderboard"))
    from load import report_hardware

    assert report_hardware(report) == f"{report['hardware']['cpu_model']} ({report['hardware'].get('cpu_capability', '?')})"


def test_s1k_builds_d1s_sft_target(tmp_path):
    src = tmp_path / "s1k"
    src.mkdir()
    _write_jsonl(src / "s1K.jsonl", [
        {"question": "What is 2+2?", "thinking_trajectories": ["2 and 2 make 4."], "attempt": "\\boxed{4}"},
        {"question": "No trace", "thinking_trajectories": [], "attempt": "x"}])
    path = build("s1k", "train", tmp_path / "data", source=src)
    rows = load_split("s1k", "train", tmp_path / "data", build_missing=False)
    assert path.is_file() and len(rows) == 1  # the record without a trace is dropped
    assert TASKS["s1k"].target(rows[0]) == "<reasoning>2 and 2 make 4.</reasoning>\n<answer>\\boxed{4}</answer>"


def test_the_flawed_teacher_forgets_only_the_carry_into_the_hundreds():
    """addition_teacher: the demonstration is the correct sum below 100; at 100 and above it is either
    the sum or the sum with 0 for its hundreds digit (the same length), the latter at the `forget` rate;
    ground truth, test split and rewards are addition's."""
    teacher = TASKS["addition_teacher"]
    rows = teacher.generate("train")
    small = [r for r in rows if r["extra"]["a"] + r["extra"]["b"] < 100]
    large = [r for r in rows if r["extra"]["a"] + r["extra"]["b"] >= 100]
    assert all(teacher.target(r) == r["ground_truth"] == str(r["extra"]["a"] + r["extra"]["b"]) for r in small)
    assert all(teacher.target(r) in (r["ground_truth"], "0" + r["ground_truth"][1:]) for r in large)
    wrong = sum(teacher.target(r) != r["ground_truth"] for r in large) / len(large)
    assert len(large) > 4000 and abs(wrong - 0.8) < 0.02  # forgotten with p = 0.8 (3 sigma: 0.018)
    assert teacher.generate("test") == TASKS["addition"].generate("test")
    assert teacher.teach(57, 68, __import__("random").Random(0)) in ("125", "025")
    assert teacher.teach(57, 38, __import__("random").Random(0)) == "95"
    assert teacher.reward("125", {"ground_truth": "125"}) == 1.0
    assert teacher.reward("025", {"ground_truth": "125"}) == 0.0


def test_sudoku_fill_puzzles_and_the_row_only_teacher():
    """sudoku_fill: 4 empty cells, a unique solution, the answer is the empty cells' digits in reading
    order, train and test on disjoint solution grids; the teacher's demonstration is a valid fill of
    every row, right on single-blank rows, and on rows with several blanks either the solution or
    the row's missing digits ascending (the latter at the `ascending` rate where the two differ)."""
    from dare.data.puzzles import all_grids, _cell_masks, _n_solutions

    masks = _cell_masks(tuple(all_grids()))
    task, teacher = TASKS["sudoku_fill"], TASKS["sudoku_fill_teacher"]
    train, test = teacher.generate("train"), teacher.generate("test")
    assert test == task.generate("test") and len(train) == 50000 and len(test) == 500
    assert not {r["extra"]["solution"] for r in train} & {r["extra"]["solution"] for r in test}
    assert set(teacher.alphabet) >= set("".join(r["prompt"][0]["content"] + r["ground_truth"] for r in test))
    differs = wrong = 0
    for r in train[:3000] + test:
        puzzle, solution = r["extra"]["puzzle"], r["extra"]["solution"]
        assert r["prompt"][0]["content"] == puzzle + "=" and puzzle.count("0") == 4
        assert _n_solutions(list(puzzle), masks) == 1
        assert r["ground_truth"] == "".join(s for p, s in zip(puzzle, solution) if p == "0")
        assert task.score(r["ground_truth"], r) == {"cell_accuracy": 1.0, "solved": 1.0}
    for r in train[:3000]:
        puzzle, solution, shown = r["extra"]["puzzle"], r["extra"]["solution"], teacher.target(r)
        filled = iter(shown)
        grid = "".join(next(filled) if p == "0" else p for p in puzzle)
        for row in range(4):
            cells = [c for c in range(4 * row, 4 * row + 4) if puzzle[c] == "0"]
            assert sorted(grid[4 * row: 4 * row + 4]) == list("1234")  # every row stays valid
            got, right = [grid[c] for c in cells], [solution[c] for c in cells]
            if len(cells) == 1:
                assert got == right
            elif sorted(right) != right:
                assert got in (right, sorted(right))
                differs, wrong = differs + 1, wrong + (got != right)
    assert differs > 1000 and abs(wrong / differs - 0.6) < 0.05  # ascending with p = 0.6 (3 sigma < 0.046)
    row = {"ground_truth": "413"}
    assert task.score("413", row) == {"cell_accuracy": 1.0, "solved": 1.0}
    assert task.score("4 1 2", row) == {"cell_accuracy": 2 / 3, "solved": 0.0}  # non-digits dropped
    assert task.score("41", row) == {"cell_accuracy": 2 / 3, "solved": 0.0}  # a missing digit is wrong
    assert task.reward("", row) == 0.0


def test_sudoku_hard_has_eight_blanks_and_unique_solutions():
    """sudoku_hard (the suite's constraint task): `sudoku_fill` with 8 empty cells in every puzzle, each with a
    unique solution, train and test on disjoint solution grids; its teacher is the row-only one."""
    from dare.data.puzzles import all_grids, _cell_masks, _n_solutions

    masks = _cell_masks(tuple(all_grids()))
    task, teacher = TASKS["sudoku_hard"], TASKS["sudoku_hard_teacher"]
    train, test = teacher.generate("train"), teacher.generate("test")
    assert test == task.generate("test") and len(train) == 50000 and len(test) == 500
    assert not {r["extra"]["solution"] for r in train} & {r["extra"]["solution"] for r in test}
    for r in train[:1000] + test:
        puzzle = r["extra"]["puzzle"]
        assert puzzle.count("0") == 8 and len(r["ground_truth"]) == 8 and _n_solutions(list(puzzle), masks) == 1
    shown = [teacher.target(r) for r in train[:3000]]
    assert 0.2 < sum(s != r["ground_truth"] for s, r in zip(shown, train)) / 3000 < 0.9  # the teacher errs


def test_chain_carry_teacher_forgets_the_ones_carry_and_goes_on_from_what_it_wrote():
    """chain_carry (the suite's long-answer task): `chain` with 6-7 terms (36-42 tokens). The teacher writes
    every term's ones digit right; at a step whose last digit is 5 or more it drops the carry into the tens
    at the `forget` rate and goes on from the term it wrote; ground truth and test split are chain_carry's."""
    import random

    from dare.rewards.arithmetic import chain_trace, lsb

    task, teacher = TASKS["chain_carry"], TASKS["chain_carry_teacher"]
    train = teacher.generate("train")
    assert teacher.generate("test") == task.generate("test")
    assert all(6 <= r["extra"]["count"] <= 7 and 36 <= len(r["ground_truth"]) <= 42 for r in train[:2000])
    assert teacher.teach(1059, 2, random.Random(0)) in ("b9601,a9701,", "b9601,a9601,")  # 1059 -> 1069 -> 1079
    sure = type(teacher)((6, 7), 10, 10, forget=1.0)
    never = type(teacher)((6, 7), 10, 10, forget=0.0)
    assert never.teach(1059, 6, random.Random(0)) == chain_trace(1059, 6)
    always = sure.teach(1054, 3, random.Random(0))  # 1054 -> 1059 (no carry), -> 1069 - 10 = 1059, again
    assert always == f"c{lsb(1059, 4)},b{lsb(1059, 4)},a{lsb(1059, 4)},"
    slips, carries = 0, 0
    for r in train[:3000]:
        value, shown = r["extra"]["start"], teacher.target(r).split(",")[:-1]
        for term in shown:
            carries += value % 10 >= 5
            right = (value + value % 10 + 1) % 10 ** 4
            written = int(term[1:][::-1])
            assert written in (right, (right - 10) % 10 ** 4) and written % 10 == right % 10
            slips += written != right
            value = written
    assert abs(slips / carries - 0.8) < 0.02  # forgotten with p = 0.8 at every carry (3 sigma < 0.01)
    assert task.score(train[0]["ground_truth"], train[0]) == {"accuracy": 1.0, "term_accuracy": 1.0}


def test_countdown_tiny_rows_and_the_papers_reward_rule():
    """countdown_tiny (the suite's search task): 3 numbers in [1, 9] and a target in [1, 99]; the reference
    solution uses each number once and reaches the target; test problems are distinct and never in train;
    the reward is d1's / TinyZero's: 1 right, 0.1 well-formed but wrong (or other numbers), 0 no expression."""
    task, teacher = TASKS["countdown_tiny"], TASKS["countdown_tiny_teacher"]
    train, test = teacher.generate("train"), teacher.generate("test")
    assert test == task.generate("test") and len(train) == 50000 and len(test) == 500
    key = lambda r: (tuple(sorted(r["extra"]["numbers"])), r["extra"]["target"])  # noqa: E731
    assert len({key(r) for r in test}) == 500 and not {key(r) for r in train} & {key(r) for r in test}
    for r in train[:2000] + test:
        nums, target = r["extra"]["numbers"], r["extra"]["target"]
        assert len(nums) == 3 and all(1 <= n <= 9 for n in nums) and 1 <= target <= 99
        assert r["prompt"][0]["content"] == ",".join(map(str, nums)) + f":{target}="
        assert task.reward(r["extra"]["solution"], r) == 1.0
        assert set(r["prompt"][0]["content"] + r["extra"]["solution"]) <= set(task.alphabet)
    row = {"extra": {"numbers": [3, 7, 2], "target": 17}}
    assert task.reward("7*2+3", row) == 1.0 and task.reward(" (3*2)+(7+4)-4 ", row) == 0.1  # other numbers
    assert task.reward("3+7+2", row) == 0.1 and task.reward("7*2+", row) == 0.1  # well-formed, wrong / unparsable
    assert task.reward("", row) == 0.0 and task.reward("7*2+3=17", row) == 0.0  # no expression
    assert task.score("7*2+3", row) == {"accuracy": 1.0, "well_formed": 1.0}
    shown = [(teacher.target(r), r) for r in train[:5000]]
    assert all(task.reward(s, r) > 0 and sorted(map(int, re.findall(r"\d+", s))) == sorted(r["extra"]["numbers"])
               for s, r in shown)  # always well-formed, every number once
    guesses = [task.reward(s, r) for s, r in shown if s != r["extra"]["solution"]]
    assert abs(len(guesses) / 5000 - 0.7) < 0.03  # a guess with p = 0.7 (3 sigma: 0.02), else the solution
    assert 0.02 < guesses.count(1.0) / len(guesses) < 0.15  # a guess reaches the target by chance only
    assert len(set(s for s, r in shown if s != r["extra"]["solution"])) > 1000  # varied guesses, not one answer
    pairs = TASKS["countdown_tiny_pairs"]
    assert [(r["prompt"], r["extra"]["numbers"]) for r in pairs.generate("test")] == [
        (r["prompt"], r["extra"]["numbers"]) for r in test]
    for r in pairs.generate("test"):  # VRPO's pairs: the solution against a wrong well-formed answer
        assert pairs.reward(r["extra"]["chosen"], r) == 1.0 and pairs.reward(r["extra"]["rejected"], r) == 0.1
