/* trainer_state.json reading (validated) and writing; see state.h for the fields and rules. */
#include "rl/state.h"

#include <inttypes.h>
#include <math.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <string.h>

#include "base/common.h"

/* The folder holding the state file, for the hint ("." when the path has no '/'). */
static void folder_of(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == path) snprintf(out, cap, "/");
    else snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

/* "<path>: <what>; the file is damaged: ..." — every damaged-file error ends with what to do. */
static int damaged(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int damaged(const char *path, const char *fmt, ...) {
    char what[768], dir[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    folder_of(path, dir, sizeof dir);
    return moerl_errorf("%s: %s; the file is damaged: move the checkpoint folder '%s' away (to start this run over) "
                        "or set trainer.resume_mode=disable", path, what, dir);
}

static const char *kind(const json_t *v) {
    if (!v) return "nothing (the field is missing)";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a bool";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Integer field `key` of o within [lo, hi]. */
static int get_int(const char *path, const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        return damaged(path, "field '%s' must be an integer in [%" PRId64 ", %" PRId64 "], found %s", key, lo, hi,
                       kind(v));
    const int64_t x = (int64_t)json_integer_value(v);
    if (x < lo || x > hi)
        return damaged(path, "field '%s' is %" PRId64 ", expected an integer in [%" PRId64 ", %" PRId64 "]", key, x,
                       lo, hi);
    *out = x;
    return MOERL_OK;
}

/* The checks on values that both the reader and the writer apply (the reader has checked types and
 * the ranges of single fields already; the writer has not). */
static int check_values(const rl_state *s, const char *path, int (*err)(const char *, const char *, ...)) {
    if (s->version < 0) return err(path, "field 'version' is %d, expected ≥ 0", s->version);
    if (s->trainer_step < 0) return err(path, "field 'trainer_step' is %" PRId64 ", expected ≥ 0", s->trainer_step);
    if (s->optimizer_step < 0)
        return err(path, "field 'optimizer_step' is %" PRId64 ", expected ≥ 0", s->optimizer_step);
    if (s->optimizer_skipped < 0)
        return err(path, "field 'optimizer_skipped' is %" PRId64 ", expected ≥ 0", s->optimizer_skipped);
    if (s->consumed_prompts < 0)
        return err(path, "field 'consumed_prompts' is %" PRId64 ", expected ≥ 0", s->consumed_prompts);
    if (s->feed_epoch < 0 || s->feed_epoch == INT_MAX)
        return err(path, "field 'feed_epoch' is %d, expected an integer in [0, %d]", s->feed_epoch, INT_MAX - 1);
    if (s->n_rows < 1) return err(path, "field 'n_rows' is %" PRId64 ", expected ≥ 1", s->n_rows);
    if (s->feed_pos < 0 || s->feed_pos > s->n_rows)
        return err(path, "field 'feed_pos' is %" PRId64 ", expected 0..n_rows = %" PRId64, s->feed_pos, s->n_rows);
    if (s->samples_log_bytes < 0)
        return err(path, "field 'samples_log_bytes' is %" PRId64 ", expected ≥ 0", s->samples_log_bytes);
    if (!isnan(s->kl_ctrl_value) && !(s->kl_ctrl_value >= 0 && isfinite(s->kl_ctrl_value)))
        return err(path, "field 'kl_ctrl_value' is %g, expected a finite number ≥ 0 or none", s->kl_ctrl_value);
    if (s->dropped_prompts < 0 || s->dropped_prompts > s->consumed_prompts)
        return err(path, "field 'dropped_prompts' is %" PRId64 ", expected 0..consumed_prompts = %" PRId64,
                   s->dropped_prompts, s->consumed_prompts);
    if (!isnan(s->last_val_accuracy) && !(s->last_val_accuracy >= 0 && s->last_val_accuracy <= 1))
        return err(path, "field 'last_val_accuracy' is %g, expected an accuracy in [0, 1] or null", s->last_val_accuracy);
    if (s->n_unconsumed < 0 || (s->n_unconsumed > 0 && !s->unconsumed_started))
        return err(path, "field 'unconsumed_started' has %d entries and no values", s->n_unconsumed);
    for (int i = 0; i < s->n_unconsumed; i++) {
        const int64_t u = s->unconsumed_started[i];
        /* a started prompt belongs to the feed's epoch or the next one (started past the epoch's end) */
        if (u < 0 || u / s->n_rows > (int64_t)s->feed_epoch + 1)
            return err(path,
                       "field 'unconsumed_started' entry %d is %" PRId64 ", expected a prompt uid ≥ 0 (epoch·n_rows + "
                       "row) of epoch ≤ feed_epoch + 1 = %" PRId64 " (n_rows %" PRId64 ")",
                       i, u, (int64_t)s->feed_epoch + 1, s->n_rows);
    }
    return MOERL_OK;
}

void rl_state_free(rl_state *s) {
    if (!s) return;
    free(s->unconsumed_started);
    memset(s, 0, sizeof *s);
}

/* The optional fields: dropped_prompts (default 0), last_val_accuracy and kl_ctrl_value (default NaN). */
static int get_optional(const char *path, const json_t *o, rl_state *out) {
    out->last_val_accuracy = NAN;
    out->kl_ctrl_value = NAN;
    if (json_object_get(o, "dropped_prompts") &&
        get_int(path, o, "dropped_prompts", 0, out->consumed_prompts, &out->dropped_prompts))
        return MOERL_ERR;
    json_t *lv = json_object_get(o, "last_val_accuracy");
    if (lv && !json_is_null(lv)) {
        if (!json_is_number(lv) || !(json_number_value(lv) >= 0 && json_number_value(lv) <= 1))
            return damaged(path, "field 'last_val_accuracy' must be an accuracy in [0, 1] or null, found %s", kind(lv));
        out->last_val_accuracy = json_number_value(lv);
    }
    json_t *kv = json_object_get(o, "kl_ctrl_value");
    if (kv && !json_is_null(kv)) {
        if (!json_is_number(kv) || !(json_number_value(kv) >= 0) || !isfinite(json_number_value(kv)))
            return damaged(path, "field 'kl_ctrl_value' must be a finite number ≥ 0 (the KL-in-reward coefficient) or "
                           "null, found %s", json_is_number(kv) ? "a negative or non-finite number" : kind(kv));
        out->kl_ctrl_value = json_number_value(kv);
    }
    json_t *on = json_object_get(o, "optimizer");
    if (on) {
        if (!json_is_string(on) || !json_string_length(on) || json_string_length(on) >= sizeof out->optimizer)
            return damaged(path, "field 'optimizer' must be an optimizer name (actor.optim.name), found %s", kind(on));
        snprintf(out->optimizer, sizeof out->optimizer, "%s", json_string_value(on));
    }
    if (json_object_get(o, "optimizer_freeze_step") &&
        get_int(path, o, "optimizer_freeze_step", 1, INT64_MAX, &out->optimizer_freeze_step))
        return MOERL_ERR;
    if (json_object_get(o, "optimizer_var_update_interval") &&
        get_int(path, o, "optimizer_var_update_interval", 1, INT64_MAX, &out->optimizer_var_update_interval))
        return MOERL_ERR;
    return MOERL_OK;
}

/* expect's optimizer against the file's (when both are known). */
static int check_optimizer(const rl_state *s, const char *path, const rl_state_expect *e) {
    if (!e || !e->optimizer || !s->optimizer[0]) return MOERL_OK;
    if (!strcmp(s->optimizer, e->optimizer) && s->optimizer_freeze_step == e->optimizer_freeze_step &&
        s->optimizer_var_update_interval == e->optimizer_var_update_interval)
        return MOERL_OK;
    /* AdamW's moments are what 1-bit Adam's warm-up builds: an adamw checkpoint may continue as onebit_adam
     * (its error feedback then starts at zero, with a warning at load) */
    if (!strcmp(s->optimizer, "adamw") && !strcmp(e->optimizer, "onebit_adam")) return MOERL_OK;
    char was[128] = "", now[128] = "";
    if (s->optimizer_freeze_step)
        snprintf(was, sizeof was, " actor.optim.freeze_step=%" PRId64 " actor.optim.var_update_interval=%" PRId64,
                 s->optimizer_freeze_step, s->optimizer_var_update_interval);
    if (e->optimizer_freeze_step)
        snprintf(now, sizeof now, " actor.optim.freeze_step=%" PRId64 " actor.optim.var_update_interval=%" PRId64,
                 e->optimizer_freeze_step, e->optimizer_var_update_interval);
    return moerl_errorf("%s: the checkpoint was written with actor.optim.name=%s%s, this run has actor.optim.name=%s%s: "
                        "resume with the checkpoint's optimizer settings (its moments, frozen variance and error "
                        "feedback belong to them), or use a new trainer.default_local_dir or trainer.resume_mode=disable",
                        path, s->optimizer, was, e->optimizer, now);
}

int rl_state_parse(rl_state *out, const char *text, size_t len, const char *path, const rl_state_expect *expect) {
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o) return damaged(path, "not valid JSON (line %d, column %d: %s)", jerr.line, jerr.column, jerr.text);
    int rc = MOERL_ERR;
    int64_t x;
    if (!json_is_object(o)) {
        damaged(path, "expected a JSON object, found %s", kind(o));
        goto done;
    }
    json_t *fmt = json_object_get(o, "format");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), RL_STATE_FORMAT) != 0) {
        char got[96];
        if (json_is_string(fmt)) snprintf(got, sizeof got, "'%.64s'", json_string_value(fmt));
        else snprintf(got, sizeof got, "%s", kind(fmt));
        damaged(path, "field 'format' is %s, expected '%s' (not a moerl RL state file)", got, RL_STATE_FORMAT);
        goto done;
    }
    json_t *fv = json_object_get(o, "format_version");
    if (!json_is_integer(fv)) {
        damaged(path, "field 'format_version' must be the integer %d, found %s", RL_STATE_FORMAT_VERSION, kind(fv));
        goto done;
    }
    if (json_integer_value(fv) != RL_STATE_FORMAT_VERSION) {
        moerl_errorf("%s: format_version %" PRId64 ", this moerl reads format_version %d (written by another moerl "
                     "version?): resume with the moerl that wrote it, or set trainer.resume_mode=disable",
                     path, (int64_t)json_integer_value(fv), RL_STATE_FORMAT_VERSION);
        goto done;
    }
    if (get_int(path, o, "version", 0, INT_MAX, &x)) goto done;
    out->version = (int)x;
    if (get_int(path, o, "trainer_step", 0, INT64_MAX, &out->trainer_step) ||
        get_int(path, o, "optimizer_step", 0, INT64_MAX, &out->optimizer_step) ||
        get_int(path, o, "optimizer_skipped", 0, INT64_MAX, &out->optimizer_skipped) ||
        get_int(path, o, "consumed_prompts", 0, INT64_MAX, &out->consumed_prompts))
        goto done;
    if (get_int(path, o, "feed_epoch", 0, INT_MAX - 1, &x)) goto done;
    out->feed_epoch = (int)x;
    if (get_int(path, o, "n_rows", 1, INT64_MAX, &out->n_rows) ||
        get_int(path, o, "feed_pos", 0, out->n_rows, &out->feed_pos) ||
        get_int(path, o, "seed", INT64_MIN, INT64_MAX, &x))
        goto done;
    out->seed = (uint64_t)x;
    if (get_int(path, o, "samples_log_bytes", 0, INT64_MAX, &out->samples_log_bytes)) goto done;
    if (get_optional(path, o, out) != MOERL_OK) goto done;
    json_t *fp = json_object_get(o, "data_fingerprint");
    const char *fps = json_string_value(fp);
    size_t fpn = fps ? strlen(fps) : 0;
    if (!fps || fpn < 1 || fpn > 16 || strspn(fps, "0123456789abcdefABCDEF") != fpn) {
        damaged(path, "field 'data_fingerprint' must be a string of 1 to 16 hex digits, found %s",
                fps ? "another string" : kind(fp));
        goto done;
    }
    out->data_fingerprint = strtoull(fps, NULL, 16);
    json_t *us = json_object_get(o, "unconsumed_started");
    if (!json_is_array(us)) {
        damaged(path, "field 'unconsumed_started' must be a list of prompt uids, found %s", kind(us));
        goto done;
    }
    const size_t nu = json_array_size(us);
    if (nu > (size_t)INT_MAX) {
        damaged(path, "field 'unconsumed_started' has %zu entries, at most %d", nu, INT_MAX);
        goto done;
    }
    out->unconsumed_started = nu ? xmalloc(nu * sizeof(int64_t)) : NULL;
    for (size_t i = 0; i < nu; i++) {
        json_t *u = json_array_get(us, i);
        if (!json_is_integer(u)) {
            damaged(path, "field 'unconsumed_started' entry %zu must be an integer prompt uid, found %s", i, kind(u));
            goto done;
        }
        out->unconsumed_started[i] = (int64_t)json_integer_value(u);
        out->n_unconsumed = (int)i + 1;
    }
    if (check_values(out, path, damaged) != MOERL_OK) goto done;
    if (expect && (out->n_rows != expect->n_rows || out->data_fingerprint != expect->data_fingerprint)) {
        moerl_errorf("%s: the checkpoint was made with other training data (%" PRId64 " rows with fingerprint %016" PRIx64
                     "; this run has %" PRId64 " rows with fingerprint %016" PRIx64
                     "); use a new trainer.default_local_dir or trainer.resume_mode=disable",
                     path, out->n_rows, out->data_fingerprint, expect->n_rows, expect->data_fingerprint);
        goto done;
    }
    if (expect && out->seed != expect->seed) {
        moerl_errorf("%s: the checkpoint was made with another trainer.seed (%" PRIu64 "; this run has %" PRIu64
                     "); resume with the same seed, or use a new trainer.default_local_dir or "
                     "trainer.resume_mode=disable", path, out->seed, expect->seed);
        goto done;
    }
    if (check_optimizer(out, path, expect) != MOERL_OK) goto done;
    rc = MOERL_OK;
