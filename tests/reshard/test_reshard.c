/* Resharding against naive references: random tensors, segment lists,
 * padding and layouts; multi-slab streaming under a tight memory limit;
 * round trips; impossible targets; the CUDA executor against the CPU one. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../common/memory.h"
#include "../../kernels/kernels.h"
#include "../../reshard/reshard.h"
#include "../support/fixture.h"

TestSuite(reshard, .init = make_dir, .fini = remove_dir);

static void run_reshard(const char *from, const char *to, const reshard_options *options)
{
    ckpt_reader *source;
    cr_assert_eq(ckpt_reader_open(&source, from, NULL), TP_OK, "%s", tp_errmsg());
    reshard_plan *plan;
    cr_assert_eq(reshard_plan_create(&plan, source, options), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(reshard_execute(plan, to), TP_OK, "%s", tp_errmsg());
    reshard_plan_free(plan);
    ckpt_reader *output;
    cr_assert_eq(ckpt_reader_open(&output, to, NULL), TP_OK, "%s", tp_errmsg());
    reshard_verify_result result;
    cr_assert_eq(reshard_verify(source, output, 2, &result), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(result.mismatches, 0, "verify: %s", result.first_mismatch);
    ckpt_reader_close(output);
    ckpt_reader_close(source);
}

/* Every piece of every tensor at path equals the naive piece of the expected
 * logical tensor (the source's, converted where the dtype changed). */
static void check_output(const char *path, const test_tensor *tensors, int n, int drop_optimizer)
{
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
    int tp = ckpt_reader_layout(r)->tp, seen = 0;
    for (int i = 0; i < n; i++) {
        const test_tensor *t = &tensors[i];
        int k = ckpt_reader_find(r, t->name);
        if (drop_optimizer && strcmp(t->desc.role, "param") != 0) {
            cr_assert_eq(k, -1, "%s dropped", t->name);
            continue;
        }
        cr_assert(k >= 0, "%s present", t->name);
        seen++;
        const ckpt_tensor_desc *d = ckpt_reader_tensor(r, k);
        int64_t count = elements_of(t->desc.shape, t->desc.ndim);
        uint8_t *logical = malloc((size_t)count * 4);
        convert_numbers(t->logical, t->desc.dtype, logical, d->dtype, count);
        cr_assert_eq(ckpt_reader_digest(r, k), naive_digest(logical, tp_dtype_size(d->dtype), count), "digest of %s",
                     t->name);
        int64_t shape[CKPT_MAX_DIMS];
        ckpt_piece_shape(d, tp, shape);
        size_t bytes = (size_t)elements_of(shape, d->ndim) * tp_dtype_size(d->dtype);
        uint8_t *want = malloc(bytes), *got = malloc(bytes);
        for (int p = 0; p < ckpt_piece_count(d, tp); p++) {
            build_piece(d, tp, p, logical, want);
            cr_assert_eq(ckpt_reader_read_piece(r, k, p, got, bytes), TP_OK, "%s", tp_errmsg());
            cr_assert_eq(memcmp(want, got, bytes), 0, "piece %d of %s at tp=%d", p, t->name, tp);
        }
        free(want);
        free(got);
        free(logical);
    }
    cr_assert_eq(ckpt_reader_num_tensors(r), seen);
    ckpt_reader_close(r);
}

Test(reshard, random_layouts_against_reference)
{
    static const int degrees[] = {1, 2, 3, 4, 6, 8};
    for (int iter = 0; iter < 20; iter++) {
        int tps[2] = {degrees[rnd(0, 4)], degrees[rnd(0, 5)]};
        int pps[2] = {(int)rnd(1, 3), (int)rnd(1, 3)};
        int64_t layers = (int64_t)pps[0] * pps[1] * rnd(1, 2);
        ckpt_layout layout = {tps[0], pps[0], 1, layers, 1};
        test_tensor tensors[10];
        int n = random_tensors(tensors, 10, tps, 2, layers);
        char source[600], target[600], back[600];
        snprintf(source, sizeof source, "%s/src%d", dir, iter);
        snprintf(target, sizeof target, "%s/dst%d", dir, iter);
        snprintf(back, sizeof back, "%s/back%d", dir, iter);
        write_tensors(source, &layout, tensors, n, iter % 4 == 3 ? 1 : 0, iter);

        reshard_options options;
        reshard_options_init(&options);
        options.tp = tps[1];
        options.pp = pps[1];
        options.threads = (int)rnd(1, 3);
        options.device = RESHARD_DEVICE_CPU;
        options.param_dtype = iter % 3 == 1 ? (int)rnd(0, 2) : -1;
        options.drop_optimizer = iter % 5 == 4;
        options.compress_level = iter % 4 == 2 ? 1 : -1;
        run_reshard(source, target, &options);
        check_output(target, tensors, n, options.drop_optimizer);

        /* Back to the source layout: bit-identical to the source. */
        if (options.param_dtype < 0 && !options.drop_optimizer) {
            reshard_options again;
            reshard_options_init(&again);
            again.tp = tps[0];
            again.pp = pps[0];
            again.device = RESHARD_DEVICE_CPU;
            run_reshard(target, back, &again);
            check_output(back, tensors, n, 0);
        }
        for (int i = 0; i < n; i++) free(tensors[i].logical);
    }
}

