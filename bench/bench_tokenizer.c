/* bench_tokenizer — encode throughput of moerl's tokenizer on a file.
 * usage: bench_tokenizer --model DIR --file F [--reps N] [--linear-max N]
 * (--linear-max: pieces of up to N bytes use the quadratic merge loop, longer ones the heap; 0 = heap only)
 * Encodes the whole file once (warm-up: the word cache fills, as it does in a long run), then N
 * timed times; prints one JSON line: {"bytes", "tokens", "median_s", "MBps", "first_s", "load_s"}
 * (MB = 10^6 bytes; first_s = the warm-up pass, a cold cache). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "bench_util.h"
#include "data/bpe.h"
#include "data/tokenizer.h"

int main(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"file", required_argument, 0, 'f'},
                                         {"reps", required_argument, 0, 'r'},
                                         {"linear-max", required_argument, 0, 'l'}, {0, 0, 0, 0}};
    const char *model = NULL, *file = NULL;
    int reps = 5, o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o == 'm') model = optarg;
        else if (o == 'f') file = optarg;
        else if (o == 'r') reps = atoi(optarg);
        else if (o == 'l') hf_bpe_set_linear_max(atoi(optarg));
        else return 2;
    }
    if (!model || !file || reps < 1) {
        fprintf(stderr, "usage: bench_tokenizer --model DIR --file F [--reps N]\n");
        return 2;
    }
    char *buf;
    size_t len;
    if (moerl_read_file(file, &buf, &len) != MOERL_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", moerl_last_error());
        return 1;
    }
    double t0 = moerl_now();
    tokenizer *t = tokenizer_load(model, 0);
    double load_s = moerl_now() - t0;
    if (!t) {
        fprintf(stderr, "bench_tokenizer: %s\n", moerl_last_error());
        return 1;
    }
    tok_seq s = {0};
    t0 = moerl_now();
    if (tokenizer_encode(t, buf, len, true, &s) != MOERL_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", moerl_last_error());
        return 1;
    }
    double first = moerl_now() - t0;
    double *ts = xmalloc(sizeof(double) * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        tok_seq_clear(&s);
        t0 = moerl_now();
        tokenizer_encode(t, buf, len, true, &s);
        ts[r] = moerl_now() - t0;
    }
    double med = bench_median(ts, reps);
    printf("{\"bytes\": %zu, \"tokens\": %lld, \"median_s\": %.4f, \"MBps\": %.2f, \"first_s\": %.4f, \"load_s\": %.3f}\n",
           len, (long long)s.n, med, len / med / 1e6, first, load_s);
    free(ts);
    tok_seq_free(&s);
    tokenizer_free(t);
    free(buf);
    return 0;
}
