"""BGPO defaults: the paper (arXiv 2510.11683, §4.1 and Table 5; its code THU-KEG/BGPO could not be read here)
and DARE's recipe `recipe/llada/run_bgpo_llada_8b_instruct.sh` (yjyddq/DARE@83ae8a3) where the paper is silent
(LLaDA-8B-Instruct, math), unless noted."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class BGPO:
    n_t: int = 16
    """Monte Carlo draws of the ELBO per completion (the paper: 16; Sudoku 32)."""
    memory_bounded: bool = True
    """Backpropagate one draw at a time (memory constant in n_t; the paper's point); false keeps every draw's graph."""

    def validate(self):
        check(self.n_t >= 1, "must be >= 1", "n_t")


# The paper fully fine-tunes LLaDA-8B-Instruct (VeRL, 8 x H800): set model.path.
Config = recipe(
    BGPO,
    # lr 5e-7, weight decay 0.01 (DARE's recipe; AdamW (0.9, 0.999) and clip 1.0 are VeRL's defaults); math 700 steps
    train=TrainConfig(steps=700, lr=5e-7, weight_decay=0.01, betas=(0.9, 0.999), max_grad_norm=1.0),
    # 16 prompts x G = 8, one update per batch (on-policy: mini-batch = batch 16); math rollouts of 512 tokens, block
    # 32, 256 steps; temperature 0.6 (DARE's recipe; the paper's is not stated).
    rl=RLConfig(
        prompts_per_step=16, group_size=8, num_iterations=1,
        decoding=DecodingConfig(gen_length=512, block_length=32, steps=256, temperature=0.6)))
