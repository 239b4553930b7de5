"""Check a graph before memory is planned for it.

- every value is defined once, and before it is used, in its section: the body sees the step's
  inputs, the state and its own values, since it runs once per layer; the state (the residual
  stream) is written by the embedding and by in-place adds only;
- every activation is used (or is a graph output);
- every weight value is used exactly once in its section, every layer binds a tensor to each of
  its body's weight roles, and every tensor of the file is used (but those the graph says this configuration
  does not read: Phi-3's other set of rope factors);
- an op writes a value once, but for the in-place ones: an add into the state, and the logits'
  scale and soft-cap on the output;
- each op has the attrs its type needs, and its shapes agree (one rule per op).
All problems are collected and reported together.
"""
from __future__ import annotations

from dataclasses import replace
from math import prod
from typing import Callable

from ..core.errors import GraphError
from ..frontend.spec import ModelSpec
from ..core.cconst import HADAMARD_BLOCK
from ..core.dtypes import DType
from ..frontend.architecture import Activation
from ..ir.graph import MOE_PARTS, OP_ATTRS, AttentionAttrs, Graph, Node, Op, Section, ValueKind, moe_weights

ShapeRule = Callable[[Node], "str | None"]


def _same(*shapes: tuple[int, ...]) -> bool:
    return len(set(shapes)) == 1


def _embed(n: Node) -> str | None:
    (ids, table), (out,) = n.inputs, n.outputs
    if (out.shape[0], prod(out.shape[1:])) != (ids.shape[0], table.shape[1]):
        return f"output {out.shape} != (tokens {ids.shape[0]}, embd {table.shape[1]})"
    return None


def _norm(n: Node) -> str | None:
    """Runs of the weight's length: the last axis (a head), or a whole row (OLMoE's q/k norms); no
    weight: the last axis."""
    (x, *w), (out,) = n.inputs, n.outputs
    if (w and w[0].shape not in ((x.shape[-1],), (prod(x.shape[1:]),))) or len(w) > 1 or out.shape != x.shape:
        return f"input {x.shape}, weight {[v.shape for v in w]}, output {out.shape} disagree"
    return None


def _matmul(n: Node) -> str | None:
    x, w, *bias = n.inputs
    (out,) = n.outputs
    n_out, n_in = w.shape
    rows = x.shape[0]
    if prod(x.shape[1:]) != n_in or out.shape[0] != rows or prod(out.shape[1:]) != n_out:
        return f"x {x.shape} @ W{w.shape}^T -> {out.shape} does not agree"
    if bias and bias[0].shape != (n_out,):
        return f"bias {bias[0].shape} != ({n_out},)"
    return None


