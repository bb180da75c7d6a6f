/* moerl plan's keys (`moerl rl`'s plus the layout and dtype keys plan models) and their reading into
 * plan_input (see plan_config.h). */
#include "plan/plan_config.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "data/data_config.h"
#include "model/model_config.h"
#include "model/perf.h"
#include "optim/onebit_adam.h"
#include "parallel/config.h"
#include "parallel/grid.h"
#include "rl/rl.h" /* rl_def_keys: every key of `moerl rl` */

static void def_int(cfg *c, const char *k, int64_t v, const char *h) {
    if (!cfg_has(c, k)) cfg_def_int(c, k, v, h);
}
static void def_str(cfg *c, const char *k, const char *v, const char *h) {
    if (!cfg_has(c, k)) cfg_def_str(c, k, v, h);
}

void plan_def_keys(cfg *c) {
    rl_def_keys(c);
    def_int(c, "rollout.n_ranks", 1, "rollout devices");
    def_int(c, "rollout.tensor_model_parallel_size", 1, "devices per rollout engine replica");
    def_str(c, "actor.dtype", "fp32", "trainer weights/grads/activations: fp32 (moerl today) | bf16 (fp32 master + moments)");
    def_str(c, "rollout.dtype", "fp32", "rollout weights and KV cache: fp32 (moerl's engine) | bf16");
    def_str(c, "plan.pp_params", "stage",
            "pipeline parameter layout: stage (each stage holds its own layers, Megatron: moerl's pipeline) | "
            "replicated (every rank holds every stage: pp_state_new alone, the bubble benchmark's)");
    plan_paged_def_keys(c);
    def_int(c, "plan.mean_response_length", 0,
            "paged KV model without rollout.synthetic_length: the response length assumed (0 = "
            "data.max_response_length, every response at the cap)");
    if (!cfg_has(c, "plan.rollout_device_memory"))
        cfg_def_float(c, "plan.rollout_device_memory", 0,
                      "bytes of memory per rollout device, for rollout.gpu_memory_utilization (0 = not given)");
    if (!cfg_has(c, "plan.link_bandwidth"))
        cfg_def_float(c, "plan.link_bandwidth", 0,
                      "gradient link per trainer rank, bytes/s (as sim.link_bandwidth), for the compression "
                      "crossover's exchange times (0 = not given: only the crossovers print)");
    if (!cfg_has(c, "plan.train_flops"))
        cfg_def_float(c, "plan.train_flops", 0,
                      "effective training FLOP/s per trainer device (as sim.train_flops), for the exchange's share of "
                      "compute (0 = not given)");
    plan_codec_def_keys(c, "plan");
}

void plan_paged_def_keys(cfg *c) {
    def_int(c, "rollout.block_size", 16, "paged KV cache: tokens per block (vLLM's block_size)");
    if (!cfg_has(c, "rollout.kv_cache_bytes")) /* a 64-bit int: cfg_check_int32 exempts keys ending in _bytes */
        cfg_def_int(c, "rollout.kv_cache_bytes", 0,
                    "paged KV cache: the engine's KV budget in bytes, e.g. 40000000000 (0 = max_num_seqs × "
                    "max_model_len, the slot engine's reservation, unless rollout.gpu_memory_utilization is set)");
    if (!cfg_has(c, "rollout.gpu_memory_utilization"))
        cfg_def_float(c, "rollout.gpu_memory_utilization", 0,
                      "paged KV cache: the KV budget as this fraction of the memory free after the weights (vLLM's "
                      "meaning; 0 = off)");
    if (!cfg_has(c, "rollout.enable_prefix_caching"))
        cfg_def_bool(c, "rollout.enable_prefix_caching", true,
                     "paged KV cache: a GRPO group's samples share their prompt's full blocks (one prefill per group)");
}

static int dtype_bytes(const cfg *c, const char *key, int *out) {
    const char *s = cfg_str(c, key);
    if (!strcmp(s, "fp32") || !strcmp(s, "float32")) *out = 4;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *out = 2;
    else return moerl_errorf("%s: '%s' is not fp32 or bf16", key, s);
    return MOERL_OK;
}

