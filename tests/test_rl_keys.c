/* moerl rl's verl-named keys (src/rl/config.c): actor.clip_ratio (verl's symmetric ε), the defaults a verl
 * config expects (actor.clip_ratio_high 0.2), trainer.test_freq=-1, the keys that act only behind a switch
 * (rl_warn_ignored_keys: one warning per key set to a non-default value while its switch is off), and a
 * section given a value. Every check is exact (no numerics: config values as declared). */
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/config.h"
#include "rl/rl.h"
#include "test.h"

/* rl_def_keys plus overrides; NULL (and the error in moerl_last_error) when one is refused. */
static cfg *rl_cfg(const char *const *kv, int n) {
    cfg *c = cfg_new();
    rl_def_keys(c);
    for (int i = 0; i < n; i++)
        if (cfg_apply_override(c, kv[i]) != MOERL_OK) {
            cfg_free(c);
            return NULL;
        }
    return c;
}

#define N(a) ((int)(sizeof(a) / sizeof *(a)))

/* Reads kv; returns rl_read_config's status, *r the config, *ignored rl_warn_ignored_keys' count. */
static int read_kv(const char *const *kv, int n, rl_config *r, int *ignored) {
    cfg *c = rl_cfg(kv, n);
    if (!c) return MOERL_ERR;
    int st = rl_read_config(c, r);
    if (ignored) *ignored = st == MOERL_OK ? rl_warn_ignored_keys(c, r) : -1;
    cfg_free(c);
    return st;
}

static void test_clip_ratio(void) {
    rl_config r;
    const char *none[] = {"rollout.n=4"};
    CHECK(read_kv(none, N(none), &r, NULL) == MOERL_OK, "defaults read: %s", moerl_last_error());
    /* verl's ppo_trainer.yaml: clip_ratio_low = clip_ratio_high = 0.2 (clip-higher is DAPO's opt-in) */
    CHECK(r.ppo.clip_ratio_low == 0.2f && r.ppo.clip_ratio_high == 0.2f, "default clip %g/%g, expected 0.2/0.2",
          (double)r.ppo.clip_ratio_low, (double)r.ppo.clip_ratio_high);
    const char *sym[] = {"actor.clip_ratio=0.1"};
    CHECK(read_kv(sym, N(sym), &r, NULL) == MOERL_OK, "actor.clip_ratio accepted: %s", moerl_last_error());
    CHECK(r.ppo.clip_ratio_low == 0.1f && r.ppo.clip_ratio_high == 0.1f, "clip_ratio=0.1 gives %g/%g",
          (double)r.ppo.clip_ratio_low, (double)r.ppo.clip_ratio_high);
    /* verl: a side's own key wins, clip_ratio fills the other (DAPO's clip_ratio=0.2 clip_ratio_high=0.28) */
    const char *both[] = {"actor.clip_ratio=0.1", "actor.clip_ratio_high=0.3"};
    CHECK(read_kv(both, N(both), &r, NULL) == MOERL_OK && r.ppo.clip_ratio_low == 0.1f && r.ppo.clip_ratio_high == 0.3f,
          "clip_ratio=0.1 with clip_ratio_high=0.3 gives %g/%g, expected 0.1/0.3 (%s)", (double)r.ppo.clip_ratio_low,
          (double)r.ppo.clip_ratio_high, moerl_last_error());
    const char *both_low[] = {"actor.clip_ratio_low=0.1", "actor.clip_ratio=0.25"};
    CHECK(read_kv(both_low, N(both_low), &r, NULL) == MOERL_OK && r.ppo.clip_ratio_low == 0.1f &&
              r.ppo.clip_ratio_high == 0.25f,
          "clip_ratio_low=0.1 with clip_ratio=0.25 gives %g/%g, expected 0.1/0.25", (double)r.ppo.clip_ratio_low,
          (double)r.ppo.clip_ratio_high);
    const char *bad[] = {"actor.clip_ratio=1.5"};
    CHECK(read_kv(bad, N(bad), &r, NULL) == MOERL_ERR, "clip_ratio=1.5 (ε_low ≥ 1) refused");
    const char *dapo[] = {"actor.clip_ratio_high=0.28"};
    CHECK(read_kv(dapo, N(dapo), &r, NULL) == MOERL_OK && r.ppo.clip_ratio_high == 0.28f && r.ppo.clip_ratio_low == 0.2f,
          "clip-higher set explicitly: %g/%g", (double)r.ppo.clip_ratio_low, (double)r.ppo.clip_ratio_high);
}

