"""The one adapter protocol every other part of the code uses.

- `facts(model)`: a `ModelFacts` with the mask/eos/pad ids, logit shift, attention kind and
  block size, read from the checkpoint's config.
- `token_logits(model, ids, attention_mask)`: logits aligned so that `out[:, i]` predicts token
  i, for every family (a shifted family is re-aligned here, not in algorithm code).
- `load_pretrained(path)`, `new_model(family, tokenizer, scratch, seed)`, `load_tokenizer(path)`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dare.models.registry import FAMILIES, ModelFacts, family_module, register_all
from dare.utils import UserError


def facts(model) -> ModelFacts:
    model = getattr(model, "module", model)  # unwrap DDP-style wrappers
    return model.dllm_facts()


def align(model, out, cu_seqlens=None, attention_mask=None):
    """Re-align a shifted family's outputs (B, L, ...) so that `out[:, i]` predicts token i: the
    output at i-1 moves to i. The first token of each sequence has no predecessor and keeps its
    own output, as the originals do; "first" means after left padding (`attention_mask`) and at
    every packed-sequence start (`cu_seqlens`), so a sequence never borrows a pad's or the previous
    packed sequence's output. Unshifted families are returned unchanged."""
    import torch

    if not facts(model).logits_shift:
        return out
    shifted = torch.cat([out[:, :1], out[:, :-1]], dim=1)
    if cu_seqlens is not None:
        starts = cu_seqlens[:-1].long()
        starts = starts[starts < out.shape[1]]
        shifted[:, starts] = out[:, starts]
    if attention_mask is not None and attention_mask.dim() == 2:
        real = attention_mask.bool()
        first = real & ~torch.cat([torch.zeros_like(real[:, :1]), real[:, :-1]], dim=1)
        shifted = torch.where(first[..., None], out, shifted)
    return shifted


def token_logits(model, input_ids, attention_mask=None, *, cu_seqlens=None, position_ids=None,
                 at: slice | None = None):
    """Full-vocabulary logits with `logits[:, i]` predicting token i. (B, L, V)

    `attention_mask` is a 2-D padding mask (pads are never attended); `cu_seqlens` packs several
    sequences in one row of `input_ids` (1, total) with no compute spent across them. `at`: only the logits
    of those positions (B, len, V), the head run on them alone (`logits_at`), as a sampler reads one block of its
    canvas (a shifted family reads each from the position before: `at` then starts after every row's first token)."""
    if at is not None:
        return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     cu_seqlens=cu_seqlens, logits_at=read_at(model, at)).logits
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   cu_seqlens=cu_seqlens).logits
    return align(model, logits, cu_seqlens, attention_mask)


def read_at(model, at: slice) -> slice:
    """The output positions whose logits predict the tokens at `at`: the same positions, or for a shifted family
    (`logits_shift`) the positions before them (so `at` must then start after every row's first token)."""
    shift = int(facts(model).logits_shift)
    if at.step not in (None, 1) or (shift and (at.start is None or at.start < 1)):
        raise ValueError(f"logits at {at}: a contiguous slice" + (" after the first position" if shift else ""))
    if not shift:
        return at
    return slice(at.start - shift, at.stop - shift if at.stop is not None else -shift)


def token_hidden(model, input_ids, attention_mask=None, *, cu_seqlens=None, position_ids=None):
    """Final hidden states aligned like `token_logits`, without the vocabulary projection: the
    logits are `output_head(model)(hidden)`, so a trainer can take the cross-entropy in chunks."""
    hidden = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   cu_seqlens=cu_seqlens, output_logits=False).last_hidden_state
    return align(model, hidden, cu_seqlens, attention_mask)


def output_head(model):
    """hidden -> logits, exactly as the model's forward computes them (including LLaDA2's float32 cast)."""
    model = getattr(model, "module", model)
    return model.logits_from_hidden


def encode_chat(tokenizer, prompts: list[list[dict]]) -> list[list[int]]:
    """Chat messages -> token ids through the tokenizer's chat template (with the generation prompt)."""
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _check_folder(path: str | Path) -> Path:
    """A checkpoint folder whose config.json parses and names a family dare knows (one line otherwise)."""
    p = Path(path)
    file = p / "config.json"
    if not file.is_file():
        raise UserError(
            f"{path}: not a checkpoint folder (no config.json). Models are loaded from local folders "
            f"(download them first, e.g. `huggingface-cli download GSAI-ML/LLaDA-8B-Instruct --local-dir ...`).")
    try:
        raw = json.loads(file.read_text())
        model_type = raw.get("model_type")
    except (ValueError, AttributeError) as e:
        raise UserError(f"{file}: not a JSON object ({e})") from None
    known = {mt for _, mt in FAMILIES.values()}
    if model_type not in known:
        raise UserError(f"{file}: model_type {model_type!r} is not a family dare knows "
                        f"(model types: {sorted(known)}; families: {sorted(FAMILIES)})")
    check_sizes(file, raw)
    return p


