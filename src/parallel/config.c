/* The job's parallel layout keys (see config.h). */
#include "parallel/config.h"

#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "dist/compress.h"

void par_def_layout_keys(cfg *c) {
    par_def_keys(c); /* actor.fsdp_config.fsdp_size, ... (src/parallel/grid.h) */
    cfg_def_float(c, "async_training.sync_bucket_mb", 64.0, "weight-broadcast bucket in MiB (under mpirun)");
    cfg_def_float(c, "actor.grad_bucket_mb", 25.0, "data-parallel gradient all-reduce bucket in MiB (DDP's 25; under mpirun)");
    cfg_def_int(c, "trainer.n_ranks", 1, "trainer ranks: under mpirun -np N the last n_ranks ranks train (in the layout the actor.* parallel keys give: data parallel, FSDP, expert / sequence / pipeline parallel), the other N-n_ranks roll out; 1 in one process");
}

int par_check_ranks(const par_config *pc, int T, const char *advice) {
    const int pp = pc->pipeline_parallel_size, fsdp = pc->fsdp_size == -1 ? T / pp : pc->fsdp_size;
    const int any = fsdp > 1 || pc->expert_parallel_size > 1 || pc->ulysses_sequence_parallel_size > 1 || pp > 1 ||
                    pc->tensor_model_parallel_size > 1;
    if (any && T < 2)
        return moerl_errorf("model parallelism (actor.fsdp_config.fsdp_size=%d, actor.expert_parallel_size=%d, "
                            "actor.ulysses_sequence_parallel_size=%d, actor.pipeline_parallel_size=%d, "
                            "actor.megatron.tensor_model_parallel_size=%d) splits the model over trainer ranks: %s",
                            pc->fsdp_size, pc->expert_parallel_size, pc->ulysses_sequence_parallel_size, pp,
                            pc->tensor_model_parallel_size, advice);
    return MOERL_OK;
}

/* The model-parallel sizes against the trainer ranks and the gradient compression. */
static int check_model_parallel(const par_layout *L, int grad_compression) {
    const par_config *pc = &L->par;
    const int T = L->n_trainer_ranks;
    const int pp = pc->pipeline_parallel_size, fsdp = pc->fsdp_size == -1 ? T / pp : pc->fsdp_size;
    char advice[96];
    snprintf(advice, sizeof advice, "run under mpirun with trainer.n_ranks ≥ 2 (it is %d)", T);
    if (par_check_ranks(pc, T, advice) != MOERL_OK) return MOERL_ERR;
    if (par_check_pp_compose(pc) != MOERL_OK || par_check_tp(pc, T) != MOERL_OK) return MOERL_ERR; /* pipeline with FSDP or EP, not SP; TP with DP */
    const int tp = pc->tensor_model_parallel_size;
    if (tp > 1 && grad_compression != GRAD_COMPRESSION_NONE)
        return moerl_errorf("actor.grad_compression compresses the data-parallel reducer's all-reduce, which "
                            "actor.megatron.tensor_model_parallel_size=%d (TP sums its own slices) does not use: set "
                            "actor.grad_compression=none", tp);
    if (pc->fsdp_keep_gathered && fsdp <= 1) /* nothing to keep: refused, not ignored (parallel.c says the same) */
        return moerl_errorf("actor.fsdp_config.reshard_after_forward=false keeps FSDP's gathered units: it needs FSDP "
                            "on (actor.fsdp_config.fsdp_size > 1), got fsdp_size=%d over %d trainer rank%s",
                            pc->fsdp_size, T, moerl_plural(T));
    if ((fsdp > 1 || pp > 1 || pc->expert_parallel_size > 1) && grad_compression != GRAD_COMPRESSION_NONE) {
        char key[96];
        if (fsdp > 1) snprintf(key, sizeof key, "actor.fsdp_config.fsdp_size=%d (FSDP reduce-scatters)", fsdp);
        else if (pp > 1) snprintf(key, sizeof key, "actor.pipeline_parallel_size=%d (each stage sums its own)", pp);
        else snprintf(key, sizeof key, "actor.expert_parallel_size=%d (EP sums its own)", pc->expert_parallel_size);
        return moerl_errorf("actor.grad_compression compresses the data-parallel reducer's all-reduce, which %s does "
                            "not use: set actor.grad_compression=none",
                            key);
    }
    return MOERL_OK;
}

int par_read_layout(const cfg *c, int grad_compression, par_layout *L) {
    memset(L, 0, sizeof *L);
    L->n_trainer_ranks = (int)cfg_int(c, "trainer.n_ranks");
    L->sync_bucket_mb = cfg_float(c, "async_training.sync_bucket_mb");
    L->grad_bucket_mb = cfg_float(c, "actor.grad_bucket_mb");
    if (L->n_trainer_ranks < 1) return moerl_errorf("trainer.n_ranks must be ≥ 1, got %d", L->n_trainer_ranks);
    if (!(L->sync_bucket_mb > 0) || L->sync_bucket_mb > 1024)
        return moerl_errorf("async_training.sync_bucket_mb must be in (0, 1024] MiB, got %g", L->sync_bucket_mb);
    if (!(L->grad_bucket_mb > 0) || L->grad_bucket_mb > 1024)
        return moerl_errorf("actor.grad_bucket_mb must be in (0, 1024] MiB, got %g", L->grad_bucket_mb);
    if (par_read_keys(c, &L->par) != MOERL_OK) return MOERL_ERR;
    /* refused here, before any folder or model exists, in one process as under mpirun */
    return check_model_parallel(L, grad_compression);
}
