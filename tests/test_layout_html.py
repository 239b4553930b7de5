"""`kiln layout --html`: a self-contained page drawn to scale, checked as data and, in a real
headless Chromium, as pixels: the drawing is there, not a blank or an error page."""
from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from browser import rendered_dom, screenshot
from compiler.cli.main import main
from compiler.core.options import CompileOptions
from compiler.driver import plan
from compiler.planner.reports.html import DTYPE_COLOURS, K_COLOUR, V_COLOUR, WIDTH, render_html


class Rects(HTMLParser):
    """Every <rect> of the page with its attributes, and anything that would load from elsewhere."""

    def __init__(self):
        super().__init__()
        self.rects, self.external = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "rect":
            self.rects.append(a)
        for key in ("src", "href"):
            if a.get(key):
                self.external.append((tag, a[key]))


def rects(page: str) -> Rects:
    p = Rects()
    p.feed(page)
    return p


@pytest.fixture(scope="module")
def gemma_page(gemma3):
    return plan(gemma3, CompileOptions(ctx=8192)).layout


def test_page_is_self_contained_and_deterministic(smollm2, tmp_path, capsys):
    out = tmp_path / "map.html"
    assert main(["layout", str(smollm2), "--html", str(out)]) == 0
    page = out.read_text()
    assert page == render_html(plan(smollm2, CompileOptions()).layout)
    r = rects(page)
    assert not r.external and "@import" not in page and "url(" not in page
    assert "<script src" not in page and len(r.rects) > 500


def test_every_buffer_is_drawn_to_scale_with_its_facts(smollm2):
    lay = plan(smollm2, CompileOptions()).layout
    r = rects(render_html(lay)).rects
    infos = [a["data-info"] for a in r]
    for b in lay.region("activations"):
        info = next(i for i in infos if i.startswith(b.name + "\n"))
        assert f"offset {b.offset:#x}, {b.size:,} bytes" in info and f"live from op {b.first_op} to op {b.last_op}" in info
        assert b.dtype in info and " x ".join(map(str, b.shape)) in info
    # the weights wrap over lines of equal bytes: a line's rectangles add up to at most its width
    weights = [a for a in r if re.search(r"\n(read by op|GGUF header)", "\n" + a["data-info"])]
    widths: dict[float, float] = {}
    for a in weights:
        widths[float(a["y"])] = widths.get(float(a["y"]), 0.0) + float(a["width"])
    lines = [widths[y] for y in sorted(widths)]
    assert len(lines) > 1 and all(w == pytest.approx(WIDTH, rel=0.01) for w in lines[:-1]) and lines[-1] <= WIDTH + 1


def test_sliding_window_saving_is_shaded(gemma_page):
    r = rects(render_html(gemma_page)).rects
    saved = [a for a in r if a.get("class") == "saved"]
    local = [ly for ly in gemma_page.kv.layers if ly.window]
    assert len(saved) == len(local) == 15  # Gemma 3 270M: 15 of 18 layers slide over 512 positions
    for a in saved:
        held = next(b for b in r if b["y"] == a["y"] and b.get("class") != "saved" and "holding" in b["data-info"])
        assert float(a["width"]) > 4 * float(held["width"])  # 8192 positions against the window's pages


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_chromium_draws_the_page(model, request, tmp_path, chromium):
    from PIL import Image

    lay = plan(request.getfixturevalue(model), CompileOptions(ctx=8192)).layout
    page, png = tmp_path / "map.html", tmp_path / "map.png"
    page.write_text(render_html(lay))
    screenshot(page, png)
    im = Image.open(png).convert("RGB")
    assert im.size == (1500, 3000)
    colours = {f"#{r:02x}{g:02x}{b:02x}": n for n, (r, g, b) in im.getcolors(maxcolors=1 << 20)}
    total = im.size[0] * im.size[1]
    assert colours.get("#ffffff", 0) < 0.8 * total  # not a blank page
    # the K and V of a KV page, and the weights' types, are painted where the page draws them
    for colour in (K_COLOUR, V_COLOUR, *{DTYPE_COLOURS[b.dtype] for b in lay.region("weights") if b.size > 2**20}):
        assert colours.get(colour, 0) > 2000, colour
    # what Chromium built from the page: every shape, and the heading (not an error page)
    dom = rendered_dom(page)
    assert "<h1>kiln memory layout" in dom and len(rects(dom).rects) == len(rects(page.read_text()).rects)
