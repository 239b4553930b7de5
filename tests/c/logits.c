/* logits.c: a kiln model's logits from plain C, for a build this machine cannot load into Python
 * (another architecture, run under an emulator). tests/test_target_aarch64.py compares them with
 * the logits of the x86 builds.
 *
 *     ./logits MODEL.gguf IDS_FILE N_STEPS OUT_FILE [THREADS]
 *
 * OUT_FILE gets, as float32 rows of kiln_n_out (n_vocab logits; an encoder's hidden states):
 *   the prompt's logits in one kiln_eval (every row: a chunk);
 *   the same prompt's logits token by token, after a reset;
 *   the prompt's logits from steps that take it beside another sequence's rows, two of its
 *   tokens a step (the other sequence's row first);
 *   N_STEPS greedy steps' logits, after the first chunk.
 * A row's logits must not depend on how it was batched: the three prompt blocks are equal bit for bit.
 */
#include <stdio.h>
#include <stdlib.h>

#include "model.h"

static int fail(const char *what, int status) {
    fprintf(stderr, "logits: %s: %s\n", what, kiln_strerror(status));
    return 1;
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int main(int argc, char **argv) {
    if (argc < 5 || argc > 6) {
        fprintf(stderr, "usage: %s MODEL.gguf IDS_FILE N_STEPS OUT_FILE [THREADS]\n", argv[0]);
        return 2;
    }
    kiln_model *m;
    int status = kiln_open(&m, argv[1], NULL, argc > 5 ? atoi(argv[5]) : 1);
    if (status < 0) return fail(argv[1], status);
    int n_vocab = kiln_n_out(m), n_steps = atoi(argv[3]);

    int32_t ids[256];
    int n = 0;
    FILE *f = fopen(argv[2], "r");
    if (!f) return fail(argv[2], KILN_E_OPEN);
    long v;
    while (n < 256 && fscanf(f, "%ld", &v) == 1) ids[n++] = (int32_t)v;
    fclose(f);

    size_t row = (size_t)n_vocab;
    float *out = malloc((3 * (size_t)n + (size_t)n_steps) * row * sizeof *out);
    float *chunk = out, *single = out + n * row, *beside = out + 2 * n * row, *steps = out + 3 * n * row;
    float *two = malloc(3 * row * sizeof *two);
    if (!out || !two) return fail("memory", KILN_E_NOMEM);

    int a = kiln_seq_open(m), b = kiln_seq_open(m);
    if (a < 0 || b < 0) return fail("opening two sequences (compile with --n-seq 2)", a < 0 ? a : b);
    if ((status = kiln_eval(m, a, ids, n, chunk, 1)) < 0) return fail("the prompt in one chunk", status);
    kiln_seq_reset(m, a);
    for (int i = 0; i < n; i++)
        if ((status = kiln_eval(m, a, &ids[i], 1, single + i * row, 0)) < 0) return fail("token by token", status);

    kiln_seq_reset(m, a);
    for (int i = 0; i < n; i += 2) {
        int rows = i + 1 < n ? 3 : 2;
        int32_t token[3] = {ids[n - 1 - i], ids[i], i + 1 < n ? ids[i + 1] : 0};
        int32_t seq[3] = {b, a, a};
        int8_t want[3] = {1, 1, 1};
        kiln_batch batch = {rows, token, seq, NULL, want};
        if ((status = kiln_step(m, &batch, two)) < 0) return fail("steps beside another sequence", status);
        for (int r = 1; r < rows; r++)
            for (size_t j = 0; j < row; j++) beside[(i + r - 1) * row + j] = two[r * row + j];
    }

    kiln_seq_rollback(m, a, n);
    const float *last = chunk + (n - 1) * row;
    for (int s = 0; s < n_steps; s++) {
        int32_t next = argmax(last, n_vocab);
        if ((status = kiln_eval(m, a, &next, 1, steps + s * row, 0)) < 0) return fail("greedy steps", status);
        last = steps + s * row;
    }

    FILE *o = fopen(argv[4], "wb");
    if (!o || fwrite(out, sizeof *out, (3 * (size_t)n + n_steps) * row, o) != (3 * (size_t)n + n_steps) * row)
        return fail(argv[4], KILN_E_OPEN);
    fclose(o);
    free(out);
    free(two);
    kiln_close(m);
    return 0;
}
