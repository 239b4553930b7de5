"""The recurrent state pool: one slot per sequence, fixed at compile time.

A recurrent layer (a Gated DeltaNet) carries, per sequence, the last ssm.conv_kernel - 1 inputs of
its conv and one [d_state][d_state] f32 matrix per value head: a size that does not grow with the
context, which is why it is not paged. Slot s belongs to sequence s; every recurrent layer has its
part of each slot at the same offset:

    conv window of (layer l, sequence s): s*slot_bytes + conv_offset[l], [taps - 1][channels] f32
    delta state of (layer l, sequence s): s*slot_bytes + delta_offset[l], [v_heads][d][d] f32

A slot's bytes are valid for the rows its sequence holds: a row at cache row 0 starts from zeros
(runtime_c/delta_net.c), so a new or reset sequence needs no clearing.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..frontend.architecture import LayerKind
from ..frontend.spec import SSMParams
from ..ir.graph import Layer
from .kv_plan import align


@dataclass(frozen=True)
class StateLayer:
    layer: int
    conv_offset: int  # of its conv window within a slot
    conv_bytes: int
    delta_offset: int  # of its delta-rule matrices within a slot
    delta_bytes: int


@dataclass(frozen=True)
class StatePlan:
    n_seq: int
    ssm: SSMParams
    layers: tuple[StateLayer, ...]
    slot_bytes: int  # one sequence's state, every recurrent layer's

    @property
    def total_bytes(self) -> int:
        return self.n_seq * self.slot_bytes

    def of(self, layer: int) -> StateLayer | None:
        return next((s for s in self.layers if s.layer == layer), None)


def plan_state(ssm: SSMParams | None, layers: tuple[Layer, ...], n_seq: int) -> StatePlan | None:
    recurrent = [ly.index for ly in layers if ly.kind is LayerKind.RECURRENT]
    if ssm is None or not recurrent:
        return None
    conv, delta = (4 * n for n in ssm.state_floats())
    out, at = [], 0
    for il in recurrent:
        out.append(StateLayer(il, at, conv, align(at + conv), delta))
        at = align(align(at + conv) + delta)
    return StatePlan(n_seq, ssm, tuple(out), at)
