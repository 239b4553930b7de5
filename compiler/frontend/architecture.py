"""Architectures: what a model family computes, as data (its template, templates/<arch>.json).

An architecture says which block stages run in which order and how each is parameterised
(norm, rope layout, activation, ...). Hyperparameters come from the GGUF and dtypes from
the weights, never from here. architecture_file.py reads a template into an Architecture and
rejects unknown or missing fields by name.

("Template" alone means this file; chat templates (text/chat.py) and the C templates of the
code generator (codegen/c_templates) are always named so.)
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum




class Stage(Enum):
    """A step of a transformer block; the builder expands each into IR nodes."""

    ATTN_NORM = "attn_norm"
    QKV = "qkv"
    QK_NORM = "qk_norm"
    ROPE = "rope"
    ATTENTION = "attention"
    ATTN_OUTPUT = "attn_output"
    ATTN_POST_NORM = "attn_post_norm"
    ATTN_RESIDUAL = "attn_residual"
    FFN_NORM = "ffn_norm"
    FFN_GLU = "ffn_glu"
    FFN_DOWN = "ffn_down"
    FFN_MOE = "ffn_moe"  # a router and experts in place of ffn_glu (or ffn_up) and ffn_down (the template's `moe`)
    FFN_POST_NORM = "ffn_post_norm"
    FFN_RESIDUAL = "ffn_residual"
    # a recurrent layer's mixer in place of attention (the template's `recurrent_block`): a Gated
    # DeltaNet, whose per-sequence state is a short conv window and one matrix a value head
    DELTA_NET = "delta_net"
    # after ffn_moe: a shared expert every row runs, gated by sigmoid(ffn_gate_inp_shexp . x), added to the
    # experts' sum (Qwen3-Next, Qwen3.5-MoE)
    FFN_SHARED_EXPERT = "ffn_shared_expert"
    # Gemma 4's: the layer's per-layer embedding (its slice of the head's inp_per_layer, gated by
    # gelu(per_layer_inp_gate . x), projected, normed) added to the residual; then the whole
    # residual times the layer's layer_output_scale
    PER_LAYER_EMBEDDING = "per_layer_embedding"
    LAYER_OUTPUT_SCALE = "layer_output_scale"
    # Gemma 4's 26B-A4B, in a layer that has a router: experts beside the dense FFN (which is then
    # their shared MLP), each branch normed, their sum the FFN's output
    FFN_MOE_BESIDE = "ffn_moe_beside"
    # an encoder's (BERT): the plain FFN's up projection and its activation, in place of ffn_glu;
    # and the post-norms of the residual stream itself, after attention's and after the FFN's
    FFN_UP = "ffn_up"
    ATTN_OUT_NORM = "attn_out_norm"
    LAYER_OUT_NORM = "layer_out_norm"


class RopeLayout(Enum):
    PAIRWISE = "pairwise"  # rotate (x[2i], x[2i+1]): GGUF llama (the converter permutes Q/K for it)
    NEOX = "neox"  # rotate (x[i], x[i + d/2]): qwen2, qwen3, gemma3


class Activation(Enum):
    SWIGLU = "swiglu"  # silu(gate) * up
    GEGLU = "geglu"  # gelu_tanh(gate) * up
    SIGMOID = "sigmoid"  # sigmoid(gate) * up: an attention output gate (attn_output_gate), not an FFN's
    # gpt-oss's experts (llama.cpp's swiglu_oai, alpha 1.702 and limit 7): g = min(gate, 7),
    # g sigmoid(1.702 g) (clamp(up, -7, 7) + 1)
    SWIGLU_OAI = "swiglu_oai"
    GELU = "gelu"  # a plain FFN's x Phi(x) (erf), BERT's: no gate
    GEGLU_ERF = "geglu_erf"  # gate Phi(gate) (erf) * up: jina-bert-v2's GLU, as its own code computes it


class EmbeddingScale(Enum):
    NONE = "none"
    SQRT_N_EMBD = "sqrt_n_embd"  # gemma: embeddings are multiplied by sqrt(n_embd)
    METADATA = "metadata"  # granite: by the GGUF's {arch}.embedding_scale (absent or 0: not scaled)


class Scalar(Enum):
    """A number the architecture applies that only the GGUF knows, or none."""
    NONE = "none"
    METADATA = "metadata"  # the GGUF's key for it (METADATA_KEYS)


class RopeFactors(Enum):
    """Per-dimension rope frequency factors, theta_i / factor_i, from a tensor of head_dim / 2."""
    NONE = "none"
    FREQS = "freqs"  # rope_freqs.weight where the file has it (Llama 3's, which its converter computes)
    LONG_SHORT = "long_short"  # Phi-3's LongRoPE: rope_factors_long.weight when the context exceeds the
    # original one (rope.scaling.original_context_length), else rope_factors_short.weight
    FREQS_GLOBAL = "freqs_global"  # rope_freqs.weight on the global layers alone (Gemma 4's proportional rope)


# The tensors each kind of factors comes in (no `blk.N.` prefix: llama.cpp reads one for every layer)
ROPE_FACTOR_TENSORS: dict[RopeFactors, tuple[str, ...]] = {
    RopeFactors.NONE: (),
    RopeFactors.FREQS: ("rope_freqs.weight",),
    RopeFactors.LONG_SHORT: ("rope_factors_long.weight", "rope_factors_short.weight"),
    RopeFactors.FREQS_GLOBAL: ("rope_freqs.weight",),
}


class RopeScaling(Enum):
    LINEAR = "linear"  # positions divided by rope.scaling.factor
    YARN = "yarn"  # YaRN: interpolate the slow dimensions, keep the fast ones, scale the attention
    LONGROPE = "longrope"  # the rope_factors_* tensors and rope.scaling.attn_factor


@dataclass(frozen=True)
class AttentionScale:
    """The scale of q . k: 1/sqrt(head_dim); or the GGUF's {arch}.attention.scale (granite; absent or
    0: 1/sqrt(head_dim)); or Gemma's 1/sqrt(query_pre_attn_scalar), which the GGUF does not carry:
    n_embd / n_head for the model with `n_embd_per_head_at_layers` layers (the 27B), head_dim for
    the others, as llama.cpp tells them apart; or 1 ("unit": Gemma 4, whose q and k norms do it)."""
    rule: str  # "inv_sqrt_head_dim" | "metadata" | "n_embd_per_head_at_layers" | "unit"
    layers: int | None = None


class LMHead(Enum):
    TIED = "tied"  # logits use token_embd.weight
    OUTPUT_OR_TIED = "output_or_tied"  # output.weight when the file has it, else tied
    OUTPUT = "output"  # output.weight, which the file must have (OLMoE, as llama.cpp requires it)
    NONE = "none"  # an encoder: the step returns each wanted row's hidden state, which the runtime pools


class QKNormSpan(Enum):
    """What the qk_norm stage normalizes: each head of Q and K (Qwen3), or all of a row's heads at
    once, before they are split into heads (OLMoE, whose attn_q_norm holds n_embd weights)."""
    HEAD = "head"
    ROW = "row"


@dataclass(frozen=True)
class MoE:
    """A mixture-of-experts FFN (stage ffn_moe), as llama.cpp's build_moe_ffn computes it: the
    router ffn_gate_inp gives each row n_expert logits (plus its bias where `router_bias`). With
    softmax gating, their softmax, the top n_expert_used experts by it (argsort order, ties as
    llama.cpp's sort leaves them), those probabilities (divided by their sum where `normalize`);
    with softmax_weight gating (gpt-oss), the top experts by the logits themselves, and the softmax
    of those k logits. Each chosen expert's GLU FFN (the 3-D ffn_gate_exps, ffn_up_exps,
    ffn_down_exps: an expert is one slice; each matmul plus its expert's row of the 2-D bias where
    `expert_biases`), or, where the template's activation is the plain gelu, an FFN without a gate
    (ffn_up_exps, GELU, ffn_down_exps: nomic-bert-moe's), its output times its weight, summed over
    the experts in rank order."""
    normalize: bool  # llama.cpp's norm_w: qwen3moe renormalizes the top-k weights, olmoe does not
    ffn_length_key: str  # the GGUF key (under '{arch}.') of an expert's FFN width
    gating: str = "softmax"  # or "softmax_weight"
    router_bias: bool = False  # ffn_gate_inp.bias
    expert_biases: bool = False  # ffn_gate_exps.bias, ffn_up_exps.bias, ffn_down_exps.bias


# An expert's FFN width: qwen3moe's own key (absent: feed_forward_length / expert_used_count, as
# llama.cpp takes it), or olmoe's feed_forward_length
MOE_FFN_LENGTH_KEYS = ("expert_feed_forward_length", "feed_forward_length")


class AttnVariant(Enum):
    DENSE = "dense"  # every layer attends to the whole context
    HYBRID_SLIDING = "hybrid_sliding"  # layer_pattern mixes sliding-window and global layers


class LayerKind(Enum):
    GLOBAL = "global"
    LOCAL = "local"  # sliding window
    RECURRENT = "recurrent"  # a recurrent block (recurrent_block): state per sequence, no KV
    MOE = "moe"  # a global attention layer whose FFN is the template's experts (moe_block)


class KVLayout(Enum):
    LAYER_KV_HEAD_POS = "layer_kv_head_pos"  # [layer][K|V][kv_head][position][head_dim]


@dataclass(frozen=True)
class Architecture:
    arch: str
    description: str
    block: tuple[Stage, ...]
    norm: str
    norm_weight_offset: float
    rope_layout: RopeLayout
    rope_base_local: float | None  # sliding-window layers' rope base; None: the file's, as global layers
    qkv_bias: bool
    activation: Activation
    embedding_scale: EmbeddingScale
    lm_head: LMHead
    kv_layout: KVLayout
    attn_variant: AttnVariant
    layer_pattern: tuple[LayerKind, ...] | None
    chat_template: str | None  # templates/chat/<name>.jinja: the chat format when the GGUF carries none
    fused_qkv: bool  # one attn_qkv tensor holds Q's rows, then K's, then V's (Phi-3)
    fused_ffn_up: bool  # ffn_up holds the gate's rows, then up's, and there is no ffn_gate (Phi-3)
    rope_scaling: tuple[RopeScaling, ...]  # the rope.scaling.type values it implements, with their keys
    rope_factors: RopeFactors
    attention_scale: AttentionScale
    residual_scale: Scalar  # each residual branch times it before it is added (granite)
    logit_scale: Scalar  # logits divided by it (granite; the key is then required, as llama.cpp requires it)
    attn_softcap: float | None  # scores -> c tanh(s / c), c from the GGUF or this default; None: no cap
    final_softcap: float | None  # the same on the logits
    requires: tuple[tuple[str, tuple], ...]  # metadata a file may carry only with these values
    moe: MoE | None = None  # the experts of an ffn_moe stage; None: a dense FFN
    qk_norm_span: QKNormSpan = QKNormSpan.HEAD
    # the block of the layers the GGUF marks recurrent (its attention.recurrent_layers, else all but
    # every full_attention_interval-th); None: every layer runs `block`
    recurrent_block: tuple[Stage, ...] | None = None
    # Q's projection holds each head's query and then its output gate; attention's output is
    # multiplied by sigmoid(gate) before attn_output (Qwen3.5, Qwen3-Next)
    attn_output_gate: bool = False
    ffn_norm_weight: str = "ffn_norm"  # the FFN norm's tensor (Qwen3.5 calls it post_attention_norm)
    # which key head a DeltaNet's value head h reads: h % n_k ("modulo", llama.cpp's qwen35) or
    # h // (n_v / n_k) ("interleaved", its qwen3next's repeat_interleave)
    head_pairing: str = "modulo"
    # every n-th layer ((il + 1) % n == 0) has no rotary embedding (NoPE): llama.cpp's fixed
    # n_no_rope_layer_step (SmolLM3's 4); None: every attention layer rotates
    nope_layer_step: int | None = None
    # a learned logit per head (attn_sinks) joins each softmax's denominator (gpt-oss)
    attn_sinks: bool = False
    attn_output_bias: bool = False  # attn_output.bias (gpt-oss)
    # each layer kind runs a body of its own (Gemma 4: sliding and global layers differ in head
    # dims, KV heads and tensors, read from the file per layer)
    kind_bodies: bool = False
    # the file's attention.shared_kv_layers last layers keep no KV: each attends to the last earlier
    # layer of its kind that does (Gemma 4, as llama.cpp reuses them)
    shared_kv: bool = False
    # a layer without attn_v takes K's projection as V (Gemma 4's attention_k_eq_v)
    k_as_v: bool = False
    # V is RMS-normed per head, without a weight (Gemma 4)
    v_norm: bool = False
    # "absolute": the head adds a learned row per position (position_embd), BERT's; a template of
    # LayerNorms (norm "layer") also adds the token-type row 0 and LayerNorms the sum (emitter.py)
    position_embedding: str = "none"
    # "metadata": attention is bidirectional where the file's attention.causal is false (an encoder
    # sees its whole input at once); "never": always bidirectional, whatever the file says, as
    # llama.cpp runs EmbeddingGemma; "always": causal, and the file may not say otherwise
    causal: str = "always"
    ffn_bias: bool = False  # ffn_up.bias and ffn_down.bias (BERT)
    # the block of the layers the GGUF's moe_every_n_layers makes MoE layers (il % n == 1, as
    # llama.cpp's nomic-bert-moe reads it): `block`'s with ffn_moe in place of the dense FFN's
    # stages; None: every layer runs `block` (a template with `moe` then has ffn_moe there)
    moe_block: tuple[Stage, ...] | None = None
    # ALiBi in place of positions (jina-bert-v2): each score plus slope_h * -|i - j|, the slopes
    # from this max bias as ggml makes them (llama.cpp fixes jina-bert-v2's at 8); None: none
    alibi_max_bias: float | None = None

    def metadata_keys(self) -> frozenset[str]:
        """The keys under '{arch}.' this architecture reads: any other that changes the math is refused."""
        reads = {"embedding_scale": self.embedding_scale is EmbeddingScale.METADATA,
                 "attention_scale": self.attention_scale.rule == "metadata",
                 "residual_scale": self.residual_scale is Scalar.METADATA,
                 "logit_scale": self.logit_scale is Scalar.METADATA,
                 "attn_softcap": self.attn_softcap is not None,
                 "final_softcap": self.final_softcap is not None}
        keys = {METADATA_KEYS[field] for field, read in reads.items() if read}
        if self.rope_scaling:
            keys |= {"rope.scaling.type", "rope.scaling.factor", "rope.scale_linear", "rope.scaling.attn_factor"}
        if RopeScaling.YARN in self.rope_scaling:
            keys |= {"rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow"}
        if self.moe is not None:
            keys |= {"expert_count", "expert_used_count", self.moe.ffn_length_key}
        if self.recurrent_block is not None:
            keys |= set(RECURRENT_KEYS)
        if self.moe_block is not None:
            keys.add("moe_every_n_layers")
        if Stage.FFN_SHARED_EXPERT in self.block:
            keys.add("expert_shared_feed_forward_length")
        if self.kind_bodies:
            keys |= set(KIND_KEYS)
        if Stage.FFN_MOE_BESIDE in self.block:
            keys |= {"expert_count", "expert_used_count", "expert_feed_forward_length"}
        if self.shared_kv:
            keys |= set(SHARED_KV_KEYS)
        if self.causal != "always":
            keys.add("attention.causal")
        if self.norm == "layer":
            keys.add("attention.layer_norm_epsilon")
        return frozenset(keys)

    @property
    def qk_norm(self) -> bool:
        return Stage.QK_NORM in self.block

    @property
    def post_norms(self) -> bool:
        return Stage.ATTN_POST_NORM in self.block

    def softcap_value(self, field: str, value: float | None) -> float:
        """A soft-cap's c: the file's value (0: no cap, as llama.cpp reads it), else the template's
        default (none: no cap)."""
        return value if value is not None else (getattr(self, field) or 0.0)

    def layer_kind(self, il: int, recurrent: tuple[bool, ...] = (), swa: tuple[bool, ...] = (),
                   moe: tuple[bool, ...] = ()) -> LayerKind:
        """Layer il's kind: recurrent, or MoE, where the file's mask says so, else by the layer
        pattern (the template's, or the file's sliding_window_pattern where the template says
        `metadata`)."""
        if il < len(recurrent) and recurrent[il]:
            return LayerKind.RECURRENT
        if il < len(moe) and moe[il]:
            return LayerKind.MOE
        if self.layer_pattern is None:
            return LayerKind.GLOBAL
        if self.layer_pattern == FROM_FILE:
            return LayerKind.LOCAL if swa[il] else LayerKind.GLOBAL
        return self.layer_pattern[il % len(self.layer_pattern)]

    def block_of(self, kind: LayerKind) -> tuple[Stage, ...]:
        """The stages a layer of this kind runs."""
        own = {LayerKind.RECURRENT: self.recurrent_block, LayerKind.MOE: self.moe_block}.get(kind)
        return own if own is not None else self.block

    def rotates(self, il: int) -> bool:
        """Whether attention layer il applies rope (not a NoPE layer)."""
        return self.nope_layer_step is None or (il + 1) % self.nope_layer_step != 0


# layer_pattern "metadata": the kinds are the file's attention.sliding_window_pattern, one flag a layer
FROM_FILE: tuple = ()
# The keys (under '{arch}.') of a template whose layer kinds differ in shape, read per layer, and of
# one whose last layers share KV (frontend/metadata.py's read_layers reads them)
KIND_KEYS = ("attention.sliding_window_pattern", "attention.key_length_swa", "attention.value_length_swa",
             "rope.dimension_count_swa", "rope.freq_base_swa", "embedding_length_per_layer_input")
SHARED_KV_KEYS = ("attention.shared_kv_layers",)

# The keys (under '{arch}.') a recurrent template reads: the DeltaNet's sizes, which layers are
# recurrent, and the rope sections of its attention layers (llama.cpp's names)
RECURRENT_KEYS = ("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank", "ssm.group_count",
                  "full_attention_interval", "attention.recurrent_layers", "rope.dimension_sections")

# The GGUF key (under '{arch}.') of each number a template can take from the file.
METADATA_KEYS = {
    "embedding_scale": "embedding_scale",
    "attention_scale": "attention.scale",
    "residual_scale": "residual_scale",
    "logit_scale": "logit_scale",
    "attn_softcap": "attn_logit_softcapping",
    "final_softcap": "final_logit_softcapping",
}
