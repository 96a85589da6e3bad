/* dcp.c: PyTorch distributed checkpoints read (dcp.h): `.metadata`
 * interpreted from its pickle (matched by class name, every size and key
 * checked), each chunk located in its item, the whole presented as a
 * foreign ckpt_reader whose pieces are the chunks' boxes. */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "../common/parallel.h"
#include "dcp.h"
#include "dcp_internal.h"

#define KEY_MAX 4096            /* bytes of a state dict key */
#define DESCRIPTION_MAX ((int64_t)256 << 20)
#define CHUNKS_MAX ((int64_t)1 << 26) /* chunks of all tensors: 16,000 ranks x 4,000 tensors */

/* ------------------------------------------------------------ helpers */

int dcp_stat(const char *path, store_stat *st)
{
    const store_ops *store;
    TP_TRY(store_for(path, &store));
    return store->stat(store, path, st);
}

int dcp_detect(const char *path, int *found)
{
    char file[CKPT_PATH_MAX + 16];
    store_stat st;
    *found = 0;
    snprintf(file, sizeof file, "%s/" DCP_METADATA_NAME, path);
    TP_TRY(dcp_stat(file, &st));
    *found = st.exists && !st.is_dir;
    return TP_OK;
}

/* The class name of an object (after the last dot of its class path). */
static const char *class_name(const pickle_value *v)
{
    if (!v || v->kind != PICKLE_OBJECT) return NULL;
    const char *dot = strrchr(v->object.cls, '.');
    return dot ? dot + 1 : v->object.cls;
}

static int is_class(const pickle_value *v, const char *name)
{
    const char *c = class_name(v);
    return c && !strcmp(c, name);
}

static const char *describe(const pickle_value *v)
{
    return v->kind == PICKLE_OBJECT ? v->object.cls : pickle_kind_name(v->kind);
}

/* A string without NUL bytes, of at most max bytes. */
static int string_of(const pickle_value *v, int64_t max, const char **out)
{
    if (!v || v->kind != PICKLE_STRING || (int64_t)strlen(v->text.data) != v->text.size || v->text.size > max)
        return TP_ERR_FORMAT;
    *out = v->text.data;
    return TP_OK;
}

/* A sequence of n integers (a torch.Size, read as a tuple) in [0, 2^40]. */
static int ints_of(const pickle_value *v, int64_t *out, int max, int *n)
{
    if (!v || (v->kind != PICKLE_TUPLE && v->kind != PICKLE_LIST) || v->items.count > max) return TP_ERR_FORMAT;
    for (int64_t i = 0; i < v->items.count; i++) {
        const pickle_value *x = v->items.items[i];
        if (x->kind != PICKLE_INT || x->integer < 0 || x->integer > ((int64_t)1 << 40)) return TP_ERR_FORMAT;
        out[i] = x->integer;
    }
    *n = (int)v->items.count;
    return TP_OK;
}

/* torch.float32 and the other dtypes, as globals "torch.NAME". */
static int dtype_of(const pickle_value *v, torch_dtype *out)
{
    if (!v || v->kind != PICKLE_GLOBAL || strncmp(v->text.data, "torch.", 6)) return TP_ERR_FORMAT;
    for (int d = TORCH_FLOAT32; d <= TORCH_COMPLEX128; d++)
        if (!strcmp(v->text.data + 6, torch_dtype_name((torch_dtype)d))) {
            *out = (torch_dtype)d;
            return TP_OK;
        }
    return TP_ERR_FORMAT;
}

/* ------------------------------------------------------------ metadata */

static int compare_keys(const void *a, const void *b, void *ctx)
{
    const dcp_checkpoint *dcp = ctx;
    return strcmp(dcp->entries[*(const int *)a].key, dcp->entries[*(const int *)b].key);
}

static int compare_names(const void *a, const void *b, void *ctx)
{
    const dcp_checkpoint *dcp = ctx;
    return strcmp(dcp->entries[*(const int *)a].name, dcp->entries[*(const int *)b].name);
}

/* The entry whose string (its key or its name: field, an offset into
 * dcp_entry) is text, found in sorted, n entry indices sorted by it; -1. */
static int find_sorted(const dcp_checkpoint *dcp, const int *sorted, int n, size_t field, const char *text)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        const char *at = *(const char *const *)((const char *)&dcp->entries[sorted[mid]] + field);
        int c = strcmp(at, text);
        if (!c) return sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

int dcp_find(const dcp_checkpoint *dcp, const char *key)
{
    return find_sorted(dcp, dcp->by_key, dcp->num_entries, offsetof(dcp_entry, key), key);
}

int dcp_find_tensor(const dcp_checkpoint *dcp, const char *name)
{
    int found = find_sorted(dcp, dcp->by_name, dcp->num_named, offsetof(dcp_entry, name), name);
    if (found >= 0) return found;
    char key[CKPT_NAME_MAX + 1];
    dcp_key_of(name, key, sizeof key);
    return dcp_find(dcp, key);
}

/* The plain name of a key (dcp_entry.name) into name (CKPT_NAME_MAX + 1
 * bytes): 0 where it would be longer. */
static int plain_name_of(const char *key, char name[CKPT_NAME_MAX + 1])
{
    if (ckpt_name_is_valid(key)) {
        snprintf(name, CKPT_NAME_MAX + 1, "%s", key);
        return 1;
    }
    size_t n = 0;
    for (const unsigned char *c = (const unsigned char *)key; *c; c++) {
        int plain = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' || *c == '_';
        if (n + (plain ? 1 : 3) > CKPT_NAME_MAX) return 0;
        if (plain) name[n++] = (char)*c;
        else n += (size_t)snprintf(name + n, 4, "-%02x", *c);
    }
    name[n] = '\0';
    return ckpt_name_is_valid(name); /* "", ".", "..": no name */
}

/* Every tensor entry's plain name, and the index by name; two keys of one
 * name are refused (a key already written as another's "-hh" form). */
static int name_entries(dcp_checkpoint *dcp)
{
    size_t bytes = 1;
    for (int i = 0; i < dcp->num_entries; i++)
        if (dcp_entry_is_tensor(&dcp->entries[i])) bytes += 3 * strlen(dcp->entries[i].key) + 1;
    dcp->names = malloc(bytes);
    dcp->by_name = calloc((size_t)dcp->num_entries + 1, sizeof *dcp->by_name);
    if (!dcp->names || !dcp->by_name) return tp_fail(TP_ERR_NOMEM, "out of memory");
    char *at = dcp->names, name[CKPT_NAME_MAX + 1];
    for (int i = 0; i < dcp->num_entries; i++) {
        dcp_entry *e = &dcp->entries[i];
        if (!dcp_entry_is_tensor(e) || !plain_name_of(e->key, name)) continue;
        size_t n = strlen(name) + 1;
        memcpy(at, name, n);
        e->name = at;
        at += n;
        dcp->by_name[dcp->num_named++] = i;
    }
    qsort_r(dcp->by_name, (size_t)dcp->num_named, sizeof *dcp->by_name, compare_names, dcp);
    for (int i = 1; i < dcp->num_named; i++) {
        const dcp_entry *a = &dcp->entries[dcp->by_name[i - 1]], *b = &dcp->entries[dcp->by_name[i]];
        if (!strcmp(a->name, b->name))
            return tp_fail(TP_ERR_FORMAT, "%s: the keys '%s' and '%s' are both read as the tensor %s", dcp->metadata_path,
                           a->key, b->key, a->name);
    }
    return TP_OK;
}

