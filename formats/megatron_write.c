/* megatron_write.c: Megatron-LM legacy checkpoints written at any TP x PP
 * (megatron.h megatron_write): one torch.save file per rank, its model
 * state dict named as Megatron names it (the tables below mirror
 * docs/MEGATRON.md section 4), each piece read from the source as the
 * target lays it out (reshard_read_piece). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/error.h"
#include "../common/parallel.h"
#include "../reshard/reshard.h"
#include "megatron_internal.h"
#include "torch_write.h"

enum { NO_EXTRA, EXTRA_NONE, EXTRA_TE }; /* a module's _extra_state: none, None, Transformer Engine's */

typedef struct {
    const char *module;         /* under layers.N. */
    const char *leaves[4];      /* its parameters, NULL-terminated */
    const char *canonical[4];   /* their canonical names after layers.N. */
    int extra;
} layer_module;

#define NORM(m, c) {m, {"weight", "bias"}, {c ".weight", c ".bias"}, NO_EXTRA}
#define LINEAR(m, c, e) {m, {"weight", "bias"}, {c ".weight", c ".bias"}, e}

static const layer_module legacy_layer[] = {
    NORM("input_norm", "input_norm"),
    LINEAR("self_attention.query_key_value", "attention.qkv", EXTRA_NONE),
    LINEAR("self_attention.dense", "attention.dense", EXTRA_NONE),
    NORM("post_attention_norm", "post_norm"),
    LINEAR("mlp.dense_h_to_4h", "mlp.fc1", EXTRA_NONE),
    LINEAR("mlp.dense_4h_to_h", "mlp.fc2", EXTRA_NONE),
    {NULL, {NULL}, {NULL}, 0},
};
static const layer_module legacy_layernorm_layer[] = {
    NORM("input_layernorm", "input_norm"),
    LINEAR("self_attention.query_key_value", "attention.qkv", NO_EXTRA),
    LINEAR("self_attention.dense", "attention.dense", NO_EXTRA),
    NORM("post_attention_layernorm", "post_norm"),
    LINEAR("mlp.dense_h_to_4h", "mlp.fc1", NO_EXTRA),
    LINEAR("mlp.dense_4h_to_h", "mlp.fc2", NO_EXTRA),
    {NULL, {NULL}, {NULL}, 0},
};
static const layer_module core_layer[] = {
    {"self_attention.core_attention", {NULL}, {NULL}, EXTRA_TE},
    LINEAR("self_attention.linear_proj", "attention.dense", EXTRA_TE),
    {"self_attention.linear_qkv",
     {"layer_norm_weight", "layer_norm_bias", "weight", "bias"},
     {"input_norm.weight", "input_norm.bias", "attention.qkv.weight", "attention.qkv.bias"},
     EXTRA_TE},
    {"mlp.linear_fc1",
     {"layer_norm_weight", "layer_norm_bias", "weight", "bias"},
     {"post_norm.weight", "post_norm.bias", "mlp.fc1.weight", "mlp.fc1.bias"},
     EXTRA_TE},
    LINEAR("mlp.linear_fc2", "mlp.fc2", EXTRA_TE),
    {NULL, {NULL}, {NULL}, 0},
};
static const layer_module core_local_layer[] = {
    NORM("input_layernorm", "input_norm"),
    LINEAR("self_attention.linear_proj", "attention.dense", EXTRA_NONE),
    LINEAR("self_attention.linear_qkv", "attention.qkv", EXTRA_NONE),
    NORM("pre_mlp_layernorm", "post_norm"),
    LINEAR("mlp.linear_fc1", "mlp.fc1", EXTRA_NONE),
    LINEAR("mlp.linear_fc2", "mlp.fc2", EXTRA_NONE),
    {NULL, {NULL}, {NULL}, 0},
};

typedef struct {
    ckpt_reader *source;
    const megatron_checkpoint *template;
    const megatron_config *c;
    megatron_naming naming;
    ckpt_layout to;
    torch_writer *w;
    byte_buffer *b;
    int pp_rank, tp_rank;
    /* The tensors emitted into the pickle, in order: their bytes are
     * written after it (source tensor and piece; index -1: empty). */
    struct pending { int index, piece; int64_t bytes; } *pending;
    int num_pending, pending_capacity;
    void *piece;          /* a buffer of the largest piece */
    size_t piece_size;
} rank_writer;

