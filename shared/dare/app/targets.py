"""A reproduction's paper numbers: `reproductions/<name>/targets.yaml`, the one place they are kept.

    paper: {arxiv: "2504.12216", table: "d1 Table 1 (+ diffu-GRPO)"}
    base_model: LLaDA-8B-Instruct
    eval: {split: test, block_length: 32, steps_per_token: 0.5, temperature: 0.0, n_shot: 0}  # the paper's protocol
                                  # (temperature may list the values a best-of report chose from; an optional
                                  # `decoding: {schedule: ass, ...}` names other decoding settings it fixes,
                                  # by the flat names of a result's decoding record: `dare.decoding.FLAT`)
    tolerance: 2.0                # points
    targets:
      - {config: gsm8k.yaml, benchmark: gsm8k, gen_length: 256, value: 79.8}   # percent, as printed

Values are in percent, as the papers print them; `result.reference.value` is a fraction like every
metric in a result. A result matches a target by the training config it was made from, the
benchmark and the generation length; `same_decoding` says whether it was evaluated with the
paper's protocol (split, block length, steps = gen_length x steps_per_token, temperature, shots, and
the decoding fields `eval.decoding` lists).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from dare.decoding import FLAT
from dare.utils import UserError, load_yaml, shown_value

KEYS = {"paper", "base_model", "eval", "tolerance", "targets"}
EVAL_KEYS = {"split", "block_length", "steps_per_token", "temperature", "n_shot", "decoding"}
TARGET_KEYS = {"config", "benchmark", "gen_length", "value"}


@dataclass(frozen=True)
class Targets:
    path: Path
    paper: dict
    base_model: str
    protocol: dict
    tolerance: float
    rows: list[dict]

    def find(self, config: str | Path | None, benchmark: str, gen_length: int) -> dict | None:
        name = Path(config).name if config else None
        for row in self.rows:
            if row["benchmark"] == benchmark and row["gen_length"] == gen_length and (
                    name is None or row["config"] == name):
                return row
        return None

    def source(self) -> str:
        return f"{self.paper['table']} (arXiv {self.paper['arxiv']})"

    def same_protocol(self, benchmark: dict, decoding: dict) -> bool:
        p = self.protocol
        steps = round(decoding["gen_length"] * p["steps_per_token"])
        temperatures = p["temperature"] if isinstance(p["temperature"], list) else [p["temperature"]]  # best of
        return (benchmark.get("split") == p["split"] and decoding.get("block_length") == p["block_length"]
                and decoding.get("steps") == steps and float(decoding.get("temperature") or 0.0) in temperatures
                and benchmark.get("n_shot", 0) == p.get("n_shot", 0)
                and all(decoding.get(k) == v for k, v in (p.get("decoding") or {}).items()))

    def reference(self, config: str | Path | None, benchmark: dict, decoding: dict) -> dict | None:
        """The result's `reference` section for this evaluation, or None when no target matches."""
        row = self.find(config, benchmark["name"], decoding["gen_length"])
        if row is None:
            return None
        return {"value": row["value"] / 100, "source": self.source(),
                "same_decoding": self.same_protocol(benchmark, decoding)}


def load_targets(path: str | Path) -> Targets:
    """Parse and check a targets.yaml; the error names the file and the entry."""
    path = Path(path)
    try:
        data = load_yaml(path.read_text(), str(path)) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"{path}: cannot read targets ({e})") from None
    missing = KEYS - set(data)
    if missing:
        raise UserError(f"{path}: missing {sorted(missing)}")
    if not {"arxiv", "table"} <= set(data["paper"] or {}):
        raise UserError(f"{path}: paper needs arxiv and table")
    if not EVAL_KEYS - {"n_shot", "decoding"} <= set(data["eval"] or {}):
        raise UserError(f"{path}: eval needs {sorted(EVAL_KEYS - {'n_shot', 'decoding'})} (the paper's protocol)")
    fields = set(FLAT)  # a result's decoding record names every setting flat (`threshold`, not `masked.threshold`)
    unknown = set((data["eval"].get("decoding") or {})) - fields
    if unknown:
        raise UserError(f"{path}: eval.decoding: unknown decoding fields {sorted(unknown)}")
    for i, row in enumerate(data["targets"] or []):
        if not isinstance(row, dict) or set(row) != TARGET_KEYS:
            raise UserError(f"{path}: targets[{i}]: needs exactly {sorted(TARGET_KEYS)}; got {shown_value(row)}")
        if not isinstance(row["value"], (int, float)) or not 0 <= row["value"] <= 100:
            raise UserError(f"{path}: targets[{i}].value={shown_value(row['value'])}: a percentage in [0, 100]")
        if not (path.parent / row["config"]).is_file():
            raise UserError(f"{path}: targets[{i}].config={shown_value(row['config'])}: no such file beside it")
    return Targets(path, data["paper"], data["base_model"], data["eval"], float(data["tolerance"]),
                   list(data["targets"] or []))


def beside(sweep_or_config: str | Path) -> Targets | None:
    """The targets.yaml in the same reproduction folder, if there is one."""
    path = Path(sweep_or_config).parent / "targets.yaml"
    return load_targets(path) if path.is_file() else None
