/* interop.c: GPT-2 names, configuration and vocabulary for Hugging Face
 * transformers and llama.cpp, and the export and import recipes built on
 * them (docs/EXPORT.md). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/json.h"
#include "../kernels/kernels.h"
#include "interop.h"

/* Per tensor kind (gpt.h order): Hugging Face name (under "h.{l}." inside
 * the layers), llama.cpp name (under "blk.{l}."), and whether Hugging Face
 * stores it transposed (Conv1D weights are [in, out]; ours and llama.cpp's
 * are [out, in] as torch.nn.Linear). */
static const struct {
    const char *hf, *gguf;
    int hf_transpose;
} names_of[GPT_TENSOR_KINDS] = {
    [GPT_TOK_EMBED] = {"wte.weight", "token_embd.weight", 0},
    [GPT_POS_EMBED] = {"wpe.weight", "position_embd.weight", 0},
    [GPT_LN1_WEIGHT] = {"ln_1.weight", "attn_norm.weight", 0},
    [GPT_LN1_BIAS] = {"ln_1.bias", "attn_norm.bias", 0},
    [GPT_QKV_WEIGHT] = {"attn.c_attn.weight", "attn_qkv.weight", 1},
    [GPT_QKV_BIAS] = {"attn.c_attn.bias", "attn_qkv.bias", 0},
    [GPT_PROJ_WEIGHT] = {"attn.c_proj.weight", "attn_output.weight", 1},
    [GPT_PROJ_BIAS] = {"attn.c_proj.bias", "attn_output.bias", 0},
    [GPT_LN2_WEIGHT] = {"ln_2.weight", "ffn_norm.weight", 0},
    [GPT_LN2_BIAS] = {"ln_2.bias", "ffn_norm.bias", 0},
    [GPT_FC_WEIGHT] = {"mlp.c_fc.weight", "ffn_up.weight", 1},
    [GPT_FC_BIAS] = {"mlp.c_fc.bias", "ffn_up.bias", 0},
    [GPT_FCPROJ_WEIGHT] = {"mlp.c_proj.weight", "ffn_down.weight", 1},
    [GPT_FCPROJ_BIAS] = {"mlp.c_proj.bias", "ffn_down.bias", 0},
    [GPT_FINAL_NORM_WEIGHT] = {"ln_f.weight", "output_norm.weight", 0},
    [GPT_FINAL_NORM_BIAS] = {"ln_f.bias", "output_norm.bias", 0},
};

void gpt_name_map_free(gpt_name_map *map)
{
    free(map->tensors);
    free(map->names);
    free(map->blocks);
    free(map->values);
    memset(map, 0, sizeof *map);
}

/* Llama's names per tensor kind: Hugging Face's (under "model.layers.{l}."
 * inside the layers) and llama.cpp's (under "blk.{l}."); the fused QKV and
 * SwiGLU input have one name per part (parts_of), in row order. */
static const char *const llama_hf[GPT_TENSOR_KINDS][3] = {
    [GPT_TOK_EMBED] = {"model.embed_tokens.weight"},
    [GPT_LN1_WEIGHT] = {"input_layernorm.weight"},
    [GPT_QKV_WEIGHT] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
    [GPT_PROJ_WEIGHT] = {"self_attn.o_proj.weight"},
    [GPT_LN2_WEIGHT] = {"post_attention_layernorm.weight"},
    [GPT_FC_WEIGHT] = {"mlp.gate_proj.weight", "mlp.up_proj.weight"},
    [GPT_FCPROJ_WEIGHT] = {"mlp.down_proj.weight"},
    [GPT_FINAL_NORM_WEIGHT] = {"model.norm.weight"},
    [GPT_OUTPUT_WEIGHT] = {"lm_head.weight"},
};
static const char *const llama_gguf[GPT_TENSOR_KINDS][3] = {
    [GPT_TOK_EMBED] = {"token_embd.weight"},
    [GPT_LN1_WEIGHT] = {"attn_norm.weight"},
    [GPT_QKV_WEIGHT] = {"attn_q.weight", "attn_k.weight", "attn_v.weight"},
    [GPT_PROJ_WEIGHT] = {"attn_output.weight"},
    [GPT_LN2_WEIGHT] = {"ffn_norm.weight"},
    [GPT_FC_WEIGHT] = {"ffn_gate.weight", "ffn_up.weight"},
    [GPT_FCPROJ_WEIGHT] = {"ffn_down.weight"},
    [GPT_FINAL_NORM_WEIGHT] = {"output_norm.weight"},
    [GPT_OUTPUT_WEIGHT] = {"output.weight"},
};

static int parts_of(gpt_tensor_kind kind)
{
    return kind == GPT_QKV_WEIGHT ? 3 : kind == GPT_FC_WEIGHT ? 2 : 1;
}

/* llama.cpp's permutation of a Q or K weight of `heads` heads of hd rows
 * (convert_hf_to_gguf.py LlamaModel.permute: reshape [heads, 2, hd/2, D],
 * swap axes 1 and 2): output row h hd + 2 i + a is input row h hd + a hd/2
 * + i, each input row offset by `first` (the part's first row in the QKV). */
static void gguf_rope_rows(int64_t *blocks, int64_t heads, int64_t hd, int64_t first)
{
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < hd / 2; i++)
            for (int64_t a = 0; a < 2; a++) blocks[h * hd + 2 * i + a] = first + h * hd + a * hd / 2 + i;
}

/* llama.cpp's rope_freqs.weight for Llama 3's scaling, as
 * convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors computes it:
 * per frequency (fp32, as transformers computes it), the divisor llama.cpp
 * applies: 1 for short wavelengths, factor for long ones, and between them
 * 1 / ((1 - smooth) / factor + smooth). */
