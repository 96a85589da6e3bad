/* interop.h: this project's GPT-2 as other tools know it, and the recipes
 * that export it to them and import it from them (docs/EXPORT.md).
 * Hugging Face transformers: GPT2LMHeadModel's safetensors names, Conv1D
 * weights stored [in, out], config.json. llama.cpp: the gpt2 architecture
 * of GGUF (tensor names, metadata keys, a vocabulary). The file formats
 * themselves are formats.h's; this is the model knowledge that drives them.
 * Functions return a tp_status (common/error.h). */
#ifndef TP_MODEL_INTEROP_H
#define TP_MODEL_INTEROP_H

#include <stddef.h>

#include "../formats/formats.h"
#include "../formats/megatron.h"
#include "../formats/registry.h"
#include "gpt.h"

/* ------------------------------------------------------------------ names */

/* The model's parameters under the names of a format, in catalogue order.
 * tensors[i].source is the checkpoint name, .name the outside one. */
typedef struct {
    export_tensor *tensors;
    int count;
    char (*names)[2][CKPT_NAME_MAX + 1]; /* storage: source, outside name */
    int64_t *blocks;                     /* storage of the tensors' row blocks */
    float *values;                       /* storage of a computed tensor (GGUF's rope_freqs) */
} gpt_name_map;

/* GPT-2: fails with TP_ERR_ARG when the model is not a GPT-2 the format can
 * express (SwiGLU, grouped-query attention). For safetensors, names carry
 * prefix ("transformer." as GPT2LMHeadModel saves them, "" for GPT2Model's
 * files); the tied output projection is not listed (not stored).
 * Llama (LlamaForCausalLM; llama.cpp's llama architecture): prefix is
 * ignored ("model." inside, lm_head.weight outside, as Hugging Face saves
 * them); a fused QKV is listed as its Q, K and V rows and the SwiGLU input
 * as its gate and up rows (entries with the same source, in row order); for
 * GGUF the Q and K rows of each head are permuted as llama.cpp's converter
 * permutes them (rotate-half pairs (j, j + hd/2) made adjacent, (2j, 2j+1)),
 * and Llama 3's frequency scaling is the computed tensor rope_freqs.weight
 * [hd/2] of the converter (each frequency's divisor). */
int gpt_name_map_create(gpt_name_map *out, const gpt_config *config, export_format format, const char *prefix);
void gpt_name_map_free(gpt_name_map *map);

/* ------------------------------------------------------------ config.json */

/* config.json of GPT2LMHeadModel for the model (malloc'ed, indented; NULL
 * without memory); torch_dtype names dtype. No dropout: tp-train trains
 * without it. */
char *gpt_hf_config_json(const gpt_config *config, tp_dtype dtype);

/* Reads a Hugging Face GPT-2 config.json into config (fp32, no padding
 * multiple: the caller sets those). Fails with TP_ERR_FORMAT, naming the key,
 * on anything this trainer does not compute: another model_type, an
 * activation other than GELU's tanh form, a layer-norm epsilon other than
 * 1e-5, untied embeddings, unscaled or layer-scaled attention. */
int gpt_hf_config_parse(const char *json, const char *where, gpt_config *config);

/* ---------------------------------------------------------- GGUF metadata */

/* The keys of llama.cpp's gpt2 architecture for the model, the general.*
 * keys of model listings (type, name, size label from the parameter count),
 * and a vocabulary: with tokenizer_dir (a Hugging Face GPT-2 tokenizer:
 * vocab.json and merges.txt) the BPE vocabulary llama.cpp's converter
 * writes; without one, for a byte-level model (256 tokens, as `tp-train
 * prepare` makes them) GPT-2's byte-to-symbol table with no merges, so that
 * llama.cpp tokenizes text byte by byte; otherwise "no_vocab". */
typedef struct gpt_gguf_metadata gpt_gguf_metadata;

