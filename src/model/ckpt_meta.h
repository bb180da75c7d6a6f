/* What a checkpoint folder says about itself beyond its weights: the policy version of an RL
 * checkpoint (trainer_state.json) and the vocabulary size of config.json, read without loading it. */
#ifndef MOERL_MODEL_CKPT_META_H
#define MOERL_MODEL_CKPT_META_H

/* The policy version of the checkpoint in dir: trainer_state.json's "version" (written with every
 * RL checkpoint), or 0 when the file is absent (an SFT or HF checkpoint). A file that is present
 * but damaged is an error naming it and the field. */
int checkpoint_policy_version(const char *dir, int *version);
/* dir/config.json's vocab_size, or 0 when there is no readable one (e.g. a tokenizer-only folder). */
int checkpoint_vocab_size(const char *dir);

#endif
