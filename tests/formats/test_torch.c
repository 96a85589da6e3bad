/* torch.save files and pickles: files written by real PyTorch
 * (tests/formats/torch_fixtures.py, with Debian's python3-torch; skipped
 * without it) read and compared with what torch.load says they hold, byte
 * for byte; zip variants (Zip64, compressed, truncated, the pre-1.6
 * format); and hostile pickles made by hand: nesting bombs, huge memo
 * indices and lengths, cycles, tensors reaching past their storage, every
 * prefix of a valid stream; entries whose bytes differ from the CRC-32 the
 * zip records. Then the fuzzing corpora replayed through the
 * fuzz targets. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../common/error.h"
#include "../../formats/torch.h"
#include "../../formats/torch_write.h"
#include "../support/fixture.h"

TestSuite(torch, .init = make_dir, .fini = remove_dir, .timeout = 60);


/* Writes the fixtures into dir; skips the test without PyTorch. */
static void make_fixtures(void)
{
    char command[1200];
    snprintf(command, sizeof command, "%s -c 'import torch, numpy' 2>/dev/null", fixture_python());
    if (system(command) != 0) cr_skip_test("python3-torch is not installed");
    snprintf(command, sizeof command, "%s tests/formats/torch_fixtures.py %s", fixture_python(), dir);
    cr_assert_eq(system(command), 0, "%s (run from the repository root)", command);
}

static void fixture(char *out, size_t size, const char *name)
{
    snprintf(out, size, "%s/%s", dir, name);
}

/* ------------------------------------------------- against real PyTorch */

typedef struct {
    char paths[64][160];
    const pickle_value *tensors[64];
    int count;
} tensor_list;

static int collect(void *ctx, const char *path, const pickle_value *tensor)
{
    tensor_list *list = ctx;
    cr_assert_lt(list->count, 64);
    snprintf(list->paths[list->count], sizeof list->paths[0], "%s", path);
    list->tensors[list->count++] = tensor;
    return 0;
}

static const pickle_value *find(const tensor_list *list, const char *path)
{
    for (int i = 0; i < list->count; i++)
        if (!strcmp(list->paths[i], path)) return list->tensors[i];
    return NULL;
}

static int hex_digit(char c)
{
    return c <= '9' ? c - '0' : c - 'a' + 10;
}

