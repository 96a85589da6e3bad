/* index.c: index.json, serialized and parsed with cJSON (docs/FORMAT.md "Index"). */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "attrs.h"
#include "index.h"
#include "namemap.h"

void ckpt_shard_file_name(int pp, int tp, int dp, char *out, size_t out_size)
{
    if (dp > 0) snprintf(out, out_size, "shard_pp%02d_tp%02d_dp%02d.h5", pp, tp, dp);
    else snprintf(out, out_size, "shard_pp%02d_tp%02d.h5", pp, tp);
}

int ckpt_shard_file_parse(const char *name, int *pp, int *tp, int *dp)
{
    int end = 0;
    char canonical[64];
    *dp = 0;
    if (sscanf(name, "shard_pp%d_tp%d_dp%d.h5%n", pp, tp, dp, &end) == 3 && end > 0 && !name[end]) {
        if (*pp < 0 || *tp < 0 || *dp < 1) return 0;
    } else if (sscanf(name, "shard_pp%d_tp%d.h5%n", pp, tp, &end) != 2 || end == 0 || name[end] || *pp < 0 || *tp < 0) {
        return 0;
    }
    ckpt_shard_file_name(*pp, *tp, *dp, canonical, sizeof canonical);
    return strcmp(canonical, name) == 0;
}

/* ------------------------------------------------------------- serialize */

static cJSON *int_array(const int64_t *values, int count)
{
    cJSON *array = cJSON_CreateArray();
    for (int i = 0; array && i < count; i++)
        cJSON_AddItemToArray(array, cJSON_CreateNumber((double)values[i]));
    return array;
}

/* Parses text as JSON of the wanted type ('o' object, 'a' array); NULL text
 * gives an empty one. */
static cJSON *parse_state_json(const char *text, char kind, const char *what, int *status)
{
    if (!text || !*text) return kind == 'o' ? cJSON_CreateObject() : cJSON_CreateArray();
    cJSON *value = cJSON_Parse(text);
    if (!value || (kind == 'o' && !cJSON_IsObject(value)) || (kind == 'a' && !cJSON_IsArray(value))) {
        cJSON_Delete(value);
        *status = tp_fail(TP_ERR_ARG, "training state: %s is not a JSON %s", what,
                            kind == 'o' ? "object" : "array");
        return NULL;
    }
    return value;
}

/* A contiguous piece's "offset" and "length", a compressed one's "chunks"
 * ([offset, length, filter mask] per block): docs/FORMAT.md section 3. */
static void extents_to_json(cJSON *po, const ckpt_index_piece *ip)
{
    if (ip->num_extents == 0) return;
    if (!ip->compressed) {
        cJSON_AddNumberToObject(po, "offset", (double)ip->extents[0].offset);
        cJSON_AddNumberToObject(po, "length", (double)ip->extents[0].length);
        return;
    }
    cJSON *chunks = cJSON_AddArrayToObject(po, "chunks");
    for (int64_t c = 0; chunks && c < ip->num_extents; c++) {
        int64_t triple[3] = {ip->extents[c].offset, ip->extents[c].length, ip->extents[c].filter_mask};
        cJSON_AddItemToArray(chunks, int_array(triple, 3));
    }
}

