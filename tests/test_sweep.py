"""`dare sweep` against a real one-node SLURM cluster (slurmctld + slurmd + munge on this host,
started by the fixture), through submitit's SLURM executor; plus validation and the local path."""

import collections.abc
import json
import os
import signal
import subprocess
import sys
import time
import types
import typing
from pathlib import Path

import pytest
import yaml

from dare.app.sweep import (SLURM_RENAMED, SlurmSection, SweepFile, launch, load_sweep, render_sbatch, results_of,
                            sbatch_script, slurm_parameters, state)
from dare.utils import UserError
from slurm_cluster import Cluster

REPO = Path(__file__).resolve().parents[1]
TINY = {"model.scratch.d_model": 32, "model.scratch.n_heads": 2, "model.scratch.n_layers": 1,
        "model.scratch.mlp_hidden_size": 64, "train.batch_size": 16, "train.lr": 1e-3, "train.warmup_steps": 0,
        "algo.response_length": 4, "run.threads": 1, "run.log_every": 1}


def write_sweep(folder: Path, name: str, grid: dict, steps: int = 3, **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "eval.yaml").write_text(yaml.safe_dump({"eval": {
        "benchmarks": ["addition"], "n_samples": 20, "batch_size": 20,
        "decoding": {"gen_length": 4, "block_length": 4, "steps": 4}}}))
    spec = {"baseline": "sft", "overrides": {**TINY, "train.steps": steps}, "grid": grid,
            "eval": {"config": "eval.yaml"}, "slurm": {"cpus_per_task": 1, "mem_gb": 2, "time_min": 10},
            "out_dir": str(folder / "runs")}
    spec.update(extra)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


# ---------------------------------------------------------------------------------------------
# Validation and the local path (no cluster)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("change,message", [
    ({"baseline": "nope"}, "baseline: unknown baseline 'nope'"),
    ({"grid": {}}, "grid: empty"),
    ({"grid": {"run.seed": []}}, "grid.run.seed: must be a non-empty list"),
    ({"grid": {"run.seed": 0}}, "grid.run.seed: expected list, got 0"),
    # the configs' loader: unknown keys with a "did you mean", types, finite numbers, at any depth
    ({"colour": "red"}, "unknown key 'colour'"),
    ({"overides": {"train.steps": 2}}, "unknown key 'overides' (did you mean 'overrides'?)"),
    ({"eval": {"config": "eval.yaml", "benchmarks": ["gsm8k"]}}, "unknown key 'eval.benchmarks'"),
    ({"out_dir": 5}, "out_dir: expected str | None, got 5"),
    ({"overrides": {"train.lr": float("nan")}}, "overrides.train.lr: must be a finite number"),
    ({"slurm": {"gpus": 8}}, "unknown key 'slurm.gpus'"),
    ({"slurm": {"constrant": "a100"}}, "unknown key 'slurm.constrant' (did you mean 'slurm.constraint'?)"),
    ({"slurm": {"setup": "module load cuda"}}, "slurm.setup: expected list[str] | None, got 'module load cuda'"),
    ({"slurm": {"additional_parameters": ["--hold"]}},
     "slurm.additional_parameters: expected dict[str, Any] | None, got ['--hold']"),
    ({"slurm": {"mem_gb": "8G"}}, "slurm.mem_gb: expected float | None, got '8G'"),
    ({"slurm": {"mem_gb": float("inf")}}, "slurm.mem_gb: must be a finite number"),
    ({"slurm": {"nodes": True}}, "slurm.nodes: expected int | None, got True"),
    ({"slurm": 8}, "slurm: expected a mapping of SlurmSection fields, got 8"),
    ({"slurm": {"mem_gb": 8, "mem": "8G"}}, "slurm: mem and mem_gb both set submitit's mem; give one"),
    ({"slurm": {"time_min": 8, "timeout_min": 9}}, "slurm: time_min and timeout_min both set submitit's time; give one"),
    ({"grid": {"train.lrr": [1]}}, "run train.lrr=1: command line: unknown key 'train.lrr'"),
])
def test_bad_sweep_files_fail_with_a_clear_message(tmp_path, change, message):
    path = write_sweep(tmp_path, "s", {"run.seed": [0]})
    spec = {**yaml.safe_load(path.read_text()), **change}
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(UserError) as e:
        load_sweep(path)
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value)


@pytest.mark.parametrize("section,expected", [
    ({}, {"nodes": 1, "ntasks_per_node": 1, "cpus_per_task": 2, "mem": "8GB", "time": 60, "signal_delay_s": 120,
          "array_parallelism": 64}),
    ({"gpus_per_node": 4, "mem_gb": 480, "time_min": 2880, "account": None},  # our names; null: not set
     {"nodes": 1, "gpus_per_node": 4, "ntasks_per_node": 4, "cpus_per_task": 2, "mem": "480GB", "time": 2880,
      "signal_delay_s": 120, "array_parallelism": 64}),
    ({"tasks_per_node": 2, "timeout_min": 30, "mem_per_gpu": "40G", "cpus_per_gpu": 4},  # no --mem, --cpus-per-task
     {"nodes": 1, "ntasks_per_node": 2, "time": 30, "mem_per_gpu": "40G", "cpus_per_gpu": 4, "signal_delay_s": 120,
      "array_parallelism": 64}),
])
def test_slurm_section_becomes_submitits_parameters(section, expected):
    assert slurm_parameters(Path("s.yaml"), SlurmSection(**section)) == expected