/* Every line of expected.txt holds for the archive. */
static void check_against_torch(const char *file)
{
    torch_archive *archive;
    cr_assert_eq(torch_archive_open(file, NULL, &archive), TP_OK, "%s", tp_errmsg());
    tensor_list *list = calloc(1, sizeof *list);
    cr_assert_eq(pickle_walk_tensors(torch_archive_doc(archive), torch_archive_root(archive), collect, list), TP_OK);
    char expected_path[700];
    fixture(expected_path, sizeof expected_path, "expected.txt");
    FILE *f = fopen(expected_path, "r");
    cr_assert(f);
    char line[8192];
    int tensors = 0;
    const pickle_value *root = torch_archive_root(archive);
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *fields[40];
        int n = 0;
        for (char *t = strtok(line, " "); t && n < 40; t = strtok(NULL, " ")) fields[n++] = t;
        if (!strcmp(fields[0], "value")) {
            const pickle_value *v = pickle_get(root, fields[1]);
            cr_assert(v, "%s missing", fields[1]);
            if (v->kind == PICKLE_INT) {
                cr_assert_eq(v->integer, strtoll(fields[2], NULL, 10), "%s", fields[1]);
            } else {
                cr_assert(v->kind == PICKLE_BIGINT || v->kind == PICKLE_BYTES, "%s is a %s", fields[1], pickle_kind_name(v->kind));
                cr_assert_eq((size_t)v->text.size * 2, strlen(fields[2]), "%s: %lld bytes", fields[1], (long long)v->text.size);
                for (int64_t i = 0; i < v->text.size; i++)
                    cr_assert_eq((unsigned char)v->text.data[i], hex_digit(fields[2][2 * i]) * 16 + hex_digit(fields[2][2 * i + 1]));
            }
            continue;
        }
        tensors++;
        const pickle_value *t = find(list, fields[0]);
        cr_assert(t, "%s: tensor %s not found", file, fields[0]);
        cr_assert_str_eq(torch_dtype_name(t->tensor->storage->storage.dtype), fields[1], "%s", fields[0]);
        int contiguous = atoi(fields[2]), ndim = atoi(fields[3]);
        cr_assert_eq(t->tensor->ndim, ndim, "%s", fields[0]);
        for (int d = 0; d < ndim; d++) cr_assert_eq(t->tensor->shape[d], atoll(fields[4 + d]), "%s dim %d", fields[0], d);
        cr_assert_eq(torch_tensor_is_contiguous(t), contiguous, "%s", fields[0]);
        int64_t offset, size;
        if (!contiguous) {
            cr_assert_neq(torch_tensor_range(archive, t, &offset, &size), TP_OK);
            cr_assert(strstr(tp_errmsg(), "not contiguous"), "%s", tp_errmsg());
            continue;
        }
        cr_assert_eq(torch_tensor_range(archive, t, &offset, &size), TP_OK, "%s: %s", fields[0], tp_errmsg());
        const char *hex = fields[4 + ndim];
        size_t want = !strcmp(hex, "-") ? 0 : strlen(hex) / 2;
        cr_assert_eq((size_t)size, want, "%s: %lld bytes, torch has %zu", fields[0], (long long)size, want);
        unsigned char *bytes = malloc(want + 1);
        cr_assert_eq(torch_tensor_read(archive, t, bytes, 0, size), TP_OK, "%s", tp_errmsg());
        for (size_t i = 0; i < want; i++)
            cr_assert_eq(bytes[i], hex_digit(hex[2 * i]) * 16 + hex_digit(hex[2 * i + 1]), "%s byte %zu", fields[0], i);
        free(bytes);
    }
    fclose(f);
    cr_assert_eq(list->count, tensors, "%d tensors found, torch.load has %d", list->count, tensors);
    free(list);
    torch_archive_close(archive);
}

/* A tree's memory is its values': a value as wide as a tensor's view (16
 * dimensions of shape and stride inline) made every int and string 288
 * bytes, and a DCP `.metadata` of 7.4 MB (18,126 chunks) took 231 MB. The
 * widest kinds now are an object's and a dict's, 6 words; a tensor's view
 * is apart. */
Test(torch, a_value_is_a_few_words)
{
    cr_assert_leq(sizeof(pickle_value), 64, "a pickle value of %zu bytes", sizeof(pickle_value));
}

Test(torch, tensors_equal_what_torch_load_gives)
{
    make_fixtures();
    char file[700];
    fixture(file, sizeof file, "state.pt");
    check_against_torch(file);
    fixture(file, sizeof file, "zip64.pt");
    check_against_torch(file);
}

