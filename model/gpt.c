/* gpt.c: configuration, options and catalogue of the GPT model.
 * Weights are [out, in] as in torch.nn.Linear. Column-parallel linears (qkv,
 * mlp.fc) split axis 0 by output rows; row-parallel ones (attn.proj,
 * mlp.proj) split axis 1; the token embedding splits the (padded) vocabulary. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/parse.h"
#include "gpt.h"

const char *gpt_arch_name(gpt_arch arch)
{
    return arch == GPT_ARCH_LLAMA ? "llama" : "gpt";
}

void gpt_config_defaults(gpt_config *c)
{
    if (c->kv_heads == 0) c->kv_heads = c->heads;
    if (c->vocab_pad_multiple == 0) c->vocab_pad_multiple = 1;
    if (c->arch != GPT_ARCH_LLAMA) {
        if (c->ffn == 0) c->ffn = 4 * c->dim;
        return;
    }
    c->swiglu = 1;
    if (c->ffn == 0) c->ffn = (8 * c->dim / 3 + 255) / 256 * 256;
    if (c->norm_eps == 0) c->norm_eps = GPT_LLAMA_DEFAULT_EPS;
    if (c->rope_theta == 0) c->rope_theta = GPT_LLAMA_DEFAULT_THETA;
    if (c->rope_scaling_factor > 0) {
        if (c->rope_low_freq_factor == 0) c->rope_low_freq_factor = 1;
        if (c->rope_high_freq_factor == 0) c->rope_high_freq_factor = 4;
        if (c->rope_original_seq == 0) c->rope_original_seq = 8192;
    }
}

/* Llama's fields: finite, positive where they must be; none in a GPT. */
static int check_arch(const gpt_config *c)
{
    if (c->arch != GPT_ARCH_LLAMA) {
        if (c->untied_embeddings || c->norm_eps || c->rope_theta || c->rope_scaling_factor)
            return tp_fail(TP_ERR_ARG, "GPT-2 ties its embeddings and has no RMSNorm epsilon or rotary embeddings "
                                       "(--arch llama has them)");
        return TP_OK;
    }
    if (!c->swiglu) return tp_fail(TP_ERR_ARG, "a Llama model has a SwiGLU MLP");
    if (c->dim / c->heads % 2)
        return tp_fail(TP_ERR_ARG, "rotary embeddings need an even head dimension: dim %lld / heads %lld = %lld",
                       (long long)c->dim, (long long)c->heads, (long long)(c->dim / c->heads));
    if (!(c->norm_eps > 0 && c->norm_eps < 1))
        return tp_fail(TP_ERR_ARG, "RMSNorm epsilon %g: expected a number in (0, 1)", c->norm_eps);
    if (!(c->rope_theta > 1 && c->rope_theta < 1e12))
        return tp_fail(TP_ERR_ARG, "rope theta %g: expected a number in (1, 1e12)", c->rope_theta);
    if (c->rope_scaling_factor != 0 &&
        !(c->rope_scaling_factor >= 1 && c->rope_scaling_factor < 1e6 && c->rope_low_freq_factor > 0 &&
          c->rope_high_freq_factor > c->rope_low_freq_factor && c->rope_high_freq_factor < 1e6 &&
          c->rope_original_seq >= 1 && c->rope_original_seq <= GPT_MAX_SIZE))
        return tp_fail(TP_ERR_ARG,
                       "rope scaling factor %g, low %g, high %g, original length %lld: expected factor >= 1, "
                       "0 < low < high, original >= 1",
                       c->rope_scaling_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                       (long long)c->rope_original_seq);
    return TP_OK;
}

static int same_model(const gpt_config *a, const gpt_config *b)
{
    return a->arch == b->arch && a->layers == b->layers && a->dim == b->dim && a->heads == b->heads &&
           a->kv_heads == b->kv_heads && a->vocab == b->vocab && a->seq == b->seq && a->ffn == b->ffn &&
           a->swiglu == b->swiglu && a->untied_embeddings == b->untied_embeddings && a->norm_eps == b->norm_eps &&
           a->rope_theta == b->rope_theta && a->rope_scaling_factor == b->rope_scaling_factor &&
           a->rope_low_freq_factor == b->rope_low_freq_factor && a->rope_high_freq_factor == b->rope_high_freq_factor &&
           a->rope_original_seq == b->rope_original_seq;
}

/* Appends to text (of size bytes, n used so far), cut short at its end. */
static void append(char *text, size_t *n, size_t size, const char *format, ...)
{
    if (*n + 1 >= size) return;
    va_list args;
    va_start(args, format);
    int written = vsnprintf(text + *n, size - *n, format, args);
    va_end(args);
    if (written > 0) *n = *n + (size_t)written < size ? *n + (size_t)written : size - 1;
}

/* v as the shortest %g that reads back as v: two settings that differ never
 * print alike (%g's six digits said "norm_eps 1e-05" for 1e-5 and for
 * 1.0000001e-5), and the usual ones print as given ("1e-05", "500000"). */
