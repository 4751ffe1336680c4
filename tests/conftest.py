"""Shared fixtures. Tests run on CPU with tiny models; nothing touches the checkout's runs/ or
data/ folders (DARE_RUNS and DARE_DATA point into a per-session temporary folder)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The environments under test: the Makefile's VENV (make test passes it on), so a second checkout with
# its own VENV=... never reaches into the first one's .venv.
VENV = Path(os.environ.get("DARE_VENV") or REPO / ".venv")
EVAL_PYTHON = os.environ.get("DARE_EVAL_PYTHON") or str(VENV / "eval" / "bin" / "python")


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.gpu` tests run only where CUDA is available (CPU CI skips them, saying why)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker); run on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def isolated_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dare")
    old = {k: os.environ.get(k) for k in ("DARE_RUNS", "DARE_DATA")}
    os.environ["DARE_RUNS"] = str(root / "runs")
    os.environ["DARE_DATA"] = str(root / "data")
    yield root
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def char_tok():
    from dare.models.tokenizer import char_tokenizer

    return char_tokenizer("0123456789+=", "llada")


@pytest.fixture(scope="session")
def tiny_model(char_tok):
    from dare.config import ScratchModelConfig
    from dare.models import new_model

    scratch = ScratchModelConfig(d_model=32, n_layers=2, n_heads=2, mlp_hidden_size=64)
    return new_model("llada", char_tok, scratch, seed=0).eval()


# Overrides for two-step runs of any baseline on a tiny model (CPU, seconds): the model size and
# optimizer for supervised runs, and the rollout settings for RL runs from `sft_checkpoint`.
TINY = ["model.scratch.d_model=32", "model.scratch.n_heads=2", "model.scratch.n_layers=1",
        "model.scratch.mlp_hidden_size=64", "train.batch_size=16", "train.lr=1e-3", "train.warmup_steps=0",
        "run.log_every=1", "run.threads=1"]
RL = ["train.lr=1e-3", "rl.prompts_per_step=4", "rl.group_size=4", "rl.num_iterations=2",
      "rl.decoding.sampler=auto", "rl.decoding.gen_length=4", "rl.decoding.block_length=4", "rl.decoding.steps=4",
      "rl.decoding.temperature=0.9", "run.log_every=1", "run.threads=1", "train.steps=2",
      "rl.diag_every=1"]  # every diagnostic on every step: each baseline's hooks run through them


# ---------------------------------------------------------------------------------------------
# Baselines under test, discovered: nothing to register in a shared test file
# ---------------------------------------------------------------------------------------------
# Every folder `baselines/<name>/` holding an algorithm.py is a baseline (`dare.app.baselines.names`).
# tests/test_baselines.py runs two steps of it on a tiny model of every family its README front
# matter declares (`families:`), and tests/test_pinned.py checks its 3-step loss trajectory against
# `baselines/<name>/pinned.json`. What a baseline's tiny runs need beyond its recipe's overrides
# below, and why it has no pinned trajectory, sit in an optional `tests:` field of its front matter:
#
#   tests:
#     overrides: {all: [algo.n_t=3], llada: [rl.decoding.steps=2]}   # `all`, then the run's family
#     unpinned: "why there is no pinned.json"

RECIPE_OVERRIDES = {  # a tiny run of each recipe (two steps; the pinned test runs three)
    "sft": [*TINY, "train.steps=2", "algo.response_length=4"],
    "preference": [*TINY, "train.steps=2", "data.task=addition_pairs", "train.batch_size=4"],
    "rl": RL,
}
TESTS_KEYS = ("overrides", "unpinned")


def baseline_recipe(name: str) -> str:
    """`RECIPE` of baselines/<name>/algorithm.py, read from its source without importing it (no torch
    at collection); a RECIPE that is not a plain string literal falls back to importing the module."""
    import ast
    import importlib

    tree = ast.parse((REPO / "baselines" / name / "algorithm.py").read_text())
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "RECIPE" for t in targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return importlib.import_module(f"baselines.{name}.algorithm").RECIPE


def baseline_tests(name: str) -> dict:
    """The `tests:` field of baselines/<name>/README.md's front matter ({} when absent), checked."""
    from dare.app.baselines import front_matter

    meta = front_matter(name)
    tests = meta.get("tests") or {}
    where = f"baselines/{name}/README.md front matter `tests:`"
    assert isinstance(tests, dict) and not set(tests) - set(TESTS_KEYS), \
        f"{where} must be a mapping with keys among {list(TESTS_KEYS)}, got {tests!r}"
    overrides = tests.get("overrides") or {}
    assert isinstance(overrides, dict) and not set(overrides) - {"all", *meta["families"]}, \
        f"{where} overrides: keys must be `all` or families it declares {meta['families']}, got {list(overrides)}"
    assert all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in overrides.values()), \
        f"{where} overrides: each value must be a list of 'key=value' strings"
    if "unpinned" in tests:
        assert isinstance(tests["unpinned"], str) and tests["unpinned"].strip(), \
            f"{where} unpinned: must be a non-empty string saying why it has no pinned.json"
    return tests


