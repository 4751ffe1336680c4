"""SPG defaults: `facebookresearch/SPG@a1c7120` `spg/slurm_scripts/train.yaml` and the GSM8K sbatch of the
mixture (`spg_mix/gsm_base_spg_mix_beta1.5.sbatch`), LLaDA-8B-Instruct, unless noted."""

from dataclasses import dataclass
from typing import Literal

from dare.config import DecodingConfig, RLConfig, SandwichOptions, TrainConfig, recipe


@dataclass
class SPG(SandwichOptions):
    """SPG's sandwich (`dare.config.SandwichOptions`: negative, beta, omega, num_t, min_t, max_t, p_mask_prompt) at the
    paper's values: the mixture with Renyi order beta 1.5 (GSM8K and MATH; the EUBO runs: Countdown 2.0, Sudoku
    1.0), omega 0.5, num_t 2 draws; and its masking."""

    masking: Literal["block_random", "random"] = "block_random"
    """block_random: SPG's block-wise masking (the rollout's blocks: `rl.decoding.block_length`, the model's
    block on block models); random: a uniform count of the whole response (the paper's ablation)."""


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
