"""Model configurations: the Hydra schemas of the ``model`` config group.

Each dataclass lists a model's constructor arguments; ``_target_`` names the class that
``hydra.utils.instantiate(cfg.model)`` builds. This module must not import JAX: the CLI imports
it to register the schemas (``SCHEMAS``) before any process has chosen its devices.

Field names are shared where the meaning is shared (``hidden``, ``heads``, ``num_layers``, ...),
so modes and plans can read any model's shapes without special cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class GPTConfig:
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


@dataclass
class BERTConfig:
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


@dataclass
class LLaMA2Config:
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


@dataclass
class MoEConfig:
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


# --- The CFP paper's workloads (models/cfp_workloads.py) ------------------------------------
# Stacks of transformer layers on given hidden states, as the CFP artifact benchmarks them
# (huwf1220/ptp_parallel, cfp_test/): no embedding, no output head, each with the artifact's
# own loss. Defaults are the settings its README prints the analysis for.


@dataclass
class CFPGPTConfig:
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


@dataclass
class CFPLLaMAConfig:
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


@dataclass
class CFPMoEConfig:
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


# Registered by launcher.schema as "<key>_schema" in the Hydra config group "model".
SCHEMAS = {
    "gpt": GPTConfig,
    "bert": BERTConfig,
    "llama2": LLaMA2Config,
    "moe": MoEConfig,
    "cfp-gpt": CFPGPTConfig,
    "cfp-llama": CFPLLaMAConfig,
    "cfp-moe": CFPMoEConfig,
}
