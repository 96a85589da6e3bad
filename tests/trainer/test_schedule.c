/* The pipeline schedules (trainer/schedule.h), every stage at once in a
 * simulation of the trainer's messages: each operation receives its input
 * (a forward) or its output's gradient (a backward) from the stage that
 * runs the neighbouring chunk, blocking until it was sent; sends never
 * block, but an operation waits until the stage's first sends_done
 * messages have been received (what MPI's rendezvous asks of large
 * messages before their buffers are used again). Checked: each stage runs every (micro-batch, chunk) forward
 * once and then its backward once; no stage waits forever; slots are never
 * shared by two units in flight; 1F1B keeps its known order and slots; and
 * with equal times per chunk and free messages the step takes the busy
 * time plus the bubble (pp - 1) / (V m) of it, as Narayanan et al. 2021
 * give for both schedules. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../trainer/schedule.h"

typedef struct {
    pipeline_op *ops;
    int64_t count, next;
    int slots;
    double clock;   /* simulated time this stage is free again */
    int64_t *sent;  /* the mailbox index of each message this stage sent, in order */
    int64_t num_sent;
} stage_run;

/* Messages by (direction, global chunk receiving, micro-batch): the time it
 * was sent, or -1. */
typedef struct {
    int pp, chunks;
    int64_t micro_batches;
    double *sent_at;  /* [2][pp chunks][micro_batches] */
    char *received;
} mailbox;

static int64_t box_index(const mailbox *b, int backward, int global_chunk, int64_t micro)
{
    return ((int64_t)backward * b->pp * b->chunks + global_chunk) * b->micro_batches + micro;
}

/* Runs every stage's schedule; times: a forward of one chunk takes
 * forward_time, a backward twice that. Returns 0 when some stage waited
 * forever, else 1 with *step_time the last stage's finish. */
static int simulate(int pp, int chunks, int64_t M, double forward_time, double *step_time, int *max_slots)
{
    stage_run *runs = calloc((size_t)pp, sizeof *runs);
    mailbox box = {pp, chunks, M, NULL, NULL};
    int64_t cells = 2 * (int64_t)pp * chunks * M;
    box.sent_at = malloc((size_t)cells * sizeof(double));
    box.received = calloc((size_t)cells, 1);
    for (int64_t i = 0; i < cells; i++) box.sent_at[i] = -1;
    *max_slots = 0;
    for (int s = 0; s < pp; s++) {
        cr_assert_eq(pipeline_schedule(pp, s, chunks, M, &runs[s].ops, &runs[s].count, &runs[s].slots), TP_OK, "%s",
                     tp_errmsg());
        cr_assert_eq(runs[s].count, 2 * M * chunks);
        if (runs[s].slots > *max_slots) *max_slots = runs[s].slots;
        runs[s].sent = malloc((size_t)runs[s].count * sizeof(int64_t));
    }
    int last_global = pp * chunks - 1, progress = 1, done = 0;
    while (progress) {
        progress = 0;
        for (int s = 0; s < pp; s++) {
            stage_run *r = &runs[s];
            while (r->next < r->count) {
                const pipeline_op *op = &r->ops[r->next];
                int g = op->chunk * pp + s;
                cr_assert_leq(op->sends_done, r->num_sent);
                int64_t w = 0;
                while (w < op->sends_done && box.received[r->sent[w]]) w++;
                if (w < op->sends_done) break; /* a send from the slot's buffers still on its way */
                double start = r->clock;
                int needs = op->backward ? g < last_global : g > 0;
                int64_t in = box_index(&box, op->backward, g, op->micro);
                if (needs) {
                    if (box.sent_at[in] < 0) break;
                    if (box.sent_at[in] > start) start = box.sent_at[in];
                    box.received[in] = 1;
                }
                r->clock = start + forward_time * (op->backward ? 2 : 1);
                int sends = op->backward ? g > 0 : g < last_global;
                cr_assert_eq(op->sends, sends);
                if (sends) {
                    int64_t out = box_index(&box, op->backward, op->backward ? g - 1 : g + 1, op->micro);
                    cr_assert_lt(box.sent_at[out], 0, "a message sent twice");
                    box.sent_at[out] = r->clock;
                    r->sent[r->num_sent++] = out;
                }
                r->next++;
                progress = 1;
                if (r->next == r->count) done++;
            }
        }
    }
    *step_time = 0;
    for (int s = 0; s < pp; s++) {
        if (runs[s].clock > *step_time) *step_time = runs[s].clock;
        free(runs[s].ops);
        free(runs[s].sent);
    }
    free(runs);
    free(box.sent_at);
    free(box.received);
    return done == pp;
}

