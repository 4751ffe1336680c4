"""d1 / diffu-GRPO defaults: `d1:diffu-grpo/slurm_scripts/train.yaml` and the sbatch files
(LLaDA-8B-Instruct, GSM8K), unless noted."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class D1:
    p_mask_prompt: float = 0.15
    """Probability of masking each prompt token in the one-step estimate (d1 §3.2; train.yaml).
    The paper's ablation finds 0.1-0.3 stable and 0.5-0.7 unstable."""
    beta: float = 0.04
    """KL coefficient (k3 estimator against the reference model)."""
    epsilon: float = 0.5
    """PPO clip range (train.yaml; the trainer dataclass default is 0.2)."""

    def validate(self):
        check(0 <= self.p_mask_prompt < 1, "must be within [0, 1)", "p_mask_prompt")
        check(self.beta >= 0, "must be >= 0", "beta")
        check(self.epsilon > 0, "must be > 0", "epsilon")


# The paper starts from LLaDA-8B-Instruct (or its s1K-SFT merge): set model.path.
Config = recipe(
    D1,
    # AdamW betas (0.9, 0.99), weight decay 0.1, grad-norm clip 0.2, lr 3e-6 constant (warmup ratio 1e-4).
    train=TrainConfig(steps=1000, lr=3e-6, weight_decay=0.1, betas=(0.9, 0.99), max_grad_norm=0.2),
    # 8 GPUs x 6 completions x grad-acc 2 = 96 completions = 16 prompts x G=6 per step; mu = 12 for
    # GSM8K/MATH (8 for Countdown/Sudoku). Rollout: 256 tokens, block 32, 128 steps, temperature 0.9.
    rl=RLConfig(
        prompts_per_step=16, group_size=6, num_iterations=12,
        decoding=DecodingConfig(gen_length=256, block_length=32, steps=128, temperature=0.9)))
