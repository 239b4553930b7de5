"""llama.cpp (through llama-cpp-python) as the reference kiln is measured against."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.core.numerics import log_softmax
from compiler.tools.llamacpp import LlamaCpp as Reference  # noqa: F401 (the tests import it from here)


@dataclass(frozen=True)
class Agreement:
    mean_kl: float
    top1: float
    max_abs: float
    positions: int


def compare(ref_logits: np.ndarray, kiln_logits: np.ndarray, rows_at_once: int = 16) -> Agreement:
    """KL(llama.cpp || kiln) and top-1 agreement over the rows given, a few rows at a time: the
    float64 temporaries of [rows, 262k] logits would otherwise take gigabytes."""
    kl, top1, max_abs = 0.0, 0, 0.0
    for i in range(0, len(ref_logits), rows_at_once):
        a, b = ref_logits[i:i + rows_at_once], kiln_logits[i:i + rows_at_once]
        lp, lq = log_softmax(a), log_softmax(b)
        kl += float((np.exp(lp) * (lp - lq)).sum())
        top1 += int((a.argmax(-1) == b.argmax(-1)).sum())
        max_abs = max(max_abs, float(np.abs(a - b).max()))
    n = len(ref_logits)
    return Agreement(kl / n, top1 / n, max_abs, n)


def combined(parts: list[Agreement]) -> Agreement:
    """The agreement over all the rows of several comparisons."""
    n = sum(a.positions for a in parts)
    return Agreement(sum(a.mean_kl * a.positions for a in parts) / n, sum(a.top1 * a.positions for a in parts) / n,
                     max(a.max_abs for a in parts), n)


def kiln_greedy(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens after ids from a kiln model, for Reference.greedy's to be compared with."""
    logits, got = model.prefill(ids), []
    for _ in range(n):
        got.append(int(logits.argmax()))
        logits = model.decode(got[-1])
    return got