Test(torch, values_and_megatron_args)
{
    make_fixtures();
    char file[700];
    fixture(file, sizeof file, "state.pt");
    torch_archive *archive;
    cr_assert_eq(torch_archive_open(file, NULL, &archive), TP_OK, "%s", tp_errmsg());
    const pickle_value *root = torch_archive_root(archive), *args = pickle_get(root, "args");
    cr_assert(args && args->kind == PICKLE_OBJECT);
    cr_assert_str_eq(args->object.cls, "argparse.Namespace");
    cr_assert_eq(pickle_get(args, "num_layers")->integer, 2);
    cr_assert_eq(pickle_get(args, "swiglu")->kind, PICKLE_BOOL);
    cr_assert_eq(pickle_get(args, "swiglu")->integer, 0);
    const pickle_value *dtype = pickle_get(args, "params_dtype");
    cr_assert(dtype->kind == PICKLE_GLOBAL && !strcmp(dtype->text.data, "torch.bfloat16"), "%s", pickle_kind_name(dtype->kind));
    cr_assert(pickle_is_string(pickle_get(args, "tokenizer_type"), "GPT2BPETokenizer"));
    /* An enum of the saving program: an opaque call, kept, not run. Python
     * 3.11 pickles a member as getattr(its class, its name), 3.12 and later
     * as a call of its class with its value. */
    const pickle_value *backend = pickle_get(args, "attention_backend");
    cr_assert(backend->kind == PICKLE_OBJECT, "%s", pickle_kind_name(backend->kind));
    cr_assert(!strcmp(backend->object.cls, "builtins.getattr") || !strcmp(backend->object.cls, "__main__.Backend"),
              "attention_backend is a call of %s", backend->object.cls);
    cr_assert_eq(pickle_get(root, "checkpoint_version")->kind, PICKLE_FLOAT);
    cr_assert_float_eq(pickle_get(root, "checkpoint_version")->real, 3.0, 0);
    cr_assert_float_eq(pickle_get(root, "ratio")->real, 0.125, 0);
    cr_assert_eq(pickle_get(root, "tags")->kind, PICKLE_SET);
    cr_assert_eq(pickle_get(root, "tags")->items.count, 2);
    const pickle_value *flags = pickle_get(root, "flags");
    cr_assert(flags->kind == PICKLE_LIST && flags->items.count == 3);
    cr_assert(flags->items.items[0]->kind == PICKLE_BOOL && flags->items.items[0]->integer == 1);
    cr_assert_eq(flags->items.items[2]->kind, PICKLE_NONE);
    /* Optimizer state is keyed by integers. */
    const pickle_value *state = pickle_get(pickle_get(root, "optimizer"), "state");
    cr_assert_eq(pickle_get(pickle_get_int(state, 0), "step")->integer, 5);
    cr_assert_eq(pickle_get_int(state, 1)->kind, PICKLE_DICT);
    cr_assert_null(pickle_get_int(state, 2));
    /* numpy's RNG state is an opaque object inside a tuple, not an error. */
    const pickle_value *rng = pickle_get(pickle_get(root, "rng_state")->items.items[0], "np_rng_state");
    cr_assert_eq(rng->kind, PICKLE_TUPLE);
    cr_assert(pickle_is_string(rng->items.items[0], "MT19937"));
    cr_assert_eq(rng->items.items[1]->kind, PICKLE_OBJECT);
    /* The state dict is an OrderedDict: a dict in the order saved. */
    const pickle_value *model = pickle_get(pickle_get(root, "model"), "language_model");
    cr_assert_eq(model->kind, PICKLE_DICT);
    cr_assert(pickle_is_string(model->dict.keys.items[0], "word_embeddings.weight"));
    torch_archive_close(archive);
}

static void expect_refused(const char *file, const char *needle)
{
    torch_archive *archive = NULL;
    int status = torch_archive_open(file, NULL, &archive);
    torch_archive_close(archive);
    cr_assert_neq(status, TP_OK, "%s accepted", file);
    cr_assert(strstr(tp_errmsg(), needle), "'%s' not in: %s", needle, tp_errmsg());
}

Test(torch, other_files_are_refused_saying_why)
{
    make_fixtures();
    char file[700];
    fixture(file, sizeof file, "legacy.pt");
    expect_refused(file, "before PyTorch 1.6");
    fixture(file, sizeof file, "deflated.pt");
    expect_refused(file, "compressed");
    fixture(file, sizeof file, "expected.txt");
    expect_refused(file, "not a torch.save file");
    expect_refused(dir, "directory");
    fixture(file, sizeof file, "missing.pt");
    expect_refused(file, "missing.pt");
}

/* Every truncation of a real archive, and a flipped byte in each of its
 * structures, fails with an error naming the file (or, for a flip in
 * tensor data, opens: tensor data is checked by whoever reads it). */
