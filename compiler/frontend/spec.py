"""What kiln knows of a model once its GGUF is read: hyperparameters, tensors, tokenizer data.

frontend/gguf_reader.py builds a ModelSpec and checks everything the later stages rely on, so
they can trust it.
"""
from __future__ import annotations

from dataclasses import dataclass
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

    @property
    def n_elems(self) -> int:
        return int(np.prod(self.shape))


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
