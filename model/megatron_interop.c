/* megatron_interop.c: this model and Megatron-LM's GPT checkpoints, both
 * ways (interop.h). Import: each catalogue tensor read, at the target
 * layout, from the Megatron tensor it is (gpt_megatron_name), a fused QKV's
 * rows regrouped within each piece, the Adam moments and fp32 masters with
 * their parameters. Writing: megatron_write given the model's config and
 * this model's names for Megatron's, each QKV piece regrouped back. */
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
    int rounded;               /* parameters stored in a wider dtype than this model's (a bf16 Llama's fp32 norms) */
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

/* Whether a Megatron GPT is Llama-shaped: rotary positions, RMSNorm. */
static int megatron_is_llama(const megatron_config *c)
{
    return !c->learned_positions && c->rmsnorm;
}

gpt_config gpt_megatron_model(const megatron_config *c)
{
    gpt_config g = {.layers = c->num_layers, .dim = c->hidden, .heads = c->heads, .kv_heads = c->heads,
                    .vocab = c->true_vocab > 0 ? c->true_vocab : c->padded_vocab, .seq = c->max_positions,
                    .ffn = c->ffn, .vocab_pad_multiple = c->true_vocab > 0 ? c->vocab_divisible_by : 1,
                    .dtype = c->dtype};
    if (megatron_is_llama(c)) {
        g.arch = GPT_ARCH_LLAMA;
        g.kv_heads = c->query_groups;
        g.swiglu = 1;
        g.untied_embeddings = c->untied;
        g.norm_eps = c->norm_epsilon;
        g.rope_theta = c->rotary_base;
        if (c->rope_scaling_factor > 0) { /* Megatron's Llama 3 scaling: its other factors are fixed */
            g.rope_scaling_factor = c->rope_scaling_factor;
            g.rope_low_freq_factor = 1;
            g.rope_high_freq_factor = 4;
            g.rope_original_seq = 8192;
        }
    }
    return g;
}