Test(torch, damaged_archives_fail_cleanly)
{
    make_fixtures();
    char file[700], damaged[700];
    fixture(file, sizeof file, "state.pt");
    fixture(damaged, sizeof damaged, "damaged.pt");
    FILE *f = fopen(file, "rb");
    static unsigned char data[1 << 16];
    size_t size = fread(data, 1, sizeof data, f);
    fclose(f);
    for (size_t cut = 0; cut < size; cut += cut < 64 || size - cut < 200 ? 1 : 97) {
        f = fopen(damaged, "wb");
        fwrite(data, 1, cut, f);
        fclose(f);
        expect_refused(damaged, "damaged.pt");
    }
    int opened = 0;
    for (size_t at = 0; at < size; at += 7) {
        data[at] ^= 0x5a;
        f = fopen(damaged, "wb");
        fwrite(data, 1, size, f);
        fclose(f);
        torch_archive *archive = NULL;
        if (torch_archive_open(damaged, NULL, &archive) == TP_OK) opened++;
        else cr_assert(strstr(tp_errmsg(), "damaged.pt"), "%s", tp_errmsg());
        torch_archive_close(archive);
        data[at] ^= 0x5a;
    }
    cr_assert_gt(opened, 0);
}

/* ------------------------------------------------- entries' CRC-32s */

/* {'activation': 'gelu', 'rng': tensor([1., 2., 3., 4.])} written by our
 * writer, as common.pt holds args and a small tensor. */
