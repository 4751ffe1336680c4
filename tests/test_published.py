"""The published numbers (issue 49, item 3): every baseline's file loads and has numbers or says why not,
each bad entry is refused with a one-line error naming the file, the entry, the field and the value, and
the Published view's rows put ours beside a number only where the protocol matches, counting a seed
published twice once."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dare.app import targets
from dare.app.baselines import names
from dare.results import Result, metric_from_values
from dare.utils import UserError
from test_results import make_result

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "reproductions"


@pytest.fixture
def published(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "leaderboard"))
    import published

    return published


# ---------------------------------------------------------------------------------------------
# The committed files
# ---------------------------------------------------------------------------------------------


def test_every_baseline_has_one_file_of_published_numbers_or_says_why_it_has_none():
    files = targets.published_files(ROOT)
    assert set(files) == set(names()) and all(files.values()), [n for n, p in files.items() if p is None]
    for name, path in files.items():
        pub = targets.load_published(path)  # every entry checked
        assert pub.baseline == name
        # numbers, or none and a `missing:` that says why (a sentence, not a placeholder); never both
        assert bool(pub.numbers) != bool(pub.missing), name
        assert pub.numbers or len(pub.missing) > 40, name
        for e in pub.numbers:
            assert e["source"].strip() and 0 <= e["value"] <= 100, (name, e)


def test_the_targets_rows_are_published_numbers_with_their_protocol_and_the_sweep_sees_the_same_targets():
    d1 = targets.load_published(ROOT / "d1" / "targets.yaml")
    t = targets.load_targets(ROOT / "d1" / "targets.yaml")
    first = d1.numbers[0]
    assert len([e for e in d1.numbers if e.get("target")]) == len(t.rows) == 12
    assert (first["value"], first["source"]) == (72.6, t.source())
    assert targets.protocol_text(first) == "gen 128 / block 32 / 64 steps, 0-shot, T=0"
    assert t.published and all("init" in e or "source" in e for e in t.published)  # `published:` rides along
    cj = targets.load_published(ROOT / "cj_grpo" / "targets.yaml").numbers[0]
    assert targets.protocol_text(cj).endswith("eos_gamma_max=1.0, eos_gamma_min=0.01, schedule=ass")


# ---------------------------------------------------------------------------------------------
# Bad entries: one line naming the file, the entry, the field and the value
# ---------------------------------------------------------------------------------------------

GOOD = {"model": "LLaDA-8B-Instruct", "benchmark": "gsm8k", "value": 79.8, "source": "d1 Table 1"}


def _write(tmp_path, data, folder="d1", name=targets.PUBLISHED_FILE) -> Path:
    path = tmp_path / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(json.loads(json.dumps(data))))  # no anchors for an entry written twice
    return path


@pytest.mark.parametrize("entry, message", [
    ({**GOOD, "gen_lenght": 256}, r"published\[1\]\.gen_lenght=256: unknown field"),
    ({k: v for k, v in GOOD.items() if k != "source"}, r"published\[1\]\.source: missing \(every number carries its source\)"),
    ({**GOOD, "source": " "}, r"published\[1\]\.source=' ': a non-empty string"),
    ({**GOOD, "value": 120}, r"published\[1\]\.value=120: a percentage in \[0, 100\]"),
    ({**GOOD, "gen_length": 256}, None),  # the same number at a stated length is another number
    ({**GOOD, "value": "79.8"}, r"published\[1\]\.value='79\.8': a percentage"),
    ({**GOOD, "value": True}, r"published\[1\]\.value=True: a percentage"),
    ({**GOOD, "benchmark": "gsm8kk"}, r"published\[1\]\.benchmark='gsm8kk': not a task of dare\.data\.TASKS"),
    ({**GOOD, "gen_length": 0}, r"published\[1\]\.gen_length=0: a positive integer"),
    ({**GOOD, "n_shot": -1}, r"published\[1\]\.n_shot=-1: an integer >= 0"),
    ({**GOOD, "temperature": []}, r"published\[1\]\.temperature=\[\]: a number >= 0"),
    ({**GOOD, "init": "nope"}, r"published\[1\]\.init='nope': not a baseline"),
    (GOOD, r"published\[1\]: the same number as published\[0\]"),
    ("gsm8k 79.8", r"published\[1\]='gsm8k 79\.8': a mapping"),
])
def test_a_bad_entry_is_refused_in_one_line_naming_file_entry_field_and_value(tmp_path, entry, message):
    path = _write(tmp_path, {"paper": {"arxiv": "2504.12216"}, "published": [GOOD, entry]})
    if message is None:
        assert len(targets.load_published(path).numbers) == 2
        return
    with pytest.raises(UserError, match=message) as e:
        targets.load_published(path)
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("data, folder, message", [
    ({"paper": {"arxiv": "1"}, "published": [GOOD]}, "nope", r"unknown baseline 'nope'"),
    ({"paper": {"arxiv": "1"}}, "d1", r"either published \(the numbers\) or missing .*not neither"),
    ({"paper": {"arxiv": "1"}, "published": [GOOD], "missing": "why"}, "d1", r"not both"),
    ({"paper": {"table": "T1"}, "published": [GOOD]}, "d1", r"paper=\{'table': 'T1'\}: needs arxiv"),
    ({"paper": {"arxiv": "1"}, "published": [GOOD], "targets": []}, "d1", r"unknown keys \['targets'\]"),
    ({"paper": {"arxiv": "1"}, "published": {"gsm8k": 79.8}}, "d1", r"published=\{'gsm8k': 79\.8\}: a list"),
    ({"paper": {"arxiv": "1"}, "missing": 3}, "d1", r"missing=3: a sentence"),
])
def test_a_bad_published_file_is_refused_in_one_line(tmp_path, data, folder, message):
    path = _write(tmp_path, data, folder)
    with pytest.raises(UserError, match=message) as e:
        targets.load_published(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_a_bad_entry_in_a_targets_file_is_named_there(tmp_path):
    text = (ROOT / "d1" / "targets.yaml").read_text()
    path = tmp_path / "d1" / "targets.yaml"
    path.parent.mkdir()
    for config in ("gsm8k.yaml", "math.yaml", "countdown.yaml", "sudoku.yaml"):
        (path.parent / config).write_text("baseline: d1\n")
    path.write_text(text.replace("value: 73.2,", "value: 173.2,"))
    with pytest.raises(UserError, match=r"targets\.yaml: published\[0\]\.value=173\.2: a percentage"):
        targets.load_published(path)
    path.write_text(text + "\nextra: 1\n")
    with pytest.raises(UserError, match=r"unknown keys \['extra'\]"):
        targets.load_targets(path)


def test_a_baseline_with_both_files_is_refused(tmp_path):
    (tmp_path / "d1").mkdir()
    (tmp_path / "d1" / "targets.yaml").write_text("")
    _write(tmp_path, {"paper": {"arxiv": "1"}, "published": [GOOD]})
    with pytest.raises(UserError, match=r"d1/published\.yaml: d1 has a targets\.yaml"):
        targets.published_files(tmp_path)


# ---------------------------------------------------------------------------------------------
# The Published view's rows
# ---------------------------------------------------------------------------------------------

PROTOCOL = {"gen_length": 256, "block_length": 32, "steps": 128, "n_shot": 0, "temperature": 0.0}


def _r(seed, acc, *, method="d1", init="pretrained", model="LLaDA-8B-Instruct", run=None, samples=None, **decoding):
    r = make_result(run_id=run or f"{method}__{init}__s{seed}__{decoding.get('steps', 128)}",
                    method={"baseline": method, "init": init})
    r["model"].update(name=model)
    r["benchmark"].update(name="gsm8k")
    r["decoding"].update({"gen_length": 256, "block_length": 32, "steps": 128, **decoding})
    r["training"].update(seed=seed)
    r["metrics"] = [metric_from_values("accuracy", acc).model_dump()]
    r["artifacts"] = {"samples": "samples.jsonl", "samples_sha256": samples or f"sha-{method}-{init}-{seed}"}
    return Path(f"/results/{r['run_id']}/result_gsm8k.json"), Result.model_validate(r)


def test_ours_is_beside_a_number_only_where_the_protocol_matches_and_a_seed_published_twice_counts_once(
        tmp_path, published):
    _write(tmp_path, {"paper": {"arxiv": "2504.12216"}, "published": [
        {**GOOD, **PROTOCOL},                                     # run here: seeds 0 and 1
        {**GOOD, **PROTOCOL, "gen_length": 512, "steps": 256},    # not run at 512
        {**GOOD, "value": 83.7, "source": "DARE README"},         # no protocol stated: never compared
        {**GOOD, **PROTOCOL, "value": 81.1, "init": "peft"},      # SFT then d1: only the run from peft
        {**GOOD, "benchmark": "gpqa", "value": 30.0}]})           # not a registry task
    items = [_r(0, [1, 1, 1, 0]),
             _r(0, [1, 1, 1, 0], run="copy-of-seed-0", samples="sha-d1-pretrained-0"),  # the same run, twice
             _r(1, [1, 0, 1, 0]),
             _r(2, [0, 0, 0, 0], steps=64),                      # another protocol
             _r(3, [0, 0, 0, 0], temperature=1.0),               # sampled, not greedy
             _r(0, [1, 1, 1, 1], method="wd1"),                  # another method
             _r(0, [1, 1, 1, 1], model="Dream-v0-Instruct-7B"),  # another model
             _r(0, [1, 1, 0, 0], init="peft")]
    rows = published.published_rows(items, root=tmp_path)
    assert len(rows) == 5
    ran, at_512, readme, from_peft, gpqa = rows
    assert (ran["ours"], ran["seeds"], ran["runs"], ran["delta"], ran["status"]) == (62.5, 2, 2, -17.3, "")
    assert ran["published"] == 79.8 and ran["source"] == "d1 Table 1" and ran["method"] == "d1"
    assert ran["protocol"] == "gen 256 / block 32 / 128 steps, 0-shot, T=0"
    assert ran["ours_column"] == "gsm8k [256/32/128, T=0]"
    assert (at_512["ours"], at_512["delta"], at_512["status"]) == (None, None, published.NOT_RUN)
    assert (readme["ours"], readme["status"]) == (None, published.NOT_COMPARABLE)
    assert readme["protocol"] == "gen / block / steps not stated, 0-shot"
    assert (from_peft["method"], from_peft["ours"], from_peft["seeds"], from_peft["delta"]) == ("d1 (from peft)", 50.0, 1, -31.1)
    assert (gpqa["ours"], gpqa["status"]) == (None, published.OTHER)


def test_two_recipes_or_decodings_matching_one_number_get_a_row_each(tmp_path, published):
    _write(tmp_path, {"paper": {"arxiv": "1"}, "published": [{**GOOD, "gen_length": 256, "block_length": 32,
                                                                "steps": 128}]})  # temperature not stated
    greedy, sampled = _r(0, [1, 1, 1, 1]), _r(1, [0, 0, 0, 0], temperature=1.0)
    rows = published.published_rows([greedy, sampled], root=tmp_path)
    assert sorted((r["ours_column"], r["ours"]) for r in rows) == [("gsm8k [256/32/128, T=0]", 100.0),
                                                                     ("gsm8k [256/32/128, T=1]", 0.0)]


def test_the_committed_numbers_as_rows_with_a_target_matched_by_its_protocol(published):
    """Every committed number is a row; a d1 result with d1's protocol sits beside d1's target at 256."""
    total = sum(m["numbers"] for m in published.published_methods())
    assert len(published.published_rows([])) == total > 150
    rows = published.published_rows([_r(0, [1, 1, 1, 0]), _r(1, [1, 1, 1, 1], method="d_treerpo")])
    ours = [(r["method"], r["published"], r["ours"], r["delta"], r["target"]) for r in rows if r["ours"] is not None]
    assert ours == [("d1", 79.8, 75.0, -4.8, True), ("d_treerpo", 81.2, 100.0, 18.8, True)]
    methods = {m["method"]: m for m in published.published_methods()}
    assert set(methods) == set(names())
    none = {n for n, path in targets.published_files(ROOT).items() if not targets.load_published(path).numbers}
    assert {m for m, row in methods.items() if row["why none"]} == none != set()
    assert methods["d1"]["file"] == "reproductions/d1/targets.yaml" and methods["d1"]["comparable"] >= 12


def test_a_file_that_does_not_load_is_said_and_the_others_still_show(tmp_path, published):
    _write(tmp_path, {"paper": {"arxiv": "1"}, "published": [GOOD]}, folder="wd1")
    _write(tmp_path, {"paper": {"arxiv": "1"}, "published": [{**GOOD, "value": 101}]}, folder="d1")
    assert [r["method"] for r in published.published_rows([], root=tmp_path)] == ["wd1"]
    methods = {m["method"]: m for m in published.published_methods(root=tmp_path)}
    assert "value=101" in methods["d1"]["why none"] and "no targets.yaml" in methods["sft"]["why none"]


def test_the_published_view_is_torch_free():
    code = ("import sys; sys.path.insert(0, 'leaderboard'); import published; "
            "assert published.published_rows([]) and published.published_methods(); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
