/* megatron.c: Megatron-LM legacy checkpoints read as logical tensors with
 * partition descriptions (megatron.h). Every rank file is opened through
 * torch_archive (nothing executed); the model's shape comes from `args`;
 * each tensor's name is mapped to a canonical one, its expected piece shape
 * computed from its description and checked on every rank. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../common/error.h"
#include "../common/memory.h"
#include "../common/parallel.h"
#include "../kernels/kernels.h"
#include "megatron_internal.h"

#define MEGATRON_ITERATION_LIMIT ((int64_t)1000000000000000) /* iterations below 10^15 */
#define MEGATRON_SIZE_LIMIT ((int64_t)1 << 31)                /* a model size in args, at most */

typedef struct {
    ckpt_tensor_copy copy;
    char source[512];
    int stage;
    const pickle_value **pieces; /* per tp rank */
    /* State of the distributed optimizer: pieces are the flat fp32 world
     * tensors of distrib_optim.pt, the piece at this element offset. */
    int64_t *flat_offset;        /* per tp rank, or NULL */
} megatron_tensor_entry;

struct megatron_checkpoint {
    char path[4096];
    store_hold *holds[2]; /* shared locks on the path opened and its iteration's directory, while it is read */
    megatron_config config;
    torch_archive **archives; /* pp_rank * tp + tp_rank */
    megatron_tensor_entry *tensors;
    int num_tensors, capacity;
    /* The parameters of the stage being read, in the rank files' order
     * (named_parameters(): every chunk's, the tied head copy included as
     * HEAD_COPY): the order the optimizer numbers them in. */
    int *stage_params;
    int num_stage_params, stage_params_capacity;
    int *chunk_first;                 /* stage * vpp + chunk: the chunk's first position in stage_params */
    const pickle_value **head_copies; /* pp_rank * tp + tp_rank: the tied head copy's tensor, or NULL */
    torch_archive **distrib_optim;    /* pp_rank * tp + tp_rank: distrib_optim.pt, when read */
    /* The tied head copy's optimizer state, (pp_rank * tp + tp_rank) * 3 +
     * role (exp_avg, exp_avg_sq, master): not a tensor of its own, kept to
     * be compared with the embeddings' (megatron_check_replicas). */
    struct head_state {
        const pickle_value *tensor; /* NULL: none */
        int64_t flat_offset;        /* a run of distrib_optim.pt's world tensor from this element, or -1 */
    } *head_states;
    char optimizer_refusal[1024]; /* why the optimizer state is not read ("" when it is, or there is none) */
    int optimizer_status;         /* and its tp_status: TP_ERR_LAYOUT (not read by design) or TP_ERR_FORMAT (damaged) */
};

enum { HEAD_COPY = -1 };

/* ------------------------------------------------------------- the files */

static int stat_path(const char *path, store_stat *st)
{
    const store_ops *store;
    TP_TRY(store_for(path, &store));
    return store->stat(store, path, st);
}

static void rank_file(const megatron_checkpoint *m, int pp_rank, int tp_rank, int pp, char *out, size_t size)
{
    if (pp > 1) snprintf(out, size, "%s/mp_rank_%02d_%03d/" MEGATRON_RANK_FILE, m->path, tp_rank, pp_rank);
    else snprintf(out, size, "%s/mp_rank_%02d/" MEGATRON_RANK_FILE, m->path, tp_rank);
}

int megatron_iteration_dir(const char *path, char *out, size_t size)
{
    char tracker[4200], *text = NULL;
    snprintf(tracker, sizeof tracker, "%s/" MEGATRON_TRACKER_NAME, path);
    int status = store_read_text_file(tracker, 64, &text, NULL);
    if (status == TP_ERR_NOT_FOUND) { /* no tracker: path is the iteration's directory */
        snprintf(out, size, "%s", path);
        return TP_OK;
    }
    if (status) return status;
    /* As Megatron reads it: int(text.strip()), or 'release'. */
    char *start = text + strspn(text, " \t\r\n"), *end = start + strlen(start);
    while (end > start && strchr(" \t\r\n", end[-1])) *--end = 0;
    for (char *c = start; *c; c++) /* shown in one line */
        if ((unsigned char)*c < 0x20) *c = ' ';
    errno = 0;
    long long iteration = strtoll(start, &end, 10);
    if (!strcmp(start, "release")) snprintf(out, size, "%s/release", path);
    else if (!start[0] || *end || errno || iteration < 0 || iteration >= MEGATRON_ITERATION_LIMIT)
        status = tp_fail(TP_ERR_FORMAT, "%s holds '%s', neither an iteration number (0 to 10^15) nor 'release'", tracker,
                         start);
    else snprintf(out, size, "%s/iter_%07lld", path, iteration);
    free(text);
    return status;
}

int megatron_iteration_dir_name(const char *path)
{
    char parent[4300], base[256]; /* "iter_0000010/" is iter_0000010 */
    if (tp_split_path(path, parent, sizeof parent, base, sizeof base)) return 0;
    if (!strcmp(base, "release")) return 1;
    if (strncmp(base, "iter_", 5) || strlen(base) < 12) return 0;
    for (const char *c = base + 5; *c; c++)
        if (*c < '0' || *c > '9') return 0;
    return 1;
}

int megatron_detect(const char *path, int *found)
{
    char file[4300];
    store_stat st;
    *found = 0;
    /* A tracker file says Megatron even when what it holds is damaged. One
     * look for it (a round trip in an object store), and the rank files
     * only under a directory named as Megatron names an iteration's; a
     * failing store is an error, not a "no". */
    snprintf(file, sizeof file, "%s/" MEGATRON_TRACKER_NAME, path);
    TP_TRY(stat_path(file, &st));
    if (st.exists || !megatron_iteration_dir_name(path)) {
        *found = st.exists;
        return TP_OK;
    }
    snprintf(file, sizeof file, "%s/mp_rank_00/" MEGATRON_RANK_FILE, path);
    TP_TRY(stat_path(file, &st));
    if (!st.exists) {
        snprintf(file, sizeof file, "%s/mp_rank_00_000/" MEGATRON_RANK_FILE, path);
        TP_TRY(stat_path(file, &st));
    }
    *found = st.exists;
    return TP_OK;
}

/* ------------------------------------------------------------------ args */


static int arg_int(const pickle_value *args, const char *file, const char *name, int64_t fallback, int64_t *out)
{
    const pickle_value *v = pickle_get(args, name);
    if (!v || v->kind == PICKLE_NONE) {
        if (fallback < 0) return tp_fail(TP_ERR_FORMAT, "%s: args has no %s", file, name);
        *out = fallback;
        return TP_OK;
    }
    if (v->kind != PICKLE_INT && v->kind != PICKLE_BOOL)
        return tp_fail(TP_ERR_FORMAT, "%s: args.%s is a %s, not an integer", file, name, pickle_kind_name(v->kind));
    *out = v->integer;
    return TP_OK;
}

static int arg_flag(const pickle_value *args, const char *name)
{
    const pickle_value *v = pickle_get(args, name);
    return v && (v->kind == PICKLE_BOOL || v->kind == PICKLE_INT) && v->integer;
}

/* A number of args: a float or an integer; fallback when absent or None. */
static int arg_number(const pickle_value *args, const char *file, const char *name, double fallback, double *out)
{
    const pickle_value *v = pickle_get(args, name);
    if (!v || v->kind == PICKLE_NONE) {
        *out = fallback;
        return TP_OK;
    }
    if (v->kind == PICKLE_FLOAT) *out = v->real;
    else if (v->kind == PICKLE_INT) *out = (double)v->integer;
    else return tp_fail(TP_ERR_FORMAT, "%s: args.%s is a %s, not a number", file, name, pickle_kind_name(v->kind));
    return TP_OK;
}

int megatron_config_read(const torch_archive *archive, megatron_config *c)
{
    return megatron_config_from(torch_archive_path(archive), torch_archive_root(archive), c);
}

