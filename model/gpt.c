/* gpt_catalog.c: tensor names, shapes and partitions of the GPT model.
 * Weights are [out, in] as in torch.nn.Linear. Column-parallel linears (qkv,
 * mlp.fc) split axis 0 by output rows; row-parallel ones (attn.proj,
 * mlp.proj) split axis 1; the token embedding splits the (padded) vocabulary. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt.h"

int gpt_error(char *err, size_t err_size, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(err, err_size, fmt, args);
    va_end(args);
    return -1;
}

void gpt_config_defaults(gpt_config *c)
{
    if (c->kv_heads == 0) c->kv_heads = c->heads;
    if (c->ffn == 0) c->ffn = 4 * c->dim;
    if (c->vocab_pad_multiple == 0) c->vocab_pad_multiple = 1;
}

int gpt_config_check(const gpt_config *c, int tp, int pp, char *err, size_t err_size)
{
#define FAIL(...) return gpt_error(err, err_size, __VA_ARGS__)
    if (c->layers < 1 || c->dim < 1 || c->heads < 1 || c->kv_heads < 1 || c->vocab < 1 ||
        c->seq < 1 || c->ffn < 1 || c->vocab_pad_multiple < 1)
        FAIL("model shape must be positive: layers=%lld dim=%lld heads=%lld kv_heads=%lld "
             "vocab=%lld seq=%lld ffn=%lld",
             (long long)c->layers, (long long)c->dim, (long long)c->heads, (long long)c->kv_heads,
             (long long)c->vocab, (long long)c->seq, (long long)c->ffn);
    /* Bounds that keep every count and shape product far from overflow (the
     * catalogue counts tensors in an int; shapes multiply in int64). */
    if (c->layers > GPT_MAX_LAYERS)
        FAIL("%lld layers: at most %d are supported", (long long)c->layers, GPT_MAX_LAYERS);
    const int64_t sizes[] = {c->dim, c->heads, c->kv_heads, c->vocab, c->seq, c->ffn, c->vocab_pad_multiple};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i] > GPT_MAX_SIZE)
            FAIL("model dimension %lld exceeds %lld: dim=%lld heads=%lld vocab=%lld seq=%lld ffn=%lld", (long long)sizes[i],
                 (long long)GPT_MAX_SIZE, (long long)c->dim, (long long)c->heads, (long long)c->vocab, (long long)c->seq,
                 (long long)c->ffn);
    if (c->dim % c->heads != 0)
        FAIL("dim %lld is not divisible by heads %lld", (long long)c->dim, (long long)c->heads);
    if (c->heads % c->kv_heads != 0)
        FAIL("heads %lld is not divisible by kv_heads %lld", (long long)c->heads,
             (long long)c->kv_heads);
    if (tp < 1 || pp < 1) FAIL("tp=%d and pp=%d must be >= 1", tp, pp);
    if (c->heads % tp != 0)
        FAIL("heads %lld is not divisible by tp %d", (long long)c->heads, tp);
    if (c->kv_heads % tp != 0)
        FAIL("kv_heads %lld is not divisible by tp %d", (long long)c->kv_heads, tp);
    if (c->ffn % tp != 0) FAIL("ffn %lld is not divisible by tp %d", (long long)c->ffn, tp);
    if (c->layers % pp != 0)
        FAIL("layers %lld is not divisible by pp %d", (long long)c->layers, pp);
    return 0;
#undef FAIL
}

static const char *const role_names[] = {"param", "master", "exp_avg", "exp_avg_sq"};

typedef struct {
    gpt_tensor *items;
    int count;
} catalog_builder;

static gpt_tensor *add(catalog_builder *b, const char *name, tp_dtype dtype, int ndim,
                       int64_t d0, int64_t d1, ckpt_anchor anchor, int64_t layer)
{
    gpt_tensor *t = &b->items[b->count++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "model/%s", name);
    snprintf(t->param, sizeof t->param, "%s", t->name);
    t->role = GPT_ROLE_PARAM;
    t->desc.dtype = dtype;
    t->desc.ndim = ndim;
    t->desc.shape[0] = d0;
    t->desc.shape[1] = ndim > 1 ? d1 : 1;
    t->desc.anchor = anchor;
    t->desc.layer = layer;
    t->init_std = 0.02f;
    t->weight_decay = ndim > 1;
    return t;
}

