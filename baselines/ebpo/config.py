"""EBPO defaults: the LLaDA2.1 report (arXiv 2602.08676, §3.2) gives the objective only; the rest is DARE's
recipe `recipe/llada2_mini/run_ebpo_llada2_mini.sh` (yjyddq/DARE@83ae8a3; LLaDA2.x-mini, math)."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class EBPO:
    n_t: int = 16
    """Composite draws (the report's N timesteps, w_n = 1 / N; DARE's mc_num)."""
    eps_low: float = 0.2
    eps_high: float = 0.2
    """Clip range of the sequence ratio (the report names eps_low, eps_high; values: VeRL's 0.2)."""
    memory_bounded: bool = True
    """Backpropagate one composite draw at a time (DARE replays one draw at a time too)."""

    def validate(self):
        check(self.n_t >= 1, "must be >= 1", "n_t")
        check(0 < self.eps_low < 1, "must be in (0, 1)", "eps_low")
        check(self.eps_high > 0, "must be > 0", "eps_high")


# A block-diffusion model (LLaDA2.x, SDAR): set model.path.
Config = recipe(
    EBPO,
    # lr 5e-7 (DARE's recipe; AdamW (0.9, 0.999), clip 1.0: VeRL's defaults), one epoch of the data.
    train=TrainConfig(steps=1000, lr=5e-7, betas=(0.9, 0.999), max_grad_norm=1.0),
    # 16 prompts x G = 8, one update per batch; rollouts of 2,048 tokens with the model's blocks, 16 steps per
    # block (num_diffusion_steps = length / 2 over blocks of 32), temperature 0.6.
    rl=RLConfig(
        prompts_per_step=16, group_size=8, num_iterations=1,
        decoding=DecodingConfig(gen_length=2048, block_length=32, steps=16, temperature=0.6)))
