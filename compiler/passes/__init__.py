"""The pass pipeline, in order. Each pass takes a graph and returns a new one."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..frontend.spec import ModelSpec
from ..ir.graph import Graph
from ..ir.kv import KVConfig
from .kernel_select import select_kernels
from .kv_insert import insert_kv_ops
from .kv_rotate import rotate_kv
from .rope_table import rope_table
from .scratch import add_scratch
from .share_act import share_act
from .validate import validate


@dataclass(frozen=True)
class PassContext:
    spec: ModelSpec
    kv: KVConfig


PIPELINE: tuple[tuple[str, Callable[[Graph, PassContext], Graph]], ...] = (
    ("validate_built", lambda g, c: validate(g, c.spec)),
    ("kv_rotate", lambda g, c: rotate_kv(g, c.kv)),
    ("kv_insert", lambda g, c: insert_kv_ops(g, c.kv)),
    ("rope_table", lambda g, c: rope_table(g)),
    ("share_act", lambda g, c: share_act(g)),
    ("kernel_select", lambda g, c: select_kernels(g)),
    ("scratch", lambda g, c: add_scratch(g, c.kv)),
    ("validate", lambda g, c: validate(g, c.spec)),
)


def run_passes(g: Graph, ctx: PassContext) -> Graph:
    for _name, run in PIPELINE:
        g = run(g, ctx)
    return g
