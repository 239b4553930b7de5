"""Float64 log-probabilities from logits: the one log-softmax that perplexity, the KV-quality
comparison and the server's logprobs share."""
from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, in float64 (the max subtracted first, so nothing overflows)."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
