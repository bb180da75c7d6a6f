#include "data/data_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/outdir.h"
#include "data/prompts.h"
#include "data/tasks.h"
#include "data/tokenizer.h"

void data_def_keys(cfg *c) {
    cfg_def_str(c, "data.task", "arith", "built-in task to generate (arith, gsm8k-style, countdown, tool_arith); empty = use files");
    cfg_def_str(c, "data.train_files", "", "train JSONL (verl schema) when data.task is empty");
    cfg_def_str(c, "data.val_files", "", "held-out JSONL when data.task is empty");
    cfg_def_int(c, "data.n_train", 2000, "rows generated for training");
    cfg_def_int(c, "data.n_test", 200, "rows generated for held-out evaluation");
    cfg_def_int(c, "data.seed", 1, "task generator seed");
    cfg_def_int(c, "data.arith_digits", 2, "arith, tool_arith: digits per operand");
    cfg_def_int(c, "data.countdown_numbers", 4, "countdown: numbers per problem");
    cfg_def_int(c, "data.max_prompt_length", 0,
                "prompt tokens at most (chat template applied): a longer prompt is an error naming its row, or "
                "dropped with data.filter_overlong_prompts; 0 = no limit (moerl plan then plans for 512, or the "
                "model's context less data.max_response_length if smaller)");
    cfg_def_bool(c, "data.filter_overlong_prompts", false,
                 "drop the prompts longer than data.max_prompt_length (train and held-out rows; the count is logged) "
                 "instead of refusing them");
    cfg_def_int(c, "data.max_response_length", 16, "new tokens at most per response (eval and rollout)");
    cfg_def_str(c, "data.chat_template", "auto",
                "auto (the checkpoint's own template, rendered by moerl's Jinja interpreter; chatml for moerl's byte "
                "tokenizer) | qwen3 | chatml | the path of a .jinja file (any model's template, as vLLM's "
                "--chat-template)");
    cfg_def_bool(c, "data.enable_thinking", true,
                 "the chat template's enable_thinking (Qwen3: false puts an empty think block in the prompt; true "
                 "leaves the variable to the template's default)");
}

int data_use_tokenizer(const char *model_dir, int vocab_size, const char *chat_template, bool enable_thinking,
                      const char *key) {
    static tokenizer *cur; /* the process's tokenizer (tokenizer.h: the current one) */
    tokenizer *t = model_dir ? tokenizer_load(model_dir, vocab_size) : tokenizer_new_bytes();
    if (!t) return MOERL_ERR;
    if (chat_template && tokenizer_set_chat_template(t, chat_template, enable_thinking, key) != MOERL_OK) {
        tokenizer_free(t);
        return MOERL_ERR;
    }
    tok_set_current(t);
    tokenizer_free(cur);
    cur = t;
    if (model_dir)
        log_info("tokenizer: %s (%s, %d ids), chat template %s", model_dir, tokenizer_kind(t), tokenizer_vocab_size(t),
                 tokenizer_chat_template_name(t));
    return MOERL_OK;
}

/* Where a key's value came from, for an error: "command line", "FILE:LINE" or "default". */
static const char *origin_name(const cfg *c, const char *key) {
    const char *o = cfg_origin(c, key);
    return strcmp(o, "override") ? o : "command line";
}

/* The task that generates the data, "" for files: data.task, except that files given while data.task
 * keeps its default (nobody asked for the built-in task) mean the files. */
static const char *data_task(const cfg *c) {
    const char *tf = cfg_str(c, "data.train_files"), *vf = cfg_str(c, "data.val_files");
    if ((tf[0] || vf[0]) && !strcmp(cfg_origin(c, "data.task"), "default")) return "";
    return cfg_str(c, "data.task");
}

