"""MDPO defaults: the README's training command (autonomousvision/mdpo @e6ae439; LLaDA-8B-Instruct,
OpenR1-Math), `recipes/LLaDA-Instruct/mdpo/config_demo.yaml` and `MDPOConfig` where the command is
silent, unless noted."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class MDPO:
    train_steps: int = 8
    """K: the decoding steps trained per rollout, those with the largest |advantage| (sample_train_steps)."""
    epsilon: float = 0.2
    """PPO clip range (MDPOConfig.epsilon)."""
    beta: float = 0.02
    """k2 KL coefficient against the reference model (README command; config_demo.yaml has 0)."""

    def validate(self):
        check(self.train_steps >= 1, "must be >= 1", "train_steps")
        check(self.epsilon > 0, "must be > 0", "epsilon")
        check(self.beta >= 0, "must be >= 0", "beta")


# The paper trains LLaDA-8B-Instruct, fully fine-tuned: set model.path.
Config = recipe(
    MDPO,
    # lr 7e-7 constant (config_demo.yaml: lr_scheduler_type constant), AdamW (MDPOConfig/TRL defaults:
    # 0.9, 0.999, weight decay 0), grad-norm clip 1.0 (TrainingArguments' default).
    train=TrainConfig(steps=1000, lr=7e-7, weight_decay=0.0, betas=(0.9, 0.999), max_grad_norm=1.0),
    # N GPUs, one completion each, num_generations = N (8 here): a group per prompt; grad-acc 16 over
    # (completion, trained step) micro-batches with 8 trained steps each = 2 prompts per optimizer step; mu = 1.
    # Rollout: MDPO's sampler, temperature 0.4, 512 tokens in one block (pure diffusion), 128 steps, no RCR.
    rl=RLConfig(
        prompts_per_step=2, group_size=8, num_iterations=1,
        decoding=DecodingConfig(sampler="maskgit", gen_length=512, block_length=512, steps=128, temperature=0.4)))
