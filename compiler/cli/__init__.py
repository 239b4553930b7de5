"""The `kiln` command: one module per command, wired together in main.py."""
from .main import main

__all__ = ["main"]
