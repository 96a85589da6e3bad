/* gpt_interop.c: GPT-2 names, configuration and vocabulary for Hugging Face
 * transformers and llama.cpp (docs/EXPORT.md). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interop.h"

/* Per layer: catalogue suffix, Hugging Face name, llama.cpp name, whether
 * Hugging Face stores it transposed (Conv1D weights are [in, out]; ours and
 * llama.cpp's are [out, in] as torch.nn.Linear). */
static const struct {
    const char *ours, *hf, *gguf;
    int hf_transpose;
} layer_names[] = {
    {"ln1.weight", "ln_1.weight", "attn_norm.weight", 0},
    {"ln1.bias", "ln_1.bias", "attn_norm.bias", 0},
    {"attn.qkv.weight", "attn.c_attn.weight", "attn_qkv.weight", 1},
    {"attn.qkv.bias", "attn.c_attn.bias", "attn_qkv.bias", 0},
    {"attn.proj.weight", "attn.c_proj.weight", "attn_output.weight", 1},
    {"attn.proj.bias", "attn.c_proj.bias", "attn_output.bias", 0},
    {"ln2.weight", "ln_2.weight", "ffn_norm.weight", 0},
    {"ln2.bias", "ln_2.bias", "ffn_norm.bias", 0},
    {"mlp.fc.weight", "mlp.c_fc.weight", "ffn_up.weight", 1},
    {"mlp.fc.bias", "mlp.c_fc.bias", "ffn_up.bias", 0},
    {"mlp.proj.weight", "mlp.c_proj.weight", "ffn_down.weight", 1},
    {"mlp.proj.bias", "mlp.c_proj.bias", "ffn_down.bias", 0},
};

static const struct {
    const char *ours, *hf, *gguf;
} outer_names[] = {
    {"tok_embed.weight", "wte.weight", "token_embd.weight"},
    {"pos_embed.weight", "wpe.weight", "position_embd.weight"},
    {"final_norm.weight", "ln_f.weight", "output_norm.weight"},
    {"final_norm.bias", "ln_f.bias", "output_norm.bias"},
};

void gpt_name_map_free(gpt_name_map *map)
{
    free(map->tensors);
    free(map->names);
    memset(map, 0, sizeof *map);
}

int gpt_name_map_create(gpt_name_map *out, const gpt_config *c, export_format format, const char *prefix, char *err,
                        size_t err_size)
{
    memset(out, 0, sizeof *out);
    const char *what = format == EXPORT_GGUF ? "llama.cpp's gpt2 architecture" : "Hugging Face's GPT-2";
    if (c->swiglu) return gpt_error(err, err_size, "a SwiGLU MLP cannot be expressed as %s (GELU MLP only)", what);
    if (c->kv_heads != c->heads)
        return gpt_error(err, err_size, "grouped-query attention (%lld key/value heads for %lld heads) cannot be expressed as %s",
                    (long long)c->kv_heads, (long long)c->heads, what);
    gpt_tensor *catalog = NULL;
    int count = 0;
    if (gpt_catalog(c, 0, &catalog, &count)) return gpt_error(err, err_size, "out of memory");
    out->tensors = calloc((size_t)count, sizeof *out->tensors);
    out->names = calloc((size_t)count, sizeof *out->names);
    if (!out->tensors || !out->names) {
        free(catalog);
        gpt_name_map_free(out);
        return gpt_error(err, err_size, "out of memory");
    }
    for (int i = 0; i < count; i++) {
        const char *ours = catalog[i].name + strlen("model/");
        char *source = out->names[i][0], *name = out->names[i][1];
        snprintf(source, CKPT_NAME_MAX + 1, "%s", catalog[i].name);
        int transpose = 0;
        long long layer;
        int offset = 0;
        if (sscanf(ours, "layers.%lld.%n", &layer, &offset) == 1 && offset > 0) {
            for (size_t k = 0; k < sizeof layer_names / sizeof layer_names[0]; k++)
                if (strcmp(ours + offset, layer_names[k].ours) == 0) {
                    if (format == EXPORT_GGUF) snprintf(name, CKPT_NAME_MAX + 1, "blk.%lld.%s", layer, layer_names[k].gguf);
                    else snprintf(name, CKPT_NAME_MAX + 1, "%sh.%lld.%s", prefix, layer, layer_names[k].hf);
                    transpose = format == EXPORT_SAFETENSORS && layer_names[k].hf_transpose;
                }
        } else {
            for (size_t k = 0; k < sizeof outer_names / sizeof outer_names[0]; k++)
                if (strcmp(ours, outer_names[k].ours) == 0) {
                    if (format == EXPORT_GGUF) snprintf(name, CKPT_NAME_MAX + 1, "%s", outer_names[k].gguf);
                    else snprintf(name, CKPT_NAME_MAX + 1, "%s%s", prefix, outer_names[k].hf);
                }
        }
        if (!name[0]) {
            free(catalog);
            gpt_name_map_free(out);
            return gpt_error(err, err_size, "internal: no %s name for %s", what, catalog[i].name);
        }
        out->tensors[i] = (export_tensor){source, name, transpose};
    }
    out->count = count;
    free(catalog);
    return 0;
}

