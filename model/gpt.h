/* gpt.h: the GPT model this project trains and writes, described once: its
 * configuration (presets, the options every program parses the same way,
 * JSON in checkpoints), and its catalogue: every tensor by global name with
 * its shape, partition description, pipeline placement and initialization.
 * The trainer builds its model from the catalogue, `tp-ckpt synth` writes
 * checkpoints of it and the interop code (interop.h) names its tensors for
 * other tools, so all agree on every name and layout (docs/FORMAT.md "GPT
 * tensor names"). Functions return a tp_status (common/error.h). */
#ifndef TP_MODEL_GPT_H
#define TP_MODEL_GPT_H

#include <stddef.h>

#include "../ckpt/ckpt.h"

/* The architecture: GPT-2 (LayerNorm with biases, learned positions, GELU
 * MLP, biased linears, tied embeddings) or Llama (RMSNorm, rotary positions,
 * SwiGLU MLP, no biases, grouped-query attention, tied or untied output). */
typedef enum { GPT_ARCH_GPT = 0, GPT_ARCH_LLAMA = 1 } gpt_arch;

typedef struct {
    gpt_arch arch;
    int64_t layers;
    int64_t dim;
    int64_t heads;
    int64_t kv_heads;           /* grouped-query attention; == heads for GPT-2 */
    int64_t vocab;              /* logical vocabulary */
    int64_t seq;                /* maximum sequence length (position table) */
    int64_t ffn;                /* MLP width; 4 * dim for GPT-2 */
    int swiglu;                 /* MLP input is [gate; up] (two segments) instead of GELU */
    int64_t vocab_pad_multiple; /* vocabulary padded to a multiple of tp * this (>= 1) */
    tp_dtype dtype;             /* parameter storage dtype */
    /* Llama only (0 in a GPT configuration): */
    int untied_embeddings;      /* a separate output projection (output.weight) */
    double norm_eps;            /* RMSNorm epsilon (rms_norm_eps) */
    double rope_theta;          /* rotary base frequency */
    double rope_scaling_factor; /* Llama 3's frequency scaling; 0: none */
    double rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_seq;  /* original_max_position_embeddings */
} gpt_config;

#define GPT_LLAMA_DEFAULT_EPS 1e-5
#define GPT_LLAMA_DEFAULT_THETA 10000.0

/* "gpt" or "llama". */
const char *gpt_arch_name(gpt_arch arch);

/* Defaults where fields are 0: kv_heads = heads, vocabulary pad 1; GPT-2:
 * ffn = 4 * dim; Llama: SwiGLU, ffn = 8/3 dim rounded up to a multiple of
 * 256 (Llama's rule), eps 1e-5, theta 10000, and Llama 3's defaults for the
 * scaling's other factors when a factor is given (1, 4, 8192). */
void gpt_config_defaults(gpt_config *config);

#define GPT_MAX_LAYERS 100000
#define GPT_MAX_SIZE ((int64_t)1 << 31) /* any other dimension */

/* Checks the shape (positive, within the bounds above, a vocabulary of at
 * least 2) and that it splits over tp and pp; fails with TP_ERR_ARG or
 * TP_ERR_LAYOUT naming the dimension. */
int gpt_config_check(const gpt_config *config, int tp, int pp);

/* Whether a checkpoint's model (saved, as its configuration names it) is
 * the run's: every dimension and setting that shapes the tensors or the
 * arithmetic, the dtype aside. TP_OK when it is; otherwise TP_ERR_ARG
 * "PATH holds another model: ..., this run has ...: resume with the model
 * flags it was trained with ...", naming both (the six sizes, and each other
 * setting where the two differ: kv_heads, arch, tied embeddings, ...) and
 * what to do. One rule
 * for the trainer's resume and tp-elastic's check before it launches. */
int gpt_config_check_same(const char *path, const gpt_config *saved, const gpt_config *run);

/* Llama 3's rope scaling as Hugging Face's config.json and our model
 * configuration both write it: {"factor", "high_freq_factor",
 * "low_freq_factor", "original_max_position_embeddings"} added to parent
 * (a cJSON object) as "rope_scaling"; returns the new object (NULL without
 * memory). Only for a configuration with scaling. */
struct cJSON;
struct cJSON *gpt_rope_scaling_json(const gpt_config *config, struct cJSON *parent);

/* The configuration as a JSON object (malloc'ed; NULL without memory), and
 * back: {} (a checkpoint that names no model) fails saying so. */
char *gpt_config_to_json(const gpt_config *config);
int gpt_config_from_json(const char *json, gpt_config *out);

/* Named shapes (fp32, defaults filled): GPT-2 "tiny", "small", "gpt2-124m";
 * Llama "llama-tiny" (2 layers, dim 64, 4 heads, 2 KV heads, untied),
 * "smollm2-135m", "tinyllama-1.1b", "llama-3.2-1b" (the real models' shapes). */
int gpt_preset(const char *name, gpt_config *out);

/* ------------------------------------------------------------ options */

/* What a user said about the model on a command line: a preset, refined by
 * explicit sizes. Every program that builds or describes a model parses the
 * same options the same way. */
typedef struct {
    const char *preset;
    gpt_config explicit_shape; /* 0: not given */
    int dtype_given, arch_given;
    int embeddings_given;      /* 1: --tied-embeddings, 2: --untied-embeddings */
} gpt_options;

