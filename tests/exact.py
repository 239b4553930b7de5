"""The exact forward pass: a referee neither engine wrote.

Every weight is dequantized by `gguf.quants` (the gguf package's numpy code, not kiln's C nor
llama.cpp's), and every step after that runs in float64 with no rounding of activations: no 8-bit
quantization before the matmuls, no f16 cache, softmax and norms in float64, RoPE's angles by pow
rather than by float32 products. Both engines round where this does not, so the distance of each
from it (mean KL over teacher-forced positions) says which is nearer the model's exact math.

It covers the two bundled architectures: llama (SmolLM2) and gemma3 (Gemma 3 270M), read from
their GGUF metadata as llama.cpp reads them.

The pass over 2,048 positions takes minutes, and its [positions, vocab] float64 logits gigabytes,
so tests/data/exact-<model>.npz stores what the tests need of it: the token ids and, at each
position, the exact log-probabilities of its TOP likeliest tokens. An engine is scored by the KL
divergence from the exact distribution coarsened to those tokens and the rest of the mass as one
(`coarse_kl`), which is the full KL less what the tail's inner differences add: on SmolLM2 it keeps
86% of the full figure, for either engine. `python tests/exact.py` writes the files again.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

F64 = np.float64
DATA = Path(__file__).parent / "data"
TOP = 128
WINDOWS, LENGTH = 8, 256
TEXT = Path(__file__).parent.parent / "compiler" / "tools" / "data" / "scandal_in_bohemia.txt"


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(head_dim), where mask) v in float64, query head h on key head h // group:
    q [n, heads, d], k and v [n, kv_heads, d], mask [n, n] (query, key) -> [n, heads, d]."""
    n, heads, hd = q.shape
    group = heads // k.shape[1]
    out = np.empty((n, heads, hd))
    for h in range(heads):
        s = np.where(mask, q[:, h] @ k[:, h // group].T / np.sqrt(F64(hd)), -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, h // group]
    return out


def stored(name: str) -> dict[str, np.ndarray]:
    """The stored reference of a bundled model: ids [W, L], top [W, L, TOP] token ids, top_lp their
    exact log-probabilities, and the GGUF's sha256."""
    with np.load(DATA / f"exact-{name}.npz") as f:
        return dict(f)


def coarse_kl(top: np.ndarray, top_lp: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """Per position, KL(exact || engine) over the exact pass's top tokens and the rest as one. The
    engine's logits are float32: their exponentials are taken in float32 and summed in float64,
    which moves a figure by 1e-8 of itself and costs a seventh of a float64 pass over 262k logits."""
    x = np.asarray(logits, dtype=np.float32)
    peak = x.max(-1, keepdims=True)
    lse = np.log(np.exp(x - peak).sum(-1, keepdims=True, dtype=F64)) + peak.astype(F64)
    lq = np.take_along_axis(x, top, -1).astype(F64) - lse
    lp = top_lp.astype(F64)
    p_rest = np.maximum(1 - np.exp(lp).sum(-1), 1e-300)
    q_rest = np.maximum(1 - np.exp(lq).sum(-1), 1e-300)
    return (np.exp(lp) * (lp - lq)).sum(-1) + p_rest * (np.log(p_rest) - np.log(q_rest))


def windows(tokenize) -> list[list[int]]:
    """WINDOWS stretches of a text no parity test reads, each tokenized as a prompt of its own (the
    model's BOS first), LENGTH tokens each."""
    paragraphs = TEXT.read_text().split("\n\n")
    starts = [i * len(paragraphs) // WINDOWS for i in range(WINDOWS)]
    return [tokenize("\n\n".join(paragraphs[s:]))[:LENGTH] for s in starts]


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def gelu_fp16_table(x: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU, which kiln_geglu reads as well (the same tokens as llama.cpp): the tanh form
    at x rounded to f16, the result rounded to f16; x itself above 10, 0 below -10."""
    y = _gelu_tanh(x.astype(np.float16).astype(F64)).astype(np.float16).astype(F64)
    return np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, y))


def _rope(x: np.ndarray, pos: np.ndarray, base: float, neox: bool) -> np.ndarray:
    """x [n, heads, d]: GGUF llama's adjacent pairs (its converter permuted Q and K for them), or
    NeoX's halves."""
    d = x.shape[-1]
    theta = pos[:, None].astype(F64) * base ** (-np.arange(0, d, 2, dtype=F64) / d)  # [n, d/2]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    a, b = (x[..., : d // 2], x[..., d // 2:]) if neox else (x[..., 0::2], x[..., 1::2])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = np.empty_like(x)
    if neox:
        out[..., : d // 2], out[..., d // 2:] = ra, rb
    else:
        out[..., 0::2], out[..., 1::2] = ra, rb
    return out


GEMMA = ("gemma3", "gemma-embedding")


class ExactForward:
    """A GGUF of the llama or gemma3 architecture, forward in float64 over a token sequence; or of
    gemma-embedding (EmbeddingGemma), Gemma 3's body bidirectional, its sliding layers' windows
    symmetric (a query at p sees p - window/2 .. p + window/2), to its hidden states."""

    def __init__(self, path: str | Path):
        self.reader = GGUFReader(str(path))
        self.arch = self._meta("general.architecture")
        if self.arch not in ("llama", *GEMMA):
            raise ValueError(f"{path}: the exact forward pass covers llama, gemma3 and gemma-embedding, not {self.arch}")
        self.bidirectional = self.arch == "gemma-embedding"
        self.gelu = _gelu_tanh  # exact; gelu_fp16_table: ggml's rounding, to measure all the rest
        self.tensors = {t.name: t for t in self.reader.tensors}
        a = self.arch
        self.n_layer = int(self._meta(f"{a}.block_count"))
        self.n_embd = int(self._meta(f"{a}.embedding_length"))
        self.n_head = int(self._meta(f"{a}.attention.head_count"))
        self.n_head_kv = int(self._meta(f"{a}.attention.head_count_kv"))
        self.head_dim = int(self._meta(f"{a}.attention.key_length", self.n_embd // self.n_head))
        self.eps = float(self._meta(f"{a}.attention.layer_norm_rms_epsilon"))
        self.base = float(self._meta(f"{a}.rope.freq_base", 10000.0))
        self.window = int(self._meta(f"{a}.attention.sliding_window", 0)) if a in GEMMA else 0
        if self._meta(f"{a}.rope.scaling.factor", 1.0) not in (0.0, 1.0):
            raise ValueError(f"{path}: RoPE scaling is not in the exact forward pass")
        self.reader.fields.clear()  # a numpy array per token string: half a gigabyte of Gemma's vocabulary
        self.embd = self.weight("token_embd.weight", np.float32)  # [vocab, n_embd], exact dequantized values
        self.head = self.weight("output.weight", np.float32) if "output.weight" in self.tensors else \
            None if self.bidirectional else self.embd

    def _meta(self, key: str, default=None):
        field = self.reader.fields.get(key)
        if field is None:
            if default is None:
                raise KeyError(key)
            return default
        value = field.parts[field.data[0]]
        return bytes(value).decode() if field.types[0].name == "STRING" else value[0].item()

    def weight(self, name: str, dtype=F64) -> np.ndarray:
        """The tensor's exact values, dequantized a slice of rows at a time: Gemma's 262k-row
        embedding whole would take its float32 size again in temporaries."""
        t = self.tensors[name]
        shape = tuple(reversed([int(n) for n in t.shape]))
        if len(shape) == 1:
            return dequantize(t.data, t.tensor_type).astype(dtype)
        out, step = np.empty(shape, dtype), 16384
        for i in range(0, shape[0], step):
            out[i:i + step] = dequantize(t.data[i:i + step], t.tensor_type).reshape((-1, *shape[1:]))
        return out

    def _layer_is_local(self, il: int) -> bool:
        return self.arch in GEMMA and (il + 1) % 6 != 0  # llama.cpp's gemma3: five local to one global

    def hidden(self, seqs: list[list[int]]) -> list[np.ndarray]:
        """For each sequence, [len(ids), n_embd] float64: its last hidden states, output_norm applied.
        The sequences go through each layer together, so its weights are dequantized once."""
        xs = [self.embd[np.asarray(ids)].astype(F64) for ids in seqs]
        if self.arch in GEMMA:
            xs = [x * np.sqrt(F64(self.n_embd)) for x in xs]
        for il in range(self.n_layer):
            w = {n.split(".")[2]: self.weight(n) for n in self.tensors if n.startswith(f"blk.{il}.")}
            xs = [self._layer(x, w, self._layer_is_local(il)) for x in xs]
        return [_rms(x, self.weight("output_norm.weight"), self.eps) for x in xs]

    def logits(self, seqs: list[list[int]]) -> list[np.ndarray]:
        """For each sequence, [len(ids), vocab] float64: each position's next-token logits, causal
        over its sequence."""
        out = []
        for x in self.hidden(seqs):
            logits, step = np.empty((len(x), self.head.shape[0])), 32768
            for i in range(0, self.head.shape[0], step):  # a slice at a time: float64 of Gemma's head is 1.3 GB
                logits[:, i:i + step] = x @ self.head[i:i + step].astype(F64).T
            out.append(logits)
        return out

    def _layer(self, x: np.ndarray, w: dict[str, np.ndarray], local: bool) -> np.ndarray:
        n, hd, gemma = len(x), self.head_dim, self.arch in GEMMA
        pos = np.arange(n)
        h = _rms(x, w["attn_norm"], self.eps)
        q = (h @ w["attn_q"].T).reshape(n, self.n_head, hd)
        k = (h @ w["attn_k"].T).reshape(n, self.n_head_kv, hd)
        v = (h @ w["attn_v"].T).reshape(n, self.n_head_kv, hd)
        if gemma:
            q, k = _rms(q, w["attn_q_norm"], self.eps), _rms(k, w["attn_k_norm"], self.eps)
        base = 10000.0 if local else self.base  # llama.cpp's gemma3: its local layers' base is 10k
        q, k = _rope(q, pos, base, neox=gemma), _rope(k, pos, base, neox=gemma)
        if self.bidirectional:  # llama.cpp's LLAMA_SWA_TYPE_SYMMETRIC
            mask = np.abs(pos[:, None] - pos[None, :]) <= (self.window // 2 if local else n)
        else:
            mask = pos[None, :] <= pos[:, None]
            if local:
                mask &= pos[:, None] - pos[None, :] < self.window
        out = attend(q, k, v, mask)
        a = out.reshape(n, -1) @ w["attn_output"].T
        if gemma:
            a = _rms(a, w["post_attention_norm"], self.eps)
        x = x + a
        h = _rms(x, w["ffn_norm"], self.eps)
        gate, up = h @ w["ffn_gate"].T, h @ w["ffn_up"].T
        act = self.gelu(gate) if gemma else gate / (1.0 + np.exp(-gate))
        f = (act * up) @ w["ffn_down"].T
        if gemma:
            f = _rms(f, w["post_ffw_norm"], self.eps)
        return x + f


def top_of(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The TOP likeliest tokens of each row, likeliest first, and their exact log-probabilities."""
    from compiler.core.numerics import log_softmax
    lp = log_softmax(logits)
    top = np.argsort(-lp, axis=-1, kind="stable")[:, :TOP]
    return top.astype(np.int32), np.take_along_axis(lp, top, -1).astype(np.float32)


def write(name: str) -> Path:
    import compiler
    from compiler.frontend.registry import BUNDLED, fetch
    path = fetch(BUNDLED[name])
    m = compiler.load(path, ctx=LENGTH)
    seqs = windows(lambda text: m.tokenize(text, add_special=True))
    tops = [top_of(x) for x in ExactForward(path).logits(seqs)]
    DATA.mkdir(exist_ok=True)
    out = DATA / f"exact-{name}.npz"
    np.savez_compressed(out, ids=np.array(seqs, np.int32), top=np.stack([t for t, _ in tops]),
                        top_lp=np.stack([lp for _, lp in tops]), sha256=BUNDLED[name].sha256)
    return out


if __name__ == "__main__":
    for model in sys.argv[1:] or ["smollm2-135m", "gemma3-270m"]:
        print(write(model))