/* A tensor entry's dtype, size and chunks (TensorStorageMetadata). */
static int read_tensor_entry(dcp_checkpoint *dcp, const pickle_value *v, dcp_entry *e, int64_t *chunks_used)
{
    const char *where = dcp->metadata_path;
    const pickle_value *props = pickle_get(v, "properties"), *size = pickle_get(v, "size"), *chunks = pickle_get(v, "chunks");
    /* TensorProperties pickles its state as a tuple (dtype, layout, ...) in every release; a dict is read too. */
    const pickle_value *dtype = NULL;
    if (is_class(props, "TensorProperties") && props->object.state) {
        const pickle_value *state = props->object.state;
        dtype = state->kind == PICKLE_TUPLE && state->items.count >= 1 ? state->items.items[0] : pickle_get(props, "dtype");
    }
    if (!dtype || dtype_of(dtype, &e->dtype))
        return tp_fail(TP_ERR_FORMAT, "%s: %s: no dtype this reader knows in its properties", where, e->key);
    if (ints_of(size, e->shape, TORCH_MAX_DIMS, &e->ndim))
        return tp_fail(TP_ERR_FORMAT, "%s: %s: its size is not a sequence of at most %d sizes", where, e->key, TORCH_MAX_DIMS);
    int64_t elements = 1;
    for (int d = 0; d < e->ndim; d++)
        if (__builtin_mul_overflow(elements, e->shape[d], &elements) || elements > CKPT_MAX_ELEMENTS)
            return tp_fail(TP_ERR_FORMAT, "%s: %s: more than 2^50 elements", where, e->key);
    if (!chunks || chunks->kind != PICKLE_LIST)
        return tp_fail(TP_ERR_FORMAT, "%s: %s: chunks are a %s, not a list", where, e->key, chunks ? describe(chunks) : "nothing");
    if (chunks->items.count > dcp->chunk_capacity - *chunks_used) /* counted above: cannot happen */
        return tp_fail(TP_ERR_STATE, "%s: %s: more chunks than counted", where, e->key);
    e->num_chunks = (int)chunks->items.count;
    e->chunk_index = *chunks_used;
    for (int64_t k = 0; k < chunks->items.count; k++) {
        const pickle_value *c = chunks->items.items[k];
        dcp_chunk *ch = &dcp->chunks[*chunks_used + k];
        int n1 = -1, n2 = -1;
        if (!is_class(c, "ChunkStorageMetadata") || ints_of(pickle_get(c, "offsets"), ch->offsets, TORCH_MAX_DIMS, &n1) ||
            ints_of(pickle_get(c, "sizes"), ch->sizes, TORCH_MAX_DIMS, &n2) || n1 != e->ndim || n2 != e->ndim)
            return tp_fail(TP_ERR_FORMAT, "%s: %s: chunk %lld is not offsets and sizes of %d dimensions", where, e->key,
                           (long long)k, e->ndim);
        for (int d = 0; d < e->ndim; d++)
            if (ch->offsets[d] > e->shape[d] || ch->sizes[d] > e->shape[d] - ch->offsets[d])
                return tp_fail(TP_ERR_FORMAT, "%s: %s: chunk %lld spans [%lld, %lld) of dimension %d of size %lld", where, e->key,
                               (long long)k, (long long)ch->offsets[d], (long long)(ch->offsets[d] + ch->sizes[d]), d,
                               (long long)e->shape[d]);
        ch->file = -1;
    }
    *chunks_used += chunks->items.count;
    return TP_OK;
}

/* The data file of that name, added on first sight (names are plain file
 * names in the directory: no '/', nothing hidden). */
static int file_of(dcp_checkpoint *dcp, const char *name, int *out)
{
    for (int f = 0; f < dcp->num_files; f++)
        if (!strcmp(dcp->files[f].name, name)) {
            *out = f;
            return TP_OK;
        }
    if (!*name || strchr(name, '/') || name[0] == '.' || strlen(name) >= sizeof dcp->files[0].name)
        return tp_fail(TP_ERR_FORMAT, "%s: a data file named '%.200s': not a plain file name of the directory", dcp->metadata_path,
                       name);
    if (dcp->num_files == dcp->files_capacity) {
        int capacity = dcp->files_capacity ? 2 * dcp->files_capacity : 16;
        dcp_file_info *grown = realloc(dcp->files, (size_t)capacity * sizeof *grown);
        if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory");
        dcp->files = grown;
        dcp->files_capacity = capacity;
    }
    dcp_file_info *f = &dcp->files[dcp->num_files];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    *out = dcp->num_files++;
    return TP_OK;
}

/* One storage_data item: MetadataIndex(fqn, offset, index) -> _StorageInfo. */
static int read_storage_item(dcp_checkpoint *dcp, const pickle_value *index, const pickle_value *info)
{
    const char *where = dcp->metadata_path, *key, *file;
    if (!is_class(index, "MetadataIndex") || string_of(pickle_get(index, "fqn"), KEY_MAX, &key))
        return tp_fail(TP_ERR_FORMAT, "%s: a storage_data key is a %s, not a MetadataIndex with an fqn", where, describe(index));
    int e = dcp_find(dcp, key);
    if (e < 0) return tp_fail(TP_ERR_FORMAT, "%s: storage for '%s', which state_dict_metadata does not list", where, key);
    dcp_entry *entry = &dcp->entries[e];
    const pickle_value *offset = pickle_get(index, "offset"), *hint = pickle_get(index, "index");
    const pickle_value *path = pickle_get(info, "relative_path"), *at = pickle_get(info, "offset"), *length = pickle_get(info, "length");
    const pickle_value *transforms = pickle_get(info, "transform_descriptors");
    if (!is_class(info, "_StorageInfo") || string_of(path, 255, &file) || !at || at->kind != PICKLE_INT || at->integer < 0 ||
        !length || length->kind != PICKLE_INT || length->integer < 0)
        return tp_fail(TP_ERR_FORMAT, "%s: %s: its storage is a %s, not a _StorageInfo with a path, an offset and a length",
                       where, key, describe(info));
    if (transforms && transforms->kind != PICKLE_NONE &&
        !((transforms->kind == PICKLE_LIST || transforms->kind == PICKLE_TUPLE) && transforms->items.count == 0)) {
        const pickle_value *first = transforms->kind == PICKLE_LIST || transforms->kind == PICKLE_TUPLE ? transforms->items.items[0] : NULL;
        return tp_fail(TP_ERR_FORMAT, "%s: %s: its item is transformed (%s): stream transforms (compression) are not read",
                       where, key, first && first->kind == PICKLE_STRING ? first->text.data : "an extension");
    }
    dcp_chunk *chunk = NULL;
    const dcp_chunk *chunks = dcp->chunks + entry->chunk_index;
    if (entry->kind == DCP_BYTES) {
        chunk = &dcp->chunks[entry->chunk_index];
    } else {
        int64_t offsets[TORCH_MAX_DIMS];
        int n = -1;
        if (ints_of(offset, offsets, TORCH_MAX_DIMS, &n) || n != entry->ndim)
            return tp_fail(TP_ERR_FORMAT, "%s: %s: a storage offset that is not %d sizes", where, key, entry->ndim);
        /* The index hint first, then every chunk. */
        int64_t first = hint && hint->kind == PICKLE_INT && hint->integer >= 0 && hint->integer < entry->num_chunks ? hint->integer : 0;
        for (int64_t k = 0; k < entry->num_chunks && !chunk; k++) {
            int64_t c = (first + k) % entry->num_chunks;
            if (!memcmp(chunks[c].offsets, offsets, sizeof(int64_t) * (size_t)n)) chunk = &dcp->chunks[entry->chunk_index + c];
        }
        if (!chunk) return tp_fail(TP_ERR_FORMAT, "%s: %s: storage for a chunk the tensor does not list", where, key);
    }
    if (chunk->file >= 0) return tp_fail(TP_ERR_FORMAT, "%s: %s: a chunk stored twice", where, key);
    TP_TRY(file_of(dcp, file, &chunk->file));
    chunk->item_offset = at->integer;
    chunk->item_bytes = length->integer;
    return TP_OK;
}