static void gguf_rope_factors(float *out, const gpt_config *c)
{
    int64_t hd = c->dim / c->heads;
    double original = (double)c->rope_original_seq, factor = c->rope_scaling_factor;
    double low_wavelen = original / c->rope_low_freq_factor, high_wavelen = original / c->rope_high_freq_factor;
    rope_frequencies(out, hd, c->rope_theta, NULL); /* unscaled, as the trainer's */
    for (int64_t j = 0; j < hd / 2; j++) {
        double wavelen = 2 * M_PI / (double)out[j];
        if (wavelen < high_wavelen) out[j] = 1.0f;
        else if (wavelen > low_wavelen) out[j] = (float)factor;
        else {
            double smooth = (original / wavelen - c->rope_low_freq_factor) /
                            (c->rope_high_freq_factor - c->rope_low_freq_factor);
            out[j] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
}

static int llama_name_map(gpt_name_map *out, const gpt_config *c, export_format format)
{
    gpt_tensor *catalog = NULL;
    int count = 0;
    TP_TRY(gpt_catalog(c, 0, &catalog, &count));
    int64_t hd = c->dim / c->heads, q = c->heads * hd, kv = c->kv_heads * hd;
    /* Row blocks: K, V (and up) as one block each; for GGUF, Q and K row by row. */
    int64_t storage = 4 + (format == EXPORT_GGUF ? q + kv : 0);
    out->tensors = calloc((size_t)count * 3, sizeof *out->tensors);
    out->names = calloc((size_t)count * 3, sizeof *out->names);
    out->blocks = calloc((size_t)storage, sizeof *out->blocks);
    if (!out->tensors || !out->names || !out->blocks) {
        free(catalog);
        gpt_name_map_free(out);
        return tp_fail(TP_ERR_NOMEM, "out of memory for %d tensor names", count * 3);
    }
    int64_t *k_block = out->blocks, *v_block = k_block + 1, *up_block = k_block + 2;
    *k_block = q / kv; /* the QKV in blocks of kv rows: Q is q / kv blocks, then K, then V */
    *v_block = q / kv + 1;
    *up_block = 1;
    int64_t *q_rows = out->blocks + 4, *k_rows = q_rows + q;
    if (format == EXPORT_GGUF) {
        gguf_rope_rows(q_rows, c->heads, hd, 0);
        gguf_rope_rows(k_rows, c->kv_heads, hd, q);
    }
    for (int i = 0; i < count; i++) {
        const gpt_tensor *t = &catalog[i];
        for (int part = 0; part < parts_of(t->kind); part++) {
            char *source = out->names[out->count][0], *name = out->names[out->count][1];
            const char *leaf = (format == EXPORT_GGUF ? llama_gguf : llama_hf)[t->kind][part];
            snprintf(source, CKPT_NAME_MAX + 1, "%s", t->name);
            if (t->layer < 0) snprintf(name, CKPT_NAME_MAX + 1, "%s", leaf);
            else if (format == EXPORT_GGUF) snprintf(name, CKPT_NAME_MAX + 1, "blk.%lld.%s", (long long)t->layer, leaf);
            else snprintf(name, CKPT_NAME_MAX + 1, "model.layers.%lld.%s", (long long)t->layer, leaf);
            export_tensor e = {.source = source, .name = name};
            if (t->kind == GPT_QKV_WEIGHT) {
                e.rows = part == 0 ? q : kv;
                if (format == EXPORT_GGUF && part < 2) e.block_rows = 1, e.blocks = part == 0 ? q_rows : k_rows;
                else if (part > 0) e.block_rows = kv, e.blocks = part == 1 ? k_block : v_block;
            } else if (t->kind == GPT_FC_WEIGHT) {
                e.rows = c->ffn;
                if (part == 1) e.block_rows = c->ffn, e.blocks = up_block;
            }
            out->tensors[out->count++] = e;
        }
    }
    free(catalog);
    if (format == EXPORT_GGUF && c->rope_scaling_factor > 0) {
        if (!(out->values = malloc((size_t)(hd / 2) * sizeof(float))))
            return tp_fail(TP_ERR_NOMEM, "out of memory for the rope factors");
        gguf_rope_factors(out->values, c);
        int k = out->count++; /* the arrays hold 3 entries per catalogue tensor: room for this one */
        snprintf(out->names[k][1], CKPT_NAME_MAX + 1, "rope_freqs.weight");
        out->tensors[k] = (export_tensor){.source = "", .name = out->names[k][1], .values = out->values, .num_values = hd / 2};
    }
    return TP_OK;
}

int gpt_name_map_create(gpt_name_map *out, const gpt_config *c, export_format format, const char *prefix)
{
    memset(out, 0, sizeof *out);
    if (c->arch == GPT_ARCH_LLAMA) return llama_name_map(out, c, format);
    const char *what = format == EXPORT_GGUF ? "llama.cpp's gpt2 architecture" : "Hugging Face's GPT-2";
    if (c->swiglu) return tp_fail(TP_ERR_ARG, "a SwiGLU MLP cannot be expressed as %s (GELU MLP only)", what);
    if (c->kv_heads != c->heads)
        return tp_fail(TP_ERR_ARG, "grouped-query attention (%lld key/value heads for %lld heads) cannot be expressed as %s",
                       (long long)c->kv_heads, (long long)c->heads, what);
    gpt_tensor *catalog = NULL;
    int count = 0;
    TP_TRY(gpt_catalog(c, 0, &catalog, &count));
    out->tensors = calloc((size_t)count, sizeof *out->tensors);
    out->names = calloc((size_t)count, sizeof *out->names);
    if (!out->tensors || !out->names) {
        free(catalog);
        gpt_name_map_free(out);
        return tp_fail(TP_ERR_NOMEM, "out of memory for %d tensor names", count);
    }
    for (int i = 0; i < count; i++) {
        const gpt_tensor *t = &catalog[i];
        char *source = out->names[i][0], *name = out->names[i][1];
        snprintf(source, CKPT_NAME_MAX + 1, "%s", t->name);
        if (format == EXPORT_GGUF && t->layer >= 0)
            snprintf(name, CKPT_NAME_MAX + 1, "blk.%lld.%s", (long long)t->layer, names_of[t->kind].gguf);
        else if (format == EXPORT_GGUF)
            snprintf(name, CKPT_NAME_MAX + 1, "%s", names_of[t->kind].gguf);
        else if (t->layer >= 0)
            snprintf(name, CKPT_NAME_MAX + 1, "%sh.%lld.%s", prefix, (long long)t->layer, names_of[t->kind].hf);
        else
            snprintf(name, CKPT_NAME_MAX + 1, "%s%s", prefix, names_of[t->kind].hf);
        int transpose = format == EXPORT_SAFETENSORS && names_of[t->kind].hf_transpose;
        out->tensors[i] = (export_tensor){.source = source, .name = name, .transpose = transpose};
    }
    out->count = count;
    free(catalog);
    return TP_OK;
}

/* -------------------------------------------------------------- config.json */

static const char *hf_dtype_name(tp_dtype dtype)
{
    return dtype == TP_BF16 ? "bfloat16" : dtype == TP_FP16 ? "float16" : "float32";
}

/* config.json of LlamaForCausalLM: keys sorted, as transformers writes them. */
static char *llama_hf_config_json(const gpt_config *c, tp_dtype dtype)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *architectures = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(architectures, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddFalseToObject(o, "attention_bias");
    cJSON_AddNumberToObject(o, "attention_dropout", 0.0);
    cJSON_AddNullToObject(o, "bos_token_id");
    cJSON_AddNullToObject(o, "eos_token_id");
    cJSON_AddNumberToObject(o, "head_dim", (double)(c->dim / c->heads));
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddNumberToObject(o, "hidden_size", (double)c->dim);
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    cJSON_AddNumberToObject(o, "intermediate_size", (double)c->ffn);
    cJSON_AddNumberToObject(o, "max_position_embeddings", (double)c->seq);
    cJSON_AddFalseToObject(o, "mlp_bias");
    cJSON_AddStringToObject(o, "model_type", "llama");
    cJSON_AddNumberToObject(o, "num_attention_heads", (double)c->heads);
    cJSON_AddNumberToObject(o, "num_hidden_layers", (double)c->layers);
    cJSON_AddNumberToObject(o, "num_key_value_heads", (double)c->kv_heads);
    cJSON_AddNumberToObject(o, "pretraining_tp", 1);
    cJSON_AddNumberToObject(o, "rms_norm_eps", c->norm_eps);
    if (c->rope_scaling_factor > 0) {
        cJSON *r = gpt_rope_scaling_json(c, o);
        if (r) cJSON_AddStringToObject(r, "rope_type", "llama3");
    } else {
        cJSON_AddNullToObject(o, "rope_scaling");
    }
    cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", !c->untied_embeddings);
    cJSON_AddStringToObject(o, "torch_dtype", hf_dtype_name(dtype));
    cJSON_AddTrueToObject(o, "use_cache");
    cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}

char *gpt_hf_config_json(const gpt_config *c, tp_dtype dtype)
{
    if (c->arch == GPT_ARCH_LLAMA) return llama_hf_config_json(c, dtype);
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
    cJSON_AddStringToObject(o, "torch_dtype", hf_dtype_name(dtype));
    cJSON_AddTrueToObject(o, "use_cache");
    cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}

/* An integer of config.json in 1..GPT_MAX_SIZE (gpt_config_check's bounds,
 * so that the conversion to int64 is exact); fallback when absent and
 * fallback > 0. */
static int config_int(const cJSON *o, const char *where, const char *key, int64_t fallback, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    const double most = (double)GPT_MAX_SIZE;
    if ((!v || cJSON_IsNull(v)) && fallback > 0) {
        *out = fallback;
        return TP_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > most || v->valuedouble != floor(v->valuedouble))
        return tp_fail(TP_ERR_FORMAT, "%s: '%s' missing or not an integer in 1..%.0f", where, key, most);
    *out = (int64_t)v->valuedouble;
    return TP_OK;
}

/* What a JSON value is, for a message saying it is not what was expected
 * ("1e-5" in quotes read as NaN and was reported as a wrong number). */
static const char *json_kind(const cJSON *v)
{
    return !v ? "missing" : cJSON_IsString(v) ? "a string" : cJSON_IsBool(v) ? "a boolean" : cJSON_IsNull(v) ? "null"
         : cJSON_IsArray(v) ? "an array" : cJSON_IsObject(v) ? "an object" : "a number";
}

static int config_number(const cJSON *o, const char *where, const char *key, double fallback, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v && fallback > 0) {
        *out = fallback;
        return TP_OK;
    }
    if (!cJSON_IsNumber(v))
        return tp_fail(TP_ERR_FORMAT, "%s: '%s' is %s, not a number", where, key, json_kind(v));
    if (!isfinite(v->valuedouble))
        return tp_fail(TP_ERR_FORMAT, "%s: '%s' is not a finite number", where, key);
    *out = v->valuedouble;
    return TP_OK;
}

/* RoPE's settings, as transformers reads them. Version 4 writes
 * rope_theta and rope_scaling (null, or a dict of the type and its keys);
 * version 5 rope_parameters, a dict holding rope_theta too
 * (modeling_rope_utils.py: rope_scaling taken first where both are given,
 * rope_theta from the dict, else the top level, else 10000; the type from
 * rope_type or type, "default" when absent). Of the types, "default" (no
 * scaling) and Llama 3's are computed; the others, and a partial rotary
 * factor, are refused naming the key. */
static int llama_rope_parse(const cJSON *o, const char *where, gpt_config *c)
{
    const char *name = "rope_scaling";
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!r || cJSON_IsNull(r) || (cJSON_IsObject(r) && !r->child)) { /* Python's falsy: None or {} */
        name = "rope_parameters";
        r = cJSON_GetObjectItemCaseSensitive(o, name);
    }
    if (r && cJSON_IsNull(r)) r = NULL;
    if (r && !cJSON_IsObject(r)) return tp_fail(TP_ERR_FORMAT, "%s: %s is %s, not an object", where, name, json_kind(r));
    char inner[CKPT_PATH_MAX + 32]; /* a key inside the dict: "c.json: rope_parameters" */
    snprintf(inner, sizeof inner, "%s: %s", where, name);
    const int theta_inside = r && cJSON_GetObjectItemCaseSensitive(r, "rope_theta");
    TP_TRY(config_number(theta_inside ? r : o, theta_inside ? inner : where, "rope_theta", 10000, &c->rope_theta));
    for (int inside = 0; inside < 2; inside++) {
        const cJSON *partial = cJSON_GetObjectItemCaseSensitive(inside ? r : o, "partial_rotary_factor");
        if (partial && !cJSON_IsNull(partial) && !(cJSON_IsNumber(partial) && partial->valuedouble == 1))
            return tp_fail(TP_ERR_FORMAT, "%s: partial_rotary_factor %s: this Llama rotates every dimension of a head",
                           inside ? inner : where, cJSON_IsNumber(partial) ? "below 1" : json_kind(partial));
        if (!r) break;
    }
    if (!r) return TP_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(r, "rope_type");
    if (!type) type = cJSON_GetObjectItemCaseSensitive(r, "type");
    if (type && !cJSON_IsString(type))
        return tp_fail(TP_ERR_FORMAT, "%s: rope_type is %s, not a string", inner, json_kind(type));
    if (!type || !strcmp(type->valuestring, "default")) return TP_OK;
    if (strcmp(type->valuestring, "llama3"))
        return tp_fail(TP_ERR_FORMAT, "%s: rope_type %s: of the scaled types, Llama 3's (llama3) is computed", inner,
                       type->valuestring);
    TP_TRY(config_number(r, inner, "factor", 0, &c->rope_scaling_factor));
    /* This toolkit's factor 0 means no scaling (gpt_config): a factor 0
     * given was imported unscaled, where -2 was refused. */
    if (!(c->rope_scaling_factor >= 1))
        return tp_fail(TP_ERR_FORMAT, "%s factor %g: expected factor >= 1 (%s null for none)", inner,
                       c->rope_scaling_factor, name);
    TP_TRY(config_number(r, inner, "low_freq_factor", 0, &c->rope_low_freq_factor));
    TP_TRY(config_number(r, inner, "high_freq_factor", 0, &c->rope_high_freq_factor));
    /* The context it was trained at: in the dict; version 5 also takes the
     * top level's, then max_position_embeddings. */
    const char *original = "original_max_position_embeddings";
    const cJSON *holder = cJSON_GetObjectItemCaseSensitive(r, original) ? r : o;
    return config_int(holder, holder == r ? inner : where, original, holder == r ? 0 : c->seq, &c->rope_original_seq);
}