static cJSON *tensor_to_json(const ckpt_index_tensor *it, int tp, int partial)
{
    const ckpt_tensor_desc *t = &it->tensor.desc;
    cJSON *o = cJSON_CreateObject();
    int64_t padded[CKPT_MAX_DIMS];
    ckpt_padded_shape(t, tp, padded);
    cJSON_AddStringToObject(o, "name", t->name);
    cJSON_AddStringToObject(o, "role", t->role);
    cJSON_AddStringToObject(o, "param", t->param);
    cJSON_AddStringToObject(o, "dtype", tp_dtype_name(t->dtype));
    cJSON_AddItemToObject(o, "shape", int_array(t->shape, t->ndim));
    cJSON_AddItemToObject(o, "padded_shape", int_array(padded, t->ndim));
    cJSON *part = cJSON_AddObjectToObject(o, "partition");
    if (t->partition.kind == CKPT_SPLIT) {
        cJSON_AddStringToObject(part, "kind", "split");
        cJSON_AddNumberToObject(part, "axis", t->partition.axis);
        cJSON_AddItemToObject(part, "segments",
                              int_array(t->partition.segments, t->partition.num_segments));
        cJSON_AddNumberToObject(part, "granule", (double)t->partition.granule);
        cJSON_AddNumberToObject(part, "pad_multiple", (double)t->partition.pad_multiple);
        if (t->partition.replicate_small_segments) cJSON_AddTrueToObject(part, "replicate_small_segments");
    } else {
        cJSON_AddStringToObject(part, "kind", "replicated");
    }
    cJSON_AddStringToObject(o, "anchor", ckpt_anchor_name(t->anchor));
    cJSON_AddNumberToObject(o, "layer", (double)t->layer);
    cJSON_AddNumberToObject(o, "stage", it->stage);
    cJSON_AddNumberToObject(o, "checksum_block_rows", (double)it->block_rows);
    char digest[17];
    uint64_t sum = 0;
    for (int p = 0; p < it->num_pieces; p++)
        if (!partial || it->pieces[p].file_index >= 0) sum += it->pieces[p].digest; /* a part: its own pieces' */
    ckpt_format_checksum(sum, digest);
    cJSON_AddStringToObject(o, "digest", digest);
    if (partial) cJSON_AddNumberToObject(o, "order", (double)it->order);
    cJSON *pieces = cJSON_AddArrayToObject(o, "pieces");
    for (int p = 0; p < it->num_pieces; p++) {
        const ckpt_index_piece *ip = &it->pieces[p];
        if (partial && ip->file_index < 0) { /* in another process's part */
            cJSON_AddItemToArray(pieces, cJSON_CreateNull());
            continue;
        }
        char hex[17], piece_digest[17];
        ckpt_format_checksum(ip->checksum, hex);
        ckpt_format_checksum(ip->digest, piece_digest);
        cJSON *po = cJSON_CreateObject();
        cJSON_AddStringToObject(po, "file", ip->file);
        cJSON_AddNumberToObject(po, "tp", ip->tp);
        cJSON_AddItemToObject(po, "shape", int_array(ip->shape, t->ndim));
        cJSON_AddNumberToObject(po, "bytes", (double)ip->bytes);
        cJSON_AddStringToObject(po, "checksum", hex);
        cJSON_AddStringToObject(po, "digest", piece_digest);
        cJSON_AddBoolToObject(po, "compressed", ip->compressed);
        extents_to_json(po, ip);
        if (ip->checksums_at > 0) cJSON_AddNumberToObject(po, "checksums_at", (double)ip->checksums_at);
        cJSON_AddItemToArray(pieces, po);
    }
    return o;
}

/* The index's own checksum (format 1.3): index_checksum, the last member,
 * is XXH3-64 of every byte of the text before that member's key. The key
 * `"index_checksum":` can stand in the text only as that member: inside a
 * string its quotes would be escaped. A step, consumed_samples or any
 * other field changed by hand or by damage is then refused on reading,
 * not resumed at another data position. */
#define SEAL_KEY "\"index_checksum\":"

static const char *find_seal(const char *text, size_t length)
{
    size_t key = strlen(SEAL_KEY);
    for (size_t i = length >= key ? length - key + 1 : 0; i-- > 0;)
        if (memcmp(text + i, SEAL_KEY, key) == 0) return text + i;
    return NULL;
}

/* Appends index_checksum to a printed index: "{...}" becomes
 * "{...,\n\t\"index_checksum\":\t\"HEX\"\n}". */
static int seal(char **text)
{
    char *t = *text;
    char *close = strrchr(t, '}');
    if (!close) return tp_fail(TP_ERR_STATE, "a printed index without its closing brace");
    size_t body = (size_t)(close - t);
    while (body > 0 && (t[body - 1] == '\n' || t[body - 1] == '\t' || t[body - 1] == ' ')) body--;
    static const char separator[] = ",\n\t";
    size_t prefix = body + strlen(separator);
    char *sealed = malloc(prefix + strlen(SEAL_KEY) + 24);
    if (!sealed) return tp_fail(TP_ERR_NOMEM, "out of memory sealing the index");
    memcpy(sealed, t, body);
    memcpy(sealed + body, separator, strlen(separator));
    char hex[17];
    ckpt_format_checksum(XXH3_64bits(sealed, prefix), hex);
    sprintf(sealed + prefix, SEAL_KEY "\t\"%s\"\n}", hex);
    free(t);
    *text = sealed;
    return TP_OK;
}

/* Checks a format 1.3 index's seal: present, the last member, and equal to
 * the checksum of the text before it. */
static int check_seal(const char *text, const cJSON *root, const char *where)
{
    const cJSON *last = root->child;
    while (last && last->next) last = last->next;
    const char *key = find_seal(text, strlen(text));
    if (!key || !last || !last->string || strcmp(last->string, "index_checksum") != 0)
        return tp_fail(TP_ERR_CHECKSUM, "%s: no index_checksum as its last member (format 1.3 has one): the index "
                       "was changed or damaged", where);
    uint64_t recorded = 0;
    if (!cJSON_IsString(last) || ckpt_parse_checksum(last->valuestring, &recorded))
        return tp_fail(TP_ERR_CHECKSUM, "%s: index_checksum is not 16 hex digits", where);
    uint64_t actual = XXH3_64bits(text, (size_t)(key - text));
    if (actual != recorded) {
        char a[17], r[17];
        ckpt_format_checksum(actual, a);
        ckpt_format_checksum(recorded, r);
        return tp_fail(TP_ERR_CHECKSUM, "%s: the index's text has checksum %s, its index_checksum says %s: the index "
                       "was changed or damaged", where, a, r);
    }
    return TP_OK;
}

