"""CFP analysis pass: contractions, strategies, ParallelBlocks, segments (issue 5).

The analysis only traces shapes, so these tests need no devices: a mesh is just its shape.
"""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import optax
import pytest

from launcher.sharding.analysis.core import analyze, analyze_graph
from launcher.sharding.analysis.contractions import find_contractions
from launcher.sharding.analysis.hlo_text import parse_hlo, read_hlo
from launcher.sharding.model_program import training_program
from launcher.sharding.analysis.strategies import allreduce_axes, enumerate_strategies, notation
from launcher.errors import UserError
from tests.launch import read_result, run_cli
from launcher.models.gpt import GPT
from launcher.models.moe import MoE
from launcher.sharding.analysis.graph import Graph, trace
from launcher.sharding.analysis.propagation import propagate

pytestmark = pytest.mark.core

f32 = jnp.float32
S = jax.ShapeDtypeStruct


def sgd_step(loss_fn):
    """A training step with Adam, over {"params", "opt_state"} like models.train's."""
    opt = optax.adam(1e-3)

    def step(state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch)
        updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss

    return step, lambda params: {"params": params, "opt_state": jax.eval_shape(opt.init, params)}


# --- a 2-layer MLP: x(8,16) @ w1(16,32) -> gelu -> @ w2(32,6) ------------------------------


def mlp_loss(p, batch):
    h = jax.nn.gelu(batch["x"] @ p["w1"] + p["b1"])
    return jnp.mean((h @ p["w2"] - batch["y"]) ** 2)


def mlp_program(out: int = 6):
    params = {"w1": S((16, 32), f32), "b1": S((32,), f32), "w2": S((32, out), f32)}
    batch = {"x": S((8, 16), f32), "y": S((8, out), f32)}
    step, state = sgd_step(mlp_loss)
    return step, (state(params), batch)


# --- one pre-LN transformer layer on x: (B=8, S=16, D=32), 4 heads ------------------------

B, SEQ, D, H, F = 8, 16, 32, 4, 64


def layer_loss(p, batch):
    x = batch["x"]

    def ln(v):
        m = v.mean(-1, keepdims=True)
        return (v - m) * jax.lax.rsqrt(((v - m) ** 2).mean(-1, keepdims=True) + 1e-5)

    h = ln(x)
    q, k, v = (jnp.einsum("bsd,dhe->bshe", h, p[w]) for w in ("wq", "wk", "wv"))
    scores = jnp.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(D // H)
    probs = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((SEQ, SEQ), bool)), scores, -1e9), axis=-1)
    ctx = jnp.einsum("bhqk,bkhe->bqhe", probs, v)
    x = x + jnp.einsum("bshe,hed->bsd", ctx, p["wo"])
    y = x + jax.nn.gelu(ln(x) @ p["w_up"]) @ p["w_down"]
    return jnp.mean((y - batch["y"]) ** 2)