def test_null_sections_are_left_out(tmp_path):
    """`slurm: null` (eval, init) is the section unset, as before the sweep file was a typed config."""
    path = write_sweep(tmp_path, "s", {"run.seed": [0]}, slurm=None, eval=None, init=None)
    sweep = load_sweep(path)
    assert sweep.slurm == slurm_parameters(path, SlurmSection()) and sweep.eval_config is None and sweep.init is None


LAB = {"cpus_per_task": 1, "mem_gb": 2, "time_min": 10, "gpus_per_node": 2, "partition": "gpu", "account": "lab",
       "qos": "high", "constraint": "a100|h100", "exclude": "node[01-02]",
       "setup": ["module load cuda/12.1", "source /opt/envs/dare/bin/activate"],
       "additional_parameters": {"reservation": "mine", "mail-type": "END"}}


def test_dry_run_prints_the_sbatch_script_submitit_writes(tmp_path, capsys):
    """A lab's options (partition, account, qos, constraint, exclude, setup lines, raw sbatch options)
    reach the printed script as the real `#SBATCH` lines, not as submitit's parameter names."""
    sweep = load_sweep(write_sweep(tmp_path, "s", {"run.seed": [0, 1]}, slurm=LAB))
    launch(sweep, dry_run=True)
    out = capsys.readouterr().out
    script = out.split("sbatch script submitit writes for the runs:\n", 1)[1]
    assert script.strip() == sbatch_script(sweep, 2).strip()
    lines = script.splitlines()
    for line in ["#SBATCH --mem=2GB", "#SBATCH --time=10", "#SBATCH --cpus-per-task=1", "#SBATCH --gpus-per-node=2",
                 "#SBATCH --ntasks-per-node=2", "#SBATCH --partition=gpu", "#SBATCH --account=lab",
                 "#SBATCH --qos=high", "#SBATCH --constraint='a100|h100'", "#SBATCH --exclude='node[01-02]'",
                 "#SBATCH --reservation=mine", "#SBATCH --mail-type=END", "#SBATCH --signal=USR2@120",
                 "#SBATCH --array=0-1%2"]:
        assert line in lines, line
    assert not [line for line in lines if "mem_gb" in line or "time_min" in line or "delay_s" in line]
    setup = lines.index("# setup")
    assert lines[setup + 1:setup + 3] == LAB["setup"] and lines.index("# command") > setup
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


# submitit's private writer and tables, the reference of ours: used here only, never in shared/
# (tests/test_structure.py::test_no_private_submitit)


