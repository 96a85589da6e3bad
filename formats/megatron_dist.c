/* megatron_dist.c: Megatron-Core's distributed checkpoints (--ckpt-format
 * torch_dist) read as the canonical tensors of megatron.h (megatron.h
 * megatron_dist_*): metadata.json says the backend, common.pt holds args
 * and the iteration, the tensors are a PyTorch distributed checkpoint
 * (dcp.h) under Megatron-Core's keys. A homogeneous model's layers are
 * stacked along a leading axis (decoder.layers.<module> [layers, ...]); each
 * layer becomes a tensor of its own whose boxes are its slices of the
 * stacked chunks, so that any layer, tensor-parallel and data-parallel
 * chunking reads by boxes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../common/error.h"
#include "../common/json.h"
#include "../common/memory.h"
#include "../kernels/kernels.h"
#include "../common/parallel.h"
#include "dcp_internal.h"
#include "megatron_internal.h"

#define CONFIG_NAME MEGATRON_DIST_CONFIG
#define COMMON_NAME MEGATRON_DIST_COMMON_FILE
/* Since Megatron-Core 0.19 the common state is a ShardedObject of the
 * checkpoint itself, a bytes item holding a torch.save of [state]:
 * load_common_state_dict takes loaded[0]. */
#define COMMON_STATE_KEY MEGATRON_DIST_COMMON_KEY
#define COMMON_STATE_MAX ((int64_t)64 << 20)
#define LAYERS_PREFIX "decoder.layers."
#define OPTIMIZER_PREFIX "optimizer.state."

/* Where a tensor's elements lie in the checkpoint. */
typedef enum {
    FROM_CHUNKS,  /* the entry's chunks are boxes of it (their slices of its layer, stacked) */
    FROM_CELLS,   /* fully_sharded_model_space: the entry [fragments..., n] holds flattened ranges of the
                     tensor-parallel pieces ("cells") of model_entry, whose shape they cut */
    FROM_BUCKETS, /* dp_reshardable: each tensor-parallel piece a run of a bucket (pieces) */
} dist_source;

/* A tensor-parallel piece of a tensor in a dp_reshardable bucket: the
 * elements [start, start + the piece's) of the 1-D bucket entry, the
 * piece flattened. */
typedef struct {
    int tensor; /* its tensor in megatron_dist.tensors */
    int entry;
    int tp_rank;
    int64_t start;
} bucket_piece;

/* A copy of a parameter's state in a dp_reshardable bucket: role r (0 the
 * main copy, 1 exp_avg, 2 exp_avg_sq) of its tensor-parallel piece `piece`
 * (0 for a replicated parameter), held by tp_rank's buffer; head: the
 * last stage's copy of the tied word embeddings. */
typedef struct bucket_copy {
    int param, role, piece, head, tp_rank, entry;
    int64_t start;
} bucket_copy;

/* One tensor of the reader: a canonical name, and where it comes from: a
 * DCP entry, one layer of it when stacked. */
typedef struct {
    char name[CKPT_NAME_MAX + 1];
    char param[CKPT_NAME_MAX + 1];
    const char *role;
    dist_source source;
    int entry;       /* FROM_CHUNKS, FROM_CELLS */
    int model_entry; /* FROM_CELLS */
    int64_t layer;   /* the slice of a stacked entry's leading axis, or -1 */
    int first_piece, num_pieces; /* FROM_BUCKETS: of megatron_dist.pieces */
    ckpt_tensor_desc desc;
} dist_tensor;

typedef struct {
    dist_tensor *items;
    int count, capacity;
} dist_tensors;

struct megatron_dist {
    char path[CKPT_PATH_MAX];  /* the iteration's directory */
    megatron_config config;
    dcp_checkpoint *dcp;
    store_hold *hold;          /* a shared lock on the save directory opened, while it is read */
    dist_tensors tensors;      /* what the reader presents */
    bucket_piece *pieces;      /* of the FROM_BUCKETS tensors */
    int num_pieces, pieces_capacity;
    /* dp_reshardable: per parameter (the first num_params tensors), where
     * tensor-parallel rank 0's bucket holds its main copy (entry -1: none),
     * to check against the weights (check_main_copies). */
    bucket_piece *main_copies;
    int num_params;
    /* dp_reshardable: every bucket copy of a parameter's state stored more
     * than once (a replicated parameter's on each tensor-parallel rank, the
     * tied embeddings' on the first and the last stage), compared by
     * megatron_dist_check_replicas. */
    struct bucket_copy *copies;
    int num_copies, copies_capacity;
    char optimizer_refusal[1024];
    const char *optimizer_layout; /* the optimizer's layout read (a static string), or NULL */
    char recorded_layout[64];  /* the distributed optimizer's layout as the common state records it, or "" */
    int common_entry;          /* the common state is the common_state entry (0.19+), not common.pt */
    torch_archive *common;     /* the archive holding it, kept for a writer to carry it */
    void *common_data;         /* the entry's bytes, which common reads (0.19+) */
    char common_where[CKPT_PATH_MAX + 64];
};

/* Whether dir holds metadata.json naming the torch_dist backend; *other
 * receives another backend's name ("zarr"), refused by the caller. */
static int read_backend(const char *dir, int *torch_dist, char *other, size_t size)
{
    char path[CKPT_PATH_MAX + 32], *text = NULL;
    *torch_dist = 0;
    other[0] = '\0';
    snprintf(path, sizeof path, "%s/" CONFIG_NAME, dir);
    store_stat st;
    TP_TRY(dcp_stat(path, &st));
    if (!st.exists) return TP_OK;
    TP_TRY(store_read_text_file(path, 1 << 20, &text, NULL));
    cJSON *root = NULL;
    int status = tp_json_parse(text, strlen(text), path, &root);
    free(text);
    if (status) return status;
    const cJSON *backend = cJSON_GetObjectItemCaseSensitive(root, "sharded_backend");
    if (!cJSON_IsString(backend)) status = tp_fail(TP_ERR_FORMAT, "%s: no sharded_backend", path);
    else if (!strcmp(backend->valuestring, "torch_dist")) *torch_dist = 1;
    else snprintf(other, size, "%s", backend->valuestring);
    cJSON_Delete(root);
    return status;
}

int megatron_dist_detect(const char *path, int *found)
{
    *found = 0;
    char dir[CKPT_PATH_MAX], other[64];
    /* A tracker file that holds no iteration is the legacy reader's to
     * explain; a store that fails to answer is an error, not a "no" (the
     * next probe would wait for the same store again). */
    int status = megatron_iteration_dir(path, dir, sizeof dir);
    if (status == TP_ERR_FORMAT) return TP_OK;
    TP_TRY(status);
    int torch_dist;
    TP_TRY(read_backend(dir, &torch_dist, other, sizeof other));
    *found = torch_dist || other[0];
    return TP_OK;
}

/* The naming of the keys: Transformer Engine's fused norms, or local modules. */
static megatron_naming naming_of(const dcp_checkpoint *dcp)
{
    for (int i = 0; i < dcp_num_entries(dcp); i++)
        if (strstr(dcp_entry_at(dcp, i)->key, "linear_qkv.layer_norm_weight")) return MEGATRON_NAMES_CORE;
    return MEGATRON_NAMES_CORE_LOCAL;
}

static int collect(megatron_dist *m, dist_tensors *list);

/* The distributed optimizer's layout as Megatron-LM's save records it in
 * the common state: content_metadata.distrib_optim_sharding_type (since
 * 2b11af0a10, 2025-06-16), or the optimizer's param_state_sharding_type
 * (DistributedOptimizer.sharded_state_dict). */
static void read_recorded_layout(const pickle_value *root, char *out, size_t size)
{
    const pickle_value *v = pickle_get(pickle_get(root, "content_metadata"), "distrib_optim_sharding_type");
    if (!v || v->kind != PICKLE_STRING) v = pickle_get(pickle_get(root, "optimizer"), "param_state_sharding_type");
    out[0] = '\0';
    if (v && v->kind == PICKLE_STRING && v->text.size < (int64_t)size) snprintf(out, size, "%s", v->text.data);
}

int megatron_dist_check_common(const megatron_dist *m, torch_archive_check_result *result)
{
    return torch_archive_check(m->common, result, NULL, NULL);
}

/* The common state (args, checkpoint_version, iteration, the scheduler):
 * common.pt beside .metadata where there is one (up to 0.18; 0.19+ still
 * reads it first), else the common_state entry. */