/* LlamaForCausalLM's config.json; what this Llama does not compute is
 * refused, naming the key. */
static int llama_hf_config_parse(const cJSON *o, const char *where, gpt_config *c)
{
    c->arch = GPT_ARCH_LLAMA;
    c->swiglu = 1;
    TP_TRY(config_int(o, where, "num_hidden_layers", 0, &c->layers));
    TP_TRY(config_int(o, where, "hidden_size", 0, &c->dim));
    TP_TRY(config_int(o, where, "num_attention_heads", 0, &c->heads));
    TP_TRY(config_int(o, where, "num_key_value_heads", c->heads, &c->kv_heads));
    TP_TRY(config_int(o, where, "intermediate_size", 0, &c->ffn));
    TP_TRY(config_int(o, where, "vocab_size", 0, &c->vocab));
    TP_TRY(config_int(o, where, "max_position_embeddings", 0, &c->seq));
    TP_TRY(config_number(o, where, "rms_norm_eps", 1e-6, &c->norm_eps)); /* LlamaConfig's defaults */
    TP_TRY(llama_rope_parse(o, where, c));
    int64_t head_dim = 0;
    if (c->dim % c->heads)
        return tp_fail(TP_ERR_FORMAT, "%s: hidden_size %lld is not a multiple of num_attention_heads %lld", where,
                       (long long)c->dim, (long long)c->heads);
    TP_TRY(config_int(o, where, "head_dim", c->dim / c->heads, &head_dim));
    if (head_dim != c->dim / c->heads)
        return tp_fail(TP_ERR_FORMAT, "%s: head_dim %lld: this Llama's heads are hidden_size / num_attention_heads = %lld",
                       where, (long long)head_dim, (long long)(c->dim / c->heads));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "hidden_act");
    /* transformers' ACT2FN names SiLU both ways */
    if (v && (!cJSON_IsString(v) || (strcmp(v->valuestring, "silu") && strcmp(v->valuestring, "swish"))))
        return tp_fail(TP_ERR_FORMAT, "%s: hidden_act %s: Llama's MLP is SwiGLU (silu)", where,
                       cJSON_IsString(v) ? v->valuestring : "(not a string)");
    const char *off[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++) { /* null is no bias too: nn.Linear(bias=None) */
        v = cJSON_GetObjectItemCaseSensitive(o, off[i]);
        if (v && !cJSON_IsFalse(v) && !cJSON_IsNull(v))
            return tp_fail(TP_ERR_FORMAT, "%s: %s must be false: this Llama has no biases", where, off[i]);
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "tie_word_embeddings");
    if (v && !cJSON_IsBool(v)) return tp_fail(TP_ERR_FORMAT, "%s: tie_word_embeddings is not a boolean", where);
    c->untied_embeddings = !cJSON_IsTrue(v); /* LlamaConfig: untied unless said */
    return TP_OK;
}

int gpt_hf_config_parse(const char *json, const char *where, gpt_config *c)
{
    memset(c, 0, sizeof *c);
    cJSON *o = NULL;
    TP_TRY(tp_json_parse(json, strlen(json), where, &o));
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return tp_fail(TP_ERR_FORMAT, "%s: not a JSON object (damaged or truncated?)", where);
    }
    int status = TP_OK;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    if (cJSON_IsString(v) && strcmp(v->valuestring, "llama") == 0) {
        status = llama_hf_config_parse(o, where, c);
        cJSON_Delete(o);
        c->dtype = TP_FP32;
        c->vocab_pad_multiple = 1;
        return status;
    }
    struct {
        const char *key;
        int64_t *field;
    } sizes[] = {{"n_layer", &c->layers}, {"n_embd", &c->dim}, {"n_head", &c->heads}, {"vocab_size", &c->vocab},
                 {"n_positions", &c->seq}};
    if (!v)
        status = tp_fail(TP_ERR_FORMAT, "%s: model_type is missing (expected gpt2 or llama)", where);
    else if (!cJSON_IsString(v) || strcmp(v->valuestring, "gpt2") != 0)
        status = tp_fail(TP_ERR_FORMAT, "%s: model_type %s is not gpt2 or llama", where,
                         cJSON_IsString(v) ? v->valuestring : "(not a string)");
    /* Within the catalogue's bounds (gpt_config_check says which), so that
     * the conversion to int64 is exact. */
    const double most = (double)GPT_MAX_SIZE;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && !status; i++) {
        v = cJSON_GetObjectItemCaseSensitive(o, sizes[i].key);
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > most || v->valuedouble != floor(v->valuedouble))
            status = tp_fail(TP_ERR_FORMAT, "%s: '%s' missing or not an integer in 1..%.0f", where, sizes[i].key, most);
        else *sizes[i].field = (int64_t)v->valuedouble;
    }
    if (!status) {
        v = cJSON_GetObjectItemCaseSensitive(o, "n_inner");
        if (!v || cJSON_IsNull(v)) c->ffn = 4 * c->dim;
        else if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= most && v->valuedouble == floor(v->valuedouble))
            c->ffn = (int64_t)v->valuedouble;
        else status = tp_fail(TP_ERR_FORMAT, "%s: 'n_inner' must be null or an integer in 1..%.0f", where, most);
    }
    /* transformers' three names of GELU's tanh form: gelu_new, gelu_pytorch_tanh
     * and gelu_fast (FastGELUActivation: the same formula, its constant
     * written 0.7978845608). */
    v = cJSON_GetObjectItemCaseSensitive(o, "activation_function");
    if (!status && v &&
        (!cJSON_IsString(v) || (strcmp(v->valuestring, "gelu_new") != 0 && strcmp(v->valuestring, "gelu_pytorch_tanh") != 0 &&
                                strcmp(v->valuestring, "gelu_fast") != 0)))
        status = tp_fail(TP_ERR_FORMAT, "%s: activation_function %s: tp-train computes GELU's tanh form (gelu_new) only",
                         where, cJSON_IsString(v) ? v->valuestring : "(not a string)");
    v = cJSON_GetObjectItemCaseSensitive(o, "layer_norm_epsilon");
    if (!status && v && !cJSON_IsNumber(v))
        status = tp_fail(TP_ERR_FORMAT, "%s: layer_norm_epsilon is %s, not a number (tp-train's layer norm uses 1e-5)",
                         where, json_kind(v));
    else if (!status && v && fabs(v->valuedouble - 1e-5) > 1e-12)
        status = tp_fail(TP_ERR_FORMAT, "%s: layer_norm_epsilon %g: tp-train's layer norm uses 1e-5", where,
                         v->valuedouble);
    struct {
        const char *key;
        int required; /* the value tp-train's model has */
    } flags[] = {{"tie_word_embeddings", 1}, {"scale_attn_weights", 1}, {"scale_attn_by_inverse_layer_idx", 0}};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0] && !status; i++) {
        v = cJSON_GetObjectItemCaseSensitive(o, flags[i].key);
        if (v && (!cJSON_IsBool(v) || cJSON_IsTrue(v) != flags[i].required))
            status = tp_fail(TP_ERR_FORMAT, "%s: %s must be %s for tp-train's GPT-2", where, flags[i].key,
                             flags[i].required ? "true" : "false");
    }
    cJSON_Delete(o);
    c->kv_heads = c->heads;
    c->dtype = TP_FP32;
    c->vocab_pad_multiple = 1;
    return status;
}

/* ---------------------------------------------------------- GGUF metadata */

#define GGUF_TOKEN_NORMAL 1
#define GGUF_TOKEN_CONTROL 3
#define GGUF_TOKEN_UNUSED 5
#define BYTE_VOCAB 256

struct gpt_gguf_metadata {
    export_kv kvs[32];
    int count;
    char *name, size_label[32]; /* name: the caller's, whole (a fixed buffer cut it, mid-character too) */
    /* The vocabulary, when one is written. */
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
    free(m->name);
    free(m->tokens);
    free(m->token_types);
    free(m->merges);
    free(m->token_text);
    free(m->merge_text);
    free(m);
}

