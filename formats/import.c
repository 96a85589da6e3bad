/* import.c: safetensors files, checked against the format's rules, and their
 * tensors written into a sharded checkpoint.
 *
 * Files are mapped read-only. Each target tensor is one task: its pieces are
 * filled slab by slab (whole checksum blocks, about 8 MiB) straight from the
 * mapping, through the partition's element runs (ckpt_piece_element_runs),
 * converting and, for transposed sources, gathering with strided moves;
 * then the tensor's pages are dropped from memory. So memory stays at a slab
 * per thread plus the pages of the tensors in flight. The conversion counts
 * the sources' NaNs and infinities as it goes (convert_numbers_counting),
 * and a source holding any is refused before the commit. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/file.h"
#include "../common/json.h"
#include "../common/memory.h"
#include "../common/parallel.h"
#include "../store/store.h"
#include "formats.h"
#include "../kernels/kernels.h"

#define SLAB_TARGET_BYTES ((int64_t)8 << 20)

typedef struct {
    char path[4096];
    int64_t size, data_start; /* data_start: 8 + header length */
    void *map;
} st_file;

typedef struct {
    safetensors_info info;
    int file;
    int64_t begin, end; /* data_offsets, relative to the file's data */
} st_tensor;

struct safetensors_set {
    st_file *files;
    int num_files;
    st_tensor *tensors;
    int count, capacity;
    char where[4200]; /* where a missing tensor is said missing: the index, or the one file */
    cJSON *metadata;  /* __metadata__ of the first file, or NULL */
    char *names;      /* every tensor name, one block */
    int *by_name;     /* tensor indices in name order, for lookups */
    char warning[4200 + 512]; /* safetensors_warning: the index path and one sentence, or "" */
};

void import_options_init(import_options *o)
{
    memset(o, 0, sizeof *o);
}

/* Sizes of every safetensors dtype, so that any valid file parses. */
static const struct {
    const char *name;
    int size;
} st_dtypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
                 {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};

/* By offsets, as the reference reader orders them: an empty tensor at the
 * offset where another begins comes first. */
static int by_begin(const void *a, const void *b)
{
    const st_tensor *const *x = a, *const *y = b;
    if ((*x)->begin != (*y)->begin) return (*x)->begin < (*y)->begin ? -1 : 1;
    return (*x)->end < (*y)->end ? -1 : (*x)->end > (*y)->end ? 1 : 0;
}

/* A nonnegative integer that fits int64 and a double exactly. */
static int json_int(const cJSON *v, int64_t *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != floor(v->valuedouble))
        return -1;
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* One of a tensor's data_offsets (which: "begin" or "end"), bytes into the
 * data after the header (data_bytes of them). cJSON reads a number as a
 * double, whose integers are exact below 2^53 (8 PiB, past any file): an
 * offset at or beyond it cannot be placed, and is said as past the data
 * with the value read, rather than as begin > end. */
static int parse_offset(const char *path, const char *tensor, const cJSON *v, const char *which, int64_t data_bytes,
                        int64_t *out)
{
    if (!cJSON_IsNumber(v))
        return tp_fail(TP_ERR_FORMAT, "%s: tensor %s: data_offsets %s is not a number (data_offsets are [begin, end], "
                       "byte offsets into the data)", path, tensor, which);
    double x = v->valuedouble;
    if (x < 0 || x != floor(x))
        return tp_fail(TP_ERR_FORMAT, "%s: tensor %s: data_offsets %s %.17g is not a nonnegative integer", path, tensor,
                       which, x);
    if (x >= 9007199254740992.0) {
        if (x > (double)data_bytes)
            return tp_fail(TP_ERR_FORMAT, "%s: tensor %s: data_offsets %s %.0f lies past the end of the data, which "
                           "holds %lld bytes (and at or beyond 2^53, where a JSON number stops holding integers "
                           "exactly)", path, tensor, which, x, (long long)data_bytes);
        return tp_fail(TP_ERR_FORMAT, "%s: tensor %s: data_offsets %s %.0f is at or beyond 2^53, where a JSON number "
                       "stops holding integers exactly", path, tensor, which, x);
    }
    *out = (int64_t)x;
    return TP_OK;
}

static int add_tensor(safetensors_set *set, const st_tensor *t)
{
    if (set->count == set->capacity) {
        int capacity = set->capacity ? 2 * set->capacity : 64;
        st_tensor *grown = realloc(set->tensors, (size_t)capacity * sizeof *grown);
        if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory");
        set->tensors = grown;
        set->capacity = capacity;
    }
    set->tensors[set->count++] = *t;
    return TP_OK;
}

/* One tensor entry of a header. */
static int parse_entry(safetensors_set *set, int file, const cJSON *item, st_tensor *t)
{
    const char *path = set->files[file].path;
    memset(t, 0, sizeof *t);
    t->file = file;
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsObject(item) || !cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offsets) ||
        cJSON_GetArraySize(offsets) != 2)
        return tp_fail(TP_ERR_FORMAT, "%s: tensor %s: expected {\"dtype\", \"shape\", \"data_offsets\": [begin, end]}",
                            path, item->string);
    int size = 0;
    for (size_t k = 0; k < sizeof st_dtypes / sizeof st_dtypes[0]; k++)
        if (strcmp(dtype->valuestring, st_dtypes[k].name) == 0) {
            size = st_dtypes[k].size;
            t->info.dtype_name = st_dtypes[k].name;
        }
    if (!size) return tp_fail(TP_ERR_FORMAT, "%s: tensor %s: unknown dtype '%s'", path, item->string, dtype->valuestring);
    t->info.supported = !strcmp(t->info.dtype_name, "F32") || !strcmp(t->info.dtype_name, "BF16") ||
                        !strcmp(t->info.dtype_name, "F16");
    t->info.dtype = !strcmp(t->info.dtype_name, "BF16") ? TP_BF16 : !strcmp(t->info.dtype_name, "F16") ? TP_FP16 : TP_FP32;
    t->info.ndim = cJSON_GetArraySize(shape);
    if (t->info.ndim > CKPT_MAX_DIMS)
        return tp_fail(TP_ERR_FORMAT, "%s: tensor %s has %d dimensions, at most %d are supported", path,
                            item->string, t->info.ndim, CKPT_MAX_DIMS);
    int64_t bytes = size;
    for (int d = 0; d < t->info.ndim; d++) {
        if (json_int(cJSON_GetArrayItem(shape, d), &t->info.shape[d]))
            return tp_fail(TP_ERR_FORMAT, "%s: tensor %s: shape entry %d is not a nonnegative integer", path,
                                item->string, d);
        if (t->info.shape[d] > 0 && bytes > INT64_MAX / 2 / t->info.shape[d])
            return tp_fail(TP_ERR_FORMAT, "%s: tensor %s: shape too large", path, item->string);
        bytes *= t->info.shape[d];
    }
    int64_t data_bytes = set->files[file].size - set->files[file].data_start;
    TP_TRY(parse_offset(path, item->string, cJSON_GetArrayItem(offsets, 0), "begin", data_bytes, &t->begin));
    TP_TRY(parse_offset(path, item->string, cJSON_GetArrayItem(offsets, 1), "end", data_bytes, &t->end));
    if (t->end < t->begin)
        return tp_fail(TP_ERR_FORMAT, "%s: tensor %s: data_offsets [%lld, %lld] must be [begin, end] with begin <= end",
                       path, item->string, (long long)t->begin, (long long)t->end);
    if (t->end - t->begin != bytes)
        return tp_fail(TP_ERR_FORMAT, "%s: tensor %s: %s of %s shape needs %lld bytes, data_offsets [%lld, %lld] hold %lld",
                            path, item->string, t->info.dtype_name, t->info.ndim ? "its" : "scalar", (long long)bytes,
                            (long long)t->begin, (long long)t->end, (long long)(t->end - t->begin));
    t->info.name = item->string; /* owned by the header, kept until close */
    t->info.file = path;
    return TP_OK;
}