int data_check_keys(const cfg *c, const char *why_test) {
    /* the filter needs a limit: with none (0) it would drop nothing, silently */
    if (cfg_bool(c, "data.filter_overlong_prompts") && cfg_int(c, "data.max_prompt_length") == 0)
        return moerl_errorf("data.filter_overlong_prompts=true drops the prompts longer than data.max_prompt_length, "
                            "but data.max_prompt_length=0 (no limit) keeps every prompt: set data.max_prompt_length "
                            "to the longest prompt to keep (in tokens, chat template applied), or "
                            "data.filter_overlong_prompts=false");
    const char *task = data_task(c);
    if (!task[0]) return MOERL_OK; /* files: data_prepare names a missing one */
    const char *tf = cfg_str(c, "data.train_files"), *vf = cfg_str(c, "data.val_files");
    if (tf[0] || vf[0])
        return moerl_errorf("data.task='%s' (%s) generates the data, so data.%s='%s' (%s) would be unused: to read "
                            "files set data.task= (empty) with data.train_files and data.val_files, or drop data.%s "
                            "to use the task",
                            task, origin_name(c, "data.task"), tf[0] ? "train_files" : "val_files", tf[0] ? tf : vf,
                            origin_name(c, tf[0] ? "data.train_files" : "data.val_files"),
                            tf[0] ? "train_files" : "val_files");
    if (why_test && cfg_int(c, "data.n_test") <= 0)
        return moerl_errorf("data.n_test=%lld generates no held-out rows, but %s: set data.n_test ≥ 1%s",
                            (long long)cfg_int(c, "data.n_test"), why_test,
                            strstr(why_test, "trainer.val_n") ? ", or trainer.val_n=0 (no held-out evaluation)" : "");
    return MOERL_OK;
}

int data_check_held_out_rows(const cfg *c, const dataset *test, const char *why_test) {
    if (!why_test || dataset_count(test) > 0) return MOERL_OK;
    if (data_task(c)[0]) return data_check_keys(c, why_test);
    if (!test->path)
        return moerl_errorf("data.val_files is empty, but %s: give a JSONL file of held-out rows%s", why_test,
                            strstr(why_test, "trainer.val_n") ? ", or set trainer.val_n=0 (no held-out evaluation)" : "");
    return moerl_errorf("data.val_files '%s' has no rows, but %s: give a file with held-out rows%s", test->path,
                        why_test,
                        strstr(why_test, "trainer.val_n") ? ", or set trainer.val_n=0 (no held-out evaluation)" : "");
}

/* data.max_prompt_length on one split: a prompt (chat template applied, generation prompt
 * included, as the rollout encodes it) longer than the limit is an error naming file:line and the
 * length (dataset_where), or dropped with data.filter_overlong_prompts (verl's data.filter_overlong_prompts). */
static int check_prompt_lengths(const cfg *c, dataset *ds, const char *split) {
    const int64_t max = cfg_int(c, "data.max_prompt_length");
    if (max < 0) return moerl_errorf("data.max_prompt_length must be ≥ 0 (0 = no limit), got %lld", (long long)max);
    if (max == 0 || dataset_count(ds) == 0) return MOERL_OK;
    const int filter = cfg_bool(c, "data.filter_overlong_prompts");
    uint8_t *keep = xmalloc((size_t)dataset_count(ds));
    tok_seq s = {0};
    int rc = MOERL_OK;
    for (int64_t i = 0; i < dataset_count(ds); i++) {
        const ds_row *r = dataset_row(ds, i);
        tok_seq_clear(&s);
        ds_row_encode_prompt(r, &s);
        keep[i] = s.n <= max;
        if (!keep[i] && !filter) {
            char w[4300];
            rc = moerl_errorf("%s: the prompt has %lld tokens (chat template applied), more than "
                              "data.max_prompt_length=%lld: raise data.max_prompt_length, or set "
                              "data.filter_overlong_prompts=true to drop such rows",
                              dataset_where(ds, r->line, w, sizeof w), (long long)s.n, (long long)max);
            break;
        }
    }
    tok_seq_free(&s);
    if (rc == MOERL_OK) {
        const int64_t n0 = dataset_count(ds), dropped = dataset_keep_rows(ds, keep);
        if (dropped > 0)
            log_info("data.filter_overlong_prompts: dropped %lld of %lld %s rows whose prompt is longer than "
                     "data.max_prompt_length=%lld tokens", (long long)dropped, (long long)n0, split, (long long)max);
        char w[4300];
        if (dataset_count(ds) == 0 && n0 > 0)
            rc = moerl_errorf("data.filter_overlong_prompts dropped every one of the %lld %s rows of %s (each prompt "
                              "is longer than data.max_prompt_length=%lld tokens): raise data.max_prompt_length",
                              (long long)n0, split, dataset_where(ds, 0, w, sizeof w), (long long)max);
    }
    free(keep);
    return rc;
}

