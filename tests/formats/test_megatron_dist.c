/* Megatron-Core's distributed optimizer in torch_dist checkpoints
 * (docs/MEGATRON.md, "The distributed optimizer in torch_dist"): where its
 * buffers put each parameter (megatron_buffer_layout: the rules of
 * DistributedOptimizer._compute_per_buffer_param_layout, the bucket ends a
 * checkpoint records), the order of a Megatron-Core model chunk's
 * parameters for Transformer Engine's and the local modules, and the
 * committed dp_reshardable checkpoint read whole: every 16-bit weight the
 * rounding of the fp32 main copy read from the buckets, as Megatron keeps
 * them. The fuzzing corpus replayed. Run from the repository root. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../formats/megatron_internal.h"
#include "../../kernels/kernels.h"
#include "../support/fixture.h"

TestSuite(megatron_dist);

#define FIXTURE "tests/data/megatron-dist/dp_reshardable"

/* ------------------------------------------------------ buffer layout */

/* Named order: a tied embedding with pp > 1 (shared), then a and b; laid
 * out in reverse: b at 0, a at 64 (aligned), the bucket closed before the
 * embedding at 192 (a's end 134 padded), the embedding in a bucket of its
 * own. */
Test(megatron_dist, buffer_layout_shared_embedding)
{
    megatron_buffer_param p[3] = {{.numel = 100, .shared = 1}, {.numel = 70}, {.numel = 64}};
    int64_t numel[2] = {192, 100};
    cr_assert_eq(megatron_buffer_layout(p, 3, numel, 2, "x"), TP_OK, "%s", tp_errmsg());
    cr_assert(p[2].bucket == 0 && p[2].start == 0);
    cr_assert(p[1].bucket == 0 && p[1].start == 64);
    cr_assert(p[0].bucket == 1 && p[0].start == 0);
    int64_t wrong[2] = {190, 100};
    cr_assert_eq(megatron_buffer_layout(p, 3, wrong, 2, "buffer 3"), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "buffer 3: bucket 0 holds 192 elements") && strstr(tp_errmsg(), "records 190"), "%s",
              tp_errmsg());
}

/* Buckets cut by size (--ddp-bucket-size, not recorded): where the
 * recorded sizes say; more parameters than buckets, or fewer, refused. */
Test(megatron_dist, buffer_layout_buckets_by_size)
{
    megatron_buffer_param p[3] = {{.numel = 100}, {.numel = 100}, {.numel = 100}};
    int64_t numel[2] = {228, 100};
    cr_assert_eq(megatron_buffer_layout(p, 3, numel, 2, "x"), TP_OK, "%s", tp_errmsg());
    cr_assert(p[2].bucket == 0 && p[2].start == 0);
    cr_assert(p[1].bucket == 0 && p[1].start == 128);
    cr_assert(p[0].bucket == 1 && p[0].start == 0);
    int64_t one[1] = {100};
    cr_assert_eq(megatron_buffer_layout(p, 3, one, 1, "x"), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "more than the 1 buckets recorded"), "%s", tp_errmsg());
    int64_t three[3] = {228, 100, 64};
    cr_assert_eq(megatron_buffer_layout(p, 3, three, 3, "x"), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "fill 2 buckets, the checkpoint records 3"), "%s", tp_errmsg());
    megatron_buffer_param empty = {.numel = 0};
    cr_assert_eq(megatron_buffer_layout(&empty, 1, numel, 1, "x"), TP_ERR_FORMAT);
}

/* ------------------------------------------------------ parameter order */

static const char *const present[] = {
    "embedding.word_embeddings.weight",  "embedding.position_embeddings.weight",
    "layers.0.input_norm.weight",        "layers.0.input_norm.bias",
    "layers.0.attention.qkv.weight",     "layers.0.attention.qkv.bias",
    "layers.0.attention.dense.weight",   "layers.0.attention.dense.bias",
    "layers.0.post_norm.weight",         "layers.0.post_norm.bias",
    "layers.0.mlp.fc1.weight",           "layers.0.mlp.fc1.bias",
    "layers.0.mlp.fc2.weight",           "layers.0.mlp.fc2.bias",
    "layers.1.input_norm.weight",        "layers.1.attention.qkv.weight",
    "final_norm.weight",                 "final_norm.bias",
};

static int find_present(void *ctx, const char *canonical)
{
    (void)ctx;
    for (size_t i = 0; i < sizeof present / sizeof *present; i++)
        if (!strcmp(present[i], canonical)) return (int)i;
    return -1;
}