static int64_t chunk_elements(const dcp_entry *e, const dcp_chunk *c)
{
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++) n *= c->sizes[d];
    return n;
}

static int read_metadata(dcp_checkpoint *dcp, const unsigned char *data, int64_t size)
{
    const char *where = dcp->metadata_path;
    pickle_limits limits;
    pickle_limits_init(&limits);
    /* A tree of values takes a few times the pickle's bytes. */
    int64_t memory = ((int64_t)512 << 20) + 16 * size;
    limits.max_memory = memory < ((int64_t)8 << 30) ? memory : (int64_t)8 << 30;
    TP_TRY(pickle_load(data, (size_t)size, where, &limits, &dcp->doc));
    const pickle_value *root = pickle_root(dcp->doc);
    if (!is_class(root, "Metadata"))
        return tp_fail(TP_ERR_FORMAT, "%s: holds a %s, not a distributed checkpoint's Metadata", where, describe(root));
    dcp->torch_version = !strncmp(root->object.cls, "torch.distributed._shard.", 25) ? DCP_TORCH_1_13 : DCP_TORCH_2;
    const pickle_value *sdm = pickle_get(root, "state_dict_metadata"), *storage = pickle_get(root, "storage_data");
    if (!sdm || sdm->kind != PICKLE_DICT)
        return tp_fail(TP_ERR_FORMAT, "%s: state_dict_metadata is a %s, not a dict", where, sdm ? describe(sdm) : "nothing");
    if (!storage || storage->kind != PICKLE_DICT)
        return tp_fail(TP_ERR_FORMAT, "%s: storage_data is a %s, not a dict (a storage layer other than the file system's?)",
                       where, storage ? describe(storage) : "nothing");
    int64_t count = sdm->dict.keys.count;
    /* The chunks listed (a bytes entry has one), counted first: chunks
     * without elements may have no storage item. */
    dcp->chunk_capacity = 1;
    for (int64_t i = 0; i < count; i++) {
        const pickle_value *chunks = pickle_get(sdm->dict.values.items[i], "chunks");
        dcp->chunk_capacity += chunks && chunks->kind == PICKLE_LIST ? chunks->items.count : 1;
    }
    if (dcp->chunk_capacity > CHUNKS_MAX)
        return tp_fail(TP_ERR_FORMAT, "%s: %lld chunks, more than the limit of %lld", where, (long long)dcp->chunk_capacity,
                       (long long)CHUNKS_MAX);
    dcp->entries = calloc((size_t)count + 1, sizeof *dcp->entries);
    dcp->by_key = calloc((size_t)count + 1, sizeof *dcp->by_key);
    dcp->chunks = calloc((size_t)dcp->chunk_capacity, sizeof *dcp->chunks);
    if (!dcp->entries || !dcp->by_key || !dcp->chunks) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int64_t used = 0;
    for (int64_t i = 0; i < count; i++) {
        dcp_entry *e = &dcp->entries[i];
        const pickle_value *value = sdm->dict.values.items[i];
        if (string_of(sdm->dict.keys.items[i], KEY_MAX, &e->key))
            return tp_fail(TP_ERR_FORMAT, "%s: a key of state_dict_metadata is not a string of at most %d bytes", where, KEY_MAX);
        dcp->num_entries = (int)i + 1;
        if (is_class(value, "BytesStorageMetadata")) {
            e->kind = DCP_BYTES;
            e->num_chunks = 1;
            e->chunk_index = used;
            dcp->chunks[used++].file = -1;
        } else if (is_class(value, "TensorStorageMetadata")) {
            e->kind = DCP_TENSOR;
            TP_TRY(read_tensor_entry(dcp, value, e, &used));
        } else {
            return tp_fail(TP_ERR_FORMAT, "%s: %s: a %s, neither tensor nor bytes metadata", where, e->key, describe(value));
        }
    }
    for (int i = 0; i < dcp->num_entries; i++) dcp->by_key[i] = i;
    qsort_r(dcp->by_key, (size_t)dcp->num_entries, sizeof *dcp->by_key, compare_keys, dcp);
    for (int i = 1; i < dcp->num_entries; i++)
        if (!strcmp(dcp->entries[dcp->by_key[i]].key, dcp->entries[dcp->by_key[i - 1]].key))
            return tp_fail(TP_ERR_FORMAT, "%s: the key '%s' twice", where, dcp->entries[dcp->by_key[i]].key);
    TP_TRY(name_entries(dcp));
    for (int64_t i = 0; i < storage->dict.keys.count; i++)
        TP_TRY(read_storage_item(dcp, storage->dict.keys.items[i], storage->dict.values.items[i]));
    for (int i = 0; i < dcp->num_entries; i++) {
        dcp_entry *e = &dcp->entries[i];
        e->chunks = dcp->chunks + e->chunk_index;
        for (int k = 0; k < e->num_chunks; k++)
            if (e->chunks[k].file < 0 && (e->kind == DCP_BYTES || chunk_elements(e, &e->chunks[k]) > 0))
                return tp_fail(TP_ERR_FORMAT, "%s: %s: chunk %d has no storage item", where, e->key, k);
    }
    return TP_OK;
}

/* Every data file is there, and every item lies inside its file. */
static int check_files(dcp_checkpoint *dcp)
{
    for (int f = 0; f < dcp->num_files; f++) {
        char path[CKPT_PATH_MAX + 80];
        store_stat st;
        snprintf(path, sizeof path, "%s/%s", dcp->path, dcp->files[f].name);
        TP_TRY(dcp_stat(path, &st));
        if (!st.exists || st.is_dir)
            return tp_fail(TP_ERR_NOT_FOUND, "%s: data file missing (%s lists items in it)", path, DCP_METADATA_NAME);
        dcp->files[f].bytes = st.size;
    }
    for (int i = 0; i < dcp->num_entries; i++) {
        const dcp_entry *e = &dcp->entries[i];
        for (int k = 0; k < e->num_chunks; k++) {
            const dcp_chunk *c = &e->chunks[k];
            if (c->file < 0) continue;
            int64_t bytes = dcp->files[c->file].bytes;
            if (c->item_offset > bytes || c->item_bytes > bytes - c->item_offset)
                return tp_fail(TP_ERR_FORMAT, "%s/%s: %s: an item of %lld bytes at %lld lies outside the file (%lld bytes)",
                               dcp->path, dcp->files[c->file].name, e->key, (long long)c->item_bytes,
                               (long long)c->item_offset, (long long)bytes);
        }
    }
    return TP_OK;
}

