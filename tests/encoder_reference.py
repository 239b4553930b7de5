"""A BERT GGUF's forward pass in float64 numpy, read straight from the file's tensors (as llama.cpp
names them): the exact values kiln's vectors and a reranker's scores are measured against. It
follows Hugging Face's BertModel (erf GELU, post-LN, bidirectional attention); a class head as
BertForSequenceClassification applies it (tanh(cls . x + b), then cls.output)."""
from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize

_erf = np.vectorize(math.erf)


class GgufBert:
    def __init__(self, path: Path):
        r = gguf.GGUFReader(str(path))
        self.t = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64).reshape(tuple(reversed(
            [int(d) for d in t.shape]))) for t in r.tensors}
        meta = {k: f.contents() for k, f in r.fields.items() if k.startswith("bert.")}
        self.n_layer, self.n_head = meta["bert.block_count"], meta["bert.attention.head_count"]
        self.eps = meta["bert.attention.layer_norm_epsilon"]

    def _ln(self, x: np.ndarray, name: str) -> np.ndarray:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.eps) * self.t[name + ".weight"] + self.t[name + ".bias"]

    def _lin(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self.t[name + ".weight"].T + self.t[name + ".bias"]

    def hidden(self, ids: list[int]) -> np.ndarray:
        t, n = self.t, len(ids)
        x = t["token_embd.weight"][ids] + t["token_types.weight"][0] + t["position_embd.weight"][:n]
        x = self._ln(x, "token_embd_norm")
        d = x.shape[1] // self.n_head
        for il in range(self.n_layer):
            p = f"blk.{il}."
            q, k, v = (self._lin(x, p + f"attn_{c}").reshape(n, self.n_head, d).transpose(1, 0, 2) for c in "qkv")
            s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
            a = np.exp(s - s.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            ctx = (a @ v).transpose(1, 0, 2).reshape(n, -1)
            x = self._ln(self._lin(ctx, p + "attn_output") + x, p + "attn_output_norm")
            up = self._lin(x, p + "ffn_up")
            ff = self._lin(0.5 * up * (1.0 + _erf(up / math.sqrt(2.0))), p + "ffn_down")
            x = self._ln(ff + x, p + "layer_output_norm")
        return x

    def score(self, ids: list[int]) -> float:
        """A reranker's score: the class head on the first token's row."""
        h = np.tanh(self.t["cls.weight"] @ self.hidden(ids)[0] + self.t["cls.bias"])
        return float((self.t["cls.output.weight"] @ h + self.t["cls.output.bias"])[0])