static void exact_number(double v, char *out, size_t size)
{
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(out, size, "%.*g", digits, v);
        if (strtod(out, NULL) == v) return;
    }
}

/* The settings beyond the six sizes that same_model compares, said for one
 * side (c) where the two sides differ, so that a refusal never reads the same
 * on both: " kv_heads 2 untied embeddings ...". */
static void describe_difference(const gpt_config *c, const gpt_config *other, char *text, size_t size)
{
    size_t n = 0;
    text[0] = '\0';
    if (c->arch != other->arch) append(text, &n, size, " arch %s", gpt_arch_name(c->arch));
    if (c->kv_heads != other->kv_heads) append(text, &n, size, " kv_heads %lld", (long long)c->kv_heads);
    if (c->swiglu != other->swiglu) append(text, &n, size, " mlp %s", c->swiglu ? "swiglu" : "gelu");
    if (c->untied_embeddings != other->untied_embeddings)
        append(text, &n, size, " %s embeddings", c->untied_embeddings ? "untied" : "tied");
    char a[32], b[32], d[32];
    exact_number(c->norm_eps, a, sizeof a);
    if (c->norm_eps != other->norm_eps) append(text, &n, size, " norm_eps %s", a);
    exact_number(c->rope_theta, a, sizeof a);
    if (c->rope_theta != other->rope_theta) append(text, &n, size, " rope_theta %s", a);
    if (c->rope_scaling_factor != other->rope_scaling_factor ||
        c->rope_low_freq_factor != other->rope_low_freq_factor ||
        c->rope_high_freq_factor != other->rope_high_freq_factor || c->rope_original_seq != other->rope_original_seq) {
        exact_number(c->rope_scaling_factor, a, sizeof a);
        exact_number(c->rope_low_freq_factor, b, sizeof b);
        exact_number(c->rope_high_freq_factor, d, sizeof d);
        if (c->rope_scaling_factor == 0) append(text, &n, size, " rope_scaling none");
        else append(text, &n, size, " rope_scaling %s,%s,%s,%lld", a, b, d, (long long)c->rope_original_seq);
    }
}

int gpt_config_check_same(const char *path, const gpt_config *saved, const gpt_config *run)
{
    if (same_model(saved, run)) return TP_OK;
    char extra_saved[256], extra_run[256];
    describe_difference(saved, run, extra_saved, sizeof extra_saved);
    describe_difference(run, saved, extra_run, sizeof extra_run);
    return tp_fail(TP_ERR_ARG,
                   "%s holds another model: layers %lld dim %lld heads %lld ffn %lld vocab %lld seq %lld%s, this run "
                   "has layers %lld dim %lld heads %lld ffn %lld vocab %lld seq %lld%s: resume with the model flags it "
                   "was trained with (tp-ckpt info %s shows them), or give another --ckpt-dir for a new model",
                   path, (long long)saved->layers, (long long)saved->dim, (long long)saved->heads,
                   (long long)saved->ffn, (long long)saved->vocab, (long long)saved->seq, extra_saved,
                   (long long)run->layers, (long long)run->dim, (long long)run->heads, (long long)run->ffn,
                   (long long)run->vocab, (long long)run->seq, extra_run, path);
}