int gpt_gguf_metadata_create(gpt_gguf_metadata **out, const gpt_config *config, const char *name,
                             const char *tokenizer_dir);
const export_kv *gpt_gguf_metadata_kvs(const gpt_gguf_metadata *metadata, int *count);
void gpt_gguf_metadata_free(gpt_gguf_metadata *metadata);

/* The byte-to-symbol table of GPT-2's byte-level BPE: symbol b (UTF-8, at
 * most 2 bytes and a NUL) stands for byte b. */
void gpt_byte_symbol(int byte, char out[4]);

/* The size label of a parameter count as llama.cpp's tools write it:
 * "124M", "1.5B", "110K". */
void gpt_size_label(int64_t parameters, char *out, size_t size);

/* ----------------------------------------------------------------- export */

/* What an export of a checkpoint writes: its tensors under the format's
 * names, and the metadata that goes with them. */
typedef struct gpt_export gpt_export;

typedef struct {
    const char *name;          /* gguf: general.name; NULL: "GPT-2 (tp-toolkit)" */
    const char *tokenizer_dir; /* gguf: a GPT-2 tokenizer (see gpt_gguf_metadata_create) */
} gpt_export_request;

/* For options->format: safetensors and GGUF need the checkpoint's model to
 * be a GPT-2 (its configuration from the training state); hdf5 writes every
 * parameter under its own name, for a checkpoint of any model. Sets
 * options->metadata, kvs and config_json, which point into the result. */
int gpt_export_create(gpt_export **out, ckpt_reader *source, const gpt_export_request *request,
                      export_options *options);
const export_tensor *gpt_export_tensors(const gpt_export *job, int *count);

/* The same for a Megatron-LM GPT (formats/megatron.h; source its reader,
 * megatron_reader_open): a GPT-2 (learned positions, LayerNorm, biases,
 * GELU, tied embeddings, one query group per head) under Hugging Face's or
 * llama.cpp's names, each fused QKV's heads regrouped from Megatron's
 * [q of a group, k, v] per group into [q; k; v], the vocabulary cut to the
 * checkpoint's true size where it was told (megatron_set_true_vocab; else
 * the padded table whole), config.json's activation Megatron's GELU (exact,
 * or the tanh form with openai_gelu). Other models fail, naming what does
 * not fit. hdf5 writes every parameter under its own name, as above. */
int gpt_export_create_megatron(gpt_export **out, ckpt_reader *source, const megatron_config *model,
                               const gpt_export_request *request, export_options *options);
void gpt_export_free(gpt_export *job);

/* ------------------------------------------------------ a Megatron-LM GPT */

/* Megatron's canonical name (formats/megatron.h) of this model's parameter
 * (model/layers.3.attn.qkv.weight -> layers.3.attention.qkv.weight). */
int gpt_megatron_name(const char *ours, char *out, size_t size);
/* What of a Megatron GPT this GPT-2 cannot compute ("a SwiGLU MLP",
 * "untied output embeddings", ...), or NULL. */
const char *gpt_megatron_unfit(const megatron_config *config);
/* This model's configuration of a Megatron GPT that gpt_megatron_unfit
 * accepts (a Llama when rotary and RMSNorm). */
gpt_config gpt_megatron_model(const megatron_config *config);

/* A fused QKV of heads in groups, kv_channels rows a block: Megatron's
 * rows per group [q of its heads, k, v], this model's [q; k; v] cut over
 * tp, the k and v of fewer groups than ranks replicated over the tp /
 * groups ranks sharing one (docs/FORMAT.md, replicate_small_segments).
 * This model's piece `piece` at degree tp is made from Megatron's piece
 * *megatron_piece at the degree returned: tp where groups >= tp (the
 * rank's whole groups), else groups (its group's rows whole, which
 * Megatron-Core cuts between the ranks sharing it). Block j of that piece
 * of ours, [q of the rank's heads; its keys; its values], is block
 * gpt_megatron_qkv_block of Megatron's. groups and tp divide one another,
 * heads divide over both (gpt_config_check). */