done:
    json_decref(o);
    if (rc != MOERL_OK) {
        free(out->unconsumed_started);
        memset(out, 0, sizeof *out);
    }
    return rc;
}

int rl_state_load(rl_state *out, const char *path, const rl_state_expect *expect) {
    char *text;
    size_t len;
    memset(out, 0, sizeof *out);
    if (moerl_read_file(path, &text, &len) != MOERL_OK) return MOERL_ERR;
    int rc = rl_state_parse(out, text, len, path, expect);
    free(text);
    return rc;
}

/* Writer-side error: the struct comes from the running job, so a bad value is moerl's own bug. */
static int invalid(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int invalid(const char *path, const char *fmt, ...) {
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return moerl_errorf("%s: refusing to write an invalid state: %s", path, what);
}

static char *state_to_json(const rl_state *s, const char *path) {
    if (check_values(s, path, invalid) != MOERL_OK) return NULL;
    json_t *o = json_object(), *us = json_array();
    json_object_set_new(o, "format", json_string(RL_STATE_FORMAT));
    json_object_set_new(o, "format_version", json_integer(RL_STATE_FORMAT_VERSION));
    json_object_set_new(o, "version", json_integer(s->version));
    json_object_set_new(o, "trainer_step", json_integer(s->trainer_step));
    json_object_set_new(o, "optimizer_step", json_integer(s->optimizer_step));
    json_object_set_new(o, "optimizer_skipped", json_integer(s->optimizer_skipped));
    json_object_set_new(o, "consumed_prompts", json_integer(s->consumed_prompts));
    json_object_set_new(o, "feed_epoch", json_integer(s->feed_epoch));
    json_object_set_new(o, "feed_pos", json_integer(s->feed_pos));
    json_object_set_new(o, "seed", json_integer((json_int_t)s->seed));
    json_object_set_new(o, "n_rows", json_integer(s->n_rows));
    char fp[32];
    snprintf(fp, sizeof fp, "%016" PRIx64, s->data_fingerprint);
    json_object_set_new(o, "data_fingerprint", json_string(fp));
    for (int i = 0; i < s->n_unconsumed; i++) json_array_append_new(us, json_integer(s->unconsumed_started[i]));
    json_object_set_new(o, "unconsumed_started", us);
    json_object_set_new(o, "samples_log_bytes", json_integer(s->samples_log_bytes));
    json_object_set_new(o, "dropped_prompts", json_integer(s->dropped_prompts));
    json_object_set_new(o, "last_val_accuracy", isnan(s->last_val_accuracy) ? json_null() : json_real(s->last_val_accuracy));
    json_object_set_new(o, "kl_ctrl_value", isnan(s->kl_ctrl_value) ? json_null() : json_real(s->kl_ctrl_value));
    if (s->optimizer[0]) json_object_set_new(o, "optimizer", json_string(s->optimizer));
    if (s->optimizer_freeze_step > 0) json_object_set_new(o, "optimizer_freeze_step", json_integer(s->optimizer_freeze_step));
    if (s->optimizer_var_update_interval > 0)
        json_object_set_new(o, "optimizer_var_update_interval", json_integer(s->optimizer_var_update_interval));
    char *txt = json_dumps(o, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!txt) {
        moerl_errorf("%s: cannot encode the state (out of memory?)", path);
        return NULL;
    }
    size_t n = strlen(txt);
    char *r = xmalloc(n + 2);
    memcpy(r, txt, n);
    r[n] = '\n';
    r[n + 1] = 0;
    free(txt);
    return r;
}

char *rl_state_to_json(const rl_state *s) { return state_to_json(s, "trainer_state.json"); }

int rl_state_write(const char *path, const rl_state *s) {
    char *txt = state_to_json(s, path);
    if (!txt) return MOERL_ERR;
    int rc = moerl_write_file_atomic(path, txt, strlen(txt));
    free(txt);
    return rc;
}
