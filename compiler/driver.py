"""From a model argument and options to a validated, planned graph: the front half of kiln."""
from __future__ import annotations

import os
from dataclasses import dataclass

from .ir.builder import build_decode, build_prefill
from .core.errors import GraphError
from .frontend.spec import ModelSpec
from .frontend.gguf_reader import read_model
from .ir.graph import Graph, Mode
from .core.options import CompileOptions
from .passes import PassContext, run_passes
from .planner.kv_plan import plan_kv
from .planner.layout import Layout, plan_layout
from .frontend.registry import resolve
from .frontend.architecture import Architecture, load_architecture


@dataclass(frozen=True)
class Planned:
    spec: ModelSpec
    template: Architecture
    options: CompileOptions
    graph: Graph
    layout: Layout


def build_graph(spec: ModelSpec, arch: Architecture, opts: CompileOptions, mode: Mode) -> Graph:
    if mode is Mode.DECODE:
        return build_decode(spec, arch)
    return build_prefill(spec, arch, opts.batch_tokens)


def plan(model: str | os.PathLike[str], opts: CompileOptions, mode: Mode = Mode.DECODE,
         log=lambda s: None) -> Planned:
    spec = read_model(resolve(model, log))
    arch = load_architecture(spec.arch)
    kv = plan_kv(spec.hparams, arch, opts)
    try:
        graph = run_passes(build_graph(spec, arch, opts, mode), PassContext(spec, kv))
    except GraphError as e:  # the file's tensors do not make the graph its template describes
        raise GraphError(f"{spec.path}: {e}") if str(spec.path) not in str(e) else e from None
    return Planned(spec, arch, opts, graph, plan_layout(graph, spec, arch, opts, kv))
