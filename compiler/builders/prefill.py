"""Prefill: a chunk of up to `prefill_chunk` tokens per step.

Buffers are planned for a full chunk. Only the last token's logits are computed, so the
LM head costs [vocab], not [chunk, vocab].
"""
from __future__ import annotations

from ..gguf_model import ModelSpec
from ..ir import Graph, Mode
from ..templates import Template
from .common import GraphBuilder


def build_prefill(spec: ModelSpec, tmpl: Template, chunk: int) -> Graph:
    b = GraphBuilder(spec, tmpl, Mode.PREFILL, n_tokens=chunk)
    b.embed()
    b.blocks()
    b.last_token()
    b.logits()
    return b.graph()
