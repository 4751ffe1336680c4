"""Decoding options owned by their sampler (`dare.decoding`): each sampler's options are its own section of a
decoding config (`rl.decoding.masked.threshold`), checked once, by that sampler's module, at config load; the
old flat keys fail with their new name; the config hash and a result's decoding record keep the flat form, so
every committed run keeps its hash (checked on all of leaderboard/results)."""

import dataclasses
import glob
import json
from pathlib import Path

import pytest

from dare import decoding
from dare.config import (ConfigError, DecodingConfig, EvalRunConfig, Invalid, config_hash, load, read_yaml,
                         recipe_hash, to_dict)

REPO = Path(__file__).resolve().parents[1]
RESULTS = sorted(glob.glob(str(REPO / "leaderboard" / "results" / "**" / "result_*.json"), recursive=True))


def test_every_option_has_one_section_per_sampler_that_reads_it():
    assert decoding.OWNERS["threshold"] == ("masked", "block")
    assert decoding.OWNERS["top_k"] == ("block", "dream", "maskgit", "truncated")
    assert decoding.OWNERS["rcr"] == ("maskgit",) and decoding.OWNERS["editing_threshold"] == ("block",)
    # the flat layout, every name kept (`record` is there as its one flag, `record_trajectory`)
    assert set(decoding.FLAT) == set(decoding.COMMON) - {"record"} | {"record_trajectory"} | set(decoding.OWNERS)
    d = DecodingConfig(masked={"threshold": 0.9}, truncated={"top_k": 5})  # a mapping builds the section
    assert d.masked == decoding.MaskedOptions(threshold=0.9) and d.truncated.top_k == 5
    assert [f.name for f in dataclasses.fields(DecodingConfig)][-5:] == list(decoding.OPTIONS)


@pytest.mark.parametrize("override, new", [
    ("rl.decoding.threshold=0.9", "'rl.decoding.masked.threshold' or 'rl.decoding.block.threshold'"),
    ("rl.decoding.rcr=true", "'rl.decoding.maskgit.rcr'"),
    ("rl.decoding.editing_threshold=0.5", "'rl.decoding.block.editing_threshold'"),
    ("rl.decoding.top_k=5", "'rl.decoding.block.top_k'"),  # of the samplers auto runs, only block has it
])
def test_an_old_flat_key_fails_with_a_one_line_rename(override, new):
    from baselines.d1.config import Config

    with pytest.raises(ConfigError) as e:
        load(Config, None, [override])
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"command line: '{override.split('=')[0]}' was renamed to {new}")


def test_the_rename_names_the_section_of_the_configs_sampler(tmp_path):
    with pytest.raises(ConfigError, match=r"^command line: 'eval\.decoding\.top_k' was renamed to "
                                          r"'eval\.decoding\.dream\.top_k'; rename it in the config"):
        load(EvalRunConfig, None, ["eval.decoding.sampler=dream", "eval.decoding.top_k=5"])
    path = tmp_path / "run.yaml"
    path.write_text("eval:\n  decoding: {sampler: truncated, top_k: 5, remasking: random}\n")
    with pytest.raises(ConfigError) as e:
        load(EvalRunConfig, path)
    assert str(e.value).splitlines()[1:] == [
        f"  {path}: 'eval.decoding.top_k' was renamed to 'eval.decoding.truncated.top_k'; rename it in the config "
        "(YAML `top_k:` under `decoding:` -> under `truncated:` in `decoding:`)",
        f"  {path}: 'eval.decoding.remasking' was renamed to 'eval.decoding.truncated.remasking'; rename it in the "
        "config (YAML `remasking:` under `decoding:` -> under `truncated:` in `decoding:`)"]
    with pytest.raises(ConfigError, match="'threshold' was renamed to 'block.threshold'"):
        load(DecodingConfig, None, ["sampler=block", "threshold=0.9"])  # a section loaded on its own


def test_lmdeploy_is_not_a_sampler():
    with pytest.raises(ConfigError, match=r"sampler: must be one of \['auto', 'masked', 'dream', 'block', "
                                          r"'maskgit', 'truncated'\], got 'lmdeploy'"):
        load(DecodingConfig, None, ["sampler=lmdeploy"])


