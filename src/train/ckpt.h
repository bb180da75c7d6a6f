/* Pieces shared by the resumable training jobs (moerl rl's trainer checkpoint, moerl sft's):
 * an atomic folder swap, the AdamW state as safetensors, and cutting a metrics JSONL back to the
 * checkpoint's step. */
#ifndef MOERL_CKPT_H
#define MOERL_CKPT_H

#include <stdint.h>

#include "optim/adamw.h"

/* Remove a flat folder (its files, then the folder); missing is fine. */
void ckpt_remove_flat_dir(const char *dir);
/* Replace folder cur by the complete folder tmp: cur → cur.old, tmp → cur, remove cur.old. A kill
 * at any moment leaves cur or cur.old complete (a loader falls back to cur.old). Errors: a rename
 * failing (message names the paths). */
int ckpt_swap_dir(const char *tmp, const char *cur);
/* The moments of s as optimizer.safetensors tensors "adam.m", "adam.v" (F32 [n]). */
int ckpt_save_optimizer(const adamw_state *s, const char *path);
/* Load them back; errors name the file and what is missing or of the wrong size. */
int ckpt_load_optimizer(adamw_state *s, const char *path);
/* Rewrite a metrics JSONL keeping the records whose "step" ≤ step (atomically; missing: ok). */
int ckpt_truncate_metrics(const char *path, int64_t step);

#endif
