/* megatron_import.c: a Megatron-LM GPT-2 written as this model's checkpoint
 * (interop.h gpt_import_megatron): each catalogue tensor read, at the
 * target layout, from the Megatron tensor it is (megatron_name), the fused
 * QKV's rows regrouped within each piece, the Adam moments and fp32
 * masters with their parameters. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "../common/memory.h"
#include "../reshard/reshard.h"
#include "interop.h"

struct gpt_megatron_import {
    ckpt_reader *source;       /* the Megatron checkpoint's reader */
    const megatron_config *c;
    gpt_config config;
    ckpt_layout to;
    gpt_tensor *catalog;
    int count;
    int *source_index;         /* per catalogue tensor: the Megatron tensor it is */
    int64_t bytes;
    char origin[512];          /* train.user: where it came from */
};

/* Our optimizer state of model/X is optim/ROLE/X; Megatron's of its
 * canonical name N is optim/ROLE/N. */
static int source_name(const gpt_tensor *t, char *out, size_t size)
{
    char param[CKPT_NAME_MAX + 1];
    TP_TRY(gpt_megatron_name(t->role == GPT_ROLE_PARAM ? t->name : t->param, param, sizeof param));
    if (t->role == GPT_ROLE_PARAM) snprintf(out, size, "%s", param);
    else snprintf(out, size, "optim/%s/%s", t->desc.role, param);
    return TP_OK;
}

int gpt_megatron_import_open(gpt_megatron_import **out, const megatron_checkpoint *m, ckpt_reader *source, int tp, int pp)
{
    *out = NULL;
    const megatron_config *c = megatron_config_of(m);
    const char *unfit = gpt_megatron_unfit(c);
    if (unfit) return tp_fail(TP_ERR_ARG, "%s: %s: the trainer computes GPT-2", megatron_path(m), unfit);
    /* The trainer's GELU is the tanh form: the exact one would be another function. */
    if (!c->openai_gelu)
        return tp_fail(TP_ERR_ARG, "%s: trained with the exact GELU (openai_gelu is false); the trainer computes its tanh "
                       "form, so training on would change the model (tp-ckpt export writes it for inference)",
                       megatron_path(m));
    gpt_megatron_import *x = calloc(1, sizeof *x);
    if (!x) return tp_fail(TP_ERR_NOMEM, "out of memory");
    x->source = source;
    x->c = c;
    x->config = (gpt_config){.layers = c->num_layers, .dim = c->hidden, .heads = c->heads, .kv_heads = c->heads,
                             .vocab = c->true_vocab > 0 ? c->true_vocab : c->padded_vocab, .seq = c->max_positions,
                             .ffn = c->ffn, .vocab_pad_multiple = c->true_vocab > 0 ? c->vocab_divisible_by : 1,
                             .dtype = c->dtype};
    x->to = (ckpt_layout){.tp = tp, .pp = pp, .dp = 1, .num_layers = c->num_layers};
    snprintf(x->origin, sizeof x->origin,
             "{\"imported_from\": \"megatron-legacy\", \"source_layout\": \"tp%dpp%d\", \"iteration\": %lld}", c->tp, c->pp,
             (long long)c->stored_iteration);
    int status = gpt_config_check(&x->config, tp, pp);
    if (!status && c->query_groups % tp)
        status = tp_fail(TP_ERR_LAYOUT, "%lld heads do not divide over tp %d", (long long)c->query_groups, tp);
    if (!status) status = gpt_catalog(&x->config, c->optimizer_read, &x->catalog, &x->count);
    if (!status && !(x->source_index = calloc((size_t)x->count + 1, sizeof *x->source_index)))
        status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < x->count && !status; i++) {
        char name[CKPT_NAME_MAX + 32];
        status = source_name(&x->catalog[i], name, sizeof name);
        x->source_index[i] = status ? -1 : ckpt_reader_find(source, name);
        if (!status && x->source_index[i] < 0)
            status = tp_fail(TP_ERR_NOT_FOUND, "%s: no %s for %s", megatron_path(m), name, x->catalog[i].name);
        int64_t shape[CKPT_MAX_DIMS], bytes = (int64_t)tp_dtype_size(x->catalog[i].desc.dtype);
        ckpt_piece_shape(&x->catalog[i].desc, tp, shape);
        for (int d = 0; d < x->catalog[i].desc.ndim; d++) bytes *= shape[d];
        x->bytes += bytes * ckpt_piece_count(&x->catalog[i].desc, tp);
    }
    if (status) {
        gpt_megatron_import_close(x);
        return status;
    }
    *out = x;
    return TP_OK;
}