/* partial: a part of an index (ckpt_index_part_to_json). */
static int index_to_json(const ckpt_index *index, int partial, char **out)
{
    int status = TP_OK;
    /* A part carries no train state: the process that merges has it (an
     * rng entry per rank would make every part grow with the world). */
    const ckpt_train_state *state = &index->state, none = {0, 0, NULL, NULL, NULL, NULL};
    if (partial) state = &none;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", CKPT_FORMAT_TAG);
    int64_t version[2] = {index->major, index->minor};
    cJSON_AddItemToObject(root, "format_version", int_array(version, 2));
    cJSON_AddNumberToObject(root, "step", (double)state->step);
    cJSON *layout = cJSON_AddObjectToObject(root, "layout");
    cJSON_AddNumberToObject(layout, "tp", index->layout.tp);
    cJSON_AddNumberToObject(layout, "pp", index->layout.pp);
    cJSON_AddNumberToObject(layout, "dp", index->layout.dp);
    cJSON_AddNumberToObject(layout, "num_layers", (double)index->layout.num_layers);
    /* Format 1.5: the interleaved schedule's chunks per stage, only when
     * several (a reader that finds none takes one). */
    if (ckpt_layout_chunks(&index->layout) > 1)
        cJSON_AddNumberToObject(layout, "virtual_stages", ckpt_layout_chunks(&index->layout));
    cJSON *model = parse_state_json(state->model_json, 'o', "model", &status);
    cJSON *schedule = parse_state_json(state->schedule_json, 'o', "schedule", &status);
    cJSON *rng = parse_state_json(state->rng_json, 'a', "rng", &status);
    cJSON *user = parse_state_json(state->user_json, 'o', "user", &status);
    cJSON_AddItemToObject(root, "model", model ? model : cJSON_CreateObject());
    cJSON *train = cJSON_AddObjectToObject(root, "train");
    cJSON_AddNumberToObject(train, "consumed_samples", (double)state->consumed_samples);
    cJSON_AddItemToObject(train, "schedule", schedule ? schedule : cJSON_CreateObject());
    cJSON_AddItemToObject(train, "rng", rng ? rng : cJSON_CreateArray());
    cJSON_AddItemToObject(root, "user", user ? user : cJSON_CreateObject());
    cJSON *files = cJSON_AddArrayToObject(root, "files");
    for (int i = 0; i < index->num_files; i++) {
        if (partial && !index->files[i].name[0]) {
            cJSON_AddItemToArray(files, cJSON_CreateNull());
            continue;
        }
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "name", index->files[i].name);
        cJSON_AddNumberToObject(f, "pp", index->files[i].pp);
        cJSON_AddNumberToObject(f, "tp", index->files[i].tp);
        if (index->files[i].dp > 0) cJSON_AddNumberToObject(f, "dp", index->files[i].dp); /* format 1.6 */
        if (partial && index->files[i].has_shard_tensors)
            cJSON_AddNumberToObject(f, "shard_tensors", (double)index->files[i].shard_tensors);
        cJSON_AddNumberToObject(f, "bytes", (double)index->files[i].bytes);
        if (index->files[i].has_meta_checksum) {
            char hex[17];
            ckpt_format_checksum(index->files[i].meta_checksum, hex);
            cJSON_AddStringToObject(f, "meta_checksum", hex);
        }
        cJSON_AddItemToArray(files, f);
    }
    cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
    for (int i = 0; i < index->num_tensors; i++) {
        const ckpt_index_tensor *it = &index->tensors[i];
        int present = !partial;
        for (int p = 0; !present && p < it->num_pieces; p++) present = it->pieces[p].file_index >= 0;
        if (present) cJSON_AddItemToArray(tensors, tensor_to_json(it, index->layout.tp, partial)); /* a part: its own */
    }
    if (!status) {
        *out = cJSON_Print(root);
        if (!*out) status = tp_fail(TP_ERR_NOMEM, "cannot serialize the index");
    }
    cJSON_Delete(root);
    if (!status && !partial && (index->major > 1 || index->minor >= 3)) {
        status = seal(out);
        if (status) {
            free(*out);
            *out = NULL;
        }
    }
    return status;
}

int ckpt_index_to_json(const ckpt_index *index, char **out)
{
    return index_to_json(index, 0, out);
}

int ckpt_index_part_to_json(const ckpt_index *part, char **out)
{
    return index_to_json(part, 1, out);
}

/* ----------------------------------------------------------------- parse */

