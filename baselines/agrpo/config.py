"""AGRPO defaults: `probablyabot/agrpo` @98f1182, `train.yaml` (LLaDA-8B-Instruct, GSM8K) and
`accelerate.yaml` (8 processes), unless noted."""

from dataclasses import dataclass
from typing import Literal

from dare.config import DecodingConfig, LoraConfig, ModelConfig, RLConfig, TrainConfig, TruncatedOptions, check, recipe


@dataclass
class AGRPO:
    mc_samples: int = 24
    """M: decoding steps scored per completion (train.yaml mc_samples)."""
    low_discrepancy: bool = True
    """Spread the M x B uniforms over strata (train.yaml low_discrepancy)."""
    importance_sampling: Literal["entropy", "uniform"] = "entropy"
    """Draw steps in proportion to their tokens' summed sampling entropy, reweighted to stay unbiased
    (train.yaml importance_sampling: entropy); uniform: every step up to the last non-EOS one alike."""
    epsilon: float = 0.2
    """PPO clip range, both sides (train.yaml epsilon; TRL's epsilon_high defaults to it)."""
    beta: float = 0.0
    """k3 KL coefficient against the reference model (train.yaml beta: 0, no reference pass)."""

    def validate(self):
        check(self.mc_samples >= 1, "must be >= 1", "mc_samples")
        check(self.importance_sampling in ("entropy", "uniform"), "must be 'entropy' or 'uniform'",
              "importance_sampling")
        check(self.epsilon > 0, "must be > 0", "epsilon")
        check(self.beta >= 0, "must be >= 0", "beta")


Config = recipe(
    AGRPO,
    # LoRA r 64, alpha 64, no dropout (train.yaml; its targets also match LLaDA's output head `ff_out`: here
    # the family's declared targets, never the head). The paper starts from LLaDA-8B-Instruct: set model.path.
    model=ModelConfig(lora=LoraConfig(rank=64, alpha=64.0)),
    # lr 5e-6, cosine with warmup ratio 0.01, AdamW (0.9, 0.99), weight decay
    # 0.01, grad-norm clip 1.0; 5 epochs of GSM8K's 7,473 prompts at 16 per step = 2,335 steps.
    train=TrainConfig(
        steps=2335, lr=5e-6, schedule="cosine", warmup_ratio=0.01, weight_decay=0.01, betas=(0.9, 0.99),
        max_grad_norm=1.0),
    # 8 processes x 8 completions x grad-acc 2 = 16 prompts x G = 8 per step, one update each (mu = 1).
    # Rollout: AGRPO's sampler, temperature 0.6, top-p 0.99, top-k 150, 384 tokens in blocks of 12,
    # 128 steps (3 tokens per step), random unmasking.
    rl=RLConfig(
        prompts_per_step=16, group_size=8, num_iterations=1,
        decoding=DecodingConfig(sampler="truncated", gen_length=384, block_length=12, steps=128, temperature=0.6,
                                truncated=TruncatedOptions(top_p=0.99, top_k=150, remasking="random"))))