def test_an_option_set_for_a_sampler_that_does_not_run_is_refused():
    from baselines.coupled_grpo.config import Config as Coupled
    from baselines.d1.config import Config as D1

    with pytest.raises(ConfigError, match=r"rl\.decoding\.maskgit\.rcr=True \(from command line\) is an option of the "
                                          r"maskgit sampler, and this config decodes with the masked sampler"):
        load(D1, None, ["rl.decoding.sampler=masked", "rl.decoding.maskgit.rcr=true"])
    with pytest.raises(ConfigError, match=r"rl\.decoding\.block\.threshold=0\.9 .* decodes with the masked sampler "
                                          r"\(rl\.decoding\.sampler=auto, model\.family=llada\)"):
        load(D1, None, ["rl.decoding.block.threshold=0.9"])
    load(D1, None, ["model.family=sdar", "rl.decoding.block.threshold=0.9"])  # auto runs the block sampler there
    load(D1, None, ["rl.decoding.block.threshold=0.0"])  # set to its default: nothing is lost
    load(Coupled, None, ["rl.decoding.sampler=masked"])  # the baseline's own Dream options are not the user's
    load(EvalRunConfig, None, ["eval.decoding.masked.threshold=0.9", "eval.decoding.block.threshold=0.8"])  # no family


def test_each_sampler_checks_its_own_options_only():
    with pytest.raises(Invalid, match="must be in"):
        DecodingConfig(sampler="maskgit", maskgit={"top_p": 0}).validate()
    DecodingConfig(sampler="masked", maskgit={"top_p": 0}).validate()  # not read: the masked sampler runs
    with pytest.raises(Invalid, match="choose one parallel rule"):
        DecodingConfig(masked={"threshold": 0.9, "factor": 1.0}).validate()  # auto, no model: masked and block
    from baselines.cj_grpo.config import Config

    # CJ-GRPO's ascending schedule (a masked-sampler option) would need steps = 2 at gen_length 4; on a block model
    # it is not read, so it is not checked (the old flat layout needed `schedule: even` there)
    cfg = load(Config, None, ["model.family=sdar", "rl.decoding.gen_length=4", "rl.decoding.steps=4"])
    assert cfg.rl.decoding.masked.schedule == "ass"
    with pytest.raises(ConfigError, match="floor\\(log2 gen_length\\) = 2"):
        load(Config, None, ["rl.decoding.gen_length=4", "rl.decoding.steps=4"])
    with pytest.raises(ConfigError, match=r"multiple of block_length"):  # auto on a bidirectional family: its layout
        load(Config, None, ["rl.decoding.masked.schedule=even", "rl.decoding.gen_length=10", "rl.decoding.steps=5",
                            "rl.decoding.masked.eos_gamma_min=1"])
    with pytest.raises(ConfigError, match=r"tree rollouts .*model\.family=sdar decodes with the block sampler"):
        load(Config, None, ["model.family=sdar", "rl.decoding.tree=[2]", "rl.decoding.gen_length=4",
                            "rl.decoding.steps=4"])


def test_the_flat_form_reads_the_options_of_the_sampler_that_runs():
    d = DecodingConfig(masked={"threshold": 0.9, "cache": "dual"}, block={"threshold": 0.5}, dream={"alg": "entropy"})
    assert decoding.flat(d, "llada")["threshold"] == 0.9 and decoding.flat(d, "sdar")["threshold"] == 0.5
    assert decoding.flat(d, "sdar")["cache"] == "auto" and decoding.flat(d, "llada")["alg"] == "maskgit_plus"
    unknown = decoding.flat(d)  # sampler auto, no family: each option of both, one value where they agree
    assert unknown["threshold"] == {"masked": 0.9, "block": 0.5} and unknown["remasking"] == "low_confidence"
    assert decoding.flat(d, runs="dream")["alg"] == "entropy"
    assert decoding.from_flat(decoding.flat(d, "llada"), "llada") == {
        **{k: v for k, v in decoding.flat(d, "llada").items() if k in decoding.COMMON},
        "masked": {k: getattr(d.masked, k) for k in decoding.OWNERS if "masked" in decoding.OWNERS[k]}}


def test_a_saved_configs_flat_decoding_with_its_runtime_setting_reads_back():
    """A run's saved config keeps `compile` (a runtime setting, never hashed) beside the flat decoding: reading it
    into today's layout keeps it where it belongs, a common setting, and the hash does not see it (the committed
    StableDRL and BridgeRatio results' configs failed here with KeyError: 'compile')."""
    d = DecodingConfig(compile=False, masked={"threshold": 0.9})
    saved = {**decoding.flat(d, "llada"), "compile": None}
    back = decoding.from_flat(saved, "llada")
    assert back["compile"] is None and back["masked"]["threshold"] == 0.9
    assert decoding.hashed(load(DecodingConfig, data=back), "llada") == decoding.hashed(d, "llada")


def test_a_results_decoding_record_keeps_its_flat_schema():
    from dare.eval import decoding_record
    from dare.results import Decoding

    d = DecodingConfig(gen_length=16, steps=8, masked={"threshold": 0.9, "cache": "dual"}, block={"top_k": 3})
    record = decoding_record(d, "masked")
    assert record == {"sampler": "masked", "gen_length": 16, "block_length": 32, "steps": 8,
                      "remasking": "low_confidence", "temperature": 0.0, "cfg_scale": 0.0, "threshold": 0.9,
                      "extra": {"cache": "dual"}}
    Decoding(**record)
    assert decoding_record(d, "block") == {**record, "sampler": "block", "threshold": None, "extra": {"top_k": 3}}


