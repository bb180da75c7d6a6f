/* SFT loop (see sft.h). */
#include "train/sft.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/signals.h"
#include "train/ckpt.h"
#include "data/tokenizer.h"
#include "train/train.h"

typedef struct {
    double inv_tokens; /* 1 / response tokens of the global batch */
    double ce_sum;
} sft_ctx;

static double sft_grad(void *vctx, const model_acts *a, const int *seq_of, const int *resp_index, float *dlogp,
                       float *dent) {
    sft_ctx *ctx = vctx;
    double loss = 0;
    for (int n = 0; n < a->N; n++) {
        if (resp_index[n] < 0) continue;
        loss -= a->logp[n] * ctx->inv_tokens;
        dlogp[n] = (float)(-ctx->inv_tokens);
    }
    ctx->ce_sum += loss;
    return loss;
}

/* Write the resumable state (see sft_opts.state_dir). */
static int sft_save_state(const moe_model *m, const adamw_state *os, const dataset *train, const sft_opts *o,
                          int64_t step, double acc0, int finished) {
    char tmp[4200], p[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", o->state_dir);
    ckpt_remove_flat_dir(tmp);
    if (moerl_mkdirs(tmp) != MOERL_OK || model_save_hf(m, tmp, 0, 0) != MOERL_OK) return MOERL_ERR;
    if (tokenizer_save(tok_current(), tmp) != MOERL_OK) return MOERL_ERR; /* a checkpoint carries its tokenizer */
    snprintf(p, sizeof p, "%s/optimizer.safetensors", tmp);
    if (ckpt_save_optimizer(os, p) != MOERL_OK) return MOERL_ERR;
    json_t *s = json_object();
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)dataset_fingerprint(train));
    json_object_set_new(s, "format", json_string("moerl-sft-state"));
    json_object_set_new(s, "format_version", json_integer(1));
    json_object_set_new(s, "step", json_integer(step));
    json_object_set_new(s, "optimizer_step", json_integer(os->step));
    json_object_set_new(s, "optimizer_skipped", json_integer(os->skipped));
    json_object_set_new(s, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(s, "batch_size", json_integer(o->batch_size));
    json_object_set_new(s, "n_rows", json_integer(dataset_count(train)));
    json_object_set_new(s, "data_fingerprint", json_string(fp));
    json_object_set_new(s, "accuracy_before", isfinite(acc0) ? json_real(acc0) : json_null());
    json_object_set_new(s, "stopped_at_accuracy", json_boolean(finished)); /* sft.stop_at_accuracy ended it */
    char *txt = json_dumps(s, JSON_INDENT(1));
    json_decref(s);
    snprintf(p, sizeof p, "%s/sft_state.json", tmp);
    const int rc = moerl_write_file_atomic(p, txt, strlen(txt));
    free(txt);
    if (rc != MOERL_OK || ckpt_swap_dir(tmp, o->state_dir) != MOERL_OK) return MOERL_ERR;
    return MOERL_OK;
}