/* actor.optim.name as moerl rl parses it; a compressed exchange is warned about (the traffic rows are exact). */
static int check_optim(const cfg *c, const par_config *pc) {
    optim_name on;
    if (optim_name_parse(cfg_str(c, "actor.optim.name"), &on) != MOERL_OK) return MOERL_ERR;
    if (rl_check_optim_keys(c, (int)cfg_int(c, "trainer.n_ranks"), pc) != MOERL_OK) return MOERL_ERR; /* as rl */
    if (on != OPTIM_ADAMW || strcmp(cfg_str(c, "actor.grad_compression"), "none"))
        log_warn("actor.optim.name=%s, actor.grad_compression=%s: moerl plan does not model compressed exchanges in "
                 "its traffic rows (the gradient all-reduce row is the uncompressed fp32 volume); the gradient exchange "
                 "table below gives each scheme's bytes and time (perf/grad_compression_ratio of a run gives the "
                 "measured reduction)",
                 cfg_str(c, "actor.optim.name"), cfg_str(c, "actor.grad_compression"));
    return MOERL_OK;
}

/* The layout keys as moerl reads them (dispatcher, capacity factor), whether they fit the model, and the
 * layouts plan does not model yet, refused rather than planned as if the key were absent. */
static int plan_read_layout(const cfg *c, const moe_config *mc, par_config *pc_out) {
    par_config pc = {0};
    if (par_read_keys(c, &pc) != MOERL_OK ||
        par_check(&pc, (int)cfg_int(c, "trainer.n_ranks"), mc->num_experts, mc->num_attention_heads,
                  mc->num_key_value_heads, mc->num_hidden_layers) != MOERL_OK ||
        par_check_pp_alone(&pc, (int)cfg_int(c, "trainer.n_ranks")) != MOERL_OK) /* moerl rl's rule */
        return MOERL_ERR;
    if (plan_check_rollout_tp((int)cfg_int(c, "rollout.tensor_model_parallel_size"), mc->num_attention_heads) != MOERL_OK)
        return MOERL_ERR;
    /* rollout TP with rollout.batch_invariant or multi-turn, and against the model: rl_check_rollout_tp */
    if (cfg_int(c, "rollout.expert_parallel_size") != 1)
        return moerl_errorf("moerl plan does not model rollout.expert_parallel_size (got %lld): plan it at 1",
                            (long long)cfg_int(c, "rollout.expert_parallel_size"));
    /* TP: par_check ran par_check_tp (TP with data parallelism, and with EP when the experts are whole; Megatron
     * sequence parallelism with TP × DP and TP × EP × DP, as moerl rl); plan_compute checks the model's sizes
     * against it (tp_config_apply) */
    *pc_out = pc;
    return MOERL_OK;
}

/* Every check moerl rl makes on its keys, in its words (rl_check_config_keys, src/rl/config.c; the data keys,
 * data_check_keys with rl's held-out reason), and those it
 * makes under mpirun against the model (rl_check_rollout_tp: plan's rollout ranks are divided by plan_compute,
 * so a replica's P stand for them here) and the ranks (lockstep runs in one process: trainer.n_ranks or
 * rollout.n_ranks > 1 needs mpirun): plan refuses what rl refuses; plan's own checks below may refuse more. */
static int plan_check_rl_keys(const cfg *c, const moe_config *mc) {
    rl_config *rc = xmalloc(sizeof *rc);
    int st = rl_check_config_keys(c, rc);
    if (st == MOERL_OK && rc->mode == RL_MODE_LOCKSTEP &&
        (cfg_int(c, "trainer.n_ranks") > 1 || cfg_int(c, "rollout.n_ranks") > 1))
        st = moerl_errorf("async_training.mode=lockstep runs in one process only; under mpirun use async or sync "
                          "(trainer.n_ranks=%lld with rollout.n_ranks=%lld needs mpirun)",
                          (long long)cfg_int(c, "trainer.n_ranks"), (long long)cfg_int(c, "rollout.n_ranks"));
    if (st == MOERL_OK && rc->rollout_tp > 1) st = rl_check_rollout_tp(rc, mc, rc->rollout_tp);
    char why[96]; /* the data keys as rl checks them, the held-out split's included (trainer.val_n) */
    if (st == MOERL_OK) st = data_check_keys(c, rl_why_test(rc, why, sizeof why));
    free(rc);
    return st;
}

