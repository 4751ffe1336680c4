"""Run configuration: dataclass defaults -> YAML file -> `key=value` overrides.

A config is a tree of plain dataclasses. `load(Config, "run.yaml", ["train.lr=3e-6"])` starts
from the defaults, merges the YAML file, applies the dotted overrides, checks every value against
its annotated type and then runs each section's `validate()` for cross-field rules. Every problem
(unknown key, wrong type, inconsistent values) is collected, then one `ConfigError` lists them all,
one per line, each naming the dotted key and where its value came from, before any model is built.
Configs hold data, never programs: no dotted class paths, no composition; components are chosen
in code.

`config_hash(cfg)` is the sha256 of the canonical JSON of every field that can change a result
(fields marked `NOHASH`, such as output paths and log intervals, are left out). Run directories
and stage reuse are keyed by it. `save(cfg, run_dir)` writes the resolved `config.yaml`.

The sections shared by every baseline live here so that configs load and validate without
importing torch.
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import difflib
import hashlib
import json
import math
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml

from dare import decoding as decoding_options
from dare.decoding import BlockOptions, DreamOptions, MaskedOptions, MaskgitOptions, TruncatedOptions
from dare.utils import UserError, YAMLAliasError, load_yaml, shown_value
from dare.data import TASKS
from dare.models import ATTENTION
from dare.models.registry import FAMILIES
from dare.utils import atomic_write

NOHASH = {"hash": False}  # field metadata: the value does not change results (paths, logging)
ADDED = {"hash": "unless_default"}
"""Field metadata for an option added after results were published: it enters the hash only when set
to something other than its default, so every earlier config keeps its hash (and its run folder)."""


class ConfigError(UserError, ValueError):
    """A config problem, reported before any compute starts."""

    @classmethod
    def of(cls, problems: list[str]) -> ConfigError:
        """One error for every problem: a single one as it is, several as a count and then one per line."""
        if len(problems) == 1:
            return cls(problems[0])
        return cls(f"{len(problems)} config problems:\n" + "\n".join(f"  {p}" for p in problems))


class Invalid(Exception):
    """Raised by a section's `validate()`; `keys` are field names relative to that section."""

    def __init__(self, message: str, *keys: str):
        super().__init__(message)
        self.message, self.keys = message, keys


_failed: contextvars.ContextVar[list | None] = contextvars.ContextVar("_failed", default=None)
"""While `load` runs a section's `validate()`: the failed checks so far (so all of them are reported)."""
_model_family: contextvars.ContextVar[str | None] = contextvars.ContextVar("_model_family", default=None)
"""While `load` validates a config with a valid `model.family`: that family (sampler=auto's choice follows it)."""


def check(condition: bool, message: str, *keys: str) -> None:
    """A rule of a section's `validate()`: raise `Invalid`, or record it while `load` collects failures."""
    if condition:
        return
    failed = _failed.get()
    if failed is None:
        raise Invalid(message, *keys)
    failed.append(Invalid(message, *keys))


# ---------------------------------------------------------------------------------------------
# Shared sections
# ---------------------------------------------------------------------------------------------


@dataclass
class RunConfig:
    seed: int = 0
    """Seeds every torch.Generator of the run (data order, rollout noise, mask noise, init)."""
    out_dir: str | None = field(default=None, metadata=NOHASH)
    """Run directory; default `runs/<baseline>/<config hash[:12]>`, so reruns reuse finished work."""
    log_every: int = field(default=10, metadata=NOHASH)
    save_every: int = field(default=0, metadata=NOHASH)
    """Checkpoint interval in the recipe's steps (`train.steps`): optimizer steps for SFT and
    preference, rollout batches for RL (each `rl.num_iterations` optimizer steps). 0: only the final."""
    keep_checkpoints: int = field(default=2, metadata=NOHASH)
    """Periodic checkpoints kept in `checkpoints/`, the latest N (0: all; with 2 a damaged latest one falls
    back to the one before). Each holds the sharded weights and optimizer state (`dare eval` exports it),
    the data state that resume needs, and its files' sha256."""
    threads: int = field(default=0, metadata=NOHASH)
    """torch intra-op threads on CPU (0: torch's default, one per core)."""
    report_to: list[str] = field(default_factory=list, metadata=NOHASH)
    """Extra metric sinks besides metrics.jsonl: "wandb", "tensorboard" (their packages must be installed)."""

    def validate(self):
        check(self.log_every > 0, "must be positive", "log_every")
        check(self.save_every >= 0, "must be >= 0", "save_every")
        check(self.keep_checkpoints >= 0, "must be >= 0 (0: keep all)", "keep_checkpoints")
        unknown = sorted(set(self.report_to) - {"wandb", "tensorboard"})
        check(not unknown, f"unknown metric sink(s) {unknown}; known: wandb, tensorboard", "report_to")


