"""GSM8K, MATH and MATH500 with d1's prompts (d1:diffu-grpo/data_utils.py) and answers.

Sources (`--from <folder>` with the original files, or the hub when reachable):
- gsm8k: `train.jsonl` / `test.jsonl` of openai/gsm8k (`{"question", "answer": "... #### 42"}`),
  or the hub's parquet files.
- math: MATH (hendrycks) `train.jsonl` / `test.jsonl` (`{"problem", "solution", "level", "type"}`;
  the answer is the solution's last `\\boxed{}`); the hub's `ankner/math-500` train split is what
  d1 trains on.
- math500: `test.jsonl` of HuggingFaceH4/MATH-500 (`{"problem", "solution", "answer", ...}`).
"""

from __future__ import annotations

from dare.data.base import REASONING_FORMAT, Task
from dare.rewards import formats
from dare.rewards import math as mathr
from dare.rewards import think

MATH_INSTRUCTION = ("You are a math expert. You will be given a question to solve. Solve it step by step. "
                    "Wrap the final answer in a \\boxed{}. ")


class GSM8K(Task):
    name = "gsm8k"
    splits = ("train", "test")
    version = f"p2.r{mathr.VERSION}.f{formats.VERSION}.s2"  # s2: accuracy as OpenCompass; p2: extra.answer
    files = {"train": ["train.jsonl", "gsm8k_train.jsonl", "train-00000-of-00001.parquet"],
             "test": ["test.jsonl", "gsm8k_test.jsonl", "test-00000-of-00001.parquet"]}
    hub = {"train": ("openai/gsm8k", "main/train-*.parquet"), "test": ("openai/gsm8k", "main/test-*.parquet")}
    reward_styles = ("default", "d1_format")

    def convert(self, record: dict, split: str) -> dict:
        question, answer = record["question"], record["answer"]
        reasoning, _, final = answer.rpartition("####")
        # ground_truth: the number without thousands commas (what the numeric rewards and OpenCompass
        # compare); extra.answer: the text after "####" as d1 keeps it (its exact-match correctness)
        return {"prompt": [{"role": "user", "content": REASONING_FORMAT + "\n\n" + question}],
                "ground_truth": final.strip().replace(",", ""),
                "extra": {"solution": reasoning.strip(), "answer": final.strip()}}

    def target(self, row: dict) -> str:
        # d1's layout, trailing newline included (its xmlcount term expects it)
        return (f"<reasoning>\n{row['extra']['solution']}\n</reasoning>\n<answer>\n{row['ground_truth']}\n"
                "</answer>\n")

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        if style == "d1_format":  # d1's five additive terms (at most 3.5), against d1's ground truth
            return sum(formats.gsm8k_d1(completion, row["extra"].get("answer", row["ground_truth"])).values())
        return mathr.gsm8k_reward(completion, row["ground_truth"])

    def score(self, completion: str, row: dict) -> dict[str, float]:
        """accuracy: OpenCompass' rule (the same number as `--engine opencompass` on the same
        completions); accuracy_answer: d1's parser (boxed, then <answer>, then the last number)."""
        return {"accuracy": mathr.gsm8k_opencompass(completion, row["ground_truth"]),
                "accuracy_answer": mathr.gsm8k_reward(completion, row["ground_truth"])}


# AGRPO's system prompt for math (probablyabot/agrpo @98f1182, data.py SYSTEM_PROMPT), word for word.
THINK_FORMAT = r"""You will be given a math problem.
Think through the problem step by step, enclosing your reasoning process in <think> tags.
Provide your final answer in <answer> tags, with only the number or expression enclosed in \boxed{}, as follows:
<think>
...
</think>
<answer>
\boxed{...}
</answer>
"""


class GSM8KThink(GSM8K):
    """GSM8K as AGRPO trains and evaluates it (`data.py` gsm_train / gsm_test): its system prompt, the
    question as the user turn, the reference answer as written after "####", and its reward
    (`dare.rewards.think`: 0.5 + 0.5 for the tags, 3.0 for math-verify correctness). Accuracy is its
    eval.py's grade, which reads only the answer's first run of digits (`think.gsm8k_graded`)."""

    name = "gsm8k_think"
    version = f"p1.t{think.VERSION}"
    reward_styles = ("default",)

    def convert(self, record: dict, split: str) -> dict:
        row = super().convert(record, split)
        row["prompt"] = [{"role": "system", "content": THINK_FORMAT}, {"role": "user", "content": record["question"]}]
        return row

    def target(self, row: dict) -> str:
        return (f"<think>\n{row['extra']['solution']}\n</think>\n<answer>\n\\boxed{{{row['extra']['answer']}}}\n"
                "</answer>")

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        return sum(think.terms(completion, row["extra"]["answer"]).values())

    def score(self, completion: str, row: dict) -> dict[str, float]:
        return {"accuracy": float(think.gsm8k_graded(completion, row["extra"]["answer"]))}


# Block-R1's b1 prompt for GSM8K and MATH (YanJiangJerry/Block-R1@fd7a1b8, rl/data_utils.py, SYSTEM_PROMPT under a
# "b1" trainer type), word for word: every reasoning step ends with the tag \block, the marker b1's dynamic blocks
# end a block after (`decoding.block.dynamic_marker`).
B1_FORMAT = r"""You are a math expert. You will be given a question to solve. You should provide clear, logical reasoning step by step. Append the tag \block directly to the end of the last sentence of each reasoning step without starting a new line. Respond exactly in the following format:
<reasoning>
Step 1, ... \block
Step 2, ... \block
...
Step n, ... \block
</reasoning>
<answer>
FINAL ANSWER ONLY
</answer>
"""  # noqa: E501