/* Tensors of many checksum blocks under a memory limit that allows only a
 * few blocks per slab, along both split axes and with padding. */
/* reshard_read_piece: each piece of a target layout straight from a source of
 * another, as a trainer resuming at a new layout reads its parameters. */
Test(reshard, single_pieces_at_any_degree)
{
    static const int degrees[] = {1, 2, 3, 4, 6};
    for (int iter = 0; iter < 12; iter++) {
        int tps[2] = {degrees[rnd(0, 4)], degrees[rnd(0, 4)]};
        ckpt_layout layout = {tps[0], 1, 1, 2, 1};
        test_tensor tensors[8];
        int n = random_tensors(tensors, 8, tps, 2, 2);
        char source[600];
        snprintf(source, sizeof source, "%s/src%d", dir, iter);
        write_tensors(source, &layout, tensors, n, iter % 3 == 2, iter);
        ckpt_reader *r;
        cr_assert_eq(ckpt_reader_open(&r, source, NULL), TP_OK, "%s", tp_errmsg());
        for (int i = 0; i < n; i++) {
            ckpt_tensor_desc target = tensors[i].desc;
            target.dtype = (tp_dtype)rnd(0, 2);
            int64_t count = elements_of(target.shape, target.ndim);
            uint8_t *logical = malloc((size_t)count * 4);
            convert_numbers(tensors[i].logical, tensors[i].desc.dtype, logical, target.dtype, count);
            int64_t shape[CKPT_MAX_DIMS];
            ckpt_piece_shape(&target, tps[1], shape);
            size_t bytes = (size_t)elements_of(shape, target.ndim) * tp_dtype_size(target.dtype);
            uint8_t *want = malloc(bytes), *got = malloc(bytes);
            for (int p = 0; p < ckpt_piece_count(&target, tps[1]); p++) {
                build_piece(&target, tps[1], p, logical, want);
                memset(got, 0x77, bytes);
                cr_assert_eq(reshard_read_piece(r, ckpt_reader_find(r, tensors[i].name), &target, tps[1], p, got, bytes),
                             TP_OK, "%s", tp_errmsg());
                cr_assert_eq(memcmp(want, got, bytes), 0, "%s piece %d: tp %d -> %d", tensors[i].name, p, tps[0], tps[1]);
            }
            free(want);
            free(got);
            free(logical);
        }
        ckpt_reader_close(r);
        for (int i = 0; i < n; i++) free(tensors[i].logical);
    }
}

Test(reshard, streams_in_slabs_within_memory)
{
    test_tensor tensors[3];
    static const int64_t shapes[3][2] = {{12000, 300}, {300, 6000}, {10001, 256}};
    for (int i = 0; i < 3; i++) {
        memset(&tensors[i], 0, sizeof tensors[i]);
        snprintf(tensors[i].name, sizeof tensors[i].name, "model/big%d", i);
        tensors[i].desc = (ckpt_tensor_desc){.name = tensors[i].name, .dtype = TP_FP32, .ndim = 2,
                                             .shape = {shapes[i][0], shapes[i][1]}, .anchor = CKPT_ANCHOR_FIRST};
        tensors[i].desc.partition = (ckpt_partition){CKPT_SPLIT, i == 1, 0, {0}, 0, i == 2 ? 8 : 0, 0};
        size_t bytes = (size_t)(shapes[i][0] * shapes[i][1] * 4);
        tensors[i].logical = malloc(bytes);
        for (size_t b = 0; b < bytes; b++) tensors[i].logical[b] = (uint8_t)next_random();
    }
    char source[600], target[600];
    snprintf(source, sizeof source, "%s/src", dir);
    snprintf(target, sizeof target, "%s/dst", dir);
    ckpt_layout layout = {4, 1, 1, 1, 1};
    write_tensors(source, &layout, tensors, 3, 0, 1);
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, source, NULL), TP_OK);
    reshard_options options;
    reshard_options_init(&options);
    options.tp = 2;
    options.threads = 1;
    options.device = RESHARD_DEVICE_CPU;
    /* What is resident now, the plan's fixed and per-thread allowances, and
     * 8 MiB for slabs: a few checksum blocks at a time. */
    long pages = 0, resident = 0;
    FILE *statm = fopen("/proc/self/statm", "r");
    cr_assert(statm && fscanf(statm, "%ld %ld", &pages, &resident) == 2);
    fclose(statm);
    options.memory_limit = (int64_t)resident * 4096 + ((int64_t)(32 + 12 + 8) << 20);
    reshard_plan *plan;
    cr_assert_eq(reshard_plan_create(&plan, r, &options), TP_OK, "%s", tp_errmsg());
    const reshard_summary *s = reshard_plan_summary(plan);
    cr_assert(s->slabs >= 8, "several slabs per piece: %lld", (long long)s->slabs);
    cr_assert(s->slab_bytes <= (int64_t)8 << 20, "slabs of at most 8 MiB: %lld", (long long)s->slab_bytes);
    cr_assert(s->buffer_memory < options.memory_limit, "buffers within the limit");
    reshard_plan_free(plan);
    ckpt_reader_close(r);
    run_reshard(source, target, &options);
    check_output(target, tensors, 3, 0);
    for (int i = 0; i < 3; i++) free(tensors[i].logical);
}