@dataclass
class ScratchModelConfig:
    """Size of a model initialised from scratch (used only when `model.path` is empty)."""

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_hidden_size: int = 512
    max_sequence_length: int = 64
    rope_theta: float = 10000.0

    def validate(self):
        check(self.d_model % self.n_heads == 0, "d_model must be a multiple of n_heads", "d_model", "n_heads")
        check((self.d_model // self.n_heads) % 2 == 0, "head dim (d_model / n_heads) must be even for RoPE",
              "d_model", "n_heads")


@dataclass
class LoraConfig:
    """LoRA through peft; rank 0 trains every parameter."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    """Dropout on the adapter's input (draws from torch's global RNG, whose state checkpoints keep)."""
    targets: str | None = None
    """peft `target_modules` (a regex or name); None: the family's declared targets (`dare models show`),
    which never include the output head, routers or routed experts."""

    def validate(self):
        check(self.rank >= 0, "must be >= 0 (0: no LoRA)", "rank")
        check(self.alpha > 0, "must be positive", "alpha")
        check(0 <= self.dropout < 1, "must be within [0, 1)", "dropout")


@dataclass
class ModelConfig:
    path: str | None = field(default=None, metadata=NOHASH)
    """A checkpoint folder loaded with `from_pretrained`; empty: initialise `family` from `scratch`.
    Not part of the config hash: the run key identifies the starting checkpoint by its contents
    (`dare.train.fit.run_key`), so a path on one machine and another hash the same."""
    family: str = "llada"
    """Model family (see `dare models`); must match the checkpoint's `model_type` when `path` is set."""
    name: str | None = field(default=None, metadata=NOHASH)
    """Display name in results; default: the checkpoint's recorded name or the folder name."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute precision. bfloat16 is mixed precision: float32 master weights and optimizer state,
    bfloat16 forward/backward, gradients reduced in float32; under LoRA the frozen base is stored in bfloat16
    and only the adapters and their optimizer state are float32."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    scratch: ScratchModelConfig = field(default_factory=ScratchModelConfig)

    def validate(self):
        check(self.family in FAMILIES, f"unknown family {self.family!r}{did_you_mean(self.family, FAMILIES)}; "
              f"known: {sorted(FAMILIES)}", "family")


@dataclass
class DataConfig:
    task: str = "addition"
    """Task name from `dare data list`; its parquet is built on demand under `data/`."""
    split: str = "train"
    reward: str = "default"
    """Reward style of the task: "default" (correctness), "d1_format" for the format-shaped rewards of d1
    (gsm8k, math), or "b1" for Block-R1's b1 MATH terms (math_b1)."""
    unpaired: bool = field(default=False, metadata=ADDED)
    """Preference recipe: each (prompt, chosen, rejected) row of the task becomes two unpaired examples, the chosen
    response labelled desirable and the rejected one undesirable (KTO's unpaired data, as trl-lib/kto-mix-14k is
    built from pairs), shuffled apart: batches of single responses with `labels` (ELBO-KTO)."""

    def validate(self):
        check(self.task in TASKS, f"unknown task {self.task!r}{did_you_mean(self.task, TASKS)}; known: {sorted(TASKS)}",
              "task")
        check(self.split in TASKS[self.task].splits, f"task {self.task!r} has splits {TASKS[self.task].splits}",
              "split")
        styles = TASKS[self.task].reward_styles
        check(self.reward in styles, f"task {self.task!r} has reward styles {styles}", "reward")


@dataclass
class DecodingConfig:
    """How the sampler decodes (`dare.rollout`): `rl.decoding` for RL rollouts, `eval.decoding` for
    evaluation, the `decoding` argument of `dare.rollout.generate`; defaults = d1's protocol on LLaDA.

    The fields here are the settings every sampler reads and the rollout's shape the RL loop sets
    (`record`, `tree`, `whole_last_block`); each sampler's options are its own section, named
    after it (`masked`, `block`, `dream`, `maskgit`, `truncated`: `rl.decoding.masked.threshold=0.9`), defined
    and checked by its module in `dare.decoding`. A sampler reads only its own section: the loader rejects an
    option set for a sampler that does not run. The config hash covers the flat form of the section (every
    setting by its name before the options had sections, `dare.decoding.flat`), so runs keep their hash."""

    sampler: Literal["auto", "masked", "dream", "block", "maskgit", "truncated"] = "auto"
    """masked: LLaDA's semi-autoregressive sampler with Fast-dLLM's caches and parallel decoding;
    dream: Dream's `diffusion_generate` algorithms; block: SDAR/LLaDA2 block diffusion; maskgit: MDPO's
    sampler (MaskGIT schedule, top-p/top-k confidences, optional running-confidence remasking `rcr`);
    truncated: AGRPO's (gen_length / steps tokens per step, top-k/top-p truncation, the drawn log-probs,
    entropies and supports recorded). auto: from the model's facts, block-causal models get the block
    sampler, others the masked one."""
    gen_length: int = 256
    block_length: int = 32
    """Semi-AR block (masked, maskgit and truncated samplers). The block sampler uses the model's own block
    size; Dream's sampler has none."""
    steps: int = 128
    """Masked, maskgit, truncated, Dream: total steps over all blocks. Block: denoising steps per block."""
    temperature: float = 0.0
    record: tuple[Literal["states", "predictions", "supports", "entropies", "greedy"], ...] = ()
    """What the rollout keeps besides its tokens, step map and log-probs (the RL loop sets it from the algorithm's
    `rollout_options`): states, the response after every step (`trajectory`; MDPO, AGRPO); predictions, the
    maskgit sampler's x0-hat and confidences at every step (MDPO); supports, the truncated sampler's top-k/top-p
    support of each token (AGRPO); entropies, the masked sampler's entropy of the model's distribution each token
    was committed from (the truncated sampler records its own always); greedy, the masked sampler's argmax
    completion of the canvas before every step (EGSPO; no cache). The flat form (`dare.decoding.flat`) keeps one
    flag, `record_trajectory`."""
    tree: tuple[int, ...] = ()
    """Tree rollouts (masked sampler, d-TreeRPO): the branching width of each level, e.g. (4, 4). The
    steps are split evenly over the levels; every node continues decoding its parent's canvas for its
    level's steps, so siblings share the parent's state exactly. Rows come in groups of prod(tree)
    identical prompts, one tree per group, whose leaves fill the group's rows in path order
    (`dare.rollout.tree`); () = independent rollouts."""
    whole_last_block: bool = True
    """Block sampler: decode the last block whole, past `gen_length` (both originals do); False ends the canvas
    at `gen_length`, so a trainer that scores the `gen_length` tokens sees exactly the blocks the sampler
    decoded (the RL loop sets it for block models: `dare.train.rl`)."""
    compile: bool | None = field(default=None, metadata=NOHASH)
    """Capture the step forward of the masked sampler (prefix and dual cache) and of the block sampler (its cache
    of committed blocks) with `torch.compile(fullgraph=True, dynamic=False)`, on CUDA in mode reduce-overhead (CUDA
    graphs); None = auto: on for CUDA, off on a CPU. The tokens are the eager step's; a capture that fails falls
    back to eager with one line on stderr. Not hashed (`dare.decoding.RUNTIME`)."""
    masked: MaskedOptions = field(default_factory=MaskedOptions)
    """The masked sampler's options (`dare.decoding.masked`)."""
    block: BlockOptions = field(default_factory=BlockOptions)
    """The block sampler's options (`dare.decoding.block`)."""
    dream: DreamOptions = field(default_factory=DreamOptions)
    """Dream's sampler's options (`dare.decoding.dream`)."""
    maskgit: MaskgitOptions = field(default_factory=MaskgitOptions)
    """The maskgit sampler's options (`dare.decoding.maskgit`)."""
    truncated: TruncatedOptions = field(default_factory=TruncatedOptions)
    """The truncated sampler's options (`dare.decoding.truncated`)."""

    def __post_init__(self):
        for name, cls in decoding_options.OPTIONS.items():  # `masked={"threshold": 0.9}` builds the section
            value = getattr(self, name)
            if isinstance(value, Mapping):
                setattr(self, name, cls(**value))

    def validate(self):
        """The common settings' rules, then the options' rules of the sampler that runs: the one this section
        selects, for sampler=auto the one the config's `model.family` picks (`load` knows it), else both of
        `dare.decoding.AUTO` (without the masked sampler's block layout, which waits for the model)."""
        family = _model_family.get()
        check(self.gen_length > 0, "must be positive", "gen_length")
        check(self.block_length > 0, "must be positive", "block_length")
        check(self.steps > 0, "must be positive", "steps")
        check(self.temperature >= 0, "must be >= 0", "temperature")
        runs = decoding_options.resolve(self.sampler, family)
        for kind, sampler in (("predictions", "maskgit"), ("supports", "truncated"), ("greedy", "masked"),
                              ("entropies", "masked")):
            check(kind not in self.record or runs == sampler, f"only the {sampler} sampler records {kind}",
                  "record", "sampler")
        if self.tree:
            check(all(w >= 1 for w in self.tree) and len(self.tree) <= self.steps,
                  f"widths must be >= 1, at most steps ({self.steps}) levels", "tree")
            check(self.steps <= self.gen_length, f"tree levels are counted in steps: every step must commit a token "
                  f"(steps {self.steps} <= gen_length {self.gen_length})", "tree", "steps")
            check(decoding_options.resolve(self.sampler, family) in (None, "masked"), "tree rollouts continue the "
                  "masked sampler's fixed schedule: sampler masked" + (f" (model.family={family} decodes with the "
                  "block sampler)" if family and self.sampler == "auto" else ""), "tree", "sampler")
        for rule in decoding_options.rules(self, family):
            check(*rule)


