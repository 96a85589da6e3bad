/* gpt_catalog.h: the tensors of a GPT model, by global name, with their
 * partition descriptions and initialization. The trainer builds its model
 * from this list and `tp-ckpt synth` writes checkpoints of it, so both agree
 * on every name and layout (docs/FORMAT.md "GPT tensor names"). */
#ifndef TP_GPT_CATALOG_H
#define TP_GPT_CATALOG_H

#include <stddef.h>

#include "../ckpt/ckpt.h"

typedef struct {
    int64_t layers;
    int64_t dim;
    int64_t heads;
    int64_t kv_heads;           /* grouped-query attention; == heads for GPT-2 */
    int64_t vocab;              /* logical vocabulary */
    int64_t seq;                /* maximum sequence length (position table) */
    int64_t ffn;                /* MLP width; 4 * dim for GPT-2 */
    int swiglu;                 /* MLP input is [gate; up] (two segments) instead of GELU */
    int64_t vocab_pad_multiple; /* vocabulary padded to a multiple of tp * this (>= 1) */
    tp_dtype dtype;           /* parameter storage dtype */
} gpt_config;

/* GPT-2 shapes where fields are 0: kv_heads = heads, ffn = 4 * dim, pad 1. */
void gpt_config_defaults(gpt_config *config);

/* Writes a one-line message to err (the trainer's way of failing: every
 * function that can fail takes err, err_size) and returns -1. */
int gpt_error(char *err, size_t err_size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define GPT_MAX_LAYERS 100000
#define GPT_MAX_SIZE ((int64_t)1 << 31) /* any other dimension */

/* Checks the shape (within the bounds above) and that it splits over tp and
 * pp; on failure writes one line naming the dimension to err and returns -1. */
int gpt_config_check(const gpt_config *config, int tp, int pp, char *err, size_t err_size);

typedef enum { GPT_ROLE_PARAM, GPT_ROLE_MASTER, GPT_ROLE_EXP_AVG, GPT_ROLE_EXP_AVG_SQ } gpt_role;

typedef struct {
    ckpt_tensor_desc desc;            /* strings point into this entry */
    char name[CKPT_NAME_MAX + 1];
    char param[CKPT_NAME_MAX + 1];
    gpt_role role;
    float init_mean, init_std;        /* parameters: mean + std * N(0, 1) */
    int weight_decay;                 /* decay applies (matrices and embeddings) */
} gpt_tensor;

/* Fails (-1) on a configuration gpt_config_check refuses for its size, or
 * without memory.
 * The parameter tensors and, with optimizer, each one's Adam moments (fp32)
 * and fp32 master copy when parameters are stored in lower precision.
 * *out is malloc'ed; free it with free(). */
int gpt_catalog(const gpt_config *config, int with_optimizer, gpt_tensor **out, int *count);

/* The config as a JSON object (malloc'ed), and back. */
char *gpt_config_to_json(const gpt_config *config);
int gpt_config_from_json(const char *json, gpt_config *out, char *err, size_t err_size);

#endif