static void expect_order(const megatron_config *c, int pp_rank, const int *want, int n)
{
    int got[32], count = 0;
    cr_assert_eq(megatron_core_chunk_params(c, pp_rank, 0, find_present, NULL, got, 32, &count), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(count, n, "%d parameters, %d expected", count, n);
    for (int i = 0; i < n; i++)
        cr_assert_eq(got[i], want[i], "parameter %d: %s, expected %s", i, got[i] >= 0 ? present[got[i]] : "the head copy",
                     want[i] >= 0 ? present[want[i]] : "the head copy");
}

/* Transformer Engine's modules: linear_proj before linear_qkv and its
 * fused norm; the local ones: input_layernorm first. */
Test(megatron_dist, chunk_order_of_the_modules)
{
    megatron_config c = {.num_layers = 2, .pp = 1, .vpp = 1, .impl = MEGATRON_IMPL_TRANSFORMER_ENGINE};
    int te[] = {0, 1, 6, 7, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
    expect_order(&c, 0, te, 18);
    c.impl = MEGATRON_IMPL_LOCAL;
    int local[] = {0, 1, 2, 3, 6, 7, 4, 5, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
    expect_order(&c, 0, local, 18);
    /* pp 2, tied: the last stage's copy of the embeddings, after the final norm. */
    c.pp = 2;
    int last[] = {14, 15, 16, 17, MEGATRON_HEAD_COPY};
    expect_order(&c, 1, last, 5);
    c.untied = 1;
    expect_order(&c, 1, last, 4);
    c.impl = MEGATRON_IMPL_OTHER;
    int out[32], count;
    cr_assert_eq(megatron_core_chunk_params(&c, 0, 0, find_present, NULL, out, 32, &count), TP_ERR_LAYOUT);
    cr_assert(strstr(tp_errmsg(), "args.transformer_impl"), "%s", tp_errmsg());
    c.impl = MEGATRON_IMPL_LOCAL;
    cr_assert_eq(megatron_core_chunk_params(&c, 0, 0, find_present, NULL, out, 3, &count), TP_ERR_FORMAT);
}

/* ------------------------------------------------- the checkpoint, read */

/* Every parameter of the committed checkpoint with an fp32 main copy in
 * the buckets: the weight is that copy rounded, element by element. */
Test(megatron_dist, dp_reshardable_main_copies_round_to_the_weights)
{
    megatron_dist *m = NULL;
    cr_assert_eq(megatron_dist_open(FIXTURE, &m), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(megatron_dist_optimizer_layout(m), "dp_reshardable");
    cr_assert(megatron_dist_config(m)->optimizer_read);
    cr_assert_null(megatron_dist_optimizer_refusal(m));
    ckpt_reader *r = NULL;
    cr_assert_eq(megatron_dist_reader_open(m, 1, 1, &r), TP_OK, "%s", tp_errmsg());
    int params = 0, masters = 0;
    for (int i = 0; i < ckpt_reader_num_tensors(r); i++) {
        const ckpt_tensor_desc *t = ckpt_reader_tensor(r, i);
        if (!ckpt_tensor_is_param(t)) continue;
        params++;
        char name[CKPT_NAME_MAX + 32];
        snprintf(name, sizeof name, "optim/master/%s", t->name);
        int k = ckpt_reader_find(r, name);
        cr_assert_geq(k, 0, "no main copy of %s", t->name);
        int64_t n = elements_of(t->shape, t->ndim);
        size_t bytes = (size_t)n * tp_dtype_size(t->dtype);
        unsigned char *weight = malloc(bytes), *rounded = malloc(bytes);
        float *main = malloc((size_t)n * sizeof *main);
        cr_assert(weight && rounded && main);
        cr_assert_eq(ckpt_reader_read_piece(r, i, 0, weight, bytes), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(ckpt_reader_read_piece(r, k, 0, main, (size_t)n * sizeof *main), TP_OK, "%s", tp_errmsg());
        convert_numbers(main, TP_FP32, rounded, t->dtype, n);
        cr_assert_eq(memcmp(weight, rounded, bytes), 0, "%s is not its main copy rounded", t->name);
        free(weight);
        free(rounded);
        free(main);
        masters++;
    }
    cr_assert_eq(params, masters);
    cr_assert_eq(ckpt_reader_num_tensors(r), 4 * params, "each parameter with its master and moments");
    ckpt_reader_close(r);
    megatron_dist_close(m);
}

/* ---------------------------------------------------- the true vocabulary */

/* The fixture's tables hold 32 rows: 30 tokens padded to a multiple of 8 x
 * tp 2, the padding at the end of tensor-parallel rank 1's piece (in the
 * buckets, each piece a run of a bucket). Told 30, every table (the
 * weights, the main copy, both moments) is its first 30 rows as read
 * padded, with and without digests; 40 tokens (48 rows) are refused. */
Test(megatron_dist, true_vocabulary_leaves_the_padding_out)
{
    megatron_dist *padded = NULL, *told = NULL;
    cr_assert_eq(megatron_dist_open(FIXTURE, &padded), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(megatron_dist_open(FIXTURE, &told), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(megatron_dist_config(padded)->padded_vocab, 32);
    cr_assert_eq(megatron_dist_set_true_vocab(told, 40), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "a vocabulary of 40 tokens is padded to 48 rows for tp 2 (a multiple of 8 x 2); the "
                                  "checkpoint has 32"), "%s", tp_errmsg());
    cr_assert_eq(megatron_dist_set_true_vocab(told, 30), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(megatron_dist_config(told)->true_vocab, 30);
    for (int digests = 0; digests < 2; digests++) {
        ckpt_reader *all = NULL, *tokens = NULL;
        cr_assert_eq(megatron_dist_reader_open(padded, digests, 1, &all), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(megatron_dist_reader_open(told, digests, 1, &tokens), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(ckpt_reader_num_tensors(tokens), ckpt_reader_num_tensors(all));
        int tables = 0;
        for (int i = 0; i < ckpt_reader_num_tensors(all); i++) {
            const ckpt_tensor_desc *a = ckpt_reader_tensor(all, i), *t = ckpt_reader_tensor(tokens, i);
            cr_assert_str_eq(a->name, t->name);
            int table = !strcmp(a->param, "embedding.word_embeddings.weight");
            tables += table;
            cr_assert_eq(t->shape[0], table ? 30 : a->shape[0], "%s: %lld rows", t->name, (long long)t->shape[0]);
            int64_t n = elements_of(a->shape, a->ndim), m = elements_of(t->shape, t->ndim);
            size_t size = tp_dtype_size(a->dtype);
            unsigned char *x = calloc((size_t)n, size), *y = calloc((size_t)n, size);
            cr_assert(x && y);
            cr_assert_eq(ckpt_reader_read_piece(all, i, 0, x, (size_t)n * size), TP_OK, "%s", tp_errmsg());
            /* Read at tp 1, the table's piece is padded to a multiple of 8: 32 rows, its last 2 zeros. */
            int64_t piece[CKPT_MAX_DIMS];
            ckpt_piece_shape(t, 1, piece);
            int64_t stored = elements_of(piece, t->ndim);
            cr_assert_eq(stored, n, "%s: a piece of %lld elements", t->name, (long long)stored);
            cr_assert_eq(ckpt_reader_read_piece(tokens, i, 0, y, (size_t)stored * size), TP_OK, "%s", tp_errmsg());
            cr_assert_eq(memcmp(x, y, (size_t)m * size), 0, "%s: the tokens' rows differ", t->name);
            for (int64_t k = m * (int64_t)size; k < n * (int64_t)size; k++)
                cr_assert_eq(y[k], 0, "%s: its padding reads as %d at byte %lld", t->name, y[k], (long long)k);
            free(x);
            free(y);
        }
        cr_assert_eq(tables, 4, "the weights, the main copy and two moments");
        ckpt_reader_close(all);
        ckpt_reader_close(tokens);
    }
    megatron_dist_close(padded);
    megatron_dist_close(told);
}

/* ------------------------------------------------------------ the corpus */

#define LLVMFuzzerTestOneInput fuzz_megatron_dist_one
#include "../fuzz/fuzz_megatron_dist.c"
#undef LLVMFuzzerTestOneInput

Test(megatron_dist, fuzz_corpus)
{
    cr_assert_gt(replay_corpus("megatron_dist", fuzz_megatron_dist_one), 0);
}

#define LLVMFuzzerTestOneInput fuzz_megatron_dist_json_one
#include "../fuzz/fuzz_megatron_dist_json.c"
#undef LLVMFuzzerTestOneInput

/* metadata.json and the tracker file (tests/fuzz/corpus/megatron_dist_json:
 * Megatron-Core's own, and crashes found by `make fuzz`). */
Test(megatron_dist, fuzz_corpus_json)
{
    cr_assert_gt(replay_corpus("megatron_dist_json", fuzz_megatron_dist_json_one), 0);
}