int gpt_config_check(const gpt_config *c, int tp, int pp)
{
    if (c->layers < 1 || c->dim < 1 || c->heads < 1 || c->kv_heads < 1 || c->vocab < 1 || c->seq < 1 || c->ffn < 1 ||
        c->vocab_pad_multiple < 1)
        return tp_fail(TP_ERR_ARG,
                       "model shape must be positive: layers=%lld dim=%lld heads=%lld kv_heads=%lld vocab=%lld seq=%lld "
                       "ffn=%lld",
                       (long long)c->layers, (long long)c->dim, (long long)c->heads, (long long)c->kv_heads,
                       (long long)c->vocab, (long long)c->seq, (long long)c->ffn);
    if (c->vocab < 2) return tp_fail(TP_ERR_ARG, "a vocabulary of %lld token predicts nothing: at least 2", (long long)c->vocab);
    /* Bounds that keep every count and shape product far from overflow (the
     * catalogue counts tensors in an int; shapes multiply in int64). */
    if (c->layers > GPT_MAX_LAYERS)
        return tp_fail(TP_ERR_ARG, "%lld layers: at most %d are supported", (long long)c->layers, GPT_MAX_LAYERS);
    const int64_t sizes[] = {c->dim, c->heads, c->kv_heads, c->vocab, c->seq, c->ffn, c->vocab_pad_multiple};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i] > GPT_MAX_SIZE)
            return tp_fail(TP_ERR_ARG, "model dimension %lld exceeds %lld: dim=%lld heads=%lld vocab=%lld seq=%lld ffn=%lld",
                           (long long)sizes[i], (long long)GPT_MAX_SIZE, (long long)c->dim, (long long)c->heads,
                           (long long)c->vocab, (long long)c->seq, (long long)c->ffn);
    if (c->dim % c->heads != 0)
        return tp_fail(TP_ERR_ARG, "dim %lld is not divisible by heads %lld", (long long)c->dim, (long long)c->heads);
    TP_TRY(check_arch(c));
    if (c->heads % c->kv_heads != 0)
        return tp_fail(TP_ERR_ARG, "heads %lld is not divisible by kv_heads %lld", (long long)c->heads,
                       (long long)c->kv_heads);
    if (tp < 1 || pp < 1) return tp_fail(TP_ERR_LAYOUT, "tp=%d and pp=%d must be >= 1", tp, pp);
    if (c->heads % tp != 0)
        return tp_fail(TP_ERR_LAYOUT, "heads %lld is not divisible by tp %d", (long long)c->heads, tp);
    /* Fewer key/value heads than ranks: each is replicated over tp / kv_heads ranks. */
    if (c->kv_heads % tp != 0 && (c->kv_heads > tp || tp % c->kv_heads != 0))
        return tp_fail(TP_ERR_LAYOUT,
                       "kv_heads %lld over tp %d: neither divides the other (fewer key/value heads than ranks are "
                       "replicated when they divide tp)",
                       (long long)c->kv_heads, tp);
    if (c->ffn % tp != 0) return tp_fail(TP_ERR_LAYOUT, "ffn %lld is not divisible by tp %d", (long long)c->ffn, tp);
    if (c->layers % pp != 0)
        return tp_fail(TP_ERR_LAYOUT, "layers %lld is not divisible by pp %d", (long long)c->layers, pp);
    return TP_OK;
}

int gpt_preset(const char *name, gpt_config *c)
{
    if (strcmp(name, "tiny") == 0) *c = (gpt_config){.layers = 2, .dim = 64, .heads = 4, .vocab = 256, .seq = 32};
    else if (strcmp(name, "small") == 0) *c = (gpt_config){.layers = 6, .dim = 384, .heads = 6, .vocab = 256, .seq = 256};
    else if (strcmp(name, "gpt2-124m") == 0)
        *c = (gpt_config){.layers = 12, .dim = 768, .heads = 12, .vocab = 50257, .seq = 1024, .vocab_pad_multiple = 128};
    else if (strcmp(name, "llama-tiny") == 0)
        *c = (gpt_config){.arch = GPT_ARCH_LLAMA, .layers = 2, .dim = 64, .heads = 4, .kv_heads = 2, .vocab = 256,
                          .seq = 32, .ffn = 128, .untied_embeddings = 1};
    else if (strcmp(name, "smollm2-135m") == 0) /* HuggingFaceTB/SmolLM2-135M */
        *c = (gpt_config){.arch = GPT_ARCH_LLAMA, .layers = 30, .dim = 576, .heads = 9, .kv_heads = 3, .vocab = 49152,
                          .seq = 8192, .ffn = 1536, .rope_theta = 100000};
    else if (strcmp(name, "tinyllama-1.1b") == 0) /* TinyLlama/TinyLlama-1.1B */
        *c = (gpt_config){.arch = GPT_ARCH_LLAMA, .layers = 22, .dim = 2048, .heads = 32, .kv_heads = 4,
                          .vocab = 32000, .seq = 2048, .ffn = 5632, .untied_embeddings = 1};
    else if (strcmp(name, "llama-3.2-1b") == 0) /* meta-llama/Llama-3.2-1B */
        *c = (gpt_config){.arch = GPT_ARCH_LLAMA, .layers = 16, .dim = 2048, .heads = 32, .kv_heads = 8,
                          .vocab = 128256, .seq = 131072, .ffn = 8192, .rope_theta = 500000,
                          .rope_scaling_factor = 32, .rope_low_freq_factor = 1, .rope_high_freq_factor = 4,
                          .rope_original_seq = 8192};
    else
        return tp_fail(TP_ERR_ARG,
                       "--model expects tiny, small, gpt2-124m, llama-tiny, smollm2-135m, tinyllama-1.1b or "
                       "llama-3.2-1b, got '%s'",
                       name);
    c->dtype = TP_FP32;
    gpt_config_defaults(c);
    return TP_OK;
}

/* ------------------------------------------------------------ options */

const char *const gpt_option_names[] = {"model",      "arch",       "layers",          "dim",
                                        "heads",      "kv-heads",   "vocab",           "seq",
                                        "ffn",        "vocab-pad-multiple", "dtype",  "norm-eps",
                                        "rope-theta", "rope-scaling", "swiglu",        "tied-embeddings",
                                        "untied-embeddings", NULL};

int gpt_option_is_flag(const char *name)
{
    return !strcmp(name, "swiglu") || !strcmp(name, "tied-embeddings") || !strcmp(name, "untied-embeddings");
}

