/* gpt_interop.h: this project's GPT-2 as other tools name it. Hugging Face
 * transformers (GPT2LMHeadModel: safetensors names, Conv1D weights stored
 * [in, out], config.json) and llama.cpp (the gpt2 architecture of GGUF:
 * tensor names, metadata keys, vocabulary). The file formats themselves are
 * reshard/export.h's; this is the model knowledge that drives them. */
#ifndef TP_GPT_INTEROP_H
#define TP_GPT_INTEROP_H

#include <stddef.h>

#include "../formats/formats.h"
#include "gpt.h"

/* The model's parameters under the names of a format, in catalogue order.
 * tensors[i].source is the checkpoint name, .name the outside one. */
typedef struct {
    export_tensor *tensors;
    int count;
    char (*names)[2][CKPT_NAME_MAX + 1]; /* storage: source, outside name */
} gpt_name_map;

/* Fails, with one line in err, when the model is not a GPT-2 the format can
 * express (SwiGLU, grouped-query attention). For safetensors, names carry
 * prefix ("transformer." as GPT2LMHeadModel saves them, "" for GPT2Model's
 * files); the tied output projection is not listed (not stored). */
int gpt_name_map_create(gpt_name_map *out, const gpt_config *config, export_format format, const char *prefix,
                        char *err, size_t err_size);
void gpt_name_map_free(gpt_name_map *map);

/* config.json of GPT2LMHeadModel for the model (malloc'ed, indented);
 * torch_dtype names dtype. No dropout: tp-train trains without it. */
char *gpt_hf_config_json(const gpt_config *config, tp_dtype dtype);

/* Reads a Hugging Face GPT-2 config.json into config (fp32, no padding
 * multiple: the caller sets those). Fails, naming the key, on anything this
 * trainer does not compute: another model_type, an activation other than
 * GELU's tanh form, a layer-norm epsilon other than 1e-5, untied embeddings,
 * unscaled or layer-scaled attention. */
int gpt_hf_config_parse(const char *json, const char *where, gpt_config *config, char *err, size_t err_size);

/* GGUF metadata of llama.cpp's gpt2 architecture. Without a tokenizer the
 * vocabulary is "no_vocab" with gpt2.vocab_size; with tokenizer_dir (a
 * Hugging Face GPT-2 tokenizer: vocab.json and merges.txt) it is the BPE
 * vocabulary llama.cpp's converter writes. */
typedef struct gpt_gguf_metadata gpt_gguf_metadata;

int gpt_gguf_metadata_create(gpt_gguf_metadata **out, const gpt_config *config, const char *name,
                             const char *tokenizer_dir, char *err, size_t err_size);
const export_kv *gpt_gguf_metadata_kvs(const gpt_gguf_metadata *metadata, int *count);
void gpt_gguf_metadata_free(gpt_gguf_metadata *metadata);

#endif
