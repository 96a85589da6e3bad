/* Export (safetensors, GGUF, merged HDF5) and safetensors import against
 * naive references: every output file is parsed here, with plain C, cJSON
 * and the HDF5 C API, and every tensor compared byte for byte with the
 * logical tensor of the fixture, transposed and converted where asked.
 * Also: shards and their index, streaming in many bands under a tight
 * memory limit, atomic outputs, the format rules safetensors_open enforces
 * (malformed files written byte by byte) and import into several layouts. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../common/memory.h"
#include "../../kernels/kernels.h"
#include "../../formats/formats.h"
#include "../../reshard/reshard.h"
#include "../support/fixture.h"

TestSuite(export, .init = make_dir, .fini = remove_dir);

/* ------------------------------------------------------------- helpers */

static const char *st_dtype_name(tp_dtype dtype)
{
    return dtype == TP_BF16 ? "BF16" : dtype == TP_FP16 ? "F16" : "F32";
}

static int path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Entries of a directory other than . and ..; with a name containing
 * "staging", "tmp" or "replaced", *leftovers counts it too. */
static int count_entries(const char *path, int *leftovers)
{
    DIR *d = opendir(path);
    cr_assert_not_null(d, "cannot list %s", path);
    int n = 0, bad = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        n++;
        if (strstr(e->d_name, "staging") || strstr(e->d_name, "tmp") || strstr(e->d_name, "replaced")) bad++;
    }
    closedir(d);
    if (leftovers) *leftovers = bad;
    return n;
}

/* Nothing at path, and its parent holds exactly `entries` entries, none of
 * them a staging leftover. */
static void assert_nothing_left(const char *parent, const char *path, int entries)
{
    cr_assert(!path_exists(path), "%s must not exist after a failed export", path);
    int leftovers = 0, n = count_entries(parent, &leftovers);
    cr_assert_eq(leftovers, 0, "%s holds a staging leftover", parent);
    cr_assert_eq(n, entries, "%s holds %d entries, expected %d", parent, n, entries);
}

/* A call that must fail: with status, or with any failure where status is
 * TP_OK (what the call returns there is not what the case is about). */
static void assert_refused(int got, int status, const char *what)
{
    if (status == TP_OK)
        cr_assert_neq(got, TP_OK, "%s is accepted", what);
    else
        cr_assert_eq(got, status, "%s: expected %s, got %s: %s", what, tp_status_name(status), tp_status_name(got),
                     tp_errmsg());
}

typedef struct {
    uint8_t *bytes;
    size_t size;
} blob;

static blob read_all(const char *path)
{
    blob b = {NULL, 0};
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    b.bytes = malloc((size_t)n + 1);
    cr_assert_eq(fread(b.bytes, 1, (size_t)n, f), (size_t)n, "read %s", path);
    fclose(f);
    b.size = (size_t)n;
    return b;
}

static void write_all(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    if (size) cr_assert_eq(fwrite(data, 1, size, f), size);
    cr_assert_eq(fclose(f), 0);
}

static int same_file(const char *path, const blob *b)
{
    blob now = read_all(path);
    int same = now.size == b->size && memcmp(now.bytes, b->bytes, b->size) == 0;
    free(now.bytes);
    return same;
}

/* A tensor of given shape with random bytes; split_axis < 0: replicated. */
static void fixed_tensor(test_tensor *t, const char *name, tp_dtype dtype, int ndim, const int64_t *shape,
                         int split_axis, ckpt_anchor anchor, int64_t layer)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->desc.name = t->name;
    t->desc.dtype = dtype;
    t->desc.ndim = ndim;
    memcpy(t->desc.shape, shape, (size_t)ndim * sizeof *shape);
    if (split_axis >= 0) {
        t->desc.partition.kind = CKPT_SPLIT;
        t->desc.partition.axis = split_axis;
    }
    t->desc.anchor = anchor;
    t->desc.layer = layer;
    size_t bytes = (size_t)elements_of(shape, ndim) * tp_dtype_size(dtype);
    t->logical = malloc(bytes);
    random_numbers(t->logical, bytes, dtype);
}

static void free_tensors(test_tensor *t, int n)
{
    for (int i = 0; i < n; i++) free(t[i].logical);
}

static int64_t tensor_bytes(const test_tensor *t, tp_dtype out)
{
    return elements_of(t->desc.shape, t->desc.ndim) * (int64_t)tp_dtype_size(out);
}

/* Naive: the logical tensor, transposed when asked (2-D), in dtype out. */
static uint8_t *expected_tensor(const test_tensor *t, int transpose, tp_dtype out)
{
    int64_t n = elements_of(t->desc.shape, t->desc.ndim);
    size_t es = tp_dtype_size(t->desc.dtype);
    const uint8_t *src = t->logical;
    uint8_t *moved = NULL;
    if (transpose) {
        cr_assert_eq(t->desc.ndim, 2);
        int64_t rows = t->desc.shape[0], cols = t->desc.shape[1];
        moved = malloc((size_t)n * es);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) memcpy(moved + (c * rows + r) * es, src + (r * cols + c) * es, es);
        src = moved;
    }
    uint8_t *result = malloc((size_t)n * tp_dtype_size(out) + 1);
    convert_numbers(src, t->desc.dtype, result, out, n);
    free(moved);
    return result;
}

/* Shape as written: transposed when asked. */
static void written_shape(const test_tensor *t, int transpose, int64_t *shape)
{
    memcpy(shape, t->desc.shape, sizeof t->desc.shape);
    if (transpose) {
        shape[0] = t->desc.shape[1];
        shape[1] = t->desc.shape[0];
    }
}

static ckpt_reader *open_reader(const char *path)
{
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
    return r;
}

/* Progress from worker threads. */
typedef struct {
    atomic_llong bytes;
    atomic_int calls;
} progress;

static void on_bytes(void *ctx, int64_t bytes)
{
    progress *p = ctx;
    atomic_fetch_add(&p->bytes, (long long)bytes);
    atomic_fetch_add(&p->calls, 1);
}

/* The three export formats: a name for messages, what an output path ends
 * with, and where the tensor data lies below the output path (safetensors
 * writes a directory, the others one file). */
typedef struct {
    export_format id;
    const char *name;
    const char *suffix;
    const char *data_file;
} output_format;

static const output_format output_formats[] = {
    {EXPORT_SAFETENSORS, "safetensors", "", "/model.safetensors"},
    {EXPORT_GGUF, "GGUF", ".gguf", ""},
    {EXPORT_HDF5, "HDF5", ".h5", ""},
};
#define FORMAT_COUNT (sizeof output_formats / sizeof output_formats[0])

/* ------------------------------------------------- safetensors parsing */

typedef struct {
    blob file;
    uint64_t header_length;
    cJSON *header;
} st_parsed;

static int64_t json_int(const cJSON *v)
{
    cr_assert(cJSON_IsNumber(v), "expected a number");
    return (int64_t)v->valuedouble;
}

typedef struct {
    const char *name;
    int64_t begin, end;
} st_span;

static int by_span(const void *a, const void *b)
{
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Parses a safetensors file and checks the rules of the format as the
 * reference writer applies them: header padded with spaces to a multiple of
 * 8 bytes, data offsets contiguous from 0, no trailing bytes. */
static void st_parse(const char *path, st_parsed *out)
{
    out->file = read_all(path);
    const uint8_t *bytes = out->file.bytes;
    cr_assert_geq(out->file.size, 8, "%s: too short", path);
    uint64_t n = 0;
    for (int k = 0; k < 8; k++) n |= (uint64_t)bytes[k] << (8 * k);
    out->header_length = n;
    cr_assert_leq(n, out->file.size - 8, "%s: header length %llu beyond the file", path, (unsigned long long)n);
    cr_assert_eq((8 + n) % 8, 0, "%s: header length %llu: data not 8-byte aligned", path, (unsigned long long)n);
    const char *text = (const char *)bytes + 8, *end = NULL;
    out->header = cJSON_ParseWithLengthOpts(text, (size_t)n, &end, 0);
    cr_assert(cJSON_IsObject(out->header), "%s: header is not a JSON object", path);
    size_t json_length = (size_t)(end - text);
    cr_assert_lt(n - json_length, 8, "%s: %llu bytes of padding", path, (unsigned long long)(n - json_length));
    for (size_t k = json_length; k < n; k++) cr_assert_eq(text[k], ' ', "%s: padding byte %zu is not a space", path, k);
    /* Offsets: contiguous from 0, covering the data exactly. */
    int count = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, out->header) count++;
    st_span *spans = calloc((size_t)count + 1, sizeof *spans);
    int m = 0;
    cJSON_ArrayForEach(item, out->header)
    {
        if (!strcmp(item->string, "__metadata__")) continue;
        const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
        cr_assert(cJSON_IsArray(offsets) && cJSON_GetArraySize(offsets) == 2, "%s: %s: data_offsets", path,
                  item->string);
        spans[m++] = (st_span){item->string, json_int(cJSON_GetArrayItem(offsets, 0)),
                               json_int(cJSON_GetArrayItem(offsets, 1))};
    }
    qsort(spans, (size_t)m, sizeof *spans, by_span);
    int64_t covered = 0;
    for (int i = 0; i < m; i++) {
        cr_assert_eq(spans[i].begin, covered, "%s: %s begins at %lld, expected %lld", path, spans[i].name,
                     (long long)spans[i].begin, (long long)covered);
        covered = spans[i].end;
    }
    free(spans);
    cr_assert_eq(covered, (int64_t)(out->file.size - 8 - n), "%s: tensors cover %lld bytes, the data is %lld", path,
                 (long long)covered, (long long)(out->file.size - 8 - n));
}

static void st_free(st_parsed *p)
{
    cJSON_Delete(p->header);
    free(p->file.bytes);
}

/* Checks tensor `name` of a parsed file: dtype, shape and bytes. */
static void st_check_tensor(const st_parsed *p, const char *name, tp_dtype dtype, int ndim, const int64_t *shape,
                            const uint8_t *want)
{
    const cJSON *entry = cJSON_GetObjectItemCaseSensitive(p->header, name);
    cr_assert(cJSON_IsObject(entry), "tensor %s missing from the header", name);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    cr_assert(cJSON_IsString(d) && !strcmp(d->valuestring, st_dtype_name(dtype)), "%s: dtype %s, expected %s", name,
              cJSON_IsString(d) ? d->valuestring : "?", st_dtype_name(dtype));
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    cr_assert(cJSON_IsArray(s) && cJSON_GetArraySize(s) == ndim, "%s: shape rank", name);
    for (int k = 0; k < ndim; k++)
        cr_assert_eq(json_int(cJSON_GetArrayItem(s, k)), shape[k], "%s: shape[%d]", name, k);
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    int64_t begin = json_int(cJSON_GetArrayItem(offsets, 0)), end = json_int(cJSON_GetArrayItem(offsets, 1));
    int64_t bytes = elements_of(shape, ndim) * (int64_t)tp_dtype_size(dtype);
    cr_assert_eq(end - begin, bytes, "%s: data_offsets [%lld, %lld] for %lld bytes", name, (long long)begin,
                 (long long)end, (long long)bytes);
    const uint8_t *data = p->file.bytes + 8 + p->header_length + begin;
    cr_assert_eq(memcmp(data, want, (size_t)bytes), 0, "%s: data differs from the expected tensor", name);
}

/* Tensor `name` of a parsed file is source s as exported: transposed when
 * asked, in dtype. */
static void st_check_exported(const st_parsed *p, const char *name, const test_tensor *s, int transpose,
                              tp_dtype dtype)
{
    int64_t shape[CKPT_MAX_DIMS];
    written_shape(s, transpose, shape);
    uint8_t *want = expected_tensor(s, transpose, dtype);
    st_check_tensor(p, name, dtype, s->desc.ndim, shape, want);
    free(want);
}

/* __metadata__ holds "format": "pt", our mark and exactly the given pairs. */
static void st_check_metadata(const st_parsed *p, const char *const *pairs)
{
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(p->header, "__metadata__");
    cr_assert(cJSON_IsObject(meta), "no __metadata__");
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(meta, "format");
    cr_assert(cJSON_IsString(format) && !strcmp(format->valuestring, "pt"), "__metadata__ lacks \"format\": \"pt\"");
    const cJSON *mark = cJSON_GetObjectItemCaseSensitive(meta, EXPORT_MARK_KEY);
    cr_assert(cJSON_IsString(mark) && !strcmp(mark->valuestring, EXPORT_MARK), "__metadata__ lacks the mark");
    int expected = 2;
    for (int k = 0; pairs && pairs[k]; k += 2, expected++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, pairs[k]);
        cr_assert(cJSON_IsString(v) && !strcmp(v->valuestring, pairs[k + 1]), "__metadata__ %s should be %s", pairs[k],
                  pairs[k + 1]);
    }
    cr_assert_eq(cJSON_GetArraySize(meta), expected, "__metadata__ entries");
}

/* A source checkpoint of random tensors at a random layout. */
static int random_source(const char *path, test_tensor *tensors, int max, ckpt_layout *layout)
{
    static const int tps[] = {1, 2, 4};
    int n = random_tensors(tensors, max, tps, 3, 2);
    *layout = (ckpt_layout){tps[rnd(0, 2)], (int)rnd(1, 2), 1, 2, 1};
    write_tensors(path, layout, tensors, n, rnd(0, 3) == 0, 7);
    return n;
}