static int read_common(megatron_dist *m)
{
    char path[CKPT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/" COMMON_NAME, m->path);
    torch_archive *archive = NULL;
    int status = torch_archive_open(path, NULL, &archive);
    if (status != TP_ERR_NOT_FOUND) {
        if (!status) status = megatron_config_read(archive, &m->config);
        m->common = archive;
        if (!status) read_recorded_layout(torch_archive_root(archive), m->recorded_layout, sizeof m->recorded_layout);
        m->common_entry = 0;
        snprintf(m->common_where, sizeof m->common_where, "%s", path);
        return status;
    }
    int entry = dcp_find(m->dcp, COMMON_STATE_KEY);
    if (entry < 0 || dcp_entry_at(m->dcp, entry)->kind != DCP_BYTES)
        return tp_fail(TP_ERR_FORMAT, "%s: neither " COMMON_NAME " nor a bytes entry " COMMON_STATE_KEY
                       ": the model's args are not known without Megatron-Core's common state", m->path);
    snprintf(m->common_where, sizeof m->common_where, "%s: " COMMON_STATE_KEY, m->path);
    int64_t size = 0;
    TP_TRY(dcp_read_bytes(m->dcp, entry, COMMON_STATE_MAX, &m->common_data, &size));
    status = torch_archive_open_memory(m->common_where, m->common_data, size, NULL, &archive);
    m->common = archive;
    m->common_entry = 1;
    const pickle_value *root = status ? NULL : torch_archive_root(archive);
    if (!status && !((root->kind == PICKLE_LIST || root->kind == PICKLE_TUPLE) && root->items.count >= 1 &&
                     root->items.items[0]->kind == PICKLE_DICT))
        status = tp_fail(TP_ERR_FORMAT, "%s: holds a %s, not a list whose first item is the common state (a dict)",
                         m->common_where, pickle_kind_name(root->kind));
    if (!status) status = megatron_config_from(m->common_where, root->items.items[0], &m->config);
    if (!status) read_recorded_layout(root->items.items[0], m->recorded_layout, sizeof m->recorded_layout);
    return status;
}

const pickle_value *megatron_dist_common_state(const megatron_dist *m, const torch_archive **archive, const char **where)
{
    *archive = m->common;
    *where = m->common_where;
    const pickle_value *root = torch_archive_root(m->common);
    return m->common_entry ? root->items.items[0] : root;
}

int megatron_dist_open(const char *path, megatron_dist **out)
{
    *out = NULL;
    megatron_dist *m = calloc(1, sizeof *m);
    if (!m) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int torch_dist = 0, status = megatron_iteration_dir(path, m->path, sizeof m->path);
    /* The save directory held while it is read (the iteration's, by dcp_open). */
    if (!status && strcmp(path, m->path)) status = store_hold_shared(path, &m->hold);
    char other[64] = "";
    if (!status) status = read_backend(m->path, &torch_dist, other, sizeof other);
    if (!status && !torch_dist)
        status = other[0] ? tp_fail(TP_ERR_FORMAT, "%s: Megatron-Core's %s backend is not read (torch_dist is)", m->path, other)
                          : tp_fail(TP_ERR_FORMAT, "%s: no " CONFIG_NAME ": not a Megatron-Core distributed checkpoint", m->path);
    if (!status) status = dcp_open(m->path, &m->dcp);
    if (!status) status = read_common(m);
    if (!status) {
        m->config.core_names = 1;
        m->config.naming = naming_of(m->dcp);
        status = collect(m, &m->tensors);
    }
    if (status) {
        megatron_dist_close(m);
        return status;
    }
    *out = m;
    return TP_OK;
}

void megatron_dist_close(megatron_dist *m)
{
    if (!m) return;
    dcp_close(m->dcp);
    torch_archive_close(m->common);
    free(m->common_data);
    free(m->tensors.items);
    free(m->pieces);
    free(m->main_copies);
    free(m->copies);
    store_hold_release(m->hold);
    free(m);
}

const megatron_config *megatron_dist_config(const megatron_dist *m)
{
    return &m->config;
}

const char *megatron_dist_path(const megatron_dist *m)
{
    return m->path;
}

const dcp_checkpoint *megatron_dist_dcp(const megatron_dist *m)
{
    return m->dcp;
}

const char *megatron_dist_common_source(const megatron_dist *m)
{
    return m->common_entry ? "common_state" : COMMON_NAME;
}

const char *megatron_dist_optimizer_refusal(const megatron_dist *m)
{
    return m->optimizer_refusal[0] ? m->optimizer_refusal : NULL;
}

const char *megatron_dist_optimizer_layout(const megatron_dist *m)
{
    return m->config.optimizer_read ? m->optimizer_layout : NULL;
}

/* ------------------------------------------------------------ tensors */

static int push(dist_tensors *list, const dist_tensor *t)
{
    if (list->count == list->capacity) {
        int capacity = list->capacity ? 2 * list->capacity : 256;
        dist_tensor *grown = realloc(list->items, (size_t)capacity * sizeof *grown);
        if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory");
        list->items = grown;
        list->capacity = capacity;
    }
    list->items[list->count++] = *t;
    return TP_OK;
}

/* Megatron-Core's names of the optimizer's states, ours: the main (fp32)
 * copy of a parameter is fp32_param in the model's space of the
 * non-distributed optimizer and fully_sharded_model_space, param in
 * fully_reshardable's and dp_reshardable's. */
static const char *role_of(const char *state, size_t length)
{
    static const struct {
        const char *state, *role;
    } roles[] = {{"exp_avg", "exp_avg"}, {"exp_avg_sq", "exp_avg_sq"}, {"fp32_param", "master"}, {"param", "master"}};
    for (size_t i = 0; i < sizeof roles / sizeof *roles; i++)
        if (strlen(roles[i].state) == length && !strncmp(state, roles[i].state, length)) return roles[i].role;
    return NULL;
}

/* Adds the tensor(s) of a model key (the part after optimizer.state.STATE.
 * for the optimizer's, with role): one, or one per layer when stacked.
 * Their shape is shape_entry's (the entry's, or the model's when the
 * entry's cells cut it). */
static int add_key(const megatron_dist *m, int entry, int shape_entry, dist_source source, const char *key, const char *role,
                   dist_tensors *list)
{
    const megatron_config *c = &m->config;
    const dcp_entry *e = dcp_entry_at(m->dcp, shape_entry);
    int stacked = !strncmp(key, LAYERS_PREFIX, strlen(LAYERS_PREFIX)) &&
                  !(key[strlen(LAYERS_PREFIX)] >= '0' && key[strlen(LAYERS_PREFIX)] <= '9');
    if (stacked && (e->ndim < 2 || e->shape[0] != c->num_layers))
        return tp_fail(TP_ERR_FORMAT, "%s: %s: layers stacked along a first axis of %lld, args say %lld layers", m->path, e->key,
                       (long long)(e->ndim ? e->shape[0] : 0), (long long)c->num_layers);
    int64_t layers = stacked ? c->num_layers : 1;
    for (int64_t l = 0; l < layers; l++) {
        char path[CKPT_NAME_MAX + 64], canonical[CKPT_NAME_MAX + 1];
        if (stacked) snprintf(path, sizeof path, LAYERS_PREFIX "%lld.%s", (long long)l, key + strlen(LAYERS_PREFIX));
        else snprintf(path, sizeof path, "%s", key);
        int kind;
        int status = megatron_canonical_name(c, path, 0, c->num_layers, canonical, sizeof canonical, &kind);
        if (status) return tp_fail_context(status, "%s: key %s", m->path, dcp_entry_at(m->dcp, entry)->key);
        if (kind != MEGATRON_NAME_TENSOR) return TP_OK; /* the tied head's copy; extra state */
        dist_tensor t = {.entry = entry, .model_entry = shape_entry, .source = source, .layer = stacked ? l : -1,
                         .role = role ? role : "param"};
        snprintf(t.param, sizeof t.param, "%s", canonical);
        int length = role ? snprintf(t.name, sizeof t.name, "optim/%.16s/%.200s", role, canonical)
                          : snprintf(t.name, sizeof t.name, "%.255s", canonical);
        if (length >= (int)sizeof t.name || strlen(canonical) > 200)
            return tp_fail(TP_ERR_FORMAT, "%s: key %s: a name too long", m->path, e->key);
        megatron_describe(c, t.param, &t.desc);
        /* A tensor entry: one of ours (the data's dtype: the entry's). */
        torch_dtype_to_tp(dcp_entry_at(m->dcp, entry)->dtype, &t.desc.dtype);
        /* The logical shape: the entry's, without the layer axis. */
        int ndim = e->ndim - (stacked ? 1 : 0);
        int same = ndim == t.desc.ndim;
        for (int d = 0; same && d < ndim; d++) same = e->shape[d + (stacked ? 1 : 0)] == t.desc.shape[d];
        if (!same) {
            char got[160], want[160];
            ckpt_shape_text(e->shape + (stacked ? 1 : 0), ndim, got, sizeof got);
            ckpt_shape_text(t.desc.shape, t.desc.ndim, want, sizeof want);
            return tp_fail(TP_ERR_FORMAT, "%s: key %s: %s%s, the args make %s %s", m->path, e->key, got,
                           stacked ? " per layer" : "", t.param, want);
        }
        TP_TRY(push(list, &t));
    }
    return TP_OK;
}

/* Whether key is an optimizer's: optimizer.…, or chained_N.optimizer.…
 * (ChainedOptimizer's prefix of each of several optimizers). */
static int optimizer_key(const char *key, int *chained)
{
    *chained = 0;
    if (!strncmp(key, "optimizer.", strlen("optimizer."))) return 1;
    if (strncmp(key, "chained_", strlen("chained_"))) return 0;
    const char *p = key + strlen("chained_");
    while (*p >= '0' && *p <= '9') p++;
    *chained = p > key + strlen("chained_") && !strncmp(p, ".optimizer.", strlen(".optimizer."));
    return *chained;
}

/* An entry optimizer.state.STATE.KEY of the model's space: the role, and
 * KEY's entry (a parameter's), or NULL. */
static const char *state_entry(const dcp_checkpoint *dcp, const char *key, int *model_entry)
{
    *model_entry = -1;
    if (strncmp(key, OPTIMIZER_PREFIX, strlen(OPTIMIZER_PREFIX))) return NULL;
    const char *state = key + strlen(OPTIMIZER_PREFIX), *dot = strchr(state, '.');
    const char *role = dot ? role_of(state, (size_t)(dot - state)) : NULL;
    int found = role ? dcp_find(dcp, dot + 1) : -1;
    int chained;
    if (found < 0 || !dcp_entry_is_tensor(dcp_entry_at(dcp, found)) || optimizer_key(dot + 1, &chained)) return NULL;
    *model_entry = found;
    return role;
}

/* A state of the model's space: as its parameter is chunked (the
 * non-distributed optimizer, fully_reshardable, and a 1-D parameter of
 * fully_sharded_model_space before 244ec97009), or in
 * fully_sharded_model_space's cells. The main copy of an fp32 parameter
 * is the parameter itself (Megatron's optimizers keep no other) and is
 * not a tensor of its own. */
static int add_state(megatron_dist *m, int entry, int model_entry, const char *role, dist_tensors *list, int *cells)
{
    const dcp_entry *e = dcp_entry_at(m->dcp, entry), *p = dcp_entry_at(m->dcp, model_entry);
    if (!strcmp(role, "master") && p->dtype == TORCH_FLOAT32) return TP_OK;
    int same = e->ndim == p->ndim;
    for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == p->shape[d];
    if (same) return add_key(m, entry, model_entry, FROM_CHUNKS, p->key, role, list);
    /* fully_sharded_model_space, saved as Megatron-Core up to 0.15 saves a
     * flattened ShardedTensor (dist_checkpointing/strategies/torch.py
     * sharded_tensor_to_torch_sharded_tensor and resharding.py
     * nd_flattened_tensor_reformulated_global_shape, at core_v0.15.0): a
     * parameter [X, Y] cut into pieces [x, y] as [X / x, Y / y, x y], the
     * chunk of a flattened range [a, b) of piece (i, j) at (i, j, a). */
    int64_t piece = 1;
    int cut = e->ndim == p->ndim + 1;
    for (int d = 0; cut && d < p->ndim; d++) {
        cut = e->shape[d] >= 1 && p->shape[d] % e->shape[d] == 0;
        if (cut) piece *= p->shape[d] / e->shape[d];
    }
    if (!cut || piece != e->shape[e->ndim - 1]) {
        char got[160], want[160];
        ckpt_shape_text(e->shape, e->ndim, got, sizeof got);
        ckpt_shape_text(p->shape, p->ndim, want, sizeof want);
        return tp_fail(TP_ERR_FORMAT, "%s: %s is %s: neither its parameter's shape %s nor that cut into flattened pieces "
                       "[pieces along each dimension..., elements of a piece]", m->path, e->key, got, want);
    }
    *cells = 1;
    return add_key(m, entry, model_entry, FROM_CELLS, p->key, role, list);
}

/* ------------------------------------------------------ dp_reshardable */

/* A bucket's state: optimizer.distributed.dp_group_idx_G.gbuf_idx_B.
 * dtype_(PARAM_DTYPE, GRAD_DTYPE).bucket_idx_K.STATE (distrib_optimizer.py
 * sharded_param_state_dp_reshardable, Megatron-LM d98e8a64dd). */
typedef struct {
    int group, gbuf, bucket;
    const char *role;
    torch_dtype param_dtype;
    int entry;
} bucket_key;

#define BUCKET_PREFIX "optimizer.distributed.dp_group_idx_"
#define BUCKET_INDEX_MAX 100000000 /* a group, buffer or bucket number, at most */

static const char *parse_number(const char *p, int *out)
{
    int64_t v = 0;
    const char *start = p;
    while (*p >= '0' && *p <= '9' && v <= BUCKET_INDEX_MAX) v = v * 10 + (*p++ - '0');
    if (p == start || v > BUCKET_INDEX_MAX) return NULL;
    *out = (int)v;
    return p;
}

static const char *expect(const char *p, const char *text)
{
    return p && !strncmp(p, text, strlen(text)) ? p + strlen(text) : NULL;
}

static int parse_bucket_key(const char *key, bucket_key *out)
{
    const char *p = expect(key, BUCKET_PREFIX);
    if (p) p = parse_number(p, &out->group);
    p = expect(p, ".gbuf_idx_");
    if (p) p = parse_number(p, &out->gbuf);
    p = expect(p, ".dtype_(torch.");
    if (!p) return 0;
    /* The dtypes' text (a tuple's str) has dots of its own: the bucket is after the last ".bucket_idx_". */
    const char *bucket = NULL;
    for (const char *q = strstr(p, ".bucket_idx_"); q; q = strstr(q + 1, ".bucket_idx_")) bucket = q;
    if (!bucket) return 0;
    static const struct {
        const char *name;
        torch_dtype dtype;
    } dtypes[] = {{"float32, ", TORCH_FLOAT32}, {"bfloat16, ", TORCH_BFLOAT16}, {"float16, ", TORCH_FLOAT16}};
    int known = 0;
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes && !known; i++)
        if (!strncmp(p, dtypes[i].name, strlen(dtypes[i].name))) {
            out->param_dtype = dtypes[i].dtype;
            known = 1;
        }
    p = parse_number(bucket + strlen(".bucket_idx_"), &out->bucket);
    p = expect(p, ".");
    out->role = p ? role_of(p, strlen(p)) : NULL;
    return known && out->role && strcmp(p, "fp32_param") != 0;
}