class GSM8KB1(GSM8K):
    """GSM8K as Block-R1 trains b1 on it (`get_gsm8k_questions` under a b1 trainer type): b1's prompt, then the
    question after one newline, as the user turn; the answers, rewards and metrics are GSM8K's."""

    name = "gsm8k_b1"
    version = f"{GSM8K.version}.b1"

    def convert(self, record: dict, split: str) -> dict:
        row = super().convert(record, split)
        row["prompt"] = [{"role": "user", "content": f"{B1_FORMAT}\n{record['question']}"}]
        return row

    def target(self, row: dict) -> str:
        """b1's layout: each line of the solution a step ending in `\\block`."""
        steps = "\n".join(f"{line} \\block" for line in row["extra"]["solution"].splitlines() if line.strip())
        return f"<reasoning>\n{steps}\n</reasoning>\n<answer>\n{row['ground_truth']}\n</answer>\n"


class MATH(Task):
    name = "math"
    splits = ("train", "test")
    version = f"p1.r{mathr.VERSION}.f{formats.VERSION}"
    files = {"train": ["train.jsonl", "math_train.jsonl"], "test": ["test.jsonl", "math_test.jsonl"]}
    hub = {"train": ("ankner/math-500", "*train*.parquet"), "test": ("ankner/math-500", "*test*.parquet")}
    reward_styles = ("default", "d1_format")

    def convert(self, record: dict, split: str) -> dict | None:
        answer = record.get("answer") or mathr.last_boxed(record["solution"])
        if answer is None:
            return None  # a solution without a boxed answer cannot be scored
        extra = {k: record[k] for k in ("solution", "level", "type", "subject", "unique_id") if k in record}
        return {"prompt": [{"role": "user", "content": f"{REASONING_FORMAT}\n\n{MATH_INSTRUCTION}\n\n"
                                                       f"{record['problem']}"}],
                "ground_truth": answer, "extra": extra}

    def target(self, row: dict) -> str:
        solution = row["extra"].get("solution", "")
        return f"<reasoning>\n{solution}\n</reasoning>\n<answer>\n\\boxed{{{row['ground_truth']}}}\n</answer>\n"

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        if style == "d1_format":
            return sum(formats.math_d1(completion, row["ground_truth"]).values())
        return mathr.math_reward(completion, row["ground_truth"])



class MATHB1(MATH):
    """MATH as Block-R1 trains b1 on it (`get_math_questions` under a b1 trainer type: `ankner/math-500`'s train
    split): b1's prompt (GSM8K's, `B1_FORMAT`), then the problem after one newline, as the user turn. Reward style
    `b1`: the reference's two terms (`formats.math_b1`: correctness on the answer block, d1's format term); the
    other styles and the answers are MATH's. Metric `accuracy`: the last `\\boxed{}`, else the last answer block,
    equivalent to the reference (the reference's rl/eval/parse_and_get_acc.py `parse_math_answers` order)."""

    name = "math_b1"
    version = f"{MATH.version}.b1"
    reward_styles = ("default", "d1_format", "b1")

    def convert(self, record: dict, split: str) -> dict | None:
        row = super().convert(record, split)
        if row is not None:
            row["prompt"] = [{"role": "user", "content": f"{B1_FORMAT}\n{record['problem']}"}]
        return row

    def target(self, row: dict) -> str:
        """b1's layout: each line of the solution a step ending in `\\block`, the final answer alone."""
        solution = row["extra"].get("solution", "")
        steps = "\n".join(f"{line} \\block" for line in solution.splitlines() if line.strip())
        return f"<reasoning>\n{steps}\n</reasoning>\n<answer>\n{row['ground_truth']}\n</answer>\n"

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        if style == "b1":
            return sum(formats.math_b1(completion, row["ground_truth"]).values())
        return super().reward(completion, row, style)

    def score(self, completion: str, row: dict) -> dict[str, float]:
        answer = mathr.last_boxed(completion) or mathr.answer_tag(completion)
        return {"accuracy": float(answer is not None and mathr.equivalent(answer, row["ground_truth"]))}

class MATH500(MATH):
    name = "math500"
    splits = ("test",)
    files = {"test": ["test.jsonl", "math500.jsonl", "MATH-500.jsonl"]}
    hub = {"test": ("HuggingFaceH4/MATH-500", "test.jsonl")}


class S1K(Task):
    """s1K (simplescaling/s1K): 1,000 questions with reasoning traces, d1's SFT data. The target is
    d1's layout `<reasoning>{thinking_trajectories[0]}</reasoning>\\n<answer>{attempt}</answer>`
    (`d1:SFT/sft_train.py`). SFT only: it has no held-out split and no scorer."""

    name = "s1k"
    splits = ("train",)
    version = "p1"
    files = {"train": ["s1K.jsonl", "train.jsonl", "train-00000-of-00001.parquet"]}
    hub = {"train": ("simplescaling/s1K", "data/train-*.parquet")}

    def convert(self, record: dict, split: str) -> dict | None:
        traces = record.get("thinking_trajectories") or []
        if not record.get("question") or not traces or not record.get("attempt"):
            return None
        trace = traces[0] if isinstance(traces, (list, tuple)) else str(traces)
        return {"prompt": [{"role": "user", "content": record["question"]}], "ground_truth": record["attempt"],
                "extra": {"reasoning": trace}}

    def target(self, row: dict) -> str:
        return f"<reasoning>{row['extra']['reasoning']}</reasoning>\n<answer>{row['ground_truth']}</answer>"

    def score(self, completion: str, row: dict) -> dict[str, float]:
        raise NotImplementedError("s1k is SFT data; evaluate the fine-tuned model on gsm8k, math500, ...")
