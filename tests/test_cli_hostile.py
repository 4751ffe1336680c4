"""Hostile input to the command line (issue 45, items 9-10): each is refused quickly, with one clear line
(exit 2), before anything is written: paths that leave `dare results publish --to`, YAML alias bombs,
sweep grids of millions of runs, inf/nan settings, and a failed `dare train` leaves no empty run folder."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, dare_cli
from dare.app.cli import main
from dare.results import write_result
from test_results import make_result

FAST_S = 20.0
"""A refusal's wall time bound (a subprocess imports torch first; the bombs took 77 s and 6 GB before)."""


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[:2000]
    assert lines[0].startswith("error: ") and len(lines[0]) < 1200, lines[0][:2000]
    return lines[0]


# ---------------------------------------------------------------------------------------------
# 9. dare results publish: every path stays under --to
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("run_id", ["../../x", "..", ".", "a/b", "ABSOLUTE"])
def test_publish_refuses_a_run_id_that_is_not_a_plain_name(tmp_path, capsys, run_id):
    if run_id == "ABSOLUTE":
        run_id = str(tmp_path / "elsewhere")
    src = tmp_path / "work" / "run" / "result_addition.json"
    write_result(make_result(run_id=run_id), src)
    board = tmp_path / "work" / "board"
    before = files_under(tmp_path)
    t0 = time.perf_counter()
    assert main(["results", "publish", str(src), "--to", str(board)]) == 2
    assert time.perf_counter() - t0 < FAST_S
    line = one_error_line(capsys.readouterr().err)
    assert str(src) in line and "run_id=" in line and repr(run_id) in line and "nothing was published" in line
    assert files_under(tmp_path) == before  # nothing written anywhere, --to included


