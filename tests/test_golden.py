"""Golden outputs for a tiny synthetic llama (IR, layout maps, generated C): regenerated and diffed byte for byte.

After an intended change, refresh them with:  KILN_UPDATE_GOLDEN=1 make test
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from compiler.codegen import generate
from compiler.ir.graph import Mode, format_graph
from compiler.core.options import CompileOptions
from compiler.driver import plan
from compiler.planner.reports.html import render_html
from compiler.planner.reports.text import render_json, render_text
from synthetic import TinySpec, write_tiny_model

GOLDEN = Path(__file__).resolve().parent.parent / "generated" / "examples" / "tiny-llama"


def render_examples(workdir: Path) -> dict[str, str]:
    model = write_tiny_model(workdir / "tiny-llama.gguf", TinySpec(arch="llama", wtype=Q.Q8_0))
    out, planned = {}, {}
    for mode in Mode:
        p = planned[mode] = plan(model, CompileOptions(ctx=64, prefill_chunk=16), mode)
        out[f"ir_{mode.value}.txt"] = format_graph(p.graph)
        out[f"layout_{mode.value}.txt"] = render_text(p.layout)
        out[f"layout_{mode.value}.json"] = render_json(p.layout)
    out["layout_decode.html"] = render_html(planned[Mode.DECODE].layout)
    src = generate(planned[Mode.DECODE], planned[Mode.PREFILL])
    out["model.c"], out["model.h"] = src.model_c, src.model_h
    return out


def test_golden_examples(tmp_path):
    fresh = render_examples(tmp_path)
    if os.environ.get("KILN_UPDATE_GOLDEN"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name, text in fresh.items():
            (GOLDEN / name).write_text(text)
    assert sorted(p.name for p in GOLDEN.iterdir()) == sorted(fresh)
    for name, text in fresh.items():
        golden = (GOLDEN / name).read_text()
        if golden != text:
            diff = "".join(difflib.unified_diff(golden.splitlines(True), text.splitlines(True), name, "regenerated"))
            pytest.fail(f"{name} differs from its golden copy (KILN_UPDATE_GOLDEN=1 to accept):\n{diff[:4000]}")


def test_examples_are_deterministic(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert render_examples(tmp_path / "a") == render_examples(tmp_path / "b")
