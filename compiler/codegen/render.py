"""Render the planned decode and prefill graphs into model.c and model.h with jinja2."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jinja2

from ..core.version import __version__
from ..core.dtypes import DType
from ..ir.graph import Node, Op, ValueKind
from ..build.packing import HEADER_BYTES, header_crc32
from ..driver import Planned
from ..frontend.architecture import RopeLayout
from .emit import CodegenError, EmitContext, c_float, c_name, statement

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "c_templates"),
                          keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                          undefined=jinja2.StrictUndefined)

_C_TYPE = {DType.F32: "float", DType.I32: "int32_t", DType.I8: "void"}


@dataclass(frozen=True)
class Generated:
    model_c: str
    model_h: str


def _shape_comment(shape: tuple[int, ...]) -> str:
    return "[" + " x ".join(["n", *map(str, shape[1:])]) + "]" if len(shape) > 1 else f"[{shape[0]} bytes]"


def _node_lines(n: Node, index: int, step: str, offsets: dict[str, int], ctx: EmitContext) -> list[str]:
    lines = [f"    /* {n.label}: {n.kernel} */"]
    written = [v for v in n.outputs if v.kind is ValueKind.ACTIVATION] + ([n.scratch] if n.scratch else [])
    for v in written:
        ctype = _C_TYPE[v.dtype]
        cast = "" if ctype == "void" else f"({ctype} *)"
        lines.append(f"    {ctype} *{c_name(v)} = {cast}A({offsets[v.name]:#x}); /* {_shape_comment(v.shape)} */")
    lines.append(f"    {statement(n, ctx)}")
    lines.append(f"    OP_DONE({step}, {index});")
    return lines


STEP_INPUTS = ("inp_tokens", "inp_pos", "inp_seq", "inp_row", "inp_out")


def _step(p: Planned, ctx: EmitContext) -> dict:
    offsets = {b.name: b.offset for b in p.layout.region("activations")}
    body, layer = [], None
    step = f"STEP_{p.graph.mode.name}"
    for i, n in enumerate(p.graph.nodes):
        if n.layer != layer:
            layer = n.layer
            title = f"layer {layer}" if layer is not None else "output"
            body.append(f"\n    /* ---- {title} ---- */")
        body += _node_lines(n, i, step, offsets, ctx)
    return {
        "mode": p.graph.mode.value,
        "n_tokens": p.graph.n_tokens,
        "n_ops": len(p.graph.nodes),
        "inputs": STEP_INPUTS,
        "offsets": {name: f"{offsets[name]:#x}" for name in STEP_INPUTS},
        "body": body,
    }


def _k_rope(p: Planned) -> list[str]:
    """How each layer's cached keys were made, as {rope base, neox, hadamard} (base 0: K is not
    rotated by position): a context shift rotates them again."""
    made_by = {v.name: n for n in p.graph.nodes for v in n.outputs}
    rows = {}
    for n in p.graph.nodes:
        if n.op in (Op.KV_STORE, Op.KV_BATCH_COPY):
            src = made_by.get(n.inputs[0].name)
            hadamard = src is not None and src.op is Op.HADAMARD
            if hadamard:
                src = made_by.get(src.inputs[0].name)
            base, neox = (src.attrs.base, src.attrs.layout is RopeLayout.NEOX) if src and src.op is Op.ROPE else (0.0, False)
            rows[n.layer] = f"{{{c_float(base)}, {int(neox)}, {int(hadamard)}}}"
    return [row for _, row in sorted(rows.items())]


def generate(decode: Planned, prefill: Planned) -> Generated:
    spec, opts, kv = decode.spec, decode.options, decode.layout.kv
    header_crc = header_crc32(spec)
    arena = max(decode.layout.activation_bytes, prefill.layout.activation_bytes)
    # one packed region serves both steps: they multiply by the same weights
    if {pw.tensor for pw in prefill.layout.packed} - {pw.tensor for pw in decode.layout.packed}:
        raise CodegenError("the prefill graph packs weights the decode graph does not")
    emit_ctx = EmitContext(packed={pw.tensor: pw.offset for pw in decode.layout.packed})
    ctx = {
        "model": spec.path.name, "arch": spec.arch, "version": __version__,
        "ctx": opts.ctx, "kv_dtype": kv.dtype_label, "kv_type_k": f"KILN_{kv.k_dtype.name}",
        "kv_type_v": f"KILN_{kv.v_dtype.name}", "chunk": opts.prefill_chunk, "n_seq": opts.n_seq,
        "page_size": kv.page_size, "batch_tokens": opts.batch_tokens,
        "n_vocab": spec.hparams.n_vocab, "n_layer": spec.hparams.n_layer, "n_head_kv": kv.n_head_kv,
        "head_dim": kv.head_dim,
        "file_size": spec.file_size, "header_bytes": spec.data_offset, "header_crc32": header_crc,
        "groups": [{"window": g.window or 0, "n_pages": g.n_pages, "page_bytes": g.page_bytes} for g in kv.groups],
        "kv_group": [ly.group for ly in kv.layers],
        "kv_k": [f"{ly.offset:#x}" for ly in kv.layers],
        "kv_v": [f"{ly.v_offset:#x}" for ly in kv.layers],
        "k_rope": _k_rope(decode),
        "arena_bytes": arena, "decode_bytes": decode.layout.activation_bytes,
        "prefill_bytes": prefill.layout.activation_bytes,
        "steps": [_step(decode, emit_ctx), _step(prefill, emit_ctx)],
        "n_ops_max": max(len(decode.graph.nodes), len(prefill.graph.nodes)),
        "packed_bytes": decode.layout.packed_bytes,
        "packed_header_bytes": HEADER_BYTES,
        "packed": [{"type": f"KILN_{pw.dtype.name}", "n_out": pw.n_out, "n_in": pw.n_in, "src": f"{pw.src:#x}",
                    "dst": f"{pw.offset:#x}", "tensor": pw.tensor} for pw in decode.layout.packed],
    }
    return Generated(_ENV.get_template("model.c.j2").render(ctx), _ENV.get_template("model.h.j2").render(ctx))