static int add_pending(rank_writer *r, int index, int piece, int64_t bytes)
{
    if (r->num_pending == r->pending_capacity) {
        int next = r->pending_capacity ? 2 * r->pending_capacity : 64;
        struct pending *bigger = realloc(r->pending, (size_t)next * sizeof *bigger);
        if (!bigger) return tp_fail(TP_ERR_NOMEM, "out of memory");
        r->pending = bigger;
        r->pending_capacity = next;
    }
    r->pending[r->num_pending++] = (struct pending){index, piece, bytes};
    return TP_OK;
}

static torch_dtype torch_dtype_of(tp_dtype dtype)
{
    return dtype == TP_BF16 ? TORCH_BFLOAT16 : dtype == TP_FP16 ? TORCH_FLOAT16 : TORCH_FLOAT32;
}

/* Emits this rank's piece of the source's tensor index. */
static int emit_tensor(rank_writer *r, int index)
{
    const ckpt_tensor_desc *t = ckpt_reader_tensor(r->source, index);
    int piece = t->partition.kind == CKPT_SPLIT ? r->tp_rank : 0;
    int64_t shape[CKPT_MAX_DIMS], bytes = (int64_t)tp_dtype_size(t->dtype);
    ckpt_piece_shape(t, r->to.tp, shape);
    for (int d = 0; d < t->ndim; d++) bytes *= shape[d];
    TP_TRY(add_pending(r, index, piece, bytes));
    return torch_writer_tensor(r->w, torch_dtype_of(t->dtype), t->ndim, shape);
}

/* The bytes of the tensors emitted, in order, each piece read from the
 * source as the target lays it out. */
static int write_pending(rank_writer *r)
{
    for (int k = 0; k < r->num_pending; k++) {
        const struct pending *p = &r->pending[k];
        if ((size_t)p->bytes > r->piece_size) {
            void *bigger = realloc(r->piece, (size_t)p->bytes);
            if (!bigger) return tp_fail(TP_ERR_NOMEM, "out of memory for a piece of %lld bytes", (long long)p->bytes);
            r->piece = bigger;
            r->piece_size = (size_t)p->bytes;
        }
        if (p->index >= 0)
            TP_TRY(reshard_read_piece(r->source, p->index, ckpt_reader_tensor(r->source, p->index), r->to.tp, p->piece,
                                      r->piece, (size_t)p->bytes));
        TP_TRY(torch_writer_storage(r->w, r->piece, p->bytes));
    }
    return TP_OK;
}

/* key: tensor, when the source has it. */
static int entry(rank_writer *r, const char *key, const char *canonical)
{
    int index = ckpt_reader_find(r->source, canonical);
    if (index < 0) return TP_OK; /* a model without biases has none */
    pk_string(r->b, key);
    return emit_tensor(r, index);
}

/* A module's _extra_state: None, or Transformer Engine's as the template
 * holds it (an empty uint8 tensor since TE 2.0, a BytesIO before). */
static int emit_extra(rank_writer *r, const char *key, int extra, const char *template_key)
{
    if (extra == NO_EXTRA) return TP_OK;
    pk_string(r->b, key);
    if (extra == EXTRA_NONE) {
        pk_none(r->b);
        return TP_OK;
    }
    const pickle_value *v = megatron_model_value(r->template, template_key);
    if (v && v->kind != PICKLE_TENSOR) return pk_value(r->b, v);
    if (v && torch_tensor_numel(v) > 0)
        return tp_fail(TP_ERR_FORMAT, "%s: %s holds Transformer Engine's FP8 state, which is not converted",
                       megatron_path(r->template), template_key);
    int64_t empty = 0;
    TP_TRY(add_pending(r, -1, 0, 0));
    return torch_writer_tensor(r->w, TORCH_UINT8, 1, &empty);
}

static const layer_module *layer_table(megatron_naming naming)
{
    switch (naming) {
    case MEGATRON_NAMES_LEGACY_LAYERNORM: return legacy_layernorm_layer;
    case MEGATRON_NAMES_CORE: return core_layer;
    case MEGATRON_NAMES_CORE_LOCAL: return core_local_layer;
    default: return legacy_layer;
    }
}

/* Module state dicts are OrderedDicts, the containers Megatron's legacy
 * model builds around them plain dicts: both as torch.save writes them. */

