/* layer_check: each tensor-parallel layer against its dense version.
 * Run under mpirun with N ranks: builds the model at tp = N and, on every
 * rank, the dense model (tp = 1, a process alone) from the same seed, runs one
 * micro-batch through both, and compares the vocabulary-parallel embedding,
 * every column-parallel output (qkv, mlp.fc) with its columns of the dense
 * one, every row-parallel result (after its all-reduce), the vocabulary-parallel
 * logits and loss, and every gradient piece with its part of the dense
 * gradient (padding rows zero). Exit 0 when all agree to 1e-5 relative. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../trainer/comm_mpi.h"
#include "../../trainer/model.h"

static int failures;

static void compare(const char *what, const float *got, const float *want, int64_t n, int rank)
{
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(got[i] - want[i]));
    if (worst > 1e-5 * fmax(scale, 1e-6)) {
        fprintf(stderr, "layer_check rank %d: %s differs by %g (scale %g)\n", rank, what, worst, scale);
        failures++;
    }
}

/* Differences of a local piece from its part of the dense tensor, gathered
 * over the partition's element runs; padding must be zero. */
typedef struct {
    const float *piece, *dense;
    double worst;
    int padding_nonzero;
} walk;

static int compare_run(void *ctx, int64_t offset, int64_t logical, int64_t n)
{
    walk *w = ctx;
    for (int64_t i = 0; i < n; i++) {
        if (logical < 0) w->padding_nonzero |= w->piece[offset + i] != 0;
        else w->worst = fmax(w->worst, fabs(w->piece[offset + i] - w->dense[logical + i]));
    }
    return 0;
}

/* Judged against the largest value of the whole dense tensor (n elements). */
static void judge(const char *what, const walk *w, int64_t n, int rank)
{
    double scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(w->dense[i]));
    if (w->padding_nonzero || w->worst > 1e-5 * fmax(scale, 1e-6)) {
        fprintf(stderr, "layer_check rank %d: %s differs by %g (scale %g)%s\n", rank, what, w->worst, scale,
                w->padding_nonzero ? ", padding not zero" : "");
        failures++;
    }
}

/* Columns of activations [rows, local] against [rows, full], mapped like a
 * 1-D tensor's pieces (the bias of the layer that produced them). */
static void compare_columns(const char *what, const float *local, int64_t local_cols, const float *dense,
                            int64_t dense_cols, int64_t rows, const ckpt_tensor_desc *columns, int tp, int piece, int rank)
{
    walk all = {dense, dense, 0, 0};
    for (int64_t r = 0; r < rows; r++) {
        walk w = {local + r * local_cols, dense + r * dense_cols, 0, 0};
        ckpt_piece_element_runs(columns, tp, piece, 0, local_cols, compare_run, &w);
        all.worst = fmax(all.worst, w.worst);
        all.padding_nonzero |= w.padding_nonzero;
    }
    judge(what, &all, rows * dense_cols, rank);
}

