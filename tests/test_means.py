"""Under CI=true a skip for want of a tool fails the run, unless the machine cannot install it."""
from __future__ import annotations

import pytest

import means


def test_a_missing_tool_fails_under_ci_where_apt_could_install_it(monkeypatch):
    monkeypatch.setattr(means, "IN_CI", True)
    monkeypatch.setattr(means, "means_to_install", lambda: None)
    with pytest.raises(pytest.fail.Exception, match="chromium is missing, though this machine could install it"):
        means.skip_for_want_of("chromium", "`make browser` installs it")


def test_without_the_means_it_skips_and_the_run_names_it(monkeypatch):
    monkeypatch.setattr(means, "IN_CI", True)
    monkeypatch.setattr(means, "means_to_install", lambda: "not root")
    monkeypatch.setattr(means, "LACKED", [])
    with pytest.raises(pytest.skip.Exception, match="qemu-aarch64 is missing"):
        means.skip_for_want_of("qemu-aarch64", "`make cross` installs it")
    assert means.LACKED == ["qemu-aarch64 (not root)"]


def test_a_tool_from_pypi_is_always_installable(monkeypatch):
    monkeypatch.setattr(means, "IN_CI", True)
    monkeypatch.setattr(means, "means_to_install", lambda: "no apt-get")
    with pytest.raises(pytest.fail.Exception, match="llama-cpp-python is missing"):
        means.skip_for_want_of("llama-cpp-python", "`make dev` builds it", apt=False)


def test_outside_ci_it_skips_saying_what_installs_it(monkeypatch):
    monkeypatch.setattr(means, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="make browser"):
        means.skip_for_want_of("chromium", "`make browser` installs it")
