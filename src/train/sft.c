/* SFT loop (see sft.h). */
#include "train/sft.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "base/rng.h"
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

int sft_train(moe_model *m, const dataset *train, const dataset *test, const sft_opts *o, double *acc_before,
              double *acc_after) {
    const int64_t n_rows = dataset_count(train);
    const int bs = o->batch_size;
    if (bs <= 0 || bs > n_rows)
        return moerl_errorf("SFT batch size %d must be in 1..%lld (training rows)", bs, (long long)n_rows);
    if (!(o->optim.lr >= 0) || !isfinite(o->optim.lr) || !(o->optim.weight_decay >= 0) || !isfinite(o->optim.weight_decay))
        return moerl_errorf("SFT learning rate and weight decay must be finite numbers ≥ 0 (got %g, %g)",
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
    if (o->metrics_path && !(mw = metrics_open(o->metrics_path))) goto out;
    double acc0 = 0, acc = 0, mlen;
    if (eval_accuracy(m, test, o->val_n, o->max_response_length, 64, &acc0, &mlen) != MOERL_OK) goto out;
    log_info("%s: held-out accuracy before: %.1f%%", o->label, 100 * acc0);
    rng_state rng;
    rng_seed(&rng, o->seed);
    train_step_opts to = {.max_tokens = o->max_tokens, .temperature = 1.0f, .want_entropy = 0,
                          .aux_coef = m->cfg.router_aux_loss_coef};
    progress pb;
    progress_begin(&pb, o->label, total);
    double t_start = moerl_now();
    int64_t step = 0, tokens_seen = 0;
    for (int64_t ep = 0; step < total; ep++) {
        for (int64_t i = 0; i < n_rows; i++) order[i] = (int)i;
        rng_shuffle_int(&rng, order, (int)n_rows);
        for (int64_t b = 0; b + bs <= n_rows && step < total; b += bs, step++) {
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
