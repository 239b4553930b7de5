"""Where kiln's files are: the data it ships (architecture files, the C runtime), and its cache.

`templates/` and `runtime_c/` are top-level folders of the source tree. A wheel installs them as
package data, compiler/_share/templates and compiler/_share/runtime_c (pyproject maps them), so
the same lookup serves a checkout, an editable install and a wheel installed anywhere.
"""
from __future__ import annotations

import os
from pathlib import Path

from .errors import KilnError

PACKAGE = Path(__file__).resolve().parent.parent  # compiler/


def _shared(name: str) -> Path:
    for candidate in (PACKAGE / "_share" / name, PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise KilnError(f"kiln's {name}/ folder is missing (looked in {PACKAGE / '_share'} and {PACKAGE.parent}); "
                    "reinstall kiln")


ARCH_DIR = _shared("templates")  # one architecture file per arch: templates/<arch>.json
CHAT_TEMPLATE_DIR = ARCH_DIR / "chat"  # the built-in chat templates the architecture files name
RUNTIME_DIR = _shared("runtime_c")  # the hand-written C runtime


def cache_dir() -> Path:
    """$KILN_CACHE, default ~/.cache/kiln: fetched models, builds, generated C, packed weights."""
    return Path(os.environ.get("KILN_CACHE") or Path.home() / ".cache" / "kiln")