MAX_LAYERS = 1024
"""The most layers a checkpoint's config may name (released models have up to about 130): a model is built layer by
layer, even on the meta device, so 10^9 layers would run for hours while memory grows."""
MAX_SIZE = 2**20
"""The largest any other size of a config may be (widths, heads, experts, vocabulary, context length)."""
_SIZE = re.compile(r"(^|_)(size|dim|heads|experts|layers|model|embeddings|length|tok)$|^(n|num)_")
_LAYERS = ("n_layers", "num_hidden_layers", "num_layers")


def check_sizes(file: Path, raw: dict) -> None:
    """One line naming the field when a size of a config.json (`hidden_size`, `n_layers`, `vocab_size`, ...: the
    integers its name marks as sizes) is not an integer in [0, `MAX_SIZE`] (layers: [0, `MAX_LAYERS`]), before any
    model is built from it."""
    if not isinstance(raw, dict):
        raise UserError(f"{file}: not a JSON object")
    for key, value in raw.items():
        if not _SIZE.search(key) or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue  # `pruned_heads: {}`, `tie_word_embeddings: true`: not sizes
        limit = MAX_LAYERS if key in _LAYERS else MAX_SIZE
        if not isinstance(value, int) or not 0 <= value <= limit:
            raise UserError(f"{file}: {key}={str(value)[:40]}: a size must be an integer in [0, {limit:,}]")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def _check_tokenizer(folder: Path) -> Path:
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise UserError(f"{folder}: no tokenizer ({', '.join(TOKENIZER_FILES)}); copy the tokenizer files of the "
                        f"model it was trained from into the folder")
    return folder


def check_checkpoint(path: str | Path) -> Path:
    """Everything `load_pretrained` and `load_tokenizer` need, checked in a moment without loading
    anything: the config (`_check_folder`), tokenizer files, and weights files whose sizes match what
    their headers describe (a truncated copy is named, with both sizes). Raises a one-line UserError."""
    return _check_weights(_check_tokenizer(_check_folder(path)))