static void split(gpt_tensor *t, int axis, int64_t granule, int num_segments, const int64_t *segments)
{
    t->desc.partition.kind = CKPT_SPLIT;
    t->desc.partition.axis = axis;
    t->desc.partition.granule = granule;
    t->desc.partition.num_segments = num_segments;
    for (int s = 0; s < num_segments; s++) t->desc.partition.segments[s] = segments[s];
}

static void constant(gpt_tensor *t, float value)
{
    t->init_mean = value;
    t->init_std = 0;
}

int gpt_catalog(const gpt_config *c, int with_optimizer, gpt_tensor **out, int *count)
{
    int per_param = with_optimizer ? (c->dtype == TP_FP32 ? 3 : 4) : 1;
    if (c->layers < 1 || c->layers > GPT_MAX_LAYERS) return -1; /* gpt_config_check says why */
    int params = 4 + 12 * (int)c->layers;
    catalog_builder b = {calloc((size_t)(params * per_param), sizeof(gpt_tensor)), 0};
    if (!b.items) return -1;
    int64_t hd = c->dim / c->heads, q = c->heads * hd, kv = c->kv_heads * hd;
    int64_t fc = c->swiglu ? 2 * c->ffn : c->ffn;
    int64_t qkv_segments[3] = {q, kv, kv}, fc_segments[2] = {c->ffn, c->ffn};
    float residual_std = 0.02f / sqrtf(2.0f * (float)c->layers);
    char name[CKPT_NAME_MAX];
    gpt_tensor *t;

    t = add(&b, "tok_embed.weight", c->dtype, 2, c->vocab, c->dim, CKPT_ANCHOR_FIRST, -1);
    split(t, 0, 1, 1, &c->vocab);
    t->desc.partition.pad_multiple = c->vocab_pad_multiple;
    add(&b, "pos_embed.weight", c->dtype, 2, c->seq, c->dim, CKPT_ANCHOR_FIRST, -1);
    for (int64_t l = 0; l < c->layers; l++) {
#define NAME(suffix) (snprintf(name, sizeof name, "layers.%lld.%s", (long long)l, suffix), name)
        constant(add(&b, NAME("ln1.weight"), c->dtype, 1, c->dim, 1, CKPT_ANCHOR_LAYER, l), 1);
        constant(add(&b, NAME("ln1.bias"), c->dtype, 1, c->dim, 1, CKPT_ANCHOR_LAYER, l), 0);
        t = add(&b, NAME("attn.qkv.weight"), c->dtype, 2, q + 2 * kv, c->dim, CKPT_ANCHOR_LAYER, l);
        split(t, 0, hd, 3, qkv_segments);
        t = add(&b, NAME("attn.qkv.bias"), c->dtype, 1, q + 2 * kv, 1, CKPT_ANCHOR_LAYER, l);
        split(t, 0, hd, 3, qkv_segments);
        constant(t, 0);
        t = add(&b, NAME("attn.proj.weight"), c->dtype, 2, c->dim, q, CKPT_ANCHOR_LAYER, l);
        split(t, 1, hd, 1, &q);
        t->init_std = residual_std;
        constant(add(&b, NAME("attn.proj.bias"), c->dtype, 1, c->dim, 1, CKPT_ANCHOR_LAYER, l), 0);
        constant(add(&b, NAME("ln2.weight"), c->dtype, 1, c->dim, 1, CKPT_ANCHOR_LAYER, l), 1);
        constant(add(&b, NAME("ln2.bias"), c->dtype, 1, c->dim, 1, CKPT_ANCHOR_LAYER, l), 0);
        t = add(&b, NAME("mlp.fc.weight"), c->dtype, 2, fc, c->dim, CKPT_ANCHOR_LAYER, l);
        split(t, 0, 1, c->swiglu ? 2 : 1, c->swiglu ? fc_segments : &fc);
        t = add(&b, NAME("mlp.fc.bias"), c->dtype, 1, fc, 1, CKPT_ANCHOR_LAYER, l);
        split(t, 0, 1, c->swiglu ? 2 : 1, c->swiglu ? fc_segments : &fc);
        constant(t, 0);
        t = add(&b, NAME("mlp.proj.weight"), c->dtype, 2, c->dim, c->ffn, CKPT_ANCHOR_LAYER, l);
        split(t, 1, 1, 1, &c->ffn);
        t->init_std = residual_std;
        constant(add(&b, NAME("mlp.proj.bias"), c->dtype, 1, c->dim, 1, CKPT_ANCHOR_LAYER, l), 0);
#undef NAME
    }
    constant(add(&b, "final_norm.weight", c->dtype, 1, c->dim, 1, CKPT_ANCHOR_LAST, -1), 1);
    constant(add(&b, "final_norm.bias", c->dtype, 1, c->dim, 1, CKPT_ANCHOR_LAST, -1), 0);

    /* Optimizer state: same partition as the parameter, fp32, named by role. */
    for (int p = 0; with_optimizer && p < params; p++) {
        for (gpt_role role = GPT_ROLE_MASTER; role <= GPT_ROLE_EXP_AVG_SQ; role++) {
            if (role == GPT_ROLE_MASTER && c->dtype == TP_FP32) continue;
            gpt_tensor state = b.items[p];
            state.role = role;
            state.desc.dtype = TP_FP32;
            snprintf(state.name, sizeof state.name, "optim/%s/%s", role_names[role], b.items[p].name + strlen("model/"));
            b.items[b.count++] = state;
        }
    }
    for (int i = 0; i < b.count; i++) {
        b.items[i].desc.name = b.items[i].name;
        b.items[i].desc.param = b.items[i].param;
        b.items[i].desc.role = role_names[b.items[i].role];
    }
    *out = b.items;
    *count = b.count;
    return 0;
}