void gpt_byte_symbol(int byte, char out[4])
{
    /* GPT-2's bytes_to_unicode: the printable bytes ! .. ~, ¡ .. ¬ and ® .. ÿ
     * stand for themselves; the other 68, in increasing order, for 256, 257, ... */
    int printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF);
    int code = byte;
    if (!printable) {
        code = 256;
        for (int b = 0; b < byte; b++)
            if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) code++;
    }
    if (code < 0x80) {
        out[0] = (char)code;
        out[1] = '\0';
    } else { /* below 0x800: two bytes of UTF-8 */
        out[0] = (char)(0xC0 | (code >> 6));
        out[1] = (char)(0x80 | (code & 0x3F));
        out[2] = '\0';
    }
}

void gpt_size_label(int64_t parameters, char *out, size_t size)
{
    /* As llama.cpp's gguf-py (model_weight_count_rounded_notation, two
     * significant digits at least). */
    double n = (double)parameters, scaled;
    const char *suffix;
    if (n > 1e12) scaled = n * 1e-12, suffix = "T";
    else if (n > 1e9) scaled = n * 1e-9, suffix = "B";
    else if (n > 1e6) scaled = n * 1e-6, suffix = "M";
    else scaled = n * 1e-3, suffix = "K";
    char whole[32];
    snprintf(whole, sizeof whole, "%.0f", nearbyint(scaled)); /* Python's round: half to even */
    const char *digits = whole;
    while (*digits == '0') digits++;
    int fix = 2 - (int)strlen(digits);
    snprintf(out, size, "%.*f%s", fix > 0 ? fix : 0, scaled, suffix);
}

static int tokenizer_missing(void)
{
    char why[2048];
    snprintf(why, sizeof why, "%s", tp_errmsg());
    return tp_fail(TP_ERR_NOT_FOUND, "%s (a tokenizer needs tokenizer.json, or vocab.json and merges.txt)", why);
}

#define GGUF_TOKEN_USER_DEFINED 4

/* Whether the tokenizer directory dir (a local one or a store's URL)
 * holds the file name. */
static int tokenizer_file_exists(const char *dir, const char *name, int *exists)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    const store_ops *store;
    TP_TRY(store_for(path, &store));
    return store_exists(store, path, exists);
}

/* A JSON file of DIR, parsed; NULL in *out when absent and optional. */
static int read_json(const char *dir, const char *name, int optional, cJSON **out)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *out = NULL;
    int exists = 1;
    if (optional) TP_TRY(tokenizer_file_exists(dir, name, &exists));
    if (!exists) return TP_OK;
    char *text = NULL;
    int64_t size = 0;
    if (store_read_text_file(path, CKPT_INDEX_MAX_BYTES, &text, &size)) return tokenizer_missing();
    int status = tp_json_parse(text, (size_t)size, path, out);
    free(text);
    return status;
}

/* The token a tokenizer_config.json entry names ("<s>" or {"content": "<s>"}), or NULL. */
static const char *config_token(const cJSON *config, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* llama.cpp's name of a tokenizer.json's pre-tokenizer where this toolkit
 * knows it (the converter recognises it by hashing its output): Llama 3's
 * split pattern, SmolLM's individual digits before the byte level, GPT-2's
 * plain byte level; else "default", which llama.cpp loads with a warning. */
static const char *pre_tokenizer_name(const cJSON *tokenizer)
{
    static const char llama3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                 "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(tokenizer, "pre_tokenizer");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pre, "type");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "ByteLevel")) return "gpt-2";
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers"), *step;
    int digits = 0;
    cJSON_ArrayForEach(step, steps)
    {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(step, "type");
        const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(step, "pattern"), "Regex");
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "Split") && cJSON_IsString(pattern) &&
            !strcmp(pattern->valuestring, llama3))
            return "llama-bpe";
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "Digits") &&
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(step, "individual_digits")))
            digits = 1;
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "ByteLevel") && digits) return "smollm";
    }
    return "default";
}

/* A Hugging Face tokenizer.json of a BPE model (the tokenizers library's
 * format: Llama 3, SmolLM), as llama.cpp's converter writes it: the tokens
 * of model.vocab and added_tokens in id order (special added tokens
 * control, other added ones user-defined, missing ids [PADn] unused),
 * model.merges as "a b" (strings, or pairs in newer files), and BOS/EOS and
 * add_bos_token from tokenizer_config.json where it names them. */
static int load_hf_tokenizer(gpt_gguf_metadata *m, const char *dir, int64_t vocab, int32_t *bos, int32_t *eos,
                             int *add_bos, const char **pre)
{
    cJSON *json = NULL, *config = NULL;
    TP_TRY(read_json(dir, "tokenizer.json", 0, &json));
    int status = read_json(dir, "tokenizer_config.json", 1, &config);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(json, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *words = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(json, "added_tokens");
    if (!status && (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") || !cJSON_IsObject(words) ||
                    !cJSON_IsArray(merges) || (added && !cJSON_IsArray(added))))
        status = tp_fail(TP_ERR_FORMAT, "%s/tokenizer.json: not a BPE tokenizer (model.type %s, model.vocab, "
                         "model.merges and added_tokens expected)", dir, cJSON_IsString(type) ? type->valuestring : "missing");
    size_t bytes = 0;
    const cJSON *entry;
    if (status) { /* model.vocab may be a list (a Unigram model's), whose entries have no name */
        cJSON_Delete(json);
        cJSON_Delete(config);
        return status;
    }
    cJSON_ArrayForEach(entry, words) bytes += strlen(entry->string) + 1;
    cJSON_ArrayForEach(entry, added)
    {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(entry, "content");
        bytes += cJSON_IsString(content) ? strlen(content->valuestring) + 1 : 0;
    }
    m->num_tokens = vocab;
    m->tokens = calloc((size_t)vocab, sizeof *m->tokens);
    m->token_types = calloc((size_t)vocab, sizeof *m->token_types);
    m->token_text = malloc(bytes + (size_t)vocab * 24 + 1);
    if (!status && (!m->tokens || !m->token_types || !m->token_text))
        status = tp_fail(TP_ERR_NOMEM, "out of memory for %s/tokenizer.json", dir);
    char *at = m->token_text;
    /* The vocabulary, then the added tokens (they may rename ids of it). */
    for (int pass = 0; pass < 2 && !status; pass++) {
        const cJSON *list = pass ? added : words;
        cJSON_ArrayForEach(entry, list)
        {
            const cJSON *id = pass ? cJSON_GetObjectItemCaseSensitive(entry, "id") : entry;
            const cJSON *content = pass ? cJSON_GetObjectItemCaseSensitive(entry, "content") : NULL;
            const char *token = pass ? (cJSON_IsString(content) ? content->valuestring : NULL) : entry->string;
            double k = cJSON_IsNumber(id) ? id->valuedouble : -1;
            if (!cJSON_IsNumber(id)) {
                status = tp_fail(TP_ERR_FORMAT, "%s/tokenizer.json: token '%s' has no numeric id", dir,
                                 token ? token : "(none)");
                break;
            }
            if (!token || k < 0 || k != floor(k) || k >= (double)vocab) {
                status = tp_fail(TP_ERR_FORMAT, "%s/tokenizer.json: token '%s' has id %g, outside the model's vocabulary "
                                 "of %lld", dir, token ? token : "(none)", k, (long long)vocab);
                break;
            }
            if (!pass && m->tokens[(int64_t)k]) {
                status = tp_fail(TP_ERR_FORMAT, "%s/tokenizer.json: id %lld is given twice", dir, (long long)k);
                break;
            }
            strcpy(at, token);
            m->tokens[(int64_t)k] = at;
            at += strlen(at) + 1;
            m->token_types[(int64_t)k] = !pass ? GGUF_TOKEN_NORMAL
                                         : cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(entry, "special"))
                                             ? GGUF_TOKEN_CONTROL
                                             : GGUF_TOKEN_USER_DEFINED;
        }
    }
    for (int64_t k = 0; k < vocab && !status; k++)
        if (!m->tokens[k]) {
            m->tokens[k] = at;
            at += sprintf(at, "[PAD%lld]", (long long)k) + 1;
            m->token_types[k] = GGUF_TOKEN_UNUSED;
        }
    /* Merges: "a b", or ["a", "b"]. */
    bytes = 0;
    cJSON_ArrayForEach(entry, merges)
    {
        if (cJSON_IsString(entry)) bytes += strlen(entry->valuestring) + 1;
        else if (cJSON_GetArraySize(entry) == 2 && cJSON_IsString(cJSON_GetArrayItem(entry, 0)) &&
                 cJSON_IsString(cJSON_GetArrayItem(entry, 1)))
            bytes += strlen(cJSON_GetArrayItem(entry, 0)->valuestring) + strlen(cJSON_GetArrayItem(entry, 1)->valuestring) + 2;
        else if (!status)
            status = tp_fail(TP_ERR_FORMAT, "%s/tokenizer.json: a merge is neither \"a b\" nor a pair of strings", dir);
    }
    if (!status) {
        m->merges = calloc((size_t)cJSON_GetArraySize(merges) + 1, sizeof *m->merges);
        m->merge_text = malloc(bytes + 1);
        if (!m->merges || !m->merge_text) status = tp_fail(TP_ERR_NOMEM, "out of memory for %s/tokenizer.json", dir);
    }
    at = m->merge_text;
    cJSON_ArrayForEach(entry, merges)
    {
        if (status) break;
        if (cJSON_IsString(entry)) strcpy(at, entry->valuestring);
        else sprintf(at, "%s %s", cJSON_GetArrayItem(entry, 0)->valuestring, cJSON_GetArrayItem(entry, 1)->valuestring);
        if (!strchr(at, ' ') || at[0] == ' ') {
            status = tp_fail(TP_ERR_FORMAT, "%s/tokenizer.json: merge '%s' is not two tokens separated by a space", dir, at);
            break;
        }
        m->merges[m->num_merges++] = at;
        at += strlen(at) + 1;
    }
    /* BOS and EOS by name, from tokenizer_config.json. */
    *bos = *eos = -1;
    const char *names[2] = {config_token(config, "bos_token"), config_token(config, "eos_token")};
    for (int64_t k = 0; k < vocab && !status; k++) {
        if (names[0] && !strcmp(m->tokens[k], names[0]) && *bos < 0) *bos = (int32_t)k;
        if (names[1] && !strcmp(m->tokens[k], names[1]) && *eos < 0) *eos = (int32_t)k;
    }
    const cJSON *flag = cJSON_GetObjectItemCaseSensitive(config, "add_bos_token");
    *add_bos = cJSON_IsBool(flag) ? cJSON_IsTrue(flag) : -1;
    *pre = pre_tokenizer_name(json);
    cJSON_Delete(json);
    cJSON_Delete(config);
    return status;
}

