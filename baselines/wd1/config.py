"""wd1 defaults: `wd1/train.yaml` and the paper's Table 6: identical to d1 except beta = 0, psi = 1
and no clipping (LLaDA-8B-Instruct, GSM8K)."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class WD1:
    p_mask_prompt: float = 0.15
    """d1's prompt masking probability for the one-step estimate."""
    psi: float = 1.0
    """Temperature of the group softmax over advantages (psi = 1 in the paper and code)."""

    def validate(self):
        check(0 <= self.p_mask_prompt < 1, "must be within [0, 1)", "p_mask_prompt")
        check(self.psi > 0, "must be positive", "psi")


# LLaDA-8B-Instruct: set model.path. The paper trains LoRA r 128 / alpha 64 on a 4-bit base.
# The demo task by default (offline); the paper's GSM8K/MATH/Countdown/Sudoku runs: reproductions/wd1/.
Config = recipe(
    WD1,
    # as d1: AdamW (0.9, 0.99), weight decay 0.1, grad-norm 0.2, lr 3e-6 constant
    train=TrainConfig(steps=5000, lr=3e-6, weight_decay=0.1, betas=(0.9, 0.99), max_grad_norm=0.2),
    # 4 GPUs x 6 completions x grad-acc 2 = 48 completions = 8 prompts x G = 6; mu = 12. Rollout as d1:
    # 256 tokens, block 32, 128 steps, temperature 0.9.
    rl=RLConfig(
        prompts_per_step=8, group_size=6, num_iterations=12,
        decoding=DecodingConfig(gen_length=256, block_length=32, steps=128, temperature=0.9)))
