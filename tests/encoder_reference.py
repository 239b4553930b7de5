"""A BERT GGUF's forward pass in float64 numpy, read straight from the file's tensors (as llama.cpp
names them): the exact values kiln's vectors and a reranker's scores are measured against. It
follows Hugging Face's BertModel (erf GELU, post-LN, bidirectional attention); a class head as
BertForSequenceClassification applies it (tanh(cls . x + b), then cls.output). A nomic-bert file
(nomic-embed-text): no learned positions but NEOX rotary ones on Q and K, Q, K and V in one
attn_qkv, a SwiGLU FFN, no biases but the norms'. A nomic-bert-moe file (nomic-embed-text-v2-moe):
that attention with biases, a GELU FFN with biases, and in the layers with a router (ffn_gate_inp)
the softmax's top expert_used_count experts, each up, GELU, down, times its probability as it is
(llama.cpp's build_moe_ffn for the arch: no renormalization), summed in rank order. A jina-bert-v2 file (jina-embeddings-v2): BERT's attention with ALiBi in place
of learned positions (each score plus slope_h * -|i - j|, ggml's slopes for max bias 8), and a GEGLU
FFN whose ffn_up holds the gate's rows then up's, gelu(gate) * up by erf as jina's code has it."""
from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize

_erf = np.vectorize(math.erf)


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ggml's soft_max slopes: m0^(h+1) for the first 2^floor(log2 n) heads, then m1^(2(h - that) + 1)."""
    n2 = 1 << int(math.floor(math.log2(n_head)))
    m0, m1 = 2.0 ** (-max_bias / n2), 2.0 ** (-(max_bias / 2.0) / n2)
    return np.array([m0 ** (h + 1) if h < n2 else m1 ** (2 * (h - n2) + 1) for h in range(n_head)])


class GgufBert:
    def __init__(self, path: Path):
        r = gguf.GGUFReader(str(path))
        self.t = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64).reshape(tuple(reversed(
            [int(d) for d in t.shape]))) for t in r.tensors}
        a = r.fields["general.architecture"].contents()
        meta = {k[len(a) + 1:]: f.contents() for k, f in r.fields.items() if k.startswith(a + ".")}
        self.n_layer, self.n_head = meta["block_count"], meta["attention.head_count"]
        self.eps = meta["attention.layer_norm_epsilon"]
        self.rope_base = meta.get("rope.freq_base", 10000.0) if a.startswith("nomic-bert") else None
        self.n_used = meta.get("expert_used_count", 0)
        self.alibi = a == "jina-bert-v2"
        self.max_bias = 8.0 if self.alibi else 0.0  # llama.cpp fixes jina-bert-v2's at 8 (a control may set 0)
        self.routed: list[int] = []  # every expert the router chose, in order

    def _ln(self, x: np.ndarray, name: str) -> np.ndarray:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.eps) * self.t[name + ".weight"] + self.t[name + ".bias"]

    def _lin(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self.t[name + ".weight"].T + self.t.get(name + ".bias", 0.0)

    @staticmethod
    def _gelu(x: np.ndarray) -> np.ndarray:
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))

    def _experts(self, x: np.ndarray, p: str) -> np.ndarray:
        logits = x @ self.t[p + "ffn_gate_inp.weight"].T
        prob = np.exp(logits - logits.max(-1, keepdims=True))
        prob /= prob.sum(-1, keepdims=True)
        out = np.zeros_like(x)
        for r, row in enumerate(prob):
            for e in np.argsort(-row, kind="stable")[:self.n_used]:
                self.routed.append(int(e))
                h = self._gelu(self.t[p + "ffn_up_exps.weight"][e] @ x[r])
                out[r] += row[e] * (self.t[p + "ffn_down_exps.weight"][e] @ h)
        return out

    def _rope(self, x: np.ndarray) -> np.ndarray:
        """[heads, n, d] rotated NEOX-wise: dims (i, i + d/2) by pos * base^(-2i/d)."""
        d = x.shape[-1]
        theta = np.arange(x.shape[1])[:, None] * self.rope_base ** (-2.0 * np.arange(d // 2) / d)
        c, s = np.cos(theta), np.sin(theta)
        a, b = x[..., :d // 2], x[..., d // 2:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)

    def hidden(self, ids: list[int]) -> np.ndarray:
        t, n = self.t, len(ids)
        x = t["token_embd.weight"][ids] + t["token_types.weight"][0]
        if self.rope_base is None and not self.alibi:
            x = x + t["position_embd.weight"][:n]
        x = self._ln(x, "token_embd_norm")
        e = x.shape[1]
        d = e // self.n_head
        for il in range(self.n_layer):
            p = f"blk.{il}."
            if self.rope_base is None:
                parts = [self._lin(x, p + f"attn_{c}") for c in "qkv"]
            else:
                qkv = self._lin(x, p + "attn_qkv")
                parts = [qkv[:, :e], qkv[:, e:2 * e], qkv[:, 2 * e:]]
            q, k, v = (h.reshape(n, self.n_head, d).transpose(1, 0, 2) for h in parts)
            if self.rope_base is not None:
                q, k = self._rope(q), self._rope(k)
            s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
            if self.max_bias:
                s = s - alibi_slopes(self.n_head, self.max_bias)[:, None, None] * np.abs(np.subtract.outer(range(n), range(n)))
            a = np.exp(s - s.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            ctx = (a @ v).transpose(1, 0, 2).reshape(n, -1)
            x = self._ln(self._lin(ctx, p + "attn_output") + x, p + "attn_output_norm")
            if p + "ffn_gate_inp.weight" in t:
                ff = self._experts(x, p)
            elif self.alibi:  # ffn_up: the gate's rows, then up's
                up = self._lin(x, p + "ffn_up")
                ff = self._lin(self._gelu(up[:, :up.shape[1] // 2]) * up[:, up.shape[1] // 2:], p + "ffn_down")
            elif p + "ffn_gate.weight" in t:
                up, g = self._lin(x, p + "ffn_up"), self._lin(x, p + "ffn_gate")
                ff = self._lin(g / (1.0 + np.exp(-g)) * up, p + "ffn_down")
            else:
                ff = self._lin(self._gelu(self._lin(x, p + "ffn_up")), p + "ffn_down")
            x = self._ln(ff + x, p + "layer_output_norm")
        return x

    def score(self, ids: list[int]) -> float:
        """A reranker's score: the class head on the first token's row."""
        h = np.tanh(self.t["cls.weight"] @ self.hidden(ids)[0] + self.t["cls.bias"])
        return float((self.t["cls.output.weight"] @ h + self.t["cls.output.bias"])[0])
