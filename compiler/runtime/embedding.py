"""Embeddings and rerank scores from a model whose step returns hidden states (an encoder, or a
decoder compiled with embedding=True): inputs packed whole into steps, each input's rows pooled
and normalized as llama.cpp's embedding path does, in float64 and rounded once.

A vector depends only on its own input's rows. Each row's hidden state is bitwise the same
however the step was batched (the kernels keep one order of operations per row), and pooling reads
one input's rows in their order, so an input's vector is the same alone, among many, in any order
and at any thread count.
"""
from __future__ import annotations

from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass

import numpy as np

from ..core.errors import OptionError
from .status import ModelError

# llama.cpp's pooling_type values (the GGUF's {arch}.pooling_type), by name
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
POOLING_NAMES = {v: k for k, v in POOLING.items()}
MAX_NORM = 64  # the highest p of a p-norm: beyond it, the max-abs norm is what is meant


@dataclass(frozen=True)
class Pooling:
    """How an input's rows become its vector: `kind` (POOLING), `normalize` as llama-server's
    embd_normalize (-1 none, 0 max-abs scaled to int16, 1 taxicab, 2 Euclidean, p > 2 the p-norm),
    `dimensions` (Matryoshka: the first d, then normalized; None: all)."""
    kind: str = "mean"
    normalize: int = 2
    dimensions: int | None = None

    def check(self, n_embd: int) -> "Pooling":
        if self.kind not in POOLING:
            raise OptionError(f"pooling must be one of {', '.join(POOLING)}, got {self.kind!r}")
        if isinstance(self.normalize, bool) or not isinstance(self.normalize, int) or \
                not -1 <= self.normalize <= MAX_NORM:
            raise OptionError(f"normalize must be an integer from -1 (none) to {MAX_NORM}, got {self.normalize!r}")
        d = self.dimensions
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= n_embd):
            raise OptionError(f"dimensions must be an integer from 1 to the model's {n_embd}, got {d!r}")
        return self


def default_pooling(model) -> str:
    """The file's pooling_type; a model whose file names none pools as llama.cpp then does for it:
    an encoder by the mean, a decoder by its last token."""
    kind = model.spec.hparams.pooling
    if kind is not None:
        if kind not in POOLING_NAMES:
            raise ModelError(f"{model.spec.path}: pooling_type {kind} is not one llama.cpp defines (0..4)")
        return POOLING_NAMES[kind]
    return "last" if model.spec.hparams.causal else "mean"


def normalized(v: np.ndarray, norm: int) -> np.ndarray:
    """llama.cpp's common_embd_normalize, in float64; a zero vector stays zero."""
    if norm < 0:
        return v
    if norm == 0:
        total = np.abs(v).max(initial=0.0) / 32760.0
    elif norm == 2:
        total = np.sqrt(np.dot(v, v))
    else:
        total = np.sum(np.abs(v) ** norm) ** (1.0 / norm)
    return v / total if total > 0 else np.zeros_like(v)


def pooled(rows: np.ndarray, kind: str, causal: bool) -> np.ndarray:
    """One input's vector from its hidden rows [n_tokens, n_embd] (rank: the row its class head reads)."""
    rows = rows.astype(np.float64)
    if kind == "mean":
        return rows.sum(axis=0) / rows.shape[0]
    if kind == "cls" or (kind == "rank" and not causal):
        return rows[0]
    return rows[-1]  # last, a causal reranker's last token, or (none: each token on its own) the token


def _rows_wanted(kind: str, causal: bool) -> str:
    return "last" if kind == "last" or (kind == "rank" and causal) else "all"


