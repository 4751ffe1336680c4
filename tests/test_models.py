import json

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer

from dare.config import ScratchModelConfig
from dare.models import facts, load_pretrained, load_tokenizer, new_model, token_logits
from dare.models.llada import LLaDAConfig, LLaDAModelLM
from dare.models.tokenizer import save_tokenizer
from dare.utils import UserError


def test_original_parameter_names(tiny_model):
    names = set(tiny_model.state_dict())
    for n in ["model.transformer.wte.weight", "model.transformer.ln_f.weight", "model.transformer.ff_out.weight",
              *(f"model.transformer.blocks.1.{p}.weight" for p in
                ["attn_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_norm", "ff_proj", "up_proj", "ff_out"])]:
        assert n in names, n
    assert not any("rotary" in n for n in names)


def test_save_load_round_trip_through_auto_classes(tiny_model, char_tok, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    save_tokenizer(char_tok, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "llada"
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    # Auto classes know `llada` without trust_remote_code once dare.models is imported.
    assert isinstance(AutoConfig.from_pretrained(tmp_path), LLaDAConfig)
    auto = AutoModel.from_pretrained(tmp_path)
    assert isinstance(auto, LLaDAModelLM)
    x = torch.randint(0, len(char_tok), (2, 9))
    torch.testing.assert_close(token_logits(auto, x), token_logits(tiny_model, x), rtol=0, atol=0)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok.decode(tok("12+34=")["input_ids"]) == "12+34="
    assert facts(load_pretrained(tmp_path)) == facts(tiny_model)
    assert load_tokenizer(tmp_path).convert_tokens_to_ids("<|mdm_mask|>") == facts(tiny_model).mask_token_id


def test_facts_come_from_the_config(tiny_model, char_tok):
    f = facts(tiny_model)
    assert f.family == "llada" and f.attention == "bidirectional" and f.logits_shift is False
    assert f.mask_token_id == char_tok.convert_tokens_to_ids("<|mdm_mask|>")
    assert f.eos_token_id == char_tok.eos_token_id == f.pad_token_id
    iLLaDA_like = LLaDAConfig(d_model=16, n_heads=2, n_layers=1, vocab_size=10, embedding_size=10, mask_token_id=5)
    assert facts(LLaDAModelLM(iLLaDA_like)).mask_token_id == 5
    with pytest.raises(ValueError, match="no mask_token_id"):
        facts(LLaDAModelLM(LLaDAConfig(d_model=16, n_heads=2, n_layers=1, vocab_size=10, embedding_size=10)))


def test_left_padding_is_invisible(tiny_model):
    """A left-padded row computes exactly what the same row computes alone."""
    seq = torch.tensor([[5, 9, 10, 11, 3, 4]])
    padded = torch.cat([torch.full((1, 3), 1), seq], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    alone = token_logits(tiny_model, seq)
    with_pad = token_logits(tiny_model, padded, mask)[:, 3:]
    torch.testing.assert_close(with_pad, alone, rtol=1e-5, atol=1e-5)


def test_attention_is_bidirectional(tiny_model):
    x = torch.tensor([[5, 9, 10, 11, 3, 4]])
    y = x.clone()
    y[0, -1] = 12
    a, b = token_logits(tiny_model, x), token_logits(tiny_model, y)
    assert not torch.allclose(a[0, 0], b[0, 0])  # a later token changes an earlier position's logits


def test_new_model_is_seeded_without_touching_global_rng(char_tok):
    scratch = ScratchModelConfig(d_model=32, n_layers=1, n_heads=2, mlp_hidden_size=64)
    state = torch.random.get_rng_state()
    a = new_model("llada", char_tok, scratch, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    b = new_model("llada", char_tok, scratch, seed=3)
    c = new_model("llada", char_tok, scratch, seed=4)
    wa, wb, wc = (m.model.transformer.wte.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_unsupported_options_and_missing_folders_are_clear(tmp_path):
    with pytest.raises(NotImplementedError, match="block_type"):
        LLaDAModelLM(LLaDAConfig(d_model=16, n_heads=2, n_layers=1, vocab_size=10, block_type="sequential"))
    with pytest.raises(NotImplementedError, match="scale_logits"):  # an OLMo option the original honours
        LLaDAModelLM(LLaDAConfig(d_model=16, n_heads=2, n_layers=1, vocab_size=10, scale_logits=True))
    with pytest.raises(UserError, match="not a checkpoint folder"):
        load_pretrained(tmp_path / "nowhere")


def test_chat_template_and_char_tokenizer(char_tok):
    from dare.models import encode_chat

    ids = encode_chat(char_tok, [[{"role": "user", "content": "7+8="}]])[0]
    assert char_tok.convert_ids_to_tokens(ids) == ["<|user|>", "7", "+", "8", "=", "<|assistant|>"]


LOAD_AFTER_IMPORT_DARE = """
import sys
import dare  # registers the families with the Auto classes (cheaply: transformers is not imported yet)
assert "torch" not in sys.modules
from transformers import AutoConfig, AutoModel
assert AutoConfig.for_model("llada").model_type == "llada"
model = AutoModel.from_pretrained(sys.argv[1])
print(type(model).__name__)
"""


@pytest.mark.parametrize("env", ["train", "eval"])
def test_an_export_loads_with_the_auto_classes_after_import_dare(sft_checkpoint, env):
    """A fresh interpreter: `import dare`, then plain transformers loads an exported final/ (both
    environments: transformers 5 here, 4.x in the eval environment)."""
    import subprocess
    import sys
    from pathlib import Path

    from conftest import EVAL_PYTHON

    python = sys.executable if env == "train" else EVAL_PYTHON
    if not Path(python).exists():
        pytest.skip("no eval environment (make test builds $VENV/eval)")
    r = subprocess.run([python, "-c", LOAD_AFTER_IMPORT_DARE, str(sft_checkpoint("llada"))], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == "LLaDAModelLM"


# Stand-ins for a released checkpoint's remote code (the real modeling_llada.py cannot be downloaded
# here): subclasses defined in the checkpoint folder, so a model loaded through them shows it.
REMOTE_CONFIG = """from dare.models.llada import LLaDAConfig as _Ours


class LLaDAConfig(_Ours):
    pass
"""
REMOTE_MODEL = """from dare.models.llada import LLaDAModelLM as _Ours

from .configuration_llada import LLaDAConfig


class LLaDAModelLM(_Ours):
    config_class = LLaDAConfig
"""
LOAD_REMOTE = """
import sys
from transformers import AutoModel
model = AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True)
print(type(model).__module__)
"""


def test_an_export_keeps_its_bases_auto_map_and_remote_code(char_tok, tmp_path):
    """Fine-tuned from a folder that loads through its own `auto_map` (as released checkpoints do),
    the export carries that auto_map and the code files, and loads the same way, without `dare`."""
    import subprocess
    import sys

    from conftest import TINY
    from dare.app.runs import train

    base = tmp_path / "base"
    model = new_model("llada", char_tok, ScratchModelConfig(d_model=32, n_heads=2, n_layers=1, mlp_hidden_size=64), 0)
    model.save_pretrained(base)
    save_tokenizer(char_tok, base)
    config = json.loads((base / "config.json").read_text())
    auto_map = {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModel": "modeling_llada.LLaDAModelLM"}
    (base / "config.json").write_text(json.dumps({**config, "auto_map": auto_map}))
    (base / "configuration_llada.py").write_text(REMOTE_CONFIG)
    (base / "modeling_llada.py").write_text(REMOTE_MODEL)
    final = train("sft", None, [*TINY, f"model.path={base}", "train.steps=1", "algo.response_length=4",
                                f"run.out_dir={tmp_path / 'run'}"]) / "final"
    assert json.loads((final / "config.json").read_text())["auto_map"] == auto_map
    assert (final / "modeling_llada.py").read_text() == REMOTE_MODEL
    r = subprocess.run([sys.executable, "-c", LOAD_REMOTE, str(final)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1].startswith("transformers_modules.") and "modeling_llada" in r.stdout
