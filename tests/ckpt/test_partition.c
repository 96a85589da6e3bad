/* Partition arithmetic against a naive reference built from the definition in
 * docs/FORMAT.md, over many random tensors, segment lists and layouts. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../../ckpt/ckpt.h"

/* xorshift so that failures reproduce */
static uint64_t rng_state = 88172645463325252ull;
static int64_t rnd(int64_t lo, int64_t hi) /* inclusive */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (int64_t)(rng_state % (uint64_t)(hi - lo + 1));
}

/* A random split tensor along axis 0 or 1 with 1..4 segments. */
static ckpt_tensor_desc random_split(int64_t *granule_out)
{
    ckpt_tensor_desc t;
    memset(&t, 0, sizeof t);
    t.name = "model/x.weight";
    t.dtype = TP_FP32;
    t.ndim = (int)rnd(1, 3);
    for (int d = 0; d < t.ndim; d++) t.shape[d] = rnd(1, 5);
    t.partition.kind = CKPT_SPLIT;
    t.partition.axis = (int)rnd(0, t.ndim - 1);
    t.partition.granule = rnd(1, 4);
    t.partition.num_segments = (int)rnd(1, 4);
    t.partition.pad_multiple = rnd(0, 1) ? rnd(1, 3) : 0;
    t.partition.replicate_small_segments = t.partition.pad_multiple == 0 && rnd(0, 1);
    int64_t total = 0;
    for (int s = 0; s < t.partition.num_segments; s++) {
        t.partition.segments[s] = t.partition.granule * rnd(1, 12);
        total += t.partition.segments[s];
    }
    t.shape[t.partition.axis] = total;
    t.anchor = CKPT_ANCHOR_FIRST;
    *granule_out = t.partition.granule;
    return t;
}

/* Reference: for every rank and local index, the logical index or -1 for
 * padding, straight from the definition; replica[] the same places' replica
 * numbers (0 but for replicated segments' granules on their later holders). */
static int64_t *replica;

static int reference(const ckpt_tensor_desc *t, int tp, int64_t **map_out, int64_t *piece_size)
{
    const ckpt_partition *p = &t->partition;
    int64_t local_total = 0, paddeds[CKPT_MAX_SEGMENTS], holders[CKPT_MAX_SEGMENTS];
    for (int s = 0; s < p->num_segments; s++) {
        int64_t size = p->segments[s], padded = size, granules = size / p->granule;
        holders[s] = 1;
        if (p->replicate_small_segments && granules < tp) {
            if (tp % granules) return 0; /* cannot replicate evenly */
            holders[s] = tp / granules;
            paddeds[s] = p->granule * tp; /* one granule per rank */
            local_total += p->granule;
            continue;
        }
        if (p->pad_multiple) {
            int64_t unit = tp * p->pad_multiple * p->granule;
            while (padded % unit) padded++;
        } else if (size % (tp * p->granule)) {
            return 0; /* cannot split */
        }
        if ((padded / p->granule) % tp) return 0;
        paddeds[s] = padded;
        local_total += padded / tp;
    }
    int64_t *map = malloc(sizeof(int64_t) * (size_t)(local_total * tp));
    free(replica);
    replica = calloc((size_t)(local_total * tp), sizeof(int64_t));
    int64_t seg_logical = 0, seg_local = 0;
    for (int s = 0; s < p->num_segments; s++) {
        int64_t share = paddeds[s] / tp;
        for (int64_t k = 0; k < paddeds[s]; k++) {
            int64_t rank = k / share, local = seg_local + k % share;
            if (holders[s] > 1) { /* rank holds granule rank / holders */
                map[rank * local_total + local] = seg_logical + rank / holders[s] * p->granule + k % share;
                replica[rank * local_total + local] = rank % holders[s];
                continue;
            }
            map[rank * local_total + local] = k < p->segments[s] ? seg_logical + k : -1;
        }
        seg_logical += p->segments[s];
        seg_local += share;
    }
    *map_out = map;
    *piece_size = local_total;
    return 1;
}

