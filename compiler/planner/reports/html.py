"""Render a Layout as one self-contained HTML page of inline SVG, every region drawn to scale.

- the weights (the GGUF file) and the packed weights: the region wrapped over lines of equal
  bytes, one rectangle a tensor, coloured by dtype;
- the KV pool: one page of each layer group (K and V of each layer), and each layer's bytes in
  the pool beside what it would take holding n_seq x ctx positions, the saving shaded;
- the activation arena: op index across, arena offset down, one rectangle a buffer over its
  live range, so that buffers reusing the same bytes at different times are visible.

Hovering a shape shows its name, shape, dtype, offset, size and live range (an inline script
fills a panel; the SVG <title> is the same text for browsers without scripts). Deterministic:
the same Layout gives the same bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jinja2

from ...core.version import __version__
from ..layout import Buffer, Layout

WIDTH = 1100  # drawing width in px
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"), autoescape=True,
                          keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                          undefined=jinja2.StrictUndefined)

DTYPE_COLOURS = {"f32": "#4e79a7", "f16": "#59a14f", "bf16": "#8cd17d", "q8_0": "#f28e2b", "q6_k": "#e15759",
                 "q5_k": "#ff9d9a", "q5_1": "#b6992d", "q5_0": "#f1ce63", "q4_k": "#76b7b2", "q4_1": "#b07aa1",
                 "q4_0": "#d4a6c8", "i32": "#9d7660", "i8": "#bab0ac"}
K_COLOUR, V_COLOUR, HEADER_COLOUR = "#4e79a7", "#f28e2b", "#cccccc"
# Tableau 20, for activation buffers by kind (their name without the layer)
PALETTE = ("#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f", "#8cd17d", "#b6992d", "#f1ce63", "#499894",
           "#86bcb6", "#e15759", "#ff9d9a", "#79706e", "#bab0ac", "#d37295", "#fabfd2", "#b07aa1", "#d4a6c8",
           "#9d7660", "#d7b5a6")


@dataclass(frozen=True)
class Shape:
    x: float
    y: float
    w: float
    h: float
    fill: str
    info: str  # the hover text, one fact a line
    css: str = ""  # a class: "saved" for shaded savings


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str
    anchor: str = "start"


@dataclass(frozen=True)
class Drawing:
    height: float
    shapes: tuple[Shape, ...]
    labels: tuple[Label, ...] = ()


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _info(b: Buffer, live: str) -> str:
    shape = " x ".join(map(str, b.shape))
    note = f"\n{b.note}" if b.note else ""
    return (f"{b.name}\nshape [{shape}] {b.dtype}\noffset {b.offset:#x}, {b.size:,} bytes ({_size(b.size)})\n"
            f"{live}{note}")


def _wrapped(items: list[tuple[int, int, str, str]], total: int, lines: int, line_h: float = 18,
             gap: float = 6) -> Drawing:
    """A region of `total` bytes drawn as `lines` lines of equal bytes, left to right, top to
    bottom; each (offset, size, fill, info) item a rectangle, split where it wraps."""
    per_line = max(1, -(-total // lines))
    scale = WIDTH / per_line
    shapes, labels = [], []
    for offset, size, fill, info in items:
        start, end = offset, offset + size
        while start < end:
            line = start // per_line
            stop = min(end, (line + 1) * per_line)
            shapes.append(Shape(round((start - line * per_line) * scale, 2), round(line * (line_h + gap), 2),
                                round(max((stop - start) * scale, 0.5), 2), line_h, fill, info))
            start = stop
    used_lines = max(1, -(-total // per_line))
    for line in range(used_lines):
        labels.append(Label(WIDTH + 6, line * (line_h + gap) + line_h - 5, f"{line * per_line:#x}"))
    return Drawing(round(used_lines * (line_h + gap), 2), tuple(shapes), tuple(labels))


def _region_drawing(buffers: list[Buffer], live_word: str, header: str) -> Drawing:
    """Weights or packed weights: each distinct (offset, size) once, coloured by dtype, and
    the bytes before the first one (the file's header) in grey."""
    seen: dict[tuple[int, int], Buffer] = {}
    for b in buffers:
        seen.setdefault((b.offset, b.size), b)
    total = max((o + s for o, s in seen), default=0)
    first = min((o for o, _ in seen), default=0)
    items = [(0, first, HEADER_COLOUR, f"{header}\n{first:,} bytes")] if first else []
    items += [(b.offset, b.size, DTYPE_COLOURS.get(b.dtype, "#999999"), _info(b, f"{live_word} {b.first_op}"))
              for (_, _), b in sorted(seen.items())]
    return _wrapped(items, total, lines=max(1, min(16, len(items) // 12)))


def _dtype_legend(buffers: list[Buffer]) -> list[tuple[str, str, str]]:
    by_type: dict[str, int] = {}
    seen = set()
    for b in buffers:
        if (b.offset, b.size) not in seen:
            seen.add((b.offset, b.size))
            by_type[b.dtype] = by_type.get(b.dtype, 0) + b.size
    return [(DTYPE_COLOURS.get(t, "#999999"), t, _size(n)) for t, n in sorted(by_type.items(), key=lambda x: -x[1])]


def _kv_page(lay: Layout, group) -> Drawing:
    """One page of a group: for each of its layers, K then V."""
    kv = lay.kv
    items = []
    for ly in kv.layers:
        if ly.group != group.index or ly.shared:
            continue
        readers = [r.layer for r in kv.layers if r.source == ly.layer and r.shared]
        for part, offset, size, dtype, colour in (("K", ly.offset, ly.k_bytes, kv.config.k_dtype, K_COLOUR),
                                                  ("V", ly.v_offset, ly.v_bytes, kv.config.v_dtype, V_COLOUR)):
            items.append((offset, size, colour,
                          f"layer {ly.layer} {part} ({ly.kind.value}{f', window {ly.window}' if ly.window else ''})\n"
                          f"shape [{ly.n_head_kv} x {kv.config.page_size} x {ly.head_dim}] {dtype.label}\n"
                          f"offset {offset:#x} in each page, {size:,} bytes\n"
                          f"page bytes {group.page_bytes:,}; written by op {_kv_ops(lay, ly.layer)}"
                          + (f"\nalso read by layer{'s' if len(readers) > 1 else ''} "
                             f"{', '.join(map(str, readers))}, which keep no KV" if readers else "")))
    return _wrapped(items, group.page_bytes, lines=1, line_h=26)


def _kv_ops(lay: Layout, layer: int) -> str:
    b = next((b for b in lay.region("kv") if b.name == f"kv_cache-{layer}.k"), None)
    return f"{b.first_op}, read by op {b.last_op}" if b else "-"


def _kv_layers(lay: Layout) -> Drawing:
    """Each layer's bytes in the pool (solid) and, shaded, what n_seq x ctx positions would add."""
    kv, kc = lay.kv, lay.kv.config
    fulls = {ly.layer: kc.n_seq * kc.ctx * ly.n_head_kv * (ly.k_row + ly.v_row) for ly in kv.layers}
    held = {ly.layer: kv.groups[ly.group].n_pages * ly.page_bytes for ly in kv.layers}
    scale = (WIDTH - 260) / max([*fulls.values(), *held.values()], default=1)
    shapes, labels, bar_h, step = [], [], 12, 15
    for i, ly in enumerate(kv.layers):
        y, full = i * step, fulls[ly.layer]
        kind = f"{ly.kind.value}{f', window {ly.window}' if ly.window else ''}"
        reads = f"; reads layer {ly.source}'s pages" if ly.shared else ""
        info = (f"layer {ly.layer} ({kind}), group {ly.group}, {ly.n_head_kv} KV heads of {ly.head_dim}{reads}\n"
                f"in the pool: {held[ly.layer]:,} bytes "
                f"({_size(held[ly.layer])}), {kv.groups[ly.group].n_pages} pages x {ly.page_bytes:,}\n"
                f"holding {kc.n_seq} x {kc.ctx} positions: {full:,} bytes ({_size(full)})")
        colour = "#59a14f" if ly.window else "#4e79a7"
        shapes.append(Shape(0, y, round(max(held[ly.layer] * scale, 0.5), 2), bar_h, colour, info))
        if full > held[ly.layer]:
            shapes.append(Shape(round(held[ly.layer] * scale, 2), y, round((full - held[ly.layer]) * scale, 2), bar_h,
                                colour, info + f"\nsaved: {full - held[ly.layer]:,} bytes", "saved"))
        labels.append(Label(WIDTH - 250, y + bar_h - 2, f"layer {ly.layer:>2}  {kind}  {_size(held[ly.layer])}"
                            + (f"  (reads {ly.source}'s)" if ly.shared else "")))
    return Drawing(len(kv.layers) * step, tuple(shapes), tuple(labels))


def _kind_colours(lay: Layout) -> dict[str, str]:
    kinds = sorted({b.name for b in lay.region("activations")})
    return {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(kinds)}


def _activations(lay: Layout, height: float = 520) -> Drawing:
    """Op index across, arena offset down; one rectangle a buffer over [first_op, last_op]."""
    bufs = lay.region("activations")
    colour = _kind_colours(lay)
    x_scale = WIDTH / max(lay.n_ops, 1)
    y_scale = height / max(lay.activation_bytes, 1)
    shapes = tuple(Shape(round(b.first_op * x_scale, 2), round(b.offset * y_scale, 2),
                         round(max((b.last_op - b.first_op + 1) * x_scale, 0.5), 2),
                         round(max(b.size * y_scale, 0.5), 2), colour[b.name],
                         _info(b, f"live from op {b.first_op} to op {b.last_op}"))
                   for b in sorted(bufs, key=lambda b: (b.first_op, b.offset, b.name)))
    labels = [Label(-6, round(f * height, 2) + 4, _size(int(f * lay.activation_bytes)), "end")
              for f in (0, 0.25, 0.5, 0.75, 1)]
    labels += [Label(round(first * x_scale, 2), height + 16, name) for name, first, _ in lay.sections]
    return Drawing(height, shapes, tuple(labels))


def render_html(lay: Layout) -> str:
    c, kv = lay.config, lay.kv
    weights, packed = lay.region("weights"), lay.region("packed")
    regions = [("weights (GGUF, mapped)", lay.weights_bytes, "#4e79a7"), ("packed weights", lay.packed_bytes, "#76b7b2"),
               ("KV pool", kv.total_bytes, "#f28e2b"), ("activations", lay.activation_bytes, "#e15759")]
    if lay.state:
        regions.insert(3, ("recurrent state", lay.state_bytes, STATE_COLOUR))
    total = sum(n for _, n, _ in regions)
    overview, x = [], 0.0
    for name, n, colour in regions:
        w = n * WIDTH / total if total else 0
        overview.append(Shape(round(x, 2), 0, round(max(w, 0.5), 2), 26, colour,
                              f"{name}\n{n:,} bytes ({_size(n)}), {100 * n / total:.1f}% of the plan"))
        x += w
    saved_kv = kv.full_context_bytes - kv.total_bytes
    return _ENV.get_template("layout.html.j2").render(
        c=c, lay=lay, kv=kv, version=__version__, width=WIDTH, size=_size,
        overview=Drawing(26, tuple(overview)), regions=regions, total=total,
        weights=_region_drawing(weights, "read by op", "GGUF header: metadata and tensor table"),
        weights_legend=_dtype_legend(weights),
        packed=_region_drawing(packed, "first read by op", "") if packed else None, packed_legend=_dtype_legend(packed),
        pages=[(g, _kv_page(lay, g)) for g in kv.groups], kv_layers=_kv_layers(lay), saved_kv=saved_kv,
        activations=_activations(lay), kinds=_kind_colours(lay), k_colour=K_COLOUR, v_colour=V_COLOUR,
        reuse_saved=lay.activation_bytes_without_reuse - lay.activation_bytes,
        state_slot=_state_slot(lay) if lay.state else None, state_colours=(CONV_COLOUR, STATE_COLOUR))


STATE_COLOUR, CONV_COLOUR = "#b07aa1", "#ff9da7"


def _state_slot(lay: Layout) -> Drawing:
    """One sequence's slot of the recurrent state, to scale: each recurrent layer's conv window,
    then its delta-rule matrices."""
    items = [(b.offset, b.size, CONV_COLOUR if b.name.startswith("conv") else STATE_COLOUR,
              _info(b, f"read and written by op {b.first_op}")) for b in lay.region("state")]
    return _wrapped(items, lay.state.slot_bytes, lines=max(1, min(8, len(items) // 4)))