/* Model parallelism against trainer.n_ranks, rl's check (par_check_ranks) in plan's words: plan runs nothing, so
 * the count is all it needs (the other checks of trainer.n_ranks are rl's, plan_check_rl_keys). */
static int plan_check_ranks(const cfg *c) {
    const int64_t T = cfg_int(c, "trainer.n_ranks");
    par_config pc;
    if (T < 1 || par_read_keys(c, &pc) != MOERL_OK) return MOERL_OK; /* refused by plan_check_rl_keys, in rl's words */
    char advice[160];
    snprintf(advice, sizeof advice, "set trainer.n_ranks ≥ 2, the trainer ranks plan sizes the layout for (it is %lld; "
             "moerl rl then runs them under mpirun)", (long long)T);
    return par_check_ranks(&pc, (int)T, advice);
}

/* The prompt length plan sizes a sequence with (*plen, in: data.max_prompt_length or PLAN_DEFAULT_PROMPT_LEN),
 * against the model's context as moerl rl checks it (rl_check_seq_len): data.max_prompt_length when set, every
 * prompt rl admits being at most that long, is refused past the context; unset (0 = no limit), the assumed
 * prompt is capped at what the context leaves after data.max_response_length, the longest prompt rl admits
 * (refused when not even one token is left). */
static int plan_prompt_len(const moe_config *mc, int64_t plen0, int64_t rlen, int64_t *plen) {
    const int ctx = mc->max_position_embeddings;
    if (plen0 > 0) return rl_check_seq_len("data.max_prompt_length", plen0, rlen, ctx);
    if (ctx <= 0 || *plen + rlen <= ctx) return MOERL_OK;
    if (rl_check_seq_len("data.max_prompt_length unset: the shortest prompt", 1, rlen, ctx) != MOERL_OK)
        return MOERL_ERR;
    *plen = ctx - rlen;
    return MOERL_OK;
}