int gpt_megatron_import_open(gpt_megatron_import **out, const megatron_config *c, ckpt_reader *source, int tp, int pp)
{
    *out = NULL;
    const char *unfit = gpt_megatron_unfit(c);
    if (unfit) return tp_fail(TP_ERR_ARG, "%s: %s: the trainer computes GPT-2 or Llama", ckpt_reader_path(source), unfit);
    /* The trainer's GELU is the tanh form: the exact one would be another function. */
    if (!megatron_is_llama(c) && !c->openai_gelu)
        return tp_fail(TP_ERR_ARG, "%s: trained with the exact GELU (openai_gelu is false); the trainer computes its tanh "
                       "form, so training on would change the model (tp-ckpt export writes it for inference)",
                       ckpt_reader_path(source));
    gpt_megatron_import *x = calloc(1, sizeof *x);
    if (!x) return tp_fail(TP_ERR_NOMEM, "out of memory");
    x->source = source;
    x->c = c;
    x->config = gpt_megatron_model(c);
    x->to = (ckpt_layout){.tp = tp, .pp = pp, .dp = 1, .num_layers = c->num_layers};
    snprintf(x->origin, sizeof x->origin,
             "{\"imported_from\": \"megatron\", \"source_layout\": \"tp%dpp%d\", \"iteration\": %lld}", c->tp, c->pp,
             (long long)c->stored_iteration);
    /* Fewer query groups (a Llama's kv_heads; a GPT-2 has one per head)
     * than ranks are replicated key/value heads, as the trainer holds them;
     * groups and tp that neither divide the other are refused here. */
    int status = gpt_config_check(&x->config, tp, pp);
    if (status)
        tp_fail_context(status, "%s: %lld heads in %lld query groups at tp %d pp %d", ckpt_reader_path(source),
                        (long long)c->heads, (long long)c->query_groups, tp, pp);
    if (!status) status = gpt_catalog(&x->config, c->optimizer_read, &x->catalog, &x->count);
    if (!status && !(x->source_index = calloc((size_t)x->count + 1, sizeof *x->source_index)))
        status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < x->count && !status; i++) {
        char name[CKPT_NAME_MAX + 32];
        status = source_name(&x->catalog[i], name, sizeof name);
        x->source_index[i] = status ? -1 : ckpt_reader_find(source, name);
        /* Megatron keeps no fp32 copy of a parameter stored in fp32 beside
         * bf16 ones (Float16OptimizerWithFloat16Params' fp32_from_fp32
         * groups: a Megatron-Core Llama's norms): the parameter is its own
         * master. */
        if (!status && x->source_index[i] < 0 && x->catalog[i].role == GPT_ROLE_MASTER &&
            !gpt_megatron_name(x->catalog[i].param, name, sizeof name)) {
            int param = ckpt_reader_find(source, name);
            if (param >= 0 && ckpt_reader_tensor(source, param)->dtype == TP_FP32) x->source_index[i] = param;
        }
        if (!status && x->source_index[i] < 0)
            status = tp_fail(TP_ERR_NOT_FOUND, "%s: no %s for %s", ckpt_reader_path(source), name, x->catalog[i].name);
        if (!status && x->catalog[i].role == GPT_ROLE_PARAM &&
            tp_dtype_size(ckpt_reader_tensor(source, x->source_index[i])->dtype) > tp_dtype_size(x->catalog[i].desc.dtype))
            x->rounded++;
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

int gpt_megatron_import_rounded(const gpt_megatron_import *x)
{
    return x->rounded;
}

void gpt_megatron_import_close(gpt_megatron_import *x)
{
    if (!x) return;
    free(x->catalog);
    free(x->source_index);
    free(x);
}

/* Megatron lays a fused QKV out per query group, [q of its heads, k, v]
 * (blocks of kv_channels rows); this model as [q; k; v], each cut over tp
 * (docs/FORMAT.md), the k and v of fewer groups than ranks replicated over
 * the tp / groups ranks that share a group (replicate_small_segments).
 * This model's piece `piece` at degree tp, [q of the rank's heads; its keys;
 * its values], is then read from Megatron's piece gpt_megatron_qkv_degree
 * gives: with groups >= tp the one at tp (the rank's whole groups); with
 * fewer groups than ranks the group's whole rows (Megatron-Core cuts a
 * group between the ranks sharing it, and none of its pieces holds a
 * rank's replicated key and value together with its query heads). */
int gpt_megatron_qkv_degree(int64_t groups, int tp, int piece, int *megatron_piece)
{
    if (groups >= tp) {
        *megatron_piece = piece;
        return tp;
    }
    *megatron_piece = piece / (tp / (int)groups);
    return (int)groups;
}

int64_t gpt_megatron_qkv_block(int64_t heads, int64_t groups, int tp, int piece, int64_t j)
{
    int64_t per_group = heads / groups, rank_heads = heads / tp;
    if (groups < tp) { /* the group's rows whole: the rank's share of its query heads, then its k and v */
        int64_t first = piece % (tp / groups) * rank_heads;
        return j < rank_heads ? first + j : per_group + (j - rank_heads);
    }
    int64_t rank_groups = groups / tp;
    if (j < rank_heads) return j / per_group * (per_group + 2) + j % per_group;
    if (j < rank_heads + rank_groups) return (j - rank_heads) * (per_group + 2) + per_group;
    return (j - rank_heads - rank_groups) * (per_group + 2) + per_group + 1;
}

/* This model's QKV piece `piece` at degree tp from Megatron's rows that
 * hold it (to_megatron 0), or back (1: tp at most groups, where the two
 * hold the same rows). */
static void regroup_qkv(int64_t heads, int64_t groups, int tp, int piece, const unsigned char *from, unsigned char *to,
                        size_t block_bytes, int to_megatron)
{
    int64_t blocks = heads / tp + 2 * (groups < tp ? 1 : groups / tp);
    for (int64_t j = 0; j < blocks; j++) {
        int64_t block = gpt_megatron_qkv_block(heads, groups, tp, piece, j);
        if (to_megatron) memcpy(to + (size_t)block * block_bytes, from + (size_t)j * block_bytes, block_bytes);
        else memcpy(to + (size_t)j * block_bytes, from + (size_t)block * block_bytes, block_bytes);
    }
}

/* The flat index in Megatron's fused QKV, whose rows lie per query group
 * ([q heads of the group, k, v], kv_channels rows a head, as its reader
 * describes the whole tensor), of element `element` of this model's
 * ([q; k; v]) whose rows are `row` elements long. */
static int64_t megatron_qkv_element(const megatron_config *c, int64_t element, int64_t row)
{
    int64_t r = element / row, head = r / c->kv_channels;
    int64_t block = gpt_megatron_qkv_block(c->heads, c->query_groups, 1, 0, head); /* the whole tensor: degree 1 */
    return (block * c->kv_channels + r % c->kv_channels) * row + element % row;
}

/* What the writer counted of each catalogue tensor, said of the Megatron
 * tensor it was read from (its file, name, shape and index; a QKV's first
 * found mapped back to Megatron's rows), each Megatron tensor once (an
 * fp32 parameter is its own master). */
static int nonfinite_status(const gpt_megatron_import *x, ckpt_writer *w, const int *ids, const import_options *options)
{
    ckpt_nonfinite found;
    ckpt_nonfinite_init(&found);
    for (int i = 0; i < x->count; i++) {
        convert_nonfinite counted = ckpt_writer_nonfinite(w, ids[i]);
        if (!counted.nans && !counted.infinities) continue;
        int again = 0;
        for (int j = 0; j < i && !again; j++) again = x->source_index[j] == x->source_index[i];
        if (again) continue;
        const gpt_tensor *t = &x->catalog[i];
        const ckpt_tensor_desc *source = ckpt_reader_tensor(x->source, x->source_index[i]);
        if (t->kind == GPT_QKV_WEIGHT || t->kind == GPT_QKV_BIAS) {
            int64_t row = 1;
            for (int d = 1; d < t->desc.ndim; d++) row *= t->desc.shape[d];
            counted.first = megatron_qkv_element(x->c, counted.first, row);
        }
        ckpt_nonfinite_note(&found, ckpt_reader_element_file(x->source, x->source_index[i], counted.first),
                            source->name, source->shape, source->ndim, counted);
    }
    if (options->nonfinite) *options->nonfinite = found;
    return ckpt_nonfinite_check(&found, options->allow_nonfinite, "imported", "imports");
}

int gpt_megatron_import_run(gpt_megatron_import *x, const import_options *options, const char *out)
{
    ckpt_write_options write_options;
    ckpt_write_options_init(&write_options);
    write_options.compress_level = options->compress_level;
    write_options.overwrite = options->overwrite;
    write_options.update_latest = options->update_latest;
    /* Megatron's values, weights and optimizer state, counted as the writer
     * digests them: refused before the commit (nonfinite_status). */
    write_options.count_nonfinite = 1;
    if (options->nonfinite) ckpt_nonfinite_init(options->nonfinite);
    int *ids = calloc((size_t)x->count + 1, sizeof *ids);
    if (!ids) return tp_fail(TP_ERR_NOMEM, "out of memory");
    ckpt_writer *w = NULL;
    int status = ckpt_writer_create(&w, out, &x->to, &write_options);
    if (status) {
        free(ids);
        return status;
    }
    unsigned char *piece = NULL, *grouped = NULL;
    size_t capacity = 0;
    for (int i = 0; i < x->count && !status; i++) {
        const gpt_tensor *t = &x->catalog[i];
        status = ckpt_writer_add_tensor(w, &t->desc, &ids[i]);
        int id = ids[i];
        int qkv = t->kind == GPT_QKV_WEIGHT || t->kind == GPT_QKV_BIAS;
        /* The QKV as Megatron lays it out (its own description), regrouped after. */
        const ckpt_tensor_desc *as_read = qkv ? ckpt_reader_tensor(x->source, x->source_index[i]) : &t->desc;
        ckpt_tensor_desc read = *as_read;
        read.dtype = t->desc.dtype;
        int64_t shape[CKPT_MAX_DIMS], bytes = (int64_t)tp_dtype_size(t->desc.dtype);
        ckpt_piece_shape(&t->desc, x->to.tp, shape);
        for (int d = 0; d < t->desc.ndim; d++) bytes *= shape[d];
        /* A QKV is read as Megatron's piece that holds ours: with fewer
         * groups than ranks a group's rows, [per_group + 2 heads, ...],
         * more than our piece's [heads / tp + 2 heads, ...]. */
        int megatron_piece, degree = qkv ? gpt_megatron_qkv_degree(x->c->query_groups, x->to.tp, 0, &megatron_piece) : x->to.tp;
        int64_t read_shape[CKPT_MAX_DIMS], read_bytes = (int64_t)tp_dtype_size(t->desc.dtype);
        ckpt_piece_shape(&read, degree, read_shape);
        for (int d = 0; d < read.ndim; d++) read_bytes *= read_shape[d];
        int64_t largest = read_bytes > bytes ? read_bytes : bytes;
        if (!status && (size_t)largest > capacity) {
            free(piece);
            free(grouped);
            piece = alloc_pages((size_t)largest);
            grouped = alloc_pages((size_t)largest);
            capacity = (size_t)largest;
            if (!piece || !grouped) status = tp_fail(TP_ERR_NOMEM, "out of memory for a piece of %lld bytes", (long long)largest);
        }
        for (int p = 0; p < ckpt_piece_count(&t->desc, x->to.tp) && !status; p++) {
            if (!ckpt_writer_owns_piece(w, id, p)) continue;
            if (qkv) gpt_megatron_qkv_degree(x->c->query_groups, x->to.tp, p, &megatron_piece);
            else megatron_piece = p;
            status = reshard_read_piece(x->source, x->source_index[i], &read, degree, megatron_piece, qkv ? grouped : piece,
                                        (size_t)(qkv ? read_bytes : bytes));
            if (!status && qkv)
                regroup_qkv(x->c->heads, x->c->query_groups, x->to.tp, p, grouped, piece,
                            (size_t)(bytes / shape[0] * x->c->kv_channels), 0);
            if (!status) status = ckpt_writer_put_piece(w, id, p, piece);
            if (!status && options->on_bytes) options->on_bytes(options->progress_ctx, bytes);
        }
        if (status) tp_fail_context(status, "importing %s", t->name);
    }
    free(piece);
    free(grouped);
    /* What the source records of what was read, whole (an entry read in
     * part, a padded table's rows past --true-vocab-size, is read to its
     * end against its CRC-32), before the output appears; then its values. */
    if (!status) status = ckpt_reader_finish_checks(x->source, NULL);
    if (!status) status = nonfinite_status(x, w, ids, options);
    free(ids);
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

/* ------------------------------------------------------------ writing */

typedef struct {
    ckpt_reader *source;
    gpt_config config;
    char (*canonical)[CKPT_NAME_MAX + 1]; /* per source tensor: Megatron's name of a parameter, "" otherwise */
    int count;
} source_names;

static int find_canonical(void *ctx, const char *canonical)
{
    const source_names *n = ctx;
    for (int i = 0; i < n->count; i++)
        if (!strcmp(n->canonical[i], canonical)) return i;
    return -1;
}

static const char *canonical_of(void *ctx, int index)
{
    const source_names *n = ctx;
    return index >= 0 && index < n->count && n->canonical[index][0] ? n->canonical[index] : NULL;
}

static void qkv_to_megatron(void *ctx, int tp, const void *piece, void *out, size_t block_bytes)
{
    const source_names *n = ctx;
    regroup_qkv(n->config.heads, n->config.kv_heads, tp, 0, piece, out, block_bytes, 1);
}

/* The model of a checkpoint of this model as Megatron describes it, and
 * the canonical name of each of its parameters (names->canonical, freed
 * by the caller). */
static int source_model(ckpt_reader *source, source_names *names, megatron_config *model)
{
    const ckpt_train_state *state = ckpt_reader_state(source);
    const ckpt_layout *layout = ckpt_reader_layout(source);
    *names = (source_names){.source = source, .count = ckpt_reader_num_tensors(source)};
    /* Another tool's checkpoint names its model only when it carries this
     * toolkit's description (a DCP checkpoint tp-reshard wrote from one). */
    if (!state->model_json || !strcmp(state->model_json, "{}"))
        return tp_fail(TP_ERR_FORMAT, "%s names no model of this toolkit's or of Megatron: Megatron's args are written "
                       "from a Megatron-LM checkpoint or this toolkit's GPT or Llama (a DCP checkpoint tp-reshard wrote "
                       "from one names it); a Megatron checkpoint converted with --format tp keeps Megatron's names "
                       "without its args: convert the Megatron checkpoint itself, or tp-ckpt import it (a model of "
                       "this toolkit's)", ckpt_reader_path(source));
    int status = gpt_config_from_json(state->model_json, &names->config);
    if (status) return tp_fail_context(status, "%s", ckpt_reader_path(source));
    const gpt_config *g = &names->config;
    int llama = g->arch == GPT_ARCH_LLAMA;
    /* Megatron's Llama 3 scaling has a factor of its own; its other values are fixed. */
    if (llama && g->rope_scaling_factor > 0 &&
        (g->rope_low_freq_factor != 1 || g->rope_high_freq_factor != 4 || g->rope_original_seq != 8192))
        return tp_fail(TP_ERR_ARG,
                       "%s: rope scaling with low %g, high %g, original length %lld: Megatron-LM's is fixed at 1, 4, "
                       "8192",
                       ckpt_reader_path(source), g->rope_low_freq_factor, g->rope_high_freq_factor,
                       (long long)g->rope_original_seq);
    /* The model as Megatron describes it: GPT-2's GELU is the tanh form;
     * Llama's rotary embeddings turn half-heads (not interleaved pairs). */
    *model = (megatron_config){
        .iteration = state->step, .stored_iteration = state->step, .consumed_samples = state->consumed_samples,
        .checkpoint_version = 3.0, .tp = layout->tp, .pp = layout->pp, .vpp = 1, .naming = MEGATRON_NAMES_LEGACY,
        .num_layers = g->layers, .hidden = g->dim, .ffn = g->ffn, .heads = g->heads, .query_groups = g->kv_heads,
        .kv_channels = g->dim / g->heads, .true_vocab = g->vocab, .vocab_divisible_by = g->vocab_pad_multiple,
        .max_positions = g->seq, .swiglu = g->swiglu, .learned_positions = !llama, .has_bias = !llama,
        .untied = g->untied_embeddings, .rmsnorm = llama, .dtype = g->dtype, .openai_gelu = !llama,
        .norm_epsilon = llama ? g->norm_eps : 1e-5, .rotary_base = g->rope_theta, .rotary_percent = 1,
        .rope_scaling_factor = g->rope_scaling_factor};
    model->padded_vocab = megatron_vocab_with_padding(model->true_vocab, model->vocab_divisible_by, model->tp);
    if (!(names->canonical = calloc((size_t)names->count + 1, sizeof *names->canonical)))
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < names->count && !status; i++) {
        const ckpt_tensor_desc *t = ckpt_reader_tensor(source, i);
        if (!strcmp(t->role, "param")) status = gpt_megatron_name(t->name, names->canonical[i], sizeof *names->canonical);
    }
    return status;
}

/* The view's state: the source's names and their canonical ones. */
static int view_open(ckpt_reader *source, megatron_config *model, megatron_source_names *adapter, void **state)
{
    source_names *names = calloc(1, sizeof *names);
    if (!names) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int status = source_model(source, names, model);
    if (status) {
        free(names->canonical);
        free(names);
        return status;
    }
    *adapter = (megatron_source_names){find_canonical, qkv_to_megatron, names, canonical_of};
    *state = names;
    return TP_OK;
}

static void view_close(void *state)
{
    source_names *names = state;
    if (names) free(names->canonical);
    free(names);
}

const formats_megatron_view gpt_megatron_view = {view_open, view_close};