/* FACTOR[,LOW,HIGH,ORIGINAL]: Llama 3's rope_scaling. */
static int parse_rope_scaling(const char *value, gpt_config *c)
{
    double f[4] = {0, 0, 0, 0};
    int n = 0;
    const char *p = value;
    /* Up to four numbers (parse_double's) separated by commas, nothing
     * after the last: a fifth value or trailing text is refused, not dropped. */
    for (;;) {
        size_t len = strcspn(p, ",");
        char number[64];
        if (n == 4 || len >= sizeof number) {
            n = 5;
            break;
        }
        memcpy(number, p, len);
        number[len] = '\0';
        if (parse_double(number, &f[n++])) n = 5;
        if (n > 4 || p[len] != ',') break;
        p += len + 1;
    }
    if (n > 4 || !(f[0] >= 1) || f[3] != floor(f[3]) || f[3] < 0 || f[3] > (double)GPT_MAX_SIZE)
        return tp_fail(TP_ERR_ARG,
                       "--rope-scaling expects FACTOR[,LOW,HIGH,ORIGINAL] (Llama 3.x: 32,1,4,8192), got '%s'", value);
    c->rope_scaling_factor = f[0];
    c->rope_low_freq_factor = f[1];
    c->rope_high_freq_factor = f[2];
    c->rope_original_seq = (int64_t)f[3];
    return TP_OK;
}

int gpt_options_set(gpt_options *o, const char *name, const char *value)
{
    gpt_config *c = &o->explicit_shape;
    if (strcmp(name, "model") == 0) {
        gpt_config preset;
        TP_TRY(gpt_preset(value, &preset));
        o->preset = value;
        return TP_OK;
    }
    if (strcmp(name, "swiglu") == 0) {
        c->swiglu = 1;
        return TP_OK;
    }
    if (strcmp(name, "arch") == 0) {
        if (strcmp(value, "gpt") && strcmp(value, "llama"))
            return tp_fail(TP_ERR_ARG, "--arch expects gpt or llama, got '%s'", value);
        c->arch = strcmp(value, "llama") == 0 ? GPT_ARCH_LLAMA : GPT_ARCH_GPT;
        o->arch_given = 1;
        return TP_OK;
    }
    if (strcmp(name, "tied-embeddings") == 0 || strcmp(name, "untied-embeddings") == 0) {
        int given = name[0] == 't' ? 1 : 2;
        if (o->embeddings_given && o->embeddings_given != given)
            return tp_fail(TP_ERR_ARG, "--tied-embeddings and --untied-embeddings contradict each other: give one");
        o->embeddings_given = given;
        return TP_OK;
    }
    if (strcmp(name, "rope-scaling") == 0) return parse_rope_scaling(value, c);
    if (strcmp(name, "norm-eps") == 0 || strcmp(name, "rope-theta") == 0) {
        double v = 0;
        int eps = name[0] == 'n';
        if (parse_double(value, &v) || !(eps ? v > 0 && v < 1 : v > 1 && v < 1e12))
            return tp_fail(TP_ERR_ARG, "--%s expects a number in %s, got '%s'", name, eps ? "(0, 1)" : "(1, 1e12)",
                           value);
        *(eps ? &c->norm_eps : &c->rope_theta) = v;
        return TP_OK;
    }
    if (strcmp(name, "dtype") == 0) {
        if (tp_dtype_parse(value, &c->dtype)) return tp_fail(TP_ERR_ARG, "--dtype expects fp32, bf16 or fp16, got '%s'", value);
        o->dtype_given = 1;
        return TP_OK;
    }
    /* The bounds gpt_config_check applies, so that a value is refused where it is typed. */
    const struct {
        const char *name;
        int64_t *field, min, max;
    } sizes[] = {{"layers", &c->layers, 1, GPT_MAX_LAYERS}, {"dim", &c->dim, 1, GPT_MAX_SIZE},
                 {"heads", &c->heads, 1, GPT_MAX_SIZE},     {"kv-heads", &c->kv_heads, 1, GPT_MAX_SIZE},
                 {"vocab", &c->vocab, 2, GPT_MAX_SIZE},     {"seq", &c->seq, 1, GPT_MAX_SIZE},
                 {"ffn", &c->ffn, 1, GPT_MAX_SIZE},         {"vocab-pad-multiple", &c->vocab_pad_multiple, 1, 1 << 20}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (strcmp(name, sizes[i].name) != 0) continue;
        if (parse_int(value, sizes[i].min, sizes[i].max, sizes[i].field))
            return tp_fail(TP_ERR_ARG, "--%s expects an integer in %lld..%lld, got '%s'", name, (long long)sizes[i].min,
                           (long long)sizes[i].max, value);
        return TP_OK;
    }
    return tp_fail(TP_ERR_ARG, "--%s is not a model option", name);
}

