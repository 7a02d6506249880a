"""The CFP paper's workloads (models/cfp_workloads.py) against what CFP's artifact prints.

CFP's README (public repository huwf1220/ptp_parallel) prints, on 4 devices:

- GPT config F with 2 layers: ``generated_search_space: [3, 3, 3, 3, 3, 3, 3, 3]`` (batch 16)
  and a searched solution over 8 ParallelBlocks (batch 24), ``FLOP_COUNT: 59.373627899904``
  (batch 24);
- MoE (config E) with 4 layers and batch 64: ``ParallelBlocks sequence: (0, 8) mapped to (0, 8)``,
  ``(8, 14) mapped to (8, 14)``, ``(14, 22) mapped to (0, 8)``, ``(22, 28) mapped to (8, 14)``
  (4 segments, one per layer, on 2 templates), ``segment PB search space: [3, 3, 3, 4]`` for the
  MoE layer and ``[3, 3, 3, 3]`` for the dense one, a searched solution over 16 ParallelBlocks,
  ``TFLOP_COUNT: 52.9891590144``.

Our analysis runs on the full-size models (it only traces shapes) on a 1-D mesh of 4.
"""

from __future__ import annotations

import itertools
import math
import re

import jax
import numpy as np
import pytest

from launcher.sharding.pipeline import analyze
from launcher.models.plans import builtin
from launcher.models.train import run_training
from tests.test_models import load_preset

pytestmark = pytest.mark.core

MESH = [4]
# The artifact's published numbers (its README), nothing derived from our own runs.
CFP_GPT_F_SEARCH_SPACE = [3, 3, 3, 3, 3, 3, 3, 3]   # 2 layers, 4 devices
CFP_GPT_F_TFLOP_COUNT = 59.373627899904             # batch 24, 2 layers
CFP_MOE_SEGMENTS = [(0, 8, 0), (8, 14, 8), (14, 22, 0), (22, 28, 8)]  # (start, end, mapped start)
CFP_MOE_LAYER_SPACE = [3, 3, 3, 4]
CFP_MOE_DENSE_SPACE = [3, 3, 3, 3]
CFP_MOE_BLOCKS = 16                                 # the searched solution's length
CFP_MOE_TFLOP_COUNT = 52.9891590144                 # batch 64, 4 layers


def head_weights(a) -> list[tuple[int, str] | None]:
    """Per block, the parameter its head contraction reads, as (layer, name) with name e.g.
    ``moe.w_in``; None when both operands are activations (MoE dispatch and combine)."""
    g = a.graph
    names = dict(zip(g.inputs, g.input_names, strict=True))

    def param(v):
        for _ in range(4):  # through a dtype cast or two
            if v is None:
                return None
            if v in names:
                m = re.search(r"\['params'\]\['layers'\]\[(\d+)\]\['(\w+)'\]\['(\w+)'\]", names[v])
                return (int(m.group(1)), f"{m.group(2)}.{m.group(3)}") if m else None
            p = g.producer[v]
            if p is None or len(g.ops[p].inputs) != 1:
                return None
            v = g.ops[p].inputs[0]
        return None

    out = []
    for b in a.blocks:
        c = a.contractions[b.head]
        out.append(param(c.lhs) or param(c.rhs))
    return out


def layer_starts(weights) -> list[int]:
    """The first block of every layer (its QKV projection's), and one past the last block."""
    return [i for i, w in enumerate(weights) if w and w[1] == "attn.w_qkv"] + [len(weights)]


@pytest.fixture(scope="module")
def moe():
    return analyze(load_preset("cfp-moe"), mesh_shape=MESH).analysis


# --- GPT, config F ---------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [16, 24])
def test_gpt_config_f_has_cfps_parallel_blocks(batch):
    a = analyze(load_preset("cfp-gpt", batch_size=batch), mesh_shape=MESH).analysis
    assert [b.num_plans for b in a.blocks] == CFP_GPT_F_SEARCH_SPACE
    assert a.exhaustive_space == math.prod(CFP_GPT_F_SEARCH_SPACE)
    # CFP's blocks per layer (auto_sharding_opt_exp.cc: TRANSFORMER_DOT_PAIRS fuse the attention
    # scores and weighted sum into the fused QKV projection's block): QKV with the attention
    # core, output projection, MLP in, MLP out. Ours find the same by propagation.
    assert [w[1] for w in head_weights(a)] == ["attn.w_qkv", "attn.wo", "mlp.w_in", "mlp.w_out"] * 2
    for layer in (0, 4):
        assert sorted(r for r in a.blocks[layer].roles.values() if r != "bwd") == ["absorbed", "absorbed", "head"]
    # One segment per layer on one template: CFP profiles a layer's 81 combinations once.
    assert [(s.start, s.end, s.template) for s in a.segments] == [(0, 4, 0), (4, 8, 0)]
    assert [t.plan_counts for t in a.templates] == [CFP_GPT_F_SEARCH_SPACE[:4]]


# --- MoE, config E ---------------------------------------------------------------------------


def test_moe_dense_layers_and_attention_are_cfps_blocks(moe):
    weights = head_weights(moe)
    dense = [b.num_plans for b, w in zip(moe.blocks, weights, strict=True) if w and w[0] % 2 == 1]
    assert dense == CFP_MOE_DENSE_SPACE * 2
    assert [w[1] for w in weights if w and w[0] == 1] == ["attn.w_qkv", "attn.wo", "mlp.w_in", "mlp.w_out"]