int megatron_config_from(const char *file, const pickle_value *root, megatron_config *c)
{
    const pickle_value *args = pickle_get(root, "args");
    if (!args || args->kind != PICKLE_OBJECT)
        return tp_fail(TP_ERR_FORMAT, "%s: no args (an argparse.Namespace): not a Megatron-LM checkpoint", file);
    const pickle_value *version = pickle_get(root, "checkpoint_version");
    if (!version || (version->kind != PICKLE_FLOAT && version->kind != PICKLE_INT))
        return tp_fail(TP_ERR_VERSION, "%s: no checkpoint_version (Megatron-LM before 2020); not read", file);
    c->checkpoint_version = version->kind == PICKLE_FLOAT ? version->real : (double)version->integer;
    /* 2.0 introduced the per-head [q, k, v] order of the fused QKV that 3.0 keeps (NaN is neither). */
    if (!(c->checkpoint_version >= 2.0 && c->checkpoint_version <= 3.0))
        return tp_fail(TP_ERR_VERSION, "%s: checkpoint_version %g; versions 2.0 and 3.0 are read", file, c->checkpoint_version);
    const pickle_value *iteration = pickle_get(root, "iteration");
    if (iteration && iteration->kind != PICKLE_INT)
        return tp_fail(TP_ERR_FORMAT, "%s: iteration is a %s, not an iteration number (0 to 10^15)", file,
                       pickle_kind_name(iteration->kind));
    if (iteration && (iteration->integer < 0 || iteration->integer >= MEGATRON_ITERATION_LIMIT))
        return tp_fail(TP_ERR_FORMAT, "%s: iteration %lld: not an iteration number (0 to 10^15)", file,
                       (long long)iteration->integer);
    c->iteration = iteration ? iteration->integer : -1;
    c->stored_iteration = c->iteration;
    int64_t v, per_chunk;
    /* Before version 3.0 args named the tensor-parallel size model_parallel_size. */
    TP_TRY(arg_int(args, file, "model_parallel_size", 1, &v));
    TP_TRY(arg_int(args, file, "tensor_model_parallel_size", v, &v));
    c->tp = (int)v;
    TP_TRY(arg_int(args, file, "pipeline_model_parallel_size", 1, &v));
    c->pp = (int)v;
    TP_TRY(arg_int(args, file, "num_layers", -1, &c->num_layers));
    /* A virtual pipeline is given by its size or by layers per chunk. */
    TP_TRY(arg_int(args, file, "num_layers_per_virtual_pipeline_stage", 0, &per_chunk));
    v = per_chunk > 0 && c->pp > 0 && c->num_layers % (c->pp * per_chunk) == 0 ? c->num_layers / (c->pp * per_chunk) : 1;
    TP_TRY(arg_int(args, file, "virtual_pipeline_model_parallel_size", v, &v));
    c->vpp = (int)v;
    TP_TRY(arg_int(args, file, "hidden_size", -1, &c->hidden));
    TP_TRY(arg_int(args, file, "num_attention_heads", -1, &c->heads));
    TP_TRY(arg_int(args, file, "padded_vocab_size", -1, &c->padded_vocab));
    TP_TRY(arg_int(args, file, "ffn_hidden_size", 4 * c->hidden, &c->ffn));
    TP_TRY(arg_int(args, file, "make_vocab_size_divisible_by", 128, &c->vocab_divisible_by));
    TP_TRY(arg_int(args, file, "max_position_embeddings", 0, &c->max_positions));
    if (c->heads <= 0 || c->hidden <= 0 || c->num_layers <= 0 || c->tp <= 0 || c->pp <= 0 || c->vpp <= 0 ||
        c->tp > 4096 || c->pp > 4096 || c->vpp > 4096)
        return tp_fail(TP_ERR_FORMAT, "%s: args of %lld heads, hidden %lld, %lld layers, tp %d, pp %d, vpp %d", file,
                       (long long)c->heads, (long long)c->hidden, (long long)c->num_layers, c->tp, c->pp, c->vpp);
    TP_TRY(arg_int(args, file, "kv_channels", c->hidden / c->heads, &c->kv_channels));
    c->query_groups = c->heads;
    if (arg_flag(args, "group_query_attention")) TP_TRY(arg_int(args, file, "num_query_groups", -1, &c->query_groups));
    c->swiglu = arg_flag(args, "swiglu");
    c->untied = arg_flag(args, "untie_embeddings_and_output_weights");
    const pickle_value *bias = pickle_get(args, "add_bias_linear");
    c->has_bias = !bias || bias->integer;
    const pickle_value *positions = pickle_get(args, "position_embedding_type");
    c->learned_positions = !positions || pickle_is_string(positions, "learned_absolute");
    const pickle_value *dtype = pickle_get(args, "params_dtype");
    c->dtype = arg_flag(args, "bf16") ? TP_BF16 : arg_flag(args, "fp16") ? TP_FP16 : TP_FP32;
    if (dtype && dtype->kind == PICKLE_GLOBAL) {
        if (!strcmp(dtype->text.data, "torch.bfloat16")) c->dtype = TP_BF16;
        else if (!strcmp(dtype->text.data, "torch.float16")) c->dtype = TP_FP16;
        else if (!strcmp(dtype->text.data, "torch.float32")) c->dtype = TP_FP32;
    }
    c->has_optimizer = pickle_get(root, "optimizer") != NULL;
    const pickle_value *samples = pickle_get(args, "consumed_train_samples");
    c->consumed_samples = samples && samples->kind == PICKLE_INT ? samples->integer : 0;
    /* What the GPT computes beyond the shapes (docs/MEGATRON.md section 3). */
    c->openai_gelu = arg_flag(args, "openai_gelu");
    c->post_layernorm_residual = arg_flag(args, "apply_residual_connection_post_layernorm");
    const pickle_value *norm = pickle_get(args, "normalization");
    c->rmsnorm = norm && pickle_is_string(norm, "RMSNorm");
    const pickle_value *eps = pickle_get(args, "layernorm_epsilon");
    if (!eps) eps = pickle_get(args, "norm_epsilon");
    c->norm_epsilon = eps && eps->kind == PICKLE_FLOAT ? eps->real : 1e-5;
    TP_TRY(arg_number(args, file, "rotary_base", 10000, &c->rotary_base));
    TP_TRY(arg_number(args, file, "rotary_percent", 1.0, &c->rotary_percent));
    c->rotary_interleaved = arg_flag(args, "rotary_interleaved");
    c->rope_scaling_factor = 0;
    if (arg_flag(args, "use_rope_scaling")) {
        /* The flag is --rotary-scaling-factor (rope_scaling_factor in some releases); 8 by default. */
        TP_TRY(arg_number(args, file, "rope_scaling_factor", 8, &c->rope_scaling_factor));
        TP_TRY(arg_number(args, file, "rotary_scaling_factor", c->rope_scaling_factor, &c->rope_scaling_factor));
    }
    c->qk_layernorm = arg_flag(args, "qk_layernorm");
    const pickle_value *impl = pickle_get(args, "transformer_impl"), *spec = pickle_get(args, "spec");
    c->impl = spec && spec->kind != PICKLE_NONE              ? MEGATRON_IMPL_OTHER
              : !impl || pickle_is_string(impl, "transformer_engine") ? MEGATRON_IMPL_TRANSFORMER_ENGINE
              : pickle_is_string(impl, "local")                 ? MEGATRON_IMPL_LOCAL
                                                                : MEGATRON_IMPL_OTHER;
    /* Every size is a divisor or a dimension somewhere: named when out of range. */
    const struct {
        const char *name;
        int64_t value, least;
    } sizes[] = {{"num_layers", c->num_layers, 1},         {"hidden_size", c->hidden, 1},
                 {"num_attention_heads", c->heads, 1},      {"ffn_hidden_size", c->ffn, 1},
                 {"kv_channels", c->kv_channels, 1},        {"num_query_groups", c->query_groups, 1},
                 {"padded_vocab_size", c->padded_vocab, 1}, {"make_vocab_size_divisible_by", c->vocab_divisible_by, 1},
                 {"max_position_embeddings", c->max_positions, 0}};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        if (sizes[i].value < sizes[i].least || sizes[i].value > MEGATRON_SIZE_LIMIT)
            return tp_fail(TP_ERR_FORMAT, "%s: args.%s is %lld, expected %lld to 2^31", file, sizes[i].name,
                           (long long)sizes[i].value, (long long)sizes[i].least);
    if (c->kv_channels <= 0 || c->query_groups <= 0 || c->heads % c->query_groups || c->padded_vocab <= 0 || c->ffn <= 0)
        return tp_fail(TP_ERR_FORMAT, "%s: args of %lld heads in %lld query groups, kv channels %lld, vocabulary %lld, ffn %lld",
                       file, (long long)c->heads, (long long)c->query_groups, (long long)c->kv_channels,
                       (long long)c->padded_vocab, (long long)c->ffn);
    if (c->num_layers % ((int64_t)c->pp * c->vpp))
        return tp_fail(TP_ERR_FORMAT, "%s: %lld layers do not divide over pp %d x vpp %d", file, (long long)c->num_layers,
                       c->pp, c->vpp);
    /* Fewer groups than ranks (Megatron-Core 0.16 and later, f7dfb99795 of
     * 2025-12-06: TransformerConfig takes groups that are a multiple or a
     * divisor of tp; each rank all-gathers the fused QKV's activations and
     * takes its group's): a group's rows spread over tp / groups ranks, the
     * same rows on disk. Older releases and the legacy model divide() the
     * groups by tp, and cannot build it. */
    if (c->query_groups % c->tp && c->tp % c->query_groups)
        return tp_fail(TP_ERR_LAYOUT, "%s: %lld query groups over %d tensor-parallel ranks: neither divides the other",
                       file, (long long)c->query_groups, c->tp);
    if (c->heads % c->tp || c->ffn % c->tp || c->padded_vocab % c->tp)
        return tp_fail(TP_ERR_FORMAT, "%s: %lld heads, ffn %lld or vocabulary %lld do not divide over tp %d", file,
                       (long long)c->heads, (long long)c->ffn, (long long)c->padded_vocab, c->tp);
    return TP_OK;
}

/* ----------------------------------------------------------------- names */

typedef struct {
    const char *const *sources; /* Megatron's names of the part after layers.N. */
    const char *canonical;
} layer_name;

static const char *const qkv_w[] = {"self_attention.query_key_value.weight", "self_attention.linear_qkv.weight", NULL};
static const char *const qkv_b[] = {"self_attention.query_key_value.bias", "self_attention.linear_qkv.bias", NULL};
static const char *const dense_w[] = {"self_attention.dense.weight", "self_attention.linear_proj.weight", NULL};
static const char *const dense_b[] = {"self_attention.dense.bias", "self_attention.linear_proj.bias", NULL};
static const char *const in_w[] = {"input_norm.weight", "input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight", NULL};
static const char *const in_b[] = {"input_norm.bias", "input_layernorm.bias", "self_attention.linear_qkv.layer_norm_bias", NULL};
static const char *const post_w[] = {"post_attention_norm.weight", "post_attention_layernorm.weight", "pre_mlp_layernorm.weight",
                                     "mlp.linear_fc1.layer_norm_weight", NULL};
static const char *const post_b[] = {"post_attention_norm.bias", "post_attention_layernorm.bias", "pre_mlp_layernorm.bias",
                                     "mlp.linear_fc1.layer_norm_bias", NULL};
static const char *const fc1_w[] = {"mlp.dense_h_to_4h.weight", "mlp.linear_fc1.weight", NULL};
static const char *const fc1_b[] = {"mlp.dense_h_to_4h.bias", "mlp.linear_fc1.bias", NULL};
static const char *const fc2_w[] = {"mlp.dense_4h_to_h.weight", "mlp.linear_fc2.weight", NULL};
static const char *const fc2_b[] = {"mlp.dense_4h_to_h.bias", "mlp.linear_fc2.bias", NULL};

static const layer_name layer_names[] = {
    {qkv_w, "attention.qkv.weight"},   {qkv_b, "attention.qkv.bias"}, {dense_w, "attention.dense.weight"},
    {dense_b, "attention.dense.bias"}, {in_w, "input_norm.weight"},   {in_b, "input_norm.bias"},
    {post_w, "post_norm.weight"},      {post_b, "post_norm.bias"},    {fc1_w, "mlp.fc1.weight"},
    {fc1_b, "mlp.fc1.bias"},           {fc2_w, "mlp.fc2.weight"},     {fc2_b, "mlp.fc2.bias"},
};

static int has_prefix(const char *s, const char *prefix)
{
    return !strncmp(s, prefix, strlen(prefix));
}

static int has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

int megatron_canonical_name(const megatron_config *c, const char *path, int64_t first_layer, int64_t chunk_layers,
                          char *out, size_t size, int *kind)
{
    *kind = MEGATRON_NAME_TENSOR;
    if (size) out[0] = '\0'; /* no name for what is skipped or a copy: callers may look at it */
    if (has_suffix(path, "_extra_state")) { /* Transformer Engine's FP8 metadata, empty without FP8 */
        *kind = MEGATRON_NAME_SKIP;
        return TP_OK;
    }
    const char *p = has_prefix(path, "language_model.") ? path + strlen("language_model.") : path;
    if (!strcmp(p, "embedding.word_embeddings.weight") || !strcmp(p, "embedding.position_embeddings.weight") ||
        (c->untied && !strcmp(p, "output_layer.weight"))) {
        snprintf(out, size, "%s", p);
        return TP_OK;
    }
    if (!strcmp(p, "word_embeddings_for_head.weight") || (!c->untied && !strcmp(p, "output_layer.weight"))) {
        *kind = MEGATRON_NAME_HEAD_COPY;
        return TP_OK;
    }
    const char *stack = NULL;
    const char *stacks[] = {"encoder.", "transformer.", "decoder."};
    for (int i = 0; i < 3 && !stack; i++)
        if (has_prefix(p, stacks[i])) stack = p + strlen(stacks[i]);
    if (stack && (!strcmp(stack, "final_norm.weight") || !strcmp(stack, "final_layernorm.weight"))) {
        snprintf(out, size, "final_norm.weight");
        return TP_OK;
    }
    if (stack && (!strcmp(stack, "final_norm.bias") || !strcmp(stack, "final_layernorm.bias"))) {
        snprintf(out, size, "final_norm.bias");
        return TP_OK;
    }
    if (stack && has_prefix(stack, "layers.")) {
        char *end;
        long long local = strtoll(stack + strlen("layers."), &end, 10);
        if (end != stack + strlen("layers.") && *end == '.' && local >= 0 && local < chunk_layers) {
            for (size_t i = 0; i < sizeof layer_names / sizeof *layer_names; i++)
                for (const char *const *s = layer_names[i].sources; *s; s++)
                    if (!strcmp(end + 1, *s)) {
                        snprintf(out, size, "layers.%lld.%s", (long long)(first_layer + local), layer_names[i].canonical);
                        return TP_OK;
                    }
        }
    }
    return tp_fail(TP_ERR_FORMAT, "tensor %s is not a known Megatron-LM GPT tensor (nothing is converted without knowing it)", path);
}

