"""The compiled hot loops hold what their arithmetic needs and nothing more.

A loop's speed can fall to half with every result still right: an accumulator the compiler keeps
on the stack, a product it hoists out of a benchmark. No timing on a shared machine would see it,
so these tests read the assembly GCC makes of the C and count the instructions of each hot loop.
"""
from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from compiler.build.targets import cc, compile_args, host_family
from compiler.core.paths import RUNTIME_DIR

pytestmark = pytest.mark.skipif(host_family() != "x86_64", reason="these loops are x86's")


def loops(source: Path, target: str, extra: tuple[str, ...] = ()) -> list[list[str]]:
    """The innermost loops of the compiled source (a label, the branch back to it, no loop between),
    each as its instructions without the {vex} prefix."""
    asm = subprocess.run([*cc(target), *compile_args(False, target), *extra, f"-I{source.parent}", f"-I{RUNTIME_DIR}",
                          "-S", "-o", "-", str(source)], capture_output=True, text=True, check=True).stdout
    lines = [re.sub(r"^\{vex\}\s*", "", ln.strip()) for ln in asm.splitlines()]
    at = {ln[:-1]: i for i, ln in enumerate(lines) if re.fullmatch(r"\.L\w+:", ln)}
    spans = [(at[m.group(1)], i) for i, ln in enumerate(lines)
             if (m := re.fullmatch(r"j\w+\s+(\.L\w+)", ln)) and at.get(m.group(1), i) < i]
    inner = [(a, b) for a, b in spans if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in spans)]
    return [[x for x in lines[a + 1:b] if x and not x.startswith((".", "#"))] for a, b in inner]


def ops(loop: list[str]) -> Counter:
    return Counter(ln.split()[0] for ln in loop)


def stack_refs(loop: list[str]) -> int:
    return sum("(%rsp)" in ln or "(%rbp)" in ln for ln in loop)


PEAK_LOOPS = {  # a build of runtime_c/bench/vnni_peak.c: (its flags beyond the target's, its step's instructions, steps)
    "avx512-vnni": ((), ("vpdpbusd",), 16),
    "x86-64-v3+avxvnni": (("-mavxvnni",), ("vpdpbusd",), 12),
    "x86-64-v3": ((), ("vpmaddubsw", "vpmaddwd", "vpaddd"), 8),
}


@pytest.mark.parametrize("build", PEAK_LOOPS)
def test_the_int8_peak_loops_hold_their_multiply_adds_alone(build):
    """The yardstick of --profile's "of peak" is a loop of independent multiply-add chains; any other
    vector instruction in it lowers the peak it measures (GCC 12 once copied every accumulator each
    iteration, and the peak read 118 G multiply-adds a second of a Cascade Lake core's ~300), and a
    product hoisted out of it raises it (AVX2's was, and the loop measured vpaddd alone). The exact
    ceiling's loop holds the same chains and, for each 8 steps, one block's float steps: a vmulps and
    a vfmadd, no more (a copy of a register would cost it a slot) and no fewer."""
    extra, step, chains = PEAK_LOOPS[build]
    found = [lp for lp in loops(RUNTIME_DIR / "bench" / "vnni_peak.c", build.split("+")[0], extra) if step[0] in ops(lp)]
    assert len(found) == 2, f"{build}: {len(found)} loops hold {step[0]}"
    blocks = chains // 8
    for loop, floats in zip(sorted(found, key=len), ([], ["vmulps", "vfmadd231ps"] * blocks)):
        vector = [ln for ln in loop if re.search(r"%[xyz]mm", ln)]
        assert sorted(ln.split()[0] for ln in vector) == sorted(list(step) * chains + floats), f"{build}: {vector}"
        assert not any("(" in ln for ln in vector), f"{build}: a peak loop reads or writes memory: {vector}"


AVX512 = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni")
TUNINGS = {  # GCC's tunings the x8 kernels are built under: -march=native on Intel's and AMD's cores, and generic
    "cascadelake": ("-march=cascadelake", "-mavx512vnni"),
    "icelake-server": ("-march=icelake-server",),
    "znver3+avx512": ("-march=znver3", *AVX512),  # GCC 12.2 has no znver4; a Zen 4's -march=native tunes like this
    "x86-64-v4": ("-march=x86-64-v4", "-mavx512vnni"),
}


