/* The model.* config keys (architecture of a new model, or model.path) and the model they build. */
#ifndef MOERL_MODEL_CONFIG_H
#define MOERL_MODEL_CONFIG_H

#include "base/config.h"
#include "model/model.h"

/* Declare the model.* keys: model.path, or an architecture for a random init (model.seed), and the
 * MoE execution switches model.moe.*. */
void model_def_keys(cfg *c);
/* The architecture without weights: from `model` (a folder holding config.json, or the file) when
 * non-empty, else from model.path when set, else from the model.* keys (validated; errors name the
 * file or "model.*"). model NULL = use model.path / the keys. With a path, model.* architecture keys
 * given as well are an error naming them (or, for a path given on the command line beside a config
 * file's keys, a warning). */
int model_config_from_keys(const cfg *c, const char *model, moe_config *mc);
/* Load model.path, or create a new model from the model.* architecture keys (random init with
 * model.seed), and apply the model.moe.* switches. Logs what it did. Does not choose a tokenizer
 * (data_use_model_tokenizer, data/data_config.h). Errors name model.path or the model.* key. */
int model_build_from_keys(const cfg *c, moe_model *m);
/* Declare the training commands' recompute keys (moerl rl, sft, plan): model.enable_gradient_checkpointing
 * and actor.recompute_granularity (docs/parallelism.md, "Activation recompute"). model_build_from_keys then
 * checks them and sets moe_config.exec.recompute. */
void model_def_train_keys(cfg *c);
/* MODEL_RECOMPUTE_* the keys ask for (NONE where they are not declared). Check them first. */
int model_recompute_mode(const cfg *c);
/* MOERL_ERR naming the key and value: a granularity other than full|selective, or one set without
 * model.enable_gradient_checkpointing=true. Keys not declared: MOERL_OK. */
int model_check_train_keys(const cfg *c);

#endif
