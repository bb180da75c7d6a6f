/* moerl score --model DIR --tokens 1,5,9,...
 * Prints one JSON object: token_logprobs (T−1 values: log p(token[t+1] | tokens ≤ t)),
 * ce_loss (their negative mean) and aux_loss (HF load_balancing_loss_func over all MoE layers,
 * without the router_aux_loss_coef factor; model/score.h). The user's perplexity/debug tool. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "cli/options.h"
#include "model/model.h"
#include "model/score.h"

int cmd_score(int argc, char **argv) {
    const char *model_dir = NULL;
    cli_int_list toks = {0};
    const cli_opt opts[] = {
        CLI_OPT_STR("model", &model_dir, "DIR", CLI_ONCE | CLI_REQUIRED, "a checkpoint folder (config.json + safetensors)"),
        CLI_OPT_LIST("tokens", &toks, "1,5,9,...", CLI_ONCE | CLI_REQUIRED, "the token ids to score (at least 2)"),
    };
    const cli_spec spec = {.cmd = "score", .synopsis = "--model DIR --tokens 1,5,9,...", .opts = opts,
                           .n_opts = CLI_NOPTS(opts),
                           .about = "prints {\"token_logprobs\": [...], \"ce_loss\": x, \"aux_loss\": y}: log p(token[t+1] | "
                                    "tokens <= t), their negative mean, and the HF load-balancing loss (without "
                                    "router_aux_loss_coef)"};
    int code;
    if (cli_parse(&spec, argc, argv, &code)) return code;
    int *tokens = toks.v, T = toks.n;
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
    /* a sequence longer than the context is a usage error (exit 2), the rest a failure */
    const int too_long = m.cfg.max_position_embeddings > 0 && T > m.cfg.max_position_embeddings;
    float *logp = xmalloc((T - 1) * sizeof(float));
    double ce, aux;
    int rc = 0;
    if (model_score_tokens(&m, tokens, T, logp, &ce, &aux) != MOERL_OK) {
        fprintf(stderr, "moerl score: %s\n", moerl_last_error());
        rc = too_long ? 2 : 1;
    } else {
        json_t *o = json_object(), *lp = json_array();
        for (int t = 0; t + 1 < T; t++) json_array_append_new(lp, cli_json_real(logp[t]));
        json_object_set_new(o, "token_logprobs", lp);
        json_object_set_new(o, "ce_loss", cli_json_real(ce));
        json_object_set_new(o, "aux_loss", cli_json_real(aux));
        char *js = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
        printf("%s\n", js);
        free(js);
        json_decref(o);
    }
    free(logp);
    free(tokens);
    model_free(&m);
    return rc;
}