Test(partition, random_layouts_match_reference)
{
    int checked = 0, refused = 0;
    for (int iter = 0; iter < 3000; iter++) {
        int64_t granule;
        ckpt_tensor_desc t = random_split(&granule);
        int tp = (int)rnd(1, 8);
        int64_t *map = NULL, piece_size = 0;
        int possible = reference(&t, tp, &map, &piece_size);
        int status = ckpt_tensor_check(&t, tp);
        cr_assert_eq(status == TP_OK, possible, "iteration %d: check says %d, reference %d", iter,
                     status, possible);
        if (!possible) {
            cr_assert_eq(status, TP_ERR_LAYOUT);
            cr_assert(strstr(tp_errmsg(), "model/x.weight") && strstr(tp_errmsg(), "tp="),
                      "message names the tensor and degree: %s", tp_errmsg());
            refused++;
            continue;
        }
        int axis = t.partition.axis;
        int64_t piece[CKPT_MAX_DIMS], padded[CKPT_MAX_DIMS];
        ckpt_piece_shape(&t, tp, piece);
        ckpt_padded_shape(&t, tp, padded);
        cr_assert_eq(piece[axis], piece_size);
        cr_assert_eq(padded[axis], piece_size * tp);
        cr_assert_eq(ckpt_piece_count(&t, tp), tp);

        /* Piece runs reproduce the reference map, rank by rank. */
        for (int r = 0; r < tp; r++) {
            ckpt_run runs[2 * CKPT_MAX_SEGMENTS];
            int64_t n = ckpt_piece_runs(&t, tp, r, runs, 2 * CKPT_MAX_SEGMENTS);
            cr_assert(n > 0 && n <= 2 * t.partition.num_segments);
            int64_t local = 0;
            for (int64_t k = 0; k < n; k++) {
                cr_assert_eq(runs[k].local_start, local);
                for (int64_t i = 0; i < runs[k].length; i++) {
                    int64_t want = map[r * piece_size + local + i];
                    int64_t got = runs[k].logical_start < 0 ? -1 : runs[k].logical_start + i;
                    cr_assert_eq(got, want, "iter %d rank %d local %lld", iter, r, (long long)(local + i));
                    cr_assert_eq(runs[k].replica, replica[r * piece_size + local + i], "iter %d rank %d", iter, r);
                }
                local += runs[k].length;
            }
            cr_assert_eq(local, piece_size);
        }
        /* Logical ranges: runs in increasing order land where the reference says. */
        for (int q = 0; q < 10; q++) {
            int64_t len = t.shape[axis];
            int64_t start = rnd(0, len - 1), count = rnd(1, len - start);
            int64_t max_runs = (int64_t)t.partition.num_segments * tp;
            ckpt_run *runs = malloc(sizeof *runs * (size_t)max_runs);
            int64_t n = ckpt_partition_runs(&t, tp, start, count, runs, max_runs);
            cr_assert(n >= 1 && n <= max_runs);
            int64_t next = start;
            for (int64_t k = 0; k < n; k++) {
                cr_assert_eq(runs[k].logical_start, next);
                for (int64_t i = 0; i < runs[k].length; i++) {
                    cr_assert_eq(map[runs[k].rank * piece_size + runs[k].local_start + i], next + i);
                    cr_assert_eq(replica[runs[k].rank * piece_size + runs[k].local_start + i], 0,
                                 "logical ranges are read from the primary copy");
                }
                next += runs[k].length;
            }
            cr_assert_eq(next, start + count);
            cr_assert_eq(ckpt_partition_runs(&t, tp, start, count, runs, 0), -1, "too few runs is an error");
            free(runs);
        }
        free(map);
        checked++;
    }
    cr_assert(checked > 1000 && refused > 100, "both outcomes exercised: %d ok, %d refused", checked, refused);
}