@pytest.mark.parametrize("field", ["config", "samples"])
def test_publish_refuses_an_artifact_outside_the_results_folder(tmp_path, capsys, field):
    """`artifacts.config: ../../X` (a file that exists there) was read from outside the result's folder and
    written to `--to/<run_id>/../../X`, outside --to."""
    work = tmp_path / "work"
    (work / "X").parent.mkdir(parents=True)
    (work / "X").write_text("x: 1\n")
    src = work / "runs" / "a" / "result_addition.json"
    write_result(make_result(artifacts={field: "../../X"}), src)
    board = work / "board" / "name"
    before = files_under(tmp_path)
    assert main(["results", "publish", str(src), "--to", str(board)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(src) in line and f"artifacts.{field}='../../X'" in line and "inside the result's folder" in line
    assert files_under(tmp_path) == before


def test_publish_refuses_an_artifact_symlinked_out_of_the_results_folder(tmp_path, capsys):
    secret = tmp_path / "secret.txt"
    secret.write_text("do not publish\n")
    src = tmp_path / "run" / "result_addition.json"
    src.parent.mkdir()
    (src.parent / "config.yaml").symlink_to(secret)
    write_result(make_result(artifacts={"config": "config.yaml"}), src)
    board = tmp_path / "board"
    assert main(["results", "publish", str(src), "--to", str(board)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "artifacts.config='config.yaml'" in line
    assert not board.exists()


def test_publish_refuses_a_destination_symlinked_out_of_to(tmp_path, capsys):
    """A run folder under --to that is a symlink elsewhere would have the copies written through it."""
    src = tmp_path / "run" / "result_addition.json"
    write_result(make_result(), src)
    board, elsewhere = tmp_path / "board", tmp_path / "elsewhere"
    board.mkdir()
    elsewhere.mkdir()
    (board / make_result()["run_id"]).symlink_to(elsewhere)
    assert main(["results", "publish", str(src), "--to", str(board)]) == 2
    assert "resolves outside --to" in one_error_line(capsys.readouterr().err)
    assert not any(elsewhere.iterdir())


def test_publish_checks_every_file_before_copying_the_first(tmp_path, capsys):
    good, bad = tmp_path / "good" / "result_addition.json", tmp_path / "bad" / "result_addition.json"
    write_result(make_result(), good)
    write_result(make_result(run_id="../escape"), bad)
    board = tmp_path / "board"
    assert main(["results", "publish", str(good), str(bad), "--to", str(board)]) == 2
    assert "run_id='../escape'" in one_error_line(capsys.readouterr().err)
    assert not board.exists()
    # and a plain result still publishes, with its artifacts
    (good.parent / "config.yaml").write_text("train: {lr: 0.001}\n")
    write_result(make_result(artifacts={"config": "config.yaml"}), good)
    assert main(["results", "publish", str(good), "--to", str(board)]) == 0
    assert (board / make_result()["run_id"] / "config.yaml").is_file()


# ---------------------------------------------------------------------------------------------
# 10a. YAML anchors and aliases (billion laughs), and huge values echoed in errors
# ---------------------------------------------------------------------------------------------


def alias_bomb(levels: int, width: int = 10) -> str:
    """`[&l0 [x, x, ...], &l1 [*l0, *l0, ...], ...]`: width**levels leaves from a few hundred bytes."""
    items = [f"&l0 [{', '.join(['x'] * width)}]"]
    items += [f"&l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return f"[{', '.join(items)}]"


def test_a_yaml_alias_bomb_in_a_config_file_is_refused_naming_the_file(tmp_path):
    """Under a known key (train.lr), 10^6 leaves: before, the error printed the expanded value (megabytes;
    at 10^9 leaves it took 77 s and a 6 GB MemoryError)."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(f"train:\n  lr: {alias_bomb(6)}\n")
    t0 = time.perf_counter()
    r = dare_cli("train", "sft", str(bomb), "--dry-run", timeout=120)
    assert time.perf_counter() - t0 < FAST_S
    assert r.returncode == 2
    line = one_error_line(r.stderr)
    assert str(bomb) in line and "aliases" in line and "not allowed" in line


def test_yaml_aliases_are_refused_in_overrides_sweeps_and_targets(tmp_path, capsys):
    assert main(["train", "sft", "--dry-run", "train.betas=[&a 0.9, *a]"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "command line: train.betas" in line and "aliases" in line
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"baseline: sft\ngrid:\n  run.seed: {alias_bomb(5)}\n")
    assert main(["sweep", str(sweep), "--dry-run"]) == 2
    assert "aliases" in one_error_line(capsys.readouterr().err)
    sweep.write_text("baseline: sft\ngrid:\n  run.seed: &s [0, 1]\n  train.steps: *s\n")
    assert main(["sweep", str(sweep), "--dry-run"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{sweep}, line 3" in line and "aliases" in line
    targets = tmp_path / "targets.yaml"
    targets.write_text("paper: &p {arxiv: '1', table: '1'}\nbase_model: *p\n")
    from dare.app.targets import load_targets
    from dare.utils import UserError

    with pytest.raises(UserError, match="aliases"):
        load_targets(targets)


def test_no_committed_yaml_uses_anchors_or_aliases():
    """The refusal breaks nothing in the repository: no committed YAML (or README front matter) has one."""
    import yaml

    files = subprocess.run(["git", "ls-files", "*.yaml", "*.yml", "baselines/*/README.md"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    assert files
    for name in files:
        text = (REPO / name).read_text()
        if name.endswith(".md"):
            if not text.startswith("---\n"):
                continue
            text = text[4:text.find("\n---", 4)]
        for event in yaml.parse(text):
            assert not isinstance(event, yaml.AliasEvent) and getattr(event, "anchor", None) is None, name


def test_errors_echo_a_huge_value_cut_short(capsys, tmp_path):
    huge = "9" * 50 + "x" * 100_000
    assert main(["train", "sft", "--dry-run", f"train.lr={huge}"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "train.lr" in line and "characters)" in line and len(line) < 400
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"model": {"family": "f" * 100_000}}))
    assert main(["train", "sft", str(cfg), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "model.family" in err and len(err) < 3000


# ---------------------------------------------------------------------------------------------
# 10b. a sweep's run count is capped before its grid is expanded
# ---------------------------------------------------------------------------------------------


def test_a_sweep_of_a_hundred_million_runs_is_refused_before_expanding(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    tenths = [i / 10 for i in range(1, 11)]  # every run a valid one: before, each was resolved, 10^8 of them
    grid = {"run.seed": list(range(10)), "run.log_every": list(range(1, 11)), "run.save_every": list(range(10)),
            "train.logit_chunk": list(range(1, 11)), "train.lr": tenths, "train.weight_decay": tenths,
            "train.min_lr_ratio": [t / 2 for t in tenths], "train.max_grad_norm": tenths}
    sweep.write_text(json.dumps({"baseline": "sft", "grid": grid}))
    t0 = time.perf_counter()
    r = dare_cli("sweep", str(sweep), "--dry-run", timeout=60, env={"DARE_RUNS": str(tmp_path / "runs")})
    assert time.perf_counter() - t0 < FAST_S
    assert r.returncode == 2
    line = one_error_line(r.stderr)
    assert "100,000,000 runs" in line and "10,000" in line and "--max-runs" in line
    assert not (tmp_path / "runs").exists()


def test_the_sweep_cap_counts_methods_and_can_be_raised(tmp_path, capsys):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("baseline: sft\ngrid:\n  run.seed: [0, 1, 2]\n")
    assert main(["sweep", str(sweep), "--dry-run", "--max-runs", "2"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "3 runs" in line and "cap of 2" in line
    assert main(["sweep", str(sweep), "--dry-run", "--max-runs", "3"]) == 0
    assert capsys.readouterr().out.count("pending  run.seed=") == 3


# ---------------------------------------------------------------------------------------------
# 10c. inf and nan are no setting
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("override", ["train.lr=.inf", "train.lr=nan", "train.lr=-.inf", "train.lr=inf",
                                      "train.lr=1.0e999", "rl.decoding.temperature=.nan", "rl.collapse_below=.inf"])
def test_non_finite_floats_are_refused_on_the_command_line(capsys, override):
    key = override.split("=")[0]
    assert main(["train", "d1", "--dry-run", override]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"command line: {key}: must be a finite number" in line


def test_non_finite_floats_are_refused_in_config_files(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  lr: .nan\n")
    assert main(["train", "sft", str(cfg), "--dry-run"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{cfg}: train.lr: must be a finite number" in line
    cfg.write_text("train:\n  lr: 0.001\n")  # a finite value as before
    assert main(["train", "sft", str(cfg), "--dry-run"]) == 0


# ---------------------------------------------------------------------------------------------
# 10d. a dare train that fails before its first step leaves no run folder
# ---------------------------------------------------------------------------------------------

TINY = ["model.scratch.d_model=32", "model.scratch.n_heads=2", "model.scratch.n_layers=1",
        "model.scratch.mlp_hidden_size=64", "train.batch_size=8", "train.warmup_steps=0",
        "algo.response_length=4", "run.threads=1"]


def test_a_train_failing_before_its_first_step_leaves_no_run_folder(tmp_path, capsys):
    empty = tmp_path / "not_a_checkpoint"
    empty.mkdir()
    out = tmp_path / "runs" / "new" / "r1"
    assert main(["train", "sft", f"model.path={empty}", f"run.out_dir={out}", "train.steps=1", *TINY]) == 2
    assert "not a checkpoint folder" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # the run folder and the parents it made
    # a folder that was there before (a run being resumed) is kept, whatever it holds
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("mine\n")
    assert main(["train", "sft", f"model.path={empty}", f"run.out_dir={out}", "train.steps=1", *TINY]) == 2
    assert (out / "notes.txt").read_text() == "mine\n"


def test_a_train_crashing_after_its_first_step_keeps_its_folder(tmp_path, monkeypatch):
    from dare.train import loop

    original = loop.Loop.end_step

    def crash_at_step_2(self, done, *args, **kwargs):
        original(self, done, *args, **kwargs)
        if done == 2:
            raise RuntimeError("simulated crash")

    monkeypatch.setattr(loop.Loop, "end_step", crash_at_step_2)
    out = tmp_path / "runs" / "r1"
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(["train", "sft", f"run.out_dir={out}", "train.steps=3", "run.save_every=1", "run.log_every=1", *TINY])
    assert (out / "checkpoints").is_dir() and (out / "run.json").is_file() and (out / "metrics.jsonl").is_file()


# ---------------------------------------------------------------------------------------------
# Issue 60: no training log copied through a link out of its run folder; absurd plan and bench input
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout, command", [("train", "publish"), ("sweep", "publish"), ("sweep", "collect")])
def test_no_training_log_is_copied_through_a_link_out_of_its_run_folder(tmp_path, capsys, layout, command):
    """A run's metrics.jsonl linked to a file outside its folder (/proc/self/environ: the publisher's HF_TOKEN) was
    copied into the published folder. The publish is refused in one line naming the log, before anything is
    written (as an artifact linked out is); the same log as a plain file is published with the result."""
    from test_sweep import _evaluated, load_sweep, write_sweep

    secret = tmp_path / "environ"
    secret.write_text("HF_TOKEN=hf_not_to_be_published\n")
    if layout == "train":  # `dare train` run: <run>/metrics.jsonl, its evaluation in <run>/eval/<hash>/
        src = tmp_path / "runs" / "r1" / "eval" / "0123abcd" / "result_addition.json"
        write_result(make_result(), src)
        log = src.parents[2] / "metrics.jsonl"
    else:  # a sweep's run: <run>/train/metrics.jsonl, its evaluation in <run>/eval/
        sweep = load_sweep(write_sweep(tmp_path, "s", {"run.seed": [0]}))
        src = _evaluated(sweep.runs[0], "linked")
        log = src.parent.parent / "train" / "metrics.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.symlink_to(secret)
    board = tmp_path / "board"
    if command == "collect":
        assert main(["sweep", "collect", str(sweep.path), "--to", str(board)]) == 2
    else:
        assert main(["results", "publish", str(src), "--to", str(board)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(log) in line and f"a link to {secret}" in line and "nothing was published" in line, line
    assert not board.exists()
    log.unlink()
    log.write_text('{"step": 1, "loss": 0.5}\n')
    if command == "collect":
        assert main(["sweep", "collect", str(sweep.path), "--to", str(board)]) == 0
    else:
        assert main(["results", "publish", str(src), "--to", str(board)]) == 0
    assert [p.read_text() for p in board.glob("*/metrics.jsonl")] == ['{"step": 1, "loss": 0.5}\n']


def _config_json(folder: Path, **changes) -> Path:
    """A checkpoint folder holding only LLaDA-8B's released config.json, with `changes`."""
    from dare.models.registry import family_module

    module = family_module("llada")
    _, kwargs = module.RELEASED
    folder.mkdir(parents=True)
    config = json.loads(module.MODEL_CLASS.config_class(**kwargs).to_json_string())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.mark.parametrize("changes, shown", [
    ({"n_layers": 10**9}, "n_layers=1000000000: a size must be an integer in [0, 1,024]"),  # hung, 4.7 GB at 120 s
    ({"n_heads": -4}, "n_heads=-4: a size must be an integer in [0, 1,048,576]"),  # a traceback
    ({"d_model": 2**20}, "dare plan builds one on the CPU to measure it, and allows"),  # asked for terabytes
])
def test_dare_plan_refuses_an_absurd_config_before_building_it(tmp_path, capsys, changes, shown):
    folder = _config_json(tmp_path / "ckpt", **changes)
    t0 = time.perf_counter()
    assert main(["plan", "d1", f"model.path={folder}"]) == 2
    assert shown in one_error_line(capsys.readouterr().err)
    assert time.perf_counter() - t0 < FAST_S


@pytest.mark.parametrize("option, value, shown", [
    ("--gpu-memory", "nan", "--gpu-memory=nan: must be a finite number > 0"),  # a traceback
    ("--gpu-memory", "inf", "--gpu-memory=inf: must be a finite number > 0"),
    ("--prompt-length", "-100000", "--prompt-length=-100000: must be a finite number >= 1"),  # "fits, peak -3162 GiB"
    ("--length", "0", "--length=0: must be a finite number >= 1"),
    ("--gpus", "-2", "--gpus=-2: must be a finite number >= 1"),
])
def test_dare_plan_refuses_an_option_out_of_range_in_one_line(capsys, option, value, shown):
    assert main(["plan", "d1", "model.path=/nowhere", "--released", option, value]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: dare plan: {shown}"


@pytest.mark.parametrize("what, option, value", [
    ("rewards", "--n", "0"), ("rewards", "--n", "-5"), ("rewards", "--workers", "-3"),
    ("estimators", "--draws", "-1"), ("rollout", "--prompts", "-1"), ("gpu", "--budget", "nan"),
])
def test_dare_bench_refuses_a_count_out_of_range_before_benchmarking(monkeypatch, capsys, what, option, value):
    """The former code ran the benchmark: a traceback (--n 0, --workers -3) or a report of negative rates (--n -5)."""
    from dare.app import bench, bench_estimators, bench_gpu

    def ran(*args, **kwargs):
        raise AssertionError("the benchmark ran")

    for module, name in ((bench, "rewards_benchmark"), (bench, "rollout_benchmark"),
                         (bench_estimators, "estimators_benchmark"), (bench_gpu, "gpu_benchmark")):
        monkeypatch.setattr(module, name, ran)
    assert main(["bench", what, option, value]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: dare bench {what}: {option}={value}: must be a finite number")


def test_dare_bench_gpu_without_out_writes_under_runs_and_says_where(tmp_path, monkeypatch, capsys):
    """It wrote into leaderboard/results/bench-gpu/, the checkout's committed results."""
    from dare.app import bench_gpu

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setenv("DARE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(bench_gpu, "experts_benchmark", stop)  # the first stage: where it writes is known by then
    with pytest.raises(Stop):
        bench_gpu.gpu_benchmark("cpu", "float32", shrink=True, run_tests=False)
    said = capsys.readouterr().out
    assert "report -> " in said and str(tmp_path / "runs" / "bench" / "gpu-cpu-") in said, said
    with pytest.raises(Stop):  # a folder given: the report inside it, under its usual name
        bench_gpu.gpu_benchmark("cpu", "float32", shrink=True, run_tests=False, out=f"{tmp_path}/board/")
    assert f"report -> {tmp_path}/board/gpu-cpu-" in capsys.readouterr().out


def test_the_hostile_file_tests_pass_as_an_unprivileged_user():
    """Issue 60: the hostile inputs of this file and of test_leaderboard_hostile.py (links out of their folder,
    FIFOs, /dev/zero, bad published files, absurd plan and bench input) hold for a user without privileges too
    (root reads what a user cannot, so a check could pass for one and not the other). The test creates the user
    and reruns both files as it, on the system python3 with this environment's packages (the project's
    interpreter may live where the user cannot read) and a `dare` on PATH that runs the same code."""
    import shutil
    import tempfile

    python = "/usr/bin/python3"
    if os.geteuid() != 0 or not os.path.exists(python) or shutil.which("su") is None:
        pytest.skip("needs root (to create the user), su and the system python3")
    version = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                             text=True).stdout.strip()
    if version != str(sys.version_info[:2]):
        pytest.skip(f"the system python3 is {version}, this environment's packages are for {sys.version_info[:2]}")
    user = "dare-sandbox-test"
    if subprocess.run(["id", user], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", user], check=True)
    import site

    packages = next(p for p in site.getsitepackages() if p.endswith("site-packages"))
    work = Path(tempfile.mkdtemp(prefix="dare-unprivileged-"))
    try:
        (work / "bin").mkdir()
        (work / "bin" / "dare").write_text(f'#!/bin/sh\nexec {python} -m dare.app.cli "$@"\n')
        (work / "cwd").mkdir()
        for path in (work, work / "bin", work / "bin" / "dare", work / "cwd"):
            os.chmod(path, 0o755)
        os.chown(work / "cwd", int(subprocess.run(["id", "-u", user], capture_output=True, text=True).stdout), -1)
        env = (f"HOME={work}/cwd PATH={work}/bin:/usr/bin:/bin PYTHONPATH={REPO}/shared:{REPO}:{packages} "
               "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'")
        files = " ".join(str(REPO / "tests" / f) for f in ("test_cli_hostile.py", "test_leaderboard_hostile.py"))
        command = (f"cd {work}/cwd && env {env} {python} -m pytest -q -p no:cacheprovider {files} "
                   "-k 'not unprivileged_user'")
        r = subprocess.run(["su", user, "-s", "/bin/sh", "-c", command], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-1000:]
        assert " passed" in r.stdout and "failed" not in r.stdout.splitlines()[-1], r.stdout[-1000:]
    finally:
        shutil.rmtree(work, ignore_errors=True)