def _hashed_flat_config(config: dict) -> dict:
    """A run's recorded (hashed) config in the new layout: its flat decoding sections read back, the settings
    the hash leaves out at their default (`dare.decoding.FLAT_ADDED`) restored."""
    family = (config.get("model") or {}).get("family")

    def walk(d):
        for k, v in d.items():
            if k == "decoding" and isinstance(v, dict):
                added = {n: list(decoding.FLAT[n]) if n == "tree" else decoding.FLAT[n] for n in decoding.FLAT_ADDED}
                d[k] = decoding.from_flat({**added, **v}, family)
            elif isinstance(v, dict):
                walk(v)

    config = json.loads(json.dumps(config))
    walk(config)
    return config


def _with_added_defaults(obj, data: dict) -> None:
    """Config fields added later (`ADDED`) that a recorded config leaves out held their field default."""
    from dare.config import _default

    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, DecodingConfig):
            continue
        if dataclasses.is_dataclass(value) and isinstance(data.get(f.name), dict):
            _with_added_defaults(value, data[f.name])
        elif f.metadata.get("hash") == "unless_default" and f.name not in data:
            data[f.name] = _default(f)


def test_every_committed_run_keeps_its_config_and_recipe_hash():
    """Each committed result records the training config its hash covers (the flat decoding, as written before
    the options moved to their samplers): read into today's layout, it hashes to the recorded config and recipe
    hashes (the leaderboard groups seeds by the recipe hash)."""
    from dare.app import baselines

    seen = {}
    for path in RESULTS:
        result = json.loads(Path(path).read_text())
        training = result.get("training") or {}
        if training.get("config") and training["config_hash"] not in seen:
            seen[training["config_hash"]] = (result["method"]["baseline"], training)
    assert len(seen) > 100
    for digest, (baseline, training) in seen.items():
        config_class = baselines.load(baseline).Config
        data = _hashed_flat_config(training["config"])
        _with_added_defaults(config_class(), data)
        cfg = load(config_class, data=data)
        assert (config_hash(cfg), recipe_hash(cfg)) == (digest, training.get("recipe_hash") or recipe_hash(cfg)), \
            (baseline, training["config_path"])
        assert to_dict(cfg, hashed_only=True)["rl" if "rl" in training["config"] else "run"] == \
            training["config"]["rl" if "rl" in training["config"] else "run"]


def test_every_committed_evaluation_keeps_its_result_hash():
    """The eval hash in each committed result's run id, recomputed from the evaluation config saved beside it
    (an older run's flat decoding keys read into today's layout; a newer run's saved in it, sections and the
    runtime `compile` included); the bench results' from their decoding record."""
    from dare.eval import decoding_for, result_hash

    checked = 0
    for path in RESULTS:
        result = json.loads(Path(path).read_text())
        beside = Path(path).parent / "config.yaml"
        if beside.is_file():
            data = read_yaml(beside)
            saved = data["eval"]["decoding"]
            if not any(isinstance(saved.get(s), dict) for s in decoding.OPTIONS):  # saved before the sections
                data["eval"]["decoding"] = decoding.from_flat(saved)
            masked = data["eval"]["decoding"].get("masked") or {}
            if masked.get("further_horizon") == 0 and masked.get("cache") != "prefix":
                masked["further_horizon"] = None  # saved while 0 meant no window (now unset; 0 is the block alone)
            cfg = load(EvalRunConfig, data=data)
            name, family = result["benchmark"]["name"], result["model"]["family"]
            digest = result_hash(cfg, name, decoding_for(cfg, family, name)[0], family)
            assert result["run_id"].endswith(digest[:8]), path
        else:  # `dare bench rollout`: the strategy's decoding hashed, its record holds every changed setting
            record = result["decoding"]
            values = {**decoding.FLAT, **{k: v for k, v in record.items() if k != "extra"}, **record["extra"],
                      "threshold": record["threshold"] or 0.0}
            cfg = load(DecodingConfig, data=decoding.from_flat(values))
            strategy = result["method"]["variant"].split(":", 1)[1].replace("+", "-")
            assert result["run_id"].endswith(f"-{config_hash(cfg)[:8]}-{strategy}"), path
        checked += 1
    assert checked > 200


