/* megatron_modules.c: Megatron's modules as they hold their parameters:
 * the layer tables (what each module names its parameters and in which
 * order it registers them), the order of a Megatron-Core model chunk's
 * parameters, and where the distributed optimizer keeps each one's state
 * in its buffer's buckets (docs/MEGATRON.md section 8 and "The distributed
 * optimizer in torch_dist"). */
#include <stdio.h>
#include <string.h>

#include "../common/error.h"
#include "megatron_internal.h"

#define NORM(m, c) {m, {"weight", "bias"}, {c ".weight", c ".bias"}, MEGATRON_NO_EXTRA}
#define LINEAR(m, c, e) {m, {"weight", "bias"}, {c ".weight", c ".bias"}, e}

/* megatron/legacy/model/transformer.py ParallelTransformerLayer. */
static const megatron_layer_module legacy_layer[] = {
    NORM("input_norm", "input_norm"),
    LINEAR("self_attention.query_key_value", "attention.qkv", MEGATRON_EXTRA_NONE),
    LINEAR("self_attention.dense", "attention.dense", MEGATRON_EXTRA_NONE),
    NORM("post_attention_norm", "post_norm"),
    LINEAR("mlp.dense_h_to_4h", "mlp.fc1", MEGATRON_EXTRA_NONE),
    LINEAR("mlp.dense_4h_to_h", "mlp.fc2", MEGATRON_EXTRA_NONE),
    {NULL, {NULL}, {NULL}, 0},
};
static const megatron_layer_module legacy_layernorm_layer[] = {
    NORM("input_layernorm", "input_norm"),
    LINEAR("self_attention.query_key_value", "attention.qkv", MEGATRON_NO_EXTRA),
    LINEAR("self_attention.dense", "attention.dense", MEGATRON_NO_EXTRA),
    NORM("post_attention_layernorm", "post_norm"),
    LINEAR("mlp.dense_h_to_4h", "mlp.fc1", MEGATRON_NO_EXTRA),
    LINEAR("mlp.dense_4h_to_h", "mlp.fc2", MEGATRON_NO_EXTRA),
    {NULL, {NULL}, {NULL}, 0},
};
/* Megatron-Core's TransformerLayer with Transformer Engine's modules: the
 * input norm is an IdentityOp, Attention registers core_attention and
 * linear_proj before SelfAttention adds linear_qkv (megatron/core/
 * transformer/attention.py), and TE's LayerNormLinear registers its
 * layer_norm_weight and layer_norm_bias before its weight and bias
 * (transformer_engine/pytorch/module/layernorm_linear.py __init__). */
static const megatron_layer_module core_layer[] = {
    {"self_attention.core_attention", {NULL}, {NULL}, MEGATRON_EXTRA_TE},
    LINEAR("self_attention.linear_proj", "attention.dense", MEGATRON_EXTRA_TE),
    {"self_attention.linear_qkv",
     {"layer_norm_weight", "layer_norm_bias", "weight", "bias"},
     {"input_norm.weight", "input_norm.bias", "attention.qkv.weight", "attention.qkv.bias"},
     MEGATRON_EXTRA_TE},
    {"mlp.linear_fc1",
     {"layer_norm_weight", "layer_norm_bias", "weight", "bias"},
     {"post_norm.weight", "post_norm.bias", "mlp.fc1.weight", "mlp.fc1.bias"},
     MEGATRON_EXTRA_TE},
    LINEAR("mlp.linear_fc2", "mlp.fc2", MEGATRON_EXTRA_TE),
    {NULL, {NULL}, {NULL}, 0},
};
/* The same layer of Megatron-Core's local modules (gpt_layer_specs.py
 * get_gpt_layer_local_spec): TransformerLayer registers input_layernorm,
 * self_attention, pre_mlp_layernorm, mlp. */
static const megatron_layer_module core_local_layer[] = {
    NORM("input_layernorm", "input_norm"),
    LINEAR("self_attention.linear_proj", "attention.dense", MEGATRON_EXTRA_NONE),
    LINEAR("self_attention.linear_qkv", "attention.qkv", MEGATRON_EXTRA_NONE),
    NORM("pre_mlp_layernorm", "post_norm"),
    LINEAR("mlp.linear_fc1", "mlp.fc1", MEGATRON_EXTRA_NONE),
    LINEAR("mlp.linear_fc2", "mlp.fc2", MEGATRON_EXTRA_NONE),
    {NULL, {NULL}, {NULL}, 0},
};

const megatron_layer_module *megatron_layer_modules(megatron_naming naming)
{
    switch (naming) {
    case MEGATRON_NAMES_LEGACY_LAYERNORM: return legacy_layernorm_layer;
    case MEGATRON_NAMES_CORE: return core_layer;
    case MEGATRON_NAMES_CORE_LOCAL: return core_local_layer;
    default: return legacy_layer;
    }
}

static int put(int *out, int max, int *n, int index)
{
    if (*n == max) return tp_fail(TP_ERR_FORMAT, "a model chunk of more than %d parameters", max);
    out[(*n)++] = index;
    return TP_OK;
}

static int put_found(int (*find)(void *ctx, const char *canonical), void *ctx, const char *canonical, int *out, int max,
                     int *n)
{
    int index = find(ctx, canonical);
    return index >= 0 ? put(out, max, n, index) : TP_OK;
}

