"""d-TreeRPO defaults: `THU-BPM/d-TreeRPO` @3eb6f21, `dtreerpo/slurm_scripts/dtreerpo.yaml` (used by all
eight run scripts; LLaDA-8B-Instruct), `accelerate.yaml` (8 processes) and the trainer's `getattr`
defaults for the self-distillation, unless noted."""

from dataclasses import dataclass

from dare.config import DecodingConfig, LoraConfig, MaskedOptions, ModelConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class DTreeRPO:
    epsilon: float = 0.4
    """PPO clip range, both sides (dtreerpo.yaml epsilon)."""
    beta: float = 0.01
    """k3 KL coefficient against the reference model (dtreerpo.yaml beta)."""
    sd_lambda_max: float = 3e-3
    """Self-distillation weight at the end of training (lambda_max)."""
    sd_gamma: float = 2.0
    """Growth rate of the weight: lambda(t) = lambda_max (e^{gamma t} - 1) / (e^gamma - 1)."""
    sd_tau_max: float = 2.0
    """Softmax temperature of the positive siblings' advantages at the start: tau(t) = tau_max (1 - t)^power."""
    sd_tau_power: float = 0.7

    def validate(self):
        check(self.epsilon > 0, "must be > 0", "epsilon")
        check(self.beta >= 0, "must be >= 0", "beta")
        check(self.sd_lambda_max >= 0, "must be >= 0 (0: no self-distillation)", "sd_lambda_max")
        check(self.sd_gamma > 0, "must be > 0", "sd_gamma")
        check(self.sd_tau_max > 0, "must be > 0", "sd_tau_max")
        check(self.sd_tau_power >= 0, "must be >= 0", "sd_tau_power")


Config = recipe(
    DTreeRPO,
    # LoRA r 128, alpha 64, dropout 0.05 (the run scripts; the 4-bit NF4 base is not supported here). The paper
    # starts from LLaDA-8B-Instruct: set model.path.
    model=ModelConfig(lora=LoraConfig(rank=128, alpha=64.0, dropout=0.05)),
    # lr 3e-5 constant with warmup ratio 1e-4, AdamW (0.9, 0.99), weight decay 0.1, grad-norm clip 0.2;
    # max_steps 30,000 optimizer steps, one tree search per 5 parents x mu 12 = 60 of them: 500 tree steps.
    train=TrainConfig(steps=500, lr=3e-5, warmup_ratio=1e-4, weight_decay=0.1, betas=(0.9, 0.99), max_grad_norm=0.2),
    # 8 processes x 4 tree rows = 32 prompts per tree search, 4 x 4 = 16 leaves each (num_tree_samples 4,
    # tree_branch_factor 4, tree_contraction_factor 2 levels), mu = 12. Rollout: LLaDA's sampler, 256 tokens,
    # block 32, 128 steps, low-confidence remasking, temperature 0.9 (the config's default).
    rl=RLConfig(
        prompts_per_step=32, group_size=16, num_iterations=12,
        decoding=DecodingConfig(sampler="masked", gen_length=256, block_length=32, steps=128, temperature=0.9,
                                tree=(4, 4), masked=MaskedOptions(cache="none"))))
