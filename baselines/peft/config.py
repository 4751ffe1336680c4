"""peft (LoRA SFT) defaults: d1's SFT stage (`d1:SFT/sft_train.py`; LLaDA-8B-Instruct on s1K)."""

from dataclasses import dataclass

from dare.config import LoraConfig, ModelConfig, TrainConfig, check, recipe


@dataclass
class PEFT:
    eps: float = 1e-3
    """t = (1 - eps) u + eps with u ~ U(0, 1) (d1's `dLLMDataCollator.forward_process`)."""
    response_length: int | None = None
    """Pad responses with EOS to this length (None: the batch's longest plus one EOS). d1 pads the
    whole sequence to 4096 tokens."""
    max_length: int | None = 4096
    """Cut prompt + response to this many tokens from the right (d1: the tokenizer's
    `truncation=True, max_length=4096` on the chat text); None: no limit."""

    def validate(self):
        check(0 < self.eps < 1, "must be within (0, 1)", "eps")
        check(self.max_length is None or self.max_length > 0, "must be > 0 or null", "max_length")
        check(self.response_length is None or self.response_length > 1, "must be > 1 or null", "response_length")


Config = recipe(
    PEFT,
    # LoRA r 128, alpha 256, dropout 0.05 (d1 targets q, k, v only: model.lora.targets='.*\.(q_proj|k_proj|v_proj)';
    # the default here is the family's declared targets, which include the MLP)
    model=ModelConfig(lora=LoraConfig(rank=128, alpha=256.0, dropout=0.05)),
    # lr 1e-5, weight decay 0.1, grad-norm 1.0; batch 1 per GPU x grad-acc 4 x 4 GPUs = 16; 20 epochs of s1K.
    # Schedule: d1 passes no lr_scheduler_type, so HF's default: linear decay to 0, no warmup.
    train=TrainConfig(
        steps=1250, batch_size=16, lr=1e-5, weight_decay=0.1, max_grad_norm=1.0, schedule="linear",
        min_lr_ratio=0.0, warmup_steps=0))
