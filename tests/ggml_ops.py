"""ggml's own CPU ops, run through the libraries llama-cpp-python ships: references for the kernels
of kiln that must compute llama.cpp's bits (a rope with its scalings; a mixture of experts'
routing and the weighted sum of its experts), and llama.cpp's own rope parameters for a model,
read from the graph it builds (ggml_rope_ext's op_params and its factors tensor).

Everything here calls ggml's public C API (ggml.h, ggml-cpu.h) through ctypes: ggml_init gives a
context that owns its tensors, an op builds a node, ggml_graph_compute_with_ctx runs it on the CPU
backend llama.cpp itself runs, built with the same flags.
"""
from __future__ import annotations

import ctypes as C
from contextlib import contextmanager
from pathlib import Path

import llama_cpp
import numpy as np

from compiler.tools.llamacpp import LlamaCpp

_LIB = Path(llama_cpp.__file__).parent / "lib"
_base = C.CDLL(str(_LIB / "libggml-base.so"), mode=C.RTLD_GLOBAL)
_cpu = C.CDLL(str(_LIB / "libggml-cpu.so"), mode=C.RTLD_GLOBAL)
_P, _I64, _F = C.c_void_p, C.c_int64, C.c_float
F32, I32 = 0, 26  # enum ggml_type
ROPE_NORMAL, ROPE_NEOX = 0, 2  # GGML_ROPE_TYPE_*


class _InitParams(C.Structure):
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", _P), ("no_alloc", C.c_bool)]


class Tensor(C.Structure):
    """struct ggml_tensor (ggml.h), for reading a node that llama.cpp's eval callback shows."""
    _fields_ = [("type", C.c_int), ("buffer", _P), ("ne", _I64 * 4), ("nb", C.c_size_t * 4), ("op", C.c_int),
                ("op_params", C.c_int32 * 16), ("flags", C.c_int32), ("src", _P * 10), ("view_src", _P),
                ("view_offs", C.c_size_t), ("data", _P), ("name", C.c_char * 64), ("extra", _P),
                ("padding", C.c_char * 8)]


_SIGNATURES = {
    "ggml_init": (_P, [_InitParams]), "ggml_free": (None, [_P]),
    "ggml_new_tensor_1d": (_P, [_P, C.c_int, _I64]), "ggml_new_tensor_2d": (_P, [_P, C.c_int, _I64, _I64]),
    "ggml_new_tensor_3d": (_P, [_P, C.c_int, _I64, _I64, _I64]),
    "ggml_rope_ext": (_P, [_P, _P, _P, _P, C.c_int, C.c_int, C.c_int] + [_F] * 6),
    "ggml_soft_max": (_P, [_P, _P]), "ggml_argsort_top_k": (_P, [_P, _P, C.c_int]),
    "ggml_get_rows": (_P, [_P, _P, _P]), "ggml_sum_rows": (_P, [_P, _P]), "ggml_div": (_P, [_P, _P, _P]),
    "ggml_mul": (_P, [_P, _P, _P]), "ggml_add": (_P, [_P, _P, _P]), "ggml_cont": (_P, [_P, _P]),
    "ggml_clamp": (_P, [_P, _P, _F, _F]), "ggml_reshape_2d": (_P, [_P, _P, _I64, _I64]),
    "ggml_reshape_3d": (_P, [_P, _P, _I64, _I64, _I64]),
    "ggml_view_2d": (_P, [_P, _P, _I64, _I64, C.c_size_t, C.c_size_t]),
    "ggml_new_graph": (_P, [_P]), "ggml_build_forward_expand": (None, [_P, _P]),
    "ggml_get_data": (_P, [_P]), "ggml_op_desc": (C.c_char_p, [_P]),
}
for _name, (_res, _args) in _SIGNATURES.items():
    _fn = getattr(_base, _name)
    _fn.restype, _fn.argtypes = _res, _args
_cpu.ggml_graph_compute_with_ctx.restype = C.c_int
_cpu.ggml_graph_compute_with_ctx.argtypes = [_P, _P, C.c_int]
g = _base  # ops by their ggml names: g.ggml_mul(ctx, a, b)


@contextmanager
def graph(mb: int = 64):
    """A ggml context of mb MiB: yields it; its tensors are freed with it."""
    ctx = g.ggml_init(_InitParams(mb << 20, None, False))
    try:
        yield ctx
    finally:
        g.ggml_free(ctx)


def tensor(ctx, a: np.ndarray) -> int:
    """A ggml tensor holding a copy of a (float32 or int32; numpy's shape, so ne is its reverse)."""
    a = np.ascontiguousarray(a)
    t = getattr(g, f"ggml_new_tensor_{a.ndim}d")(ctx, {np.float32: F32, np.int32: I32}[a.dtype.type], *a.shape[::-1])
    C.memmove(g.ggml_get_data(t), a.ctypes.data, a.nbytes)
    return t