def baseline_runs(*recipes: str) -> list[tuple[str, str]]:
    """(name, family) for every baseline whose RECIPE is one of `recipes`, one pair per family its
    front matter declares (in that order), baselines sorted by name."""
    from dare.app.baselines import front_matter, names

    return [(n, f) for n in names() if baseline_recipe(n) in recipes for f in front_matter(n)["families"]]


def tiny_overrides(name: str, family: str) -> list[str]:
    """The overrides of a tiny two-step run of baseline `name` on `family`: its recipe's
    (`RECIPE_OVERRIDES`), then its front matter's `tests: overrides:` for `all` families and for `family`."""
    own = baseline_tests(name).get("overrides") or {}
    return [*RECIPE_OVERRIDES[baseline_recipe(name)], *own.get("all", []), *own.get(family, [])]


@pytest.fixture(scope="session")
def sft_checkpoint(tmp_path_factory):
    """`sft_checkpoint(family)`: the final checkpoint of a 2-step sft run of a tiny model of that
    family (made once per session): the starting point of the RL and preference baselines' runs."""
    from dare.app.runs import train

    made = {}

    def make(family: str):
        if family not in made:
            out = tmp_path_factory.mktemp(f"sft-{family}")
            made[family] = train("sft", None, [*TINY, f"model.family={family}", "train.steps=2",
                                               "algo.response_length=4", f"run.out_dir={out}"]) / "final"
        return made[family]

    return make


def run_config(name: str, /, **algo):
    """The baseline's whole run config with its `algo` section changed: every hook takes the whole
    config (`dare.train.hooks`)."""
    import dataclasses
    import importlib

    cfg = importlib.import_module(f"baselines.{name}.config").Config()
    return dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, **algo))


def dare_cli(*args, env=None, timeout=600):
    """Run the installed `dare` command (the real entry point) and capture its output."""
    exe = shutil.which("dare", path=str(Path(sys.executable).parent)) or "dare"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=REPO)


@pytest.fixture(scope="session")
def trained_tiny(char_tok):
    """A tiny LLaDA briefly trained with the sft baseline's loss on addition (a few seconds).
    Unlike a random model it never predicts the mask token, as real checkpoints don't."""
    import torch

    from baselines.sft.algorithm import loss, sample_noise
    from dare.config import ScratchModelConfig
    from dare.data import TASKS, load_split
    from dare.models import encode_chat, facts, new_model
    from dare.train.sft import sft_batch

    model = new_model("llada", char_tok, ScratchModelConfig(d_model=32, n_layers=2, n_heads=2, mlp_hidden_size=64), 0)
    rows = load_split("addition", "train")[:512]
    prompts = encode_chat(char_tok, [r["prompt"] for r in rows])
    targets = char_tok([TASKS["addition"].target(r) for r in rows], add_special_tokens=False)["input_ids"]
    f = facts(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for step in range(60):
        idx = [(step * 64 + i) % len(rows) for i in range(64)]
        batch = sft_batch([prompts[i] for i in idx], [targets[i] for i in idx], f.eos_token_id, f.pad_token_id, 4)
        cfg = run_config("sft")
        value, _ = loss(model, batch, sample_noise(batch, g, cfg), cfg)
        value.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()
