/* bench_load — checkpoint load time and peak resident set for a ~1 GB model, per loading mode
 * (model_load_opts.mode, src/model/checkpoint.h), all measured in the same run:
 *   read  read() each file whole into a heap buffer, then convert into the parameter buffer
 *         (the classic loader: 2× the checkpoint resident at the peak);
 *   copy  mmap, convert every tensor into the buffer, nothing dropped (moerl before this mode);
 *   mmap  the default: a moerl F32 file in the buffer's layout becomes the buffer (no copy at all);
 *         BF16 is converted from the mapping in 64 MB windows dropped behind.
 * Model: vocab 32768, hidden 1024, 7 layers, 8 heads × 128, 2 kv heads, 16 experts top-4, expert
 * size 512: 263 M parameters, 1.05 GB in F32 (0.53 GB in BF16), written once by model_save_hf.
 * Each measurement is a fresh process (this binary with --child MODE DIR), so ru_maxrss is its own
 * peak: model_load_hf_opts without gradients (as model_load_hf_inference, what generate/score/eval
 * call: config, tensor table, open, checks, convert or adopt, the finiteness check that reads every
 * parameter) timed with a monotonic clock; ru_maxrss read after it. File-backed pages of an adopted
 * mapping count in ru_maxrss like heap pages do. The files stay in the page cache
 * between runs (warm cache: the figures measure the loader, not the disk); modes alternate within
 * each repetition. Every child prints a hash of the parameter bits, which must agree across modes.
 *
 * Usage: bench_load [--reps 5] [--dir DIR] [--keep]   (bash bench/run_load.sh) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "bench_util.h"
#include "model/checkpoint.h"
#include "model/model.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static moe_config load_config(void) {
    moe_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 32768;
    c.hidden_size = 1024;
    c.intermediate_size = 2048;
    c.moe_intermediate_size = 512;
    c.num_hidden_layers = 7;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.head_dim = 128;
    c.num_experts = 16;
    c.num_experts_per_tok = 4;
    c.decoder_sparse_step = 1;
    c.norm_topk_prob = 1;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 1000000.0f;
    c.max_position_embeddings = 4096;
    c.initializer_range = 0.02f;
    c.bos_token_id = -1;
    c.eos_token_id = -1;
    return c;
}

/* One measurement: load dir in mode `mode_name` ("read", "copy" or "mmap"). */
static int child(const char *mode_name, const char *dir) {
    model_load_opts o;
    model_load_opts_default(&o);
    if (model_load_mode_parse(mode_name, "bench_load --child MODE", &o.mode) != MOERL_OK) {
        fprintf(stderr, "bench_load: %s\n", moerl_last_error());
        return 1;
    }
    const double t0 = now_s();
    moe_model m;
    if (model_load_hf_opts(&m, dir, 0, &o) != MOERL_OK) {
        fprintf(stderr, "bench_load: %s\n", moerl_last_error());
        return 1;
    }
    const double t = now_s() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the tensors' bits (padding left out) */
    for (int i = 0; i < m.n_tensors; i++) {
        const uint32_t *p = (const uint32_t *)(m.params + m.tensors[i].offset);
        for (int64_t j = 0; j < m.tensors[i].numel; j++) h = (h ^ p[j]) * 1099511628211ull;
    }
    printf("%.6f %ld %016llx %d\n", t, ru.ru_maxrss, (unsigned long long)h, m.params_map != NULL);
    model_free(&m);
    return 0;
}

static long file_bytes(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    struct stat sb;
    return stat(p, &sb) == 0 ? (long)sb.st_size : -1;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--child")) return child(argv[2], argv[3]);
    int reps = 5, keep = 0;
    const char *root = "build/bench/load_ckpt";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) root = argv[++i];
        else if (!strcmp(argv[i], "--keep")) keep = 1;
        else {
            fprintf(stderr, "usage: bench_load [--reps N] [--dir DIR] [--keep]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 100) reps = 5;
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) moerl_fatal("cannot read /proc/self/exe");
    self[k] = 0;
    char dirs[2][4096];
    snprintf(dirs[0], sizeof dirs[0], "%s/f32", root);
    snprintf(dirs[1], sizeof dirs[1], "%s/bf16", root);
    if (file_bytes(dirs[0]) < 0 || file_bytes(dirs[1]) < 0) {
        const moe_config c = load_config();
        moe_model m;
        if (model_init_inference(&m, &c) != MOERL_OK) moerl_fatal("%s", moerl_last_error());
        printf("writing the checkpoints (%lld parameters) to %s ...\n", (long long)model_num_params(&m), root);
        fflush(stdout);
        model_init_random(&m, 1);
        for (int d = 0; d < 2; d++)
            if (model_save_hf(&m, dirs[d], d == 1, 0) != MOERL_OK) moerl_fatal("%s", moerl_last_error());
        model_free(&m);
    }
    static const char *modes[3] = {"read", "copy", "mmap"};
    double t[2][3][100], rss[2][3][100];
    unsigned long long hash[2][3];
    int adopted[2][3];
    for (int r = 0; r < reps; r++) {
        for (int d = 0; d < 2; d++) {
            for (int mo = 0; mo < 3; mo++) {
                char cmd[8400];
                snprintf(cmd, sizeof cmd, "'%s' --child %s '%s'", self, modes[mo], dirs[d]);
                FILE *p = popen(cmd, "r");
                double tt = 0;
                long kb = 0;
                unsigned long long h = 0;
                int ad = 0;
                if (!p || fscanf(p, "%lf %ld %llx %d", &tt, &kb, &h, &ad) != 4) moerl_fatal("child failed: %s", cmd);
                if (pclose(p) != 0) moerl_fatal("child failed: %s", cmd);
                t[d][mo][r] = tt;
                rss[d][mo][r] = (double)kb / 1024.0;
                hash[d][mo] = h;
                adopted[d][mo] = ad;
            }
        }
    }
    printf("checkpoint load, %d repetitions (median; min–max), warm page cache, OMP_NUM_THREADS=%s\n", reps,
           getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "(unset)");
    printf("%-5s %-5s %10s %16s %10s %14s %10s %s\n", "file", "mode", "MB", "load s", "vs read", "peak RSS MB",
           "vs read", "buffer");
    int bad = 0;
    for (int d = 0; d < 2; d++) {
        const double mb = (double)file_bytes(dirs[d]) / 1e6;
        const double t_read = bench_median(t[d][0], reps), r_read = bench_median(rss[d][0], reps);
        for (int mo = 0; mo < 3; mo++) {
            double ts[100], rs[100];
            memcpy(ts, t[d][mo], sizeof ts);
            memcpy(rs, rss[d][mo], sizeof rs);
            const double tm = bench_median_sorted(ts, reps), rm = bench_median_sorted(rs, reps);
            printf("%-5s %-5s %10.0f %7.3f (%.3f–%.3f) %9.2f× %8.0f (%4.0f–%4.0f) %6.2f× %s\n", d ? "BF16" : "F32",
                   modes[mo], mb, tm, ts[0], ts[reps - 1], t_read / tm, rm, rs[0], rs[reps - 1], rm / r_read,
                   adopted[d][mo] ? "the mapped file" : "heap");
            if (hash[d][mo] != hash[d][0]) bad = 1;
        }
    }
    printf("parameter bits identical across modes: %s\n", bad ? "NO" : "yes");
    if (!keep) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        if (system(cmd) != 0) fprintf(stderr, "bench_load: could not remove %s\n", root);
    }
    return bad;
}