int gpt_options_finish(const gpt_options *o, gpt_config *out)
{
    const gpt_config *shape = &o->explicit_shape;
    gpt_config c;
    memset(&c, 0, sizeof c);
    if (o->preset) TP_TRY(gpt_preset(o->preset, &c));
    /* Explicit flags refine the preset. */
    const int64_t *given[] = {&shape->layers, &shape->dim, &shape->heads, &shape->kv_heads, &shape->vocab,
                              &shape->seq, &shape->ffn, &shape->vocab_pad_multiple};
    int64_t *fields[] = {&c.layers, &c.dim, &c.heads, &c.kv_heads, &c.vocab, &c.seq, &c.ffn, &c.vocab_pad_multiple};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (*given[i]) *fields[i] = *given[i];
    /* A preset's derived sizes follow the explicit ones they derive from. */
    if (o->preset && shape->heads && !shape->kv_heads) c.kv_heads = c.heads;
    if (o->preset && shape->dim && !shape->ffn) c.ffn = 4 * c.dim;
    if (shape->swiglu) c.swiglu = 1;
    c.dtype = o->dtype_given ? shape->dtype : TP_FP32;
    if (o->arch_given) {
        if (o->preset && shape->arch != c.arch)
            return tp_fail(TP_ERR_ARG, "--arch %s contradicts --model %s (a %s)", gpt_arch_name(shape->arch),
                           o->preset, gpt_arch_name(c.arch));
        c.arch = shape->arch;
    }
    int llama = c.arch == GPT_ARCH_LLAMA;
    /* Hugging Face's LlamaConfig does not tie by default. */
    if (llama && !o->preset) c.untied_embeddings = 1;
    if (o->embeddings_given) c.untied_embeddings = o->embeddings_given == 2;
    if (shape->norm_eps) c.norm_eps = shape->norm_eps;
    if (shape->rope_theta) c.rope_theta = shape->rope_theta;
    if (shape->rope_scaling_factor) {
        c.rope_scaling_factor = shape->rope_scaling_factor;
        c.rope_low_freq_factor = shape->rope_low_freq_factor;
        c.rope_high_freq_factor = shape->rope_high_freq_factor;
        c.rope_original_seq = shape->rope_original_seq;
    }
    if (!llama && (o->embeddings_given || shape->norm_eps || shape->rope_theta || shape->rope_scaling_factor))
        return tp_fail(TP_ERR_ARG, "--tied-embeddings, --untied-embeddings, --norm-eps, --rope-theta and "
                                   "--rope-scaling describe a Llama model: add --arch llama");
    if (llama && o->preset && shape->dim && !shape->ffn) c.ffn = 0; /* Llama's rule from the new dim */
    if (!c.layers || !c.dim || !c.heads || !c.vocab || !c.seq)
        return tp_fail(TP_ERR_ARG, "give --model or all of --layers --dim --heads --vocab --seq");
    gpt_config_defaults(&c);
    *out = c;
    return TP_OK;
}

int gpt_options_shape_given(const gpt_options *o)
{
    const gpt_config *c = &o->explicit_shape; /* what gpt_options_set fills, dtype aside */
    return o->preset || o->arch_given || o->embeddings_given || c->layers || c->dim || c->heads || c->kv_heads ||
           c->vocab || c->seq || c->ffn || c->vocab_pad_multiple || c->swiglu || c->norm_eps || c->rope_theta ||
           c->rope_scaling_factor;
}

/* ----------------------------------------------------------- catalogue */

static const char *const kind_names[GPT_TENSOR_KINDS] = {
    "tok_embed.weight", "pos_embed.weight", "ln1.weight",      "ln1.bias",          "attn.qkv.weight",
    "attn.qkv.bias",    "attn.proj.weight", "attn.proj.bias",  "ln2.weight",        "ln2.bias",
    "mlp.fc.weight",    "mlp.fc.bias",      "mlp.proj.weight", "mlp.proj.bias",     "final_norm.weight",
    "final_norm.bias",  "output.weight"};

const char *gpt_tensor_kind_name(gpt_tensor_kind kind)
{
    return kind >= 0 && kind < GPT_TENSOR_KINDS ? kind_names[kind] : "?";
}

int gpt_tensor_kind_in_layer(gpt_tensor_kind kind)
{
    return kind >= GPT_FIRST_LAYER_KIND && kind < GPT_FIRST_LAYER_KIND + GPT_LAYER_KINDS;
}

static const char *const role_names[] = {"param", "master", "exp_avg", "exp_avg_sq"};

typedef struct {
    gpt_tensor *items;
    int count;
} catalog_builder;

