"""The IR as text (`kiln ir`): one line per node, the body once, then what each layer binds."""
from __future__ import annotations

from .graph import Graph, Node, Op, Value


def _value(v: Value) -> str:
    shape = "x".join(str(d) for d in v.shape)
    return f"{v.name}:{v.dtype.label if v.dtype else 'w'}[{shape}]"


def _node(i: int, n: Node, width: int) -> str:
    outs = ", ".join(_value(v) for v in n.outputs) or "-"
    ins = ", ".join(_value(v) for v in n.inputs)
    kernel = f" [{n.kernel}]" if n.kernel else ""
    rotations = "  rotations " + "; ".join(f"{k}: base {r.base:g}, {r.n_rot} dims{', factors' if r.factors else ''} "
                                          f"at {r.at}" for k, r in enumerate(n.attrs.rotations)) \
        if n.op is Op.ROPE_TABLE else ""
    return f"{i:4d}  {n.name:<{width}}  {n.op.value}{kernel}  {outs} <- {ins}{rotations}"


def _runs(ids: list[int]) -> str:
    """3, 4, 5, 8 -> '3..5, 8'"""
    out: list[list[int]] = []
    for i in ids:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join(f"{a}..{b}" if b > a else str(a) for a, b in out)


def format_graph(g: Graph) -> str:
    """Index, name, op, kernel, outputs <- inputs; layer weights print as `role:w[shape]`, their
    tensor and type in each layer listed at the end."""
    lines = [
        f"graph: {len(g.nodes)} ops (head {len(g.head)}, "
        + ", ".join(f"{b.name} {len(b.nodes)} x {len(g.layers_of(b.name))} layers" for b in g.bodies)
        + f", tail {len(g.tail)}), n_tokens={g.n_tokens}",
        "inputs:  " + ", ".join(_value(v) for v in g.inputs),
        "state:   " + ", ".join(_value(v) for v in g.state),
        "outputs: " + ", ".join(_value(v) for v in g.outputs),
    ]
    width = max((len(n.name) for n in g.nodes), default=0)
    i = 0
    for section, nodes in g.sections():
        runs = _runs([ly.index for ly in g.layers_of(section)])
        lines.append(f"{section}, for each layer {runs}" if g.is_body(section) else section)
        for n in nodes:
            lines.append(_node(i, n, width))
            i += 1
    lines.append("layers")
    table = next((n for n in g.head if n.op is Op.ROPE_TABLE), None)
    for ly in g.layers:
        weights = ", ".join(f"{role} {t.dtype.label}" for role, t in ly.weights.items())
        reads = f"  reads layer {ly.kv_source}'s KV" if ly.kv_source not in (None, ly.index) else ""
        body = f" {ly.body}" if len(g.bodies) > 1 else ""
        rotation = f" (rotation {table.attrs.layers[ly.index]})" if table and table.attrs.layers[ly.index] >= 0 else ""
        lines.append(f"{ly.index:4d}  {ly.kind.value:<6}{body} window {ly.window or '-'}  rope base "
                     f"{ly.rope_base:g}{rotation}{reads}  {weights}")
    return "\n".join(lines) + "\n"
