"""BERT: an encoder-only transformer trained with a masked-language-model loss.

Token + learned position embeddings and an embedding LayerNorm, ``num_layers`` post-LN blocks
(bidirectional self-attention and a GELU MLP, LayerNorm after each residual), and the MLM head:
dense + GELU + LayerNorm, then logits from the token embedding (tied) plus an output bias. The
loss is the cross-entropy at the masked positions only. Next-sentence prediction and token-type
embeddings are left out (as in RoBERTa): the synthetic data has no sentence pairs.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from . import data
from . import layers as L
from .base import LanguageModel
from .configs import BERTConfig
from .layers import ParamSpec

LN_EPS = 1e-12  # BERT's LayerNorm epsilon


class BERT(LanguageModel):
    config_class = BERTConfig
    causal = False

    def param_specs(self) -> Any:
        c = self.config
        return {
            "wte": ParamSpec((c.vocab_size, c.hidden), ("vocab", "embed")),
            "wpe": ParamSpec((c.seq_len, c.hidden), (None, "embed")),
            "ln_emb": L.layer_norm_spec(c.hidden),
            "layers": L.stacked([{
                "attn": L.attention_spec(c.hidden, c.heads, bias=True),
                "ln1": L.layer_norm_spec(c.hidden),
                "mlp": L.mlp_spec(c.hidden, self.ffn, bias=True),
                "ln2": L.layer_norm_spec(c.hidden),
            } for _ in range(c.num_layers)], c.scan_layers),
            "head": {
                "dense": ParamSpec((c.hidden, c.hidden), ("embed", None)),
                "dense_bias": ParamSpec((c.hidden,), (None,), "zeros"),
                "ln": L.layer_norm_spec(c.hidden),
                "bias": ParamSpec((c.vocab_size,), ("vocab",), "zeros"),
            },
        }

    def forward(self, params: Any, batch: dict) -> tuple[jax.Array, jax.Array]:
        x = L.embed(params["wte"], batch["tokens"], self.dtype) + params["wpe"].astype(self.dtype)
        x = L.layer_norm(params["ln_emb"], x, LN_EPS)
        x, _ = L.run_layers(params["layers"], x, self.layer, self.config.scan_layers)
        h = params["head"]
        x = jnp.einsum("bse,ef->bsf", x, h["dense"].astype(self.dtype)) + h["dense_bias"].astype(self.dtype)
        x = L.layer_norm(h["ln"], jax.nn.gelu(x), LN_EPS)
        logits = L.logits_from(x, params["wte"], tied=True) + h["bias"].astype(self.dtype)
        return logits, jnp.zeros((), jnp.float32)

    def layer(self, p: Any, x: jax.Array, aux: Any = None) -> tuple[jax.Array, Any]:
        x = L.layer_norm(p["ln1"], x + L.attention(p["attn"], x, causal=False), LN_EPS)
        return L.layer_norm(p["ln2"], x + L.mlp(p["mlp"], x), LN_EPS), aux

    def make_batch(self, rng: jax.Array) -> dict[str, jax.Array]:
        c = self.config
        return data.masked_lm_batch(rng, c.batch_size, c.seq_len, c.vocab_size, c.mask_prob)

    def batch_axes(self) -> dict:
        return {"tokens": ("batch", "seq"), "targets": ("batch", "seq"), "weights": ("batch", "seq")}

    def flops_per_step(self) -> float:
        """3 x forward matmul FLOPs:

            3 * (L * (8*T*h^2 + 4*T*s*h + 4*T*h*f) + 2*T*h^2 + 2*T*h*V),   T = batch * seq

        the encoder layers as in GPT (no causal mask, same work), then the MLM head's dense
        layer and the vocabulary projection. Logits are computed at every position (static
        shapes; the loss weights pick the masked ones), so the head is counted over all T.
        """
        c = self.config
        t = c.batch_size * c.seq_len
        layer = L.attention_flops(t, c.seq_len, c.hidden) + L.mlp_flops(t, c.hidden, self.ffn)
        head = 2 * t * c.hidden**2 + L.logits_flops(t, c.hidden, c.vocab_size)
        return float(3 * (c.num_layers * layer + head))

    def paper_flops_per_step(self) -> float:
        """PaLM's model-FLOPs convention, 6*N*T + 12*L*T*s*h with N the matmul parameters
        (here it coincides with ``flops_per_step``)."""
        c = self.config
        t = c.batch_size * c.seq_len
        n = c.num_layers * (4 * c.hidden**2 + 2 * c.hidden * self.ffn) + c.hidden**2 + c.hidden * c.vocab_size
        return float(6 * n * t + 12 * c.num_layers * t * c.seq_len * c.hidden)