/* A random source checkpoint at dir/src<iter>, opened, its tensors listed
 * in order under the names `name` gives, some matrices transposed. */
typedef struct {
    test_tensor t[10];
    int n;
    ckpt_reader *r;
    export_tensor specs[10];
    char names[10][64];
} listed_source;

static void list_random_source(listed_source *x, int iter, void (*name)(int i, char *out, size_t size), int *transposed)
{
    char src[700];
    ckpt_layout layout;
    snprintf(src, sizeof src, "%s/src%d", dir, iter);
    x->n = random_source(src, x->t, 10, &layout);
    x->r = open_reader(src);
    for (int i = 0; i < x->n; i++) {
        name(i, x->names[i], sizeof x->names[i]);
        x->specs[i] = (export_tensor){.source = x->t[i].name, .name = x->names[i], .transpose = x->t[i].desc.ndim == 2 && rnd(0, 1)};
        *transposed += x->specs[i].transpose;
    }
}

static void gguf_name(int i, char *out, size_t size)
{
    snprintf(out, size, "blk.%d.w", i);
}

static void hdf5_name(int i, char *out, size_t size)
{
    snprintf(out, size, "%s/t%d", i % 2 ? "decoder/layer" : "head", i);
}

/* Rows cut to a prefix (a padded vocabulary) and regrouped in blocks (a
 * fused QKV's heads), with and without a transposition, through the HDF5
 * writer and read back by HDF5: each output row is the source row the map
 * names. */
Test(export, rows_cut_and_regrouped)
{
    seed_random(808);
    test_tensor t[2];
    fixed_tensor(&t[0], "model/qkv", TP_FP32, 2, (int64_t[]){12, 5}, 0, CKPT_ANCHOR_FIRST, 0);
    fixed_tensor(&t[1], "model/table", TP_FP32, 2, (int64_t[]){10, 3}, 0, CKPT_ANCHOR_FIRST, 0);
    char src[700], out[700];
    snprintf(src, sizeof src, "%s/rows_src", dir);
    ckpt_layout layout = {2, 1, 1, 1, 1};
    write_tensors(src, &layout, t, 2, 0, 7);
    ckpt_reader *r = open_reader(src);
    static const int64_t blocks[] = {2, 0, 5, 1, 3, 4}; /* blocks of 2 rows */
    for (int transpose = 0; transpose < 2; transpose++) {
        const export_tensor specs[] = {
            {.source = "model/qkv", .name = "qkv", .transpose = transpose, .block_rows = 2, .blocks = blocks},
            {.source = "model/table", .name = "table", .transpose = transpose, .rows = 7},
            {.source = "model/qkv", .name = "both", .rows = 8, .block_rows = 4, .blocks = (const int64_t[]){1, 0}},
        };
        export_options options;
        export_options_init(&options);
        options.format = EXPORT_HDF5;
        options.threads = 2;
        snprintf(out, sizeof out, "%s/rows%d.h5", dir, transpose);
        cr_assert_eq(export_run(r, specs, 3, &options, out, NULL), TP_OK, "%s", tp_errmsg());
        hid_t file = H5Fopen(out, H5F_ACC_RDONLY, H5P_DEFAULT);
        cr_assert_geq(file, 0);
        for (int k = 0; k < 3; k++) {
            const test_tensor *s = k == 1 ? &t[1] : &t[0];
            int64_t rows = specs[k].rows ? specs[k].rows : s->desc.shape[0], cols = s->desc.shape[1];
            int flip = specs[k].transpose;
            float *got = malloc((size_t)(rows * cols) * sizeof *got);
            hid_t dset = H5Dopen2(file, specs[k].name, H5P_DEFAULT);
            hsize_t dims[2];
            H5Sget_simple_extent_dims(H5Dget_space(dset), dims, NULL);
            cr_assert(dims[0] == (hsize_t)(flip ? cols : rows) && dims[1] == (hsize_t)(flip ? rows : cols), "%s: shape",
                      specs[k].name);
            cr_assert_geq(H5Dread(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, got), 0);
            H5Dclose(dset);
            const float *logical = (const float *)s->logical;
            for (int64_t row = 0; row < rows; row++) {
                int64_t from = specs[k].blocks ? specs[k].blocks[row / specs[k].block_rows] * specs[k].block_rows +
                                                     row % specs[k].block_rows
                                               : row;
                for (int64_t c = 0; c < cols; c++)
                    cr_assert_eq(flip ? got[c * rows + row] : got[row * cols + c], logical[from * cols + c],
                                 "%s: output row %lld is source row %lld", specs[k].name, (long long)row, (long long)from);
            }
            free(got);
        }
        H5Fclose(file);
    }
    /* Maps that do not fit are refused before anything is written. */
    const export_tensor too_many = {.source = "model/table", .name = "t", .rows = 11};
    const export_tensor uneven = {.source = "model/qkv", .name = "q", .block_rows = 5, .blocks = blocks};
    const export_tensor outside = {.source = "model/qkv", .name = "q", .block_rows = 6, .blocks = (const int64_t[]){0, 2}};
    const export_tensor *bad[] = {&too_many, &uneven, &outside};
    for (int k = 0; k < 3; k++) {
        export_options options;
        export_options_init(&options);
        options.format = EXPORT_HDF5;
        snprintf(out, sizeof out, "%s/bad%d.h5", dir, k);
        cr_assert_eq(export_run(r, bad[k], 1, &options, out, NULL), TP_ERR_ARG, "map %d accepted", k);
        cr_assert(!path_exists(out));
    }
    ckpt_reader_close(r);
    free_tensors(t, 2);
}

/* ====================================================== 1. safetensors */

