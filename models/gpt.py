"""GPT: a decoder-only transformer (GPT-2 / Megatron layout).

Token + learned position embeddings, ``num_layers`` pre-LN blocks (causal self-attention and a
GELU MLP, each with a residual), a final LayerNorm, and logits from the token embedding (tied).
Layers are an unrolled Python loop so every layer appears in the traced program, or with
``model.scan_layers=true`` stacked and run by ``jax.lax.scan`` (``layers.stacked``).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from . import layers as L
from .base import LanguageModel
from .configs import GPTConfig
from .layers import ParamSpec


class GPT(LanguageModel):
    config_class = GPTConfig

    def param_specs(self) -> Any:
        c = self.config
        # GPT-2 scales the residual projections by 1/sqrt(2 * layers) so the residual stream's
        # variance does not grow with depth.
        out_std = L.INIT_STD / math.sqrt(2 * c.num_layers)
        return {
            "wte": ParamSpec((c.vocab_size, c.hidden), ("vocab", "embed")),
            "wpe": ParamSpec((c.seq_len, c.hidden), (None, "embed"), std=0.01),
            "layers": L.stacked([{
                "ln1": L.layer_norm_spec(c.hidden),
                "attn": L.attention_spec(c.hidden, c.heads, bias=True, out_std=out_std),
                "ln2": L.layer_norm_spec(c.hidden),
                "mlp": L.mlp_spec(c.hidden, self.ffn, bias=True, out_std=out_std),
            } for _ in range(c.num_layers)], c.scan_layers),
            "ln_f": L.layer_norm_spec(c.hidden),
        }

    def forward(self, params: Any, batch: dict) -> tuple[jax.Array, jax.Array]:
        x = L.embed(params["wte"], batch["tokens"], self.dtype) + params["wpe"].astype(self.dtype)
        x, _ = L.run_layers(params["layers"], x, self.layer, self.config.scan_layers)
        x = L.layer_norm(params["ln_f"], x)
        return L.logits_from(x, params["wte"], tied=True), jnp.zeros((), jnp.float32)

    def layer(self, p: Any, x: jax.Array, aux: Any = None) -> tuple[jax.Array, Any]:
        x = x + L.attention(p["attn"], L.layer_norm(p["ln1"], x), causal=True)
        return x + L.mlp(p["mlp"], L.layer_norm(p["ln2"], x)), aux

    def flops_per_step(self) -> float:
        """3 x forward matmul FLOPs (the backward pass computes two products per forward one):

            3 * (L * (8*T*h^2 + 4*T*s*h + 4*T*h*f) + 2*T*h*V),   T = batch * seq

        i.e. per layer Q/K/V/output projections, attention scores and weighted sum, and the
        two MLP matrices; then the (tied) vocabulary projection. With f = 4h this is Alpa's
        ``72*B*s*L*h^2 * (1 + s/(6h)) + 6*B*s*h*V``. The embedding lookup is a gather, not a
        matmul, and is not counted.
        """
        c = self.config
        t = c.batch_size * c.seq_len
        layer = L.attention_flops(t, c.seq_len, c.hidden) + L.mlp_flops(t, c.hidden, self.ffn)
        return float(3 * (c.num_layers * layer + L.logits_flops(t, c.hidden, c.vocab_size)))

    def paper_flops_per_step(self) -> float:
        """The CFP paper's TFLOP_COUNT for GPT: 72*B*s*L*h^2 (Alpa's formula without the
        attention-score and vocabulary terms; 59.37e12 for config F at batch 24)."""
        c = self.config
        return float(72 * c.batch_size * c.seq_len * c.num_layers * c.hidden**2)