@pytest.mark.slow  # four builds of x8_vnni.c, ~35 s
@pytest.mark.parametrize("tuning", TUNINGS)
def test_the_x8_prefill_kernels_keep_their_accumulators_in_registers(tuning):
    """x8_vnni.c's prefill kernels (8 activation rows a weight block): a 32-weight block's loop, or a
    K-quant sub-block's, is 64 vpdpbusd and the integer and float steps around them, every accumulator
    and activation pointer in a register.
    - x8_rows (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4): inlined for all the types into one function,
      under GCC 12's tuning for Intel's cores (not its generic or Zen tuning) they had kept 30-45 of those
      on the stack, loaded and stored each block, and SmolLM2's prefill ran 18% slower on a Cascade Lake.
    - kx8_rows (the six K-quant and IQ4_XS loops): Q6_K's, Q3_K's and IQ4_XS's had reloaded a row's
      pointer for nearly every vpdpbusd, 56-76 stack references a sub-block under every tuning; they
      read a tile of the rows' values now, and Q6_K's matmul ran ~20% faster.
    - Q6_K's sub-block loop puts its weights' top two bits back from 2-bit fields (x8_pack.c).
    The 8 rows' integer chains are interleaved step by step (x8.h's chunk_dots), which takes 8 more
    registers: Q4_1 and Q5_1, which also keep 8 sums of minimums, leave 3-4 float accumulators in memory,
    each read and written once a block (the loop ran 1.10-1.19x faster all the same)."""
    found = loops(RUNTIME_DIR / "x8_vnni.c", "avx512-vnni", TUNINGS[tuning])
    block_loops = [lp for lp in found if ops(lp)["vpdpbusd"] == 64 and "vpmulld" not in ops(lp) and "vcvtdq2ps" in ops(lp)]
    sub_block_loops = [lp for lp in found if ops(lp)["vpdpbusd"] == 64 and "vpmulld" in ops(lp)]
    assert (len(block_loops), len(sub_block_loops)) == (7, 6), ([len(lp) for lp in block_loops], [len(lp) for lp in sub_block_loops])
    refs = ([stack_refs(lp) for lp in block_loops], [stack_refs(lp) for lp in sub_block_loops])
    assert max(refs[1]) <= 5 and max(refs[0]) <= 8 and sum(r > 5 for r in refs[0]) <= 2, refs  # Q4_1's, Q5_1's
    # Q6_K's (a scale a 16 weights, so two vpmulld a chunk and row, and a left shift): its top two bits
    # from 2-bit fields by a shift and a ternary logic op a vector; as two bit planes they took a kmovq,
    # a mask move and an or each (310 instructions). Q5_K's fifth bits, and the 5-bit types', come
    # from bit fields the same way, with no kmovq either.
    q6 = [lp for lp in sub_block_loops if "vpsllw" in ops(lp) and ops(lp)["vpmulld"] == 16]
    fifth = [lp for lp in block_loops + sub_block_loops if "vpsllw" in ops(lp) and ops(lp)["vpmulld"] < 16]
    assert len(fifth) == 3 and not any(ops(lp)["kmovq"] for lp in fifth), [(len(lp), ops(lp)["kmovq"]) for lp in fifth]
    assert len(q6) == 1 and len(q6[0]) <= 200 and not ops(q6[0])["kmovq"], [(len(lp), ops(lp)["kmovq"]) for lp in q6]


@pytest.mark.slow  # two builds of x8_avx2.c, ~15 s
@pytest.mark.parametrize("tuning", ["cascadelake", "znver3+avx512"])
def test_the_x8_decode_kernels_run_two_chains_on_broadcast_operands(tuning):
    """x8_avx2.c's one-row loops in the VNNI builds (decode's matmuls, 256 bits wide): a block's 8 vpdpbusd
    read their 4 activation bytes broadcast from memory ({1to8}), not through a vpbroadcastd each, and add
    into two independent chains, not one. As one chain of 8 (40 cycles of latency a block) with a broadcast
    apiece, the kernel ran 3-45% slower in cache on a Cascade Lake, depending on the type."""
    found = [lp for lp in loops(RUNTIME_DIR / "x8_avx2.c", "avx512-vnni", TUNINGS[tuning]) if ops(lp)["vpdpbusd"] == 8]
    assert len(found) >= 9, len(found)  # the seven 32-weight types' and the K-quants' chunks, some in several copies
    for lp in found:
        dots = [ln for ln in lp if ln.startswith("vpdpbusd")]
        assert all("{1to8}" in ln for ln in dots), dots
        loads = [ln for ln in lp if ln.startswith("vpbroadcastd") and "(" in ln]  # a seed's comes from a register
        assert not loads, loads
        assert len({ln.rsplit(",", 1)[1] for ln in dots}) >= 2, dots


@pytest.mark.slow  # two builds of attention.c, ~12 s
@pytest.mark.parametrize("target", ["avx512-vnni", "x86-64-v3"])
def test_decode_attention_asks_for_the_next_span_as_it_scores_this_one(target):
    """attention.c's span kernels, in decode, ask for the next item's K and V rows two lines an iteration
    (kiln_trickle, attn_span.h). Asked for all at once before an item, they stalled the thread on its fill
    buffers, and decode's attention at depth 1024 ran 1.18x slower on a Cascade Lake; asked for a line at a
    time, each tested against the range's end, 8-15% slower. So each loop that converts f16 rows and
    multiplies them comes with exactly two prefetches and no division, and at most one branch (the test of the
    step, where GCC did not make the loop twice: with the prefetches and without, as prefill runs it)."""
    found = [lp for lp in loops(RUNTIME_DIR / "attention.c", target) if ops(lp)["vfmadd231ps"] >= 4 and ops(lp)["vcvtph2ps"]]
    asking = [lp for lp in found if ops(lp)["prefetcht1"]]
    # AVX-512: the scores' 16 shapes and the values' 4 counts, some merged by GCC; AVX2: one query's 8 widths, the values
    assert len(asking) >= (12 if target == "avx512-vnni" else 5), [dict(ops(lp)) for lp in found]
    for lp in asking:
        assert ops(lp)["prefetcht1"] == 2, lp
        assert not [ln for ln in lp if re.match(r"i?div\w*\s", ln)], lp
        assert len([ln for ln in lp if re.match(r"j\w+\s", ln)]) <= 1, lp