void megatron_describe(const megatron_config *c, const char *name, ckpt_tensor_desc *d)
{
    memset(d, 0, sizeof *d);
    d->name = name;
    d->dtype = c->dtype;
    d->partition.kind = CKPT_REPLICATED;
    d->anchor = CKPT_ANCHOR_LAYER;
    int64_t h = c->hidden, kv = c->kv_channels, qkv_granule = (c->heads / c->query_groups + 2) * kv;
    const char *leaf = name;
    if (has_prefix(name, "layers.")) {
        d->layer = strtoll(name + strlen("layers."), NULL, 10);
        leaf = strchr(name + strlen("layers."), '.') + 1;
    } else {
        d->anchor = has_prefix(name, "embedding.") ? CKPT_ANCHOR_FIRST : CKPT_ANCHOR_LAST;
    }
    /* Biases and norms are vectors of their rows. */
    d->ndim = has_suffix(leaf, ".bias") || strstr(leaf, "norm.") ? 1 : 2;
    d->shape[0] = h;
    d->shape[1] = h;
    if (megatron_is_vocabulary_table(name)) {
        megatron_describe_vocabulary(c, d);
    } else if (!strcmp(name, "embedding.position_embeddings.weight")) {
        d->shape[0] = c->max_positions;
    } else if (has_prefix(leaf, "attention.qkv.")) {
        d->shape[0] = c->query_groups * qkv_granule;
        d->partition.kind = CKPT_SPLIT;
        /* Whole query groups per rank, as the legacy model needs; a head's
         * rows for Megatron-Core, which also cuts a group between ranks
         * (fewer groups than ranks: each rank all-gathers its group's). */
        d->partition.granule = c->core_names ? kv : qkv_granule;
    } else if (!strcmp(leaf, "attention.dense.weight")) {
        d->shape[1] = c->heads * kv;
        d->partition.kind = CKPT_SPLIT;
        d->partition.axis = 1;
        d->partition.granule = kv;
    } else if (has_prefix(leaf, "mlp.fc1.")) {
        d->shape[0] = c->swiglu ? 2 * c->ffn : c->ffn;
        d->partition.kind = CKPT_SPLIT;
        if (c->swiglu) {
            d->partition.num_segments = 2;
            d->partition.segments[0] = d->partition.segments[1] = c->ffn;
        }
    } else if (!strcmp(leaf, "mlp.fc2.weight")) {
        d->shape[1] = c->ffn;
        d->partition.kind = CKPT_SPLIT;
        d->partition.axis = 1;
    }
}

/* ------------------------------------------------------------ the tensors */

typedef struct {
    megatron_checkpoint *m;
    int stage, tp_rank;
    int64_t first_layer, chunk_layers;
    const char *file;
    int next;            /* rank > 0: the index in this chunk's order */
    int chunk_start;     /* the chunk's first tensor in m->tensors */
    int head_copies;
} chunk_walk;

/* Whether a tensor holds one of the project's dtypes, and which. */
static int float_dtype(const pickle_value *tensor, tp_dtype *out)
{
    return torch_dtype_to_tp(tensor->tensor->storage->storage.dtype, out);
}

static int check_piece(const megatron_checkpoint *m, const megatron_tensor_entry *e, const pickle_value *t, const char *file)
{
    int64_t expected[CKPT_MAX_DIMS];
    ckpt_piece_shape(&e->copy.desc, m->config.tp, expected);
    int same = t->tensor->ndim == e->copy.desc.ndim;
    for (int d = 0; same && d < t->tensor->ndim; d++) same = t->tensor->shape[d] == expected[d];
    if (!same) {
        char want[64], got[64];
        int n = 0, k = 0;
        for (int d = 0; d < e->copy.desc.ndim; d++) n += snprintf(want + n, sizeof want - (size_t)n, d ? " x %lld" : "%lld", (long long)expected[d]);
        for (int d = 0; d < t->tensor->ndim && k < 60; d++) k += snprintf(got + k, sizeof got - (size_t)k, d ? " x %lld" : "%lld", (long long)t->tensor->shape[d]);
        if (!t->tensor->ndim) snprintf(got, sizeof got, "a scalar");
        return tp_fail(TP_ERR_FORMAT, "%s: tensor %s is %s, the model in args gives %s at tp %d", file, e->source, got, want,
                       m->config.tp);
    }
    tp_dtype dtype;
    if (!float_dtype(t, &dtype) || dtype != e->copy.desc.dtype)
        return tp_fail(TP_ERR_FORMAT, "%s: tensor %s is %s, expected %s", file, e->source, torch_dtype_name(t->tensor->storage->storage.dtype),
                       tp_dtype_name(e->copy.desc.dtype));
    if (!torch_tensor_is_contiguous(t))
        return tp_fail(TP_ERR_FORMAT, "%s: tensor %s is not contiguous", file, e->source);
    return TP_OK;
}

/* A new tensor of stage described by d, its pieces to be set. */
static int new_entry(megatron_checkpoint *m, const char *file, int stage, const char *source, const ckpt_tensor_desc *d,
                     megatron_tensor_entry **out)
{
    for (int i = 0; i < m->num_tensors; i++)
        if (!strcmp(m->tensors[i].copy.name, d->name))
            return tp_fail(TP_ERR_FORMAT, "%s: tensor %s is also in %s (as %s)", file, source, m->tensors[i].source, d->name);
    int capacity = m->capacity;
    TP_TRY(array_reserve((void **)&m->tensors, &m->capacity, m->num_tensors + 1, sizeof *m->tensors));
    if (capacity != m->capacity) /* moved */
        for (int i = 0; i < m->num_tensors; i++) ckpt_tensor_copy_rebind(&m->tensors[i].copy);
    megatron_tensor_entry *e = &m->tensors[m->num_tensors];
    memset(e, 0, sizeof *e);
    int status = ckpt_tensor_copy_init(&e->copy, d);
    if (status) return tp_fail_context(status, "%s: tensor %s", file, source);
    snprintf(e->source, sizeof e->source, "%s", source);
    e->stage = stage;
    if (!(e->pieces = calloc((size_t)m->config.tp, sizeof *e->pieces))) return tp_fail(TP_ERR_NOMEM, "out of memory");
    m->num_tensors++;
    *out = e;
    return TP_OK;
}

/* A new tensor of stage described by d, its piece at tp rank 0 t. */
static int add_entry(megatron_checkpoint *m, const char *file, int stage, const char *source, const ckpt_tensor_desc *d,
                     const pickle_value *t)
{
    megatron_tensor_entry *e;
    TP_TRY(new_entry(m, file, stage, source, d, &e));
    TP_TRY(check_piece(m, e, t, file));
    e->pieces[0] = t;
    return TP_OK;
}

static int add_stage_param(megatron_checkpoint *m, int index)
{
    TP_TRY(array_reserve((void **)&m->stage_params, &m->stage_params_capacity, m->num_stage_params + 1,
                         sizeof *m->stage_params));
    m->stage_params[m->num_stage_params++] = index;
    return TP_OK;
}

static int add_tensor(chunk_walk *w, const char *source, const char *name, const pickle_value *t)
{
    ckpt_tensor_desc d;
    megatron_describe(&w->m->config, name, &d);
    float_dtype(t, &d.dtype); /* a norm kept in fp32 beside bf16 weights stays fp32 */
    TP_TRY(add_entry(w->m, w->file, w->stage, source, &d, t));
    return add_stage_param(w->m, w->m->num_tensors - 1);
}

static int visit_tensor(void *ctx, const char *path, const pickle_value *t)
{
    chunk_walk *w = ctx;
    char name[CKPT_NAME_MAX + 1];
    int kind;
    int status = megatron_canonical_name(&w->m->config, path, w->first_layer, w->chunk_layers, name, sizeof name, &kind);
    if (status) return tp_fail_context(status, "%s", w->file);
    if (kind == MEGATRON_NAME_SKIP) return TP_OK;
    /* Megatron-Core's flat names start at the module: no language_model. */
    if (!has_prefix(path, "language_model.") && has_prefix(path, "decoder.")) w->m->config.core_names = 1;
    if (has_suffix(name, ".input_norm.weight"))
        w->m->config.naming = has_suffix(path, "linear_qkv.layer_norm_weight") ? MEGATRON_NAMES_CORE
                              : has_prefix(path, "decoder.")                    ? MEGATRON_NAMES_CORE_LOCAL
                              : has_suffix(path, "input_layernorm.weight")      ? MEGATRON_NAMES_LEGACY_LAYERNORM
                                                                                : MEGATRON_NAMES_LEGACY;
    if (kind == MEGATRON_NAME_HEAD_COPY) {
        /* The last stage's copy of the tied word embeddings: same piece shape. */
        megatron_tensor_entry copy = {0};
        ckpt_tensor_desc d;
        megatron_describe(&w->m->config, "embedding.word_embeddings.weight", &d);
        if (ckpt_tensor_copy_init(&copy.copy, &d)) return tp_fail_context(TP_ERR_FORMAT, "%s", w->file);
        snprintf(copy.source, sizeof copy.source, "%s", path);
        w->head_copies++;
        TP_TRY(check_piece(w->m, &copy, t, w->file));
        w->m->head_copies[w->stage * w->m->config.tp + w->tp_rank] = t;
        return w->tp_rank == 0 ? add_stage_param(w->m, HEAD_COPY) : TP_OK;
    }
    if (w->tp_rank == 0) return add_tensor(w, path, name, t);
    /* Other ranks of the stage hold the same tensors in the same order. */
    int index = w->chunk_start + w->next++;
    if (index >= w->m->num_tensors || strcmp(w->m->tensors[index].copy.name, name))
        return tp_fail(TP_ERR_FORMAT, "%s: tensor %s is not where tensor-parallel rank 0 of the stage has it", w->file, path);
    megatron_tensor_entry *e = &w->m->tensors[index];
    TP_TRY(check_piece(w->m, e, t, w->file));
    e->pieces[w->tp_rank] = t;
    return TP_OK;
}

static int read_stage(megatron_checkpoint *m, int stage)
{
    const megatron_config *c = &m->config;
    int64_t chunk_layers = c->num_layers / ((int64_t)c->pp * c->vpp);
    for (int v = 0; v < c->vpp; v++) {
        int chunk_start = m->num_tensors;
        m->chunk_first[stage * c->vpp + v] = m->num_stage_params;
        for (int t = 0; t < c->tp; t++) {
            const torch_archive *a = m->archives[stage * c->tp + t];
            char key[32];
            snprintf(key, sizeof key, c->vpp > 1 ? "model%d" : "model", v);
            const pickle_value *model = pickle_get(torch_archive_root(a), key);
            if (!model || model->kind != PICKLE_DICT)
                return tp_fail(TP_ERR_FORMAT, "%s: no '%s' dict of weights", torch_archive_path(a), key);
            /* Megatron's interleaved schedule: chunk v of stage p holds layers
             * from v * (L / vpp) + p * (L / (pp * vpp)). */
            chunk_walk w = {.m = m, .stage = stage, .tp_rank = t, .first_layer = v * (c->num_layers / c->vpp) + stage * chunk_layers,
                            .chunk_layers = chunk_layers, .file = torch_archive_path(a), .chunk_start = chunk_start};
            TP_TRY(pickle_walk_tensors(torch_archive_doc(a), model, visit_tensor, &w));
            if (t > 0 && chunk_start + w.next != m->num_tensors)
                return tp_fail(TP_ERR_FORMAT, "%s: %d tensors where tensor-parallel rank 0 of the stage has %d", w.file, w.next,
                               m->num_tensors - chunk_start);
            if (w.head_copies) m->config.tied_head_copy = 1;
        }
    }
    m->chunk_first[(stage + 1) * c->vpp] = m->num_stage_params;
    return TP_OK;
}

/* ------------------------------------------------------- optimizer state */

