"""What every task provides (see `dare.data` for the registry and the parquet schema)."""

from __future__ import annotations

from pathlib import Path

from dare.data.sources import find_file, hub_file, read_records
from dare.data.schema import DataError

# d1's answer format instruction (d1:diffu-grpo/data_utils.py SYSTEM_PROMPT), shared by the
# reasoning tasks' prompts.
REASONING_FORMAT = "\nRespond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n"


class Task:
    """A task: how to get its rows, its prompt, its reference answer and its reward/metric.

    Subclasses set `name`, `splits`, `version` and either `offline = True` with `generate(split)`,
    or `files` (original file names per split, for `--from`) / `hub` ((repo, file glob) per split)
    with `convert(record, split)`. Rows are dicts {prompt, ground_truth, extra}.
    """

    name: str
    splits: tuple[str, ...]
    version: str
    offline = False
    files: dict[str, list[str]] = {}
    hub: dict[str, tuple[str, str]] = {}
    reward_styles: tuple[str, ...] = ("default",)
    alphabet = ""  # characters a from-scratch character tokenizer needs (synthetic tasks only)

    def build(self, split: str, source: Path | None = None) -> list[dict]:
        if split not in self.splits:
            raise DataError(f"{self.name} has splits {self.splits}, not {split!r}")
        if self.offline and source is None:
            return self.generate(split)
        path, records = self.records(split, source)
        rows = []
        for i, record in enumerate(records):
            try:
                row = self.convert(record, split)
            except KeyError as e:
                raise DataError(f"{path}: record {i}: missing field {e}") from None
            except (TypeError, ValueError, AttributeError) as e:
                raise DataError(f"{path}: record {i}: {type(e).__name__}: {e}") from None
            if row is not None:
                rows.append(row)
        if not rows:
            raise DataError(f"{path}: no usable {self.name}/{split} records")
        return rows

    def records(self, split: str, source: Path | None) -> tuple[Path, list[dict]]:
        if source is not None:
            path = find_file(Path(source), self.files.get(split, []), self.name, split)
        elif split in self.hub:
            repo, pattern = self.hub[split]
            path = hub_file(repo, pattern, self.name)
        else:
            raise DataError(f"{self.name}/{split}: no download source; run "
                            f"`dare data build {self.name} --from <folder>`")
        return path, read_records(path)

    def generate(self, split: str) -> list[dict]:
        raise NotImplementedError

    def convert(self, record: dict, split: str) -> dict | None:
        raise NotImplementedError

    # --- training and evaluation -----------------------------------------------------------------

    def target(self, row: dict) -> str:
        """The supervised response for SFT."""
        return row["ground_truth"]

    def reward(self, completion: str, row: dict, style: str = "default") -> float:
        raise NotImplementedError(f"{self.name} has no scalar reward")

    def rewards(self, completions: list[str], rows: list[dict], style: str = "default") -> list[float]:
        """Batched rewards (code tasks run their sandboxes in parallel here)."""
        self.check_style(style)
        return [self.reward(c, r, style) for c, r in zip(completions, rows)]

    def score(self, completion: str, row: dict) -> dict[str, float]:
        """Evaluation metrics of one sample (values summed over samples by the evaluator)."""
        return {"accuracy": self.reward(completion, row)}

    def scores(self, completions: list[str], rows: list[dict]) -> list[dict[str, float]]:
        return [self.score(c, r) for c, r in zip(completions, rows)]

    def check_style(self, style: str) -> None:
        if style not in self.reward_styles:
            raise DataError(f"{self.name}: unknown reward style {style!r}; choose from {self.reward_styles}")
