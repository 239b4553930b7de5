/* generate.c: greedy decoding with a kiln-compiled model from plain C, no Python.
 *
 * Build it in the directory `kiln compile MODEL -o DIR --c-lib` wrote:
 *     cc -O2 -I. examples/c/generate.c -L. -lkiln_model -Wl,-rpath,'$ORIGIN' -o generate
 * Run it with the GGUF the library was compiled for and a file of prompt token ids
 * (whitespace-separated, as `kiln tokenize MODEL -p TEXT` prints them):
 *     ./generate MODEL.gguf prompt.ids 32 [packed.x8|-] [threads]
 * It prints the N generated ids on one line; `kiln detokenize MODEL -f FILE` turns them into text.
 * Greedy: each next token is the first index of the largest logit, as kiln's Python wrapper picks.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

static int fail(const char *what, int status) {
    fprintf(stderr, "generate: %s: %s\n", what, kiln_strerror(status));
    return 1;
}

/* whitespace-separated token ids from path ("-": stdin); *n gets their count; NULL on error */
static int32_t *read_ids(const char *path, int n_vocab, int *n) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!f) {
        fprintf(stderr, "generate: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    int cap = 256, count = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    long v;
    int got;
    while (ids && (got = fscanf(f, "%ld", &v)) == 1) {
        if (v < 0 || v >= n_vocab) {
            fprintf(stderr, "generate: %s: token id %ld is outside [0, %d)\n", path, v, n_vocab);
            free(ids);
            ids = NULL;
            break;
        }
        if (count == cap) {
            int32_t *grown = realloc(ids, 2 * cap * sizeof *ids);
            if (!grown) free(ids);
            ids = grown;
            cap *= 2;
        }
        if (ids) ids[count++] = (int32_t)v;
    }
    if (ids && (!feof(f) || count == 0)) {
        fprintf(stderr, "generate: %s: expected whitespace-separated token ids%s\n", path,
                count == 0 ? " (found none)" : "");
        free(ids);
        ids = NULL;
    }
    if (f != stdin) fclose(f);
    *n = count;
    return ids;
}

/* the first index of the largest of n logits */
static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 6) {
        fprintf(stderr, "usage: %s MODEL.gguf IDS_FILE N_TOKENS [PACKED_FILE|-] [THREADS]\n", argv[0]);
        return 2;
    }
    const char *packed = argc > 4 && strcmp(argv[4], "-") != 0 ? argv[4] : NULL;
    int threads = argc > 5 ? atoi(argv[5]) : 1;
    kiln_model *m;
    int status = kiln_open(&m, argv[1], packed, threads);
    if (status < 0) return fail(argv[1], status);
    int n_vocab = kiln_n_vocab(m), n_ctx = kiln_n_ctx(m);

    int n_prompt = 0;
    int32_t *prompt = read_ids(argv[2], n_vocab, &n_prompt);
    if (!prompt) return 1;
    char *end;
    long n_gen = strtol(argv[3], &end, 10);
    if (*end || n_gen < 0 || n_prompt + n_gen > n_ctx) {
        fprintf(stderr, "generate: N_TOKENS must be a count with prompt + N <= n_ctx = %d (prompt: %d tokens)\n",
                n_ctx, n_prompt);
        return 2;
    }
    int seq = kiln_seq_open(m);
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    if (seq < 0 || !logits) return fail("opening a sequence", seq < 0 ? seq : KILN_E_NOMEM);

    status = kiln_eval(m, seq, prompt, n_prompt, logits, 0); /* prefill, in chunks: the last token's logits */
    for (long i = 0; i < n_gen && status >= 0; i++) {
        int32_t next = argmax(logits, n_vocab);
        printf(i ? " %d" : "%d", next);
        if (i + 1 < n_gen) status = kiln_eval(m, seq, &next, 1, logits, 0);
    }
    printf("\n");
    if (status < 0) return fail("decoding", status);
    free(logits);
    free(prompt);
    kiln_close(m);
    return 0;
}
