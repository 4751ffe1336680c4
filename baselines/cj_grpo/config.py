"""CJ-GRPO defaults: `EOSER-ASS-RL:cj-grpo/slurm_scripts/train.yaml` and the run scripts (LLaDA-8B,
GSM8K), with the paper's decoding (EOSER + ASS), unless noted."""

from dataclasses import dataclass

from dare.config import DecodingConfig, MaskedOptions, RLConfig, TrainConfig, check, recipe


@dataclass
class CJGRPO:
    beta: float = 0.04
    """k3 KL coefficient against the reference model (train.yaml)."""
    epsilon: float = 0.5
    """PPO clip range (train.yaml)."""

    def validate(self):
        check(self.beta >= 0, "must be >= 0", "beta")
        check(self.epsilon > 0, "must be > 0", "epsilon")


# The paper starts from LLaDA-8B-Instruct: set model.path.
Config = recipe(
    CJGRPO,
    # AdamW betas (0.9, 0.99), weight decay 0.1, grad-norm clip 0.2, lr 3e-6 constant (warmup ratio 1e-4).
    train=TrainConfig(steps=1000, lr=3e-6, weight_decay=0.1, betas=(0.9, 0.99), max_grad_norm=0.2),
    # 8 GPUs x 6 completions x grad-acc 2 = 16 prompts x G = 6 per step; mu = 12 for GSM8K/MATH (8 for
    # Countdown/Sudoku: the run scripts' NUM_ITER). Rollout: temperature 1.0, 256 tokens, the ascending
    # schedule in floor(log2 256) = 8 steps in one block (train.yaml block_num 1) with EOSER from 0.01 to 1.
    rl=RLConfig(
        prompts_per_step=16, group_size=6, num_iterations=12,
        decoding=DecodingConfig(gen_length=256, steps=8, temperature=1.0, masked=MaskedOptions(
            schedule="ass", ass_blocks=1, eos_gamma_min=0.01, eos_gamma_max=1.0))))