static int make_versions(dcp_checkpoint *dcp)
{
    dcp->versions = calloc(1, sizeof *dcp->versions);
    if (dcp->versions) dcp->versions->of = calloc((size_t)dcp->num_files + 1, sizeof *dcp->versions->of);
    if (!dcp->versions || !dcp->versions->of) return tp_fail(TP_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&dcp->versions->lock, NULL);
    return TP_OK;
}

/* File f's version: "" before its first read. */
static void version_of(const dcp_checkpoint *dcp, int f, char out[DCP_VERSION_MAX])
{
    pthread_mutex_lock(&dcp->versions->lock);
    memcpy(out, dcp->versions->of[f], DCP_VERSION_MAX);
    pthread_mutex_unlock(&dcp->versions->lock);
}

/* Records the version a read of file f saw, if it is the first. (A later
 * read through a handle pinned to it cannot see another: it fails.) */
static void note_version(const dcp_checkpoint *dcp, int f, const char *version)
{
    pthread_mutex_lock(&dcp->versions->lock);
    if (!dcp->versions->of[f][0]) snprintf(dcp->versions->of[f], DCP_VERSION_MAX, "%s", version);
    pthread_mutex_unlock(&dcp->versions->lock);
}

int dcp_open(const char *path, dcp_checkpoint **out)
{
    *out = NULL;
    dcp_checkpoint *dcp = calloc(1, sizeof *dcp);
    if (!dcp) return tp_fail(TP_ERR_NOMEM, "out of memory");
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    int status = n + 16 < sizeof dcp->path ? TP_OK : tp_fail(TP_ERR_ARG, "%.200s...: path too long", path);
    if (!status) {
        snprintf(dcp->path, sizeof dcp->path, "%.*s", (int)n, path);
        snprintf(dcp->metadata_path, sizeof dcp->metadata_path, "%s/" DCP_METADATA_NAME, dcp->path);
    }
    /* What is read must stay: a replacement waits for, or refuses, this reader. */
    if (!status) status = store_hold_shared(dcp->path, &dcp->hold);
    char *data = NULL;
    int64_t size = 0;
    if (!status) status = store_read_file(dcp->metadata_path, DCP_METADATA_MAX, &data, &size);
    dcp->metadata_bytes = size;
    if (!status) status = read_metadata(dcp, (const unsigned char *)data, size);
    free(data);
    if (!status) status = check_files(dcp);
    if (!status) status = make_versions(dcp);
    if (status) {
        dcp_close(dcp);
        return status;
    }
    *out = dcp;
    return TP_OK;
}

void dcp_close(dcp_checkpoint *dcp)
{
    if (!dcp) return;
    pickle_free(dcp->doc);
    free(dcp->entries);
    free(dcp->by_key);
    free(dcp->names);
    free(dcp->by_name);
    free(dcp->chunks);
    free(dcp->files);
    if (dcp->versions && dcp->versions->of) {
        pthread_mutex_destroy(&dcp->versions->lock);
        free(dcp->versions->of);
    }
    free(dcp->versions);
    store_hold_release(dcp->hold);
    free(dcp);
}

dcp_torch_version dcp_torch_version_of(const dcp_checkpoint *dcp)
{
    return dcp->torch_version;
}

const char *dcp_path(const dcp_checkpoint *dcp)
{
    return dcp->path;
}

int dcp_num_entries(const dcp_checkpoint *dcp)
{
    return dcp->num_entries;
}

const dcp_entry *dcp_entry_at(const dcp_checkpoint *dcp, int index)
{
    return index >= 0 && index < dcp->num_entries ? &dcp->entries[index] : NULL;
}

int dcp_entry_is_tensor(const dcp_entry *e)
{
    tp_dtype dtype;
    if (e->kind != DCP_TENSOR || e->ndim < 1 || e->ndim > CKPT_MAX_DIMS || !torch_dtype_to_tp(e->dtype, &dtype)) return 0;
    /* A tensor without elements (a buffer of size 0) is no tensor of this
     * project (every dimension at least 1): an other entry, carried. */
    for (int d = 0; d < e->ndim; d++)
        if (e->shape[d] == 0) return 0;
    return 1;
}

int dcp_entry_is_other(const dcp_entry *e)
{
    return !dcp_entry_is_tensor(e) && strcmp(e->key, DCP_INDEX_KEY);
}

int dcp_num_files(const dcp_checkpoint *dcp)
{
    return dcp->num_files;
}

const char *dcp_file(const dcp_checkpoint *dcp, int i, int64_t *bytes)
{
    if (i < 0 || i >= dcp->num_files) return NULL;
    if (bytes) *bytes = dcp->files[i].bytes;
    return dcp->files[i].name;
}

int64_t dcp_bytes(const dcp_checkpoint *dcp)
{
    int64_t total = dcp->metadata_bytes;
    for (int f = 0; f < dcp->num_files; f++) total += dcp->files[f].bytes;
    return total;
}

void dcp_file_path(const dcp_checkpoint *dcp, int file, char *out, size_t size)
{
    snprintf(out, size, "%s/%s", dcp->path, dcp->files[file].name);
}

int dcp_open_item_file(const dcp_checkpoint *dcp, const dcp_chunk *c, const store_ops **store, store_file **file)
{
    char path[CKPT_PATH_MAX + 80];
    dcp_file_path(dcp, c->file, path, sizeof path);
    TP_TRY(store_for(path, store));
    TP_TRY((*store)->open(*store, path, STORE_OPEN_READ, file));
    char version[DCP_VERSION_MAX];
    version_of(dcp, c->file, version);
    int status = store_file_pin(*store, *file, version);
    if (status) (*store)->close(*file);
    return status;
}

void dcp_close_item_file(const dcp_checkpoint *dcp, const dcp_chunk *c, const store_ops *store, store_file *file)
{
    char version[DCP_VERSION_MAX];
    store_file_version(store, file, version, sizeof version);
    if (version[0]) note_version(dcp, c->file, version);
    store->close(file);
}

int dcp_read_item(const dcp_checkpoint *dcp, const dcp_chunk *c, void *buf)
{
    const store_ops *store;
    store_file *file;
    TP_TRY(dcp_open_item_file(dcp, c, &store, &file));
    int status = c->item_bytes ? store->read_at(file, buf, (size_t)c->item_bytes, c->item_offset) : TP_OK;
    dcp_close_item_file(dcp, c, store, file);
    return status;
}

/* Opens chunk c's item as a torch.save archive, pinned as
 * dcp_open_item_file pins, noting the version its first read saw. */
static int open_item_archive(const dcp_checkpoint *dcp, const dcp_chunk *c, const pickle_limits *limits, torch_archive **out)
{
    char path[CKPT_PATH_MAX + 80], version[DCP_VERSION_MAX];
    dcp_file_path(dcp, c->file, path, sizeof path);
    version_of(dcp, c->file, version);
    TP_TRY(torch_archive_open_range(path, c->item_offset, c->item_bytes, version, limits, out));
    torch_archive_version(*out, version, sizeof version);
    if (version[0]) note_version(dcp, c->file, version);
    return TP_OK;
}