Test(export, safetensors_random_tensors)
{
    seed_random(101);
    static const char *const metadata[] = {"source", "tp-toolkit test", "step", "7", NULL};
    int transposed = 0;
    for (int iter = 0; iter < 8; iter++) {
        char src[700], out[700], file[800];
        snprintf(src, sizeof src, "%s/src%d", dir, iter);
        snprintf(out, sizeof out, "%s/hf%d", dir, iter);
        test_tensor tensors[10];
        ckpt_layout layout;
        int n = random_source(src, tensors, 10, &layout);
        ckpt_reader *r = open_reader(src);

        /* Listed last-first, under other names; some matrices transposed. */
        export_tensor specs[10];
        char names[10][64];
        int which[10];
        for (int k = 0; k < n; k++) {
            int i = n - 1 - k;
            which[k] = i;
            snprintf(names[k], sizeof names[k], "transformer.h.%d.weight", k);
            specs[k] = (export_tensor){.source = tensors[i].name, .name = names[k], .transpose = tensors[i].desc.ndim == 2 && rnd(0, 1)};
            transposed += specs[k].transpose;
        }
        export_options options;
        export_options_init(&options);
        options.format = EXPORT_SAFETENSORS;
        options.dtype = iter % 4 == 0 ? -1 : (int)rnd(0, 2);
        options.threads = (int)rnd(1, 2);
        options.metadata = metadata;
        options.config_json = "{\"model_type\": \"gpt2\"}";
        export_summary summary;
        cr_assert_eq(export_run(r, specs, n, &options, out, &summary), TP_OK, "%s", tp_errmsg());

        /* One file, config.json beside it, no index, no staging leftover. */
        int leftovers = 0;
        cr_assert_eq(count_entries(out, NULL), 2, "model.safetensors and config.json");
        count_entries(dir, &leftovers);
        cr_assert_eq(leftovers, 0, "staging leftover in %s", dir);
        snprintf(file, sizeof file, "%s/config.json", out);
        blob config = read_all(file);
        cr_assert(config.size == strlen(options.config_json) && !memcmp(config.bytes, options.config_json, config.size),
                  "config.json holds the caller's text");
        free(config.bytes);

        snprintf(file, sizeof file, "%s/model.safetensors", out);
        st_parsed p;
        st_parse(file, &p);
        st_check_metadata(&p, metadata);
        cr_assert_eq(cJSON_GetArraySize(p.header), n + 1, "every tensor and __metadata__");
        int64_t total = 0;
        for (int k = 0; k < n; k++) {
            const test_tensor *t = &tensors[which[k]];
            tp_dtype dtype = options.dtype >= 0 ? (tp_dtype)options.dtype : t->desc.dtype;
            st_check_exported(&p, names[k], t, specs[k].transpose, dtype);
            total += tensor_bytes(t, dtype);
        }
        st_free(&p);
        cr_assert_eq(summary.tensors, n);
        cr_assert_eq(summary.files, 1);
        cr_assert_eq(summary.tensor_bytes, total);

        /* The library's own reader agrees. */
        safetensors_set *set;
        cr_assert_eq(safetensors_open(&set, out), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(safetensors_count(set), n);
        cr_assert_str_eq(safetensors_metadata(set, "format"), "pt");
        cr_assert_str_eq(safetensors_metadata(set, "source"), "tp-toolkit test");
        cr_assert_null(safetensors_metadata(set, "absent"));
        for (int k = 0; k < n; k++) {
            const safetensors_info *info = safetensors_find(set, names[k]);
            cr_assert_not_null(info, "%s", names[k]);
            cr_assert_eq(info->ndim, tensors[which[k]].desc.ndim);
            cr_assert_str_eq(info->file, file);
        }
        cr_assert_null(safetensors_find(set, tensors[0].name), "source names are not output names");
        safetensors_close(set);
        ckpt_reader_close(r);
        free_tensors(tensors, n);
    }
    cr_assert_gt(transposed, 0, "the random tensors included a transposed matrix");
}

/* ======================================================== 2. sharding */

Test(export, safetensors_shards_and_index)
{
    seed_random(202);
    test_tensor t[7];
    fixed_tensor(&t[0], "model/a", TP_FP32, 2, (int64_t[]){10, 10}, 0, CKPT_ANCHOR_LAYER, 0);  /* 400 B */
    fixed_tensor(&t[1], "model/b", TP_BF16, 1, (int64_t[]){30}, -1, CKPT_ANCHOR_FIRST, 0);     /* 60 */
    fixed_tensor(&t[2], "model/c", TP_FP32, 2, (int64_t[]){40, 30}, 1, CKPT_ANCHOR_LAYER, 1);  /* 4800 */
    fixed_tensor(&t[3], "model/d", TP_FP16, 2, (int64_t[]){8, 25}, 0, CKPT_ANCHOR_LAYER, 1);   /* 400 */
    fixed_tensor(&t[4], "model/e", TP_FP32, 1, (int64_t[]){50}, 0, CKPT_ANCHOR_LAST, 0);       /* 200 */
    fixed_tensor(&t[5], "model/f", TP_BF16, 2, (int64_t[]){20, 20}, -1, CKPT_ANCHOR_LAST, 0);  /* 800 */
    fixed_tensor(&t[6], "model/g", TP_FP32, 1, (int64_t[]){300}, -1, CKPT_ANCHOR_FIRST, 0);    /* 1200 */
    char src[700], out[700];
    snprintf(src, sizeof src, "%s/src", dir);
    snprintf(out, sizeof out, "%s/sharded", dir);
    ckpt_layout layout = {2, 2, 1, 2, 1};
    write_tensors(src, &layout, t, 7, 0, 3);
    ckpt_reader *r = open_reader(src);

    /* a also as its transpose's copy and untransposed: equal and unequal pairs. */
    const export_tensor specs[] = {
        {.source = "model/a", .name = "h.a", .transpose = 1}, {.source = "model/b", .name = "h.b", .transpose = 0}, {.source = "model/c", .name = "h.c", .transpose = 1}, {.source = "model/d", .name = "h.d", .transpose = 0},
        {.source = "model/e", .name = "h.e", .transpose = 0}, {.source = "model/f", .name = "h.f", .transpose = 0}, {.source = "model/g", .name = "h.g", .transpose = 0}, {.source = "model/a", .name = "h.a.copy", .transpose = 1},
        {.source = "model/a", .name = "h.a.plain", .transpose = 0},
    };
    const int source_of[] = {0, 1, 2, 3, 4, 5, 6, 0, 0};
    const int count = 9;
    /* Greedy in list order, max 1000 bytes: a+b | c (4800, alone) | d+e | f | g (1200, alone) | a.copy+a.plain. */
    const int file_of[] = {0, 0, 1, 2, 2, 3, 4, 5, 5};
    const int num_files = 6;
    export_options options;
    export_options_init(&options);
    options.max_shard_bytes = 1000;
    options.threads = 2;
    export_summary summary;
    cr_assert_eq(export_run(r, specs, count, &options, out, &summary), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(summary.files, num_files);

    char file[800];
    snprintf(file, sizeof file, "%s/model.safetensors", out);
    cr_assert(!path_exists(file), "a sharded export has no model.safetensors");
    cr_assert_eq(count_entries(out, NULL), num_files + 1, "shards and the index");
    int64_t total = 0, file_bytes[6] = {0};
    int file_tensors[6] = {0};
    for (int f = 0; f < num_files; f++) {
        snprintf(file, sizeof file, "%s/model-%05d-of-%05d.safetensors", out, f + 1, num_files);
        st_parsed p;
        st_parse(file, &p);
        st_check_metadata(&p, NULL);
        for (int i = 0; i < count; i++) {
            const test_tensor *s = &t[source_of[i]];
            const cJSON *entry = cJSON_GetObjectItemCaseSensitive(p.header, specs[i].name);
            if (file_of[i] != f) {
                cr_assert_null(entry, "%s is not in shard %d", specs[i].name, f + 1);
                continue;
            }
            st_check_exported(&p, specs[i].name, s, specs[i].transpose, s->desc.dtype);
            file_bytes[f] += tensor_bytes(s, s->desc.dtype);
            file_tensors[f]++;
        }
        cr_assert_eq(cJSON_GetArraySize(p.header), file_tensors[f] + 1, "shard %d holds only its tensors", f + 1);
        cr_assert(file_tensors[f] == 1 || file_bytes[f] <= options.max_shard_bytes,
                  "shard %d: %lld bytes in %d tensors exceed the shard size", f + 1, (long long)file_bytes[f],
                  file_tensors[f]);
        total += file_bytes[f];
        st_free(&p);
    }
    cr_assert_eq(summary.tensor_bytes, total);

    /* The index: total_size and the file of every tensor. */
    snprintf(file, sizeof file, "%s/model.safetensors.index.json", out);
    blob text = read_all(file);
    cJSON *index = cJSON_ParseWithLength((const char *)text.bytes, text.size);
    free(text.bytes);
    cr_assert(cJSON_IsObject(index), "index is JSON");
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(index, "metadata"), "total_size");
    cr_assert_eq(json_int(size), total, "metadata.total_size");
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map"), *entry;
    cr_assert_eq(cJSON_GetArraySize(map), count, "weight_map entries");
    const char *previous = "";
    cJSON_ArrayForEach(entry, map)
    {
        cr_assert_lt(strcmp(previous, entry->string), 0, "weight_map keys sorted: %s after %s", entry->string, previous);
        previous = entry->string;
    }
    for (int i = 0; i < count; i++) {
        char want[64];
        snprintf(want, sizeof want, "model-%05d-of-%05d.safetensors", file_of[i] + 1, num_files);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(map, specs[i].name);
        cr_assert(cJSON_IsString(v) && !strcmp(v->valuestring, want), "weight_map[%s] should be %s", specs[i].name, want);
    }
    cJSON_Delete(index);

    /* The directory opens as one set. */
    safetensors_set *set;
    cr_assert_eq(safetensors_open(&set, out), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(safetensors_count(set), count);
    for (int i = 0; i < count; i++) {
        const safetensors_info *info = safetensors_find(set, specs[i].name);
        cr_assert_not_null(info);
        char want[64];
        snprintf(want, sizeof want, "model-%05d-of-%05d.safetensors", file_of[i] + 1, num_files);
        cr_assert_str_eq(strrchr(info->file, '/') + 1, want);
    }
    /* Comparisons across shards: equal, unequal, and with a tensor that is not there. */
    static const struct {
        const char *what, *first, *second;
        int status;
        int equal; /* when status is TP_OK */
    } comparisons[] = {
        {"the same transposed source twice", "h.a", "h.a.copy", TP_OK, 1},
        {"a tensor and its transpose", "h.a", "h.a.plain", TP_OK, 0},
        {"a tensor that is not there", "h.a", "h.nothing", TP_ERR_NOT_FOUND, 0},
    };
    for (size_t k = 0; k < sizeof comparisons / sizeof comparisons[0]; k++) {
        int equal = -1;
        int status = safetensors_equal(set, comparisons[k].first, comparisons[k].second, &equal);
        cr_assert_eq(status, comparisons[k].status, "%s: expected %s, got %s: %s", comparisons[k].what,
                     tp_status_name(comparisons[k].status), tp_status_name(status), tp_errmsg());
        if (status == TP_OK) cr_assert_eq(equal, comparisons[k].equal, "%s: equal is %d", comparisons[k].what, equal);
    }
    safetensors_close(set);
    ckpt_reader_close(r);
    free_tensors(t, 7);
}

/* ============================================ 3. multi-band streaming */

/* Bytes of buffers one output row needs at most: the row in the output dtype,
 * plus the stored dtype's row where it is converted or transposed. */
static int64_t row_estimate(const test_tensor *s, int transpose, int dtype)
{
    int64_t shape[CKPT_MAX_DIMS];
    written_shape(s, transpose, shape);
    tp_dtype out = dtype >= 0 ? (tp_dtype)dtype : s->desc.dtype;
    int64_t per_element = (int64_t)tp_dtype_size(out);
    if (transpose || out != s->desc.dtype) per_element += (int64_t)tp_dtype_size(s->desc.dtype);
    return elements_of(shape + 1, s->desc.ndim - 1) * per_element;
}

static int64_t widest_row(const test_tensor *const *sources, const export_tensor *specs, int count, int dtype)
{
    int64_t widest = 0;
    for (int i = 0; i < count; i++) {
        int64_t bytes = row_estimate(sources[i], specs[i].transpose, dtype);
        if (bytes > widest) widest = bytes;
    }
    return widest;
}

/* The smallest memory limit export_run accepts for these tensors (the limit
 * may count the process's own memory beside the buffers), by bisection.
 * Planning comes before the output is staged, so with an output path whose
 * parent does not exist a limit that is enough fails with
 * TP_ERR_NOT_FOUND and one too small with TP_ERR_LIMIT; nothing is
 * written either way. */
static int64_t smallest_memory_limit(ckpt_reader *r, const export_tensor *specs, int count,
                                     const export_options *options)
{
    char nowhere[800];
    snprintf(nowhere, sizeof nowhere, "%s/no-such-directory/out", dir);
    export_options o = *options;
    int64_t fails = 0, plans = (int64_t)1 << 40;
    o.memory_limit = plans;
    cr_assert_eq(export_run(r, specs, count, &o, nowhere, NULL), TP_ERR_NOT_FOUND, "%s", tp_errmsg());
    while (plans - fails > 1) {
        o.memory_limit = fails + (plans - fails) / 2;
        int status = export_run(r, specs, count, &o, nowhere, NULL);
        cr_assert(status == TP_ERR_LIMIT || status == TP_ERR_NOT_FOUND, "limit %lld: %s",
                  (long long)o.memory_limit, tp_errmsg());
        if (status == TP_ERR_LIMIT) fails = o.memory_limit;
        else plans = o.memory_limit;
    }
    return plans;
}

/* export_run with memory_limit about `margin` bytes above the smallest
 * accepted one. The process's own memory grows between the bisection and
 * the run (AddressSanitizer's quarantine keeps what each refused try freed:
 * 16 to 20 KiB a try, as much as a fixed step of 16 KiB, so 64 such steps
 * fell short), so a refusal raises the limit by what the process has grown
 * since the bisection, and a page more each try: the limit that plans leaves about
 * margin bytes for the buffers whatever the drift. */
static void export_tight(ckpt_reader *r, const export_tensor *specs, int count, export_options *options,
                         int64_t margin, const char *out, export_summary *summary)
{
    int64_t least = smallest_memory_limit(r, specs, count, options), held = resident_bytes();
    options->memory_limit = least + margin;
    int status = TP_ERR_LIMIT;
    for (int attempt = 0; attempt < 64 && status == TP_ERR_LIMIT; attempt++) {
        status = export_run(r, specs, count, options, out, summary);
        int64_t grown = resident_bytes() - held;
        if (status == TP_ERR_LIMIT)
            options->memory_limit = least + margin + (grown > 0 ? grown : 0) + 4096 * (int64_t)(attempt + 1);
    }
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
}

/* Tensors whose rows are wide, transposed and not, converted and not. */
static int band_tensors(test_tensor *t)
{
    fixed_tensor(&t[0], "model/wide.w", TP_FP32, 2, (int64_t[]){2048, 64}, 1, CKPT_ANCHOR_LAYER, 0);
    fixed_tensor(&t[1], "model/tall.w", TP_BF16, 2, (int64_t[]){1024, 64}, 0, CKPT_ANCHOR_LAYER, 1);
    fixed_tensor(&t[2], "model/cube.w", TP_FP16, 3, (int64_t[]){20, 6, 10}, 1, CKPT_ANCHOR_FIRST, 0);
    fixed_tensor(&t[3], "model/bias", TP_FP32, 1, (int64_t[]){200}, 0, CKPT_ANCHOR_LAST, 0);
    fixed_tensor(&t[4], "model/sq.w", TP_BF16, 2, (int64_t[]){30, 30}, -1, CKPT_ANCHOR_LAST, 0);
    fixed_tensor(&t[5], "model/long.w", TP_FP32, 2, (int64_t[]){256, 2048}, 0, CKPT_ANCHOR_LAST, 0);
    return 6;
}

/* wide: 64 output rows of 2048 values; long: 256 rows of 2048; tall.T: 64 rows of 1024. */
static const export_tensor band_specs[] = {
    {.source = "model/wide.w", .name = "wide", .transpose = 1}, {.source = "model/tall.w", .name = "tall", .transpose = 0},     {.source = "model/cube.w", .name = "cube", .transpose = 0}, {.source = "model/bias", .name = "bias", .transpose = 0},
    {.source = "model/sq.w", .name = "sq", .transpose = 1},     {.source = "model/tall.w", .name = "tall.T", .transpose = 1}, {.source = "model/long.w", .name = "long", .transpose = 0},
};
static const int band_source[] = {0, 1, 2, 3, 4, 1, 5};
#define BAND_COUNT 7

Test(export, many_bands_under_tight_memory_limit)
{
    seed_random(303);
    test_tensor t[6];
    int n = band_tensors(t);
    const test_tensor *sources[BAND_COUNT];
    for (int i = 0; i < BAND_COUNT; i++) sources[i] = &t[band_source[i]];
    char src[700], out[700], file[800];
    snprintf(src, sizeof src, "%s/src", dir);
    ckpt_layout layout = {2, 1, 1, 2, 1};
    write_tensors(src, &layout, t, n, 0, 1);
    ckpt_reader *r = open_reader(src);
    static const int dtypes[] = {-1, TP_FP32, TP_BF16, TP_FP16};
    for (int iter = 0; iter < 4; iter++) {
        snprintf(out, sizeof out, "%s/bands%d", dir, iter);
        export_options options;
        export_options_init(&options);
        options.dtype = dtypes[iter];
        options.threads = 2;
        progress seen;
        atomic_init(&seen.bytes, 0);
        atomic_init(&seen.calls, 0);
        options.on_bytes = on_bytes;
        options.progress_ctx = &seen;
        export_summary summary;
        /* About four of the widest rows beyond the least that plans. There a
         * second thread's overhead does not fit: export runs on one. */
        int64_t widest = widest_row(sources, band_specs, BAND_COUNT, options.dtype);
        export_tight(r, band_specs, BAND_COUNT, &options, 4 * widest, out, &summary);
        cr_assert_eq(summary.threads, 1, "a limit too tight for two threads' shares runs one, not %d", summary.threads);
        /* Bands of about five widest rows: wide and long alone take 13 and 26 or more. */
        cr_assert_geq(atomic_load(&seen.calls), 30, "only %d bands", atomic_load(&seen.calls));
        cr_assert_eq(atomic_load(&seen.bytes), summary.tensor_bytes, "progress adds up to the tensor bytes");
        snprintf(file, sizeof file, "%s/model.safetensors", out);
        st_parsed p;
        st_parse(file, &p);
        for (int i = 0; i < BAND_COUNT; i++) {
            const test_tensor *s = sources[i];
            tp_dtype dtype = options.dtype >= 0 ? (tp_dtype)options.dtype : s->desc.dtype;
            st_check_exported(&p, band_specs[i].name, s, band_specs[i].transpose, dtype);
        }
        st_free(&p);
    }

    /* Too small for one row: refused before anything is written. */
    for (size_t k = 0; k < FORMAT_COUNT; k++) {
        const output_format *format = &output_formats[k];
        snprintf(out, sizeof out, "%s/too-small%s", dir, format->suffix);
        int entries = count_entries(dir, NULL);
        export_options options;
        export_options_init(&options);
        options.format = format->id;
        options.threads = 2;
        options.memory_limit = 2 * 1000; /* a row of wide (transposed: 2048 fp32 values) needs 8 KiB or more */
        cr_assert_eq(export_run(r, band_specs, BAND_COUNT, &options, out, NULL), TP_ERR_LIMIT, "%s: %s", format->name,
                     tp_errmsg());
        cr_assert(strstr(tp_errmsg(), "memory"), "%s: message: %s", format->name, tp_errmsg());
        assert_nothing_left(dir, out, entries);
    }
    ckpt_reader_close(r);
    free_tensors(t, n);
}

/* Progress that also keeps the largest band. */
typedef struct {
    atomic_llong largest;
} band_sizes;

static void on_band(void *ctx, int64_t bytes)
{
    band_sizes *b = ctx;
    long long seen = atomic_load(&b->largest);
    while (bytes > seen && !atomic_compare_exchange_weak(&b->largest, &seen, (long long)bytes)) {
    }
}

/* All buffers together stay within memory_limit (formats.h: "buffers of all
 * threads"; docs/EXPORT.md: "all buffers together stay within
 * --memory-limit"), also when the tensor with the largest staging buffer
 * (square, transposed) is not the one with the largest output buffer (an
 * unconverted, untransposed tensor of 4 KiB rows, many more rows than fit).
 * Whatever part of the limit a thread's share is, that tensor's bands are
 * as many of its rows as fit the share S, so its largest band B (seen by
 * the progress callback) says S < B + 4096; each thread's buffers must fit
 * in S. */
Test(export, buffers_stay_within_memory_limit)
{
    seed_random(304);
    test_tensor t[4];
    fixed_tensor(&t[0], "model/square.w", TP_FP32, 2, (int64_t[]){512, 512}, -1, CKPT_ANCHOR_FIRST, 0);
    fixed_tensor(&t[1], "model/rows.w", TP_FP32, 2, (int64_t[]){1024, 1024}, -1, CKPT_ANCHOR_FIRST, 0);
    fixed_tensor(&t[2], "model/half.w", TP_BF16, 2, (int64_t[]){1024, 2048}, -1, CKPT_ANCHOR_LAST, 0);
    fixed_tensor(&t[3], "model/bias", TP_FP32, 1, (int64_t[]){4096}, -1, CKPT_ANCHOR_LAST, 0);
    char src[700], out[700];
    snprintf(src, sizeof src, "%s/src", dir);
    ckpt_layout layout = {1, 1, 1, 1, 1};
    write_tensors(src, &layout, t, 4, 0, 1);
    ckpt_reader *r = open_reader(src);
    /* With dtype fp32 rows is the unconverted one; with bf16, half. */
    const export_tensor specs[] = {
        {.source = "model/square.w", .name = "square", .transpose = 1}, {.source = "model/rows.w", .name = "rows", .transpose = 0}, {.source = "model/half.w", .name = "half", .transpose = 0}, {.source = "model/bias", .name = "bias", .transpose = 0}};
    const test_tensor *sources[] = {&t[0], &t[1], &t[2], &t[3]};
    static const int dtypes[] = {TP_FP32, TP_BF16};
    int64_t share[2], used[2], limit[2];
    for (int iter = 0; iter < 2; iter++) {
        snprintf(out, sizeof out, "%s/buffers%d", dir, iter);
        export_options options;
        export_options_init(&options);
        options.dtype = dtypes[iter];
        options.threads = 2;
        band_sizes bands;
        atomic_init(&bands.largest, 0);
        options.on_bytes = on_band;
        options.progress_ctx = &bands;
        export_summary summary;
        export_tight(r, specs, 4, &options, 2 * 4 * widest_row(sources, specs, 4, options.dtype), out, &summary);
        share[iter] = atomic_load(&bands.largest) + 4096;
        used[iter] = summary.buffer_memory / summary.threads;
        limit[iter] = options.memory_limit;
    }
    ckpt_reader_close(r);
    free_tensors(t, 4);
    for (int iter = 0; iter < 2; iter++)
        cr_expect_leq(used[iter], share[iter],
                      "dtype %s, memory limit %lld: %lld bytes of buffers per thread, the share of the limit is at most %lld",
                      tp_dtype_name((tp_dtype)dtypes[iter]), (long long)limit[iter], (long long)used[iter],
                      (long long)share[iter]);
}

/* ============================================================= 4. GGUF */

typedef struct {
    const uint8_t *p;
    size_t size, pos;
} cursor;

static void take(cursor *c, void *out, size_t n)
{
    cr_assert_leq(c->pos + n, c->size, "GGUF: read past the end at %zu", c->pos);
    memcpy(out, c->p + c->pos, n);
    c->pos += n;
}

static uint32_t take_u32(cursor *c)
{
    uint32_t v;
    take(c, &v, 4);
    return v;
}

static uint64_t take_u64(cursor *c)
{
    uint64_t v;
    take(c, &v, 8);
    return v;
}

/* A GGUF string (u64 length, bytes) into out. */
static void take_string(cursor *c, char *out, size_t cap)
{
    uint64_t n = take_u64(c);
    cr_assert_lt(n, cap, "GGUF string of %llu bytes", (unsigned long long)n);
    take(c, out, (size_t)n);
    out[n] = '\0';
}

static void expect_string(cursor *c, const char *want, const char *what)
{
    char got[256];
    take_string(c, got, sizeof got);
    cr_assert_str_eq(got, want, "%s", what);
}

static int64_t align32(int64_t n)
{
    return (n + 31) / 32 * 32;
}

/* Value types of GGUF key-values (gguf_type in ggml). */
enum { GGUF_TYPE_UINT32 = 4, GGUF_TYPE_INT32 = 5, GGUF_TYPE_FLOAT32 = 6, GGUF_TYPE_STRING = 8, GGUF_TYPE_ARRAY = 9 };

/* The key-value at c is kv, the index-th given: its key, the GGUF type
 * llama.cpp reads it as, and its value (a float bit for bit). */
static void expect_kv(cursor *c, int index, const export_kv *kv)
{
    char what[128];
    snprintf(what, sizeof what, "key %d", index);
    expect_string(c, kv->key, what);
    switch (kv->type) {
    case EXPORT_KV_STRING:
        cr_assert_eq(take_u32(c), GGUF_TYPE_STRING, "%s: string type", kv->key);
        expect_string(c, kv->string, kv->key);
        break;
    case EXPORT_KV_U32:
        cr_assert_eq(take_u32(c), GGUF_TYPE_UINT32, "%s: u32 type", kv->key);
        cr_assert_eq(take_u32(c), kv->u32, "%s", kv->key);
        break;
    case EXPORT_KV_F32: {
        cr_assert_eq(take_u32(c), GGUF_TYPE_FLOAT32, "%s: f32 type", kv->key);
        float value;
        take(c, &value, 4);
        cr_assert_eq(memcmp(&value, &kv->f32, 4), 0, "%s: bits", kv->key);
        break;
    }
    case EXPORT_KV_STRINGS:
        cr_assert_eq(take_u32(c), GGUF_TYPE_ARRAY, "%s: array type", kv->key);
        cr_assert_eq(take_u32(c), GGUF_TYPE_STRING, "%s: array of strings", kv->key);
        cr_assert_eq(take_u64(c), (uint64_t)kv->count, "%s: %lld strings", kv->key, (long long)kv->count);
        for (int64_t k = 0; k < kv->count; k++) expect_string(c, kv->strings[k], kv->key);
        break;
    case EXPORT_KV_I32S:
        cr_assert_eq(take_u32(c), GGUF_TYPE_ARRAY, "%s: array type", kv->key);
        cr_assert_eq(take_u32(c), GGUF_TYPE_INT32, "%s: array of i32", kv->key);
        cr_assert_eq(take_u64(c), (uint64_t)kv->count, "%s: %lld values", kv->key, (long long)kv->count);
        for (int64_t k = 0; k < kv->count; k++) {
            int32_t value;
            take(c, &value, 4);
            cr_assert_eq(value, kv->i32s[k], "%s[%lld]", kv->key, (long long)k);
        }
        break;
    default:
        cr_assert_fail("%s: a key-value type this reader does not know", kv->key);
    }
}

Test(export, gguf_random_tensors)
{
    seed_random(404);
    static const char *const tokens[] = {"a", "bc", "<|endoftext|>"};
    static const int32_t types[] = {1, -2, 3, 2147483647};
    const export_kv kvs[] = {
        {"general.architecture", EXPORT_KV_STRING, 0, 0, "gpt2", NULL, NULL, 0},
        {"gpt2.context_length", EXPORT_KV_U32, 1024, 0, NULL, NULL, NULL, 0},
        {"gpt2.attention.layer_norm_epsilon", EXPORT_KV_F32, 0, 1e-5f, NULL, NULL, NULL, 0},
        {"tokenizer.ggml.tokens", EXPORT_KV_STRINGS, 0, 0, NULL, tokens, NULL, 3},
        {"tokenizer.ggml.token_type", EXPORT_KV_I32S, 0, 0, NULL, NULL, types, 4},
    };
    const int num_kvs = (int)(sizeof kvs / sizeof kvs[0]);
    static const int dtypes[] = {TP_FP32, TP_BF16, TP_FP16, -1, TP_BF16, TP_FP32};
    int transposed = 0;
    for (int iter = 0; iter < 6; iter++) {
        listed_source x;
        list_random_source(&x, iter, gguf_name, &transposed);
        test_tensor *t = x.t;
        int n = x.n;
        ckpt_reader *r = x.r;
        const export_tensor *specs = x.specs;
        char (*names)[64] = x.names;
        char out[700];
        snprintf(out, sizeof out, "%s/model%d.gguf", dir, iter);
        export_options options;
        export_options_init(&options);
        options.format = EXPORT_GGUF;
        options.dtype = dtypes[iter];
        options.threads = 2;
        options.kvs = kvs;
        options.num_kvs = num_kvs;
        export_summary summary;
        cr_assert_eq(export_run(r, specs, n, &options, out, &summary), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(summary.files, 1);

        /* The output dtype of each tensor: 1-D stays fp32. */
        tp_dtype out_dtype[10];
        int file_type = 0, matrices = 0;
        for (int i = 0; i < n; i++) {
            out_dtype[i] = t[i].desc.ndim == 1 ? TP_FP32 : options.dtype >= 0 ? (tp_dtype)options.dtype : t[i].desc.dtype;
            if (t[i].desc.ndim >= 2) matrices++;
        }
        if (options.dtype >= 0 && matrices)
            file_type = options.dtype == TP_BF16 ? 32 : options.dtype == TP_FP16 ? 1 : 0;

        blob file = read_all(out);
        cursor c = {file.bytes, file.size, 0};
        char magic[4];
        take(&c, magic, 4);
        cr_assert_eq(memcmp(magic, "GGUF", 4), 0, "magic");
        cr_assert_eq(take_u32(&c), 3, "version");
        cr_assert_eq(take_u64(&c), (uint64_t)n, "tensor count");
        cr_assert_eq(take_u64(&c), (uint64_t)num_kvs + 2, "key-value count: the mark, the given ones and general.file_type");
        /* The mark first, then as given, in order; general.file_type last. */
        const export_kv mark = {EXPORT_MARK_KEY, EXPORT_KV_STRING, 0, 0, EXPORT_MARK, NULL, NULL, 0};
        expect_kv(&c, -1, &mark);
        for (int k = 0; k < num_kvs; k++) expect_kv(&c, k, &kvs[k]);
        expect_string(&c, "general.file_type", "the last key");
        cr_assert_eq(take_u32(&c), GGUF_TYPE_UINT32, "general.file_type: u32 type");
        uint32_t got_file_type = take_u32(&c);
        if (options.dtype >= 0)
            cr_assert_eq(got_file_type, (uint32_t)file_type, "general.file_type for dtype %d", options.dtype);
        else
            cr_assert(got_file_type == 0 || got_file_type == 1 || got_file_type == 32, "file type %u", got_file_type);

        /* Tensor infos: dimensions fastest first, ggml types, padded running offsets. */
        int64_t offsets[10], running = 0;
        for (int i = 0; i < n; i++) {
            expect_string(&c, names[i], "tensor name");
            cr_assert_eq(take_u32(&c), (uint32_t)t[i].desc.ndim, "%s: dimensions", names[i]);
            int64_t shape[CKPT_MAX_DIMS];
            written_shape(&t[i], specs[i].transpose, shape);
            for (int d = 0; d < t[i].desc.ndim; d++)
                cr_assert_eq(take_u64(&c), (uint64_t)shape[t[i].desc.ndim - 1 - d], "%s: ne[%d]", names[i], d);
            uint32_t ggml = out_dtype[i] == TP_BF16 ? 30 : out_dtype[i] == TP_FP16 ? 1 : 0;
            cr_assert_eq(take_u32(&c), ggml, "%s: ggml type", names[i]);
            offsets[i] = (int64_t)take_u64(&c);
            cr_assert_eq(offsets[i], running, "%s: offset", names[i]);
            running += align32(tensor_bytes(&t[i], out_dtype[i]));
        }
        int64_t data_start = align32((int64_t)c.pos);
        cr_assert_eq((int64_t)file.size, data_start + running, "file size: header %zu, data %lld", c.pos,
                     (long long)running);
        for (int i = 0; i < n; i++) {
            uint8_t *want = expected_tensor(&t[i], specs[i].transpose, out_dtype[i]);
            cr_assert_eq(memcmp(file.bytes + data_start + offsets[i], want, (size_t)tensor_bytes(&t[i], out_dtype[i])), 0,
                         "%s: data", names[i]);
            free(want);
        }
        free(file.bytes);
        ckpt_reader_close(r);
        free_tensors(t, n);
    }
    cr_assert_gt(transposed, 0, "the random tensors included a transposed matrix");
}

/* ============================================================= 5. HDF5 */

static char *root_attribute(hid_t file, const char *name)
{
    cr_assert_gt(H5Aexists(file, name), 0, "root attribute %s", name);
    hid_t attr = H5Aopen(file, name, H5P_DEFAULT), type = H5Aget_type(attr);
    cr_assert(attr >= 0 && type >= 0);
    cr_assert_gt(H5Tis_variable_str(type), 0, "attribute %s: a variable-length string", name);
    cr_assert_eq(H5Tget_cset(type), H5T_CSET_UTF8, "attribute %s: UTF-8", name);
    char *value = NULL;
    cr_assert_geq(H5Aread(attr, type, &value), 0);
    char *copy = strdup(value);
    H5free_memory(value);
    H5Tclose(type);
    H5Aclose(attr);
    return copy;
}

Test(export, hdf5_random_tensors)
{
    seed_random(505);
    static const char *const metadata[] = {"architecture", "gpt2", "exported_by", "tp-ckpt", NULL};
    static const int dtypes[] = {-1, TP_BF16, TP_FP16, TP_FP32, -1};
    int transposed = 0;
    for (int iter = 0; iter < 5; iter++) {
        listed_source x;
        list_random_source(&x, iter, hdf5_name, &transposed);
        test_tensor *t = x.t;
        int n = x.n;
        ckpt_reader *r = x.r;
        const export_tensor *specs = x.specs;
        char (*names)[64] = x.names;
        char out[700];
        snprintf(out, sizeof out, "%s/merged%d.h5", dir, iter);
        export_options options;
        export_options_init(&options);
        options.format = EXPORT_HDF5;
        options.dtype = dtypes[iter];
        options.threads = 2;
        options.metadata = metadata;
        export_summary summary;
        cr_assert_eq(export_run(r, specs, n, &options, out, &summary), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(summary.files, 1);
        int leftovers = 0;
        count_entries(dir, &leftovers);
        cr_assert_eq(leftovers, 0);

        hid_t file = H5Fopen(out, H5F_ACC_RDONLY, H5P_DEFAULT);
        cr_assert_geq(file, 0, "HDF5 opens %s", out);
        char *mark = root_attribute(file, "format");
        cr_assert_str_eq(mark, EXPORT_MARK, "the mark: the root attribute format");
        free(mark);
        for (int k = 0; metadata[k]; k += 2) {
            char *value = root_attribute(file, metadata[k]);
            cr_assert_str_eq(value, metadata[k + 1], "attribute %s", metadata[k]);
            free(value);
        }
        for (int i = 0; i < n; i++) {
            tp_dtype dtype = options.dtype >= 0 ? (tp_dtype)options.dtype : t[i].desc.dtype;
            hid_t dset = H5Dopen2(file, names[i], H5P_DEFAULT);
            cr_assert_geq(dset, 0, "dataset %s", names[i]);
            hid_t space = H5Dget_space(dset), type = H5Dget_type(dset);
            hsize_t dims[CKPT_MAX_DIMS];
            cr_assert_eq(H5Sget_simple_extent_ndims(space), t[i].desc.ndim, "%s: rank", names[i]);
            H5Sget_simple_extent_dims(space, dims, NULL);
            int64_t shape[CKPT_MAX_DIMS];
            written_shape(&t[i], specs[i].transpose, shape);
            for (int d = 0; d < t[i].desc.ndim; d++) cr_assert_eq(dims[d], (hsize_t)shape[d], "%s: dim %d", names[i], d);
            cr_assert_eq(H5Tget_class(type), H5T_FLOAT, "%s: a float type", names[i]);
            hid_t dcpl = H5Dget_create_plist(dset);
            cr_assert_eq(H5Pget_layout(dcpl), H5D_CONTIGUOUS, "%s: stored contiguously", names[i]);
            H5Pclose(dcpl);
            cr_assert_eq(H5Tget_size(type), tp_dtype_size(dtype), "%s: element size", names[i]);
            size_t spos, epos, esize, mpos, msize;
            cr_assert_geq(H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize), 0);
            if (dtype == TP_BF16)
                cr_assert(spos == 15 && epos == 7 && esize == 8 && mpos == 0 && msize == 7 && H5Tget_ebias(type) == 127,
                          "%s: bf16 fields", names[i]);
            else if (dtype == TP_FP16)
                cr_assert(spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10 && H5Tget_ebias(type) == 15,
                          "%s: fp16 fields", names[i]);
            else
                cr_assert_gt(H5Tequal(type, H5T_IEEE_F32LE), 0, "%s: IEEE fp32 little-endian", names[i]);
            size_t bytes = (size_t)tensor_bytes(&t[i], dtype);
            uint8_t *got = malloc(bytes + 1);
            /* fp32 as native floats; 16-bit floats in their own (file) type: raw bytes. */
            cr_assert_geq(H5Dread(dset, dtype == TP_FP32 ? H5T_NATIVE_FLOAT : type, H5S_ALL, H5S_ALL, H5P_DEFAULT, got), 0,
                          "%s: read", names[i]);
            uint8_t *want = expected_tensor(&t[i], specs[i].transpose, dtype);
            cr_assert_eq(memcmp(got, want, bytes), 0, "%s: data", names[i]);
            free(want);
            free(got);
            H5Tclose(type);
            H5Sclose(space);
            H5Dclose(dset);
        }
        H5Fclose(file);
        ckpt_reader_close(r);
        free_tensors(t, n);
    }
    cr_assert_gt(transposed, 0, "the random tensors included a transposed matrix");
}

/* ======================================================= 6. atomicity */

/* A small source; with corrupt, a byte of model/big's data flipped. */
static void small_source(const char *path, test_tensor *t, int corrupt)
{
    fixed_tensor(&t[0], "model/big", TP_FP32, 2, (int64_t[]){64, 64}, -1, CKPT_ANCHOR_FIRST, 0);
    fixed_tensor(&t[1], "model/vec", TP_BF16, 1, (int64_t[]){64}, -1, CKPT_ANCHOR_FIRST, 0);
    ckpt_layout layout = {1, 1, 1, 1, 1};
    write_tensors(path, &layout, t, 2, 0, 1);
    if (!corrupt) return;
    char shard[800];
    snprintf(shard, sizeof shard, "%s/shard_pp00_tp00.h5", path);
    hid_t f = H5Fopen(shard, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "/tensors/model/big", H5P_DEFAULT);
    cr_assert_geq(d, 0, "dataset of model/big in %s", shard);
    haddr_t offset = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    cr_assert_neq(offset, HADDR_UNDEF);
    int fd = open(shard, O_RDWR);
    unsigned char c;
    cr_assert_eq(pread(fd, &c, 1, (off_t)offset + 5000), 1);
    c ^= 0x10;
    cr_assert_eq(pwrite(fd, &c, 1, (off_t)offset + 5000), 1);
    close(fd);
}

/* Exports that must fail, leaving nothing at the output. */
typedef struct {
    const char *what;
    export_tensor specs[2];
    int count;
    int damaged_source;
    int status;
    const char *named; /* the message names it (or NULL) */
} refused_export;

static const refused_export refused_exports[] = {
    {"a missing tensor", {{.source = "model/big", .name = "big", .transpose = 0}, {.source = "model/nothing", .name = "nothing", .transpose = 0}}, 2, 0, TP_ERR_NOT_FOUND, "model/nothing"},
    {"a vector transposed", {{.source = "model/big", .name = "big", .transpose = 0}, {.source = "model/vec", .name = "vec", .transpose = 1}}, 2, 0, TP_ERR_ARG, "model/vec"},
    {"one name twice", {{.source = "model/big", .name = "same", .transpose = 0}, {.source = "model/vec", .name = "same", .transpose = 0}}, 2, 0, TP_ERR_ARG, "same"},
    {"nothing to export", {{.source = "model/big", .name = "big", .transpose = 1}, {.source = "model/vec", .name = "vec", .transpose = 0}}, 0, 0, TP_ERR_ARG, "nothing to export"},
    {"a damaged block", {{.source = "model/big", .name = "big", .transpose = 1}, {.source = "model/vec", .name = "vec", .transpose = 0}}, 2, 1, TP_ERR_CHECKSUM, "model/big"},
};

/* A file in the format, at out (safetensors: out/model.safetensors, out
 * existing), with its signature but without our mark: an HDF5 file whose
 * root attribute format is another's, a GGUF file whose first key is
 * another, safetensors weights whose __metadata__ holds "format" alone.
 * Its path goes to path; returns its bytes. */
static blob unmarked_file(export_format format, const char *out, char *path, size_t size)
{
    if (format == EXPORT_HDF5) {
        snprintf(path, size, "%s", out);
        hid_t f = H5Fcreate(out, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        cr_assert_geq(f, 0);
        hid_t type = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR);
        H5Tset_size(type, 8);
        hid_t attr = H5Acreate2(f, "format", type, space, H5P_DEFAULT, H5P_DEFAULT);
        cr_assert_geq(attr, 0);
        cr_assert_geq(H5Awrite(attr, type, "tp-ckpt"), 0);
        H5Aclose(attr);
        H5Sclose(space);
        H5Tclose(type);
        H5Fclose(f);
    } else if (format == EXPORT_GGUF) {
        snprintf(path, size, "%s", out);
        /* GGUF v3, no tensors, one key: general.name = "x". */
        static const uint8_t gguf[] = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                                       12, 0, 0, 0, 0, 0, 0, 0, 'g', 'e', 'n', 'e', 'r', 'a', 'l', '.', 'n', 'a', 'm',
                                       'e', 8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 'x'};
        write_all(path, gguf, sizeof gguf);
    } else {
        snprintf(path, size, "%s/model.safetensors", out);
        static const char header[] = "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                                     "\"data_offsets\":[0,4]}}      "; /* padded to a multiple of 8 */
        uint8_t bytes[8 + sizeof header - 1 + 4] = {0};
        uint64_t n = sizeof header - 1;
        memcpy(bytes, &n, 8);
        memcpy(bytes + 8, header, n);
        cr_assert(mkdir(out, 0755) == 0 || errno == EEXIST);
        write_all(path, bytes, sizeof bytes);
    }
    return read_all(path);
}

Test(export, outputs_are_atomic)
{
    seed_random(606);
    char src[700], bad[700], outdir[700], out[800], marker[900];
    snprintf(src, sizeof src, "%s/src", dir);
    snprintf(bad, sizeof bad, "%s/bad", dir);
    snprintf(outdir, sizeof outdir, "%s/out", dir);
    cr_assert_eq(mkdir(outdir, 0755), 0);
    test_tensor t[2], u[2];
    small_source(src, t, 0);
    small_source(bad, u, 1);
    ckpt_reader *r = open_reader(src), *broken = open_reader(bad);
    const export_tensor good[] = {{.source = "model/big", .name = "big", .transpose = 1}, {.source = "model/vec", .name = "vec", .transpose = 0}};
    for (size_t i = 0; i < FORMAT_COUNT; i++) {
        const output_format *format = &output_formats[i];
        export_options options;
        export_options_init(&options);
        options.format = format->id;
        options.threads = 2;

        /* An existing output is refused and left as it was. */
        snprintf(out, sizeof out, "%s/existing%s", outdir, format->suffix);
        blob old = {(uint8_t *)"not an export\n", 14};
        if (format->id == EXPORT_SAFETENSORS) {
            cr_assert_eq(mkdir(out, 0755), 0);
            snprintf(marker, sizeof marker, "%s/marker.txt", out);
        } else {
            snprintf(marker, sizeof marker, "%s", out);
        }
        write_all(marker, old.bytes, old.size);
        int entries = count_entries(outdir, NULL);
        cr_assert_eq(export_run(r, good, 2, &options, out, NULL), TP_ERR_EXISTS, "%s: %s", format->name, tp_errmsg());
        cr_assert(strstr(tp_errmsg(), out), "%s: message names the path: %s", format->name, tp_errmsg());
        cr_assert(same_file(marker, &old), "%s: the existing output is untouched", format->name);
        cr_assert_eq(count_entries(outdir, NULL), entries, "%s: no staging leftover", format->name);
        if (format->id == EXPORT_SAFETENSORS) cr_assert_eq(count_entries(out, NULL), 1);

        /* Nor does --force replace what is not an earlier export in this format. */
        options.overwrite = 1;
        cr_assert_eq(export_run(r, good, 2, &options, out, NULL), TP_ERR_EXISTS, "%s: %s", format->name, tp_errmsg());
        cr_assert(strstr(tp_errmsg(), out) && strstr(tp_errmsg(), "is not a"), "%s: message says what is there: %s",
                  format->name, tp_errmsg());
        cr_assert(same_file(marker, &old), "%s: the unrelated output is untouched by --force", format->name);
        cr_assert_eq(count_entries(outdir, NULL), entries, "%s: no staging leftover after a refused --force",
                     format->name);

        /* Nor a file of the format that is not ours: the signature without the mark. */
        cr_assert_eq(unlink(marker), 0);
        blob foreign = unmarked_file(format->id, out, marker, sizeof marker);
        cr_assert_eq(export_run(r, good, 2, &options, out, NULL), TP_ERR_EXISTS, "%s: %s", format->name, tp_errmsg());
        cr_assert(strstr(tp_errmsg(), out) && strstr(tp_errmsg(), format->id == EXPORT_HDF5 ? "root attribute" : "mark"),
                  "%s: the message says the mark is missing: %s", format->name, tp_errmsg());
        cr_assert(same_file(marker, &foreign), "%s: the unmarked file is untouched by --force", format->name);
        free(foreign.bytes);

        /* An earlier export survives a failing export with overwrite. */
        cr_assert_eq(unlink(marker), 0);
        if (format->id == EXPORT_SAFETENSORS) cr_assert_eq(rmdir(out), 0);
        options.overwrite = 0;
        cr_assert_eq(export_run(r, good, 2, &options, out, NULL), TP_OK, "%s: %s", format->name, tp_errmsg());
        options.overwrite = 1;
        if (format->id == EXPORT_SAFETENSORS) snprintf(marker, sizeof marker, "%s/model.safetensors", out);
        blob earlier = read_all(marker);
        cr_assert_eq(export_run(broken, good, 2, &options, out, NULL), TP_ERR_CHECKSUM, "%s: %s", format->name,
                     tp_errmsg());
        cr_assert(same_file(marker, &earlier), "%s: the earlier export survives a failed overwrite", format->name);
        free(earlier.bytes);
        cr_assert_eq(count_entries(outdir, NULL), entries, "%s: no staging leftover after a failed overwrite",
                     format->name);

        /* With overwrite it is replaced by a complete export. */
        cr_assert_eq(export_run(r, good, 2, &options, out, NULL), TP_OK, "%s: %s", format->name, tp_errmsg());
        cr_assert_eq(count_entries(outdir, NULL), entries, "%s: no staging leftover after the overwrite", format->name);
        if (format->id == EXPORT_SAFETENSORS) {
            st_parsed p;
            st_parse(marker, &p);
            st_check_exported(&p, "big", &t[0], 1, TP_FP32);
            st_free(&p);
        } else if (format->id == EXPORT_GGUF) {
            blob now = read_all(out);
            cr_assert(now.size > 4 && !memcmp(now.bytes, "GGUF", 4), "a GGUF file replaced the old one");
            free(now.bytes);
        } else {
            hid_t f = H5Fopen(out, H5F_ACC_RDONLY, H5P_DEFAULT);
            cr_assert_geq(f, 0, "an HDF5 file replaced the old one");
            cr_assert_gt(H5Lexists(f, "big", H5P_DEFAULT), 0);
            H5Fclose(f);
        }
        options.overwrite = 0;

        /* Failures leave nothing: before the output is staged, and while
         * streaming (a damaged block of the source). */
        snprintf(out, sizeof out, "%s/failed%s", outdir, format->suffix);
        entries = count_entries(outdir, NULL);
        for (size_t k = 0; k < sizeof refused_exports / sizeof refused_exports[0]; k++) {
            const refused_export *x = &refused_exports[k];
            int got = export_run(x->damaged_source ? broken : r, x->specs, x->count, &options, out, NULL);
            cr_assert_eq(got, x->status, "%s, %s: expected %s, got %s: %s", format->name, x->what,
                         tp_status_name(x->status), tp_status_name(got), tp_errmsg());
            if (x->named)
                cr_assert(strstr(tp_errmsg(), x->named), "%s, %s: the message names %s: %s", format->name, x->what,
                          x->named, tp_errmsg());
            assert_nothing_left(outdir, out, entries);
        }
    }

    /* Refusals particular to one format, with the default options: GGUF
     * names of 64 bytes or more; in HDF5 a dataset where a group is needed,
     * which fails only once the file exists. */
    char long_name[80];
    memset(long_name, 'x', 64);
    long_name[64] = '\0';
    const struct format_refusal {
        const char *what;
        export_format format;
        const char *file;
        export_tensor specs[2];
        int count;
        int status; /* TP_OK: any failure will do */
    } format_refusals[] = {
        {"a GGUF name of 64 bytes", EXPORT_GGUF, "long.gguf", {{.source = "model/vec", .name = long_name, .transpose = 0}}, 1, TP_ERR_ARG},
        {"HDF5 dataset blk where blk/w needs a group", EXPORT_HDF5, "clash.h5",
         {{.source = "model/vec", .name = "blk", .transpose = 0}, {.source = "model/big", .name = "blk/w", .transpose = 0}}, 2, TP_OK},
    };
    int entries = count_entries(outdir, NULL);
    for (size_t k = 0; k < sizeof format_refusals / sizeof format_refusals[0]; k++) {
        const struct format_refusal *x = &format_refusals[k];
        snprintf(out, sizeof out, "%s/%s", outdir, x->file);
        export_options options;
        export_options_init(&options);
        options.format = x->format;
        assert_refused(export_run(r, x->specs, x->count, &options, out, NULL), x->status, x->what);
        assert_nothing_left(outdir, out, entries);
    }

    ckpt_reader_close(broken);
    ckpt_reader_close(r);
    free_tensors(t, 2);
    free_tensors(u, 2);
}

/* --force replaces a safetensors export's directory whole, so an entry it
 * takes for the export's by name alone must be the export's file: a
 * directory named config.json or model.safetensors.index.json (someone's
 * notes in it) was taken for one, and went with the rest. */
Test(export, force_keeps_a_directory_named_as_an_export_file)
{
    seed_random(640);
    char src[700], out[700], inside[800], notes[900];
    snprintf(src, sizeof src, "%s/src", dir);
    snprintf(out, sizeof out, "%s/hf", dir);
    test_tensor t[2];
    small_source(src, t, 0);
    ckpt_reader *r = open_reader(src);
    const export_tensor good[] = {{.source = "model/big", .name = "big", .transpose = 1}, {.source = "model/vec", .name = "vec", .transpose = 0}};
    export_options options;
    export_options_init(&options);
    options.format = EXPORT_SAFETENSORS;
    options.config_json = "{}";
    cr_assert_eq(export_run(r, good, 2, &options, out, NULL), TP_OK, "%s", tp_errmsg());
    options.overwrite = 1;
    static const char *const names[] = {"config.json", "model.safetensors.index.json"};
    blob kept = {(uint8_t *)"not an export's\n", 16};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(inside, sizeof inside, "%s/%s", out, names[i]);
        cr_assert(unlink(inside) == 0 || errno == ENOENT);
        cr_assert_eq(mkdir(inside, 0755), 0);
        snprintf(notes, sizeof notes, "%s/notes.txt", inside);
        write_all(notes, kept.bytes, kept.size);
        cr_assert_eq(export_run(r, good, 2, &options, out, NULL), TP_ERR_EXISTS, "%s: a directory: %s", names[i],
                     tp_errmsg());
        cr_assert(strstr(tp_errmsg(), names[i]) && strstr(tp_errmsg(), "directory"),
                  "the refusal names the directory %s: %s", names[i], tp_errmsg());
        cr_assert(same_file(notes, &kept), "%s: what the directory holds is untouched", names[i]);
        cr_assert_eq(unlink(notes), 0);
        cr_assert_eq(rmdir(inside), 0);
    }
    /* As files they are the export's: replaced. */
    write_all(inside, kept.bytes, kept.size);
    cr_assert_eq(export_run(r, good, 2, &options, out, NULL), TP_OK, "%s", tp_errmsg());
    ckpt_reader_close(r);
    free_tensors(t, 2);
}

/* The same tensors give the same bytes whatever the layout, thread count
 * and band size they come through (docs/EXPORT.md "Deterministic"). */
Test(export, outputs_are_deterministic)
{
    seed_random(650);
    static const int tps[] = {1, 2, 4};
    test_tensor t[8];
    int n = random_tensors(t, 8, tps, 3, 2);
    char a[700], b[700], out[2][800], file[2][1700];
    snprintf(a, sizeof a, "%s/tp1pp1", dir);
    snprintf(b, sizeof b, "%s/tp4pp2", dir);
    write_tensors(a, &(ckpt_layout){1, 1, 1, 2, 1}, t, n, 0, 1);
    write_tensors(b, &(ckpt_layout){4, 2, 1, 2, 1}, t, n, 1, 1);
    ckpt_reader *readers[2] = {open_reader(a), open_reader(b)};
    export_tensor specs[8];
    char names[8][64];
    for (int i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "w.%d", i);
        specs[i] = (export_tensor){.source = t[i].name, .name = names[i], .transpose = t[i].desc.ndim == 2 && i % 2};
    }
    static const char *const metadata[] = {"k", "v", NULL};
    for (size_t i = 0; i < FORMAT_COUNT; i++) {
        const output_format *format = &output_formats[i];
        for (int k = 0; k < 2; k++) {
            snprintf(out[k], sizeof out[k], "%s/det-%d%s", dir, k, format->suffix);
            export_options options;
            export_options_init(&options);
            options.format = format->id;
            options.dtype = format->id == EXPORT_GGUF ? TP_BF16 : -1;
            options.metadata = metadata;
            options.threads = k ? 2 : 1;
            if (k == 0) {
                cr_assert_eq(export_run(readers[k], specs, n, &options, out[k], NULL), TP_OK, "%s", tp_errmsg());
            } else { /* in many bands */
                const test_tensor *sources[8];
                for (int i = 0; i < n; i++) sources[i] = &t[i];
                export_tight(readers[k], specs, n, &options, 2 * 2 * widest_row(sources, specs, n, options.dtype), out[k],
                             NULL);
            }
            snprintf(file[k], sizeof file[k], "%s%s", out[k], format->data_file);
        }
        blob first = read_all(file[0]);
        cr_assert(same_file(file[1], &first), "%s: %s and %s differ", format->name, file[0], file[1]);
        free(first.bytes);
    }
    ckpt_reader_close(readers[0]);
    ckpt_reader_close(readers[1]);
    free_tensors(t, n);
}

