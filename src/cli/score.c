/* moerl score --model DIR --tokens 1,5,9,...
 * Prints one JSON object: token_logprobs (T−1 values: log p(token[t+1] | tokens ≤ t)),
 * ce_loss (their negative mean) and aux_loss (HF load_balancing_loss_func over all MoE layers,
 * without the router_aux_loss_coef factor). The user's perplexity/debug tool. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "model/forward.h"
#include "model/model.h"

int cmd_score(int argc, char **argv) {
    const char *model_dir = NULL, *tokens_s = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model_dir = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens_s = argv[++i];
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: moerl score --model DIR --tokens 1,5,9,...\n"
                   "prints {\"token_logprobs\": [...], \"ce_loss\": x, \"aux_loss\": y}\n");
            return 0;
        } else {
            fprintf(stderr, "moerl score: unknown or incomplete option '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (!model_dir || !tokens_s) {
        fprintf(stderr, "moerl score: --model DIR and --tokens LIST are required\n");
        return 2;
    }
    int *tokens, T;
    if (cli_parse_int_list(tokens_s, &tokens, &T) != MOERL_OK) {
        fprintf(stderr, "moerl score: --tokens: %s\n", moerl_last_error());
        return 2;
    }
    if (T < 2) {
        fprintf(stderr, "moerl score: --tokens needs at least 2 tokens (got %d)\n", T);
        free(tokens);
        return 2;
    }
    moe_model m;
    if (model_load_hf_inference(&m, model_dir) != MOERL_OK) {
        fprintf(stderr, "moerl score: %s\n", moerl_last_error());
        free(tokens);
        return 1;
    }
    if (m.cfg.max_position_embeddings > 0 && T > m.cfg.max_position_embeddings) {
        fprintf(stderr, "moerl score: %d tokens exceed the model's context max_position_embeddings %d\n", T,
                m.cfg.max_position_embeddings);
        free(tokens);
        model_free(&m);
        return 2;
    }
    model_acts a;
    int cu[2] = {0, T};
    int rc = 1;
    int *targets = xmalloc(T * sizeof(int));
    for (int t = 0; t < T; t++) targets[t] = t + 1 < T ? tokens[t + 1] : -1;
    if (model_acts_init(&a, &m, T) != MOERL_OK || model_forward(&m, &a, tokens, cu, NULL, 1, T) != MOERL_OK) {
        fprintf(stderr, "moerl score: %s\n", moerl_last_error());
        goto out;
    }
    model_logprobs(&m, &a, targets, 1.0f, 0);
    json_t *o = json_object(), *lp = json_array();
    double sum = 0;
    for (int t = 0; t + 1 < T; t++) {
        json_array_append_new(lp, cli_json_real(a.logp[t]));
        sum += a.logp[t];
    }
    json_object_set_new(o, "token_logprobs", lp);
    json_object_set_new(o, "ce_loss", cli_json_real(-sum / (T - 1)));
    json_object_set_new(o, "aux_loss", cli_json_real(a.aux_loss));
    char *js = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
    printf("%s\n", js);
    free(js);
    json_decref(o);
    rc = 0;
    model_acts_free(&a);
out:
    free(targets);
    free(tokens);
    model_free(&m);
    return rc;
}