/* -------------------------------------------------------------- config.json */

char *gpt_hf_config_json(const gpt_config *c, tp_dtype dtype)
{
    /* Keys sorted, as transformers writes them. */
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "activation_function", "gelu_new"); /* GELU, tanh approximation */
    cJSON *architectures = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(architectures, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddNumberToObject(o, "attn_pdrop", 0.0);
    /* GPT-2's own vocabulary ends with <|endoftext|>; others name no such token. */
    if (c->vocab == 50257) cJSON_AddNumberToObject(o, "bos_token_id", 50256);
    else cJSON_AddNullToObject(o, "bos_token_id");
    cJSON_AddNumberToObject(o, "embd_pdrop", 0.0);
    if (c->vocab == 50257) cJSON_AddNumberToObject(o, "eos_token_id", 50256);
    else cJSON_AddNullToObject(o, "eos_token_id");
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    cJSON_AddNumberToObject(o, "layer_norm_epsilon", 1e-5);
    cJSON_AddStringToObject(o, "model_type", "gpt2");
    cJSON_AddNumberToObject(o, "n_ctx", (double)c->seq); /* read by llama.cpp's converter */
    cJSON_AddNumberToObject(o, "n_embd", (double)c->dim);
    cJSON_AddNumberToObject(o, "n_head", (double)c->heads);
    if (c->ffn == 4 * c->dim) cJSON_AddNullToObject(o, "n_inner");
    else cJSON_AddNumberToObject(o, "n_inner", (double)c->ffn);
    cJSON_AddNumberToObject(o, "n_layer", (double)c->layers);
    cJSON_AddNumberToObject(o, "n_positions", (double)c->seq);
    cJSON_AddFalseToObject(o, "reorder_and_upcast_attn");
    cJSON_AddNumberToObject(o, "resid_pdrop", 0.0);
    cJSON_AddFalseToObject(o, "scale_attn_by_inverse_layer_idx");
    cJSON_AddTrueToObject(o, "scale_attn_weights");
    cJSON_AddTrueToObject(o, "tie_word_embeddings");
    cJSON_AddStringToObject(o, "torch_dtype", dtype == TP_BF16 ? "bfloat16" : dtype == TP_FP16 ? "float16" : "float32");
    cJSON_AddTrueToObject(o, "use_cache");
    cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}

int gpt_hf_config_parse(const char *json, const char *where, gpt_config *c, char *err, size_t err_size)
{
    memset(c, 0, sizeof *c);
    cJSON *o = cJSON_Parse(json);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return gpt_error(err, err_size, "%s: not a JSON object (damaged or truncated?)", where);
    }
    int status = 0;
    const cJSON *v;
    struct {
        const char *key;
        int64_t *field;
    } sizes[] = {{"n_layer", &c->layers}, {"n_embd", &c->dim}, {"n_head", &c->heads}, {"vocab_size", &c->vocab},
                 {"n_positions", &c->seq}};
    v = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    if (!v)
        status = gpt_error(err, err_size, "%s: model_type is missing (expected gpt2)", where);
    else if (!cJSON_IsString(v) || strcmp(v->valuestring, "gpt2") != 0)
        status = gpt_error(err, err_size, "%s: model_type %s is not gpt2", where,
                      cJSON_IsString(v) ? v->valuestring : "(not a string)");
    /* Within the catalogue's bounds (gpt_config_check says which), so that
     * the conversion to int64 is exact. */
    const double most = (double)GPT_MAX_SIZE;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && !status; i++) {
        v = cJSON_GetObjectItemCaseSensitive(o, sizes[i].key);
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > most || v->valuedouble != floor(v->valuedouble))
            status = gpt_error(err, err_size, "%s: '%s' missing or not an integer in 1..%.0f", where, sizes[i].key, most);
        else *sizes[i].field = (int64_t)v->valuedouble;
    }
    if (!status) {
        v = cJSON_GetObjectItemCaseSensitive(o, "n_inner");
        if (!v || cJSON_IsNull(v)) c->ffn = 4 * c->dim;
        else if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= most && v->valuedouble == floor(v->valuedouble))
            c->ffn = (int64_t)v->valuedouble;
        else status = gpt_error(err, err_size, "%s: 'n_inner' must be null or an integer in 1..%.0f", where, most);
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "activation_function");
    if (!status && v &&
        (!cJSON_IsString(v) || (strcmp(v->valuestring, "gelu_new") != 0 && strcmp(v->valuestring, "gelu_pytorch_tanh") != 0)))
        status = gpt_error(err, err_size, "%s: activation_function %s: tp-train computes GELU's tanh form (gelu_new) only", where,
                      cJSON_IsString(v) ? v->valuestring : "(not a string)");
    v = cJSON_GetObjectItemCaseSensitive(o, "layer_norm_epsilon");
    if (!status && v && (!cJSON_IsNumber(v) || fabs(v->valuedouble - 1e-5) > 1e-12))
        status = gpt_error(err, err_size, "%s: layer_norm_epsilon %g: tp-train's layer norm uses 1e-5", where,
                      cJSON_IsNumber(v) ? v->valuedouble : NAN);
    struct {
        const char *key;
        int required; /* the value tp-train's model has */
    } flags[] = {{"tie_word_embeddings", 1}, {"scale_attn_weights", 1}, {"scale_attn_by_inverse_layer_idx", 0}};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0] && !status; i++) {
        v = cJSON_GetObjectItemCaseSensitive(o, flags[i].key);
        if (v && (!cJSON_IsBool(v) || cJSON_IsTrue(v) != flags[i].required))
            status = gpt_error(err, err_size, "%s: %s must be %s for tp-train's GPT-2", where, flags[i].key,
                          flags[i].required ? "true" : "false");
    }
    cJSON_Delete(o);
    c->kv_heads = c->heads;
    c->dtype = TP_FP32;
    c->vocab_pad_multiple = 1;
    return status;
}

