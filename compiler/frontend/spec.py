"""What kiln knows of a model once its GGUF is read: hyperparameters, tensors, tokenizer data.

frontend/gguf_reader.py builds a ModelSpec and checks everything the later stages rely on, so
they can trust it.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from ..core.dtypes import DType
from ..core.errors import ModelFileError


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file. `shape` is outermost-first (numpy order; GGML's ne reversed)."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int
    view_of: str | None = None  # a range of rows of this file tensor (Phi-3's fused attn_qkv), or None

    def rows(self, first: int, count: int) -> "TensorInfo":
        """Rows first .. first + count - 1 of this matrix, as a tensor of their own."""
        row_bytes = self.nbytes // self.shape[0]
        return TensorInfo(f"{self.name}[{first}:{first + count}]", self.dtype, (count, *self.shape[1:]),
                          self.offset + first * row_bytes, count * row_bytes, self.name)

    @property
    def n_elems(self) -> int:
        return int(np.prod(self.shape))


@dataclass(frozen=True)
class SSMParams:
    """A Gated DeltaNet's sizes, as llama.cpp names them: ssm.conv_kernel taps, ssm.state_size (the
    head dim of q, k and v), ssm.group_count key heads, ssm.time_step_rank value heads."""
    d_conv: int
    d_state: int
    n_k_heads: int
    n_v_heads: int

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.d_state

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.d_state

    @property
    def conv_dim(self) -> int:
        """The channels the conv sees: q's, k's, then v's."""
        return 2 * self.key_dim + self.value_dim

    def state_floats(self) -> tuple[int, int]:
        """f32s of one sequence's conv window (the last d_conv - 1 inputs) and delta-rule matrices."""
        return (self.d_conv - 1) * self.conv_dim, self.n_v_heads * self.d_state * self.d_state


PER_LAYER_FIELDS = ("layer_n_head_kv", "layer_n_ff", "swa_layers", "head_dim_swa", "n_rot_swa", "rope_base_swa",
                    "n_embd_per_layer")


@dataclass(frozen=True)
class HParams:
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    n_vocab: int
    rope_base: float
    norm_eps: float
    n_ctx_train: int
    sliding_window: int | None
    # RoPE scaling, as llama.cpp reads it (where the architecture implements it; else the defaults)
    rope_scaling: str = "none"  # none | linear | yarn | longrope (rope.scaling.type; absent: linear if a factor is set)
    rope_scaling_factor: float = 1.0  # positions are divided by it (linear, yarn; 0 in the file: 1)
    rope_attn_factor: float = 1.0  # the rotation's magnitude (rope.scaling.attn_factor; Phi-3's LongRoPE)
    rope_n_ctx_orig: int = 0  # rope.scaling.original_context_length, else the training context
    yarn_beta_fast: float = 32.0  # llama.cpp's defaults where the file has none
    yarn_beta_slow: float = 1.0
    # the numbers the architecture takes from the file (architecture.METADATA_KEYS), where present
    scalars: tuple[tuple[str, float], ...] = ()
    # a mixture of experts (the template's `moe`): experts per layer, used per token, an expert's FFN width
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    moe_layers: tuple[bool, ...] = ()  # the layers that run the template's moe_block (moe_every_n_layers)
    # a recurrent template's (Gated DeltaNet): which layers are recurrent, and their sizes
    recurrent_layers: tuple[bool, ...] = ()
    ssm: "SSMParams | None" = None
    # the last shared_kv_layers layers keep no KV of their own (Gemma 4's attention.shared_kv_layers)
    shared_kv_layers: int = 0
    # per layer, where the file gives them so (Gemma 4): head_count_kv, feed_forward_length, and which
    # layers slide (attention.sliding_window_pattern), whose heads, rotated dims and rope base are
    # the _swa keys'
    layer_n_head_kv: tuple[int, ...] = ()
    layer_n_ff: tuple[int, ...] = ()
    swa_layers: tuple[bool, ...] = ()
    head_dim_swa: int = 0
    n_rot_swa: int = 0
    rope_base_swa: float = 0.0
    n_embd_per_layer: int = 0  # the per-layer embeddings' width (embedding_length_per_layer_input; 0: none)
    causal: bool = True  # False: attention sees the whole input (attention.causal, an encoder's)
    pooling: int | None = None  # the file's pooling_type (llama.cpp's: 0 none, 1 mean, 2 cls, 3 last, 4 rank)

    def for_layer(self, il: int) -> "HParams":
        """The hyperparameters layer il's body is built with: the file's per-layer values where it
        has them, else the model's."""
        from dataclasses import replace

        out = {}
        if self.layer_n_head_kv:
            out["n_head_kv"] = self.layer_n_head_kv[il]
        if self.layer_n_ff:
            out["n_ff"] = self.layer_n_ff[il]
        if self.swa_layers and self.swa_layers[il]:
            out |= {"head_dim": self.head_dim_swa, "n_rot": self.n_rot_swa, "rope_base": self.rope_base_swa}
        return replace(self, **out) if out else self

    @property
    def rope_scaled(self) -> bool:
        return (self.rope_scaling != "none" and self.rope_scaling_factor != 1.0) or self.rope_attn_factor != 1.0 \
            or self.rope_scaling == "yarn"

    def per_layer(self) -> list[tuple[str, object]]:
        """The per-layer values, as the layout's configuration shows them."""
        out = [(name, getattr(self, name)) for name in PER_LAYER_FIELDS if getattr(self, name)]
        return [(n, "".join("S" if x else "F" for x in v) if n == "swa_layers" else v) for n, v in out]

    def scalar(self, key: str) -> float | None:
        return dict(self.scalars).get(key)

    def items(self) -> list[tuple[str, object]]:
        """(name, value) for the layout's configuration: RoPE scaling only where it scales, and the
        architecture's scalars by their GGUF keys."""
        shown = {"scalars": False, "rope_scaling": self.rope_scaled, "rope_scaling_factor": self.rope_scaled,
                 "rope_attn_factor": self.rope_scaled, "rope_n_ctx_orig": self.rope_scaled,
                 "yarn_beta_fast": self.rope_scaling == "yarn", "yarn_beta_slow": self.rope_scaling == "yarn",
                 **{name: self.n_expert > 0 for name in ("n_expert", "n_expert_used", "n_ff_exp")},
                 "recurrent_layers": False, "ssm": False, "moe_layers": False,
                 "shared_kv_layers": self.shared_kv_layers > 0,
                 **{name: False for name in PER_LAYER_FIELDS}}
        out = [(f.name, getattr(self, f.name)) for f in fields(self) if shown.get(f.name, True)]
        out += self.per_layer()
        if any(self.moe_layers):  # which layers' FFN is the experts: M, else D(ense)
            out.append(("moe_layers", "".join("M" if m else "D" for m in self.moe_layers)))
        if self.ssm is not None:  # the layer kinds as a pattern, and the DeltaNet's sizes by their names
            out.append(("recurrent_layers", "".join("R" if r else "A" for r in self.recurrent_layers)))
            out += [(f"ssm_{f.name}", getattr(self.ssm, f.name)) for f in fields(self.ssm)]
        return out + list(self.scalars)


