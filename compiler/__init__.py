"""kiln: an ahead-of-time compiler from GGUF models to C for CPU inference."""
from .core.version import __version__


def load(*args, **kwargs):
    from .runtime.api import load as _load

    return _load(*args, **kwargs)


load.__doc__ = """compiler.load(model, ctx=2048, kv_dtype="f32", threads=None, ...) -> Model.

The whole signature, every parameter explained: compiler.runtime.api.load."""