/* ============================================ 7. malformed safetensors */

/* A safetensors file byte by byte: the 8-byte little-endian header length
 * (length < 0: the JSON's own), the header text, then data bytes. */
static void write_st(const char *path, int64_t length, const char *json, const void *data, size_t data_size)
{
    size_t text = strlen(json);
    uint64_t n = length >= 0 ? (uint64_t)length : (uint64_t)text;
    uint8_t *bytes = malloc(8 + text + data_size + 1);
    for (int k = 0; k < 8; k++) bytes[k] = (uint8_t)(n >> (8 * k));
    memcpy(bytes + 8, json, text);
    if (data_size) memcpy(bytes + 8 + text, data, data_size);
    write_all(path, bytes, 8 + text + data_size);
    free(bytes);
}

static void expect_open_fails(const char *path, int status, const char *named)
{
    safetensors_set *set = NULL;
    int got = safetensors_open(&set, path);
    if (got == TP_OK) safetensors_close(set);
    cr_assert_eq(got, status, "%s: expected %s, got %s: %s", path, tp_status_name(status), tp_status_name(got),
                 tp_errmsg());
    cr_assert(strstr(tp_errmsg(), named), "the message names %s: %s", named, tp_errmsg());
}

/* One file that breaks a rule of the format: its header length (-1: the
 * JSON's own), header, and how many data bytes follow. */