/* Where the first invalid UTF-8 of a header lies, for its message: the
 * JSON string holding it (a tensor name, a key deeper down, or a value),
 * from its opening quote. Valid JSON puts every byte past ASCII inside a
 * string; outside one, the byte itself is shown. */
static int refuse_invalid_utf8(const char *path, const char *text, size_t length, size_t bad)
{
    size_t start = bad, depth = 0;
    int in_string = 0;
    for (size_t i = 0; i < bad; i++) {
        if (in_string) {
            if (text[i] == '\\') i++;
            else if (text[i] == '"') in_string = 0;
        } else if (text[i] == '"') {
            in_string = 1;
            start = i;
        } else if (text[i] == '{' || text[i] == '[') {
            depth++;
        } else if ((text[i] == '}' || text[i] == ']') && depth > 0) {
            depth--;
        }
    }
    if (!in_string) start = bad;
    size_t end = start + 1; /* past the closing quote, or the end of the text */
    while (in_string && end < length && text[end] != '"') end += text[end] == '\\' ? 2 : 1;
    if (end > length) end = length;
    size_t after = end + 1;
    while (after < length && (text[after] == ' ' || text[after] == '\n' || text[after] == '\r' || text[after] == '\t'))
        after++;
    int key = in_string && after < length && text[after] == ':';
    const char *what = !in_string ? "a byte" : key && depth == 1 ? "the tensor name" : key ? "the key" : "the string";
    size_t shown = in_string ? end - start - 1 : 1;
    char escaped[4 * 96 + 1];
    tp_text_escape(text + (in_string ? start + 1 : start), shown < 96 ? shown : 96, escaped, sizeof escaped);
    return tp_fail(TP_ERR_FORMAT, "%s: %s \"%s%s\" at byte %lld of the file is not valid UTF-8 (byte %lld, 0x%02x): a "
                   "header is UTF-8 JSON, and the reference reader refuses this one", path, what, escaped,
                   shown > 96 ? "..." : "", (long long)(8 + (in_string ? start + 1 : start)), (long long)(8 + bad),
                   (unsigned char)text[bad]);
}

/* Parses and checks one file; its tensors join the set. headers keeps the
 * parsed JSON alive (the names point into it). */
static int parse_file(safetensors_set *set, int file, cJSON **header_out)
{
    st_file *f = &set->files[file];
    int fd;
    TP_TRY(tp_open_regular(f->path, &fd));
    struct stat st;
    uint64_t length = 0;
    int status = TP_OK;
    char *text = NULL;
    if (fstat(fd, &st) != 0) status = tp_fail(TP_ERR_IO, "%s: %s", f->path, strerror(errno));
    else if (st.st_size < 8)
        status = tp_fail(TP_ERR_FORMAT, "%s: %lld bytes: too short for the 8-byte header length (truncated?)",
                              f->path, (long long)st.st_size);
    else if (pread(fd, &length, 8, 0) != 8) status = tp_fail(TP_ERR_IO, "%s: cannot read: %s", f->path, strerror(errno));
    else if (length > SAFETENSORS_MAX_HEADER)
        status = tp_fail(TP_ERR_FORMAT, "%s: header length %llu exceeds the format's limit of %llu bytes (not a safetensors file?)",
                              f->path, (unsigned long long)length, (unsigned long long)SAFETENSORS_MAX_HEADER);
    else if ((int64_t)length > st.st_size - 8)
        status = tp_fail(TP_ERR_FORMAT, "%s: header length %llu runs past the end of the %lld-byte file (truncated?)",
                              f->path, (unsigned long long)length, (long long)st.st_size);
    else if (!(text = malloc(length + 1))) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    else if (pread(fd, text, length, 8) != (ssize_t)length)
        status = tp_fail(TP_ERR_IO, "%s: cannot read the header: %s", f->path, strerror(errno));
    if (!status) {
        f->size = st.st_size;
        f->data_start = 8 + (int64_t)length;
        if (st.st_size > 0) {
            f->map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
            if (f->map == MAP_FAILED) {
                f->map = NULL;
                status = tp_fail(TP_ERR_IO, "%s: cannot map: %s", f->path, strerror(errno));
            }
        }
    }
    close(fd);
    cJSON *header = NULL;
    if (!status) {
        text[length] = '\0';
        /* After the object only padding (spaces, as the reference writer pads) may
         * follow; a name holding a NUL (\u0000), read as its prefix, is refused. */
        int64_t bad = tp_utf8_invalid_at(text, length);
        if (bad >= 0) status = refuse_invalid_utf8(f->path, text, length, (size_t)bad);
        else status = tp_json_parse(text, length, f->path, &header);
        if (!status && !cJSON_IsObject(header))
            status = tp_fail(TP_ERR_FORMAT, "%s: the header is not a JSON object", f->path);
    }
    free(text);
    *header_out = header;
    if (status) return status;
    int first = set->count;
    const cJSON *item;
    cJSON_ArrayForEach(item, header)
    {
        if (strcmp(item->string, "__metadata__") == 0) {
            const cJSON *v;
            int strings = cJSON_IsObject(item);
            cJSON_ArrayForEach(v, item) strings = strings && cJSON_IsString(v);
            if (!strings)
                return tp_fail(TP_ERR_FORMAT, "%s: __metadata__ must map strings to strings", f->path);
            if (!set->metadata) set->metadata = cJSON_Duplicate(item, 1);
            continue;
        }
        st_tensor t;
        status = parse_entry(set, file, item, &t);
        if (!status) status = add_tensor(set, &t);
        if (status) return status;
    }
    /* The data must be covered exactly: contiguous, in some order, from 0. */
    int n = set->count - first;
    st_tensor **order = malloc((size_t)(n + 1) * sizeof *order);
    if (!order) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) order[i] = &set->tensors[first + i];
    qsort(order, (size_t)n, sizeof *order, by_begin);
    int64_t covered = 0, data = f->size - f->data_start;
    for (int i = 0; i < n && !status; i++) {
        /* Past the end first: a gap up to it would name bytes the file lacks. */
        if (order[i]->end > data)
            status = tp_fail(TP_ERR_FORMAT, "%s: tensor %s [%lld, %lld) runs past the end of the data, which holds %lld "
                             "bytes (truncated?)", f->path, order[i]->info.name, (long long)order[i]->begin,
                             (long long)order[i]->end, (long long)data);
        else if (order[i]->begin < covered)
            status = tp_fail(TP_ERR_FORMAT, "%s: tensor %s [%lld, %lld) overlaps tensor %s [%lld, %lld)", f->path,
                                  order[i]->info.name, (long long)order[i]->begin, (long long)order[i]->end,
                                  order[i - 1]->info.name, (long long)order[i - 1]->begin, (long long)order[i - 1]->end);
        else if (order[i]->begin > covered)
            status = tp_fail(TP_ERR_FORMAT, "%s: bytes [%lld, %lld) of the data belong to no tensor (before %s)",
                                  f->path, (long long)covered, (long long)order[i]->begin, order[i]->info.name);
        covered = order[i]->end;
    }
    free(order);
    if (!status && covered != data) /* covered < data: every tensor ends within it */
        status = tp_fail(TP_ERR_FORMAT, "%s: the tensors cover %lld bytes of data, the file holds %lld (trailing bytes)",
                         f->path, (long long)covered, (long long)data);
    return status;
}