/* The generated files' names (data_prepare): what determines the rows, and nothing else. */
static void data_file_names(const char *out_dir, const char *task, const task_opts *o, char *tr, char *te,
                            size_t cap) {
    char opt[96] = "";
    if (!strcmp(task, "arith") || !strcmp(task, "tool_arith")) snprintf(opt, sizeof opt, "-d%d", o->arith_digits);
    else if (!strcmp(task, "countdown"))
        snprintf(opt, sizeof opt, "-k%d-m%d-t%d", o->countdown_numbers, o->countdown_max_number,
                 o->countdown_max_target);
    snprintf(te, cap, "%s/data/%s%s-s%llu-test%lld.jsonl", out_dir, task, opt, (unsigned long long)o->seed,
             (long long)o->n_test);
    snprintf(tr, cap, "%s/data/%s%s-s%llu-test%lld-train%lld.jsonl", out_dir, task, opt, (unsigned long long)o->seed,
             (long long)o->n_test, (long long)o->n_train);
}

int data_prepare(const cfg *c, const char *out_dir, dataset *train, dataset *test) {
    return data_prepare_staged(c, out_dir, train, test, NULL);
}

/* Whether rows are scored by the built-in rewards (data/rewards.h), whose data_source must then be
 * known: none of the reward.* sources is set (reward/reward.h declares those keys; data/ sits below
 * reward/, so it reads them by name, and only where a command declares them). */
static int builtin_rewards(const cfg *c) {
    static const char *sources[] = {"reward.custom_reward_function.path", "reward.command", "reward.url"};
    for (int i = 0; i < 3; i++)
        if (cfg_has(c, sources[i]) && cfg_str(c, sources[i])[0]) return 0;
    return 1;
}

static int prepare_staged(const cfg *c, const char *out_dir, dataset *train, dataset *test, data_staged *staged,
                          int need_rewards);

/* verl's data.train_files may be a list; here it is one file: "[a.jsonl,b.jsonl]" (a list written on the
 * command line) that names no file is refused as a list, as the YAML loader refuses a YAML list. */
static int check_not_a_list(const char *key, const char *v) {
    const size_t n = strlen(v);
    if (n < 2 || v[0] != '[' || v[n - 1] != ']' || access(v, F_OK) == 0) return MOERL_OK;
    return moerl_errorf("%s: got a list '%s', expected one JSONL file (moerl reads one file per split: join "
                        "them first, e.g. cat a.jsonl b.jsonl > train.jsonl)", key, v);
}

int data_prepare_staged(const cfg *c, const char *out_dir, dataset *train, dataset *test, data_staged *staged) {
    return prepare_staged(c, out_dir, train, test, staged, 1);
}

int data_prepare_staged_any_source(const cfg *c, const char *out_dir, dataset *train, dataset *test,
                                   data_staged *staged) {
    return prepare_staged(c, out_dir, train, test, staged, 0);
}

const char *data_source_without_reward(const dataset *ds) {
    for (int64_t i = 0; i < dataset_count(ds); i++) {
        const ds_row *r = dataset_row(ds, i);
        if (!reward_fn_for(r->data_source)) return r->data_source;
    }
    return NULL;
}