@dataclass
class TrainConfig:
    steps: int = 1000
    """SFT and preference: optimizer steps. RL: rollout batches, each followed by `rl.num_iterations`
    optimizer steps (TRL-based references such as d1 and wd1 count optimizer steps: divide by mu)."""
    batch_size: int = 8
    """Sequences per optimizer step (SFT); RL batches are set by `rl.*`."""
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    """Linear warmup, in optimizer steps."""
    warmup_ratio: float = field(default=0.0, metadata=ADDED)
    """Linear warmup as a share of the optimizer steps, ceil(ratio x steps) as transformers counts it
    (TRL references' `warmup_ratio`); only with warmup_steps = 0."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """After warmup: constant, or decay towards `min_lr_ratio * lr` as transformers' linear / cosine
    (with min lr) schedules do (the floor is reached one step after the last)."""
    min_lr_ratio: float = 0.0
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0: off)."""
    micro_batch_size: int = 0
    """Rows per forward/backward on each process; a step accumulates gradients over its micro-batches
    (losses are normalized by whole-step totals, so the gradient does not depend on it). 0: all at once."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass (less memory, ~1/3 more compute)."""
    packing: bool = True
    """Log-prob passes drop padding and pack the sequences of a micro-batch into one row (no compute on pads)."""
    sequence_parallel: int = field(default=1, metadata=ADDED)
    """Ulysses sequence parallelism: groups of this many processes share each data-parallel share of the batch,
    each process computing 1/P of the positions of the trained model's forward and backward (all-to-all over
    attention heads); for sequences too long for one device. Needs packing off; must divide the processes."""
    logit_chunk: int = 1024
    """Positions per output-head call in log-prob passes (peak memory ~ chunk x vocab); 0: full logits."""
    reference_offload: bool = False
    """Keep the frozen reference model on the CPU (moved to the device only for its forward passes;
    FSDP's CPU offload when sharded)."""
    reference_sync_every: int = 0
    """TR-DPO reference update (TRL's `sync_ref_model` / `ref_model_sync_steps`): every this many
    optimizer steps the reference becomes (1 - reference_mix) * reference + reference_mix * policy.
    0: the reference stays the initial model. Needs a reference copy (not LoRA's disabled adapter)."""
    reference_mix: float = 0.6
    """The policy's weight in the reference update (TRL's `ref_model_mixup_alpha`, default 0.6)."""
    optimizer: Literal["adamw", "adamw_offload"] = field(default="adamw", metadata=ADDED)
    """AdamW with its state beside the weights (`adamw`), or a full fine-tune on one device (`adamw_offload`):
    bfloat16 weights and gradients on the device, float32 master weights and moments on the CPU, stepped there.
    `adamw_offload` needs model.dtype=bfloat16, no LoRA and one process. Bytes per parameter of each: `dare.train.optim`."""

    def validate(self):
        check(self.steps > 0, "must be positive", "steps")
        check(self.batch_size > 0, "must be positive", "batch_size")
        check(self.micro_batch_size >= 0, "must be >= 0 (0: no accumulation)", "micro_batch_size")
        check(self.logit_chunk >= 0, "must be >= 0 (0: full logits)", "logit_chunk")
        check(self.lr > 0, "must be positive", "lr")
        check(0 <= self.warmup_steps <= self.steps, "must be within [0, train.steps]", "warmup_steps")
        check(0 <= self.warmup_ratio <= 1, "must be within [0, 1]", "warmup_ratio")
        check(not (self.warmup_ratio and self.warmup_steps), "set warmup_steps or warmup_ratio, not both",
              "warmup_ratio", "warmup_steps")
        check(0 <= self.min_lr_ratio <= 1, "must be within [0, 1]", "min_lr_ratio")
        check(all(0 <= b < 1 for b in self.betas), "must be within [0, 1)", "betas")
        check(self.max_grad_norm >= 0, "must be >= 0", "max_grad_norm")
        check(self.reference_sync_every >= 0, "must be >= 0 (0: a frozen reference)", "reference_sync_every")
        check(self.sequence_parallel >= 1, "must be >= 1 (1: off)", "sequence_parallel")
        check(self.sequence_parallel == 1 or not self.packing,
              "sequence parallelism takes no packed input: set train.packing=false", "sequence_parallel", "packing")
        check(0 < self.reference_mix <= 1, "must be within (0, 1]", "reference_mix")


