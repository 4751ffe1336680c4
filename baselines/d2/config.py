"""d2-StepMerge defaults: `d2:diffu-grpo/bash_scripts/train.yaml` and `gsm8k_d2stepmerge.sh` (LLaDA-8B-Instruct,
GSM8K), unless noted."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class D2:
    segments: int = 8
    """N: the rollout's steps cut into N segments, one forward each (gsm8k_d2stepmerge.sh --N 8; Countdown, Sudoku
    and MATH500: 16). N = rl.decoding.steps is the exact trajectory likelihood."""
    p_mask_prompt: float = 0.15
    """Probability of masking each prompt token, a fresh mask per inner update (train.yaml; random_masking)."""
    beta: float = 0.04
    """k3 KL coefficient against the reference model (train.yaml)."""
    epsilon: float = 0.5
    """PPO clip range (train.yaml)."""

    def validate(self):
        check(self.segments >= 1, "must be >= 1", "segments")
        check(0 <= self.p_mask_prompt < 1, "must be within [0, 1)", "p_mask_prompt")
        check(self.beta >= 0, "must be >= 0", "beta")
        check(self.epsilon > 0, "must be > 0", "epsilon")


# The paper starts from LLaDA-8B-Instruct: set model.path.
Config = recipe(
    D2,
    # AdamW betas (0.9, 0.99), weight decay 0.1, grad-norm clip 0.2, lr 3e-6 constant (train.yaml). 1000 rollout
    # batches of mu = 12: 12000 optimizer steps, the last checkpoint eval_gsm8k_d2stepmerge.sh evaluates (which one
    # the paper reports is not stated).
    train=TrainConfig(steps=1000, lr=3e-6, weight_decay=0.1, betas=(0.9, 0.99), max_grad_norm=0.2),
    # 16 prompts x G = 6 per step as d1 (the scripts' gradient accumulation is N x d1's: one micro-step per
    # segment); mu = 12 for GSM8K/MATH500 (8 for Countdown/Sudoku). Rollout: 256 tokens, block 32, 128 steps,
    # temperature 0.9 (the config's default; Sudoku 0.3).
    rl=RLConfig(
        prompts_per_step=16, group_size=6, num_iterations=12,
        decoding=DecodingConfig(gen_length=256, block_length=32, steps=128, temperature=0.9)))
