/* index_scale: what index.json costs at cluster scale (docs/SCALE.md).
 *
 *   index_scale [--tp T] [--pp P] [--dp D] [--repeat N] [--part-mb M] [--keep K] [--compressed]
 *               [--json-only] [MODEL OPTIONS]
 *
 * Builds, in memory, the index a checkpoint of the model at layout tp x pp x dp
 * would have, with the library's own structures (ckpt/index.h): the tensors
 * of the model's catalogue (model/gpt.h gpt_catalog: the trainer's names,
 * shapes and partitions, with Adam's exp_avg and exp_avg_sq), every piece in
 * the shard of its stage and rank, the train state shaped as the trainer
 * writes it (one rng entry per rank of the world, trainer/checkpoint.c).
 * Only checksums, digests and offsets are made up (values of the same
 * width as real ones). Then it measures, best of N:
 *   - ckpt_index_to_json: seconds and peak heap;
 *   - the text's size;
 *   - ckpt_index_parse (what every reader does on opening): seconds, peak
 *     heap during the parse and the heap the parsed index keeps.
 * Heap figures count every malloc/calloc/realloc/free of the program
 * (linked with --wrap, Makefile) by malloc_usable_size: bytes live at the
 * peak above those live before, the text itself excluded.
 *
 * From the same index it computes (not measured: the request rules of
 * ckpt/upload.c, store/s3.c, store/object.c, ckpt/rundir.c and ckpt/reader.c
 * applied to the pieces' sizes) the bytes per checkpoint and per writer and
 * the S3 requests of a save and of a resume (docs/SCALE.md says which rule
 * gives which count).
 *
 * Model options are the programs' (--model, --arch, --layers, --dim, ...);
 * without --model they refine the shape of a 70B Llama (80 layers, dim
 * 8192, ffn 28672, 64 heads, 8 key/value heads, vocabulary 128256, untied),
 * fp32: `--layers 2000 --pp 2000` is that model 25 times deeper.
 * Prints a small table, then one JSON line beginning {"op":"index_scale". */
#include <malloc.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../ckpt/commit.h"
#include "../ckpt/index.h"
#include "../common/clock.h"
#include "../common/parse.h"
#include "../model/gpt.h"

/* ------------------------------------------------------- heap accounting */

/* The program is linked with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,
 * --wrap=free: every allocation of this program and the static libraries
 * (cJSON allocates through the bounded parser's hooks, common/json.c)
 * passes here. Memory glibc allocates for itself (stdio) is not seen. */
void *__real_malloc(size_t size);
void *__real_calloc(size_t count, size_t size);
void *__real_realloc(void *p, size_t size);
void __real_free(void *p);

static _Atomic int64_t heap_live, heap_peak;

static void heap_add(int64_t bytes)
{
    int64_t now = atomic_fetch_add(&heap_live, bytes) + bytes;
    int64_t peak = atomic_load(&heap_peak);
    while (now > peak && !atomic_compare_exchange_weak(&heap_peak, &peak, now)) {
    }
}

void *__wrap_malloc(size_t size)
{
    void *p = __real_malloc(size);
    if (p) heap_add((int64_t)malloc_usable_size(p));
    return p;
}

void *__wrap_calloc(size_t count, size_t size)
{
    void *p = __real_calloc(count, size);
    if (p) heap_add((int64_t)malloc_usable_size(p));
    return p;
}

void *__wrap_realloc(void *old, size_t size)
{
    int64_t before = old ? (int64_t)malloc_usable_size(old) : 0;
    void *p = __real_realloc(old, size);
    if (p) heap_add((int64_t)malloc_usable_size(p) - before);
    else if (size == 0) heap_add(-before);
    return p;
}

void __wrap_free(void *p)
{
    if (p) heap_add(-(int64_t)malloc_usable_size(p));
    __real_free(p);
}

/* Starts a measurement: the peak is reset to what is live now. */
static int64_t heap_mark(void)
{
    int64_t live = atomic_load(&heap_live);
    atomic_store(&heap_peak, live);
    return live;
}