def _rope(n: Node) -> str | None:
    """As built: x, positions, and perhaps frequency factors; once the rope_table pass has run, x and the table."""
    (x, by, *factors), (out,) = n.inputs, n.outputs
    if len(x.shape) != 3 or out.shape != x.shape or by.shape[0] != x.shape[0] or n.attrs.n_rot > x.shape[2]:
        return f"x {x.shape}, {by.name} {by.shape}, output {out.shape}, n_rot {n.attrs.n_rot} disagree"
    if by.kind is ValueKind.STATE and (factors or len(by.shape) != 2):
        return f"a rope reads its rotations from the table alone, not {[v.name for v in n.inputs[1:]]}"
    if factors and (len(factors) > 1 or factors[0].shape != (n.attrs.n_rot // 2,)):
        return f"frequency factors {[f.shape for f in factors]} are not one vector of n_rot / 2 = {n.attrs.n_rot // 2}"
    return None


def _rope_table(n: Node) -> str | None:
    (pos, *factors), (table,), a = n.inputs, n.outputs, n.attrs
    if table.shape != (pos.shape[0], max(a.row, 1)) or a.row != sum(r.n_rot for r in a.rotations):
        return f"table {table.shape} is not {pos.shape[0]} rows of the rotations' {a.row} values"
    if [r.at for r in a.rotations] != [sum(r.n_rot for r in a.rotations[:k]) for k in range(len(a.rotations))]:
        return "the rotations do not lie side by side"
    if any(r.factors for r in a.rotations) != bool(factors):
        return "a rotation divides by frequency factors the table does not read, or it reads factors none takes"
    if any(not -1 <= k < len(a.rotations) for k in a.layers):
        return f"a layer's rotation {a.layers} is not one of the {len(a.rotations)}"
    return None


def _attention(n: Node) -> str | None:
    a: AttentionAttrs = n.attrs
    q, *rest = n.inputs
    (out,) = n.outputs
    if q.shape[1:] != (a.n_head, a.head_dim) or out.shape != (q.shape[0], a.n_head * a.head_dim):
        return f"q {q.shape} or output {out.shape} disagree with {a.n_head} heads of {a.head_dim}"
    sinks = [v for v in rest if v.kind is ValueKind.WEIGHT]
    rest = [v for v in rest if v.kind is not ValueKind.WEIGHT]
    if sinks and (len(sinks) > 1 or sinks[0].shape != (a.n_head,)):
        return f"sinks {[s.shape for s in sinks]} are not one logit per head ({a.n_head})"
    if not rest:  # a layer that reads another's KV, before kv_insert points it at the cache
        return None
    if rest[-1].kind is ValueKind.KV:
        *_, kc, vc = rest
        if not _same(kc.shape[::2], vc.shape[::2], (a.n_head_kv, a.head_dim)):
            return f"kv cache {kc.shape}, {vc.shape} disagrees with {a.n_head_kv} kv heads of {a.head_dim}"
    else:
        k, v = rest
        if not _same(k.shape, v.shape, (q.shape[0], a.n_head_kv, a.head_dim)):
            return f"k {k.shape}, v {v.shape} disagree with {a.n_head_kv} kv heads"
    return None


def _kv_write(n: Node) -> str | None:
    k, v, seq, row, kc, vc = n.inputs
    if (not _same(k.shape, v.shape) or not _same(seq.shape, row.shape, (k.shape[0],))
            or not _same(kc.shape[::2], vc.shape[::2], k.shape[1:])):
        return f"k {k.shape}, v {v.shape}, seq {seq.shape}, row {row.shape} do not fit cache {kc.shape}, {vc.shape}"
    if n.outputs:
        return "a cache write has no outputs"
    return None


def _elementwise(n: Node) -> str | None:
    if not _same(*(v.shape for v in n.inputs + n.outputs)):
        return f"shapes {[v.shape for v in n.inputs + n.outputs]} differ"
    return None


def _glu(n: Node) -> str | None:
    """gate and up of one row each, as flat as the output (a DeltaNet gates its heads' norms); a
    sigmoid gate may be one value a row (a shared expert's)."""
    gate, *rest = n.inputs + n.outputs
    one = n.attrs.activation is Activation.SIGMOID and gate.shape[1:] == (1,)
    if not _same(*((v.shape[0], prod(v.shape[1:])) for v in ([] if one else [gate]) + rest)) or \
            gate.shape[0] != rest[0].shape[0]:
        return f"shapes {[v.shape for v in n.inputs + n.outputs]} differ"
    return None


def _hadamard(n: Node) -> str | None:
    (x,), (out,) = n.inputs, n.outputs
    if out.shape != x.shape or x.shape[-1] % HADAMARD_BLOCK:
        return f"x {x.shape} -> {out.shape}: blocks of {HADAMARD_BLOCK} along the last axis"
    return None


def _select_rows(n: Node) -> str | None:
    (x, rows), (out,) = n.inputs, n.outputs
    if out.shape != x.shape or rows.shape != (x.shape[0],):
        return f"rows {rows.shape} of {x.shape} do not make {out.shape}"
    return None


def _moe_route(n: Node) -> str | None:
    a = n.attrs
    (logits,), (ids, weights) = n.inputs, n.outputs
    rows = logits.shape[0]
    if logits.shape != (rows, a.n_expert) or ids.shape != weights.shape or ids.shape != (rows, a.n_used) \
            or not 1 <= a.n_used <= a.n_expert or ids.dtype is not DType.I32:
        return f"logits {logits.shape} -> top {a.n_used} of {a.n_expert}: ids {ids.shape}, weights {weights.shape}"
    return None


def _moe_ffn(n: Node) -> str | None:
    a = n.attrs
    (x, ids, weights), (out,) = n.inputs[:3], n.outputs
    w = moe_weights(n)
    if len(a.parts) != len(n.inputs) - 3 or not set(a.parts) <= set(MOE_PARTS) or "down" not in w \
            or ("gate_up" in w) == ("gate" in w or "up" in w):
        return f"weights {a.parts} are not gate, up (or gate_up), down, and their optional biases and scale"
    if ("gate" in w or "gate_up" in w) == (a.activation is Activation.GELU):  # a plain GELU expert has no gate
        return f"a {a.activation.value} expert {'has no' if a.activation is Activation.GELU else 'needs a'} gate"
    n_embd, n_ff = x.shape[-1], w["down"].shape[2]
    if ids.shape != (x.shape[0], a.n_used) or weights.shape != ids.shape or out.shape != x.shape:
        return f"x {x.shape}, ids {ids.shape}, weights {weights.shape}, output {out.shape} disagree"
    want = {"gate": (a.n_expert, n_ff, n_embd), "up": (a.n_expert, n_ff, n_embd), "gate_up": (a.n_expert, 2 * n_ff, n_embd),
            "down": (a.n_expert, n_embd, n_ff), "gate_b": (a.n_expert, n_ff), "up_b": (a.n_expert, n_ff),
            "down_b": (a.n_expert, n_embd), "down_scale": (a.n_expert,)}
    wrong = [f"{p} {v.shape}" for p, v in w.items() if v.shape != want[p]]
    return f"experts {', '.join(wrong)} disagree with {a.n_expert} experts of ff {n_ff} over {n_embd}" if wrong else None


def _regroup(n: Node) -> str | None:
    a, (x,) = n.attrs, n.inputs
    rows = x.shape[0]
    used = sorted(p for parts in a.outputs for p in parts)
    if prod(x.shape[1:]) != a.groups * sum(a.parts) or used != list(range(len(a.parts))) \
            or len(a.outputs) != len(n.outputs):
        return f"{x.shape} is not {a.groups} groups of parts {a.parts}, each part in one of {a.outputs}"
    for out, parts in zip(n.outputs, a.outputs):
        if out.shape[0] != rows or prod(out.shape[1:]) != a.groups * sum(a.parts[p] for p in parts):
            return f"output {out.name} {out.shape} is not parts {parts} of {a.groups} groups"
    return None


def _ssm_conv(n: Node) -> str | None:
    (x, w, seq, row, state), (out,) = n.inputs, n.outputs
    channels, taps = x.shape[1], n.attrs.taps
    if w.shape != (channels, taps) or out.shape != x.shape or state.shape != (taps - 1, channels) \
            or not _same(seq.shape, row.shape, (x.shape[0],)):
        return f"x {x.shape}, taps {w.shape}, state {state.shape} -> {out.shape} disagree"
    return None


def _delta_net(n: Node) -> str | None:
    a = n.attrs
    (x, alpha, beta, dt, decay, seq, row, state), (out,) = n.inputs, n.outputs
    rows, d = x.shape[0], a.d_state
    if x.shape != (rows, (2 * a.n_k_heads + a.n_v_heads) * d) or out.shape != (rows, a.n_v_heads, d) \
            or a.n_v_heads % a.n_k_heads or state.shape != (a.n_v_heads, d, d):
        return f"qkv {x.shape}, state {state.shape} -> {out.shape} disagree with {a.n_k_heads} key and " \
               f"{a.n_v_heads} value heads of {d}"
    if not _same(alpha.shape, beta.shape, (rows, a.n_v_heads)) or not _same(dt.shape, decay.shape, (a.n_v_heads,)):
        return f"alpha {alpha.shape}, beta {beta.shape}, dt {dt.shape}, a {decay.shape}: one per value head"
    return None


def _layer_norm(n: Node) -> str | None:
    (x, w, b), (out,) = n.inputs, n.outputs
    if not _same(w.shape, b.shape, (x.shape[-1],)) or out.shape != x.shape:
        return f"input {x.shape}, weight {w.shape}, bias {b.shape}, output {out.shape} disagree"
    return None


def _add(n: Node) -> str | None:
    if n.inputs[1].kind is ValueKind.WEIGHT:  # a row added to every row
        (x, w), (out,) = n.inputs, n.outputs
        return None if w.shape == (1, x.shape[-1]) and out.shape == x.shape else \
            f"the row {w.shape} does not fit the rows of {x.shape}"
    problem = _elementwise(n)
    if problem is None and n.outputs[0].kind is ValueKind.STATE and n.inputs[1] != n.outputs[0]:
        return "an add into the state must add to the state itself (in place)"
    return problem


SHAPE_RULES: dict[Op, ShapeRule] = {
    Op.EMBED: _embed,
    Op.RMS_NORM: _norm,
    Op.MATMUL: _matmul,
    Op.ROPE: _rope,
    Op.ROPE_TABLE: _rope_table,
    Op.HADAMARD: _hadamard,
    Op.ATTENTION: _attention,
    Op.KV_STORE: _kv_write,
    Op.ADD: _add,
    Op.GLU: _glu,
    Op.SELECT_ROWS: _select_rows,
    Op.LOGITS: _matmul,
    Op.SCALE: lambda n: _elementwise(replace(n, inputs=n.inputs[:1])) or (
        f"the scale {n.inputs[1].shape} is not one value or one a column" if n.inputs[1:] and
        n.inputs[1].shape not in ((1,), (n.inputs[0].shape[-1],)) else None),
    Op.SOFTCAP: _elementwise,
    Op.MOE_ROUTE: _moe_route,
    Op.MOE_FFN: _moe_ffn,
    Op.REGROUP: _regroup,
    Op.SSM_CONV: _ssm_conv,
    Op.DELTA_NET: _delta_net,
    Op.LAYER_NORM: _layer_norm,
    Op.ACTIVATE: _elementwise,
    Op.LAYER_SLICE: lambda n: None if n.inputs[0].kind is ValueKind.STATE and len(n.inputs[0].shape) == 3 and \
        n.outputs[0].shape == (n.inputs[0].shape[0], n.inputs[0].shape[2]) else
        f"{n.outputs[0].shape} is not one layer's part of the state {n.inputs[0].shape}",
}
assert set(SHAPE_RULES) == set(Op)

_ALWAYS_DEFINED = (ValueKind.WEIGHT, ValueKind.KV, ValueKind.INPUT, ValueKind.STATE, ValueKind.RECURRENT)
_WRITES_STATE = (Op.EMBED, Op.ADD, Op.SCALE, Op.LAYER_NORM,  # a post-norm encoder norms the stream in place
                 Op.ROPE_TABLE)
_IN_PLACE_ON_OUTPUT = (Op.SCALE, Op.SOFTCAP)  # the logits, rewritten where the LM head wrote them


def graph_problems(g: Graph, spec: ModelSpec | None = None) -> list[str]:
    problems: list[str] = []
    used: dict[str, int] = {}
    weight_uses: dict[str, int] = {}
    for section, nodes in g.sections():
        defined: set[str] = set()  # a section sees its own values only
        for n in nodes:
            where = f"{section} op {n.name}"
            for v in n.inputs:
                if v.kind is ValueKind.WEIGHT:
                    key = f"{v.name}'" + (f" ({section} body)" if section != Section.BODY else "")
                    weight_uses[key] = weight_uses.get(key, 0) + 1
                    if (v.tensor is None) != g.is_body(section):
                        problems.append(f"{where}: weight '{v.name}' must be a layer's role in the body "
                                        "and a file tensor elsewhere")
                elif v.kind not in _ALWAYS_DEFINED and v.name not in defined:
                    problems.append(f"{where}: input '{v.name}' is used before it is defined")
                used[v.name] = used.get(v.name, 0) + 1
            for v in n.outputs:
                if v.kind is ValueKind.STATE:
                    if n.op not in _WRITES_STATE:
                        problems.append(f"{where}: {n.op.value} writes the state '{v.name}'")
                    continue
                if v.kind is ValueKind.OUTPUT and n.op in _IN_PLACE_ON_OUTPUT and v in n.inputs and v.name in defined:
                    continue
                if v.name in defined:
                    problems.append(f"{where}: '{v.name}' is defined twice")
                defined.add(v.name)
            expected = OP_ATTRS[n.op]
            if (n.attrs is None) != (expected is None) or (expected and not isinstance(n.attrs, expected)):
                problems.append(f"{where}: {n.op.value} needs attrs {expected.__name__ if expected else None}")
                continue
            shape_problem = SHAPE_RULES[n.op](n)
            if shape_problem:
                problems.append(f"{where}: {n.op.value}: {shape_problem}")
    outputs = {v.name for v in g.outputs}
    for v in g.activations():
        if v.name not in used and v.name not in outputs:
            problems.append(f"activation '{v.name}' is computed but never used")
    for name, count in sorted(weight_uses.items()):
        if count != 1:
            problems.append(f"weight '{name} is used {count} times (expected exactly once)")
    for section, nodes in g.sections():
        if not g.is_body(section):
            continue
        roles = {v.name for n in nodes for v in n.inputs if v.kind is ValueKind.WEIGHT}
        for ly in g.layers_of(section):
            if set(ly.weights) != roles:
                problems.append(f"layer {ly.index} binds {sorted(ly.weights)}, but its body uses {sorted(roles)}")
    if spec is not None:
        viewed = {t.view_of or t.name for v in g.weights() for t in g.tensors(v)}
        for name in spec.tensors:
            if name not in viewed and name not in g.unused:
                problems.append(f"tensor '{name}' of {spec.path.name} is not used by the {spec.arch} architecture")
    return problems


def validate(g: Graph, spec: ModelSpec | None = None) -> Graph:
    problems = graph_problems(g, spec)
    if problems:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise GraphError(f"the step graph is invalid:\n  {shown}{more}")
    return g