/* ---------------------------------------------------------- GGUF metadata */

struct gpt_gguf_metadata {
    export_kv kvs[24];
    int count;
    char name[256];
    /* Vocabulary from a tokenizer, when given. */
    char **tokens;
    int32_t *token_types;
    int64_t num_tokens;
    char **merges;
    int64_t num_merges;
    char *token_text, *merge_text; /* storage of the strings */
};

void gpt_gguf_metadata_free(gpt_gguf_metadata *m)
{
    if (!m) return;
    free(m->tokens);
    free(m->token_types);
    free(m->merges);
    free(m->token_text);
    free(m->merge_text);
    free(m);
}

/* GPT-2 BPE as llama.cpp's converter writes it: the tokens of vocab.json in
 * id order (missing ids as [PADn], unused), <|...|> tokens as control
 * tokens, and the merges of merges.txt without its #version line. */
static int load_tokenizer(gpt_gguf_metadata *m, const char *dir, int64_t vocab, int32_t *eos, char *err, size_t err_size)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    char *text = NULL;
    if (ckpt_read_text_file(path, &text, NULL))
        return gpt_error(err, err_size, "%s (a tokenizer needs vocab.json and merges.txt)", tp_errmsg());
    cJSON *json = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(json)) {
        cJSON_Delete(json);
        return gpt_error(err, err_size, "%s: not a JSON object of token: id", path);
    }
    m->num_tokens = vocab;
    m->tokens = calloc((size_t)vocab, sizeof *m->tokens);
    m->token_types = calloc((size_t)vocab, sizeof *m->token_types);
    size_t bytes = 0;
    const cJSON *entry;
    cJSON_ArrayForEach(entry, json) bytes += strlen(entry->string) + 1;
    m->token_text = malloc(bytes + (size_t)vocab * 16 + 1);
    int status = !m->tokens || !m->token_types || !m->token_text ? gpt_error(err, err_size, "out of memory") : 0;
    char *at = m->token_text;
    *eos = -1;
    cJSON_ArrayForEach(entry, json)
    {
        if (status) break;
        double id = cJSON_IsNumber(entry) ? entry->valuedouble : -1;
        if (id < 0 || id != floor(id) || id >= (double)vocab) {
            status = gpt_error(err, err_size, "%s: token '%s' has id %g, outside the model's vocabulary of %lld", path,
                          entry->string, id, (long long)vocab);
            break;
        }
        int64_t k = (int64_t)id;
        if (m->tokens[k]) {
            status = gpt_error(err, err_size, "%s: id %lld is given twice", path, (long long)k);
            break;
        }
        strcpy(at, entry->string);
        m->tokens[k] = at;
        at += strlen(at) + 1;
        size_t n = strlen(entry->string);
        int control = n >= 4 && strncmp(entry->string, "<|", 2) == 0 && strcmp(entry->string + n - 2, "|>") == 0;
        m->token_types[k] = control ? 3 : 1; /* CONTROL, NORMAL */
        if (strcmp(entry->string, "<|endoftext|>") == 0) *eos = (int32_t)k;
    }
    cJSON_Delete(json);
    for (int64_t k = 0; k < vocab && !status; k++)
        if (!m->tokens[k]) {
            m->tokens[k] = at;
            at += sprintf(at, "[PAD%lld]", (long long)k) + 1;
            m->token_types[k] = 5; /* UNUSED */
        }
    if (status) return status;
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    int64_t size = 0;
    if (ckpt_read_text_file(path, &m->merge_text, &size))
        return gpt_error(err, err_size, "%s (a tokenizer needs vocab.json and merges.txt)", tp_errmsg());
    int64_t lines = 1;
    for (int64_t i = 0; i < size; i++) lines += m->merge_text[i] == '\n';
    m->merges = calloc((size_t)lines, sizeof *m->merges);
    if (!m->merges) return gpt_error(err, err_size, "out of memory");
    for (char *line = strtok(m->merge_text, "\r\n"); line; line = strtok(NULL, "\r\n")) {
        if (strncmp(line, "#version", 8) == 0 || !*line) continue;
        char *space = strchr(line, ' ');
        if (!space || space == line || !space[1])
            return gpt_error(err, err_size, "%s: merge '%s' is not two tokens separated by a space", path, line);
        m->merges[m->num_merges++] = line;
    }
    return 0;
}