/* The layers of this stage, keys prefixed ("decoder.layers.", or "layers."
 * inside the legacy encoder dict) and numbered from 0 in the stage. */
static int emit_layers(rank_writer *r, const char *prefix)
{
    int64_t per_stage = r->c->num_layers / r->to.pp;
    for (int64_t j = 0; j < per_stage; j++) {
        int64_t layer = r->pp_rank * per_stage + j;
        for (const layer_module *m = layer_table(r->naming); m->module; m++) {
            char key[512], canonical[256], template_key[512];
            for (int k = 0; k < 4 && m->leaves[k]; k++) {
                snprintf(key, sizeof key, "%s%lld.%s.%s", prefix, (long long)j, m->module, m->leaves[k]);
                snprintf(canonical, sizeof canonical, "layers.%lld.%s", (long long)layer, m->canonical[k]);
                TP_TRY(entry(r, key, canonical));
            }
            snprintf(key, sizeof key, "%s%lld.%s._extra_state", prefix, (long long)j, m->module);
            snprintf(template_key, sizeof template_key, "decoder.layers.0.%s._extra_state", m->module);
            TP_TRY(emit_extra(r, key, m->extra, template_key));
        }
    }
    return TP_OK;
}

static int emit_model_legacy(rank_writer *r)
{
    int first = r->pp_rank == 0, last = r->pp_rank == r->to.pp - 1;
    byte_buffer *b = r->b;
    const char *final = r->naming == MEGATRON_NAMES_LEGACY ? "final_norm" : "final_layernorm";
    pk_dict_begin(b);
    pk_string(b, "language_model");
    pk_dict_begin(b);
    if (first) {
        pk_string(b, "embedding");
        pk_dict_begin(b);
        pk_string(b, "word_embeddings");
        pk_ordered_dict_begin(b);
        TP_TRY(entry(r, "weight", "embedding.word_embeddings.weight"));
        pk_dict_end(b);
        if (ckpt_reader_find(r->source, "embedding.position_embeddings.weight") >= 0) {
            pk_string(b, "position_embeddings");
            pk_ordered_dict_begin(b);
            TP_TRY(entry(r, "weight", "embedding.position_embeddings.weight"));
            pk_dict_end(b);
        }
        pk_dict_end(b);
    }
    pk_string(b, "encoder");
    pk_ordered_dict_begin(b);
    TP_TRY(emit_layers(r, "layers."));
    if (last) {
        char key[64];
        snprintf(key, sizeof key, "%s.weight", final);
        TP_TRY(entry(r, key, "final_norm.weight"));
        snprintf(key, sizeof key, "%s.bias", final);
        TP_TRY(entry(r, key, "final_norm.bias"));
    }
    pk_dict_end(b);
    if (last && r->c->untied) {
        pk_string(b, "output_layer");
        pk_ordered_dict_begin(b);
        TP_TRY(entry(r, "weight", "output_layer.weight"));
        TP_TRY(emit_extra(r, "_extra_state", r->naming == MEGATRON_NAMES_LEGACY ? EXTRA_NONE : NO_EXTRA, NULL));
        pk_dict_end(b);
    }
    pk_dict_end(b); /* language_model */
    if (last && !first && !r->c->untied) { /* the last stage's copy of the tied embeddings */
        pk_string(b, "word_embeddings_for_head");
        pk_ordered_dict_begin(b);
        TP_TRY(entry(r, "weight", "embedding.word_embeddings.weight"));
        pk_dict_end(b);
    }
    pk_dict_end(b);
    return TP_OK;
}

static int emit_model_core(rank_writer *r)
{
    int first = r->pp_rank == 0, last = r->pp_rank == r->to.pp - 1;
    byte_buffer *b = r->b;
    pk_ordered_dict_begin(b); /* the model's state_dict() */
    if (first) {
        TP_TRY(entry(r, "embedding.word_embeddings.weight", "embedding.word_embeddings.weight"));
        TP_TRY(entry(r, "embedding.position_embeddings.weight", "embedding.position_embeddings.weight"));
    }
    TP_TRY(emit_layers(r, "decoder.layers."));
    if (last) {
        TP_TRY(entry(r, "decoder.final_layernorm.weight", "final_norm.weight"));
        TP_TRY(entry(r, "decoder.final_layernorm.bias", "final_norm.bias"));
        if (r->c->untied) {
            TP_TRY(entry(r, "output_layer.weight", "output_layer.weight"));
        } else if (!first) { /* the tied embeddings' copy */
            TP_TRY(entry(r, "output_layer.weight", "embedding.word_embeddings.weight"));
        }
        TP_TRY(emit_extra(r, "output_layer._extra_state", EXTRA_NONE, NULL));
    }
    pk_dict_end(b);
    return TP_OK;
}

