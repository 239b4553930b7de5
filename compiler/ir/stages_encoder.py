"""The block stages of a post-norm encoder (BERT and its variants): a plain FFN's up projection and
activation, and the LayerNorms of the residual stream itself after each residual add. stages.py's
STAGES maps them."""
from __future__ import annotations

from .emitter import GraphBuilder
from .graph import GluAttrs, Op


def ffn_up(b: GraphBuilder) -> None:
    """A plain FFN's up projection and its activation (BERT's GELU): no gate."""
    up = b.matmul("ffn_up", b.cur, "ffn_up", (b.T, b.hp.n_ff), b.arch.ffn_bias)
    b.cur = b.emit(Op.ACTIVATE, "ffn_act", (up,), up.shape, GluAttrs(b.arch.activation))


def attn_out_norm(b: GraphBuilder) -> None:
    b.norm_stream("attn_out_norm", b.layer_weight("attn_output_norm"), b.layer_weight("attn_output_norm", "bias"))


def layer_out_norm(b: GraphBuilder) -> None:
    b.norm_stream("layer_out_norm", b.layer_weight("layer_output_norm"), b.layer_weight("layer_output_norm", "bias"))