@dataclass(frozen=True)
class TokenizerData:
    """The tokenizer as the GGUF stores it; the tokenizer module turns it into one that runs."""

    model: str  # "gpt2" (BPE), "llama" (SentencePiece), "bert" (WordPiece), "gemma4" (BPE on U+2581 text)
    pre: str | None
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    scores: tuple[float, ...] | None
    merges: tuple[str, ...] | None
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: str | None
    eog_ids: frozenset[int]  # end of generation: eos, eot, eom and the turn-end tokens, as llama.cpp's set
    # llama.cpp's settings, each from its GGUF key or, where the key is absent, from the defaults
    # table in frontend/vocab.py (per tokenizer model and pre-tokenizer)
    pre_type: str | None = None  # the pre-tokenizer `pre` names (None: one llama.cpp does not know)
    sep_id: int | None = None
    add_sep: bool = False  # WordPiece: append [SEP]
    bos_always: bool = False  # add BOS even where the GGUF says not to (Gemma 4)
    clean_spaces: bool = False  # detokenizing: drop spaces before punctuation (clean_up_tokenization_spaces)
    ignore_merges: bool = False  # BPE: a pre-token that is itself a token is not merged from bytes
    escape_whitespaces: bool = False  # spaces become U+2581 before the pieces are looked up
    remove_extra_whitespaces: bool = False
    lowercase: bool = True  # WordPiece normalizer
    strip_accents: bool = True  # WordPiece normalizer
    name: str = ""  # general.name: llama.cpp keys a few per-token attributes on it (Phi-3)
    rerank_template: str | None = None  # tokenizer.chat_template.rerank: a reranker's {query}/{document} prompt
    # a unigram ("t5") vocabulary's (text/ugm.py): SentencePiece's normalization rules as the GGUF
    # stores them, and whether "<mask>" takes the whitespace before it (llama.cpp decides by architecture)
    precompiled_charsmap: bytes = b""
    lstrip_mask: bool = False


@dataclass(frozen=True)
class ModelSpec:
    path: Path
    arch: str
    name: str
    file_size: int
    data_offset: int  # first byte of tensor data; everything before it is the header
    header_sha256: str
    header_crc32: int  # a compiled library knows its GGUF by its size and this (runtime_c/instance.c)
    hparams: HParams
    tensors: dict[str, TensorInfo]
    tokenizer: TokenizerData

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelFileError(
                f"{self.path}: tensor '{name}' is missing; the {self.arch} template needs it "
                f"(is this a complete {self.arch} GGUF?)"
            ) from None

    @property
    def weights_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())