@dataclass
class SandwichOptions:
    """The knobs of SPG's sandwiched likelihood (`dare.train.estimators.sandwiched_likelihood`) and of its block-wise
    draws (`dare.train.noise.block_random`), for the `algo` section of a baseline that trains on it (SPG, StableDRL):
    its dataclass extends this one and sets its own defaults."""

    negative: Literal["mix", "eubo", "elbo", "zero"] = "mix"
    """The likelihood of the completions with advantage <= 0: the mixture omega EUBO + (1 - omega) ELBO (SPG's
    best), the EUBO alone, the ELBO (SPG's ablation "SPG w/ ELBO") or nothing ("wo/ neg")."""
    beta: float = 1.5
    """Renyi order of the EUBO."""
    omega: float = 0.5
    """Mixture weight of the EUBO."""
    num_t: int = 2
    """Monte Carlo draws per completion and update (SPG's `num_t`, the paper's m)."""
    min_t: float = 0.0
    max_t: float = 1.0
    """The masked share inside a draw's block: a count in [max(1, int(len min_t)), int(len max_t)]."""
    p_mask_prompt: float = 0.15
    """Each prompt token and each token of the clean blocks before a draw's block is masked with it."""

    def validate(self):
        check(self.beta > 0, "must be > 0", "beta")
        check(0 <= self.omega <= 1, "must be in [0, 1]", "omega")
        check(self.num_t >= 1, "must be >= 1", "num_t")
        check(0 <= self.min_t <= self.max_t <= 1, "need 0 <= min_t <= max_t <= 1", "min_t", "max_t")
        check(0 <= self.p_mask_prompt < 1, "must be within [0, 1)", "p_mask_prompt")


