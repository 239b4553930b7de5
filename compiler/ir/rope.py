"""RoPE's parameters beyond the layer's base, as llama.cpp derives them from the GGUF.

llama.cpp hands every rope the same numbers (ggml_rope_ext): a frequency scale (1 / the scaling
factor, for linear and YaRN scaling), YaRN's extrapolation mix and its correction dimensions
(beta_fast, beta_slow, the original context), a magnitude applied to cos and sin (the attention
factor, and YaRN's own 1 + 0.1 ln(factor)), and optionally per-dimension frequency factors (Llama
3's rope_freqs; Phi-3's LongRoPE factors, long or short by the context). The magnitudes are
computed here in float32, in llama.cpp's order (llama_context's yarn_attn_factor, then ggml's
rope_yarn); the kernel (runtime_c/ops.c, kiln_rope_ext) follows ggml_rope_cache_init.

The logarithms are libm's logf, the function llama.cpp calls: numpy's float32 log is another
implementation, an ulp away on some inputs. rope_yarn's magnitude, 1 + 0.1 ln(1 / freq_scale), is
one fused multiply-add where ggml-cpu is built with FMA (llama_context's terms are not: libllama
is built for the baseline CPU).
"""
from __future__ import annotations

import ctypes
import ctypes.util
from fractions import Fraction

import numpy as np

from ..core.errors import ModelFileError
from ..frontend.architecture import ROPE_FACTOR_TENSORS, Architecture, RopeFactors, RopeLayout
from ..frontend.spec import HParams, ModelSpec
from .graph import RopeAttrs

_F = np.float32
_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.logf.restype, _libm.logf.argtypes = ctypes.c_float, [ctypes.c_float]


def _ln(x) -> np.float32:
    return _F(_libm.logf(float(_F(x))))


def _fma(a, b, c) -> np.float32:
    """a * b + c rounded once to float32 (to nearest, ties to even), as fmaf does."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    near = _F(float(exact))  # within an ulp of the answer: float64, then float32, rounds twice
    candidates = (np.nextafter(near, _F(-np.inf)), near, np.nextafter(near, _F(np.inf)))
    return min(candidates, key=lambda v: (abs(Fraction(float(v)) - exact), int(v.view(np.uint32)) & 1))


def rope_attrs(hp: HParams, layout: RopeLayout) -> RopeAttrs:
    yarn = hp.rope_scaling == "yarn"
    freq_scale = _F(1) if hp.rope_scaling == "none" else _F(1) / _F(hp.rope_scaling_factor)
    attn = _F(1)
    if yarn:  # llama_context: get_mscale(factor) / (1 + 0.1 ln factor), which the kernel's own factor restores
        factor = _F(1) / freq_scale
        attn = _F(1) if factor <= 1 else _F(0.1) * _ln(factor) + _F(1)
        attn = attn * (_F(1) / (_F(1) + _F(0.1) * _ln(factor)))
    attn = attn * _F(hp.rope_attn_factor)
    mscale = attn * _fma(_F(0.1), _ln(_F(1) / freq_scale), _F(1)) if yarn else attn  # ggml's rope_yarn
    return RopeAttrs(layout=layout, n_rot=hp.n_rot, freq_scale=float(freq_scale), ext_factor=1.0 if yarn else 0.0,
                     mscale=float(mscale), beta_fast=hp.yarn_beta_fast, beta_slow=hp.yarn_beta_slow,
                     n_ctx_orig=hp.rope_n_ctx_orig)


def rope_factors(spec: ModelSpec, arch: Architecture, n_ctx: int | None) -> tuple[str | None, tuple[str, ...]]:
    """The factors tensor the ropes read (or None), and the factor tensors of the file they do not.

    LongRoPE takes the long factors when the context exceeds the original one, as llama.cpp does
    (which compares its context rounded up to a multiple of 256). Without a context (a graph built
    only to be looked at) the short ones."""
    names = ROPE_FACTOR_TENSORS[arch.rope_factors]
    present = [n for n in names if n in spec.tensors]
    if not present:
        return None, ()
    if arch.rope_factors is RopeFactors.LONG_SHORT:
        if len(present) == 1:
            missing = next(n for n in names if n not in present)
            raise ModelFileError(f"{spec.path}: tensor '{present[0]}' is there but '{missing}' is missing; LongRoPE "
                                 "takes one or the other by the context, so a file has both")
        long = n_ctx is not None and n_ctx > spec.hparams.rope_n_ctx_orig
        chosen = names[0] if long else names[1]
        return chosen, tuple(n for n in names if n != chosen)
    return present[0], ()