typedef struct {
    const char *name;
    int64_t length;
    const char *header;
    size_t data_bytes;
    const char *also_named; /* besides the path, the message names this (or NULL) */
} malformed_file;

#define ONE_F32 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}"
static const malformed_file malformed_files[] = {
    {"beyond", 1000, ONE_F32, 8, NULL},
    {"huge-length", (int64_t)1 << 62, "{}", 0, NULL},
    {"not-json", -1, "this is not JSON at all", 0, NULL},
    {"truncated-json", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],", 8, NULL},
    {"array", -1, "[1, 2]  ", 0, NULL},
    {"dtype", -1, "{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "F33"},
    {"size", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, NULL},
    {"size2", -1, "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,8]}}", 8, NULL},
    {"backwards", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8,
     "tensor a: data_offsets [8, 0] must be [begin, end] with begin <= end"},
    /* Offsets a JSON number cannot hold exactly (cJSON reads a double: exact
     * up to 2^53): said as past the data, with the tensor and the value, not
     * as begin > end, which holds. */
    {"end-past-2^53", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,18446744073709551616]}}", 8,
     "tensor a: data_offsets end 18446744073709551616 lies past the end of the data, which holds 8 bytes (and at or "
     "beyond 2^53, where a JSON number stops holding integers exactly)"},
    {"begin-past-2^53", -1,
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[9007199254740994,9007199254741002]}}", 8,
     "tensor a: data_offsets begin 9007199254740994 lies past the end of the data, which holds 8 bytes"},
    {"fractional-offset", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.5]}}", 8,
     "tensor a: data_offsets end 8.5 is not a nonnegative integer"},
    {"string-offset", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[\"0\",8]}}", 8,
     "tensor a: data_offsets begin is not a number"},
    {"no-offsets", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, NULL},
    {"overlap", -1,
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
     12, NULL},
    {"same-place", -1,
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
     8, NULL},
    {"gap", -1,
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
     20, NULL},
    {"not-from-zero", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, NULL},
    {"trailing", -1, ONE_F32, 12, "the file holds 12 (trailing bytes)"},
    {"truncated-data", -1, ONE_F32, 6, "tensor a [0, 8) runs past the end of the data, which holds 6 bytes"},
    /* Sizes right, b far past the data: said as that, not as a gap of bytes the file lacks. */
    {"past-the-data", -1,
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1000000,1000008]}}",
     16, "tensor b [1000000, 1000008) runs past the end of the data, which holds 16 bytes"},
    {"metadata", -1,
     "{\"__metadata__\":{\"format\":\"pt\",\"layers\":12},"
     "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
     8, NULL},
    {"metadata-array", -1, "{\"__metadata__\":[\"pt\"],\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
     8, NULL},
    {"negative-shape", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, NULL},
    {"twice", -1,
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     8, NULL},
};