def _plain(hint):
    """An annotation without its None: `str | None` and `Optional[str]` -> str, an iterable -> list."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return _plain(rest[0]) if len(rest) == 1 else frozenset(map(_plain, rest))
    if origin in (list, collections.abc.Iterable):
        return ("list", _plain(args[0]))
    if origin is dict:
        return ("dict", _plain(args[0]), _plain(args[1]))
    return hint


def test_our_slurm_table_is_submitits():
    """SlurmSection holds every SlurmExecutor parameter with submitit's type, its shared names (renamed
    as SlurmExecutor renames them) and our time_min, and nothing else."""
    import submitit
    from submitit.slurm import slurm

    hints = typing.get_type_hints(slurm._make_sbatch_string)
    theirs = {k: hints[k] for k in slurm._get_default_parameters()}
    shared, renamed = submitit.AutoExecutor._typed_parameters(), slurm.SlurmExecutor._equivalence_dict()
    ours = typing.get_type_hints(SlurmSection)
    assert set(ours) == set(theirs) | set(shared) | {"time_min"}
    assert all(typing.get_args(t)[-1] is type(None) for t in ours.values())  # null: unset
    assert {k: _plain(ours[k]) for k in theirs} == {k: _plain(t) for k, t in theirs.items()}
    assert {k: _plain(ours[k]) for k in shared} == shared
    assert {k: SLURM_RENAMED.get(k, k) for k in shared} == {k: renamed.get(k, k) for k in shared}
    assert SLURM_RENAMED["time_min"] == renamed["timeout_min"] and set(SLURM_RENAMED) - set(shared) == {"time_min"}


def test_submitit_takes_every_parameter_we_pass_it(tmp_path):
    """Through its public API: AutoExecutor.update_parameters refuses a slurm_ parameter SlurmExecutor lacks
    (by name; the values of another cluster's parameters are not looked at, null ones not even their names)."""
    import submitit

    names = {SLURM_RENAMED.get(f, f) for f in typing.get_type_hints(SlurmSection)}
    submitit.AutoExecutor(folder=tmp_path, cluster="debug").update_parameters(**{f"slurm_{n}": "x" for n in names})
    with pytest.raises(NameError):
        submitit.AutoExecutor(folder=tmp_path, cluster="debug").update_parameters(slurm_time_min=1)


@pytest.mark.parametrize("gb", [8, 480, 0.5, 1.5, 2.25, 0.001])
def test_mem_gb_is_written_as_submitit_writes_it(gb):
    from submitit.slurm import slurm

    assert slurm_parameters(Path("s.yaml"), SlurmSection(mem_gb=gb))["mem"] == slurm._convert_mem(gb)


SLURM_SECTIONS = [
    {},
    LAB,
    {"nodes": 2, "gpus_per_node": 8, "mem_per_gpu": "40G", "cpus_per_gpu": 4, "gpus_per_task": 1, "exclusive": True,
     "job_name": "my run", "comment": "a 'quoted' comment", "mail_type": "END,FAIL", "srun_args": ["--cpu-bind=none"],
     "teardown": ["echo done"], "stderr_to_stdout": True, "array_parallelism": 3, "wckey": "lab"},
    {"num_gpus": 2, "use_srun": False, "exclusive": "user", "dependency": "afterok:12", "nodelist": "node[1-2]",
     "gres": "gpu:2", "additional_parameters": {"hold": True, "mail_user": "me@lab.org", "nice": 10}},
    {"name": "n", "timeout_min": 30, "tasks_per_node": 2, "mem_gb": 1.5, "signal_delay_s": 0},
]


@pytest.mark.filterwarnings("ignore:.*(num_gpus|cpus_per_gpu)")
@pytest.mark.parametrize("map_count", [None, 2, 300])
@pytest.mark.parametrize("section", SLURM_SECTIONS, ids=range(len(SLURM_SECTIONS)))
def test_our_sbatch_writer_is_submitits(section, map_count):
    from submitit.slurm import slurm

    params = slurm_parameters(Path("s.yaml"), SlurmSection(**section))
    folder, command = Path("/runs/sweeps/s/submitit/%j"), "/venv/bin/python -u -m submitit.core._submit /x"
    assert render_sbatch(params, command, folder, map_count) == \
        slurm._make_sbatch_string(command=command, folder=folder, map_count=map_count, **params)


def test_committed_sweeps_get_submitits_sbatch_script():
    """Every reproduction's slurm: section, as submitit writes it (the sections only: no run is resolved)."""
    from submitit.slurm import slurm

    from dare.config import load, read_yaml

    paths = sorted((REPO / "reproductions").glob("**/sweep*.yaml"))
    assert len(paths) > 20
    for path in paths:
        params = slurm_parameters(path, load(SweepFile, path, data=read_yaml(path)).slurm)
        assert render_sbatch(params, "cmd", "/f/%j", 3) == slurm._make_sbatch_string("cmd", "/f/%j", map_count=3,
                                                                                     **params), path


def test_run_ids_are_deterministic_and_distinct(tmp_path):
    a = load_sweep(write_sweep(tmp_path, "s", {"run.seed": [0, 1, 2]}))
    b = load_sweep(write_sweep(tmp_path, "s", {"run.seed": [0, 1, 2]}))
    assert [r.id for r in a.runs] == [r.id for r in b.runs] and len({r.id for r in a.runs}) == 3


def test_local_sweep_runs_each_run_and_a_failure_stays_alone(tmp_path):
    path = write_sweep(tmp_path, "s", {"model.path": [None, "/nonexistent/checkpoint"]})
    sweep = load_sweep(path)
    launch(sweep, cluster="local")
    states = {r.name: state(r) for r in sweep.runs}
    assert states["model.path=null"][0] == "done" and results_of(sweep.runs[0])
    bad_state, log = states["model.path=/nonexistent/checkpoint"]
    assert bad_state == "failed" and "/nonexistent/checkpoint" in Path(log).read_text()
    assert [r.id for r in launch(load_sweep(path), cluster="local")] == [sweep.runs[1].id]  # only the failed one


def test_the_papers_numbers_come_from_targets_yaml_into_every_result(tmp_path, capsys):
    """The paper-number loop: targets.yaml (percent) beside the sweep -> the sweep's evaluation writes
    `reference` (a fraction, with whether the protocol matches) -> collect publishes and compares ->
    the leaderboard's reproduction view shows ours against the paper."""
    import importlib.util

    from dare.app.sweep import collect
    from dare.results import load_results, read_result

    (tmp_path / "train.yaml").write_text("baseline: sft\n")
    (tmp_path / "targets.yaml").write_text(yaml.safe_dump({
        "paper": {"arxiv": "0000.00000", "table": "Table 9"}, "base_model": "tiny", "tolerance": 2.0,
        "eval": {"split": "test", "block_length": 4, "steps_per_token": 1.0, "temperature": 0.0, "n_shot": 0},
        "targets": [{"config": "train.yaml", "benchmark": "addition", "gen_length": 4, "value": 90.0}]}))
    sweep = load_sweep(write_sweep(tmp_path, "c", {"run.seed": [0]}, config="train.yaml"))
    launch(sweep, cluster="local")
    for r in sweep.runs:  # written by the evaluation itself
        [path] = results_of(r)
        assert read_result(path).reference.model_dump() == {"value": 0.9, "source": "Table 9 (arXiv 0000.00000)",
                                                            "same_decoding": True}
    [copied] = collect(sweep, tmp_path / "published", allow_dirty=True)  # made from whatever tree runs the suite
    assert read_result(copied).reference.value == 0.9
    value = read_result(copied).metrics[0].value
    out = capsys.readouterr().out
    assert f"addition (gen 4): ours {value:.4f} over 1 run(s) vs paper 0.9000 (Table 9" in out
    spec = importlib.util.spec_from_file_location("board", REPO / "leaderboard" / "load.py")
    board = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(board)
    [row] = board.reproduction_rows(load_results(tmp_path / "published")[0])
    assert row["paper"] == 90.0 and row["seeds"] == 1 and row["source"] == "Table 9 (arXiv 0000.00000)"
    # a sweep file with the old `expect:` key is told where the numbers live now
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump({**yaml.safe_load((tmp_path / "c.yaml").read_text()),
                                   "expect": [{"benchmark": "addition", "value": 0.9}]}))
    with pytest.raises(UserError, match="targets.yaml beside the sweep file"):
        load_sweep(old)


