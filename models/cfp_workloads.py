"""The CFP paper's workloads: the layer stacks its artifact benchmarks, as models of ours.

CFP's artifact (public repository ``huwf1220/ptp_parallel``, folder ``cfp_test/``, commit
6474c68; later commits rename it ``ptp_test/``) does not train the language models our ``gpt``,
``llama2`` and ``moe`` are. It trains stacks of transformer layers on given hidden states, with no
embedding and no output head, each with a loss of its own:

- ``CFPGPT`` (``cfp_test/gpt/gpt_seg_profiling_test.py``, config F): Alpa's BERT layers
  (``alpa/model/bert_model.py: FlaxBertLayerCollection``, as modified for CFP): one fused QKV
  projection of width 3 * hidden whose columns are read as (heads, head_dim, 3) and split into
  query, value and key; bidirectional attention (the mask is all ones); an output projection and
  a LayerNorm after the residual (post-LN, epsilon 1e-12); a GELU MLP of 4 * hidden, again
  post-LN. Loss: mean squared error of the last hidden states against labels.
- ``CFPMoE`` (``cfp_test/moe/moe_seg_profling_test.py``, config E): Alpa's
  ``FlaxMoELayerCollection`` (``alpa/model/moe.py``): layers 0, 2, 4, ... are the attention above
  followed by a GShard expert layer (router, dispatch, experts as one batched ReLU FFN of
  4 * hidden, combine; post-LN), the other layers are the BERT layers above. The artifact routes
  with ``top2_gating_dummy``, not with ``top2_gating``: every token goes to every one of the
  C = 2S/E slots of every expert, weighted by its gate probability, so dispatch and combine do
  GShard's work at full capacity, with gradients through both. ``gating="top2"`` routes as GShard
  does instead (``models.moe.top2_gating``). Loss: mean squared error, as for GPT.
- ``CFPLLaMA`` (``cfp_test/llama2/llama_seg_profiling_test.py`` and its ``llama_2_jax``): LLaMA 2
  7B decoder blocks (pre-RMSNorm with epsilon 1e-6, rotary embeddings, causal attention, SwiGLU
  of 11008, no biases) on sequences of 128 (the artifact reuses d_k = 128 as the length), no
  final norm. Loss: softmax cross-entropy of the last hidden states read as logits over the
  hidden dimension, against integer labels.

What differs, and why. Shapes and operators are the artifact's; its data is not: it feeds
``jnp.ones`` as inputs and labels (and masks the whole LLaMA loss away, which makes it NaN), ours
is synthetic with a signal (below). Dropout is left out: the GPT and MoE runs are deterministic,
and LLaMA's dropout (rate 0.1) is element-wise work on a key our training step does not carry.
The optimizer is the training step's own AdamW (``models/step.py``) instead of the artifact's
Adam or AdamW at 1e-2: element-wise work either way. The attention scale is applied to the
scores instead of to the queries, and the BERT MLP's GELU is tanh-approximated (``L.mlp``) where
Alpa's is exact: element-wise too.

The artifact's FLOP count (``TFLOP_COUNT``, XLA's dot FLOPs of the step's HLO) is what
``flops_per_step`` counts: 59.37e12 for config F at batch 24 and 2 layers, 52.99e12 for the MoE
at batch 64 and 4 layers, the numbers its README prints.

Inputs are (batch, seq, hidden) standard normal hidden states from the batch key, not the
artifact's ones: a tensor of ones looks the same however it is split, which would hide a wrong
layout. GPT and MoE learn to map each position's input to itself with the hidden dimension
reversed (a fixed feature permutation); LLaMA keeps the artifact's labels, class 1 at every
position (an input-dependent class, read off the hidden states by cross-entropy, is learnt too
slowly through gated MLPs and causal averages to show within a few steps; the constant one is
learnt within ten at the artifact's learning rate of 1e-2).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from . import layers as L
from . import rng
from .base import SpecModel, cross_entropy
from .configs import CFPGPTConfig, CFPLLaMAConfig, CFPMoEConfig
from .layers import ParamSpec
from .moe import top2_gating
from .sharding import constrain

BERT_LN_EPS = 1e-12  # Alpa's BertConfig.layer_norm_eps, which the GPT and MoE stacks keep


class LayerStack(SpecModel):
    """The model protocol for a stack of layers that maps hidden states to hidden states."""

    @property
    def tokens(self) -> int:
        return self.config.batch_size * self.config.seq_len

    # --- what a subclass provides (and param_specs) -----------------------------------------

    def forward(self, params: Any, x: jax.Array) -> jax.Array:
        """The last layer's hidden states (batch, seq, hidden) from the inputs x."""
        raise NotImplementedError

    # --- the rest of the protocol -----------------------------------------------------------

    def make_batch(self, key: jax.Array) -> dict[str, jax.Array]:
        c = self.config
        x = rng.normal(key, (c.batch_size, c.seq_len, c.hidden))
        return {"inputs": x, "targets": jnp.flip(x, axis=-1)}

    def batch_axes(self) -> dict:
        return {"inputs": ("batch", "seq", "embed"), "targets": ("batch", "seq", "embed")}

    def loss(self, params: Any, batch: dict) -> jax.Array:
        """The artifact's loss for GPT and MoE: mean squared error over every element."""
        y = self.forward(params, constrain(batch["inputs"].astype(self.dtype), ("batch", "seq", "embed")))
        return jnp.mean(jnp.square(y.astype(jnp.float32) - batch["targets"]))

    def paper_flops_per_step(self) -> float:
        """CFP's TFLOP_COUNT: XLA's count of dot FLOPs in the step's HLO
        (``hlo_module_count_flop_dot_conv_only``), which is what ``flops_per_step`` counts."""
        return self.flops_per_step()