int dcp_file_list_make(const dcp_checkpoint *dcp, dcp_file_list *out)
{
    enum { PATH = CKPT_PATH_MAX + 80 };
    int n = dcp->num_files;
    *out = (dcp_file_list){.count = n};
    out->paths = calloc((size_t)n + 1, sizeof *out->paths);
    out->versions = calloc((size_t)n + 1, sizeof *out->versions);
    out->bytes = calloc((size_t)n + 1, sizeof *out->bytes);
    out->text = calloc((size_t)n + 1, PATH + DCP_VERSION_MAX);
    int status = out->paths && out->versions && out->bytes && out->text ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int f = 0; !status && f < n; f++) {
        char *path = out->text + (size_t)f * (PATH + DCP_VERSION_MAX), *version = path + PATH;
        dcp_file_path(dcp, f, path, PATH);
        out->paths[f] = path;
        out->versions[f] = version;
        out->bytes[f] = dcp->files[f].bytes;
        version_of(dcp, f, version);
        const store_ops *store;
        status = store_for(path, &store);
        if (status || version[0] || !store->version || !dcp->files[f].bytes) continue;
        /* Not read yet, on a store of versions: its first byte pins it. */
        dcp_chunk first = {.file = f, .item_offset = 0, .item_bytes = 1};
        unsigned char byte;
        status = dcp_read_item(dcp, &first, &byte);
        version_of(dcp, f, version);
    }
    if (status) dcp_file_list_free(out);
    return status;
}

void dcp_file_list_free(dcp_file_list *list)
{
    free(list->paths);
    free(list->versions);
    free(list->bytes);
    free(list->text);
    *list = (dcp_file_list){0};
}

int dcp_read_bytes(const dcp_checkpoint *dcp, int entry, int64_t max, void **data, int64_t *size)
{
    *data = NULL;
    const dcp_entry *e = dcp_entry_at(dcp, entry);
    if (!e || e->kind != DCP_BYTES) return tp_fail(TP_ERR_ARG, "%s: entry %d is not a bytes entry", dcp->path, entry);
    const dcp_chunk *c = &e->chunks[0];
    if (c->item_bytes > max)
        return tp_fail(TP_ERR_FORMAT, "%s: %s: %lld bytes, more than the limit of %lld", dcp->path, e->key,
                       (long long)c->item_bytes, (long long)max);
    void *buf = malloc((size_t)c->item_bytes + 1);
    if (!buf) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int status = dcp_read_item(dcp, c, buf);
    if (status) {
        free(buf);
        return tp_fail_context(status, "%s", e->key);
    }
    *data = buf;
    *size = c->item_bytes;
    return TP_OK;
}

int dcp_has_description(const dcp_checkpoint *dcp)
{
    int e = dcp_find(dcp, DCP_INDEX_KEY);
    return e >= 0 && dcp->entries[e].kind == DCP_BYTES;
}

/* The description carried (a torch.save archive of one string), parsed. */
static int read_description(const dcp_checkpoint *dcp, ckpt_description **out)
{
    *out = NULL;
    const dcp_entry *e = &dcp->entries[dcp_find(dcp, DCP_INDEX_KEY)];
    const dcp_chunk *c = &e->chunks[0];
    if (c->item_bytes > DESCRIPTION_MAX)
        return tp_fail(TP_ERR_FORMAT, "%s: %s: %lld bytes, more than the limit of %lld", dcp->path, DCP_INDEX_KEY,
                       (long long)c->item_bytes, (long long)DESCRIPTION_MAX);
    char where[CKPT_PATH_MAX + 120];
    snprintf(where, sizeof where, "%s: %s", dcp->path, DCP_INDEX_KEY);
    torch_archive *a;
    TP_TRY(open_item_archive(dcp, c, NULL, &a));
    const char *text;
    int status = string_of(torch_archive_root(a), DESCRIPTION_MAX, &text)
                     ? tp_fail(TP_ERR_FORMAT, "%s: holds a %s, not a text", where, describe(torch_archive_root(a)))
                     : ckpt_description_parse(text, where, out);
    torch_archive_close(a);
    return status;
}

/* ------------------------------------------------------------ the reader */

typedef struct {
    const dcp_checkpoint *dcp;
    const int64_t *chunk;   /* per chunk to locate: its index in dcp->chunks */
    const int *chunk_entry; /* and its entry */
    int64_t *data_offset;   /* out: where its data starts in its file */
    int (*orders)[TORCH_MAX_DIMS]; /* out (NULL: row-major only): the order its data is dense in */
    ckpt_foreign_check *checks; /* out (may be NULL): its data's zip entry and recorded CRC-32 */
} locate_job;

/* Opens chunk k's item, a torch.save archive of one tensor, and finds its
 * data: of the entry's dtype, the chunk's sizes, contiguous (or dense in
 * any order, where the job takes orders). */
static int locate_chunk(void *ctx, int64_t k, int thread)
{
    (void)thread;
    locate_job *job = ctx;
    const dcp_checkpoint *dcp = job->dcp;
    const dcp_chunk *c = &dcp->chunks[job->chunk[k]];
    const dcp_entry *e = &dcp->entries[job->chunk_entry[k]];
    char path[CKPT_PATH_MAX + 80];
    dcp_file_path(dcp, c->file, path, sizeof path);
    pickle_limits limits;
    pickle_limits_init(&limits);
    limits.max_memory = (int64_t)16 << 20; /* a tensor's pickle is a few hundred bytes */
    torch_archive *a;
    int status = open_item_archive(dcp, c, &limits, &a);
    if (status) return tp_fail_context(status, "%s: the item at %lld", e->key, (long long)c->item_offset);
    const pickle_value *t = torch_archive_root(a);
    int64_t offset = 0, bytes = 0, want = chunk_elements(e, c) * (int64_t)torch_dtype_size(e->dtype);
    int same = t->kind == PICKLE_TENSOR && t->tensor->ndim == e->ndim && t->tensor->storage->storage.dtype == e->dtype;
    for (int d = 0; same && d < e->ndim; d++) same = t->tensor->shape[d] == c->sizes[d];
    if (!same)
        status = tp_fail(TP_ERR_FORMAT, "%s: %s: the item at %lld holds a %s, not the chunk's %s tensor of %d dimensions", path,
                         e->key, (long long)c->item_offset, t->kind == PICKLE_TENSOR ? "tensor of another dtype or shape" : describe(t),
                         torch_dtype_name(e->dtype), e->ndim);
    else if (job->orders ? !torch_tensor_dense_order(t, job->orders[k]) : !torch_tensor_is_contiguous(t)) {
        char strides[256];
        ckpt_shape_text(t->tensor->stride, t->tensor->ndim, strides, sizeof strides);
        status = tp_fail(TP_ERR_FORMAT, "%s: %s: the chunk at %lld is stored with strides %s, %s", path, e->key,
                         (long long)c->item_offset, strides,
                         job->orders ? "which overlap or leave gaps: its elements cannot be read exactly"
                                     : "not row-major");
    }
    if (!status && job->orders) status = torch_tensor_dense_range(a, t, &offset, &bytes);
    else if (!status) status = torch_tensor_range(a, t, &offset, &bytes);
    if (!status && bytes != want)
        status = tp_fail(TP_ERR_FORMAT, "%s: %s: the chunk at %lld holds %lld bytes, its sizes say %lld", path, e->key,
                         (long long)c->item_offset, (long long)bytes, (long long)want);
    torch_storage_entry entry;
    if (!status && job->checks) status = torch_tensor_storage_entry(a, t, &entry);
    if (!status && job->checks)
        job->checks[k] = entry.recorded ? (ckpt_foreign_check){c->file, entry.offset, entry.size, entry.crc32, e->key}
                                        : (ckpt_foreign_check){.bytes = -1};
    torch_archive_close(a);
    job->data_offset[k] = offset;
    return status;
}

