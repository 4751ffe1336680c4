"""d1's format-shaped rewards (`d1:diffu-grpo/reward_func.py`, summed with weight 1.0 each),
as an option next to the plain correctness rewards. Completions are expected as

    <reasoning>
    ...
    </reasoning>
    <answer>
    ...
    </answer>

GSM8K (Unsloth recipe), exactly as d1's code computes it (wd1 uses the same file):
xmlcount (+0.125 per correctly placed tag line, minus 0.001 per character after `</answer>`),
soft format (+0.5, `re.match` from the first character, without DOTALL: it never fires when the
reasoning or the answer spans lines), strict format (+0.5, the exact newline layout with one-line
reasoning and answer and the trailing newline), integer answer (+0.5 if the extracted answer
`.isdigit()`), correctness (+2.0 if it equals the ground truth as written after `####`, commas
kept). The extracted answer is the text between the last `<answer>` and the next `</answer>`,
stripped; without the tag it is the whole completion, so a bare "72" earns correctness and int.
The soft and strict layouts exclude each other, so a completion scores at most 3.5 (not the 4.0
the five weights add up to): the strict layout with one-line reasoning.
MATH (maximum 3.0): correctness (+2.0 when the last `\\boxed{}` is equivalent to the reference)
plus format 0.5 x [(1 if an `<answer>` block exists) + (1.0 if `\\boxed` is inside it (inside the
whole completion when there is none), else 0.5)]: 1.0 / 0.75 / 0.5 / 0.25 as wd1 B.2 states.

Deviations in the MATH terms, listed in the baselines that use them (d1, wd1):
1. d1's format check tests the Python string `"\\boxed"`, in which `\\b` is a backspace escape, so
   it never matches and every answer block scores 0.75 (0.25 without one); we test the literal
   `\\boxed` as the paper describes (wd1 B.2: 1.0 / 0.75 / 0.5 / 0.25).
2. d1's format term reads the FIRST `<answer>` block; we read the last (`answer_tag`).
3. Correctness: d1 compares `is_equiv` (string normalisation) of the last `\\boxed{}` (the whole
   response when there is none) with the reference; we use math-verify's `equivalent` on the last
   `\\boxed{}` (no boxed answer: 0).
"""

from __future__ import annotations

import re

from dare.rewards.math import answer_tag, equivalent, last_boxed

VERSION = 2  # 2: GSM8K terms exactly as d1 computes them (match without DOTALL, untagged answers)

# d1's patterns, applied with `re.match` and no flags (so `.` does not cross a newline)
_SOFT = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>")
_STRICT = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$")


def d1_answer(text: str) -> str:
    """d1's `extract_xml_answer`: the text between the last `<answer>` and the following
    `</answer>`, stripped (the whole text when there is no tag)."""
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


def xmlcount(text: str) -> float:
    score = 0.0
    if text.count("<reasoning>\n") == 1:
        score += 0.125
    if text.count("\n</reasoning>\n") == 1:
        score += 0.125
    if text.count("\n<answer>\n") == 1:
        score += 0.125
        score -= len(text.split("\n</answer>\n")[-1]) * 0.001
    if text.count("\n</answer>") == 1:
        score += 0.125
        score -= (len(text.split("\n</answer>")[-1]) - 1) * 0.001
    return score


def soft_format(text: str) -> float:
    return 0.5 if _SOFT.match(text) else 0.0


def strict_format(text: str) -> float:
    return 0.5 if _STRICT.match(text) else 0.0


def gsm8k_d1(completion: str, ground_truth: str) -> dict[str, float]:
    """The five d1 GSM8K terms; the reward is their sum. `ground_truth` is the text after `####`
    as d1 keeps it (commas included)."""
    answer = d1_answer(completion)
    return {"xmlcount": xmlcount(completion), "soft_format": soft_format(completion),
            "strict_format": strict_format(completion), "int": 0.5 if answer.isdigit() else 0.0,
            "correctness": 2.0 if answer == ground_truth else 0.0}


def math_d1(completion: str, ground_truth: str) -> dict[str, float]:
    """d1's MATH terms: correctness (2.0) and format (up to 1.0)."""
    boxed = last_boxed(completion)
    correct = 2.0 if boxed is not None and equivalent(boxed, ground_truth) else 0.0
    answer = answer_tag(completion)
    segment = completion if answer is None else answer
    fmt = 0.5 * ((1.0 if answer is not None else 0.0) + (1.0 if "\\boxed" in segment else 0.5))
    return {"correctness": correct, "format": fmt}


def math_b1(completion: str, ground_truth: str) -> dict[str, float]:
    """Block-R1's b1 MATH terms (YanJiangJerry/Block-R1@fd7a1b8, rl/reward_func.py `correctness_reward_func_math` +
    `boxed_and_answer_tags_format_reward`): as d1's, except that b1's correctness reads the answer block (its prompt
    asks for "FINAL ANSWER ONLY" there): 2.0 when the text between the last `<answer>` and the next `</answer>`
    (`d1_answer`: the whole completion without one) is equivalent to the reference. The format term and the
    deviations are d1's (`math_d1`, above: math-verify for `is_equiv`, so a `\\boxed{}` inside the block counts
    where the reference's string comparison keeps the `\\boxed` and fails; the literal `\\boxed`; the last block)."""
    correct = 2.0 if equivalent(d1_answer(completion), ground_truth) else 0.0
    return {"correctness": correct, "format": math_d1(completion, ground_truth)["format"]}