# ---------------------------------------------------------------------------------------------
# Alpa's BERT layer, as CFP's GPT and MoE stacks use it


def fused_attention_spec(hidden: int, heads: int) -> dict:
    """One (hidden, 3 * hidden) projection whose columns are (heads, head_dim, 3), as Alpa's
    ``qvk_combined`` Dense reshaped to (..., -1, 3); an output projection; both with biases."""
    d = hidden // heads
    return {
        "w_qkv": ParamSpec((hidden, heads, d, 3), ("embed", "heads", "kv", None)),
        "b_qkv": ParamSpec((heads, d, 3), ("heads", "kv", None), "zeros"),
        "wo": ParamSpec((heads, d, hidden), ("heads", "kv", "embed")),
        "bo": ParamSpec((hidden,), ("embed",), "zeros"),
    }


def fused_attention(p: dict, x: jax.Array) -> jax.Array:
    """Bidirectional multi-head self-attention over x: (batch, seq, embed), before the residual."""
    dtype = x.dtype
    qkv = jnp.einsum("bse,ehdt->bshdt", x, p["w_qkv"].astype(dtype)) + p["b_qkv"].astype(dtype)
    qkv = constrain(qkv, ("batch", "seq", "heads", "kv", None))
    # Alpa's split order along the last axis: query, value, key.
    q, v, k = qkv[..., 0], qkv[..., 1], qkv[..., 2]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / math.sqrt(q.shape[-1])
    scores = constrain(scores, ("batch", "heads", "seq", None))
    probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
    out = constrain(jnp.einsum("bhqk,bkhd->bqhd", probs, v), ("batch", "seq", "heads", "kv"))
    y = jnp.einsum("bshd,hde->bse", out, p["wo"].astype(dtype)) + p["bo"].astype(dtype)
    return constrain(y, ("batch", "seq", "embed"))


def post_ln_attention_spec(hidden: int, heads: int) -> dict:
    return {"attn": fused_attention_spec(hidden, heads), "ln_attn": L.layer_norm_spec(hidden)}


