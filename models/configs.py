"""Model configurations: the Hydra schemas of the ``model`` config group.

Each dataclass lists a model's constructor arguments; ``_target_`` names the class that
``hydra.utils.instantiate(cfg.model)`` builds. This module must not import JAX: the CLI imports
it to register the schemas (``SCHEMAS``) before any process has chosen its devices.

Field names are shared where the meaning is shared (``hidden``, ``heads``, ``num_layers``, ...),
so modes and plans can read any model's shapes without special cases.

Each schema's ``check`` refuses values no model can be built from (a negative batch, heads that
do not divide the width). It runs twice with the same messages: at composition, before anything
is submitted (``launcher/cli/schema.py: validate``, through ``check`` below), and in the model's
constructor, for models built in Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .errors import ModelError

DTYPES = ("float32", "bfloat16", "float16")


class _Transformer:
    """The checks every transformer config shares; ``c`` is the config (a dataclass or the
    composed ``cfg.model``)."""

    _AT_LEAST_ONE = ("batch_size", "seq_len", "num_layers", "hidden", "heads")

    @classmethod
    def check(cls, c: Any) -> None:
        for key in cls._AT_LEAST_ONE:
            if getattr(c, key) < 1:
                raise ModelError(f"model.{key}={getattr(c, key)}: must be at least 1")
        if c.ffn_dim is not None and c.ffn_dim < 1:
            raise ModelError(f"model.ffn_dim={c.ffn_dim}: must be at least 1 (or null for the default)")
        if c.hidden % c.heads:
            divisors = [d for d in range(1, c.hidden + 1) if c.hidden % d == 0 and d <= 128]
            raise ModelError(f"model.heads={c.heads} does not divide model.hidden={c.hidden}: each head gets "
                            f"hidden/heads dimensions; use heads in {divisors} or change hidden")
        if c.dtype not in DTYPES:
            raise ModelError(f"model.dtype={c.dtype!r}: must be one of {list(DTYPES)}")


class _LanguageModel(_Transformer):
    _AT_LEAST_ONE = _Transformer._AT_LEAST_ONE + ("vocab_size",)

    @classmethod
    def check(cls, c: Any) -> None:
        super().check(c)
        if c.vocab_size < 2:
            raise ModelError(f"model.vocab_size={c.vocab_size}: must be at least 2 (token 0 is reserved)")


class _Rotary:
    @classmethod
    def check(cls, c: Any) -> None:
        super().check(c)  # type: ignore[misc]
        if (c.hidden // c.heads) % 2:
            raise ModelError(f"model.hidden/model.heads = {c.hidden // c.heads}: rotary embeddings rotate pairs "
                            "of dimensions, so the head dimension must be even")


class _Experts:
    @classmethod
    def check(cls, c: Any) -> None:
        super().check(c)  # type: ignore[misc]
        if c.num_experts < 2:
            raise ModelError(f"model.num_experts={c.num_experts}: top-2 gating needs at least 2 experts")
        tokens = c.batch_size * c.seq_len
        if c.expert_group_size < 1 or tokens % c.expert_group_size:
            raise ModelError(f"model.expert_group_size={c.expert_group_size} does not divide the "
                            f"{tokens} tokens of a batch (batch_size {c.batch_size} x seq_len {c.seq_len}); "
                            "choose a group size that divides batch_size * seq_len")
        if getattr(c, "scan_layers", False) and c.num_layers % 2:
            raise ModelError(f"model.scan_layers=true stacks the MoE and dense layers as pairs, and "
                             f"model.num_layers={c.num_layers} is odd: use an even number of layers, or "
                             "model.scan_layers=false")
        if c.capacity_factor <= 0:
            raise ModelError(f"model.capacity_factor={c.capacity_factor}: must be positive (2.0 gives GShard's and CFP's capacity 2S/E)")


@dataclass
class GPTConfig(_LanguageModel):
    """Decoder-only transformer as in GPT-2 / Megatron: learned positions, pre-LN, GELU MLP,
    output head tied to the token embedding."""

    _target_: str = "launcher.models.gpt.GPT"
    batch_size: int = 8
    seq_len: int = 1024
    num_layers: int = 2
    hidden: int = 1024
    heads: int = 16
    ffn_dim: Optional[int] = None  # None: 4 * hidden
    vocab_size: int = 51200
    dtype: str = "float32"  # compute dtype; parameters and optimizer state stay float32
    scan_layers: bool = False  # the layers stacked and run by jax.lax.scan (models/layers.py: stacked)


@dataclass
class BERTConfig(_LanguageModel):
    """Encoder-only transformer as in BERT: learned positions, post-LN, GELU MLP, masked-LM head
    (dense + GELU + LayerNorm, decoder tied to the token embedding)."""

    _target_: str = "launcher.models.bert.BERT"
    batch_size: int = 8
    seq_len: int = 512
    num_layers: int = 24
    hidden: int = 1024
    heads: int = 16
    ffn_dim: Optional[int] = None  # None: 4 * hidden
    vocab_size: int = 30592
    mask_prob: float = 0.15  # fraction of positions masked and predicted
    dtype: str = "float32"
    scan_layers: bool = False  # the layers stacked and run by jax.lax.scan (models/layers.py: stacked)

    @classmethod
    def check(cls, c: Any) -> None:
        super().check(c)
        if not 0.0 < c.mask_prob <= 1.0:
            raise ModelError(f"model.mask_prob={c.mask_prob}: must be in (0, 1], e.g. 0.15")


@dataclass
class LLaMA2Config(_Rotary, _LanguageModel):
    """LLaMA 2: RMSNorm, rotary position embeddings, SwiGLU MLP, no biases, untied output head."""

    _target_: str = "launcher.models.llama2.LLaMA2"
    batch_size: int = 8
    seq_len: int = 4096
    num_layers: int = 32
    hidden: int = 4096
    heads: int = 32
    ffn_dim: Optional[int] = None  # None: LLaMA's rule, 2/3 * 4 * hidden rounded up to a multiple of 256
    vocab_size: int = 32000
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    dtype: str = "float32"
    scan_layers: bool = False  # the layers stacked and run by jax.lax.scan (models/layers.py: stacked)


@dataclass
class MoEConfig(_Experts, _LanguageModel):
    """GShard-style mixture of experts: a GPT-style decoder in which every other layer (layers
    0, 2, 4, ...) replaces its MLP with top-2-gated experts over groups of tokens."""

    _target_: str = "launcher.models.moe.MoE"
    batch_size: int = 32
    seq_len: int = 1024
    num_layers: int = 16
    hidden: int = 1280
    heads: int = 4
    ffn_dim: Optional[int] = None  # None: 8 * hidden, as in Alpa's MoE benchmarks (mlp_factor 8)
    vocab_size: int = 32000
    num_experts: int = 32
    expert_group_size: int = 2048  # tokens per gating group (S in GShard)
    capacity_factor: float = 2.0  # expert capacity C = ceil(capacity_factor * S / E); 2.0 gives GShard's 2S/E
    aux_loss_weight: float = 0.01  # weight of the load-balancing loss added to the LM loss
    dtype: str = "float32"
    scan_layers: bool = False  # the layers stacked and run by jax.lax.scan (models/layers.py: stacked)


# --- The CFP paper's workloads (models/cfp_workloads.py) ------------------------------------
# Stacks of transformer layers on given hidden states, as the CFP artifact benchmarks them
# (huwf1220/ptp_parallel, cfp_test/): no embedding, no output head, each with the artifact's
# own loss. Defaults are the settings its README prints the analysis for.


@dataclass
class CFPGPTConfig(_Transformer):
    """CFP's "GPT" (config F, cfp_test/gpt/): Alpa's BERT layers (post-LN, one fused QKV
    projection, bidirectional attention, GELU MLP of 4 * hidden), mean squared error against
    target hidden states."""

    _target_: str = "launcher.models.cfp_workloads.CFPGPT"
    batch_size: int = 24
    seq_len: int = 1024
    num_layers: int = 2
    hidden: int = 4096
    heads: int = 32
    ffn_dim: Optional[int] = None  # None: 4 * hidden
    dtype: str = "float32"
    scan_layers: bool = False  # the layers stacked and run by jax.lax.scan (models/layers.py: stacked)


@dataclass
class CFPLLaMAConfig(_Rotary, _Transformer):
    """CFP's LLaMA 2 (cfp_test/llama2/): LLaMA 2 7B decoder blocks on 128-token sequences,
    cross-entropy of the last hidden state read as logits over the hidden dimension."""

    _target_: str = "launcher.models.cfp_workloads.CFPLLaMA"
    batch_size: int = 80
    seq_len: int = 128
    num_layers: int = 4
    hidden: int = 4096
    heads: int = 32
    ffn_dim: Optional[int] = 11008  # None: LLaMA's rule (2/3 * 4 * hidden, rounded up to 256)
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    dtype: str = "float32"
    scan_layers: bool = False  # the layers stacked and run by jax.lax.scan (models/layers.py: stacked)


@dataclass
class CFPMoEConfig(_Experts, _Transformer):
    """CFP's GShard MoE (config E, cfp_test/moe/): Alpa's MoE layer stack, layers 0, 2, 4, ...
    with experts (ReLU FFN of 4 * hidden, capacity 2S/E) and the others dense BERT layers, mean
    squared error against target hidden states."""

    _target_: str = "launcher.models.cfp_workloads.CFPMoE"
    batch_size: int = 64
    seq_len: int = 1024
    num_layers: int = 4
    hidden: int = 1280
    heads: int = 16
    ffn_dim: Optional[int] = None  # None: 4 * hidden, for the experts and the dense layers
    num_experts: int = 32
    expert_group_size: int = 2048  # tokens per gating group (S)
    capacity_factor: float = 2.0  # expert capacity C = ceil(capacity_factor * S / E)
    gating: str = "dummy"  # "dummy": the artifact's top2_gating_dummy; "top2": GShard's routing (models/moe.py)
    dtype: str = "float32"
    scan_layers: bool = False  # the layers stacked and run by jax.lax.scan (models/layers.py: stacked)

    @classmethod
    def check(cls, c: Any) -> None:
        super().check(c)
        if c.gating not in ("dummy", "top2"):
            raise ModelError(f"model.gating={c.gating!r}: use 'dummy' (the CFP artifact's) or 'top2' (GShard's)")


# Registered by launcher.cli.schema as "schema_model_<key>" at the root of Hydra's repository (no group,
# so never offered as an option); conf/model/<key>.yaml pulls it in with its defaults line.
SCHEMAS = {
    "gpt": GPTConfig,
    "bert": BERTConfig,
    "llama2": LLaMA2Config,
    "moe": MoEConfig,
    "cfp-gpt": CFPGPTConfig,
    "cfp-llama": CFPLLaMAConfig,
    "cfp-moe": CFPMoEConfig,
}


def schema_of(model: Any) -> Optional[type]:
    """The schema of a model config (a dataclass or ``cfg.model``) by its ``_target_``; None for
    a user's own model class."""
    target = getattr(model, "_target_", None)
    return next((s for s in SCHEMAS.values() if s._target_ == target), None)


def check(model: Any) -> None:
    """Raises ModelError when ``model`` (``cfg.model``) cannot build its model; a user's own
    model class is checked by its constructor only."""
    schema = schema_of(model)
    if schema is not None:
        schema.check(model)
