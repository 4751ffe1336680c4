"""Every reproduction config loads with the validation `dare train` uses, and every targets.yaml
names configs, benchmarks and numbers that exist."""

from pathlib import Path

import pytest
import yaml

from dare.data import TASKS
from dare.app.runs import resolve

ROOT = Path(__file__).resolve().parents[1] / "reproductions"
CONFIGS = sorted(p for p in ROOT.glob("*/*.yaml") if p.name not in ("targets.yaml", "eval.yaml", "published.yaml")
                 and not p.name.startswith(("eval_", "sweep")))
EVALS = sorted(ROOT.glob("*/eval_*.yaml"))
SWEEPS = sorted(ROOT.glob("*/sweep*.yaml"))  # sweep.yaml, and sweep_<task>.yaml beside it
TARGETS = sorted(ROOT.glob("*/targets.yaml"))


def test_the_demo_eval_config_loads():
    from dare.config import EvalRunConfig, load

    assert load(EvalRunConfig, ROOT / "demo" / "eval.yaml").eval.decoding.gen_length == 4


def test_there_are_reproductions_for_the_wave_one_baselines():
    folders = {p.parent.name for p in TARGETS}
    assert {"sft", "peft", "vrpo", "d1", "coupled_grpo", "wd1"} <= folders


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_reproduction_config_resolves(path):
    baseline = yaml.safe_load(path.read_text())["baseline"]
    _, cfg, _ = resolve(baseline, path)
    if path.parent.name not in ("demo", "tiny", "sudoku", "bench"):  # the paper configs start from released checkpoints
        assert cfg.model.path and cfg.model.path.startswith("/ckpt/"), path


def _leaves(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield prefix + k, v


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_reproduction_configs_state_only_what_differs_from_the_baselines_defaults(path):
    """A value equal to the baseline's default is a second copy of it, which drifts when the default
    is corrected: the config states what the reproduction changes, config.py the rest."""
    from dare.app import baselines
    from dare.config import to_dict

    data = yaml.safe_load(path.read_text())
    defaults = dict(_leaves(to_dict(baselines.load(data.pop("baseline")).Config())))
    same = [k for k, v in _leaves(data) if k in defaults and (defaults[k] == v or (
        isinstance(v, list) and isinstance(defaults[k], (list, tuple)) and list(defaults[k]) == v))]
    assert not same, f"{path}: {same} repeat the baseline's defaults"


@pytest.mark.parametrize("path", TARGETS, ids=lambda p: p.parent.name)
def test_targets_are_complete(path):
    """Parsed by the same code that writes `result.reference` (dare.app.targets)."""
    from dare.app.targets import load_targets

    t = load_targets(path)
    assert t.rows, f"{path}: no targets"
    for row in t.rows:
        assert row["benchmark"] in TASKS, (path, row["benchmark"])
        assert row["gen_length"] in (128, 256, 512, 1024), (path, row)


def test_a_sweeps_evaluation_matches_a_target_of_its_folder():
    """Each paper sweep evaluates a (config, benchmark, gen length) its targets.yaml names, with the
    paper's protocol, so its results carry `reference` with same_decoding where the protocol matches."""
    from dare.app.sweep import load_sweep
    from dare.config import EvalRunConfig, load, to_dict

    for path in SWEEPS:
        sweep = load_sweep(path)
        if sweep.targets is None:
            continue
        cfg = load(EvalRunConfig, sweep.eval_config)
        decoding = to_dict(cfg.eval.decoding)
        refs = [sweep.targets.reference(config, {"name": b, "split": cfg.eval.split, "n_shot": 0}, decoding)
                for config in sweep.methods.values() for b in cfg.eval.benchmarks]
        assert any(refs), (path, cfg.eval.benchmarks, decoding["gen_length"])


def test_a_protocols_decoding_fields_decide_same_decoding(tmp_path):
    """CJ-GRPO's targets fix the ASS schedule and EOSER: the same block, steps and temperature with even
    steps is not the paper's protocol; an unknown decoding field is refused by name. The evaluation hands
    the decoding over in its flat form (`dare.decoding.flat`: the names of a result's decoding record)."""
    from dare.app.targets import load_targets
    from dare.config import DecodingConfig
    from dare.decoding import flat
    from dare.utils import UserError

    t = load_targets(ROOT / "cj_grpo" / "targets.yaml")
    bench = {"name": "gsm8k", "split": "test", "n_shot": 0}
    ass = flat(DecodingConfig(gen_length=256, block_length=256, steps=8, temperature=0.0,
                              masked={"schedule": "ass", "eos_gamma_min": 0.01}), "llada")
    assert t.reference("gsm8k.yaml", bench, ass)["same_decoding"] is True
    assert t.reference("gsm8k.yaml", bench, {**ass, "schedule": "even"})["same_decoding"] is False
    assert t.reference("gsm8k.yaml", bench, {**ass, "eos_gamma_min": 1.0})["same_decoding"] is False
    bad = tmp_path / "targets.yaml"
    (tmp_path / "gsm8k.yaml").write_text("baseline: d1\n")
    bad.write_text((ROOT / "cj_grpo" / "targets.yaml").read_text().replace("schedule: ass", "shedule: ass"))
    with pytest.raises(UserError, match="shedule"):
        load_targets(bad)


@pytest.mark.parametrize("path", EVALS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_eval_configs_load(path):
    from dare.config import EvalRunConfig, load

    assert load(EvalRunConfig, path).eval.benchmarks


def test_every_paper_folder_has_a_sweep():
    assert {p.parent.name for p in SWEEPS} >= {p.parent.name for p in TARGETS} | {"demo"}


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.parent.name)
def test_sweep_files_load(path):
    from dare.app.sweep import load_sweep

    sweep = load_sweep(path)
    assert sweep.runs and len({r.id for r in sweep.runs}) == len(sweep.runs)


# d1 and wd1 count TRL global steps, i.e. optimizer steps; our RL `train.steps` and `run.save_every`
# count rollout batches of mu = rl.num_iterations optimizer steps each. Paper totals (optimizer steps):
# d1 publishes none (10 epochs, best checkpoint every 100 steps from 600): 5000 bounds the search;
# wd1 evaluates up to 7500 (GSM8K, MATH), 4000 (Countdown), 12500 (Sudoku) (wd1 §5 / App.).
PAPER_OPTIMIZER_STEPS = {"d1": {"gsm8k": 5000, "math": 5000, "countdown": 5000, "sudoku": 5000},
                         "wd1": {"gsm8k": 7500, "math": 7500, "countdown": 4000, "sudoku": 12500}}


@pytest.mark.parametrize("paper, task", [(p, t) for p, ts in PAPER_OPTIMIZER_STEPS.items() for t in ts])
def test_rl_reproductions_run_the_papers_optimizer_steps(paper, task):
    _, cfg, _ = resolve(paper, ROOT / paper / f"{task}.yaml")
    mu = cfg.rl.num_iterations
    optimizer_steps = cfg.train.steps * mu
    assert 0 <= optimizer_steps - PAPER_OPTIMIZER_STEPS[paper][task] < mu, (cfg.train.steps, mu)
    assert (cfg.run.save_every * mu) % 100 == 0  # checkpoints on d1's save_steps grid (every 100 optimizer steps)
    text = (ROOT / paper / f"{task}.yaml").read_text()
    assert "rollout batches of mu" in text and "optimizer steps" in text  # the unit is written next to the value