int dcp_locate(const dcp_checkpoint *dcp, int64_t n, const int64_t *chunk, const int *chunk_entry, int threads,
               int64_t *data_offset, int (*orders)[TORCH_MAX_DIMS], ckpt_foreign_check *checks)
{
    locate_job job = {dcp, chunk, chunk_entry, data_offset, orders, checks};
    return parallel_for(n, threads > 0 ? threads : parallel_cpu_count(), locate_chunk, &job);
}

int dcp_order_is_row_major(const int *order, const int64_t *sizes, int ndim)
{
    for (int j = 1; j < ndim && sizes[order[j]] > 1; j++)
        if (order[j - 1] > order[j]) return 0;
    return 1;
}

int dcp_compact_checks(ckpt_foreign_check *checks, int64_t n)
{
    int kept = 0;
    for (int64_t k = 0; k < n; k++)
        if (checks[k].bytes >= 0) checks[kept++] = checks[k];
    return kept;
}

/* A tensor's description: the carried one, or a plain one. */
static int describe_plainly(const dcp_entry *e, ckpt_tensor_desc *t)
{
    memset(t, 0, sizeof *t);
    if (!e->name)
        return tp_fail(TP_ERR_FORMAT, "key %s: no tensor name of at most %d characters reads it (each byte outside "
                       "[A-Za-z0-9._] written -hh)", e->key, CKPT_NAME_MAX);
    t->name = e->name;
    t->role = "param";
    torch_dtype_to_tp(e->dtype, &t->dtype);
    t->ndim = e->ndim;
    memcpy(t->shape, e->shape, sizeof(int64_t) * (size_t)e->ndim);
    t->partition.kind = CKPT_REPLICATED;
    t->anchor = CKPT_ANCHOR_FIRST;
    ckpt_tensor_copy check;
    int status = ckpt_tensor_copy_init(&check, t);
    return status ? tp_fail_context(status, "key %s", e->key) : TP_OK;
}

static tp_dtype tp_dtype_of(torch_dtype dtype)
{
    tp_dtype out = TP_FP32;
    torch_dtype_to_tp(dtype, &out);
    return out;
}

/* The carried description's tensor against the entry that holds it. */
static int check_described(const dcp_checkpoint *dcp, const ckpt_tensor_desc *t, const dcp_entry *e)
{
    int same = e->kind == DCP_TENSOR && dcp_entry_is_tensor(e) && tp_dtype_of(e->dtype) == t->dtype && e->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = e->shape[d] == t->shape[d];
    if (!same)
        return tp_fail(TP_ERR_FORMAT, "%s: %s: the description carried says a %s tensor of %d dimensions [%lld, ...], the "
                       "checkpoint holds a %s one of %d [%lld, ...]", dcp->path, e->key, tp_dtype_name(t->dtype), t->ndim,
                       (long long)t->shape[0], e->kind == DCP_TENSOR ? torch_dtype_name(e->dtype) : "bytes", e->ndim,
                       (long long)(e->ndim ? e->shape[0] : 0));
    return TP_OK;
}

int dcp_box_boxes(const char *where, const ckpt_tensor_desc *t, int file, int64_t data_offset, const int64_t *offsets,
                  const int64_t *sizes, ckpt_foreign_box *boxes, int64_t *n)
{
    ckpt_foreign_box box = {.file = file, .offset = data_offset};
    for (int d = 0; d < t->ndim; d++) {
        box.start[d] = offsets[d];
        box.count[d] = sizes[d];
    }
    *n = 0;
    int64_t padded[CKPT_MAX_DIMS];
    ckpt_padded_shape(t, 1, padded);
    int axis = t->partition.axis;
    if (t->partition.kind != CKPT_SPLIT || padded[axis] == t->shape[axis] || sizes[axis] == 0) {
        boxes[(*n)++] = box;
        return TP_OK;
    }
    ckpt_run runs[CKPT_MAX_SEGMENTS];
    int64_t m = ckpt_partition_runs(t, 1, offsets[axis], sizes[axis], runs, CKPT_MAX_SEGMENTS);
    if (m < 0) return tp_fail(TP_ERR_FORMAT, "%s: a chunk outside its tensor", where);
    if (m == 1) { /* inside one segment: only where it starts moves */
        box.start[axis] = runs[0].local_start;
        boxes[(*n)++] = box;
        return TP_OK;
    }
    if (axis != 0) /* its rows would not be contiguous in the file */
        return tp_fail(TP_ERR_LAYOUT, "%s: a chunk across the padded segments of dimension %d (only dimension 0 is cut)",
                       where, axis);
    int64_t row_bytes = (int64_t)tp_dtype_size(t->dtype);
    for (int d = 1; d < t->ndim; d++) row_bytes *= sizes[d];
    for (int64_t k = 0; k < m; k++) {
        ckpt_foreign_box b = box;
        b.start[0] = runs[k].local_start;
        b.count[0] = runs[k].length;
        b.offset = data_offset + (runs[k].logical_start - offsets[0]) * row_bytes;
        boxes[(*n)++] = b;
    }
    return TP_OK;
}

/* Runs of a chunk stored dense in another order than row-major that a
 * checkpoint's reader takes at most, each a box (about 190 bytes): such a
 * chunk across the padded segments of its tensor is read a run at a time. */
#define DENSE_RUNS_MAX ((int64_t)1 << 20)

static int reserve_boxes(const char *where, ckpt_foreign_box **boxes, int64_t num_boxes, int64_t *capacity)
{
    if (num_boxes + CKPT_MAX_SEGMENTS <= *capacity) return TP_OK;
    ckpt_foreign_box *grown = realloc(*boxes, (size_t)(2 * *capacity) * sizeof **boxes);
    if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory for the boxes of %s", where);
    *boxes = grown;
    *capacity *= 2;
    return TP_OK;
}

/* Adds the boxes of chunk c of entry e, described by t, whose data starts
 * at data_offset dense in order (torch_tensor_dense_order): those of
 * dcp_box_boxes where that is row-major. A chunk stored in another order
 * (a transposed [R, C] one, strides (1, R): order (1, 0); channels_last
 * [N, C, H, W]: (0, 2, 3, 1)) is one box that says its order
 * (ckpt_foreign_box.permuted): the reader reads it in slabs of whole
 * stored runs and permutes them in memory, at about a row-major box's
 * speed. Only where its tensor's padded segments cut it (dcp_box_boxes
 * gives more than one box, each at an offset only row-major data has) is
 * it one box per run of the dimensions innermost in memory that are in
 * row-major order too, the others stepped over (a transposed chunk: C
 * boxes of [R, 1]), slow (a read and a copy per element of a box's
 * column); runs counts those boxes against DENSE_RUNS_MAX. */