int plan_read_input(const cfg *c, const char *model, moe_config *mc, plan_input *in) {
    if (model_config_from_keys(c, model, mc) != MOERL_OK) return MOERL_ERR;
    mc->exec.separate_permute = !cfg_bool(c, "model.moe.fused_permute");
    mc->exec.per_expert_weights = !cfg_bool(c, "model.moe.stacked_weights");
    memset(in, 0, sizeof *in);
    if (cfg_check_int32(c, "seed,_bytes") != MOERL_OK || plan_check_ranks(c) != MOERL_OK ||
        plan_check_rl_keys(c, mc) != MOERL_OK)
        return MOERL_ERR;
    /* the data.* keys as moerl rl and simulate check them (e.g. data.filter_overlong_prompts=true needs
     * data.max_prompt_length > 0): plan_check_rl_keys; plan reads no data itself */
    const char *pos[] = {"trainer.n_ranks", "rollout.n_ranks", "rollout.tensor_model_parallel_size", "rollout.max_num_seqs",
                         "rollout.n", "actor.ppo_mini_batch_size", "actor.ppo_epochs", "async_training.require_batches",
                         "async_training.trigger_parameter_sync_step", "actor.ppo_max_token_len_per_gpu"};
    for (size_t i = 0; i < sizeof pos / sizeof *pos; i++)
        if (cfg_int(c, pos[i]) < 1) return moerl_errorf("%s must be ≥ 1, got %lld", pos[i], (long long)cfg_int(c, pos[i]));
    par_config pc = {0};
    if (plan_read_layout(c, mc, &pc) != MOERL_OK) return MOERL_ERR;
    in->n_trainer = (int)cfg_int(c, "trainer.n_ranks");
    rl_warn_idle_shards(&pc, in->n_trainer, (int)cfg_int(c, "actor.ppo_mini_batch_size")); /* as moerl rl */
    in->fsdp = (int)cfg_int(c, "actor.fsdp_config.fsdp_size");
    in->ep = (int)cfg_int(c, "actor.expert_parallel_size");
    in->sp = (int)cfg_int(c, "actor.ulysses_sequence_parallel_size");
    in->pp = (int)cfg_int(c, "actor.pipeline_parallel_size");
    in->tp = (int)cfg_int(c, "actor.megatron.tensor_model_parallel_size");
    in->tp_experts = cfg_int(c, "actor.megatron.expert_tensor_parallel_size") != 1;
    in->tp_sp = pc.sequence_parallel;
    in->vpp = pc.virtual_pipeline_parallel_size; /* interleaved 1F1B's chunks per stage */
    if (dtype_bytes(c, "actor.dtype", &in->dtype_bytes) != MOERL_OK) return MOERL_ERR;
    if (dtype_bytes(c, "rollout.dtype", &in->kv_dtype_bytes) != MOERL_OK) return MOERL_ERR;
    in->micro_tokens = cfg_int(c, "actor.ppo_max_token_len_per_gpu");
    in->dispatcher = (int)pc.dispatcher;
    in->alltoall_max_ep = pc.alltoall_max_ep;
    in->capacity_factor = pc.capacity_factor;
    /* the global aux loss's router-count pre-pass: one forward-only pass per micro-batch */
    in->fwd_only_passes = mc->router_aux_loss_coef > 0 && mc->num_experts > 0 ? 1 : 0;
    /* the proximal logprobs, once per step: decoupled loss, or old logprobs recomputed (no bypass) */
    in->logprob_passes = cfg_bool(c, "actor.use_decoupled_loss") || !cfg_bool(c, "algorithm.rollout_correction.bypass_mode");
    in->ref_model = cfg_bool(c, "actor.use_kl_loss") || cfg_bool(c, "algorithm.use_kl_in_reward"); /* the KL
                                                                 reference (src/rl/trainer.c trainer_init) */
    const char *ppl = cfg_str(c, "plan.pp_params");
    if (!strcmp(ppl, "stage")) in->pp_params = PLAN_PP_STAGE_LOCAL;
    else if (!strcmp(ppl, "replicated")) in->pp_params = PLAN_PP_REPLICATED;
    else return moerl_errorf("plan.pp_params: '%s' is not stage or replicated", ppl);
    if (model_check_train_keys(c) != MOERL_OK) return MOERL_ERR;
    in->recompute = model_recompute_mode(c); /* MODEL_RECOMPUTE_*: the arena's layout (plan_acts_bytes) */
    in->fsdp_keep_gathered = pc.fsdp_keep_gathered; /* actor.fsdp_config.reshard_after_forward=false */
    const int64_t rb = cfg_int(c, "async_training.require_batches"), ep = cfg_int(c, "actor.ppo_epochs");
    if (rb * ep > INT32_MAX) /* both fit 32 bits (cfg_check_int32), so the product fits 64 */
        return moerl_errorf("async_training.require_batches × actor.ppo_epochs = %lld × %lld optimizer updates per "
                            "step exceed 2^31 − 1", (long long)rb, (long long)ep);
    in->updates_per_step = (int)(rb * ep);
    /* data.max_prompt_length (src/data/data_config.c, shared with rl): 0 = no limit there, planned as 512 here */
    const int64_t plen0 = cfg_int(c, "data.max_prompt_length"), rlen = cfg_int(c, "data.max_response_length");
    int64_t plen = plen0 == 0 ? PLAN_DEFAULT_PROMPT_LEN : plen0;
    if (plen <= 0 || rlen <= 0)
        return moerl_errorf("data.max_prompt_length (%lld; 0 = no limit, planned as %d) and data.max_response_length "
                            "(%lld) must be positive",
                            (long long)plen0, PLAN_DEFAULT_PROMPT_LEN, (long long)rlen);
    if (plen + rlen > INT32_MAX)
        return moerl_errorf("data.max_prompt_length + data.max_response_length = %lld does not fit a 32-bit sequence "
                            "length", (long long)(plen + rlen));
    if (plan_prompt_len(mc, plen0, rlen, &plen) != MOERL_OK) return MOERL_ERR; /* the context, as rl checks it */
    /* one epoch's tokens of a step at full length (an upper bound: real responses stop earlier) */
    const int64_t mini = cfg_int(c, "actor.ppo_mini_batch_size"), n = cfg_int(c, "rollout.n");
    const double st = (double)mini * (double)rb * (double)n * (double)(plen + rlen) * (double)ep; /* no int64 overflow */
    if (st > PLAN_MAX_STEP_TOKENS)
        return moerl_errorf("the tokens trained per step, actor.ppo_mini_batch_size × async_training.require_batches × "
                            "rollout.n × (data.max_prompt_length + data.max_response_length) × actor.ppo_epochs = "
                            "%lld × %lld × %lld × %lld × %lld = %.4g, exceed plan's limit 2^53 (%.4g): lower one of "
                            "them", (long long)mini, (long long)rb, (long long)n, (long long)(plen + rlen),
                            (long long)ep, st, PLAN_MAX_STEP_TOKENS);
    in->step_tokens = mini * rb * n * (plen + rlen) * ep;
    in->logprob_tokens = in->step_tokens / ep;
    in->resp_fraction = (double)rlen / (double)(plen + rlen);
    in->n_rollout = (int)cfg_int(c, "rollout.n_ranks");
    in->rollout_tp = (int)cfg_int(c, "rollout.tensor_model_parallel_size");
    in->max_num_seqs = (int)cfg_int(c, "rollout.max_num_seqs");
    in->record_routes = cfg_bool(c, "rollout.enable_rollout_routing_replay");
    /* actor.router_replay.mode's needs (R3: the record; R2: the old-logprob pass): rl_check_config_keys */
    if (check_optim(c, &pc) != MOERL_OK) return MOERL_ERR;
    in->max_model_len = (int)(plen + rlen);
    /* where a sequence's length comes from, for messages: the keys, or plan's assumption for an unset
     * data.max_prompt_length */
    static char len_src[256];
    if (plen0 == 0 && plen < PLAN_DEFAULT_PROMPT_LEN)
        snprintf(len_src, sizeof len_src, "data.max_prompt_length unset (0 = no limit in rl; plan assumes %d), capped "
                 "at %lld by the model's context (max_position_embeddings %d) + data.max_response_length=%lld",
                 PLAN_DEFAULT_PROMPT_LEN, (long long)plen, mc->max_position_embeddings, (long long)rlen);
    else if (plen0 == 0)
        snprintf(len_src, sizeof len_src, "data.max_prompt_length unset (0 = no limit in rl; plan assumes %d) + "
                 "data.max_response_length=%lld", PLAN_DEFAULT_PROMPT_LEN, (long long)rlen);
    else
        snprintf(len_src, sizeof len_src, "data.max_prompt_length=%lld + data.max_response_length=%lld",
                 (long long)plen, (long long)rlen);
    if (in->micro_tokens > 0 && in->micro_tokens < plen + rlen) /* as moerl rl refuses it (rl_check_update_sizes) */
        return moerl_errorf("actor.ppo_max_token_len_per_gpu=%lld is below one sequence: %s = %lld tokens, and a "
                            "sequence is never split across micro-batches: set actor.ppo_max_token_len_per_gpu to at "
                            "least %lld%s",
                            (long long)in->micro_tokens, len_src, (long long)(plen + rlen), (long long)(plen + rlen),
                            plen0 == 0 ? ", or set data.max_prompt_length to the longest prompt of your data (what "
                                         "moerl rl measures from the data when it is unset)"
                                       : "");
    /* whole GRPO groups per data-parallel pipeline, as moerl rl checks them (rl_check_pipeline_groups):
     * prompts at the planned length, responses as short as 0 tokens */
    in->group_size = (int)n;
    in->groups_per_update = (int)mini;
    in->min_seq_len = (int)plen;
    in->seq_len_src = len_src;
    in->sync_every = (int)cfg_int(c, "async_training.trigger_parameter_sync_step");
    return MOERL_OK;
}

