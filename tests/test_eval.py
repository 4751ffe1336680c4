"""The embedded evaluator on a checkpoint folder we did not train (a "base" model)."""

import fcntl
import json
import os
import pty
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from dare.eval import default_out_dir, evaluate_checkpoint
from dare.models.tokenizer import save_tokenizer
from dare.results import read_result
from dare.utils import UserError, sha256_file

EVAL = ["eval.n_samples=20", "eval.batch_size=8", "eval.decoding.gen_length=4", "eval.decoding.block_length=4",
        "eval.decoding.steps=4"]


@pytest.fixture
def checkpoint(tmp_path, trained_tiny, char_tok):
    folder = tmp_path / "a" / "tiny"
    trained_tiny.save_pretrained(folder)
    save_tokenizer(char_tok, folder)
    return folder


def test_result_and_samples_of_a_base_checkpoint(checkpoint, tmp_path):
    [path] = evaluate_checkpoint(checkpoint, None, EVAL, out_dir=tmp_path / "out")
    r = read_result(path)
    assert r.method.baseline == "base" and r.method.init is None and r.training is None
    assert r.benchmark.n_samples.effective == 20 and r.benchmark.n_samples.original == 500
    assert r.throughput.nfe_per_sample == 4 and r.throughput.tokens_per_forward == 1.0
    samples = [json.loads(x) for x in (tmp_path / "out" / "samples_addition.jsonl").read_text().splitlines()]
    assert len(samples) == 20 and r.artifacts.samples_sha256 == sha256_file(tmp_path / "out" / "samples_addition.jsonl")
    acc = r.metric("accuracy")
    assert acc.sum == sum(s["scores"]["accuracy"] for s in samples) and acc.count == 20
    mtime = path.stat().st_mtime_ns
    evaluate_checkpoint(checkpoint, None, EVAL, out_dir=tmp_path / "out")  # valid result: reused
    assert path.stat().st_mtime_ns == mtime


def test_same_folder_name_different_contents_never_share_results(checkpoint, tmp_path, trained_tiny, char_tok):
    other = tmp_path / "b" / "tiny"
    trained_tiny.save_pretrained(other)
    save_tokenizer(char_tok, other)
    (other / "config.json").write_text((other / "config.json").read_text().replace('"init_std": 0.02', '"init_std": 0.03'))
    assert default_out_dir(checkpoint, "h" * 64) != default_out_dir(other, "h" * 64)


def test_empty_selection_is_an_error(checkpoint, tmp_path):
    with pytest.raises(UserError, match="n_samples"):
        evaluate_checkpoint(checkpoint, None, ["eval.n_samples=0"], out_dir=tmp_path / "o")


def test_an_evaluation_of_a_rewritten_checkpoint_is_not_reused(tmp_path):
    """Results are keyed by the eval config; a checkpoint retrained in place must be evaluated again."""
    import os

    from dare.eval import evaluate_checkpoint
    from dare.app.runs import train

    run = train("sft", None, ["model.scratch.d_model=32", "model.scratch.n_heads=2", "model.scratch.n_layers=1",
                              "model.scratch.mlp_hidden_size=64", "train.steps=2", "train.batch_size=8",
                              "train.warmup_steps=0", "algo.response_length=4", f"run.out_dir={tmp_path / 'r'}"])
    (first,) = evaluate_checkpoint(run / "final", None, ["eval.n_samples=8"])
    stamp = first.stat().st_mtime
    assert evaluate_checkpoint(run / "final", None, ["eval.n_samples=8"]) == [first]
    assert first.stat().st_mtime == stamp  # reused
    weights = next((run / "final").glob("*.safetensors"))
    os.utime(weights, (stamp + 10, stamp + 10))  # the checkpoint is newer than its evaluation
    evaluate_checkpoint(run / "final", None, ["eval.n_samples=8"])
    assert first.stat().st_mtime > stamp  # evaluated again


def test_progress_is_plain_lines_in_a_log(checkpoint, tmp_path, capsys):
    """Not a terminal (a log, a pipe): one line per tenth of the samples, with the count and the rate."""
    evaluate_checkpoint(checkpoint, None, EVAL, out_dir=tmp_path / "out")
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("[eval] addition/test: ")]
    assert [ln.split(",")[0] for ln in lines] == ["[eval] addition/test: 8/20 samples (40%)",
                                                  "[eval] addition/test: 16/20 samples (80%)",
                                                  "[eval] addition/test: 20/20 samples (100%)"]
    assert all(ln.endswith(" samples/s") for ln in lines)


def test_progress_is_a_bar_on_a_terminal(checkpoint, tmp_path):
    """`dare eval` with its stderr on a terminal draws a tqdm bar (redrawn in place with carriage returns)."""
    exe = shutil.which("dare", path=str(Path(sys.executable).parent))
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 rows, 100 columns
    proc = subprocess.Popen([exe, "eval", str(checkpoint), *EVAL, "--out", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal's other side closed: the command ended
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert proc.wait(timeout=600) == 0, shown.decode(errors="replace")
    text = shown.decode(errors="replace")
    assert "\r" in text and "[eval] addition/test: 100%|" in text and "20/20" in text
    assert "samples (" not in text  # no plain progress lines on a terminal
