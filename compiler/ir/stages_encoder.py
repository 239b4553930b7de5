"""The block stages of a post-norm encoder (BERT and its variants): a plain FFN's up projection and
activation, and the LayerNorms of the residual stream itself after each residual add. stages.py's
STAGES maps them."""
from __future__ import annotations

from .emitter import GraphBuilder
from .graph import GluAttrs, Node, NormAttrs, Op


def ffn_up(b: GraphBuilder) -> None:
    """A plain FFN's up projection and its activation (BERT's GELU): no gate."""
    up = b.matmul("ffn_up", b.cur, "ffn_up", (b.T, b.hp.n_ff), b.arch.ffn_bias)
    b.cur = b.emit(Op.ACTIVATE, "ffn_act", (up,), up.shape, GluAttrs(b.arch.activation))


def _residual_norm(b: GraphBuilder, name: str, role: str) -> None:
    """A post-norm encoder's: the residual stream itself normed in place; the next stage reads it."""
    w = b.layer_weight(role)
    b.nodes.append(Node(Op.LAYER_NORM, name, (b.x, w, b.layer_weight(role, "bias")), (b.x,),
                        NormAttrs(eps=b.hp.norm_eps, weight_offset=0.0)))
    b.cur = b.x


def attn_out_norm(b: GraphBuilder) -> None:
    _residual_norm(b, "attn_out_norm", "attn_output_norm")


def layer_out_norm(b: GraphBuilder) -> None:
    _residual_norm(b, "layer_out_norm", "layer_output_norm")