def post_ln_attention(p: dict, x: jax.Array) -> jax.Array:
    """Alpa's FlaxBertAttention: LayerNorm(attention(x) + x)."""
    return L.layer_norm(p["ln_attn"], fused_attention(p["attn"], x) + x, BERT_LN_EPS)


def bert_layer_spec(hidden: int, heads: int, ffn: int) -> dict:
    return {**post_ln_attention_spec(hidden, heads), "mlp": L.mlp_spec(hidden, ffn, bias=True),
            "ln_mlp": L.layer_norm_spec(hidden)}


def bert_layer(p: dict, x: jax.Array) -> jax.Array:
    """Alpa's FlaxBertLayer: post-LN attention, then LayerNorm(mlp(a) + a)."""
    a = post_ln_attention(p, x)
    return L.layer_norm(p["ln_mlp"], L.mlp(p["mlp"], a) + a, BERT_LN_EPS)


# ---------------------------------------------------------------------------------------------
# GPT (config F)


class CFPGPT(LayerStack):
    config_class = CFPGPTConfig

    def param_specs(self) -> Any:
        c = self.config
        return {"layers": L.stacked([bert_layer_spec(c.hidden, c.heads, self.ffn) for _ in range(c.num_layers)],
                                    c.scan_layers)}

    def forward(self, params: Any, x: jax.Array) -> jax.Array:
        return L.run_layers(params["layers"], x, lambda p, x, aux: (bert_layer(p, x), aux), self.config.scan_layers)[0]

    def flops_per_step(self) -> float:
        """3 x forward matmul FLOPs, less one product the step never computes:

            3 * L * (8*T*h^2 + 4*T*s*h + 4*T*h*f) - 6*T*h^2,   T = batch * seq

        The first layer's inputs are data, not parameters, and its fused QKV projection reads
        them directly (post-LN), so no gradient is propagated to them: that projection's input
        gradient (2*T*h*3h) is not computed. 59.37e12 for config F at batch 24, 2 layers.
        """
        c = self.config
        t, h = self.tokens, c.hidden
        # The fused QKV projection does the work of three separate ones.
        layer = L.attention_flops(t, c.seq_len, h) + L.mlp_flops(t, h, self.ffn)
        return float(3 * c.num_layers * layer - 2 * t * h * 3 * h)


# ---------------------------------------------------------------------------------------------
# GShard MoE (config E)


def dummy_gating(probs: jax.Array, capacity: int) -> tuple[jax.Array, jax.Array]:
    """The artifact's ``top2_gating_dummy``: (G, S, E) gate probabilities broadcast over C slots.
    Combine weights and dispatch mask are the same tensor, so gradients flow through both."""
    g, s, e = probs.shape
    combine = jnp.broadcast_to(probs[..., None], (g, s, e, capacity))
    return combine, combine