/* Load the resumable state if present: 1 resumed (weights, optimizer, *step, *acc0), 0 none. */
static int sft_load_state(moe_model *m, adamw_state *os, const dataset *train, const sft_opts *o, int64_t *step,
                          double *acc0, int *finished) {
    char dir[4200], p[4300];
    snprintf(dir, sizeof dir, "%s", o->state_dir);
    snprintf(p, sizeof p, "%s/sft_state.json", dir);
    if (access(p, R_OK) != 0) { /* a kill between the two renames of the swap leaves .old */
        snprintf(dir, sizeof dir, "%s.old", o->state_dir);
        snprintf(p, sizeof p, "%s/sft_state.json", dir);
        if (access(p, R_OK) != 0) {
            snprintf(p, sizeof p, "%s/model.safetensors", o->state_dir);
            char q[4300];
            snprintf(q, sizeof q, "%s/trainer_state.json", o->state_dir);
            if (access(q, F_OK) == 0)
                return moerl_errorf("%s holds a moerl rl checkpoint (trainer_state.json), not an SFT run to resume: use "
                                    "another trainer.default_local_dir (model.path can point at it)", o->state_dir);
            if (access(p, F_OK) == 0)
                return moerl_errorf("%s holds a checkpoint without sft_state.json (a finished SFT run of an older moerl, "
                                    "or a copied model?), not an SFT run to resume: use another trainer.default_local_dir, "
                                    "or trainer.resume_mode=disable trainer.overwrite_output_dir=true to replace it",
                                    o->state_dir);
            return 0;
        }
    }
    json_error_t err;
    json_t *s = json_load_file(p, 0, &err);
    if (!s)
        return moerl_errorf("%s:%d: %s (the file is damaged: move the checkpoint folder away or set "
                            "trainer.resume_mode=disable)", p, err.line, err.text);
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)dataset_fingerprint(train));
    const char *fmt = json_string_value(json_object_get(s, "format")), *sfp = json_string_value(json_object_get(s, "data_fingerprint"));
    json_t *jst = json_object_get(s, "step");
    int bad = !fmt || strcmp(fmt, "moerl-sft-state") || json_integer_value(json_object_get(s, "format_version")) != 1 ||
              !json_is_integer(jst) || json_integer_value(jst) < 0;
    if (bad) {
        json_decref(s);
        return moerl_errorf("%s: not a moerl SFT state of format_version 1 with a step ≥ 0 (the file is damaged: move "
                            "the checkpoint folder away or set trainer.resume_mode=disable)", p);
    }
    {
        char what[200] = "";
        const long long sbs = json_integer_value(json_object_get(s, "batch_size"));
        const unsigned long long sseed = (unsigned long long)json_integer_value(json_object_get(s, "seed"));
        if (!sfp || strcmp(sfp, fp) || json_integer_value(json_object_get(s, "n_rows")) != dataset_count(train))
            snprintf(what, sizeof what, "other training data (its rows are fingerprinted)");
        else if (sseed != o->seed)
            snprintf(what, sizeof what, "trainer.seed %llu (now %llu)", sseed, (unsigned long long)o->seed);
        else if (sbs != o->batch_size) /* the data order is replayed per batch: a resume keeps the batch size */
            snprintf(what, sizeof what, "batch size %lld (now %d; data.train_batch_size / sft.train_batch_size)", sbs,
                     o->batch_size);
        if (what[0]) {
            json_decref(s);
            return moerl_errorf("%s: the checkpoint was made with %s; resume with the same setting, or use a new "
                                "trainer.default_local_dir, or trainer.resume_mode=disable", p, what);
        }
    }
    if (model_load_weights(m, dir) != MOERL_OK) {
        json_decref(s);
        return MOERL_ERR;
    }
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    if (ckpt_load_optimizer(os, p) != MOERL_OK) {
        json_decref(s);
        return MOERL_ERR;
    }
    *step = json_integer_value(jst);
    os->step = json_integer_value(json_object_get(s, "optimizer_step"));
    os->skipped = json_integer_value(json_object_get(s, "optimizer_skipped"));
    json_t *a = json_object_get(s, "accuracy_before");
    *acc0 = json_is_number(a) ? json_number_value(a) : NAN;
    *finished = json_is_true(json_object_get(s, "stopped_at_accuracy"));
    json_decref(s);
    return 1;
}

