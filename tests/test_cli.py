"""The `dare` command through its installed entry point."""

import pytest

from conftest import dare_cli

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