void safetensors_close(safetensors_set *set)
{
    if (!set) return;
    for (int f = 0; f < set->num_files; f++)
        if (set->files[f].map) munmap(set->files[f].map, (size_t)set->files[f].size);
    free(set->files);
    free(set->tensors);
    free(set->names);
    free(set->by_name);
    cJSON_Delete(set->metadata);
    free(set);
}


/* model.safetensors.index.json, parsed. */
static int read_index(const char *path, cJSON **out)
{
    char *text = NULL;
    int64_t size = 0;
    *out = NULL;
    int status = store_read_text_file(path, CKPT_INDEX_MAX_BYTES, &text, &size);
    if (status) return status;
    status = tp_json_parse(text, (size_t)size, path, out);
    if (!status && !cJSON_IsObject(*out))
        status = tp_fail(TP_ERR_FORMAT, "%s: not a JSON object (damaged or truncated?)", path);
    free(text);
    return status;
}

static const safetensors_set *sorting_set;
static int by_tensor_name(const void *a, const void *b)
{
    return strcmp(sorting_set->tensors[*(const int *)a].info.name, sorting_set->tensors[*(const int *)b].info.name);
}

typedef struct {
    const char *name, *file;
} map_entry;

static int by_entry_name(const void *a, const void *b)
{
    return strcmp(((const map_entry *)a)->name, ((const map_entry *)b)->name);
}

/* The index lists exactly the tensors of the files, each in its own file
 * (a name twice in the weight map is refused by tp_json_parse). */
static int check_weight_map(const safetensors_set *set, const cJSON *index, const char *index_path)
{
    const cJSON *weight_map = cJSON_GetObjectItemCaseSensitive(index, "weight_map"), *entry;
    int n = cJSON_GetArraySize(weight_map), k = 0;
    map_entry *entries = malloc((size_t)(n + 1) * sizeof *entries);
    if (!entries) return tp_fail(TP_ERR_NOMEM, "out of memory");
    cJSON_ArrayForEach(entry, weight_map) entries[k++] = (map_entry){entry->string, entry->valuestring};
    qsort(entries, (size_t)n, sizeof *entries, by_entry_name);
    int status = TP_OK, i = 0, j = 0;
    while (!status && (i < n || j < set->count)) {
        const safetensors_info *t = j < set->count ? &set->tensors[set->by_name[j]].info : NULL;
        int order = i >= n ? 1 : !t ? -1 : strcmp(entries[i].name, t->name);
        if (order < 0)
            status = tp_fail(TP_ERR_FORMAT, "%s: tensor %s is listed in %s but missing from it", index_path,
                                  entries[i].name, entries[i].file);
        else if (order > 0)
            status = tp_fail(TP_ERR_FORMAT, "%s: tensor %s of %s is not in the index", index_path, t->name, t->file);
        else if (strcmp(strrchr(t->file, '/') + 1, entries[i].file) != 0)
            status = tp_fail(TP_ERR_FORMAT, "%s: tensor %s is listed in %s but missing from it", index_path,
                                  entries[i].name, entries[i].file);
        i++;
        j++;
    }
    free(entries);
    return status;
}

/* The index's metadata.total_size against the shards. No reader checks it
 * (transformers' get_checkpoint_shard_files passes the metadata on
 * untouched) and writers count it differently: huggingface_hub sums each
 * distinct storage's bytes (a tensor viewing part of a larger storage counts
 * all of it), transformers' older shard_checkpoint a bool's element as 1/8
 * byte, mlx-examples' save_weights (2024) the shard files' sizes, headers
 * included. The tensors themselves are checked against the weight map and
 * each shard's header, so a total_size that matches neither the tensors'
 * bytes nor the files' is said as a warning, not refused: it is the trace
 * of an index from another copy of the model (another dtype, a shard
 * replaced) as much as of another way of counting. Absent: nothing said. */
static void check_total_size(safetensors_set *set, const cJSON *index, const char *index_path)
{
    const cJSON *metadata = cJSON_GetObjectItemCaseSensitive(index, "metadata");
    const cJSON *total = cJSON_IsObject(metadata) ? cJSON_GetObjectItemCaseSensitive(metadata, "total_size") : NULL;
    if (!total) return;
    int64_t tensor_bytes = 0, file_bytes = 0;
    for (int f = 0; f < set->num_files; f++) {
        tensor_bytes += set->files[f].size - set->files[f].data_start; /* covered exactly by its tensors (parse_file) */
        file_bytes += set->files[f].size;
    }
    if (!cJSON_IsNumber(total) || total->valuedouble < 0) {
        snprintf(set->warning, sizeof set->warning, "%s: metadata.total_size is not a byte count; the shards' tensors "
                 "hold %lld bytes (it was not used: each tensor was checked against its shard's header)", index_path,
                 (long long)tensor_bytes);
        return;
    }
    if (total->valuedouble == (double)tensor_bytes || total->valuedouble == (double)file_bytes) return;
    snprintf(set->warning, sizeof set->warning, "%s: metadata.total_size says %.17g bytes, but the %d shards' tensors "
             "hold %lld (their files %lld): an index of another copy of the model (another dtype, a shard replaced?) "
             "or of a writer that counts otherwise; each tensor was read as its shard's header says", index_path,
             total->valuedouble, set->num_files, (long long)tensor_bytes, (long long)file_bytes);
}

typedef struct {
    const char *file;
    int order; /* of first appearance in the weight map */
} file_use;

static int by_file_then_order(const void *a, const void *b)
{
    const file_use *x = a, *y = b;
    int c = strcmp(x->file, y->file);
    return c ? c : x->order - y->order;
}

static int by_order(const void *a, const void *b)
{
    return ((const file_use *)a)->order - ((const file_use *)b)->order;
}

/* The files a weight map names, each once, in order of first appearance,
 * appended to names as dir/file: sorted, not compared pairwise (an index of
 * 60,000 files took 48 s that way). */