/* The template's args with the parallel sizes of the output. */
static int emit_args(rank_writer *r)
{
    const pickle_value *args = megatron_args(r->template);
    byte_buffer *b = r->b;
    int core = r->naming >= MEGATRON_NAMES_CORE;
    pk_global(b, "argparse", "Namespace");
    buffer_put(b, ")\x81", 2); /* Namespace.__new__(Namespace): EMPTY_TUPLE, NEWOBJ */
    pk_dict_begin(b);
    const pickle_value *state = args->object.state;
    for (int64_t i = 0; state && state->kind == PICKLE_DICT && i < state->dict.keys.count; i++) {
        const pickle_value *k = state->dict.keys.items[i];
        TP_TRY(pk_value(b, k));
        if (pickle_is_string(k, "tensor_model_parallel_size")) pk_int(b, r->to.tp);
        else if (pickle_is_string(k, "pipeline_model_parallel_size") ||
                 pickle_is_string(k, "transformer_pipeline_model_parallel_size"))
            pk_int(b, r->to.pp);
        else if (pickle_is_string(k, "virtual_pipeline_model_parallel_size") ||
                 pickle_is_string(k, "num_layers_per_virtual_pipeline_stage"))
            pk_none(b);
        /* The model family and its modules, as the names say (Megatron
         * builds the model these args describe, then loads the names). */
        else if (pickle_is_string(k, "use_legacy_models")) pk_bool(b, !core);
        else if (pickle_is_string(k, "use_mcore_models")) pk_bool(b, core);
        else if (pickle_is_string(k, "transformer_impl") && core)
            pk_string(b, r->naming == MEGATRON_NAMES_CORE ? "transformer_engine" : "local");
        else TP_TRY(pk_value(b, state->dict.values.items[i]));
    }
    pk_dict_end(b);
    buffer_put(b, "b", 1); /* BUILD */
    return TP_OK;
}

static int write_rank(rank_writer *r, const char *iteration_dir)
{
    char dir[4400], file[4500];
    if (r->to.pp > 1) snprintf(dir, sizeof dir, "%s/mp_rank_%02d_%03d", iteration_dir, r->tp_rank, r->pp_rank);
    else snprintf(dir, sizeof dir, "%s/mp_rank_%02d", iteration_dir, r->tp_rank);
    if (mkdir(dir, 0755) != 0) return tp_fail(TP_ERR_IO, "%s: cannot create: %s", dir, strerror(errno));
    snprintf(file, sizeof file, "%s/model_optim_rng.pt", dir);
    TP_TRY(torch_writer_open(file, "model_optim_rng", &r->w));
    r->b = torch_writer_pickle(r->w);
    pk_dict_begin(r->b);
    pk_string(r->b, "args");
    int status = emit_args(r);
    pk_string(r->b, "checkpoint_version");
    pk_float(r->b, 3.0);
    pk_string(r->b, "iteration");
    pk_int(r->b, r->c->stored_iteration >= 0 ? r->c->stored_iteration : 0);
    pk_string(r->b, "model");
    r->num_pending = 0;
    if (!status) status = r->naming >= MEGATRON_NAMES_CORE ? emit_model_core(r) : emit_model_legacy(r);
    pk_dict_end(r->b);
    if (!status) status = torch_writer_begin_storages(r->w);
    if (!status) status = write_pending(r);
    if (status) {
        torch_writer_abort(r->w);
        return tp_fail_context(status, "%s: ", file);
    }
    return torch_writer_finish(r->w);
}

typedef struct {
    rank_writer *writers; /* one per thread */
    const char *iteration_dir;
} rank_job;

/* Task f: the rank file of pipeline stage f / tp, tensor-parallel rank f % tp. */
static int write_rank_task(void *ctx, int64_t f, int thread)
{
    rank_job *job = ctx;
    rank_writer *r = &job->writers[thread];
    r->pp_rank = (int)(f / r->to.tp);
    r->tp_rank = (int)(f % r->to.tp);
    return write_rank(r, job->iteration_dir);
}