def test_several_methods_from_one_trained_start(tmp_path, capsys):
    """The tiny-task comparison as a sweep: `init` is trained once and evaluated, every method's runs
    start from its final checkpoint, `--only` selects a method, and collecting twice publishes
    nothing twice (the start included)."""
    from dare.app.sweep import collect, matches

    tiny = {k: v for k, v in TINY.items() if not k.startswith("model.scratch")}
    (tmp_path / "start.yaml").write_text(yaml.safe_dump({"baseline": "sft", "train": {"steps": 2, "warmup_steps": 0}, "model": {
        "scratch": {k.split(".")[-1]: v for k, v in TINY.items() if k.startswith("model.scratch")}},
        "algo": {"response_length": 4}}))
    (tmp_path / "peft.yaml").write_text(yaml.safe_dump({"baseline": "peft", "model": {"lora": {"rank": 4}},
                                                        "algo": {"response_length": 4}}))
    path = write_sweep(tmp_path, "m", {"run.seed": [0]}, steps=2, init={"config": "start.yaml"},
                       methods={"sft": None, "peft": "peft.yaml"})
    spec = yaml.safe_load(path.read_text())
    del spec["baseline"]
    spec["overrides"] = {**tiny, "train.steps": 2}
    path.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(path)
    assert sorted(r.name for r in sweep.runs) == ["baseline=peft,run.seed=0", "baseline=sft,run.seed=0"]
    launched = launch(sweep, cluster="local", only={"baseline": "peft"})
    assert {r.baseline for r in launched} == {"peft"} and state(sweep.init)[0] == "done"
    start = json.loads((sweep.init.dir / "status.json").read_text())["run"]
    for r in sweep.runs:
        meta = json.loads((r.dir / "train" / "final" / "dare.json").read_text()) if r.baseline == "peft" else None
        assert (state(r)[0] == "done") == (r.baseline == "peft")
        if meta:
            assert meta["init"]["config_hash"] == json.loads((Path(start) / "run.json").read_text())["config_hash"]
    assert [matches(r, {"baseline": "peft", "run.seed": "0"}) for r in sweep.runs].count(True) == 1
    assert not any(matches(r, {"run.seed": "1"}) for r in sweep.runs)
    first = collect(sweep, tmp_path / "board", allow_dirty=True)  # made from whatever tree runs the suite
    assert len(first) == 2  # the start and the peft run (the sft run was not launched)
    out = capsys.readouterr().out
    assert "sft (start)" in out and "peft" in out and "± " in out
    again = collect(sweep, tmp_path / "board", allow_dirty=True)
    assert sorted(again) == sorted(first) and len(list((tmp_path / "board").iterdir())) == 2


def test_method_overrides_reach_one_method_and_leave_the_others_ids_alone(tmp_path):
    """`method_overrides`: one method's own settings after the sweep's `overrides` (the suite's cj_grpo, whose
    ascending schedule fixes its step count from the length); the other methods' runs keep the ids they had
    without it; a name that is not one of the methods is refused in one line."""
    spec = {"methods": {"sft": None, "peft": None}, "overrides": {**TINY, "train.steps": 2}, "grid": {"run.seed": [0]},
            "out_dir": str(tmp_path / "runs")}
    before = tmp_path / "before.yaml"
    before.write_text(yaml.safe_dump(spec))
    after = tmp_path / "after.yaml"
    after.write_text(yaml.safe_dump({**spec, "method_overrides": {"peft": {"train.lr": 0.003}}}))
    ids = {r.baseline: (r.id, r.overrides) for r in load_sweep(before).runs}
    new = {r.baseline: (r.id, r.overrides) for r in load_sweep(after).runs}
    assert new["sft"] == ids["sft"] and new["peft"][0] != ids["peft"][0]
    assert "train.lr=0.003" in new["peft"][1] and "train.lr=0.003" not in new["sft"][1]
    after.write_text(yaml.safe_dump({**spec, "method_overrides": {"d1": {"train.lr": 0.003}}}))
    with pytest.raises(UserError, match=r"method_overrides.'d1': not one of the sweep's methods \(peft, sft\)"):
        load_sweep(after)


