"""The graph builder's primitives: it emits IR nodes in schedule order, binds each layer weight
role to its tensor in the first layer of the body being built, and builds the head, the tail and
the layer table. The block stages (stages.py) use these; builder.py puts the whole graph together.
"""
from __future__ import annotations

from dataclasses import replace
from math import sqrt

import numpy as np

from ..core.dtypes import DType
from ..core.errors import ArchitectureError, ModelFileError
from ..frontend.architecture import Architecture, EmbeddingScale, LayerKind, LMHead, RopeFactors, Scalar
from ..frontend.spec import ModelSpec, TensorInfo
from .graph import (Attrs, EmbedAttrs, Layer, MatmulAttrs, Node, NormAttrs, Op, RegroupAttrs, ScaleAttrs, Section,
                    SoftcapAttrs, Value, ValueKind)
from .rope import rope_factors

AS_ROW = (-1, 1)  # bind's marker: a vector read as a matrix of one row

# The step's inputs: the batch's arrays, one entry per row.
INPUTS = (
    ("inp_tokens", "token ids"),
    ("inp_pos", "rope positions"),
    ("inp_seq", "each row's sequence"),
    ("inp_row", "each row's index in its sequence's cache"),
    ("inp_out", "the rows whose logits are wanted"),
)
# ... and a bidirectional model's: the last cache row each row sees, its sequence's last in the step
SEEN = ("inp_seen", "each row's last visible cache row")


