"""SDAR-MoE (JetLM/SDAR-30B-A3B-Chat/Sci): block diffusion on the Qwen3-MoE layout, with the
original config and parameter names (Qwen3-MoE's: `mlp.gate.weight` router,
`mlp.experts.{e}.{gate,up,down}_proj`; no shared expert). Everything but the MLP is `sdar.py`.

Sparse block (Qwen3-MoE): router logits in the activation dtype, softmax in float32, top-k,
renormalised when `norm_topk_prob`, cast back; each chosen expert's SwiGLU output is weighted
and accumulated in the activation dtype. A layer is sparse when it is not in `mlp_only_layers`
and `(layer_idx + 1) % decoder_sparse_step == 0`; otherwise it is a dense SwiGLU of
`intermediate_size`.

Deliberate differences from the original code: those of `sdar.py`, plus no load-balancing
aux loss in `forward` (`output_router_logits=True` returns the router logits for a trainer that
wants one).
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from dare.models.blocks import SoftmaxTopKMoE, SwiGLU
from dare.models.sdar import END_OF_TURN, LORA_TARGETS, MASK_TOKEN, SPECIAL_TOKENS, SDARConfig, SDARForCausalLM, tiny_common

__all__ = ["SDARMoeConfig", "SDARMoeForCausalLM", "LORA_TARGETS", "MASK_TOKEN", "SPECIAL_TOKENS", "END_OF_TURN"]


class SDARMoeConfig(SDARConfig):
    model_type = "sdar_moe"

    def __init__(
        self,
        hidden_size: int = 2048,
        intermediate_size: int = 6144,
        num_hidden_layers: int = 24,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 4,
        decoder_sparse_step: int = 1,
        moe_intermediate_size: int = 768,
        num_experts_per_tok: int = 8,
        num_experts: int = 128,
        norm_topk_prob: bool = False,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        mlp_only_layers: list[int] | None = None,
        **kwargs,
    ):
        self.decoder_sparse_step = decoder_sparse_step
        self.moe_intermediate_size = moe_intermediate_size
        self.num_experts_per_tok = num_experts_per_tok
        self.num_experts = num_experts
        self.norm_topk_prob = norm_topk_prob
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.mlp_only_layers = [] if mlp_only_layers is None else mlp_only_layers
        super().__init__(hidden_size=hidden_size, intermediate_size=intermediate_size,
                         num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, **kwargs)


class SDARMoeForCausalLM(SDARForCausalLM):
    config_class = SDARMoeConfig
    family = "sdar_moe"

    def mlp_for(self, layer_idx: int):
        c = self.config
        if layer_idx not in c.mlp_only_layers and c.num_experts > 0 and (layer_idx + 1) % c.decoder_sparse_step == 0:
            return SoftmaxTopKMoE(c.hidden_size, c.moe_intermediate_size, c.num_experts, c.num_experts_per_tok,
                                  c.norm_topk_prob)
        return SwiGLU(c.hidden_size, c.intermediate_size)


MODEL_CLASS = SDARMoeForCausalLM


# The headline released checkpoint and its config, for `dare models`.
RELEASED = ("JetLM/SDAR-30B-A3B-Chat", dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
    num_key_value_heads=4, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6, moe_intermediate_size=768,
    num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, bos_token_id=151643, eos_token_id=151643))

def scratch_config(scratch, tokenizer) -> SDARMoeConfig:
    """A small SDAR-MoE config: 8 experts, top-2, renormalised, every layer sparse, block size 4."""
    return SDARMoeConfig(**tiny_common(scratch, tokenizer), moe_intermediate_size=max(8, scratch.mlp_hidden_size // 4),
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                         architectures=["SDARMoeForCausalLM"])


AutoConfig.register("sdar_moe", SDARMoeConfig, exist_ok=True)
AutoModel.register(SDARMoeConfig, SDARMoeForCausalLM, exist_ok=True)
AutoModelForCausalLM.register(SDARMoeConfig, SDARMoeForCausalLM, exist_ok=True)