Test(reshard, impossible_targets_name_the_tensor)
{
    char source[600], target[600];
    snprintf(source, sizeof source, "%s/src", dir);
    snprintf(target, sizeof target, "%s/dst", dir);
    test_tensor t;
    memset(&t, 0, sizeof t);
    strcpy(t.name, "model/layers.1.attn.qkv.weight");
    t.desc = (ckpt_tensor_desc){.name = t.name, .dtype = TP_FP32, .ndim = 2, .shape = {192, 4},
                                .anchor = CKPT_ANCHOR_LAYER, .layer = 1};
    t.desc.partition = (ckpt_partition){CKPT_SPLIT, 0, 3, {128, 32, 32}, 16, 0, 0};
    t.logical = calloc(192 * 4, 4);
    ckpt_layout layout = {2, 2, 1, 4, 1};
    write_tensors(source, &layout, &t, 1, 0, 1);
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, source, NULL), TP_OK);
    reshard_options options;
    reshard_options_init(&options);
    options.tp = 4;
    reshard_plan *plan;
    cr_assert_eq(reshard_plan_create(&plan, r, &options), TP_ERR_LAYOUT);
    cr_assert(strstr(tp_errmsg(), "model/layers.1.attn.qkv.weight") && strstr(tp_errmsg(), "segment 1"),
              "%s", tp_errmsg());
    options.tp = 2;
    options.pp = 3;
    cr_assert_eq(reshard_plan_create(&plan, r, &options), TP_ERR_LAYOUT);
    cr_assert(strstr(tp_errmsg(), "4 layers") && strstr(tp_errmsg(), "pp=3"), "%s", tp_errmsg());
    options.pp = 1;
    options.memory_limit = 1 << 20;
    cr_assert_eq(reshard_plan_create(&plan, r, &options), TP_ERR_LIMIT);
    cr_assert(strstr(tp_errmsg(), "memory limit"), "%s", tp_errmsg());
    ckpt_reader_close(r);
    cr_assert_eq(access(target, F_OK), -1, "nothing written");
    free(t.logical);
}

/* Reading an output back (--verify, an upload) keeps to the limit the write
 * kept to: fewer threads where it leaves no room, never none. */
Test(reshard, verify_threads_within_memory)
{
    int64_t held = resident_bytes(), mib = 1 << 20;
    cr_assert_eq(reshard_verify_threads(held + 30 * mib, 8, 0), 1);
    cr_assert_eq(reshard_verify_threads(1, 8, 0), 0, "none fits: the caller refuses the limit");
    cr_assert_eq(reshard_verify_threads((int64_t)1 << 30, 8, 0), 8);
    cr_assert_eq(reshard_verify_threads(0, 4, 0), 4, "0 is the default limit, 1 GiB");
    int some = reshard_verify_threads(256 << 20, 64, 0);
    cr_assert(some > 1 && some < 64, "%d threads within 256 MiB", some);
}

/* The plan says what reading its output back needs a thread, from the
 * output's own pieces: what the reader counts once it is written
 * (ckpt_reader_verify_thread_bytes), plain or compressed, with the source
 * slab of a converted tensor on top; far below the 16 MiB slab for small
 * pieces, so --verify and an upload are not refused limits they fit in.
 * (Until 2026-12-01 every output was read back at 16 MiB a thread.) */
