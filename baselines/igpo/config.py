"""IGPO defaults: facebookresearch/igpo @e85eaea, `run_igpo.sh` (its one experiment) over `train.yaml` and
`utils/diffu_grpo_config.py` (LLaDA-8B-Instruct on MetaMathQA), unless noted."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class IGPO:
    solved_at: float = 1.0
    """A completion is correct when its reward reaches this (the task's full reward; the reference tests its
    correctness reward for the maximum). A group none of whose completions is correct gets hints."""
    share_low: float = 0.2
    """The hinted share of a row's chunks is drawn from U[share_low, share_high] (sorted within the group)
    (run_igpo.sh inpaint_chunk_ratio_low)."""
    share_high: float = 0.6
    """(run_igpo.sh inpaint_chunk_high_initial_ratio)"""
    min_chunk: int = 5
    """Chunk sizes of the reference solution, drawn from [min_chunk, max_chunk] tokens (run_igpo.sh)."""
    max_chunk: int = 10
    free_tail: int = 30
    """The last positions of the completion stay free of hints (create_spacing_scaled_inpainting_sequence)."""
    max_spacing: int = 100
    """Gaps between hint chunks, stretched by up to 1.5x to fill the completion, are capped here (config)."""
    max_replacements: int = 4
    """At most this many correct hinted completions replace a failed group's completions (run_igpo.sh)."""
    hint_keep: float = 0.2
    """Of a hinted completion's hint tokens, the share with the highest entropy under the old policy kept in the
    loss (at least one); every other token is kept (entropy_clipping_ratio_inpaint)."""
    beta: float = 0.01
    """k3 KL coefficient against the reference model (run_igpo.sh)."""
    epsilon: float = 0.2
    """Clip range of the sequence ratio, both sides (run_igpo.sh epsilon_low = epsilon_high = 0.2)."""

    def validate(self):
        check(0 <= self.share_low <= self.share_high <= 1, "must satisfy 0 <= share_low <= share_high <= 1",
              "share_low", "share_high")
        check(1 <= self.min_chunk <= self.max_chunk, "must satisfy 1 <= min_chunk <= max_chunk", "min_chunk",
              "max_chunk")
        check(self.free_tail >= 0, "must be >= 0", "free_tail")
        check(self.max_spacing >= 0, "must be >= 0", "max_spacing")
        check(self.max_replacements >= 1, "must be >= 1", "max_replacements")
        check(0 <= self.hint_keep <= 1, "must be within [0, 1]", "hint_keep")
        check(self.beta >= 0, "must be >= 0", "beta")
        check(0 < self.epsilon < 1, "must be within (0, 1)", "epsilon")


# The paper starts from LLaDA-8B-Instruct: set model.path.
Config = recipe(
    IGPO,
    # AdamW betas (0.9, 0.99), weight decay 0.1, grad-norm clip 0.2 (train.yaml), lr 5e-7 (run_igpo.sh; 50 warmup
    # steps there, none here).
    train=TrainConfig(steps=1000, lr=5e-7, weight_decay=0.1, betas=(0.9, 0.99), max_grad_norm=0.2),
    # 8 GPUs x gradient accumulation 8 x one prompt of G = 8 a micro-batch = 64 prompts a step, mu = 4. Rollout:
    # 256 tokens, block 32, 128 steps, temperature 1.2 (run_igpo.sh).
    rl=RLConfig(
        prompts_per_step=64, group_size=8, num_iterations=4,
        decoding=DecodingConfig(gen_length=256, block_length=32, steps=128, temperature=1.2)))
