/* megatron_dist.c: Megatron-Core's distributed checkpoints (--ckpt-format
 * torch_dist) read as the canonical tensors of megatron.h (megatron.h
 * megatron_dist_*): metadata.json says the backend, common.pt holds args
 * and the iteration, the tensors are a PyTorch distributed checkpoint
 * (dcp.h) under Megatron-Core's keys. A homogeneous model's layers are
 * stacked along a leading axis (decoder.layers.<module> [layers, ...]); each
 * layer becomes a tensor of its own whose boxes are its slices of the
 * stacked chunks, so that any layer, tensor-parallel and data-parallel
 * chunking reads by boxes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../common/error.h"
#include "../common/json.h"
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

/* One tensor of the reader: a canonical name, and where it comes from: a
 * DCP entry, one layer of it when stacked. */
typedef struct {
    char name[CKPT_NAME_MAX + 1];
    char param[CKPT_NAME_MAX + 1];
    const char *role;
    int entry;
    int64_t layer;   /* the slice of a stacked entry's leading axis, or -1 */
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
    char optimizer_refusal[1024];
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

static void shape_text(const int64_t *shape, int ndim, char *out, size_t size)
{
    int n = snprintf(out, size, "[");
    for (int d = 0; d < ndim && n < (int)size; d++)
        n += snprintf(out + n, size - (size_t)n, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (n < (int)size) snprintf(out + n, size - (size_t)n, "]");
}

/* Megatron-Core's names of the optimizer's states, ours. */
static const char *role_of(const char *state)
{
    if (!strcmp(state, "exp_avg")) return "exp_avg";
    if (!strcmp(state, "exp_avg_sq")) return "exp_avg_sq";
    if (!strcmp(state, "fp32_param")) return "master";
    return NULL;
}

/* Adds the tensor(s) of a model key (the part after optimizer.state.STATE.
 * for the optimizer's, with role): one, or one per layer when stacked. */
static int add_key(const megatron_dist *m, int entry, const char *key, const char *role, dist_tensors *list)
{
    const megatron_config *c = &m->config;
    const dcp_entry *e = dcp_entry_at(m->dcp, entry);
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
        if (status) return tp_fail_context(status, "%s: key %s", m->path, e->key);
        if (kind != MEGATRON_NAME_TENSOR) return TP_OK; /* the tied head's copy; extra state */
        dist_tensor t = {.entry = entry, .layer = stacked ? l : -1, .role = role ? role : "param"};
        snprintf(t.param, sizeof t.param, "%s", canonical);
        int length = role ? snprintf(t.name, sizeof t.name, "optim/%.16s/%.200s", role, canonical)
                          : snprintf(t.name, sizeof t.name, "%.255s", canonical);
        if (length >= (int)sizeof t.name || strlen(canonical) > 200)
            return tp_fail(TP_ERR_FORMAT, "%s: key %s: a name too long", m->path, e->key);
        megatron_describe(c, t.param, &t.desc);
        torch_dtype_to_tp(e->dtype, &t.desc.dtype); /* a tensor entry: one of ours */
        /* The logical shape: the entry's, without the layer axis. */
        int ndim = e->ndim - (stacked ? 1 : 0);
        int same = ndim == t.desc.ndim;
        for (int d = 0; same && d < ndim; d++) same = e->shape[d + (stacked ? 1 : 0)] == t.desc.shape[d];
        if (!same) {
            char got[160], want[160];
            shape_text(e->shape + (stacked ? 1 : 0), ndim, got, sizeof got);
            shape_text(t.desc.shape, t.desc.ndim, want, sizeof want);
            return tp_fail(TP_ERR_FORMAT, "%s: key %s: %s%s, the args make %s %s", m->path, e->key, got,
                           stacked ? " per layer" : "", t.param, want);
        }
        TP_TRY(push(list, &t));
    }
    return TP_OK;
}

/* Every tensor: the model's, and the optimizer's where it is stored in the
 * model's space (optimizer.state.STATE.KEY, shaped as its parameter); any
 * other optimizer layout leaves the optimizer out, said. */
static int collect(megatron_dist *m, dist_tensors *list)
{
    const dcp_checkpoint *dcp = m->dcp;
    int optimizer_entries = 0, model_space = 1;
    for (int i = 0; i < dcp_num_entries(dcp); i++) {
        const dcp_entry *e = dcp_entry_at(dcp, i);
        if (strncmp(e->key, "optimizer.", strlen("optimizer."))) continue;
        if (!dcp_entry_is_tensor(e)) continue;
        optimizer_entries++;
        const char *state = e->key + strlen(OPTIMIZER_PREFIX), *dot = strchr(state, '.');
        char name[64] = "";
        if (!strncmp(e->key, OPTIMIZER_PREFIX, strlen(OPTIMIZER_PREFIX)) && dot && dot - state < (int)sizeof name)
            snprintf(name, sizeof name, "%.*s", (int)(dot - state), state);
        if (!role_of(name) || dcp_find(dcp, dot + 1) < 0) {
            model_space = 0;
            snprintf(m->optimizer_refusal, sizeof m->optimizer_refusal,
                     "the optimizer's state is not stored in the model's space (%s: the distributed optimizer's "
                     "dp_reshardable layout, or another); the weights are read", e->key);
            break;
        }
    }
    m->config.has_optimizer = optimizer_entries > 0;
    m->config.optimizer_read = optimizer_entries > 0 && model_space;
    for (int i = 0; i < dcp_num_entries(dcp); i++) {
        const dcp_entry *e = dcp_entry_at(dcp, i);
        if (!dcp_entry_is_tensor(e)) continue; /* _extra_state and other objects */
        if (strncmp(e->key, "optimizer.", strlen("optimizer."))) {
            TP_TRY(add_key(m, i, e->key, NULL, list));
        } else if (m->config.optimizer_read) {
            const char *state = e->key + strlen(OPTIMIZER_PREFIX), *dot = strchr(state, '.');
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(dot - state), state);
            TP_TRY(add_key(m, i, dot + 1, role_of(name), list));
        }
    }
    return TP_OK;
}