/* GPT-2 BPE as llama.cpp's converter writes it: the tokens of vocab.json in
 * id order (missing ids as [PADn], unused), <|...|> tokens as control
 * tokens, and the merges of merges.txt without its #version line. */
static int load_tokenizer(gpt_gguf_metadata *m, const char *dir, int64_t vocab, int32_t *eos)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    char *text = NULL;
    int64_t size = 0;
    if (store_read_text_file(path, CKPT_INDEX_MAX_BYTES, &text, &size)) return tokenizer_missing();
    cJSON *json = NULL;
    int parsed = tp_json_parse(text, (size_t)size, path, &json);
    free(text);
    if (parsed) return parsed;
    if (!cJSON_IsObject(json)) {
        cJSON_Delete(json);
        return tp_fail(TP_ERR_FORMAT, "%s: not a JSON object of token: id", path);
    }
    m->num_tokens = vocab;
    m->tokens = calloc((size_t)vocab, sizeof *m->tokens);
    m->token_types = calloc((size_t)vocab, sizeof *m->token_types);
    size_t bytes = 0;
    const cJSON *entry;
    cJSON_ArrayForEach(entry, json) bytes += strlen(entry->string) + 1;
    m->token_text = malloc(bytes + (size_t)vocab * 16 + 1);
    int status = !m->tokens || !m->token_types || !m->token_text ? tp_fail(TP_ERR_NOMEM, "out of memory for %s", path)
                                                                 : TP_OK;
    char *at = m->token_text;
    *eos = -1;
    cJSON_ArrayForEach(entry, json)
    {
        if (status) break;
        double id = cJSON_IsNumber(entry) ? entry->valuedouble : -1;
        if (id < 0 || id != floor(id) || id >= (double)vocab) {
            status = tp_fail(TP_ERR_FORMAT, "%s: token '%s' has id %g, outside the model's vocabulary of %lld", path,
                             entry->string, id, (long long)vocab);
            break;
        }
        int64_t k = (int64_t)id;
        if (m->tokens[k]) {
            status = tp_fail(TP_ERR_FORMAT, "%s: id %lld is given twice", path, (long long)k);
            break;
        }
        strcpy(at, entry->string);
        m->tokens[k] = at;
        at += strlen(at) + 1;
        size_t n = strlen(entry->string);
        int control = n >= 4 && strncmp(entry->string, "<|", 2) == 0 && strcmp(entry->string + n - 2, "|>") == 0;
        m->token_types[k] = control ? GGUF_TOKEN_CONTROL : GGUF_TOKEN_NORMAL;
        if (strcmp(entry->string, "<|endoftext|>") == 0) *eos = (int32_t)k;
    }
    cJSON_Delete(json);
    for (int64_t k = 0; k < vocab && !status; k++)
        if (!m->tokens[k]) {
            m->tokens[k] = at;
            at += sprintf(at, "[PAD%lld]", (long long)k) + 1;
            m->token_types[k] = GGUF_TOKEN_UNUSED;
        }
    if (status) return status;
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    if (store_read_text_file(path, CKPT_INDEX_MAX_BYTES, &m->merge_text, &size))
        return tokenizer_missing();
    int64_t lines = 1;
    for (int64_t i = 0; i < size; i++) lines += m->merge_text[i] == '\n' || m->merge_text[i] == '\r'; /* as strtok splits */
    m->merges = calloc((size_t)lines, sizeof *m->merges);
    if (!m->merges) return tp_fail(TP_ERR_NOMEM, "out of memory for %s", path);
    for (char *line = strtok(m->merge_text, "\r\n"); line; line = strtok(NULL, "\r\n")) {
        if (strncmp(line, "#version", 8) == 0 || !*line) continue;
        char *space = strchr(line, ' ');
        if (!space || space == line || !space[1])
            return tp_fail(TP_ERR_FORMAT, "%s: merge '%s' is not two tokens separated by a space", path, line);
        m->merges[m->num_merges++] = line;
    }
    return TP_OK;
}

/* The vocabulary of a byte-level model: token b is byte b, written as its
 * symbol of GPT-2's byte-level BPE. With no merges, llama.cpp's gpt2
 * tokenizer turns text into its bytes, as `tp-train prepare` does. */
static int byte_tokenizer(gpt_gguf_metadata *m)
{
    m->num_tokens = BYTE_VOCAB;
    m->tokens = calloc(BYTE_VOCAB, sizeof *m->tokens);
    m->token_types = calloc(BYTE_VOCAB, sizeof *m->token_types);
    m->token_text = malloc(BYTE_VOCAB * 4);
    m->merges = calloc(1, sizeof *m->merges);
    if (!m->tokens || !m->token_types || !m->token_text || !m->merges)
        return tp_fail(TP_ERR_NOMEM, "out of memory for a byte-level vocabulary");
    for (int b = 0; b < BYTE_VOCAB; b++) {
        m->tokens[b] = m->token_text + 4 * b;
        gpt_byte_symbol(b, m->tokens[b]);
        m->token_types[b] = GGUF_TOKEN_NORMAL;
    }
    return TP_OK;
}

static void kv_u32(gpt_gguf_metadata *m, const char *key, int64_t value)
{
    m->kvs[m->count++] = (export_kv){key, EXPORT_KV_U32, (uint32_t)value, 0, NULL, NULL, NULL, 0};
}

static void kv_bool(gpt_gguf_metadata *m, const char *key, int value)
{
    m->kvs[m->count++] = (export_kv){key, EXPORT_KV_BOOL, value != 0, 0, NULL, NULL, NULL, 0};
}

static void kv_string(gpt_gguf_metadata *m, const char *key, const char *value)
{
    m->kvs[m->count++] = (export_kv){key, EXPORT_KV_STRING, 0, 0, value, NULL, NULL, 0};
}