static int add_chunk_boxes(const char *where, const ckpt_tensor_desc *t, const dcp_entry *e, const dcp_chunk *c,
                           int64_t data_offset, const int *order, ckpt_foreign_box **boxes, int64_t *num_boxes,
                           int64_t *capacity, int64_t *runs)
{
    int m = 0; /* dimensions of more than one element: order's first */
    while (m < e->ndim && c->sizes[order[m]] > 1) m++;
    int inner = m > 0 ? m - 1 : 0; /* the first of the innermost run in row-major order */
    while (inner > 0 && order[inner - 1] < order[inner]) inner--;
    int64_t stride[TORCH_MAX_DIMS] = {0}, count = 1, step = 1;
    for (int j = m - 1; j >= 0; j--) {
        stride[order[j]] = step;
        step *= c->sizes[order[j]];
        if (j < inner) count *= c->sizes[order[j]];
    }
    int64_t n;
    TP_TRY(reserve_boxes(where, boxes, *num_boxes, capacity));
    if (count > 1) { /* not row-major: one box in its order, unless cut */
        ckpt_foreign_box *box = *boxes + *num_boxes;
        TP_TRY(dcp_box_boxes(where, t, c->file, data_offset, c->offsets, c->sizes, box, &n));
        if (n == 1) {
            box->permuted = 1;
            for (int j = 0; j < e->ndim; j++) box->order[j] = order[j];
            (*num_boxes)++;
            return TP_OK;
        }
        memset(box, 0, (size_t)n * sizeof *box);
    }
    if (count > 1 && count > DENSE_RUNS_MAX - *runs) {
        char strides[256];
        ckpt_shape_text(stride, e->ndim, strides, sizeof strides);
        return tp_fail(TP_ERR_FORMAT, "%s: the chunk at %lld is stored with strides %s across padded segments: %lld "
                       "runs to read, more than the %lld runs of such chunks a checkpoint is read in", where,
                       (long long)c->item_offset, strides, (long long)count, (long long)DENSE_RUNS_MAX);
    }
    if (count > 1) *runs += count;
    int64_t index[TORCH_MAX_DIMS] = {0}; /* along the dimensions stepped over, order[0..inner) */
    for (int64_t r = 0; r < count; r++) {
        int64_t offsets[TORCH_MAX_DIMS], sizes[TORCH_MAX_DIMS], at = 0;
        memcpy(offsets, c->offsets, sizeof offsets);
        memcpy(sizes, c->sizes, sizeof sizes);
        for (int j = 0; j < inner; j++) {
            offsets[order[j]] += index[order[j]];
            sizes[order[j]] = 1;
            at += index[order[j]] * stride[order[j]];
        }
        TP_TRY(reserve_boxes(where, boxes, *num_boxes, capacity));
        TP_TRY(dcp_box_boxes(where, t, c->file, data_offset + at * (int64_t)torch_dtype_size(e->dtype), offsets, sizes,
                             *boxes + *num_boxes, &n));
        *num_boxes += n;
        for (int j = inner - 1; j >= 0 && ++index[order[j]] == c->sizes[order[j]]; j--) index[order[j]] = 0;
    }
    return TP_OK;
}

int dcp_reader_open(const dcp_checkpoint *dcp, int compute_digests, int threads, ckpt_reader **out)
{
    *out = NULL;
    ckpt_description *description = NULL;
    if (dcp_has_description(dcp)) TP_TRY(read_description(dcp, &description));
    int n = 0;
    for (int i = 0; i < dcp->num_entries; i++) n += dcp_entry_is_tensor(&dcp->entries[i]);
    if (description && ckpt_description_count(description) != n) {
        int count = ckpt_description_count(description);
        ckpt_description_free(description);
        return tp_fail(TP_ERR_FORMAT, "%s: the description carried lists %d tensors, the checkpoint holds %d", dcp->path, count,
                       n);
    }
    ckpt_tensor_desc *descs = calloc((size_t)n + 1, sizeof *descs);
    int *entry = calloc((size_t)n + 1, sizeof *entry);
    uint64_t *digests = calloc((size_t)n + 1, sizeof *digests);
    unsigned char *used = calloc((size_t)dcp->num_entries + 1, 1); /* entries described */
    int64_t total_chunks = 0;
    int status = descs && entry && digests && used ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0, k = 0; !status && i < (description ? n : dcp->num_entries); i++) {
        if (description) {
            descs[i] = *ckpt_description_tensor(description, i);
            digests[i] = ckpt_description_digest(description, i);
            entry[i] = dcp_find_tensor(dcp, descs[i].name);
            if (entry[i] >= 0 && used[entry[i]]++) {
                status = tp_fail(TP_ERR_FORMAT, "%s: the description carried lists %s twice", dcp->path,
                                 dcp->entries[entry[i]].key);
                continue;
            }
            if (entry[i] < 0)
                status = tp_fail(TP_ERR_FORMAT, "%s: the description carried lists %s, which is not there", dcp->path,
                                 descs[i].name);
            else status = check_described(dcp, &descs[i], &dcp->entries[entry[i]]);
            if (!status) total_chunks += dcp->entries[entry[i]].num_chunks;
            continue;
        }
        if (!dcp_entry_is_tensor(&dcp->entries[i])) continue;
        entry[k] = i;
        status = describe_plainly(&dcp->entries[i], &descs[k]);
        total_chunks += dcp->entries[i].num_chunks;
        k++;
    }
    /* Locate every chunk with data, in parallel: an item's archive each. */
    int64_t *chunk = calloc((size_t)total_chunks + 1, sizeof *chunk), *data_offset = calloc((size_t)total_chunks + 1, sizeof *data_offset);
    int *chunk_entry = calloc((size_t)total_chunks + 1, sizeof *chunk_entry);
    int (*orders)[TORCH_MAX_DIMS] = calloc((size_t)total_chunks + 1, sizeof *orders);
    ckpt_foreign_check *checks = calloc((size_t)total_chunks + 1, sizeof *checks);
    int64_t located = 0, runs = 0;
    if (!status && (!chunk || !data_offset || !chunk_entry || !orders || !checks))
        status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; !status && i < n; i++) {
        const dcp_entry *e = &dcp->entries[entry[i]];
        for (int k = 0; k < e->num_chunks; k++)
            if (chunk_elements(e, &e->chunks[k]) > 0) {
                chunk[located] = e->chunk_index + k;
                chunk_entry[located++] = entry[i];
            }
    }
    if (!status) status = dcp_locate(dcp, located, chunk, chunk_entry, threads, data_offset, orders, checks);
    int num_checks = status ? 0 : dcp_compact_checks(checks, located);
    /* The boxes: a chunk may become one per segment it spans, most one
     * (grown as they come: room for every chunk's 16 was 2.3 KB a chunk). */
    int64_t box_capacity = located + CKPT_MAX_SEGMENTS, num_boxes = 0;
    ckpt_foreign_box *boxes = status ? NULL : malloc((size_t)box_capacity * sizeof *boxes);
    int64_t *box_first = status ? NULL : calloc((size_t)n + 1, sizeof *box_first);
    if (!status && (!boxes || !box_first)) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0, at = 0; !status && i < n; i++) {
        box_first[i] = num_boxes;
        const dcp_entry *e = &dcp->entries[entry[i]];
        for (; at < located && chunk_entry[at] == entry[i] && !status; at++) {
            char where[CKPT_PATH_MAX + KEY_MAX + 8];
            snprintf(where, sizeof where, "%s: %s", dcp->path, e->key);
            status = add_chunk_boxes(where, &descs[i], e, &dcp->chunks[chunk[at]], data_offset[at], orders[at], &boxes,
                                     &num_boxes, &box_capacity, &runs);
        }
    }
    if (!status) box_first[n] = num_boxes;
    dcp_file_list files = {0};
    if (!status) status = dcp_file_list_make(dcp, &files);
    if (!status) {
        ckpt_layout layout = {1, 1, 1, 1, 1};
        ckpt_train_state state = {0};
        if (description) {
            layout.num_layers = ckpt_description_layout(description)->num_layers;
            state = *ckpt_description_state(description);
        }
        /* A plain description anchors nothing to layers: one, on the first stage. */
        ckpt_foreign source = {.path = dcp->path, .layout = layout, .state = state, .num_tensors = n, .tensors = descs,
                               .num_files = files.count, .files = files.paths, .file_bytes = files.bytes,
                               .versions = files.versions, .boxes = boxes, .box_first = box_first,
                               .digests = description ? digests : NULL, .checks = checks, .num_checks = num_checks};
        if (dcp->num_files == 0) status = tp_fail(TP_ERR_FORMAT, "%s: no data files", dcp->path);
        else status = ckpt_reader_open_foreign(out, &source, compute_digests);
    }
    dcp_file_list_free(&files);
    free(boxes);
    free(box_first);
    free(chunk);
    free(chunk_entry);
    free(data_offset);
    free(orders);
    free(checks);
    free(descs);
    free(entry);
    free(digests);
    free(used);
    ckpt_description_free(description);
    return status;
}