Test(reshard, read_back_sized_by_the_output)
{
    test_tensor tensors[2];
    static const int64_t shapes[2][2] = {{96, 40}, {4096, 320}}; /* 15 KiB, 5 MiB */
    for (int i = 0; i < 2; i++) {
        memset(&tensors[i], 0, sizeof tensors[i]);
        snprintf(tensors[i].name, sizeof tensors[i].name, "model/w%d", i);
        tensors[i].desc = (ckpt_tensor_desc){.name = tensors[i].name, .dtype = TP_FP32, .ndim = 2,
                                             .shape = {shapes[i][0], shapes[i][1]}, .anchor = CKPT_ANCHOR_FIRST};
        tensors[i].desc.partition = (ckpt_partition){CKPT_SPLIT, i, 0, {0}, 0, 0, 0};
        tensors[i].desc.role = "param"; /* converted by --dtype */
        int64_t count = shapes[i][0] * shapes[i][1];
        float *values = malloc((size_t)count * sizeof *values); /* within bf16's range */
        for (int64_t k = 0; k < count; k++) values[k] = (float)(next_random() % 2001) / 1000.0f - 1.0f;
        tensors[i].logical = (uint8_t *)values;
    }
    char source[600], target[600];
    snprintf(source, sizeof source, "%s/src", dir);
    ckpt_layout layout = {4, 1, 1, 1, 1};
    write_tensors(source, &layout, tensors, 1, 0, 1); /* the small tensor alone */
    snprintf(target, sizeof target, "%s/src_both", dir);
    write_tensors(target, &layout, tensors, 2, 0, 1);
    struct {
        const char *from;
        int tp, compress, dtype;
    } cases[] = {{source, 2, 0, -1}, {source, 1, 1, -1}, {target, 2, 0, -1}, {target, 8, 1, -1}, {target, 1, 0, TP_BF16}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ckpt_reader *r, *out;
        cr_assert_eq(ckpt_reader_open(&r, cases[c].from, NULL), TP_OK, "%s", tp_errmsg());
        reshard_options options;
        reshard_options_init(&options);
        options.tp = cases[c].tp;
        options.compress_level = cases[c].compress;
        options.param_dtype = cases[c].dtype;
        options.device = RESHARD_DEVICE_CPU;
        reshard_plan *plan;
        cr_assert_eq(reshard_plan_create(&plan, r, &options), TP_OK, "%s", tp_errmsg());
        int64_t planned = reshard_plan_summary(plan)->read_back_bytes;
        char out_path[700];
        snprintf(out_path, sizeof out_path, "%s/out%zu", dir, c);
        cr_assert_eq(reshard_execute(plan, out_path), TP_OK, "%s", tp_errmsg());
        reshard_plan_free(plan);
        cr_assert_eq(ckpt_reader_open(&out, out_path, NULL), TP_OK, "%s", tp_errmsg());
        int64_t counted = ckpt_reader_verify_thread_bytes(out);
        if (cases[c].dtype < 0) cr_assert_eq(planned, counted, "case %zu: planned %lld, the output's reader %lld", c,
                                             (long long)planned, (long long)counted);
        else cr_assert(planned > counted, "case %zu: the converted source slab on top: %lld", c, (long long)planned);
        cr_assert(planned > 0 && planned <= RESHARD_READ_BACK_BYTES + (8 << 20), "case %zu: %lld", c, (long long)planned);
        if (cases[c].from == source) cr_assert(planned < (64 << 10), "case %zu: a 15 KiB tensor: %lld", c, (long long)planned);
        ckpt_reader_close(out);
        ckpt_reader_close(r);
    }
    /* A small need leaves room for more readers than the 16 MiB slab. */
    int64_t held = resident_bytes(), mib = 1 << 20;
    cr_assert_eq(reshard_verify_threads(held + 30 * mib, 8, 0), 1);
    cr_assert_eq(reshard_verify_threads(held + 30 * mib, 8, 64 << 10), 5, "8 + 5 x (4 MiB + 64 KiB) within 30 MiB");
    for (int i = 0; i < 2; i++) free(tensors[i].logical);
}

/* A converted tensor's verify reads its source slab by slab
 * (converted_digest): from another tool's checkpoint, through the buffers
 * its reader keeps a thread (ckpt_reader_read_thread_bytes: the bounce
 * buffer of its boxes and the rows of a box stored transposed), beside the
 * output's piece and the converted slab. The plan counts them in
 * read_back_bytes; left out (2026-12-01, third review), --verify --dtype
 * of a DCP source ran more threads than the limit held. */