@dataclass
class RLConfig:
    prompts_per_step: int = 16
    """Distinct prompts per rollout batch."""
    group_size: int = 6
    """Completions per prompt (G)."""
    num_iterations: int = 1
    """Policy updates per rollout batch (mu); with 1 the old log-probs are not recomputed."""
    mini_batches: int = field(default=1, metadata=ADDED)
    """Optimizer steps per update, each on its slice of the groups (verl's `ppo_mini_batch_size` = the rollout
    batch / mini_batches), each loss normalized by its mini-batch's totals, as verl's is; it must divide the
    prompts each process rolls out per step."""
    noise_draws: Literal["per_update", "once"] = field(default="per_update", metadata=ADDED)
    """How many noise draws a rollout batch's mu updates use: per_update, a fresh draw for each update (d1's
    `random_masking=True`: the policy, old and reference log-probs of an update share its draw); once, one draw
    for all mu updates (d1's ablation "fixed masking", which it finds less stable at mu = 12). An algorithm that
    draws nothing (no `sample_noise`) has one empty draw either way."""
    recompute_old_logps: bool = False
    """Compute the old log-probs even when mu = 1 (the ratio is then 1 by construction); only the
    benchmark's naive pipeline sets it."""
    decoding: DecodingConfig = field(default_factory=lambda: DecodingConfig(temperature=0.9))
    gather_rollout: bool = field(default=True, metadata=NOHASH)
    """Under FSDP (several processes), gather the policy whole once for each rollout (and validation rollout)
    and reshard it after (`dare.train.dist.gathered`): one all-gather per FSDP unit instead of one per unit and
    forward, for the memory of the whole model in the compute dtype on every process during the rollout (2
    bytes a parameter in bfloat16); false: FSDP gathers a unit at a time in every forward. Same tokens."""
    eval_every: int = field(default=0, metadata=NOHASH)
    """Validate every N rollout batches (and after the last) with the embedded evaluator: the first
    `eval_samples` prompts of `eval_split`, greedy with the rollout's lengths, the task's metrics
    logged as `val/<metric>` in metrics.jsonl; 0: off."""
    eval_every_forwards: int = field(default=0, metadata=NOHASH)
    """Also validate after each step that takes the run's sequence forwards (`compute/total_forwards`: rollout +
    training, summed over processes) past a multiple of N, and after the last: a schedule of forward budgets
    shared by every method whatever it spends per step, for rankings at equal compute; 0: off."""
    eval_samples: int = field(default=64, metadata=NOHASH)
    eval_split: str = field(default="test", metadata=NOHASH)
    # Diagnostics (`dare.train.diagnostics`): they read the run and never change it (their noise and
    # forwards leave every generator untouched), so they are not part of the config hash.
    agreement_rows: int = field(default=8, metadata=NOHASH)
    """Rows of every logged step whose committed tokens the trainer replays in the sampler's states
    (`agree/logp_gap`: rollout/trainer agreement); 0: off."""
    diag_every: int = field(default=10, metadata=NOHASH)
    """Every N steps, re-estimate the first `diag_rows` rows' log-probs with `diag_draws` independent noise
    draws (`diag/logp_std`, `diag/logp_std_to_adv_std`); 0: off."""
    diag_draws: int = field(default=4, metadata=NOHASH)
    diag_rows: int = field(default=8, metadata=NOHASH)
    warn_no_diversity: int = field(default=5, metadata=NOHASH)
    """Warn in the log after N consecutive steps in which every group's completions are identical; 0: never."""
    # Guards: a non-finite loss or gradient norm, or a collapse of `collapse_metric`, stops the update and
    # restores the last good checkpoint (`run.save_every` writes them); they change nothing in a healthy run.
    on_collapse: Literal["rollback", "stop"] = field(default="rollback", metadata=NOHASH)
    """rollback: restore the last good checkpoint, halve the learning rate and go on (at most `max_rollbacks`
    times, then stop); stop: exit with the reason. Either way the event is recorded in run.json (`guards`)."""
    max_rollbacks: int = field(default=3, metadata=NOHASH)
    collapse_metric: str = field(default="", metadata=NOHASH)
    """A logged metric (rollout/reward_mean, val/accuracy, ...) whose mean over `collapse_window` steps falling
    below `collapse_below`, or more than `collapse_drop` (a share) below its best, is a collapse; "": off."""
    collapse_window: int = field(default=5, metadata=NOHASH)
    collapse_below: float | None = field(default=None, metadata=NOHASH)
    collapse_drop: float | None = field(default=None, metadata=NOHASH)

    def validate(self):
        check(self.agreement_rows >= 0, "must be >= 0 (0: off)", "agreement_rows")
        check(self.diag_every >= 0, "must be >= 0 (0: off)", "diag_every")
        check(self.diag_draws >= 2, "must be >= 2 (a spread needs two draws)", "diag_draws")
        check(self.diag_rows > 0, "must be positive", "diag_rows")
        check(self.warn_no_diversity >= 0, "must be >= 0 (0: never)", "warn_no_diversity")
        check(self.max_rollbacks >= 0, "must be >= 0", "max_rollbacks")
        check(self.collapse_window > 0, "must be positive", "collapse_window")
        check(not self.collapse_metric or self.collapse_below is not None or self.collapse_drop is not None,
              "a collapse criterion needs collapse_below or collapse_drop", "collapse_metric")
        check(self.collapse_drop is None or 0 < self.collapse_drop < 1, "must be in (0, 1)", "collapse_drop")
        check(self.eval_every >= 0, "must be >= 0 (0: no validation)", "eval_every")
        check(self.eval_every_forwards >= 0, "must be >= 0 (0: no schedule of forward budgets)", "eval_every_forwards")
        check(self.eval_samples > 0, "must be positive", "eval_samples")
        check(self.prompts_per_step > 0, "must be positive", "prompts_per_step")
        check(self.group_size >= 2, "must be >= 2: every RL baseline's advantages are relative to its group",
              "group_size")
        check(self.num_iterations > 0, "must be positive", "num_iterations")
        check(self.mini_batches > 0, "must be positive", "mini_batches")


@dataclass
class EvalConfig:
    benchmarks: list[str] = field(default_factory=lambda: ["addition"])
    engine: Literal["embedded", "opencompass"] = "embedded"
    """embedded: our tasks, decoded and scored in this process. opencompass: the benchmarks of
    DARE's suite (`dare/eval/configs/benchmarks.yaml`) through OpenCompass in the eval environment;
    the ones it does not cover (countdown, sudoku, our synthetic tasks) still run embedded."""
    split: str = "test"
    """Split of the embedded tasks (OpenCompass' dataset configs fix their own)."""
    n_samples: int | None = None
    """Evaluate the first n examples of the split (None: all)."""
    batch_size: int = 64
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    preset: Literal["auto", "dare", "none"] = "auto"
    """dare: each benchmark decodes with the settings DARE used for the checkpoint's family
    (`dare/eval/configs/<family>.yaml`); the `decoding` fields you set (file or command line) win.
    none: `decoding` as given for every benchmark. auto: dare with the opencompass engine."""

    def validate(self):
        """The benchmark names are checked by `dare.eval.load_eval_config` (it knows the suite)."""
        check(len(self.benchmarks) > 0, "at least one benchmark", "benchmarks")
        check(self.n_samples is None or self.n_samples > 0, "must be positive or null", "n_samples")
        check(self.batch_size > 0, "must be positive", "batch_size")