static int compare_bucket_keys(const void *a, const void *b)
{
    const bucket_key *x = a, *y = b;
    if (x->group != y->group) return x->group < y->group ? -1 : 1;
    if (x->gbuf != y->gbuf) return x->gbuf < y->gbuf ? -1 : 1;
    if (x->bucket != y->bucket) return x->bucket < y->bucket ? -1 : 1;
    return strcmp(x->role, y->role);
}

/* The model's parameters by name, for the chunks' walks. */
typedef struct {
    const char *name;
    int index;
} named;

typedef struct {
    named *by_name; /* sorted */
    int count;
} param_index;

static int compare_named(const void *a, const void *b)
{
    return strcmp(((const named *)a)->name, ((const named *)b)->name);
}

static int find_param(void *ctx, const char *canonical)
{
    const param_index *index = ctx;
    named key = {canonical, 0}, *found = bsearch(&key, index->by_name, (size_t)index->count, sizeof key, compare_named);
    return found ? found->index : -1;
}

static int push_piece(megatron_dist *m, bucket_piece piece)
{
    TP_TRY(array_reserve((void **)&m->pieces, &m->pieces_capacity, m->num_pieces + 1, sizeof *m->pieces));
    m->pieces[m->num_pieces++] = piece;
    return TP_OK;
}

static const char *const bucket_roles[3] = {"master", "exp_avg", "exp_avg_sq"};

/* The tensor of a parameter's state of role r (0 master, 1 exp_avg, 2
 * exp_avg_sq): state_of[param * 3 + r], created at its first piece. */
static int state_tensor(megatron_dist *m, dist_tensors *list, int param, int r, int entry, int *state_of)
{
    int *slot = &state_of[param * 3 + r];
    tp_dtype dtype;
    torch_dtype_to_tp(dcp_entry_at(m->dcp, entry)->dtype, &dtype);
    if (*slot >= 0) {
        if (dtype != list->items[*slot].desc.dtype)
            return tp_fail(TP_ERR_FORMAT, "%s: %s of %s is %s in %s, %s in another bucket", m->path, bucket_roles[r],
                           list->items[param].name, tp_dtype_name(dtype), dcp_entry_at(m->dcp, entry)->key,
                           tp_dtype_name(list->items[*slot].desc.dtype));
        return TP_OK;
    }
    dist_tensor t = list->items[param];
    t.source = FROM_BUCKETS;
    t.entry = t.model_entry = -1;
    t.layer = -1;
    t.role = bucket_roles[r];
    t.desc.dtype = dtype;
    snprintf(t.name, sizeof t.name, "optim/%s/%.200s", bucket_roles[r], list->items[param].name);
    snprintf(t.param, sizeof t.param, "%s", list->items[param].name);
    *slot = list->count;
    return push(list, &t);
}

/* The buffer of tensor-parallel rank tp_rank's data-parallel group
 * numbered gbuf: the parameters of one dtype of one model chunk (params,
 * in named_parameters() order; MEGATRON_HEAD_COPY the tied embeddings'
 * copy), its buckets' states the keys [0, n) (sorted). Each parameter's
 * states become pieces of its optimizer tensors. */
static int read_buffer(megatron_dist *m, dist_tensors *list, int tp_rank, int word, const int *params, int num_params,
                       const bucket_key *keys, int n, int *state_of, const char *where)
{
    const megatron_config *c = &m->config;
    int num_buckets = n ? keys[n - 1].bucket + 1 : 0;
    int64_t *bucket_numel = calloc((size_t)num_buckets + 1, sizeof *bucket_numel);
    int(*entry_of)[3] = calloc((size_t)num_buckets + 1, sizeof *entry_of);
    megatron_buffer_param *layout = calloc((size_t)num_params + 1, sizeof *layout);
    int status = bucket_numel && entry_of && layout ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int b = 0; !status && b < num_buckets; b++)
        for (int r = 0; r < 3; r++) entry_of[b][r] = -1;
    for (int k = 0; !status && k < n; k++) {
        const dcp_entry *e = dcp_entry_at(m->dcp, keys[k].entry);
        int r = 0, b = keys[k].bucket;
        while (strcmp(bucket_roles[r], keys[k].role)) r++;
        if (e->ndim != 1 || entry_of[b][r] >= 0)
            status = tp_fail(TP_ERR_FORMAT, "%s: %s: %s", m->path, e->key,
                             e->ndim != 1 ? "not one-dimensional (a bucket's flat state)" : "a bucket's state twice");
        else if (bucket_numel[b] && bucket_numel[b] != e->shape[0])
            status = tp_fail(TP_ERR_FORMAT, "%s: %s has %lld elements, its bucket's other states %lld", m->path, e->key,
                             (long long)e->shape[0], (long long)bucket_numel[b]);
        entry_of[b][r] = keys[k].entry;
        bucket_numel[b] = e->shape[0];
    }
    /* Every bucket has the states the first has; Adam's moments always. */
    for (int b = 0; !status && b < num_buckets; b++)
        for (int r = 0; r < 3 && !status; r++)
            if (entry_of[b][r] < 0 && (r > 0 || entry_of[0][0] >= 0))
                status = tp_fail(TP_ERR_FORMAT, "%s: no %s state of bucket_idx_%d", where, r ? bucket_roles[r] : "param", b);
    /* Each parameter's tensor-parallel piece, where Megatron's layout puts it. */
    for (int k = 0; !status && k < num_params; k++) {
        int index = params[k] == MEGATRON_HEAD_COPY ? word : params[k];
        if (index < 0) {
            status = tp_fail(TP_ERR_FORMAT, "%s: a copy of the tied word embeddings, which the checkpoint lacks", where);
            break;
        }
        const ckpt_tensor_desc *d = &list->items[index].desc;
        int64_t shape[CKPT_MAX_DIMS], numel = 1;
        ckpt_piece_shape(d, c->tp, shape);
        for (int x = 0; x < d->ndim; x++) numel *= shape[x];
        layout[k].numel = numel;
        layout[k].shared = c->pp > 1 && !c->untied && index == word;
    }
    if (!status) status = megatron_buffer_layout(layout, num_params, bucket_numel, num_buckets, where);
    for (int k = 0; !status && k < num_params; k++) {
        /* The states stored more than once: each tensor-parallel rank's of a
         * replicated parameter, each stage's of the tied embeddings. */
        int index = params[k] == MEGATRON_HEAD_COPY ? word : params[k];
        int replicated = ckpt_piece_count(&list->items[index].desc, c->tp) == 1;
        if ((c->tp > 1 && replicated) || layout[k].shared)
            for (int r = 0; r < 3 && !status; r++) {
                if (entry_of[layout[k].bucket][r] < 0) continue;
                status = array_reserve((void **)&m->copies, &m->copies_capacity, m->num_copies + 1, sizeof *m->copies);
                if (!status)
                    m->copies[m->num_copies++] = (bucket_copy){index, r, replicated ? 0 : tp_rank, params[k] == MEGATRON_HEAD_COPY,
                                                               tp_rank, entry_of[layout[k].bucket][r], layout[k].start};
            }
        if (params[k] == MEGATRON_HEAD_COPY) continue; /* the embeddings' state again: its place is checked */
        if (tp_rank == 0 && entry_of[layout[k].bucket][0] >= 0)
            m->main_copies[params[k]] = (bucket_piece){.tensor = params[k], .entry = entry_of[layout[k].bucket][0],
                                                       .start = layout[k].start};
        /* A replicated parameter's pieces are alike: tensor-parallel rank 0's is read. */
        if (ckpt_piece_count(&list->items[params[k]].desc, c->tp) == 1 && tp_rank > 0) continue;
        tp_dtype param_dtype = list->items[params[k]].desc.dtype; /* list grows below */
        for (int r = 0; r < 3 && !status; r++) {
            int entry = entry_of[layout[k].bucket][r];
            if (entry < 0 || (r == 0 && param_dtype == TP_FP32)) continue; /* an fp32 parameter is its own main copy */
            status = state_tensor(m, list, params[k], r, entry, state_of);
            if (!status)
                status = push_piece(m, (bucket_piece){.tensor = state_of[params[k] * 3 + r], .entry = entry, .tp_rank = tp_rank,
                                                      .start = layout[k].start});
        }
    }
    free(bucket_numel);
    free(entry_of);
    free(layout);
    return status;
}