def _evaluated(run, tag: str, commit: str = "a" * 40, dirty: bool | None = False) -> Path:
    """A result in `run`'s eval folder, as its evaluation would write it, made at `commit` (dirty or not):
    a committed result of the tiny task with its run id and provenance changed."""
    source = sorted((REPO / "leaderboard" / "results" / "tiny-llada-espo").glob("*/result_addition.json"))[0]
    result = json.loads(source.read_text())
    result["run_id"] = f"{result['run_id']}-{tag}"
    result["provenance"].update(git_commit=commit, git_dirty=dirty)
    (run.dir / "eval").mkdir(parents=True)
    for name in ("samples_addition.jsonl", "config.yaml"):
        (run.dir / "eval" / name).write_text((source.parent / name).read_text())
    (run.dir / "eval" / "result_addition.json").write_text(json.dumps(result))
    return run.dir / "eval" / "result_addition.json"


def test_collect_refuses_a_result_made_from_a_dirty_tree_unless_allowed(tmp_path, capsys):
    """Issue 49: `dare sweep collect` copied a run made from a tree with uncommitted changes without a word, and
    the repository's tests refused it later. It names the run and its file and copies nothing; `allow_dirty`
    (--allow-dirty) copies it with a warning on stderr."""
    from dare.app.sweep import collect

    sweep = load_sweep(write_sweep(tmp_path, "s", {"run.seed": [0, 1]}))
    _evaluated(sweep.runs[0], "clean")
    dirty = _evaluated(sweep.runs[1], "dirty", dirty=True)
    with pytest.raises(UserError, match=rf"^{dirty}: run run.seed=1 of .*uncommitted changes.*--allow-dirty"):
        collect(sweep, tmp_path / "board")
    assert not (tmp_path / "board").exists()
    (tmp_path / "nogit").mkdir()
    outside = load_sweep(write_sweep(tmp_path / "nogit", "s", {"run.seed": [0]}))
    _evaluated(outside.runs[0], "nogit", commit=None, dirty=None)
    with pytest.raises(UserError, match="run run.seed=0 of .*outside a git checkout"):
        collect(outside, tmp_path / "board")
    from dare.app.cli import main

    capsys.readouterr()
    assert main(["sweep", "collect", str(sweep.path), "--to", str(tmp_path / "board")]) != 0
    assert str(dirty) in capsys.readouterr().err and not (tmp_path / "board").exists()
    assert main(["sweep", "collect", str(sweep.path), "--to", str(tmp_path / "board"), "--allow-dirty"]) == 0
    err = capsys.readouterr().err
    assert f"WARNING: {dirty}: run run.seed=1" in err and "run.seed=0" not in err
    assert len(list((tmp_path / "board").iterdir())) == 2


def test_collect_refuses_a_folder_of_two_commits(tmp_path):
    """A results folder holds one commit's runs (tests/test_leaderboard.py); collecting a new commit's runs into
    a folder of an earlier commit (CONTRIBUTING's former route into leaderboard/results/tiny/) is refused at
    collect time, naming both commits, and so is a sweep whose own runs come from two commits."""
    from dare.app.sweep import collect

    earlier = load_sweep(write_sweep(tmp_path / "earlier", "s", {"run.seed": [0]}))
    _evaluated(earlier.runs[0], "earlier", commit="1" * 40)
    assert len(collect(earlier, tmp_path / "board")) == 1
    assert len(collect(earlier, tmp_path / "board")) == 1  # the same runs again: nothing new, no conflict
    sweep = load_sweep(write_sweep(tmp_path / "mine", "s", {"run.seed": [0, 1]}))
    for run in sweep.runs:
        _evaluated(run, run.id, commit="2" * 40)
    with pytest.raises(UserError, match=r"board: would hold results of 2 commits \(1111111: 1 already there; "
                                        r"2222222: 2 from this sweep\); a results folder holds one commit's runs"):
        collect(sweep, tmp_path / "board")
    assert len(list((tmp_path / "board").iterdir())) == 1
    assert len(collect(sweep, tmp_path / "board-mine")) == 2  # a folder of its own
    mixed = load_sweep(write_sweep(tmp_path / "mixed", "s", {"run.seed": [0, 1]}))
    for run, commit in zip(mixed.runs, ("3" * 40, "4" * 40)):
        _evaluated(run, run.id, commit=commit)
    with pytest.raises(UserError, match=r"2 commits \(3333333: 1 from this sweep; 4444444: 1 from this sweep\)"):
        collect(mixed, tmp_path / "board-mixed")


def test_collect_says_how_to_evaluate_the_start_again_when_only_it_is_of_another_commit(tmp_path):
    """A sweep whose start was evaluated by an earlier sweep (another commit) and whose runs are of one commit:
    the refusal names the one command that evaluates the start again at the runs' commit."""
    from dare.app.sweep import collect

    (tmp_path / "start.yaml").write_text("baseline: sft\n")
    sweep = load_sweep(write_sweep(tmp_path, "s", {"run.seed": [0, 1]}, init={"config": "start.yaml"}))
    _evaluated(sweep.init, "start", commit="5" * 40)
    for run in sweep.runs:
        _evaluated(run, run.id, commit="6" * 40)
    with pytest.raises(UserError, match=r"only the start was evaluated at another commit \(5555555\): from a clean "
                                        r"checkout of 6666666, move .*init/eval aside and run `python -m "
                                        r"dare.app.sweep .*s.yaml init`"):
        collect(sweep, tmp_path / "board")
    mixed = load_sweep(write_sweep(tmp_path / "mixed", "s", {"run.seed": [0, 1]}, init={"config": "../start.yaml"}))
    for run, commit in zip([mixed.init, *mixed.runs], ("5" * 40, "6" * 40, "7" * 40)):
        _evaluated(run, run.id if run is not mixed.init else "start", commit=commit)
    with pytest.raises(UserError) as refused:  # the runs themselves differ: no such hint
        collect(mixed, tmp_path / "board")
    assert "only the start" not in str(refused.value)