Test(partition, fused_qkv_grouped_query)
{
    /* 8 query heads, 2 KV heads of 16: segments [128, 32, 32] granule 16. */
    ckpt_tensor_desc t = {.name = "model/layers.0.attn.qkv.weight", .dtype = TP_BF16, .ndim = 2,
                          .shape = {192, 64}, .anchor = CKPT_ANCHOR_LAYER, .layer = 0};
    t.partition = (ckpt_partition){CKPT_SPLIT, 0, 3, {128, 32, 32}, 16, 0, 0};
    cr_assert_eq(ckpt_tensor_check(&t, 2), TP_OK);
    int64_t shape[CKPT_MAX_DIMS];
    ckpt_piece_shape(&t, 2, shape);
    cr_assert_eq(shape[0], 96); /* 64 q + 16 k + 16 v */
    ckpt_run runs[8];
    cr_assert_eq(ckpt_piece_runs(&t, 2, 1, runs, 8), 3);
    cr_assert_eq(runs[0].logical_start, 64);  /* q rows 64..127 */
    cr_assert_eq(runs[1].logical_start, 144); /* k rows 128 + 16 */
    cr_assert_eq(runs[2].logical_start, 176); /* v rows 160 + 16 */
    cr_assert_eq(ckpt_tensor_check(&t, 4), TP_ERR_LAYOUT, "2 KV heads cannot split over 4 ranks");
    cr_assert(strstr(tp_errmsg(), "segment 1"), "names the segment: %s", tp_errmsg());
}

Test(partition, fewer_kv_heads_than_ranks_are_replicated)
{
    /* 4 query heads, 1 KV head of 16: segments [64, 16, 16] granule 16, the
     * KV head on every one of 4 ranks (Megatron's layout for K < TP). */
    ckpt_tensor_desc t = {.name = "model/layers.0.attn.qkv.weight", .dtype = TP_FP32, .ndim = 2,
                          .shape = {96, 8}, .anchor = CKPT_ANCHOR_LAYER, .layer = 0};
    t.partition = (ckpt_partition){CKPT_SPLIT, 0, 3, {64, 16, 16}, 16, 0, 1};
    cr_assert_eq(ckpt_tensor_check(&t, 4), TP_OK, "%s", tp_errmsg());
    int64_t shape[CKPT_MAX_DIMS];
    ckpt_piece_shape(&t, 4, shape);
    cr_assert_eq(shape[0], 48, "16 q + 16 k + 16 v: %lld", (long long)shape[0]);
    ckpt_run runs[8];
    cr_assert_eq(ckpt_piece_runs(&t, 4, 2, runs, 8), 3);
    cr_assert(runs[0].logical_start == 32 && runs[0].replica == 0, "query head 2 is rank 2's own");
    cr_assert(runs[1].logical_start == 64 && runs[1].local_start == 16 && runs[1].replica == 2, "the key head's 3rd copy");
    cr_assert(runs[2].logical_start == 80 && runs[2].replica == 2);
    /* Reading the key rows takes them from rank 0, the primary copy. */
    cr_assert_eq(ckpt_partition_runs(&t, 4, 64, 32, runs, 8), 2);
    cr_assert(runs[0].rank == 0 && runs[0].local_start == 16 && runs[1].rank == 0 && runs[1].local_start == 32);
    /* 2 KV heads over 8 ranks: head g on ranks 4g..4g+3. */
    t.shape[0] = 128 + 64;
    t.partition = (ckpt_partition){CKPT_SPLIT, 0, 3, {128, 32, 32}, 16, 0, 1};
    cr_assert_eq(ckpt_tensor_check(&t, 8), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_piece_runs(&t, 8, 5, runs, 8), 3);
    cr_assert(runs[1].logical_start == 128 + 16 && runs[1].replica == 1, "rank 5: head 1's 2nd copy");
    /* At tp 2 the same description splits as before: no replicas. */
    cr_assert_eq(ckpt_piece_runs(&t, 2, 1, runs, 8), 3);
    cr_assert(runs[1].logical_start == 144 && runs[1].replica == 0);
    /* 2 heads cannot be replicated evenly over 3 ranks (nor padded). */
    cr_assert_eq(ckpt_tensor_check(&t, 3), TP_ERR_LAYOUT);
    cr_assert(strstr(tp_errmsg(), "cannot be replicated evenly") || strstr(tp_errmsg(), "not divisible"), "%s",
              tp_errmsg());
    t.partition.pad_multiple = 1;
    cr_assert_eq(ckpt_tensor_check(&t, 8), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "cannot be padded"), "%s", tp_errmsg());
}