Test(reshard, read_back_counts_a_foreign_source_read)
{
    enum { ROWS = 64, COLS = 48 };
    char path[700];
    snprintf(path, sizeof path, "%s/__0_0.distcp", dir);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    static float values[ROWS * COLS]; /* stored transposed: column c, row r at c * ROWS + r */
    for (int c = 0; c < COLS; c++)
        for (int r = 0; r < ROWS; r++) values[c * ROWS + r] = (float)(r * COLS + c) / 4096.0f;
    cr_assert_eq(fwrite(values, sizeof values, 1, f), 1);
    cr_assert_eq(fclose(f), 0);
    ckpt_tensor_desc t = {.name = "model/w", .dtype = TP_FP32, .ndim = 2, .shape = {ROWS, COLS},
                          .anchor = CKPT_ANCHOR_FIRST, .role = "param"};
    ckpt_foreign_box box = {.file = 0, .count = {ROWS, COLS}, .permuted = 1, .order = {1, 0}};
    int64_t box_first[2] = {0, 1}, bytes = sizeof values;
    const char *files[1] = {path};
    ckpt_foreign src = {.path = dir, .layout = {1, 1, 1, 1, 1}, .num_tensors = 1, .tensors = &t, .num_files = 1,
                        .files = files, .file_bytes = &bytes, .boxes = &box, .box_first = box_first};
    ckpt_reader *r, *out;
    cr_assert_eq(ckpt_reader_open_foreign(&r, &src, 1), TP_OK, "%s", tp_errmsg());
    int64_t reading = ckpt_reader_read_thread_bytes(r);
    cr_assert(reading > 0, "a foreign source's reads keep buffers: %lld", (long long)reading);
    reshard_options options;
    reshard_options_init(&options);
    options.tp = 2;
    options.param_dtype = TP_BF16;
    options.device = RESHARD_DEVICE_CPU;
    reshard_plan *plan;
    cr_assert_eq(reshard_plan_create(&plan, r, &options), TP_OK, "%s", tp_errmsg());
    int64_t planned = reshard_plan_summary(plan)->read_back_bytes;
    char out_path[700];
    snprintf(out_path, sizeof out_path, "%s/out_foreign", dir);
    cr_assert_eq(reshard_execute(plan, out_path), TP_OK, "%s", tp_errmsg());
    reshard_plan_free(plan);
    cr_assert_eq(ckpt_reader_open(&out, out_path, NULL), TP_OK, "%s", tp_errmsg());
    reshard_verify_result result;
    cr_assert_eq(reshard_verify(r, out, 1, &result), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(result.mismatches, 0, "verify: %s", result.first_mismatch);
    /* The output's piece, the source's slab and the same in bf16, the source's read buffers. */
    int64_t least = ckpt_reader_verify_thread_bytes(out) + ROWS * COLS * (4 + 2) + reading;
    cr_assert(planned >= least, "planned %lld for the read-back, at least %lld needed (%lld of the source's reads)",
              (long long)planned, (long long)least, (long long)reading);
    ckpt_reader_close(out);
    ckpt_reader_close(r);
}

/* The allowance beside the buffers is the measured one (ckpt.h,
 * docs/BENCHMARKS.md): a plain reader or writer's thread fits in what the
 * process holds, 8 MiB and 4 MiB a thread beside its buffers; a zstd
 * writer's needs more. Until 2026-12-01 every thread was given 32 MiB and
 * 12 MiB, and two read-back threads within 50 MiB above what the process
 * holds were one. */
Test(reshard, threads_within_measured_allowance)
{
    int64_t held = resident_bytes(), share = -1, mib = 1 << 20;
    cr_assert_eq(reshard_verify_threads(held + 50 * mib, 2, 0), 2, "two 16 MiB readers beside 8 + 2 x 4 MiB");
    cr_assert_eq(reshard_verify_threads(held + 50 * mib, 8, 0), 2);
    cr_assert_eq(reshard_threads_within(held + 20 * mib, 8, 4 * mib, 0, &share), 1);
    cr_assert(share >= 4 * mib && share <= 12 * mib, "%lld", (long long)share);
    cr_assert_eq(reshard_threads_within(held + 20 * mib, 1, 4 * mib, 1, &share), 0, "zstd: 24 MiB + 16 a thread");
    cr_assert_eq(reshard_threads_within(held + 48 * mib, 1, 4 * mib, 1, &share), 1);
    cr_assert_eq(reshard_threads_within(held + 4 * mib, 4, 1, 0, &share), 0, "below the fixed allowance");
    /* Every thread's share, buffers and allowance, within the limit. */
    for (int64_t limit = 16 * mib; limit <= 256 * mib; limit += 7 * mib)
        for (int zstd = 0; zstd <= 1; zstd++) {
            int fit = reshard_threads_within(held + limit, 16, 2 * mib, zstd, &share);
            int64_t fixed = zstd ? CKPT_ZSTD_FIXED_MEMORY : CKPT_FIXED_MEMORY;
            int64_t thread = zstd ? CKPT_ZSTD_THREAD_MEMORY : CKPT_THREAD_MEMORY;
            if (!fit) continue;
            cr_assert(held + fixed + fit * (thread + share) <= held + limit + mib, "%d threads of %lld within %lld",
                      fit, (long long)share, (long long)limit);
            cr_assert(fit == 16 || (limit - fixed) / (fit + 1) - thread < 3 * mib, "one more would fit");
        }
}

/* Refusals of a limit say every size in one unit (format_bytes'), whichever
 * writer refuses: the DCP, Megatron and export writers said bytes. */
Test(reshard, memory_refusal_one_unit)
{
    cr_assert_eq(reshard_memory_refusal(64 << 20, 3 << 20, 0, "tensor %s (%s)", "model/x", "a row"), TP_ERR_LIMIT);
    const char *m = tp_errmsg();
    cr_assert(strstr(m, "memory limit of 64.00 MiB is too small: one thread needs at least "), "%s", m);
    cr_assert(strstr(m, "tensor model/x (a row): 3.00 MiB of buffers"), "%s", m);
    cr_assert(strstr(m, "12.00 MiB set aside for the checkpoint library (") && strstr(m, "raise --memory-limit"), "%s", m);
    cr_assert(!strstr(m, " bytes"), "%s", m);
    cr_assert_eq(reshard_memory_refusal(0, 1, 1, "x"), TP_ERR_LIMIT);
    cr_assert(strstr(tp_errmsg(), "memory limit of 1.00 GiB") && strstr(tp_errmsg(), "40.00 MiB set aside for the "
              "checkpoint library writing zstd"), "%s", tp_errmsg());
}

Test(reshard, layouts_parse)
{
    int tp, pp, v;
    cr_assert_eq(reshard_parse_layout("tp4pp2", &tp, &pp, &v), TP_OK);
    cr_assert(tp == 4 && pp == 2 && v == 0);
    cr_assert_eq(reshard_parse_layout("pp2", &tp, &pp, &v), TP_OK);
    cr_assert(tp == 0 && pp == 2 && v == 0);
    cr_assert_eq(reshard_parse_layout("pp3tp8", &tp, &pp, &v), TP_OK);
    cr_assert(tp == 8 && pp == 3 && v == 0);
    cr_assert_eq(reshard_parse_layout("tp2pp2v2", &tp, &pp, &v), TP_OK, "%s", tp_errmsg());
    cr_assert(tp == 2 && pp == 2 && v == 2);
    cr_assert_eq(reshard_parse_layout("pp4v3tp1", &tp, &pp, &v), TP_OK, "%s", tp_errmsg());
    cr_assert(tp == 1 && pp == 4 && v == 3);
    cr_assert_eq(reshard_parse_layout("pp2v4096", &tp, &pp, &v), TP_OK, "%s", tp_errmsg());
    cr_assert(tp == 0 && pp == 2 && v == 4096);
    const char *bad[] = {"", "tp", "tp0", "tp4tp2", "tp4x", "4", "dp2", "tp99999", "tp2pp2v", "tp2pp2v0",
                         "tp2v2", "v2pp2", "v2", "tp2pp2v2v2", "tp2pp2vv2", "tp2pp2v2x", "tp2pp2V2", "tp2pp2v4097",
                         "tp2pp2 v2", "tp2v2pp2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(reshard_parse_layout(bad[i], &tp, &pp, &v), TP_ERR_ARG, "'%s' refused", bad[i]);
        cr_assert(strstr(tp_errmsg(), "not understood"), "%s: %s", bad[i], tp_errmsg());
    }
    /* Understood, but not a layout: one chunk written out, or chunks without a pipeline. */
    cr_assert_eq(reshard_parse_layout("tp2pp2v1", &tp, &pp, &v), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "v1 is one chunk"), "%s", tp_errmsg());
    cr_assert_eq(reshard_parse_layout("tp2pp1v2", &tp, &pp, &v), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "need pp 2 or more"), "%s", tp_errmsg());

    char text[RESHARD_LAYOUT_TEXT_MAX];
    reshard_layout_text(&(ckpt_layout){2, 2, 1, 8, 2}, text);
    cr_assert_str_eq(text, "tp2pp2v2");
    reshard_layout_text(&(ckpt_layout){4, 1, 1, 8, 1}, text);
    cr_assert_str_eq(text, "tp4pp1");
    reshard_layout_text(&(ckpt_layout){4, 2, 1, 8, 0}, text);
    cr_assert_str_eq(text, "tp4pp2");
}