/* The options, by name: model (a preset), arch, layers, dim, heads,
 * kv-heads, vocab, seq, ffn, vocab-pad-multiple, dtype, norm-eps,
 * rope-theta, rope-scaling (FACTOR[,LOW,HIGH,ORIGINAL]), and the flags
 * swiglu, tied-embeddings and untied-embeddings (value ignored). */
extern const char *const gpt_option_names[];

/* Whether option `name` is a flag (swiglu, tied-embeddings, untied-embeddings). */
int gpt_option_is_flag(const char *name);

/* Sets option `name` from its text; fails with TP_ERR_ARG naming the option
 * and what it accepts. */
int gpt_options_set(gpt_options *options, const char *name, const char *value);

/* The configuration: the preset refined by the explicit sizes, defaults
 * filled; fails when neither a preset nor every one of layers, dim, heads,
 * vocab and seq was given. dtype is fp32 unless given. */
int gpt_options_finish(const gpt_options *options, gpt_config *out);

/* Whether any option describing the model's shape was given (all but
 * --dtype, which says how it trains): without one, tp-train --resume takes
 * the model of the checkpoint it resumes. */
int gpt_options_shape_given(const gpt_options *options);

/* ----------------------------------------------------------- catalogue */

/* Which tensor of the model an entry is. Per-layer kinds live under
 * "model/layers.{l}.", the others at the top. */
typedef enum {
    GPT_TOK_EMBED,      /* tok_embed.weight [V, D] (the output projection too: tied) */
    GPT_POS_EMBED,      /* pos_embed.weight [S, D] */
    GPT_LN1_WEIGHT,     /* layers.{l}.ln1.weight [D] */
    GPT_LN1_BIAS,       /* layers.{l}.ln1.bias [D] */
    GPT_QKV_WEIGHT,     /* layers.{l}.attn.qkv.weight [Q + 2 KV, D] */
    GPT_QKV_BIAS,       /* layers.{l}.attn.qkv.bias [Q + 2 KV] */
    GPT_PROJ_WEIGHT,    /* layers.{l}.attn.proj.weight [D, Q] */
    GPT_PROJ_BIAS,      /* layers.{l}.attn.proj.bias [D] */
    GPT_LN2_WEIGHT,     /* layers.{l}.ln2.weight [D] */
    GPT_LN2_BIAS,       /* layers.{l}.ln2.bias [D] */
    GPT_FC_WEIGHT,      /* layers.{l}.mlp.fc.weight [F or 2F, D] */
    GPT_FC_BIAS,        /* layers.{l}.mlp.fc.bias [F or 2F] */
    GPT_FCPROJ_WEIGHT,  /* layers.{l}.mlp.proj.weight [D, F] */
    GPT_FCPROJ_BIAS,    /* layers.{l}.mlp.proj.bias [D] */
    GPT_FINAL_NORM_WEIGHT, /* final_norm.weight [D] */
    GPT_FINAL_NORM_BIAS,   /* final_norm.bias [D] */
    GPT_OUTPUT_WEIGHT,     /* output.weight [V, D]: Llama's untied output projection */
    GPT_TENSOR_KINDS
} gpt_tensor_kind;

#define GPT_FIRST_LAYER_KIND GPT_LN1_WEIGHT
#define GPT_LAYER_KINDS (GPT_FCPROJ_BIAS - GPT_LN1_WEIGHT + 1)

/* "tok_embed.weight", "ln1.weight" (without "layers.{l}."), ... */
const char *gpt_tensor_kind_name(gpt_tensor_kind kind);
int gpt_tensor_kind_in_layer(gpt_tensor_kind kind);

typedef enum { GPT_ROLE_PARAM, GPT_ROLE_MASTER, GPT_ROLE_EXP_AVG, GPT_ROLE_EXP_AVG_SQ } gpt_role;

typedef struct {
    ckpt_tensor_desc desc;            /* strings point into this entry */
    char name[CKPT_NAME_MAX + 1];
    char param[CKPT_NAME_MAX + 1];
    gpt_tensor_kind kind;
    int64_t layer;                    /* global layer index, -1 outside the layers */
    gpt_role role;
    int param_index;                  /* catalogue index of the parameter this state belongs to */
    float init_mean, init_std;        /* parameters: mean + std * N(0, 1) */
    int weight_decay;                 /* decay applies (matrices and embeddings) */
} gpt_tensor;

/* The parameter tensors in catalogue order (the embeddings, each layer's,
 * the final norm, the untied output projection) and, with optimizer, then each one's Adam moments (fp32)
 * and fp32 master copy when parameters are stored in lower precision.
 * Fails on a configuration gpt_config_check refuses for its size, or
 * without memory. *out is malloc'ed; free it with free(). */
int gpt_catalog(const gpt_config *config, int with_optimizer, gpt_tensor **out, int *count);

/* Parameters of the model: elements of its catalogue's parameter tensors
 * (logical, no padding; the tied output projection counted once). */
int gpt_parameter_count(const gpt_config *config, int64_t *count);

/* Training FLOPs per token at sequence length seq, as PaLM and llm.c count
 * them for model FLOPs utilization: 6 N (forward and backward of every
 * parameter) + 12 L d T (attention's scores and weighted sums); N counts
 * every parameter, embeddings included. Fails as gpt_parameter_count. */
int gpt_training_flops_per_token(const gpt_config *config, int64_t seq, double *flops);

#endif