@dataclass
class EvalRunConfig:
    """`dare eval <checkpoint>`: the checkpoint is given on the command line, not here."""

    run: RunConfig = field(default_factory=RunConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    dtype: Literal["float32", "bfloat16"] = "float32"


def recipe(algo: type, *, model: ModelConfig | None = None, data: DataConfig | None = None,
           train: TrainConfig | None = None, rl: RLConfig | None = None) -> type:
    """A baseline's `Config` dataclass, declared by its paper's values: `Config = recipe(D1, train=TrainConfig(
    lr=3e-6, ...), rl=RLConfig(group_size=6, ...))`. Its sections are run, model, data, train, rl (only when `rl`
    is given: the recipes with rollouts) and algo, in that order; a section not given is its class's defaults,
    and `algo` is the baseline's own dataclass with its defaults. Each `Config()` gets fresh copies."""
    sections = {"run": RunConfig(), "model": model or ModelConfig(), "data": data or DataConfig(),
                "train": train or TrainConfig(), **({"rl": rl} if rl is not None else {}), "algo": algo()}
    cls = dataclasses.make_dataclass("Config", [
        (name, type(value), field(default_factory=lambda value=value: copy.deepcopy(value)))
        for name, value in sections.items()])
    cls.__module__ = sys._getframe(1).f_globals.get("__name__", cls.__module__)  # where the baseline declared it
    return cls


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = load_yaml(path.read_text(), str(path))
    except YAMLAliasError as e:
        raise ConfigError(str(e)) from None
    except yaml.YAMLError as e:
        raise _yaml_error(path, e) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of config keys, got {type(data).__name__}")
    return data


def _yaml_error(path: Path, e: yaml.YAMLError) -> ConfigError:
    """A YAML syntax error as `<file>, line L, column C: not valid YAML: <problem>`."""
    mark = getattr(e, "problem_mark", None)
    if mark is None:
        return ConfigError(f"{path}: not valid YAML: {e}")
    context, start = getattr(e, "context", None), getattr(e, "context_mark", None)
    problem = e.problem + (f" ({context} at line {start.line + 1})" if context and start else "")
    return ConfigError(f"{path}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}")


def load(cls, path: str | Path | None = None, overrides: typing.Iterable[str] = (), *,
         data: Mapping | None = None):
    """Defaults of `cls` <- YAML `path` (or an already-read `data` mapping) <- `key=value` overrides.
    Every problem found is collected; one `ConfigError` then lists them, one per line."""
    cfg = cls()
    origins: dict[str, str] = {}
    problems: list[str] = []
    if data is None and path is not None:
        data = read_yaml(path)
    if data:
        _merge(cfg, data, "", str(path) if path is not None else "config", origins, problems)
    for item in overrides:
        try:
            _override(cfg, item, origins, problems)
        except ConfigError as e:
            problems.append(str(e))
    family = getattr(getattr(cfg, "model", None), "family", None)
    token = _model_family.set(family if family in ATTENTION else None)
    try:
        _validate_tree(cfg, "", origins, problems)
    finally:
        _model_family.reset(token)
    problems += _across_sections(cfg, origins)
    if problems:
        raise ConfigError.of(problems)
    return cfg


def parse_override(item: str) -> tuple[str, Any, str]:
    """One `key=value` override as (key, value, raw): the value read as YAML (the text itself when it is not
    YAML; None when empty). The one parser of overrides (`dare train`, `dare eval`, sweeps); ConfigError for
    an item without `=` or a value with YAML anchors or aliases."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"command line: override {shown_value(item)} is not of the form key=value")
    try:
        return key, load_yaml(raw, f"command line: {key}") if raw.strip() else None, raw
    except YAMLAliasError as e:
        raise ConfigError(f"{e} (quote the value to mean the text)") from None
    except yaml.YAMLError:
        return key, raw, raw


def _override(cfg, item: str, origins: dict, problems: list[str]) -> None:
    """Apply one `key=value` override; raises the ConfigError of a bad one."""
    key, value, raw = parse_override(item)
    try:
        _set_dotted(cfg, key, value, "command line", origins, problems)
    except ConfigError as first:
        if value == raw or value is None:
            raise
        # YAML read `model.name=2024` as an int or `data.task=yes` as a bool: a string field
        # takes the text as written; any other field reports the first error.
        try:
            _set_dotted(cfg, key, raw, "command line", origins, problems)
        except ConfigError:
            raise first from None


def _fields(obj) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(obj)}


def _hints(obj) -> dict[str, Any]:
    return typing.get_type_hints(type(obj))


RENAMED = {"rl.rollout": "rl.decoding"}
"""Keys that were renamed: old dotted prefix -> new. A config with an old key fails with the new name
(one name per concept: the decoding settings are `decoding` in training, evaluation and rollout). The
decoding options that moved into their sampler's section (`rl.decoding.threshold` ->
`rl.decoding.masked.threshold`) fail the same way, with the section of the config's sampler
(`dare.decoding.renamed`)."""


def _unknown(key: str, candidates: typing.Iterable[str], source: str, section=None) -> ConfigError:
    """The error of an unknown `key` (dotted, from the top) met in config section `section`: a renamed key's
    new name, else the closest known key."""
    name = key.rsplit(".", 1)[-1]
    if isinstance(section, DecodingConfig) and name in decoding_options.OWNERS:
        return ConfigError(f"{source}: {decoding_options.renamed(key, name, section.sampler)}")
    for old, new in RENAMED.items():
        if key == old or key.startswith(old + "."):
            return ConfigError(f"{source}: '{key}' was renamed to '{new + key[len(old):]}'; rename it in the "
                               f"config (YAML `{old.split('.')[-1]}:` under `{old.rsplit('.', 1)[0]}:` -> "
                               f"`{new.split('.')[-1]}:`)")
    return ConfigError(f"{source}: unknown key '{key}'{did_you_mean(key, candidates)}")


def did_you_mean(name: str, known: typing.Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest of `known` to a mistyped `name`; "" when none is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _all_keys(obj, prefix: str = "") -> list[str]:
    keys = []
    for name in _fields(obj):
        value = getattr(obj, name)
        keys.append(prefix + name)
        if dataclasses.is_dataclass(value):
            keys += _all_keys(value, f"{prefix}{name}.")
    return keys


def _merge(obj, data: Mapping, prefix: str, source: str, origins: dict, problems: list[str]) -> None:
    """Set the fields of section `obj` from `data`, appending each bad key's message to `problems`."""
    if isinstance(obj, DecodingConfig):  # a config saved before `record` holds its one flag
        data = decoding_options.without_record_trajectory(data, sampler=obj.sampler)
    for key, value in data.items():
        try:
            _merge_one(obj, key, value, prefix, source, origins, problems)
        except ConfigError as e:
            problems.append(str(e))