def test_moe_layer_is_cfps_four_blocks_and_three_that_cfp_fuses_by_hand(moe):
    """CFP's MoE layer is 4 ParallelBlocks only because its compiler merges blocks by a table
    written for this model (auto_sharding_opt_exp.cc: MOE_DOT_PAIRS): dispatch and combine go into
    the router's block, each on one fixed strategy whatever the router's plan ("5 4 3 3 3",
    "8 4 3 3 3"), and the second expert matmul into the first on a fixed pairing ("7 6 2 0 1 3").
    Our blocks come from communication-free propagation, which makes neither merge: dispatch
    and combine contract two activations of different blocks, and the second expert matmul
    contracts the dimension the first one's column split leaves split (an all-reduce)."""
    weights = head_weights(moe)
    layer0 = [(w[1] if w else None, b.num_plans) for b, w in zip(moe.blocks, weights, strict=True)][:7]
    assert [name for name, _ in layer0] == ["attn.w_qkv", "attn.wo", "moe.gate", None, "moe.w_in", "moe.w_out", None]
    # CFP's space is what the enumeration offers; the router's block offers after it the plan tp
    # keeps it on (replicated: references.py, "Offered"), which CFP's space does not hold.
    kept = [b for b, w in zip(moe.blocks[:7], weights[:7], strict=True) if w and w[1] in ("attn.w_qkv", "attn.wo", "moe.gate", "moe.w_in")]
    assert [b.enumerated for b in kept] == CFP_MOE_LAYER_SPACE
    extra = {name: b.num_plans - b.enumerated for b, name in zip(kept, ("attn.w_qkv", "attn.wo", "moe.gate", "moe.w_in"), strict=True)}
    assert extra == {"attn.w_qkv": 0, "attn.wo": 0, "moe.gate": 1, "moe.w_in": 0}, extra
    assert kept[2].references == {kept[2].enumerated: ("tp",)}
    merged_by_cfp = [n for name, n in layer0 if name in (None, "moe.w_out")]
    assert len(merged_by_cfp) == 3 and all(n > 1 for n in merged_by_cfp)  # real choices in ours
    n_moe = sum(1 for w in weights if w and w[1] == "moe.gate")
    assert len(moe.blocks) == CFP_MOE_BLOCKS + 3 * n_moe
    starts = layer_starts(weights)
    assert [b.num_plans for b in moe.blocks[starts[2]:starts[3]]] == [n for _, n in layer0]  # layer 2 = layer 0


def test_moe_segments_are_cfps_one_per_layer_on_two_templates(moe):
    # Blocks are signed by their forward contractions (segments.py), so the edge layers of a
    # stack with no embedding or head (no input gradient in the first, the loss in the last)
    # match the layers between, as in CFP's analysis.
    starts = layer_starts(head_weights(moe))
    assert [(s.start, s.end) for s in moe.segments] == list(itertools.pairwise(starts))
    # The same mapping as CFP's: layers 2 and 3 onto the templates of layers 0 and 1.
    mapped = [m for _, _, m in CFP_MOE_SEGMENTS]
    assert [s.template for s in moe.segments] == [sorted(set(mapped)).index(m) for m in mapped]
    moe_t, dense_t = moe.templates
    assert dense_t.plan_counts == CFP_MOE_DENSE_SPACE
    assert moe_t.plan_counts == [b.num_plans for b in moe.blocks[:7]]


@pytest.mark.parametrize("preset, tflop_count", [("cfp-gpt", CFP_GPT_F_TFLOP_COUNT), ("cfp-moe", CFP_MOE_TFLOP_COUNT)])
def test_flops_are_cfps_tflop_count(preset, tflop_count):
    # CFP's TFLOP_COUNT is XLA's dot FLOPs of the step, which flops_per_step counts (the
    # traced step's matmuls, tests/test_models.py), so equal shapes and operators give it exactly.
    assert load_preset(preset).flops_per_step() / 1e12 == pytest.approx(tflop_count, rel=1e-12)


# --- the tiny twins --------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["cfp-gpt", "cfp-llama", "cfp-moe"])
def test_tiny_twins_have_the_full_size_blocks(family):
    """What mode=analysis/profile see on a tiny twin (2 layers; the MoE's an expert layer and a
    dense one) is the full-size model's block structure."""
    tiny = analyze(load_preset(f"{family}-tiny"), mesh_shape=MESH).analysis
    full = analyze(load_preset(family, num_layers=2), mesh_shape=MESH).analysis
    assert [b.num_plans for b in tiny.blocks] == [b.num_plans for b in full.blocks]
    assert head_weights(tiny) == head_weights(full)
    assert [sorted(b.roles.values()) for b in tiny.blocks] == [sorted(b.roles.values()) for b in full.blocks]


@pytest.mark.parametrize("family, plan, weight, spec", [
    ("cfp-gpt", "dp_tp", ("attn", "w_qkv"), (None, "model")),         # heads over "model"
    ("cfp-llama", "dp_tp", ("mlp", "w_gate"), (None, "model")),       # SwiGLU columns over "model"
    ("cfp-moe", "ep", ("moe", "w_in"), ("data",)),                    # experts over the devices
], ids=["cfp-gpt-dp_tp", "cfp-llama-dp_tp", "cfp-moe-ep"])
def test_tiny_twins_train_under_their_builtin_plan(family, plan, weight, spec):
    # One layer (the MoE's is an expert layer) compiles fastest; the artifact's learning rate,
    # at which even LLaMA's constant class is learnt within a few steps.
    model = load_preset(f"{family}-tiny", num_layers=1)
    r = run_training(model, builtin(plan), 4, jax.devices()[:8], learning_rate=1e-2)
    assert all(np.isfinite(r.losses)) and r.losses[-1] < r.losses[0]
    layout = r.state["params"]["layers"][0][weight[0]][weight[1]].sharding.spec
    assert tuple(layout)[:len(spec)] == spec