static int add_shard_names(const char *dir, const char *index_path, const cJSON *map, cJSON *names)
{
    int n = cJSON_GetArraySize(map), k = 0, kept = 0, status = TP_OK;
    file_use *uses = malloc((size_t)(n + 1) * sizeof *uses);
    if (!uses) return tp_fail(TP_ERR_NOMEM, "out of memory reading %s", index_path);
    const cJSON *entry;
    cJSON_ArrayForEach(entry, map)
    {
        if (!cJSON_IsString(entry) || strchr(entry->valuestring, '/') || !entry->valuestring[0]) {
            status = tp_fail(TP_ERR_FORMAT, "%s: tensor %s maps to no plain file name", index_path, entry->string);
            break;
        }
        uses[k] = (file_use){entry->valuestring, k};
        k++;
    }
    if (!status) {
        qsort(uses, (size_t)k, sizeof *uses, by_file_then_order);
        for (int i = 0; i < k; i++)
            if (i == 0 || strcmp(uses[i].file, uses[i - 1].file) != 0) uses[kept++] = uses[i];
        qsort(uses, (size_t)kept, sizeof *uses, by_order);
    }
    for (int i = 0; !status && i < kept; i++) {
        char file[4200];
        snprintf(file, sizeof file, "%s/%s", dir, uses[i].file);
        cJSON *name = cJSON_CreateString(file);
        if (!name || !cJSON_AddItemToArray(names, name)) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    free(uses);
    return status;
}

static int ends_with(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    return n >= k && strcmp(name + n - k, suffix) == 0;
}

/* How a directory that holds neither model.safetensors nor the index
 * differs from a model directory, said as what it holds: this toolkit's
 * checkpoint or run, PyTorch pickles (transformers' older default), shards
 * whose index is gone, GGUF files. */
static int refuse_model_dir(const char *dir)
{
    ckpt_dir_kind kind;
    ckpt_candidate newest;
    if (ckpt_run_dir_kind(dir, &kind, &newest) == TP_OK && kind != CKPT_DIR_FREE)
        return tp_fail(TP_ERR_FORMAT, "%s is %s, not a Hugging Face model directory: it needs no import (tp-reshard %s "
                       "--to tpTppP -o OUT changes its layout; tp-ckpt export writes safetensors)", dir,
                       kind == CKPT_DIR_RUN ? "a run directory of this toolkit's checkpoints" : "already this toolkit's checkpoint",
                       kind == CKPT_DIR_RUN ? newest.path : dir);
    /* A directory ckpt_run_dir_kind cannot list is said below, by opendir. */
    DIR *d = opendir(dir);
    if (!d) return tp_fail(errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    char pickle[256] = "", shards[600] = "", gguf[256] = "";
    int num_shards = 0;
    struct dirent *entry;
    while ((entry = readdir(d)) != NULL) {
        const char *name = entry->d_name;
        if (!pickle[0] && !strncmp(name, "pytorch_model", 13) && (ends_with(name, ".bin") || ends_with(name, ".bin.index.json")))
            snprintf(pickle, sizeof pickle, "%s", name);
        if (!gguf[0] && ends_with(name, ".gguf")) snprintf(gguf, sizeof gguf, "%s", name);
        if (ends_with(name, ".safetensors") && num_shards++ < 3)
            snprintf(shards + strlen(shards), sizeof shards - strlen(shards), "%s%s", num_shards > 1 ? ", " : "", name);
    }
    closedir(d);
    if (num_shards > 3)
        snprintf(shards + strlen(shards), sizeof shards - strlen(shards), " and %d more", num_shards - 3);
    if (num_shards)
        return tp_fail(TP_ERR_NOT_FOUND, "%s holds safetensors files (%s) but no model.safetensors.index.json, the index "
                       "that says which tensors each holds: restore it (save_pretrained writes it beside the shards); "
                       "a single file must be named model.safetensors", dir, shards);
    if (pickle[0])
        return tp_fail(TP_ERR_FORMAT, "%s holds PyTorch pickles (%s), which import does not read (unpickling can run "
                       "code); convert them to safetensors with transformers, "
                       "AutoModelForCausalLM.from_pretrained(\"%s\").save_pretrained(OUT, safe_serialization=True), "
                       "and import OUT", dir, pickle, dir);
    if (gguf[0])
        return tp_fail(TP_ERR_FORMAT, "%s holds a GGUF file (%s), which import does not read: import reads a Hugging Face "
                       "model directory (config.json and safetensors weights)", dir, gguf);
    return tp_fail(TP_ERR_NOT_FOUND, "%s holds neither model.safetensors nor model.safetensors.index.json (import reads a "
                   "Hugging Face model directory: config.json and safetensors weights)", dir);
}

/* A path that is no directory, said as what it is. */
static int refuse_model_file(const char *path)
{
    unsigned char magic[4] = {0};
    int fd;
    if (tp_open_regular(path, &fd) == TP_OK) {
        if (pread(fd, magic, sizeof magic, 0) != (ssize_t)sizeof magic) memset(magic, 0, sizeof magic);
        close(fd);
    } /* else (a special file, unreadable) what the name says below */
    char dir[4200], config[4300];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    if (slash == path) snprintf(dir, sizeof dir, "/");
    snprintf(config, sizeof config, "%s/config.json", dir);
    if (!memcmp(magic, "GGUF", 4))
        return tp_fail(TP_ERR_FORMAT, "%s is a GGUF file (llama.cpp's), which import does not read: import reads a Hugging "
                       "Face model directory (config.json and safetensors weights)", path);
    if (ends_with(path, ".bin") || ends_with(path, ".pt") || ends_with(path, ".pth") || !memcmp(magic, "PK\3\4", 4))
        return tp_fail(TP_ERR_FORMAT, "%s is a PyTorch file (torch.save's pickle), which import does not read "
                       "(unpickling can run code): convert the model to safetensors with transformers' "
                       "save_pretrained(OUT, safe_serialization=True), and import the directory OUT", path);
    if (access(config, F_OK) == 0)
        return tp_fail(TP_ERR_ARG, "%s is a file of the Hugging Face model directory %s: give the directory (tp-ckpt "
                       "import %s ...)", path, dir, dir);
    return tp_fail(TP_ERR_ARG, "%s is a file, not a directory: import reads a Hugging Face model directory "
                   "(config.json and safetensors weights)", path);
}

int safetensors_model_dir(const char *path, int *sharded)
{
    if (store_is_remote(path))
        return tp_fail(TP_ERR_ARG, "%s: import maps a model's files, so reads a local directory (tp-ckpt copy or the "
                       "store's own tool brings it here)", path);
    struct stat st;
    if (stat(path, &st) != 0) return tp_fail(errno == ENOENT ? TP_ERR_NOT_FOUND : TP_ERR_IO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return refuse_model_file(path);
    char index_path[4200], single[4200];
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", path);
    snprintf(single, sizeof single, "%s/model.safetensors", path);
    int has_index = stat(index_path, &st) == 0, has_single = stat(single, &st) == 0;
    /* transformers' from_pretrained looks for model.safetensors first and
     * then never reads the index: the two may be different models (a
     * download copied over an older one of the other kind), and which one
     * is current only the user knows. */
    if (has_index && has_single)
        return tp_fail(TP_ERR_FORMAT, "%s holds both model.safetensors and model.safetensors.index.json (with its "
                       "shards): transformers loads model.safetensors and ignores the index, so one of them is "
                       "stale; remove the one that is not the model", path);
    if (!has_index && !has_single) return refuse_model_dir(path);
    if (sharded) *sharded = has_index;
    return TP_OK;
}

int safetensors_open(safetensors_set **out, const char *path)
{
    *out = NULL;
    safetensors_set *set = calloc(1, sizeof *set);
    if (!set) return tp_fail(TP_ERR_NOMEM, "out of memory");
    struct stat st;
    if (stat(path, &st) != 0) {
        free(set);
        return tp_fail(TP_ERR_NOT_FOUND, "%s: %s", path, strerror(errno));
    }
    cJSON *index = NULL, *shard_names = cJSON_CreateArray();
    int status = TP_OK, sharded = 0;
    char index_path[4200], single[4200];
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", path);
    snprintf(single, sizeof single, "%s/model.safetensors", path);
    if (!S_ISDIR(st.st_mode)) {
        cJSON_AddItemToArray(shard_names, cJSON_CreateString(path));
    } else if ((status = safetensors_model_dir(path, &sharded)) != TP_OK) {
        /* said why */
    } else if (sharded) {
        /* Sharded: every file the weight map names, once, in order of appearance. */
        status = read_index(index_path, &index);
        const cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
        if (!status && !cJSON_IsObject(map))
            status = tp_fail(TP_ERR_FORMAT, "%s: no \"weight_map\" object (not a safetensors index?)", index_path);
        if (!status) status = add_shard_names(path, index_path, map, shard_names);
    } else {
        cJSON_AddItemToArray(shard_names, cJSON_CreateString(single));
    }
    /* A missing tensor is missing from the index (a sharded directory), not
     * from whichever shard comes first. */
    const cJSON *first = cJSON_GetArrayItem(shard_names, 0);
    snprintf(set->where, sizeof set->where, "%s", index ? index_path : first ? first->valuestring : path);
    int files = cJSON_GetArraySize(shard_names);
    cJSON **headers = calloc((size_t)files + 1, sizeof(cJSON *)); /* kept until the names are copied */
    set->files = calloc((size_t)files + 1, sizeof *set->files);
    if (!status && (!headers || !set->files)) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int f = 0; f < files && !status; f++) {
        snprintf(set->files[f].path, sizeof set->files[f].path, "%s", cJSON_GetArrayItem(shard_names, f)->valuestring);
        set->num_files = f + 1;
        status = parse_file(set, f, &headers[f]);
    }
    /* Names must outlive the headers' JSON: copy them into one block. */
    size_t name_bytes = 0;
    for (int i = 0; i < set->count; i++) name_bytes += strlen(set->tensors[i].info.name) + 1;
    if (!status && !(set->names = malloc(name_bytes + 1))) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0, at = 0; i < set->count && !status; i++) {
        size_t n = strlen(set->tensors[i].info.name) + 1;
        memcpy(set->names + at, set->tensors[i].info.name, n);
        set->tensors[i].info.name = set->names + at;
        at += (int)n;
    }
    /* Names in order: duplicates side by side, lookups by bisection. */
    if (!status && !(set->by_name = malloc((size_t)(set->count + 1) * sizeof *set->by_name)))
        status = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!status) {
        for (int i = 0; i < set->count; i++) set->by_name[i] = i;
        sorting_set = set;
        qsort(set->by_name, (size_t)set->count, sizeof *set->by_name, by_tensor_name);
    }
    for (int i = 1; i < set->count && !status; i++) {
        const safetensors_info *a = &set->tensors[set->by_name[i - 1]].info, *b = &set->tensors[set->by_name[i]].info;
        if (strcmp(a->name, b->name) == 0)
            status = tp_fail(TP_ERR_FORMAT, "tensor %s appears twice (in %s and %s)", a->name, a->file, b->file);
    }
    if (!status && index) status = check_weight_map(set, index, index_path);
    if (!status && index) check_total_size(set, index, index_path);
    for (int f = 0; f < files && headers; f++) cJSON_Delete(headers[f]);
    free(headers);
    cJSON_Delete(index);
    cJSON_Delete(shard_names);
    if (status) {
        safetensors_close(set);
        return status;
    }
    *out = set;
    return TP_OK;
}