def compute(ctx, *nodes) -> None:
    gf = g.ggml_new_graph(ctx)
    for n in nodes:
        g.ggml_build_forward_expand(gf, n)
    assert _cpu.ggml_graph_compute_with_ctx(ctx, gf, 1) == 0, "ggml_graph_compute failed"


def read(t: int, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    out = np.empty(shape, dtype)
    C.memmove(out.ctypes.data, g.ggml_get_data(t), out.nbytes)
    return out


def rope(x: np.ndarray, pos: np.ndarray, p: dict, factors: np.ndarray | None = None) -> np.ndarray:
    """ggml_rope_ext of x [rows][heads][head_dim] at positions pos, with p holding its parameters
    (mode, n_dims, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)."""
    with graph() as ctx:
        ff = tensor(ctx, factors.astype(np.float32)) if factors is not None else None
        t = g.ggml_rope_ext(ctx, tensor(ctx, x.astype(np.float32)), tensor(ctx, pos.astype(np.int32)), ff,
                            p["n_dims"], p["mode"], p["n_ctx_orig"], p["freq_base"], p["freq_scale"],
                            p["ext_factor"], p["attn_factor"], p["beta_fast"], p["beta_slow"])
        compute(ctx, t)
        return read(t, x.shape)


def moe_route(logits: np.ndarray, k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """build_moe_ffn's routing with softmax gating, op for op: the experts [rows][k] and their
    weights [rows][k] for router logits [rows][n_expert]."""
    rows, n = logits.shape
    with graph() as ctx:
        probs = g.ggml_soft_max(ctx, tensor(ctx, logits.astype(np.float32)))
        chosen = g.ggml_argsort_top_k(ctx, probs, k)
        weights = g.ggml_get_rows(ctx, g.ggml_reshape_3d(ctx, probs, 1, n, rows), chosen)
        if normalize:
            weights = g.ggml_reshape_2d(ctx, weights, k, rows)
            total = g.ggml_clamp(ctx, g.ggml_sum_rows(ctx, weights), 6.103515625e-5, float("inf"))
            weights = g.ggml_div(ctx, weights, total)
        ids = g.ggml_cont(ctx, chosen)
        compute(ctx, weights, ids)
        return read(ids, (rows, k), np.int32), read(weights, (rows, k))


def moe_sum(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """build_moe_ffn's ffn_moe_out from the experts' outputs y [rows][k][n_embd] and their weights
    w [rows][k]: ggml_mul, then the rank views added in order."""
    rows, k, n_embd = y.shape
    with graph() as ctx:
        experts = g.ggml_mul(ctx, tensor(ctx, y.astype(np.float32)), tensor(ctx, w.astype(np.float32)[:, :, None]))
        views = [g.ggml_view_2d(ctx, experts, n_embd, rows, 4 * n_embd * k, 4 * n_embd * j) for j in range(k)]
        out = views[0]
        for v in views[1:]:
            out = g.ggml_add(ctx, out, v)
        out = g.ggml_cont(ctx, out)
        compute(ctx, out)
        return read(out, (rows, n_embd))


def llamacpp_ropes(path: Path, n_ctx: int) -> dict[int, tuple[dict, np.ndarray | None]]:
    """layer -> (the parameters, the frequency factors or None) of the ropes llama.cpp's graph
    holds for this model in a context of n_ctx positions, read from its nodes while it decodes a
    token (every rope of a layer, Q's and K's, must take the same)."""
    seen: dict[int, tuple[dict, np.ndarray | None]] = {}

    def look(ptr: int, ask: bool) -> bool:
        if g.ggml_op_desc(ptr) != b"ROPE":
            return False if ask else True
        if ask:
            return True
        t = Tensor.from_address(ptr)
        ints, floats = list(t.op_params), np.array(t.op_params, np.int32).view(np.float32)
        p = dict(n_dims=ints[1], mode=ints[2], n_ctx_orig=ints[4], **{k: float(floats[i]) for i, k in enumerate(
            ("freq_base", "freq_scale", "ext_factor", "attn_factor", "beta_fast", "beta_slow"), start=5)})
        factors = None
        if t.src[2]:
            f = Tensor.from_address(t.src[2])
            factors = np.ctypeslib.as_array(C.cast(f.data, C.POINTER(C.c_float)), shape=(f.ne[0],)).copy()
        layer = int(t.name.decode().rsplit("-", 1)[1])
        if layer in seen:
            before = seen[layer]
            assert before[0] == p and (before[1] is None) == (factors is None) and (
                factors is None or np.array_equal(before[1], factors)), f"layer {layer}: two ropes differ"
        seen[layer] = (p, factors)
        return True

    ref = LlamaCpp(path, n_ctx=n_ctx, eval_callback=look)
    try:
        ref.logits(ref.tokenize("a")[:1])
    finally:
        ref.close()
    return seen