static int compare_pieces(const void *a, const void *b)
{
    const bucket_piece *x = a, *y = b;
    if (x->tensor != y->tensor) return x->tensor < y->tensor ? -1 : 1;
    return x->tp_rank < y->tp_rank ? -1 : x->tp_rank > y->tp_rank;
}

/* dp_reshardable: keys[0..n) the buckets' states. Data-parallel group G
 * is the model-parallel rank tp_rank + tp pp_rank (optimizer/__init__.py
 * get_megatron_optimizer: data_parallel_group_idx = the rank in mp_group,
 * whose ranks parallel_state.py orders tensor-parallel first); its buffers
 * gbuf_idx 0, 1, ... are its model chunks' in order, in each a buffer per
 * parameter dtype in the order of their first parameters
 * (group_params_for_buffers). */
static int collect_buckets(megatron_dist *m, dist_tensors *list, bucket_key *keys, int n)
{
    const megatron_config *c = &m->config;
    qsort(keys, (size_t)n, sizeof *keys, compare_bucket_keys);
    int num_params = list->count, groups = c->tp * c->pp;
    /* A chunk's parameters are the model's (and the tied copy): the walk of
     * a chunk of more layers than the model has tensors is refused first. */
    int64_t chunk_layers = c->num_layers / ((int64_t)c->pp * c->vpp);
    int max = num_params + 2;
    if (chunk_layers > num_params)
        return tp_fail(TP_ERR_FORMAT, "%s: args say %lld layers a model chunk, the checkpoint has %d tensors", m->path,
                       (long long)chunk_layers, num_params);
    named *by_name = calloc((size_t)num_params + 1, sizeof *by_name);
    int *state_of = malloc(((size_t)num_params * 3 + 1) * sizeof *state_of);
    int *params = calloc((size_t)max, sizeof *params), *buffer = calloc((size_t)max, sizeof *buffer);
    int status = by_name && state_of && params && buffer ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    /* by_name points into the list's items, and the walk below pushes each
     * parameter's states onto the list (at most three each: state_of): the
     * room for them is made now, so that no push moves the items under it. */
    if (!status) status = array_reserve((void **)&list->items, &list->capacity, num_params * 4, sizeof *list->items);
    for (int k = 0; !status && k < num_params; k++) by_name[k] = (named){list->items[k].name, k};
    for (int k = 0; !status && k < num_params * 3; k++) state_of[k] = -1;
    free(m->main_copies);
    m->num_copies = 0;
    m->num_params = num_params;
    m->main_copies = status ? NULL : calloc((size_t)num_params + 1, sizeof *m->main_copies);
    if (!status && !m->main_copies) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int k = 0; !status && k < num_params; k++) m->main_copies[k].entry = -1;
    if (!status) qsort(by_name, (size_t)num_params, sizeof *by_name, compare_named);
    param_index index = {.by_name = by_name, .count = num_params};
    int word = status ? -1 : find_param(&index, "embedding.word_embeddings.weight");
    if (!status && n && keys[n - 1].group >= groups)
        status = tp_fail(TP_ERR_FORMAT, "%s: %s: data-parallel group %d of a model of tp %d x pp %d", m->path,
                         dcp_entry_at(m->dcp, keys[n - 1].entry)->key, keys[n - 1].group, c->tp, c->pp);
    int at = 0; /* the first key of the group's next buffer */
    for (int g = 0; !status && g < groups; g++) {
        int pp_rank = g / c->tp, tp_rank = g % c->tp, gbuf = 0;
        for (int v = 0; !status && v < c->vpp; v++) {
            int count = 0;
            status = megatron_core_chunk_params(c, pp_rank, v, find_param, &index, params, max, &count);
            /* One buffer per dtype, in the order of their first parameters. */
            char *taken = status ? NULL : calloc((size_t)count + 1, 1);
            if (!status && !taken) status = tp_fail(TP_ERR_NOMEM, "out of memory");
            for (int first = 0; !status && first < count; first++) {
                if (taken[first]) continue;
                int head = word >= 0 ? word : 0; /* the copy has the embeddings' dtype */
                tp_dtype dtype = list->items[params[first] == MEGATRON_HEAD_COPY ? head : params[first]].desc.dtype;
                int size = 0;
                for (int k = first; k < count; k++) {
                    int index_k = params[k] == MEGATRON_HEAD_COPY ? head : params[k];
                    if (taken[k] || list->items[index_k].desc.dtype != dtype) continue;
                    taken[k] = 1;
                    buffer[size++] = params[k];
                }
                int end = at;
                while (end < n && keys[end].group == g && keys[end].gbuf == gbuf) end++;
                char where[CKPT_PATH_MAX + 200];
                snprintf(where, sizeof where, "%s: " BUCKET_PREFIX "%d.gbuf_idx_%d (tp rank %d, pp rank %d, model chunk %d)",
                         m->path, g, gbuf, tp_rank, pp_rank, v);
                if (end == at || keys[at].group != g)
                    status = tp_fail(TP_ERR_FORMAT, "%s: no buckets: not in the checkpoint", where);
                for (int k = at; !status && k < end; k++)
                    if (keys[k].bucket > keys[end - 1].bucket || (k > at && keys[k].bucket > keys[k - 1].bucket + 1) ||
                        (k == at && keys[k].bucket != 0))
                        status = tp_fail(TP_ERR_FORMAT, "%s: buckets not numbered 0, 1, ...: bucket_idx_%d", where,
                                         keys[k].bucket);
                for (int k = at; !status && k < end; k++)
                    if (torch_dtype_from_tp(dtype) != keys[k].param_dtype)
                        status = tp_fail(TP_ERR_FORMAT, "%s: %s names parameters of %s, the model's are %s", where,
                                         dcp_entry_at(m->dcp, keys[k].entry)->key, torch_dtype_name(keys[k].param_dtype),
                                         tp_dtype_name(dtype));
                if (!status) status = read_buffer(m, list, tp_rank, word, buffer, size, keys + at, end - at, state_of, where);
                at = end;
                gbuf++;
            }
            free(taken);
        }
        if (!status && at < n && keys[at].group == g)
            status = tp_fail(TP_ERR_FORMAT, "%s: %s: a buffer the model does not have (its %d model chunks hold %d)", m->path,
                             dcp_entry_at(m->dcp, keys[at].entry)->key, c->vpp, gbuf);
    }
    /* Each tensor's pieces together, by tensor-parallel rank: all of them. */
    if (!status) qsort(m->pieces, (size_t)m->num_pieces, sizeof *m->pieces, compare_pieces);
    for (int k = 0; !status && k < m->num_pieces;) {
        dist_tensor *t = &list->items[m->pieces[k].tensor];
        t->first_piece = k;
        while (k < m->num_pieces && m->pieces[k].tensor == m->pieces[t->first_piece].tensor) k++;
        t->num_pieces = k - t->first_piece;
        int want = ckpt_piece_count(&t->desc, c->tp);
        for (int p = 0; p < t->num_pieces && p < want && !status; p++)
            if (m->pieces[t->first_piece + p].tp_rank != p || t->num_pieces != want)
                status = tp_fail(TP_ERR_FORMAT, "%s: %s: %d tensor-parallel pieces in the buckets, %d expected", m->path, t->name,
                                 t->num_pieces, want);
    }
    /* Every parameter's moments. */
    for (int k = 0; !status && k < num_params; k++)
        if (state_of[k * 3 + 1] < 0 || state_of[k * 3 + 2] < 0)
            status = tp_fail(TP_ERR_FORMAT, "%s: %s has no state in the distributed optimizer's buckets", m->path,
                             list->items[k].name);
    free(by_name);
    free(state_of);
    free(params);
    free(buffer);
    return status;
}

/* Every tensor: the model's, and the optimizer's where it is read (the
 * model's space, fully_sharded_model_space's cells, dp_reshardable's
 * buckets); another optimizer layout leaves the optimizer out, said. */
