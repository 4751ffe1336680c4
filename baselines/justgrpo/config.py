"""JustGRPO defaults: `LeapLabTHU/JustGRPO@eebe50e` `train.py` (its argparse defaults, the same in the
first commit) and `grpo.py` (LLaDA-8B-Instruct, GSM8K), unless noted."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class JustGRPO:
    epsilon: float = 0.2
    """PPO clip range (`logprob_loss(eps=0.2)`); inert at mu = 1, where the ratio is exactly 1."""
    temperature: float = 1.0
    """The learner divides the logits by it before the log-softmax (`logprob_loss(temperature=1.)`)."""

    def validate(self):
        check(self.epsilon > 0, "must be > 0", "epsilon")
        check(self.temperature > 0, "must be > 0", "temperature")


# The paper trains LLaDA-8B-Instruct (full fine-tuning, bf16 autocast, FSDP): set model.path.
Config = recipe(
    JustGRPO,
    # AdamW lr 5e-6, betas (0.9, 0.999), eps 1e-8, no weight decay, constant lr, grad-norm clip 1.0; 125 steps.
    train=TrainConfig(steps=125, lr=5e-6, weight_decay=0.0, betas=(0.9, 0.999), max_grad_norm=1.0),
    # 8 GPUs x 1 prompt x grad-acc 8 = 64 prompts per optimizer step, 16 completions each (8 generations x
    # 2 repeats), one update per rollout batch. Rollouts in AR order: block 1, as many steps as tokens
    # (256), temperature 1.0 (the sampler's default, never overridden).
    rl=RLConfig(
        prompts_per_step=64, group_size=16, num_iterations=1,
        decoding=DecodingConfig(gen_length=256, block_length=1, steps=256, temperature=1.0)))