/* A sharded directory: part-1 holds a (F32 [2]), part-2 holds b (F16 [2]);
 * index.json variants that do not describe them, and what is refused. */
static const struct {
    const char *what, *index;
    int status;
    const char *named;
} shard_indexes[] = {
    {"a tensor missing from its shard",
     "{\"metadata\":{\"total_size\":12},\"weight_map\":{\"a\":\"part-1.safetensors\","
     "\"b\":\"part-2.safetensors\",\"c\":\"part-2.safetensors\"}}",
     TP_ERR_FORMAT, "tensor c is listed in part-2.safetensors"},
    {"a tensor listed in another shard", "{\"weight_map\":{\"a\":\"part-2.safetensors\",\"b\":\"part-2.safetensors\"}}",
     TP_ERR_FORMAT, "part-2.safetensors"},
    {"shards swapped", "{\"weight_map\":{\"b\":\"part-1.safetensors\",\"a\":\"part-2.safetensors\"}}", TP_ERR_FORMAT,
     "model.safetensors.index.json"},
    {"a shard that is not there", "{\"weight_map\":{\"a\":\"part-1.safetensors\",\"b\":\"part-3.safetensors\"}}",
     TP_ERR_NOT_FOUND, "part-3.safetensors"},
    {"no weight map", "{\"metadata\":{}}", TP_ERR_FORMAT, "model.safetensors.index.json"},
};