static void kv_u32(gpt_gguf_metadata *m, const char *key, int64_t value)
{
    m->kvs[m->count++] = (export_kv){key, EXPORT_KV_U32, (uint32_t)value, 0, NULL, NULL, NULL, 0};
}

static void kv_string(gpt_gguf_metadata *m, const char *key, const char *value)
{
    m->kvs[m->count++] = (export_kv){key, EXPORT_KV_STRING, 0, 0, value, NULL, NULL, 0};
}

int gpt_gguf_metadata_create(gpt_gguf_metadata **out, const gpt_config *c, const char *name, const char *tokenizer_dir,
                             char *err, size_t err_size)
{
    *out = NULL;
    const int64_t u32_max = 0xFFFFFFFFll;
    if (c->seq > u32_max || c->dim > u32_max || c->ffn > u32_max || c->vocab > u32_max)
        return gpt_error(err, err_size, "the model's sizes do not fit GGUF's 32-bit hyperparameters");
    gpt_gguf_metadata *m = calloc(1, sizeof *m);
    if (!m) return gpt_error(err, err_size, "out of memory");
    snprintf(m->name, sizeof m->name, "%s", name);
    int32_t eos = -1;
    if (tokenizer_dir && load_tokenizer(m, tokenizer_dir, c->vocab, &eos, err, err_size)) {
        gpt_gguf_metadata_free(m);
        return -1;
    }
    /* The keys llama.cpp reads for gpt2, in its types: counts u32, epsilon f32. */
    kv_string(m, "general.architecture", "gpt2");
    kv_string(m, "general.name", m->name);
    kv_u32(m, "gpt2.context_length", c->seq);
    kv_u32(m, "gpt2.embedding_length", c->dim);
    kv_u32(m, "gpt2.feed_forward_length", c->ffn);
    kv_u32(m, "gpt2.block_count", c->layers);
    kv_u32(m, "gpt2.attention.head_count", c->heads);
    m->kvs[m->count++] = (export_kv){"gpt2.attention.layer_norm_epsilon", EXPORT_KV_F32, 0, 1e-5f, NULL, NULL, NULL, 0};
    kv_u32(m, "gpt2.vocab_size", c->vocab);
    if (!tokenizer_dir) {
        kv_string(m, "tokenizer.ggml.model", "no_vocab");
    } else {
        kv_string(m, "tokenizer.ggml.model", "gpt2");
        kv_string(m, "tokenizer.ggml.pre", "gpt-2");
        m->kvs[m->count++] = (export_kv){"tokenizer.ggml.tokens", EXPORT_KV_STRINGS, 0, 0, NULL,
                                         (const char *const *)m->tokens, NULL, m->num_tokens};
        m->kvs[m->count++] = (export_kv){"tokenizer.ggml.token_type", EXPORT_KV_I32S, 0, 0, NULL, NULL,
                                         m->token_types, m->num_tokens};
        m->kvs[m->count++] = (export_kv){"tokenizer.ggml.merges", EXPORT_KV_STRINGS, 0, 0, NULL,
                                         (const char *const *)m->merges, NULL, m->num_merges};
        if (eos >= 0) {
            kv_u32(m, "tokenizer.ggml.bos_token_id", eos);
            kv_u32(m, "tokenizer.ggml.eos_token_id", eos);
        }
    }
    *out = m;
    return 0;
}

const export_kv *gpt_gguf_metadata_kvs(const gpt_gguf_metadata *m, int *count)
{
    *count = m->count;
    return m->kvs;
}