static int collect_optimizer(megatron_dist *m, dist_tensors *list)
{
    const dcp_checkpoint *dcp = m->dcp;
    int states = 0, buckets = 0, cells = 0, fully = 0, entries = 0;
    const char *other = NULL, *why = NULL;
    for (int i = 0; i < dcp_num_entries(dcp); i++) {
        const dcp_entry *e = dcp_entry_at(dcp, i);
        int chained, model;
        bucket_key key;
        if (!optimizer_key(e->key, &chained)) continue;
        if (!dcp_entry_is_tensor(e)) {
            /* dp_zero_gather_scatter: a pickled distrib_optim.pt per group (sharded_param_state_dp_zero). */
            if (!strncmp(e->key, BUCKET_PREFIX, strlen(BUCKET_PREFIX)) && strstr(e->key, ".param_state/") && !other) {
                other = e->key;
                why = "the distributed optimizer's dp_zero_gather_scatter layout (each group's state a pickle) is not read";
            }
            continue;
        }
        entries++;
        const char *role = state_entry(dcp, e->key, &model);
        if (role) {
            states++;
            fully += !strncmp(e->key, OPTIMIZER_PREFIX "param.", strlen(OPTIMIZER_PREFIX "param."));
        } else if (parse_bucket_key(e->key, &key)) {
            buckets++;
        } else if (!other) {
            other = e->key;
            why = chained ? "several optimizers chained (ChainedOptimizer's chained_N. keys) are not read"
                          : "an optimizer entry of a layout not known";
        }
    }
    m->config.has_optimizer = entries > 0 || other;
    if (!other && states && buckets) {
        other = "optimizer.state.* and optimizer.distributed.*";
        why = "two layouts of the optimizer at once";
    }
    if (other) {
        snprintf(m->optimizer_refusal, sizeof m->optimizer_refusal, "%s: %s", other, why);
        return TP_OK;
    }
    if (!entries) return TP_OK;
    int params = list->count, status = TP_OK;
    if (buckets) {
        bucket_key *keys = calloc((size_t)buckets, sizeof *keys);
        if (!keys) return tp_fail(TP_ERR_NOMEM, "out of memory");
        int n = 0;
        for (int i = 0; i < dcp_num_entries(dcp) && n < buckets; i++)
            if (dcp_entry_is_tensor(dcp_entry_at(dcp, i)) && parse_bucket_key(dcp_entry_at(dcp, i)->key, &keys[n]))
                keys[n++].entry = i;
        status = collect_buckets(m, list, keys, n);
        free(keys);
        m->optimizer_layout = "dp_reshardable";
    } else {
        for (int i = 0; i < dcp_num_entries(dcp) && !status; i++) {
            int model;
            const dcp_entry *e = dcp_entry_at(dcp, i);
            const char *role = dcp_entry_is_tensor(e) ? state_entry(dcp, e->key, &model) : NULL;
            if (role) status = add_state(m, i, model, role, list, &cells);
        }
        m->optimizer_layout = cells ? "fully_sharded_model_space" : fully ? "fully_reshardable" : "model space";
    }
    /* What the common state records, where it does. */
    if (!status && m->recorded_layout[0] && strcmp(m->optimizer_layout, "model space") &&
        strcmp(m->recorded_layout, m->optimizer_layout))
        status = tp_fail(TP_ERR_FORMAT, "%s: the optimizer's state is laid out as %s, the common state records %s", m->path,
                         m->optimizer_layout, m->recorded_layout);
    /* Modules whose order is not known: the optimizer left out, said; the weights are read. */
    if (status == TP_ERR_LAYOUT) {
        snprintf(m->optimizer_refusal, sizeof m->optimizer_refusal, "%s", tp_errmsg());
        list->count = params;
        m->num_pieces = 0;
        m->num_params = 0;
        m->optimizer_layout = NULL;
        return TP_OK;
    }
    if (!status) m->config.optimizer_read = 1;
    return status;
}

static int collect(megatron_dist *m, dist_tensors *list)
{
    const dcp_checkpoint *dcp = m->dcp;
    for (int i = 0; i < dcp_num_entries(dcp); i++) {
        const dcp_entry *e = dcp_entry_at(dcp, i);
        int chained;
        if (dcp_entry_is_tensor(e) && !optimizer_key(e->key, &chained)) /* not _extra_state and other objects */
            TP_TRY(add_key(m, i, i, FROM_CHUNKS, e->key, NULL, list));
    }
    return collect_optimizer(m, list);
}

/* ------------------------------------------------------------- boxes */

/* The boxes of the reader being made, grown as tensors add theirs. */
typedef struct {
    ckpt_foreign_box *items;
    int count, capacity;
} box_list;

/* Adds a box [offsets, offsets + sizes) of t, in its logical coordinates,
 * stored at offset of file row-major, or dense in order (dcp_locate's;
 * NULL: row-major) where that is another. A vocabulary table told its true
 * size (megatron_dist_set_true_vocab) is stored with the rows of Megatron's
 * padding after its tokens' rows: a box's rows past them are left out (the
 * box's leading rows stay where they are in the file). */
static int add_box_in_order(box_list *boxes, const char *where, const ckpt_tensor_desc *t, int file, int64_t offset,
                            const int64_t *offsets, const int64_t *sizes, const int *order)
{
    if (boxes->count > INT32_MAX - 2 * CKPT_MAX_SEGMENTS) return tp_fail(TP_ERR_FORMAT, "%s: too many chunks", where);
    TP_TRY(array_reserve((void **)&boxes->items, &boxes->capacity, boxes->count + CKPT_MAX_SEGMENTS, sizeof *boxes->items));
    int64_t rows[CKPT_MAX_DIMS];
    if (t->partition.kind == CKPT_SPLIT && t->partition.pad_multiple > 0 && t->partition.axis == 0 &&
        offsets[0] + sizes[0] > t->shape[0]) {
        if (offsets[0] >= t->shape[0]) return TP_OK; /* padding only */
        if (order && !dcp_order_is_row_major(order, sizes, t->ndim)) /* its leading rows are not where they were */
            return tp_fail(TP_ERR_FORMAT, "%s: a chunk stored in another order than row-major across the vocabulary's "
                           "padding rows: not read", where);
        memcpy(rows, sizes, (size_t)t->ndim * sizeof *rows);
        rows[0] = t->shape[0] - offsets[0];
        sizes = rows;
    }
    int64_t n;
    ckpt_foreign_box *box = boxes->items + boxes->count;
    TP_TRY(dcp_box_boxes(where, t, file, offset, offsets, sizes, box, &n));
    if (order && !dcp_order_is_row_major(order, sizes, t->ndim)) {
        /* One box that says its order, which the reader reads in slabs and
         * permutes in memory (as formats/dcp.c add_chunk_boxes gives a DCP's). */
        if (n != 1)
            return tp_fail(TP_ERR_FORMAT, "%s: a chunk stored in another order than row-major across the padded "
                           "segments of its tensor: not read", where);
        box->permuted = 1;
        for (int j = 0; j < t->ndim; j++) box->order[j] = order[j];
    }
    boxes->count += (int)n;
    return TP_OK;
}

static int add_box(box_list *boxes, const char *where, const ckpt_tensor_desc *t, int file, int64_t offset,
                   const int64_t *offsets, const int64_t *sizes)
{
    return add_box_in_order(boxes, where, t, file, offset, offsets, sizes, NULL);
}

/* A box of consecutive elements of a row-major block: [start, start +
 * count), its first element the block's element first. */
typedef struct {
    int64_t start[CKPT_MAX_DIMS], count[CKPT_MAX_DIMS], first;
} flat_box;

/* Cuts the elements [a, b) of a row-major block of shape (ndim dims,
 * none 0) into boxes of consecutive elements: the rest of a row, whole
 * rows, the rest of a plane, ..., at most 2 ndim - 1 of them. */
static int flat_boxes(const int64_t *shape, int ndim, int64_t a, int64_t b, flat_box *out)
{
    int64_t stride[CKPT_MAX_DIMS];
    stride[ndim - 1] = 1;
    for (int d = ndim - 2; d >= 0; d--) stride[d] = stride[d + 1] * shape[d + 1];
    int n = 0;
    while (a < b) {
        /* The outermost dimension one step of which starts at a and fits. */
        int d = 0;
        while (d < ndim - 1 && (a % stride[d] || stride[d] > b - a)) d++;
        int64_t at = a / stride[d] % shape[d], steps = (b - a) / stride[d];
        if (steps > shape[d] - at) steps = shape[d] - at;
        flat_box *box = &out[n++];
        for (int k = 0; k < ndim; k++) {
            box->start[k] = a / stride[k] % shape[k];
            box->count[k] = k < d ? 1 : k == d ? steps : shape[k];
        }
        box->first = a;
        a += steps * stride[d];
    }
    return n;
}

/* Adds a box of tensor-parallel rank rank's piece of t at degree tp (in
 * the piece's coordinates, stored row-major at offset of file): in t's
 * logical coordinates, the piece's padding and replicated rows left out
 * (the first rank that holds them is read). */
static int add_piece_box(box_list *boxes, const char *where, const ckpt_tensor_desc *t, int tp, int rank, const flat_box *box,
                         int file, int64_t offset, int64_t elem)
{
    if (t->partition.kind != CKPT_SPLIT) return add_box(boxes, where, t, file, offset, box->start, box->count);
    ckpt_run runs[2 * CKPT_MAX_SEGMENTS];
    int64_t n = ckpt_piece_runs(t, tp, rank, runs, 2 * CKPT_MAX_SEGMENTS);
    if (n < 0) return tp_fail(TP_ERR_FORMAT, "%s: tensor-parallel piece %d of %s at tp %d", where, rank, t->name, tp);
    int axis = t->partition.axis, leading = 1;
    int64_t inner = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (d < axis) leading &= box->count[d] == 1;
        if (d > axis) inner *= box->count[d];
    }
    int64_t lo0 = box->start[axis], hi0 = lo0 + box->count[axis];
    for (int64_t r = 0; r < n; r++) {
        const ckpt_run *run = &runs[r];
        int64_t lo = lo0 > run->local_start ? lo0 : run->local_start;
        int64_t hi = hi0 < run->local_start + run->length ? hi0 : run->local_start + run->length;
        if (run->logical_start < 0 || run->replica || lo >= hi) continue;
        if (!leading && (lo != lo0 || hi != hi0)) /* its part of the run would not be consecutive in the file */
            return tp_fail(TP_ERR_LAYOUT, "%s: %s: a flat range across a cut of dimension %d is not read", where, t->name, axis);
        int64_t start[CKPT_MAX_DIMS], count[CKPT_MAX_DIMS];
        memcpy(start, box->start, sizeof start);
        memcpy(count, box->count, sizeof count);
        start[axis] = run->logical_start + lo - run->local_start;
        count[axis] = hi - lo;
        TP_TRY(add_box(boxes, where, t, file, offset + (lo - lo0) * inner * elem, start, count));
    }
    return TP_OK;
}

