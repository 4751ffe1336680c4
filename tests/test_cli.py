"""The `dare` command through its installed entry point (or its `main` in this process)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, dare_cli
from dare.app.cli import main
from dare.models.registry import ATTENTION, FAMILIES

SUBCOMMANDS = ["train", "eval", "sweep", "leaderboard", "data", "bench", "models", "demo", "results"]


@pytest.mark.parametrize("sub", [None, *SUBCOMMANDS])
def test_help(sub):
    r = dare_cli(*([sub] if sub else []), "--help")
    assert r.returncode == 0, r.stderr
    assert "usage: dare" in r.stdout


def test_config_typo_is_one_clear_line():
    r = dare_cli("train", "sft", "train.lrr=3e-4")
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: command line: unknown key 'train.lrr' (did you mean 'train.lr'?)")


def test_yaml_typo_names_the_file(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("train:\n  stepz: 3\n")
    r = dare_cli("train", "sft", str(cfg))
    assert r.returncode == 2 and f"{cfg}: unknown key 'train.stepz'" in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_baseline_and_missing_checkpoint(tmp_path):
    r = dare_cli("train", "wd2")
    assert r.returncode == 2 and "unknown baseline 'wd2'" in r.stderr and "available:" in r.stderr
    r = dare_cli("eval", str(tmp_path / "nope"))
    assert r.returncode == 2 and "not a checkpoint folder" in r.stderr


def test_dry_run_prints_resolved_config_and_hash():
    r = dare_cli("train", "d1", "--dry-run", "rl.group_size=4")
    assert r.returncode == 0, r.stderr
    assert "group_size: 4" in r.stdout and "# config_hash: sha256:" in r.stdout


def test_sweep_dry_run_lists_runs_and_sbatch_parameters(tmp_path):
    r = dare_cli("sweep", "reproductions/demo/sweep.yaml", "--dry-run", env={"DARE_RUNS": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("pending  run.seed=") == 3 and "--time=30" in r.stdout and "--signal=USR2@120" in r.stdout
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def test_models_and_data_list():
    r = dare_cli("models")
    assert r.returncode == 0 and "llada" in r.stdout and "bidirectional" in r.stdout
    r = dare_cli("data", "list")
    assert r.returncode == 0 and "addition" in r.stdout




def test_version_is_the_installed_distributions():
    import importlib.metadata

    r = dare_cli("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"dare {importlib.metadata.version('dare-dllm')}"


def test_train_takes_the_baseline_from_the_yamls_baseline_key(capsys):
    sft_yaml = str(REPO / "reproductions" / "demo" / "sft.yaml")
    assert main(["train", sft_yaml, "--dry-run", "train.steps=77"]) == 0
    from_yaml = capsys.readouterr().out
    assert main(["train", "sft", sft_yaml, "--dry-run", "train.steps=77"]) == 0
    assert capsys.readouterr().out == from_yaml  # the same resolved config and hash
    assert "steps: 77" in from_yaml and "name: tiny-llada-addition" in from_yaml


def test_train_rejects_a_yaml_of_another_baseline_or_without_one(capsys, tmp_path):
    d1_yaml = str(REPO / "reproductions" / "demo" / "d1.yaml")
    assert main(["train", "sft", d1_yaml, "--dry-run"]) == 2
    assert "baseline: 'd1' does not match the requested baseline 'sft'" in capsys.readouterr().err
    bare = tmp_path / "bare.yaml"
    bare.write_text("train: {steps: 3}\n")
    assert main(["train", str(bare), "--dry-run"]) == 2
    assert f"{bare}: no `baseline:` key" in capsys.readouterr().err
    assert main(["train", d1_yaml, str(bare)]) == 2
    assert "unexpected argument" in capsys.readouterr().err


def test_every_config_problem_is_reported_at_once(capsys, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("baseline: sft\ntrain: {stepz: 3, batch_size: many, warmup_steps: -1}\ndata: {tsk: addition}\n")
    assert main(["train", str(cfg), "--dry-run", "train.lr=0", "model.famly=llada"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "error: 6 config problems:",
        f"  {cfg}: unknown key 'train.stepz' (did you mean 'train.steps'?)",
        f"  {cfg}: train.batch_size: expected int, got 'many'",
        f"  {cfg}: unknown key 'data.tsk' (did you mean 'data.task'?)",
        "  command line: unknown key 'model.famly' (did you mean 'model.family'?)",
        "  invalid config: train.lr: must be positive [train.lr=0.0 (from command line)]",
        f"  invalid config: train.warmup_steps: must be within [0, train.steps] [train.warmup_steps=-1 (from {cfg})]",
    ]


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("baseline: sft\ntrain:\n  steps: [3\nmodel: x\n")
    r = dare_cli("train", str(cfg))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"error: {cfg}, line 4, column 6: not valid YAML: ")


def test_eval_benchmarks_did_you_mean(capsys, tmp_path):
    assert main(["eval", str(tmp_path), "--benchmarks", "gsm9k,additon"]) == 2
    err = capsys.readouterr().err
    assert "error: 2 config problems:" in err
    assert "unknown benchmark 'gsm9k' (did you mean 'gsm8k'?)" in err
    assert "unknown benchmark 'additon' (did you mean 'addition'?)" in err


def test_models_lists_every_family_without_importing_torch():
    """`dare models` prints the torch-free registry (seconds): torch and transformers are never imported."""
    exe = shutil.which("dare", path=str(Path(sys.executable).parent))
    r = subprocess.run([sys.executable, "-X", "importtime", exe, "models"], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")}
    assert "dare.app.cli" in imported
    assert not [m for m in imported if m.split(".")[0] in ("torch", "transformers")]
    rows = {ln.split()[0]: ln.split()[1:] for ln in r.stdout.splitlines()[1:] if ln.strip() and ln.split()[0] in FAMILIES}
    assert rows == {f: [model_type, ATTENTION[f], module] for f, (module, model_type) in FAMILIES.items()}


def test_make_help_lists_every_target_with_a_description():
    text = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, flags=re.M))
    phony = set(re.search(r"^\.PHONY:(.*)$", text, flags=re.M).group(1).split())
    assert phony <= targets and "help" in targets
    r = subprocess.run(["make", "--no-print-directory", "help"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    described = {m.group(1): m.group(2) for m in re.finditer(r"^make (\S+) +(\S.*)$", r.stdout, flags=re.M)}
    assert set(described) == targets


def test_runs_and_data_land_in_the_working_directory_readable_by_the_group(tmp_path):
    """Without DARE_RUNS / DARE_DATA, a run, its data and its evaluation are written under the
    working directory (not the checkout), with the permissions the umask gives (0644 files under
    umask 022), so collaborators can read results and checkpoints."""
    import stat

    exe = shutil.which("dare", path=str(Path(sys.executable).parent))
    env = {k: v for k, v in os.environ.items() if k not in ("DARE_RUNS", "DARE_DATA")}
    work = tmp_path / "work"
    work.mkdir()
    dry = subprocess.run([exe, "train", "sft", "--dry-run"], capture_output=True, text=True, cwd=work, env=env)
    assert dry.returncode == 0, dry.stderr
    run_dir = Path(dry.stdout.strip().splitlines()[-1].removeprefix("# run_dir: "))
    assert run_dir.parent.parent == work / "runs"
    script = "import os, sys; os.umask(0o022); from dare.app.cli import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", script, "train", "sft", *TINY_ARGS], capture_output=True, text=True,
                       cwd=work, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = list((work / "runs" / "sft").iterdir())
    assert len(runs) == 1 and (work / "data" / "addition" / "train.parquet").is_file()
    for path in [runs[0] / "run.json", runs[0] / "config.yaml", runs[0] / "final" / "dare.json",
                 *(runs[0] / "final").glob("*.safetensors")]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    assert not (REPO / "runs" / "sft" / runs[0].name).exists()  # nothing in the checkout


TINY_ARGS = ["model.scratch.d_model=32", "model.scratch.n_heads=2", "model.scratch.n_layers=1",
             "model.scratch.mlp_hidden_size=64", "train.batch_size=8", "train.steps=1", "train.warmup_steps=0",
             "algo.response_length=4", "run.threads=1"]


def test_recorded_commands_are_what_was_typed_without_machine_paths(tmp_path):
    """`python -m` shows as such (not the module's file path), and absolute paths inside the working
    directory become relative, `key=<path>` overrides included: committed results carry no machine path."""
    import json

    from dare.utils import shown_argument

    r = subprocess.run([sys.executable, "-m", "dare.app.cli", "env"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["command"] == "python -m dare.app.cli env"
    assert shown_argument(f"model.path={REPO}/runs/sft/abc/final") == "model.path=runs/sft/abc/final"
    assert shown_argument(f"{REPO}/reproductions/demo/sft.yaml") == "reproductions/demo/sft.yaml"
    assert shown_argument("train.lr=1e-3") == "train.lr=1e-3"
    assert shown_argument(f"run.out_dir={tmp_path}") == f"run.out_dir={tmp_path}"  # outside: as given


@pytest.mark.parametrize("env", ["train", "eval"])
def test_dare_env_prints_the_fingerprint_in_both_environments(env):
    """The same fingerprint results carry, for bug reports: the ISA torch dispatches to, threads and
    BLAS, the packages (transformers 5 here, 4.x with OpenCompass there) and the lock each
    environment was installed from."""
    import json

    from conftest import EVAL_PYTHON

    python = sys.executable if env == "train" else EVAL_PYTHON
    if not Path(python).exists():
        pytest.skip("no eval environment (make test builds $VENV/eval)")
    r = subprocess.run([python, "-m", "dare.app.cli", "env"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    fp = json.loads(r.stdout)
    import torch

    assert fp["hardware"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and fp["hardware"]["blas"]
    assert fp["packages"]["transformers"].startswith("5." if env == "train" else "4.")
    assert ("opencompass" in fp["packages"]) == (env == "eval")
    if os.environ.get("DARE_VENV"):  # under `make test` both venvs were installed from their locks
        assert fp["lock"]["lock"] == f"locks/{env}.txt", fp["lock"]


def test_demo_compare_names_the_tiny_route_of_contributing(capsys):
    """`dare demo --compare` (moved) prints the route CONTRIBUTING.md section 6 gives, from the same helper as
    `dare checklist`, not a collect into leaderboard/results/tiny (an earlier commit's folder: collect refuses it)."""
    from dare.app.baselines import tiny_commands

    assert main(["demo", "--compare"]) != 0
    err = capsys.readouterr().err
    for command in tiny_commands("<name>", "<family>"):
        assert command in err, command
    assert not re.search(r"--to leaderboard/results/tiny\b(?!-)", err)


def test_publish_warns_by_the_check_collect_makes(tmp_path, capsys):
    """`dare results publish` copies a result the committed-results test would refuse, warning with the reason
    `dare sweep collect` gives (one check, `dare.app.sweep.check_traceable`): a dirty tree, no commit (outside a
    checkout), no recorded lock; a clean, locked result publishes quietly."""
    import json

    from dare.app.sweep import untraced
    from dare.results import read_result

    source = sorted((REPO / "leaderboard" / "results" / "tiny-llada-espo").glob("*/result_addition.json"))[0]
    cases = {"clean": {}, "dirty": {"git_dirty": True}, "outside": {"git_dirty": None, "git_commit": None},
             "unlocked": {"lock": None}}
    for name, change in cases.items():
        result = json.loads(source.read_text())
        result["run_id"] += f"-{name}"
        result["provenance"].update(change)
        src = tmp_path / name / "result_addition.json"
        src.parent.mkdir()
        src.write_text(json.dumps(result))
        assert main(["results", "publish", str(src), "--to", str(tmp_path / "board")]) == 0
        err = capsys.readouterr().err
        why = untraced(read_result(src))
        assert (why is not None) == (name in ("dirty", "outside"))
        if why:
            assert f"WARNING: {src}: {why}; published anyway" in err, err
        assert ("no recorded lock" in err) == (name == "unlocked") and (err == "") == (name == "clean"), err
        assert (tmp_path / "board" / result["run_id"] / src.name).is_file()