/* The target of --to: degrees not named are the source's; a pipeline named
 * anew has one chunk per stage unless the text says otherwise, a kept one
 * keeps its chunks. */
Test(reshard, target_layouts_keep_or_name_the_chunks)
{
    ckpt_layout source = {2, 2, 4, 8, 2};
    reshard_options o;
    reshard_options_init(&o);
    o.tp = 4;
    ckpt_layout to = reshard_target_layout(&source, &o);
    cr_assert(to.tp == 4 && to.pp == 2 && ckpt_layout_chunks(&to) == 2 && to.num_layers == 8 && to.dp == 4);
    o.pp = 2;
    to = reshard_target_layout(&source, &o);
    cr_assert(to.pp == 2 && ckpt_layout_chunks(&to) == 1, "tp4pp2 is one chunk per stage");
    o.pp = 4;
    o.virtual_stages = 2;
    to = reshard_target_layout(&source, &o);
    cr_assert(to.pp == 4 && ckpt_layout_chunks(&to) == 2);
    ckpt_layout plain = {1, 1, 1, 8, 0};
    reshard_options_init(&o);
    o.pp = 2;
    o.virtual_stages = 4;
    to = reshard_target_layout(&plain, &o);
    cr_assert(to.tp == 1 && to.pp == 2 && ckpt_layout_chunks(&to) == 4);
}

