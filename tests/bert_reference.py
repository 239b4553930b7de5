"""BERT in float64 numpy, read straight from a Hugging Face folder's safetensors: the sentence
embeddings sentence-transformers computes (mean pooling over the input's tokens, then L2), for
judging what llama.cpp computes from a converted GGUF.

It follows Hugging Face's BertModel: word + position + token-type (all 0) embeddings and a
LayerNorm, then post-LN layers of bidirectional attention (padding masked out of the keys) and an
exact erf GELU feed-forward.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

_erf = np.frompyfunc(math.erf, 1, 1)  # no scipy in the venv; tanh's approximation would not be exact


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


class BertReference:
    def __init__(self, folder: Path):
        self.cfg = json.loads((Path(folder) / "config.json").read_text())
        raw = load_file(str(Path(folder) / "model.safetensors"))
        self.w = {k.removeprefix("bert."): v.astype(np.float64) for k, v in raw.items()}
        self.heads = self.cfg["num_attention_heads"]
        self.eps = self.cfg.get("layer_norm_eps", 1e-12)

    def hidden(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The last hidden states [batch, n, hidden] of token ids [batch, n] (mask 1 on real tokens)."""
        w, (b, n) = self.w, ids.shape
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        d = x.shape[-1] // self.heads
        key_bias = np.where(mask[:, None, None, :] > 0, 0.0, -np.inf)  # [b, 1, 1, n]: padding is no key

        def lin(t: np.ndarray, name: str) -> np.ndarray:
            return t @ w[name + ".weight"].T + w[name + ".bias"]

        def split(t: np.ndarray) -> np.ndarray:
            return t.reshape(b, n, self.heads, d).transpose(0, 2, 1, 3)

        for i in range(self.cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            q, k, v = (split(lin(x, p + f"attention.self.{t}")) for t in ("query", "key", "value"))
            scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + key_bias
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, n, -1)
            x = layer_norm(lin(ctx, p + "attention.output.dense") + x, w[p + "attention.output.LayerNorm.weight"],
                           w[p + "attention.output.LayerNorm.bias"], self.eps)
            ff = lin(gelu(lin(x, p + "intermediate.dense")), p + "output.dense")
            x = layer_norm(ff + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], self.eps)
        return x

    def embed(self, batch: list[list[int]]) -> np.ndarray:
        """Unit vectors [len(batch), hidden]: the sequences padded to one length and run together,
        as sentence-transformers batches them."""
        n = max(len(s) for s in batch)
        ids = np.zeros((len(batch), n), dtype=np.int64)
        mask = np.zeros((len(batch), n), dtype=np.float64)
        for row, seq in enumerate(batch):
            ids[row, :len(seq)], mask[row, :len(seq)] = seq, 1.0
        h = self.hidden(ids, mask)
        pooled = (h * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