static gpt_tensor *add(catalog_builder *b, gpt_tensor_kind kind, int64_t layer, tp_dtype dtype, int ndim, int64_t d0,
                       int64_t d1)
{
    gpt_tensor *t = &b->items[b->count];
    memset(t, 0, sizeof *t);
    /* Names built by hand: the planner builds catalogues by the thousand
     * (elastic/plan.c), where snprintf took half of the time. */
    char *at = stpcpy(t->name, layer >= 0 ? "model/layers." : "model/");
    if (layer >= 0) {
        char digits[24];
        int n = 0;
        for (long long v = layer; v > 0 || n == 0; v /= 10) digits[n++] = (char)('0' + v % 10);
        while (n) *at++ = digits[--n];
        *at++ = '.';
    }
    strcpy(at, kind_names[kind]); /* the longest name fits CKPT_NAME_MAX many times over */
    memcpy(t->param, t->name, sizeof t->name);
    t->kind = kind;
    t->layer = layer;
    t->role = GPT_ROLE_PARAM;
    t->param_index = b->count++;
    t->desc.dtype = dtype;
    t->desc.ndim = ndim;
    t->desc.shape[0] = d0;
    t->desc.shape[1] = ndim > 1 ? d1 : 1;
    t->desc.anchor = layer >= 0 ? CKPT_ANCHOR_LAYER
                     : kind == GPT_FINAL_NORM_WEIGHT || kind == GPT_FINAL_NORM_BIAS || kind == GPT_OUTPUT_WEIGHT
                         ? CKPT_ANCHOR_LAST
                         : CKPT_ANCHOR_FIRST;
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

/* Llama's layers and final norm: the GPT names where the role is the same
 * (ln1/ln2 are RMSNorm weights; mlp.fc is [gate; up]), no biases, no
 * position table. */
static void llama_layers(catalog_builder *b, const gpt_config *c, float residual_std)
{
    int64_t hd = c->dim / c->heads, q = c->heads * hd, kv = c->kv_heads * hd;
    int64_t qkv_segments[3] = {q, kv, kv}, fc_segments[2] = {c->ffn, c->ffn};
    gpt_tensor *t;
    for (int64_t l = 0; l < c->layers; l++) {
        constant(add(b, GPT_LN1_WEIGHT, l, c->dtype, 1, c->dim, 1), 1);
        t = add(b, GPT_QKV_WEIGHT, l, c->dtype, 2, q + 2 * kv, c->dim);
        split(t, 0, hd, 3, qkv_segments);
        t->desc.partition.replicate_small_segments = c->kv_heads < c->heads; /* K < TP at some layouts */
        t = add(b, GPT_PROJ_WEIGHT, l, c->dtype, 2, c->dim, q);
        split(t, 1, hd, 1, &q);
        t->init_std = residual_std;
        constant(add(b, GPT_LN2_WEIGHT, l, c->dtype, 1, c->dim, 1), 1);
        t = add(b, GPT_FC_WEIGHT, l, c->dtype, 2, 2 * c->ffn, c->dim);
        split(t, 0, 1, 2, fc_segments);
        t = add(b, GPT_FCPROJ_WEIGHT, l, c->dtype, 2, c->dim, c->ffn);
        split(t, 1, 1, 1, &c->ffn);
        t->init_std = residual_std;
    }
    constant(add(b, GPT_FINAL_NORM_WEIGHT, -1, c->dtype, 1, c->dim, 1), 1);
}

int gpt_catalog(const gpt_config *c, int with_optimizer, gpt_tensor **out, int *count)
{
    *out = NULL;
    *count = 0;
    if (c->layers < 1 || c->layers > GPT_MAX_LAYERS || c->heads < 1)
        return tp_fail(TP_ERR_ARG, "no catalogue of a model with %lld layers and %lld heads", (long long)c->layers,
                       (long long)c->heads);
    int per_param = with_optimizer ? (c->dtype == TP_FP32 ? 3 : 4) : 1;
    int params = 5 + GPT_LAYER_KINDS * (int)c->layers; /* at most: GPT's or Llama's */
    catalog_builder b = {calloc((size_t)(params * per_param), sizeof(gpt_tensor)), 0};
    if (!b.items) return tp_fail(TP_ERR_NOMEM, "out of memory for the catalogue of %d tensors", params * per_param);
    int64_t hd = c->dim / c->heads, q = c->heads * hd, kv = c->kv_heads * hd;
    int64_t fc = c->swiglu ? 2 * c->ffn : c->ffn;
    int64_t qkv_segments[3] = {q, kv, kv}, fc_segments[2] = {c->ffn, c->ffn};
    float residual_std = 0.02f / sqrtf(2.0f * (float)c->layers);
    gpt_tensor *t;

    t = add(&b, GPT_TOK_EMBED, -1, c->dtype, 2, c->vocab, c->dim);
    split(t, 0, 1, 1, &c->vocab);
    t->desc.partition.pad_multiple = c->vocab_pad_multiple;
    if (c->arch == GPT_ARCH_LLAMA) {
        llama_layers(&b, c, residual_std);
        if (c->untied_embeddings) {
            t = add(&b, GPT_OUTPUT_WEIGHT, -1, c->dtype, 2, c->vocab, c->dim);
            split(t, 0, 1, 1, &c->vocab);
            t->desc.partition.pad_multiple = c->vocab_pad_multiple;
        }
        goto state;
    }
    add(&b, GPT_POS_EMBED, -1, c->dtype, 2, c->seq, c->dim);
    for (int64_t l = 0; l < c->layers; l++) {
        constant(add(&b, GPT_LN1_WEIGHT, l, c->dtype, 1, c->dim, 1), 1);
        constant(add(&b, GPT_LN1_BIAS, l, c->dtype, 1, c->dim, 1), 0);
        t = add(&b, GPT_QKV_WEIGHT, l, c->dtype, 2, q + 2 * kv, c->dim);
        split(t, 0, hd, 3, qkv_segments);
        t->desc.partition.replicate_small_segments = c->kv_heads < c->heads;
        t = add(&b, GPT_QKV_BIAS, l, c->dtype, 1, q + 2 * kv, 1);
        split(t, 0, hd, 3, qkv_segments);
        t->desc.partition.replicate_small_segments = c->kv_heads < c->heads;
        constant(t, 0);
        t = add(&b, GPT_PROJ_WEIGHT, l, c->dtype, 2, c->dim, q);
        split(t, 1, hd, 1, &q);
        t->init_std = residual_std;
        constant(add(&b, GPT_PROJ_BIAS, l, c->dtype, 1, c->dim, 1), 0);
        constant(add(&b, GPT_LN2_WEIGHT, l, c->dtype, 1, c->dim, 1), 1);
        constant(add(&b, GPT_LN2_BIAS, l, c->dtype, 1, c->dim, 1), 0);
        t = add(&b, GPT_FC_WEIGHT, l, c->dtype, 2, fc, c->dim);
        split(t, 0, 1, c->swiglu ? 2 : 1, c->swiglu ? fc_segments : &fc);
        t = add(&b, GPT_FC_BIAS, l, c->dtype, 1, fc, 1);
        split(t, 0, 1, c->swiglu ? 2 : 1, c->swiglu ? fc_segments : &fc);
        constant(t, 0);
        t = add(&b, GPT_FCPROJ_WEIGHT, l, c->dtype, 2, c->dim, c->ffn);
        split(t, 1, 1, 1, &c->ffn);
        t->init_std = residual_std;
        constant(add(&b, GPT_FCPROJ_BIAS, l, c->dtype, 1, c->dim, 1), 0);
    }
    constant(add(&b, GPT_FINAL_NORM_WEIGHT, -1, c->dtype, 1, c->dim, 1), 1);
    constant(add(&b, GPT_FINAL_NORM_BIAS, -1, c->dtype, 1, c->dim, 1), 0);

state:
    /* Optimizer state: same partition as the parameter, fp32, named by role. */
    params = b.count;
    for (int p = 0; with_optimizer && p < params; p++) {
        for (gpt_role role = GPT_ROLE_MASTER; role <= GPT_ROLE_EXP_AVG_SQ; role++) {
            if (role == GPT_ROLE_MASTER && c->dtype == TP_FP32) continue;
            gpt_tensor state = b.items[p];
            state.role = role;
            state.param_index = p;
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
    return TP_OK;
}

int gpt_parameter_count(const gpt_config *c, int64_t *count)
{
    gpt_tensor *catalog = NULL;
    int n = 0;
    *count = 0;
    TP_TRY(gpt_catalog(c, 0, &catalog, &n));
    for (int i = 0; i < n; i++) {
        int64_t elements = 1;
        for (int d = 0; d < catalog[i].desc.ndim; d++) elements *= catalog[i].desc.shape[d];
        *count += elements;
    }
    free(catalog);
    return TP_OK;
}

int gpt_training_flops_per_token(const gpt_config *c, int64_t seq, double *flops)
{
    int64_t parameters = 0;
    *flops = 0;
    TP_TRY(gpt_parameter_count(c, &parameters));
    *flops = 6.0 * (double)parameters + 12.0 * (double)c->layers * (double)c->dim * (double)seq;
    return TP_OK;
}

/* --------------------------------------------------------------- JSON */

cJSON *gpt_rope_scaling_json(const gpt_config *c, cJSON *parent)
{
    cJSON *r = cJSON_AddObjectToObject(parent, "rope_scaling");
    if (!r) return NULL;
    cJSON_AddNumberToObject(r, "factor", c->rope_scaling_factor);
    cJSON_AddNumberToObject(r, "high_freq_factor", c->rope_high_freq_factor);
    cJSON_AddNumberToObject(r, "low_freq_factor", c->rope_low_freq_factor);
    cJSON_AddNumberToObject(r, "original_max_position_embeddings", (double)c->rope_original_seq);
    return r;
}

char *gpt_config_to_json(const gpt_config *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "arch", gpt_arch_name(c->arch));
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
    if (c->arch == GPT_ARCH_LLAMA) {
        cJSON_AddBoolToObject(o, "tied_embeddings", !c->untied_embeddings);
        cJSON_AddNumberToObject(o, "norm_eps", c->norm_eps);
        cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
        if (c->rope_scaling_factor > 0) gpt_rope_scaling_json(c, o);
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

static int json_number(const cJSON *o, const char *key, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return tp_fail(TP_ERR_FORMAT, "model config: '%s' missing or not a number", key);
    *out = v->valuedouble;
    return TP_OK;
}

/* "arch" (absent in configurations written before Llama: GPT) and Llama's fields. */
static int llama_from_json(const cJSON *o, gpt_config *out)
{
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(o, "arch");
    if (arch && (!cJSON_IsString(arch) || (strcmp(arch->valuestring, "gpt") && strcmp(arch->valuestring, "llama"))))
        return tp_fail(TP_ERR_FORMAT, "model config: 'arch' must be \"gpt\" or \"llama\"");
    if (!arch || strcmp(arch->valuestring, "llama")) return TP_OK;
    out->arch = GPT_ARCH_LLAMA;
    const cJSON *tied = cJSON_GetObjectItemCaseSensitive(o, "tied_embeddings");
    if (!cJSON_IsBool(tied)) return tp_fail(TP_ERR_FORMAT, "model config: 'tied_embeddings' missing or not a boolean");
    out->untied_embeddings = cJSON_IsFalse(tied);
    TP_TRY(json_number(o, "norm_eps", &out->norm_eps));
    TP_TRY(json_number(o, "rope_theta", &out->rope_theta));
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    if (scaling) {
        double original = 0;
        if (!cJSON_IsObject(scaling)) return tp_fail(TP_ERR_FORMAT, "model config: 'rope_scaling' is not an object");
        TP_TRY(json_number(scaling, "factor", &out->rope_scaling_factor));
        TP_TRY(json_number(scaling, "low_freq_factor", &out->rope_low_freq_factor));
        TP_TRY(json_number(scaling, "high_freq_factor", &out->rope_high_freq_factor));
        TP_TRY(json_number(scaling, "original_max_position_embeddings", &original));
        if (original < 1 || original > (double)GPT_MAX_SIZE || original != floor(original))
            return tp_fail(TP_ERR_FORMAT, "model config: rope_scaling's original length %g is not a length", original);
        out->rope_original_seq = (int64_t)original;
    }
    return check_arch(out);
}

int gpt_config_from_json(const char *json, gpt_config *out)
{
    memset(out, 0, sizeof *out);
    cJSON *o = cJSON_Parse(json);
    /* An empty configuration is no damaged one: a checkpoint that another
     * tool's became under its own names (tp-reshard --format tp of a
     * Megatron or DCP source) holds no model of this toolkit's, and its
     * tensors are not this model's (names, a fused QKV's row order). */
    if (cJSON_IsObject(o) && !o->child) {
        cJSON_Delete(o);
        return tp_fail(TP_ERR_FORMAT, "names no model (its model configuration is {}): a conversion of another tool's "
                       "checkpoint that kept its tensor names (tp-reshard --format tp of a Megatron-LM, Megatron-Core "
                       "or DCP one) is not this model's; tp-ckpt import converts a Megatron checkpoint into it");
    }
    int status = TP_OK;
    struct {
        const char *key;
        int64_t *field;
    } ints[] = {{"layers", &out->layers}, {"dim", &out->dim},       {"heads", &out->heads},
                {"kv_heads", &out->kv_heads}, {"vocab", &out->vocab}, {"seq", &out->seq},
                {"ffn", &out->ffn}, {"vocab_pad_multiple", &out->vocab_pad_multiple}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !status; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, ints[i].key);
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > (double)GPT_MAX_SIZE ||
            v->valuedouble != floor(v->valuedouble))
            status = tp_fail(TP_ERR_FORMAT, "model config: '%s' missing or not an integer in 1..%lld", ints[i].key,
                             (long long)GPT_MAX_SIZE);
        else *ints[i].field = (int64_t)v->valuedouble;
    }
    const cJSON *mlp = cJSON_GetObjectItemCaseSensitive(o, "mlp");
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(o, "dtype");
    if (!status && (!cJSON_IsString(mlp) || (strcmp(mlp->valuestring, "gelu") != 0 &&
                                             strcmp(mlp->valuestring, "swiglu") != 0)))
        status = tp_fail(TP_ERR_FORMAT, "model config: 'mlp' must be \"gelu\" or \"swiglu\"");
    if (!status && (!cJSON_IsString(dtype) || tp_dtype_parse(dtype->valuestring, &out->dtype)))
        status = tp_fail(TP_ERR_FORMAT, "model config: 'dtype' must be fp32, bf16 or fp16");
    if (!status) out->swiglu = strcmp(mlp->valuestring, "swiglu") == 0;
    if (!status) status = llama_from_json(o, out);
    cJSON_Delete(o);
    return status;
}
