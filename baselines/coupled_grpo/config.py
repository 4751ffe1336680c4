"""coupled-GRPO defaults: DiffuCoder `recipes/config_coupled_code.yaml` (DiffuCoder-7B-Instruct,
AceCode-89K hard split), unless noted."""

from dataclasses import dataclass
from typing import Literal

from dare.config import DecodingConfig, DreamOptions, ModelConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class CoupledGRPO:
    t_min: float = 0.2
    t_max: float = 0.8
    """The coupled pair's mask ratio t ~ U(t_min, t_max), drawn per estimate (code)."""
    baseline: Literal["mean", "loo"] = "mean"
    """Advantage baseline: the paper's headline row uses the group mean; the code hard-codes
    leave-one-out (`loo`)."""
    beta: float = 0.01
    """k3 KL coefficient against the reference (moved towards the policy every 64 optimizer steps: `train.reference_sync_every`)."""
    epsilon: float = 0.5
    """PPO clip range (epsilon_low = epsilon_high = 0.5)."""

    def validate(self):
        check(0 < self.t_min <= self.t_max < 1, "need 0 < t_min <= t_max < 1", "t_min", "t_max")
        check(self.beta >= 0, "must be >= 0", "beta")
        check(self.epsilon > 0, "must be > 0", "epsilon")


# The demo task by default (offline); the paper trains on AceCode-89K (not in the task registry;
# reproductions/coupled_grpo/ uses MBPP's train split as the closest registered code task).
Config = recipe(
    CoupledGRPO,
    # DiffuCoder-7B-Instruct is a Dream-architecture model: set model.path.
    model=ModelConfig(family="dream"),
    # lr 1e-6 cosine to 0.1x (min_lr_rate 0.1), AdamW (0.9, 0.99), weight decay 0.1, grad-norm 0.2;
    # gradient checkpointing; full fine-tuning in bf16. The reference is updated TR-DPO style
    # (`sync_ref_model: True`, `ref_model_sync_steps: 64`, TRL's default `ref_model_mixup_alpha` 0.6):
    # every 64 optimizer steps ref <- 0.4 ref + 0.6 policy.
    train=TrainConfig(
        steps=1000, lr=1e-6, weight_decay=0.1, betas=(0.9, 0.99), max_grad_norm=0.2, schedule="cosine",
        min_lr_ratio=0.1, gradient_checkpointing=True, reference_sync_every=64, reference_mix=0.6),
    # 8 GPUs x 5 per device x grad-acc 2 = 80 completions = 8 prompts x G = 10; mu = 2. Rollout: Dream's
    # diffusion_generate, alg entropy, 256 tokens in 256 steps, temperature 1.0, top_p 0.95.
    rl=RLConfig(
        prompts_per_step=8, group_size=10, num_iterations=2,
        decoding=DecodingConfig(sampler="dream", gen_length=256, block_length=256, steps=256, temperature=1.0,
                                dream=DreamOptions(alg="entropy", top_p=0.95))))
