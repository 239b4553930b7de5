"""kiln: an ahead-of-time compiler from GGUF models to C for CPU inference."""
from .core.version import __version__


def load(*args, **kwargs):
    """compiler.load(model, ctx=2048, kv_dtype="f32", threads=None, prefill_chunk=256) -> Model"""
    from .runtime.model import load as _load

    return _load(*args, **kwargs)
