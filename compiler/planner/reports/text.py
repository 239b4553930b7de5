"""Render a Layout as the text memory map or as JSON. Both are deterministic."""
from __future__ import annotations

import json

from ..layout import Buffer, Layout


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
    c, kv, kc = lay.config, lay.kv, lay.kv.config
    out = [f"kiln memory layout: {c.model} ({c.arch}), a step of up to {c.batch_tokens} rows: {lay.n_ops} ops, "
           f"the layer body once", ""]
    out.append("CONFIGURATION")
    out += [f"  {k:<16} {v}" for k, v in c.items()]

    saved = lay.activation_bytes_without_reuse - lay.activation_bytes
    out += ["", "SUMMARY",
            f"  weights          {_mib(lay.weights_bytes)}, mmapped views of the GGUF",
            *([f"    experts        {_mib(lay.expert_bytes)}; a token reads {_mib(lay.expert_bytes_per_token)} "
               f"of them (its experts' slices)"] if lay.expert_bytes else []),
            f"  packed weights   {_mib(lay.packed_bytes)}: matmul weights interleaved by 8 rows, in a file the "
            f"compiler writes and the library reads into 2 MB pages (where the build has the x8 kernel)",
            f"  kv pool          {_mib(kv.total_bytes)}: pages of {kc.page_size} positions, {kc.dtype_label}, "
            f"shared by up to {kc.n_seq} sequence(s)",
            *([f"  recurrent state  {_mib(lay.state_bytes)}: {lay.state.slot_bytes:,} bytes a sequence in "
               f"{len(lay.state.layers)} recurrent layers, whatever its length"] if lay.state else []),
            f"  activations      {_mib(lay.activation_bytes)}",
            f"    without reuse  {_mib(lay.activation_bytes_without_reuse)}; "
            f"reuse saves {saved:,} bytes ({_pct(saved, lay.activation_bytes_without_reuse)})",
            f"    peak live      {_mib(lay.activation_peak_live_bytes)} (lower bound for any allocator)"]
    saved = kv.full_context_bytes - kv.total_bytes
    out.append(f"  kv without paging {_mib(kv.full_context_bytes)}: {kc.n_seq} x {kc.ctx} positions in every layer; "
               f"the pool saves {saved:,} bytes ({_pct(saved, kv.full_context_bytes)})")
    shared = [ly for ly in kv.layers if ly.shared]
    if shared:
        out.append(f"    shared KV      {len(shared)} layers read an earlier layer's pages and keep none: "
                   f"{_mib(kv.shared_saved_bytes)} the pool would otherwise hold for them")

    out += ["", "ACTIVATIONS (offsets within the activation arena; live = op range in the schedule, the body once)"]
    out += _buffer_rows(lay.region("activations"))

    uniform = len({(ly.k_row, ly.v_row) for ly in kv.layers}) == 1
    rows = f"row = {kv.k_row_bytes} (K) and {kv.v_row_bytes} (V) bytes" if uniform else \
        "row = each layer's k_row (K) and v_row (V) bytes below"
    out += ["", f"KV POOL (pages of {kc.page_size} positions; {rows} = one position of one head; "
                f"block tables of {kv.max_blocks} entries per sequence and group)",
            f"  {'group':>5}  {'window':>6} {'layers':>6}  {'page bytes':>12}  {'pages':>7}  {'per seq':>7}  "
            f"{'pool offset':>12}  {'pool bytes':>14}"]
    for g in kv.groups:
        out.append(f"  {g.index:>5}  {g.window or '-':>6} {len(g.layers):>6}  {g.page_bytes:>12,}  {g.n_pages:>7}  "
                   f"{g.seq_pages:>7}  {g.pool_offset:#12x}  {g.pool_bytes:>14,}")
    for g in kv.groups:
        if g.window:
            out.append(f"  group {g.index}: a sequence holds at most {g.seq_pages} pages ({g.seq_pages * kc.page_size} "
                       f"positions) of its sliding layers: the window of {g.window} plus a step's "
                       f"{lay.config.batch_tokens} rows; older pages return to the pool")
    out += [f"  {'layer':>5}  {'kind':<6} {'window':>6} {'group':>5}  {'heads':>7}  {'k_offset':>12}  {'v_offset':>12}  "
            f"{'bytes/page':>12}" + ("" if uniform else f"  {'k_row':>6}  {'v_row':>6}")]
    for ly in kv.layers:
        out.append(f"  {ly.layer:>5}  {ly.kind.value:<6} {ly.window or '-':>6} {ly.group:>5}  "
                   f"{f'{ly.n_head_kv}x{ly.head_dim}':>7}  {ly.offset:#12x}  {ly.v_offset:#12x}  {ly.page_bytes:>12,}"
                   + ("" if uniform else f"  {ly.k_row:>6}  {ly.v_row:>6}")
                   + (f"  reads layer {ly.source}'s rows" if ly.shared else ""))
    k_row, v_row = (kv.k_row_bytes, kv.v_row_bytes) if uniform else ("k_row[layer]", "v_row[layer]")
    out.append(f"  offset(page, layer, K|V, head, row) = pool_offset[group] + page*page_bytes[group] + "
               f"(K ? k_offset[layer] + (head*{kc.page_size} + row) * {k_row} : "
               f"v_offset[layer] + (head*{kc.page_size} + row) * {v_row})")
    if kv.k_transposed:
        head = f"{kc.page_size * kv.k_row_bytes}" if uniform else f"{kc.page_size}*k_row[layer]"
        value = kv.k_row_bytes // kv.layers[0].head_dim if uniform else f"{kc.k_dtype.label} value bytes"
        out.append(f"  K ({kc.k_dtype.label}) is held transposed in those bytes: value d of (head, row) at k_offset[layer] + "
                   f"head*{head} + (d*{kc.page_size} + row) * {value}")

    if lay.state:
        st = lay.state
        out += ["", f"RECURRENT STATE (a slot of {st.slot_bytes:,} bytes per sequence, {st.n_seq} slot(s): "
                    f"{_mib(st.total_bytes)} whatever the context; offsets within a slot)"]
        out += _buffer_rows(lay.region("state"))
        out.append(f"  offset(sequence, layer) = sequence*{st.slot_bytes} + conv_offset[layer] | delta_offset[layer]; "
                   f"a sequence's attention layers hold {_mib(kv.page_tokens_bytes * kc.ctx)} of KV at a full "
                   f"context of {kc.ctx}")

    out += ["", "WEIGHTS (offsets within the GGUF file)"]
    out += _buffer_rows(lay.region("weights"))
    if lay.packed:
        out += ["", "PACKED WEIGHTS (offsets within the packed region; live = first op that reads it)"]
        out += _buffer_rows(lay.region("packed"))
    return "\n".join(out) + "\n"


