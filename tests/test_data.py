import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dare.data import TASKS, build, load_split, split_path
from dare.data.schema import DataError, _schema
from dare.rewards.arithmetic import exact_match, parse_answer
from dare.utils import sha256_file


def test_build_is_byte_deterministic(tmp_path):
    a = build("addition", "test", tmp_path / "a")
    b = build("addition", "test", tmp_path / "b")
    assert sha256_file(a) == sha256_file(b)


def test_addition_splits_are_disjoint_and_correct(tmp_path):
    train = load_split("addition", "train", tmp_path)
    test = load_split("addition", "test", tmp_path)
    assert len(test) == 500 and len(train) == 100 * 100 - 500
    key = lambda r: (r["extra"]["a"], r["extra"]["b"])  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in test}
    for r in test[:50]:
        a, b = key(r)
        assert r["prompt"] == [{"role": "user", "content": f"{a}+{b}="}] and r["ground_truth"] == str(a + b)
    assert [r["index"] for r in test] == list(range(500))


def test_chain_writes_every_step_and_its_answers_are_long(tmp_path):
    """The bench task: each term is the one before plus its last digit plus 1, modulo 10^4, digits least
    significant first, letters count down to `a`; 102-156 tokens (one character each)."""
    test = load_split("chain", "test", tmp_path)
    train = load_split("chain", "train", tmp_path)
    assert len(test) == 500 and len(train) == 20000
    lengths = set()
    letters = "abcdefghijklmnopqrstuvwxyz"
    for r in test:
        value, count = r["extra"]["start"], r["extra"]["count"]
        assert r["prompt"][0]["content"] == f"{str(value).zfill(4)[::-1]},{letters[count - 1]}"
        terms = r["ground_truth"].split(",")
        assert terms[-1] == "" and len(terms) == count + 1
        for k, term in zip(range(count, 0, -1), terms):
            value = (value + value % 10 + 1) % 10000
            assert term[0] == letters[k - 1] and int(term[1:][::-1]) == value and len(term) == 5
        lengths.add(len(r["ground_truth"]))
    assert min(lengths) == 102 and max(lengths) == 156
    task = TASKS["chain"]
    truth = test[0]["ground_truth"]
    n = truth.count(",")
    assert task.score(f" {truth}\n", test[0]) == {"accuracy": 1.0, "term_accuracy": 1.0}
    wrong_last = truth[:-2] + ("0" if truth[-2] != "0" else "1") + ","
    assert task.score(wrong_last, test[0]) == {"accuracy": 0.0, "term_accuracy": (n - 1) / n}
    assert task.score(truth + "z", test[0])["accuracy"] == 0.0  # nothing may follow the last term
    assert task.reward("", test[0]) == 0.0


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=_schema()), path)


def _row(i, **kw):
    return {"index": i, "task": "gsm8k", "split": "test", "prompt": [{"role": "user", "content": "1+1="}],
            "ground_truth": "2", "extra": "{}", **kw}


@pytest.mark.parametrize("bad,field", [
    ({"ground_truth": None}, "ground_truth"),
    ({"prompt": []}, "prompt"),
    ({"extra": "{not json"}, "extra"),
    ({"index": 7}, "index"),
    ({"task": "countdown"}, "task"),
])
def test_load_names_file_row_and_field(tmp_path, bad, field):
    """A task built from its original files (an offline task's bad file is rebuilt from code instead)."""
    path = split_path("gsm8k", "test", tmp_path)
    _write(path, [_row(0), _row(1, **bad)])
    with pytest.raises(DataError, match=rf"test\.parquet: row 1: field '{field}'"):
        load_split("gsm8k", "test", tmp_path)


def test_load_rejects_wrong_schema_and_garbage(tmp_path):
    path = split_path("gsm8k", "test", tmp_path)
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table({"index": [0], "task": ["gsm8k"]}), path)
    with pytest.raises(DataError, match="missing column 'split'"):
        load_split("gsm8k", "test", tmp_path)
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="not a readable parquet"):
        load_split("gsm8k", "test", tmp_path)
    with pytest.raises(DataError, match="dare data build"):
        load_split("addition", "train", tmp_path / "empty", build_missing=False)


def test_addition_reward():
    assert exact_match("46", "46") == 1.0
    assert exact_match(" 46 ", "46") == 1.0
    assert exact_match("046", "46") == 1.0  # the value counts, not leading zeros
    assert exact_match("45", "46") == 0.0
    assert exact_match("4 6", "46") == 0.0 and exact_match("", "46") == 0.0 and exact_match("46+", "46") == 0.0
    assert parse_answer("x") is None
    task = TASKS["addition"]
    row = {"ground_truth": "12"}
    assert task.reward("12", row) == 1.0 and task.score("13", row) == {"accuracy": 0.0}


def test_an_offline_split_built_by_another_version_is_rebuilt(tmp_path, capsys):
    """A parquet file does not name the code version that built it: an offline split whose bytes
    differ from the recorded hash (an older generator, a changed parameter) is rebuilt on load, never
    silently trained on; with build_missing=False it is an error that says how to fix it."""
    from dare.data import DataError, build, load_split, recorded_hashes, split_path
    from dare.utils import sha256_file

    path = build("addition_teacher", "train", tmp_path)
    rows = load_split("addition_teacher", "train", tmp_path)
    table = pq.read_table(path)
    pq.write_table(table.slice(0, 100), path)  # what an older build left behind
    with pytest.raises(DataError, match="built by another version of 'addition_teacher'.*dare data build"):
        load_split("addition_teacher", "train", tmp_path, build_missing=False)
    assert load_split("addition_teacher", "train", tmp_path) == rows
    assert "rebuilding" in capsys.readouterr().err
    assert sha256_file(split_path("addition_teacher", "train", tmp_path)) == recorded_hashes()["addition_teacher/train"]


def test_a_split_this_code_wrote_with_another_pyarrow_is_not_rebuilt_at_every_load(tmp_path, capsys, monkeypatch):
    """The recorded hashes hold for the pinned pyarrow (its version is in the parquet footer). Where
    another pyarrow wrote the file (a GPU image's, say), its sha256 differs from the recorded one but
    its bytes are what this code builds there: loading it must not rebuild it again and again
    (seen on an H100 image: `dare bench rollout` rebuilt addition/test before every strategy)."""
    import dare.data.store as store
    from dare.data import build, load_split

    path = build("addition", "test", tmp_path)
    before = path.stat().st_mtime_ns
    monkeypatch.setattr(store, "recorded_hashes", lambda: {"addition/test": "0" * 64})  # another writer's hash
    assert len(load_split("addition", "test", tmp_path)) == 500
    assert path.stat().st_mtime_ns == before and "rebuilding" not in capsys.readouterr().err
    path.write_bytes(path.read_bytes()[:-8] + b"00000000")  # bytes this code does not build: rebuilt
    load_split("addition", "test", tmp_path)
    assert "rebuilding" in capsys.readouterr().err
