/* schedule.c: 1F1B and interleaved 1F1B orders (schedule.h). */
#include <stdlib.h>

#include "../common/error.h"
#include "comm.h"
#include "schedule.h"

int pipeline_check(int pp, int chunks, int64_t micro_batches)
{
    if (pp < 1 || chunks < 1 || micro_batches < 1)
        return tp_fail(TP_ERR_ARG, "a pipeline of %d stages, %d chunks each, %lld micro-batches", pp, chunks,
                       (long long)micro_batches);
    if (chunks > 1 && pp < 2)
        return tp_fail(TP_ERR_ARG, "virtual stages interleave chunks of layers over pipeline stages: they need pp 2 "
                       "or more (pp is %d)", pp);
    if (chunks > 1 && micro_batches % pp)
        return tp_fail(TP_ERR_ARG, "the interleaved schedule runs micro-batches in groups of pp = %d: %lld "
                       "micro-batches a step (--grad-accum, or --global-batch / (micro-batch x dp)) is not a multiple "
                       "of %d", pp, (long long)micro_batches, pp);
    if (pp > 1 && 2 * micro_batches * chunks > COMM_MAX_TAG + 1)
        return tp_fail(TP_ERR_ARG, "%lld micro-batches x %d chunks: more pipeline messages a step than MPI's %d tags",
                       (long long)micro_batches, chunks, COMM_MAX_TAG);
    return TP_OK;
}

/* The micro-batch and chunk of the i-th forward (or backward) of a stage. */
static void nth_unit(int pp, int chunks, int64_t i, int backward, int64_t *micro, int *chunk)
{
    if (chunks == 1) {
        *micro = i;
        *chunk = 0;
        return;
    }
    int64_t group = i / ((int64_t)pp * chunks), within = i % ((int64_t)pp * chunks);
    *micro = group * pp + within % pp;
    *chunk = (int)(within / pp);
    if (backward) *chunk = chunks - 1 - *chunk;
}

static int64_t warmup_forwards(int pp, int stage, int chunks, int64_t micro_batches)
{
    int64_t total = micro_batches * chunks, warmup;
    if (chunks == 1) warmup = pp - stage - 1;
    else if (micro_batches == pp) warmup = total;
    else warmup = 2 * (int64_t)(pp - stage - 1) + (int64_t)(chunks - 1) * pp;
    return warmup < total ? warmup : total;
}

typedef struct {
    int pp, stage, chunks;
    pipeline_op *ops;
    int64_t count, sends;
    int *slot_of;       /* per (micro, chunk): its slot while in flight */
    int64_t *sent_from; /* per slot: the stage's sends up to the last forward that used it (0: none) */
    char *busy;         /* per slot: taken now */
    int slots;
    int *head_of;       /* per (micro, chunk) of the model's last chunk: its head buffer while in flight */
    char *head_busy;    /* per head buffer: taken now */
    int64_t grad_sent_from[PIPELINE_GRAD_BUFFERS]; /* the same per gradient buffer, up to its last backward */
    int64_t backwards;
} builder;

static void add(builder *b, int64_t i, int backward)
{
    pipeline_op *op = &b->ops[b->count++];
    op->backward = backward;
    nth_unit(b->pp, b->chunks, i, backward, &op->micro, &op->chunk);
    op->sends = backward ? !(b->stage == 0 && op->chunk == 0)
                         : !(b->stage == b->pp - 1 && op->chunk == b->chunks - 1);
    b->sends += op->sends;
    int64_t unit = op->micro * b->chunks + op->chunk;
    int is_head = b->stage == b->pp - 1 && op->chunk == b->chunks - 1;
    op->head = -1;
    if (is_head && backward) b->head_busy[op->head = b->head_of[unit]] = 0;
    if (is_head && !backward) {
        int h = 0;
        while (b->head_busy[h]) h++;
        b->head_busy[op->head = b->head_of[unit] = h] = 1;
    }
    if (backward) {
        op->slot = b->slot_of[unit];
        b->busy[op->slot] = 0;
        /* Only a backward that sends uses a gradient buffer, and waits for its last send. */
        op->grad_buffer = op->sends ? (int)(b->backwards++ % PIPELINE_GRAD_BUFFERS) : -1;
        op->sends_done = op->sends ? b->grad_sent_from[op->grad_buffer] : 0;
        if (op->sends) b->grad_sent_from[op->grad_buffer] = b->sends;
        return;
    }
    int s = 0;
    while (b->busy[s]) s++; /* there are as many slots as units, at most */
    op->slot = b->slot_of[unit] = s;
    op->grad_buffer = -1;
    /* A slot's output is its only send: a forward that sent none leaves nothing to wait for. */
    op->sends_done = b->sent_from[s];
    b->sent_from[s] = op->sends ? b->sends : 0;
    b->busy[s] = 1;
    if (s + 1 > b->slots) b->slots = s + 1;
}

int pipeline_schedule(int pp, int stage, int chunks, int64_t micro_batches, pipeline_op **ops, int64_t *count,
                      int *slots)
{
    *ops = NULL;
    *count = 0;
    *slots = 0;
    TP_TRY(pipeline_check(pp, chunks, micro_batches));
    if (stage < 0 || stage >= pp) return tp_fail(TP_ERR_ARG, "stage %d of a pipeline of %d", stage, pp);
    int64_t total = micro_batches * chunks, warmup = warmup_forwards(pp, stage, chunks, micro_batches);
    builder b = {.pp = pp, .stage = stage, .chunks = chunks, .ops = malloc((size_t)(2 * total) * sizeof *b.ops),
                 .slot_of = malloc((size_t)total * sizeof(int)), .sent_from = calloc((size_t)total, sizeof(int64_t)),
                 .busy = calloc((size_t)total, 1), .head_of = malloc((size_t)total * sizeof(int)),
                 .head_busy = calloc((size_t)total, 1)};
    int status = TP_OK;
    if (!b.ops || !b.slot_of || !b.sent_from || !b.busy || !b.head_of || !b.head_busy) {
        status = tp_fail(TP_ERR_NOMEM, "out of memory for a schedule of %lld micro-batches", (long long)total);
    } else {
        int64_t f = 0, k = 0;
        for (; f < warmup; f++) add(&b, f, 0);
        for (; f < total; f++, k++) {
            add(&b, f, 0);
            add(&b, k, 1);
        }
        for (; k < total; k++) add(&b, k, 1);
    }
    free(b.slot_of);
    free(b.sent_from);
    free(b.head_of);
    free(b.head_busy);
    free(b.busy);
    if (status) {
        free(b.ops);
        return status;
    }
    *ops = b.ops;
    *count = b.count;
    *slots = b.slots;
    return TP_OK;
}

pipeline_buffers pipeline_buffers_used(const pipeline_op *ops, int64_t count)
{
    pipeline_buffers used = {0, 0};
    for (int64_t i = 0; i < count; i++) {
        if (ops[i].head + 1 > used.heads) used.heads = ops[i].head + 1;
        if (ops[i].grad_buffer >= 0) used.grad_buffers = PIPELINE_GRAD_BUFFERS;
    }
    return used;
}

double pipeline_bubble_fraction(int pp, int chunks, int64_t micro_batches)
{
    return (double)(pp - 1) / ((double)chunks * (double)micro_batches);
}