def _check_weights(folder: Path) -> Path:
    """Weights files whose sizes match what their headers describe (one line naming a truncated one)."""
    weights = sorted(folder.glob("*.safetensors"))
    if not weights and not list(folder.glob("pytorch_model*.bin")):
        raise UserError(f"{folder}: no weights (*.safetensors)")
    for file in weights:
        size = file.stat().st_size
        with open(file, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            header = f.read(n) if 0 < n <= size - 8 else b""
        try:
            tensors = json.loads(header) if header else None
        except ValueError:
            tensors = None
        if not isinstance(tensors, dict):
            raise UserError(f"{file}: not a readable safetensors file ({size} bytes; its header is cut or damaged)")
        end = max((t["data_offsets"][1] for k, t in tensors.items() if k != "__metadata__"), default=0)
        if size < 8 + n + end:
            raise UserError(f"{file}: truncated: {size:,} bytes, its header describes {8 + n + end:,}")
    return folder


def load_pretrained(path: str | Path, dtype: str = "float32", attn_backend: str | None = None):
    """Load a checkpoint folder of any registered family, without `trust_remote_code`.

    `attn_backend` (sdpa | flex | flash) overrides what the checkpoint's config asks for; an
    unavailable kernel asked for here is an error."""
    import torch
    from transformers import AutoModel

    register_all()
    folder = _check_weights(_check_folder(path))  # (a model folder needs no tokenizer: `load_tokenizer` checks)
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") == "llada" and "LLaDAMoEModelLM" in (config.get("architectures") or []):
        # LLaDA-MoE's released config.json reuses `model_type: llada` for a different architecture
        from dare.models.lladamoe import LLaDAMoEConfig, LLaDAMoEModelLM

        cfg = LLaDAMoEConfig.from_dict({k: v for k, v in config.items() if k != "model_type"})
        model = LLaDAMoEModelLM.from_pretrained(folder, config=cfg, dtype=getattr(torch, dtype))
    else:
        model = AutoModel.from_pretrained(folder, dtype=getattr(torch, dtype))
    if attn_backend is not None:
        model.set_attention_backend(attn_backend)
    if getattr(model.config, "eot_token_id", None) is None:
        model.config.eot_token_id = end_of_turn_id(folder, facts(model).family)
    return model


def end_of_turn_id(folder: str | Path, family: str) -> int | None:
    """The id of the family's end-of-turn token (`END_OF_TURN`) in the checkpoint's tokenizer
    files (`tokenizer_config.json`'s `added_tokens_decoder`, else `tokenizer.json`'s
    `added_tokens`), or None when the tokenizer has no such token. Released configs do not name
    it (LLaDA-8B-Instruct's says only eos 126081), so it is read here, once, at load time."""
    name = getattr(family_module(family), "END_OF_TURN", None)
    folder = Path(folder)
    if name is None:
        return None
    found: dict[str, int] = {}
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        for i, tok in (json.loads(cfg.read_text()).get("added_tokens_decoder") or {}).items():
            found.setdefault(tok.get("content"), int(i))
    tok_file = folder / "tokenizer.json"
    if name not in found and tok_file.is_file():
        for tok in json.loads(tok_file.read_text()).get("added_tokens") or []:
            found.setdefault(tok.get("content"), int(tok["id"]))
    return found.get(name)


def meta_model(path: str | Path):
    """The model of a checkpoint folder (or a config.json) built on the meta device from its
    config alone: its facts and parameter count without reading or allocating any weights."""
    import torch
    from transformers import AutoConfig

    register_all()
    path = Path(path)
    file = path if path.name == "config.json" else _check_folder(path) / "config.json"
    if not file.is_file():
        raise UserError(f"{path}: no config.json")
    raw = json.loads(file.read_text())
    check_sizes(file, raw)
    if raw.get("model_type") == "llada" and "LLaDAMoEModelLM" in (raw.get("architectures") or []):
        from dare.models.lladamoe import LLaDAMoEConfig, LLaDAMoEModelLM  # same special case as load_pretrained

        model_class, config = LLaDAMoEModelLM, LLaDAMoEConfig.from_dict({k: v for k, v in raw.items()
                                                                        if k != "model_type"})
    else:
        config = AutoConfig.from_pretrained(file)
        classes = [family_module(f).MODEL_CLASS for f, (_, mt) in FAMILIES.items() if mt == config.model_type]
        if not classes:
            raise UserError(f"{file}: model_type {config.model_type!r} is not a family dare knows ({sorted(FAMILIES)})")
        model_class = classes[0]
    with torch.device("meta"):
        return model_class(config)


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_check_tokenizer(_check_folder(path)))


def new_model(family: str, tokenizer, scratch, seed: int, dtype: str = "float32"):
    """A randomly initialised model of `family`, sized by `scratch` (a ScratchModelConfig),
    with the special-token ids taken from `tokenizer`. The weights depend only on `seed`; the
    global RNG states (CPU and every CUDA device) are restored afterwards, as if never touched."""
    import torch

    module = family_module(family)
    config = module.scratch_config(scratch, tokenizer)
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):  # everything seeded here is restored on exit
        torch.manual_seed(seed)
        model = module.MODEL_CLASS(config)
    return model.to(getattr(torch, dtype))


def checkpoint_fingerprint(path: str | Path) -> str:
    """Identifies a checkpoint folder's contents cheaply: our `dare.json` when present (it carries
    the producing run's config hash and time), else config.json plus each weight file's name,
    size and modification time."""
    import hashlib

    folder = Path(path)
    h = hashlib.sha256()
    if (folder / "dare.json").is_file():
        h.update((folder / "dare.json").read_bytes())
    else:
        if (folder / "config.json").is_file():
            h.update((folder / "config.json").read_bytes())
        for f in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def checkpoint_meta(path: str | Path) -> dict:
    """The `dare.json` written next to a checkpoint by our trainers ({} for foreign checkpoints)."""
    meta = Path(path) / "dare.json"
    return json.loads(meta.read_text()) if meta.is_file() else {}


def count_parameters(model_class, config) -> tuple[int, int]:
    """(total, active per token) parameters of `model_class(config)`, built on the meta device so
    nothing is allocated (an 8B or 30B config counts in about a second). Active counts only
    `num_experts_per_tok` of each layer's `num_experts` routed experts."""
    import torch

    with torch.device("meta"):
        model = model_class(config)
    total = sum(p.numel() for p in model.parameters())
    routed = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    n_experts = getattr(config, "num_experts", None)
    active = total - routed + (routed * config.num_experts_per_tok // n_experts if n_experts else 0)
    return total, active
