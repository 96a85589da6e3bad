/* megatron_dist_write.c: Megatron-Core's distributed checkpoints
 * (--ckpt-format torch_dist) written at any TP x PP (megatron.h
 * megatron_dist_write), as megatron/core/dist_checkpointing's save writes
 * them (docs/MEGATRON.md "Writing"): the tensors are a PyTorch distributed
 * checkpoint written by dcp_write.c under Megatron-Core's keys (a layer's
 * tensors stacked along a leading axis of the number of layers, each chunk
 * one layer of one tensor-parallel rank's piece), the Adam state in the
 * model's space beside them, the ShardedObjects (_extra_state, rng_state,
 * common_state) as bytes entries KEY/shard_OFFSETS_SHAPE holding a
 * torch.save of [data], the common state in common.pt (up to 0.18) or in
 * its entry (0.19+), metadata.json last. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/error.h"
#include "../common/memory.h"
#include "../common/path.h"
#include "../reshard/reshard.h"
#include "dcp_internal.h"
#include "megatron_internal.h"
#include "torch_write.h"

#define ARCHIVE_NAME "archive" /* torch.save's folder name when it writes to a stream, as DCP's writer does */
/* The values carried into the common state may share what they copy at
 * most this much beyond the source's size (torch_write.h pk_memo_create). */
#define COPY_BUDGET ((int64_t)1 << 20)

int megatron_core_release_parse(const char *text, megatron_core_common *out)
{
    int major, minor, used = 0;
    if (sscanf(text, "%d.%d%n", &major, &minor, &used) != 2 || major < 0 || minor < 0 ||
        (text[used] && !(text[used] == '.' && text[used + 1] >= '0' && text[used + 1] <= '9')))
        return tp_fail(TP_ERR_ARG, "a Megatron-Core release '%s' (0.18 and before: common.pt; 0.19 and after: the "
                       "common_state entry)", text);
    *out = major == 0 && minor <= 18 ? MEGATRON_CORE_COMMON_FILE : MEGATRON_CORE_COMMON_ENTRY;
    return TP_OK;
}

enum { OBJECT_COMMON, OBJECT_EXTRA_NONE };

typedef struct {
    char key[CKPT_NAME_MAX + 1];
    int kind;
} dist_object;

typedef struct {
    ckpt_reader *source;
    const megatron_dist_write_options *o;
    const megatron_config *c;
    megatron_naming naming;
    ckpt_layout to;
    int optimizer;                  /* the source's optimizer state is written */
    int rng;                        /* the torch_dist source's RNG states are carried */
    int same_layout;                /* the output's layout is the torch_dist source's */
    const dcp_checkpoint *carried;  /* the torch_dist source's container, whose bytes entries go along */
    dist_object *objects;           /* the bytes entries written here */
    int num_objects;
    int64_t copy_budget;
    struct dcp_write_hooks hooks;
    dcp_write_options dcp;
} dist_writer;

/* ------------------------------------------------------------ the tensors */

static const char *canonical_of(const dist_writer *w, int tensor, const ckpt_tensor_desc *t, int param)
{
    if (w->o->names) return param ? w->o->names->canonical(w->o->names->ctx, tensor) : NULL;
    return param ? t->name : t->param;
}

/* Megatron-Core's key of a tensor of the source (dcp_write_hooks key_of):
 * the parameter's key, stacked along the layers where it is a layer's;
 * its Adam state under optimizer.state.STATE. (fp32_param: the fp32 master
 * of a 16-bit parameter, the only ones Megatron keeps). */
