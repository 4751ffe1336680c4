"""GDPO defaults: `KevinRojas1499/GDPO@1918683` `gdpo/slurm_scripts/train.yaml`, `countdown_base.sbatch` and
`gdpo_config.py` (LLaDA-8B-Instruct), unless noted."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class GDPO:
    nodes: int = 3
    """Gauss-Legendre nodes of the semi-deterministic ELBO (the shipped sbatch: gauss-3; the config default: gauss-2)."""
    beta: float = 0.0
    """k3 KL coefficient on the raw sequence ELBO (train.yaml: 0; the config default 0.04)."""
    epsilon: float = 0.5
    """Clip range of the sequence ratio."""

    def validate(self):
        check(self.nodes in (1, 2, 3), "must be 1, 2 or 3", "nodes")
        check(self.beta >= 0, "must be >= 0", "beta")
        check(self.epsilon > 0, "must be > 0", "epsilon")


# GDPO trains LoRA r 128 / alpha 64 / dropout 0.05 on a 4-bit LLaDA-8B-Instruct: set model.path and model.lora.
Config = recipe(
    GDPO,
    # AdamW (0.9, 0.99), weight decay 0.1, grad-norm clip 0.2, lr 3e-7 constant (warmup ratio 1e-4); 15,000 optimizer
    # steps = 1,250 rollout batches of mu = 12.
    train=TrainConfig(steps=1250, lr=3e-7, weight_decay=0.1, betas=(0.9, 0.99), max_grad_norm=0.2),
    # one process x 6 completions x grad-acc 2 = 12 completions = 2 prompts x G = 6 per step (its accelerate config
    # launches one process), mu = 12; rollouts of 256 tokens, block 32, 128 steps, temperature 0.9.
    rl=RLConfig(
        prompts_per_step=2, group_size=6, num_iterations=12,
        decoding=DecodingConfig(gen_length=256, block_length=32, steps=128, temperature=0.9)))