def hidden_states(model, inputs: SequenceABC[SequenceABC[int]], kind: str) -> list[np.ndarray]:
    """Each input's hidden rows that `kind` pools (all of them, or its last), inputs packed whole
    into steps of up to batch_tokens rows and as many sequences as are free. A bidirectional model
    sees each input in one step (the planner sized the step for its longest); a causal one may take
    a longer input in chunks."""
    causal, limit = model.spec.hparams.causal, model.options.batch_tokens
    want = _rows_wanted(kind, causal)
    out: list[list[np.ndarray]] = [[] for _ in inputs]
    pending = list(range(len(inputs)))
    while pending:
        step: list[tuple[int, object]] = []  # (input index, its Sequence)
        rows = 0
        try:
            while pending and (not step or rows + len(inputs[pending[0]]) <= limit):
                i = pending[0]
                if len(inputs[i]) > limit:  # causal only: its chunks alone, before the next step
                    if step:
                        break
                    _chunked(model, inputs[i], want, out[i])
                    pending.pop(0)
                    continue
                step.append((i, model.sequence()))
                rows += len(inputs[i])
                pending.pop(0)
        except ModelError:  # every sequence is open: run what the step has
            if not step:
                raise
        try:
            if step:
                got = model.instance.step([(s, inputs[i]) for i, s in step], [want] * len(step))
                sizes = [len(inputs[i]) if want == "all" else 1 for i, _ in step]
                for (i, _), part in zip(step, np.split(got, np.cumsum(sizes)[:-1])):
                    out[i].append(part)
        finally:
            for _, s in step:
                s.close()
    return [np.concatenate(parts) for parts in out]


def _chunked(model, ids: SequenceABC[int], want: str, out: list[np.ndarray]) -> None:
    limit = model.options.batch_tokens
    with model.sequence() as seq:
        for at in range(0, len(ids), limit):
            part = list(ids[at:at + limit])
            last = at + limit >= len(ids)
            wanted = want if want == "all" or last else None
            got = model.instance.step([(seq, part)], [wanted])
            if wanted is not None:
                out.append(got)


def _token_ids(model, inputs, field: str) -> list[list[int]]:
    """Each input's ids: a string is tokenized as llama.cpp's embedding path does (special tokens
    added and parsed), a list of ints taken as ids. Empty and over-long inputs are refused by index."""
    if isinstance(inputs, str) or (isinstance(inputs, SequenceABC) and inputs and isinstance(inputs[0], int)):
        inputs = [inputs]
    if not isinstance(inputs, SequenceABC) or isinstance(inputs, (bytes, bytearray)) or not inputs:
        raise ModelError(f"{field}: expected a string, a list of strings, or token ids, got an empty or foreign value")
    out = []
    for k, item in enumerate(inputs):
        ids = model.tokenize(item) if isinstance(item, str) and item else [int(t) for t in item]
        if not ids:
            raise ModelError(f"{field}[{k}]: the input is empty")
        if len(ids) > model.n_ctx:
            raise ModelError(f"{field}[{k}]: the input has {len(ids)} tokens but the model takes at most "
                             f"{model.n_ctx} (its context)")
        out.append(ids)
    return out


def embed(model, inputs, pooling: Pooling) -> np.ndarray | list[np.ndarray]:
    """[n_inputs, dims] float32 vectors; pooling "none": one [n_tokens, dims] array an input."""
    pooling = pooling.check(model.spec.hparams.n_embd)
    if pooling.kind == "rank":
        raise OptionError("pooling 'rank' scores (query, document) pairs: use rerank")
    rows = hidden_states(model, _token_ids(model, inputs, "input"), pooling.kind)
    if pooling.kind == "none":
        return [vectors(list(part[:, None]), pooling, True, model.projection) for part in rows]
    return vectors(rows, pooling, model.spec.hparams.causal, model.projection)


def vectors(rows: SequenceABC[np.ndarray], pooling: Pooling, causal: bool,
            projection: "Projection | None" = None) -> np.ndarray:
    """[n_inputs, dims] float32: each input's rows pooled, projected (where the model has Dense
    layers), cut to `dimensions`, normalized."""
    d = pooling.dimensions
    project = projection.apply if projection is not None else (lambda v: v)
    out = [normalized(v[:d] if d else v, pooling.normalize)
           for v in (project(pooled(p, pooling.kind, causal)) for p in rows)]
    return np.stack(out).astype(np.float32)


