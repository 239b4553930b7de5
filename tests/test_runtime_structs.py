"""The C quant block structs agree with gguf-py's own size table."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

RUNTIME = Path(__file__).resolve().parent.parent / "runtime_c"
STRUCTS = {"block_q4_0": Q.Q4_0, "block_q4_1": Q.Q4_1, "block_q5_0": Q.Q5_0, "block_q5_1": Q.Q5_1,
           "block_q8_0": Q.Q8_0, "block_q4_K": Q.Q4_K, "block_q5_K": Q.Q5_K, "block_q6_K": Q.Q6_K}


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_block_sizes_match_gguf(tmp_path):
    src = tmp_path / "sizes.c"
    src.write_text('#include <stdio.h>\n#include "quants.h"\nint main(void) {\n'
                   + "".join(f'  printf("{n} %zu\\n", sizeof({n}));\n' for n in STRUCTS) + "  return 0;\n}\n")
    exe = tmp_path / "sizes"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", f"-I{RUNTIME}", str(src), "-o", str(exe)], check=True)
    sizes = dict(line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True).stdout.splitlines())
    for name, qtype in STRUCTS.items():
        assert int(sizes[name]) == GGML_QUANT_SIZES[qtype][1], name
