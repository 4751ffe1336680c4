"""OpenCompass model class for every family: `DiffusionLM` plugs our model adapters and rollout
engine into the released OpenCompass (imported in the eval environment only).

One class serves LLaDA, Dream, SDAR and LLaDA2.x: the family comes from the checkpoint's config
(`dare.models.load_pretrained`), mask id, logit shift and block size from the model's facts, and
the sampler from the decoding settings (`dare.config.DecodingConfig`, "auto" picks the block
sampler for block-causal models).

    generate(inputs, max_out_len)  chat messages -> the tokenizer's chat template -> batches of
                                   mixed prompt lengths (sorted by length, left-padded, returned in
                                   the input order) -> `dare.rollout.generate`. A diffusion model
                                   decodes a fixed canvas, so `gen_length` (not `max_out_len`)
                                   sets the response length, as in DARE's model classes.
    get_ppl(inputs, mask_length)   mean negative log-likelihood per scored token, from the Monte
                                   Carlo ELBO (`dare.train.estimators.sequence_elbo`).
                                   Scored tokens: after `mask_length[i]` tokens when OpenCompass
                                   gives it, else the whole text (OpenCompass hands likelihood
                                   prompts over as plain text, no chat template).
                                   Multiple-choice datasets can so be scored by likelihood.
    get_token_len(prompt)          tokens of a plain-text prompt, or of a role list through the
                                   chat template.

Every call is deterministic (generators seeded from `seed`, the inputs and the call count), and the
rollout statistics (samples, NFE, tokens, time) accumulate into `stats_path` for the result JSON.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch
from opencompass.models.base import BaseModel, LMTemplateParser
from opencompass.models.base_api import APITemplateParser
from opencompass.registry import MODELS

from dare.config import DecodingConfig, load
from dare.models import facts, load_pretrained, load_tokenizer
from dare.utils import atomic_write, make_generator

ROLES = {"HUMAN": "user", "BOT": "assistant", "SYSTEM": "system"}
# HUMAN/BOT/SYSTEM prompts are kept as separate chat turns for the tokenizer's chat template
DEFAULT_META_TEMPLATE = dict(round=[dict(role="HUMAN", api_role="HUMAN"), dict(role="SYSTEM", api_role="SYSTEM"),
                                    dict(role="BOT", api_role="BOT", generate=True)])


def to_messages(prompt) -> list[dict]:
    """An OpenCompass prompt (a string or a list of {role, prompt}) as chat messages; consecutive
    turns of one role are merged, empty ones dropped."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    messages = []
    for item in prompt:
        if not item.get("prompt"):
            continue
        role = ROLES[item["role"]]
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += "\n" + item["prompt"]
        else:
            messages.append({"role": role, "content": item["prompt"]})
    return messages


