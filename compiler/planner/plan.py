"""From a model argument and options to a validated, planned step graph: the front half of kiln.

GGUF -> spec -> architecture -> KV config -> graph -> passes -> layout.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..core.errors import GraphError
from ..core.options import CompileOptions
from ..frontend.architecture import Architecture
from ..frontend.architecture_file import load_architecture
from ..frontend.gguf_reader import read_model
from ..frontend.registry import resolve
from ..frontend.spec import ModelSpec
from ..ir.builder import build_graph
from ..ir.graph import Graph
from ..ir.kv import kv_config
from ..passes import PassContext, run_passes
from .layout import Layout, plan_layout


@dataclass(frozen=True)
class Planned:
    spec: ModelSpec
    arch: Architecture
    options: CompileOptions
    graph: Graph
    layout: Layout


def plan(model: str | os.PathLike[str], opts: CompileOptions, log=lambda s: None) -> Planned:
    spec = read_model(resolve(model, log))
    arch = load_architecture(spec.arch)
    kv = kv_config(spec.hparams, opts)
    try:
        graph = run_passes(build_graph(spec, arch, opts.batch_tokens, opts.ctx), PassContext(spec, kv))
    except GraphError as e:  # the file's tensors do not make the graph its architecture describes
        raise GraphError(f"{spec.path}: {e}") if str(spec.path) not in str(e) else e from None
    return Planned(spec, arch, opts, graph, plan_layout(graph, spec, arch, opts, kv))