int gpt_gguf_metadata_create(gpt_gguf_metadata **out, const gpt_config *c, const char *name, const char *tokenizer_dir)
{
    *out = NULL;
    const int64_t u32_max = 0xFFFFFFFFll;
    if (c->seq > u32_max || c->dim > u32_max || c->ffn > u32_max || c->vocab > u32_max)
        return tp_fail(TP_ERR_ARG, "the model's sizes do not fit GGUF's 32-bit hyperparameters");
    int64_t parameters = 0;
    TP_TRY(gpt_parameter_count(c, &parameters));
    /* GGUF's strings are UTF-8 (gguf-py decodes them so): a name of other
     * bytes is refused rather than written for readers to fail on. */
    int64_t bad = tp_utf8_invalid_at(name, strlen(name));
    if (bad >= 0)
        return tp_fail(TP_ERR_ARG, "the model name for general.name is not valid UTF-8 (at byte %lld): GGUF strings are "
                       "UTF-8", (long long)bad);
    gpt_gguf_metadata *m = calloc(1, sizeof *m);
    if (!m || !(m->name = strdup(name))) {
        free(m);
        return tp_fail(TP_ERR_NOMEM, "out of memory for GGUF metadata");
    }
    gpt_size_label(parameters, m->size_label, sizeof m->size_label);
    int32_t eos = -1, bos = -1;
    int status = TP_OK, add_bos = -1;
    const char *vocabulary = "no_vocab", *pre = "gpt-2";
    int hf_tokenizer = 0;
    if (tokenizer_dir) status = tokenizer_file_exists(tokenizer_dir, "tokenizer.json", &hf_tokenizer);
    if (status) {
        gpt_gguf_metadata_free(m);
        return status;
    }
    if (hf_tokenizer) {
        status = load_hf_tokenizer(m, tokenizer_dir, c->vocab, &bos, &eos, &add_bos, &pre);
        vocabulary = "gpt2";
    } else if (tokenizer_dir) {
        status = load_tokenizer(m, tokenizer_dir, c->vocab, &eos);
        bos = eos;
        vocabulary = "gpt2";
    } else if (c->vocab == BYTE_VOCAB) {
        status = byte_tokenizer(m);
        vocabulary = "gpt2";
    }
    if (status) {
        gpt_gguf_metadata_free(m);
        return status;
    }
    /* What model listings show, then the keys llama.cpp reads for gpt2 or
     * llama, in its types: counts u32, epsilon and base frequency f32. */
    int llama = c->arch == GPT_ARCH_LLAMA;
    kv_string(m, "general.architecture", llama ? "llama" : "gpt2");
    kv_string(m, "general.type", "model");
    kv_string(m, "general.name", m->name);
    kv_string(m, "general.size_label", m->size_label);
    if (llama) {
        kv_u32(m, "llama.context_length", c->seq);
        kv_u32(m, "llama.embedding_length", c->dim);
        kv_u32(m, "llama.feed_forward_length", c->ffn);
        kv_u32(m, "llama.block_count", c->layers);
        kv_u32(m, "llama.attention.head_count", c->heads);
        kv_u32(m, "llama.attention.head_count_kv", c->kv_heads);
        m->kvs[m->count++] = (export_kv){"llama.rope.freq_base", EXPORT_KV_F32, 0, (float)c->rope_theta, NULL, NULL, NULL, 0};
        m->kvs[m->count++] = (export_kv){"llama.attention.layer_norm_rms_epsilon", EXPORT_KV_F32, 0, (float)c->norm_eps,
                                         NULL, NULL, NULL, 0};
        kv_u32(m, "llama.rope.dimension_count", c->dim / c->heads);
        kv_u32(m, "llama.vocab_size", c->vocab);
    } else {
        kv_u32(m, "gpt2.context_length", c->seq);
        kv_u32(m, "gpt2.embedding_length", c->dim);
        kv_u32(m, "gpt2.feed_forward_length", c->ffn);
        kv_u32(m, "gpt2.block_count", c->layers);
        kv_u32(m, "gpt2.attention.head_count", c->heads);
        m->kvs[m->count++] = (export_kv){"gpt2.attention.layer_norm_epsilon", EXPORT_KV_F32, 0, 1e-5f, NULL, NULL, NULL, 0};
        kv_u32(m, "gpt2.vocab_size", c->vocab);
    }
    kv_string(m, "tokenizer.ggml.model", vocabulary);
    if (m->tokens) {
        kv_string(m, "tokenizer.ggml.pre", pre);
        m->kvs[m->count++] = (export_kv){"tokenizer.ggml.tokens", EXPORT_KV_STRINGS, 0, 0, NULL,
                                         (const char *const *)m->tokens, NULL, m->num_tokens};
        m->kvs[m->count++] = (export_kv){"tokenizer.ggml.token_type", EXPORT_KV_I32S, 0, 0, NULL, NULL,
                                         m->token_types, m->num_tokens};
        m->kvs[m->count++] = (export_kv){"tokenizer.ggml.merges", EXPORT_KV_STRINGS, 0, 0, NULL,
                                         (const char *const *)m->merges, NULL, m->num_merges};
    }
    if (bos >= 0) kv_u32(m, "tokenizer.ggml.bos_token_id", bos);
    if (eos >= 0) kv_u32(m, "tokenizer.ggml.eos_token_id", eos);
    if (add_bos >= 0) kv_bool(m, "tokenizer.ggml.add_bos_token", add_bos);
    if (bos < 0 && eos < 0 && !tokenizer_dir && m->tokens) {
        /* A byte model has no special tokens; llama.cpp wants a BOS and an
         * EOS that exist, so both are byte 0, which text does not hold, and
         * neither is added to what it tokenizes. */
        kv_u32(m, "tokenizer.ggml.bos_token_id", 0);
        kv_u32(m, "tokenizer.ggml.eos_token_id", 0);
        kv_bool(m, "tokenizer.ggml.add_bos_token", 0);
        kv_bool(m, "tokenizer.ggml.add_eos_token", 0);
    }
    *out = m;
    return TP_OK;
}

const export_kv *gpt_gguf_metadata_kvs(const gpt_gguf_metadata *m, int *count)
{
    *count = m->count;
    return m->kvs;
}

/* ----------------------------------------------------------------- export */

struct gpt_export {
    gpt_name_map map;              /* safetensors, GGUF */
    int64_t *qkv_blocks;           /* a Megatron source: its fused QKV's head blocks in [q; k; v] order */
    int64_t *qkv_rows;             /* and its rows for the parts that pick blocks of [q; k; v] (a Llama's K, V) */
    export_tensor *all;            /* hdf5: every parameter under its own name */
    int count;
    gpt_gguf_metadata *gguf;
    char *config_json;
    char step[32], source_layout[64];
    const char *metadata[12];
};

void gpt_export_free(gpt_export *x)
{
    if (!x) return;
    gpt_name_map_free(&x->map);
    free(x->qkv_blocks);
    free(x->qkv_rows);
    free(x->all);
    gpt_gguf_metadata_free(x->gguf);
    cJSON_free(x->config_json);
    free(x);
}

const export_tensor *gpt_export_tensors(const gpt_export *x, int *count)
{
    *count = x->count;
    return x->all ? x->all : x->map.tensors;
}

int gpt_export_create(gpt_export **out, ckpt_reader *r, const gpt_export_request *request, export_options *options)
{
    *out = NULL;
    gpt_export *x = calloc(1, sizeof *x);
    if (!x) return tp_fail(TP_ERR_NOMEM, "out of memory");
    const ckpt_layout *layout = ckpt_reader_saved_layout(r);
    const ckpt_train_state *state = ckpt_reader_state(r);
    snprintf(x->step, sizeof x->step, "%lld", (long long)state->step);
    snprintf(x->source_layout, sizeof x->source_layout, "tp%dpp%d", layout->tp, layout->pp);
    int status = TP_OK;
    if (options->format == EXPORT_HDF5) {
        /* Every parameter under its own name: no model knowledge needed. */
        /* After `format`, the export's mark (formats.h). */
        const char *metadata[] = {"model", state->model_json, "step", x->step, "source_layout", x->source_layout, NULL};
        memcpy(x->metadata, metadata, sizeof metadata);
        x->all = calloc((size_t)ckpt_reader_num_tensors(r) + 1, sizeof *x->all);
        if (!x->all) status = tp_fail(TP_ERR_NOMEM, "out of memory");
        for (int i = 0; !status && i < ckpt_reader_num_tensors(r); i++) {
            const ckpt_tensor_desc *t = ckpt_reader_tensor(r, i);
            if (strcmp(t->role, "param") == 0) x->all[x->count++] = (export_tensor){.source = t->name, .name = t->name};
        }
    } else {
        gpt_config config;
        status = gpt_config_from_json(state->model_json, &config);
        if (!status) status = gpt_config_check(&config, 1, 1);
        if (status) tp_fail_context(status, "%s", ckpt_reader_path(r));
        if (!status) status = gpt_name_map_create(&x->map, &config, options->format, "transformer.");
        if (!status) x->count = x->map.count;
        if (!status && options->format == EXPORT_SAFETENSORS) {
            /* Provenance: the step and the layout of the source. */
            const char *metadata[] = {"tp_toolkit.step", x->step, "tp_toolkit.source_layout", x->source_layout, NULL};
            memcpy(x->metadata, metadata, sizeof metadata);
            x->config_json = gpt_hf_config_json(&config, options->dtype >= 0 ? (tp_dtype)options->dtype : config.dtype);
            if (!x->config_json) status = tp_fail(TP_ERR_NOMEM, "out of memory");
        } else if (!status) {
            const char *name = request->name                  ? request->name
                               : config.arch == GPT_ARCH_LLAMA ? "Llama (tp-toolkit)"
                                                               : "GPT-2 (tp-toolkit)";
            status = gpt_gguf_metadata_create(&x->gguf, &config, name, request->tokenizer_dir);
        }
    }
    if (status) {
        gpt_export_free(x);
        return status;
    }
    options->metadata = x->metadata[0] ? x->metadata : NULL;
    options->config_json = x->config_json;
    if (x->gguf) options->kvs = gpt_gguf_metadata_kvs(x->gguf, &options->num_kvs);
    *out = x;
    return TP_OK;
}

/* ------------------------------------------------------ a Megatron-LM GPT */

/* This model's parameter names and Megatron's canonical ones
 * (formats/megatron.h), by prefix before the layer and leaf after it. */
static const struct {
    const char *ours, *megatron;
} megatron_names[] = {
    {"model/tok_embed.weight", "embedding.word_embeddings.weight"},
    {"model/pos_embed.weight", "embedding.position_embeddings.weight"},
    {"model/final_norm.", "final_norm."},
    {"model/output.weight", "output_layer.weight"},
    {".ln1.", ".input_norm."},
    {".attn.qkv.", ".attention.qkv."},
    {".attn.proj.", ".attention.dense."},
    {".ln2.", ".post_norm."},
    {".mlp.fc.", ".mlp.fc1."},
    {".mlp.proj.", ".mlp.fc2."},
};