/* The optimizer numbers a rank's parameters without naming them
 * (docs/MEGATRON.md section 7): named_parameters() order, regrouped into
 * the param groups, which Megatron keys by weight decay (none for biases
 * and vectors). The state is matched to parameters by that rule, checked
 * against each group's count and every tensor's shape; a layout the rule
 * does not explain is refused, never guessed. */

int megatron_no_weight_decay(const ckpt_tensor_desc *d)
{
    return d->ndim == 1 || has_suffix(d->param ? d->param : d->name, ".bias");
}

/* Whether the stage's parameter index (or HEAD_COPY) has no weight decay. */
static int no_weight_decay(const megatron_checkpoint *m, int index)
{
    return index != HEAD_COPY && megatron_no_weight_decay(&m->tensors[index].copy.desc); /* the copy: a matrix */
}

int megatron_group_no_weight_decay(const pickle_value *group, const char *file, int64_t g, int *out)
{
    const pickle_value *v = pickle_get(group, "wd_mult");
    if (!v || (v->kind != PICKLE_FLOAT && v->kind != PICKLE_INT)) v = pickle_get(group, "weight_decay");
    if (!v || (v->kind != PICKLE_FLOAT && v->kind != PICKLE_INT))
        return tp_fail(TP_ERR_FORMAT, "%s: optimizer param group %lld has neither wd_mult nor weight_decay: which "
                       "parameters it holds cannot be told", file, (long long)g);
    *out = v->kind == PICKLE_FLOAT ? v->real == 0 : v->integer == 0;
    return TP_OK;
}

/* One optimizer tensor of the parameter at index (role "exp_avg",
 * "exp_avg_sq" or "master") at tp_rank: a tensor of its own, described as
 * its parameter, fp32. The tied head copy's state is checked, not kept (the
 * embeddings' state is the same, and written again for the copy). */
/* The description of a parameter's optimizer state of role: the
 * parameter's (index, or the head copy's: the word embeddings'), fp32,
 * named optim/ROLE/NAME; its strings in s (adding an entry moves
 * m->tensors). */
typedef struct {
    char name[CKPT_NAME_MAX + 32], param[CKPT_NAME_MAX + 1];
    ckpt_tensor_desc desc;
} state_desc;

static void describe_state(const megatron_checkpoint *m, int index, const char *role, state_desc *s)
{
    snprintf(s->param, sizeof s->param, "%s", index == HEAD_COPY ? "embedding.word_embeddings.weight" : m->tensors[index].copy.name);
    megatron_describe(&m->config, s->param, &s->desc);
    snprintf(s->name, sizeof s->name, "optim/%s/%s", role, s->param);
    s->desc.role = role;
    s->desc.param = s->param;
    s->desc.name = s->name;
    s->desc.dtype = TP_FP32;
}

/* The entry tensor-parallel rank 0 added, for a piece of another rank. */
static int rank0_entry(megatron_checkpoint *m, const char *name, const char *source, const char *file,
                       megatron_tensor_entry **out)
{
    for (int i = 0; i < m->num_tensors; i++)
        if (!strcmp(m->tensors[i].copy.name, name)) {
            *out = &m->tensors[i];
            return TP_OK;
        }
    return tp_fail(TP_ERR_FORMAT, "%s: optimizer %s (%s) has no counterpart at tensor-parallel rank 0", file, source, name);
}

/* Keeps the tied head copy's state of role at (stage, tp_rank). */
static int keep_head_state(megatron_checkpoint *m, int stage, int tp_rank, const char *role, const pickle_value *t,
                           int64_t flat_offset)
{
    int r = !strcmp(role, "exp_avg") ? 0 : !strcmp(role, "exp_avg_sq") ? 1 : 2;
    if (!m->head_states &&
        !(m->head_states = calloc((size_t)m->config.tp * (size_t)m->config.pp * 3, sizeof *m->head_states)))
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    m->head_states[(stage * m->config.tp + tp_rank) * 3 + r] = (struct head_state){t, flat_offset};
    return TP_OK;
}

static int add_optimizer_piece(megatron_checkpoint *m, int stage, int tp_rank, int index, const char *role,
                               const char *source, const pickle_value *t, const char *file)
{
    if (!t || t->kind != PICKLE_TENSOR)
        return tp_fail(TP_ERR_FORMAT, "%s: optimizer %s is not a tensor", file, source);
    state_desc d;
    describe_state(m, index, role, &d);
    if (index == HEAD_COPY) { /* checked against what it should be */
        megatron_tensor_entry probe = {0};
        TP_TRY(ckpt_tensor_copy_init(&probe.copy, &d.desc));
        snprintf(probe.source, sizeof probe.source, "%s", source);
        TP_TRY(check_piece(m, &probe, t, file));
        return keep_head_state(m, stage, tp_rank, role, t, -1);
    }
    if (tp_rank == 0) return add_entry(m, file, stage, source, &d.desc, t);
    megatron_tensor_entry *e = NULL;
    TP_TRY(rank0_entry(m, d.name, source, file, &e));
    TP_TRY(check_piece(m, e, t, file));
    e->pieces[tp_rank] = t;
    return TP_OK;
}

/* ------------------------------------------- the distributed optimizer */

/* One state of the parameter at index (or the head copy, only checked) from
 * a flat world tensor of distrib_optim.pt, at element offset. */
static int add_flat_piece(megatron_checkpoint *m, int stage, int tp_rank, int index, const char *role, const char *source,
                          const pickle_value *world, int64_t offset, const char *file)
{
    state_desc d;
    describe_state(m, index, role, &d);
    int64_t shape[CKPT_MAX_DIMS], numel = 1;
    ckpt_piece_shape(&d.desc, m->config.tp, shape);
    for (int k = 0; k < d.desc.ndim; k++) numel *= shape[k];
    if (offset < 0 || offset + numel > torch_tensor_numel(world))
        return tp_fail(TP_ERR_FORMAT, "%s: %s: elements [%lld, %lld) of %s lie outside its %lld", file, source, (long long)offset,
                       (long long)(offset + numel), d.param, (long long)torch_tensor_numel(world));
    if (index == HEAD_COPY) return keep_head_state(m, stage, tp_rank, role, world, offset);
    megatron_tensor_entry *e = NULL;
    if (tp_rank == 0) {
        TP_TRY(new_entry(m, file, stage, source, &d.desc, &e));
        if (!(e->flat_offset = calloc((size_t)m->config.tp, sizeof *e->flat_offset))) return tp_fail(TP_ERR_NOMEM, "out of memory");
    } else {
        TP_TRY(rank0_entry(m, d.name, source, file, &e));
        if (!e->flat_offset)
            return tp_fail(TP_ERR_FORMAT, "%s: %s is in distrib_optim.pt, tensor-parallel rank 0's in its rank file", file, source);
    }
    e->pieces[tp_rank] = world;
    e->flat_offset[tp_rank] = offset;
    return TP_OK;
}

/* The world tensors of one model chunk's buffer: {(param dtype, grad
 * dtype): {param, exp_avg, exp_avg_sq, numel_unpadded}}. */
static int chunk_buffer(const pickle_value *root, int chunk, const char *path, const pickle_value *world[3], int64_t *numel)
{
    const pickle_value *buffers = pickle_get_int(root, chunk);
    if (!buffers || buffers->kind != PICKLE_DICT || buffers->dict.values.count != 1)
        return tp_fail(TP_ERR_LAYOUT, "%s: model chunk %d has %lld buffers; one per chunk (one parameter dtype) is read", path,
                       chunk, buffers && buffers->kind == PICKLE_DICT ? (long long)buffers->dict.values.count : 0LL);
    const pickle_value *state = buffers->dict.values.items[0], *n = pickle_get(state, "numel_unpadded");
    if (!n || n->kind != PICKLE_INT)
        return tp_fail(TP_ERR_FORMAT, "%s: the buffer of model chunk %d has no numel_unpadded", path, chunk);
    *numel = n->integer;
    const char *keys[3] = {"param", "exp_avg", "exp_avg_sq"};
    for (int k = 0; k < 3; k++) {
        world[k] = pickle_get(state, keys[k]);
        if (!world[k] || world[k]->kind != PICKLE_TENSOR || world[k]->tensor->storage->storage.dtype != TORCH_FLOAT32 ||
            world[k]->tensor->ndim != 1 || world[k]->tensor->shape[0] != *numel || !torch_tensor_is_contiguous(world[k]))
            return tp_fail(TP_ERR_FORMAT, "%s: %s of model chunk %d is not an fp32 vector of numel_unpadded %lld elements", path,
                           keys[k], chunk, (long long)*numel);
    }
    return TP_OK;
}

/* Megatron keeps each parameter as its fp32 main copy rounded (an fp32
 * one as the copy itself: DistributedOptimizer.
 * _copy_main_params_to_model_params), and distrib_optim.pt holds the main
 * copies apart from the rank file that holds the weights. Nothing else ties
 * the two: another rank's or stage's distrib_optim.pt of the same buffer
 * sizes (two tensor-parallel ranks always have them) would be read as this
 * rank's, every moment in another rank's rows. The main copy found at
 * offset must round to the weight; checked on the first elements of the
 * parameters outside the layers and of the chunk's first layer, as
 * megatron_dist.c checks a dp_reshardable buffer's order. */
static int check_main_copy(const char *path, const char *file, int chunk, const char *name, const torch_archive *weights,
                           const pickle_value *weight, const torch_archive *state, const pickle_value *main, int64_t offset)
{
    tp_dtype dtype;
    if (!float_dtype(weight, &dtype)) /* check_piece refused other dtypes at open */
        return tp_fail(TP_ERR_FORMAT, "%s: %s is not of a floating-point dtype", file, name);
    int64_t n = torch_tensor_numel(weight) < 8 ? torch_tensor_numel(weight) : 8;
    size_t size = tp_dtype_size(dtype);
    float copy[8];
    unsigned char stored[8 * sizeof(float)], rounded[8 * sizeof(float)];
    TP_TRY(torch_tensor_read(weights, weight, stored, 0, n * (int64_t)size));
    TP_TRY(torch_tensor_read(state, main, copy, offset * 4, n * 4));
    /* convert_numbers, not convert_from_f32: its target clones do not link under clang's sanitizers */
    convert_numbers(copy, TP_FP32, rounded, dtype, n);
    for (int64_t i = 0; i < n; i++)
        if (memcmp(stored + i * size, rounded + i * size, size)) {
            float w;
            convert_numbers(stored + i * size, dtype, &w, TP_FP32, 1);
            /* A diverged run's NaN: PyTorch's copy writes its canonical NaN,
             * our rounding keeps the main copy's sign and payload. */
            if (isnan(w) && isnan(copy[i])) continue;
            return tp_fail(TP_ERR_FORMAT, "%s: the main copy of %s (model chunk %d param[%lld:]) is not the weight %s holds "
                           "(element %lld: %.9g, the weight %.9g): this distrib_optim.pt is of another rank, stage or save",
                           path, name, chunk, (long long)offset, file, (long long)i, (double)copy[i], (double)w);
        }
    return TP_OK;
}

/* The distributed optimizer's state of one rank (docs/MEGATRON.md section
 * 8): the parameters are views into their chunk's buffer, so each one's
 * storage offset in the model file is its buffer offset; the world tensors
 * are the buffer's buckets cut to their unpadded size and concatenated. A
 * bucket is the run of parameters between shared embeddings (each in a
 * bucket of its own); the sizes must add up to numel_unpadded, which
 * rejects buckets cut by size (--overlap-grad-reduce) rather than guess. */