typedef struct {
    const char *where;   /* file name for messages */
    char context[300];   /* "tensor 'x'" etc. */
    int status;
    int partial;         /* a part of an index: absent files and pieces are null */
    ckpt_name_map file_at; /* file name -> its place in 'files': a lookup, not a search per piece (16,000
                              files took 13 s to parse) */
} parse_ctx;

const char *ckpt_index_file_name_of(const void *ctx, int64_t i)
{
    const ckpt_index *index = ctx;
    return index->files[i].name;
}

/* The place in 'files' of the file named `name`, or -1. */
static int listed_file(const parse_ctx *ctx, const ckpt_index *index, const char *name)
{
    return (int)ckpt_name_map_find(&ctx->file_at, name, ckpt_index_file_name_of, index);
}

static void parse_error(parse_ctx *ctx, const char *field, const char *expected)
{
    if (ctx->status) return;
    ctx->status = tp_fail(TP_ERR_FORMAT, "%s: %s%sfield '%s' missing or not %s", ctx->where,
                            ctx->context, ctx->context[0] ? ": " : "", field, expected);
}

static int64_t get_int(parse_ctx *ctx, const cJSON *obj, const char *field, int64_t min, int64_t max)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, field);
    double v = cJSON_IsNumber(item) ? item->valuedouble : NAN;
    if (!(v >= (double)min && v <= (double)max) || v != floor(v)) {
        parse_error(ctx, field, "an integer in range");
        return min;
    }
    return (int64_t)v;
}

static const char *get_string(parse_ctx *ctx, const cJSON *obj, const char *field, size_t max_len)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!cJSON_IsString(item) || strlen(item->valuestring) > max_len) {
        parse_error(ctx, field, "a string");
        return "";
    }
    return item->valuestring;
}

static int get_int_array(parse_ctx *ctx, const cJSON *obj, const char *field, int64_t *out,
                         int max_count, int64_t min)
{
    const cJSON *array = cJSON_GetObjectItemCaseSensitive(obj, field);
    int n = cJSON_IsArray(array) ? cJSON_GetArraySize(array) : -1;
    if (n < 1 || n > max_count) {
        parse_error(ctx, field, "an array of integers of the right length");
        return 0;
    }
    int i = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, array)
    {
        double v = cJSON_IsNumber(item) ? item->valuedouble : NAN;
        if (!(v >= (double)min && v <= 9.0e15) || v != floor(v)) {
            parse_error(ctx, field, "an array of integers in range");
            return 0;
        }
        out[i++] = (int64_t)v;
    }
    return n;
}

static char *dup_json(const cJSON *value)
{
    return value ? cJSON_PrintUnformatted(value) : NULL;
}

/* A piece's extents (format 1.1; absent in 1.0): "offset" and "length" of a
 * contiguous piece, "chunks" of a compressed one, one per checksum block. */
static void parse_extents(parse_ctx *ctx, const cJSON *po, ckpt_index_piece *ip,
                          const ckpt_piece_geometry *g)
{
    const cJSON *chunks = cJSON_GetObjectItemCaseSensitive(po, "chunks");
    int has_offset = cJSON_GetObjectItemCaseSensitive(po, "offset") != NULL;
    if (ctx->status || (!chunks && !has_offset)) return;
    int64_t count = ip->compressed ? g->num_blocks : 1;
    if (ip->compressed ? !cJSON_IsArray(chunks) || cJSON_GetArraySize(chunks) != count : !has_offset) {
        parse_error(ctx, ip->compressed ? "chunks" : "offset",
                    ip->compressed ? "an array of one [offset, length, mask] per block" : "an integer");
        return;
    }
    ip->extents = calloc((size_t)count, sizeof *ip->extents);
    if (!ip->extents) {
        ctx->status = tp_fail(TP_ERR_NOMEM, "%s: out of memory", ctx->where);
        return;
    }
    ip->num_extents = count;
    if (!ip->compressed) {
        ip->extents[0].offset = get_int(ctx, po, "offset", 0, (int64_t)1 << 52);
        ip->extents[0].length = get_int(ctx, po, "length", 0, (int64_t)1 << 52);
        if (!ctx->status && ip->extents[0].length != g->bytes) parse_error(ctx, "length", "the piece's size");
        return;
    }
    int64_t c = 0;
    const cJSON *chunk;
    cJSON_ArrayForEach(chunk, chunks)
    {
        int64_t triple[3] = {-1, -1, -1};
        int k = 0;
        const cJSON *item;
        if (cJSON_IsArray(chunk) && cJSON_GetArraySize(chunk) == 3)
            cJSON_ArrayForEach(item, chunk)
            {
                double v = cJSON_IsNumber(item) ? item->valuedouble : NAN;
                if (v >= 0 && v <= 4.0e15 && v == floor(v)) triple[k] = (int64_t)v;
                k++;
            }
        if (k != 3 || triple[0] < 0 || triple[1] < 1 || triple[2] < 0 || triple[2] > 3) {
            parse_error(ctx, "chunks", "[offset, length >= 1, filter mask 0..3] triples");
            return;
        }
        ip->extents[c++] = (ckpt_extent){triple[0], triple[1], (uint32_t)triple[2]};
    }
}