/* ------------------------------------------------------ made-up values */

static uint64_t mix(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---------------------------------------------------------- the index */

#define ALIGN_MIN ((int64_t)64 << 10) /* pieces this large are 4 KiB-aligned (docs/FORMAT.md "Storage") */
#define METADATA_GUESS ((int64_t)64 << 10) /* HDF5 metadata per file: a guess; counts for nothing below */

static int64_t round_up(int64_t x, int64_t to)
{
    return (x + to - 1) / to * to;
}

/* The trainer's rng array (trainer/checkpoint.c rng_json): one entry per rank. */
static char *rng_json(int tp, int pp, int dp)
{
    int64_t world = (int64_t)tp * pp * dp;
    size_t capacity = (size_t)world * 96 + 16, used = 0;
    char *text = malloc(capacity);
    if (!text) return NULL;
    text[used++] = '[';
    for (int64_t r = 0; r < world; r++)
        used += (size_t)snprintf(text + used, capacity - used, "%s{\"pp\":%lld,\"tp\":%lld,\"dp\":%lld,\"state\":"
                                 "\"%016llx:%llu\"}", r ? "," : "", (long long)(r / tp % pp), (long long)(r % tp),
                                 (long long)(r / ((int64_t)tp * pp)), 0x5eed5eed5eed5eedull, 1000000ull);
    snprintf(text + used, capacity - used, "]");
    return text;
}

/* The index of a checkpoint of the catalogue at the layout, as the commit
 * would write it. file_offset[f] ends as the file's size. */
static int build_index(const gpt_config *config, const gpt_tensor *catalog, int count, const ckpt_layout *layout,
                       int compressed, ckpt_index *index)
{
    memset(index, 0, sizeof *index);
    index->major = CKPT_FORMAT_MAJOR;
    index->minor = CKPT_FORMAT_MINOR;
    index->layout = *layout;
    char *model = gpt_config_to_json(config), *rng = rng_json(layout->tp, layout->pp, layout->dp);
    ckpt_train_state state = {1000000, 1000000 * 1024, model,
                              "{\"kind\":\"cosine\",\"lr\":0.00015,\"min_lr\":1.5e-05,\"warmup\":2000,"
                              "\"total_steps\":1000000,\"step\":1000000}",
                              rng,
                              "{\"global_batch\":1024,\"micro_batch\":1,\"grad_accum\":8,\"seq\":8192,"
                              "\"data\":\"files\"}"};
    int status = model && rng ? ckpt_index_set_state(index, &state) : tp_fail(TP_ERR_NOMEM, "out of memory");
    free(model);
    free(rng);
    if (status) return status;
    int files = layout->tp * layout->pp;
    index->files = calloc((size_t)files, sizeof *index->files);
    index->tensors = calloc((size_t)count, sizeof *index->tensors);
    if (!index->files || !index->tensors) return tp_fail(TP_ERR_NOMEM, "out of memory");
    index->num_files = files;
    uint64_t seed = 42;
    for (int f = 0; f < files; f++) {
        ckpt_index_file *file = &index->files[f];
        file->pp = f / layout->tp;
        file->tp = f % layout->tp;
        ckpt_shard_file_name(file->pp, file->tp, 0, file->name, sizeof file->name);
        file->bytes = 4096; /* the superblock and root group come first */
        file->has_meta_checksum = 1;
        file->meta_checksum = mix(&seed);
    }
    for (int i = 0; i < count; i++) {
        ckpt_index_tensor *it = &index->tensors[i];
        TP_TRY(ckpt_tensor_copy_init(&it->tensor, &catalog[i].desc));
        index->num_tensors = i + 1;
        const ckpt_tensor_desc *t = &it->tensor.desc;
        it->stage = ckpt_tensor_stage(t, layout);
        it->block_rows = ckpt_piece_block_rows(t, layout->tp);
        it->order = i;
        it->num_pieces = ckpt_piece_count(t, layout->tp);
        if (!(it->pieces = calloc((size_t)it->num_pieces, sizeof *it->pieces)))
            return tp_fail(TP_ERR_NOMEM, "out of memory");
        ckpt_piece_geometry g;
        ckpt_piece_geometry_init(&g, t, layout->tp, it->block_rows);
        for (int p = 0; p < it->num_pieces; p++) {
            ckpt_index_piece *ip = &it->pieces[p];
            ip->file_index = it->stage * layout->tp + p;
            ckpt_index_file *file = &index->files[ip->file_index];
            snprintf(ip->file, sizeof ip->file, "%s", file->name);
            ip->pp = it->stage;
            ip->tp = p;
            memcpy(ip->shape, g.shape, sizeof ip->shape);
            ip->bytes = g.bytes;
            ip->checksum = mix(&seed);
            ip->digest = mix(&seed);
            ip->compressed = compressed;
            ip->num_extents = compressed ? g.num_blocks : 1;
            if (!(ip->extents = calloc((size_t)ip->num_extents, sizeof *ip->extents)))
                return tp_fail(TP_ERR_NOMEM, "out of memory");
            if (!compressed && g.bytes >= ALIGN_MIN) file->bytes = round_up(file->bytes, 4096);
            for (int64_t b = 0; b < ip->num_extents; b++) {
                int64_t rows = b == g.num_blocks - 1 ? g.rows - b * g.block_rows : g.block_rows;
                /* A compressed chunk as large as 9/10 of its block: only the digits count. */
                int64_t length = compressed ? rows * g.row_bytes * 9 / 10 + 1 : g.bytes;
                ip->extents[b] = (ckpt_extent){file->bytes, length, 0};
                file->bytes += length;
            }
            ip->checksums_at = round_up(file->bytes, 8);
            file->bytes = ip->checksums_at + 8 * g.num_blocks;
        }
        uint64_t sum = 0;
        for (int p = 0; p < it->num_pieces; p++) sum += it->pieces[p].digest;
        it->digest = sum;
    }
    for (int f = 0; f < files; f++) index->files[f].bytes += METADATA_GUESS;
    return TP_OK;
}

/* ------------------------------------------------------ request counts */

/* The constants of store/object.c and ckpt/reader.c the counts
 * follow (not exported; kept equal by hand, docs/SCALE.md). */
#define WINDOW_READ_MAX ((int64_t)64 << 10)    /* reads this small go through 256 KiB windows */
#define PARALLEL_READ_MIN ((int64_t)16 << 20)  /* reads this large are split ... */
#define READ_PART ((int64_t)8 << 20)           /* ... into ranged GETs of this size */
#define DIRECT_READ_MAX ((int64_t)64 << 20)    /* whole blocks read as a group of up to this size ... */
#define VERIFY_READ_MAX ((int64_t)8 << 20)     /* ... this much per read when verifying */
#define LIST_PAGE 1000                         /* keys per S3 listing page */

/* GETs of one read of `bytes` (store/object.c object_read_at); a windowed
 * read counts as one (an upper bound: a window may serve its neighbours). */
static int64_t gets_of_read(int64_t bytes)
{
    if (bytes <= 0) return 0;
    if (bytes < PARALLEL_READ_MIN) return 1;
    return (bytes + READ_PART - 1) / READ_PART;
}

/* GETs that read a piece whole with verification, and its block checksums
 * (reader.c read_piece_box and read_blocks): whole blocks in groups of up
 * to DIRECT_READ_MAX, each group read VERIFY_READ_MAX at a time (so hashed
 * while in cache); a compressed piece one chunk (block) at a time. */
static int64_t gets_of_piece(const ckpt_index_tensor *it, const ckpt_index_piece *ip, int tp)
{
    ckpt_piece_geometry g;
    ckpt_piece_geometry_init(&g, &it->tensor.desc, tp, it->block_rows);
    int64_t block_bytes = g.block_rows * g.row_bytes;
    int64_t gets = 1; /* the block checksums at checksums_at */
    if (ip->compressed) return gets + g.num_blocks;
    int64_t per_group = DIRECT_READ_MAX / block_bytes, per_read = VERIFY_READ_MAX / block_bytes;
    if (per_group < 1) per_group = 1;
    if (per_read < 1) per_read = 1;
    for (int64_t group = 0; group < g.num_blocks; group += per_group) {
        int64_t group_end = group + per_group < g.num_blocks ? group + per_group : g.num_blocks;
        for (int64_t b = group; b < group_end; b += per_read) {
            int64_t end = b + per_read < group_end ? b + per_read : group_end;
            int64_t row_end = end * g.block_rows < g.rows ? end * g.block_rows : g.rows;
            gets += gets_of_read((row_end - b * g.block_rows) * g.row_bytes);
        }
    }
    return gets;
}

typedef struct {
    int64_t ckpt_bytes, file_max, file_min;
    /* A save (ckpt/upload.c ckpt_upload and ckpt_upload_latest). */
    int64_t parts_max;                      /* multipart parts of the largest file */
    int64_t save_put, save_post, save_head, save_list, save_delete_replacing;
    /* A resume (trainer/checkpoint.c): rank 0 lists the candidates and reads
     * the index; each reader opens with that text and checks sizes on its
     * reads' answers, then reads its pieces. */
    int64_t root_head, root_get, root_list; /* rank 0, before any piece */
    int64_t open_head, open_get, open_list; /* each reader, before any piece */
    /* Before: every rank found the candidates and opened the reader itself. */
    int64_t before_head, before_get, before_list;
    int64_t piece_gets_max, piece_gets_all; /* per rank (the busiest shard), per copy of the checkpoint */
    int64_t pieces;
} request_counts;

static void count_requests(const ckpt_index *index, int64_t text_bytes, int64_t part, int keep,
                           request_counts *out)
{
    memset(out, 0, sizeof *out);
    int files = index->num_files;
    int64_t *gets = calloc((size_t)files, sizeof *gets);
    out->file_min = INT64_MAX;
    for (int f = 0; f < files; f++) {
        int64_t bytes = index->files[f].bytes;
        if (bytes > out->file_max) out->file_max = bytes;
        if (bytes < out->file_min) out->file_min = bytes;
        if (bytes > part) { /* CreateMultipartUpload, the parts, CompleteMultipartUpload */
            int64_t parts = (bytes + part - 1) / part;
            out->save_post += 2;
            out->save_put += parts;
            if (parts > out->parts_max) out->parts_max = parts;
        } else {
            out->save_put += 1;
        }
        out->save_head += 1; /* its size checked after the upload */
    }
    /* Before: HEAD of the remote index (404: a listing of one key to tell a
     * directory); after the shards: the index PUT, then `latest`'s PUT.
     * Replacing a checkpoint: its index DELETE first. */
    out->save_head += 1;
    out->save_list += 1;
    out->save_put += 2;
    out->save_delete_replacing = 1;
    for (int i = 0; i < index->num_tensors; i++) {
        const ckpt_index_tensor *it = &index->tensors[i];
        for (int p = 0; p < it->num_pieces; p++) {
            int64_t g = gets_of_piece(it, &it->pieces[p], index->layout.tp);
            out->ckpt_bytes += it->pieces[p].bytes;
            gets[it->pieces[p].file_index] += g;
            out->piece_gets_all += g;
            out->pieces++;
        }
    }
    for (int f = 0; f < files; f++)
        if (gets && gets[f] > out->piece_gets_max) out->piece_gets_max = gets[f];
    free(gets);
    /* A run directory of `keep` checkpoints, `latest`, the lease. */
    int64_t pages = (keep + 2 + LIST_PAGE - 1) / LIST_PAGE;
    /* ckpt_candidates: HEAD run/index.json (404, then a listing of one key),
     * HEAD latest, HEAD + GET latest (read), HEAD of its index.json, the
     * run directory listed, HEAD of each step_N/index.json. */
    int64_t candidates_head = 4 + keep, candidates_list = 1 + pages, candidates_get = 1;
    int64_t index_gets = text_bytes <= WINDOW_READ_MAX ? 1 : gets_of_read(text_bytes);
    /* Rank 0 now: a HEAD of the run directory and the candidates twice (the
     * --resume check, then the load), then HEAD + GET of index.json
     * (ckpt_read_index_text). The readers: nothing (the index's text given,
     * the path not resolved, sizes on the answers). */
    out->root_head = 1 + 2 * candidates_head + 1;
    out->root_list = 2 * candidates_list;
    out->root_get = 2 * candidates_get + index_gets;
    out->open_head = out->open_get = out->open_list = 0;
    /* Before, on every rank: the run directory's HEAD and candidates (the
     * --resume check), the candidates again, and ckpt_reader_open: the
     * parent listed for live staging entries, HEAD of the checkpoint (404,
     * then a listing of one key), HEAD of its index, HEAD + GET of
     * index.json, HEAD of every shard file. */
    out->before_head = 1 + 2 * candidates_head + 3 + files;
    out->before_list = 2 * candidates_list + pages + 1;
    out->before_get = 2 * candidates_get + index_gets;
}

/* ------------------------------------------------------------------- main */

static void usage(void)
{
    fprintf(stderr, "usage: index_scale [--tp T] [--pp P] [--dp D] [--repeat N] [--part-mb M] [--keep K] [--compressed]\n"
                    "                   [--json-only] [--model NAME | --layers L --dim D ...]\n");
}

int main(int argc, char **argv)
{
    int64_t tp = 8, pp = 16, dp = 8, repeat = 3, part_mb = 64, keep = 3;
    int compressed = 0, json_only = 0, model_option = 0;
    gpt_options options;
    memset(&options, 0, sizeof options);
    /* Without --model, a 70B Llama (Llama 3 70B's shape), which the options refine. */
    int preset_given = 0;
    for (int i = 1; i < argc; i++) preset_given |= strcmp(argv[i], "--model") == 0;
    if (!preset_given) {
        static const char *const shape[][2] = {{"arch", "llama"}, {"layers", "80"}, {"dim", "8192"},
                                               {"ffn", "28672"}, {"heads", "64"}, {"kv-heads", "8"},
                                               {"vocab", "128256"}, {"seq", "8192"}};
        for (size_t k = 0; k < sizeof shape / sizeof *shape; k++) gpt_options_set(&options, shape[k][0], shape[k][1]);
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        int bad = 0;
        if (strcmp(a, "--tp") == 0) bad = parse_int(v, 1, 4096, &tp), i++;
        else if (strcmp(a, "--pp") == 0) bad = parse_int(v, 1, 4096, &pp), i++;
        else if (strcmp(a, "--dp") == 0) bad = parse_int(v, 1, 1 << 20, &dp), i++;
        else if (strcmp(a, "--repeat") == 0) bad = parse_int(v, 1, 1000, &repeat), i++;
        else if (strcmp(a, "--part-mb") == 0) bad = parse_int(v, 5, 5 << 10, &part_mb), i++;
        else if (strcmp(a, "--keep") == 0) bad = parse_int(v, 1, 1 << 20, &keep), i++;
        else if (strcmp(a, "--compressed") == 0) compressed = 1;
        else if (strcmp(a, "--json-only") == 0) json_only = 1;
        else if (strncmp(a, "--", 2) == 0) {
            const char *name = a + 2;
            int known = 0;
            for (int k = 0; gpt_option_names[k]; k++) known |= strcmp(gpt_option_names[k], name) == 0;
            model_option = known;
            if (!known) bad = 1;
            else if (gpt_option_is_flag(name)) bad = gpt_options_set(&options, name, "1") != TP_OK;
            else bad = gpt_options_set(&options, name, v) != TP_OK, i++;
        } else {
            bad = 1;
        }
        if (bad) {
            fprintf(stderr, "index_scale: bad option %s%s%s\n", a, model_option ? ": " : "", model_option ? tp_errmsg() : "");
            usage();
            return 2;
        }
    }
    gpt_config config;
    gpt_tensor *catalog = NULL;
    int count = 0;
    int status = gpt_options_finish(&options, &config);
    if (!status) status = gpt_config_check(&config, (int)tp, (int)pp);
    if (!status) status = gpt_catalog(&config, 1, &catalog, &count);
    ckpt_layout layout = {(int)tp, (int)pp, (int)dp, config.layers, 1};
    if (!status) status = ckpt_layout_check(&layout);
    if (status) {
        fprintf(stderr, "index_scale: %s\n", tp_errmsg());
        return 1;
    }
    int64_t parameters = 0;
    gpt_parameter_count(&config, &parameters);

    /* The parser's hooks (common/json.c) go in at its first call: before
     * anything is counted, so that cJSON's allocations are all seen. */
    ckpt_index scratch;
    ckpt_index_parse("{}", "warm-up", &scratch);

    ckpt_index index;
    status = build_index(&config, catalog, count, &layout, compressed, &index);
    free(catalog);
    if (status) {
        fprintf(stderr, "index_scale: %s\n", tp_errmsg());
        return 1;
    }
    double serialize_s = 1e30, parse_s = 1e30;
    int64_t serialize_heap = 0, parse_heap = 0, kept_heap = 0, text_bytes = 0;
    char *text = NULL;
    for (int64_t rep = 0; rep < repeat && !status; rep++) {
        free(text);
        text = NULL;
        int64_t base = heap_mark();
        double t0 = now_seconds();
        status = ckpt_index_to_json(&index, &text);
        double t1 = now_seconds();
        if (status) break;
        text_bytes = (int64_t)strlen(text);
        if (t1 - t0 < serialize_s) serialize_s = t1 - t0;
        /* The text is what the serializer hands back, not its working memory. */
        int64_t used = atomic_load(&heap_peak) - base;
        if (used > serialize_heap) serialize_heap = used;

        ckpt_index parsed;
        base = heap_mark();
        t0 = now_seconds();
        status = ckpt_index_parse(text, "synthetic index.json", &parsed);
        t1 = now_seconds();
        if (status) break;
        if (t1 - t0 < parse_s) parse_s = t1 - t0;
        if (atomic_load(&heap_peak) - base > parse_heap) parse_heap = atomic_load(&heap_peak) - base;
        kept_heap = atomic_load(&heap_live) - base;
        if (rep == 0) { /* the parsed index is the one built: it serializes to the same text */
            char *again = NULL;
            status = ckpt_index_to_json(&parsed, &again);
            if (!status && strcmp(again, text) != 0)
                status = tp_fail(TP_ERR_STATE, "the parsed index serializes to other text than the one built");
            free(again);
        }
        ckpt_index_free(&parsed);
    }
    /* The distributed commit (trainer/checkpoint.c): each writer's part of
     * the index (what it sends rank 0), and rank 0's merge of all of them,
     * which must give the same text. Up to 1,024 files (the parts are cut
     * from the index here in files x pieces). */
    double merge_s = -1;
    int64_t part_max = 0, parts_total = 0;
    if (!status && index.num_files <= 1024) {
        char **parts = calloc((size_t)index.num_files, sizeof *parts);
        ckpt_index_file *files = malloc((size_t)index.num_files * sizeof *files);
        if (!parts || !files) status = tp_fail(TP_ERR_NOMEM, "out of memory for the parts");
        else memcpy(files, index.files, (size_t)index.num_files * sizeof *files);
        for (int f = 0; !status && f < index.num_files; f++) {
            for (int g = 0; g < index.num_files; g++) index.files[g].name[0] = g == f ? files[g].name[0] : '\0';
            for (int i = 0; i < index.num_tensors; i++)
                for (int p = 0; p < index.tensors[i].num_pieces; p++) {
                    ckpt_index_piece *ip = &index.tensors[i].pieces[p];
                    int at = ip->pp * index.layout.tp + ip->tp;
                    ip->file_index = at == f ? f : -1;
                }
            status = ckpt_index_part_to_json(&index, &parts[f]);
            if (!status && (int64_t)strlen(parts[f]) > part_max) part_max = (int64_t)strlen(parts[f]);
            if (!status) parts_total += (int64_t)strlen(parts[f]);
        }
        if (files) memcpy(index.files, files, (size_t)index.num_files * sizeof *files);
        for (int i = 0; i < index.num_tensors; i++)
            for (int p = 0; p < index.tensors[i].num_pieces; p++)
                index.tensors[i].pieces[p].file_index = index.tensors[i].pieces[p].pp * index.layout.tp +
                                                        index.tensors[i].pieces[p].tp;
        char *merged = NULL;
        double t0 = now_seconds();
        if (!status)
            status = ckpt_index_from_parts(&index.layout, &index.state, (const char *const *)parts, index.num_files,
                                           "synthetic parts", &merged, NULL);
        merge_s = now_seconds() - t0;
        if (!status && strcmp(merged, text) != 0)
            status = tp_fail(TP_ERR_STATE, "the index merged from the parts is not the one built");
        free(merged);
        for (int f = 0; parts && f < index.num_files; f++) free(parts[f]);
        free(parts);
        free(files);
    }
    if (status) {
        fprintf(stderr, "index_scale: %s\n", tp_errmsg());
        free(text);
        ckpt_index_free(&index);
        return 1;
    }
    request_counts rq;
    count_requests(&index, text_bytes, part_mb << 20, (int)keep, &rq);
    struct rusage usage_self;
    getrusage(RUSAGE_SELF, &usage_self);
    int64_t files = index.num_files, world = tp * pp * dp;
    /* A resume by tp-train, every rank: rank 0's opening, the readers' (one
     * per shard file), one copy of the pieces. */
    int64_t resume_head = rq.root_head + rq.open_head * files, resume_get = rq.root_get + rq.open_get * files +
            rq.piece_gets_all, resume_list = rq.root_list + rq.open_list * files;
    const double MB = 1e6, GB = 1e9;

    if (!json_only) {
        printf("index_scale: %s, %.1fB parameters, %d layers, tp%lld pp%lld dp%lld (%lld ranks), fp32 + Adam%s\n",
               gpt_arch_name(config.arch), parameters / 1e9, (int)config.layers, (long long)tp, (long long)pp,
               (long long)dp, (long long)world, compressed ? ", zstd chunks" : "");
        printf("measured (best of %lld):\n", (long long)repeat);
        printf("  %-34s %lld tensors, %lld pieces, %lld files\n", "index", (long long)index.num_tensors,
               (long long)rq.pieces, (long long)files);
        printf("  %-34s %.2f MB (%lld bytes; %.1f kB per file)\n", "index.json", text_bytes / MB,
               (long long)text_bytes, text_bytes / 1e3 / (double)files);
        printf("  %-34s %.3f s, peak heap %.1f MB\n", "serialize (ckpt_index_to_json)", serialize_s,
               serialize_heap / MB);
        printf("  %-34s %.3f s, peak heap %.1f MB, kept %.1f MB\n", "parse (ckpt_index_parse)", parse_s,
               parse_heap / MB, kept_heap / MB);
        printf("  %-34s %.1f MB\n", "process peak RSS", usage_self.ru_maxrss / 1e3);
        if (merge_s >= 0)
            printf("  %-34s %.3f s for %lld parts of at most %.1f kB (%.2f MB in all), the same text\n",
                   "commit merge (ckpt_index_from_parts)", merge_s, (long long)files, part_max / 1e3, parts_total / MB);
        printf("computed (request rules of ckpt/, docs/SCALE.md):\n");
        printf("  %-34s %.1f GB; per writer %.2f to %.2f GB\n", "checkpoint", rq.ckpt_bytes / GB, rq.file_min / GB,
               rq.file_max / GB);
        printf("  %-34s %lld PUT, %lld POST, %lld HEAD, %lld LIST (+1 DELETE replacing); %lld parts of %lld MiB "
               "per largest file\n", "save", (long long)rq.save_put, (long long)rq.save_post, (long long)rq.save_head,
               (long long)rq.save_list, (long long)rq.parts_max, (long long)part_mb);
        printf("  %-34s %lld HEAD, %lld GET, %lld LIST before any piece (rank 0: %lld, %lld, %lld); %lld GETs of "
               "pieces (busiest shard)\n", "resume, per reader", (long long)rq.open_head, (long long)rq.open_get,
               (long long)rq.open_list, (long long)rq.root_head, (long long)rq.root_get, (long long)rq.root_list,
               (long long)rq.piece_gets_max);
        /* tp-train: the first data-parallel replica reads (one reader per
         * shard), the others receive over their data-parallel group. */
        printf("  %-34s %lld HEAD, %lld GET, %lld LIST (the %lld ranks of the first replica read; before, every "
               "rank opened and read: %lld HEAD, %lld GET, %lld LIST)\n", "resume, all ranks",
               (long long)resume_head, (long long)resume_get, (long long)resume_list, (long long)files,
               (long long)(rq.before_head * world), (long long)((rq.before_get * world) + rq.piece_gets_all * dp),
               (long long)(rq.before_list * world));
    }
    printf("{\"op\":\"index_scale\",\"arch\":\"%s\",\"parameters\":%lld,\"layers\":%lld,\"tp\":%lld,\"pp\":%lld,"
           "\"dp\":%lld,\"ranks\":%lld,\"compressed\":%s,\"files\":%lld,\"tensors\":%d,\"pieces\":%lld,"
           "\"index_bytes\":%lld,\"serialize_s\":%.6f,\"serialize_heap_bytes\":%lld,\"parse_s\":%.6f,"
           "\"parse_heap_bytes\":%lld,\"parsed_kept_bytes\":%lld,\"max_rss_bytes\":%lld,\"repeat\":%lld,"
           "\"ckpt_bytes\":%lld,\"file_bytes_max\":%lld,\"file_bytes_min\":%lld,\"part_bytes\":%lld,\"parts_max\":%lld,"
           "\"save_put\":%lld,\"save_post\":%lld,\"save_head\":%lld,\"save_list\":%lld,\"save_delete_replacing\":%lld,"
           "\"open_head_per_rank\":%lld,\"open_get_per_rank\":%lld,\"open_list_per_rank\":%lld,"
           "\"piece_gets_per_rank_max\":%lld,\"piece_gets_per_copy\":%lld,\"resume_head\":%lld,\"resume_get\":%lld,"
           "\"resume_list\":%lld,\"keep\":%lld,\"part_bytes_max\":%lld,"
           "\"parts_bytes\":%lld,\"merge_s\":%.6f}\n",
           gpt_arch_name(config.arch), (long long)parameters, (long long)config.layers, (long long)tp, (long long)pp,
           (long long)dp, (long long)world, compressed ? "true" : "false", (long long)files, index.num_tensors,
           (long long)rq.pieces, (long long)text_bytes, serialize_s, (long long)serialize_heap, parse_s,
           (long long)parse_heap, (long long)kept_heap, (long long)usage_self.ru_maxrss * 1024, (long long)repeat,
           (long long)rq.ckpt_bytes, (long long)rq.file_max, (long long)rq.file_min, (long long)(part_mb << 20),
           (long long)rq.parts_max, (long long)rq.save_put, (long long)rq.save_post, (long long)rq.save_head,
           (long long)rq.save_list, (long long)rq.save_delete_replacing, (long long)rq.open_head,
           (long long)rq.open_get, (long long)rq.open_list, (long long)rq.piece_gets_max,
           (long long)rq.piece_gets_all, (long long)resume_head, (long long)resume_get, (long long)resume_list,
           (long long)keep, (long long)part_max, (long long)parts_total, merge_s);
    free(text);
    ckpt_index_free(&index);
    return 0;
}
