/* megatron_write.c: Megatron-LM legacy checkpoints written at any TP x PP
 * (megatron.h megatron_write): one torch.save file per rank, its model
 * state dict named as Megatron names it (the tables below mirror
 * docs/MEGATRON.md section 4), each piece read from the source as the
 * target lays it out (reshard_read_piece_rows), streamed. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/error.h"
#include "../common/memory.h"
#include "../common/parallel.h"
#include "../common/path.h"
#include "../reshard/reshard.h"
#include "megatron_internal.h"
#include "torch_write.h"

/* Pieces stream from the source to the file through a buffer of about this
 * size, which stays in the CPU's cache from the read through the CRC-32 to
 * the write. Copying through it runs at cp's speed; through a whole piece,
 * every byte crosses memory four times, not two (docs/BENCHMARKS.md,
 * bench-megatron). */
#define BLOCK_BYTES ((int64_t)256 << 10)

/* An entry of the template's first parameter's optimizer state other than
 * the moments (torch's Adam keeps a step) is copied to every parameter;
 * the copies of a rank file take at most this plus the source's size in
 * bytes, so that a large hostile entry is not multiplied by the
 * parameters. A step takes a hundred bytes. */
#define COPY_BUDGET ((int64_t)1 << 20)

typedef struct {
    ckpt_reader *source;
    const megatron_checkpoint *template; /* NULL: a model written from its config alone */
    const megatron_config *c;
    const pickle_value *args; /* the args carried (the template's, or a torch_dist source's), or NULL */
    const char *args_file;    /* where they were read */
    const pickle_value *state; /* without a template: a torch_dist source's common state, or NULL */
    const megatron_source_names *names;
    void *scratch;        /* names: a piece's worth, for reordering a QKV */
    megatron_naming naming;
    ckpt_layout to;
    torch_writer *w;
    byte_buffer *b;
    int pp_rank, tp_rank;
    int optimizer;        /* write the source's optimizer state (optim/ROLE/NAME tensors) */
    void (*on_bytes)(void *ctx, int64_t bytes);
    void *progress_ctx;
    int carry_rank_state; /* the layout is the template's: each rank's RNG state goes along */
    int stored_padding;   /* the source's reader holds its stored vocabulary padding (not a torch_dist source's) */
    /* The tensors emitted into the pickle, in order: their bytes are
     * written after it (source tensor and piece; index -1: a tensor of the
     * template's rank file, raw, or empty). */
    struct pending {
        int index, piece;
        int64_t bytes, rows;
        int qkv;                 /* a fused QKV's piece, to reorder from a source under its own names */
        const pickle_value *raw; /* index -1: a tensor of the template's rank file (raw_pp, raw_tp) */
        int raw_pp, raw_tp;
    } *pending;
    int num_pending, pending_capacity;
    /* The parameters emitted, in order (source indices): the order the
     * optimizer numbers them in. */
    int *params;
    int num_params, params_capacity;
    int64_t block_bytes;  /* a piece streams through r->piece this much at a time */
    void *piece;          /* a buffer of a block, or of a whole piece where one is reordered */
    size_t piece_size;
    pk_memo *memo;        /* of the rank file's pickle: what is carried over from the template, written once */
    int64_t copy_budget;  /* bytes the copies of a per-parameter entry may take in a rank file */
    int source_failed;    /* a read of the source failed: its message names the source, no output context */
} rank_writer;

/* status, of a read of the source: its failure is the source's to name (its
 * file, its entry), so the rank file being written, a staging path the user
 * never sees, is not put in front of it (write_rank). */
static int source_read(rank_writer *r, int status)
{
    r->source_failed = status != TP_OK;
    return status;
}

static int add_pending(rank_writer *r, struct pending p)
{
    TP_TRY(array_reserve((void **)&r->pending, &r->pending_capacity, r->num_pending + 1, sizeof *r->pending));
    r->pending[r->num_pending++] = p;
    return TP_OK;
}

/* Where a value carried over from the template lies. */
typedef struct {
    rank_writer *r;
    int rank[2]; /* pp, tp of the template's rank file */
} template_value;

static int emit_raw_tensor(void *ctx, const pickle_value *t);

enum { NO_TENSORS, TENSORS = 1, COPY = 2 };

/* A value of the template's rank file from->rank written back (only data
 * and known classes: torch_write.h pk_value), its place in that file (a
 * printf format: "args.data_path") named where it is refused; with
 * TENSORS, its tensors copied whole; with COPY, a copy sharing nothing
 * written before (an entry given to every parameter). */
