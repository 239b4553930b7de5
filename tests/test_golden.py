"""Golden outputs for a tiny synthetic llama (IR, layout maps, generated C): regenerated and diffed byte for byte.

After an intended change, refresh them with:  KILN_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_golden.py
and read the diff before committing it.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from compiler.codegen.render import generate
from compiler.core.options import CompileOptions
from compiler.ir.printer import format_graph
from compiler.planner.plan import plan
from compiler.planner.reports.html import render_html
from compiler.planner.reports.text import render_json, render_text
from synthetic import TinySpec, write_tiny_model

GOLDEN = Path(__file__).resolve().parent.parent / "generated" / "examples" / "tiny-llama"


def render_examples(workdir: Path) -> dict[str, str]:
    model = write_tiny_model(workdir / "tiny-llama.gguf", TinySpec(arch="llama", wtype=Q.Q8_0))
    p = plan(model, CompileOptions(ctx=64, prefill_chunk=16))
    return {"ir.txt": format_graph(p.graph), "layout.txt": render_text(p.layout), "layout.json": render_json(p.layout),
            "layout.html": render_html(p.layout), "model.c": generate(p)}


def golden_differences(fresh: dict[str, str]) -> list[str]:
    """Each golden file that differs from its regenerated text, with the diff; and files missing or extra."""
    problems = []
    on_disk = sorted(p.name for p in GOLDEN.iterdir())
    if on_disk != sorted(fresh):
        problems.append(f"golden files {on_disk} != regenerated {sorted(fresh)}")
    for name, text in fresh.items():
        golden = (GOLDEN / name).read_text() if (GOLDEN / name).is_file() else ""
        if golden != text:
            diff = "".join(difflib.unified_diff(golden.splitlines(True), text.splitlines(True), name, "regenerated"))
            problems.append(f"{name} differs from its golden copy (KILN_UPDATE_GOLDEN=1 to accept):\n{diff[:4000]}")
    return problems


def test_golden_examples(tmp_path):
    fresh = render_examples(tmp_path)
    if os.environ.get("KILN_UPDATE_GOLDEN"):  # write them, then still compare: the test passes only if they hold
        for stale in GOLDEN.iterdir():
            stale.unlink()
        for name, text in fresh.items():
            (GOLDEN / name).write_text(text)
        pytest.skip(f"KILN_UPDATE_GOLDEN: wrote {len(fresh)} golden files; read `git diff {GOLDEN}` and run again")
    problems = golden_differences(fresh)
    assert not problems, "\n".join(problems)


def test_examples_are_deterministic(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert render_examples(tmp_path / "a") == render_examples(tmp_path / "b")


def test_ops_without_a_barrier_between_them_may_not_share_arena_bytes(tmp_path):
    """k and v run beside q (they read its quantized rows, with no barrier between them): a layout
    that put k's output over q's input is refused, not emitted as a race."""
    from dataclasses import replace

    from compiler.codegen.emit import CodegenError

    model = write_tiny_model(tmp_path / "tiny-llama.gguf", TinySpec(arch="llama", wtype=Q.Q8_0))
    p = plan(model, CompileOptions(ctx=64, prefill_chunk=16))
    assert "OP_NEXT" in generate(p)
    at = {b.name: b for b in p.layout.buffers}
    planted = [replace(b, offset=at["attn_norm"].offset) if b.name == "k" else b for b in p.layout.buffers]
    with pytest.raises(CodegenError, match="q and k run without a barrier, but k and attn_norm share arena bytes"):
        generate(replace(p, layout=replace(p.layout, buffers=tuple(planted))))