static int key_of(void *ctx, int tensor, char *key, size_t size, int64_t *index, int64_t *stack, int *skip)
{
    dist_writer *w = ctx;
    const ckpt_tensor_desc *t = ckpt_reader_tensor(w->source, tensor);
    int param = !t->role || !strcmp(t->role, "param");
    const char *prefix = "";
    *skip = 0;
    if (!param) {
        if (!strcmp(t->role, "exp_avg")) prefix = "optimizer.state.exp_avg.";
        else if (!strcmp(t->role, "exp_avg_sq")) prefix = "optimizer.state.exp_avg_sq.";
        else if (!strcmp(t->role, "master")) prefix = "optimizer.state.fp32_param.";
        int p = t->param ? ckpt_reader_find(w->source, t->param) : -1;
        *skip = !w->optimizer || !prefix[0] ||
                (!strcmp(t->role, "master") && p >= 0 && ckpt_reader_tensor(w->source, p)->dtype == TP_FP32);
        if (*skip) return TP_OK;
    }
    const char *canonical = canonical_of(w, tensor, t, param);
    if (!canonical) return tp_fail(TP_ERR_FORMAT, "tensor %s: not one of Megatron's", t->name);
    char core[CKPT_NAME_MAX + 1];
    int64_t layer;
    /* Keys of Transformer Engine's fused norms whatever the modules: the
     * local specification saves its norms under them too
     * (gpt_layer_specs.py's sharded_state_dict_keys_map, since efbfb5f05e,
     * 2023-12; the real local-spec fixtures have them). */
    TP_TRY(megatron_core_key(MEGATRON_NAMES_CORE, canonical, core, sizeof core, &layer));
    if (layer >= w->c->num_layers)
        return tp_fail(TP_ERR_FORMAT, "tensor %s: layer %lld of a model of %lld", t->name, (long long)layer,
                       (long long)w->c->num_layers);
    if (snprintf(key, size, "%s%s", prefix, core) >= (int)size) return tp_fail(TP_ERR_FORMAT, "tensor %s: a key too long", t->name);
    *index = layer;
    *stack = layer >= 0 ? w->c->num_layers : 0;
    return TP_OK;
}

/* A source under its own names lays out a fused QKV its own way ([q; k;
 * v]): it is read whole and regrouped into Megatron's per-group order,
 * which Megatron-Core cuts into tp runs of rows (a group cut between ranks
 * where tp exceeds the query groups). */
static int whole_piece(void *ctx, int tensor)
{
    dist_writer *w = ctx;
    const ckpt_tensor_desc *t = ckpt_reader_tensor(w->source, tensor);
    const char *canonical = w->o->names && !strcmp(t->role, "param") ? w->o->names->canonical(w->o->names->ctx, tensor) : NULL;
    return canonical && strstr(canonical, ".attention.qkv.") != NULL;
}

static int regroup_qkv(void *ctx, int tensor, void *whole, void *scratch, int64_t bytes)
{
    dist_writer *w = ctx;
    const ckpt_tensor_desc *t = ckpt_reader_tensor(w->source, tensor);
    int64_t row = (int64_t)tp_dtype_size(t->dtype);
    for (int d = 1; d < t->ndim; d++) row *= t->shape[d];
    memcpy(scratch, whole, (size_t)bytes);
    w->o->names->qkv_to_megatron(w->o->names->ctx, 1, scratch, whole, (size_t)(row * w->c->kv_channels));
    return TP_OK;
}

static int fill_padding(void *ctx, int tensor, int tp, int piece, int64_t row0, int64_t count, void *rows)
{
    dist_writer *w = ctx;
    /* A torch_dist source's reader leaves its padding out (zeros), a legacy one's holds it. */
    return megatron_fill_vocabulary_padding(w->source, w->o->dist == NULL, tensor, tp, piece, row0, count, rows);
}

/* ------------------------------------------------------ the bytes entries */

static int is_prefix(const char *key, const char *prefix)
{
    return !strncmp(key, prefix, strlen(prefix));
}

/* Which bytes entries of a torch_dist source go along: never its common
 * state (written again); its RNG states where they are carried; at its own
 * layout everything else, at another only the _extra_state objects, whose
 * keys are the layers' (KEY/shard_LAYER_LAYERS), whatever the layout. */
static int carry(void *ctx, const dcp_entry *e)
{
    dist_writer *w = ctx;
    if (!strcmp(e->key, MEGATRON_DIST_COMMON_KEY)) return 0;
    if (is_prefix(e->key, "rng_state/")) return w->rng;
    return w->same_layout || strstr(e->key, "._extra_state/shard_") != NULL;
}

static const char *object_key(void *ctx, int object)
{
    return ((dist_writer *)ctx)->objects[object].key;
}