/* Each unit forwarded once then backwarded once, and no slot in use twice. */
static void check_stage_order(int pp, int stage, int chunks, int64_t M)
{
    pipeline_op *ops;
    int64_t count;
    int slots;
    cr_assert_eq(pipeline_schedule(pp, stage, chunks, M, &ops, &count, &slots), TP_OK, "%s", tp_errmsg());
    char *state = calloc((size_t)(M * chunks), 1);
    int *holder = malloc((size_t)slots * sizeof(int)), heads = pipeline_buffers_used(ops, count).heads;
    int *head_holder = malloc((size_t)(heads + 1) * sizeof(int));
    for (int i = 0; i < slots; i++) holder[i] = -1;
    for (int i = 0; i < heads; i++) head_holder[i] = -1;
    cr_assert(stage == pp - 1 ? heads >= 1 : heads == 0, "pp %d stage %d: %d heads", pp, stage, heads);
    /* Gradients go back from every chunk but the model's first. */
    cr_assert_eq(pipeline_buffers_used(ops, count).grad_buffers, stage > 0 || chunks > 1 ? PIPELINE_GRAD_BUFFERS : 0);
    for (int64_t i = 0; i < count; i++) {
        const pipeline_op *op = &ops[i];
        cr_assert(op->chunk >= 0 && op->chunk < chunks && op->micro >= 0 && op->micro < M);
        cr_assert(op->slot >= 0 && op->slot < slots);
        int unit = (int)(op->micro * chunks + op->chunk);
        cr_assert_eq(state[unit], op->backward ? 1 : 0, "pp %d stage %d V %d m %lld: unit %d out of order", pp, stage,
                     chunks, (long long)M, unit);
        state[unit]++;
        if (op->backward) {
            cr_assert_eq(holder[op->slot], unit, "a backward in another unit's slot");
            holder[op->slot] = -1;
        } else {
            cr_assert_eq(holder[op->slot], -1, "a slot in use twice");
            holder[op->slot] = unit;
        }
        /* The model's last chunk, and it alone, goes through a head buffer of its own while in flight. */
        int is_head = stage == pp - 1 && op->chunk == chunks - 1;
        cr_assert_eq(op->head >= 0, is_head);
        if (is_head && op->backward) {
            cr_assert_eq(head_holder[op->head], unit, "a backward in another unit's head");
            head_holder[op->head] = -1;
        } else if (is_head) {
            cr_assert_eq(head_holder[op->head], -1, "a head in use twice");
            head_holder[op->head] = unit;
        }
    }
    for (int64_t u = 0; u < M * chunks; u++) cr_assert_eq(state[u], 2);
    free(state);
    free(holder);
    free(head_holder);
    free(ops);
}

/* A schedule as text: "F3 B1 ..." (micro-batches), or with chunks "F3.1 B1.0 ...". */
static void order_text(const pipeline_op *ops, int64_t count, int with_chunks, char *out, size_t size)
{
    out[0] = '\0';
    for (int64_t i = 0; i < count; i++) {
        size_t used = strlen(out);
        if (with_chunks)
            snprintf(out + used, size - used, "%c%lld.%d ", ops[i].backward ? 'B' : 'F', (long long)ops[i].micro,
                     ops[i].chunk);
        else snprintf(out + used, size - used, "%c%lld ", ops[i].backward ? 'B' : 'F', (long long)ops[i].micro);
    }
}

Test(schedule, one_f_one_b_order_and_slots)
{
    /* pp 4, stage 1, 6 micro-batches: 2 warm-up forwards, then alternating. */
    pipeline_op *ops;
    int64_t count;
    int slots;
    cr_assert_eq(pipeline_schedule(4, 1, 1, 6, &ops, &count, &slots), TP_OK);
    char got[128];
    order_text(ops, count, 0, got, sizeof got);
    cr_assert_str_eq(got, "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5 ");
    cr_assert_eq(slots, 3); /* pp - stage, as many micro-batches in flight */
    /* Slots reused in turn: micro-batch k in slot k mod 3, its forward
     * waiting for the sends up to the forward of micro-batch k - 3; the
     * backward of k sends from gradient buffer k mod 2, waiting for the sends
     * up to the backward of k - 2 (each operation of a middle stage sends). */
    for (int64_t i = 0; i < count; i++) {
        cr_assert_eq(ops[i].slot, ops[i].micro % 3);
        cr_assert_eq(ops[i].sends, 1);
        int64_t before = ops[i].micro - (ops[i].backward ? PIPELINE_GRAD_BUFFERS : 3), done = 0;
        for (int64_t j = 0; j < i; j++)
            if (ops[j].backward == ops[i].backward && ops[j].micro == before) done = j + 1;
        cr_assert_eq(ops[i].sends_done, done, "op %lld", (long long)i);
        cr_assert_eq(ops[i].grad_buffer, ops[i].backward ? (int)(ops[i].micro % PIPELINE_GRAD_BUFFERS) : -1);
    }
    free(ops);
    for (int pp = 1; pp <= 6; pp++)
        for (int s = 0; s < pp; s++)
            for (int64_t m = 1; m <= 9; m++) {
                cr_assert_eq(pipeline_schedule(pp, s, 1, m, &ops, &count, &slots), TP_OK);
                cr_assert_eq(slots, m < pp - s ? m : pp - s);
                free(ops);
            }
}

