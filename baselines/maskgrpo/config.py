"""MaskGRPO defaults (text tasks): martian422/MaskGRPO @b74ba3c, `scripts/train/t2t_grpo_train.sh` over
`configs/rl.yaml` (LLaDA-8B-Instruct, GSM8K), unless noted."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class MaskGRPO:
    remasking: str = "arlike"
    """How each update's estimate masks the completion: arlike (AR-like reversing: the later a position, the more
    likely it is masked; the script's) or random (i.i.d. at the update's ratio, UniGRPO's)."""
    ar_span: str = "sequence"
    """arlike: the positions the AR-like curve spans. sequence: every position after the first of the (padded)
    sequence, read at the completion's, as the reference's code does it (`remask_ar` reads the prompt length as 1:
    `prompt_index` is one row there); completion: the completion's positions alone, as the paper describes it."""
    min_mask_rate: float = 0.6
    """The mask ratio of update i of mu rises linearly: min(m + (1 - m)(i + 1) / mu, 0.999) (the script's MIN_MASK)."""
    beta: float = 0.01
    """k3 KL coefficient against the reference (rl.yaml)."""
    epsilon: float = 0.2
    """PPO clip range, both sides (rl.yaml)."""

    def validate(self):
        check(self.remasking in ("arlike", "random"), "must be arlike or random", "remasking")
        check(self.ar_span in ("sequence", "completion"), "must be sequence or completion", "ar_span")
        check(0 <= self.min_mask_rate < 1, "must be within [0, 1)", "min_mask_rate")
        check(self.beta >= 0, "must be >= 0", "beta")
        check(self.epsilon > 0, "must be > 0", "epsilon")


# The paper starts from LLaDA-8B-Instruct (the text tasks; MMaDA for images, not here): set model.path.
Config = recipe(
    MaskGRPO,
    # AdamW betas (0.9, 0.99), weight decay 0.1, grad-norm clip 0.2, lr 3e-6 constant (rl.yaml).
    train=TrainConfig(steps=1000, lr=3e-6, weight_decay=0.1, betas=(0.9, 0.99), max_grad_norm=0.2),
    # 8 processes x 6 completions (one group of G = 6) x accumulation 2 = 16 prompts a rollout batch, mu = 12.
    # Rollout: 256 tokens, block 16, 128 steps, low-confidence remasking (its `generate`), temperature 0.9 (TRL's
    # GRPOConfig default; rl.yaml sets none).
    rl=RLConfig(
        prompts_per_step=16, group_size=6, num_iterations=12,
        decoding=DecodingConfig(gen_length=256, block_length=16, steps=128, temperature=0.9)))