static int prepare_staged(const cfg *c, const char *out_dir, dataset *train, dataset *test, data_staged *staged,
                          int need_rewards) {
    const char *task = data_task(c);
    char tr[4096], te[4096];
    if (staged) memset(staged, 0, sizeof *staged);
    if (data_check_keys(c, NULL) != MOERL_OK) return MOERL_ERR;
    if (task[0]) {
        task_opts o;
        task_opts_default(&o);
        o.n_train = cfg_int(c, "data.n_train");
        o.n_test = cfg_int(c, "data.n_test");
        o.seed = (uint64_t)cfg_int(c, "data.seed");
        o.arith_digits = (int)cfg_int(c, "data.arith_digits");
        o.countdown_numbers = (int)cfg_int(c, "data.countdown_numbers");
        data_file_names(out_dir, task, &o, tr, te, sizeof tr);
        if (staged) { /* temporary names until the run's checks pass (rank and pid: several processes) */
            int rank;
            moerl_launcher_world(&rank);
            snprintf(staged->data_dir, sizeof staged->data_dir, "%s/data", out_dir);
            const char *final[2] = {tr, te};
            for (int i = 0; i < 2; i++) {
                snprintf(staged->dst[i], sizeof staged->dst[i], "%s", final[i]);
                snprintf(staged->tmp[i], sizeof staged->tmp[i], "%s.staged-r%d-%ld", final[i], rank, (long)getpid());
            }
            staged->n = 2;
            snprintf(tr, sizeof tr, "%s", staged->tmp[0]);
            snprintf(te, sizeof te, "%s", staged->tmp[1]);
        }
        if (task_generate(task, &o, tr, te) != MOERL_OK) return moerl_error_prefix("data.task: ");
    } else {
        snprintf(tr, sizeof tr, "%s", cfg_str(c, "data.train_files"));
        snprintf(te, sizeof te, "%s", cfg_str(c, "data.val_files"));
        if (!tr[0])
            return moerl_errorf("data from files needs data.train_files (JSONL; it is empty)%s",
                                cfg_str(c, "data.task")[0] ? "" : " — or set data.task to generate the data");
        if (check_not_a_list("data.train_files", tr) != MOERL_OK || check_not_a_list("data.val_files", te) != MOERL_OK)
            return MOERL_ERR;
    }
    if (dataset_load(train, tr) != MOERL_OK) return MOERL_ERR;
    memset(test, 0, sizeof *test);
    /* no data.val_files: no held-out rows (data_check_held_out_rows refuses it where they are evaluated) */
    if (te[0] && dataset_load(test, te) != MOERL_OK) {
        dataset_free(train);
        return MOERL_ERR;
    }
    const int gen = task[0] != 0;
    if (gen) { /* messages name generated data by the key that made it, not by a file a refusal may remove */
        char label[300];
        dataset *both[2] = {train, test};
        for (int d = 0; d < 2; d++) {
            snprintf(label, sizeof label, "the %s data generated by data.task=%s", d ? "held-out" : "training", task);
            free(both[d]->path);
            both[d]->path = xstrdup(label);
            both[d]->generated = 1;
        }
    }
    if (dataset_count(train) == 0)
        return gen ? moerl_errorf("%s has no rows (data.n_train=%lld): set data.n_train ≥ 1", train->path,
                                  (long long)cfg_int(c, "data.n_train"))
                   : moerl_errorf("training data '%s' has no rows", tr);
    if (need_rewards && builtin_rewards(c) && (data_check_sources(train) != MOERL_OK || data_check_sources(test) != MOERL_OK))
        return MOERL_ERR;
    /* every prompt, with its row's tools, renders with the chat template (errors name the row) */
    if (dataset_check_prompts(train) != MOERL_OK || dataset_check_prompts(test) != MOERL_OK) return MOERL_ERR;
    if (check_prompt_lengths(c, train, "training") != MOERL_OK ||
        check_prompt_lengths(c, test, "held-out") != MOERL_OK)
        return MOERL_ERR;
    return MOERL_OK;
}

