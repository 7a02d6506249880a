"""LLaMA 2: a decoder-only transformer with RMSNorm, rotary embeddings and SwiGLU.

Token embedding (no position table: rotary embeddings rotate queries and keys instead),
``num_layers`` pre-norm blocks (causal self-attention and a SwiGLU MLP), a final RMSNorm and
an untied output head. No biases anywhere. Every head has its own keys and values (the 7B
and 13B models; grouped-query attention, used by 70B, is not modelled).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from . import layers as L
from .base import LanguageModel
from .configs import LLaMA2Config
from .layers import ParamSpec


class LLaMA2(LanguageModel):
    config_class = LLaMA2Config

    @property
    def ffn(self) -> int:
        # LLaMA's rule: 2/3 of 4*hidden (SwiGLU has three matrices, so this keeps the MLP's
        # parameter count at 8*h^2), rounded up to a multiple of 256; 11008 for hidden 4096.
        if self.config.ffn_dim:
            return self.config.ffn_dim
        f = int(2 * 4 * self.config.hidden / 3)
        return 256 * -(-f // 256)

    def param_specs(self) -> Any:
        c = self.config
        return {
            "tok_emb": ParamSpec((c.vocab_size, c.hidden), ("vocab", "embed")),
            "layers": L.stacked([{
                "attn_norm": L.rms_norm_spec(c.hidden),
                "attn": L.attention_spec(c.hidden, c.heads, bias=False),
                "mlp_norm": L.rms_norm_spec(c.hidden),
                "mlp": L.swiglu_spec(c.hidden, self.ffn),
            } for _ in range(c.num_layers)], c.scan_layers),
            "norm": L.rms_norm_spec(c.hidden),
            "lm_head": ParamSpec((c.hidden, c.vocab_size), ("embed", "vocab")),
        }

    def forward(self, params: Any, batch: dict) -> tuple[jax.Array, jax.Array]:
        c = self.config
        x = L.embed(params["tok_emb"], batch["tokens"], self.dtype)
        x, _ = L.run_layers(params["layers"], x, self.layer, c.scan_layers)
        x = L.rms_norm(params["norm"], x, c.norm_eps)
        return L.logits_from(x, params["lm_head"], tied=False), jnp.zeros((), jnp.float32)

    def layer(self, p: Any, x: jax.Array, aux: Any = None) -> tuple[jax.Array, Any]:
        c = self.config
        x = x + L.attention(p["attn"], L.rms_norm(p["attn_norm"], x, c.norm_eps), causal=True, rope_theta=c.rope_theta)
        return x + L.swiglu(p["mlp"], L.rms_norm(p["mlp_norm"], x, c.norm_eps)), aux

    def flops_per_step(self) -> float:
        """3 x forward matmul FLOPs:

            3 * (L * (8*T*h^2 + 4*T*s*h + 6*T*h*f) + 2*T*h*V),   T = batch * seq

        per layer the four attention projections, scores and weighted sum, and SwiGLU's three
        matrices; then the output head. Rotary embeddings and norms are elementwise.
        """
        c = self.config
        t = c.batch_size * c.seq_len
        layer = L.attention_flops(t, c.seq_len, c.hidden) + L.swiglu_flops(t, c.hidden, self.ffn)
        return float(3 * (c.num_layers * layer + L.logits_flops(t, c.hidden, c.vocab_size)))

    def paper_flops_per_step(self) -> float:
        """PaLM's model-FLOPs convention, 6*N*T + 12*L*T*s*h with N the matmul parameters
        (here it coincides with ``flops_per_step``)."""
        c = self.config
        t = c.batch_size * c.seq_len
        n = c.num_layers * (4 * c.hidden**2 + 3 * c.hidden * self.ffn) + c.hidden * c.vocab_size
        return float(6 * n * t + 12 * c.num_layers * t * c.seq_len * c.hidden)