class GraphBuilder:
    """Emits nodes in schedule order and tracks the working values of the current stage."""

    def __init__(self, spec: ModelSpec, arch: Architecture, n_tokens: int, n_ctx: int | None = None,
                 embedding: bool = False):
        self.spec, self.arch, self.T = spec, arch, n_tokens
        # the step returns hidden states, not logits: an encoder's always, a decoder's when asked
        self.embedding = embedding or arch.lm_head is LMHead.NONE
        self.hp = spec.hparams
        self.nodes: list[Node] = []
        self.roles: dict[str, tuple[str, tuple[int, int] | None]] = {}  # role -> its tensor (blk.0.*), and rows
        self.kinds = tuple(arch.layer_kind(il, self.hp.recurrent_layers, self.hp.swa_layers, self.hp.moe_layers)
                           for il in range(self.hp.n_layer))
        self.kv_sources = tuple(self._kv_source(il) for il in range(self.hp.n_layer))
        self.body_names = self._body_names()
        self.first = 0  # the first layer of the body being built: its tensors give the shapes
        self.factors, self.unused = rope_factors(spec, arch, n_ctx)
        if arch.rope_factors is RopeFactors.FREQS_GLOBAL and self.factors is None and LayerKind.GLOBAL in self.kinds:
            spec.tensor("rope_freqs.weight")  # the global layers' proportional rope: llama.cpp requires it too
        inputs = INPUTS if self.hp.causal else (*INPUTS, SEEN)
        self.inputs = {name: Value(name, ValueKind.INPUT, (n_tokens,), DType.I32) for name, _ in inputs}
        self.x = Value("x", ValueKind.STATE, (n_tokens, self.hp.n_embd), DType.F32)  # the residual stream
        self.cur = self.q = self.k = self.v = self.x  # outputs of the latest stages
        self.gate: Value | None = None  # attention's output gate (attn_output_gate)
        self.ffn_in = self.x  # the FFN's normed input (a shared expert reads it beside the experts)
        p = self.hp.n_embd_per_layer  # Gemma 4's per-layer embeddings: [rows, layer, p], the head writes them
        self.per_layer = Value("inp_per_layer", ValueKind.STATE, (n_tokens, self.hp.n_layer, p), DType.F32) \
            if p else None

    @property
    def owns_kv(self) -> bool:
        """Whether the layers of the body being built keep KV of their own."""
        return self.kv_sources[self.first] == self.first

    # -- primitives -------------------------------------------------------------------------
    def weight(self, name: str, view_of: str | None = None) -> Value:
        t = self.spec.tensor(view_of or name)
        return Value(name, ValueKind.WEIGHT, t.shape, t.dtype, t)

    def layer_weight(self, name: str, suffix: str = "weight") -> Value:
        role = name if suffix == "weight" else f"{name}_{suffix}"
        return self.bind(role, f"blk.0.{name}.{suffix}")

    def bind(self, role: str, tensor: str, rows: tuple[int, int] | None = None, as_row: bool = False) -> Value:
        """The role's weight: a tensor of layer 0 (blk.0.*, the same name in each layer; another
        name is one tensor every layer shares), or its rows first .. first + count - 1; as_row: a
        vector read as a matrix of one row (rows (0, 1) of its one-row view)."""
        if as_row:
            rows = AS_ROW
        self.roles[role] = (tensor, rows)
        return Value(role, ValueKind.WEIGHT, self._tensor(self.first, tensor, rows).shape, None)

    def has(self, name0: str) -> bool:
        """Whether the first layer of the body being built has this tensor (named as in layer 0)."""
        return name0.replace("blk.0.", f"blk.{self.first}.", 1) in self.spec.tensors

    def first_tensor(self, name0: str) -> TensorInfo:
        """A tensor (named as in layer 0) of the first layer of the body being built."""
        return self.spec.tensor(name0.replace("blk.0.", f"blk.{self.first}.", 1))

    def _tensor(self, il: int, name0: str, rows: tuple[int, int] | None) -> TensorInfo:
        t = self.spec.tensor(name0.replace("blk.0.", f"blk.{il}.", 1))
        if rows is AS_ROW:
            return replace(t, shape=(1, *t.shape))
        if rows is None:
            return t
        if t.shape[0] < rows[0] + rows[1]:
            raise ModelFileError(f"{self.spec.path}: tensor '{t.name}' has {t.shape[0]} rows; the {self.arch.arch} "
                                 f"architecture reads rows {rows[0]}..{rows[0] + rows[1] - 1} of it")
        return t.rows(*rows)

    def fused(self, tensor: str, parts: tuple[tuple[str, int], ...]) -> tuple[Value, ...]:
        """Roles that are consecutive row ranges of one tensor, which must hold exactly them."""
        rows = self.first_tensor(tensor).shape[0]
        if rows != sum(n for _, n in parts):
            raise ModelFileError(f"{self.spec.path}: tensor '{tensor}' has {rows} rows; the {self.arch.arch} "
                                 f"architecture reads it as {' + '.join(f'{r} ({n})' for r, n in parts)}")
        starts = np.cumsum([0] + [n for _, n in parts])
        return tuple(self.bind(role, tensor, (int(at), n)) for (role, n), at in zip(parts, starts))

    def scalar(self, key: str) -> float:
        """A number the template takes from the file; absent or 0 reads as unset (0.0), as llama.cpp's do."""
        return self.hp.scalar(key) or 0.0

    def emit(self, op: Op, name: str, inputs: tuple[Value, ...], shape: tuple[int, ...], attrs: Attrs = None) -> Value:
        out = Value(name, ValueKind.ACTIVATION, shape, DType.F32)
        self.nodes.append(Node(op, name, inputs, (out,), attrs))
        return out

    def add_into_x(self, name: str, y: Value) -> None:
        self.nodes.append(Node(Op.ADD, name, (y, self.x), (self.x,)))

    def norm(self, name: str, x: Value, w: Value | None) -> Value:
        """RMSNorm over runs of w's length (each head, or a row), times w; without w, over each
        last-axis run alone. A template of LayerNorms (norm "layer") takes w's bias beside it."""
        attrs = NormAttrs(eps=self.hp.norm_eps, weight_offset=self.arch.norm_weight_offset)
        if self.arch.norm == "layer":
            bias = self.weight(w.tensor.name.removesuffix(".weight") + ".bias") if w.tensor is not None else \
                self.bind(w.name + "_bias", self.roles[w.name][0].removesuffix(".weight") + ".bias")
            return self.emit(Op.LAYER_NORM, name, (x, w, bias), x.shape, attrs)
        return self.emit(Op.RMS_NORM, name, (x,) if w is None else (x, w), x.shape, attrs)

    def norm_stream(self, name: str, w: Value, b: Value) -> None:
        """LayerNorm of the residual stream in place (a post-norm encoder's); the next stage reads it."""
        self.nodes.append(Node(Op.LAYER_NORM, name, (self.x, w, b), (self.x,), NormAttrs(self.hp.norm_eps, 0.0)))
        self.cur = self.x

    def matmul(self, name: str, x: Value, role: str | Value, shape: tuple[int, ...], bias: bool | Value = False) -> Value:
        """x times the role's weight, plus its bias where `bias` (the role's own, or the one given)."""
        w = role if isinstance(role, Value) else self.layer_weight(role)
        if bias is True:
            bias = self.layer_weight(w.name, "bias")
        inputs = (x, w) + ((bias,) if bias else ())
        return self.emit(Op.MATMUL, name, inputs, shape, MatmulAttrs())

    def regroup(self, name: str, x: Value, groups: int, parts: tuple[int, ...], outputs: tuple[tuple[int, ...], ...],
                values: tuple[tuple[str, tuple[int, ...]], ...]) -> tuple[Value, ...]:
        outs = tuple(Value(v, ValueKind.ACTIVATION, shape, DType.F32) for v, shape in values)
        self.nodes.append(Node(Op.REGROUP, name, (x,), outs, RegroupAttrs(groups, parts, outputs)))
        return outs

    def scale(self, name: str, x: Value, by: float) -> Value:
        return self.emit(Op.SCALE, name, (x,), x.shape, ScaleAttrs(by))

    def take(self) -> tuple[Node, ...]:
        nodes, self.nodes = tuple(self.nodes), []
        return nodes

    # -- head, body, tail --------------------------------------------------------------------
    def head(self) -> tuple[Node, ...]:
        scale = {EmbeddingScale.NONE: 1.0, EmbeddingScale.SQRT_N_EMBD: sqrt(self.hp.n_embd),
                 EmbeddingScale.METADATA: self.scalar("embedding_scale") or 1.0}[self.arch.embedding_scale]
        self.nodes.append(Node(Op.EMBED, "inp_embd", (self.inputs["inp_tokens"], self.weight("token_embd.weight")),
                               (self.x,), EmbedAttrs(scale)))
        if self.arch.norm == "layer":
            self._encoder_inputs()
        if self.per_layer is not None:
            self._per_layer_inputs()
        return self.take()

    def _encoder_inputs(self) -> None:
        """A BERT family encoder's, in llama.cpp's order: the token-type embedding's row 0 where the
        file has one (every token is of type 0), then, with absolute positions, each row's position's
        row of position_embd, then LayerNorm (token_embd_norm)."""
        n = self.hp.n_embd
        if "token_types.weight" in self.spec.tensors:
            t = self.spec.tensor("token_types.weight")
            if t.shape[1:] != (n,) or t.dtype is not DType.F32:
                raise ModelFileError(f"{self.spec.path}: tensor 'token_types.weight' is {t.dtype.name} {list(t.shape)}; "
                                     f"token-type embeddings are F32 rows of n_embd ({n})")
            row0 = Value("token_types.weight", ValueKind.WEIGHT, (1, n), t.dtype, t.rows(0, 1))
            self.nodes.append(Node(Op.ADD, "inp_type_embd", (self.x, row0), (self.x,)))
        if self.arch.position_embedding == "absolute":
            table = self.weight("position_embd.weight")
            if table.shape[1:] != (n,):
                raise ModelFileError(f"{self.spec.path}: tensor 'position_embd.weight' is {list(table.shape)}; "
                                     f"position embeddings are rows of n_embd ({n})")
            pos = self.emit(Op.EMBED, "inp_pos_embd", (self.inputs["inp_pos"], table), (self.T, n), EmbedAttrs(1.0))
            self.add_into_x("inp_embd_pos", pos)
        self.norm_stream("inp_norm", self.weight("token_embd_norm.weight"), self.weight("token_embd_norm.bias"))

    def _per_layer_inputs(self) -> None:
        """Gemma 4's per-layer embeddings, as llama.cpp's project_per_layer_inputs: the embedding
        projected to every layer's width (per_layer_model_proj, times 1/sqrt(n_embd)), each layer's
        part RMS-normed (per_layer_proj_norm), plus the token's row of per_layer_token_embd (times
        sqrt(width)), all times 1/sqrt(2)."""
        T, n, p = self.T, self.hp.n_layer, self.hp.n_embd_per_layer
        shape = (T, n, p)
        for name, want in (("per_layer_token_embd.weight", (self.hp.n_vocab, n * p)),
                           ("per_layer_model_proj.weight", (n * p, self.hp.n_embd)), ("per_layer_proj_norm.weight", (p,))):
            t = self.spec.tensor(name)
            table = name == "per_layer_token_embd.weight"  # a row a token: at least the vocabulary's
            if (t.shape[1:], t.shape[0] >= want[0]) != (want[1:], True) if table else t.shape != want:
                raise ModelFileError(f"{self.spec.path}: tensor '{name}' is {list(t.shape)} but {n} layers' per-layer "
                                     f"embeddings of {p} (embedding_length_per_layer_input) make it {list(want)}")
        tok = Value("inp_per_layer_tokens", ValueKind.ACTIVATION, shape, DType.F32)
        self.nodes.append(Node(Op.EMBED, "inp_per_layer_selected",
                               (self.inputs["inp_tokens"], self.weight("per_layer_token_embd.weight")), (tok,),
                               EmbedAttrs(float(np.sqrt(np.float32(p))))))
        proj = self.matmul("per_layer_proj_raw", self.x, self.weight("per_layer_model_proj.weight"), shape)
        proj = self.scale("per_layer_proj_scaled", proj, float(np.float32(1) / np.sqrt(np.float32(self.hp.n_embd))))
        proj = self.norm("per_layer_proj", proj, self.weight("per_layer_proj_norm.weight"))
        summed = self.emit(Op.ADD, "inp_per_layer_sum", (proj, tok), shape)
        self.nodes.append(Node(Op.SCALE, "inp_per_layer", (summed,), (self.per_layer,),
                               ScaleAttrs(float(np.float32(1) / np.sqrt(np.float32(2))))))

    def tail(self) -> tuple[Node, ...]:
        if self.embedding:
            return self._hidden_tail()
        x = self.norm("result_norm", self.x, self.weight("output_norm.weight"))
        x = self.emit(Op.SELECT_ROWS, "result_rows", (x, self.inputs["inp_out"]), x.shape)
        tied = self.arch.lm_head is LMHead.TIED or (self.arch.lm_head is LMHead.OUTPUT_OR_TIED
                                                    and "output.weight" not in self.spec.tensors)
        head = self.weight("output.weight", view_of="token_embd.weight" if tied else None)
        logits = Value("result_output", ValueKind.OUTPUT, (self.T, self.hp.n_vocab), DType.F32)
        self.nodes.append(Node(Op.LOGITS, "result_output", (x, head), (logits,)))
        if self.arch.logit_scale is Scalar.METADATA:  # in place, in the caller's buffer
            by = float(np.float32(1) / np.float32(self.scalar("logit_scale")))  # llama.cpp's scale by 1/s
            self.nodes.append(Node(Op.SCALE, "result_scaled", (logits,), (logits,), ScaleAttrs(by)))
        cap = self.arch.softcap_value("final_softcap", self.hp.scalar("final_logit_softcapping"))
        if cap:
            self.nodes.append(Node(Op.SOFTCAP, "result_capped", (logits,), (logits,), SoftcapAttrs(cap)))
        return self.take()

    def pooling_tensors(self) -> tuple[str, ...]:
        """What an embedding graph leaves to the runtime: a reranker's class head (cls.*) and the
        Dense layers after pooling (dense_2, dense_3), which runtime/embedding.py applies to the
        pooled row, and a decoder's LM head."""
        if not self.embedding:
            return ()
        return tuple(n for n in self.spec.tensors if n.startswith(("cls.", "dense_2.", "dense_3.")) or
                     n == "output.weight")

    def _hidden_tail(self) -> tuple[Node, ...]:
        """An embedding model's: each wanted row's hidden state (after output_norm where the file
        has one) into the caller's buffer, [rows, n_embd]; the runtime pools them."""
        x = self.x
        if "output_norm.weight" in self.spec.tensors:
            x = self.norm("result_norm", x, self.weight("output_norm.weight"))
        out = Value("result_output", ValueKind.OUTPUT, (self.T, self.hp.n_embd), DType.F32)
        self.nodes.append(Node(Op.SELECT_ROWS, "result_embd", (x, self.inputs["inp_out"]), (out,)))
        return self.take()

    def _kv_source(self, il: int) -> int:
        """The layer whose KV layer il attends to: its own, or (a layer past the file's
        attention.shared_kv_layers) the last layer of its kind that keeps KV, as llama.cpp reuses them."""
        n_kv = self.hp.n_layer - self.hp.shared_kv_layers
        if il < n_kv:
            return il
        same = [j for j in range(n_kv) if self.kinds[j] is self.kinds[il]]
        if not same:
            raise ModelFileError(f"{self.spec.path}: layer {il} is one of the last {self.hp.shared_kv_layers} "
                                 f"(attention.shared_kv_layers), which read the KV of an earlier {self.kinds[il].value} "
                                 "layer, but no earlier layer of that kind keeps its own")
        return same[-1]

    def _body_names(self) -> tuple[str, ...]:
        """The body each layer runs: the recurrent one, or the attention layers' (one per layer kind
        where the template's kinds differ in shape or a kind runs a block of its own, the MoE layers'
        moe_block; and apart for the layers that keep no KV). The first attention layer's is Section.BODY."""
        keys = []
        for il, kind in enumerate(self.kinds):
            if kind is LayerKind.RECURRENT:
                keys.append(Section.RECURRENT)
                continue
            key = kind.value if self.arch.kind_bodies or self.arch.block_of(kind) != self.arch.block else ""
            if self.kv_sources[il] != il:
                key = f"{key}_shared" if key else "shared"
            keys.append(key)
        first = next((k for k in keys if k != Section.RECURRENT), None)
        return tuple(Section.BODY if k == first else k for k in keys)

    def layers(self, roles: dict[str, dict]) -> tuple[Layer, ...]:
        """Every layer: its body, the tensors of that body's roles, its window, rope base and KV."""
        out = []
        for il in range(self.hp.n_layer):
            kind = self.kinds[il]
            window = None
            if kind is LayerKind.LOCAL:
                if self.hp.sliding_window is None:
                    raise ArchitectureError(
                        f"{self.spec.path}: the {self.arch.arch} architecture makes layer {il} a sliding-window "
                        f"layer, but the file has no '{self.spec.arch}.attention.sliding_window'")
                window = self.hp.sliding_window
            local = kind is LayerKind.LOCAL and self.arch.rope_base_local is not None
            base = (self.arch.rope_base_local if local else self.hp.rope_base) if self.arch.rotates(il) else 0.0
            body = self.body_names[il]
            tensors = {role: self._layer_tensor(il, name0, rows, body) for role, (name0, rows) in roles[body].items()}
            source = self.kv_sources[il] if kind is not LayerKind.RECURRENT else None
            out.append(Layer(il, kind, window, base, tensors, body, source))
        return tuple(out)

    def _layer_tensor(self, il: int, name0: str, rows: tuple[int, int] | None, body: str) -> TensorInfo:
        first = self.body_names.index(body)
        t, t0 = (self.spec.tensor(name0.replace("blk.0.", f"blk.{i}.", 1)) for i in (il, first))
        if t.shape != t0.shape:
            raise ModelFileError(f"{self.spec.path}: tensor '{t.name}' is {list(t.shape)} but "
                                 f"'{t0.name}' is {list(t0.shape)}; every layer of a kind must have the same shapes")
        return self._tensor(il, name0, rows)