static int read_rank_distributed(megatron_checkpoint *m, int stage, int tp_rank, const char *file)
{
    const megatron_config *c = &m->config;
    char path[4400];
    snprintf(path, sizeof path, "%.*s/distrib_optim.pt", (int)(strrchr(file, '/') - file), file);
    store_stat st;
    TP_TRY(stat_path(path, &st));
    if (!st.exists)
        return tp_fail(TP_ERR_FORMAT, "%s: missing; %s holds the distributed optimizer's settings only", path, file);
    if (!m->distrib_optim && !(m->distrib_optim = calloc((size_t)c->tp * (size_t)c->pp, sizeof *m->distrib_optim)))
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    torch_archive **archive = &m->distrib_optim[stage * c->tp + tp_rank];
    TP_TRY(torch_archive_open(path, NULL, archive));
    const pickle_value *root = torch_archive_root(*archive), *coalesced = pickle_get(root, "buckets_coalesced");
    if (!coalesced || coalesced->kind != PICKLE_BOOL || !coalesced->integer)
        return tp_fail(TP_ERR_LAYOUT, "%s: the distributed optimizer's state without buckets_coalesced (Megatron-LM before "
                       "April 2024) is not read yet", path);
    int status = TP_OK;
    for (int v = 0; v < c->vpp && !status; v++) {
        const pickle_value *world[3];
        int64_t numel_unpadded = 0;
        TP_TRY(chunk_buffer(root, v, path, world, &numel_unpadded));
        int first = m->chunk_first[stage * c->vpp + v], n = m->chunk_first[stage * c->vpp + v + 1] - first;
        int64_t *start = calloc((size_t)n + 1, sizeof *start), *offset = calloc((size_t)n + 1, sizeof *offset);
        int *order = calloc((size_t)n + 1, sizeof *order);
        if (!start || !offset || !order) status = tp_fail(TP_ERR_NOMEM, "out of memory");
        const pickle_value *storage = NULL;
        for (int k = 0; k < n && !status; k++) {
            int index = m->stage_params[first + k];
            const pickle_value *t = index == HEAD_COPY ? m->head_copies[stage * c->tp + tp_rank] : m->tensors[index].pieces[tp_rank];
            if (!storage) storage = t->tensor->storage;
            if (strcmp(t->tensor->storage->storage.key, storage->storage.key))
                status = tp_fail(TP_ERR_LAYOUT, "%s: the parameters of model chunk %d do not share one buffer (%s is apart): "
                                 "their places in the optimizer's buffer are unknown", file, v,
                                 index == HEAD_COPY ? "the head copy" : m->tensors[index].source);
            start[k] = t->tensor->offset;
            order[k] = k;
        }
        /* Buffer order: by offset (an insertion sort; a chunk has few hundred). */
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && start[order[j]] < start[order[j - 1]]; j--) {
                int swap = order[j];
                order[j] = order[j - 1];
                order[j - 1] = swap;
            }
        int64_t base = 0, bucket_start = 0, end = 0;
        int open = 0, previous_shared = 0;
        for (int i = 0; i < n && !status; i++) {
            int k = order[i], index = m->stage_params[first + k];
            int shared = c->pp > 1 && !c->untied &&
                         (index == HEAD_COPY || !strcmp(m->tensors[index].copy.name, "embedding.word_embeddings.weight"));
            const pickle_value *t = index == HEAD_COPY ? m->head_copies[stage * c->tp + tp_rank] : m->tensors[index].pieces[tp_rank];
            if (open && start[k] < end)
                status = tp_fail(TP_ERR_FORMAT, "%s: parameters overlap in the buffer of model chunk %d", file, v);
            if (open && (shared || previous_shared)) { /* a shared embedding's bucket of its own */
                /* Megatron closes the bucket before it at the embedding's start
                 * padded to 64 elements (the gap counted in numel_unpadded, as
                 * megatron_buffer_layout reads torch_dist's), the one after it at
                 * its end. */
                base += (shared ? (end + 63) / 64 * 64 : end) - bucket_start;
                open = 0;
            }
            if (!open) {
                bucket_start = start[k];
                open = 1;
            }
            offset[k] = base + start[k] - bucket_start;
            end = start[k] + torch_tensor_numel(t);
            previous_shared = shared;
        }
        if (!status && n && base + end - bucket_start != numel_unpadded)
            status = tp_fail(TP_ERR_LAYOUT, "%s: the parameters of model chunk %d fill %lld elements of their buckets, the state "
                             "has %lld: buckets cut by size (--overlap-grad-reduce) are not read yet", path, v,
                             (long long)(base + end - bucket_start), (long long)numel_unpadded);
        int64_t first_layer = -1; /* the chunk's first layer, whose parameters' main copies are checked */
        for (int k = 0; k < n; k++) {
            int index = m->stage_params[first + k];
            const ckpt_tensor_desc *d = index == HEAD_COPY ? NULL : &m->tensors[index].copy.desc;
            if (d && d->anchor == CKPT_ANCHOR_LAYER && (first_layer < 0 || d->layer < first_layer)) first_layer = d->layer;
        }
        for (int k = 0; k < n && !status; k++) {
            int index = m->stage_params[first + k];
            const ckpt_tensor_desc *d = index == HEAD_COPY ? NULL : &m->tensors[index].copy.desc;
            if (d && d->anchor == CKPT_ANCHOR_LAYER && d->layer != first_layer) continue;
            const pickle_value *t = index == HEAD_COPY ? m->head_copies[stage * c->tp + tp_rank] : m->tensors[index].pieces[tp_rank];
            status = check_main_copy(path, file, v, d ? m->tensors[index].source : "the tied head copy",
                                     m->archives[stage * c->tp + tp_rank], t, *archive, world[0], offset[k]);
        }
        const char *roles[3] = {"master", "exp_avg", "exp_avg_sq"};
        for (int k = 0; k < n && !status; k++)
            for (int r = c->dtype == TP_FP32 ? 1 : 0; r < 3 && !status; r++) { /* fp32 parameters are their masters */
                char source[160];
                snprintf(source, sizeof source, "distrib_optim.pt chunk %d %s[%lld:]", v, r ? roles[r] : "param", (long long)offset[k]);
                status = add_flat_piece(m, stage, tp_rank, m->stage_params[first + k], roles[r], source, world[r], offset[k], path);
            }
        free(start);
        free(offset);
        free(order);
    }
    return status;
}

static int read_rank_optimizer(megatron_checkpoint *m, int stage, int tp_rank, const int *params, int num_params)
{
    const torch_archive *a = m->archives[stage * m->config.tp + tp_rank];
    const char *file = torch_archive_path(a);
    const pickle_value *opt = pickle_get(torch_archive_root(a), "optimizer");
    if (!opt || opt->kind != PICKLE_DICT)
        return tp_fail(TP_ERR_FORMAT, "%s: no optimizer dict, where the first rank file has one", file);
    /* Float16OptimizerWithFloat16Params wraps the torch optimizer's state
     * dict with the fp32 master weights; FP32Optimizer's is the inner one. */
    const pickle_value *inner = pickle_get(opt, "optimizer"), *masters = NULL;
    if (inner && inner->kind == PICKLE_DICT) masters = pickle_get(opt, "fp32_from_fp16_params");
    else inner = opt;
    const pickle_value *state = pickle_get(inner, "state"), *groups = pickle_get(inner, "param_groups");
    if (!groups || groups->kind != PICKLE_LIST)
        return tp_fail(TP_ERR_FORMAT, "%s: the optimizer state has no param_groups list", file);
    if (!state) return read_rank_distributed(m, stage, tp_rank, file); /* the state is in distrib_optim.pt */
    if (state->kind != PICKLE_DICT) return tp_fail(TP_ERR_FORMAT, "%s: optimizer state is a %s, not a dict", file,
                                                   pickle_kind_name(state->kind));
    int want_masters = m->config.dtype != TP_FP32;
    if (want_masters && (!masters || masters->kind != PICKLE_LIST || masters->items.count != groups->items.count))
        return tp_fail(TP_ERR_FORMAT, "%s: %s parameters without fp32_from_fp16_params holding one list per param group (%lld)",
                       file, tp_dtype_name(m->config.dtype), (long long)groups->items.count);
    char *taken = calloc((size_t)num_params + 1, 1);
    if (!taken) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int status = TP_OK, seen[2] = {0, 0};
    for (int64_t g = 0; g < groups->items.count && !status; g++) {
        const pickle_value *group = groups->items.items[g], *ids = pickle_get(group, "params");
        int cls = 0;
        status = megatron_group_no_weight_decay(group, file, g, &cls);
        if (!status && (!ids || ids->kind != PICKLE_LIST))
            status = tp_fail(TP_ERR_FORMAT, "%s: optimizer param group %lld has no params list", file, (long long)g);
        if (!status && seen[cls]++)
            status = tp_fail(TP_ERR_LAYOUT, "%s: two optimizer param groups %s weight decay (learning-rate multipliers?): "
                             "which parameters each holds is not recorded", file, cls ? "without" : "with");
        const pickle_value *group_masters = status || !want_masters ? NULL : masters->items.items[g];
        if (!status && want_masters && (group_masters->kind != PICKLE_LIST || group_masters->items.count != ids->items.count))
            status = tp_fail(TP_ERR_FORMAT, "%s: fp32_from_fp16_params[%lld] does not hold one tensor per parameter of its group",
                             file, (long long)g);
        int k = 0;
        for (int64_t j = 0; !status && j < ids->items.count; j++, k++) {
            while (k < num_params && (taken[k] || no_weight_decay(m, params[k]) != cls)) k++;
            const pickle_value *id = ids->items.items[j];
            if (k == num_params || id->kind != PICKLE_INT) {
                status = tp_fail(TP_ERR_FORMAT, "%s: optimizer param group %lld lists %lld parameters, more than the stage has %s "
                                 "weight decay", file, (long long)g, (long long)ids->items.count, cls ? "without" : "with");
                break;
            }
            taken[k] = 1;
            const pickle_value *entry = pickle_get_int(state, id->integer);
            char source[128];
            snprintf(source, sizeof source, "state[%lld]", (long long)id->integer);
            if (!entry || entry->kind != PICKLE_DICT) {
                status = tp_fail(TP_ERR_FORMAT, "%s: optimizer %s (parameter %d of the stage) is missing", file, source, k);
                break;
            }
            const char *roles[] = {"exp_avg", "exp_avg_sq"};
            for (int r = 0; r < 2 && !status; r++) {
                snprintf(source, sizeof source, "state[%lld].%s", (long long)id->integer, roles[r]);
                status = add_optimizer_piece(m, stage, tp_rank, params[k], roles[r], source, pickle_get(entry, roles[r]), file);
            }
            if (!status && want_masters) {
                snprintf(source, sizeof source, "fp32_from_fp16_params[%lld][%lld]", (long long)g, (long long)j);
                status = add_optimizer_piece(m, stage, tp_rank, params[k], "master", source, group_masters->items.items[j], file);
            }
        }
    }
    for (int k = 0; k < num_params && !status; k++)
        if (!taken[k])
            status = tp_fail(TP_ERR_FORMAT, "%s: parameter %s is in no optimizer param group", file,
                             params[k] == HEAD_COPY ? "word_embeddings_for_head" : m->tensors[params[k]].source);
    free(taken);
    return status;
}

/* The optimizer state of every rank, or the reason it cannot be read in
 * m->optimizer_refusal (the weights are read either way). */