def _tensor(spec, name: str) -> np.ndarray | None:
    """A small tensor of the file dequantized to float64, in numpy's order; None where it is absent."""
    from gguf.quants import dequantize

    t = spec.tensors.get(name)
    if t is None:
        return None
    raw = np.fromfile(spec.path, np.uint8, t.nbytes, offset=t.offset)
    return dequantize(raw, t.dtype.value).reshape(t.shape).astype(np.float64)


class Projection:
    """Sentence-transformers' Dense layers after pooling, as llama.cpp's build_dense_out applies
    them (EmbeddingGemma's 768 -> 3072 -> 768): the pooled vector through dense_2 (+ its bias), then
    dense_3, no activation, in float64 like the pooling before it."""

    TENSORS = ("dense_2.weight", "dense_2.bias", "dense_3.weight")

    def __init__(self, spec):
        self.w2, self.b2, self.w3 = (_tensor(spec, name) for name in self.TENSORS)

    @classmethod
    def of(cls, spec) -> "Projection | None":
        return cls(spec) if any(name in spec.tensors for name in cls.TENSORS) else None

    def apply(self, v: np.ndarray) -> np.ndarray:
        if self.w2 is not None:
            v = self.w2 @ v
        if self.b2 is not None:
            v = v + self.b2
        return self.w3 @ v if self.w3 is not None else v


class ClassHead:
    """A reranker's classification head (llama.cpp's RANK pooling), read from the file: the pooled
    row through cls (+ cls.bias, then tanh) where the file has it, then cls.output (+ its bias);
    a Qwen3 reranker's two outputs (yes, no) through a softmax. The score is output 0."""

    def __init__(self, model):
        spec = model.spec
        if "cls.output.weight" not in spec.tensors and "cls.weight" not in spec.tensors:
            raise ModelError(f"{spec.path}: the model has no classification head (cls.output.weight); it can "
                             "embed but not rerank")
        self.dense, self.dense_b = _tensor(spec, "cls.weight"), _tensor(spec, "cls.bias")
        self.out, self.out_b = _tensor(spec, "cls.output.weight"), _tensor(spec, "cls.output.bias")
        self.softmax = spec.arch in ("qwen3", "qwen3vl")

    def score(self, v: np.ndarray) -> float:
        if self.dense is not None:
            v = self.dense @ v + (self.dense_b if self.dense_b is not None else 0.0)
            v = np.tanh(v)
        if self.out is not None:
            v = self.out @ v + (self.out_b if self.out_b is not None else 0.0)
        if self.softmax:
            e = np.exp(v - v.max())
            v = e / e.sum()
        return float(np.float32(v[0]))

    def scores(self, rows: SequenceABC[np.ndarray], causal: bool) -> np.ndarray:
        """Each input's score from its hidden rows (float32)."""
        return np.array([self.score(pooled(part, "rank", causal)) for part in rows], np.float32)


def rerank_ids(model, query: str, document: str) -> list[int]:
    """llama-server's format_prompt_rerank: the model's `rerank` chat template where it has one,
    filled with the pair; else [BOS] query [EOS] [SEP] document [EOS], each where the vocab adds it."""
    tok = model.spec.tokenizer
    if tok.rerank_template:  # special-token text in the template is parsed, and nothing is added
        return model.tokenize(tok.rerank_template.replace("{query}", query).replace("{document}", document),
                              add_special=False)
    q, d = (model.tokenize(text, add_special=False, parse_special=False) for text in (query, document))
    bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    eos = [tok.eos_id] if tok.add_eos and tok.eos_id is not None else []
    sep = [tok.sep_id] if tok.add_sep and tok.sep_id is not None else []
    return bos + q + eos + sep + d + eos


def rerank(model, query: str, documents: SequenceABC[str], head: ClassHead) -> np.ndarray:
    """Each document's relevance score to the query, in the documents' order (float32)."""
    if not isinstance(query, str) or not query:
        raise ModelError("query: expected a non-empty string")
    if isinstance(documents, str) or not documents or not all(isinstance(d, str) and d for d in documents):
        raise ModelError("documents: expected a non-empty list of non-empty strings")
    ids = _token_ids(model, [rerank_ids(model, query, d) for d in documents], "documents")
    return head.scores(hidden_states(model, ids, "rank"), model.spec.hparams.causal)
