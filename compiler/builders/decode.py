"""Decode: one token per step."""
from __future__ import annotations

from ..gguf_model import ModelSpec
from ..ir import Graph, Mode
from ..templates import Template
from .common import GraphBuilder


def build_decode(spec: ModelSpec, tmpl: Template) -> Graph:
    b = GraphBuilder(spec, tmpl, Mode.DECODE, n_tokens=1)
    b.embed()
    b.blocks()
    b.logits()
    return b.graph()