def test_further_horizon_unset_is_no_window_and_keeps_every_hash():
    """Issue 59.3: `masked.further_horizon` unset (None) is no window and 0 the block alone, as in TraceRL's rollout
    (0 meant no window before). A config without the option, or with a window, keeps the hash it had at e8b2faf
    (computed there with `dare.app.runs.resolve`); 0 is now a setting: hashed, and in a result's decoding record."""
    from dare.app.runs import resolve
    from dare.eval import decoding_record

    before = {("tracerl", "reproductions/tracerl/llada_math.yaml"):
              "e8434ff46b9f570013bb3b70a68b1931104bf7100f06594926dccbd227700bcf",
              ("rldf", "reproductions/rldf/llada_math.yaml"):
              "14add02c02c1733a4fe173652e8df8faa4e8dcbfc4a898d1134eef6740acd843",
              ("tracerl", None): "bc2bb4105796ba04cdf912f6efc7f02675e4b61da660769fd7e880441f8ce9d0",
              ("d1", None): "90eca4a87546a1005b2856623aa64411c00c7054ec101d9ca44c9ba53fa620aa"}
    for (name, path), digest in before.items():
        _, cfg, _ = resolve(name, REPO / path if path else None, [])
        assert config_hash(cfg) == digest, (name, path)
    assert DecodingConfig().masked.further_horizon is None and decoding.FLAT["further_horizon"] is None
    unset = DecodingConfig(masked={"cache": "prefix"})
    zero = DecodingConfig(masked={"cache": "prefix", "further_horizon": 0})
    assert "further_horizon" not in decoding.hashed(unset, "llada")
    assert decoding.hashed(zero, "llada")["further_horizon"] == 0
    assert decoding_record(unset, "masked")["extra"] == {"cache": "prefix"}
    assert decoding_record(zero, "masked")["extra"] == {"cache": "prefix", "further_horizon": 0}


def test_record_says_what_it_asks_for_and_the_flat_form_keeps_one_flag():
    """`record` names what the rollout keeps (states, predictions, supports), where `record_trajectory` meant the
    trajectory, predictions or supports by sampler: a kind the sampler cannot record fails at load, the flat form
    (config hash, result record) still holds the one flag, and an old flat `record_trajectory` reads back as
    everything that sampler kept."""
    from dare.config import to_dict

    with pytest.raises(ConfigError, match="only the maskgit sampler records predictions"):
        load(EvalRunConfig, overrides=["eval.decoding.record=[predictions]"])
    with pytest.raises(ConfigError, match="only the truncated sampler records supports"):
        load(EvalRunConfig, overrides=["eval.decoding.sampler=maskgit", "eval.decoding.record=[supports]"])
    load(EvalRunConfig, overrides=["eval.decoding.sampler=maskgit", "eval.decoding.record=[states,predictions]"])
    assert decoding.flat(DecodingConfig())["record_trajectory"] is False and "record" not in decoding.flat(DecodingConfig())
    for record in [("states",), ("states", "predictions")]:
        d = DecodingConfig(sampler="maskgit", record=record)
        assert decoding.flat(d)["record_trajectory"] is True
        assert to_dict(d, hashed_only=True) == to_dict(DecodingConfig(sampler="maskgit", record=("states",)),
                                                       hashed_only=True)
    for sampler, kept in [("maskgit", ("states", "predictions")), ("truncated", ("states", "supports")),
                          ("masked", ("states",)), ("auto", ("states",))]:
        assert decoding.from_flat({"sampler": sampler, "record_trajectory": True})["record"] == kept
        assert "record" not in decoding.from_flat({"sampler": sampler, "record_trajectory": False})
    saved = {"eval": {"decoding": {"sampler": "maskgit", "record_trajectory": True}}}  # a config.yaml saved before
    assert load(EvalRunConfig, data=saved).eval.decoding.record == ("states", "predictions")
    overlay = {"rl": {"decoding": {"record_trajectory": True}}}  # onto a section whose sampler is truncated
    from baselines.agrpo.config import Config as AGRPOConfig
    assert load(AGRPOConfig, data=overlay).rl.decoding.record == ("states", "supports")
    saved["eval"]["decoding"]["record_trajectory"] = False
    assert load(EvalRunConfig, data=saved).eval.decoding.record == ()


@pytest.mark.parametrize("record", [(), ("states",), ("predictions",), ("states", "predictions")])
def test_the_maskgit_sampler_records_only_what_is_asked(record):
    import torch

    from dare.models import facts
    from dare.rollout import generate, left_pad
    from test_reference_samplers import PROMPTS, soft_llada

    model = soft_llada(0)
    ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
    out = generate(model, ids, mask, DecodingConfig(sampler="maskgit", gen_length=8, block_length=4, steps=4,
                                                    record=record), torch.Generator().manual_seed(0))
    assert (out.trajectory is not None) == ("states" in record)
    assert (out.predictions is not None) == (out.confidences is not None) == ("predictions" in record)
    if record:
        assert (out.trajectory if "states" in record else out.predictions).shape == (len(PROMPTS), 4, 8)