Test(partition, vocabulary_padding)
{
    ckpt_tensor_desc t = {.name = "model/tok_embed.weight", .dtype = TP_FP32, .ndim = 2,
                          .shape = {50257, 8}, .anchor = CKPT_ANCHOR_FIRST};
    t.partition = (ckpt_partition){CKPT_SPLIT, 0, 1, {50257}, 1, 128, 0};
    int64_t padded[CKPT_MAX_DIMS];
    ckpt_padded_shape(&t, 1, padded);
    cr_assert_eq(padded[0], 50304); /* Megatron's 128-multiple */
    ckpt_padded_shape(&t, 8, padded);
    cr_assert_eq(padded[0], 51200); /* multiple of 8 * 128 */
    ckpt_run runs[4];
    cr_assert_eq(ckpt_piece_runs(&t, 8, 7, runs, 4), 2);
    cr_assert_eq(runs[1].logical_start, -1);
    cr_assert_eq(runs[1].length, 51200 - 50257);
}

Test(partition, stages_follow_layers)
{
    ckpt_layout layout = {2, 4, 1, 8, 1};
    ckpt_tensor_desc t = {.name = "a", .ndim = 1, .shape = {4}, .anchor = CKPT_ANCHOR_LAYER};
    int expect[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    for (int l = 0; l < 8; l++) {
        t.layer = l;
        cr_assert_eq(ckpt_tensor_stage(&t, &layout), expect[l]);
    }
    t.anchor = CKPT_ANCHOR_FIRST;
    cr_assert_eq(ckpt_tensor_stage(&t, &layout), 0);
    t.anchor = CKPT_ANCHOR_LAST;
    cr_assert_eq(ckpt_tensor_stage(&t, &layout), 3);
    ckpt_layout bad = {2, 3, 1, 8, 1};
    cr_assert_eq(ckpt_layout_check(&bad), TP_ERR_LAYOUT);
    cr_assert(strstr(tp_errmsg(), "8 layers") && strstr(tp_errmsg(), "pp=3"), "%s", tp_errmsg());
}

/* The interleaved schedule: pp * V chunks of layers, chunk k on stage
 * k mod pp (docs/FORMAT.md section 2); 0 and 1 chunks are the consecutive
 * placement. Expectations written out by hand. */
Test(partition, stages_interleave_with_virtual_stages)
{
    struct {
        int pp, chunks;
        int64_t layers;
        int expect[12];
    } cases[] = {
        {2, 2, 8, {0, 0, 1, 1, 0, 0, 1, 1}},
        {2, 4, 8, {0, 1, 0, 1, 0, 1, 0, 1}},
        {3, 2, 12, {0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2}},
        {2, 3, 12, {0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1}},
        {4, 2, 8, {0, 1, 2, 3, 0, 1, 2, 3}},
        {2, 1, 8, {0, 0, 0, 0, 1, 1, 1, 1}},
        {2, 0, 8, {0, 0, 0, 0, 1, 1, 1, 1}},
    };
    ckpt_tensor_desc t = {.name = "a", .ndim = 1, .shape = {4}, .anchor = CKPT_ANCHOR_LAYER};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ckpt_layout layout = {2, cases[c].pp, 1, cases[c].layers, cases[c].chunks};
        cr_assert_eq(ckpt_layout_check(&layout), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(ckpt_layout_chunks(&layout), cases[c].chunks > 1 ? cases[c].chunks : 1);
        t.anchor = CKPT_ANCHOR_LAYER;
        for (int l = 0; l < cases[c].layers; l++) {
            t.layer = l;
            cr_assert_eq(ckpt_tensor_stage(&t, &layout), cases[c].expect[l], "pp %d, %d chunks per stage: layer %d",
                         cases[c].pp, cases[c].chunks, l);
        }
        t.anchor = CKPT_ANCHOR_FIRST;
        cr_assert_eq(ckpt_tensor_stage(&t, &layout), 0);
        t.anchor = CKPT_ANCHOR_LAST;
        cr_assert_eq(ckpt_tensor_stage(&t, &layout), cases[c].pp - 1);
    }
}

Test(partition, virtual_stages_that_do_not_divide_are_refused)
{
    ckpt_layout uneven = {2, 2, 1, 8, 3};
    cr_assert_eq(ckpt_layout_check(&uneven), TP_ERR_LAYOUT);
    cr_assert(strstr(tp_errmsg(), "8 layers") && strstr(tp_errmsg(), "pp=2 x 3"), "%s", tp_errmsg());
    ckpt_layout over = {2, 2, 1, 8, 8}; /* 16 chunks of half a layer */
    cr_assert_eq(ckpt_layout_check(&over), TP_ERR_LAYOUT);
    ckpt_layout negative = {2, 2, 1, 8, -1}, huge = {1, 1, 1, 4097, 4097};
    cr_assert_eq(ckpt_layout_check(&negative), TP_ERR_LAYOUT);
    cr_assert(strstr(tp_errmsg(), "-1 virtual stages"), "%s", tp_errmsg());
    cr_assert_eq(ckpt_layout_check(&huge), TP_ERR_LAYOUT);
    cr_assert(strstr(tp_errmsg(), "4097 virtual stages"), "%s", tp_errmsg());
    ckpt_layout most = {1, 2, 1, 2 * 4096, 4096}, none = {1, 2, 1, 0, 2};
    cr_assert_eq(ckpt_layout_check(&most), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_layout_check(&none), TP_OK, "no layers split into any chunks: %s", tp_errmsg());
}

Test(partition, invalid_descriptions_are_refused)
{
    ckpt_tensor_desc t = {.name = "model/w", .dtype = TP_FP32, .ndim = 2, .shape = {10, 4},
                          .anchor = CKPT_ANCHOR_FIRST};
    t.partition = (ckpt_partition){CKPT_SPLIT, 0, 2, {4, 5}, 1, 0, 0};
    cr_assert_eq(ckpt_tensor_check(&t, 1), TP_ERR_ARG, "segments must sum to the axis");
    cr_assert(strstr(tp_errmsg(), "sum to 9"), "%s", tp_errmsg());
    t.partition = (ckpt_partition){CKPT_SPLIT, 0, 1, {10}, 4, 0, 0};
    cr_assert_eq(ckpt_tensor_check(&t, 1), TP_ERR_ARG, "segment not a multiple of the granule");
    t.partition = (ckpt_partition){CKPT_SPLIT, 2, 0, {0}, 0, 0, 0};
    cr_assert_eq(ckpt_tensor_check(&t, 1), TP_ERR_ARG, "axis out of range");
    t.partition = (ckpt_partition){CKPT_REPLICATED, 0, 0, {0}, 0, 0, 0};
    const char *bad_names[] = {"", "/abs", "a//b", "a/../b", "trailing/", "sp ace", "a/./b"};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        t.name = bad_names[i];
        cr_assert_eq(ckpt_tensor_check(&t, 1), TP_ERR_ARG, "name '%s' refused", bad_names[i]);
    }
    t.name = "optim/exp_avg/layers.0.attn.qkv-weight_1";
    cr_assert_eq(ckpt_tensor_check(&t, 1), TP_OK);
    t.shape[1] = 0;
    cr_assert_eq(ckpt_tensor_check(&t, 1), TP_ERR_ARG, "zero-sized dimension");
}