/* Into and out of the interleaved schedule: every piece of the output
 * equals the naive one and lies in the shard of the stage its layer's
 * chunk gives (layer / 2 mod 2 for 8 layers at pp2 with 2 chunks: 0 0 1 1 0
 * 0 1 1), the digests equal; back to consecutive stages, bit for bit. */
Test(reshard, into_and_out_of_interleaved_stages)
{
    int tps[2] = {2, 4};
    test_tensor tensors[10];
    int n = random_tensors(tensors, 10, tps, 2, 8);
    /* Every layer of 0..7 present at least once. */
    for (int l = 0; l < 8 && l < n; l++) {
        tensors[l].desc.anchor = CKPT_ANCHOR_LAYER;
        tensors[l].desc.layer = l;
    }
    char source[600], interleaved[600], back[600], four[600];
    snprintf(source, sizeof source, "%s/src", dir);
    snprintf(interleaved, sizeof interleaved, "%s/v2", dir);
    snprintf(back, sizeof back, "%s/back", dir);
    snprintf(four, sizeof four, "%s/pp4", dir);
    ckpt_layout layout = {2, 1, 1, 8, 1};
    write_tensors(source, &layout, tensors, n, 0, 1);

    reshard_options options;
    reshard_options_init(&options);
    options.tp = 4;
    options.pp = 2;
    options.virtual_stages = 2;
    options.device = RESHARD_DEVICE_CPU;
    run_reshard(source, interleaved, &options);
    check_output(interleaved, tensors, n, 0);
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, interleaved, NULL), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_layout_chunks(ckpt_reader_layout(r)), 2);
    static const int stage_of_layer[8] = {0, 0, 1, 1, 0, 0, 1, 1};
    int layered = 0;
    for (int i = 0; i < n; i++) {
        const ckpt_tensor_desc *d = &tensors[i].desc;
        int expect = d->anchor == CKPT_ANCHOR_LAYER ? stage_of_layer[d->layer] : d->anchor == CKPT_ANCHOR_FIRST ? 0 : 1;
        layered += d->anchor == CKPT_ANCHOR_LAYER && expect != d->layer / 4; /* where consecutive stages differ */
        int k = ckpt_reader_find(r, tensors[i].name);
        for (int p = 0; p < ckpt_piece_count(d, 4); p++) {
            ckpt_piece_info info;
            cr_assert_eq(ckpt_reader_piece_info(r, k, p, &info), TP_OK);
            cr_assert_eq(info.pp, expect, "%s (layer %lld) piece %d on stage %d, expected %d", tensors[i].name,
                         (long long)d->layer, p, info.pp, expect);
        }
    }
    cr_assert_gt(layered, 0, "some layer lies elsewhere than without chunks");
    ckpt_reader_close(r);

    reshard_options_init(&options);
    options.tp = 2;
    options.pp = 1;
    options.device = RESHARD_DEVICE_CPU;
    run_reshard(interleaved, back, &options);
    check_output(back, tensors, n, 0);
    reshard_options_init(&options);
    options.pp = 4;
    options.device = RESHARD_DEVICE_CPU;
    run_reshard(interleaved, four, &options);
    check_output(four, tensors, n, 0);
    cr_assert_eq(ckpt_reader_open(&r, four, NULL), TP_OK, "%s", tp_errmsg());
    cr_assert(ckpt_reader_layout(r)->pp == 4 && ckpt_layout_chunks(ckpt_reader_layout(r)) == 1);
    ckpt_reader_close(r);
    for (int i = 0; i < n; i++) free(tensors[i].logical);
}