def _merge_one(obj, key, value, prefix: str, source: str, origins: dict, problems: list[str]) -> None:
    """Set one field (or merge one subsection) of `obj`; raises the ConfigError of a bad key or value."""
    if not isinstance(key, str) or key not in _fields(obj):
        raise _unknown(prefix + str(key), _all_keys(obj, prefix), source, obj)
    current = getattr(obj, key)
    if dataclasses.is_dataclass(current):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{source}: {prefix}{key}: expected a mapping of "
                              f"{type(current).__name__} fields, got {shown_value(value)}")
        _merge(current, value, f"{prefix}{key}.", source, origins, problems)
    else:
        setattr(obj, key, _coerce(value, _hints(obj)[key], prefix + key, source))
        origins[prefix + key] = source


def _set_dotted(cfg, key: str, value, source: str, origins: dict, problems: list[str]) -> None:
    """Set dotted `key` to `value`; raises the ConfigError of a bad key or value (a section's
    fields given as a mapping append theirs to `problems`)."""
    obj, parts = cfg, key.split(".")
    for i, part in enumerate(parts):
        fields = _fields(obj)
        if part not in fields:
            raise _unknown(key, _all_keys(cfg), source, obj)
        if i == len(parts) - 1:
            current = getattr(obj, part)
            if dataclasses.is_dataclass(current):
                if not isinstance(value, Mapping):
                    raise ConfigError(f"{source}: {key} is a section; set its fields ({key}.<field>=...)")
                _merge(current, value, key + ".", source, origins, problems)
            else:
                setattr(obj, part, _coerce(value, _hints(obj)[part], key, source))
                origins[key] = source
            return
        obj = getattr(obj, part)
        if not dataclasses.is_dataclass(obj):
            raise _unknown(key, _all_keys(cfg), source)


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value, tp, key: str, source: str):
    """Check `value` against the annotation `tp`; ints widen to floats, lists to tuples."""

    def fail():
        return ConfigError(f"{source}: {key}: expected {_type_name(tp)}, got {shown_value(value)}")

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        if not _all_finite(value):
            raise ConfigError(f"{source}: {key}: {NON_FINITE}, got {shown_value(value)}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_finite = None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, source)
            except ConfigError as e:
                non_finite = non_finite or (e if NON_FINITE in str(e) else None)
        raise non_finite or fail()
    if origin is Literal:
        if value in args:
            return value
        raise ConfigError(f"{source}: {key}: must be one of {list(args)}, got {shown_value(value)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise fail()
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise fail()
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads `1e-5` (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise fail()
        if not math.isfinite(number):  # .inf, nan, 1e999: no setting means that
            raise ConfigError(f"{source}: {key}: {NON_FINITE}, got {shown_value(value)}")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise fail()
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise fail()
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{source}: {key}: expected {len(args)} values, got {shown_value(value)}")
            return tuple(_coerce(v, a, key, source) for v, a in zip(value, args))
        item = args[0] if args else Any
        items = [_coerce(v, item, key, source) for v in value]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise fail()
        vt = args[1] if args else Any
        return {str(k): _coerce(v, vt, f"{key}.{k}", source) for k, v in value.items()}
    raise ConfigError(f"{key}: unsupported annotation {tp!r} in the config class")


NON_FINITE = "must be a finite number (inf and nan are not allowed)"


def _all_finite(value) -> bool:
    """Whether no float in `value` (nested lists and mappings included) is inf or nan."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, Mapping):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_all_finite(v) for v in value)
    return True


def _validate_tree(obj, prefix: str, origins: dict, problems: list[str]) -> None:
    """Run `validate()` of every section, innermost first, appending each failed rule to `problems`."""
    for name in _fields(obj):
        value = getattr(obj, name)
        if dataclasses.is_dataclass(value):
            _validate_tree(value, f"{prefix}{name}.", origins, problems)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        problems += _run_check(validate, obj, prefix, origins)


def _run_check(fn, obj, prefix: str, origins: dict) -> list[str]:
    """The messages of the rules that `fn` (a section's `validate`) finds broken. A later rule that
    trips over a value an earlier one rejected (`TASKS[task]` of an unknown task) ends the section."""
    failed: list[Invalid] = []
    token = _failed.set(failed)
    try:
        fn()
    except Invalid as e:
        failed.append(e)
    except Exception:
        if not failed:
            raise
    finally:
        _failed.reset(token)
    return [_invalid_message(e, obj, prefix, origins) for e in failed]


def _invalid_message(e: Invalid, obj, prefix: str, origins: dict) -> str:
    """`invalid config: <key>: <rule> [<key>=<value> (from <file | command line | defaults>), ...]`."""
    where = ", ".join(f"{prefix}{k}={shown_value(_get(obj, k))} (from {origins.get(prefix + k, 'defaults')})"
                      for k in e.keys)
    keys = [prefix + k for k in e.keys]
    return (f"invalid config: {keys[0] if keys else prefix.rstrip('.')}: {e.message}"
            + (f" [{where}]" if where else ""))


def _get(obj, key: str):
    """The value of dotted `key` (`masked.threshold`) under section `obj`; '?' where there is none."""
    for part in key.split("."):
        obj = getattr(obj, part, "?")
    return obj


def check_across_sections(cfg, origins: dict | None = None) -> None:
    """Raise a ConfigError listing the broken rules of `_across_sections`."""
    problems = _across_sections(cfg, origins or {})
    if problems:
        raise ConfigError.of(problems)


def _across_sections(cfg, origins: dict) -> list[str]:
    """Rules that join two sections, checked before any model is built:
    - `train.reference_sync_every` needs a reference copy, which LoRA does not have (its reference
      is the base with the adapter disabled);
    - `train.optimizer=adamw_offload` needs `model.dtype=bfloat16` and no LoRA;
    - a decoding section's options are those of the sampler that runs (sampler=auto: the one the config's
      `model.family` picks, both of `dare.decoding.AUTO` where it names none): an option set in a file or on
      the command line for a sampler that does not run is an error. (The options of the sampler that runs
      are checked by `DecodingConfig.validate`, which `load` tells the family.)"""
    problems = []
    model, train = getattr(cfg, "model", None), getattr(cfg, "train", None)
    if model is not None and train is not None and getattr(train, "reference_sync_every", 0) and model.lora.rank > 0:
        problems.append(
            f"invalid config: train.reference_sync_every={train.reference_sync_every} (from "
            f"{origins.get('train.reference_sync_every', 'defaults')}) with model.lora.rank={model.lora.rank}: "
            "under LoRA the reference is the base with the adapter disabled, which a TR-DPO update cannot move; "
            "train without LoRA or set train.reference_sync_every=0")
    if model is not None and getattr(train, "optimizer", "adamw") == "adamw_offload":
        where = f"train.optimizer=adamw_offload (from {origins.get('train.optimizer', 'defaults')})"
        if model.lora.rank > 0:
            problems.append(f"invalid config: {where} with model.lora.rank={model.lora.rank}: LoRA's adapters are "
                            "small and its base is frozen, nothing to offload; set train.optimizer=adamw")
        elif model.dtype != "bfloat16":
            problems.append(f"invalid config: {where} with model.dtype={model.dtype}: it keeps bfloat16 weights on the "
                            "device; set model.dtype=bfloat16")
    family = getattr(model, "family", None)

    def walk(obj, prefix):
        if isinstance(obj, DecodingConfig):
            problems.extend(_unused_options(obj, prefix, family, origins))
            return
        for name in _fields(obj):
            value = getattr(obj, name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{name}.")

    walk(cfg, "")
    return problems


def _unused_options(d: DecodingConfig, prefix: str, family: str | None, origins: dict) -> list[str]:
    """The options of decoding section `d` (at `prefix`) set for a sampler that does not run."""
    runs = decoding_options.resolve(d.sampler, family if family in ATTENTION else None)
    if runs:
        decodes = f"the {runs} sampler ({prefix}sampler={d.sampler}" + (
            f", model.family={family})" if d.sampler == "auto" else ")")
    else:
        decodes = f"the masked or the block sampler ({prefix}sampler=auto, as the model says)"
    return [f"invalid config: {prefix}{key}={shown_value(_get(d, key))} (from {origins[prefix + key]}) is an "
            f"option of the {sampler} sampler, and this config decodes with {decodes}: set {prefix}sampler or drop "
            "the option"
            for key, sampler in decoding_options.unused_options(d, family if family in ATTENTION else None,
                                                                lambda k: prefix + k in origins)]


# ---------------------------------------------------------------------------------------------
# Serialisation and hashing
# ---------------------------------------------------------------------------------------------


def to_dict(cfg, *, hashed_only: bool = False, _family: str | None = None) -> dict:
    """The config as plain data. `hashed_only`: what the config hash covers (no `NOHASH` field, no `ADDED`
    field at its default, every decoding section in its flat form: `dare.decoding.hashed`, its sampler=auto
    resolved by the config's `model.family`)."""
    if hashed_only and isinstance(cfg, DecodingConfig):
        return decoding_options.hashed(cfg, _family)
    if _family is None:
        _family = getattr(getattr(cfg, "model", None), "family", None)
    out = {}
    for f in dataclasses.fields(cfg):
        if hashed_only and not f.metadata.get("hash", True):
            continue
        value = getattr(cfg, f.name)
        if hashed_only and f.metadata.get("hash") == "unless_default" and value == _default(f):
            continue
        if dataclasses.is_dataclass(value):
            value = to_dict(value, hashed_only=hashed_only, _family=_family)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def config_hash(cfg) -> str:
    canonical = json.dumps(to_dict(cfg, hashed_only=True), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def recipe_hash(cfg) -> str:
    """The config hash without `run.seed`: the runs of one recipe that differ only by seed share it
    (the leaderboard pools those, and only those)."""
    hashed = to_dict(cfg, hashed_only=True)
    hashed.get("run", {}).pop("seed", None)
    return hashlib.sha256(json.dumps(hashed, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class _PlainDumper(yaml.SafeDumper):
    """Writes a value shared by two fields twice, never as an anchor and alias (which `read_yaml` refuses)."""

    def ignore_aliases(self, data):
        return True


def to_yaml(cfg) -> str:
    return yaml.dump(to_dict(cfg), Dumper=_PlainDumper, sort_keys=False)


def save(cfg, run_dir: str | Path, header: str = "") -> str:
    """Write the resolved config and its hash into `run_dir`; returns the hash."""
    digest = config_hash(cfg)
    text = f"# {header}\n" if header else ""
    text += f"# config_hash: sha256:{digest}\n" + to_yaml(cfg)
    atomic_write(Path(run_dir) / "config.yaml", text)
    atomic_write(Path(run_dir) / "config.sha256", digest + "\n")
    return digest