def test_collect_defaults_to_the_folder_the_sweep_was_collected_into(tmp_path, monkeypatch, capsys):
    """Without --to, `dare sweep collect` of a baseline's tiny sweep (`TINY_SWEEP`) goes to its own folder
    (`TINY_RESULTS`, CONTRIBUTING.md section 6), not to `leaderboard/results/<family>` (the former default, the
    sweep file's folder name); another sweep under reproductions/ to its path there joined by "-" (the folder's
    sweep*.yaml left out), which is where each committed one was collected, and the former default for the
    paper reproductions (reproductions/<name>/sweep.yaml)."""
    from dare.app.baselines import TINY_RESULTS, TINY_SWEEP
    from dare.app.cli import main
    from dare.app.sweep import default_destination

    tiny = []
    for path in sorted((REPO / "reproductions" / "tiny").glob("*/*.yaml")):
        family, name = path.parent.name, path.stem
        if path == REPO / TINY_SWEEP.format(family=family, name=name) and (REPO / TINY_RESULTS.format(
                family=family, name=name)).is_dir() and load_sweep(path).methods.keys() == {name}:
            assert default_destination(load_sweep(path)) == TINY_RESULTS.format(family=family, name=name), path
            tiny.append(f"{family}-{name}")
    assert "llada-espo" in tiny and len(tiny) >= 10, tiny
    for sweep, dest in {"tiny/sweep.yaml": "tiny", "tiny/dream/sweep.yaml": "tiny-dream",
                        "tiny/sdar/sweep.yaml": "tiny-sdar", "tiny/llada2/supervised.yaml": "tiny-llada2-supervised",
                        "tiny/dream/trajectory.yaml": "tiny-dream-trajectory", "sudoku/dream/sweep.yaml": "sudoku-dream",
                        "d1/sweep.yaml": "d1", "justgrpo/sweep_math.yaml": "justgrpo"}.items():
        assert default_destination(load_sweep(REPO / "reproductions" / sweep)) == f"leaderboard/results/{dest}", sweep
        assert dest in ("d1", "justgrpo") or (REPO / "leaderboard" / "results" / dest).is_dir(), dest
    # a new baseline's sweep, collected by the CLI without --to, from the directory it runs in
    folder = tmp_path / "clone" / "reproductions" / "tiny" / "llada"
    espo = {"baseline": "espo", "overrides": {k: v for k, v in TINY.items() if not k.startswith("algo.")}}
    sweep = load_sweep(write_sweep(folder, "espo", {"run.seed": [0]}, **espo))
    assert default_destination(sweep) == TINY_RESULTS.format(family="llada", name="espo")
    _evaluated(sweep.runs[0], "default")
    monkeypatch.chdir(tmp_path / "clone")
    assert main(["sweep", "collect", str(sweep.path)]) == 0
    assert f"1 result(s) -> {TINY_RESULTS.format(family='llada', name='espo')}" in capsys.readouterr().out
    assert len(list((tmp_path / "clone" / TINY_RESULTS.format(family="llada", name="espo")).iterdir())) == 1
    # a sweep file not named after the one baseline it runs is not a baseline's tiny sweep
    other = load_sweep(write_sweep(folder, "mine", {"run.seed": [0]}, **espo))
    assert default_destination(other) == "leaderboard/results/tiny-llada-mine"
    assert default_destination(load_sweep(write_sweep(tmp_path / "s", "x", {"run.seed": [0]}))) == "leaderboard/results/s"


# ---------------------------------------------------------------------------------------------
# A real SLURM
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        c.stop()
        pytest.skip(f"SLURM cannot be started on this machine: {e}")
    yield c
    c.stop()


