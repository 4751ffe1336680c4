"""EGSPO defaults: vishnutez/egspo-dllm-rl @a7d618b, `egspo/train.sh` over `egspo/slurm_scripts/train.yaml` and
`egspo/egspo_config.py` (LLaDA-8B-Instruct, GSM8K), unless noted."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class EGSPO:
    num_steps: int = 8
    """K: the denoising steps of each rollout trained on, those whose committed tokens had the highest mean entropy
    (logps_eval_num_steps, time steps mode high_entropy)."""
    steps_per_update: int = 2
    """The chosen steps one update trains on, in the reference's order: its gradient accumulation (2 micro-batches)
    runs one chosen step per micro-batch on the same rollout."""
    lambda1: float = 0.5
    """Weight of the step advantage (final reward - the step's one-step denoising reward) in the step's return;
    0 is GRPO on the entropy-chosen steps (train.sh LAMBDA1)."""
    normalize_returns: bool = True
    """Returns divided by 1 + lambda1 (train.sh NORMALIZE_RETURNS)."""
    beta: float = 0.04
    """k3 KL coefficient against the reference, on each step's log-prob (train.yaml)."""
    epsilon: float = 0.2
    """PPO clip, low side (train.sh EPSILON)."""
    epsilon_high: float = 0.5
    """PPO clip, high side (train.sh EPSILON_HIGH)."""

    def validate(self):
        check(self.num_steps >= 1, "must be >= 1", "num_steps")
        check(1 <= self.steps_per_update <= self.num_steps, "must be within [1, num_steps]", "steps_per_update")
        check(self.lambda1 >= 0, "must be >= 0", "lambda1")
        check(self.beta >= 0, "must be >= 0", "beta")
        check(0 < self.epsilon < 1, "must be within (0, 1)", "epsilon")
        check(self.epsilon_high > 0, "must be > 0", "epsilon_high")


# The paper starts from LLaDA-8B-Instruct (train.sh MODEL_PATH): set model.path.
Config = recipe(
    EGSPO,
    # AdamW betas (0.9, 0.99), weight decay 0.1, grad-norm clip 0.2 (train.yaml; DeepSpeed's own clip is 1), lr 3e-5
    # constant (train.sh).
    train=TrainConfig(steps=1000, lr=3e-5, weight_decay=0.1, betas=(0.9, 0.99), max_grad_norm=0.2),
    # 8 processes (4 nodes x 2 GPUs) x 6 completions = 48 completions = 6 prompts of G = 8 a rollout batch (its one
    # cached rollout serves both accumulation micro-batches); a rollout serves K = 8 micro-batches, one chosen step
    # each: 4 optimizer steps of 2 steps. Rollout: 256 tokens, block 32, 128 steps, temperature 0.9.
    rl=RLConfig(
        prompts_per_step=6, group_size=8, num_iterations=4,
        decoding=DecodingConfig(gen_length=256, block_length=32, steps=128, temperature=0.9)))