Test(export, safetensors_open_rejects_malformed_files)
{
    uint8_t data[64];
    for (int k = 0; k < 64; k++) data[k] = (uint8_t)(k * 7 + 1);
    char path[800];
    /* Too short for the header length. */
    static const struct {
        const char *name, *bytes;
        size_t size;
    } short_files[] = {{"short", "\x10\0\0\0\0", 5}, {"empty", "", 0}};
    for (size_t i = 0; i < sizeof short_files / sizeof short_files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, short_files[i].name);
        write_all(path, short_files[i].bytes, short_files[i].size);
        expect_open_fails(path, TP_ERR_FORMAT, path);
    }
    for (size_t i = 0; i < sizeof malformed_files / sizeof malformed_files[0]; i++) {
        const malformed_file *m = &malformed_files[i];
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, m->name);
        write_st(path, m->length, m->header, data, m->data_bytes);
        expect_open_fails(path, TP_ERR_FORMAT, path);
        if (m->also_named) cr_assert(strstr(tp_errmsg(), m->also_named), "%s: names %s: %s", m->name, m->also_named, tp_errmsg());
    }

    /* Nothing to open: not there at all, or a directory with neither
     * model.safetensors nor an index. */
    static const struct {
        const char *name;
        int directory;
    } nothing_to_open[] = {{"absent.safetensors", 0}, {"emptydir", 1}};
    for (size_t i = 0; i < sizeof nothing_to_open / sizeof nothing_to_open[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, nothing_to_open[i].name);
        if (nothing_to_open[i].directory) cr_assert_eq(mkdir(path, 0755), 0);
        expect_open_fails(path, TP_ERR_NOT_FOUND, path);
    }

    /* A sharded directory, with indexes that do not describe it... */
    char file[900];
    snprintf(path, sizeof path, "%s/sharded", dir);
    cr_assert_eq(mkdir(path, 0755), 0);
    snprintf(file, sizeof file, "%s/part-1.safetensors", path);
    write_st(file, -1, ONE_F32, data, 8);
    snprintf(file, sizeof file, "%s/part-2.safetensors", path);
    write_st(file, -1, "{\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", data, 4);
    snprintf(file, sizeof file, "%s/model.safetensors.index.json", path);
    for (size_t i = 0; i < sizeof shard_indexes / sizeof shard_indexes[0]; i++) {
        write_all(file, shard_indexes[i].index, strlen(shard_indexes[i].index));
        safetensors_set *set = NULL;
        int got = safetensors_open(&set, path);
        if (got == TP_OK) safetensors_close(set);
        cr_assert_eq(got, shard_indexes[i].status, "%s: expected %s, got %s: %s", shard_indexes[i].what,
                     tp_status_name(shard_indexes[i].status), tp_status_name(got), tp_errmsg());
        cr_assert(strstr(tp_errmsg(), shard_indexes[i].named), "%s: the message names %s: %s", shard_indexes[i].what,
                  shard_indexes[i].named, tp_errmsg());
    }
    /* ... and with a correct index it opens. */
    const char *index = "{\"metadata\":{\"total_size\":12},\"weight_map\":{\"a\":\"part-1.safetensors\",\"b\":\"part-2.safetensors\"}}";
    write_all(file, index, strlen(index));
    safetensors_set *set;
    cr_assert_eq(safetensors_open(&set, path), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(safetensors_count(set), 2);
    cr_assert_eq(safetensors_find(set, "b")->dtype, TP_FP16);
    safetensors_close(set);
}
#undef ONE_F32

/* model.safetensors.index.json's metadata.total_size against the shards
 * (part-1: a F32 [2], part-2: a F16 [2]; 12 bytes of tensors): said as a
 * warning when it matches neither the tensors' bytes nor the files' (an
 * index of another copy of the model, another dtype: here 24), silent when
 * it matches either (huggingface_hub counts tensor bytes, mlx-examples'
 * save_weights counted file sizes) or is absent; opened all the same, as
 * transformers loads such a directory. */