/* Where the located chunks' data lie. */
typedef struct {
    const int64_t *located_at;  /* by chunk: its place in data_offset, or -1 */
    const int64_t *data_offset;
    const int64_t *sorted;      /* a bucket entry's chunks by offset, from its chunk_index */
    int (*orders)[TORCH_MAX_DIMS]; /* by place: the order its data is dense in */
} chunk_places;

/* The chunks of a stacked or plain entry, each a box of the tensor (its
 * layer's slice). */
static int boxes_from_chunks(const megatron_dist *m, const dist_tensor *dt, const ckpt_tensor_desc *desc,
                             const chunk_places *at, box_list *boxes)
{
    const dcp_entry *e = dcp_entry_at(m->dcp, dt->entry);
    int skip = dt->layer >= 0; /* the leading layer axis */
    int64_t elem = (int64_t)torch_dtype_size(e->dtype);
    char where[CKPT_PATH_MAX + 600];
    snprintf(where, sizeof where, "%s: %s", m->path, e->key);
    for (int k = 0; k < e->num_chunks; k++) {
        const dcp_chunk *ch = &e->chunks[k];
        if (at->located_at[e->chunk_index + k] < 0) continue;
        if (skip && (dt->layer < ch->offsets[0] || dt->layer >= ch->offsets[0] + ch->sizes[0])) continue;
        int64_t slice = elem; /* bytes of one layer of the chunk */
        for (int d = 1; d < e->ndim; d++) slice *= ch->sizes[d];
        int64_t offset = at->data_offset[at->located_at[e->chunk_index + k]] + (skip ? (dt->layer - ch->offsets[0]) * slice : 0);
        /* The order its data is dense in, of the layer's slice where the
         * entry stacks layers: contiguous only where the layer axis is the
         * outermost in memory (or the chunk holds one layer). */
        const int *stored = at->orders[at->located_at[e->chunk_index + k]];
        int order[TORCH_MAX_DIMS];
        for (int j = 0, n = 0; j < e->ndim; j++)
            if (!skip || stored[j] != 0) order[n++] = stored[j] - skip;
        if (skip && ch->sizes[0] > 1 && stored[0] != 0)
            return tp_fail(TP_ERR_FORMAT, "%s: the chunk at %lld of layers [%lld, %lld) is stored with its layers "
                           "interleaved in memory: a layer's slice is not contiguous", where, (long long)ch->item_offset,
                           (long long)ch->offsets[0], (long long)(ch->offsets[0] + ch->sizes[0]));
        TP_TRY(add_box_in_order(boxes, where, desc, ch->file, offset, ch->offsets + skip, ch->sizes + skip, order));
    }
    return TP_OK;
}

/* fully_sharded_model_space: each chunk (piece index..., a) of [pieces
 * along each dimension..., n] the elements [a, a + size) of that piece of
 * the parameter's entry, flattened. */
static int boxes_from_cells(const megatron_dist *m, const dist_tensor *dt, const ckpt_tensor_desc *desc,
                            const chunk_places *at, box_list *boxes)
{
    const dcp_entry *e = dcp_entry_at(m->dcp, dt->entry), *p = dcp_entry_at(m->dcp, dt->model_entry);
    int ndim = p->ndim, skip = dt->layer >= 0;
    int64_t elem = (int64_t)torch_dtype_size(e->dtype), piece[CKPT_MAX_DIMS];
    char where[CKPT_PATH_MAX + 600];
    snprintf(where, sizeof where, "%s: %s", m->path, e->key);
    for (int d = 0; d < ndim; d++) piece[d] = p->shape[d] / e->shape[d];
    if (skip && piece[0] != 1)
        return tp_fail(TP_ERR_FORMAT, "%s: pieces of %lld layers of the stacked %s", where, (long long)piece[0], p->key);
    for (int k = 0; k < e->num_chunks; k++) {
        const dcp_chunk *ch = &e->chunks[k];
        if (at->located_at[e->chunk_index + k] < 0) continue;
        for (int d = 0; d < ndim; d++)
            if (ch->sizes[d] != 1)
                return tp_fail(TP_ERR_FORMAT, "%s: chunk %d spans %lld pieces along dimension %d (one holds part of one piece)",
                               where, k, (long long)ch->sizes[d], d);
        if (skip && ch->offsets[0] != dt->layer) continue;
        if (!dcp_order_is_row_major(at->orders[at->located_at[e->chunk_index + k]], ch->sizes, e->ndim))
            return tp_fail(TP_ERR_FORMAT, "%s: the chunk at %lld is stored in another order than row-major (its elements "
                           "are read as a flat run)", where, (long long)ch->item_offset);
        int64_t a = ch->offsets[ndim], offset = at->data_offset[at->located_at[e->chunk_index + k]];
        flat_box cut[2 * CKPT_MAX_DIMS];
        int n = flat_boxes(piece, ndim, a, a + ch->sizes[ndim], cut);
        for (int b = 0; b < n; b++) {
            for (int d = 0; d < ndim; d++) cut[b].start[d] += ch->offsets[d] * piece[d];
            TP_TRY(add_box(boxes, where, desc, ch->file, offset + (cut[b].first - a) * elem, cut[b].start + skip,
                           cut[b].count + skip));
        }
    }
    return TP_OK;
}

/* dp_reshardable: each tensor-parallel piece the elements [start, start +
 * its size) of a bucket, in whichever of the bucket's chunks (each
 * data-parallel rank's part of each parameter, and of the padding between
 * them) hold them. */
static int boxes_from_buckets(const megatron_dist *m, const dist_tensor *dt, const ckpt_tensor_desc *desc,
                              const chunk_places *at, box_list *boxes)
{
    int tp = m->config.tp;
    int64_t piece[CKPT_MAX_DIMS], numel = 1;
    ckpt_piece_shape(desc, tp, piece);
    for (int d = 0; d < desc->ndim; d++) numel *= piece[d];
    for (int i = 0; i < dt->num_pieces; i++) {
        const bucket_piece *bp = &m->pieces[dt->first_piece + i];
        const dcp_entry *e = dcp_entry_at(m->dcp, bp->entry);
        int64_t elem = (int64_t)torch_dtype_size(e->dtype), begin = bp->start, end = bp->start + numel;
        char where[CKPT_PATH_MAX + 600];
        snprintf(where, sizeof where, "%s: %s", m->path, e->key);
        if (end > e->shape[0])
            return tp_fail(TP_ERR_FORMAT, "%s: %s's elements [%lld, %lld) lie outside its %lld", where, dt->name,
                           (long long)begin, (long long)end, (long long)e->shape[0]);
        /* The first chunk that ends after begin, by binary search of the chunks sorted by offset. */
        const int64_t *sorted = at->sorted + e->chunk_index;
        int lo = 0, hi = e->num_chunks;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            const dcp_chunk *ch = &e->chunks[sorted[mid] - e->chunk_index];
            if (ch->offsets[0] + ch->sizes[0] <= begin) lo = mid + 1;
            else hi = mid;
        }
        for (int j = lo; j < e->num_chunks; j++) {
            const dcp_chunk *ch = &e->chunks[sorted[j] - e->chunk_index];
            if (ch->offsets[0] >= end) break;
            if (at->located_at[sorted[j]] < 0) continue;
            int64_t x = ch->offsets[0] > begin ? ch->offsets[0] : begin;
            int64_t y = ch->offsets[0] + ch->sizes[0] < end ? ch->offsets[0] + ch->sizes[0] : end;
            if (x >= y) continue;
            int64_t offset = at->data_offset[at->located_at[sorted[j]]];
            flat_box cut[2 * CKPT_MAX_DIMS];
            int n = flat_boxes(piece, desc->ndim, x - begin, y - begin, cut);
            for (int b = 0; b < n; b++)
                TP_TRY(add_piece_box(boxes, where, desc, tp, bp->tp_rank, &cut[b], ch->file,
                                     offset + (cut[b].first + begin - ch->offsets[0]) * elem, elem));
        }
    }
    return TP_OK;
}

/* Reads elements [start, start + n) of a 1-D bucket entry (of its dtype)
 * from the chunks that hold them (one read a chunk); *file_of_first (may be
 * NULL) the data file of element start. */
static int read_bucket_elements(const megatron_dist *m, const chunk_places *at, int entry, int64_t start, int64_t n,
                                void *buffer, int *file_of_first)
{
    const dcp_entry *e = dcp_entry_at(m->dcp, entry);
    const int64_t *sorted = at->sorted + e->chunk_index;
    const int64_t elem = (int64_t)torch_dtype_size(e->dtype);
    unsigned char *out = buffer;
    for (int64_t i = 0; i < n;) {
        int64_t x = start + i;
        int lo = 0, hi = e->num_chunks;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            const dcp_chunk *ch = &e->chunks[sorted[mid] - e->chunk_index];
            if (ch->offsets[0] + ch->sizes[0] <= x) lo = mid + 1;
            else hi = mid;
        }
        const dcp_chunk *ch = lo < e->num_chunks ? &e->chunks[sorted[lo] - e->chunk_index] : NULL;
        if (!ch || ch->offsets[0] > x || at->located_at[sorted[lo]] < 0)
            return tp_fail(TP_ERR_FORMAT, "%s: %s: no chunk holds element %lld", m->path, e->key, (long long)x);
        int64_t take = ch->offsets[0] + ch->sizes[0] - x;
        if (take > n - i) take = n - i;
        if (!i && file_of_first) *file_of_first = ch->file;
        const store_ops *store;
        store_file *file;
        TP_TRY(dcp_open_item_file(m->dcp, ch, &store, &file));
        int status = store->read_at(file, out + i * elem, (size_t)(take * elem),
                                    at->data_offset[at->located_at[sorted[lo]]] + (x - ch->offsets[0]) * elem);
        dcp_close_item_file(m->dcp, ch, store, file);
        TP_TRY(status);
        i += take;
    }
    return TP_OK;
}

/* Megatron keeps a 16-bit parameter as its fp32 main copy rounded, and an
 * fp32 one as that copy itself (DistributedOptimizer.
 * _copy_main_params_to_model_params). Nothing in a dp_reshardable
 * checkpoint records the order of its buffers' parameters, which is taken
 * from the modules args name (megatron_core_chunk_params), and bucket sizes
 * rarely tell a wrong one: the main copies found where that order puts
 * them must round to the weights. Checked on the first elements of the
 * parameters outside the layers and of each model chunk's first layer. */
