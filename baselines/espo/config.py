"""ESPO defaults: `ML-GSAI/ESPO@b5f2dac` `recipes/train.yaml` and `recipes/run_gsm8k_llada.sh` (LLaDA-8B-Instruct,
GSM8K), unless noted."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class ESPO:
    num_mc: int = 2
    """Coupled pairs (a mask and its complement) per ELBO estimate: 4 forwards (every task script: 2)."""
    beta: float = 1e-3
    """k2 KL coefficient on the raw ELBO, divided by the generation length (math 1e-3, countdown 3e-3,
    sudoku and code 1e-2)."""
    epsilon: float = 0.2
    """Clip range of the sequence ratio (countdown: 0)."""

    def validate(self):
        check(self.num_mc >= 1, "must be >= 1", "num_mc")
        check(self.beta >= 0, "must be >= 0", "beta")
        check(self.epsilon >= 0, "must be >= 0", "epsilon")


# ESPO trains LoRA r 128 / alpha 64 / dropout 0.05 on a bfloat16 LLaDA-8B-Instruct: set model.path and model.lora.
Config = recipe(
    ESPO,
    # AdamW (0.9, 0.99), weight decay 0.01, grad-norm clip 0.2, lr 3e-6 constant (warmup ratio 0.001); one epoch of
    # GSM8K's 7,473 problems at 16 prompts per step.
    train=TrainConfig(steps=467, lr=3e-6, weight_decay=0.01, betas=(0.9, 0.99), max_grad_norm=0.2),
    # 8 GPUs x 3 completions x grad-acc 4 = 96 completions = 16 prompts x G = 6 per step, mu = 8; rollouts of 256
    # tokens, block 32, 256 steps (one token per step), temperature 1.0.
    rl=RLConfig(
        prompts_per_step=16, group_size=6, num_iterations=8,
        decoding=DecodingConfig(gen_length=256, block_length=32, steps=256, temperature=1.0)))