Test(export, safetensors_index_total_size_is_checked)
{
    static const char part1[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    static const char part2[] = "{\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}";
    uint8_t data[8] = {0};
    char path[800], file[900];
    snprintf(path, sizeof path, "%s/total", dir);
    cr_assert_eq(mkdir(path, 0755), 0);
    snprintf(file, sizeof file, "%s/part-1.safetensors", path);
    write_st(file, -1, part1, data, 8);
    snprintf(file, sizeof file, "%s/part-2.safetensors", path);
    write_st(file, -1, part2, data, 4);
    long long file_bytes = (long long)(8 + strlen(part1) + 8 + 8 + strlen(part2) + 4);
    char by_files[64];
    snprintf(by_files, sizeof by_files, "{\"total_size\":%lld}", file_bytes);
    static const char map[] = "\"weight_map\":{\"a\":\"part-1.safetensors\",\"b\":\"part-2.safetensors\"}}";
    const struct {
        const char *what, *metadata; /* the index's metadata object, NULL: none */
        const char *warned;          /* in the warning, NULL: none */
    } cases[] = {
        {"the tensors' bytes", "{\"total_size\":12}", NULL},
        {"the files' bytes", by_files, NULL},
        {"no total_size", "{\"format\":\"pt\"}", NULL},
        {"no metadata", NULL, NULL},
        {"twice the tensors' bytes (another dtype)", "{\"total_size\":24}",
         "model.safetensors.index.json: metadata.total_size says 24 bytes, but the 2 shards' tensors hold 12 (their "
         "files "},
        {"a fraction (a bool counted as 1/8 byte)", "{\"total_size\":12.125}", "total_size says 12.125 bytes"},
        {"a string", "{\"total_size\":\"12\"}", "metadata.total_size is not a byte count; the shards' tensors hold 12 bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char index[600];
        snprintf(index, sizeof index, "{%s%s%s%s", cases[i].metadata ? "\"metadata\":" : "",
                 cases[i].metadata ? cases[i].metadata : "", cases[i].metadata ? "," : "", map);
        snprintf(file, sizeof file, "%s/model.safetensors.index.json", path);
        write_all(file, index, strlen(index));
        safetensors_set *set = NULL;
        cr_assert_eq(safetensors_open(&set, path), TP_OK, "%s: opened: %s", cases[i].what, tp_errmsg());
        const char *warning = safetensors_warning(set);
        if (cases[i].warned)
            cr_assert(strstr(warning, cases[i].warned) && strstr(warning, path), "%s: the warning says '%s': '%s'",
                      cases[i].what, cases[i].warned, warning);
        else
            cr_assert_str_empty(warning, "%s: nothing to say: '%s'", cases[i].what, warning);
        cr_assert_eq(safetensors_count(set), 2);
        safetensors_close(set);
    }
}

/* An empty tensor takes no bytes; the reference implementation sorts by
 * (begin, end), so one at an offset where another tensor begins is valid. */
Test(export, safetensors_open_accepts_empty_tensor_between_others)
{
    uint8_t data[16] = {0};
    static const struct {
        const char *order, *header;
    } files[] = {
        {"empty tensor listed last",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
         "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}"},
        {"empty tensor listed between",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}"},
    };
    for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
        char path[800];
        snprintf(path, sizeof path, "%s/empty-between%zu.safetensors", dir, k);
        write_st(path, -1, files[k].header, data, 16);
        safetensors_set *set = NULL;
        int status = safetensors_open(&set, path);
        /* Expected, not asserted: the other order is still tried when this one fails. */
        cr_expect_eq(status, TP_OK, "%s: a valid file with an empty tensor: %s", files[k].order, tp_errmsg());
        cr_expect(status != TP_OK || safetensors_count(set) == 3, "%s: three tensors", files[k].order);
        safetensors_close(set);
    }
}

/* The header must be JSON and nothing else (the reference parser refuses
 * trailing characters); only spaces may pad it. */
Test(export, safetensors_open_rejects_trailing_garbage_in_header)
{
    uint8_t data[8] = {0};
    char path[800];
    snprintf(path, sizeof path, "%s/garbage.safetensors", dir);
    write_st(path, -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}garbage", data, 8);
    safetensors_set *set = NULL;
    int status = safetensors_open(&set, path);
    safetensors_close(set);
    cr_assert_eq(status, TP_ERR_FORMAT, "a header with trailing garbage: got %s", tp_status_name(status));
}

/* The header limit, SAFETENSORS_MAX_HEADER (32 MiB, docs/EXPORT.md), the
 * export's too: a length at it is within the limit (here it runs past the
 * end of the small file), one beyond it is refused naming the limit. */
Test(export, safetensors_header_limit_is_one_for_reading_and_writing)
{
    char path[800];
    snprintf(path, sizeof path, "%s/long-header.safetensors", dir);
    write_st(path, (int64_t)32 << 20, "{}", NULL, 0);
    expect_open_fails(path, TP_ERR_FORMAT, "runs past the end");
    write_st(path, ((int64_t)32 << 20) + 1, "{}", NULL, 0);
    expect_open_fails(path, TP_ERR_FORMAT, "exceeds the format's limit of 33554432 bytes");
}

/* model.safetensors beside model.safetensors.index.json: transformers loads
 * the single file and never reads the index, this reader took the index's
 * shards; refused, naming both and which one transformers loads. */
Test(export, safetensors_directory_with_both_single_file_and_index_is_refused)
{
    uint8_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    char path[800], file[900];
    snprintf(path, sizeof path, "%s/both", dir);
    cr_assert_eq(mkdir(path, 0755), 0);
    snprintf(file, sizeof file, "%s/model-00001-of-00001.safetensors", path);
    write_st(file, -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, 8);
    snprintf(file, sizeof file, "%s/model.safetensors.index.json", path);
    const char *index = "{\"weight_map\":{\"a\":\"model-00001-of-00001.safetensors\"}}";
    write_all(file, index, strlen(index));
    safetensors_set *set = NULL;
    cr_assert_eq(safetensors_open(&set, path), TP_OK, "the sharded directory alone opens: %s", tp_errmsg());
    safetensors_close(set);
    snprintf(file, sizeof file, "%s/model.safetensors", path);
    write_st(file, -1, "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, 8);
    expect_open_fails(path, TP_ERR_FORMAT, "holds both model.safetensors and model.safetensors.index.json");
    cr_assert(strstr(tp_errmsg(), path) && strstr(tp_errmsg(), "transformers loads model.safetensors"), "%s",
              tp_errmsg());
}

/* A valid file whose header is not padded: data at odd offsets of the file. */
Test(export, unpadded_header_imports)
{
    seed_random(707);
    /* a: bf16 [4, 6] -> target [4, 6] split on rows; b: f32 [4] replicated;
     * c: f16 [6, 4], the transpose of target [4, 6] fp32. */
    uint8_t data[48 + 16 + 48];
    for (size_t k = 0; k < sizeof data; k++) data[k] = (uint8_t)next_random();
    const char *json = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"a\":{\"dtype\":\"BF16\",\"shape\":[4,6],\"data_offsets\":[0,48]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[48,64]},"
                       "\"c\":{\"dtype\":\"F16\",\"shape\":[6,4],\"data_offsets\":[64,112]}}";
    char header[600];
    snprintf(header, sizeof header, "%s%s", json, strlen(json) % 2 ? "" : " ");
    cr_assert_eq(strlen(header) % 2, 1, "odd header length");
    char path[800], out[800];
    snprintf(path, sizeof path, "%s/odd.safetensors", dir);
    write_st(path, -1, header, data, sizeof data);
    safetensors_set *set;
    cr_assert_eq(safetensors_open(&set, path), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(safetensors_count(set), 3);
    const safetensors_info *c = safetensors_find(set, "c");
    cr_assert(c && c->dtype == TP_FP16 && c->supported && c->ndim == 2 && c->shape[0] == 6 && c->shape[1] == 4);

    test_tensor t[3];
    fixed_tensor(&t[0], "model/a", TP_BF16, 2, (int64_t[]){4, 6}, 0, CKPT_ANCHOR_FIRST, 0);
    fixed_tensor(&t[1], "model/b", TP_FP32, 1, (int64_t[]){4}, -1, CKPT_ANCHOR_FIRST, 0);
    fixed_tensor(&t[2], "model/c", TP_FP32, 2, (int64_t[]){4, 6}, 1, CKPT_ANCHOR_LAST, 0);
    /* The expected logical tensors, from the file's bytes. */
    memcpy(t[0].logical, data, 48);
    memcpy(t[1].logical, data + 48, 16);
    test_tensor source_c;
    fixed_tensor(&source_c, "c", TP_FP16, 2, (int64_t[]){6, 4}, -1, CKPT_ANCHOR_LAST, 0);
    memcpy(source_c.logical, data + 64, 48);
    uint8_t *c_want = expected_tensor(&source_c, 1, TP_FP32);
    memcpy(t[2].logical, c_want, 96);
    free(c_want);

    ckpt_tensor_desc descs[3] = {t[0].desc, t[1].desc, t[2].desc};
    const export_tensor map[] = {{.source = NULL, .name = "a", .transpose = 0}, {.source = NULL, .name = "b", .transpose = 0}, {.source = NULL, .name = "c", .transpose = 1}};
    ckpt_layout layout = {2, 1, 1, 1, 1};
    import_options options;
    import_options_init(&options);
    options.threads = 2;
    snprintf(out, sizeof out, "%s/imported", dir);
    cr_assert_eq(import_run(set, descs, map, 3, &layout, NULL, &options, out), TP_OK, "%s", tp_errmsg());
    safetensors_close(set);
    ckpt_reader *r = open_reader(out);
    for (int i = 0; i < 3; i++) {
        int k = ckpt_reader_find(r, t[i].name);
        cr_assert_geq(k, 0, "%s", t[i].name);
        size_t bytes = (size_t)tensor_bytes(&t[i], t[i].desc.dtype);
        uint8_t *got = malloc(bytes);
        int64_t start[CKPT_MAX_DIMS] = {0};
        cr_assert_eq(ckpt_reader_read_region(r, k, start, t[i].desc.shape, got, bytes), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(memcmp(got, t[i].logical, bytes), 0, "%s imported from an unaligned offset", t[i].name);
        free(got);
    }
    ckpt_reader_close(r);
    free_tensors(t, 3);
    free(source_c.logical);
}

/* ============================================================ 8. import */

/* Every tensor at path equals its expected logical bytes, and padding is zero. */
static void check_imported(const char *path, const test_tensor *t, uint8_t *const *want, int n)
{
    ckpt_reader *r = open_reader(path);
    cr_assert_eq(ckpt_reader_num_tensors(r), n);
    int tp = ckpt_reader_layout(r)->tp;
    for (int i = 0; i < n; i++) {
        int k = ckpt_reader_find(r, t[i].name);
        cr_assert_geq(k, 0, "%s imported", t[i].name);
        const ckpt_tensor_desc *d = ckpt_reader_tensor(r, k);
        cr_assert(ckpt_tensor_equal_layout(d, &t[i].desc), "%s: layout as described", t[i].name);
        cr_assert_eq(d->dtype, t[i].desc.dtype);
        size_t bytes = (size_t)tensor_bytes(&t[i], t[i].desc.dtype);
        uint8_t *got = malloc(bytes + 1);
        int64_t start[CKPT_MAX_DIMS] = {0};
        cr_assert_eq(ckpt_reader_read_region(r, k, start, t[i].desc.shape, got, bytes), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(memcmp(got, want[i], bytes), 0, "%s at tp=%d: values differ", t[i].name, tp);
        free(got);
        int64_t n_elements = elements_of(t[i].desc.shape, t[i].desc.ndim);
        cr_assert_eq(ckpt_reader_digest(r, k), naive_digest(want[i], tp_dtype_size(d->dtype), n_elements),
                     "%s: logical digest", t[i].name);
        for (int p = 0; p < ckpt_piece_count(d, tp); p++) {
            cr_assert_eq(ckpt_reader_check_padding(r, k, p), TP_OK, "%s piece %d: %s", t[i].name, p, tp_errmsg());
            cr_assert_eq(ckpt_reader_verify_piece(r, k, p), TP_OK, "%s piece %d: %s", t[i].name, p, tp_errmsg());
        }
    }
    ckpt_reader_close(r);
}

Test(export, import_into_layouts)
{
    seed_random(808);
    int transposed = 0;
    for (int iter = 0; iter < 3; iter++) {
        char src[700], hf[700], out[800];
        snprintf(src, sizeof src, "%s/src%d", dir, iter);
        snprintf(hf, sizeof hf, "%s/hf%d", dir, iter);
        static const int tps[] = {1, 2, 4};
        test_tensor t[10];
        int n = random_tensors(t, 10, tps, 3, 2);
        for (int i = 0; i < n; i++)
            if (t[i].desc.dtype == TP_FP16) t[i].desc.dtype = TP_BF16; /* fp32 and bf16 only */
        ckpt_layout layout = {tps[rnd(0, 2)], (int)rnd(1, 2), 1, 2, 1};
        write_tensors(src, &layout, t, n, 0, 5);
        ckpt_reader *r = open_reader(src);
        export_tensor specs[10], map[10];
        char names[10][64];
        for (int i = 0; i < n; i++) {
            snprintf(names[i], sizeof names[i], "h.%d.%s", i, i % 2 ? "weight" : "bias");
            specs[i] = (export_tensor){.source = t[i].name, .name = names[i], .transpose = t[i].desc.ndim == 2 && rnd(0, 1)};
            transposed += specs[i].transpose;
            map[i] = (export_tensor){.source = NULL, .name = names[i], .transpose = specs[i].transpose};
        }
        export_options options;
        export_options_init(&options);
        options.threads = 2;
        options.max_shard_bytes = iter == 1 ? 2000 : 0; /* a sharded directory once */
        cr_assert_eq(export_run(r, specs, n, &options, hf, NULL), TP_OK, "%s", tp_errmsg());
        ckpt_reader_close(r);

        safetensors_set *set;
        cr_assert_eq(safetensors_open(&set, hf), TP_OK, "%s", tp_errmsg());
        ckpt_tensor_desc descs[10];
        uint8_t *want[10];
        for (int i = 0; i < n; i++) {
            descs[i] = t[i].desc;
            want[i] = t[i].logical;
        }
        /* The tensors' random bits hold NaNs and infinities: carried bit for
         * bit, and the tensors holding any counted as a widening finds them. */
        int with_nonfinite = 0;
        for (int i = 0; i < n; i++) {
            int64_t count = elements_of(t[i].desc.shape, t[i].desc.ndim), bad = 0;
            float *wide = malloc((size_t)count * sizeof *wide + 1);
            cr_assert(wide);
            convert_to_f32(want[i], t[i].desc.dtype, wide, count);
            for (int64_t e = 0; e < count; e++) bad += !isfinite(wide[e]);
            with_nonfinite += bad > 0;
            free(wide);
        }
        import_options io;
        import_options_init(&io);
        io.threads = 2;
        io.allow_nonfinite = 1;
        ckpt_nonfinite found;
        io.nonfinite = &found;
        ckpt_train_state state = {42, 336, "{\"arch\":\"gpt2\"}", NULL, NULL, NULL};
        for (int k = 0; k < 3; k++)
            for (int pp = 1; pp <= 2; pp++) {
                ckpt_layout to = {tps[k], pp, 1, 2, 1};
                snprintf(out, sizeof out, "%s/imported%d_tp%d_pp%d", dir, iter, tps[k], pp);
                cr_assert_eq(import_run(set, descs, map, n, &to, &state, &io, out), TP_OK, "tp=%d pp=%d: %s", tps[k], pp,
                             tp_errmsg());
                cr_assert_eq(found.tensors, with_nonfinite, "tp=%d: %d tensors said to hold NaN or infinities, %d do (%s)",
                             tps[k], found.tensors, with_nonfinite, found.summary);
                check_imported(out, t, want, n);
                ckpt_reader *back = open_reader(out);
                cr_assert_eq(ckpt_reader_state(back)->step, 42);
                ckpt_reader_close(back);
            }
        safetensors_close(set);

        /* Through fp32 and back to the stored dtypes: converted as convert_numbers does. */
        snprintf(hf, sizeof hf, "%s/hf%d-fp32", dir, iter);
        r = open_reader(src);
        options.dtype = TP_FP32;
        cr_assert_eq(export_run(r, specs, n, &options, hf, NULL), TP_OK, "%s", tp_errmsg());
        ckpt_reader_close(r);
        cr_assert_eq(safetensors_open(&set, hf), TP_OK, "%s", tp_errmsg());
        for (int i = 0; i < n; i++) {
            int64_t count = elements_of(t[i].desc.shape, t[i].desc.ndim);
            uint8_t *wide = malloc((size_t)count * 4);
            want[i] = malloc((size_t)count * 4);
            convert_numbers(t[i].logical, t[i].desc.dtype, wide, TP_FP32, count);
            convert_numbers(wide, TP_FP32, want[i], t[i].desc.dtype, count);
            free(wide);
        }
        snprintf(out, sizeof out, "%s/imported%d-narrowed", dir, iter);
        ckpt_layout to = {2, 2, 1, 2, 1};
        cr_assert_eq(import_run(set, descs, map, n, &to, &state, &io, out), TP_OK, "%s", tp_errmsg());
        check_imported(out, t, want, n);
        for (int i = 0; i < n; i++) free(want[i]);
        safetensors_close(set);
        free_tensors(t, n);
    }
    cr_assert_gt(transposed, 0, "the random tensors included a transposed matrix");
}

Test(export, import_checks_sources_before_writing)
{
    seed_random(909);
    test_tensor t[2];
    fixed_tensor(&t[0], "model/w", TP_FP32, 2, (int64_t[]){4, 6}, 1, CKPT_ANCHOR_FIRST, 0);
    fixed_tensor(&t[1], "model/v", TP_BF16, 1, (int64_t[]){6}, -1, CKPT_ANCHOR_FIRST, 0);
    char path[800], out[800];
    snprintf(path, sizeof path, "%s/in.safetensors", dir);
    uint8_t data[96 + 12 + 16];
    memcpy(data, t[0].logical, 96);
    memcpy(data + 96, t[1].logical, 12);
    for (int k = 0; k < 16; k++) data[108 + k] = (uint8_t)k;
    write_st(path, -1,
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[4,6],\"data_offsets\":[0,96]},"
             "\"v\":{\"dtype\":\"BF16\",\"shape\":[6],\"data_offsets\":[96,108]},"
             "\"ints\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[108,124]}}",
             data, sizeof data);
    safetensors_set *set;
    cr_assert_eq(safetensors_open(&set, path), TP_OK, "%s", tp_errmsg());
    const safetensors_info *ints = safetensors_find(set, "ints");
    cr_assert(ints && !ints->supported && !strcmp(ints->dtype_name, "I32"), "I32 parses, unsupported");
    ckpt_tensor_desc descs[2] = {t[0].desc, t[1].desc};
    ckpt_layout layout = {2, 1, 1, 1, 1};
    import_options options;
    import_options_init(&options);
    snprintf(out, sizeof out, "%s/ckpt", dir);
    int entries = count_entries(dir, NULL);

    /* The good mapping works (so the failures below are the sources' fault). */
    const export_tensor good[] = {{.source = NULL, .name = "w", .transpose = 0}, {.source = NULL, .name = "v", .transpose = 0}};
    char ok_out[800];
    snprintf(ok_out, sizeof ok_out, "%s/ok", dir);
    cr_assert_eq(import_run(set, descs, good, 2, &layout, NULL, &options, ok_out), TP_OK, "%s", tp_errmsg());
    uint8_t *want[2] = {t[0].logical, t[1].logical};
    check_imported(ok_out, t, want, 2);
    entries++;

    /* Sources that do not fit their targets: refused before anything is written. */
    ckpt_tensor_desc int_target = t[1].desc;
    int_target.shape[0] = 4;
    const struct {
        const char *what;
        export_tensor map[2];
        int int_target; /* the second target is int_target (an I32 source's shape) */
        int status;     /* TP_OK: any failure will do */
        const char *named;
    } refused[] = {
        {"a missing source", {{.source = NULL, .name = "w", .transpose = 0}, {.source = NULL, .name = "nothing", .transpose = 0}}, 0, TP_ERR_NOT_FOUND, "nothing"},
        {"a source of the transposed shape", {{.source = NULL, .name = "w", .transpose = 1}, {.source = NULL, .name = "v", .transpose = 0}}, 0, TP_OK, "model/w"}, /* [6, 4] expected */
        {"sources swapped", {{.source = NULL, .name = "v", .transpose = 0}, {.source = NULL, .name = "w", .transpose = 0}}, 0, TP_OK, "model/w"},
        {"an I32 source", {{.source = NULL, .name = "w", .transpose = 0}, {.source = NULL, .name = "ints", .transpose = 0}}, 1, TP_OK, "I32"},
        {"a vector transposed", {{.source = NULL, .name = "w", .transpose = 0}, {.source = NULL, .name = "v", .transpose = 1}}, 0, TP_OK, "model/v"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
        ckpt_tensor_desc targets[2] = {t[0].desc, refused[k].int_target ? int_target : t[1].desc};
        assert_refused(import_run(set, targets, refused[k].map, 2, &layout, NULL, &options, out), refused[k].status,
                       refused[k].what);
        cr_assert(strstr(tp_errmsg(), refused[k].named), "%s: the message names %s: %s", refused[k].what,
                  refused[k].named, tp_errmsg());
        assert_nothing_left(dir, out, entries);
    }

    /* An existing output is refused without overwrite. */
    cr_assert_eq(import_run(set, descs, good, 2, &layout, NULL, &options, ok_out), TP_ERR_EXISTS, "%s",
                 tp_errmsg());
    safetensors_close(set);
    free_tensors(t, 2);
}
