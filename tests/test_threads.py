"""The thread pool under ThreadSanitizer: pools of 1 to 4 threads created, run and destroyed
many times, with barriers between dependent writes, report no data race; the chunks of work that
threads claim (kiln_claims, as the matmuls take their rows) hand out every item exactly once, past
the lists a region keeps counters for too, in pieces whose sizes differ by one item at most."""
from __future__ import annotations

import subprocess

import pytest

from compiler.core.paths import RUNTIME_DIR

DRIVER = r"""
#include <stdatomic.h>
#include <stdio.h>
#include "threads.h"

typedef struct { int *out; int n; long sum; int lists; int *taken; atomic_int first_done; int first_took, first_cut; } job;

static void region(void *arg, const kiln_thread *t) {
    job *j = arg;
    int lo, hi;
    kiln_share(t, j->n, 1, &lo, &hi);
    for (int i = lo; i < hi; i++) j->out[i] += i; /* disjoint shares */
    kiln_barrier(t);
    if (t->ith == 0) { /* reads every share: only safe after the barrier */
        j->sum = 0;
        for (int i = 0; i < j->n; i++) j->sum += j->out[i];
    }
    kiln_barrier(t);
    /* claims are not shares: thread 0 claims while the others wait, and so takes every chunk */
    if (t->ith == 0) atomic_store(&j->first_done, 0);
    kiln_barrier(t);
    kiln_claims c = kiln_claims_begin(t, 40, 3);
    kiln_claims cut = kiln_claims_begin(t, 128, 11); /* 12 pieces of 10 or 11 items, not 11 of 11 and one of 7 */
    int took = 0, pieces = 0, smallest = 1 << 30, largest = 0;
    if (t->ith != 0)
        while (!atomic_load(&j->first_done)) {}
    for (int a, b; kiln_claim(&c, &a, &b);) took += b - a;
    for (int a, b; kiln_claim(&cut, &a, &b); pieces++) {
        smallest = b - a < smallest ? b - a : smallest;
        largest = b - a > largest ? b - a : largest;
    }
    if (t->ith == 0) {
        j->first_took = took;
        j->first_cut = t->nth == 1 || (pieces == 12 && smallest == 10 && largest == 11); /* alone: one static share */
        atomic_store(&j->first_done, 1);
    }
    /* claimed chunks: lists of 1..5 items a chunk, more lists than the region has counters for */
    for (int l = 0; l < j->lists; l++) {
        kiln_claims c = kiln_claims_begin(t, 13, 1 + l % 5);
        for (int a, b; kiln_claim(&c, &a, &b);)
            for (int i = a; i < b; i++) j->taken[13 * l + i] += 1;
    }
    kiln_barrier(t);
}

int main(void) {
    for (int n = 1; n <= 4; n++)
        for (int rep = 0; rep < 30; rep++) {
            kiln_pool *p = kiln_pool_create(n);
            int out[257] = {0};
            static int taken[13 * 2100];
            job j = {out, 257, 0, rep == 0 ? 2100 : 3, taken, 0, 0, 0};
            for (int k = 1; k <= 10; k++) {
                kiln_pool_run(p, region, &j);
                if (j.sum != (long)k * 256 * 257 / 2) return 2;
                for (int i = 0; i < 13 * j.lists; i++)
                    if (taken[i] != 1) return 4; /* every item claimed once */
                if (j.first_took != 40) return 5;
                if (!j.first_cut) return 6; /* a list's pieces differ in size by one item at most */
                for (int i = 0; i < 13 * j.lists; i++) taken[i] = 0;
            }
            if (kiln_pool_size(p) != n) return 3;
            kiln_pool_destroy(p);
        }
    puts("ok");
    return 0;
}
"""


def test_the_pool_is_race_free_under_thread_sanitizer(tmp_path):
    tsan = subprocess.run(["cc", "-print-file-name=libtsan.so"], capture_output=True, text=True).stdout.strip()
    if not tsan.startswith("/"):
        pytest.fail("the ThreadSanitizer test needs libtsan (gcc's runtime); install gcc")
    (tmp_path / "driver.c").write_text(DRIVER)
    exe = tmp_path / "pool_tsan"
    build = subprocess.run(["cc", "-std=gnu11", "-O1", "-g", "-march=native", "-fsanitize=thread", f"-I{RUNTIME_DIR}",
                            str(tmp_path / "driver.c"), str(RUNTIME_DIR / "threads.c"), "-o", str(exe), "-lpthread"],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True, env={"TSAN_OPTIONS": "halt_on_error=1"})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
    assert "ThreadSanitizer" not in r.stderr