int gpt_megatron_qkv_degree(int64_t groups, int tp, int piece, int *megatron_piece);
int64_t gpt_megatron_qkv_block(int64_t heads, int64_t groups, int tp, int piece, int64_t j);

/* A Megatron-LM GPT-2 as this model's checkpoint at layout tp x pp, for
 * tp-train to go on training it: its weights, and the Adam moments and
 * fp32 masters where they were read, each fused QKV regrouped from
 * Megatron's per-group [q, k, v] into [q; k; v] piece by piece; the
 * vocabulary its true size where told (megatron_set_true_vocab, padded as
 * Megatron pads), else the padded table; the iteration as the step; fewer
 * query groups than tp ranks (tp a multiple of them) as replicated
 * key/value heads, as the trainer writes them. Refused for what the
 * trainer does not compute (gpt_megatron_unfit), for the exact GELU
 * (openai_gelu false: the trainer computes the tanh form) and for groups
 * and tp that neither divide the other. */
typedef struct gpt_megatron_import gpt_megatron_import;

int gpt_megatron_import_open(gpt_megatron_import **out, const megatron_config *model, ckpt_reader *source, int tp,
                             int pp);
int64_t gpt_megatron_import_bytes(const gpt_megatron_import *job);
int gpt_megatron_import_count(const gpt_megatron_import *job);
/* Parameters stored wider than this model's dtype (a bf16 Llama's fp32
 * norms), rounded to it; their fp32 values are kept as their masters. */
int gpt_megatron_import_rounded(const gpt_megatron_import *job);
/* Writes the checkpoint at out (compress_level, overwrite, update_latest
 * and progress of options; one thread). */
int gpt_megatron_import_run(gpt_megatron_import *job, const import_options *options, const char *out);
void gpt_megatron_import_close(gpt_megatron_import *job);

/* A checkpoint of this model seen as a Megatron model, for the registry's
 * Megatron writers (formats/registry.h): args from the model (learned
 * positions, LayerNorm, biases, GELU's tanh form: openai_gelu, tied
 * embeddings; Llama's RMSNorm, SwiGLU, rotary half-heads), the vocabulary
 * padded as Megatron pads it (its pad multiple as
 * make_vocab_size_divisible_by), the step as the iteration, each fused QKV
 * regrouped into Megatron's per-group order; weights only (a Megatron
 * optimizer's param groups are its run's: the legacy writer leaves it out,
 * torch_dist's refuses it unless left out). */
extern const formats_megatron_view gpt_megatron_view;

/* ----------------------------------------------------------------- import */

/* A Hugging Face GPT-2 directory (config.json, and model.safetensors or
 * shards with model.safetensors.index.json) opened and checked for import:
 * every entry is a parameter of the model (or an attention-mask buffer, or an
 * lm_head equal to the token table) and every parameter is there. */
typedef struct gpt_import gpt_import;

typedef struct {
    int tp, pp;                 /* layout of the checkpoint to write */
    tp_dtype dtype;             /* dtype of the parameters */
    int64_t vocab_pad_multiple; /* >= 1 */
} gpt_import_request;

int gpt_import_open(gpt_import **out, const char *dir, const gpt_import_request *request);
int gpt_import_count(const gpt_import *job);   /* tensors to write */
int64_t gpt_import_bytes(const gpt_import *job); /* bytes of tensor data to write */
/* What opening the directory found doubtful but not wrong, for the program
 * to say before it writes: "" or one sentence (safetensors_warning). */
const char *gpt_import_warning(const gpt_import *job);
/* Writes the checkpoint (step 0, weights only) at out_path. */
int gpt_import_run(gpt_import *job, const import_options *options, const char *out_path);
void gpt_import_close(gpt_import *job);

#endif