static void parse_tensor(parse_ctx *ctx, const cJSON *o, const ckpt_index *index,
                         ckpt_index_tensor *it)
{
    ckpt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.name = get_string(ctx, o, "name", CKPT_NAME_MAX);
    snprintf(ctx->context, sizeof ctx->context, "tensor '%s'", d.name);
    d.role = get_string(ctx, o, "role", 63);
    d.param = get_string(ctx, o, "param", CKPT_NAME_MAX);
    const char *dtype = get_string(ctx, o, "dtype", 15);
    if (!ctx->status && tp_dtype_parse(dtype, &d.dtype)) parse_error(ctx, "dtype", "fp32, bf16 or fp16");
    d.ndim = get_int_array(ctx, o, "shape", d.shape, CKPT_MAX_DIMS, 1);
    const cJSON *part = cJSON_GetObjectItemCaseSensitive(o, "partition");
    const char *kind = cJSON_IsObject(part) ? get_string(ctx, part, "kind", 15) : "";
    if (!cJSON_IsObject(part)) parse_error(ctx, "partition", "an object");
    if (strcmp(kind, "split") == 0) {
        d.partition.kind = CKPT_SPLIT;
        d.partition.axis = (int)get_int(ctx, part, "axis", 0, CKPT_MAX_DIMS - 1);
        d.partition.num_segments =
            get_int_array(ctx, part, "segments", d.partition.segments, CKPT_MAX_SEGMENTS, 1);
        d.partition.granule = get_int(ctx, part, "granule", 1, (int64_t)1 << 40);
        d.partition.pad_multiple = get_int(ctx, part, "pad_multiple", 0, 1 << 20);
        /* Format 1.4: absent means false. */
        const cJSON *replicate = cJSON_GetObjectItemCaseSensitive(part, "replicate_small_segments");
        if (replicate && !cJSON_IsBool(replicate)) parse_error(ctx, "partition.replicate_small_segments", "a boolean");
        d.partition.replicate_small_segments = cJSON_IsTrue(replicate);
    } else if (strcmp(kind, "replicated") != 0) {
        parse_error(ctx, "partition.kind", "'split' or 'replicated'");
    }
    const char *anchor = get_string(ctx, o, "anchor", 15);
    if (!ctx->status && ckpt_anchor_parse(anchor, &d.anchor)) parse_error(ctx, "anchor", "first, last or layer");
    d.layer = get_int(ctx, o, "layer", -1, (int64_t)1 << 40);
    it->stage = (int)get_int(ctx, o, "stage", 0, index->layout.pp - 1);
    it->block_rows = get_int(ctx, o, "checksum_block_rows", 1, (int64_t)1 << 40);
    const char *digest = get_string(ctx, o, "digest", 16);
    if (!ctx->status && ckpt_parse_checksum(digest, &it->digest)) parse_error(ctx, "digest", "16 hex digits");
    if (ctx->status) return;
    if (ckpt_tensor_copy_init(&it->tensor, &d) ||
        ckpt_tensor_check(&it->tensor.desc, index->layout.tp)) {
        ctx->status = tp_fail_context(TP_ERR_FORMAT, "%s", ctx->where);
        return;
    }
    const ckpt_tensor_desc *t = &it->tensor.desc;
    if (ckpt_tensor_stage(t, &index->layout) != it->stage) {
        parse_error(ctx, "stage", "the stage its anchor and layer give");
        return;
    }
    const cJSON *pieces = cJSON_GetObjectItemCaseSensitive(o, "pieces");
    int expected = ckpt_piece_count(t, index->layout.tp);
    if (!cJSON_IsArray(pieces) || cJSON_GetArraySize(pieces) != expected) {
        char want[64];
        snprintf(want, sizeof want, "an array of %d pieces", expected);
        parse_error(ctx, "pieces", want);
        return;
    }
    it->num_pieces = expected;
    it->pieces = calloc((size_t)expected, sizeof *it->pieces);
    if (!it->pieces) {
        ctx->status = tp_fail(TP_ERR_NOMEM, "%s: out of memory", ctx->where);
        return;
    }
    int64_t shape[CKPT_MAX_DIMS];
    ckpt_piece_shape(t, index->layout.tp, shape);
    if (it->block_rows > shape[0]) { /* a block is at most a whole piece */
        char want[64];
        snprintf(want, sizeof want, "at most the piece's %lld rows", (long long)shape[0]);
        parse_error(ctx, "checksum_block_rows", want);
        return;
    }
    ckpt_piece_geometry geometry;
    ckpt_piece_geometry_init(&geometry, t, index->layout.tp, it->block_rows);
    int p = 0;
    const cJSON *po;
    cJSON_ArrayForEach(po, pieces)
    {
        ckpt_index_piece *ip = &it->pieces[p];
        if (ctx->partial && cJSON_IsNull(po)) { /* in another part */
            ip->file_index = -1;
            p++;
            continue;
        }
        snprintf(ctx->context, sizeof ctx->context, "tensor '%s' piece %d", t->name, p);
        snprintf(ip->file, sizeof ip->file, "%s", get_string(ctx, po, "file", 63));
        ip->tp = (int)get_int(ctx, po, "tp", 0, index->layout.tp - 1);
        int n = get_int_array(ctx, po, "shape", ip->shape, CKPT_MAX_DIMS, 1);
        ip->bytes = get_int(ctx, po, "bytes", 0, (int64_t)1 << 52);
        const char *hex = get_string(ctx, po, "checksum", 16);
        const char *piece_digest = get_string(ctx, po, "digest", 16);
        const cJSON *compressed = cJSON_GetObjectItemCaseSensitive(po, "compressed");
        if (!cJSON_IsBool(compressed)) parse_error(ctx, "compressed", "a boolean");
        if (ctx->status) return;
        ip->compressed = cJSON_IsTrue(compressed);
        if (ckpt_parse_checksum(hex, &ip->checksum)) parse_error(ctx, "checksum", "16 hex digits");
        if (ckpt_parse_checksum(piece_digest, &ip->digest)) parse_error(ctx, "digest", "16 hex digits");
        if (ip->tp != (t->partition.kind == CKPT_SPLIT ? p : 0)) parse_error(ctx, "tp", "the piece's rank");
        if (n != t->ndim || memcmp(shape, ip->shape, sizeof(int64_t) * (size_t)n) != 0)
            parse_error(ctx, "shape", "the shape the partition gives");
        if (ip->bytes != geometry.bytes) parse_error(ctx, "bytes", "the piece's size");
        parse_extents(ctx, po, ip, &geometry);
        if (cJSON_GetObjectItemCaseSensitive(po, "checksums_at"))
            ip->checksums_at = get_int(ctx, po, "checksums_at", 1, (int64_t)1 << 52);
        ip->file_index = listed_file(ctx, index, ip->file);
        if (ip->file_index < 0) parse_error(ctx, "file", "a file listed in 'files'");
        else {
            const ckpt_index_file *file = &index->files[ip->file_index];
            ip->pp = file->pp;
            if (ip->pp != it->stage || file->tp != ip->tp)
                parse_error(ctx, "file", "the shard of the piece's stage and rank");
            else if (file->dp > 0 && ckpt_tensor_is_param(t) && index->minor < 7) /* 1.6: optimizer state only */
                parse_error(ctx, "file", "the shard's own file (a parameter before format 1.7)");
        }
        if (ctx->status) return;
        p++;
    }
    uint64_t sum = 0;
    for (p = 0; p < it->num_pieces; p++) sum += it->pieces[p].digest;
    snprintf(ctx->context, sizeof ctx->context, "tensor '%s'", t->name);
    if (sum != it->digest) parse_error(ctx, "digest", "the sum of its pieces' digests");
    ctx->context[0] = '\0';
}

