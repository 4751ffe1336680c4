from dataclasses import dataclass, field

import pytest

from dare import config
from dare.config import ConfigError, DecodingConfig, NOHASH, check


@dataclass
class Inner:
    size: int = 4
    rate: float = 0.5
    name: str | None = None

    def validate(self):
        check(self.size % 2 == 0, "must be even", "size")


@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    tags: list[str] = field(default_factory=list)
    betas: tuple[float, float] = (0.9, 0.99)
    flag: bool = False
    out: str = field(default="x", metadata=NOHASH)


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_precedence_defaults_yaml_overrides(tmp_path):
    p = write(tmp_path, "inner: {size: 6, rate: 1}\ntags: [a, b]\n")
    cfg = config.load(Outer, p, ["inner.rate=2e-5", "flag=true", "betas=[0.8, 0.95]"])
    assert cfg.inner.size == 6
    assert cfg.inner.rate == 2e-5 and isinstance(cfg.inner.rate, float)  # "2e-5" is a YAML string
    assert cfg.tags == ["a", "b"] and cfg.flag is True and cfg.betas == (0.8, 0.95)
    assert config.load(Outer).inner.size == 4  # defaults are not shared between instances


def test_unknown_key_names_key_file_and_suggestion(tmp_path):
    p = write(tmp_path, "inner: {sise: 6}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: unknown key 'inner\.sise' \(did you mean 'inner\.size'\?\)"):
        config.load(Outer, p)
    with pytest.raises(ConfigError, match=r"command line: unknown key 'decoding\.gen_lenght' \(did you mean 'decoding\.gen_length'"):
        config.load(Outer, None, ["decoding.gen_lenght=3"])


def test_wrong_type_names_key_and_source(tmp_path):
    p = write(tmp_path, "inner: {size: four}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: inner\.size: expected int, got 'four'"):
        config.load(Outer, p)
    with pytest.raises(ConfigError, match=r"command line: flag: expected bool"):
        config.load(Outer, None, ["flag=1"])
    with pytest.raises(ConfigError, match="expected 2 values"):
        config.load(Outer, None, ["betas=[1, 2, 3]"])
    with pytest.raises(ConfigError, match="is a section"):
        config.load(Outer, None, ["inner=3"])
    with pytest.raises(ConfigError, match="not of the form key=value"):
        config.load(Outer, None, ["=3"])
    with pytest.raises(ConfigError, match="must be one of"):
        config.load(Outer, None, ["decoding.masked.remasking=confident"])


def test_inconsistent_values_fail_with_key_and_file(tmp_path):
    p = write(tmp_path, "decoding: {sampler: masked, gen_length: 100, block_length: 32}\n")
    with pytest.raises(ConfigError) as e:
        config.load(Outer, p)
    msg = str(e.value)
    assert "decoding.gen_length" in msg and "multiple of block_length" in msg and "c.yaml" in msg
    with pytest.raises(ConfigError, match=r"inner\.size: must be even"):
        config.load(Outer, None, ["inner.size=3"])
    with pytest.raises(ConfigError, match="steps"):
        config.load(Outer, None, ["decoding.sampler=masked", "decoding.steps=100"])  # 8 blocks do not divide 100