@pytest.fixture
def on_cluster(cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    return cluster


@pytest.mark.slow
def test_slurm_sweep_completes_is_idempotent_and_isolates_failures(tmp_path, on_cluster):
    ok = load_sweep(write_sweep(tmp_path / "ok", "s", {"run.seed": [0, 1]}))
    bad = load_sweep(write_sweep(tmp_path / "bad", "s", {"model.path": [None, "/nonexistent/checkpoint"]}))
    assert len(launch(ok, cluster="slurm")) == 2 and len(launch(bad, cluster="slurm")) == 2
    on_cluster.wait_empty()
    assert [state(r)[0] for r in ok.runs] == ["done", "done"]
    for r in ok.runs:
        (result,) = results_of(r)
        assert json.loads(result.read_text())["benchmark"]["n_samples"]["effective"] == 20
    good, failed = bad.runs
    assert state(good)[0] == "done"
    failed_state, log = state(failed)
    assert failed_state == "failed" and "/nonexistent/checkpoint" in Path(log).read_text()

    # a relaunch submits only the run whose results went missing, and never a queued one twice
    for p in (ok.runs[1].dir / "eval").glob("*"):
        p.unlink()
    again = launch(load_sweep(ok.path), cluster="slurm")
    assert [r.id for r in again] == [ok.runs[1].id]
    assert launch(load_sweep(ok.path), cluster="slurm") == []  # it is queued or running
    r = subprocess.run([str(Path(sys.executable).parent / "dare"), "sweep", "status", str(ok.path)],
                       capture_output=True, text=True, env=on_cluster.env)
    assert "running" in r.stdout or "done" in r.stdout, r.stdout + r.stderr
    on_cluster.wait_empty()
    assert [state(r)[0] for r in ok.runs] == ["done", "done"]


@pytest.mark.slow
def test_slurm_accepts_the_lab_options_and_submits_the_dry_run_script(tmp_path, on_cluster):
    """sbatch takes the options a lab adds (account, a comment, setup lines, a raw option: --hold, so
    nothing runs); the runs' array waits for the init job and, but for that dependency, is the
    script the dry run prints."""
    (tmp_path / "start.yaml").write_text("baseline: sft\n")
    slurm = {"cpus_per_task": 1, "mem_gb": 2, "time_min": 10, "account": "lab", "comment": "dare sweep test",
             "setup": ["echo setup"], "additional_parameters": {"hold": True}}
    sweep = load_sweep(write_sweep(tmp_path, "s", {"run.seed": [0, 1]}, slurm=slurm, init={"config": "start.yaml"}))
    printed = sbatch_script(sweep, 2)
    assert len(launch(sweep, cluster="slurm")) == 2
    init_id = json.loads((sweep.init.dir / "job.json").read_text())["job_id"]
    job_id = json.loads((sweep.runs[0].dir / "job.json").read_text())["job_id"].split("_")[0]
    try:
        [submitted] = (sweep.out / "submitit").glob(f"{job_id}*/{job_id}_submission.sh")
        assert submitted.read_text() == printed.replace("#SBATCH --error", f"#SBATCH --dependency=afterok:{init_id}\n"
                                                                           "#SBATCH --error")
        shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                               env=on_cluster.env, check=True).stdout
        assert "Account=lab" in shown and "Comment=dare sweep test" in shown and "JobHeldUser" in shown, shown
        assert f"Dependency=afterok:{init_id}" in shown, shown
    finally:
        subprocess.run(["scancel", init_id, job_id], env=on_cluster.env, check=True)
    on_cluster.wait_empty()


@pytest.mark.slow
def test_slurm_preempted_run_requeues_and_resumes(tmp_path, on_cluster):
    path = write_sweep(tmp_path, "long", {"run.seed": [0]}, steps=400)
    spec = yaml.safe_load(path.read_text())
    spec["overrides"]["run.save_every"] = 20
    path.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(path)
    (run,) = launch(sweep, cluster="slurm")
    job_id = json.loads((run.dir / "job.json").read_text())["job_id"]
    metrics = run.dir / "train" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline:  # wait for a checkpoint to exist, mid-training
        if list((run.dir / "train" / "checkpoints").glob("step_*[0-9]")) and metrics.is_file() and \
                len(metrics.read_text().splitlines()) >= 25:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the run never reached its first checkpoint")
    subprocess.run(["scancel", "--signal=TERM", job_id], check=True, env=on_cluster.env)
    # SLURM holds a requeued job for a while (its BeginTime); release it now instead of waiting minutes
    deadline = time.time() + 120
    while time.time() < deadline:
        if any(line.split()[1] == "PENDING" for line in on_cluster.queue()):
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=on_cluster.env)
            break
        time.sleep(0.5)
    on_cluster.wait_empty(timeout=900)
    assert state(run)[0] == "done" and results_of(run)
    status = json.loads((run.dir / "train" / "run.json").read_text())
    assert status["status"] == "done"
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert steps == list(range(1, 401))  # resumed from the checkpoint: every step once, none repeated
    logs = "".join(p.read_text() for p in (sweep.out / "submitit").glob("**/*_log.*"))
    assert "stopped by signal 15 after step" in logs and "DUE TO JOB REQUEUE" in logs
    assert "resuming from" in logs and "Job completed successfully" in logs