static int parse_index(const char *text, const char *where, int partial, ckpt_index *out)
{
    memset(out, 0, sizeof *out);
    parse_ctx ctx = {where, "", TP_OK, partial, {0}};
    cJSON *root = NULL;
    /* The tensors are parsed one at a time: cJSON's tree of them all took 5.5
     * bytes of memory a byte of text, 11.4 with chunk lists (docs/SCALE.md). */
    tp_json_span *tensor_spans = NULL;
    int64_t num_spans = 0;
    TP_TRY(tp_json_parse_deferring(text, strlen(text), where, "tensors", &root, &tensor_spans, &num_spans));
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        free(tensor_spans);
        return tp_fail(TP_ERR_FORMAT, "%s: not a JSON object (damaged index?)", where);
    }
    const char *format = get_string(&ctx, root, "format", 63);
    if (!ctx.status && strcmp(format, CKPT_FORMAT_TAG) != 0)
        ctx.status = tp_fail(TP_ERR_FORMAT, "%s: format is '%s', expected '%s'", where, format,
                               CKPT_FORMAT_TAG);
    int64_t version[2] = {0, 0};
    if (!ctx.status && get_int_array(&ctx, root, "format_version", version, 2, 0) != 2)
        parse_error(&ctx, "format_version", "[major, minor]");
    if (!ctx.status && version[0] > CKPT_FORMAT_MAJOR)
        ctx.status = tp_fail(TP_ERR_VERSION,
                               "%s: checkpoint format version %lld.%lld is newer than this build "
                               "reads (%d.x); upgrade tp-toolkit to read it",
                               where, (long long)version[0], (long long)version[1],
                               CKPT_FORMAT_MAJOR);
    if (!ctx.status && version[0] < 1)
        ctx.status = tp_fail(TP_ERR_VERSION, "%s: format version %lld.%lld is not valid",
                               where, (long long)version[0], (long long)version[1]);
    if (!ctx.status && !partial && (version[0] > 1 || version[1] >= 3)) ctx.status = check_seal(text, root, where);
    if (ctx.status) goto done;
    out->major = (int)version[0];
    out->minor = (int)version[1];

    const cJSON *layout = cJSON_GetObjectItemCaseSensitive(root, "layout");
    if (!cJSON_IsObject(layout)) parse_error(&ctx, "layout", "an object");
    else {
        out->layout.tp = (int)get_int(&ctx, layout, "tp", 1, 4096);
        out->layout.pp = (int)get_int(&ctx, layout, "pp", 1, 4096);
        out->layout.dp = (int)get_int(&ctx, layout, "dp", 1, 1 << 30);
        out->layout.num_layers = get_int(&ctx, layout, "num_layers", 0, (int64_t)1 << 30);
        /* Format 1.5: absent means one chunk per stage. */
        out->layout.virtual_stages = cJSON_GetObjectItemCaseSensitive(layout, "virtual_stages")
                                         ? (int)get_int(&ctx, layout, "virtual_stages", 1, 4096)
                                         : 1;
    }
    if (!ctx.status && ckpt_layout_check(&out->layout))
        ctx.status = tp_fail_context(TP_ERR_FORMAT, "%s", where);
    out->state.step = get_int(&ctx, root, "step", 0, (int64_t)1 << 52);
    const cJSON *train = cJSON_GetObjectItemCaseSensitive(root, "train");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (!cJSON_IsObject(model)) parse_error(&ctx, "model", "an object");
    if (!cJSON_IsObject(user)) parse_error(&ctx, "user", "an object");
    if (!cJSON_IsObject(train)) parse_error(&ctx, "train", "an object");
    if (ctx.status) goto done;
    out->state.consumed_samples = get_int(&ctx, train, "consumed_samples", 0, (int64_t)1 << 52);
    const cJSON *schedule = cJSON_GetObjectItemCaseSensitive(train, "schedule");
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(train, "rng");
    if (!cJSON_IsObject(schedule)) parse_error(&ctx, "train.schedule", "an object");
    if (!cJSON_IsArray(rng)) parse_error(&ctx, "train.rng", "an array");
    if (ctx.status) goto done;
    out->state.model_json = dup_json(model);
    out->state.schedule_json = dup_json(schedule);
    out->state.rng_json = dup_json(rng);
    out->state.user_json = dup_json(user);

    /* A file per shard, and (1.6) data-parallel files of shards: at most
     * dp - 1 per shard. */
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    int64_t shard_files = (int64_t)out->layout.tp * out->layout.pp;
    int64_t most_files = shard_files * out->layout.dp;
    int listed = cJSON_IsArray(files) ? cJSON_GetArraySize(files) : -1;
    if (listed < shard_files || listed > most_files || (version[1] < 6 && listed != shard_files)) {
        char want[96];
        if (listed >= shard_files && version[1] < 6)
            snprintf(want, sizeof want, "an array of %lld shard files (data-parallel files need format 1.6)",
                     (long long)shard_files);
        else snprintf(want, sizeof want, "an array of %lld to %lld shard files", (long long)shard_files,
                      (long long)most_files);
        parse_error(&ctx, "files", want);
        goto done;
    }
    out->files = calloc((size_t)listed, sizeof *out->files);
    if (!out->files) {
        ctx.status = tp_fail(TP_ERR_NOMEM, "%s: out of memory", where);
        goto done;
    }
    int64_t own_files = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, files)
    {
        ckpt_index_file *file = &out->files[out->num_files];
        if (partial && cJSON_IsNull(f)) { /* in another part: no name */
            out->num_files++;
            continue;
        }
        snprintf(ctx.context, sizeof ctx.context, "file #%d", out->num_files);
        snprintf(file->name, sizeof file->name, "%s", get_string(&ctx, f, "name", 63));
        file->pp = (int)get_int(&ctx, f, "pp", 0, out->layout.pp - 1);
        file->tp = (int)get_int(&ctx, f, "tp", 0, out->layout.tp - 1);
        if (cJSON_GetObjectItemCaseSensitive(f, "dp")) file->dp = (int)get_int(&ctx, f, "dp", 1, out->layout.dp - 1);
        file->has_shard_tensors = partial && cJSON_GetObjectItemCaseSensitive(f, "shard_tensors");
        if (file->has_shard_tensors) file->shard_tensors = get_int(&ctx, f, "shard_tensors", 0, (int64_t)1 << 40);
        file->bytes = get_int(&ctx, f, "bytes", 0, (int64_t)1 << 52);
        if (cJSON_GetObjectItemCaseSensitive(f, "meta_checksum")) {
            const char *hex = get_string(&ctx, f, "meta_checksum", 16);
            if (!ctx.status && ckpt_parse_checksum(hex, &file->meta_checksum))
                parse_error(&ctx, "meta_checksum", "16 hex digits");
            file->has_meta_checksum = 1;
        }
        char expect[64];
        ckpt_shard_file_name(file->pp, file->tp, file->dp, expect, sizeof expect);
        if (!ctx.status && strcmp(expect, file->name) != 0) parse_error(&ctx, "name", expect);
        if (ctx.status) goto done;
        int status = ckpt_name_map_insert(&ctx.file_at, file->name, out->num_files, ckpt_index_file_name_of, out);
        if (status == TP_ERR_ARG) parse_error(&ctx, "name", "a file listed once");
        else if (status) ctx.status = status;
        if (ctx.status) goto done;
        own_files += file->dp == 0;
        out->num_files++;
    }
    ctx.context[0] = '\0';
    if (!partial && own_files != shard_files) {
        ctx.status = tp_fail(TP_ERR_FORMAT, "%s: field 'files' lists %lld of the %lld shards' own files", where,
                             (long long)own_files, (long long)shard_files);
        goto done;
    }

    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    if (!cJSON_IsArray(tensors)) {
        parse_error(&ctx, "tensors", "an array");
        goto done;
    }
    if (num_spans > INT_MAX) {
        parse_error(&ctx, "tensors", "an array of at most 2^31 - 1 tensors");
        goto done;
    }
    out->tensors = calloc(num_spans > 0 ? (size_t)num_spans : 1, sizeof *out->tensors);
    if (!out->tensors) {
        ctx.status = tp_fail(TP_ERR_NOMEM, "%s: out of memory", where);
        goto done;
    }
    for (int64_t k = 0; k < num_spans; k++) {
        snprintf(ctx.context, sizeof ctx.context, "tensor #%d", out->num_tensors);
        char what[CKPT_PATH_MAX + 32];
        snprintf(what, sizeof what, "%s: tensor #%d", where, out->num_tensors);
        cJSON *t = NULL;
        ctx.status = tp_json_parse(text + tensor_spans[k].offset, tensor_spans[k].length, what, &t);
        if (ctx.status) goto done;
        ckpt_index_tensor *it = &out->tensors[out->num_tensors++];
        it->order = out->num_tensors - 1;
        if (!cJSON_IsObject(t)) parse_error(&ctx, "tensors[]", "an object");
        else parse_tensor(&ctx, t, out, it);
        if (partial && !ctx.status) it->order = get_int(&ctx, t, "order", 0, (int64_t)1 << 52);
        cJSON_Delete(t);
        if (ctx.status) goto done;
    }