def layout_dict(lay: Layout) -> dict:
    kv, kc = lay.kv, lay.kv.config
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
            **({"kv_bytes_saved_by_sharing": kv.shared_saved_bytes} if any(ly.shared for ly in kv.layers) else {}),
            **({"state_bytes": lay.state_bytes} if lay.state else {}),
            **({"expert_bytes": lay.expert_bytes, "expert_bytes_per_token": lay.expert_bytes_per_token}
               if lay.expert_bytes else {}),
        },
        "kv_pool": {
            "page_size": kc.page_size,
            "n_pages": sum(g.n_pages for g in kv.groups),
            "page_bytes": sum(g.page_bytes for g in kv.groups),
            "pool_bytes": kv.total_bytes,
            "max_seq": kc.n_seq,
            "bytes_without_paging": kv.full_context_bytes,
            "k_transposed": kv.k_transposed,
            "groups": [{"group": g.index, "window": g.window, "layers": list(g.layers), "page_bytes": g.page_bytes,
                        "n_pages": g.n_pages, "pages_per_seq_max": g.seq_pages, "pool_offset": g.pool_offset,
                        "pool_bytes": g.pool_bytes} for g in kv.groups],
        },
        "buffers": [
            {"name": b.name, "region": b.region, "offset": b.offset, "size": b.size, "shape": list(b.shape),
             "dtype": b.dtype, "first_op": b.first_op, "last_op": b.last_op, "note": b.note}
            for b in lay.buffers
        ],
        "kv": [
            {"layer": ly.layer, "kind": ly.kind.value, "window": ly.window, "group": ly.group,
             "k_offset": ly.offset, "v_offset": ly.v_offset, "bytes_per_page": ly.page_bytes,
             "n_head_kv": ly.n_head_kv, "head_dim": ly.head_dim, "k_row_bytes": ly.k_row, "v_row_bytes": ly.v_row,
             **({"reads_layer": ly.source} if ly.shared else {})}
            for ly in kv.layers
        ],
        **({"recurrent_state": {
            "slot_bytes": lay.state.slot_bytes, "n_slots": lay.state.n_seq, "total_bytes": lay.state.total_bytes,
            "kv_bytes_per_sequence_full_context": kv.page_tokens_bytes * kc.ctx,
            "layers": [{"layer": s.layer, "conv_offset": s.conv_offset, "conv_bytes": s.conv_bytes,
                        "delta_offset": s.delta_offset, "delta_bytes": s.delta_bytes} for s in lay.state.layers],
        }} if lay.state else {}),
    }


def render_json(lay: Layout) -> str:
    return json.dumps(layout_dict(lay), indent=1) + "\n"