@pytest.mark.slow
def test_slurm_job_killed_mid_checkpoint_resumes_from_the_last_complete_one(tmp_path, on_cluster):
    """A SLURM job whose training process is killed (SIGKILL, as the OOM killer or a node failure does: no
    handler runs, unlike a preemption) while a checkpoint is being written leaves its `step_N.tmp` behind
    and the job failed; the sweep's relaunch submits the run again, and it resumes from the last complete
    checkpoint and ends with every step logged once."""
    path = write_sweep(tmp_path, "killed", {"run.seed": [0]}, steps=12)
    spec = yaml.safe_load(path.read_text())
    # a model whose checkpoints take a moment to write (~40 MB with the optimizer state), one every step
    spec["overrides"].update({"run.save_every": 1, "model.scratch.d_model": 256, "model.scratch.n_heads": 4,
                              "model.scratch.n_layers": 4, "model.scratch.mlp_hidden_size": 1024})
    path.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(path)
    (run,) = launch(sweep, cluster="slurm")
    ckpts = run.dir / "train" / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline:  # a complete checkpoint exists and the next one is being written
        if list(ckpts.glob("step_*[0-9]")) and list(ckpts.glob("step_*.tmp")):
            pid = int((run.dir / "train" / ".lock").read_text().split()[0])  # the training process (its lock)
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.001)
    else:
        pytest.fail("never saw a checkpoint being written")
    on_cluster.wait_empty()
    left = sorted(p.name for p in ckpts.iterdir())
    assert any(n.endswith(".tmp") for n in left), left  # killed mid-checkpoint
    complete = [n for n in left if not n.endswith(".tmp")]
    assert state(run)[0] == "failed"
    assert [r.id for r in launch(load_sweep(path), cluster="slurm")] == [run.id]  # the relaunch
    on_cluster.wait_empty(timeout=600)
    assert state(run)[0] == "done" and results_of(run)
    metrics = run.dir / "train" / "metrics.jsonl"
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == list(range(1, 13))
    logs = "".join(p.read_text() for p in (sweep.out / "submitit").glob("**/*_log.*"))
    assert "resuming from" in logs and complete[-1] in logs.split("resuming from", 1)[1].splitlines()[0]
    assert not list(ckpts.glob("*.tmp"))  # the partial folder was cleared by the resumed run's next save


@pytest.mark.slow
def test_slurm_multi_task_run_forms_one_process_group(tmp_path, on_cluster):
    """slurm.tasks_per_node=2: srun starts two training processes that join one gloo process group
    from SLURM's environment (the same path as 2 nodes x 8 GPUs, at a size this machine has)."""
    path = write_sweep(tmp_path, "mt", {"run.seed": [0]}, slurm={"tasks_per_node": 2, "cpus_per_task": 1,
                                                                 "mem_gb": 2, "time_min": 10})
    sweep = load_sweep(path)
    (run,) = launch(sweep, cluster="slurm")
    on_cluster.wait_empty()
    assert state(run)[0] == "done" and results_of(run)
    assert json.loads((run.dir / "train" / "run.json").read_text())["world_size"] == 2


def test_sweeps_with_the_same_folder_and_file_name_get_their_own_run_folders(tmp_path):
    """reproductions/tiny/sdar/sweep.yaml and reproductions/sudoku/sdar/sweep.yaml both end in
    sdar/sweep: their runs (and their init runs) must not share a folder."""
    from dare.app.sweep import sweep_folder

    repo = tmp_path / "repo" / "reproductions"
    assert sweep_folder(repo / "tiny" / "sdar" / "sweep.yaml") == Path("tiny/sdar/sweep")
    assert sweep_folder(repo / "sudoku" / "sdar" / "sweep.yaml") == Path("sudoku/sdar/sweep")
    assert sweep_folder(repo / "tiny" / "sweep.yaml") == Path("tiny/sweep")
    assert sweep_folder(tmp_path / "mine" / "grid.yaml") == Path("mine/grid")


def test_a_targets_protocol_reads_a_results_decoding_record_like_its_flat_form():
    """Issue 59.5: `dare sweep collect` passes a result's decoding record, whose settings off their default sit
    under `extra`, to `same_protocol`; CJ-GRPO's target fixes `schedule: ass` (and EOSER's gammas), so its own
    protocol read as "not the paper's" from the record (the flat form evaluation passes read right)."""
    from dare.app.targets import load_targets
    from dare.decoding import FLAT
    from dare.results import Decoding

    targets = load_targets(REPO / "reproductions" / "cj_grpo" / "targets.yaml")
    bench = {"name": "gsm8k", "split": "test", "n_shot": 0}
    fixed = {"schedule": "ass", "eos_gamma_min": 0.01, "eos_gamma_max": 1.0}
    flat = {**FLAT, "gen_length": 256, "block_length": 256, "steps": 8, **fixed}
    record = Decoding(sampler="masked", gen_length=256, block_length=256, steps=8, remasking="low_confidence",
                      temperature=0.0, extra=fixed).model_dump()
    assert targets.same_protocol(bench, flat) and targets.same_protocol(bench, record)
    even = Decoding(**{**record, "extra": {}}).model_dump()  # the default schedule: not the paper's protocol
    assert not targets.same_protocol(bench, even)
    assert not targets.same_protocol(bench, {**flat, "schedule": "even"})


def test_a_local_run_gets_the_threads_of_its_slurm_job(tmp_path, monkeypatch):
    """torch's default (one thread a core) in each of two local sweeps on two cores oversubscribed the machine:
    a suite seed ran ten times slower. A local run gets `cpus_per_task` as OMP_NUM_THREADS unless it is set."""
    import dare.app.sweep as sweep_mod

    seen = []
    monkeypatch.setattr(sweep_mod.subprocess, "run",
                        lambda *a, env=None, **k: seen.append(env) or types.SimpleNamespace(returncode=0))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    sweep = load_sweep(write_sweep(tmp_path, "t", {"run.seed": [0]}))  # cpus_per_task: 1
    sweep_mod._local(sweep, sweep.runs[0])
    assert seen[-1]["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own setting wins
    sweep_mod._local(sweep, sweep.runs[0])
    assert seen[-1]["OMP_NUM_THREADS"] == "3"