def layer_program():
    params = {"wq": S((D, H, D // H), f32), "wk": S((D, H, D // H), f32), "wv": S((D, H, D // H), f32),
              "wo": S((H, D // H, D), f32), "w_up": S((D, F), f32), "w_down": S((F, D), f32)}
    batch = {"x": S((B, SEQ, D), f32), "y": S((B, SEQ, D), f32)}
    step, state = sgd_step(layer_loss)
    return step, (state(params), batch)


def gpt(num_layers: int, **kw):

    shape = dict(num_layers=num_layers, hidden=64, heads=4, seq_len=16, vocab_size=128, batch_size=8)
    return GPT(**{**shape, **kw})


def model_analysis(model, mesh_shape):
    p = training_program(model)
    return analyze(p.step, p.args, mesh_shape)


def roles_by_block(a):
    return [sorted(b.roles.values()) for b in a.blocks]


# ---------------------------------------------------------------------------------------------


def test_mlp_blocks_and_strategy_counts():
    a = analyze(*mlp_program(), [4])
    assert len(a.blocks) == 2  # one per forward matmul
    fwd = [op for op in sorted(a.contractions) if a.graph.ops[op].phase == "fwd"]
    assert len(fwd) == 2
    # x@w1: rows 8, columns 32, inner 16 all divide by 4 -> 3 strategies; h@w2: its 6 output
    # columns do not divide by 4 -> rows and inner only.
    counts = [len(enumerate_strategies(a.contractions[op], a.mesh_shape)) for op in fwd]
    assert counts == [3, 2]
    assert [b.num_plans for b in a.blocks] == [3, 2]
    assert [notation(a.contractions[fwd[0]], s) for s in a.blocks[0].plans] == [
        "SR = SR x RR @ {0}", "RS = RR x RS @ {0}", "RR = RS x SR @ {0} (allreduce @ 0)"]
    # Every operator belongs to exactly one block.
    owned = sorted(i for b in a.blocks for i in b.ops)
    assert owned == list(range(len(a.graph.ops)))
    # Backward contractions join the block of their forward matmul: w1's gradient (16,32) in
    # block 0; w2's gradient and the gradient through w2 in block 1.
    bwd = {op: a.owner[op] for op in a.contractions if a.graph.ops[op].phase == "bwd"}
    shapes = {a.contractions[op].out_shape: blk for op, blk in bwd.items()}
    assert shapes[(32, 16)] == 0 or shapes.get((16, 32)) == 0
    assert sorted(bwd.values()) == [0, 1, 1]


def test_mlp_backward_strategies_follow_the_plan():
    a = analyze(*mlp_program(), [4])
    b0 = a.blocks[0]
    (dw1,) = [op for op, role in b0.roles.items() if role == "bwd"]
    data_parallel, column, row = b0.strategies[dw1]
    # Rows (the batch) split: the weight gradient sums over the split batch -> all-reduce.
    assert allreduce_axes(a.contractions[dw1], data_parallel) == (0,)
    # Columns or the inner dimension split: each device owns its slice of the gradient.
    assert allreduce_axes(a.contractions[dw1], column) == ()
    assert allreduce_axes(a.contractions[dw1], row) == ()


def test_transformer_layer_blocks_as_drawn_by_hand():
    a = analyze(*layer_program(), [4])
    # Q/K/V projections with the attention core; the output projection; MLP up; MLP down.
    assert len(a.blocks) == 4
    # Block 0's backward: three weight gradients and four attention gradients (no input
    # gradient: x is the batch).
    assert roles_by_block(a)[0] == ["absorbed"] * 2 + ["bwd"] * 7 + ["head"] + ["sibling"] * 2
    for roles in roles_by_block(a)[1:]:
        assert roles == ["bwd", "bwd", "head"]
    g = a.graph
    heads = [g.ops[b.head] for b in a.blocks]
    assert [a.contractions[b.head].rhs_shape for b in a.blocks] == [(D, H, D // H), (H, D // H, D), (D, F), (F, D)]
    assert all(op.phase == "fwd" for op in heads)
    # The softmax between the scores and the weighted sum is communication-free under every
    # plan (heads or batch split), so it sits inside block 0 as members.
    exp_ops = [op.id for op in g.ops if op.prim == "exp" and op.phase == "fwd"]
    assert exp_ops and all(a.owner[i] == 0 and i in a.blocks[0].members for i in exp_ops)
    # Megatron's column split of Q/K/V (plan 1) keeps the weight gradients local; the
    # data-parallel plan (plan 0) all-reduces them.
    b0 = a.blocks[0]
    # (weight gradients are the backward contractions that sum over the tokens, batch x seq)
    weight_grads = [op for op, r in b0.roles.items() if r == "bwd" and sorted(
        d.size for d in a.contractions[op].dims if d.role == "contracting") == [B, SEQ]]
    assert len(weight_grads) == 3
    for op in weight_grads:
        assert allreduce_axes(a.contractions[op], b0.strategies[op][0]) == (0,)
        assert allreduce_axes(a.contractions[op], b0.strategies[op][1]) == ()


@pytest.mark.parametrize("n", [2, 4, 8])
def test_gpt_layers_map_to_one_template(n):
    a = model_analysis(gpt(n), [4])
    assert len(a.blocks) == 4 * n + 2
    assert [(s.start, s.end) for s in a.segments] == [(0, 1)] + [(1 + 4 * i, 5 + 4 * i) for i in range(n)] + \
        [(4 * n + 1, 4 * n + 2)]
    assert [s.template for s in a.segments] == [0] + [1] * n + [2]
    embed, layer, head = a.templates
    assert a.contractions[a.blocks[0].head].kind == "lookup"
    assert layer.plan_counts == [3, 3, 3, 3] and len(layer.instances) == n
    assert a.exhaustive_space == 3 ** (4 * n + 2)
    assert a.segment_space == 3 + 81 + 3
    text = a.segments_txt()
    assert "ParallelBlocks sequence: (5, 9) mapped to (1, 5)" in text


def test_moe_splits_experts_and_alternates_two_templates():

    model = MoE(num_layers=4, hidden=32, heads=4, seq_len=16, vocab_size=128, batch_size=4,
                num_experts=4, expert_group_size=16)
    a = model_analysis(model, [4])
    # Expert contractions: a batch dimension of size num_experts, which a strategy splits.
    experts = [c for c in a.contractions.values() if a.graph.ops[c.op].phase == "fwd"
               and any(d.role == "batch" and d.size == 4 and d.rhs == 0 for d in c.dims) and len(c.rhs_shape) == 3]
    assert len(experts) == 4  # w_in and w_out in each of the two MoE layers
    for c in experts:
        e = next(i for i, d in enumerate(c.dims) if d.role == "batch" and d.rhs == 0)
        assert any(s.axes[e] == (0,) for s in enumerate_strategies(c, [4]))
    # Layers 0 and 2 are MoE, 1 and 3 dense: two layer templates, alternating.
    layer_templates = [s.template for s in a.segments[1:-1]]
    assert len(layer_templates) == 4
    assert layer_templates[0] == layer_templates[2] != layer_templates[1] == layer_templates[3]
    moe_t, dense_t = a.templates[layer_templates[0]], a.templates[layer_templates[1]]
    assert len(moe_t.plan_counts) > len(dense_t.plan_counts) == 4


def test_elementwise_results_are_split_wherever_an_input_splits_them():

    g = Graph()
    probs, scale, label, iota = (g.new_var(s, "float32") for s in ((8, 32, 256), (8, 32, 256), (8, 32, 1), (1, 1, 256)))
    out = g.new_var((8, 32, 256), "float32")
    # The softmax gradient: a broadcast scale (vocabulary whole) times the probabilities (split).
    mul = g.add_op("mul", (scale, probs), (out,))
    assert propagate(g, mul, [((0,), (), ()), ((0,), (), (1,))], [4, 2]) == ([((0,), (), (1,))], False)
    # A one-hot of an argmax: unit dimensions broadcast, the batch split carries over.
    eq = g.add_op("eq", (label, iota), (out,))
    assert propagate(g, eq, [((0,), (), ()), None], [4, 2]) == ([((0,), (), ())], False)
    # One dimension split two ways, or one mesh axis over two dimensions: a reshard.
    assert propagate(g, mul, [((0,), (), ()), ((1,), (), ())], [4, 2])[1]
    assert propagate(g, mul, [((0,), (), ()), ((), (), (0,))], [4, 2])[1]


def test_pooling_and_its_gradients_keep_the_batch_and_feature_splits():
    """Average and max pooling (Flax's ``avg_pool``/``max_pool``: ``reduce_window_sum``/``max``)
    and their gradients (a padded ``reduce_window_sum``, ``select_and_scatter_add``) keep a split
    batch or feature dimension, as a convolution does; only a split windowed dimension needs
    communication. Before, they stopped propagation and a CNN's plan nearest dp pinned the pooled
    activations whole: 7 all-gathers where dp has none, 1.9x its step time."""
    def pool(x, init, op):   # as flax's pooling calls it (NHWC, a 2x2 window, stride 2)
        return jax.lax.reduce_window(x, init, op, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    def pooled(x):
        return (pool(x, 0.0, jax.lax.add) ** 2).sum() + (pool(x, -jnp.inf, jax.lax.max) ** 2).sum()

    _, g = trace(jax.grad(pooled), jax.ShapeDtypeStruct((8, 6, 6, 4), jnp.float32))
    windowed = [op for op in g.ops if op.prim in ("reduce_window_sum", "reduce_window_max", "select_and_scatter_add")]
    assert sorted(op.prim for op in windowed) == ["reduce_window_max", "reduce_window_sum", "reduce_window_sum",
                                                  "select_and_scatter_add"]
    for op in windowed:
        ranked = [v is not None and len(g.shape(v)) == 4 for v in op.inputs]
        assert op.params["windowed"] == (1, 2)
        for split in (((0,), (), (), ()), ((), (), (), (0,)), ((0,), (), (), (1,))):   # batch, features, both
            assert propagate(g, op, [split if r else None for r in ranked], [4, 2]) == ([split], False), op.prim
        # A split spatial dimension would need the neighbouring shard's window (a halo).
        assert propagate(g, op, [((), (0,), (), ()) if r else None for r in ranked], [4, 2])[1], op.prim
    # The max pool's gradient follows whichever operand the block decides (the pooled gradient,
    # or the input it scatters onto); two operands split differently need a reshard.
    (scatter,) = [op for op in windowed if op.prim == "select_and_scatter_add"]
    assert propagate(g, scatter, [None, ((0,), (), (), ())], [4, 2]) == ([((0,), (), (), ())], False)
    assert propagate(g, scatter, [((0,), (), (), ()), ((), (), (), (0,))], [4, 2])[1]


def test_2d_mesh_versus_1d_strategy_counts():
    a8 = analyze(*layer_program(), [8])
    a24 = analyze(*layer_program(), [2, 4])
    qkv = a8.blocks[0].head  # (8,16,32) x (32,4,8): rows 8, columns (4,8), inner 32
    c_qkv = a8.contractions[qkv]
    c_scores = next(c for c in a8.contractions.values() if a8.graph.ops[c.op].phase == "fwd" and c.of_role("batch"))
    # 1-D mesh of 8: one strategy per role with a dimension divisible by 8.
    #   projection: rows (8), columns (the head dim, 8), inner (32)          -> 3
    #   scores (8,16,4,8)x(8,16,4,8): batch (8), q (16), k (16), inner (8)   -> 4
    assert len(enumerate_strategies(c_qkv, [8])) == 3
    assert len(enumerate_strategies(c_scores, [8])) == 4
    # 2-D mesh 2x4, r roles available on both axes and over both at once:
    #   r*(r-1) ordered pairs + r joint splits (by 8) + 2*r single-axis -> r^2 + 2r
    assert len(enumerate_strategies(c_qkv, [2, 4])) == 3 * 3 + 2 * 3 == 15
    assert len(enumerate_strategies(c_scores, [2, 4])) == 4 * 4 + 2 * 4 == 24
    # On 8 devices the 4 heads cannot be split, so the column split takes the head dimension,
    # the scores then contract over a split dimension and head their own blocks; on 2x4 a
    # column split over 4 takes the heads, but one over 2 still reaches... every plan of the
    # projection block must stay communication-free for the scores to be absorbed.
    assert [b.num_plans for b in a8.blocks] == [3, 4, 4, 3, 3, 3]
    assert all(n in (15, 24) for n in (b.num_plans for b in a24.blocks))
    # A dimension divisible by 4 but not 8 is split on the 2x4 mesh only.
    odd = analyze(*mlp_program(out=4), [8])
    assert [b.num_plans for b in odd.blocks] == [3, 2]  # w2's 4 columns: no split over 8
    odd24 = analyze(*mlp_program(out=4), [2, 4])
    c = odd24.contractions[odd24.blocks[1].head]
    assert any(s.axes[[d.role for d in c.dims].index("rhs_free")] == (1,) for s in odd24.blocks[1].plans)
    assert "SS = SR x RS @ {0,1}" in [notation(c, s) for s in odd24.blocks[1].plans]
    assert "RS = RS x SS @ {1,0} (allreduce @ 1)" in [notation(c, s) for s in odd24.blocks[1].plans]


def test_hlo_dump_gives_the_traced_contractions(tmp_path):
    p = training_program(gpt(2))
    traced = analyze(p.step, p.args, [4])
    text = jax.jit(p.step).lower(*p.args).as_text(dialect="hlo")
    path = tmp_path / "step.hlo"
    path.write_text(text)
    from_hlo = analyze_graph(read_hlo(path), [4])

    def key(a):
        return sorted((c.kind, a.graph.ops[c.op].phase, c.lhs_shape, c.rhs_shape, c.out_shape,
                       tuple((d.role, d.size) for d in c.dims)) for c in a.contractions.values())

    assert len(traced.contractions) == len(from_hlo.contractions) > 0
    assert key(traced) == key(from_hlo)
    assert [b.num_plans for b in from_hlo.blocks] == [b.num_plans for b in traced.blocks]
    assert [(s.start, s.end, s.template) for s in from_hlo.segments] == \
        [(s.start, s.end, s.template) for s in traced.segments]


def test_same_input_same_bytes():
    first = model_analysis(gpt(2), [4]).files()
    second = model_analysis(gpt(2), [4]).files()
    assert first == second
    data = json.loads(first["analysis.json"])
    assert data["num_blocks"] == 10 and data["segment_space"] == 87


def test_program_without_contraction_is_refused():
    def step(state, batch):
        return state, jnp.sum(state["w"] * batch["x"])

    with pytest.raises(UserError, match="no tensor contraction"):
        analyze(step, ({"w": S((8, 4), f32)}, {"x": S((8, 4), f32)}), [4])


def test_mesh_axis_dividing_no_dimension_is_refused():
    with pytest.raises(UserError, match=r"mesh axis 0 of size 7 .* divides no dimension"):
        analyze(*mlp_program(), [7])
    with pytest.raises(UserError, match="1-D, 2-D or 3-D"):
        analyze(*mlp_program(), [2, 2, 2, 1])


def test_bad_hlo_input_is_refused(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        read_hlo(tmp_path / "missing.hlo")
    with pytest.raises(UserError, match="no HLO computation"):
        parse_hlo("this is not HLO\n")
    with pytest.raises(UserError, match=r"<hlo>:3: operand 'y'"):
        parse_hlo("ENTRY main {\n  x = f32[4] parameter(0)\n  ROOT z = f32[4] add(x, y)\n}\n")


def test_contractions_of_a_handwritten_hlo_module():
    g = parse_hlo("""
HloModule m
ENTRY %main (a: f32[8,16], b: f32[16,24]) -> f32[8,24] {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,24]{1,0} parameter(1)
  ROOT %dot = f32[8,24]{1,0} dot(f32[8,16]{1,0} %a, f32[16,24]{1,0} %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
""")
    (c,) = find_contractions(g).values()
    assert [(d.role, d.size) for d in c.dims] == [("lhs_free", 8), ("rhs_free", 24), ("contracting", 16)]


def test_hlo_text_comments_and_quoted_brackets_are_not_structure():
    """XLA prints /*index=N*/ in long tuples and brackets inside metadata strings; the reader
    (launcher/hlo/text.py, shared with the replay) reads past both."""
    g = parse_hlo("""
HloModule m
ENTRY %main (a: f32[8,16], b: f32[16,24]) -> (f32[8,24], f32[8,16], f32[8,16], f32[8,16], f32[8,16], /*index=5*/f32[8,16]) {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,24]{1,0} parameter(1)  // the weights
  %dot = f32[8,24]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/dot[(("}
  ROOT %t = (f32[8,24]{1,0}, f32[8,16]{1,0}, f32[8,16]{1,0}, f32[8,16]{1,0}, f32[8,16]{1,0}, /*index=5*/f32[8,16]{1,0}) tuple(%dot, %a, %a, %a, %a, /*index=5*/%a)
}
""")
    assert [op.prim for op in g.ops] == ["dot_general"] and len(g.outputs) == 6
    assert [g.shape(v) for v in g.outputs] == [(8, 24)] + [(8, 16)] * 5
    (c,) = find_contractions(g).values()
    assert [(d.role, d.size) for d in c.dims] == [("lhs_free", 8), ("rhs_free", 24), ("contracting", 16)]


@pytest.mark.slow
def test_analysis_mode_through_the_cli(tmp_path):
    """Two processes x 2 devices: the mode writes the four files, byte for byte what the same
    analysis gives in this process on a 1-D mesh of the 4 global devices."""
    shape = dict(num_layers=2, hidden=64, heads=4, seq_len=16, vocab_size=128, batch_size=8)
    run_cli("mode=analysis", "model._target_=launcher.models.gpt.GPT", *[f"++model.{k}={v}" for k, v in shape.items()],
            "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=2", run_dir=tmp_path)
    result = read_result(tmp_path)
    for key in ("num_contractions", "num_blocks", "segments", "templates", "exhaustive_space", "segment_space",
                "analysis_time_s"):
        assert key in result
    assert result["num_blocks"] == 10 and result["mesh_shape"] == [4]
    assert result["segments"][1] == {"index": 1, "blocks": [1, 5], "template": 1}
    expected = model_analysis(gpt(2), [4]).files()
    for name, text in expected.items():
        assert (tmp_path / name).read_text() == text, name