int sft_train(moe_model *m, const dataset *train, const dataset *test, const sft_opts *o, double *acc_before,
              double *acc_after) {
    const int64_t n_rows = dataset_count(train);
    const int bs = o->batch_size;
    if (bs <= 0 || bs > n_rows)
        return moerl_errorf("SFT batch size %d (data.train_batch_size, or sft.train_batch_size for the warm start) must be "
                            "in 1..%lld, the training rows (after sft.validation_rows)", bs, (long long)n_rows);
    if (!(o->optim.lr >= 0) || !isfinite(o->optim.lr) || !(o->optim.weight_decay >= 0) || !isfinite(o->optim.weight_decay))
        return moerl_errorf("SFT learning rate and weight decay (optim.lr / optim.weight_decay, sft.lr / sft.weight_decay "
                            "for the warm start) must be finite numbers ≥ 0 (got %g, %g)",
                            (double)o->optim.lr, (double)o->optim.weight_decay);
    int rc = MOERL_ERR;
    tok_seq *seqs = xcalloc(n_rows, sizeof(tok_seq));
    int *resp_start = xmalloc(n_rows * sizeof(int)), *order = xmalloc(n_rows * sizeof(int));
    train_seq *batch = xmalloc(bs * sizeof(train_seq));
    metrics_writer *mw = NULL;
    model_acts acts = {0};
    adamw_state os = {0};
    for (int64_t i = 0; i < n_rows; i++) {
        const ds_row *r = dataset_row(train, i);
        if (!r->response) {
            moerl_errorf("%s:%lld: SFT needs a 'response' field", train->path, (long long)r->line);
            goto out;
        }
        tok_chat_encode(r->prompt, r->n_prompt, true, &seqs[i]);
        resp_start[i] = (int)seqs[i].n;
        tok_encode_response(r->response, &seqs[i]);
        for (int64_t t = 0; t < seqs[i].n; t++)
            if (seqs[i].ids[t] >= m->cfg.vocab_size) {
                moerl_errorf("%s:%lld: token %d outside the model's vocabulary %d", train->path, (long long)r->line,
                             seqs[i].ids[t], m->cfg.vocab_size);
                goto out;
            }
    }
    int64_t total = o->total_epochs * (n_rows / bs);
    if (o->total_steps > 0) total = o->total_steps;
    if (total <= 0) {
        moerl_errorf("no SFT steps: %lld rows, batch %d, %lld epochs", (long long)n_rows, bs, (long long)o->total_epochs);
        goto out;
    }
    adamw_init(&os, m, o->optim);
    if (model_acts_init(&acts, m, o->max_tokens) != MOERL_OK) goto out;
    if (o->stop_signal_out) *o->stop_signal_out = 0;
    int64_t step0 = 0;
    double acc0 = 0, acc = 0, mlen;
    int resumed = 0, finished = 0;
    if (o->state_dir && o->resume) {
        resumed = sft_load_state(m, &os, train, o, &step0, &acc0, &finished);
        if (resumed < 0) goto out;
        if (resumed) {
            log_info("%s: resumed from %s at step %lld of %lld", o->label, o->state_dir, (long long)step0,
                     (long long)total);
            if (o->metrics_path && ckpt_truncate_metrics(o->metrics_path, step0) != MOERL_OK) goto out;
        }
    }
    if (!resumed && o->metrics_path) unlink(o->metrics_path); /* a new run starts a new record */
    if (o->metrics_path && !(mw = metrics_open(o->metrics_path))) goto out;
    if (!resumed) {
        if (eval_accuracy(m, test, o->val_n, o->max_response_length, 64, &acc0, &mlen) != MOERL_OK) goto out;
        log_info("%s: held-out accuracy before: %.1f%%", o->label, 100 * acc0);
    }
    if (step0 >= total || finished) {
        log_info("%s: nothing left to do: the run in %s finished at step %lld; raise the step count to continue",
                 o->label, o->state_dir, (long long)step0);
        if (acc_before) *acc_before = acc0;
        if (acc_after) *acc_after = NAN;
        rc = MOERL_OK;
        goto out;
    }
    rng_state rng;
    rng_seed(&rng, o->seed);
    train_step_opts to = {.max_tokens = o->max_tokens, .temperature = 1.0f, .want_entropy = 0,
                          .aux_coef = m->cfg.router_aux_loss_coef};
    progress pb;
    progress_begin(&pb, o->label, total);
    double t_start = moerl_now();
    int64_t step = step0, tokens_seen = 0;
    const int64_t per_epoch = n_rows / bs;
    int stopped = 0;
    for (int64_t ep = 0; step < total && !stopped; ep++) {
        for (int64_t i = 0; i < n_rows; i++) order[i] = (int)i;
        rng_shuffle_int(&rng, order, (int)n_rows); /* replayed for the epochs before a resume point */
        if ((ep + 1) * per_epoch <= step0) continue;
        const int64_t b0 = ep * per_epoch < step0 ? (step0 - ep * per_epoch) * bs : 0;
        for (int64_t b = b0; b + bs <= n_rows && step < total; b += bs, step++) {
            if (moerl_stop_requested()) {
                stopped = moerl_stop_requested();
                break;
            }
            if (o->state_dir && o->save_freq > 0 && step > step0 && step % o->save_freq == 0 &&
                sft_save_state(m, &os, train, o, step, acc0, 0) != MOERL_OK)
                goto out;
            double t0 = moerl_now();
            int64_t resp_tokens = 0;
            for (int j = 0; j < bs; j++) {
                int i = order[b + j];
                batch[j] = (train_seq){.tokens = seqs[i].ids, .len = (int)seqs[i].n, .resp_start = resp_start[i]};
                resp_tokens += seqs[i].n - resp_start[i];
            }
            sft_ctx sc = {.inv_tokens = 1.0 / (double)resp_tokens};
            train_step_out so;
            if (train_accumulate(m, &acts, batch, bs, &to, sft_grad, &sc, &so) != MOERL_OK) goto out;
            float lr = lr_schedule(o->lr_scheduler, step, total, o->optim.lr, o->warmup_ratio, o->min_lr_ratio);
            double gn;
            int applied = adamw_step(&os, m, lr, (float)so.loss, &gn);
            double dt = moerl_now() - t0;
            tokens_seen += so.n_tokens;
            if (mw) {
                const char *keys[] = {"train/loss", "train/ce_loss", "moe/aux_loss", "actor/grad_norm", "train/lr",
                                      "perf/throughput", "timing_s/step", "train/skipped_steps", "train/epoch"};
                double vals[] = {so.loss, sc.ce_sum, so.aux_loss, gn, lr, so.n_tokens / dt, dt, (double)os.skipped,
                                 (double)ep};
                metrics_write(mw, step + 1, 9, keys, vals);
            }
            if (o->test_freq > 0 && (step + 1) % o->test_freq == 0 && step + 1 < total) {
                const dataset *vs = o->validation ? o->validation : test;
                if (eval_accuracy(m, vs, o->val_n, o->max_response_length, 64, &acc, &mlen) != MOERL_OK) goto out;
                log_info("%s step %lld: %s accuracy %.1f%%", o->label, (long long)step + 1,
                         o->validation ? "validation" : "held-out", 100 * acc);
                if (mw) {
                    const char *k2[] = {o->validation ? "val/validation_accuracy" : "val/accuracy"};
                    double v2[] = {acc};
                    metrics_write(mw, step + 1, 1, k2, v2);
                }
                if (o->stop_accuracy > 0 && acc >= o->stop_accuracy) {
                    log_info("%s: accuracy %.1f%% reached the stop level %.1f%% at step %lld", o->label, 100 * acc,
                             100 * o->stop_accuracy, (long long)step + 1);
                    total = step + 1; /* ends both loops after this step */
                }
            }
            char extra[160];
            snprintf(extra, sizeof extra, "loss %.4f ce %.4f aux %.3f gnorm %.3f lr %.2e %.0f tok/s%s", so.loss,
                     sc.ce_sum, so.aux_loss, gn, lr, so.n_tokens / dt, applied ? "" : " (skipped: non-finite)");
            progress_update(&pb, step + 1, extra);
        }
    }
    progress_end(&pb, NULL);
    double train_s = moerl_now() - t_start;
    const int at_accuracy = !stopped && step < (o->total_steps > 0 ? o->total_steps : o->total_epochs * per_epoch);
    if (o->state_dir && sft_save_state(m, &os, train, o, step, acc0, at_accuracy) != MOERL_OK) goto out;
    if (stopped) {
        log_info("%s: stopped by signal %d at step %lld: checkpoint in %s", o->label, stopped, (long long)step,
                 o->state_dir ? o->state_dir : "(none: no state folder)");
        if (o->stop_signal_out) *o->stop_signal_out = stopped;
        if (acc_before) *acc_before = acc0;
        if (acc_after) *acc_after = NAN;
        rc = MOERL_OK;
        goto out;
    }
    if (eval_accuracy(m, test, o->val_n, o->max_response_length, 64, &acc, &mlen) != MOERL_OK) goto out;
    log_info("%s done: %lld steps, %lld tokens in %.1f s (%.0f tokens/s); held-out accuracy %.1f%% -> %.1f%%",
             o->label, (long long)step, (long long)tokens_seen, train_s, tokens_seen / train_s, 100 * acc0, 100 * acc);
    if (mw) {
        const char *k3[] = {"val/accuracy", "val/accuracy_before"};
        double v3[] = {acc, acc0};
        metrics_write(mw, step, 2, k3, v3);
    }
    if (acc_before) *acc_before = acc0;
    if (acc_after) *acc_after = acc;
    rc = MOERL_OK;
out:
    if (mw) metrics_close(mw);
    for (int64_t i = 0; i < n_rows; i++) tok_seq_free(&seqs[i]);
    free(seqs);
    free(resp_start);
    free(order);
    free(batch);
    if (acts.arena) model_acts_free(&acts);
    if (os.m) adamw_free(&os);
    return rc;
}