static int add_object(dist_writer *w, int kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int add_object(dist_writer *w, int kind, const char *fmt, ...)
{
    dist_object *grown = realloc(w->objects, (size_t)(w->num_objects + 1) * sizeof *grown);
    if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory");
    w->objects = grown;
    dist_object *o = &w->objects[w->num_objects++];
    o->kind = kind;
    va_list args;
    va_start(args, fmt);
    vsnprintf(o->key, sizeof o->key, fmt, args);
    va_end(args);
    return TP_OK;
}

/* The tensors of the values carried into the common state (an optimizer's
 * step, a loss scale), emitted in the pickle, their bytes written after it
 * from where they were read. */
typedef struct {
    torch_writer *tw;
    const torch_archive *archive;       /* a torch_dist source's common state */
    const megatron_checkpoint *legacy;  /* or a legacy source's first rank file */
    const pickle_value **tensors;
    int count, capacity;
    int source_failed; /* reading one failed: the message names the source, no context of the output's */
} carried_tensors;

static int emit_carried_tensor(void *ctx, const pickle_value *t)
{
    carried_tensors *ct = ctx;
    if (!torch_tensor_is_contiguous(t))
        return tp_fail(TP_ERR_FORMAT, "a non-contiguous tensor among the common state carried over");
    TP_TRY(array_reserve((void **)&ct->tensors, &ct->capacity, ct->count + 1, sizeof *ct->tensors));
    ct->tensors[ct->count++] = t;
    return torch_writer_tensor(ct->tw, t->tensor->storage->storage.dtype, t->tensor->ndim, t->tensor->shape);
}

static int write_carried_tensors(carried_tensors *ct)
{
    for (int i = 0; i < ct->count; i++) {
        const pickle_value *t = ct->tensors[i];
        int64_t bytes = torch_tensor_numel(t) * (int64_t)torch_dtype_size(t->tensor->storage->storage.dtype);
        void *buf = malloc((size_t)bytes + 1);
        if (!buf) return tp_fail(TP_ERR_NOMEM, "out of memory");
        int status = ct->legacy ? megatron_rank_tensor_read(ct->legacy, 0, 0, t, buf, bytes)
                                : torch_tensor_read_checked(ct->archive, t, buf, bytes);
        ct->source_failed = status != TP_OK;
        if (!status) status = torch_writer_storage(ct->tw, buf, bytes);
        free(buf);
        TP_TRY(status);
    }
    return TP_OK;
}

static int carry_value(byte_buffer *b, pk_memo *memo, const pickle_value *v, const char *file, carried_tensors *ct,
                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int carry_value(byte_buffer *b, pk_memo *memo, const pickle_value *v, const char *file, carried_tensors *ct,
                       const char *fmt, ...)
{
    char path[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(path, sizeof path, fmt, args);
    va_end(args);
    pk_origin origin = {.file = file, .path = path, .tensor = ct ? emit_carried_tensor : NULL, .ctx = ct};
    return pk_value(b, memo, v, &origin);
}

static const char *key_text(const pickle_value *key)
{
    return key->kind == PICKLE_STRING ? key->text.data : "?";
}

/* What Megatron-Core 0.13 and later record of how the state dicts were
 * made (training/checkpointing.py _build_sharded_state_dict_metadata): for
 * the non-distributed optimizer, as the real checkpoints hold it. */
static void emit_content_metadata(byte_buffer *b)
{
    pk_string(b, "content_metadata");
    pk_dict_begin(b);
    pk_string(b, "singleton_local_shards");
    pk_bool(b, 0);
    pk_string(b, "chained_optim_avoid_prefix");
    pk_bool(b, 1);
    pk_dict_end(b);
}

/* A legacy rank file's optimizer state dict as Megatron-Core's save leaves
 * it in the common state (optimizer/optimizer.py sharded_state_dict, then
 * dist_checkpointing's extraction of the ShardedTensors): torch's param
 * groups without their params (a LocalNonpersistentObject, not saved), the
 * per-parameter state in the model's space (the tensors) but for the step,
 * shared as state.common_step; with Float16OptimizerWithFloat16Params
 * around it, the loss scaler, and of fp32_from_fp16_params the groups'
 * lists left empty (dict_utils.extract_matching_values keeps an empty list,
 * drops one emptied of its ShardedTensors). */
static int emit_legacy_optimizer(dist_writer *w, byte_buffer *b, pk_memo *memo, carried_tensors *ct)
{
    const megatron_checkpoint *m = w->o->legacy;
    const char *file = megatron_rank_path(m, 0, 0);
    const pickle_value *outer = megatron_rank_value(m, 0, 0, "optimizer");
    const pickle_value *inner = pickle_get(outer, "optimizer");
    int wrapped = inner && inner->kind == PICKLE_DICT;
    if (!wrapped) inner = outer;
    const pickle_value *groups = pickle_get(inner, "param_groups"), *state = pickle_get(inner, "state");
    if (!groups || groups->kind != PICKLE_LIST || !state || state->kind != PICKLE_DICT)
        return tp_fail(TP_ERR_FORMAT, "%s: the optimizer has no state and param_groups to follow", file);
    const pickle_value *step = state->dict.values.count ? pickle_get(state->dict.values.items[0], "step") : NULL;
    const char *where = wrapped ? "optimizer.optimizer" : "optimizer";
    if (wrapped) {
        pk_dict_begin(b);
        pk_string(b, "optimizer");
    }
    pk_dict_begin(b);
    pk_string(b, "param_groups");
    pk_list_begin(b);
    for (int64_t g = 0; g < groups->items.count; g++) {
        const pickle_value *group = groups->items.items[g];
        if (group->kind != PICKLE_DICT) return tp_fail(TP_ERR_FORMAT, "%s: %s.param_groups[%lld] is no dict", file, where, (long long)g);
        pk_dict_begin(b);
        for (int64_t i = 0; i < group->dict.keys.count; i++) {
            const pickle_value *key = group->dict.keys.items[i];
            if (pickle_is_string(key, "params")) continue;
            TP_TRY(carry_value(b, memo, key, file, NULL, "%s.param_groups[%lld]{key %lld}", where, (long long)g, (long long)i));
            TP_TRY(carry_value(b, memo, group->dict.values.items[i], file, NULL, "%s.param_groups[%lld].%s", where,
                               (long long)g, key_text(key)));
        }
        pk_dict_end(b);
    }
    pk_list_end(b);
    pk_string(b, "state");
    pk_dict_begin(b);
    if (step) {
        pk_string(b, "common_step");
        TP_TRY(carry_value(b, memo, step, file, ct, "%s.state[0].step", where));
    }
    pk_dict_end(b);
    pk_dict_end(b);
    if (!wrapped) return TP_OK;
    for (int64_t i = 0; i < outer->dict.keys.count; i++) {
        const pickle_value *key = outer->dict.keys.items[i];
        if (pickle_is_string(key, "optimizer") || pickle_is_string(key, "fp32_from_fp16_params")) continue;
        TP_TRY(carry_value(b, memo, key, file, NULL, "optimizer{key %lld}", (long long)i));
        TP_TRY(carry_value(b, memo, outer->dict.values.items[i], file, ct, "optimizer.%s", key_text(key)));
    }
    const pickle_value *masters = pickle_get(outer, "fp32_from_fp16_params");
    if (masters && masters->kind == PICKLE_LIST) {
        int empty = 0;
        for (int64_t g = 0; g < masters->items.count; g++)
            empty += masters->items.items[g]->kind == PICKLE_LIST && masters->items.items[g]->items.count == 0;
        if (empty || masters->items.count == 0) {
            pk_string(b, "fp32_from_fp16_params");
            pk_list_begin(b);
            for (int g = 0; g < empty; g++) {
                pk_list_begin(b);
                pk_list_end(b);
            }
            pk_list_end(b);
        }
    }
    pk_dict_end(b);
    return TP_OK;
}

/* The common state: everything of Megatron-LM's save_checkpoint state dict
 * that is not sharded (args, checkpoint_version, iteration, the
 * optimizer's groups and step, the schedule, the work done,
 * content_metadata). A torch_dist source's is carried, its args given the
 * output's layout and what the checkpoint holds; a legacy source's made
 * from its first rank file; otherwise written from the model. */
static int emit_common(dist_writer *w, byte_buffer *b, pk_memo *memo, carried_tensors *ct)
{
    const megatron_config *c = w->c;
    megatron_args_spec args = {.model = c, .naming = w->naming, .tp = w->to.tp, .pp = w->to.pp,
                               .ckpt_format = "torch_dist", .no_optimizer = !w->optimizer, .no_rng = !w->rng,
                               .keep_family = w->naming == c->naming};
    pk_dict_begin(b);
    if (w->o->dist) {
        const char *where;
        const pickle_value *state = megatron_dist_common_state(w->o->dist, &ct->archive, &where);
        for (int64_t i = 0; i < state->dict.keys.count; i++) {
            const pickle_value *key = state->dict.keys.items[i], *value = state->dict.values.items[i];
            /* The optimizer's and its schedule go with its state (Megatron saves both or neither). */
            if (!w->optimizer && (pickle_is_string(key, "optimizer") || pickle_is_string(key, "opt_param_scheduler")))
                continue;
            if (!w->same_layout && pickle_is_string(key, "rerun_state_machine")) continue; /* the ranks' */
            TP_TRY(carry_value(b, memo, key, where, NULL, "{key %lld}", (long long)i));
            if (pickle_is_string(key, "args")) {
                args.args = value;
                args.file = where;
                TP_TRY(megatron_args_write(b, memo, &args));
            } else {
                TP_TRY(carry_value(b, memo, value, where, ct, "%s", key_text(key)));
            }
        }
        pk_dict_end(b);
        return TP_OK;
    }
    const megatron_checkpoint *m = w->o->legacy;
    const char *file = m ? megatron_rank_path(m, 0, 0) : NULL;
    ct->legacy = m;
    pk_string(b, "args");
    args.args = m ? megatron_args(m) : NULL;
    args.file = file;
    TP_TRY(megatron_args_write(b, memo, &args));
    pk_string(b, "checkpoint_version");
    pk_float(b, 3.0);
    pk_string(b, "iteration");
    pk_int(b, c->stored_iteration >= 0 ? c->stored_iteration : 0);
    if (w->optimizer) {
        pk_string(b, "optimizer");
        TP_TRY(emit_legacy_optimizer(w, b, memo, ct));
        const pickle_value *schedule = megatron_rank_value(m, 0, 0, "opt_param_scheduler");
        if (schedule) {
            pk_string(b, "opt_param_scheduler");
            TP_TRY(carry_value(b, memo, schedule, file, ct, "opt_param_scheduler"));
        }
    }
    const pickle_value *flops = m ? megatron_rank_value(m, 0, 0, "num_floating_point_operations_so_far") : NULL;
    if (flops && (flops->kind == PICKLE_FLOAT || flops->kind == PICKLE_INT)) {
        pk_string(b, "num_floating_point_operations_so_far");
        if (flops->kind == PICKLE_FLOAT) pk_float(b, flops->real);
        else pk_int(b, flops->integer);
    }
    emit_content_metadata(b);
    pk_dict_end(b);
    return TP_OK;
}

/* The common state as a torch.save archive into tw: the dict itself
 * (common.pt), or [dict] (the common_state entry, a ShardedObject's data
 * saved as a list of one). A failure is put in the context of where (the
 * file written, and its entry) unless it is a read of the source's, whose
 * message names the source: where is a staging path the user never sees. */
static int write_common(dist_writer *w, torch_writer *tw, int as_list, const char *where)
{
    byte_buffer *b = torch_writer_pickle(tw);
    pk_memo *memo = NULL;
    carried_tensors ct = {.tw = tw};
    int status = pk_memo_create(w->copy_budget, &memo);
    if (as_list) pk_list_begin(b);
    if (!status) status = emit_common(w, b, memo, &ct);
    if (as_list) pk_list_end(b);
    pk_memo_free(memo);
    if (!status) status = torch_writer_begin_storages(tw);
    if (!status) status = write_carried_tensors(&ct);
    free(ct.tensors);
    if (status) {
        torch_writer_abort(tw);
        return ct.source_failed ? status : tp_fail_context(status, "%s", where);
    }
    status = torch_writer_finish(tw);
    return status ? tp_fail_context(status, "%s", where) : TP_OK;
}

/* A bytes entry's item at the file's position: a torch.save of [data]. */
static int write_object(void *ctx, int object, FILE *file, const char *path)
{
    dist_writer *w = ctx;
    torch_writer *tw;
    TP_TRY(torch_writer_open_in(file, path, ARCHIVE_NAME, &tw));
    if (w->objects[object].kind == OBJECT_COMMON) {
        char where[CKPT_PATH_MAX + CKPT_NAME_MAX + 8];
        snprintf(where, sizeof where, "%s: %s", path, w->objects[object].key);
        return write_common(w, tw, 1, where);
    }
    /* A module's extra state without Transformer Engine's FP8: None, as
     * Megatron-Core's local modules save it and TE's set_extra_state takes it. */
    byte_buffer *b = torch_writer_pickle(tw);
    pk_list_begin(b);
    pk_none(b);
    pk_list_end(b);
    int status = torch_writer_begin_storages(tw);
    if (status) {
        torch_writer_abort(tw);
        return status;
    }
    return torch_writer_finish(tw);
}

/* ---------------------------------------------------------------- the plan */

/* What the output carries over, checked before anything is written: only
 * data and known classes go back (torch_write.h pk_value_check). */
static int check_carried(const dist_writer *w)
{
    if (w->o->dist) {
        const torch_archive *archive;
        const char *where;
        const pickle_value *state = megatron_dist_common_state(w->o->dist, &archive, &where);
        if (state->kind != PICKLE_DICT) return tp_fail(TP_ERR_FORMAT, "%s: the common state is a %s, not a dict", where,
                                                       pickle_kind_name(state->kind));
        return pk_value_check(state, where, "common state", 1);
    }
    const megatron_checkpoint *m = w->o->legacy;
    if (!m) return TP_OK;
    const char *first = megatron_rank_path(m, 0, 0);
    if (megatron_args(m)) TP_TRY(pk_value_check(megatron_args(m), first, "args", 0));
    const char *training[] = {"optimizer", "opt_param_scheduler"};
    for (int i = 0; i < 2 && w->optimizer; i++) {
        const pickle_value *v = megatron_rank_value(m, 0, 0, training[i]);
        if (v) TP_TRY(pk_value_check(v, first, training[i], 1));
    }
    return TP_OK;
}

static void writer_free(dist_writer *w)
{
    free(w->objects);
}

static int writer_init(dist_writer *w, ckpt_reader *source, const megatron_dist_write_options *o)
{
    memset(w, 0, sizeof *w);
    w->source = source;
    w->o = o;
    w->c = o->model;
    const megatron_config *c = o->model;
    const char *name = ckpt_reader_path(source);
    if (!c) return tp_fail(TP_ERR_ARG, "%s: a torch_dist output needs the model's Megatron args (a Megatron-LM or "
                           "torch_dist source, or this toolkit's GPT)", name);
    if (o->names && !o->names->canonical)
        return tp_fail(TP_ERR_ARG, "%s: a source under its own names needs their canonical names", name);
    /* Megatron-Core's names: Transformer Engine's fused norms unless the source's are the local modules'. */
    w->naming = c->naming == MEGATRON_NAMES_CORE_LOCAL ? MEGATRON_NAMES_CORE_LOCAL : MEGATRON_NAMES_CORE;
    /* A torch_dist source whose layers are keyed one by one (a model whose
     * layers are not all alike): its tensors would be written stacked
     * beside its _extra_state objects keyed by number, which no model
     * loads whole. */
    const dcp_checkpoint *dcp = o->dist ? megatron_dist_dcp(o->dist) : NULL;
    for (int i = 0; dcp && i < dcp_num_entries(dcp); i++) {
        const char *key = dcp_entry_at(dcp, i)->key;
        if (is_prefix(key, "decoder.layers.") && key[15] >= '0' && key[15] <= '9')
            return tp_fail(TP_ERR_LAYOUT, "%s: its layers are keyed one by one (%s: a model whose layers are not all "
                           "alike), which is not written as torch_dist yet (--format tp, dcp or megatron converts it)",
                           name, key);
    }
    w->to = (ckpt_layout){.tp = o->tp ? o->tp : c->tp, .pp = o->pp ? o->pp : c->pp, .dp = 1, .num_layers = c->num_layers};
    TP_TRY(megatron_check_layout(c, &w->to, w->naming));
    int has_state = 0;
    for (int i = 0; i < ckpt_reader_num_tensors(source) && !has_state; i++) {
        const char *role = ckpt_reader_tensor(source, i)->role;
        has_state = role && !strcmp(role, "exp_avg");
    }
    if (c->has_optimizer && !c->optimizer_read && !o->weights_only) {
        const char *why = o->dist ? megatron_dist_optimizer_refusal(o->dist) : o->legacy ? megatron_optimizer_refusal(o->legacy, NULL)
                                                                                        : NULL;
        return tp_fail(TP_ERR_LAYOUT, "%s: %s; --weights-only writes the weights alone", name,
                       why ? why : "the optimizer's state was not read");
    }
    w->optimizer = has_state && !o->weights_only;
    if (w->optimizer && c->distributed_optimizer)
        return tp_fail(TP_ERR_LAYOUT, "%s: the distributed optimizer's state is not written as torch_dist yet (its "
                       "sharding type is the run's); --weights-only writes the weights alone", name);
    if (w->optimizer && !o->dist && !o->legacy)
        return tp_fail(TP_ERR_LAYOUT, "%s: the optimizer's param groups and step are not known without a Megatron-LM "
                       "source; --weights-only writes the weights alone", name);
    w->same_layout = o->dist && w->to.tp == c->tp && w->to.pp == c->pp;
    w->carried = o->dist ? megatron_dist_dcp(o->dist) : NULL;
    for (int i = 0; w->same_layout && i < dcp_num_entries(w->carried); i++)
        w->rng |= is_prefix(dcp_entry_at(w->carried, i)->key, "rng_state/");
    w->copy_budget = COPY_BUDGET;
    if (o->dist) w->copy_budget += dcp_bytes(w->carried);
    if (o->legacy) w->copy_budget += megatron_bytes(o->legacy);
    TP_TRY(check_carried(w));
    if (o->common == MEGATRON_CORE_COMMON_ENTRY) TP_TRY(add_object(w, OBJECT_COMMON, "%s", MEGATRON_DIST_COMMON_KEY));
    /* A source that is no torch_dist checkpoint has no ShardedObjects: the
     * modules' extra states, None (without FP8 state), one per layer. */
    for (int64_t l = 0; !o->dist && l < c->num_layers; l++)
        for (int i = 0; megatron_layer_extra_module(w->naming, i); i++)
            TP_TRY(add_object(w, OBJECT_EXTRA_NONE, "decoder.layers.%s._extra_state/shard_%lld_%lld",
                              megatron_layer_extra_module(w->naming, i), (long long)l, (long long)c->num_layers));
    w->hooks = (struct dcp_write_hooks){.ctx = w, .key_of = key_of, .padded = 1, .fill_padding = fill_padding,
                                        .whole_piece = o->names ? whole_piece : NULL, .transform = regroup_qkv,
                                        .no_description = 1, .carry = carry, .num_objects = w->num_objects,
                                        .object_key = object_key, .write_object = write_object};
    w->dcp = (dcp_write_options){.tp = w->to.tp, .pp = w->to.pp, .dp = 1, .torch_version = o->torch_version,
                                 .threads = o->threads, .weights_only = !w->optimizer, .memory_limit = o->memory_limit,
                                 .others_from = w->carried, .hooks = &w->hooks, .on_bytes = o->on_bytes,
                                 .progress_ctx = o->progress_ctx};
    return TP_OK;
}

static int plan_of(dist_writer *w, megatron_dist_write_plan *plan)
{
    dcp_write_plan d;
    memset(plan, 0, sizeof *plan);
    TP_TRY(dcp_write_plan_create(w->source, &w->dcp, &d));
    *plan = (megatron_dist_write_plan){.tp = d.tp, .pp = d.pp, .naming = w->naming, .files = d.files,
                                       .tensors = d.tensors, .chunks = d.chunks, .objects = w->num_objects + d.others,
                                       .bytes = d.bytes, .threads = d.threads, .buffer_memory = d.buffer_memory,
                                       .optimizer = w->optimizer, .rng = w->rng};
    for (int i = 0; w->carried && i < dcp_num_entries(w->carried); i++) {
        const dcp_entry *e = dcp_entry_at(w->carried, i);
        plan->left_out += !dcp_entry_is_tensor(e) && strcmp(e->key, MEGATRON_DIST_COMMON_KEY) && !carry(w, e);
    }
    return TP_OK;
}

int megatron_dist_write_plan_create(ckpt_reader *source, const megatron_dist_write_options *options,
                                    megatron_dist_write_plan *plan)
{
    dist_writer w;
    int status = writer_init(&w, source, options);
    if (!status) status = plan_of(&w, plan);
    writer_free(&w);
    return status;
}

/* -------------------------------------------------------------- the files */

/* A small file written whole and synced: metadata.json, the tracker. */
int megatron_dist_write(ckpt_reader *source, const megatron_dist_write_options *options, const char *out,
                        megatron_dist_write_plan *result)
{
    dist_writer w;
    megatron_dist_write_plan plan;
    int status = writer_init(&w, source, options);
    if (!status) status = plan_of(&w, &plan);
    if (status) {
        writer_free(&w);
        return status;
    }
    if (result) *result = plan;
    store_stage_options stage = {.directory = 1, .overwrite = options->overwrite, .may_replace = megatron_dist_may_replace,
                                 .bytes = plan.bytes};
    store_staged *staged = NULL;
    status = store_stage(NULL, out, &stage, &staged);
    if (status) {
        writer_free(&w);
        return status;
    }
    const char *root = store_staged_path(staged);
    const megatron_config *c = w.c;
    char dir[CKPT_PATH_MAX + 32], path[CKPT_PATH_MAX + 64];
    status = megatron_save_iteration_dir(root, c->iteration, dir, sizeof dir);
    if (!status) status = dcp_write_into(source, &w.dcp, dir, NULL);
    if (!status && options->common == MEGATRON_CORE_COMMON_FILE) { /* up to 0.18: torch.save(common_state_dict, path) */
        snprintf(path, sizeof path, "%s/" MEGATRON_DIST_COMMON_FILE, dir);
        torch_writer *tw;
        status = torch_writer_open(path, "common", &tw);
        if (!status) status = write_common(&w, tw, 0, path);
    }
    /* metadata.json last, as Megatron-Core's save_config writes it (json.dump of CheckpointingConfig). */
    snprintf(path, sizeof path, "%s/" MEGATRON_DIST_CONFIG, dir);
    if (!status)
        status = megatron_save_text(path, options->common == MEGATRON_CORE_COMMON_FILE
                                      ? "{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": 1, "
                                        "\"common_backend\": \"torch\", \"common_backend_version\": 1}"
                                      : "{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": 1}");
    if (!status) status = megatron_save_tracker(root, c->iteration);
    writer_free(&w);
    /* What a foreign source records of what was read, whole, before the output appears. */
    if (!status) status = ckpt_reader_finish_checks(source, NULL);
    if (status) {
        store_staged_discard(staged);
        return status;
    }
    return store_staged_publish(staged);
}

/* ------------------------------------------------ what --force replaces */

/* A torch_dist save's entries: in the iteration's directory, the files
 * dist_checkpointing.save writes; no directories within. */
static int dist_entry(int level, const char *name)
{
    return level == 1 && (!strcmp(name, MEGATRON_DIST_CONFIG) || !strcmp(name, MEGATRON_DIST_COMMON_FILE) ||
                          !strcmp(name, DCP_METADATA_NAME) || dcp_is_data_file_name(name));
}

int megatron_dist_may_replace(const store_ops *storage, const char *path, void *ctx)
{
    (void)ctx;
    return megatron_save_may_replace(storage, path, "torch_dist", "metadata.json, common.pt, .metadata and __R_0.distcp files",
                                     dist_entry);
}