static int carry(rank_writer *r, const pickle_value *v, template_value *from, int how, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int carry(rank_writer *r, const pickle_value *v, template_value *from, int how, const char *fmt, ...)
{
    char path[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(path, sizeof path, fmt, args);
    va_end(args);
    pk_origin origin = {.file = megatron_rank_path(r->template, from->rank[0], from->rank[1]), .path = path,
                        .tensor = how & TENSORS ? emit_raw_tensor : NULL, .ctx = from, .copy = (how & COPY) != 0};
    return pk_value(r->b, r->memo, v, &origin);
}

/* A dict key as its place in a path: ".name", or "{key N}" for a key that
 * is no string. */
static const char *key_part(const pickle_value *key, int64_t i, char *buf, size_t size)
{
    if (key->kind == PICKLE_STRING) snprintf(buf, size, ".%.200s", key->text.data);
    else snprintf(buf, size, "{key %lld}", (long long)i);
    return buf;
}

/* The shape of tensor t's piece in a rank file at degree tp. A fused QKV
 * (qkv) is Megatron's even cut of its rows, [(heads + 2 groups) x
 * kv_channels / tp, hidden]: whole groups, or a group's share where fewer
 * groups than ranks (megatron_check_layout), whatever the source's own
 * pieces (this toolkit's hold the key and value of fewer groups than ranks
 * on each rank sharing them, docs/FORMAT.md replicate_small_segments). */
static void rank_piece_shape(const ckpt_tensor_desc *t, int tp, int qkv, int64_t *shape)
{
    ckpt_piece_shape(t, tp, shape);
    if (qkv) shape[0] = t->shape[0] / tp;
}

/* Emits this rank's piece of the source's tensor index (a fused QKV: qkv). */
static int emit_tensor(rank_writer *r, int index, int qkv)
{
    const ckpt_tensor_desc *t = ckpt_reader_tensor(r->source, index);
    int piece = t->partition.kind == CKPT_SPLIT ? r->tp_rank : 0;
    int64_t shape[CKPT_MAX_DIMS], bytes = (int64_t)tp_dtype_size(t->dtype);
    rank_piece_shape(t, r->to.tp, qkv, shape);
    for (int d = 0; d < t->ndim; d++) bytes *= shape[d];
    TP_TRY(add_pending(r, (struct pending){.index = index, .piece = piece, .bytes = bytes, .rows = shape[0], .qkv = qkv}));
    return torch_writer_tensor(r->w, torch_dtype_from_tp(t->dtype), t->ndim, shape);
}

int megatron_fill_vocabulary_padding(ckpt_reader *source, int stored_padding, int index, int tp, int piece, int64_t row0,
                                     int64_t count, void *buf)
{
    const ckpt_tensor_desc *t = ckpt_reader_tensor(source, index);
    /* This format's padding is zero, as reshard_read_piece leaves it. */
    if (!stored_padding || !ckpt_reader_is_foreign(source) || t->partition.kind != CKPT_SPLIT ||
        t->partition.pad_multiple <= 0 || t->partition.axis != 0)
        return TP_OK;
    int source_tp = ckpt_reader_layout(source)->tp;
    int64_t source_rows[CKPT_MAX_DIMS], target_rows[CKPT_MAX_DIMS];
    ckpt_padded_shape(t, source_tp, source_rows);
    ckpt_padded_shape(t, tp, target_rows);
    int64_t source_piece_rows = source_rows[0] / source_tp, first = piece * (target_rows[0] / tp) + row0;
    size_t row_bytes = tp_dtype_size(t->dtype);
    for (int d = 1; d < t->ndim; d++) row_bytes *= (size_t)t->shape[d];
    for (int64_t row = first < t->shape[0] ? t->shape[0] : first; row < first + count; row++) { /* past the tokens' rows */
        int64_t from = row < source_rows[0] ? row : source_rows[0] - 1;
        TP_TRY(ckpt_reader_read_rows(source, index, (int)(from / source_piece_rows), from % source_piece_rows, 1,
                                     (char *)buf + (size_t)(row - first) * row_bytes, row_bytes));
    }
    return TP_OK;
}

static int fill_vocabulary_padding(rank_writer *r, int index, int piece, int64_t row0, int64_t count, void *buf)
{
    return megatron_fill_vocabulary_padding(r->source, r->stored_padding, index, r->to.tp, piece, row0, count, buf);
}

/* Room for bytes in r->piece (and in r->scratch with it when scratch). */
static int reserve_piece(rank_writer *r, int64_t bytes, int scratch)
{
    if ((size_t)bytes > r->piece_size) {
        free(r->piece);
        free(r->scratch);
        r->scratch = NULL;
        r->piece_size = 0;
        if (!(r->piece = alloc_pages((size_t)bytes)))
            return tp_fail(TP_ERR_NOMEM, "out of memory for a piece of %lld bytes", (long long)bytes);
        r->piece_size = (size_t)bytes;
    }
    if (scratch && !r->scratch && !(r->scratch = alloc_pages(r->piece_size)))
        return tp_fail(TP_ERR_NOMEM, "out of memory for a piece of %lld bytes", (long long)bytes);
    return TP_OK;
}

/* A piece streamed from the source to the file through r->piece, a block
 * of rows at a time. */
static int stream_piece(rank_writer *r, const struct pending *p)
{
    int64_t row_bytes = p->rows > 0 ? p->bytes / p->rows : 0;
    if (row_bytes == 0) return torch_writer_storage(r->w, r->piece, p->bytes); /* an empty tensor */
    int64_t block = r->block_bytes / row_bytes > 0 ? r->block_bytes / row_bytes : 1;
    TP_TRY(reserve_piece(r, (p->rows < block ? p->rows : block) * row_bytes, 0));
    const ckpt_tensor_desc *t = ckpt_reader_tensor(r->source, p->index);
    for (int64_t row0 = 0; row0 < p->rows; row0 += block) {
        int64_t count = p->rows - row0 < block ? p->rows - row0 : block;
        TP_TRY(source_read(r, reshard_read_piece_rows(r->source, p->index, t, r->to.tp, p->piece, row0, count, r->piece,
                                                      r->piece_size)));
        TP_TRY(fill_vocabulary_padding(r, p->index, p->piece, row0, count, r->piece));
        TP_TRY(torch_writer_storage_part(r->w, r->piece, count * row_bytes));
        if (r->on_bytes) r->on_bytes(r->progress_ctx, count * row_bytes); /* the plan's bytes: tensors' */
    }
    return TP_OK;
}

/* The bytes of the tensors emitted, in order, each piece read from the
 * source as the target lays it out. */
static int write_pending(rank_writer *r)
{
    for (int k = 0; k < r->num_pending; k++) {
        const struct pending *p = &r->pending[k];
        /* A source under its own names lays a QKV out its own way: read whole, then reordered. */
        int reorder = p->index >= 0 && p->qkv && r->names;
        if (p->index >= 0 && !reorder) {
            TP_TRY(stream_piece(r, p));
            continue;
        }
        /* Fewer query groups than ranks (Megatron-Core's, megatron_check_layout):
         * the source's piece at tp holds the rank's share of its group's
         * query heads and the group's key and value (replicated), not
         * Megatron's cut of the group; its piece at degree groups holds the
         * group whole, [per_group + 2 heads, ...], of which this rank's rows
         * are part tp_rank % share of share. */
        int share = p->qkv && r->c->query_groups < r->to.tp ? r->to.tp / (int)r->c->query_groups : 1;
        TP_TRY(reserve_piece(r, p->bytes * share, reorder));
        if (reorder) {
            int degree = r->to.tp / share;
            TP_TRY(source_read(r, reshard_read_piece(r->source, p->index, ckpt_reader_tensor(r->source, p->index), degree,
                                                     p->piece / share, r->scratch, (size_t)(p->bytes * share))));
            r->names->qkv_to_megatron(r->names->ctx, degree, r->scratch, r->piece,
                                      (size_t)(p->bytes / p->rows * r->c->kv_channels));
            if (share > 1) memmove(r->piece, (char *)r->piece + (size_t)(p->piece % share * p->bytes), (size_t)p->bytes);
            TP_TRY(fill_vocabulary_padding(r, p->index, p->piece, 0, p->rows, r->piece));
        }
        else if (p->raw)
            TP_TRY(source_read(r, megatron_rank_tensor_read(r->template, p->raw_pp, p->raw_tp, p->raw, r->piece, p->bytes)));
        TP_TRY(torch_writer_storage(r->w, r->piece, p->bytes));
        if (r->on_bytes && p->index >= 0) r->on_bytes(r->progress_ctx, p->bytes);
    }
    return TP_OK;
}

/* The source's tensor of a canonical name, or -1. */
static int source_find(const rank_writer *r, const char *canonical)
{
    return r->names ? r->names->find(r->names->ctx, canonical) : ckpt_reader_find(r->source, canonical);
}

/* key: tensor, when the source has it; a parameter of the rank. */
static int entry(rank_writer *r, const char *key, const char *canonical)
{
    int index = source_find(r, canonical);
    if (index < 0) return TP_OK; /* a model without biases has none */
    TP_TRY(array_reserve((void **)&r->params, &r->params_capacity, r->num_params + 1, sizeof *r->params));
    r->params[r->num_params++] = index;
    pk_string(r->b, key);
    return emit_tensor(r, index, strstr(canonical, ".attention.qkv.") != NULL);
}

/* Transformer Engine's extra state before TE 2.0: an io.BytesIO holding
 * a torch.save, which TE torch.loads when the model loads. It goes back
 * only when it holds torch.save(None), TE's without FP8: FP8 state is not
 * converted, and a pickle in it could call anything. */
static int check_extra_bytes(const char *file, const char *key, const pickle_value *v)
{
    if (v->kind != PICKLE_OBJECT || strcmp(v->object.cls, "_io.BytesIO") != 0) return TP_OK;
    /* BytesIO(initial_bytes), then BUILD (value, position, __dict__). */
    const pickle_value *held[2] = {
        v->object.args && v->object.args->kind == PICKLE_TUPLE && v->object.args->items.count ? v->object.args->items.items[0]
                                                                                                : NULL,
        v->object.state && v->object.state->kind == PICKLE_TUPLE && v->object.state->items.count ? v->object.state->items.items[0]
                                                                                                  : NULL};
    int none = held[0] || held[1];
    for (int i = 0; i < 2 && none; i++) {
        if (!held[i]) continue;
        torch_archive *a = NULL;
        none = held[i]->kind == PICKLE_BYTES &&
               torch_archive_open_memory(key, held[i]->text.data, held[i]->text.size, NULL, &a) == TP_OK &&
               pickle_root(torch_archive_doc(a))->kind == PICKLE_NONE;
        torch_archive_close(a);
    }
    if (!none)
        return tp_fail(TP_ERR_FORMAT, "%s: %s holds other than torch.save(None) in an io.BytesIO (Transformer Engine's FP8 "
                       "state, which is not converted, or a pickle of other than data); not written", file, key);
    return TP_OK;
}

/* A module's _extra_state: None, or Transformer Engine's as the template
 * holds it (an empty uint8 tensor since TE 2.0, a BytesIO before). */
static int emit_extra(rank_writer *r, const char *key, int extra, const char *template_key)
{
    if (extra == MEGATRON_NO_EXTRA) return TP_OK;
    pk_string(r->b, key);
    if (extra == MEGATRON_EXTRA_NONE) {
        pk_none(r->b);
        return TP_OK;
    }
    const pickle_value *v = r->template ? megatron_model_value(r->template, template_key) : NULL;
    template_value first_rank = {r, {0, 0}};
    if (v && v->kind != PICKLE_TENSOR) {
        TP_TRY(check_extra_bytes(megatron_rank_path(r->template, 0, 0), template_key, v));
        /* A copy for each module, as each had its own. */
        return carry(r, v, &first_rank, COPY, "%s.%s", r->c->vpp > 1 ? "model0" : "model", template_key);
    }
    if (v && torch_tensor_numel(v) > 0)
        return tp_fail(TP_ERR_FORMAT, "%s: %s holds Transformer Engine's FP8 state, which is not converted",
                       megatron_path(r->template), template_key);
    int64_t empty = 0;
    TP_TRY(add_pending(r, (struct pending){.index = -1}));
    return torch_writer_tensor(r->w, TORCH_UINT8, 1, &empty);
}

int megatron_core_key(megatron_naming naming, const char *canonical, char *key, size_t size, int64_t *layer)
{
    static const char *const outside[][2] = {
        {"embedding.word_embeddings.weight", "embedding.word_embeddings.weight"},
        {"embedding.position_embeddings.weight", "embedding.position_embeddings.weight"},
        {"final_norm.weight", "decoder.final_layernorm.weight"},
        {"final_norm.bias", "decoder.final_layernorm.bias"},
        {"output_layer.weight", "output_layer.weight"},
    };
    *layer = -1;
    for (size_t i = 0; i < sizeof outside / sizeof *outside; i++)
        if (!strcmp(canonical, outside[i][0])) {
            snprintf(key, size, "%s", outside[i][1]);
            return TP_OK;
        }
    long long n;
    int used = 0;
    if (sscanf(canonical, "layers.%lld.%n", &n, &used) == 1 && used > 0 && n >= 0)
        for (const megatron_layer_module *m = megatron_layer_modules(naming); m->module; m++)
            for (int k = 0; k < 4 && m->leaves[k]; k++)
                if (!strcmp(canonical + used, m->canonical[k])) {
                    *layer = n;
                    snprintf(key, size, "decoder.layers.%s.%s", m->module, m->leaves[k]);
                    return TP_OK;
                }
    return tp_fail(TP_ERR_NOT_FOUND, "%s: not a tensor of Megatron-Core's GPT (%s names)", canonical,
                   megatron_naming_name(naming));
}

const char *megatron_layer_extra_module(megatron_naming naming, int i)
{
    for (const megatron_layer_module *m = megatron_layer_modules(naming); m->module; m++)
        if (m->extra != MEGATRON_NO_EXTRA && i-- == 0) return m->module;
    return NULL;
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
        for (const megatron_layer_module *m = megatron_layer_modules(r->naming); m->module; m++) {
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
        if (source_find(r, "embedding.position_embeddings.weight") >= 0) {
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
        TP_TRY(emit_extra(r, "_extra_state", r->naming == MEGATRON_NAMES_LEGACY ? MEGATRON_EXTRA_NONE : MEGATRON_NO_EXTRA, NULL));
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
        TP_TRY(emit_extra(r, "output_layer._extra_state", MEGATRON_EXTRA_NONE, NULL));
    }
    pk_dict_end(b);
    return TP_OK;
}

static void arg_int(byte_buffer *b, const char *key, int64_t value)
{
    pk_string(b, key);
    pk_int(b, value);
}

static void arg_bool(byte_buffer *b, const char *key, int value)
{
    pk_string(b, key);
    pk_bool(b, value);
}

static void arg_string(byte_buffer *b, const char *key, const char *value)
{
    pk_string(b, key);
    pk_string(b, value);
}

/* Args written from the model alone (no template): the fields Megatron's
 * loader and converters read (docs/MEGATRON.md section 3), for the models
 * this toolkit trains: GPT-2 (learned positions, LayerNorm, biases, GELU's
 * tanh form, tied embeddings) or Llama (rotary positions, RMSNorm, no
 * biases, SwiGLU, tied or untied embeddings). */
static void emit_model_args(byte_buffer *b, const megatron_args_spec *a)
{
    const megatron_config *c = a->model;
    arg_int(b, "num_layers", c->num_layers);
    arg_int(b, "hidden_size", c->hidden);
    arg_int(b, "ffn_hidden_size", c->ffn);
    arg_int(b, "num_attention_heads", c->heads);
    arg_int(b, "kv_channels", c->kv_channels);
    arg_bool(b, "group_query_attention", c->query_groups != c->heads);
    arg_int(b, "num_query_groups", c->query_groups);
    arg_int(b, "max_position_embeddings", c->max_positions);
    arg_int(b, "seq_length", c->max_positions);
    arg_string(b, "position_embedding_type", c->learned_positions ? "learned_absolute" : "rope");
    arg_bool(b, "add_position_embedding", c->learned_positions);
    arg_bool(b, "use_rotary_position_embeddings", !c->learned_positions);
    if (!c->learned_positions) {
        pk_string(b, "rotary_base");
        pk_int(b, (int64_t)c->rotary_base); /* Megatron's --rotary-base is an integer */
        pk_string(b, "rotary_percent");
        pk_float(b, c->rotary_percent > 0 ? c->rotary_percent : 1.0);
        arg_bool(b, "rotary_interleaved", c->rotary_interleaved);
        arg_bool(b, "use_rope_scaling", c->rope_scaling_factor > 0);
        pk_string(b, "rotary_scaling_factor");
        pk_float(b, c->rope_scaling_factor > 0 ? c->rope_scaling_factor : 8.0);
    }
    arg_string(b, "normalization", c->rmsnorm ? "RMSNorm" : "LayerNorm");
    pk_string(b, "norm_epsilon");
    pk_float(b, c->norm_epsilon);
    arg_bool(b, "add_bias_linear", c->has_bias);
    arg_bool(b, "add_qkv_bias", c->has_bias);
    arg_bool(b, "swiglu", c->swiglu);
    arg_bool(b, "openai_gelu", c->openai_gelu);
    arg_bool(b, "untie_embeddings_and_output_weights", c->untied);
    arg_bool(b, "apply_residual_connection_post_layernorm", c->post_layernorm_residual);
    /* The true vocabulary where known (this toolkit's models), else only
     * the padded one, as Megatron records it (a Megatron-Core source). */
    pk_string(b, "vocab_size");
    if (c->true_vocab > 0) pk_int(b, c->true_vocab);
    else pk_none(b);
    arg_int(b, "make_vocab_size_divisible_by", c->vocab_divisible_by);
    arg_int(b, "padded_vocab_size",
            c->true_vocab > 0 ? megatron_vocab_with_padding(c->true_vocab, c->vocab_divisible_by, a->tp) : c->padded_vocab);
    arg_int(b, "tensor_model_parallel_size", a->tp);
    arg_int(b, "pipeline_model_parallel_size", a->pp);
    pk_string(b, "virtual_pipeline_model_parallel_size");
    pk_none(b);
    pk_string(b, "params_dtype");
    pk_global(b, "torch", c->dtype == TP_BF16 ? "bfloat16" : c->dtype == TP_FP16 ? "float16" : "float32");
    arg_bool(b, "fp16", c->dtype == TP_FP16);
    arg_bool(b, "bf16", c->dtype == TP_BF16);
    arg_int(b, "iteration", c->stored_iteration);
    arg_int(b, "consumed_train_samples", c->consumed_samples);
    arg_string(b, "ckpt_format", a->ckpt_format ? a->ckpt_format : "torch");
    arg_bool(b, "use_legacy_models", a->naming < MEGATRON_NAMES_CORE);
    arg_bool(b, "use_mcore_models", a->naming >= MEGATRON_NAMES_CORE);
    if (a->naming >= MEGATRON_NAMES_CORE)
        arg_string(b, "transformer_impl", a->naming == MEGATRON_NAMES_CORE ? "transformer_engine" : "local");
    arg_bool(b, "bert_binary_head", 0);
    if (a->no_optimizer >= 0) arg_bool(b, "no_save_optim", a->no_optimizer);
    if (a->no_rng >= 0) arg_bool(b, "no_save_rng", a->no_rng);
}

int megatron_args_write(byte_buffer *b, pk_memo *memo, const megatron_args_spec *a)
{
    pk_global(b, "argparse", "Namespace");
    buffer_put(b, ")\x81", 2); /* Namespace.__new__(Namespace): EMPTY_TUPLE, NEWOBJ */
    pk_dict_begin(b);
    if (!a->args) {
        emit_model_args(b, a);
        pk_dict_end(b);
        buffer_put(b, "b", 1); /* BUILD */
        return TP_OK;
    }
    int core = a->naming >= MEGATRON_NAMES_CORE;
    const pickle_value *state = a->args->object.state;
    int format_seen = 0, optim_seen = 0, rng_seen = 0;
    for (int64_t i = 0; state && state->kind == PICKLE_DICT && i < state->dict.keys.count; i++) {
        const pickle_value *k = state->dict.keys.items[i];
        char path[512], part[256];
        snprintf(path, sizeof path, "args{key %lld}", (long long)i);
        pk_origin key_origin = {.file = a->file, .path = path};
        TP_TRY(pk_value(b, memo, k, &key_origin));
        if (pickle_is_string(k, "tensor_model_parallel_size")) pk_int(b, a->tp);
        else if (pickle_is_string(k, "pipeline_model_parallel_size") ||
                 pickle_is_string(k, "transformer_pipeline_model_parallel_size"))
            pk_int(b, a->pp);
        else if (pickle_is_string(k, "padded_vocab_size") && a->model->true_vocab > 0)
            pk_int(b, megatron_vocab_with_padding(a->model->true_vocab, a->model->vocab_divisible_by, a->tp));
        else if (pickle_is_string(k, "world_size") && state->dict.values.items[i]->kind == PICKLE_INT &&
                   a->model->tp * a->model->pp > 0 &&
                   state->dict.values.items[i]->integer % (a->model->tp * a->model->pp) == 0) {
            /* The same data-parallel size over the output's model-parallel ranks. */
            pk_int(b, state->dict.values.items[i]->integer / (a->model->tp * a->model->pp) * a->tp * a->pp);
        } else if (pickle_is_string(k, "virtual_pipeline_model_parallel_size") ||
                 pickle_is_string(k, "num_layers_per_virtual_pipeline_stage"))
            pk_none(b);
        /* The model family and its modules, as the names say (Megatron
         * builds the model these args describe, then loads the names). */
        else if (pickle_is_string(k, "use_legacy_models") && !a->keep_family) pk_bool(b, !core);
        else if (pickle_is_string(k, "use_mcore_models") && !a->keep_family) pk_bool(b, core);
        else if (pickle_is_string(k, "transformer_impl") && core && !a->keep_family)
            pk_string(b, a->naming == MEGATRON_NAMES_CORE ? "transformer_engine" : "local");
        /* What the checkpoint holds, where the writer says. */
        else if (pickle_is_string(k, "ckpt_format") && a->ckpt_format && (format_seen = 1)) pk_string(b, a->ckpt_format);
        else if (pickle_is_string(k, "use_dist_ckpt") && a->ckpt_format) pk_bool(b, !strcmp(a->ckpt_format, "torch_dist"));
        else if (pickle_is_string(k, "no_save_optim") && a->no_optimizer >= 0 && (optim_seen = 1)) pk_bool(b, a->no_optimizer);
        else if (pickle_is_string(k, "no_save_rng") && a->no_rng >= 0 && (rng_seen = 1)) pk_bool(b, a->no_rng);
        else {
            snprintf(path, sizeof path, "args%s", key_part(k, i, part, sizeof part));
            pk_origin origin = {.file = a->file, .path = path};
            TP_TRY(pk_value(b, memo, state->dict.values.items[i], &origin));
        }
    }
    if (a->ckpt_format && !format_seen) arg_string(b, "ckpt_format", a->ckpt_format);
    if (a->no_optimizer >= 0 && !optim_seen) arg_bool(b, "no_save_optim", a->no_optimizer);
    if (a->no_rng >= 0 && !rng_seen) arg_bool(b, "no_save_rng", a->no_rng);
    pk_dict_end(b);
    buffer_put(b, "b", 1); /* BUILD */
    return TP_OK;
}

/* Whether this rank's file carries its RNG state (emit_training_state):
 * the template's, where the layout is its own. */
static int rank_rng_written(const rank_writer *r)
{
    return r->template && r->carry_rank_state && megatron_rank_value(r->template, r->pp_rank, r->tp_rank, "rng_state");
}

/* The template's args, or a torch_dist source's (in the legacy format:
 * ckpt_format torch), with the parallel sizes of the output; or the
 * model's own. no_save_optim and no_save_rng say what this rank file
 * holds (a weights-only output, RNG states left out on a change of layout
 * or never read), not what the source's did. */
static int emit_args(rank_writer *r)
{
    megatron_args_spec spec = {.model = r->c, .naming = r->naming, .tp = r->to.tp, .pp = r->to.pp, .args = r->args,
                               .file = r->args_file, .ckpt_format = r->template || !r->args ? NULL : "torch",
                               .no_optimizer = !r->optimizer, .no_rng = !rank_rng_written(r)};
    return megatron_args_write(r->b, r->memo, &spec);
}

/* ------------------------------------------------------- optimizer state */

/* A tensor of a value of the template's rank file, copied whole: an RNG
 * state, a loss scale. */
static int emit_raw_tensor(void *ctx, const pickle_value *t)
{
    template_value *from = ctx;
    rank_writer *r = from->r;
    if (!torch_tensor_is_contiguous(t))
        return tp_fail(TP_ERR_FORMAT, "%s: a non-contiguous tensor among the state carried over", megatron_path(r->template));
    int64_t numel = torch_tensor_numel(t);
    torch_dtype dtype = t->tensor->storage->storage.dtype;
    TP_TRY(add_pending(r, (struct pending){.index = -1, .bytes = numel * (int64_t)torch_dtype_size(dtype), .raw = t,
                                           .raw_pp = from->rank[0], .raw_tp = from->rank[1]}));
    return torch_writer_tensor(r->w, dtype, t->tensor->ndim, t->tensor->shape);
}

/* The source's optimizer tensor of role for parameter index. */
static int emit_optimizer_tensor(rank_writer *r, int param, const char *role)
{
    char name[CKPT_NAME_MAX + 32];
    const char *param_name = ckpt_reader_tensor(r->source, param)->name;
    snprintf(name, sizeof name, "optim/%s/%s", role, param_name);
    int index = ckpt_reader_find(r->source, name);
    if (index < 0)
        return tp_fail(TP_ERR_NOT_FOUND, "%s: no %s state for parameter %s", ckpt_reader_path(r->source), role, param_name);
    return emit_tensor(r, index, 0);
}

/* The optimizer state dict of this rank as Megatron's optimizers write it
 * (docs/MEGATRON.md section 7): the parameters numbered in the order
 * emitted, regrouped by weight decay in order of first appearance; each
 * group's other entries, and everything around the state (the loss
 * scaler), from the template's first rank file. */
static int emit_optimizer(rank_writer *r)
{
    byte_buffer *b = r->b;
    const char *file = megatron_path(r->template);
    const pickle_value *outer = megatron_rank_value(r->template, 0, 0, "optimizer");
    const pickle_value *inner = pickle_get(outer, "optimizer");
    int wrapped = inner && inner->kind == PICKLE_DICT;
    if (!wrapped) inner = outer;
    const pickle_value *groups = pickle_get(inner, "param_groups"), *state = pickle_get(inner, "state");
    if (!groups || groups->kind != PICKLE_LIST || !state || state->kind != PICKLE_DICT || !state->dict.values.count)
        return tp_fail(TP_ERR_FORMAT, "%s: the first rank file's optimizer has no state and param_groups to follow", file);
    const pickle_value *state0 = state->dict.values.items[0];
    template_value first_rank = {r, {0, 0}};
    const char *where = wrapped ? "optimizer.optimizer" : "optimizer"; /* in messages */
    /* The groups in order of first appearance, each the template's group
     * of the same weight decay. */
    const pickle_value *group_of[2] = {NULL, NULL};
    int order[2], num_groups = 0, group_index[2] = {0, 0};
    for (int64_t g = 0; g < groups->items.count; g++) {
        int cls;
        TP_TRY(megatron_group_no_weight_decay(groups->items.items[g], file, g, &cls));
        group_of[cls] = groups->items.items[g];
        group_index[cls] = (int)g;
    }
    for (int k = 0; k < r->num_params && num_groups < 2; k++) {
        int cls = megatron_no_weight_decay(ckpt_reader_tensor(r->source, r->params[k]));
        if (num_groups == 1 && order[0] == cls) continue;
        if (!group_of[cls])
            return tp_fail(TP_ERR_FORMAT, "%s: the optimizer has no param group %s weight decay", file, cls ? "without" : "with");
        order[num_groups++] = cls;
    }
    if (wrapped) {
        pk_dict_begin(b);
        pk_string(b, "optimizer");
    }
    pk_dict_begin(b);
    pk_string(b, "state");
    pk_dict_begin(b);
    int64_t n = 0;
    for (int g = 0; g < num_groups; g++)
        for (int k = 0; k < r->num_params; k++) {
            if (megatron_no_weight_decay(ckpt_reader_tensor(r->source, r->params[k])) != order[g]) continue;
            pk_int(b, n++);
            pk_dict_begin(b);
            pk_string(b, "exp_avg");
            TP_TRY(emit_optimizer_tensor(r, r->params[k], "exp_avg"));
            pk_string(b, "exp_avg_sq");
            TP_TRY(emit_optimizer_tensor(r, r->params[k], "exp_avg_sq"));
            /* Other per-parameter entries (torch's Adam keeps a step) as the template has them. */
            for (int64_t i = 0; state0->kind == PICKLE_DICT && i < state0->dict.keys.count; i++) {
                const pickle_value *key = state0->dict.keys.items[i];
                if (pickle_is_string(key, "exp_avg") || pickle_is_string(key, "exp_avg_sq")) continue;
                char part[256];
                TP_TRY(carry(r, key, &first_rank, COPY, "%s.state[0]{key %lld}", where, (long long)i));
                TP_TRY(carry(r, state0->dict.values.items[i], &first_rank, TENSORS | COPY, "%s.state[0]%s", where,
                             key_part(key, i, part, sizeof part)));
            }
            pk_dict_end(b);
        }
    pk_dict_end(b); /* state */
    pk_string(b, "param_groups");
    pk_list_begin(b);
    n = 0;
    for (int g = 0; g < num_groups; g++) {
        const pickle_value *group = group_of[order[g]];
        int64_t count = 0;
        for (int k = 0; k < r->num_params; k++)
            count += megatron_no_weight_decay(ckpt_reader_tensor(r->source, r->params[k])) == order[g];
        pk_dict_begin(b);
        for (int64_t i = 0; i < group->dict.keys.count; i++) {
            if (pickle_is_string(group->dict.keys.items[i], "params")) continue;
            char part[256];
            TP_TRY(carry(r, group->dict.keys.items[i], &first_rank, NO_TENSORS, "%s.param_groups{key %lld}", where,
                         (long long)i));
            TP_TRY(carry(r, group->dict.values.items[i], &first_rank, NO_TENSORS, "%s.param_groups[%d]%s", where,
                         group_index[order[g]], key_part(group->dict.keys.items[i], i, part, sizeof part)));
        }
        pk_string(b, "params"); /* torch writes it last */
        pk_list_begin(b);
        for (int64_t i = 0; i < count; i++) pk_int(b, n++);
        pk_list_end(b);
        pk_dict_end(b);
    }
    pk_list_end(b);
    pk_dict_end(b); /* the torch optimizer's state dict */
    if (!wrapped) return TP_OK;
    /* Float16OptimizerWithFloat16Params: the loss scaler as the template's,
     * then the fp32 master weights, a list per group. */
    for (int64_t i = 0; i < outer->dict.keys.count; i++) {
        const pickle_value *key = outer->dict.keys.items[i];
        if (pickle_is_string(key, "optimizer") || pickle_is_string(key, "fp32_from_fp16_params")) continue;
        char part[256];
        TP_TRY(carry(r, key, &first_rank, NO_TENSORS, "optimizer{key %lld}", (long long)i));
        TP_TRY(carry(r, outer->dict.values.items[i], &first_rank, TENSORS, "optimizer%s", key_part(key, i, part, sizeof part)));
    }
    /* Masters of the 16-bit parameters only: fp32 ones are their own, kept
     * in the wrapper's fp32_from_fp32_groups, which its state dict leaves
     * out (an fp32 model under this wrapper: empty lists). */
    pk_string(b, "fp32_from_fp16_params");
    pk_list_begin(b);
    for (int g = 0; g < num_groups; g++) {
        pk_list_begin(b);
        for (int k = 0; k < r->num_params; k++) {
            const ckpt_tensor_desc *param = ckpt_reader_tensor(r->source, r->params[k]);
            if (megatron_no_weight_decay(param) == order[g] && param->dtype != TP_FP32)
                TP_TRY(emit_optimizer_tensor(r, r->params[k], "master"));
        }
        pk_list_end(b);
    }
    pk_list_end(b);
    pk_dict_end(b);
    return TP_OK;
}

/* num_floating_point_operations_so_far, the work done, where the source
 * records a number. */
static void emit_work_done(byte_buffer *b, const pickle_value *flops)
{
    if (!flops || (flops->kind != PICKLE_FLOAT && flops->kind != PICKLE_INT)) return;
    pk_string(b, "num_floating_point_operations_so_far");
    if (flops->kind == PICKLE_FLOAT) pk_float(b, flops->real);
    else pk_int(b, flops->integer);
}

/* After the model: the optimizer state and its schedule; each rank's RNG
 * and rerun state where the layout is the template's (they belong to a
 * rank: Megatron itself drops them on a change of layout); the work done. */
static int emit_training_state(rank_writer *r)
{
    byte_buffer *b = r->b;
    if (!r->template) { /* a model alone: weights only, and a torch_dist source's work done */
        emit_work_done(b, r->state ? pickle_get(r->state, "num_floating_point_operations_so_far") : NULL);
        return TP_OK;
    }
    if (r->optimizer) {
        pk_string(b, "optimizer");
        TP_TRY(emit_optimizer(r));
        const pickle_value *schedule = megatron_rank_value(r->template, 0, 0, "opt_param_scheduler");
        if (schedule) {
            pk_string(b, "opt_param_scheduler");
            template_value first_rank = {r, {0, 0}};
            TP_TRY(carry(r, schedule, &first_rank, NO_TENSORS, "opt_param_scheduler"));
        }
    }
    const char *per_rank[] = {"rerun_state_machine", "rng_state"};
    template_value this_rank = {r, {r->pp_rank, r->tp_rank}};
    for (int i = 0; i < 2 && r->carry_rank_state; i++) {
        const pickle_value *v = megatron_rank_value(r->template, r->pp_rank, r->tp_rank, per_rank[i]);
        if (!v) continue;
        pk_string(b, per_rank[i]);
        TP_TRY(carry(r, v, &this_rank, TENSORS, "%s", per_rank[i]));
    }
    emit_work_done(b, megatron_rank_value(r->template, 0, 0, "num_floating_point_operations_so_far"));
    return TP_OK;
}

static int write_rank(rank_writer *r, const char *iteration_dir)
{
    char dir[4400], file[4500];
    if (r->to.pp > 1) snprintf(dir, sizeof dir, "%s/mp_rank_%02d_%03d", iteration_dir, r->tp_rank, r->pp_rank);
    else snprintf(dir, sizeof dir, "%s/mp_rank_%02d", iteration_dir, r->tp_rank);
    if (mkdir(dir, 0755) != 0) return tp_fail(TP_ERR_IO, "%s: cannot create: %s", dir, strerror(errno));
    snprintf(file, sizeof file, "%s/" MEGATRON_RANK_FILE, dir);
    TP_TRY(torch_writer_open(file, "model_optim_rng", &r->w));
    r->b = torch_writer_pickle(r->w);
    int status = pk_memo_create(r->copy_budget, &r->memo);
    pk_dict_begin(r->b);
    pk_string(r->b, "args");
    if (!status) status = emit_args(r);
    pk_string(r->b, "checkpoint_version");
    pk_float(r->b, 3.0);
    pk_string(r->b, "iteration");
    pk_int(r->b, r->c->stored_iteration >= 0 ? r->c->stored_iteration : 0);
    pk_string(r->b, "model");
    r->num_pending = 0;
    r->num_params = 0;
    if (!status) status = r->naming >= MEGATRON_NAMES_CORE ? emit_model_core(r) : emit_model_legacy(r);
    if (!status) status = emit_training_state(r);
    pk_dict_end(r->b);
    pk_memo_free(r->memo);
    r->memo = NULL;
    if (!status) status = torch_writer_begin_storages(r->w);
    if (!status) status = write_pending(r);
    if (status) {
        torch_writer_abort(r->w);
        return r->source_failed ? status : tp_fail_context(status, "%s", file);
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

/* ------------------------------------------------ the save directory */

int megatron_save_iteration_dir(const char *root, int64_t iteration, char *out, size_t size)
{
    if (iteration < 0) snprintf(out, size, "%s/release", root);
    else snprintf(out, size, "%s/iter_%07lld", root, (long long)iteration);
    return mkdir(out, 0755) ? tp_fail(TP_ERR_IO, "%s: cannot create: %s", out, strerror(errno)) : TP_OK;
}

int megatron_save_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wx");
    if (!f) return tp_fail(TP_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int status = TP_OK;
    if (fputs(text, f) < 0 || fflush(f) != 0 || fsync(fileno(f)) != 0)
        status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    if (fclose(f) != 0 && !status) status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return status;
}

int megatron_save_tracker(const char *root, int64_t iteration)
{
    char path[CKPT_PATH_MAX + 64], text[32];
    snprintf(path, sizeof path, "%s/" MEGATRON_TRACKER_NAME, root);
    if (iteration < 0) snprintf(text, sizeof text, "release");
    else snprintf(text, sizeof text, "%lld", (long long)iteration);
    return megatron_save_text(path, text);
}

/* What one directory of a save directory holds, against what a writer
 * writes there (ours): the first entry it does not (stray), and the
 * iteration directories seen (at the root). */
typedef struct {
    const store_ops *storage;
    const char *dir;
    int level; /* 0: the save directory, 1: an iteration's, 2: a directory in it (a rank's) */
    megatron_entry_is_ours ours;
    int iterations;
    char iteration[256], stray[520]; /* stray: a rank directory/its entry at most */
} output_scan;

static int visit_output_entry(void *ctx, const char *name)
{
    output_scan *scan = ctx;
    int ours = scan->level == 0 ? !strcmp(name, MEGATRON_TRACKER_NAME) || megatron_iteration_dir_name(name)
                                : scan->ours(scan->level, name);
    if (!ours) {
        snprintf(scan->stray, sizeof scan->stray, "%s", name);
        return TP_ERR_EXISTS;
    }
    if (scan->level == 0 && strcmp(name, MEGATRON_TRACKER_NAME)) {
        if (scan->iterations++) { /* a second iteration: a run's history */
            snprintf(scan->stray, sizeof scan->stray, "%s", name);
            return TP_ERR_EXISTS;
        }
        snprintf(scan->iteration, sizeof scan->iteration, "%s", name);
    }
    return TP_OK;
}

/* The stray entry of dir (level as in output_scan) and of what it holds, if any. */
static int scan_output_dir(const store_ops *storage, const char *dir, int level, megatron_entry_is_ours ours,
                           output_scan *scan);

static int visit_inner_dir(void *ctx, const char *name)
{
    output_scan *parent = ctx;
    if (!parent->ours(-1, name)) return TP_OK; /* not a directory of the writer's: a file, scanned already */
    char path[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(path, parent->dir, name));
    output_scan scan;
    int status = scan_output_dir(parent->storage, path, 2, parent->ours, &scan);
    if (status == TP_ERR_EXISTS) snprintf(parent->stray, sizeof parent->stray, "%.255s/%.255s", name, scan.stray);
    return status;
}

static int scan_output_dir(const store_ops *storage, const char *dir, int level, megatron_entry_is_ours ours,
                           output_scan *scan)
{
    *scan = (output_scan){.storage = storage, .dir = dir, .level = level, .ours = ours};
    TP_TRY(storage->list(storage, dir, visit_output_entry, scan));
    return level == 1 ? storage->list(storage, dir, visit_inner_dir, scan) : TP_OK;
}

int megatron_save_may_replace(const store_ops *storage, const char *path, const char *kind, const char *writes,
                              megatron_entry_is_ours ours)
{
    TP_TRY(ckpt_refuse_run_directory(storage, path));
    store_stat st;
    TP_TRY(storage->stat(storage, path, &st));
    if (!st.exists) return TP_OK;
    char refusal[512];
    snprintf(refusal, sizeof refusal,
             "--force replaces only a %s checkpoint the toolkit could have written (the tracker and one iteration of "
             "%s, nothing else): choose another output, or remove it yourself", kind, writes);
    if (!st.is_dir) return tp_fail(TP_ERR_EXISTS, "%s is a file, not a %s save directory; %s", path, kind, refusal);
    output_scan root, iteration;
    int status = scan_output_dir(storage, path, 0, ours, &root);
    if (status == TP_ERR_EXISTS && root.iterations > 1)
        return tp_fail(TP_ERR_EXISTS, "%s holds more than one iteration (%s, %s): a run's history; %s", path,
                       root.iteration, root.stray, refusal);
    if (status == TP_ERR_EXISTS && ours(1, root.stray))
        return tp_fail(TP_ERR_EXISTS, "%s holds %s: it is one iteration of a %s checkpoint, not a save directory; %s",
                       path, root.stray, kind, refusal);
    if (status == TP_ERR_EXISTS) return tp_fail(TP_ERR_EXISTS, "%s holds '%s'; %s", path, root.stray, refusal);
    TP_TRY(status);
    if (!root.iterations) return TP_OK; /* an empty directory, or a tracker alone */
    char dir[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(dir, path, root.iteration));
    status = scan_output_dir(storage, dir, 1, ours, &iteration);
    if (status == TP_ERR_EXISTS)
        return tp_fail(TP_ERR_EXISTS, "%s holds '%s/%s'; %s", path, root.iteration, iteration.stray, refusal);
    return status;
}

/* A legacy save's entries: rank directories in the iteration's (mp_rank_TT
 * or mp_rank_TT_PPP), each holding its rank file; level -1 asks which are
 * directories to look into. */
static int legacy_entry(int level, const char *name)
{
    if (level == 2) return !strcmp(name, MEGATRON_RANK_FILE);
    size_t n = strlen(name);
    if (strncmp(name, "mp_rank_", 8) || (n != 10 && n != 14) || (n == 14 && name[10] != '_')) return 0;
    for (size_t i = 8; i < n; i++)
        if (i != 10 && (name[i] < '0' || name[i] > '9')) return 0;
    return 1;
}

int megatron_may_replace(const store_ops *storage, const char *path, void *ctx)
{
    (void)ctx;
    return megatron_save_may_replace(storage, path, "Megatron-LM", "rank files", legacy_entry);
}

int megatron_check_layout(const megatron_config *c, const ckpt_layout *to, megatron_naming naming)
{
    if (c->num_layers % to->pp)
        return tp_fail(TP_ERR_LAYOUT, "%lld layers do not divide over pp %d", (long long)c->num_layers, to->pp);
    /* Megatron-Core 0.16 and later also take fewer query groups than ranks,
     * a divisor (f7dfb99795; before it, and in the legacy model, Attention
     * divide()s the groups by tp): the tp/groups ranks sharing a group then
     * cut its rows, its query heads and its key and value heads, evenly
     * (said to the user: registry_write.c note_groups_cut). */
    int shared = naming >= MEGATRON_NAMES_CORE && to->tp % c->query_groups == 0 && c->heads % to->tp == 0;
    int groups_split = c->query_groups % to->tp == 0 ||
                       (shared && (c->heads / c->query_groups + 2) % (to->tp / c->query_groups) == 0);
    if (c->heads % to->tp || c->ffn % to->tp)
        return tp_fail(TP_ERR_LAYOUT, "%lld heads and ffn %lld do not both divide over tp %d", (long long)c->heads,
                       (long long)c->ffn, to->tp);
    if (!groups_split && shared)
        return tp_fail(TP_ERR_LAYOUT, "%lld query groups over tp %d: the %d ranks sharing a group cannot cut its %lld "
                       "heads' rows (%lld query heads and its key and value) evenly", (long long)c->query_groups,
                       to->tp, to->tp / (int)c->query_groups, (long long)(c->heads / c->query_groups + 2),
                       (long long)(c->heads / c->query_groups));
    if (!groups_split)
        return tp_fail(TP_ERR_LAYOUT, "%lld query groups do not divide over tp %d (Megatron's legacy model needs the "
                       "query groups to, Megatron-Core the groups or tp to divide the other)", (long long)c->query_groups,
                       to->tp);
    if (!c->true_vocab && c->padded_vocab % (c->vocab_divisible_by * to->tp))
        return tp_fail(TP_ERR_LAYOUT, "the padded vocabulary of %lld rows is not a multiple of %lld x tp %d, as Megatron "
                       "pads for tp %d; --true-vocab-size N (the tokenizer's size) lets it be padded again",
                       (long long)c->padded_vocab, (long long)c->vocab_divisible_by, to->tp, to->tp);
    return TP_OK;
}

/* What the rank files carry over from the template (args, the model's
 * extra states, the optimizer's groups, loss scaler and schedule, each
 * rank's RNG and rerun state where the layout stays), checked before
 * anything is written: only data and known classes go back (torch_write.h
 * pk_value), so that a call in the source is refused naming where it lies
 * rather than carried into a file that torch.load runs. */
static int check_carried(const megatron_checkpoint *template, int optimizer, int carry_rank_state)
{
    const megatron_config *c = megatron_config_of(template);
    const char *first = megatron_rank_path(template, 0, 0);
    if (megatron_args(template)) TP_TRY(pk_value_check(megatron_args(template), first, "args", 0));
    const char *model = c->vpp > 1 ? "model0" : "model";
    const pickle_value *v = megatron_rank_value(template, 0, 0, model);
    if (v) TP_TRY(pk_value_check(v, first, model, 1));
    for (int64_t i = 0; v && v->kind == PICKLE_DICT && i < v->dict.keys.count; i++) {
        const pickle_value *key = v->dict.keys.items[i];
        if (key->kind == PICKLE_STRING && key->text.size >= 12 &&
            !strcmp(key->text.data + key->text.size - 12, "_extra_state"))
            TP_TRY(check_extra_bytes(first, key->text.data, v->dict.values.items[i]));
    }
    const char *training[] = {"optimizer", "opt_param_scheduler"};
    for (int i = 0; i < 2 && optimizer; i++)
        if ((v = megatron_rank_value(template, 0, 0, training[i]))) TP_TRY(pk_value_check(v, first, training[i], 1));
    const char *per_rank[] = {"rerun_state_machine", "rng_state"};
    for (int f = 0; f < c->tp * c->pp && carry_rank_state; f++)
        for (int i = 0; i < 2; i++)
            if ((v = megatron_rank_value(template, f / c->tp, f % c->tp, per_rank[i])))
                TP_TRY(pk_value_check(v, megatron_rank_path(template, f / c->tp, f % c->tp), per_rank[i], 1));
    return TP_OK;
}

/* The args a write carries (*file: where they were read): the template's;
 * without one a torch_dist source's, from its common state (*state); NULL:
 * written from the model. */
static const pickle_value *carried_args(const megatron_checkpoint *template, const megatron_write_options *o,
                                        const char **file, const pickle_value **state)
{
    *file = NULL;
    *state = NULL;
    if (template) {
        *file = megatron_rank_path(template, 0, 0);
        return megatron_args(template);
    }
    if (!o->dist) return NULL;
    const torch_archive *archive;
    *state = megatron_dist_common_state(o->dist, &archive, file);
    return pickle_get(*state, "args");
}

/* Stored bytes of tensor t at the target: every piece, on every rank that holds one. */
static int64_t written_bytes(const ckpt_tensor_desc *t, int tp, int qkv, int64_t *piece)
{
    int64_t shape[CKPT_MAX_DIMS], bytes = (int64_t)tp_dtype_size(t->dtype);
    rank_piece_shape(t, tp, qkv, shape);
    for (int d = 0; d < t->ndim; d++) bytes *= shape[d];
    *piece = bytes;
    return bytes * tp; /* split: tp pieces; replicated: a copy on each rank */
}

int megatron_write_plan_create(ckpt_reader *source, const megatron_checkpoint *template, const megatron_write_options *options,
                               megatron_write_plan *plan)
{
    if (!template && !options->model) return tp_fail(TP_ERR_ARG, "a Megatron-LM output needs a template or a model");
    const megatron_config *c = template ? megatron_config_of(template) : options->model;
    const char *name = template ? megatron_path(template) : ckpt_reader_path(source);
    memset(plan, 0, sizeof *plan);
    ckpt_layout to = {.tp = c->tp, .pp = c->pp, .dp = 1, .num_layers = c->num_layers};
    if (options->tp) to.tp = options->tp;
    if (options->pp) to.pp = options->pp;
    plan->tp = to.tp;
    plan->pp = to.pp;
    plan->files = to.tp * to.pp;
    /* The optimizer state goes along when the source has it, read. */
    for (int i = 0; i < ckpt_reader_num_tensors(source) && !plan->optimizer; i++) {
        const char *role = ckpt_reader_tensor(source, i)->role;
        plan->optimizer = role && !strcmp(role, "exp_avg");
    }
    if (options->weights_only || !c->optimizer_read) plan->optimizer = 0;
    if (plan->optimizer && c->distributed_optimizer)
        return tp_fail(TP_ERR_LAYOUT, "%s: writing the distributed optimizer's state (distrib_optim.pt) is not implemented "
                       "yet; --format tp keeps it, --weights-only converts the weights alone", name);
    plan->rank_state_dropped = template && !(to.tp == c->tp && to.pp == c->pp) && megatron_rank_value(template, 0, 0, "rng_state");
    megatron_naming naming = options->naming >= 0 ? (megatron_naming)options->naming : c->naming;
    TP_TRY(megatron_check_layout(c, &to, naming));
    if (template) TP_TRY(check_carried(template, plan->optimizer, to.tp == c->tp && to.pp == c->pp));
    const char *args_file;
    const pickle_value *state, *args = carried_args(template, options, &args_file, &state);
    if (!template && args) TP_TRY(pk_value_check(args, args_file, "args", 0)); /* a torch_dist source's */
    const char *largest = "";
    for (int i = 0; i < ckpt_reader_num_tensors(source); i++) {
        const ckpt_tensor_desc *t = ckpt_reader_tensor(source, i);
        TP_TRY(ckpt_tensor_check(t, to.tp)); /* every piece as the source describes it */
        if (strcmp(t->role, "param") && !plan->optimizer) continue;
        const char *canonical = options->names ? options->names->canonical(options->names->ctx, i) : t->name;
        int qkv = canonical && strstr(canonical, ".attention.qkv.") != NULL;
        int64_t piece, bytes = written_bytes(t, to.tp, qkv, &piece);
        /* The tied embeddings' copy on the last stage, with their state. */
        const char *param = t->param ? t->param : t->name;
        if (to.pp > 1 && !c->untied && !strcmp(param, "embedding.word_embeddings.weight")) bytes *= 2;
        plan->tensors++;
        plan->bytes += bytes;
        /* Pieces stream a block of rows at a time; a QKV of a source under
         * its own names is reordered whole (counted for every tensor of
         * such a source: the bound, not the exact need). */
        int64_t shape[CKPT_MAX_DIMS], buffer = piece, block = options->block_bytes > 0 ? options->block_bytes : BLOCK_BYTES;
        rank_piece_shape(t, to.tp, qkv, shape);
        /* A group cut between ranks is read whole (write_pending). */
        if (options->names && qkv && c->query_groups < to.tp) buffer = piece * (to.tp / c->query_groups);
        int64_t row = shape[0] > 0 ? piece / shape[0] : 0;
        if (!options->names && row > 0) buffer = piece < block ? piece : row > block ? row : block / row * row;
        if (buffer > plan->largest_buffer) {
            plan->largest_buffer = buffer;
            largest = t->name;
        }
    }
    /* Each thread holds a buffer and the staging reshard_read_piece_rows may use. */
    int64_t per_thread = 2 * plan->largest_buffer, share;
    int threads = options->threads > 0 ? options->threads : parallel_cpu_count();
    if (threads > plan->files) threads = plan->files;
    threads = reshard_threads_within(options->memory_limit, threads, per_thread, 0, &share);
    if (threads < 1)
        return reshard_memory_refusal(options->memory_limit, per_thread, 0, "tensor %s, a piece", largest);
    plan->threads = threads;
    plan->buffer_memory = plan->threads * per_thread;
    return TP_OK;
}

int megatron_write(ckpt_reader *source, const megatron_checkpoint *template, const megatron_write_options *options,
                   const char *out, megatron_write_plan *result)
{
    megatron_write_plan plan;
    TP_TRY(megatron_write_plan_create(source, template, options, &plan));
    if (result) *result = plan;
    const megatron_config *c = template ? megatron_config_of(template) : options->model;
    rank_writer r = {.source = source, .template = template, .c = c, .names = options->names, .optimizer = plan.optimizer,
                     .on_bytes = options->on_bytes, .progress_ctx = options->progress_ctx,
                     .block_bytes = options->block_bytes > 0 ? options->block_bytes : BLOCK_BYTES};
    r.to = (ckpt_layout){.dp = 1, .num_layers = c->num_layers};
    r.to.tp = plan.tp;
    r.to.pp = plan.pp;
    r.carry_rank_state = r.to.tp == c->tp && r.to.pp == c->pp;
    r.stored_padding = options->dist == NULL;
    r.args = carried_args(template, options, &r.args_file, &r.state);
    r.copy_budget = COPY_BUDGET + (template        ? megatron_bytes(template)
                                   : options->dist ? dcp_bytes(megatron_dist_dcp(options->dist))
                                                   : 0);
    r.naming = options->naming >= 0 ? (megatron_naming)options->naming : c->naming;
    store_stage_options stage = {.directory = 1, .overwrite = options->overwrite, .may_replace = megatron_may_replace,
                                 .bytes = plan.bytes};
    store_staged *staged;
    TP_TRY(store_stage(NULL, out, &stage, &staged));
    const char *root = store_staged_path(staged);
    char iteration_dir[CKPT_PATH_MAX + 32];
    int status = megatron_save_iteration_dir(root, c->iteration, iteration_dir, sizeof iteration_dir);
    /* The rank files are written in parallel, a thread each at a time. */
    int threads = plan.threads;
    rank_writer *writers = calloc((size_t)threads, sizeof *writers);
    if (!status && !writers) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < threads && writers; i++) writers[i] = r;
    rank_job job = {writers, iteration_dir};
    if (!status) status = parallel_for((int64_t)r.to.tp * r.to.pp, threads, write_rank_task, &job);
    for (int i = 0; i < threads && writers; i++) {
        free(writers[i].piece);
        free(writers[i].pending);
        free(writers[i].params);
        free(writers[i].scratch);
    }
    free(writers);
    if (!status) status = megatron_save_tracker(root, c->iteration);
    /* What a foreign source records of what was read, whole, before the output appears. */
    if (!status) status = ckpt_reader_finish_checks(source, NULL);
    if (status) {
        store_staged_discard(staged);
        return status;
    }
    return store_staged_publish(staged);
}