/* Where --device auto computes, and why, for a plan of plain copies and one
 * that converts a parameter's dtype: the CPU for both without a GPU (the
 * reason says so); with one, the GPU for the conversion only. A device the
 * options name has no reason. */
Test(reshard, auto_device_takes_the_gpu_only_to_convert)
{
    int tps[2] = {4, 2};
    test_tensor tensors[6];
    int n = random_tensors(tensors, 6, tps, 2, 2);
    cr_assert(n >= 2 && strcmp(tensors[1].desc.role, "param") == 0);
    char source[600];
    snprintf(source, sizeof source, "%s/src", dir);
    ckpt_layout layout = {4, 1, 1, 2, 1};
    write_tensors(source, &layout, tensors, n, 0, 1);
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, source, NULL), TP_OK, "%s", tp_errmsg());
    int gpus = cuda_device_count();
    for (int convert = 0; convert < 2; convert++) {
        reshard_options options;
        reshard_options_init(&options);
        options.tp = 2;
        /* tensors[1] is a parameter (fixture.c): a dtype other than its own converts it */
        options.param_dtype = !convert ? -1 : tensors[1].desc.dtype == TP_BF16 ? TP_FP32 : TP_BF16;
        reshard_plan *plan;
        cr_assert_eq(reshard_plan_create(&plan, r, &options), TP_OK, "%s", tp_errmsg());
        const reshard_summary *s = reshard_plan_summary(plan);
        const char *want = gpus == 0 ? "no CUDA device found" : convert ? "converts dtypes" : "no dtype to convert";
        cr_assert_str_eq(s->device, gpus > 0 && convert ? "cuda" : "cpu", "convert %d, %d GPU(s)", convert, gpus);
        cr_assert(s->device_reason && strstr(s->device_reason, want), "convert %d: reason '%s', want '%s'", convert,
                  s->device_reason ? s->device_reason : "(none)", want);
        reshard_plan_free(plan);
        options.device = RESHARD_DEVICE_CPU;
        cr_assert_eq(reshard_plan_create(&plan, r, &options), TP_OK, "%s", tp_errmsg());
        cr_assert_str_eq(reshard_plan_summary(plan)->device, "cpu");
        cr_assert_null(reshard_plan_summary(plan)->device_reason, "a named device needs no reason");
        reshard_plan_free(plan);
    }
    ckpt_reader_close(r);
    for (int i = 0; i < n; i++) free(tensors[i].logical);
}

Test(reshard, cuda_matches_cpu)
{
    if (cuda_device_count() == 0)
        cr_skip_test("no CUDA device (%s)", cuda_built() ? "built with CUDA" : "built without CUDA");
    int tps[2] = {4, 2};
    test_tensor tensors[10];
    int n = random_tensors(tensors, 10, tps, 2, 2);
    char source[600], on_cpu[600], on_gpu[600];
    snprintf(source, sizeof source, "%s/src", dir);
    snprintf(on_cpu, sizeof on_cpu, "%s/cpu", dir);
    snprintf(on_gpu, sizeof on_gpu, "%s/gpu", dir);
    ckpt_layout layout = {4, 1, 1, 2, 1};
    write_tensors(source, &layout, tensors, n, 0, 1);
    reshard_options options;
    reshard_options_init(&options);
    options.tp = 2;
    options.pp = 2;
    options.param_dtype = TP_BF16;
    options.device = RESHARD_DEVICE_CPU;
    run_reshard(source, on_cpu, &options);
    options.device = RESHARD_DEVICE_CUDA;
    run_reshard(source, on_gpu, &options);
    check_output(on_gpu, tensors, n, 0);
    ckpt_reader *a, *b;
    cr_assert_eq(ckpt_reader_open(&a, on_cpu, NULL), TP_OK);
    cr_assert_eq(ckpt_reader_open(&b, on_gpu, NULL), TP_OK);
    for (int i = 0; i < ckpt_reader_num_tensors(a); i++) {
        ckpt_compare_result result;
        cr_assert_eq(ckpt_compare_tensor(a, i, b, ckpt_reader_find(b, ckpt_reader_tensor(a, i)->name), 0, 0, 1 << 20,
                                         &result), TP_OK);
        cr_assert_eq(result.mismatches, 0, "%s differs between CPU and GPU", ckpt_reader_tensor(a, i)->name);
        cr_assert_eq(ckpt_reader_digest(a, i), ckpt_reader_digest(b, ckpt_reader_find(b, ckpt_reader_tensor(a, i)->name)));
    }
    ckpt_reader_close(a);
    ckpt_reader_close(b);
    for (int i = 0; i < n; i++) free(tensors[i].logical);
}
