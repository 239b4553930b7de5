"""C code generation: emit.py turns one IR node into one C statement; render.py fills the templates."""
from .render import Generated, generate

__all__ = ["Generated", "generate"]