int plan_read_paged(const cfg *c, const moe_config *mc, const plan_input *in, const plan_result *r, plan_kv_input *kv) {
    memset(kv, 0, sizeof *kv);
    kv->prompt_len = in->min_seq_len; /* data.max_prompt_length, or plan's 512 */
    kv->max_response = in->max_model_len - in->min_seq_len;
    kv->synth_alpha = cfg_float(c, "rollout.synthetic_length.alpha");
    kv->synth_min = (int)MOERL_MIN(cfg_int(c, "rollout.synthetic_length.min"), INT32_MAX);
    const int64_t mr = cfg_int(c, "plan.mean_response_length");
    if (mr < 0 || mr > kv->max_response)
        return moerl_errorf("plan.mean_response_length must be in 0..data.max_response_length (%d; 0 = the cap), got "
                            "%lld", kv->max_response, (long long)mr);
    if (mr > 0 && kv->synth_alpha > 0)
        return moerl_errorf("plan.mean_response_length=%lld and rollout.synthetic_length.alpha=%g both give the "
                            "response lengths: set one of them", (long long)mr, kv->synth_alpha);
    kv->fixed_response = mr > 0 ? (int)mr : kv->max_response;
    const int64_t bs = cfg_int(c, "rollout.block_size");
    if (bs < 1 || bs > 65536) return moerl_errorf("rollout.block_size must be in [1, 65536] tokens, got %lld", (long long)bs);
    kv->block_size = (int)bs;
    kv->group_size = in->group_size;
    kv->prefix_caching = cfg_bool(c, "rollout.enable_prefix_caching");
    kv->max_num_seqs = in->max_num_seqs;
    kv->max_model_len = in->max_model_len;
    kv->token_bytes = r->kv_cache / ((double)in->max_num_seqs * in->max_model_len);
    const double kb = (double)cfg_int(c, "rollout.kv_cache_bytes");
    const double util = cfg_float(c, "rollout.gpu_memory_utilization"), mem = cfg_float(c, "plan.rollout_device_memory");
    if (!(kb >= 0) || !isfinite(kb))
        return moerl_errorf("rollout.kv_cache_bytes must be ≥ 0 (0 = see rollout.gpu_memory_utilization), got %g", kb);
    if (!(util >= 0 && util <= 1))
        return moerl_errorf("rollout.gpu_memory_utilization must be a fraction in [0, 1] (0 = off), got %g", util);
    if (!(mem >= 0) || !isfinite(mem))
        return moerl_errorf("plan.rollout_device_memory must be ≥ 0 bytes, got %g", mem);
    if (kb > 0 && util > 0)
        return moerl_errorf("rollout.kv_cache_bytes=%g and rollout.gpu_memory_utilization=%g both give the KV "
                            "budget: set one of them", kb, util);
    const int split = MOERL_MIN(in->rollout_tp, mc->num_key_value_heads); /* devices sharing an engine's KV */
    if (kb > 0) kv->budget_bytes = kb / MOERL_MAX(split, 1);
    if (util > 0) {
        if (mem <= 0)
            return moerl_errorf("rollout.gpu_memory_utilization=%g needs the rollout device's memory: give "
                                "plan.rollout_device_memory=BYTES (e.g. 141e9 for an H200)", util);
        const double held = r->rollout_weights + r->routing_record;
        if (mem <= held)
            return moerl_errorf("plan.rollout_device_memory=%.4g bytes does not hold the rollout device's weights and "
                                "routing record (%.4g bytes): nothing is left for the KV cache", mem, held);
        kv->budget_bytes = util * (mem - held);
    } else if (strcmp(cfg_origin(c, "plan.rollout_device_memory"), "default")) {
        return moerl_errorf("plan.rollout_device_memory=%g is set but rollout.gpu_memory_utilization is 0: it sizes "
                            "only that budget", mem);
    }
    return MOERL_OK;
}