int gpt_megatron_name(const char *ours, char *out, size_t size)
{
    for (size_t i = 0; i < sizeof megatron_names / sizeof *megatron_names; i++) {
        const char *at = strstr(ours, megatron_names[i].ours);
        if (!at) continue;
        if (!strncmp(ours, "model/layers.", 13)) /* model/layers.N.<leaf> -> layers.N.<leaf> */
            snprintf(out, size, "%.*s%s%s", (int)(at - ours) - 6, ours + 6, megatron_names[i].megatron,
                     at + strlen(megatron_names[i].ours));
        else
            snprintf(out, size, "%s%s", megatron_names[i].megatron, at + strlen(megatron_names[i].ours));
        return TP_OK;
    }
    return tp_fail(TP_ERR_ARG, "tensor %s has no Megatron-LM counterpart", ours);
}

/* What of a Llama-shaped Megatron GPT (rotary positions, RMSNorm) this Llama cannot compute. */
static const char *megatron_llama_unfit(const megatron_config *c)
{
    if (!c->swiglu) return "a Llama-shaped model (rotary positions, RMSNorm) without a SwiGLU MLP";
    if (c->has_bias) return "biased linears beside rotary positions and RMSNorm";
    if (c->rotary_interleaved) return "interleaved rotary embeddings (rotary_interleaved)";
    if (c->rotary_percent != 1.0) return "rotary embeddings on part of each head (rotary_percent below 1)";
    if (c->qk_layernorm) return "norms of the queries and keys (qk_layernorm)";
    if (c->post_layernorm_residual) return "the residual taken after the norm";
    if (c->kv_channels * c->heads != c->hidden) return "kv_channels x heads other than the hidden size";
    return NULL;
}

const char *gpt_megatron_unfit(const megatron_config *c)
{
    if (!c->learned_positions && c->rmsnorm) return megatron_llama_unfit(c);
    if (c->swiglu) return "a SwiGLU MLP";
    if (c->query_groups != c->heads) return "grouped-query attention";
    if (!c->learned_positions) return "no learned position embeddings (rotary?)";
    if (c->rmsnorm) return "RMSNorm";
    if (!c->has_bias) return "linears without biases";
    if (c->untied) return "untied output embeddings";
    if (c->post_layernorm_residual) return "the residual taken after the layer norm";
    if (c->kv_channels * c->heads != c->hidden) return "kv_channels x heads other than the hidden size";
    if (c->norm_epsilon != 1e-5) return "a layer-norm epsilon other than 1e-5";
    return NULL;
}

/* A map tensor of [q; k; v] rows taken from Megatron's fused QKV instead,
 * whose rows per group g are [q of its heads, k_g, v_g] (blocks of hd rows;
 * ours_to_megatron[i]: the Megatron block of our block i). A tensor taking
 * all of [q; k; v] or its first rows reads Megatron's blocks in our order;
 * one that picks blocks of [q; k; v] itself (a Llama's K or V, or GGUF's
 * rows in llama.cpp's rotary order) reads row by row, at rows (room for
 * its rows). */
static void megatron_qkv_rows(export_tensor *t, const int64_t *ours_to_megatron, int64_t hd, int64_t *rows)
{
    if (!t->blocks) {
        t->block_rows = hd;
        t->blocks = ours_to_megatron;
        return;
    }
    for (int64_t j = 0; j < t->rows; j++) {
        int64_t ours = t->blocks[j / t->block_rows] * t->block_rows + j % t->block_rows;
        rows[j] = ours_to_megatron[ours / hd] * hd + ours % hd;
    }
    t->block_rows = 1;
    t->blocks = rows;
}

int gpt_export_create_megatron(gpt_export **out, ckpt_reader *r, const megatron_config *c, const gpt_export_request *request,
                               export_options *options)
{
    if (options->format == EXPORT_HDF5) return gpt_export_create(out, r, request, options);
    *out = NULL;
    gpt_config config = gpt_megatron_model(c);
    config.vocab_pad_multiple = 1; /* the export's tables: its vocab rows */
    int llama = config.arch == GPT_ARCH_LLAMA;
    const char *what = options->format == EXPORT_GGUF ? llama ? "llama.cpp's llama architecture" : "llama.cpp's gpt2 architecture"
                       : llama                         ? "Hugging Face's Llama"
                                                       : "Hugging Face's GPT-2";
    const char *unfit = gpt_megatron_unfit(c);
    if (unfit) return tp_fail(TP_ERR_ARG, "%s: %s cannot be expressed as %s", ckpt_reader_path(r), unfit, what);
    gpt_export *x = calloc(1, sizeof *x);
    if (!x) return tp_fail(TP_ERR_NOMEM, "out of memory");
    snprintf(x->step, sizeof x->step, "%lld", (long long)ckpt_reader_state(r)->step);
    snprintf(x->source_layout, sizeof x->source_layout, "megatron tp%dpp%d", c->tp, c->pp);
    int status = gpt_name_map_create(&x->map, &config, options->format, "transformer.");
    /* Megatron's QKV rows per group g: [q of its heads, k_g, v_g], blocks
     * of kv_channels rows; the output wants every q, then every k, every v. */
    int64_t per_group = c->heads / c->query_groups, blocks = c->heads + 2 * c->query_groups;
    int64_t hd = c->kv_channels, picked_rows = 0;
    for (int i = 0; !status && i < x->map.count; i++)
        if (x->map.tensors[i].blocks) picked_rows += x->map.tensors[i].rows;
    if (!status && (!(x->qkv_blocks = calloc((size_t)blocks, sizeof *x->qkv_blocks)) ||
                    !(x->qkv_rows = calloc((size_t)picked_rows + 1, sizeof *x->qkv_rows))))
        status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; !status && i < c->heads; i++) x->qkv_blocks[i] = i / per_group * (per_group + 2) + i % per_group;
    for (int64_t g = 0; !status && g < c->query_groups; g++) {
        x->qkv_blocks[c->heads + g] = g * (per_group + 2) + per_group;
        x->qkv_blocks[c->heads + c->query_groups + g] = g * (per_group + 2) + per_group + 1;
    }
    x->count = x->map.count;
    int64_t *rows = x->qkv_rows;
    for (int i = 0; !status && i < x->map.count; i++) {
        export_tensor *t = &x->map.tensors[i];
        if (t->values) continue; /* computed here (GGUF's rope_freqs) */
        char name[CKPT_NAME_MAX + 1];
        status = gpt_megatron_name(t->source, name, sizeof name);
        if (!status && strstr(name, ".attention.qkv.")) {
            int picks = t->blocks != NULL;
            megatron_qkv_rows(t, x->qkv_blocks, hd, rows);
            if (picks) rows += t->rows;
        }
        if (!status && (!strcmp(name, "embedding.word_embeddings.weight") || !strcmp(name, "output_layer.weight")))
            t->rows = config.vocab;
        if (!status) snprintf(x->map.names[i][0], CKPT_NAME_MAX + 1, "%s", name);
    }
    if (!status && options->format == EXPORT_SAFETENSORS) {
        const char *metadata[] = {"tp_toolkit.step", x->step, "tp_toolkit.source_layout", x->source_layout, NULL};
        memcpy(x->metadata, metadata, sizeof metadata);
        char *json = gpt_hf_config_json(&config, options->dtype >= 0 ? (tp_dtype)options->dtype : config.dtype);
        cJSON *o = json ? cJSON_Parse(json) : NULL;
        cJSON_free(json);
        /* A Megatron GPT's GELU is the exact one unless openai_gelu. */
        if (o && !llama)
            cJSON_ReplaceItemInObject(o, "activation_function", cJSON_CreateString(c->openai_gelu ? "gelu_new" : "gelu"));
        x->config_json = o ? cJSON_Print(o) : NULL;
        cJSON_Delete(o);
        if (!x->config_json) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    } else if (!status) {
        const char *name = llama ? "Megatron-LM Llama (tp-toolkit)" : "Megatron-LM GPT (tp-toolkit)";
        status = gpt_gguf_metadata_create(&x->gguf, &config, request->name ? request->name : name, request->tokenizer_dir);
    }
    if (status) {
        gpt_export_free(x);
        return status;
    }
    options->metadata = x->metadata[0] ? x->metadata : NULL;
    options->config_json = x->config_json;
    if (x->gguf) options->kvs = gpt_gguf_metadata_kvs(x->gguf, &options->num_kvs);
    *out = x;
    return TP_OK;
}

/* ----------------------------------------------------------------- import */

struct gpt_import {
    char dir[4096];
    gpt_config config;
    ckpt_layout layout;
    safetensors_set *set;
    gpt_name_map map;
    export_tensor *sources;  /* per catalogue tensor: its outside tensor, or (Llama) its stacked parts */
    const char *(*parts)[3];
    ckpt_tensor_desc *descs; /* the catalogue's, at the requested dtype */
    gpt_tensor *catalog;
    int count;
    int64_t bytes;
};

void gpt_import_close(gpt_import *im)
{
    if (!im) return;
    safetensors_close(im->set);
    gpt_name_map_free(&im->map);
    free(im->sources);
    free(im->parts);
    free(im->descs);
    free(im->catalog);
    free(im);
}

int gpt_import_count(const gpt_import *im)
{
    return im->count;
}

int64_t gpt_import_bytes(const gpt_import *im)
{
    return im->bytes;
}

const char *gpt_import_warning(const gpt_import *im)
{
    return safetensors_warning(im->set);
}

/* Entries of a GPT-2 file that are not parameters of the model: attention
 * masks older transformers saved as buffers. */