static void write_small_archive(const char *path)
{
    torch_writer *w;
    cr_assert_eq(torch_writer_open(path, "common", &w), TP_OK, "%s", tp_errmsg());
    byte_buffer *b = torch_writer_pickle(w);
    pk_dict_begin(b);
    pk_string(b, "activation");
    pk_string(b, "gelu");
    pk_string(b, "rng");
    int64_t shape[1] = {4};
    cr_assert_eq(torch_writer_tensor(w, TORCH_FLOAT32, 1, shape), TP_OK, "%s", tp_errmsg());
    pk_dict_end(b);
    cr_assert_eq(torch_writer_begin_storages(w), TP_OK, "%s", tp_errmsg());
    float values[4] = {1, 2, 3, 4};
    cr_assert_eq(torch_writer_storage(w, values, sizeof values), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(torch_writer_finish(w), TP_OK, "%s", tp_errmsg());
}

/* XORs the byte at the first occurrence of what (from its start + skip)
 * in the file with flip. */
static void flip_at(const char *path, const void *what, size_t n, size_t skip, unsigned char flip)
{
    static unsigned char data[1 << 16];
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    size_t size = fread(data, 1, sizeof data, f);
    fclose(f);
    unsigned char *at = memmem(data, size, what, n);
    cr_assert(at, "not in %s", path);
    at[skip] ^= flip;
    f = fopen(path, "wb");
    cr_assert_eq(fwrite(data, 1, size, f), size);
    fclose(f);
}

static const pickle_value *only_tensor(const torch_archive *archive)
{
    const pickle_value *t = pickle_get(torch_archive_root(archive), "rng");
    cr_assert(t && t->kind == PICKLE_TENSOR);
    return t;
}

/* A flipped byte of data.pkl that leaves a valid pickle ('gelu' read as
 * 'gelv') is refused at open by the entry's CRC-32, naming the file,
 * the entry and both values: no reader takes the altered value. */
Test(torch, a_pickle_that_differs_from_its_crc_is_refused_at_open)
{
    char path[700];
    snprintf(path, sizeof path, "%s/common.pt", dir);
    write_small_archive(path);
    flip_at(path, "gelu", 4, 3, 0x03);
    torch_archive *archive = NULL;
    int status = torch_archive_open(path, NULL, &archive);
    torch_archive_close(archive);
    cr_assert_eq(status, TP_ERR_CHECKSUM, "opened: %s", status ? tp_errmsg() : "ok");
    cr_assert(strstr(tp_errmsg(), path) && strstr(tp_errmsg(), "entry common/data.pkl: its ") &&
              strstr(tp_errmsg(), "have CRC-32 ") && strstr(tp_errmsg(), "the archive records "), "%s", tp_errmsg());
}

/* A flipped bit of a tensor's storage: the archive opens (its tensors are
 * checked by whoever reads them), torch_tensor_read_checked and
 * torch_archive_check refuse it, naming the entry; undamaged, both read. */
Test(torch, a_storage_that_differs_from_its_crc_is_refused_by_checked_reads)
{
    char path[700];
    snprintf(path, sizeof path, "%s/common.pt", dir);
    write_small_archive(path);
    torch_archive *archive;
    float got[4];
    torch_archive_check_result result;
    cr_assert_eq(torch_archive_open(path, NULL, &archive), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(torch_tensor_read_checked(archive, only_tensor(archive), got, sizeof got), TP_OK, "%s", tp_errmsg());
    cr_assert(got[0] == 1 && got[3] == 4);
    cr_assert_eq(torch_archive_check(archive, &result, NULL, NULL), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(result.unchecked, 0);
    torch_archive_close(archive);

    const float three = 3;
    flip_at(path, &three, sizeof three, 3, 0x01);
    cr_assert_eq(torch_archive_open(path, NULL, &archive), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(torch_tensor_read_checked(archive, only_tensor(archive), got, sizeof got), TP_ERR_CHECKSUM);
    cr_assert(strstr(tp_errmsg(), "entry common/data/0: its 16 bytes have CRC-32 "), "%s", tp_errmsg());
    cr_assert_eq(torch_archive_check(archive, &result, NULL, NULL), TP_ERR_CHECKSUM);
    cr_assert(strstr(tp_errmsg(), "entry common/data/0"), "%s", tp_errmsg());
    torch_archive_close(archive);
}

/* ------------------------------------------------------ hostile pickles */

static int load(const void *data, size_t size, const pickle_limits *limits, pickle_doc **doc)
{
    *doc = NULL;
    return pickle_load(data, size, "test.pkl", limits, doc);
}

static void expect_pickle_refused(const void *data, size_t size, const pickle_limits *limits, const char *needle)
{
    pickle_doc *doc;
    int status = load(data, size, limits, &doc);
    pickle_free(doc);
    cr_assert_neq(status, TP_OK, "accepted");
    cr_assert(strstr(tp_errmsg(), needle), "'%s' not in: %s", needle, tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "test.pkl"), "%s", tp_errmsg());
}

Test(torch, nesting_bomb_of_marks)
{
    static unsigned char data[20000];
    size_t n = 0;
    data[n++] = 0x80;
    data[n++] = 2;
    for (int i = 0; i < 5000; i++) data[n++] = '(';
    data[n++] = '.';
    expect_pickle_refused(data, n, NULL, "more than 1000 MARKs");
}

Test(torch, memo_index_and_lengths_beyond_bounds)
{
    const unsigned char put[] = {0x80, 2, ']', 'r', 0xf0, 0xff, 0xff, 0xff, '.'};
    expect_pickle_refused(put, sizeof put, NULL, "memo index 4294967280 beyond the limit");
    const unsigned char get[] = {0x80, 2, 'j', 0x00, 0x00, 0x10, 0x00, '.'};
    expect_pickle_refused(get, sizeof get, NULL, "never stored");
    /* BINUNICODE8 and BINBYTES8 claiming 2^60 bytes; LONG4 claiming 2^31. */
    const unsigned char text[] = {0x80, 4, 0x8d, 0, 0, 0, 0, 0, 0, 0, 0x10, 'a', '.'};
    expect_pickle_refused(text, sizeof text, NULL, "length of 1152921504606846976 bytes");
    const unsigned char bytes[] = {0x80, 4, 0x8e, 0, 0, 0, 0, 0, 0, 0, 0x10, '.'};
    expect_pickle_refused(bytes, sizeof bytes, NULL, "truncated or hostile");
    const unsigned char big[] = {0x80, 2, 0x8b, 0, 0, 0, 0x80, 1, '.'};
    expect_pickle_refused(big, sizeof big, NULL, "truncated or hostile");
}

/* A list appended to itself a million times (2 bytes of input for each
 * 8-byte reference) stops at the memory limit. */
Test(torch, memory_bomb_stops_at_the_limit)
{
    size_t n = 0, size = 2 + 1 + 2 * 1000000 + 1;
    unsigned char *data = malloc(size);
    data[n++] = 0x80;
    data[n++] = 2;
    data[n++] = ']';
    for (int i = 0; i < 1000000; i++) {
        data[n++] = '2';
        data[n++] = 'a';
    }
    data[n++] = '.';
    pickle_limits limits;
    pickle_limits_init(&limits);
    limits.max_memory = 1 << 20;
    expect_pickle_refused(data, n, &limits, "limit of 1048576 bytes");
    /* Within the default limit it loads: a list holding itself a million times. */
    pickle_doc *doc;
    cr_assert_eq(load(data, n, NULL, &doc), TP_OK, "%s", tp_errmsg());
    const pickle_value *root = pickle_root(doc);
    cr_assert_eq(root->items.count, 1000000);
    cr_assert_eq(root->items.items[999999], root);
    free(data);
    pickle_free(doc);
}

static int count_tensors(void *ctx, const char *path, const pickle_value *tensor)
{
    (void)path;
    (void)tensor;
    ++*(int *)ctx;
    return 0;
}

Test(torch, cycles_end_and_deep_trees_are_refused_by_walks)
{
    /* l = []; l.append(l); d = {'a': l, 'b': l} */
    const unsigned char cycle[] = {0x80, 2, '}', 'X', 1, 0, 0, 0, 'a', ']', 'q', 0, 'h', 0, 'a', 's',
                                   'X', 1, 0, 0, 0, 'b', 'h', 0, 's', '.'};
    pickle_doc *doc;
    cr_assert_eq(load(cycle, sizeof cycle, NULL, &doc), TP_OK, "%s", tp_errmsg());
    int tensors = 0;
    cr_assert_eq(pickle_walk_tensors(doc, pickle_root(doc), count_tensors, &tensors), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(pickle_walk_tensors(doc, pickle_root(doc), count_tensors, &tensors), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(tensors, 0);
    pickle_free(doc);
    /* Lists nested 100 deep, built through the memo without MARKs. */
    unsigned char deep[2000];
    size_t n = 0;
    deep[n++] = 0x80;
    deep[n++] = 2;
    deep[n++] = ']';
    deep[n++] = 'q';
    deep[n++] = 0;
    for (int i = 0; i < 100; i++) {
        const unsigned char one[] = {']', 'q', 1, 'a', '0', 'h', 1};
        memcpy(deep + n, one, sizeof one);
        n += sizeof one;
    }
    const unsigned char end[] = {'0', 'h', 0, '.'};
    memcpy(deep + n, end, sizeof end);
    n += sizeof end;
    cr_assert_eq(load(deep, n, NULL, &doc), TP_OK, "%s", tp_errmsg());
    cr_assert_neq(pickle_walk_tensors(doc, pickle_root(doc), count_tensors, &tensors), TP_OK);
    cr_assert(strstr(tp_errmsg(), "nested more than 64 deep"), "%s", tp_errmsg());
    pickle_free(doc);
}

static size_t put_text(unsigned char *out, size_t n, const char *text)
{
    memcpy(out + n, text, strlen(text));
    return n + strlen(text);
}

static size_t put_string(unsigned char *out, size_t n, const char *text)
{
    uint32_t size = (uint32_t)strlen(text);
    out[n++] = 'X'; /* BINUNICODE */
    memcpy(out + n, &size, 4);
    return put_text(out, n + 4, text);
}

static size_t put_long(unsigned char *out, size_t n, int64_t value)
{
    out[n++] = 0x8a; /* LONG1 of 8 bytes */
    out[n++] = 8;
    memcpy(out + n, &value, 8);
    return n + 8;
}

/* _rebuild_tensor_v2(storage of 4 floats, offset, (size0, size1),
 * (stride0, stride1), False, OrderedDict()) */
static size_t tensor_pickle(unsigned char *out, int64_t offset, int64_t size0, int64_t size1, int64_t stride0,
                            int64_t stride1)
{
    size_t n = put_text(out, 0, "\x80\x02" "ctorch._utils\n_rebuild_tensor_v2\n((");
    n = put_string(out, n, "storage");
    n = put_text(out, n, "ctorch\nFloatStorage\n");
    n = put_string(out, n, "0");
    n = put_string(out, n, "cpu");
    n = put_text(out, n, "K\x04tQ"); /* numel 4, the id tuple, BINPERSID */
    n = put_long(out, n, offset);
    n = put_long(out, put_long(out, n, size0), size1);
    out[n++] = 0x86; /* TUPLE2 */
    n = put_long(out, put_long(out, n, stride0), stride1);
    out[n++] = 0x86;
    return put_text(out, n, "\x89" "ccollections\nOrderedDict\n)RtR.");
}

Test(torch, tensors_reaching_past_their_storage_are_refused)
{
    unsigned char data[400];
    pickle_doc *doc;
    size_t n = tensor_pickle(data, 0, 2, 2, 2, 1);
    cr_assert_eq(load(data, n, NULL, &doc), TP_OK, "%s", tp_errmsg());
    const pickle_value *t = pickle_root(doc);
    cr_assert_eq(t->kind, PICKLE_TENSOR, "%s", pickle_kind_name(t->kind));
    cr_assert_eq(t->tensor->shape[0], 2);
    cr_assert_eq(t->tensor->stride[0], 2);
    cr_assert_str_eq(t->tensor->storage->storage.key, "0");
    cr_assert_eq(t->tensor->storage->storage.numel, 4);
    cr_assert(torch_tensor_is_contiguous(t));
    pickle_free(doc);
    n = tensor_pickle(data, 1, 2, 2, 2, 1);
    expect_pickle_refused(data, n, NULL, "reaching past the 4 elements of storage 0");
    n = tensor_pickle(data, 0, 2, (int64_t)1 << 62, (int64_t)1 << 62, 1);
    expect_pickle_refused(data, n, NULL, "reaching past");
    n = tensor_pickle(data, 0, 3, 3, INT64_MAX, INT64_MAX);
    expect_pickle_refused(data, n, NULL, "reaching past");
    n = tensor_pickle(data, -1, 1, 1, 1, 1);
    expect_pickle_refused(data, n, NULL, "offset -1");
    /* An empty tensor anywhere is fine. */
    n = tensor_pickle(data, 4, 0, 5, 5, 1);
    cr_assert_eq(load(data, n, NULL, &doc), TP_OK, "%s", tp_errmsg());
    pickle_free(doc);
}

/* Every prefix of a valid stream fails with a message; none crashes. */
/* torch_tensor_dense_order of a view of that shape and strides: -1 when
 * not dense, else the order's dimensions as digits ("10": dim 1 outer). */
static int dense_order_digits(int ndim, const int64_t *shape, const int64_t *stride)
{
    pickle_tensor view = {.ndim = ndim};
    memcpy(view.shape, shape, sizeof(int64_t) * (size_t)ndim);
    memcpy(view.stride, stride, sizeof(int64_t) * (size_t)ndim);
    pickle_value v = {.kind = PICKLE_TENSOR, .tensor = &view};
    int order[TORCH_MAX_DIMS], digits = 0;
    if (!torch_tensor_dense_order(&v, order)) return -1;
    for (int d = 0; d < ndim; d++) digits = digits * 10 + order[d];
    return digits;
}

/* What torch.save writes of a transposed or channels_last tensor (DCP
 * saves them with their strides): dense, in the order of its strides;
 * overlapping or gapped strides are not. */
Test(torch, dense_orders_of_strided_tensors)
{
    cr_assert_eq(dense_order_digits(2, (int64_t[]){3, 4}, (int64_t[]){4, 1}), 1, "row-major: 0 then 1");
    cr_assert_eq(dense_order_digits(2, (int64_t[]){4, 3}, (int64_t[]){1, 4}), 10, "transposed: dim 1 outermost");
    /* channels_last [N, C, H, W]: strides [H W C, 1, W C, C]: N, H, W, C. */
    cr_assert_eq(dense_order_digits(4, (int64_t[]){2, 3, 4, 5}, (int64_t[]){60, 1, 15, 3}), 231);
    /* A dimension of one element takes any stride and comes last. */
    cr_assert_eq(dense_order_digits(3, (int64_t[]){4, 1, 3}, (int64_t[]){1, 99, 4}), 201);
    cr_assert_eq(dense_order_digits(2, (int64_t[]){3, 4}, (int64_t[]){1, 1}), -1, "overlapping");
    cr_assert_eq(dense_order_digits(2, (int64_t[]){3, 4}, (int64_t[]){0, 1}), -1, "broadcast");
    cr_assert_eq(dense_order_digits(2, (int64_t[]){3, 4}, (int64_t[]){8, 1}), -1, "gaps between rows");
    cr_assert_eq(dense_order_digits(2, (int64_t[]){3, 4}, (int64_t[]){8, 2}), -1, "every other element");
}

Test(torch, every_truncation_of_a_stream_fails)
{
    unsigned char data[400];
    size_t n = tensor_pickle(data, 0, 2, 2, 2, 1);
    for (size_t cut = 0; cut < n; cut++) {
        pickle_doc *doc;
        int status = load(data, cut, NULL, &doc);
        pickle_free(doc);
        cr_assert_neq(status, TP_OK, "a prefix of %zu bytes accepted", cut);
    }
}

Test(torch, unknown_opcodes_and_calls)
{
    const unsigned char ext[] = {0x80, 2, 0x82, 1, '.'};
    expect_pickle_refused(ext, sizeof ext, NULL, "extension code");
    const unsigned char proto[] = {0x80, 9, '.'};
    expect_pickle_refused(proto, sizeof proto, NULL, "protocol 9");
    const unsigned char junk[] = {0x80, 2, 0xff, '.'};
    expect_pickle_refused(junk, sizeof junk, NULL, "0xff at byte 2");
    const unsigned char two[] = {0x80, 2, 'N', 'N', '.'};
    expect_pickle_refused(two, sizeof two, NULL, "2 values on the stack");
    /* os.system('x') is recorded, never called. */
    const char call[] = "\x80\x02" "cos\nsystem\n" "X\x01\x00\x00\x00x" "\x85R.";
    pickle_doc *doc;
    cr_assert_eq(load(call, sizeof call - 1, NULL, &doc), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(pickle_root(doc)->kind, PICKLE_OBJECT);
    cr_assert_str_eq(pickle_root(doc)->object.cls, "os.system");
    pickle_free(doc);
}

/* ------------------------------------------ the fuzzing corpora, replayed */

#define LLVMFuzzerTestOneInput fuzz_pickle_one
#include "../fuzz/fuzz_pickle.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_torch_one
#define count_tensor count_tensor_torch
#include "../fuzz/fuzz_torch.c"
#undef LLVMFuzzerTestOneInput

Test(torch, fuzz_corpora)
{
    cr_assert_gt(replay_corpus("pickle", fuzz_pickle_one), 0);
    cr_assert_gt(replay_corpus("torch", fuzz_torch_one), 0);
}