@MODELS.register_module()
class DiffusionLM(BaseModel):
    """A dLLM checkpoint folder of any family (see the module docstring)."""

    def __init__(self, path: str, decoding: dict | None = None, micro_batch_size: int = 0, dtype: str = "float32",
                 ppl_samples: int = 32, seed: int = 0, stats_path: str | None = None, threads: int = 0,
                 max_seq_len: int = 8192, meta_template: dict | None = None, tokenizer_only: bool = False,
                 generation_kwargs: dict | None = None, **unused):
        super().__init__(path=path, max_seq_len=max_seq_len, tokenizer_only=tokenizer_only,
                         meta_template=meta_template, generation_kwargs=generation_kwargs or {})
        self.template_parser = APITemplateParser(meta_template or DEFAULT_META_TEMPLATE)
        self.text_parser = LMTemplateParser(None)  # likelihood prompts: plain text, as OpenCompass expects
        self.decoding = load(DecodingConfig, data=decoding or {})
        self.micro_batch_size, self.ppl_samples, self.seed = micro_batch_size, ppl_samples, seed
        self.stats_path = Path(stats_path) if stats_path else None
        self.calls = 0
        self.stats = {"samples": 0, "nfe": 0, "response_tokens": 0, "positions": 0, "seconds": 0.0}
        if threads:
            torch.set_num_threads(threads)
        self.tokenizer = load_tokenizer(path)
        self.model = None if tokenizer_only else load_pretrained(path, dtype).eval()
        if self.model is not None and torch.cuda.is_available():
            self.model = self.model.cuda()
        if self.model is not None:
            from dare.rollout import sampler_name

            self.stats["sampler"] = sampler_name(self.model, self.decoding)

    # -- prompts ---------------------------------------------------------------------------------

    def parse_template(self, prompt_template, mode: str):
        """Generation keeps the roles (for the chat template); likelihood ("ppl") gets plain text, which
        OpenCompass' PPL inferencer measures in bytes (its BPB)."""
        if mode == "ppl":
            return self.text_parser.parse_template(prompt_template, mode)
        return self.template_parser.parse_template(prompt_template, mode)

    def _encode(self, messages: list[dict], generation_prompt: bool = True) -> list[int]:
        if self.tokenizer.chat_template:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        else:  # a base model without a chat template: the plain text
            text = "\n".join(m["content"] for m in messages)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def get_token_len(self, prompt) -> int:
        """Plain text (likelihood prompts) as is; role lists through the chat template."""
        if isinstance(prompt, str):
            return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        return len(self._encode(to_messages(prompt)))

    def _generator(self, kind: str, inputs) -> torch.Generator:
        """Seeded by the inputs and this instance's call count: a run is reproducible, and the
        repeats of a repeated dataset (identical batches) still draw different samples."""
        self.calls += 1
        key = hashlib.sha256(repr(inputs).encode()).hexdigest()
        return make_generator(self.seed, f"opencompass:{kind}:{self.calls}:{key}")

    # -- generation ------------------------------------------------------------------------------

    def generate(self, inputs, max_out_len: int = 0, **kwargs) -> list[str]:
        from dare.rollout import decode_responses, generate, left_pad

        f = facts(self.model)
        prompts = [self._encode(to_messages(p)) for p in inputs]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
        outputs: list[str] = [""] * len(prompts)
        generator = self._generator("generate", inputs)
        device = next(self.model.parameters()).device
        t0 = time.perf_counter()
        with torch.no_grad():
            step = self.micro_batch_size or len(order)  # 0: OpenCompass' batch (its `batch_size`) at once
            for start in range(0, len(order), step):
                idx = order[start:start + step]
                ids, mask = left_pad([prompts[i] for i in idx], f.pad_token_id)
                out = generate(self.model, ids.to(device), mask.to(device), self.decoding, generator)
                for i, text in zip(idx, decode_responses(self.tokenizer, out.responses, f.stop_ids)):
                    outputs[i] = text
                self.stats["nfe"] += out.nfe * len(idx)
                self.stats["response_tokens"] += int(out.response_mask.sum())
                self.stats["positions"] += out.responses.numel()
        self.stats["samples"] += len(prompts)
        self.stats["seconds"] += time.perf_counter() - t0
        self._save_stats()
        return outputs

    def _save_stats(self):
        if self.stats_path is not None:
            atomic_write(self.stats_path, json.dumps(self.stats))

    # -- likelihood ------------------------------------------------------------------------------

    def get_ppl(self, inputs, mask_length: list[int] | None = None):
        """(len(inputs),) numpy array, as OpenCompass' inferencer expects."""
        import numpy as np

        from dare.train.estimators import sequence_elbo

        device = next(self.model.parameters()).device
        out = []
        with torch.no_grad():
            for i, prompt in enumerate(inputs):
                # plain text (`parse_template` in "ppl" mode); the first mask_length tokens are context
                ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
                start = 0 if mask_length is None else int(mask_length[i])
                ids_t = torch.tensor(ids, device=device)
                n_scored = len(ids) - start
                if n_scored <= 0:
                    raise ValueError(f"get_ppl: nothing to score in input {i} ({len(ids)} tokens, mask_length {start})")
                # one stream per text: its score does not depend on the batch it arrived in
                generator = make_generator(self.seed, f"opencompass:ppl:{hashlib.sha256(prompt.encode()).hexdigest()}")
                out.append(-sequence_elbo(self.model, ids_t, start, self.ppl_samples, generator) / n_scored)
        return np.array(out)