Test(schedule, interleaved_order)
{
    /* pp 2, V 2, 4 micro-batches, stage 1: warm-up (V-1) pp = 2 forwards of
     * chunk 0, then one forward and one backward, chunks in groups of pp. */
    pipeline_op *ops;
    int64_t count;
    int slots;
    cr_assert_eq(pipeline_schedule(2, 1, 2, 4, &ops, &count, &slots), TP_OK);
    char got[256];
    order_text(ops, count, 1, got, sizeof got);
    cr_assert_str_eq(got, "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0 ");
    /* Three slots (F0.0, F1.0 and F0.1 in flight at once), but one head: the last chunk's backward follows
     * its forward at once. */
    cr_assert_eq(slots, 3);
    cr_assert_eq(pipeline_buffers_used(ops, count).heads, 1);
    free(ops);
    /* Only pp micro-batches: every forward first, and each through the head in flight at once. */
    cr_assert_eq(pipeline_schedule(2, 1, 3, 2, &ops, &count, &slots), TP_OK);
    for (int64_t i = 0; i < count; i++) cr_assert_eq(ops[i].backward, i >= 6);
    cr_assert_eq(slots, 6);
    cr_assert_eq(pipeline_buffers_used(ops, count).heads, 2);
    free(ops);
}

Test(schedule, every_stage_runs_every_unit_once)
{
    for (int pp = 1; pp <= 6; pp++)
        for (int V = 1; V <= 4; V++) {
            if (V > 1 && pp < 2) continue;
            for (int64_t m = V > 1 ? pp : 1; m <= 4 * pp; m += V > 1 ? pp : 1)
                for (int s = 0; s < pp; s++) check_stage_order(pp, s, V, m);
        }
}

Test(schedule, no_stage_waits_forever_and_the_bubble_is_as_predicted)
{
    for (int pp = 1; pp <= 8; pp++)
        for (int V = 1; V <= 4; V++) {
            if (V > 1 && pp < 2) continue;
            for (int64_t m = V > 1 ? pp : 1; m <= 4 * pp; m += V > 1 ? pp : 1) {
                double step, chunk_forward = 1.0 / V; /* a stage's layers take 1 forward, 2 backward */
                int slots;
                cr_assert(simulate(pp, V, m, chunk_forward, &step, &slots), "pp %d V %d m %lld: a stage waits forever",
                          pp, V, (long long)m);
                double busy = 3.0 * (double)m, bubble = (step - busy) / busy;
                if (m >= pp)
                    cr_assert_float_eq(bubble, pipeline_bubble_fraction(pp, V, m), 1e-9,
                                       "pp %d V %d m %lld: bubble %.4f, predicted %.4f", pp, V, (long long)m, bubble,
                                       pipeline_bubble_fraction(pp, V, m));
            }
        }
}

Test(schedule, refusals)
{
    pipeline_op *ops;
    int64_t count;
    int slots;
    cr_assert_eq(pipeline_schedule(1, 0, 2, 4, &ops, &count, &slots), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "pp 2 or more"), "%s", tp_errmsg());
    cr_assert_eq(pipeline_schedule(4, 0, 2, 6, &ops, &count, &slots), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "6 micro-batches a step (--grad-accum, or --global-batch / (micro-batch x dp)) is "
                                  "not a multiple of 4"), "%s", tp_errmsg());
    cr_assert_eq(pipeline_schedule(2, 2, 1, 4, &ops, &count, &slots), TP_ERR_ARG);
    cr_assert_eq(pipeline_schedule(2, 0, 2, 10000, &ops, &count, &slots), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "tags"), "%s", tp_errmsg());
    cr_assert_eq(pipeline_check(1, 1, 40000), TP_OK, "at pp 1 nothing is sent: no tags to run out of");
    cr_assert_eq(pipeline_check(4, 2, 8), TP_OK);
}