/* 1 when the files at a and b hold the same bytes. */
static int same_bytes(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    char ba[65536], bb[65536];
    while (same) {
        size_t na = fread(ba, 1, sizeof ba, fa), nb = fread(bb, 1, sizeof bb, fb);
        same = na == nb && !memcmp(ba, bb, na);
        if (na == 0 || na < sizeof ba) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

int data_staged_commit(data_staged *s) {
    for (int i = 0; i < s->n; i++) {
        if (access(s->dst[i], F_OK) == 0 && same_bytes(s->tmp[i], s->dst[i])) { /* the run's own file: keep it */
            unlink(s->tmp[i]);
            continue;
        }
        if (rename(s->tmp[i], s->dst[i]) != 0)
            return moerl_errorf("cannot rename '%s' to '%s': %s", s->tmp[i], s->dst[i], strerror(errno));
    }
    s->n = 0;
    return MOERL_OK;
}

void data_staged_discard(data_staged *s) {
    for (int i = 0; i < s->n; i++) unlink(s->tmp[i]);
    if (s->n && s->data_dir[0]) rmdir(s->data_dir); /* only when empty: a run's data stays */
    s->n = 0;
}

/* The "key: value" lines of the data: section of a cfg_dump_yaml text, comments dropped: *n pairs
 * (heap strings; free with free_pairs). */
static char **data_section_pairs(const char *text, int *n) {
    char **kv = NULL;
    int cnt = 0, in = 0;
    for (const char *l = text; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        if (!strncmp(l, "data:", 5) && len == 5) in = 1;
        else if (len && l[0] != ' ') in = 0;
        else if (in && len > 2 && l[2] != ' ') {
            char *line = xmalloc(len + 1);
            memcpy(line, l + 2, len - 2);
            line[len - 2] = 0;
            char *colon = strstr(line, ": "), *cmt = strstr(line, "  # ");
            if (cmt) *cmt = 0;
            if (colon) {
                *colon = 0;
                kv = realloc(kv, (size_t)(cnt + 2) * 2 * sizeof *kv);
                kv[2 * cnt] = xstrdup(line);
                kv[2 * cnt + 1] = xstrdup(colon + 2);
                cnt++;
            }
            free(line);
        }
        l = e ? e + 1 : NULL;
    }
    *n = cnt;
    return kv;
}

static void free_pairs(char **kv, int n) {
    for (int i = 0; i < 2 * n; i++) free(kv[i]);
    free(kv);
}

int data_name_changed_keys(const cfg *c, const char *out_dir) {
    char p[4200], *old = NULL, *why = xstrdup(moerl_last_error());
    size_t len;
    snprintf(p, sizeof p, "%s/config.yaml", out_dir);
    if (access(p, R_OK) != 0 || moerl_read_file(p, &old, &len) != MOERL_OK) {
        moerl_errorf("%s", why);
        free(why);
        return MOERL_ERR;
    }
    char *now = cfg_dump_yaml_string(c);
    int n_old, n_now;
    char **ko = data_section_pairs(old, &n_old), **kn = data_section_pairs(now, &n_now);
    char changed[1200] = "";
    for (int i = 0; i < n_now; i++)
        for (int j = 0; j < n_old; j++)
            if (!strcmp(kn[2 * i], ko[2 * j]) && strcmp(kn[2 * i + 1], ko[2 * j + 1])) {
                size_t at = strlen(changed);
                snprintf(changed + at, sizeof changed - at, "%sdata.%s was %s, now %s", at ? "; " : "", kn[2 * i],
                         ko[2 * j + 1], kn[2 * i + 1]);
            }
    if (changed[0])
        moerl_errorf("%s (the run's config.yaml differs in: %s)", why, changed);
    else
        moerl_errorf("%s", why);
    free_pairs(ko, n_old);
    free_pairs(kn, n_now);
    free(old);
    free(now);
    free(why);
    return MOERL_ERR;
}

int data_check_sources(const dataset *ds) {
    for (int64_t i = 0; i < dataset_count(ds); i++) {
        const ds_row *r = dataset_row(ds, i);
        char w[4300];
        if (!reward_fn_for(r->data_source)) return moerl_error_prefix("%s: ", dataset_where(ds, r->line, w, sizeof w));
    }
    return MOERL_OK;
}

int data_use_model_tokenizer(const cfg *c, int vocab_size) {
    const char *path = cfg_str(c, "model.path");
    return data_use_tokenizer(path[0] ? path : NULL, vocab_size, cfg_str(c, "data.chat_template"),
                              cfg_bool(c, "data.enable_thinking"), "data.chat_template");
}
