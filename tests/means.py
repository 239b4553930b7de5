"""What a skip for want of a tool means: on a machine that could install the tool, nothing.

`make test` installs the tools some tests need (`make cross`: Debian's aarch64 cross compiler and
qemu-user; `make browser`: Chromium; `make vocab`: llama.cpp's tokenizer suites; `make dev`:
llama-cpp-python). Outside CI a missing tool skips its tests, saying what installs it. Under
CI=true a skip would let the run pass with that proof unmade, so it fails instead, unless the
machine truly lacks the means to install it (not root, or no apt-get), which the run then says
in one line at its end.
"""
from __future__ import annotations

import os
import shutil

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
LACKED: list[str] = []  # what was skipped for want of the means, for the run's one line


def means_to_install() -> str | None:
    """None where apt-get can install Debian's packages, else why not."""
    if shutil.which("apt-get") is None:
        return "no apt-get"
    if os.geteuid() != 0:
        return "not root"
    return None


def skip_for_want_of(tool: str, how: str, *, apt: bool = True, allow_module_level: bool = False):
    """Skip (outside CI, or where apt cannot run) or fail (CI with the means): `tool` is missing and
    `how` installs it. apt False: a tool from PyPI, which every machine that ran `make dev` has."""
    lack = means_to_install() if apt else None
    if IN_CI and lack is None:
        pytest.fail(f"CI=true: {tool} is missing, though this machine could install it ({how}); a skip here "
                    "would pass the run with its proof unmade", pytrace=False)
    if IN_CI:
        LACKED.append(f"{tool} ({lack})")
    pytest.skip(f"{tool} is missing: {how}", allow_module_level=allow_module_level)
