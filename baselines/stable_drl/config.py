"""StableDRL defaults: the Block-R1 reference (`YanJiangJerry/Block-R1@fd7a1b8`): `rl/train.yaml`, the
`stable_drl_*` fields of `rl/trainers/diffu_grpo_config.py` and `reproduce/stable_drl/stable_drl_gsm8k.sh`
(LLaDA-8B-Instruct, 4 GPUs), unless noted."""

from dataclasses import dataclass
from typing import Literal

from dare.config import DecodingConfig, RLConfig, SandwichOptions, TrainConfig, check, recipe


@dataclass
class StableDRL(SandwichOptions):
    """SPG's sandwich (`dare.config.SandwichOptions`) under the reference's names: negative
    `stable_drl_logp_estimation` (derived from omega: 0 < omega < 1 gives the mixture), beta `stable_drl_spg_beta`,
    omega `stable_drl_spg_omega`, num_t `stable_drl_num_mc_samples` (1 here), min_t / max_t SPGConfig's,
    p_mask_prompt `stable_drl_p_mask_perturb`; and StableDRL's own ratio and advantage."""

    max_ratio: float = 5.0
    """Unconditional clip of the sequence importance ratio before self-normalisation (`stable_drl_ais_clip_iw`):
    w = min(r, max_ratio), whatever the advantage's sign."""
    snis: bool = True
    """Self-normalise the clipped ratios within each group (`stable_drl_use_snis`, True in Block-R1); False is
    the reference's fallback, SPG's length-weighted sandwich without any ratio."""
    num_t: int = 1
    advantage: Literal["center", "grpo_std"] = "center"
    """`stable_drl_advantage_mode`: r - mean of the group (the default), or GRPO's (r - mean) / (std + 1e-4)."""

    def validate(self):
        super().validate()
        check(self.max_ratio > 0, "must be > 0", "max_ratio")


# The reference trains LoRA r 128 / alpha 64 / dropout 0.05 on a 4-bit LLaDA-8B-Instruct (`rl/train.yaml`):
# set model.path (and model.lora.* for the LoRA).
Config = recipe(
    StableDRL,
    # AdamW (0.9, 0.99), weight decay 0.1, grad-norm clip 0.2, lr 3e-6 constant (warmup ratio 1e-4); max_steps
    # 5000 optimizer steps at mu = 12 (GSM8K): 417 rollout batches.
    train=TrainConfig(steps=417, lr=3e-6, weight_decay=0.1, betas=(0.9, 0.99), max_grad_norm=0.2),
    # 4 GPUs x 12 completions x grad-acc 1 = 48 completions = 8 prompts x G = 6 per step, mu = 12 (GSM8K, MATH;
    # Sudoku 8). Rollout: 256 tokens, block 32, 128 steps, temperature 0.9 (the config's default).
    rl=RLConfig(
        prompts_per_step=8, group_size=6, num_iterations=12,
        decoding=DecodingConfig(gen_length=256, block_length=32, steps=128, temperature=0.9)))
