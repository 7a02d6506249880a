"""Tensor contractions and the roles of their dimensions.

A contraction is written as a loop nest over *loop dimensions*, each with a role:

- ``batch``: in both operands and the output (the ``b`` of ``bqd,bkd->bqk``);
- ``lhs_free`` / ``rhs_free``: in one operand and the output (matmul's rows / columns);
- ``contracting``: in both operands, summed away (matmul's inner dimension);
- ``window``: a convolution's spatial dimensions, never split (that would need halo exchange).

Four operators are contractions:

- ``dot_general`` (every einsum and matmul);
- ``conv_general_dilated``: N is lhs-free, output features rhs-free, input features contracting
  (a grouped convolution offers N only);
- an embedding lookup, a ``gather`` of whole rows of a 2-D table: it is the contraction
  ``onehot(indices) @ table``, so the index dimensions are lhs-free, the table's row (vocabulary)
  dimension is contracting and its column dimension rhs-free. The one-hot operand is implicit:
  its vocabulary dimension has no operand dimension (``lhs_dim=None``);
- its transpose, the ``scatter-add`` of rows into a table (the lookup's gradient):
  ``onehot(indices)^T @ updates``, contracting over the index dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.sharding.analysis.graph import Graph, Op

ROLES = ("batch", "lhs_free", "rhs_free", "contracting")
ROLE_LETTER = {"batch": "b", "lhs_free": "i", "rhs_free": "j", "contracting": "k", "window": "w"}


@dataclass(frozen=True)
class LoopDim:
    role: str
    size: int
    lhs: int | None  # dimension of the lhs operand it indexes, if any
    rhs: int | None
    out: int | None


@dataclass(frozen=True)
class Contraction:
    op: int
    kind: str              # "dot" | "conv" | "lookup" | "lookup_grad"
    lhs: int | None        # var ids of the two operands and the output
    rhs: int | None
    out: int
    lhs_shape: tuple[int, ...]
    rhs_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    dims: tuple[LoopDim, ...]  # ordered: batch, lhs-free, rhs-free, contracting, window

    def of_role(self, role: str) -> list[int]:
        return [i for i, d in enumerate(self.dims) if d.role == role]

    @property
    def signature(self) -> tuple:
        """What makes two contractions interchangeable: kind and the sizes of each role."""
        return (self.kind,) + tuple((d.role, d.size) for d in self.dims)

    def roles_str(self) -> str:
        parts = []
        for role in ROLES + ("window",):
            sizes = [self.dims[i].size for i in self.of_role(role)]
            if sizes or role in ROLES:
                parts.append(f"{ROLE_LETTER[role]}={sizes}")
        return " ".join(parts)


def find_contractions(g: Graph) -> dict[int, Contraction]:
    found = {}
    for op in g.ops:
        c = as_contraction(g, op)
        if c is not None:
            found[op.id] = c
    return found


def as_contraction(g: Graph, op: Op) -> Contraction | None:
    if op.prim == "dot_general":
        return _dot(g, op)
    if op.prim == "conv_general_dilated":
        return _conv(g, op)
    if op.prim == "gather":
        return _lookup(g, op)
    if op.prim == "scatter-add":
        return _lookup_grad(g, op)
    return None


def _make(g: Graph, op: Op, kind: str, lhs: int | None, rhs: int | None, dims: list[LoopDim]) -> Contraction:
    order = {r: i for i, r in enumerate(ROLES + ("window",))}
    dims = sorted(dims, key=lambda d: (order[d.role], d.out if d.out is not None else 99,
                                       d.lhs if d.lhs is not None else 99, d.rhs if d.rhs is not None else 99))
    shape = lambda v: g.shape(v) if v is not None else ()
    return Contraction(op.id, kind, lhs, rhs, op.outputs[0], shape(lhs), shape(rhs), g.shape(op.outputs[0]),
                       tuple(dims))


def _dot(g: Graph, op: Op) -> Contraction | None:
    lhs, rhs = op.inputs[:2]
    if lhs is None or rhs is None:
        return None
    (lc, rc), (lb, rb) = op.params["contracting"], op.params["batch"]
    ls, rs = g.shape(lhs), g.shape(rhs)
    dims = []
    for o, (l, r) in enumerate(zip(lb, rb, strict=True)):
        dims.append(LoopDim("batch", ls[l], l, r, o))
    o = len(lb)
    for l in range(len(ls)):
        if l not in lc and l not in lb:
            dims.append(LoopDim("lhs_free", ls[l], l, None, o))
            o += 1
    for r in range(len(rs)):
        if r not in rc and r not in rb:
            dims.append(LoopDim("rhs_free", rs[r], None, r, o))
            o += 1
    for l, r in zip(lc, rc, strict=True):
        dims.append(LoopDim("contracting", ls[l], l, r, None))
    return _make(g, op, "dot", lhs, rhs, dims)


def _conv(g: Graph, op: Op) -> Contraction | None:
    lhs, rhs = op.inputs[:2]
    if lhs is None or rhs is None:
        return None
    p = op.params
    (ln, lc, *lsp), (ro, ri, *rsp), (on, oc, *osp) = p["lhs_spec"], p["rhs_spec"], p["out_spec"]
    ls, rs = g.shape(lhs), g.shape(rhs)
    grouped = p["feature_group_count"] > 1 or p["batch_group_count"] > 1
    dims = [LoopDim("lhs_free", ls[ln], ln, None, on)]
    # A grouped convolution ties output features to input features: splitting either alone
    # would be wrong, so they are windows here (not split).
    dims.append(LoopDim("window" if grouped else "rhs_free", rs[ro], None, ro, oc))
    dims.append(LoopDim("window" if grouped else "contracting", ls[lc], lc, ri, None))
    for a, b, c in zip(lsp, rsp, osp, strict=True):
        dims.append(LoopDim("window", ls[a], a, b, c))
    return _make(g, op, "conv", lhs, rhs, dims)


def _lookup(g: Graph, op: Op) -> Contraction | None:
    table, idx = op.inputs[:2]
    if table is None or idx is None:
        return None
    p, ts, ishape = op.params, g.shape(table), g.shape(idx)
    row_lookup = (len(ts) == 2 and p["collapsed_slice_dims"] == (0,) and p["start_index_map"] == (0,)
                  and not p["operand_batching_dims"] and p["slice_sizes"] == (1, ts[1])
                  and ishape[-1:] == (1,) and p["offset_dims"] == (len(ishape) - 1,))
    if not row_lookup:
        return None
    dims = [LoopDim("lhs_free", ishape[i], i, None, i) for i in range(len(ishape) - 1)]
    dims.append(LoopDim("rhs_free", ts[1], None, 1, len(ishape) - 1))
    dims.append(LoopDim("contracting", ts[0], None, 0, None))
    return _make(g, op, "lookup", idx, table, dims)


def _lookup_grad(g: Graph, op: Op) -> Contraction | None:
    if len(op.inputs) != 3 or any(v is None for v in op.inputs):
        return None
    table, idx, upd = op.inputs
    p, ts, ishape, us = op.params, g.shape(table), g.shape(idx), g.shape(upd)
    row_scatter = (len(ts) == 2 and p["inserted_window_dims"] == (0,) and p["scatter_dims_to_operand_dims"] == (0,)
                   and not p["operand_batching_dims"] and ishape[-1:] == (1,)
                   and p["update_window_dims"] == (len(us) - 1,) and us[-1] == ts[1])
    if not row_scatter:
        return None
    dims = [LoopDim("lhs_free", ts[0], None, None, 0), LoopDim("rhs_free", ts[1], None, len(us) - 1, 1)]
    dims += [LoopDim("contracting", ishape[i], i, i, None) for i in range(len(ishape) - 1)]
    return _make(g, op, "lookup_grad", idx, upd, dims)