done:
    ckpt_name_map_free(&ctx.file_at);
    cJSON_Delete(root);
    free(tensor_spans);
    if (ctx.status) ckpt_index_free(out);
    return ctx.status;
}

int ckpt_index_parse(const char *text, const char *where, ckpt_index *out)
{
    return parse_index(text, where, 0, out);
}

int ckpt_index_part_parse(const char *text, const char *where, ckpt_index *out)
{
    return parse_index(text, where, 1, out);
}

int ckpt_index_set_state(ckpt_index *index, const ckpt_train_state *state)
{
    int status = TP_OK;
    const char *texts[4] = {state->model_json, state->schedule_json, state->rng_json,
                            state->user_json};
    const char *names[4] = {"model", "schedule", "rng", "user"};
    char *copies[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4 && !status; i++) {
        cJSON *value = parse_state_json(texts[i], i == 2 ? 'a' : 'o', names[i], &status);
        if (value) copies[i] = cJSON_PrintUnformatted(value);
        cJSON_Delete(value);
    }
    if (status) {
        for (int i = 0; i < 4; i++) cJSON_free(copies[i]);
        return status;
    }
    index->state.step = state->step;
    index->state.consumed_samples = state->consumed_samples;
    index->state.model_json = copies[0];
    index->state.schedule_json = copies[1];
    index->state.rng_json = copies[2];
    index->state.user_json = copies[3];
    return TP_OK;
}

void ckpt_index_free(ckpt_index *index)
{
    cJSON_free((void *)index->state.model_json);
    cJSON_free((void *)index->state.schedule_json);
    cJSON_free((void *)index->state.rng_json);
    cJSON_free((void *)index->state.user_json);
    for (int i = 0; i < index->num_tensors; i++) {
        for (int p = 0; index->tensors[i].pieces && p < index->tensors[i].num_pieces; p++)
            free(index->tensors[i].pieces[p].extents);
        free(index->tensors[i].pieces);
    }
    free(index->tensors);
    free(index->files);
    memset(index, 0, sizeof *index);
}
