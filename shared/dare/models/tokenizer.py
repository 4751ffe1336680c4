"""Character-level tokenizers for models trained from scratch on synthetic tasks.

They are ordinary `transformers` fast tokenizers (`save_pretrained` / `AutoTokenizer.from_pretrained`)
with a chat template, so the demo goes through exactly the code path a real checkpoint uses:
chat messages -> `apply_chat_template` -> ids. Special-token strings come from the model family.
"""

from __future__ import annotations

import json
from pathlib import Path

from dare.models.registry import family_module

# A compact chat template: one special token per role keeps tiny sequences short.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
UNK_TOKEN = "<|unk|>"


def char_tokenizer(alphabet: str, family: str):
    """One token per character of `alphabet`, plus the family's special tokens and role tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    fam = family_module(family)
    specials = list(dict.fromkeys([*fam.SPECIAL_TOKENS.values(), fam.MASK_TOKEN, UNK_TOKEN, *ROLE_TOKENS]))
    chars = sorted(set(alphabet))
    clash = [c for c in chars if c in specials]
    if clash:
        raise ValueError(f"alphabet characters {clash} collide with special tokens")
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=UNK_TOKEN, mask_token=fam.MASK_TOKEN,
                                   chat_template=CHAT_TEMPLATE, **fam.SPECIAL_TOKENS)


def save_tokenizer(tokenizer, folder: str | Path) -> None:
    """`save_pretrained`, then record the class as `PreTrainedTokenizerFast`: transformers 5 writes
    `TokenizersBackend`, which transformers 4 (the eval environment) rejects."""
    tokenizer.save_pretrained(folder)
    cfg_path = Path(folder) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
