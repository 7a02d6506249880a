"""GShard mixture of experts: a GPT-style decoder whose even layers (0, 2, 4, ...) replace the
dense MLP with ``num_experts`` expert MLPs and top-2 gating.

Tokens are cut into groups of ``expert_group_size`` (S); each group routes independently, each
expert takes at most C = ceil(capacity_factor * S / E) tokens per group, and tokens beyond an
expert's capacity are dropped (their residual passes through unchanged). Dispatch and combine
are dense einsums with one-hot (group, token, expert, slot) tensors and the experts are one
batched contraction over the expert dimension, so a plan can split experts over devices: the
dispatched tensor (expert, group, slot, embed) is where GShard's all-to-all happens.

Gating follows GShard (Lepikhin et al. 2020, Algorithm 1 and Lingvo's ``Top2GatingOnLogits``):
the second expert is the best one other than the first, both gates are normalised to sum to 1
before capacity is applied, slots are given in token order (the first-choice assignments of a
group before its second choices), and the load-balancing loss is E^2 * mean_e(f_e * P_e) with
f_e the fraction of tokens whose first choice is e and P_e the mean gate probability of e. It
equals 1 when routing is uniform and grows as routing concentrates. The random second-expert
policy of GShard is left out: routing is deterministic. Because second choices queue behind
the whole group's first choices, a later token can take an earlier token's slot when capacity
is tight: like GShard, the model is causal only up to dropping.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from . import layers as L
from .base import LanguageModel
from .configs import MoEConfig
from .layers import ParamSpec
from .sharding import constrain


def top2_gating(probs: jax.Array, capacity: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """GShard top-2 routing of probs: (groups, tokens, experts), softmax gate probabilities.

    Returns ``combine`` (G, S, E, C): the weight of token s's output from slot c of expert e;
    ``dispatch`` (G, S, E, C): 1 where token s occupies that slot, else 0 (no gradient); and the
    load-balancing loss (a scalar, unweighted).
    """
    num_experts = probs.shape[-1]
    index_1 = jnp.argmax(probs, axis=-1)
    mask_1 = jax.nn.one_hot(index_1, num_experts, dtype=jnp.float32)
    # Load balance from first choices before any are dropped, as GShard's auxiliary loss.
    aux = jnp.mean(mask_1.mean(axis=1) * probs.mean(axis=1)) * num_experts**2

    index_2 = jnp.argmax(probs * (1.0 - mask_1), axis=-1)
    mask_2 = jax.nn.one_hot(index_2, num_experts, dtype=jnp.float32)
    gate_1 = jnp.sum(probs * mask_1, axis=-1)
    gate_2 = jnp.sum(probs * mask_2, axis=-1)
    denom = gate_1 + gate_2 + 1e-9
    gate_1, gate_2 = gate_1 / denom, gate_2 / denom

    # Slot of each token in its expert: how many earlier tokens of the group chose it. Second
    # choices queue behind all first choices of the group.
    pos_1 = jnp.cumsum(mask_1, axis=1) - mask_1
    mask_1 = mask_1 * (pos_1 < capacity)
    pos_2 = jnp.cumsum(mask_2, axis=1) - mask_2 + jnp.sum(mask_1, axis=1, keepdims=True)
    mask_2 = mask_2 * (pos_2 < capacity)

    def place(gate: jax.Array, mask: jax.Array, pos: jax.Array) -> jax.Array:
        slot = jax.nn.one_hot(jnp.sum(pos * mask, axis=-1).astype(jnp.int32), capacity, dtype=jnp.float32)
        return (gate[..., None] * mask)[..., None] * slot[..., None, :]

    combine = place(gate_1, mask_1, pos_1) + place(gate_2, mask_2, pos_2)
    dispatch = (combine > 0).astype(probs.dtype)
    return combine, dispatch, aux


class MoE(LanguageModel):
    config_class = MoEConfig

    @property
    def ffn(self) -> int:
        return self.config.ffn_dim or 8 * self.config.hidden

    @property
    def capacity(self) -> int:
        c = self.config
        return max(1, math.ceil(c.capacity_factor * c.expert_group_size / c.num_experts))

    @property
    def num_groups(self) -> int:
        return self.config.batch_size * self.config.seq_len // self.config.expert_group_size

    def is_moe_layer(self, i: int) -> bool:
        return i % 2 == 0

    def param_specs(self) -> Any:
        c = self.config
        out_std = L.INIT_STD / math.sqrt(2 * c.num_layers)
        layers = []
        for i in range(c.num_layers):
            layer = {"ln1": L.layer_norm_spec(c.hidden),
                     "attn": L.attention_spec(c.hidden, c.heads, bias=True, out_std=out_std),
                     "ln2": L.layer_norm_spec(c.hidden)}
            if self.is_moe_layer(i):
                # The router stays replicated (GShard): splitting it over experts would put a
                # collective inside the softmax.
                layer["moe"] = {
                    "gate": ParamSpec((c.hidden, c.num_experts), ("embed", None)),
                    "w_in": ParamSpec((c.num_experts, c.hidden, self.ffn), ("expert", "embed", "mlp")),
                    "w_out": ParamSpec((c.num_experts, self.ffn, c.hidden), ("expert", "mlp", "embed"), std=out_std),
                }
            else:
                layer["mlp"] = L.mlp_spec(c.hidden, self.ffn, bias=True, out_std=out_std)
            layers.append(layer)
        return {
            "wte": ParamSpec((c.vocab_size, c.hidden), ("vocab", "embed")),
            "wpe": ParamSpec((c.seq_len, c.hidden), (None, "embed"), std=0.01),
            "layers": L.stacked(layers, c.scan_layers, period=2),
            "ln_f": L.layer_norm_spec(c.hidden),
        }

    def moe_mlp(self, p: Any, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Expert MLP over x: (batch, seq, embed); returns the output and the balance loss."""
        b, s, h = x.shape
        dtype = x.dtype
        group = self.config.expert_group_size
        xg = constrain(x.reshape(b * s // group, group, h), ("batch", None, "embed"))
        # Routing in float32: bf16 probabilities tie too often for argmax to be stable.
        probs = jax.nn.softmax(jnp.einsum("gsm,me->gse", xg.astype(jnp.float32), p["gate"]), axis=-1)
        combine, dispatch, aux = top2_gating(probs, self.capacity)
        expert_in = jnp.einsum("gsec,gsm->egcm", dispatch.astype(dtype), xg)
        expert_in = constrain(expert_in, ("expert", "batch", None, "embed"))
        hidden = jax.nn.gelu(jnp.einsum("egcm,emf->egcf", expert_in, p["w_in"].astype(dtype)))
        hidden = constrain(hidden, ("expert", "batch", None, "mlp"))
        expert_out = jnp.einsum("egcf,efm->egcm", hidden, p["w_out"].astype(dtype))
        expert_out = constrain(expert_out, ("expert", "batch", None, "embed"))
        y = jnp.einsum("gsec,egcm->gsm", combine.astype(dtype), expert_out)
        y = constrain(y, ("batch", None, "embed"))
        return y.reshape(b, s, h), aux

    def forward(self, params: Any, batch: dict) -> tuple[jax.Array, jax.Array]:
        x = L.embed(params["wte"], batch["tokens"], self.dtype) + params["wpe"].astype(self.dtype)
        x, aux_total = L.run_layers(params["layers"], x, self.layer, self.config.scan_layers,
                                    aux=jnp.zeros((), jnp.float32))
        x = L.layer_norm(params["ln_f"], x)
        return L.logits_from(x, params["wte"], tied=True), self.config.aux_loss_weight * aux_total

    def layer(self, p: Any, x: jax.Array, aux_total: jax.Array) -> tuple[jax.Array, jax.Array]:
        """An MoE layer (its parameters hold ``moe``) or a dense one; the balance losses so far."""
        x = x + L.attention(p["attn"], L.layer_norm(p["ln1"], x), causal=True)
        h = L.layer_norm(p["ln2"], x)
        if "moe" in p:
            y, aux = self.moe_mlp(p["moe"], h)
            aux_total = aux_total + aux
        else:
            y = L.mlp(p["mlp"], h)
        return x + y, aux_total

    def flops_per_step(self) -> float:
        """Training matmul FLOPs, T = batch * seq, E experts, C slots, G = T/S groups:

            dense layer:  3 * (8*T*h^2 + 4*T*s*h + 4*T*h*f)
            MoE layer:    3 * (8*T*h^2 + 4*T*s*h)        attention
                        + 3 * 2*T*h*E                    router
                        + 2 * 2*T*E*C*h                  dispatch (no gradient to the 0/1 mask)
                        + 3 * 4*G*E*C*h*f                experts, over every slot, filled or not
                        + 3 * 2*T*E*C*h                  combine
            head:         3 * 2*T*h*V

        Experts compute on all E*C slots of a group whether tokens fill them or not, so the
        count uses capacity, not the number of routed tokens.
        """
        c = self.config
        t, h, e, cap = c.batch_size * c.seq_len, c.hidden, c.num_experts, self.capacity
        attn = L.attention_flops(t, c.seq_len, h)
        dense = 3 * (attn + L.mlp_flops(t, h, self.ffn))
        moe = (3 * attn + 3 * 2 * t * h * e + 2 * 2 * t * e * cap * h
               + 3 * 4 * self.num_groups * e * cap * h * self.ffn + 3 * 2 * t * e * cap * h)
        n_moe = sum(self.is_moe_layer(i) for i in range(c.num_layers))
        return float(n_moe * moe + (c.num_layers - n_moe) * dense + 3 * L.logits_flops(t, h, c.vocab_size))

    def paper_flops_per_step(self) -> float:
        """Alpa's ``compute_moe_tflops`` (benchmark/alpa/util.py), which the CFP paper's MoE
        figures follow: it assumes C = 2S/E, counts gating and dispatch as dense work and
        multiplies everything by 3."""
        c = self.config
        b, s, h, e, g, v = c.batch_size, c.seq_len, c.hidden, c.num_experts, c.expert_group_size, c.vocab_size
        mlp_factor = self.ffn / h
        pure = 3 * (b * s * h**2 * (8 + 4 * mlp_factor) + 4 * b * s**2 * h)
        moe = (b * s * h**2 * 8 + 4 * b * s**2 * h + 8 * b * s * h**2 * mlp_factor + 2 * b * s * h * e
               + 2 * b * s * 2 * g + 2 * b * s * h * 2 * g * 2)
        return float(pure * c.num_layers / 2 + 3 * moe * c.num_layers / 2 + 6 * b * s * h * v)