static int attention_mask(const char *name, const char *prefix, int64_t layers)
{
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0) return 0;
    long long layer = -1;
    int end = 0;
    int mask = sscanf(name + n, "h.%lld.attn.bias%n", &layer, &end) == 1 && end > 0 && name[n + (size_t)end] == '\0';
    end = 0;
    mask = mask || (sscanf(name + n, "h.%lld.attn.masked_bias%n", &layer, &end) == 1 && end > 0 &&
                    name[n + (size_t)end] == '\0');
    return mask && layer >= 0 && layer < layers;
}

/* Older transformers saved each Llama layer's rotary inverse frequencies
 * (model.layers.N.self_attn.rotary_emb.inv_freq): a buffer, not a parameter. */
static int rotary_buffer(const char *name, int64_t layers)
{
    long long layer = -1;
    int end = 0;
    return sscanf(name, "model.layers.%lld.self_attn.rotary_emb.inv_freq%n", &layer, &end) == 1 && end > 0 &&
           name[end] == '\0' && layer >= 0 && layer < layers;
}

/* Every entry of the files is a parameter, a mask or a tied output head. */
static int check_entries(gpt_import *im, const char *prefix)
{
    int llama = im->config.arch == GPT_ARCH_LLAMA;
    for (int i = 0; i < safetensors_count(im->set); i++) {
        const char *name = safetensors_tensor(im->set, i)->name;
        int known = llama ? rotary_buffer(name, im->config.layers) : attention_mask(name, prefix, im->config.layers);
        for (int k = 0; k < im->map.count && !known; k++) known = strcmp(im->map.tensors[k].name, name) == 0;
        if (!known && strcmp(name, "lm_head.weight") == 0) {
            /* Tied to the token embedding, or not GPT-2 as tp-train computes it. */
            char wte[64];
            snprintf(wte, sizeof wte, "%s", llama ? "model.embed_tokens.weight" : "");
            if (!llama) snprintf(wte, sizeof wte, "%swte.weight", prefix);
            /* The head without the embedding it is tied to: the name
             * safetensors' save_model keeps of two shared tensors (the first
             * in sorted order). Said as what is missing, with the file: it
             * was "no tensor model.embed_tokens.weight", or for a GPT-2
             * every other tensor "unexpected". */
            if (!safetensors_find(im->set, wte))
                return tp_fail(TP_ERR_FORMAT, "%s: tensor %s is missing, and lm_head.weight, which a tied model "
                               "shares with it, is there: the embedding must be stored under %s",
                               safetensors_tensor(im->set, i)->file, wte, wte);
            int equal = 0;
            TP_TRY(safetensors_equal(im->set, name, wte, &equal));
            /* A Llama reaches here only when config.json says the head is
             * tied: this Llama has untied heads too, so what is wrong is
             * the config or the file, not the model (the GPT-2's message,
             * "cannot be expressed", sent users after a limit that is
             * not there). */
            if (!equal && llama)
                return tp_fail(TP_ERR_FORMAT, "%s: lm_head.weight differs from %s, but config.json says "
                               "tie_word_embeddings true (the head is the embedding); an untied Llama's config.json "
                               "says tie_word_embeddings false", im->dir, wte);
            if (!equal)
                return tp_fail(TP_ERR_FORMAT, "%s: lm_head.weight differs from %s: an untied output head cannot be expressed",
                               im->dir, wte);
            known = 1;
        }
        if (!known)
            return tp_fail(TP_ERR_FORMAT, "%s: unexpected tensor %s (not a parameter of %s with %lld layers)",
                           safetensors_tensor(im->set, i)->file, name, llama ? "this Llama" : "GPT-2",
                           (long long)im->config.layers);
    }
    return TP_OK;
}

/* Per catalogue tensor, what the import reads: the name map's entries of
 * its source, one outside tensor or (Llama's fused QKV and SwiGLU input)
 * its parts stacked in row order. */
static int import_sources(gpt_import *im)
{
    im->sources = calloc((size_t)im->count + 1, sizeof *im->sources);
    im->parts = calloc((size_t)im->count + 1, sizeof *im->parts);
    if (!im->sources || !im->parts) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int i = 0; i < im->count; i++) {
        int n = 0;
        for (; k < im->map.count && !strcmp(im->map.tensors[k].source, im->catalog[i].name); k++) {
            if (n == 3) return tp_fail(TP_ERR_STATE, "internal: %s has more than 3 outside parts", im->catalog[i].name);
            im->parts[i][n++] = im->map.tensors[k].name;
        }
        if (n == 0) return tp_fail(TP_ERR_STATE, "internal: %s has no outside name", im->catalog[i].name);
        im->sources[i] = (export_tensor){.source = im->catalog[i].name, .name = im->parts[i][0],
                                         .transpose = im->map.tensors[k - 1].transpose};
        if (n > 1) im->sources[i].parts = im->parts[i], im->sources[i].num_parts = n;
    }
    if (k != im->map.count) return tp_fail(TP_ERR_STATE, "internal: %d names for %d tensors", im->map.count, im->count);
    return TP_OK;
}

int gpt_import_open(gpt_import **out, const char *dir, const gpt_import_request *request)
{
    *out = NULL;
    gpt_import *im = calloc(1, sizeof *im);
    if (!im) return tp_fail(TP_ERR_NOMEM, "out of memory");
    snprintf(im->dir, sizeof im->dir, "%s", dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = NULL;
    int status = store_read_text_file(path, CKPT_CONFIG_MAX_BYTES, &text, NULL);
    if (status) {
        char why[2048];
        snprintf(why, sizeof why, "%s", tp_errmsg());
        tp_fail(status, "%s (import reads a Hugging Face GPT-2 or Llama directory)", why);
    }
    if (!status) status = gpt_hf_config_parse(text, path, &im->config);
    free(text);
    im->config.dtype = request->dtype;
    im->config.vocab_pad_multiple = request->vocab_pad_multiple;
    if (!status) {
        status = gpt_config_check(&im->config, request->tp, request->pp);
        if (status) tp_fail_context(status, "%s", path);
    }
    if (!status) status = safetensors_open(&im->set, dir);
    /* Every layer has tensors of its own: a config.json naming more layers
     * than the files hold tensors is refused before the catalogue of its
     * tensors is built (100,000 layers took 2 GB to find that out). */
    if (!status && im->config.layers > safetensors_count(im->set))
        status = tp_fail(TP_ERR_FORMAT, "%s: %lld layers, but the safetensors files in %s hold %d tensors in all", path,
                         (long long)im->config.layers, dir, safetensors_count(im->set));
    /* GPT2LMHeadModel saves under "transformer.", GPT2Model (and the hub's gpt2) without; told by
     * either table (the token table may be stored as the tied lm_head.weight alone, which
     * check_entries says: with the token table alone asked, every other tensor was "unexpected"). */
    const char *prefix = !status && (safetensors_find(im->set, "transformer.wte.weight") ||
                                     safetensors_find(im->set, "transformer.wpe.weight"))
                             ? "transformer."
                             : "";
    if (!status) status = gpt_name_map_create(&im->map, &im->config, EXPORT_SAFETENSORS, prefix);
    if (!status) status = gpt_catalog(&im->config, 0, &im->catalog, &im->count);
    if (!status) status = import_sources(im);
    if (!status) status = check_entries(im, prefix);
    if (!status && !(im->descs = calloc((size_t)im->count + 1, sizeof *im->descs)))
        status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; !status && i < im->count; i++) {
        im->descs[i] = im->catalog[i].desc;
        im->bytes += ckpt_padded_bytes(&im->descs[i], request->tp);
    }
    im->layout = (ckpt_layout){request->tp, request->pp, 1, im->config.layers, 1};
    if (status) {
        gpt_import_close(im);
        return status;
    }
    *out = im;
    return TP_OK;
}

int gpt_import_run(gpt_import *im, const import_options *options, const char *out_path)
{
    char *model_json = gpt_config_to_json(&im->config), user[4400];
    cJSON *source = cJSON_CreateString(im->dir);
    char *quoted = cJSON_PrintUnformatted(source);
    snprintf(user, sizeof user, "{\"imported_from\":%s,\"format\":\"huggingface-%s\"}", quoted ? quoted : "\"\"",
             im->config.arch == GPT_ARCH_LLAMA ? "llama" : "gpt2");
    cJSON_free(quoted);
    cJSON_Delete(source);
    int status = model_json ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    ckpt_train_state state = {0, 0, model_json, NULL, NULL, user};
    /* The sizes config.json gave, in its own keys: a tensor of the wrong
     * shape may be a config that says another model. */
    const gpt_config *c = &im->config;
    char shapes_from[400];
    if (c->arch == GPT_ARCH_LLAMA)
        snprintf(shapes_from, sizeof shapes_from, "config.json: hidden_size %lld, num_attention_heads %lld, "
                 "num_key_value_heads %lld (heads of %lld), intermediate_size %lld, vocab_size %lld", (long long)c->dim,
                 (long long)c->heads, (long long)c->kv_heads, (long long)(c->dim / c->heads), (long long)c->ffn,
                 (long long)c->vocab);
    else
        snprintf(shapes_from, sizeof shapes_from, "config.json: n_embd %lld, n_head %lld, n_inner %lld, n_positions "
                 "%lld, vocab_size %lld", (long long)c->dim, (long long)c->heads, (long long)c->ffn,
                 (long long)c->seq, (long long)c->vocab);
    import_options with_config = *options;
    with_config.shapes_from = shapes_from;
    if (!status)
        status = import_run(im->set, im->descs, im->sources, im->count, &im->layout, &state, &with_config, out_path);
    cJSON_free(model_json);
    return status;
}