static int read_optimizer(megatron_checkpoint *m)
{
    const int *chunk_first = m->chunk_first, vpp = m->config.vpp;
    int model_tensors = m->num_tensors, status = TP_OK;
    for (int p = 0; p < m->config.pp && !status; p++)
        for (int t = 0; t < m->config.tp && !status; t++)
            status = read_rank_optimizer(m, p, t, m->stage_params + chunk_first[p * vpp],
                                         chunk_first[(p + 1) * vpp] - chunk_first[p * vpp]);
    if (status == TP_ERR_FORMAT || status == TP_ERR_LAYOUT) {
        snprintf(m->optimizer_refusal, sizeof m->optimizer_refusal, "%s", tp_errmsg());
        m->optimizer_status = status;
        for (int i = model_tensors; i < m->num_tensors; i++) {
            free(m->tensors[i].pieces);
            free(m->tensors[i].flat_offset);
        }
        m->num_tensors = model_tensors;
        free(m->head_states);
        m->head_states = NULL;
        for (int i = 0; m->distrib_optim && i < m->config.tp * m->config.pp; i++) torch_archive_close(m->distrib_optim[i]);
        free(m->distrib_optim);
        m->distrib_optim = NULL;
        return TP_OK;
    }
    if (!status) m->config.optimizer_read = 1;
    if (!status && m->distrib_optim) m->config.distributed_optimizer = 1;
    return status;
}

/* Every tensor the args describe is there, once. */
static int check_complete(const megatron_checkpoint *m)
{
    const megatron_config *c = &m->config;
    int layers_seen = 0;
    for (int i = 0; i < m->num_tensors; i++)
        if (has_prefix(m->tensors[i].copy.name, "layers.") && has_suffix(m->tensors[i].copy.name, ".attention.qkv.weight"))
            layers_seen++;
    if (layers_seen != c->num_layers)
        return tp_fail(TP_ERR_FORMAT, "%s: %d layers' attention weights found, args says %lld layers", m->path, layers_seen,
                       (long long)c->num_layers);
    const char *required[] = {"embedding.word_embeddings.weight", "final_norm.weight", c->untied ? "output_layer.weight" : NULL};
    for (int r = 0; r < 3; r++) {
        if (!required[r]) continue;
        int found = 0;
        for (int i = 0; i < m->num_tensors && !found; i++) found = !strcmp(m->tensors[i].copy.name, required[r]);
        if (!found) return tp_fail(TP_ERR_FORMAT, "%s: no %s in any rank file", m->path, required[r]);
    }
    return TP_OK;
}

/* Another rank file of the checkpoint m opens (rank 0's config read): what
 * every rank of one save shares (the model, the layout, the iteration, the
 * seed) is the same, or it is a file of another run or iteration. */
static int check_same_checkpoint(const megatron_checkpoint *m, const torch_archive *archive)
{
    const char *file = torch_archive_path(archive), *first = torch_archive_path(m->archives[0]);
    megatron_config other;
    memset(&other, 0, sizeof other);
    TP_TRY(megatron_config_read(archive, &other));
    const megatron_config *c = &m->config;
    const struct {
        const char *name;
        int64_t here, rank0;
    } shared[] = {{"tensor_model_parallel_size", other.tp, c->tp},
                  {"pipeline_model_parallel_size", other.pp, c->pp},
                  {"virtual_pipeline_model_parallel_size", other.vpp, c->vpp},
                  {"num_layers", other.num_layers, c->num_layers},
                  {"hidden_size", other.hidden, c->hidden},
                  {"ffn_hidden_size", other.ffn, c->ffn},
                  {"num_attention_heads", other.heads, c->heads},
                  {"num_query_groups", other.query_groups, c->query_groups},
                  {"kv_channels", other.kv_channels, c->kv_channels},
                  {"padded_vocab_size", other.padded_vocab, c->padded_vocab},
                  {"params_dtype", other.dtype, c->dtype},
                  {"iteration", other.stored_iteration, c->stored_iteration},
                  {"consumed_train_samples", other.consumed_samples, c->consumed_samples}};
    for (size_t i = 0; i < sizeof shared / sizeof *shared; i++)
        if (shared[i].here != shared[i].rank0)
            return tp_fail(TP_ERR_FORMAT, "%s: %s %lld, rank 0's file (%s) %lld: a rank file of another checkpoint", file,
                           shared[i].name, (long long)shared[i].here, first, (long long)shared[i].rank0);
    if (other.checkpoint_version != c->checkpoint_version)
        return tp_fail(TP_ERR_FORMAT, "%s: checkpoint_version %g, rank 0's file (%s) %g: a rank file of another checkpoint",
                       file, other.checkpoint_version, first, c->checkpoint_version);
    /* Every rank of a run has its seed; another run's file, another seed. */
    const pickle_value *args = pickle_get(torch_archive_root(archive), "args"), *args0 = megatron_args(m);
    const pickle_value *seed = pickle_get(args, "seed"), *seed0 = pickle_get(args0, "seed");
    if (seed && seed0 && seed->kind == PICKLE_INT && seed0->kind == PICKLE_INT && seed->integer != seed0->integer)
        return tp_fail(TP_ERR_FORMAT, "%s: args.seed %lld, rank 0's file (%s) %lld: a rank file of another run", file,
                       (long long)seed->integer, first, (long long)seed0->integer);
    return TP_OK;
}

int megatron_open(const char *path, megatron_checkpoint **out)
{
    *out = NULL;
    megatron_checkpoint *m = calloc(1, sizeof *m);
    if (!m) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int status = megatron_iteration_dir(path, m->path, sizeof m->path);
    /* What is read must stay: a replacement of the save directory or of the
     * iteration waits for, or refuses, this reader. */
    if (!status) status = store_hold_shared(path, &m->holds[0]);
    if (!status && strcmp(path, m->path)) status = store_hold_shared(m->path, &m->holds[1]);
    /* Rank 0's file tells the layout; pp > 1 names it mp_rank_00_000. */
    char file[4400];
    torch_archive *first = NULL;
    store_stat st = {0};
    int pp_named = 0;
    if (!status) {
        rank_file(m, 0, 0, 1, file, sizeof file);
        status = stat_path(file, &st);
        if (!status && !st.exists) {
            rank_file(m, 0, 0, 2, file, sizeof file);
            status = stat_path(file, &st);
            pp_named = 1;
        }
        if (!status && !st.exists)
            status = tp_fail(TP_ERR_NOT_FOUND, "%s: neither mp_rank_00/" MEGATRON_RANK_FILE " nor mp_rank_00_000/" MEGATRON_RANK_FILE
                             ": not a Megatron-LM checkpoint", m->path);
    }
    if (!status) status = torch_archive_open(file, NULL, &first);
    if (!status) status = megatron_config_read(first, &m->config);
    /* A release checkpoint is loaded as iteration 0 whatever it records;
     * iter_NNNNNNN holds iteration N. */
    char parent[4300], base[256] = ""; /* "iter_0000010/" is iter_0000010 */
    if (!status) status = tp_split_path(m->path, parent, sizeof parent, base, sizeof base);
    if (!status && !strcmp(base, "release")) m->config.iteration = -1;
    else if (!status && megatron_iteration_dir_name(base) && m->config.stored_iteration >= 0 &&
             strtoll(base + 5, NULL, 10) != m->config.stored_iteration)
        status = tp_fail(TP_ERR_FORMAT, "%s: iteration %lld, in the directory of iteration %lld (%s): a rank file of "
                         "another checkpoint", file, (long long)m->config.stored_iteration, strtoll(base + 5, NULL, 10), base);
    if (!status && pp_named != (m->config.pp > 1))
        status = tp_fail(TP_ERR_FORMAT, "%s: args says pipeline-parallel size %d, the files are named for %s", file, m->config.pp,
                         pp_named ? "pp > 1" : "pp 1");
    const megatron_config *c = &m->config;
    if (!status && (!(m->archives = calloc((size_t)c->tp * (size_t)c->pp, sizeof *m->archives)) ||
                    !(m->head_copies = calloc((size_t)c->tp * (size_t)c->pp, sizeof *m->head_copies)) ||
                    !(m->chunk_first = calloc((size_t)c->pp * (size_t)c->vpp + 1, sizeof *m->chunk_first))))
        status = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!status) m->archives[0] = first;
    else torch_archive_close(first);
    for (int p = 0; p < (status ? 0 : c->pp); p++) {
        for (int t = 0; t < c->tp && !status; t++) {
            if (p == 0 && t == 0) continue;
            rank_file(m, p, t, c->pp, file, sizeof file);
            status = torch_archive_open(file, NULL, &m->archives[p * c->tp + t]);
            if (!status) status = check_same_checkpoint(m, m->archives[p * c->tp + t]);
        }
    }
    for (int p = 0; p < (status ? 0 : c->pp) && !status; p++) status = read_stage(m, p);
    if (!status) status = check_complete(m);
    if (!status && c->has_optimizer) status = read_optimizer(m);
    if (!status && m->config.core_names && m->config.naming < MEGATRON_NAMES_CORE) m->config.naming = MEGATRON_NAMES_CORE;
    if (status) {
        megatron_close(m);
        return status;
    }
    *out = m;
    return TP_OK;
}

void megatron_close(megatron_checkpoint *m)
{
    if (!m) return;
    for (int i = 0; m->archives && i < m->config.tp * m->config.pp; i++) torch_archive_close(m->archives[i]);
    for (int i = 0; m->distrib_optim && i < m->config.tp * m->config.pp; i++) torch_archive_close(m->distrib_optim[i]);
    for (int i = 0; i < m->num_tensors; i++) {
        free(m->tensors[i].pieces);
        free(m->tensors[i].flat_offset);
    }
    free(m->archives);
    free(m->distrib_optim);
    free(m->head_copies);
    free(m->head_states);
    free(m->chunk_first);
    free(m->tensors);
    free(m->stage_params);
    store_hold_release(m->holds[0]);
    store_hold_release(m->holds[1]);
    free(m);
}

const megatron_config *megatron_config_of(const megatron_checkpoint *m)
{
    return &m->config;
}

int64_t megatron_vocab_with_padding(int64_t vocab, int64_t divisible_by, int tp)
{
    int64_t multiple = divisible_by * tp;
    return multiple > 0 ? (vocab + multiple - 1) / multiple * multiple : 0;
}

int megatron_is_vocabulary_table(const char *param)
{
    return !strcmp(param, "embedding.word_embeddings.weight") || !strcmp(param, "output_layer.weight");
}

void megatron_describe_vocabulary(const megatron_config *c, ckpt_tensor_desc *d)
{
    d->shape[0] = c->true_vocab > 0 ? c->true_vocab : c->padded_vocab;
    d->partition.kind = CKPT_SPLIT;
    d->partition.axis = 0;
    d->partition.pad_multiple = c->true_vocab > 0 ? c->vocab_divisible_by : 0;
    d->partition.num_segments = 0; /* one segment: the vocabulary */
    memset(d->partition.segments, 0, sizeof d->partition.segments);
}

int megatron_config_set_true_vocab(megatron_config *c, const char *path, int64_t true_vocab)
{
    int64_t padded = megatron_vocab_with_padding(true_vocab, c->vocab_divisible_by, c->tp);
    if (true_vocab <= 0 || padded != c->padded_vocab)
        return tp_fail(TP_ERR_ARG, "%s: a vocabulary of %lld tokens is padded to %lld rows for tp %d (a multiple of %lld x %d); "
                       "the checkpoint has %lld", path, (long long)true_vocab, (long long)padded, c->tp,
                       (long long)c->vocab_divisible_by, c->tp, (long long)c->padded_vocab);
    c->true_vocab = true_vocab;
    return TP_OK;
}