static void test_test_freq(void) {
    rl_config r;
    const char *off[] = {"trainer.test_freq=-1"};
    CHECK(read_kv(off, N(off), &r, NULL) == MOERL_OK && r.test_freq == -1, "trainer.test_freq=-1 accepted: %s",
          moerl_last_error());
    const char *bad[] = {"trainer.test_freq=-2"};
    CHECK(read_kv(bad, N(bad), &r, NULL) == MOERL_ERR && strstr(moerl_last_error(), "trainer.test_freq"),
          "trainer.test_freq=-2 refused: %s", moerl_last_error());
}

/* Each row: overrides, and how many keys they leave without effect. */
static void test_ignored_keys(void) {
    static const struct {
        const char *kv[3];
        int n, ignored;
    } rows[] = {
        {{"actor.kl_loss_type=k3+"}, 1, 1},
        {{"actor.kl_loss_type=k3+", "actor.use_kl_loss=true"}, 2, 0},
        {{"actor.kl_loss_type=low_var_kl"}, 1, 0}, /* the default spelt out (a verl config): nothing lost */
        {{"actor.kl_loss_coef=0.5"}, 1, 1},
        {{"algorithm.kl_ctrl.kl_coef=0.01", "algorithm.kl_penalty=mse"}, 2, 2},
        {{"algorithm.kl_ctrl.kl_coef=0.01", "algorithm.use_kl_in_reward=true"}, 2, 0},
        {{"algorithm.kl_ctrl.target_kl=0.5", "algorithm.use_kl_in_reward=true"}, 2, 1}, /* fixed: no target */
        {{"actor.clip_ratio_c=2"}, 1, 0}, /* vanilla: the dual clip acts */
        {{"actor.clip_ratio_c=2", "actor.policy_loss.loss_mode=gspo"}, 2, 1},
        {{"actor.behav_imp_weight_cap=5"}, 1, 1},
        {{"algorithm.rollout_correction.rollout_is_threshold=4"}, 1, 1},
        {{"reward_model.overlong_buffer.penalty_factor=0.5"}, 1, 1},
        {{"algorithm.filter_groups.max_num_gen_batches=3"}, 1, 1},
        {{"algorithm.norm_adv_by_std_in_grpo=false", "algorithm.adv_estimator=rloo"}, 2, 1},
        {{"algorithm.norm_adv_by_std_in_grpo=false"}, 1, 0},
        {{"actor.loss_scale_factor=16"}, 1, 1},
        {{"actor.grad_compression_chunk=64"}, 1, 1},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        rl_config r;
        int ignored = -1;
        const int st = read_kv(rows[i].kv, rows[i].n, &r, &ignored);
        CHECK(st == MOERL_OK && ignored == rows[i].ignored, "row %zu (%s ...): status %d, %d ignored, expected %d: %s",
              i, rows[i].kv[0], st, ignored, rows[i].ignored, st == MOERL_OK ? "" : moerl_last_error());
    }
}

static void test_section_value(void) {
    cfg *c = cfg_new();
    rl_def_keys(c);
    CHECK(cfg_apply_override(c, "rollout=5") == MOERL_ERR && strstr(moerl_last_error(), "'rollout' is a section") &&
              !strstr(moerl_last_error(), "did you mean"),
          "rollout=5 names a section: %s", moerl_last_error());
    const char *y = "rollout: 5\n";
    CHECK(cfg_load_yaml_string(c, y, strlen(y), "t.yaml") == MOERL_ERR &&
              strstr(moerl_last_error(), "t.yaml:1") && strstr(moerl_last_error(), "'rollout' is a section"),
          "YAML rollout: 5 names a section: %s", moerl_last_error());
    CHECK(cfg_apply_override(c, "rollout.nn=5") == MOERL_ERR && strstr(moerl_last_error(), "did you mean 'rollout.n'"),
          "a mistyped key still gets its suggestion: %s", moerl_last_error());
    cfg_free(c);
}

int main(void) {
    test_clip_ratio();
    test_test_freq();
    test_ignored_keys();
    test_section_value();
    TEST_MAIN_END();
}