static int replaceable_megatron(const char *path, void *ctx)
{
    (void)ctx;
    int megatron;
    TP_TRY(megatron_detect(path, &megatron));
    return megatron ? TP_OK : tp_fail(TP_ERR_EXISTS, "%s exists and is not a Megatron-LM checkpoint; not replaced", path);
}

/* The target layout, checked against the model as Megatron would. */
static int check_layout(const megatron_config *c, const ckpt_layout *to)
{
    if (c->num_layers % to->pp)
        return tp_fail(TP_ERR_LAYOUT, "%lld layers do not divide over pp %d", (long long)c->num_layers, to->pp);
    if (c->heads % to->tp || c->query_groups % to->tp || c->ffn % to->tp)
        return tp_fail(TP_ERR_LAYOUT, "%lld heads in %lld query groups and ffn %lld do not divide over tp %d (Megatron's "
                       "legacy model needs the query groups to)", (long long)c->heads, (long long)c->query_groups,
                       (long long)c->ffn, to->tp);
    if (c->padded_vocab % (c->vocab_divisible_by * to->tp))
        return tp_fail(TP_ERR_LAYOUT, "the padded vocabulary of %lld rows is not a multiple of %lld x tp %d, as Megatron "
                       "pads for tp %d; re-padding the vocabulary is not implemented yet", (long long)c->padded_vocab,
                       (long long)c->vocab_divisible_by, to->tp, to->tp);
    return TP_OK;
}

int megatron_write(ckpt_reader *source, const megatron_checkpoint *template, const megatron_write_options *options,
                   const char *out)
{
    const megatron_config *c = megatron_config_of(template);
    rank_writer r = {.source = source, .template = template, .c = c};
    r.to = megatron_layout(template);
    if (options->tp) r.to.tp = options->tp;
    if (options->pp) r.to.pp = options->pp;
    r.naming = options->naming >= 0 ? (megatron_naming)options->naming : c->naming;
    TP_TRY(check_layout(c, &r.to));
    ckpt_stage_options stage = {.directory = 1, .overwrite = options->overwrite, .may_replace = replaceable_megatron};
    ckpt_staged *staged;
    TP_TRY(ckpt_stage(NULL, out, &stage, &staged));
    const char *root = ckpt_staged_path(staged);
    char iteration_dir[4200], tracker[4300];
    if (c->iteration < 0) snprintf(iteration_dir, sizeof iteration_dir, "%s/release", root);
    else snprintf(iteration_dir, sizeof iteration_dir, "%s/iter_%07lld", root, (long long)c->iteration);
    int status = mkdir(iteration_dir, 0755) ? tp_fail(TP_ERR_IO, "%s: cannot create: %s", iteration_dir, strerror(errno))
                                            : TP_OK;
    /* The rank files are written in parallel, a thread each at a time. */
    int threads = options->threads > 0 ? options->threads : parallel_cpu_count();
    if (threads > r.to.tp * r.to.pp) threads = r.to.tp * r.to.pp;
    rank_writer *writers = calloc((size_t)threads, sizeof *writers);
    if (!status && !writers) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < threads && writers; i++) writers[i] = r;
    rank_job job = {writers, iteration_dir};
    if (!status) status = parallel_for((int64_t)r.to.tp * r.to.pp, threads, write_rank_task, &job);
    for (int i = 0; i < threads && writers; i++) {
        free(writers[i].piece);
        free(writers[i].pending);
    }
    free(writers);
    snprintf(tracker, sizeof tracker, "%s/latest_checkpointed_iteration.txt", root);
    FILE *f = status ? NULL : fopen(tracker, "w");
    if (!status && !f) status = tp_fail(TP_ERR_IO, "%s: cannot create: %s", tracker, strerror(errno));
    if (f) {
        if (c->iteration < 0) fputs("release", f);
        else fprintf(f, "%lld", (long long)c->iteration);
        if (fflush(f) != 0 || fsync(fileno(f)) != 0) status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", tracker, strerror(errno));
        if (fclose(f) != 0 && !status) status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", tracker, strerror(errno));
    }
    if (status) {
        ckpt_staged_discard(staged);
        return status;
    }
    return ckpt_staged_publish(staged);
}