int64_t gpt_megatron_import_bytes(const gpt_megatron_import *x)
{
    return x->bytes;
}

int gpt_megatron_import_count(const gpt_megatron_import *x)
{
    return x->count;
}

void gpt_megatron_import_close(gpt_megatron_import *x)
{
    if (!x) return;
    free(x->catalog);
    free(x->source_index);
    free(x);
}

/* A piece of the fused QKV from Megatron's order, per query group [q of its
 * heads, k, v] in blocks of kv_channels rows, into this model's [q of the
 * rank's heads; its keys; its values]. */
static void regroup_qkv(const megatron_config *c, int tp, const unsigned char *from, unsigned char *to, size_t block_bytes)
{
    int64_t per_group = c->heads / c->query_groups, groups = c->query_groups / tp, heads = c->heads / tp;
    for (int64_t j = 0; j < heads + 2 * groups; j++) {
        int64_t block = j < heads            ? j / per_group * (per_group + 2) + j % per_group
                        : j < heads + groups ? (j - heads) * (per_group + 2) + per_group
                                             : (j - heads - groups) * (per_group + 2) + per_group + 1;
        memcpy(to + (size_t)j * block_bytes, from + (size_t)block * block_bytes, block_bytes);
    }
}

int gpt_megatron_import_run(gpt_megatron_import *x, const import_options *options, const char *out)
{
    ckpt_write_options write_options;
    ckpt_write_options_init(&write_options);
    write_options.compress_level = options->compress_level;
    write_options.overwrite = options->overwrite;
    write_options.update_latest = options->update_latest;
    ckpt_writer *w = NULL;
    TP_TRY(ckpt_writer_create(&w, out, &x->to, &write_options));
    unsigned char *piece = NULL, *grouped = NULL;
    size_t capacity = 0;
    int status = TP_OK;
    for (int i = 0; i < x->count && !status; i++) {
        const gpt_tensor *t = &x->catalog[i];
        int id;
        status = ckpt_writer_add_tensor(w, &t->desc, &id);
        int qkv = t->kind == GPT_QKV_WEIGHT || t->kind == GPT_QKV_BIAS;
        /* The QKV as Megatron lays it out (its own description), regrouped after. */
        const ckpt_tensor_desc *as_read = qkv ? ckpt_reader_tensor(x->source, x->source_index[i]) : &t->desc;
        ckpt_tensor_desc read = *as_read;
        read.dtype = t->desc.dtype;
        int64_t shape[CKPT_MAX_DIMS], bytes = (int64_t)tp_dtype_size(t->desc.dtype);
        ckpt_piece_shape(&t->desc, x->to.tp, shape);
        for (int d = 0; d < t->desc.ndim; d++) bytes *= shape[d];
        if (!status && (size_t)bytes > capacity) {
            free(piece);
            free(grouped);
            piece = alloc_pages((size_t)bytes);
            grouped = alloc_pages((size_t)bytes);
            capacity = (size_t)bytes;
            if (!piece || !grouped) status = tp_fail(TP_ERR_NOMEM, "out of memory for a piece of %lld bytes", (long long)bytes);
        }
        for (int p = 0; p < ckpt_piece_count(&t->desc, x->to.tp) && !status; p++) {
            if (!ckpt_writer_owns_piece(w, id, p)) continue;
            status = reshard_read_piece(x->source, x->source_index[i], &read, x->to.tp, p, qkv ? grouped : piece, (size_t)bytes);
            if (!status && qkv) regroup_qkv(x->c, x->to.tp, grouped, piece, (size_t)(bytes / shape[0] * x->c->kv_channels));
            if (!status) status = ckpt_writer_put_piece(w, id, p, piece);
            if (!status && options->on_bytes) options->on_bytes(options->progress_ctx, bytes);
        }
        if (status) tp_fail_context(status, "importing %s", t->name);
    }
    free(piece);
    free(grouped);
    if (status) {
        ckpt_writer_abort(w);
        return status;
    }
    char *model = gpt_config_to_json(&x->config);
    const ckpt_train_state *from = ckpt_reader_state(x->source);
    ckpt_train_state state = {.step = from->step, .consumed_samples = from->consumed_samples, .model_json = model,
                              .user_json = x->origin};
    status = model ? ckpt_writer_commit(w, &state) : tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!model) ckpt_writer_abort(w);
    free(model);
    return status;
}
