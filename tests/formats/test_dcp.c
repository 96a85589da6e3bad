/* PyTorch distributed checkpoints (formats/dcp.h): the fixtures PyTorch
 * wrote (tests/data/dcp) parsed to the last chunk and value; random
 * checkpoints at random layouts written as DCP in both dialects and read
 * back bit for bit with their descriptions, state and digests; hostile
 * `.metadata` refused naming what is wrong; the fuzzing corpus replayed.
 * Run from the repository root. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../common/error.h"
#include "../../formats/dcp.h"
#include "../../formats/torch_write.h"
#include "../support/fixture.h"
/* The fuzz target, replayed below; fuzz_copy_file serves the tests too (no
 * shell: the GPU pack's test runs these in a root of glibc alone). */
#include "../fuzz/fuzz_dcp.c"

TestSuite(dcp, .init = make_dir, .fini = remove_dir);

static const dcp_entry *entry(const dcp_checkpoint *d, const char *key)
{
    int i = dcp_find(d, key);
    cr_assert(i >= 0, "entry %s", key);
    return dcp_entry_at(d, i);
}

static void assert_box(const dcp_chunk *c, int ndim, const int64_t *offsets, const int64_t *sizes)
{
    for (int k = 0; k < ndim; k++) {
        cr_assert_eq(c->offsets[k], offsets[k], "offset %d", k);
        cr_assert_eq(c->sizes[k], sizes[k], "size %d", k);
    }
}

/* The chunk of an entry at these offsets (chunks come in no set order). */
static const dcp_chunk *chunk_at(const dcp_entry *e, const int64_t *offsets)
{
    for (int c = 0; c < e->num_chunks; c++)
        if (!memcmp(e->chunks[c].offsets, offsets, sizeof(int64_t) * (size_t)e->ndim)) return &e->chunks[c];
    cr_assert_fail("%s: no chunk at the offsets asked", e->key);
    return NULL;
}

/* The fixture's values (tests/formats/dcp_torch.py `values`), fp32. */
static float fixture_value(int64_t i, double seed)
{
    return (float)((i * 0.01 + seed) * (i % 2 ? -1.0 : 1.0));
}