int megatron_dist_reader_open(const megatron_dist *m, int compute_digests, int threads, ckpt_reader **out)
{
    *out = NULL;
    const dcp_checkpoint *dcp = m->dcp;
    const megatron_config *c = &m->config;
    const dist_tensors *tensors = &m->tensors;
    int status = TP_OK;
    /* Locate every chunk of the entries read, each once. */
    int64_t total = 0;
    for (int i = 0; i < dcp_num_entries(dcp); i++) total += dcp_entry_at(dcp, i)->num_chunks;
    int64_t *chunk = calloc((size_t)total + 1, sizeof *chunk), *data_offset = calloc((size_t)total + 1, sizeof *data_offset);
    int64_t *located_at = calloc((size_t)total + 1, sizeof *located_at); /* by chunk: its place in chunk[], or -1 */
    int *chunk_entry = calloc((size_t)total + 1, sizeof *chunk_entry);
    char *used = calloc((size_t)dcp_num_entries(dcp) + 1, 1);
    int64_t located = 0;
    if (!status && (!chunk || !data_offset || !located_at || !chunk_entry || !used))
        status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int64_t k = 0; !status && k < total; k++) located_at[k] = -1;
    for (int t = 0; !status && t < tensors->count; t++) used[tensors->items[t].entry] = 1;
    for (int i = 0; !status && i < dcp_num_entries(dcp); i++) {
        const dcp_entry *e = dcp_entry_at(dcp, i);
        for (int k = 0; used[i] && k < e->num_chunks; k++) {
            int64_t n = 1;
            for (int d = 0; d < e->ndim; d++) n *= e->chunks[k].sizes[d];
            if (!n) continue;
            located_at[e->chunk_index + k] = located;
            chunk[located] = e->chunk_index + k;
            chunk_entry[located++] = i;
        }
    }
    ckpt_foreign_check *checks = status ? NULL : calloc((size_t)located + 1, sizeof *checks);
    if (!status && !checks) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!status) status = dcp_locate(dcp, located, chunk, chunk_entry, threads, data_offset, checks);
    int num_checks = status ? 0 : dcp_compact_checks(checks, located);
    /* The boxes of each tensor: the chunks of its entry, or their slices of its layer. */
    int64_t capacity = 0, num_boxes = 0;
    for (int t = 0; t < tensors->count; t++) capacity += dcp_entry_at(dcp, tensors->items[t].entry)->num_chunks;
    capacity = capacity * CKPT_MAX_SEGMENTS + 1;
    ckpt_foreign_box *boxes = status ? NULL : calloc((size_t)capacity, sizeof *boxes);
    int64_t *box_first = status ? NULL : calloc((size_t)tensors->count + 1, sizeof *box_first);
    ckpt_tensor_desc *descs = status ? NULL : calloc((size_t)tensors->count + 1, sizeof *descs);
    if (!status && (!boxes || !box_first || !descs)) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int t = 0; !status && t < tensors->count; t++) {
        const dist_tensor *dt = &tensors->items[t];
        descs[t] = dt->desc;
        descs[t].name = dt->name;
        descs[t].param = dt->param;
        descs[t].role = dt->role;
        box_first[t] = num_boxes;
        const dcp_entry *e = dcp_entry_at(dcp, dt->entry);
        int skip = dt->layer >= 0; /* the leading layer axis */
        int64_t elem = (int64_t)torch_dtype_size(e->dtype);
        for (int k = 0; k < e->num_chunks && !status; k++) {
            const dcp_chunk *ch = &e->chunks[k];
            if (located_at[e->chunk_index + k] < 0) continue;
            if (skip && (dt->layer < ch->offsets[0] || dt->layer >= ch->offsets[0] + ch->sizes[0])) continue;
            int64_t slice = elem; /* bytes of one layer of the chunk */
            for (int d = 1; d < e->ndim; d++) slice *= ch->sizes[d];
            int64_t offset = data_offset[located_at[e->chunk_index + k]] + (skip ? (dt->layer - ch->offsets[0]) * slice : 0);
            char where[CKPT_PATH_MAX + 600];
            snprintf(where, sizeof where, "%s: %s", m->path, e->key);
            int64_t n;
            status = dcp_box_boxes(where, &descs[t], ch->file, offset, ch->offsets + skip, ch->sizes + skip, boxes + num_boxes, &n);
            num_boxes += n;
        }
    }
    if (!status) box_first[tensors->count] = num_boxes;
    /* The files: the DCP checkpoint's data files. */
    dcp_file_list files = {0};
    if (!status) status = dcp_file_list_make(dcp, &files);
    cJSON *origin = cJSON_CreateObject();
    cJSON_AddStringToObject(origin, "source_format", "megatron-torch-dist");
    cJSON_AddNumberToObject(origin, "checkpoint_version", c->checkpoint_version);
    cJSON_AddStringToObject(origin, "names", megatron_naming_name(c->naming));
    cJSON_AddStringToObject(origin, "optimizer", c->optimizer_read ? "read" : m->optimizer_refusal[0] ? "not read" : "none");
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
                               .layout = {1, 1, 1, c->num_layers},
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
                               .boxes = boxes,
                               .box_first = box_first,
                               .checks = checks,
                               .num_checks = num_checks};
        status = ckpt_reader_open_foreign(out, &source, compute_digests);
    }
    cJSON_free(user);
    dcp_file_list_free(&files);
    free(boxes);
    free(box_first);
    free(descs);
    free(chunk);
    free(data_offset);
    free(checks);
    free(located_at);
    free(chunk_entry);
    free(used);
    return status;
}
