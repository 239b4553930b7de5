"""Render a Layout as the text memory map or as JSON. Both are deterministic."""
from __future__ import annotations

import json

from .layout import Buffer, Layout


def _mib(n: int) -> str:
    return f"{n:,} bytes ({n / 2**20:.2f} MiB)"


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "0.0%"


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)


def _buffer_rows(buffers: list[Buffer]) -> list[str]:
    rows = [f"  {'offset':>12}  {'end':>12}  {'size':>12}  {'shape':<16} {'dtype':<5} {'live':>9}  name"]
    for b in buffers:
        live = f"{b.first_op}..{b.last_op}"
        note = f"  ({b.note})" if b.note else ""
        rows.append(f"  {b.offset:#12x}  {b.offset + b.size:#12x}  {b.size:>12,}  {_shape(b.shape):<16} "
                    f"{b.dtype:<5} {live:>9}  {b.name}{note}")
    return rows


def render_text(lay: Layout) -> str:
    c, kv = lay.config, lay.kv
    out = [f"kiln memory layout: {c.model} ({c.arch}), {c.mode} graph of {lay.n_ops} ops", ""]
    out.append("CONFIGURATION")
    out += [f"  {k:<16} {v}" for k, v in c.items()]

    saved = lay.activation_bytes_without_reuse - lay.activation_bytes
    out += ["", "SUMMARY",
            f"  weights          {_mib(lay.weights_bytes)}, mmapped views of the GGUF",
            f"  packed weights   {_mib(lay.packed_bytes)}: matmul weights interleaved by 8 rows, in a file the "
            f"compiler writes and the library maps (where the build has the x8 kernel)",
            f"  kv               {_mib(kv.total_bytes)}: {kv.n_seq} slot(s) x {len(kv.layers)} layers, {kv.dtype.label}",
            f"  activations      {_mib(lay.activation_bytes)}",
            f"    without reuse  {_mib(lay.activation_bytes_without_reuse)}; "
            f"reuse saves {saved:,} bytes ({_pct(saved, lay.activation_bytes_without_reuse)})",
            f"    peak live      {_mib(lay.activation_peak_live_bytes)} (lower bound for any allocator)"]
    ring_saved = kv.full_context_bytes - kv.total_bytes
    if ring_saved:
        out.append(f"  kv if every layer held all {kv.ctx} positions: {_mib(kv.full_context_bytes)}; "
                   f"sliding-window rings save {ring_saved:,} bytes ({_pct(ring_saved, kv.full_context_bytes)})")

    out += ["", "ACTIVATIONS (offsets within the activation arena; live = op range in the schedule)"]
    out += _buffer_rows(lay.region("activations"))

    out += ["", f"KV CACHE (offsets within one sequence slot; slot stride {kv.seq_stride:,} bytes; "
                f"row = {kv.row_bytes} bytes = one position of one head)",
            f"  {'layer':>5}  {'kind':<6} {'window':>6} {'capacity':>8}  {'k_offset':>12}  {'v_offset':>12}  {'bytes':>12}"]
    for ly in kv.layers:
        out.append(f"  {ly.layer:>5}  {ly.kind.value:<6} {ly.window or '-':>6} {ly.capacity:>8}  "
                   f"{ly.k_offset:#12x}  {ly.v_offset:#12x}  {ly.bytes:>12,}")
    out.append(f"  offset(slot, layer, K|V, head, pos) = slot*{kv.seq_stride} + (k|v)_offset[layer] "
               f"+ (head*capacity[layer] + pos % capacity[layer]) * {kv.row_bytes}")

    out += ["", "WEIGHTS (offsets within the GGUF file)"]
    out += _buffer_rows(lay.region("weights"))
    if lay.packed:
        out += ["", "PACKED WEIGHTS (offsets within the packed region; live = first op that reads it)"]
        out += _buffer_rows(lay.region("packed"))
    return "\n".join(out) + "\n"


def layout_dict(lay: Layout) -> dict:
    kv = lay.kv
    return {
        "config": dict(lay.config.items()),
        "n_ops": lay.n_ops,
        "totals": {
            "weights_bytes": lay.weights_bytes,
            "packed_bytes": lay.packed_bytes,
            "activation_bytes": lay.activation_bytes,
            "activation_bytes_without_reuse": lay.activation_bytes_without_reuse,
            "activation_peak_live_bytes": lay.activation_peak_live_bytes,
            "kv_bytes": kv.total_bytes,
            "kv_bytes_full_context": kv.full_context_bytes,
            "kv_seq_stride": kv.seq_stride,
        },
        "buffers": [
            {"name": b.name, "region": b.region, "offset": b.offset, "size": b.size, "shape": list(b.shape),
             "dtype": b.dtype, "first_op": b.first_op, "last_op": b.last_op, "note": b.note}
            for b in lay.buffers
        ],
        "kv": [
            {"layer": ly.layer, "kind": ly.kind.value, "window": ly.window, "capacity": ly.capacity,
             "k_offset": ly.k_offset, "v_offset": ly.v_offset, "bytes": ly.bytes}
            for ly in kv.layers
        ],
    }


def render_json(lay: Layout) -> str:
    return json.dumps(layout_dict(lay), indent=1) + "\n"