Test(dcp, fixtures_written_by_pytorch)
{
    dcp_checkpoint *d;
    cr_assert_eq(dcp_open("tests/data/dcp/cols2", &d), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(dcp_torch_version_of(d), DCP_TORCH_1_13);
    cr_assert_eq(dcp_num_entries(d), 7);
    cr_assert_eq(dcp_num_files(d), 2);
    cr_assert(!dcp_has_description(d));
    const dcp_entry *w = entry(d, "model.w");
    cr_assert(w->kind == DCP_TENSOR && w->dtype == TORCH_FLOAT32 && w->ndim == 2 && w->shape[0] == 6 && w->shape[1] == 8);
    cr_assert_eq(w->num_chunks, 2);
    assert_box(chunk_at(w, (int64_t[]){0, 4}), 2, (int64_t[]){0, 4}, (int64_t[]){6, 4});
    const dcp_entry *emb = entry(d, "model.emb");
    cr_assert(emb->dtype == TORCH_BFLOAT16 && emb->num_chunks == 4, "torch.chunk's four chunks");
    assert_box(chunk_at(emb, (int64_t[]){9, 0}), 2, (int64_t[]){9, 0}, (int64_t[]){1, 4}); /* 3, 3, 3, 1 */
    cr_assert(dcp_entry_is_tensor(emb) && dcp_entry_is_tensor(entry(d, "model.norm")));
    const dcp_entry *ids = entry(d, "extra.ids"), *scale = entry(d, "extra.scale");
    cr_assert(ids->kind == DCP_TENSOR && ids->dtype == TORCH_INT64 && !dcp_entry_is_tensor(ids));
    cr_assert(scale->kind == DCP_TENSOR && scale->ndim == 0 && !dcp_entry_is_tensor(scale), "a scalar is another entry");
    cr_assert_eq(entry(d, "step")->kind, DCP_BYTES);
    void *bytes;
    int64_t size;
    cr_assert_eq(dcp_read_bytes(d, dcp_find(d, "step"), 1 << 20, &bytes, &size), TP_OK, "%s", tp_errmsg());
    cr_assert(size > 4 && !memcmp(bytes, "PK\003\004", 4), "a bytes entry is torch.save's archive of the object");
    free(bytes);
    /* The values, read through the boxes: an fp32 tensor cut along dimension 1. */
    ckpt_reader *r;
    cr_assert_eq(dcp_reader_open(d, 1, 2, &r), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_reader_num_tensors(r), 3);
    int k = ckpt_reader_find(r, "model.w");
    float got[48];
    cr_assert_eq(ckpt_reader_read_piece(r, k, 0, got, sizeof got), TP_OK, "%s", tp_errmsg());
    for (int i = 0; i < 48; i++) cr_assert_eq(got[i], fixture_value(i, 1.0), "model.w[%d]", i);
    cr_assert_eq(ckpt_reader_digest(r, k), ckpt_digest_run(got, 4, 0, 48));
    ckpt_reader_close(r);
    dcp_close(d);

    cr_assert_eq(dcp_open("tests/data/dcp/grid4", &d), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(dcp_num_files(d), 12, "a file per item");
    w = entry(d, "layers.0.w");
    cr_assert_eq(w->num_chunks, 4);
    assert_box(chunk_at(w, (int64_t[]){4, 3}), 2, (int64_t[]){4, 3}, (int64_t[]){4, 3});
    const dcp_entry *cube = entry(d, "layers.0.cube");
    assert_box(chunk_at(cube, (int64_t[]){0, 3, 2}), 3, (int64_t[]){0, 3, 2}, (int64_t[]){3, 2, 2});
    cr_assert_eq(dcp_reader_open(d, 0, 1, &r), TP_OK, "%s", tp_errmsg());
    k = ckpt_reader_find(r, "layers.0.w");
    int64_t start[2] = {2, 1}, count[2] = {5, 4};
    cr_assert_eq(ckpt_reader_read_region(r, k, start, count, got, sizeof got), TP_OK, "%s", tp_errmsg());
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 4; j++)
            cr_assert_eq(got[i * 4 + j], fixture_value((2 + i) * 6 + 1 + j, 4.0), "a region across all four boxes");
    ckpt_reader_close(r);
    dcp_close(d);
}

/* Random checkpoints written as DCP at random layouts (their pieces cut
 * again over data-parallel ranks or not), read back. */
Test(dcp, random_round_trips)
{
    for (int iter = 0; iter < 12; iter++) {
        ckpt_layout layout = {(int)rnd(1, 4), (int)rnd(1, 2), 1, 0, 1};
        layout.num_layers = layout.pp * rnd(1, 2);
        int tps[2] = {layout.tp, (int)rnd(1, 4)};
        test_tensor tensors[8];
        int n = random_tensors(tensors, 8, tps, 2, layout.num_layers);
        char src[600], out[600];
        snprintf(src, sizeof src, "%s/src%d", dir, iter);
        snprintf(out, sizeof out, "%s/dcp%d", dir, iter);
        write_tensors(src, &layout, tensors, n, iter % 2, iter + 3);
        ckpt_reader *source;
        cr_assert_eq(ckpt_reader_open(&source, src, NULL), TP_OK, "%s", tp_errmsg());
        dcp_write_options options = {.tp = tps[1], .pp = (int)rnd(1, 2), .dp = (int)rnd(0, 3), .threads = (int)rnd(1, 3),
                                     .torch_version = iter % 2 ? DCP_TORCH_1_13 : DCP_TORCH_2};
        if (layout.num_layers % options.pp) options.pp = 1;
        dcp_write_plan plan;
        cr_assert_eq(dcp_write(source, &options, out, &plan), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(plan.files, options.tp * options.pp * (options.dp ? options.dp : 1));
        cr_assert_eq(plan.tensors, n);
        dcp_checkpoint *d;
        cr_assert_eq(dcp_open(out, &d), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(dcp_torch_version_of(d), options.torch_version);
        cr_assert(dcp_has_description(d));
        ckpt_reader *r;
        cr_assert_eq(dcp_reader_open(d, iter % 3 == 0, 2, &r), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(ckpt_reader_num_tensors(r), n);
        /* The read back the plan sized by its chunks is what the reader
         * counts for them (a chunk of whole rows takes no bounce buffer). */
        cr_assert_eq(plan.read_back_bytes, ckpt_reader_verify_thread_bytes(r), "iteration %d: planned %lld, counted %lld",
                     iter, (long long)plan.read_back_bytes, (long long)ckpt_reader_verify_thread_bytes(r));
        cr_assert_eq(ckpt_reader_state(r)->step, iter + 3);
        cr_assert_eq(ckpt_reader_layout(r)->num_layers, layout.num_layers);
        for (int i = 0; i < n; i++) {
            const test_tensor *t = &tensors[i];
            int k = ckpt_reader_find(r, t->name);
            cr_assert(k >= 0, "%s", t->name);
            const ckpt_tensor_desc *got = ckpt_reader_tensor(r, k);
            cr_assert(got->partition.kind == t->desc.partition.kind && got->anchor == t->desc.anchor &&
                          !strcmp(got->role, t->desc.role) && got->dtype == t->desc.dtype,
                      "%s: its description comes back", t->name);
            if (got->partition.kind == CKPT_SPLIT)
                cr_assert(got->partition.axis == t->desc.partition.axis &&
                          got->partition.num_segments == t->desc.partition.num_segments &&
                          got->partition.pad_multiple == t->desc.partition.pad_multiple);
            size_t es = tp_dtype_size(t->desc.dtype);
            int64_t elements = elements_of(t->desc.shape, t->desc.ndim);
            cr_assert_eq(ckpt_reader_digest(r, k), naive_digest(t->logical, es, elements), "%s: digest", t->name);
            int64_t start[CKPT_MAX_DIMS] = {0};
            uint8_t *values = malloc((size_t)elements * es);
            cr_assert_eq(ckpt_reader_read_region(r, k, start, t->desc.shape, values, (size_t)elements * es), TP_OK, "%s",
                         tp_errmsg());
            cr_assert_eq(memcmp(values, t->logical, (size_t)elements * es), 0, "%s: values", t->name);
            free(values);
        }
        ckpt_verify_result result;
        cr_assert_eq(ckpt_verify(r, NULL, &result), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(result.damaged, 0, "every tensor equal to the digest its description records");
        ckpt_verify_result_free(&result);
        dcp_verify_result items;
        cr_assert_eq(dcp_verify(d, 2, NULL, NULL, &items), TP_OK, "%s", tp_errmsg());
        cr_assert(items.damaged == 0 && items.unchecked == 0 && items.items == plan.chunks + 1, "%d items", items.items);
        ckpt_reader_close(r);
        dcp_close(d);
        ckpt_reader_close(source);
        for (int i = 0; i < n; i++) free(tensors[i].logical);
    }
}

/* ----------------------------------------------------- hostile metadata */

/* A `.metadata` of one fp32 tensor "w" of shape [4, 6], whose chunks and
 * storage items a case describes, beside a data file holding the fixture
 * cols2's first item (a torch.save of a [6, 4] fp32 chunk at offset 0). */
typedef struct {
    const char *dtype;          /* the torch dtype's name */
    int64_t offsets[2][2], sizes[2][2];
    int chunks;
    const char *path[2];        /* the items' relative paths */
    int64_t at[2], length[2];
    int storage;                /* storage items written (of chunks) */
    const char *key2;           /* a second entry of this key (bytes), or NULL */
    const char *transform;      /* transform_descriptors of the first item, or NULL */
    const char *root_class;     /* instead of Metadata */
} hostile_case;

static void pk_size2(byte_buffer *b, const int64_t *v)
{
    pk_global(b, "torch", "Size");
    pk_mark(b);
    pk_mark(b);
    pk_int(b, v[0]);
    pk_int(b, v[1]);
    pk_tuple_end(b);
    pk_tuple_end(b);
    pk_reduce(b);
}

static void write_hostile(const char *path, const hostile_case *c)
{
    const char *m = "torch.distributed.checkpoint.metadata";
    byte_buffer b = {NULL, 0, 0, 0};
    pk_proto(&b);
    pk_object_begin(&b, NULL, m, c->root_class ? c->root_class : "Metadata");
    pk_dict_begin(&b);
    pk_string(&b, "state_dict_metadata");
    pk_dict_begin(&b);
    pk_string(&b, "w");
    pk_object_begin(&b, NULL, m, "TensorStorageMetadata");
    pk_dict_begin(&b);
    pk_string(&b, "properties");
    pk_object_begin(&b, NULL, m, "TensorProperties");
    pk_mark(&b);
    pk_global(&b, "torch", c->dtype ? c->dtype : "float32");
    pk_tuple_end(&b);
    pk_build(&b);
    pk_string(&b, "size");
    pk_size2(&b, (int64_t[]){6, 8});
    pk_string(&b, "chunks");
    pk_list_begin(&b);
    for (int k = 0; k < c->chunks; k++) {
        pk_object_begin(&b, NULL, m, "ChunkStorageMetadata");
        pk_dict_begin(&b);
        pk_string(&b, "offsets");
        pk_size2(&b, c->offsets[k]);
        pk_string(&b, "sizes");
        pk_size2(&b, c->sizes[k]);
        pk_dict_end(&b);
        pk_build(&b);
    }
    pk_list_end(&b);
    pk_dict_end(&b);
    pk_build(&b);
    if (c->key2) {
        pk_string(&b, c->key2);
        pk_object_begin(&b, NULL, m, "BytesStorageMetadata");
        pk_dict_begin(&b);
        pk_dict_end(&b);
        pk_build(&b);
    }
    pk_dict_end(&b);
    pk_string(&b, "storage_data");
    pk_dict_begin(&b);
    for (int k = 0; k < c->storage; k++) {
        pk_object_begin(&b, NULL, m, "MetadataIndex");
        pk_dict_begin(&b);
        pk_string(&b, "fqn");
        pk_string(&b, "w");
        pk_string(&b, "offset");
        pk_size2(&b, c->offsets[k]);
        pk_dict_end(&b);
        pk_build(&b);
        pk_object_begin(&b, NULL, "torch.distributed.checkpoint.filesystem", "_StorageInfo");
        pk_dict_begin(&b);
        pk_string(&b, "relative_path");
        pk_string(&b, c->path[k] ? c->path[k] : "__0_0.distcp");
        pk_string(&b, "offset");
        pk_int(&b, c->at[k]);
        pk_string(&b, "length");
        pk_int(&b, c->length[k]);
        if (k == 0 && c->transform) {
            pk_string(&b, "transform_descriptors");
            pk_list_begin(&b);
            pk_string(&b, c->transform);
            pk_list_end(&b);
        }
        pk_dict_end(&b);
        pk_build(&b);
    }
    pk_dict_end(&b);
    pk_dict_end(&b);
    pk_build(&b);
    pk_stop(&b);
    cr_assert(!b.failed);
    FILE *f = fopen(path, "wb");
    cr_assert(f && fwrite(b.data, 1, b.size, f) == b.size);
    fclose(f);
    free(b.data);
}

/* The case must be refused, by dcp_open or dcp_reader_open, with a message
 * holding expect. */
static void refused(const hostile_case *c, const char *expect)
{
    char ckpt[600], data[700], meta[700];
    static int n;
    snprintf(ckpt, sizeof ckpt, "%s/hostile%d", dir, n++);
    cr_assert_eq(mkdir(ckpt, 0755), 0);
    snprintf(data, sizeof data, "%s/__0_0.distcp", ckpt);
    cr_assert_eq(fuzz_copy_file("tests/data/dcp/cols2/__0_0.distcp", data), 0);
    snprintf(meta, sizeof meta, "%s/.metadata", ckpt);
    write_hostile(meta, c);
    dcp_checkpoint *d = NULL;
    ckpt_reader *r = NULL;
    int status = dcp_open(ckpt, &d);
    if (!status) status = dcp_reader_open(d, 1, 1, &r);
    cr_assert_neq(status, TP_OK, "refused: %s", expect);
    cr_assert(strstr(tp_errmsg(), expect), "'%s' says '%s'", tp_errmsg(), expect);
    ckpt_reader_close(r);
    dcp_close(d);
}

Test(dcp, hostile_metadata_refused)
{
    /* The item at 0 of cols2's __0_0.distcp: find its length from the fixture. */
    dcp_checkpoint *fixture;
    cr_assert_eq(dcp_open("tests/data/dcp/cols2", &fixture), TP_OK, "%s", tp_errmsg());
    const dcp_entry *w = entry(fixture, "model.w");
    const dcp_chunk *first = NULL;
    for (int k = 0; k < w->num_chunks; k++)
        if (!strcmp(dcp_file(fixture, w->chunks[k].file, NULL), "__0_0.distcp")) first = &w->chunks[k];
    cr_assert(first);
    int64_t at = first->item_offset, length = first->item_bytes;
    dcp_close(fixture);
    /* The item holds a [6, 4] chunk: the tensor [6, 8] cut in two, both items the same one. */
    hostile_case ok = {.chunks = 2, .offsets = {{0, 0}, {0, 4}}, .sizes = {{6, 4}, {6, 4}}, .at = {at, at},
                       .length = {length, length}, .storage = 2};
    char ckpt[600], data[700], meta[700];
    snprintf(ckpt, sizeof ckpt, "%s/good", dir);
    cr_assert_eq(mkdir(ckpt, 0755), 0);
    snprintf(data, sizeof data, "%s/__0_0.distcp", ckpt);
    cr_assert_eq(fuzz_copy_file("tests/data/dcp/cols2/__0_0.distcp", data), 0);
    snprintf(meta, sizeof meta, "%s/.metadata", ckpt);
    write_hostile(meta, &ok);
    dcp_checkpoint *d;
    ckpt_reader *r;
    cr_assert_eq(dcp_open(ckpt, &d), TP_OK, "the case builder makes a valid checkpoint: %s", tp_errmsg());
    cr_assert_eq(dcp_reader_open(d, 1, 1, &r), TP_OK, "%s", tp_errmsg());
    ckpt_reader_close(r);
    dcp_close(d);

    hostile_case c = ok;
    c.storage = 1;
    refused(&c, "w: chunk 1 has no storage item");
    c = ok;
    c.path[1] = "../__0_0.distcp";
    refused(&c, "not a plain file name");
    c = ok;
    c.path[1] = "__9_0.distcp";
    refused(&c, "__9_0.distcp: data file missing");
    c = ok;
    c.transform = "zstandard";
    refused(&c, "transformed (zstandard)");
    c = ok;
    c.sizes[1][1] = 5;
    refused(&c, "chunk 1 spans [4, 9) of dimension 1 of size 8");
    c = ok;
    c.at[1] = 1 << 20;
    refused(&c, "lies outside the file");
    c = ok;
    c.at[1] = at + 1; /* not the start of an archive */
    refused(&c, "w: the item at");
    c = ok;
    c.dtype = "bfloat16"; /* the item holds fp32 */
    refused(&c, "not the chunk's bfloat16 tensor");
    c = ok;
    c.offsets[1][1] = 2; /* overlapping chunks, one missing */
    c.sizes[1][1] = 4;
    refused(&c, "overlap");
    c = ok;
    c.key2 = "w";
    refused(&c, "the key 'w' twice");
    c = ok;
    c.root_class = "Planner";
    refused(&c, "not a distributed checkpoint's Metadata");
}

/* ------------------------------------------------------------ the corpus */

Test(dcp, fuzz_corpus)
{
    cr_assert_gt(replay_corpus("dcp", LLVMFuzzerTestOneInput), 0);
}