const char *safetensors_warning(const safetensors_set *set)
{
    return set->warning;
}

int safetensors_count(const safetensors_set *set)
{
    return set->count;
}

const safetensors_info *safetensors_tensor(const safetensors_set *set, int i)
{
    return i >= 0 && i < set->count ? &set->tensors[i].info : NULL;
}

const safetensors_info *safetensors_find(const safetensors_set *set, const char *name)
{
    int lo = 0, hi = set->count;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, order = strcmp(set->tensors[set->by_name[mid]].info.name, name);
        if (order == 0) return &set->tensors[set->by_name[mid]].info;
        if (order < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const char *safetensors_metadata(const safetensors_set *set, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(set->metadata, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static const st_tensor *find_tensor(const safetensors_set *set, const char *name)
{
    const safetensors_info *info = safetensors_find(set, name);
    return info ? (const st_tensor *)info : NULL; /* info is the first member */
}

static const unsigned char *tensor_data(const safetensors_set *set, const st_tensor *t)
{
    return (const unsigned char *)set->files[t->file].map + set->files[t->file].data_start + t->begin;
}

/* Whether n values of x and y, of different dtypes, are equal as numbers
 * (both widened to fp32, exact for F16 and BF16; NaN equal to NaN, as the
 * bytes of one dtype would be), in blocks on the stack: the data of a
 * header not padded to its element size may be misaligned. */
static int equal_values(const unsigned char *x, tp_dtype xt, const unsigned char *y, tp_dtype yt, int64_t n)
{
    enum { BLOCK = 1024 };
    float wide_x[BLOCK], wide_y[BLOCK], raw_x[BLOCK], raw_y[BLOCK]; /* raw: room for BLOCK fp32 */
    size_t xs = tp_dtype_size(xt), ys = tp_dtype_size(yt);
    for (int64_t at = 0; at < n; at += BLOCK) {
        int64_t m = n - at < BLOCK ? n - at : BLOCK;
        memcpy(raw_x, x + (size_t)at * xs, (size_t)m * xs);
        memcpy(raw_y, y + (size_t)at * ys, (size_t)m * ys);
        convert_to_f32(raw_x, xt, wide_x, m);
        convert_to_f32(raw_y, yt, wide_y, m);
        for (int64_t k = 0; k < m; k++)
            if (wide_x[k] != wide_y[k] && !(isnan(wide_x[k]) && isnan(wide_y[k]))) return 0;
    }
    return 1;
}

int safetensors_equal(safetensors_set *set, const char *a, const char *b, int *equal)
{
    const st_tensor *x = find_tensor(set, a), *y = find_tensor(set, b);
    if (!x || !y) return tp_fail(TP_ERR_NOT_FOUND, "no tensor %s", x ? b : a);
    int same_shape = x->info.ndim == y->info.ndim;
    for (int k = 0; same_shape && k < x->info.ndim; k++) same_shape = x->info.shape[k] == y->info.shape[k];
    if (!same_shape) {
        *equal = 0;
    } else if (!strcmp(x->info.dtype_name, y->info.dtype_name)) {
        *equal = memcmp(tensor_data(set, x), tensor_data(set, y), (size_t)(x->end - x->begin)) == 0;
    } else if (x->info.supported && y->info.supported) {
        /* A tied head saved in another dtype than the embedding (an F16
         * lm_head beside F32 weights) holds the same model when its values
         * are the embedding's: its bytes cannot be. */
        int64_t n = (x->end - x->begin) / (int64_t)tp_dtype_size(x->info.dtype);
        *equal = equal_values(tensor_data(set, x), x->info.dtype, tensor_data(set, y), y->info.dtype, n);
    } else {
        *equal = 0;
    }
    return TP_OK;
}

/* ------------------------------------------------------------------ import */

typedef struct {
    safetensors_set *set;
    const ckpt_tensor_desc *tensors;
    const export_tensor *map;
    const st_tensor *(*sources)[IMPORT_MAX_PARTS]; /* per tensor: its source, or its stacked parts */
    int *ids;          /* writer tensor ids */
    int *order;        /* tasks: tensors, largest first */
    ckpt_writer *writer;
    int tp;
    const import_options *o;
    convert_overflow *overflow; /* per tensor: finite values its dtype made infinite */
    /* Per tensor, per source part: its NaNs and infinities, first the flat
     * index of the earliest in the part (row-major), -1 when none. */
    convert_nonfinite (*nonfinite)[IMPORT_MAX_PARTS];
    void **slabs;      /* per thread */
    int64_t slab_bytes;
} importer;

typedef struct {
    const unsigned char *src[IMPORT_MAX_PARTS]; /* the source tensor's data, or its parts' */
    int64_t part_end[IMPORT_MAX_PARTS];         /* logical elements before the end of each part */
    int parts;
    tp_dtype in, out;
    unsigned char *slab;
    size_t out_size;
    int transpose;
    int64_t rows, cols;         /* the target's logical [rows, cols] (transposed sources: [cols, rows]) */
    convert_overflow overflow;  /* finite values made infinite, over the whole tensor */
    convert_nonfinite nonfinite[IMPORT_MAX_PARTS]; /* per part, over the whole tensor (as importer's) */
    /* The piece being filled holds replicas (fewer key/value heads than
     * ranks) of these logical ranges along the split axis: their elements
     * are counted in their primary copy, so what is found here is dropped. */
    int64_t replica_begin[CKPT_MAX_SEGMENTS], replica_end[CKPT_MAX_SEGMENTS];
    int num_replicas;
    int64_t split_inner, split_size; /* elements after the split axis; its logical size */
} fill_ctx;

/* Whether the run from logical element first is a replica in this piece. */
static int is_replica(const fill_ctx *c, int64_t first)
{
    int64_t along = c->num_replicas ? first / c->split_inner % c->split_size : 0;
    for (int k = 0; k < c->num_replicas; k++)
        if (along >= c->replica_begin[k] && along < c->replica_end[k]) return 1;
    return 0;
}

/* Elements of the slab at offset come from logical elements [first, first + n)
 * of the target tensor (-1: padding). */
static int fill_run(void *ctx, int64_t offset, int64_t first, int64_t n)
{
    fill_ctx *c = ctx;
    unsigned char *dst = c->slab + (size_t)offset * c->out_size;
    if (first < 0) {
        memset(dst, 0, (size_t)n * c->out_size);
        return 0;
    }
    int counted = !is_replica(c, first);
    convert_nonfinite found;
    if (!c->transpose) { /* from the part each element lies in (parts stack along axis 0) */
        for (int p = 0; n > 0 && p < c->parts; p++) {
            int64_t begin = p ? c->part_end[p - 1] : 0;
            if (first >= c->part_end[p]) continue;
            int64_t m = c->part_end[p] - first < n ? c->part_end[p] - first : n;
            const unsigned char *src = c->src[p] + (size_t)(first - begin) * tp_dtype_size(c->in);
            convert_overflow_add(&c->overflow, convert_numbers_counting(src, c->in, 1, dst, c->out, m, &found));
            if (counted) convert_nonfinite_add(&c->nonfinite[p], found, first - begin);
            dst += (size_t)m * c->out_size;
            first += m;
            n -= m;
        }
        return 0;
    }
    /* Target element (r, k) is source element (k, r): a gather with stride
     * rows, one logical row of the run at a time. */
    for (int64_t done = 0; done < n;) {
        int64_t r = (first + done) / c->cols, k = (first + done) % c->cols, m = c->cols - k;
        if (m > n - done) m = n - done;
        const unsigned char *src = c->src[0] + (size_t)(k * c->rows + r) * tp_dtype_size(c->in);
        unsigned char *to = dst + (size_t)done * c->out_size;
        convert_overflow_add(&c->overflow, convert_numbers_counting(src, c->in, c->rows, to, c->out, m, &found));
        if (found.first >= 0) found.first = (k + found.first) * c->rows + r; /* the source's flat index */
        if (counted) convert_nonfinite_add(&c->nonfinite[0], found, 0);
        done += m;
    }
    return 0;
}

static int import_tensor(void *ctx, int64_t task, int thread)
{
    importer *im = ctx;
    int i = im->order[task];
    const ckpt_tensor_desc *d = &im->tensors[i];
    int parts = im->map[i].num_parts > 1 ? im->map[i].num_parts : 1;
    size_t in_size = tp_dtype_size(im->sources[i][0]->info.dtype);
    void *aligned[IMPORT_MAX_PARTS] = {NULL};
    int status = TP_OK;
    fill_ctx fill = {.parts = parts,
                     .in = im->sources[i][0]->info.dtype,
                     .out = d->dtype,
                     .slab = im->slabs[thread],
                     .out_size = tp_dtype_size(d->dtype),
                     .transpose = im->map[i].transpose,
                     .rows = d->shape[0],
                     .cols = 1,
                     .split_inner = 1,
                     .split_size = 1};
    for (int k = 1; k < d->ndim; k++) fill.cols *= d->shape[k];
    for (int p = 0; p < IMPORT_MAX_PARTS; p++) fill.nonfinite[p].first = -1;
    if (d->partition.kind == CKPT_SPLIT) {
        for (int k = d->partition.axis + 1; k < d->ndim; k++) fill.split_inner *= d->shape[k];
        fill.split_size = d->shape[d->partition.axis];
    }
    for (int p = 0; p < parts && !status; p++) {
        const st_tensor *s = im->sources[i][p];
        fill.src[p] = tensor_data(im->set, s);
        fill.part_end[p] = (p ? fill.part_end[p - 1] : 0) + (s->end - s->begin) / (int64_t)in_size;
        if ((uintptr_t)fill.src[p] % in_size != 0) { /* a header not padded to the element size */
            aligned[p] = alloc_pages((size_t)(s->end - s->begin));
            if (!aligned[p]) status = tp_fail(TP_ERR_NOMEM, "out of memory");
            else fill.src[p] = memcpy(aligned[p], fill.src[p], (size_t)(s->end - s->begin));
        }
    }
    int64_t piece_shape[CKPT_MAX_DIMS], row_elements = 1;
    ckpt_piece_shape(d, im->tp, piece_shape);
    for (int k = 1; k < d->ndim; k++) row_elements *= piece_shape[k];
    int64_t block = ckpt_writer_block_rows(im->writer, im->ids[i]);
    int64_t slab_rows = im->slab_bytes / (row_elements * (int64_t)fill.out_size) / block * block;
    if (slab_rows < block) slab_rows = block;
    for (int p = 0; p < ckpt_piece_count(d, im->tp) && !status; p++) {
        ckpt_run runs[2 * CKPT_MAX_SEGMENTS];
        int64_t num_runs = d->partition.kind == CKPT_SPLIT ? ckpt_piece_runs(d, im->tp, p, runs, 2 * CKPT_MAX_SEGMENTS) : 0;
        fill.num_replicas = 0;
        for (int64_t k = 0; k < num_runs; k++)
            if (runs[k].replica > 0 && runs[k].logical_start >= 0 && fill.num_replicas < CKPT_MAX_SEGMENTS) {
                fill.replica_begin[fill.num_replicas] = runs[k].logical_start;
                fill.replica_end[fill.num_replicas++] = runs[k].logical_start + runs[k].length;
            }
        for (int64_t r = 0; r < piece_shape[0] && !status; r += slab_rows) {
            int64_t n = piece_shape[0] - r < slab_rows ? piece_shape[0] - r : slab_rows;
            ckpt_piece_element_runs(d, im->tp, p, r, r + n, fill_run, &fill);
            status = ckpt_writer_put_rows(im->writer, im->ids[i], p, r, n, fill.slab);
            if (!status && im->o->on_bytes) im->o->on_bytes(im->o->progress_ctx, n * row_elements * (int64_t)fill.out_size);
        }
    }
    /* The whole tensor's count, checked once every tensor is converted
     * (import_run), so that the error names them all; the writer commits
     * nothing of a failed import. */
    im->overflow[i] = fill.overflow;
    memcpy(im->nonfinite[i], fill.nonfinite, sizeof fill.nonfinite);
    /* Done with this tensor: its pages leave this process's memory. */
    for (int p = 0; p < parts; p++) {
        const st_tensor *s = im->sources[i][p];
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = (uintptr_t)tensor_data(im->set, s) / page * page;
        uintptr_t end = (uintptr_t)tensor_data(im->set, s) + (uintptr_t)(s->end - s->begin);
        if (end > start) madvise((void *)start, end - start, MADV_DONTNEED);
        free(aligned[p]);
    }
    return status;
}

static int64_t tensor_elements(const ckpt_tensor_desc *d)
{
    int64_t n = 1;
    for (int k = 0; k < d->ndim; k++) n *= d->shape[k];
    return n;
}

static const importer *sort_importer;
static int larger_first(const void *a, const void *b)
{
    int64_t x = tensor_elements(&sort_importer->tensors[*(const int *)a]);
    int64_t y = tensor_elements(&sort_importer->tensors[*(const int *)b]);
    return x < y ? 1 : x > y ? -1 : *(const int *)a - *(const int *)b;
}

/* A source of the wrong shape: the message, then what the expected shapes
 * were derived from (a Hugging Face config.json's sizes), so that a wrong
 * num_key_value_heads is told from a damaged tensor. */
static int __attribute__((format(printf, 2, 3))) shape_refusal(const importer *im, const char *fmt, ...)
{
    char message[4096];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    const char *from = im->o ? im->o->shapes_from : NULL;
    return tp_fail(TP_ERR_FORMAT, "%s%s%s", message, from ? "; the shapes expected follow " : "", from ? from : "");
}

/* The rows of tensor i's parts: where the target's segments give each
 * part's rows (fused QKV: [q, k, v]; SwiGLU: [gate, up]), each must have
 * its own, not only their sum (q and k of swapped widths would put K's rows
 * among Q's); else the sum must be the target's. A failure names every part
 * with its shape (and its file where it is not that of the part named
 * first), and the first of the wrong width against its expected shape. */
static int check_part_rows(const importer *im, int i, int64_t rows)
{
    const ckpt_tensor_desc *d = &im->tensors[i];
    const export_tensor *e = &im->map[i];
    const ckpt_partition *p = &d->partition;
    int per_part = p->kind == CKPT_SPLIT && p->axis == 0 && p->num_segments == e->num_parts, wrong = -1;
    for (int k = 0; per_part && k < e->num_parts && wrong < 0; k++)
        if (im->sources[i][k]->info.shape[0] != p->segments[k]) wrong = k;
    if (wrong < 0 && rows == d->shape[0]) return TP_OK;
    const char *first_file = im->sources[i][wrong >= 0 ? wrong : 0]->info.file;
    char parts[2048] = "", shape[160];
    size_t n = 0;
    for (int k = 0; k < e->num_parts && n < sizeof parts; k++) {
        const safetensors_info *s = &im->sources[i][k]->info;
        ckpt_shape_text(s->shape, s->ndim, shape, sizeof shape);
        const char *file = strrchr(s->file, '/') ? strrchr(s->file, '/') + 1 : s->file;
        n += (size_t)snprintf(parts + n, sizeof parts - n, "%s%s %s%s%s", k ? ", " : "", s->name, shape,
                              strcmp(s->file, first_file) ? " in " : "", strcmp(s->file, first_file) ? file : "");
    }
    if (wrong < 0)
        return shape_refusal(im, "%s: the %d parts of %s have %lld rows together, expected %lld: %s", first_file,
                       e->num_parts, d->name, (long long)rows, (long long)d->shape[0], parts);
    const safetensors_info *s = &im->sources[i][wrong]->info;
    int64_t want[CKPT_MAX_DIMS];
    memcpy(want, s->shape, sizeof want);
    want[0] = p->segments[wrong];
    char got[160], widths[160] = "";
    ckpt_shape_text(s->shape, s->ndim, got, sizeof got);
    ckpt_shape_text(want, s->ndim, shape, sizeof shape);
    for (int k = 0; k < e->num_parts; k++)
        snprintf(widths + strlen(widths), sizeof widths - strlen(widths), "%s%lld",
                 !k ? "" : k == e->num_parts - 1 ? " and " : ", ", (long long)p->segments[k]);
    return shape_refusal(im, "%s: tensor %s %s, expected %s (part %d of %d of %s, whose parts have %s rows: %s)",
                   first_file, s->name, got, shape, wrong + 1, e->num_parts, d->name, widths, parts);
}

/* The parts of tensor i: present, of one supported dtype, each [rows_p,
 * the target's other dimensions], their rows adding up to the target's. */
static int check_parts(importer *im, int i)
{
    const ckpt_tensor_desc *d = &im->tensors[i];
    const export_tensor *e = &im->map[i];
    if (e->num_parts > IMPORT_MAX_PARTS || e->transpose)
        return tp_fail(TP_ERR_ARG, "tensor %s: %d stacked parts%s", d->name, e->num_parts,
                       e->transpose ? ", transposed" : "");
    int64_t rows = 0;
    for (int p = 0; p < e->num_parts; p++) {
        const st_tensor *s = find_tensor(im->set, e->parts[p]);
        if (!s)
            return tp_fail(TP_ERR_NOT_FOUND, "%s: tensor %s (part %d of %s) is missing", im->set->where, e->parts[p],
                           p, d->name);
        if (!s->info.supported)
            return tp_fail(TP_ERR_FORMAT, "%s: tensor %s is %s; import reads F32, BF16 and F16", s->info.file,
                           s->info.name, s->info.dtype_name);
        if (p && s->info.dtype != im->sources[i][0]->info.dtype)
            return tp_fail(TP_ERR_FORMAT, "%s: tensor %s is %s and %s is %s: the parts of %s must share a dtype",
                           s->info.file, s->info.name, s->info.dtype_name, im->sources[i][0]->info.name,
                           im->sources[i][0]->info.dtype_name, d->name);
        int same = s->info.ndim == d->ndim;
        for (int k = 1; same && k < d->ndim; k++) same = s->info.shape[k] == d->shape[k];
        if (!same)
            return shape_refusal(im, "%s: tensor %s has %d dimensions of which the last is %lld; %s needs rows of "
                           "%lld",
                           s->info.file, s->info.name, s->info.ndim, (long long)s->info.shape[s->info.ndim - 1],
                           d->name, (long long)(d->ndim > 1 ? d->shape[d->ndim - 1] : 1));
        rows += s->info.shape[0];
        im->sources[i][p] = s;
    }
    return check_part_rows(im, i, rows);
}

/* Every source present, of a supported dtype, with the expected shape. */
static int check_sources(importer *im, int count)
{
    for (int i = 0; i < count; i++) {
        const ckpt_tensor_desc *d = &im->tensors[i];
        if (im->map[i].num_parts > 1) {
            TP_TRY(check_parts(im, i));
            continue;
        }
        const st_tensor *s = find_tensor(im->set, im->map[i].name);
        if (!s)
            return tp_fail(TP_ERR_NOT_FOUND, "%s: tensor %s (for %s) is missing", im->set->where,
                                im->map[i].name, d->name);
        if (!s->info.supported)
            return tp_fail(TP_ERR_FORMAT, "%s: tensor %s is %s; import reads F32, BF16 and F16", s->info.file,
                                s->info.name, s->info.dtype_name);
        int64_t expected[CKPT_MAX_DIMS];
        memcpy(expected, d->shape, sizeof expected);
        if (im->map[i].transpose) {
            if (d->ndim != 2) return tp_fail(TP_ERR_ARG, "tensor %s: only matrices can be transposed", d->name);
            expected[0] = d->shape[1];
            expected[1] = d->shape[0];
        }
        int same = s->info.ndim == d->ndim;
        for (int k = 0; same && k < d->ndim; k++) same = s->info.shape[k] == expected[k];
        if (!same) {
            char want[160], got[160];
            ckpt_shape_text(expected, d->ndim, want, sizeof want);
            ckpt_shape_text(s->info.shape, s->info.ndim, got, sizeof got);
            return shape_refusal(im, "%s: tensor %s has shape %s, expected %s for %s", s->info.file, s->info.name,
                           got, want, d->name);
        }
        im->sources[i][0] = s;
    }
    return TP_OK;
}

/* The sources' NaNs and infinities, said by the first source tensor in the
 * model's order that holds any (ckpt_nonfinite_note): its file, name, how
 * many of each, where the first lies (its [row, col], or index, in the
 * source's own shape); then how many others hold some. */
static void describe_nonfinite(const importer *im, int count, ckpt_nonfinite *found)
{
    ckpt_nonfinite_init(found);
    for (int i = 0; i < count; i++) {
        int parts = im->map[i].num_parts > 1 ? im->map[i].num_parts : 1;
        for (int p = 0; p < parts; p++) {
            const safetensors_info *s = &im->sources[i][p]->info;
            ckpt_nonfinite_note(found, s->file, s->name, s->shape, s->ndim, im->nonfinite[i][p]);
        }
    }
}

int import_run(safetensors_set *set, const ckpt_tensor_desc *tensors, const export_tensor *map, int count,
               const ckpt_layout *layout, const ckpt_train_state *state, const import_options *options,
               const char *out_path)
{
    importer im = {.set = set,
                   .tensors = tensors,
                   .map = map,
                   .sources = calloc((size_t)count + 1, sizeof *im.sources),
                   .ids = calloc((size_t)count + 1, sizeof(int)),
                   .order = calloc((size_t)count + 1, sizeof(int)),
                   .tp = layout->tp,
                   .o = options,
                   .overflow = calloc((size_t)count + 1, sizeof *im.overflow),
                   .nonfinite = calloc((size_t)count + 1, sizeof *im.nonfinite),
                   .slab_bytes = SLAB_TARGET_BYTES};
    int threads = options->threads > 0 ? options->threads : parallel_cpu_count();
    if (threads > count) threads = count > 0 ? count : 1;
    int status = !im.sources || !im.ids || !im.order || !im.overflow || !im.nonfinite
                     ? tp_fail(TP_ERR_NOMEM, "out of memory")
                     : TP_OK;
    if (options->nonfinite) ckpt_nonfinite_init(options->nonfinite);
    for (int i = 0; i < count && !status; i++) {
        status = ckpt_tensor_check(&tensors[i], layout->tp);
    }
    if (!status) status = check_sources(&im, count);
    ckpt_write_options write_options;
    ckpt_write_options_init(&write_options);
    write_options.overwrite = options->overwrite;
    write_options.update_latest = options->update_latest;
    write_options.compress_level = options->compress_level;
    if (!status) status = ckpt_writer_create(&im.writer, out_path, layout, &write_options);
    for (int i = 0; i < count && !status; i++) {
        status = ckpt_writer_add_tensor(im.writer, &tensors[i], &im.ids[i]);
        im.order[i] = i;
    }
    if (!status) {
        sort_importer = &im;
        qsort(im.order, (size_t)count, sizeof *im.order, larger_first);
        /* A slab must hold at least one checksum block of any piece. */
        for (int i = 0; i < count; i++) {
            int64_t shape[CKPT_MAX_DIMS], row = (int64_t)tp_dtype_size(tensors[i].dtype);
            ckpt_piece_shape(&tensors[i], layout->tp, shape);
            for (int k = 1; k < tensors[i].ndim; k++) row *= shape[k];
            int64_t block = ckpt_writer_block_rows(im.writer, im.ids[i]) * row;
            if (block > im.slab_bytes) im.slab_bytes = block;
        }
        im.slabs = calloc((size_t)threads, sizeof *im.slabs);
        for (int t = 0; t < threads && im.slabs; t++)
            if (!(im.slabs[t] = alloc_pages((size_t)im.slab_bytes))) status = tp_fail(TP_ERR_NOMEM, "out of memory");
        if (!im.slabs) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    if (!status) status = parallel_for(count, threads, import_tensor, &im);
    /* NaNs and infinities in the source are its own damage (a broken
     * download, an export of a diverged run): refused before the commit,
     * so that nothing is written, unless the caller takes them as they are. */
    if (!status) {
        ckpt_nonfinite found;
        describe_nonfinite(&im, count, &found);
        status = ckpt_nonfinite_check(&found, options->allow_nonfinite, "imported", "imports");
        if (options->nonfinite) *options->nonfinite = found;
    }
    if (!status) {
        int others, first = convert_overflow_first(im.overflow, count, &others);
        if (first >= 0) status = convert_overflow_check(im.overflow[first], tensors[first].dtype, tensors[first].name, others);
    }
    if (im.writer) {
        if (status) ckpt_writer_abort(im.writer);
        else status = ckpt_writer_commit(im.writer, state);
    }
    for (int t = 0; im.slabs && t < threads; t++) free(im.slabs[t]);
    free(im.slabs);
    free(im.sources);
    free(im.ids);
    free(im.order);
    free(im.overflow);
    free(im.nonfinite);
    return status;
}