char *gpt_config_to_json(const gpt_config *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "arch", "gpt");
    cJSON_AddNumberToObject(o, "layers", (double)c->layers);
    cJSON_AddNumberToObject(o, "dim", (double)c->dim);
    cJSON_AddNumberToObject(o, "heads", (double)c->heads);
    cJSON_AddNumberToObject(o, "kv_heads", (double)c->kv_heads);
    cJSON_AddNumberToObject(o, "vocab", (double)c->vocab);
    cJSON_AddNumberToObject(o, "seq", (double)c->seq);
    cJSON_AddNumberToObject(o, "ffn", (double)c->ffn);
    cJSON_AddStringToObject(o, "mlp", c->swiglu ? "swiglu" : "gelu");
    cJSON_AddNumberToObject(o, "vocab_pad_multiple", (double)c->vocab_pad_multiple);
    cJSON_AddStringToObject(o, "dtype", tp_dtype_name(c->dtype));
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

int gpt_config_from_json(const char *json, gpt_config *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    cJSON *o = cJSON_Parse(json);
    int status = 0;
    struct {
        const char *key;
        int64_t *field;
    } ints[] = {{"layers", &out->layers}, {"dim", &out->dim},       {"heads", &out->heads},
                {"kv_heads", &out->kv_heads}, {"vocab", &out->vocab}, {"seq", &out->seq},
                {"ffn", &out->ffn}, {"vocab_pad_multiple", &out->vocab_pad_multiple}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !status; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, ints[i].key);
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble != floor(v->valuedouble)) {
            snprintf(err, err_size, "model config: '%s' missing or not a positive integer", ints[i].key);
            status = -1;
        } else {
            *ints[i].field = (int64_t)v->valuedouble;
        }
    }
    const cJSON *mlp = cJSON_GetObjectItemCaseSensitive(o, "mlp");
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(o, "dtype");
    if (!status && (!cJSON_IsString(mlp) || (strcmp(mlp->valuestring, "gelu") != 0 &&
                                             strcmp(mlp->valuestring, "swiglu") != 0))) {
        snprintf(err, err_size, "model config: 'mlp' must be \"gelu\" or \"swiglu\"");
        status = -1;
    }
    if (!status && (!cJSON_IsString(dtype) || tp_dtype_parse(dtype->valuestring, &out->dtype))) {
        snprintf(err, err_size, "model config: 'dtype' must be fp32, bf16 or fp16");
        status = -1;
    }
    if (!status) out->swiglu = strcmp(mlp->valuestring, "swiglu") == 0;
    cJSON_Delete(o);
    return status;
}