int megatron_set_true_vocab(megatron_checkpoint *m, int64_t true_vocab)
{
    TP_TRY(megatron_config_set_true_vocab(&m->config, m->path, true_vocab));
    for (int i = 0; i < m->num_tensors; i++) {
        megatron_tensor_entry *e = &m->tensors[i];
        const char *param = e->copy.desc.param ? e->copy.desc.param : e->copy.desc.name;
        if (!megatron_is_vocabulary_table(param)) continue;
        ckpt_tensor_desc d = e->copy.desc;
        megatron_describe_vocabulary(&m->config, &d);
        ckpt_tensor_copy copy;
        TP_TRY(ckpt_tensor_copy_init(&copy, &d));
        e->copy = copy;
        ckpt_tensor_copy_rebind(&e->copy);
    }
    return TP_OK;
}

const char *megatron_optimizer_refusal(const megatron_checkpoint *m, int *status)
{
    if (status) *status = m->optimizer_status;
    return m->optimizer_refusal[0] ? m->optimizer_refusal : NULL;
}

const char *megatron_path(const megatron_checkpoint *m)
{
    return m->path;
}

ckpt_layout megatron_layout(const megatron_checkpoint *m)
{
    /* Chunk v of stage p holds the layers from v (L / vpp) + p (L / (pp vpp)): chunk v pp + p of the
     * interleaved placement (docs/FORMAT.md section 2). */
    ckpt_layout layout = {.tp = m->config.tp, .pp = m->config.pp, .dp = 1, .num_layers = m->config.num_layers,
                          .virtual_stages = m->config.vpp};
    return layout;
}

int megatron_num_tensors(const megatron_checkpoint *m)
{
    return m->num_tensors;
}

const ckpt_tensor_desc *megatron_tensor(const megatron_checkpoint *m, int index)
{
    return index >= 0 && index < m->num_tensors ? &m->tensors[index].copy.desc : NULL;
}

const char *megatron_source_name(const megatron_checkpoint *m, int index)
{
    return index >= 0 && index < m->num_tensors ? m->tensors[index].source : NULL;
}

/* The file a piece lies in: the rank file, or its distrib_optim.pt. */
static const torch_archive *piece_archive(const megatron_checkpoint *m, const megatron_tensor_entry *e, int tp_rank)
{
    int rank = e->stage * m->config.tp + tp_rank;
    return e->flat_offset ? m->distrib_optim[rank] : m->archives[rank];
}

int megatron_piece_range(const megatron_checkpoint *m, int index, int tp_rank, const char **file, int64_t *offset,
                         int64_t *size)
{
    if (index < 0 || index >= m->num_tensors || tp_rank < 0 || tp_rank >= m->config.tp)
        return tp_fail(TP_ERR_ARG, "%s: no tensor %d at tensor-parallel rank %d", m->path, index, tp_rank);
    const megatron_tensor_entry *e = &m->tensors[index];
    const torch_archive *a = piece_archive(m, e, tp_rank);
    *file = torch_archive_path(a);
    if (!e->flat_offset) return torch_tensor_range(a, e->pieces[tp_rank], offset, size);
    /* A run of a flat world tensor. */
    int64_t shape[CKPT_MAX_DIMS], numel = 1;
    ckpt_piece_shape(&e->copy.desc, m->config.tp, shape);
    for (int d = 0; d < e->copy.desc.ndim; d++) numel *= shape[d];
    TP_TRY(torch_tensor_range(a, e->pieces[tp_rank], offset, size));
    *offset += e->flat_offset[tp_rank] * 4;
    *size = numel * 4;
    return TP_OK;
}

int megatron_read_piece(const megatron_checkpoint *m, int index, int tp_rank, void *buf, int64_t size)
{
    const char *file;
    int64_t offset, bytes;
    TP_TRY(megatron_piece_range(m, index, tp_rank, &file, &offset, &bytes));
    if (size != bytes)
        return tp_fail(TP_ERR_ARG, "%s: tensor %s at rank %d is %lld bytes, %lld asked", file, m->tensors[index].source, tp_rank,
                       (long long)bytes, (long long)size);
    const megatron_tensor_entry *e = &m->tensors[index];
    return torch_tensor_read(piece_archive(m, e, tp_rank), e->pieces[tp_rank], buf, e->flat_offset ? e->flat_offset[tp_rank] * 4 : 0,
                             size);
}

/* ------------------------------------------- copies of one tensor compared */

/* Bytes [from, from + size) of a tensor's data in an archive: one stored copy. */
typedef struct {
    const torch_archive *archive;
    const pickle_value *tensor;
    int64_t from, size;
} stored_copy;

typedef struct {
    int tensor;        /* the tensor read */
    int piece;         /* its piece (tensor-parallel rank) the copy is of */
    int head;          /* the copy is the tied output layer's (else tensor-parallel rank `rank`'s replica) */
    int rank;          /* the copy's tensor-parallel rank */
    stored_copy read, copy;
    int differ;        /* 1: at element `element`, whose bytes are read_bits and copy_bits; 2: sizes differ */
    int64_t element;
    unsigned char read_bits[4], copy_bits[4];
} replica_check;

#define REPLICA_BLOCK (MEGATRON_VERIFY_THREAD_BYTES / 2) /* bytes of each copy compared at a time */

/* Where tp_rank's piece of tensor index lies, as the reader reads it. */
static int piece_copy(const megatron_checkpoint *m, int index, int tp_rank, stored_copy *out)
{
    const megatron_tensor_entry *e = &m->tensors[index];
    const char *file;
    int64_t offset;
    TP_TRY(megatron_piece_range(m, index, tp_rank, &file, &offset, &out->size));
    out->archive = piece_archive(m, e, tp_rank);
    out->tensor = e->pieces[tp_rank];
    out->from = e->flat_offset ? e->flat_offset[tp_rank] * 4 : 0;
    return TP_OK;
}

/* The copies [first, first + count) of checks, of one piece: the piece
 * read once a block at a time, each copy's block compared with it. */
typedef struct {
    int64_t first;
    int count;
} replica_group;

typedef struct {
    const megatron_checkpoint *m;
    replica_check *checks;
    const replica_group *groups;
} replica_job;

static int compare_copies(void *ctx, int64_t g, int thread)
{
    (void)thread;
    const replica_job *job = ctx;
    replica_check *copies = job->checks + job->groups[g].first;
    int count = job->groups[g].count, open = 0;
    const stored_copy *read = &copies[0].read;
    const ckpt_tensor_desc *d = &job->m->tensors[copies[0].tensor].copy.desc;
    for (int k = 0; k < count; k++) {
        if (copies[k].copy.size != read->size) copies[k].differ = 2;
        open += !copies[k].differ;
    }
    int64_t block = read->size < REPLICA_BLOCK ? read->size : REPLICA_BLOCK;
    unsigned char *a = malloc((size_t)block + 1), *b = malloc((size_t)block + 1);
    int status = a && b ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory comparing the copies of %s", d->name);
    size_t element = tp_dtype_size(d->dtype);
    for (int64_t at = 0; !status && open && at < read->size; at += block) {
        int64_t n = read->size - at < block ? read->size - at : block;
        status = torch_tensor_read(read->archive, read->tensor, a, read->from + at, n);
        for (int k = 0; !status && k < count; k++) {
            replica_check *c = &copies[k];
            if (c->differ) continue;
            status = torch_tensor_read(c->copy.archive, c->copy.tensor, b, c->copy.from + at, n);
            if (status || !memcmp(a, b, (size_t)n)) continue;
            int64_t e = 0; /* the first element whose bits differ */
            while (!memcmp(a + e * (int64_t)element, b + e * (int64_t)element, element)) e++;
            c->differ = 1;
            c->element = at / (int64_t)element + e;
            memcpy(c->read_bits, a + e * (int64_t)element, element);
            memcpy(c->copy_bits, b + e * (int64_t)element, element);
            open--;
        }
    }
    free(a);
    free(b);
    return status;
}

/* What a copy that differs holds: the tensor, both files, the element at
 * its place in the piece, both values. */
static void describe_difference(const megatron_checkpoint *m, const replica_check *c, char *out, size_t size)
{
    const megatron_tensor_entry *e = &m->tensors[c->tensor];
    const ckpt_tensor_desc *d = &e->copy.desc;
    const char *copy_file = torch_archive_path(c->copy.archive), *read_file = torch_archive_path(c->read.archive);
    char what[CKPT_NAME_MAX + 700], rank[48];
    snprintf(what, sizeof what, c->head ? "%s (%s) and its copy for the tied output layer differ"
                                        : "%s (%s) is replicated over the tensor-parallel ranks and its copies differ",
             d->name, e->source);
    snprintf(rank, sizeof rank, c->head ? "the copy" : "tensor-parallel rank %d's copy", c->rank);
    if (c->differ == 2) {
        snprintf(out, size, "%s: %lld bytes in %s (%s), %lld in %s (the one read)", what, (long long)c->copy.size, copy_file,
                 rank, (long long)c->read.size, read_file);
        return;
    }
    int64_t shape[CKPT_MAX_DIMS];
    ckpt_piece_shape(d, m->config.tp, shape);
    char place[200], copy_value[64], read_value[64];
    ckpt_element_place(shape, NULL, d->ndim, c->element, place, sizeof place); /* in the piece */
    ckpt_element_text(c->copy_bits, d->dtype, copy_value, sizeof copy_value);
    ckpt_element_text(c->read_bits, d->dtype, read_value, sizeof read_value);
    char piece[48] = "";
    if (c->head) snprintf(piece, sizeof piece, " of tensor-parallel piece %d", c->piece);
    snprintf(out, size, "%s: element [%s]%s is %s in %s (%s), %s in %s (%s)", what, place, piece, copy_value, copy_file, rank,
             read_value, read_file, c->head ? "the one read" : "rank 0's, the one read");
}

int megatron_check_replicas(const megatron_checkpoint *m, int threads, megatron_replica_result *result)
{
    memset(result, 0, sizeof *result);
    const megatron_config *c = &m->config;
    int ranks = c->tp * c->pp, word = -1, states[3] = {-1, -1, -1};
    static const char *const roles[3] = {"exp_avg", "exp_avg_sq", "master"};
    for (int i = 0; i < m->num_tensors; i++) {
        const char *name = m->tensors[i].copy.name;
        if (!strcmp(name, "embedding.word_embeddings.weight")) word = i;
        for (int r = 0; r < 3; r++) {
            char state[64];
            snprintf(state, sizeof state, "optim/%s/embedding.word_embeddings.weight", roles[r]);
            if (!strcmp(name, state)) states[r] = i;
        }
    }
    /* Every copy: tensor-parallel replicas, then the tied head's copies;
     * grouped by the piece they copy. */
    int64_t most = (int64_t)m->num_tensors * c->tp + 4 * (int64_t)ranks;
    replica_check *checks = calloc((size_t)most + 1, sizeof *checks);
    replica_group *groups = calloc((size_t)most + 1, sizeof *groups);
    char *seen = calloc((size_t)m->num_tensors + 1, 1);
    int status = checks && groups && seen ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    int64_t n = 0, num_groups = 0;
    for (int i = 0; !status && c->tp > 1 && i < m->num_tensors; i++) {
        if (m->tensors[i].copy.desc.partition.kind != CKPT_REPLICATED) continue;
        groups[num_groups++] = (replica_group){n, c->tp - 1};
        for (int r = 1; r < c->tp && !status; r++) {
            replica_check *k = &checks[n++];
            *k = (replica_check){.tensor = i, .piece = 0, .rank = r};
            status = piece_copy(m, i, 0, &k->read);
            if (!status) status = piece_copy(m, i, r, &k->copy);
        }
    }
    for (int f = 0; !status && f < ranks; f++) {
        int tp_rank = f % c->tp;
        for (int r = -1; r < 3 && !status; r++) { /* the weights, then each state */
            int index = r < 0 ? word : states[r];
            const struct head_state *h = r >= 0 && m->head_states ? &m->head_states[f * 3 + r] : NULL;
            const pickle_value *t = r < 0 ? m->head_copies[f] : h ? h->tensor : NULL;
            if (!t || index < 0) continue;
            groups[num_groups++] = (replica_group){n, 1};
            replica_check *k = &checks[n++];
            *k = (replica_check){.tensor = index, .piece = tp_rank, .head = 1, .rank = tp_rank};
            status = piece_copy(m, index, tp_rank, &k->read);
            if (!status && h && h->flat_offset >= 0) {
                k->copy = (stored_copy){m->distrib_optim[f], t, h->flat_offset * 4, k->read.size};
            } else if (!status) {
                int64_t offset;
                k->copy = (stored_copy){m->archives[f], t, 0, 0};
                status = torch_tensor_range(m->archives[f], t, &offset, &k->copy.size);
            }
        }
    }
    replica_job job = {m, checks, groups};
    if (!status) status = parallel_for(num_groups, threads > 0 ? threads : 1, compare_copies, &job);
    for (int64_t g = 0; !status && g < num_groups; g++) result->bytes += checks[groups[g].first].read.size;
    for (int64_t i = 0; !status && i < n; i++) {
        const replica_check *k = &checks[i];
        result->copies++;
        result->bytes += k->copy.size;
        result->tensors += !(seen[k->tensor] & 1);
        seen[k->tensor] |= 1;
        if (!k->differ) continue;
        if (!result->copies_differ++) describe_difference(m, k, result->first_difference, sizeof result->first_difference);
        result->tensors_differ += !(seen[k->tensor] & 2);
        seen[k->tensor] |= 2;
    }
    free(checks);
    free(groups);
    free(seen);
    return status;
}