static int check_main_copies(const megatron_dist *m, const chunk_places *at, ckpt_reader *reader)
{
    const megatron_config *c = &m->config;
    int64_t chunk_layers = c->num_layers / ((int64_t)c->pp * c->vpp);
    for (int p = 0; p < m->num_params; p++) {
        const bucket_piece *copy = &m->main_copies[p];
        const ckpt_tensor_desc *t = &m->tensors.items[p].desc;
        if (copy->entry < 0 || dcp_entry_at(m->dcp, copy->entry)->dtype != TORCH_FLOAT32) continue;
        if (t->anchor == CKPT_ANCHOR_LAYER && t->layer % chunk_layers) continue;
        /* Tensor-parallel rank 0's first elements (at most 8 of a row). */
        int64_t start[CKPT_MAX_DIMS] = {0}, count[CKPT_MAX_DIMS], piece[CKPT_MAX_DIMS];
        int last = t->ndim - 1;
        ckpt_piece_shape(t, c->tp, piece);
        for (int d = 0; d < t->ndim; d++) count[d] = 1;
        int64_t n = piece[last] < 8 ? piece[last] : 8;
        if (t->partition.kind == CKPT_SPLIT) {
            ckpt_run runs[2 * CKPT_MAX_SEGMENTS];
            if (ckpt_piece_runs(t, c->tp, 0, runs, 2 * CKPT_MAX_SEGMENTS) < 1 || runs[0].logical_start < 0 || runs[0].local_start)
                continue;
            start[t->partition.axis] = runs[0].logical_start;
            if (t->partition.axis == last && runs[0].length < n) n = runs[0].length;
        }
        count[last] = n;
        float main[8];
        unsigned char weight[8 * sizeof(float)], rounded[8 * sizeof(float)];
        TP_TRY(ckpt_reader_read_region(reader, p, start, count, weight, sizeof weight));
        TP_TRY(read_bucket_elements(m, at, copy->entry, copy->start, n, main, NULL));
        /* convert_numbers, not convert_from_f32: its target clones do not link under clang's sanitizers */
        convert_numbers(main, TP_FP32, rounded, t->dtype, n);
        if (memcmp(weight, rounded, (size_t)n * tp_dtype_size(t->dtype))) {
            float w[8];
            convert_numbers(weight, t->dtype, w, TP_FP32, n);
            int i = 0;
            while (i < n - 1 && !memcmp(weight + i * tp_dtype_size(t->dtype), rounded + i * tp_dtype_size(t->dtype),
                                        tp_dtype_size(t->dtype)))
                i++;
            return tp_fail(TP_ERR_FORMAT, "%s: the main copy of %s where the order of %s modules (args.transformer_impl) "
                           "puts it in %s is not its weight (element %d: %g, the weight %g): the buffers hold the "
                           "parameters in another order, of other modules than args say", m->path, t->name,
                           c->impl == MEGATRON_IMPL_LOCAL ? "Megatron-Core's local" : "Transformer Engine's",
                           dcp_entry_at(m->dcp, copy->entry)->key, i, (double)main[i], (double)w[i]);
        }
    }
    return TP_OK;
}

typedef struct {
    int64_t offset, chunk;
} chunk_order;

static int compare_chunk_order(const void *a, const void *b)
{
    const chunk_order *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Where the chunks of the entries marked in used lie (1: read by boxes;
 * 2: a bucket, its chunks also sorted by offset for read_bucket_elements),
 * each located once (dcp_locate), with the CRC-32s to check as they are read. */
typedef struct {
    int64_t *chunk, *data_offset, *located_at, *sorted; /* located_at: by chunk, its place in chunk[], or -1 */
    int *chunk_entry;
    int (*orders)[TORCH_MAX_DIMS]; /* by place: the order each one's data is dense in */
    int64_t located;
    ckpt_foreign_check *checks;
    int num_checks;
} chunk_locations;

static void chunk_locations_free(chunk_locations *l)
{
    free(l->chunk);
    free(l->data_offset);
    free(l->located_at);
    free(l->sorted);
    free(l->chunk_entry);
    free(l->orders);
    free(l->checks);
    memset(l, 0, sizeof *l);
}

static int locate_chunks(const megatron_dist *m, const char *used, int threads, chunk_locations *l)
{
    const dcp_checkpoint *dcp = m->dcp;
    int64_t total = 0;
    for (int i = 0; i < dcp_num_entries(dcp); i++) total += dcp_entry_at(dcp, i)->num_chunks;
    l->chunk = calloc((size_t)total + 1, sizeof *l->chunk);
    l->data_offset = calloc((size_t)total + 1, sizeof *l->data_offset);
    l->located_at = calloc((size_t)total + 1, sizeof *l->located_at);
    l->sorted = calloc((size_t)total + 1, sizeof *l->sorted);
    l->chunk_entry = calloc((size_t)total + 1, sizeof *l->chunk_entry);
    int status = l->chunk && l->data_offset && l->located_at && l->sorted && l->chunk_entry
                     ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int64_t k = 0; !status && k < total; k++) l->located_at[k] = -1;
    for (int i = 0; !status && i < dcp_num_entries(dcp); i++) {
        const dcp_entry *e = dcp_entry_at(dcp, i);
        for (int k = 0; used[i] && k < e->num_chunks; k++) {
            int64_t n = 1;
            for (int d = 0; d < e->ndim; d++) n *= e->chunks[k].sizes[d];
            if (!n) continue;
            l->located_at[e->chunk_index + k] = l->located;
            l->chunk[l->located] = e->chunk_index + k;
            l->chunk_entry[l->located++] = i;
        }
        if (used[i] == 2 && e->num_chunks) {
            chunk_order *order = malloc((size_t)e->num_chunks * sizeof *order);
            if (!order) {
                status = tp_fail(TP_ERR_NOMEM, "out of memory");
                break;
            }
            for (int k = 0; k < e->num_chunks; k++) order[k] = (chunk_order){e->chunks[k].offsets[0], e->chunk_index + k};
            qsort(order, (size_t)e->num_chunks, sizeof *order, compare_chunk_order);
            for (int k = 0; k < e->num_chunks; k++) l->sorted[e->chunk_index + k] = order[k].chunk;
            free(order);
        }
    }
    l->checks = status ? NULL : calloc((size_t)l->located + 1, sizeof *l->checks);
    l->orders = status ? NULL : calloc((size_t)l->located + 1, sizeof *l->orders);
    if (!status && (!l->checks || !l->orders)) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!status) status = dcp_locate(dcp, l->located, l->chunk, l->chunk_entry, threads, l->data_offset, l->orders, l->checks);
    /* A chunk dense in another order than row-major (a transposed one) is
     * read as one box in its order by boxes_from_chunks; the distributed
     * optimizer's buckets, read as flat runs of elements, must be row-major. */
    for (int64_t k = 0; !status && k < l->located; k++) {
        const dcp_entry *e = dcp_entry_at(dcp, l->chunk_entry[k]);
        const dcp_chunk *c = &e->chunks[l->chunk[k] - e->chunk_index];
        if (used[l->chunk_entry[k]] == 2 && !dcp_order_is_row_major(l->orders[k], c->sizes, e->ndim))
            status = tp_fail(TP_ERR_FORMAT, "%s: %s: the chunk at %lld is stored in another order than row-major (a "
                             "bucket of the distributed optimizer's is read as a run of elements)", m->path, e->key,
                             (long long)c->item_offset);
    }
    l->num_checks = status ? 0 : dcp_compact_checks(l->checks, l->located);
    if (status) chunk_locations_free(l);
    return status;
}

static int compare_copies(const void *a, const void *b)
{
    const bucket_copy *x = a, *y = b;
    int kx[5] = {x->param, x->role, x->piece, x->head, x->tp_rank}, ky[5] = {y->param, y->role, y->piece, y->head, y->tp_rank};
    for (int i = 0; i < 5; i++)
        if (kx[i] != ky[i]) return kx[i] < ky[i] ? -1 : 1;
    return 0;
}

static const char *const copy_roles[3] = {"master", "exp_avg", "exp_avg_sq"};

/* What a copy that differs holds (as megatron.c's describe_difference says
 * a legacy checkpoint's): the state, the element at its place in the piece,
 * both values and bits, both data files and bucket keys. */
static void describe_bucket_difference(const megatron_dist *m, const bucket_copy *copy, const bucket_copy *read,
                                       int copy_file, int read_file, int64_t element, const unsigned char *copy_bits,
                                       const unsigned char *read_bits, tp_dtype dtype, char *out, size_t size)
{
    const ckpt_tensor_desc *d = &m->tensors.items[copy->param].desc;
    char copy_path[CKPT_PATH_MAX + 64], read_path[CKPT_PATH_MAX + 64], place[200], copy_value[64], read_value[64];
    dcp_file_path(m->dcp, copy_file, copy_path, sizeof copy_path);
    dcp_file_path(m->dcp, read_file, read_path, sizeof read_path);
    int64_t shape[CKPT_MAX_DIMS];
    ckpt_piece_shape(d, m->config.tp, shape);
    ckpt_element_place(shape, NULL, d->ndim, element, place, sizeof place); /* in the piece */
    ckpt_element_text(copy_bits, dtype, copy_value, sizeof copy_value);
    ckpt_element_text(read_bits, dtype, read_value, sizeof read_value);
    char piece[48] = "", rank[48];
    if (copy->head) snprintf(piece, sizeof piece, " of tensor-parallel piece %d", copy->piece);
    snprintf(rank, sizeof rank, copy->head ? "the copy" : "tensor-parallel rank %d's copy", copy->tp_rank);
    snprintf(out, size, "optim/%s/%.120s's %s in the distributed optimizer's buckets: element [%.100s]%s is %s in %.200s "
             "(%.160s, %s), %s in %.200s (%.160s, %s)", copy_roles[copy->role], m->tensors.items[copy->param].name,
             copy->head ? "copy for the tied output layer differs from the first stage's"
                        : "copies differ over the tensor-parallel ranks (the parameter is replicated)",
             place, piece, copy_value, copy_path, dcp_entry_at(m->dcp, copy->entry)->key, rank, read_value, read_path,
             dcp_entry_at(m->dcp, read->entry)->key, read->head || copy->head ? "the one read" : "rank 0's, the one read");
}