int plan_read_xchg(const cfg *c, const moe_config *mc, const plan_input *in, const plan_result *r, plan_xchg_input *x,
                   plan_codec *k) {
    memset(x, 0, sizeof *x);
    if (plan_codec_read(c, "plan", k) != MOERL_OK) return MOERL_ERR;
    x->link_bw = cfg_float(c, "plan.link_bandwidth");
    const double fl = cfg_float(c, "plan.train_flops");
    if (!(x->link_bw >= 0) || !isfinite(x->link_bw))
        return moerl_errorf("plan.link_bandwidth must be ≥ 0 bytes/s (0 = not given), got %g", x->link_bw);
    if (!(fl >= 0) || !isfinite(fl))
        return moerl_errorf("plan.train_flops must be ≥ 0 FLOP/s (0 = not given), got %g", fl);
    x->elements = (double)r->n_params; /* the bucketed reducer's payload: the whole padded layout, 4 B each */
    if (r->tp > 1) x->elements = r->grads / in->dtype_bytes; /* TP: each rank sums its slice over its dp ranks */
    x->ranks = r->dp;
    if (fl > 0) { /* one update's forward + backward, every sequence at full length, shared by the trainer devices */
        const double L = in->max_model_len, seqs = (double)in->step_tokens / L / in->updates_per_step;
        x->compute_s = model_train_flops(mc, (int64_t)(seqs * L), (int64_t)(seqs * L * (L + 1) / 2)) / in->n_trainer / fl;
    }
    return MOERL_OK;
}
