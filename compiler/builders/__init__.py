"""One graph builder per mode; both share the block stages in `common`."""
from .decode import build_decode
from .prefill import build_prefill

__all__ = ["build_decode", "build_prefill"]
