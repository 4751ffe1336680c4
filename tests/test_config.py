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
        config.load(Outer, None, ["decoding.remasking=confident"])


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

    with pytest.raises(ConfigError, match="eval.benchmarks: unknown benchmark 'gsm9k'"):
        load_eval_config(None, ["eval.benchmarks=[gsm9k]"])
    with pytest.raises(ConfigError, match="eval.split: 'addition' has splits"):
        load_eval_config(None, ["eval.split=dev"])


def test_string_fields_take_override_text_as_written():
    cfg = config.load(Outer, None, ["inner.name=2024", "out=yes"])
    assert cfg.inner.name == "2024" and cfg.out == "yes"
    with pytest.raises(ConfigError, match="expected int"):
        config.load(Outer, None, ["inner.size=yes"])