int megatron_dist_check_replicas(const megatron_dist *m, int threads, megatron_replica_result *result)
{
    memset(result, 0, sizeof *result);
    if (m->num_copies < 2) return TP_OK;
    bucket_copy *copies = malloc((size_t)m->num_copies * sizeof *copies);
    char *used = calloc((size_t)dcp_num_entries(m->dcp) + 1, 1), *seen = calloc((size_t)m->tensors.count + 1, 1);
    int status = copies && used && seen ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!status) {
        memcpy(copies, m->copies, (size_t)m->num_copies * sizeof *copies);
        /* Each group of copies of one state of one piece together, the one read first (the first stage's, rank 0's). */
        qsort(copies, (size_t)m->num_copies, sizeof *copies, compare_copies);
        for (int k = 0; k < m->num_copies; k++) used[copies[k].entry] = 2;
    }
    chunk_locations where = {0};
    if (!status) status = locate_chunks(m, used, threads, &where);
    chunk_places at = {.located_at = where.located_at, .data_offset = where.data_offset, .sorted = where.sorted,
                       .orders = where.orders};
    enum { BLOCK = 1 << 16 }; /* elements compared at a time */
    unsigned char *a = status ? NULL : malloc((size_t)BLOCK * 8), *b = status ? NULL : malloc((size_t)BLOCK * 8);
    if (!status && (!a || !b)) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int first = 0, next; !status && first < m->num_copies; first = next) {
        const bucket_copy *read = &copies[first];
        for (next = first + 1; next < m->num_copies && copies[next].param == read->param && copies[next].role == read->role &&
                               copies[next].piece == read->piece; next++) {}
        if (next - first < 2) continue;
        const ckpt_tensor_desc *d = &m->tensors.items[read->param].desc;
        int64_t shape[CKPT_MAX_DIMS], numel = 1;
        ckpt_piece_shape(d, m->config.tp, shape);
        for (int x = 0; x < d->ndim; x++) numel *= shape[x];
        torch_dtype dtype = dcp_entry_at(m->dcp, read->entry)->dtype;
        size_t elem = torch_dtype_size(dtype);
        tp_dtype tp_type = TP_FP32;
        torch_dtype_to_tp(dtype, &tp_type);
        result->bytes += numel * (int64_t)elem;
        for (int k = first + 1; k < next && !status; k++) {
            const bucket_copy *copy = &copies[k];
            if (dcp_entry_at(m->dcp, copy->entry)->dtype != dtype)
                status = tp_fail(TP_ERR_FORMAT, "%s: %s is %s, %s %s", m->path, dcp_entry_at(m->dcp, copy->entry)->key,
                                 torch_dtype_name(dcp_entry_at(m->dcp, copy->entry)->dtype),
                                 dcp_entry_at(m->dcp, read->entry)->key, torch_dtype_name(dtype));
            result->copies++;
            result->bytes += numel * (int64_t)elem;
            result->tensors += !(seen[read->param] & 1);
            seen[read->param] |= 1;
            for (int64_t at0 = 0; !status && at0 < numel; at0 += BLOCK) {
                int64_t n = numel - at0 < BLOCK ? numel - at0 : BLOCK;
                int copy_file = 0, read_file = 0;
                status = read_bucket_elements(m, &at, read->entry, read->start + at0, n, a, &read_file);
                if (!status) status = read_bucket_elements(m, &at, copy->entry, copy->start + at0, n, b, &copy_file);
                if (status || !memcmp(a, b, (size_t)n * elem)) continue;
                int64_t e = 0; /* the first element whose bits differ, and the files that hold it */
                while (!memcmp(a + e * (int64_t)elem, b + e * (int64_t)elem, elem)) e++;
                status = read_bucket_elements(m, &at, read->entry, read->start + at0 + e, 1, a, &read_file);
                if (!status) status = read_bucket_elements(m, &at, copy->entry, copy->start + at0 + e, 1, b, &copy_file);
                if (!status && !result->copies_differ)
                    describe_bucket_difference(m, copy, read, copy_file, read_file, at0 + e, b, a, tp_type,
                                               result->first_difference, sizeof result->first_difference);
                result->copies_differ++;
                result->tensors_differ += !(seen[read->param] & 2);
                seen[read->param] |= 2;
                break;
            }
        }
    }
    free(a);
    free(b);
    chunk_locations_free(&where);
    free(copies);
    free(used);
    free(seen);
    return status;
}

int megatron_dist_refuse_differing_copies(const megatron_dist *m, int threads)
{
    megatron_replica_result replicas;
    TP_TRY(megatron_dist_check_replicas(m, threads, &replicas));
    return megatron_replicas_refusal(m->path, &replicas);
}

int megatron_dist_set_true_vocab(megatron_dist *m, int64_t true_vocab)
{
    TP_TRY(megatron_config_set_true_vocab(&m->config, m->path, true_vocab));
    for (int t = 0; t < m->tensors.count; t++)
        if (megatron_is_vocabulary_table(m->tensors.items[t].param))
            megatron_describe_vocabulary(&m->config, &m->tensors.items[t].desc);
    return TP_OK;
}

int megatron_dist_reader_open(const megatron_dist *m, int compute_digests, int threads, ckpt_reader **out)
{
    *out = NULL;
    const dcp_checkpoint *dcp = m->dcp;
    const megatron_config *c = &m->config;
    const dist_tensors *tensors = &m->tensors;
    /* Digests prove an output equal to the copy read: where another copy
     * differs, the checkpoint holds two values and neither is proven. */
    if (compute_digests) TP_TRY(megatron_dist_refuse_differing_copies(m, threads));
    /* Locate every chunk of the entries read, each once. */
    char *used = calloc((size_t)dcp_num_entries(dcp) + 1, 1); /* 1: read; 2: a bucket, its chunks sorted */
    int status = used ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int t = 0; !status && t < tensors->count; t++) {
        const dist_tensor *dt = &tensors->items[t];
        if (dt->source != FROM_BUCKETS) used[dt->entry] = 1;
        for (int i = 0; dt->source == FROM_BUCKETS && i < dt->num_pieces; i++) used[m->pieces[dt->first_piece + i].entry] = 2;
    }
    for (int p = 0; !status && p < m->num_params; p++) /* the main copies checked (fp32 parameters' too) */
        if (m->main_copies[p].entry >= 0) used[m->main_copies[p].entry] = 2;
    chunk_locations where = {0};
    if (!status) status = locate_chunks(m, used, threads, &where);
    ckpt_foreign_check *checks = where.checks;
    int num_checks = where.num_checks;
    /* The boxes of each tensor. */
    box_list boxes = {0};
    int64_t *box_first = status ? NULL : calloc((size_t)tensors->count + 1, sizeof *box_first);
    ckpt_tensor_desc *descs = status ? NULL : calloc((size_t)tensors->count + 1, sizeof *descs);
    if (!status && (!box_first || !descs)) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    chunk_places at = {.located_at = where.located_at, .data_offset = where.data_offset, .sorted = where.sorted,
                       .orders = where.orders};
    for (int t = 0; !status && t < tensors->count; t++) {
        const dist_tensor *dt = &tensors->items[t];
        descs[t] = dt->desc;
        descs[t].name = dt->name;
        descs[t].param = dt->param;
        descs[t].role = dt->role;
        box_first[t] = boxes.count;
        status = dt->source == FROM_CHUNKS  ? boxes_from_chunks(m, dt, &descs[t], &at, &boxes)
                 : dt->source == FROM_CELLS ? boxes_from_cells(m, dt, &descs[t], &at, &boxes)
                                            : boxes_from_buckets(m, dt, &descs[t], &at, &boxes);
    }
    if (!status) box_first[tensors->count] = boxes.count;
    /* The files: the DCP checkpoint's data files. */
    dcp_file_list files = {0};
    if (!status) status = dcp_file_list_make(dcp, &files);
    cJSON *origin = cJSON_CreateObject();
    cJSON_AddStringToObject(origin, "source_format", "megatron-torch-dist");
    cJSON_AddNumberToObject(origin, "checkpoint_version", c->checkpoint_version);
    cJSON_AddStringToObject(origin, "names", megatron_naming_name(c->naming));
    cJSON_AddStringToObject(origin, "optimizer", c->optimizer_read ? "read" : m->optimizer_refusal[0] ? "not read" : "none");
    if (c->optimizer_read) cJSON_AddStringToObject(origin, "optimizer_layout", m->optimizer_layout);
    if (m->optimizer_refusal[0]) cJSON_AddStringToObject(origin, "optimizer_refusal", m->optimizer_refusal);
    /* The layout it was saved at (it is read as whole tensors: tp1pp1). */
    cJSON_AddNumberToObject(origin, "saved_tp", c->tp);
    cJSON_AddNumberToObject(origin, "saved_pp", c->pp);
    char *user = cJSON_PrintUnformatted(origin);
    cJSON_Delete(origin);
    if (!status && !user) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!status && !files.count) status = tp_fail(TP_ERR_FORMAT, "%s: no data files", m->path);
    if (!status) {
        ckpt_foreign source = {.path = m->path,
                               .layout = {.tp = 1, .pp = 1, .dp = 1, .num_layers = c->num_layers},
                               .saved = {c->tp, c->pp, 1, c->num_layers, c->vpp > 1 ? c->vpp : 0},
                               .state = {.step = c->iteration > 0 ? c->iteration : 0,
                                         .consumed_samples = c->consumed_samples,
                                         .user_json = user},
                               .num_tensors = tensors->count,
                               .tensors = descs,
                               .num_files = files.count,
                               .files = files.paths,
                               .file_bytes = files.bytes,
                               .versions = files.versions,
                               .boxes = boxes.items,
                               .box_first = box_first,
                               .checks = checks,
                               .num_checks = num_checks};
        status = ckpt_reader_open_foreign(out, &source, compute_digests);
        if (!status && m->num_params) status = check_main_copies(m, &at, *out);
        if (status) {
            ckpt_reader_close(*out);
            *out = NULL;
        }
    }
    cJSON_free(user);
    dcp_file_list_free(&files);
    free(boxes.items);
    free(box_first);
    free(descs);
    chunk_locations_free(&where);
    free(used);
    return status;
}