int megatron_replicas_refusal(const char *path, const megatron_replica_result *replicas)
{
    if (!replicas->copies_differ) return TP_OK;
    char more[96] = "";
    if (replicas->copies_differ > 1)
        snprintf(more, sizeof more, " (%d copies of %d tensors differ)", replicas->copies_differ, replicas->tensors_differ);
    return tp_fail(TP_ERR_FORMAT, "%s: %s%s", path, replicas->first_difference, more);
}

int megatron_refuse_differing_copies(const megatron_checkpoint *m, int threads)
{
    megatron_replica_result replicas;
    TP_TRY(megatron_check_replicas(m, threads, &replicas));
    return megatron_replicas_refusal(m->path, &replicas);
}

int megatron_reader_open(const megatron_checkpoint *m, int compute_digests, ckpt_reader **out)
{
    *out = NULL;
    /* Digests prove an output equal to the copy read: where another copy
     * differs, the checkpoint holds two values and neither is proven. */
    if (compute_digests) TP_TRY(megatron_refuse_differing_copies(m, 1));
    const megatron_config *c = &m->config;
    /* The rank files, then their distrib_optim.pt where read. */
    int ranks = c->tp * c->pp, files = m->distrib_optim ? 2 * ranks : ranks;
    int64_t pieces = 0;
    for (int i = 0; i < m->num_tensors; i++) pieces += ckpt_piece_count(&m->tensors[i].copy.desc, c->tp);
    const char **paths = calloc((size_t)files, sizeof *paths);
    int64_t *bytes = calloc((size_t)files, sizeof *bytes), *offsets = calloc((size_t)pieces + 1, sizeof *offsets);
    int *piece_file = calloc((size_t)pieces + 1, sizeof *piece_file);
    ckpt_tensor_desc *tensors = calloc((size_t)m->num_tensors + 1, sizeof *tensors);
    /* Each piece's storage entry and the CRC-32 the zip records for it,
     * checked as it is read (a storage shared by pieces is given once per piece). */
    ckpt_foreign_check *checks = calloc((size_t)pieces + 1, sizeof *checks);
    int num_checks = 0;
    /* Each file's version as the rank files were read at open: the data
     * read later must be of it (an object replaced meanwhile fails). */
    char (*version_text)[128] = calloc((size_t)files + 1, sizeof *version_text);
    const char **versions = calloc((size_t)files + 1, sizeof *versions);
    if (!version_text || !versions) { /* out of memory: said below */
        free(checks);
        checks = NULL;
    }
    int status = paths && bytes && offsets && piece_file && tensors && checks ? TP_OK
                                                                              : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int f = 0; f < files && !status; f++) {
        const torch_archive *a = f < ranks ? m->archives[f] : m->distrib_optim[f - ranks];
        paths[f] = torch_archive_path(a);
        bytes[f] = torch_archive_bytes(a);
        torch_archive_version(a, version_text[f], sizeof version_text[f]);
        versions[f] = version_text[f];
    }
    int64_t at = 0;
    for (int i = 0; i < m->num_tensors && !status; i++) {
        const megatron_tensor_entry *e = &m->tensors[i];
        tensors[i] = e->copy.desc;
        for (int p = 0; p < ckpt_piece_count(&e->copy.desc, c->tp) && !status; p++, at++) {
            const char *file;
            int64_t size;
            piece_file[at] = e->stage * c->tp + p + (e->flat_offset ? ranks : 0);
            status = megatron_piece_range(m, i, p, &file, &offsets[at], &size);
            torch_storage_entry entry;
            if (!status) status = torch_tensor_storage_entry(piece_archive(m, e, p), e->pieces[p], &entry);
            if (!status && entry.recorded)
                checks[num_checks++] = (ckpt_foreign_check){piece_file[at], entry.offset, entry.size, entry.crc32, entry.entry};
        }
    }
    /* The training state: the iteration as the step, the samples consumed,
     * where the checkpoint came from and what of its optimizer was read. */
    cJSON *origin = cJSON_CreateObject();
    cJSON_AddStringToObject(origin, "source_format", "megatron-legacy");
    cJSON_AddNumberToObject(origin, "checkpoint_version", c->checkpoint_version);
    cJSON_AddStringToObject(origin, "names", c->core_names ? "core" : "legacy");
    cJSON_AddStringToObject(origin, "optimizer", c->optimizer_read ? "read" : m->optimizer_refusal[0] ? "not read" : "none");
    if (m->optimizer_refusal[0]) {
        cJSON_AddStringToObject(origin, "optimizer_refusal", m->optimizer_refusal);
        cJSON_AddBoolToObject(origin, "optimizer_damaged", m->optimizer_status == TP_ERR_FORMAT);
    }
    char *user = cJSON_PrintUnformatted(origin);
    cJSON_Delete(origin);
    if (!status && !user) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    ckpt_foreign source = {
        .path = m->path,
        .layout = megatron_layout(m),
        .state = {.step = c->iteration > 0 ? c->iteration : 0,
                  .consumed_samples = c->consumed_samples,
                  .user_json = user},
        .num_tensors = m->num_tensors,
        .tensors = tensors,
        .num_files = files,
        .files = paths,
        .file_bytes = bytes,
        .piece_file = piece_file,
        .piece_offset = offsets,
        .checks = checks,
        .num_checks = num_checks,
        .versions = versions,
    };
    if (!status) status = ckpt_reader_open_foreign(out, &source, compute_digests);
    cJSON_free(user);
    free(paths);
    free(bytes);
    free(offsets);
    free(piece_file);
    free(tensors);
    free(checks);
    free(versions);
    free(version_text);
    return status;
}

const char *megatron_naming_name(megatron_naming naming)
{
    static const char *names[] = {"legacy", "legacy-layernorm", "core", "core-local"};
    return (unsigned)naming < 4 ? names[naming] : "?";
}

int megatron_naming_parse(const char *text, megatron_naming *out)
{
    for (int i = 0; i < 4; i++)
        if (!strcmp(text, megatron_naming_name((megatron_naming)i))) {
            *out = (megatron_naming)i;
            return TP_OK;
        }
    return tp_fail(TP_ERR_ARG, "'%s' is not a Megatron naming (legacy, legacy-layernorm, core or core-local)", text);
}

const pickle_value *megatron_args(const megatron_checkpoint *m)
{
    return pickle_get(torch_archive_root(m->archives[0]), "args");
}

const pickle_value *megatron_rank_value(const megatron_checkpoint *m, int pp_rank, int tp_rank, const char *key)
{
    return pickle_get(torch_archive_root(m->archives[pp_rank * m->config.tp + tp_rank]), key);
}

const char *megatron_rank_path(const megatron_checkpoint *m, int pp_rank, int tp_rank)
{
    return torch_archive_path(m->archives[pp_rank * m->config.tp + tp_rank]);
}

int megatron_rank_tensor_read(const megatron_checkpoint *m, int pp_rank, int tp_rank, const pickle_value *tensor, void *buf,
                              int64_t size)
{
    return torch_tensor_read_checked(m->archives[pp_rank * m->config.tp + tp_rank], tensor, buf, size);
}

const pickle_value *megatron_model_value(const megatron_checkpoint *m, const char *key)
{
    const pickle_value *model = pickle_get(torch_archive_root(m->archives[0]), m->config.vpp > 1 ? "model0" : "model");
    return pickle_get(model, key);
}

int64_t megatron_bytes(const megatron_checkpoint *m)
{
    int64_t bytes = 0;
    for (int f = 0; f < m->config.tp * m->config.pp; f++) {
        bytes += torch_archive_bytes(m->archives[f]);
        if (m->distrib_optim && m->distrib_optim[f]) bytes += torch_archive_bytes(m->distrib_optim[f]);
    }
    return bytes;
}

typedef struct {
    const megatron_checkpoint *m;
    int ranks;                      /* files below are rank files, the rest distrib_optim.pt */
    torch_archive_check_result *checks;
    int *statuses;
    char (*messages)[640];
    void (*on_bytes)(void *ctx, int64_t bytes);
    void *ctx;
} verify_job;

static int verify_file(void *ctx, int64_t f, int thread)
{
    (void)thread;
    verify_job *job = ctx;
    torch_archive *a = f < job->ranks ? job->m->archives[f] : job->m->distrib_optim[f - job->ranks];
    if (!a) return TP_OK;
    int status = torch_archive_check(a, &job->checks[f], job->on_bytes, job->ctx);
    job->statuses[f] = status;
    if (status) snprintf(job->messages[f], sizeof job->messages[f], "%s", tp_errmsg());
    return status == TP_ERR_CHECKSUM ? TP_OK : status; /* damage is counted, not a failure to verify */
}

int megatron_verify(const megatron_checkpoint *m, int threads, void (*on_bytes)(void *ctx, int64_t bytes), void *ctx,
                    megatron_verify_result *result)
{
    memset(result, 0, sizeof *result);
    int ranks = m->config.tp * m->config.pp, files = m->distrib_optim ? 2 * ranks : ranks;
    verify_job job = {m, ranks, calloc((size_t)files, sizeof *job.checks), calloc((size_t)files, sizeof *job.statuses),
                      calloc((size_t)files, sizeof *job.messages), on_bytes, ctx};
    int status = job.checks && job.statuses && job.messages ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!status) status = parallel_for(files, threads > 0 ? threads : 1, verify_file, &job);
    for (int f = 0; f < files && !status; f++) {
        result->files += job.checks[f].entries > 0;
        result->entries += job.checks[f].entries;
        result->unchecked += job.checks[f].unchecked;
        if (job.statuses[f] == TP_ERR_CHECKSUM && !result->damaged++)
            snprintf(result->first_damage, sizeof result->first_damage, "%s", job.messages[f]);
    }
    if (!status) status = megatron_check_replicas(m, threads, &result->replicas);
    free(job.checks);
    free(job.statuses);
    free(job.messages);
    return status;
}
