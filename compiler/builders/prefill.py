"""The batch step: up to `batch_tokens` rows of any sequences (prefill chunks beside decode tokens).

Buffers are planned for a full batch. The LM head runs on the rows the caller asks for
(the last, or all) and writes straight into the caller's logits buffer, so the arena
never holds [chunk, vocab].
"""
from __future__ import annotations

from ..gguf_model import ModelSpec
from ..ir import Graph, Mode
from ..templates import Template
from .common import GraphBuilder


def build_prefill(spec: ModelSpec, tmpl: Template, batch_tokens: int) -> Graph:
    b = GraphBuilder(spec, tmpl, Mode.PREFILL, n_tokens=batch_tokens)
    b.embed()
    b.blocks()
    b.logits()
    return b.graph()