def test_bad_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        config.load(Outer, tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(Outer, write(tmp_path, "inner: {size: [\n"))
    with pytest.raises(ConfigError) as e:  # the file, line and column of the mistake
        config.load(Outer, write(tmp_path, "inner:\n  size: 4\n\trate: 1\n", name="tab.yaml"))
    assert str(e.value).startswith(f"{tmp_path / 'tab.yaml'}, line 3, column 1: not valid YAML: ")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        config.load(Outer, write(tmp_path, "- 1\n- 2\n"))


def test_hash_ignores_nohash_fields_and_save(tmp_path):
    a, b = config.load(Outer), config.load(Outer, None, ["out=elsewhere"])
    assert config.config_hash(a) == config.config_hash(b)
    c = config.load(Outer, None, ["inner.size=8"])
    assert config.config_hash(a) != config.config_hash(c)
    digest = config.save(c, tmp_path / "run")
    assert (tmp_path / "run" / "config.sha256").read_text().strip() == digest
    reloaded = config.load(Outer, tmp_path / "run" / "config.yaml")  # the saved config loads back
    assert config.config_hash(reloaded) == digest


def test_eval_config_validates_benchmarks():
    from dare.eval import load_eval_config

    with pytest.raises(ConfigError, match="eval.benchmarks: unknown benchmark 'gsm9k' \\(did you mean 'gsm8k'\\?\\)"):
        load_eval_config(None, ["eval.benchmarks=[gsm9k]"])
    with pytest.raises(ConfigError) as e:  # every bad name at once, an OpenCompass one named as such
        load_eval_config(None, ["eval.benchmarks=[additon,mmlu,addition,gsm9k]"])
    lines = str(e.value).splitlines()
    assert lines[:4] == [
        "3 config problems:",
        "  command line: eval.benchmarks: unknown benchmark 'additon' (did you mean 'addition'?) for the embedded engine",
        "  command line: eval.benchmarks: unknown benchmark 'mmlu' (OpenCompass runs it: eval.engine=opencompass) for "
        "the embedded engine",
        "  command line: eval.benchmarks: unknown benchmark 'gsm9k' (did you mean 'gsm8k'?) for the embedded engine"]
    assert lines[4].startswith("  embedded tasks: ['addition'") and "OpenCompass (engine=opencompass)" in lines[5]
    with pytest.raises(ConfigError, match="eval.split: 'addition' has splits"):
        load_eval_config(None, ["eval.split=dev"])


def test_string_fields_take_override_text_as_written():
    cfg = config.load(Outer, None, ["inner.name=2024", "out=yes"])
    assert cfg.inner.name == "2024" and cfg.out == "yes"
    with pytest.raises(ConfigError, match="expected int"):
        config.load(Outer, None, ["inner.size=yes"])


def test_every_problem_is_reported_at_once(tmp_path):
    """Unknown keys, wrong types and broken rules of the file and the command line: one error lists them all,
    each naming its source and dotted key, in the order file, command line, rules."""
    p = write(tmp_path, "inner: {sise: 6, rate: fast}\ndecoding: {block: {top_p: 0, top_k: -1}}\nflag: 3\n")
    with pytest.raises(ConfigError) as e:
        config.load(Outer, p, ["inner.size=3", "decoding.gen_lenght=8", "=1"])
    assert str(e.value).splitlines() == [
        "8 config problems:",
        f"  {p}: unknown key 'inner.sise' (did you mean 'inner.size'?)",
        f"  {p}: inner.rate: expected float, got 'fast'",
        f"  {p}: flag: expected bool, got 3",
        "  command line: unknown key 'decoding.gen_lenght' (did you mean 'decoding.gen_length'?)",
        "  command line: override '=1' is not of the form key=value",
        "  invalid config: inner.size: must be even [inner.size=3 (from command line)]",
        f"  invalid config: decoding.block.top_p: must be in (0, 1] [decoding.block.top_p=0.0 (from {p})]",
        f"  invalid config: decoding.block.top_k: must be >= 0 [decoding.block.top_k=-1 (from {p})]",
    ]


def test_a_rule_that_depends_on_a_rejected_value_is_not_reported():
    """DataConfig looks up the task's splits after checking the task: an unknown task is one problem,
    with the closest task name, not a crash."""
    with pytest.raises(ConfigError) as e:
        config.load(config.DataConfig, None, ["task=additon", "split=nope"])
    assert str(e.value).startswith("invalid config: task: unknown task 'additon' (did you mean 'addition'?); known:")
    assert "\n" not in str(e.value)


def test_validate_outside_load_still_raises_on_the_first_broken_rule():
    with pytest.raises(config.Invalid, match="must be in"):
        DecodingConfig(sampler="block", block={"top_p": 0, "top_k": -1}).validate()


def test_an_option_added_later_keeps_earlier_hashes_until_it_is_set():
    """`ADDED` fields enter the hash only when set away from their default, so results published
    before the option existed keep their run ids (here `rl.decoding.whole_last_block`)."""
    import dataclasses

    from dare.config import config_hash, to_dict
    from baselines.d1.config import Config

    cfg = Config()
    hashed = to_dict(cfg, hashed_only=True)
    assert "whole_last_block" not in hashed["rl"]["decoding"] and "whole_last_block" in to_dict(cfg)["rl"]["decoding"]
    cut = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, decoding=dataclasses.replace(
        cfg.rl.decoding, whole_last_block=False)))
    assert to_dict(cut, hashed_only=True)["rl"]["decoding"]["whole_last_block"] is False
    assert config_hash(cut) != config_hash(cfg)
