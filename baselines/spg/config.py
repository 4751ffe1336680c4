"""SPG defaults: `facebookresearch/SPG@a1c7120` `spg/slurm_scripts/train.yaml` and the GSM8K sbatch of the
mixture (`spg_mix/gsm_base_spg_mix_beta1.5.sbatch`), LLaDA-8B-Instruct, unless noted."""

from dataclasses import dataclass
from typing import Literal

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class SPG:
    negative: Literal["mix", "eubo", "elbo", "zero"] = "mix"
    """The likelihood of the completions with advantage <= 0: the mixture omega EUBO + (1 - omega) ELBO (the
    paper's best), the EUBO alone, the ELBO (ablation "SPG w/ ELBO") or nothing ("wo/ neg")."""
    beta: float = 1.5
    """Renyi order of the EUBO (GSM8K and MATH 1.5; EUBO runs: Countdown 2.0; Sudoku 1.0)."""
    omega: float = 0.5
    """Mixture weight of the EUBO."""
    num_t: int = 2
    """Monte Carlo draws per completion and update (`num_t`, the paper's m)."""
    min_t: float = 0.0
    max_t: float = 1.0
    """The masked share inside a draw's block: a count in [max(1, int(len min_t)), int(len max_t)]."""
    p_mask_prompt: float = 0.15
    """Each prompt token and each token of the clean blocks before a draw's block is masked with it."""
    masking: Literal["block_random", "random"] = "block_random"
    """block_random: SPG's block-wise masking (the rollout's blocks: `rl.decoding.block_length`, the model's
    block on block models); random: a uniform count of the whole response (the paper's ablation)."""

    def validate(self):
        check(self.beta > 0, "must be > 0", "beta")
        check(0 <= self.omega <= 1, "must be in [0, 1]", "omega")
        check(self.num_t >= 1, "must be >= 1", "num_t")
        check(0 <= self.min_t <= self.max_t <= 1, "need 0 <= min_t <= max_t <= 1", "min_t", "max_t")
        check(0 <= self.p_mask_prompt < 1, "must be within [0, 1)", "p_mask_prompt")


# The paper starts from LLaDA-8B-Instruct (LoRA r 128 / alpha 64 / dropout 0.05 on a 4-bit base): set
# model.path (and model.lora.* for the LoRA).
Config = recipe(
    SPG,
    # AdamW betas (0.9, 0.99), weight decay 0.1, grad-norm clip 0.2, lr 3e-6 constant; 6000 optimizer steps
    # on GSM8K (mu 4: 1500 rollout batches; MATH 4000 / Sudoku 2500 optimizer steps).
    train=TrainConfig(steps=1500, lr=3e-6, weight_decay=0.1, betas=(0.9, 0.99), max_grad_norm=0.2),
    # 8 GPUs x 6 completions x grad-acc 2 = 96 completions = 16 prompts x G = 6 per step, mu = 4 for every
    # task. Rollout: 256 tokens, block 32, 128 steps, temperature 0.9 (Sudoku 0.3).
    rl=RLConfig(
        prompts_per_step=16, group_size=6, num_iterations=4,
        decoding=DecodingConfig(gen_length=256, block_length=32, steps=128, temperature=0.9)))