/* ------------------------------------------------------------ verify */

int dcp_check_item(const dcp_checkpoint *dcp, const dcp_chunk *c)
{
    unsigned char start[4] = {0};
    const store_ops *store;
    store_file *file;
    TP_TRY(dcp_open_item_file(dcp, c, &store, &file));
    int status = c->item_bytes >= 4 ? store->read_at(file, start, 4, c->item_offset) : TP_OK;
    dcp_close_item_file(dcp, c, store, file);
    if (status || memcmp(start, "PK\003\004", 4)) return status;
    pickle_limits limits;
    pickle_limits_init(&limits);
    limits.max_memory = (int64_t)64 << 20;
    torch_archive *a;
    TP_TRY(open_item_archive(dcp, c, &limits, &a));
    torch_archive_check_result checked = {0, 0};
    status = torch_archive_check(a, &checked, NULL, NULL);
    torch_archive_close(a);
    return status;
}

typedef struct {
    const dcp_checkpoint *dcp;
    const dcp_chunk **items;
    const char **keys;
    void (*on_bytes)(void *ctx, int64_t bytes);
    void *ctx;
    dcp_verify_result *result;
    pthread_mutex_t lock;
} verify_job;

static int verify_item(void *ctx, int64_t k, int thread)
{
    (void)thread;
    verify_job *job = ctx;
    const dcp_chunk *c = job->items[k];
    char path[CKPT_PATH_MAX + 80];
    dcp_file_path(job->dcp, c->file, path, sizeof path);
    /* A bytes entry need not be an archive (a planner of its own may write
     * raw bytes): one that does not start as a zip is counted unchecked. */
    unsigned char start[4] = {0};
    const store_ops *store;
    store_file *file;
    TP_TRY(dcp_open_item_file(job->dcp, c, &store, &file));
    int status = c->item_bytes >= 4 ? store->read_at(file, start, 4, c->item_offset) : TP_OK;
    dcp_close_item_file(job->dcp, c, store, file);
    if (status) return status;
    if (memcmp(start, "PK\003\004", 4)) {
        pthread_mutex_lock(&job->lock);
        job->result->items++;
        job->result->unchecked++;
        pthread_mutex_unlock(&job->lock);
        if (job->on_bytes) job->on_bytes(job->ctx, c->item_bytes);
        return TP_OK;
    }
    torch_archive *a;
    pickle_limits limits;
    pickle_limits_init(&limits);
    limits.max_memory = (int64_t)64 << 20;
    status = open_item_archive(job->dcp, c, &limits, &a);
    torch_archive_check_result checked = {0, 0};
    int damaged = 0;
    if (!status) {
        status = torch_archive_check(a, &checked, job->on_bytes, job->ctx);
        if (status == TP_ERR_CHECKSUM) {
            damaged = 1;
            pthread_mutex_lock(&job->lock);
            if (!job->result->damaged)
                snprintf(job->result->first_damage, sizeof job->result->first_damage, "%s (item at %lld): %s",
                         job->keys[k], (long long)c->item_offset, tp_errmsg());
            pthread_mutex_unlock(&job->lock);
            status = TP_OK;
        }
        torch_archive_close(a);
    }
    if (status) return tp_fail_context(status, "%s", job->keys[k]);
    pthread_mutex_lock(&job->lock);
    job->result->items++;
    job->result->entries += checked.entries;
    job->result->unchecked += checked.unchecked;
    job->result->damaged += damaged;
    pthread_mutex_unlock(&job->lock);
    return TP_OK;
}

static int by_file_then_offset(const void *a, const void *b)
{
    const dcp_chunk *x = *(const dcp_chunk *const *)a, *y = *(const dcp_chunk *const *)b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->item_offset < y->item_offset ? -1 : x->item_offset > y->item_offset;
}

/* Bytes of the data files that no item covers (a tail, gaps): verify
 * reads the items only, and says so rather than count them as checked.
 * sorted: room for n items, sorted here. */
static int64_t bytes_in_no_item(const dcp_checkpoint *dcp, const dcp_chunk *const *chunks, const dcp_chunk **items,
                                int64_t n)
{
    memcpy(items, chunks, (size_t)n * sizeof *items);
    qsort(items, (size_t)n, sizeof *items, by_file_then_offset);
    int64_t covered = 0;
    for (int64_t k = 0; k < n;) {
        int file = items[k]->file;
        int64_t end = 0; /* of the union so far, in this file */
        for (; k < n && items[k]->file == file; k++) {
            int64_t from = items[k]->item_offset > end ? items[k]->item_offset : end;
            int64_t to = items[k]->item_offset + items[k]->item_bytes;
            if (to > from) covered += to - from;
            if (to > end) end = to;
        }
    }
    int64_t outside = dcp_bytes(dcp) - dcp->metadata_bytes - covered;
    return outside > 0 ? outside : 0;
}

int dcp_verify(const dcp_checkpoint *dcp, int threads, void (*on_bytes)(void *ctx, int64_t bytes), void *ctx,
               dcp_verify_result *result)
{
    memset(result, 0, sizeof *result);
    int64_t n = 0;
    for (int i = 0; i < dcp->num_entries; i++)
        for (int k = 0; k < dcp->entries[i].num_chunks; k++) n += dcp->entries[i].chunks[k].file >= 0;
    const dcp_chunk **items = calloc((size_t)n + 1, sizeof *items), **sorted = calloc((size_t)n + 1, sizeof *sorted);
    const char **keys = calloc((size_t)n + 1, sizeof *keys);
    if (!items || !keys || !sorted) {
        free(items);
        free(sorted);
        free(keys);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    n = 0;
    for (int i = 0; i < dcp->num_entries; i++)
        for (int k = 0; k < dcp->entries[i].num_chunks; k++)
            if (dcp->entries[i].chunks[k].file >= 0) {
                items[n] = &dcp->entries[i].chunks[k];
                keys[n++] = dcp->entries[i].key;
            }
    for (int64_t k = 0; k < n; k++) result->item_bytes += items[k]->item_bytes;
    result->outside_bytes = bytes_in_no_item(dcp, items, sorted, n);
    verify_job job = {dcp, items, keys, on_bytes, ctx, result, PTHREAD_MUTEX_INITIALIZER};
    int status = parallel_for(n, threads > 0 ? threads : parallel_cpu_count(), verify_item, &job);
    free(items);
    free(sorted);
    free(keys);
    return status;
}

void dcp_key_of(const char *name, char *key, size_t size)
{
    snprintf(key, size, "%s", name);
    for (char *c = key; *c; c++)
        if (*c == '/') *c = '.';
}