class CFPMoE(LayerStack):
    config_class = CFPMoEConfig

    @property
    def capacity(self) -> int:
        c = self.config
        return max(1, math.ceil(c.capacity_factor * c.expert_group_size / c.num_experts))

    @property
    def num_groups(self) -> int:
        return self.tokens // self.config.expert_group_size

    def is_moe_layer(self, i: int) -> bool:
        return i % 2 == 0

    def param_specs(self) -> Any:
        c = self.config
        layers = []
        for i in range(c.num_layers):
            if not self.is_moe_layer(i):
                layers.append(bert_layer_spec(c.hidden, c.heads, self.ffn))
                continue
            layers.append({**post_ln_attention_spec(c.hidden, c.heads), "moe": {
                # The router stays replicated (GShard): splitting it over experts would put a
                # collective inside the softmax. Alpa's experts have no biases.
                "gate": ParamSpec((c.hidden, c.num_experts), ("embed", None)),
                "w_in": ParamSpec((c.num_experts, c.hidden, self.ffn), ("expert", "embed", "mlp")),
                "w_out": ParamSpec((c.num_experts, self.ffn, c.hidden), ("expert", "mlp", "embed")),
            }, "ln_moe": L.layer_norm_spec(c.hidden)})
        return {"layers": L.stacked(layers, c.scan_layers, period=2)}

    def experts(self, p: dict, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Alpa's FlaxPositionWiseMoELayer over x: (batch, seq, embed), with the einsums' operand
        orders kept (the expert output is (group, expert, slot, embed)); returns the output and
        GShard's balance loss (zero under the dummy gating, which has none)."""
        b, s, h = x.shape
        dtype = x.dtype
        group = self.config.expert_group_size
        xg = constrain(x.reshape(b * s // group, group, h), ("batch", None, "embed"))
        # Routing in float32 whatever the compute dtype, as the artifact's runs compute it (and
        # bf16 probabilities tie too often for top-2's argmax).
        probs = jax.nn.softmax(jnp.einsum("gsm,me->gse", xg.astype(jnp.float32), p["gate"]), axis=-1)
        if self.config.gating == "dummy":
            combine, dispatch = dummy_gating(probs, self.capacity)
            aux = jnp.zeros((), jnp.float32)
        else:
            combine, dispatch, aux = top2_gating(probs, self.capacity)
        expert_in = jnp.einsum("gsec,gsm->egcm", dispatch.astype(dtype), xg)
        expert_in = constrain(expert_in, ("expert", "batch", None, "embed"))
        hidden = jax.nn.relu(jnp.einsum("egcm,emh->egch", expert_in, p["w_in"].astype(dtype)))
        hidden = constrain(hidden, ("expert", "batch", None, "mlp"))
        expert_out = jnp.einsum("egch,ehm->gecm", hidden, p["w_out"].astype(dtype))
        expert_out = constrain(expert_out, ("batch", "expert", None, "embed"))
        y = constrain(jnp.einsum("gsec,gecm->gsm", combine.astype(dtype), expert_out), ("batch", None, "embed"))
        return y.reshape(b, s, h), aux

    def forward_with_aux(self, params: Any, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return L.run_layers(params["layers"], x, self.layer, self.config.scan_layers, aux=jnp.zeros((), jnp.float32))

    def layer(self, p: Any, x: jax.Array, aux_total: jax.Array) -> tuple[jax.Array, jax.Array]:
        """An MoE layer (its parameters hold ``moe``) or a dense BERT layer; the balance losses so far."""
        if "moe" not in p:
            return bert_layer(p, x), aux_total
        a = post_ln_attention(p, x)
        y, aux = self.experts(p["moe"], a)
        aux_total = aux_total + aux
        return L.layer_norm(p["ln_moe"], y + a, BERT_LN_EPS), aux_total

    def forward(self, params: Any, x: jax.Array) -> jax.Array:
        return self.forward_with_aux(params, x)[0]

    def loss(self, params: Any, batch: dict) -> jax.Array:
        """Mean squared error; under ``gating="top2"`` plus GShard's balance loss, weighted 0.01
        as in ``models/moe.py`` (the artifact's top-2 gating, unused, has none)."""
        y, aux = self.forward_with_aux(params, constrain(batch["inputs"].astype(self.dtype), ("batch", "seq", "embed")))
        return jnp.mean(jnp.square(y.astype(jnp.float32) - batch["targets"])) + 0.01 * aux

    def flops_per_step(self) -> float:
        """Training matmul FLOPs, T = batch * seq, E experts, C slots, G = T/S groups:

            dense layer:  3 * (8*T*h^2 + 4*T*s*h + 4*T*h*f)
            MoE layer:    3 * (8*T*h^2 + 4*T*s*h)        attention
                        + 3 * 2*T*h*E                    router
                        + k * 2*T*E*C*h                  dispatch
                        + 3 * 4*G*E*C*h*f                experts, over every slot
                        + 3 * 2*T*E*C*h                  combine
            less          6*T*h^2                        the first layer's QKV input gradient

        k is 3 under the dummy gating, whose dispatch mask carries gradients, and 2 under top-2
        gating, whose 0/1 mask does not. The first layer reads data, not parameters, directly
        (post-LN), so no gradient is propagated to it. 52.99e12 at batch 64, 4 layers.
        """
        c = self.config
        t, h, e, cap, f = self.tokens, c.hidden, c.num_experts, self.capacity, self.ffn
        attn = L.attention_flops(t, c.seq_len, h)
        dispatch_passes = 3 if c.gating == "dummy" else 2
        dense = 3 * (attn + L.mlp_flops(t, h, f))
        moe = (3 * attn + 3 * 2 * t * h * e + dispatch_passes * 2 * t * e * cap * h
               + 3 * 4 * self.num_groups * e * cap * h * f + 3 * 2 * t * e * cap * h)
        n_moe = sum(self.is_moe_layer(i) for i in range(c.num_layers))
        return float(n_moe * moe + (c.num_layers - n_moe) * dense - 2 * t * h * 3 * h)


# ---------------------------------------------------------------------------------------------
# LLaMA 2


class CFPLLaMA(LayerStack):
    config_class = CFPLLaMAConfig

    @property
    def ffn(self) -> int:
        if self.config.ffn_dim:
            return self.config.ffn_dim
        return 256 * -(-int(2 * 4 * self.config.hidden / 3) // 256)

    def param_specs(self) -> Any:
        c = self.config
        return {"layers": L.stacked([{
            "attn_norm": L.rms_norm_spec(c.hidden),
            "attn": L.attention_spec(c.hidden, c.heads, bias=False),
            "mlp_norm": L.rms_norm_spec(c.hidden),
            "mlp": L.swiglu_spec(c.hidden, self.ffn),
        } for _ in range(c.num_layers)], c.scan_layers)}

    def forward(self, params: Any, x: jax.Array) -> jax.Array:
        c = self.config

        def layer(p: Any, x: jax.Array, aux: Any) -> tuple[jax.Array, Any]:
            x = x + L.attention(p["attn"], L.rms_norm(p["attn_norm"], x, c.norm_eps), causal=True,
                                rope_theta=c.rope_theta)
            return x + L.swiglu(p["mlp"], L.rms_norm(p["mlp_norm"], x, c.norm_eps)), aux

        return L.run_layers(params["layers"], x, layer, c.scan_layers)[0]

    def make_batch(self, key: jax.Array) -> dict[str, jax.Array]:
        c = self.config
        return {"inputs": rng.normal(key, (c.batch_size, c.seq_len, c.hidden)),
                "targets": jnp.ones((c.batch_size, c.seq_len), jnp.int32)}

    def batch_axes(self) -> dict:
        return {"inputs": ("batch", "seq", "embed"), "targets": ("batch", "seq")}

    def loss(self, params: Any, batch: dict) -> jax.Array:
        """The artifact's loss: cross-entropy of the last hidden states as logits over the hidden
        dimension (it has no output head)."""
        y = self.forward(params, constrain(batch["inputs"].astype(self.dtype), ("batch", "seq", "embed")))
        return cross_entropy(y, batch["targets"])

    def flops_per_step(self) -> float:
        """3 x forward matmul FLOPs:  3 * L * (8*T*h^2 + 4*T*s*h + 6*T*h*f),  T = batch * seq.

        Unlike the post-LN stacks, the first layer's input gradients are computed: the RMSNorm
        scale in front of its projections is a parameter, and its gradient needs them."""
        c = self.config
        t = self.tokens
        layer = L.attention_flops(t, c.seq_len, c.hidden) + L.swiglu_flops(t, c.hidden, self.ffn)
        return float(3 * c.num_layers * layer)