int megatron_core_chunk_params(const megatron_config *c, int pp_rank, int vp_rank, int (*find)(void *ctx, const char *canonical),
                               void *ctx, int *out, int max, int *count)
{
    *count = 0;
    if (c->impl == MEGATRON_IMPL_OTHER)
        return tp_fail(TP_ERR_LAYOUT, "the model's modules (args.transformer_impl, args.spec) are neither Transformer Engine's "
                       "nor Megatron-Core's local ones: the order of their parameters, which the distributed optimizer's "
                       "buffers follow, is not known");
    /* GPTModel registers embedding, decoder (its layers, then final_layernorm) and output_layer (gpt_model.py). */
    int first = pp_rank == 0 && vp_rank == 0, last = pp_rank == c->pp - 1 && vp_rank == c->vpp - 1, n = 0;
    int64_t chunk_layers = c->num_layers / ((int64_t)c->pp * c->vpp);
    int64_t first_layer = vp_rank * (c->num_layers / c->vpp) + pp_rank * chunk_layers;
    if (first) {
        TP_TRY(put_found(find, ctx, "embedding.word_embeddings.weight", out, max, &n));
        TP_TRY(put_found(find, ctx, "embedding.position_embeddings.weight", out, max, &n));
    }
    const megatron_layer_module *modules =
        megatron_layer_modules(c->impl == MEGATRON_IMPL_LOCAL ? MEGATRON_NAMES_CORE_LOCAL : MEGATRON_NAMES_CORE);
    for (int64_t j = 0; j < chunk_layers; j++)
        for (const megatron_layer_module *m = modules; m->module; m++)
            for (int k = 0; k < 4 && m->canonical[k]; k++) {
                char canonical[160];
                snprintf(canonical, sizeof canonical, "layers.%lld.%s", (long long)(first_layer + j), m->canonical[k]);
                TP_TRY(put_found(find, ctx, canonical, out, max, &n));
            }
    if (last) {
        TP_TRY(put_found(find, ctx, "final_norm.weight", out, max, &n));
        TP_TRY(put_found(find, ctx, "final_norm.bias", out, max, &n));
        /* The output layer's weight: its own (untied), or with tied
         * embeddings a copy on the last stage when the first is another
         * (skip_weight_param_allocation on a stage that has the embedding). */
        if (c->untied) TP_TRY(put_found(find, ctx, "output_layer.weight", out, max, &n));
        else if (!first) TP_TRY(put(out, max, &n, MEGATRON_HEAD_COPY));
    }
    *count = n;
    return TP_OK;
}

/* Buckets close as DistributedOptimizer._compute_per_buffer_param_layout
 * closes them (megatron/core/optimizer/distrib_optimizer.py, Megatron-LM
 * d98e8a64dd; before 55b8111ad8, 2026-04-22, the same rule in
 * _ParamAndGradBuffer): one being filled closes before a shared embedding,
 * with the padding up to its start, and after one; or when it reaches
 * bucket_size, which is not recorded: the recorded sizes say where. */
static int close_bucket(int64_t numel, int *bucket, const int64_t *bucket_numel, int num_buckets, const char *where)
{
    if (*bucket >= num_buckets)
        return tp_fail(TP_ERR_FORMAT, "%s: the parameters fill more than the %d buckets recorded", where, num_buckets);
    if (numel != bucket_numel[*bucket])
        return tp_fail(TP_ERR_FORMAT, "%s: bucket %d holds %lld elements of parameters, the checkpoint records %lld", where,
                       *bucket, (long long)numel, (long long)bucket_numel[*bucket]);
    ++*bucket;
    return TP_OK;
}

int megatron_buffer_layout(megatron_buffer_param *params, int n, const int64_t *bucket_numel, int num_buckets,
                           const char *where)
{
    /* Bucket ends are padded to a multiple of lcm(dp, 128), so a 64-element
     * alignment from the bucket's start is the buffer's. */
    int64_t start = 0, end = 0;
    int bucket = 0, in_bucket = 0;
    for (int i = n - 1; i >= 0; i--) {
        megatron_buffer_param *p = &params[i];
        if (p->numel <= 0 || p->numel > CKPT_MAX_ELEMENTS)
            return tp_fail(TP_ERR_FORMAT, "%s: a parameter of %lld elements", where, (long long)p->numel);
        start = (start + 63) / 64 * 64;
        if (p->shared && in_bucket) {
            TP_TRY(close_bucket(start, &bucket, bucket_numel, num_buckets, where));
            start = 0;
            in_bucket = 0;
        }
        if (bucket >= num_buckets)
            return tp_fail(TP_ERR_FORMAT, "%s: the parameters fill more than the %d buckets recorded", where, num_buckets);
        end = start + p->numel;
        if (end > bucket_numel[bucket])
            return tp_fail(TP_ERR_FORMAT, "%s: bucket %d holds %lld elements, the checkpoint records %lld", where, bucket,
                           (long long)end, (long long)bucket_numel[bucket]);
        p->bucket = bucket;
        p->start = start;
        in_bucket = 1;
        if (p->shared || end == bucket_numel[bucket]) {
            TP_TRY(close_bucket(end, &bucket, bucket_numel, num_buckets, where));
            start = 0;
            in_bucket = 0;
        } else {
            start = end;
        }
    }
    if (in_bucket) TP_TRY(close_bucket(end, &bucket, bucket_numel, num_buckets, where));
    if (bucket != num_buckets)
        return tp_fail(TP_ERR_FORMAT, "%s: the parameters fill %d buckets, the checkpoint records %d", where, bucket,
                       num_buckets);
    return TP_OK;
}