int main(int argc, char **argv)
{
    int world = comm_mpi_world_size(&argc, &argv);
    comm *c = NULL, *alone = NULL;
    if (comm_mpi_create(&c, &argc, &argv, world, 1, 1) || comm_local_create(&alone)) {
        fprintf(stderr, "layer_check: %s\n", tp_errmsg());
        return 1;
    }
    /* vocab 250 pads to 252 at tp 4; 4 heads split at tp 1, 2, 4. */
    gpt_config config = {.layers = 2, .dim = 32, .heads = 4, .vocab = 250, .seq = 8, .dtype = TP_FP32};
    gpt_config_defaults(&config);
    gpt_model *tp = NULL, *dense = NULL;
    if (gpt_model_create(&tp, &config, c, NULL, 2, 8, 1, 1, 0, 1, 0, 0) ||
        gpt_model_create(&dense, &config, alone, NULL, 2, 8, 1, 1, 0, 1, 0, 0) ||
        gpt_model_init_values(tp, 99) || gpt_model_init_values(dense, 99)) {
        fprintf(stderr, "layer_check: %s\n", tp_errmsg());
        return 1;
    }
    int64_t N = 16, D = config.dim;
    gpt_slot *a = &tp->slots[0], *b = &dense->slots[0];
    for (int64_t i = 0; i < N; i++) {
        a->tokens[i] = b->tokens[i] = (int)((i * 37 + 11) % config.vocab);
        a->targets[i] = b->targets[i] = (int)((i * 53 + 5) % config.vocab);
    }
    gpt_model_zero_grads(tp);
    gpt_model_zero_grads(dense);
    if (gpt_model_forward(tp, a, 0) || gpt_model_forward(dense, b, 0)) return fprintf(stderr, "forward failed\n"), 1;
    int rank = c->rank, piece = c->tp_rank;
    compare("embedding (vocabulary-parallel, summed)", a->input, b->input, N * D, rank);
    for (int l = 0; l < config.layers; l++) {
        char what[128];
        const ckpt_tensor_desc *qkv_bias = &tp->params[tp->layer[l][GPT_QKV_BIAS - GPT_FIRST_LAYER_KIND]].spec->desc;
        const ckpt_tensor_desc *fc_bias = &tp->params[tp->layer[l][GPT_FC_BIAS - GPT_FIRST_LAYER_KIND]].spec->desc;
        snprintf(what, sizeof what, "layer %d qkv (column-parallel)", l);
        compare_columns(what, (const float *)a->qkv + l * N * tp->qkv_local, tp->qkv_local,
                        (const float *)b->qkv + l * N * dense->qkv_local, dense->qkv_local, N, qkv_bias, c->tp,
                        piece, rank);
        snprintf(what, sizeof what, "layer %d attention output + projection (row-parallel)", l);
        compare(what, a->res1 + l * N * D, b->res1 + l * N * D, N * D, rank);
        snprintf(what, sizeof what, "layer %d mlp.fc (column-parallel)", l);
        compare_columns(what, (const float *)a->fc + l * N * tp->ffn_local, tp->ffn_local,
                        (const float *)b->fc + l * N * dense->ffn_local, dense->ffn_local, N, fc_bias, c->tp,
                        piece, rank);
        snprintf(what, sizeof what, "layer %d mlp.proj (row-parallel)", l);
        compare(what, a->res2 + l * N * D, b->res2 + l * N * D, N * D, rank);
    }
    const ckpt_tensor_desc *wte = &tp->params[tp->wte].spec->desc;
    ckpt_tensor_desc vocab_columns = *wte;
    vocab_columns.ndim = 1; /* the token table's rows are the logits' columns */
    compare_columns("logits (vocabulary-parallel)", a->head->logits, tp->vocab_local, b->head->logits, dense->vocab_local, N,
                    &vocab_columns, c->tp, piece, rank);
    float loss_a = (float)a->loss_sum, loss_b = (float)b->loss_sum;
    compare("loss (vocabulary-parallel cross-entropy)", &loss_a, &loss_b, 1, rank);

    float scale = 1.0f / (float)N;
    if (gpt_model_backward(tp, a, 0, NULL, NULL, scale) || gpt_model_backward(dense, b, 0, NULL, NULL, scale))
        return fprintf(stderr, "backward failed\n"), 1;
    for (int i = 0; i < tp->num_params; i++) {
        const param_view *v = &tp->params[i];
        const param_view *d = &dense->params[gpt_model_find(dense, (int)(v->spec - tp->catalog))];
        char what[CKPT_NAME_MAX + 32];
        snprintf(what, sizeof what, "gradient of %s", v->spec->name);
        walk w = {v->grad, d->grad, 0, 0};
        ckpt_piece_element_runs(&v->spec->desc, c->tp, v->piece, 0, v->shape[0], compare_run, &w);
        judge(what, &w, d->numel, rank);
        snprintf(what, sizeof what, "value of %s", v->spec->name);
        walk values = {v->data, d->data, 0, 0};
        ckpt_piece_element_runs(&v->spec->desc, c->tp, v->piece, 0, v->shape[0], compare_run, &values);
        judge(what, &values, d->numel, rank);
    }
    /* The collectives of sequence parallelism over MPI (with TP_COMM_PART_MAX
     * low, in the pieces and units of large counts): member j's 40 values
     * j * 1000 + i gathered; each member keeping the sum of everyone's part. */
    enum { PART = 40 };
    float part[PART], *all = calloc((size_t)c->tp * PART, sizeof *all), *full = calloc((size_t)c->tp * PART, sizeof *full);
    float kept[PART];
    for (int i = 0; i < PART; i++) part[i] = (float)(c->tp_rank * 1000 + i);
    for (int j = 0; full && j < c->tp; j++)
        for (int i = 0; i < PART; i++) full[j * PART + i] = (float)((c->tp_rank + 1) * (100 * j + i));
    if (!all || !full || comm_all_gather(c, GROUP_TP, part, all, PART, COMM_FLOAT, COMM_HOST) ||
        comm_reduce_scatter(c, GROUP_TP, full, kept, PART, COMM_FLOAT, COMM_HOST)) {
        fprintf(stderr, "layer_check rank %d: the collectives failed: %s\n", rank, tp_errmsg());
        failures++;
    } else {
        float sum_of_ranks = (float)(c->tp * (c->tp + 1) / 2); /* (1 + ... + tp) */
        for (int j = 0; j < c->tp; j++)
            for (int i = 0; i < PART; i++) failures += all[j * PART + i] != (float)(j * 1000 + i);
        for (int i = 0; i < PART; i++) failures += kept[i] != sum_of_ranks * (float)(100 * c->tp_rank + i);
        if (failures) fprintf(stderr, "layer_check rank %d: all-gather or reduce-scatter wrong\n", rank);
        /* The same in place (comm.h): the sum into the member's own part of
         * what it sent; the gather from the member's own part of the result. */
        for (int j = 0; j < c->tp; j++)
            for (int i = 0; i < PART; i++) full[j * PART + i] = (float)((c->tp_rank + 1) * (100 * j + i));
        float *own = full + (size_t)c->tp_rank * PART;
        int in_place = failures;
        if (comm_reduce_scatter(c, GROUP_TP, full, own, PART, COMM_FLOAT, COMM_HOST)) failures++;
        for (int i = 0; i < PART; i++) failures += own[i] != sum_of_ranks * (float)(100 * c->tp_rank + i);
        for (int i = 0; i < PART; i++) all[(size_t)c->tp_rank * PART + i] = (float)(c->tp_rank * 1000 + i);
        if (comm_all_gather(c, GROUP_TP, all + (size_t)c->tp_rank * PART, all, PART, COMM_FLOAT, COMM_HOST)) failures++;
        for (int j = 0; j < c->tp; j++)
            for (int i = 0; i < PART; i++) failures += all[j * PART + i] != (float)(j * 1000 + i);
        if (failures > in_place) fprintf(stderr, "layer_check rank %d: in place, all-gather or reduce-scatter wrong\n", rank);
        /* bf16 bits (the sequence-parallel gather of bf16 activations): MPI's 16-bit values, in units too. */
        uint16_t bits[PART], *all_bits = calloc((size_t)c->tp * PART, sizeof *all_bits);
        for (int i = 0; i < PART; i++) bits[i] = (uint16_t)(0x3f80 + 0x100 * c->tp_rank + i);
        int before = failures;
        if (!all_bits || comm_all_gather(c, GROUP_TP, bits, all_bits, PART, COMM_BF16, COMM_HOST)) failures++;
        for (int j = 0; all_bits && j < c->tp; j++)
            for (int i = 0; i < PART; i++) failures += all_bits[j * PART + i] != (uint16_t)(0x3f80 + 0x100 * j + i);
        if (failures > before) fprintf(stderr, "layer_check rank %d: the bf16 all-gather wrong\n", rank);
        free(all_bits);
    }
    free(all);
    free(full);
    /* A message of more values than an MPI count holds is refused before
     * anything is sent (a cast to int cut it to its low bits); the buffer
     * is never touched. */
    float one = 0;
    if (comm_send(c, COMM_NEXT_STAGE, &one, (int64_t)INT_MAX + 1, COMM_FLOAT, 0, COMM_HOST) != TP_ERR_COMM ||
        !strstr(tp_errmsg(), "more than one MPI message counts") ||
        comm_recv(c, COMM_PREV_STAGE, &one, (int64_t)1 << 32, COMM_FLOAT, 0, COMM_HOST) != TP_ERR_COMM) {
        fprintf(stderr, "layer_check rank %d: a message beyond an MPI count not refused: %s\n", rank, tp_errmsg());
        failures++;
    }
    int total = failures;
    comm_all_reduce(c, GROUP_WORLD, &total, 1, COMM_INT, COMM_MAX, COMM_HOST);
    if (rank == 0) printf("layer_check: tp=%d: %s\n", c->tp, total ? "MISMATCH" : "every layer agrees with its dense version");
    gpt_model_free(tp);
    gpt_model_free(dense);
    comm_free(alone);
    comm_free(c);
    return total ? 1 : 0;
}
