/* The trainer driven from outside, in one process: the thread communicator's
 * collectives and pipeline messages, train_run at tp2pp2 on threads against
 * one rank alone, a stop asked for through the API (checkpoint committed,
 * TRAIN_STOPPED, a resume finishes the run), failures as outcomes, and the
 * device seam: a kernel backend whose memory only its own copies can read
 * (tests/support/encoded_backend.h) trains as the CPU does, at every
 * layout, and its checkpoints resume on the CPU and the reverse. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../ckpt/ckpt.h"
#include "../../trainer/checkpoint.h"
#include "../../trainer/comm.h"
#include "../../trainer/train.h"
#include "../support/encoded_backend.h"
#include "../support/fixture.h"

TestSuite(train, .init = make_dir, .fini = remove_dir);

/* Runs body(rank's comm, arg of that rank) on one thread per rank. */
typedef void *(*rank_body)(void *arg);

typedef struct {
    comm *c;
    void *arg;
    int status;
} rank_slot;

static void run_ranks(int tp, int pp, int dp, void *(*body)(void *), rank_slot *slots)
{
    int world = tp * pp * dp;
    comm *comms[16];
    cr_assert_eq(comm_threads_create(comms, tp, pp, dp), TP_OK, "%s", tp_errmsg());
    pthread_t threads[16];
    for (int r = 0; r < world; r++) {
        slots[r].c = comms[r];
        cr_assert_eq(pthread_create(&threads[r], NULL, body, &slots[r]), 0);
    }
    for (int r = 0; r < world; r++) pthread_join(threads[r], NULL);
    for (int r = 0; r < world; r++) comm_free(comms[r]);
}

/* ------------------------------------------------------------ communicator */

static void *collectives(void *arg)
{
    rank_slot *slot = arg;
    comm *c = slot->c;
    int bad = 0;
    /* Sum over TP of (tp_rank + 1): 1 + 2 = 3 at tp 2, in every element. */
    float x[5];
    for (int i = 0; i < 5; i++) x[i] = (float)(c->tp_rank + 1);
    bad |= comm_all_reduce(c, GROUP_TP, x, 5, COMM_FLOAT, COMM_SUM, COMM_HOST) != TP_OK;
    for (int i = 0; i < 5; i++) bad |= x[i] != 3.0f;
    /* Max over DP of dp_rank: dp - 1. */
    int m = c->dp_rank;
    bad |= comm_all_reduce(c, GROUP_DP, &m, 1, COMM_INT, COMM_MAX, COMM_HOST) != TP_OK;
    bad |= m != c->dp - 1;
    /* Sum over the world of the ranks: 0 + ... + 7 = 28. */
    double w = c->rank;
    bad |= comm_all_reduce(c, GROUP_WORLD, &w, 1, COMM_DOUBLE, COMM_SUM, COMM_HOST) != TP_OK;
    bad |= w != 28.0;
    /* EMBED joins the first and last stage of one TP rank and replica. */
    float e = (float)(10 * c->pp_rank + 1);
    bad |= comm_all_reduce(c, GROUP_EMBED, &e, 1, COMM_FLOAT, COMM_SUM, COMM_HOST) != TP_OK;
    bad |= e != 12.0f; /* 1 + 11 at pp 2 */
    /* Pipeline: stage 0 sends its rank to stage 1, which answers with twice it. */
    int value = c->rank * 100, answer = 0;
    if (c->pp_rank == 0) {
        bad |= comm_send(c, COMM_NEXT_STAGE, &value, 1, COMM_INT, 7, COMM_HOST) != TP_OK;
        bad |= comm_recv(c, COMM_NEXT_STAGE, &answer, 1, COMM_INT, 8, COMM_HOST) != TP_OK;
        bad |= answer != 2 * value;
        /* The stages are a ring: the first's previous is the last. */
        bad |= comm_send(c, COMM_PREV_STAGE, &value, 1, COMM_INT, 9, COMM_HOST) != TP_OK;
    } else {
        int got = 0;
        bad |= comm_recv(c, COMM_PREV_STAGE, &got, 1, COMM_INT, 7, COMM_HOST) != TP_OK;
        bad |= got != (c->rank - c->tp) * 100;
        got *= 2;
        bad |= comm_send(c, COMM_PREV_STAGE, &got, 1, COMM_INT, 8, COMM_HOST) != TP_OK;
        bad |= comm_recv(c, COMM_NEXT_STAGE, &got, 1, COMM_INT, 9, COMM_HOST) != TP_OK; /* the last's next: the first */
        bad |= got != (c->rank - c->tp) * 100;
    }
    bad |= comm_wait_sends(c, COMM_HOST) != TP_OK;
    /* Broadcast from rank 5. */
    char text[16];
    snprintf(text, sizeof text, "rank %d", c->rank);
    bad |= comm_broadcast(c, text, sizeof text, 5, COMM_HOST) != TP_OK;
    bad |= strcmp(text, "rank 5") != 0;
    /* Texts of every length gathered to rank 3, none from odd ranks, rank 6's long. */
    char mine[4096];
    memset(mine, 'a' + c->rank, sizeof mine);
    mine[c->rank == 6 ? sizeof mine - 1 : (size_t)c->rank + 1] = '\0';
    char **texts = NULL;
    bad |= comm_gather_texts(c, c->rank % 2 ? NULL : mine, 3, &texts) != TP_OK;
    bad |= (c->rank == 3) != (texts != NULL);
    for (int r = 0; texts && r < c->world; r++) {
        if (r % 2) {
            bad |= texts[r] != NULL;
            continue;
        }
        size_t want = r == 6 ? sizeof mine - 1 : (size_t)r + 1;
        bad |= !texts[r] || strlen(texts[r]) != want || texts[r][0] != 'a' + r || texts[r][want - 1] != 'a' + r;
    }
    comm_texts_free(texts, c->world);
    /* All-gather over TP: [tp_rank's 3 values] in member order; over DP too. */
    float part[3], all[3 * 2];
    for (int i = 0; i < 3; i++) part[i] = (float)(10 * c->tp_rank + i);
    bad |= comm_all_gather(c, GROUP_TP, part, all, 3, COMM_FLOAT, COMM_HOST) != TP_OK;
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 3; i++) bad |= all[j * 3 + i] != (float)(10 * j + i);
    double mine_d = c->dp_rank + 0.5, both_d[2];
    bad |= comm_all_gather(c, GROUP_DP, &mine_d, both_d, 1, COMM_DOUBLE, COMM_HOST) != TP_OK;
    bad |= both_d[0] != 0.5 || both_d[1] != 1.5;
    /* Reduce-scatter over TP: member j keeps the sum of everyone's part j:
     * rank t sends (t + 1) * (100 j + i) for part j. */
    float full[2 * 3], kept[3];
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 3; i++) full[j * 3 + i] = (float)((c->tp_rank + 1) * (100 * j + i));
    bad |= comm_reduce_scatter(c, GROUP_TP, full, kept, 3, COMM_FLOAT, COMM_HOST) != TP_OK;
    for (int i = 0; i < 3; i++) bad |= kept[i] != (float)(3 * (100 * c->tp_rank + i)); /* (1 + 2) x */
    /* Both in place (comm.h): into the member's own part of what it sent,
     * and gathered from the member's own part of the result. */
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 3; i++) full[j * 3 + i] = (float)((c->tp_rank + 1) * (100 * j + i));
    bad |= comm_reduce_scatter(c, GROUP_TP, full, full + 3 * c->tp_rank, 3, COMM_FLOAT, COMM_HOST) != TP_OK;
    for (int i = 0; i < 3; i++) bad |= full[3 * c->tp_rank + i] != (float)(3 * (100 * c->tp_rank + i));
    for (int i = 0; i < 3; i++) all[3 * c->tp_rank + i] = (float)(10 * c->tp_rank + i);
    bad |= comm_all_gather(c, GROUP_TP, all + 3 * c->tp_rank, all, 3, COMM_FLOAT, COMM_HOST) != TP_OK;
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 3; i++) bad |= all[j * 3 + i] != (float)(10 * j + i);
    /* bf16 bits (2 bytes each, an odd count) gathered as they are, never summed. */
    uint16_t bits[3], all_bits[3 * 2];
    for (int i = 0; i < 3; i++) bits[i] = (uint16_t)(0x3f80 + 0x100 * c->tp_rank + i);
    bad |= comm_all_gather(c, GROUP_TP, bits, all_bits, 3, COMM_BF16, COMM_HOST) != TP_OK;
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 3; i++) bad |= all_bits[j * 3 + i] != (uint16_t)(0x3f80 + 0x100 * j + i);
    bad |= comm_all_reduce(c, GROUP_TP, bits, 3, COMM_BF16, COMM_SUM, COMM_HOST) != TP_ERR_ARG;
    bad |= comm_reduce_scatter(c, GROUP_TP, all_bits, bits, 3, COMM_BF16, COMM_HOST) != TP_ERR_ARG;
    /* A device stream is refused by a host communicator. */
    bad |= comm_all_gather(c, GROUP_TP, part, all, 3, COMM_FLOAT, (comm_stream)x) != TP_ERR_COMM;
    bad |= comm_reduce_scatter(c, GROUP_TP, full, kept, 3, COMM_FLOAT, (comm_stream)x) != TP_ERR_COMM;
    bad |= comm_all_reduce(c, GROUP_TP, x, 1, COMM_FLOAT, COMM_SUM, (comm_stream)x) != TP_ERR_COMM;
    slot->status = bad;
    return NULL;
}

Test(train, thread_communicator_collectives_and_messages)
{
    rank_slot slots[8];
    memset(slots, 0, sizeof slots);
    run_ranks(2, 2, 2, collectives, slots);
    for (int r = 0; r < 8; r++) cr_assert_eq(slots[r].status, 0, "rank %d saw a wrong result", r);
}

/* Ranks 2 and 3 of 4 fail with causes of their own: every rank hears
 * rank 2's (the lowest failing) status and cause, named by its rank; with
 * no failure, every rank goes on. */
typedef struct {
    int status;
    char message[256];
    int clean;
} agreement;

static void *agree_on_the_first_failure(void *arg)
{
    rank_slot *slot = arg;
    comm *c = slot->c;
    agreement *a = slot->arg;
    int mine = TP_OK;
    if (c->rank == 2) mine = tp_fail(TP_ERR_NOT_FOUND, "d.bin: no such token file");
    if (c->rank == 3) mine = tp_fail(TP_ERR_NOMEM, "out of memory");
    a->status = comm_agree_first(c, mine, "CK");
    snprintf(a->message, sizeof a->message, "%s", tp_errmsg());
    a->clean = comm_agree_first(c, TP_OK, "CK");
    return NULL;
}

Test(train, every_rank_hears_the_first_failed_ranks_cause)
{
    rank_slot slots[4];
    agreement got[4];
    memset(slots, 0, sizeof slots);
    memset(got, 0, sizeof got);
    for (int r = 0; r < 4; r++) slots[r].arg = &got[r];
    run_ranks(1, 2, 2, agree_on_the_first_failure, slots);
    for (int r = 0; r < 4; r++) {
        cr_expect_eq(got[r].status, TP_ERR_NOT_FOUND, "rank %d: status %d", r, got[r].status);
        cr_expect_str_eq(got[r].message, "rank 2: d.bin: no such token file", "rank %d", r);
        cr_expect_eq(got[r].clean, TP_OK, "rank %d: no failure, yet %d", r, got[r].clean);
    }
}

static void *abort_or_wait(void *arg)
{
    rank_slot *slot = arg;
    comm *c = slot->c;
    if (c->rank == 1) {
        comm_abort(c, 3);
        slot->status = TP_OK;
        return NULL;
    }
    /* Waits for rank 1, which never comes: the abort must wake it. */
    float x = 1;
    slot->status = comm_all_reduce(c, GROUP_WORLD, &x, 1, COMM_FLOAT, COMM_SUM, COMM_HOST);
    return NULL;
}

Test(train, abort_wakes_the_ranks_that_wait, .timeout = 30)
{
    rank_slot slots[4];
    memset(slots, 0, sizeof slots);
    run_ranks(2, 2, 1, abort_or_wait, slots);
    for (int r = 0; r < 4; r++) {
        if (r == 1) continue;
        cr_assert_eq(slots[r].status, TP_ERR_COMM, "rank %d returned %d", r, slots[r].status);
    }
}

/* --------------------------------------------------------------- training */

typedef struct {
    double losses[64];
    int64_t last_step;
    int warnings;
    int64_t stop_after; /* > 0: ask for a stop when this step is reported */
    train_control *control;
    int64_t saved[8];   /* steps of SAVED reports, in order */
    int saves;
    int saved_before_its_step; /* a SAVED report came before its step's STEP report */
    double load_seconds; /* RESUMED */
    int64_t load_state_bytes, optimizer_bytes, parameter_bytes; /* RESUMED; START */
} recorder;

static void record(void *ctx, const train_report *r)
{
    recorder *rec = ctx;
    if (r->kind == TRAIN_REPORT_WARNING) rec->warnings++;
    if (r->kind == TRAIN_REPORT_RESUMED) {
        rec->load_seconds = r->seconds;
        rec->load_state_bytes = r->bytes;
    }
    if (r->kind == TRAIN_REPORT_START) {
        rec->optimizer_bytes = r->optimizer_bytes;
        rec->parameter_bytes = r->parameter_bytes;
    }
    if (r->kind == TRAIN_REPORT_SAVED) {
        if (rec->saves < 8) rec->saved[rec->saves] = r->step;
        rec->saves++;
        if (r->step > rec->last_step || !r->text || !strstr(r->text, "step_")) rec->saved_before_its_step = 1;
    }
    if (r->kind != TRAIN_REPORT_STEP) return;
    if (r->step < 64) rec->losses[r->step] = r->loss;
    rec->last_step = r->step;
    if (rec->stop_after > 0 && r->step == rec->stop_after) train_request_stop(rec->control);
}

static void tiny_options(train_options *o, int64_t steps)
{
    train_options_init(o);
    cr_assert_eq(gpt_preset("tiny", &o->config), TP_OK);
    o->seq = o->config.seq;
    o->micro_batch = 2;
    o->grad_accum = 2;
    o->steps = steps;
    o->lr = 1e-3;
    o->warmup = 2;
}

typedef struct {
    train_options options;
    recorder rec;
    train_outcome outcome;
} rank_run;

static void *train_rank(void *arg)
{
    rank_slot *slot = arg;
    rank_run *run = slot->arg;
    run->options.report = record;
    run->options.report_ctx = &run->rec;
    slot->status = train_run(&run->options, slot->c, &run->outcome);
    return NULL;
}

Test(train, four_ranks_on_threads_train_as_one_rank, .timeout = 120)
{
    /* One rank alone. */
    comm *alone = NULL;
    cr_assert_eq(comm_local_create(&alone), TP_OK);
    rank_run single;
    memset(&single, 0, sizeof single);
    tiny_options(&single.options, 6);
    single.options.report = record;
    single.options.report_ctx = &single.rec;
    cr_assert_eq(train_run(&single.options, alone, &single.outcome), TP_OK, "%s", tp_errmsg());
    comm_free(alone);
    cr_assert_eq(single.outcome.end, TRAIN_FINISHED);
    cr_assert_eq(single.outcome.steps_run, 6);
    /* tp 2, pp 2 on four threads of this process, the same global batch. */
    rank_run runs[4];
    rank_slot slots[4];
    memset(runs, 0, sizeof runs);
    memset(slots, 0, sizeof slots);
    for (int r = 0; r < 4; r++) {
        tiny_options(&runs[r].options, 6);
        slots[r].arg = &runs[r];
    }
    run_ranks(2, 2, 1, train_rank, slots);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(slots[r].status, TP_OK, "rank %d: %s", r, runs[r].outcome.reason);
        cr_assert_eq(runs[r].outcome.end, TRAIN_FINISHED);
        for (int64_t s = 1; s <= 6; s++) {
            double a = runs[r].rec.losses[s], b = single.rec.losses[s];
            cr_assert(b > 0 && fabs(a - b) <= 1e-4 * b, "rank %d step %lld: loss %.9g at tp2pp2, %.9g alone", r,
                      (long long)s, a, b);
        }
    }
}

Test(train, a_stop_request_checkpoints_and_a_resume_finishes, .timeout = 120)
{
    char run_dir[700];
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    train_control control;
    train_control_init(&control);
    rank_run runs[2];
    rank_slot slots[2];
    memset(runs, 0, sizeof runs);
    memset(slots, 0, sizeof slots);
    for (int r = 0; r < 2; r++) {
        tiny_options(&runs[r].options, 8);
        runs[r].options.ckpt_dir = run_dir;
        runs[r].options.control = &control;
        runs[r].rec.control = &control;
        /* One rank asks, when step 3 is reported (between steps): all agree
         * to stop after the next one. */
        runs[r].rec.stop_after = r == 0 ? 3 : 0;
        slots[r].arg = &runs[r];
    }
    run_ranks(2, 1, 1, train_rank, slots);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(slots[r].status, TP_OK, "rank %d: %s", r, runs[r].outcome.reason);
        cr_assert_eq(runs[r].outcome.end, TRAIN_STOPPED, "rank %d ended %d", r, runs[r].outcome.end);
        cr_assert_eq(runs[r].outcome.step, 4, "stopped after step %lld", (long long)runs[r].outcome.step);
        cr_assert_eq(runs[r].rec.last_step, 4);
        /* Every rank hears of the commit once, after the step's report. */
        cr_assert_eq(runs[r].rec.saves, 1, "rank %d: %d saves reported", r, runs[r].rec.saves);
        cr_assert_eq(runs[r].rec.saved[0], 4);
        cr_assert_eq(runs[r].rec.saved_before_its_step, 0);
    }
    char step4[800];
    snprintf(step4, sizeof step4, "%s/step_00000004", run_dir);
    cr_assert(ckpt_is_committed(step4), "the stop committed %s", step4);
    cr_assert_str_eq(runs[0].outcome.last_checkpoint, step4);

    /* Resumed, the run finishes from step 5 with no stop asked. */
    train_control_init(&control);
    memset(slots, 0, sizeof slots);
    for (int r = 0; r < 2; r++) {
        memset(&runs[r].rec, 0, sizeof runs[r].rec);
        runs[r].options.resume = 1;
        slots[r].arg = &runs[r];
    }
    run_ranks(2, 1, 1, train_rank, slots);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(slots[r].status, TP_OK, "rank %d: %s", r, runs[r].outcome.reason);
        cr_assert_eq(runs[r].outcome.end, TRAIN_FINISHED);
        cr_assert_eq(runs[r].outcome.steps_run, 4, "steps 5..8 ran (%lld)", (long long)runs[r].outcome.steps_run);
        cr_assert_eq(runs[r].rec.losses[4], 0.0, "step 4 is not run again");
        cr_assert_gt(runs[r].rec.losses[5], 0.0);
        cr_assert_gt(runs[r].rec.load_seconds, 0.0, "the load's time is reported");
        cr_assert_eq(runs[r].rec.saves, 1, "the final checkpoint (step 8) is reported");
        cr_assert_eq(runs[r].rec.saved[0], 8);
    }
}

/* The model a resume given no model shape trains (tp-train --resume,
 * tp-elastic run): the checkpoint's shape, in the precision the run
 * recorded (bf16 here, though the checkpoint's weights are fp32) unless
 * --dtype says otherwise; a directory without checkpoints has none. */
Test(train, a_run_without_model_options_takes_its_checkpoints_model_and_precision, .timeout = 120)
{
    char run_dir[700], empty[700];
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    snprintf(empty, sizeof empty, "%s/empty", dir);
    rank_run run;
    rank_slot slot;
    memset(&run, 0, sizeof run);
    memset(&slot, 0, sizeof slot);
    tiny_options(&run.options, 2);
    run.options.ckpt_dir = run_dir;
    run.options.bf16 = 1;
    slot.arg = &run;
    run_ranks(1, 1, 1, train_rank, &slot);
    cr_assert_eq(slot.status, TP_OK, "%s", run.outcome.reason);

    gpt_config model, tiny;
    char resolved[800], want[800];
    cr_assert_eq(gpt_preset("tiny", &tiny), TP_OK);
    cr_assert_eq(checkpoint_run_model(run_dir, NULL, &model, resolved, sizeof resolved), TP_OK, "%s", tp_errmsg());
    snprintf(want, sizeof want, "%s/step_00000002", run_dir);
    cr_assert_str_eq(resolved, want);
    cr_assert_eq(model.dtype, TP_BF16, "the run's precision, not its weights' dtype (%s)", tp_dtype_name(model.dtype));
    tiny.dtype = TP_BF16;
    cr_assert_eq(gpt_config_check_same(resolved, &tiny, &model), TP_OK, "%s", tp_errmsg());

    gpt_options given = {0};
    cr_assert_eq(gpt_options_set(&given, "dtype", "fp32"), TP_OK);
    cr_assert_eq(checkpoint_run_model(run_dir, &given, &model, resolved, sizeof resolved), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(model.dtype, TP_FP32, "--dtype fp32 given: %s", tp_dtype_name(model.dtype));

    cr_assert_eq(mkdir(empty, 0755), 0);
    cr_assert_eq(checkpoint_run_model(empty, NULL, &model, resolved, sizeof resolved), TP_ERR_NOT_FOUND);
    cr_assert(strstr(tp_errmsg(), empty), "the error names the directory: %s", tp_errmsg());
}

Test(train, a_failure_is_an_outcome_every_rank_knows)
{
    comm *alone = NULL;
    cr_assert_eq(comm_local_create(&alone), TP_OK);
    rank_run run;
    memset(&run, 0, sizeof run);
    tiny_options(&run.options, 4);
    char missing[700];
    snprintf(missing, sizeof missing, "%s/no-such-tokens.bin", dir);
    run.options.data = missing;
    int status = train_run(&run.options, alone, &run.outcome);
    cr_assert_eq(status, TP_ERR_NOT_FOUND, "status %d: %s", status, tp_errmsg());
    cr_assert_eq(run.outcome.end, TRAIN_FAILED);
    cr_assert_eq(run.outcome.all_ranks_know, 1, "a failure before the first step is agreed on");
    cr_assert(strstr(run.outcome.reason, "no-such-tokens.bin"), "%s", run.outcome.reason);
    cr_assert_str_eq(tp_errmsg(), run.outcome.reason);
    cr_assert_eq(run.outcome.steps_run, 0);
    cr_assert_eq(run.outcome.options_refused, 0, "a missing data file is a failure, not the options' contradiction");
    comm_free(alone);
}

/* A resume whose model flags are not its checkpoint's: every rank fails
 * with gpt_config_check_same's reason and marks the options refused
 * (tp-train's usage error, exit 2); the same run resumed with its own model
 * but its newest checkpoint damaged fails without the mark (exit 1). */
Test(train, another_model_at_resume_refuses_the_options_on_every_rank, .timeout = 120)
{
    char run_dir[700];
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    rank_run runs[2];
    rank_slot slots[2];
    memset(runs, 0, sizeof runs);
    memset(slots, 0, sizeof slots);
    tiny_options(&runs[0].options, 2);
    runs[0].options.ckpt_dir = run_dir;
    slots[0].arg = &runs[0];
    run_ranks(1, 1, 1, train_rank, slots);
    cr_assert_eq(slots[0].status, TP_OK, "%s", runs[0].outcome.reason);

    for (int damaged = 0; damaged < 2; damaged++) {
        if (damaged) { /* the run's only checkpoint, its index cut short */
            char index[800];
            snprintf(index, sizeof index, "%s/step_00000002/index.json", run_dir);
            cr_assert_eq(truncate(index, 10), 0, "%s: %s", index, strerror(errno));
        }
        memset(runs, 0, sizeof runs);
        memset(slots, 0, sizeof slots);
        for (int r = 0; r < 2; r++) { /* two data-parallel ranks */
            tiny_options(&runs[r].options, 4);
            runs[r].options.ckpt_dir = run_dir;
            runs[r].options.resume = 1;
            if (!damaged) runs[r].options.config.dim *= 2;
            slots[r].arg = &runs[r];
        }
        run_ranks(1, 1, 2, train_rank, slots);
        for (int r = 0; r < 2; r++) {
            const train_outcome *o = &runs[r].outcome;
            cr_assert_neq(slots[r].status, TP_OK, "rank %d resumed", r);
            cr_assert(o->end == TRAIN_FAILED && o->all_ranks_know && o->steps_run == 0, "rank %d", r);
            if (!damaged) {
                cr_assert_eq(slots[r].status, TP_ERR_ARG, "rank %d: %s", r, o->reason);
                cr_assert(strstr(o->reason, "holds another model"), "rank %d: %s", r, o->reason);
                cr_assert_eq(o->options_refused, 1, "rank %d: another model is the options' fault", r);
            } else {
                cr_assert(strstr(o->reason, "no intact checkpoint"), "rank %d: %s", r, o->reason);
                cr_assert_eq(o->options_refused, 0, "rank %d: damage is not the options' fault: %s", r, o->reason);
            }
        }
    }
}

Test(train, a_claimed_run_directory_is_refused_alike_on_every_rank, .timeout = 120)
{
    char run_dir[700];
    snprintf(run_dir, sizeof run_dir, "%s/claimed", dir);
    cr_assert_eq(mkdir(run_dir, 0755), 0);
    ckpt_run_claim *held = NULL;
    cr_assert_eq(ckpt_run_claim_take(run_dir, NULL, "first-run", &held), TP_OK, "%s", tp_errmsg());
    rank_run runs[2];
    rank_slot slots[2];
    memset(runs, 0, sizeof runs);
    memset(slots, 0, sizeof slots);
    for (int r = 0; r < 2; r++) {
        tiny_options(&runs[r].options, 2);
        runs[r].options.ckpt_dir = run_dir;
        slots[r].arg = &runs[r];
    }
    run_ranks(2, 1, 1, train_rank, slots);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %ld ", (long)getpid());
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(slots[r].status, TP_ERR_EXISTS, "rank %d: %d %s", r, slots[r].status, runs[r].outcome.reason);
        cr_assert_eq(runs[r].outcome.all_ranks_know, 1);
        cr_assert(strstr(runs[r].outcome.reason, "first-run (") && strstr(runs[r].outcome.reason, pid),
                  "rank %d names the holder: %s", r, runs[r].outcome.reason);
        cr_assert_str_eq(runs[r].outcome.reason, runs[0].outcome.reason, "said alike on every rank");
    }
    char step[800];
    snprintf(step, sizeof step, "%s/step_00000002", run_dir);
    cr_assert(access(step, F_OK) != 0, "the refused run wrote nothing");
    /* Released (the holder ended): the directory is free at once. */
    ckpt_run_claim_release(held);
    memset(slots, 0, sizeof slots);
    for (int r = 0; r < 2; r++) slots[r].arg = &runs[r];
    run_ranks(2, 1, 1, train_rank, slots);
    for (int r = 0; r < 2; r++) cr_assert_eq(slots[r].status, TP_OK, "rank %d: %s", r, runs[r].outcome.reason);
    cr_assert(ckpt_is_committed(step), "%s", step);
}

/* ------------------------------------------------------------- device seam */

/* Runs a tiny model for `steps` at (tp, pp, dp <= 2) on threads with
 * `kernels` (NULL: the CPU); the losses of rank 0 into losses[1..steps]. */
/* The model of these runs: tiny's (or run_preset's), with `layers` layers
 * (0: the preset's 2), and virtual_stages chunks of them per stage; with
 * micro-batches of one sequence (the same global batch) when one_sequence
 * is set; ZeRO-1 when run_zero is set; bf16 mixed precision when run_bf16
 * is set. */
static int run_layers, run_virtual_stages, run_one_sequence, run_zero, run_bf16, run_ckpt_every, run_accumulate;
static const char *run_preset;
static recorder run_rank0; /* what rank 0 was told in the last run of train_layout_sp */

static void train_layout_sp(int tp, int pp, int dp, const kernel_backend *kernels, int64_t steps, const char *ckpt_dir,
                            int64_t stop_at, int resume, int sequence_parallel, double *losses)
{
    rank_run runs[8];
    rank_slot slots[8];
    int world = tp * pp * dp;
    memset(runs, 0, sizeof runs);
    memset(slots, 0, sizeof slots);
    for (int r = 0; r < world; r++) {
        tiny_options(&runs[r].options, steps);
        if (run_preset) {
            cr_assert_eq(gpt_preset(run_preset, &runs[r].options.config), TP_OK);
            runs[r].options.seq = runs[r].options.config.seq;
        }
        if (run_layers) runs[r].options.config.layers = run_layers;
        runs[r].options.virtual_stages = run_virtual_stages;
        runs[r].options.grad_accum = 2 / dp; /* the global batch of every layout: 4 sequences */
        if (run_one_sequence) {
            runs[r].options.micro_batch = 1;
            runs[r].options.grad_accum = 4 / dp;
        }
        runs[r].options.kernels = kernels;
        runs[r].options.ckpt_dir = ckpt_dir;
        runs[r].options.stop_at = stop_at;
        runs[r].options.resume = resume;
        runs[r].options.sequence_parallel = sequence_parallel;
        runs[r].options.zero = run_zero;
        runs[r].options.bf16 = run_bf16;
        runs[r].options.ckpt_every = run_ckpt_every;
        if (run_accumulate) { /* micro-batches of one sequence, run_accumulate of them a step */
            runs[r].options.micro_batch = 1;
            runs[r].options.grad_accum = run_accumulate;
        }
        slots[r].arg = &runs[r];
    }
    run_ranks(tp, pp, dp, train_rank, slots);
    for (int r = 0; r < world; r++) {
        cr_assert_eq(slots[r].status, TP_OK, "%s rank %d: %s", kernels ? kernels->name : "cpu", r,
                     runs[r].outcome.reason);
        cr_assert_neq(runs[r].outcome.end, TRAIN_FAILED);
    }
    /* The loss is known on every rank; rank 0 speaks for all. */
    for (int64_t s = 1; s <= steps; s++) losses[s] = runs[0].rec.losses[s];
    run_rank0 = runs[0].rec;
}

static void train_layout(int tp, int pp, int dp, const kernel_backend *kernels, int64_t steps, const char *ckpt_dir,
                         int64_t stop_at, int resume, double *losses)
{
    train_layout_sp(tp, pp, dp, kernels, steps, ckpt_dir, stop_at, resume, 0, losses);
}

/* bf16 mixed precision keeps the activations only products and the
 * attention read as bf16 bits (trainer/model.h): through the device seam
 * (each operation reading and writing no more than its bf16 extents) the
 * CPU's losses to the bit, with sequence parallelism too (the bf16 rows
 * gathered through the staged all-gather); close to, and not, fp32's. And
 * a stage of both layers the losses of two stages of one layer each, to the
 * bit: there each layer's activations sit at offset 0 of their slot, so a
 * wrong stride or offset of the bf16 regions (which the seam, decoding
 * within the slot's one allocation, cannot see) shows. That with Llama's
 * tiny (RoPE, SwiGLU and grouped-query attention in bf16 too), whose output
 * projection is untied: a tied table's gradient is summed in another order
 * on one stage (the head's and the embedding's, micro-batch by micro-batch)
 * than on two (each stage's, then the two added), a last bit that bf16's
 * roundings carry to GPT-2's losses within a few steps. */
Test(train, bf16_activations_through_the_device_seam, .timeout = 300)
{
    double one_stage[8] = {0}, two_stages[8] = {0};
    run_bf16 = 1;
    run_preset = "llama-tiny";
    train_layout(1, 1, 1, NULL, 5, NULL, 0, 0, one_stage);
    train_layout(1, 2, 1, NULL, 5, NULL, 0, 0, two_stages);
    run_preset = NULL;
    run_bf16 = 0;
    for (int s = 1; s <= 5; s++)
        cr_assert(one_stage[s] == two_stages[s], "step %d: bf16 loss %.9g with both layers on a stage, %.9g on two", s,
                  one_stage[s], two_stages[s]);
    const int layouts[3][4] = {{1, 1, 1, 0}, {2, 1, 1, 1}, {2, 2, 1, 0}}; /* tp, pp, dp, sequence parallelism */
    for (int i = 0; i < 3; i++) {
        const int *l = layouts[i];
        double fp32[8] = {0}, cpu[8] = {0}, device[8] = {0};
        train_layout_sp(l[0], l[1], l[2], NULL, 5, NULL, 0, 0, l[3], fp32);
        run_bf16 = 1;
        train_layout_sp(l[0], l[1], l[2], NULL, 5, NULL, 0, 0, l[3], cpu);
        train_layout_sp(l[0], l[1], l[2], encoded_backend(), 5, NULL, 0, 0, l[3], device);
        run_bf16 = 0;
        for (int s = 1; s <= 5; s++) {
            cr_assert(device[s] == cpu[s], "tp%d pp%d sp%d step %d: bf16 loss %.9g through the device seam, %.9g on "
                      "the CPU", l[0], l[1], l[3], s, device[s], cpu[s]);
            cr_assert(cpu[s] != fp32[s] && fabs(cpu[s] - fp32[s]) <= 1e-2 * fp32[s],
                      "tp%d pp%d sp%d step %d: bf16 loss %.9g, fp32 %.9g: not within 1e-2, or equal (no rounding)",
                      l[0], l[1], l[3], s, cpu[s], fp32[s]);
        }
    }
    cr_assert_eq(encoded_backend_live_bytes(), 0);
}

/* A checkpoint every step, each snapshot copied by the writer's thread
 * while the next step computes (to_host_background after the saved step's
 * mark): through the device seam, every tensor of every step's checkpoint
 * has the digest of the CPU's, at tp1 and at tp2 dp2 with ZeRO-1. A
 * snapshot that read what the next step wrote, or read the seam's memory
 * while an operation had it decoded, would differ. */
Test(train, asynchronous_snapshots_through_the_device_seam, .timeout = 300)
{
    const int layouts[2][4] = {{1, 1, 1, 0}, {2, 1, 2, 1}}; /* tp, pp, dp, ZeRO */
    run_ckpt_every = 1;
    for (int i = 0; i < 2; i++) {
        const int *l = layouts[i];
        char cpu_dir[700], device_dir[700];
        snprintf(cpu_dir, sizeof cpu_dir, "%s/snapshots-cpu%d", dir, i);
        snprintf(device_dir, sizeof device_dir, "%s/snapshots-device%d", dir, i);
        double cpu[8] = {0}, device[8] = {0};
        run_zero = l[3];
        train_layout(l[0], l[1], l[2], NULL, 4, cpu_dir, 0, 0, cpu);
        train_layout(l[0], l[1], l[2], encoded_backend(), 4, device_dir, 0, 0, device);
        run_zero = 0;
        for (int step = 1; step <= 4; step++) {
            char a_path[800], b_path[800];
            snprintf(a_path, sizeof a_path, "%s/step_%08d", cpu_dir, step);
            snprintf(b_path, sizeof b_path, "%s/step_%08d", device_dir, step);
            ckpt_reader *a = NULL, *b = NULL;
            cr_assert_eq(ckpt_reader_open(&a, a_path, NULL), TP_OK, "%s", tp_errmsg());
            cr_assert_eq(ckpt_reader_open(&b, b_path, NULL), TP_OK, "%s", tp_errmsg());
            int tensors = ckpt_reader_num_tensors(a);
            cr_assert_eq(ckpt_reader_num_tensors(b), tensors);
            for (int t = 0; t < tensors; t++) {
                const char *name = ckpt_reader_tensor(a, t)->name;
                int j = ckpt_reader_find(b, name);
                cr_assert(j >= 0, "%s: missing in %s", name, b_path);
                cr_assert_eq(ckpt_reader_digest(a, t), ckpt_reader_digest(b, j),
                             "tp%d dp%d ZeRO-%d, step %d: %s differs between the CPU's snapshot and the device seam's",
                             l[0], l[2], l[3], step, name);
            }
            ckpt_reader_close(a);
            ckpt_reader_close(b);
        }
        for (int s = 1; s <= 4; s++) cr_assert(device[s] == cpu[s], "step %d: %.9g, %.9g", s, device[s], cpu[s]);
    }
    run_ckpt_every = 0;
    cr_assert_eq(encoded_backend_live_bytes(), 0);
}

/* bf16 products read a bf16 copy of the weights, made again after every
 * change (gpt_model_weights_changed): a run saved after step 3 and resumed
 * (its copy made from the loaded weights) has the losses of a straight
 * run (its copy written by each optimizer step, gpt_model_update_bits) to
 * the bit, without a sharded optimizer, with ZeRO-1 (the copy after the
 * all-gather of the updated shards) and with ZeRO-3 (made at every gather).
 * A copy left as it was after a step changes them from step 4 (checked by
 * breaking it: no bits given to the update, the copy still taken as
 * current). */
Test(train, bf16_weights_copy_follows_every_change, .timeout = 300)
{
    const int zero_of[3] = {0, 1, 3}, dp_of[3] = {1, 2, 2};
    run_bf16 = 1;
    for (int i = 0; i < 3; i++) {
        char run_dir[700];
        snprintf(run_dir, sizeof run_dir, "%s/bf16-weights-zero%d", dir, zero_of[i]);
        double straight[8] = {0}, first[8] = {0}, rest[8] = {0};
        run_zero = zero_of[i];
        train_layout(1, 1, dp_of[i], NULL, 6, NULL, 0, 0, straight);
        train_layout(1, 1, dp_of[i], NULL, 6, run_dir, 3, 0, first);
        train_layout(1, 1, dp_of[i], NULL, 6, run_dir, 0, 1, rest);
        for (int s = 1; s <= 6; s++) {
            double got = s <= 3 ? first[s] : rest[s];
            cr_assert(straight[s] > 0 && got == straight[s],
                      "zero %d step %d: bf16 loss %.9g saved after step 3 and resumed, %.9g straight", zero_of[i], s,
                      got, straight[s]);
        }
    }
    run_zero = 0;
    run_bf16 = 0;
}

/* Sequence parallelism changes where the norms' and residuals' rows live,
 * not what is computed: the losses of the same layout without it (1e-5),
 * on the CPU and through the device seam (the staged all-gather and
 * reduce-scatter of device data); a checkpoint written with it resumes
 * without it. */
Test(train, sequence_parallelism_trains_as_without_it, .timeout = 300)
{
    const int layouts[3][3] = {{2, 1, 1}, {2, 2, 1}, {2, 1, 2}};
    for (int i = 0; i < 3; i++) {
        const int *l = layouts[i];
        double plain[8] = {0}, split[8] = {0}, device[8] = {0};
        train_layout_sp(l[0], l[1], l[2], NULL, 5, NULL, 0, 0, 0, plain);
        train_layout_sp(l[0], l[1], l[2], NULL, 5, NULL, 0, 0, 1, split);
        train_layout_sp(l[0], l[1], l[2], encoded_backend(), 5, NULL, 0, 0, 1, device);
        for (int s = 1; s <= 5; s++) {
            cr_assert(plain[s] > 0 && fabs(split[s] - plain[s]) <= 1e-5 * plain[s],
                      "tp%d pp%d dp%d step %d: loss %.9g with sequence parallelism, %.9g without", l[0], l[1], l[2], s,
                      split[s], plain[s]);
            cr_assert(device[s] == split[s], "tp%d pp%d dp%d step %d: %.9g through the device seam, %.9g on the CPU",
                      l[0], l[1], l[2], s, device[s], split[s]);
        }
    }
    cr_assert_eq(encoded_backend_live_bytes(), 0);
    char run_dir[700];
    snprintf(run_dir, sizeof run_dir, "%s/sp", dir);
    double straight[8] = {0}, first[8] = {0}, rest[8] = {0};
    train_layout_sp(2, 1, 1, NULL, 6, NULL, 0, 0, 1, straight);
    train_layout_sp(2, 1, 1, NULL, 6, run_dir, 3, 0, 1, first);
    train_layout_sp(2, 1, 1, NULL, 6, run_dir, 0, 1, 0, rest);
    for (int s = 1; s <= 6; s++) {
        double got = s <= 3 ? first[s] : rest[s];
        cr_assert(fabs(got - straight[s]) <= 1e-5 * straight[s], "step %d: %.9g saved with, resumed without, %.9g",
                  s, got, straight[s]);
    }
}

/* The interleaved schedule changes the order of the micro-batches' work,
 * not what is computed: at 4 layers, (pp 2, V 2) has the losses of pp 1
 * and of 1F1B at pp 2 (1e-5; the gradients add up in another order), with
 * tensor and sequence parallelism too, and through the device seam bit for
 * bit; a checkpoint written at (pp 2, V 2) resumes at pp 1 and at (pp 2,
 * V 1), and one written at pp 1 resumes at (pp 2, V 2). */
Test(train, the_interleaved_schedule_trains_as_1f1b, .timeout = 300)
{
    run_layers = 4;
    run_one_sequence = 1; /* micro-batches a step a multiple of pp at dp 2 */
    double alone[8] = {0}, one_f_one_b[8] = {0}, interleaved[8] = {0}, device[8] = {0}, tensor[8] = {0},
           data[8] = {0};
    run_virtual_stages = 1;
    train_layout(1, 1, 1, NULL, 5, NULL, 0, 0, alone);
    train_layout(1, 2, 1, NULL, 5, NULL, 0, 0, one_f_one_b);
    run_virtual_stages = 2;
    train_layout(1, 2, 1, NULL, 5, NULL, 0, 0, interleaved);
    train_layout(1, 2, 1, encoded_backend(), 5, NULL, 0, 0, device);
    train_layout_sp(2, 2, 1, NULL, 5, NULL, 0, 0, 1, tensor);
    train_layout(2, 2, 2, NULL, 5, NULL, 0, 0, data);
    for (int s = 1; s <= 5; s++) {
        cr_assert(alone[s] > 0 && fabs(one_f_one_b[s] - alone[s]) <= 1e-5 * alone[s]);
        cr_assert(fabs(interleaved[s] - alone[s]) <= 1e-5 * alone[s], "step %d: loss %.9g interleaved, %.9g at pp 1",
                  s, interleaved[s], alone[s]);
        cr_assert(device[s] == interleaved[s], "step %d: %.9g through the device seam, %.9g on the CPU", s, device[s],
                  interleaved[s]);
        cr_assert(fabs(tensor[s] - alone[s]) <= 1e-5 * alone[s], "step %d: %.9g at tp2 pp2 V2 with sequence "
                  "parallelism, %.9g at pp 1", s, tensor[s], alone[s]);
        cr_assert(fabs(data[s] - alone[s]) <= 1e-5 * alone[s], "step %d: %.9g at tp2 pp2 dp2 V2, %.9g at pp 1", s,
                  data[s], alone[s]);
    }
    cr_assert_eq(encoded_backend_live_bytes(), 0);
    /* Saved at (pp 2, V 2) after step 3; resumed at pp 1 and at (pp 2, V 1). */
    const struct {
        int save_pp, save_v, load_pp, load_v;
    } moves[3] = {{2, 2, 1, 1}, {2, 2, 2, 1}, {1, 1, 2, 2}};
    for (int i = 0; i < 3; i++) {
        char run_dir[700];
        snprintf(run_dir, sizeof run_dir, "%s/interleaved%d", dir, i);
        double first[8] = {0}, rest[8] = {0};
        run_virtual_stages = moves[i].save_v;
        train_layout(1, moves[i].save_pp, 1, NULL, 5, run_dir, 3, 0, first);
        run_virtual_stages = moves[i].load_v;
        train_layout(1, moves[i].load_pp, 1, NULL, 5, run_dir, 0, 1, rest);
        for (int s = 1; s <= 5; s++) {
            double got = s <= 3 ? first[s] : rest[s];
            cr_assert(fabs(got - alone[s]) <= 1e-5 * alone[s],
                      "step %d: %.9g saved at (pp %d, V %d), resumed at (pp %d, V %d); %.9g uninterrupted", s, got,
                      moves[i].save_pp, moves[i].save_v, moves[i].load_pp, moves[i].load_v, alone[s]);
        }
    }
    run_layers = 0;
    run_virtual_stages = 0;
    run_one_sequence = 0;
}

/* A sharded optimizer splits state over the data-parallel ranks, not what
 * is computed: ZeRO-1 the moments, ZeRO-3 the parameters and gradients too.
 * At each layout with dp 2 the losses of the same layout without it (1e-6:
 * the gradients' sums may add in another order), and through the device
 * seam (reduce-scatters, all-gathers, ZeRO-3's work area, the state's
 * chunks through host copies) bit for bit. Its checkpoints are the
 * format's own: saved with it after step 3, resumed without it at another
 * layout, with it at another, with the other stage, and the reverse, with
 * the losses of an uninterrupted run. */
static void check_sharded_optimizer(int stage)
{
    const int other = stage == 1 ? 3 : 1;
    const int layouts[3][3] = {{1, 1, 2}, {2, 1, 2}, {1, 2, 2}};
    for (int i = 0; i < 3; i++) {
        const int *l = layouts[i];
        double plain[8] = {0}, sharded[8] = {0}, device[8] = {0};
        run_zero = 0;
        train_layout(l[0], l[1], l[2], NULL, 5, NULL, 0, 0, plain);
        run_zero = stage;
        train_layout(l[0], l[1], l[2], NULL, 5, NULL, 0, 0, sharded);
        train_layout(l[0], l[1], l[2], encoded_backend(), 5, NULL, 0, 0, device);
        for (int s = 1; s <= 5; s++) {
            cr_assert(plain[s] > 0 && fabs(sharded[s] - plain[s]) <= 1e-6 * plain[s],
                      "tp%d pp%d dp%d step %d: loss %.9g with ZeRO-%d, %.9g without", l[0], l[1], l[2], s, sharded[s],
                      stage, plain[s]);
            cr_assert(device[s] == sharded[s], "tp%d pp%d dp%d step %d: %.9g through the device seam, %.9g on the CPU",
                      l[0], l[1], l[2], s, device[s], sharded[s]);
        }
    }
    cr_assert_eq(encoded_backend_live_bytes(), 0);
    /* The checkpoints after step 3, and after step 4 resumed from them,
     * hold the same bits on the CPU and through the device seam, and at step
     * 4 those of a run straight to step 4: what it saves and loads is the
     * state exactly (every tensor's logical digest alike). With ZeRO-1 they
     * are also the bits of a run without it: at dp 2 a gradient is the sum
     * of the same two values. ZeRO-3 sums each micro-batch's and each use's
     * gradients over the ranks before adding them up, another order: its
     * state agrees with the run without it to rounding only, which Adam
     * amplifies where a gradient is rounding alone (the key biases', whose
     * exact gradient is 0); the losses above bound it. */
    const char *saved_at[4] = {"zero-plain", "zero-sharded", "zero-device", "zero-straight"};
    for (int i = 0; i < 4; i++) {
        char run_dir[700];
        snprintf(run_dir, sizeof run_dir, "%s/%s%d", dir, saved_at[i], stage);
        double losses[8] = {0};
        run_zero = i > 0 ? stage : 0;
        const kernel_backend *k = i == 2 ? encoded_backend() : NULL;
        if (i < 3) train_layout(2, 1, 2, k, 6, run_dir, 3, 0, losses);
        train_layout(2, 1, 2, k, 6, run_dir, 4, i < 3, losses);
        if (i != 1) continue;
        /* What the first replica held in host memory for the state it read
         * at that resume: ZeRO-1, both moments whole ([2, total], as many
         * bytes as the parameters and gradients it keeps); ZeRO-3, one
         * unit's parameters and moments at a time ([3, largest unit], at
         * most three times its work area of one use, (parameter_bytes -
         * optimizer_bytes) / 2), less than the stage's state, [3, total] =
         * 3 x dp x its shard of a moment. A unit holds a view at least (at
         * tp2, the feed-forward's [ffn/2, dim] or the token table's
         * [vocab/2, dim]) and is padded to dp pieces: three fp32 copies of
         * it a multiple of 12 x dp bytes. */
        const recorder *r = &run_rank0;
        gpt_config tiny;
        cr_assert_eq(gpt_preset("tiny", &tiny), TP_OK);
        int64_t ffn = tiny.ffn ? tiny.ffn : 4 * tiny.dim, largest_view = (ffn > tiny.vocab ? ffn : tiny.vocab) / 2 * tiny.dim;
        if (stage == 1)
            cr_assert_eq(r->load_state_bytes, r->parameter_bytes);
        else
            cr_assert(r->load_state_bytes >= 12 * largest_view && r->load_state_bytes % (12 * 2) == 0 &&
                          r->load_state_bytes <= 3 * (r->parameter_bytes - r->optimizer_bytes) / 2 &&
                          r->load_state_bytes < 3 * 2 * r->optimizer_bytes / 2,
                      "ZeRO-3's load held %lld bytes; it keeps %lld of parameters and gradients, %lld of moments",
                      (long long)r->load_state_bytes, (long long)r->parameter_bytes, (long long)r->optimizer_bytes);
    }
    for (int step = 3; step <= 4; step++) {
        ckpt_reader *readers[4] = {NULL};
        for (int i = 0; i < (step == 4 ? 4 : 3); i++) {
            char path[800];
            snprintf(path, sizeof path, "%s/%s%d/step_%08d", dir, saved_at[i], stage, step);
            cr_assert_eq(ckpt_reader_open(&readers[i], path, NULL), TP_OK, "%s", tp_errmsg());
        }
        /* Pairs whose bits agree: sharded and device, sharded and straight (step 4), plain and sharded (ZeRO-1). */
        const int pairs[3][2] = {{1, 2}, {1, 3}, {0, 1}};
        int tensors = ckpt_reader_num_tensors(readers[1]), moments = 0;
        for (int t = 0; t < tensors; t++) {
            const char *name = ckpt_reader_tensor(readers[1], t)->name;
            moments += strstr(name, "exp_avg") != NULL;
            for (int p = 0; p < 3; p++) {
                ckpt_reader *a = readers[pairs[p][0]], *b = readers[pairs[p][1]];
                if (!b || (p == 2 && stage != 1)) continue;
                cr_assert_eq(ckpt_reader_num_tensors(a), tensors);
                int i = ckpt_reader_find(a, name), j = ckpt_reader_find(b, name);
                cr_assert(i >= 0 && j >= 0, "%s: missing", name);
                cr_assert_eq(ckpt_reader_digest(a, i), ckpt_reader_digest(b, j), "ZeRO-%d, step %d: %s differs in %s",
                             stage, step, name, saved_at[pairs[p][1]]);
            }
        }
        cr_assert(moments > 0, "the checkpoints hold no moments");
        for (int i = 0; i < 4; i++) ckpt_reader_close(readers[i]);
    }
    run_zero = 0;
    double straight[8] = {0};
    train_layout(1, 1, 1, NULL, 6, NULL, 0, 0, straight);
    const struct {
        int save_tp, save_dp, save_zero, load_tp, load_dp, load_zero, on_device;
    } moves[4] = {{2, 2, stage, 1, 1, 0, 0},
                  {1, 2, stage, 2, 2, stage, 1},
                  {2, 1, 0, 1, 2, stage, 0},
                  {1, 2, stage, 1, 2, other, 1}};
    for (int i = 0; i < 4; i++) {
        char run_dir[700];
        snprintf(run_dir, sizeof run_dir, "%s/zero%d-%d", dir, stage, i);
        double first[8] = {0}, rest[8] = {0};
        const kernel_backend *k = moves[i].on_device ? encoded_backend() : NULL;
        run_zero = moves[i].save_zero;
        train_layout(moves[i].save_tp, 1, moves[i].save_dp, k, 6, run_dir, 3, 0, first);
        run_zero = moves[i].load_zero;
        train_layout(moves[i].load_tp, 1, moves[i].load_dp, k, 6, run_dir, 0, 1, rest);
        for (int s = 1; s <= 6; s++) {
            double got = s <= 3 ? first[s] : rest[s];
            cr_assert(fabs(got - straight[s]) <= 1e-5 * straight[s],
                      "step %d: %.9g saved at tp%d dp%d zero %d, resumed at tp%d dp%d zero %d; %.9g uninterrupted", s,
                      got, moves[i].save_tp, moves[i].save_dp, moves[i].save_zero, moves[i].load_tp, moves[i].load_dp,
                      moves[i].load_zero, straight[s]);
        }
    }
    run_zero = 0;
    cr_assert_eq(encoded_backend_live_bytes(), 0);
}

Test(train, zero1_trains_as_without_it, .timeout = 300)
{
    check_sharded_optimizer(1);
}

Test(train, zero3_trains_as_without_it, .timeout = 300)
{
    check_sharded_optimizer(3);
}

Test(train, a_device_backend_trains_as_the_cpu_bit_for_bit, .timeout = 120)
{
    double cpu[8] = {0}, device[8] = {0};
    train_layout(1, 1, 1, NULL, 5, NULL, 0, 0, cpu);
    train_layout(1, 1, 1, encoded_backend(), 5, NULL, 0, 0, device);
    for (int s = 1; s <= 5; s++)
        cr_assert(cpu[s] > 0 && device[s] == cpu[s], "step %d: loss %.9g through the device seam, %.9g on the CPU", s,
                  device[s], cpu[s]);
    cr_assert_eq(encoded_backend_live_bytes(), 0, "%zu bytes of device memory not released",
                 encoded_backend_live_bytes());
}

Test(train, a_device_backend_trains_at_every_layout_through_host_copies, .timeout = 180)
{
    /* tp2pp2: TP all-reduces and pipeline messages of device data; pp2dp2:
     * the tied embedding's and the data-parallel gradient reductions. */
    const int layouts[2][3] = {{2, 2, 1}, {1, 2, 2}};
    double alone[8] = {0};
    train_layout(1, 1, 1, NULL, 5, NULL, 0, 0, alone);
    for (int i = 0; i < 2; i++) {
        double cpu[8] = {0}, device[8] = {0};
        const int *l = layouts[i];
        train_layout(l[0], l[1], l[2], NULL, 5, NULL, 0, 0, cpu);
        train_layout(l[0], l[1], l[2], encoded_backend(), 5, NULL, 0, 0, device);
        for (int s = 1; s <= 5; s++) {
            cr_assert(device[s] == cpu[s], "tp%d pp%d dp%d step %d: loss %.9g through the device seam, %.9g on the CPU",
                      l[0], l[1], l[2], s, device[s], cpu[s]);
            cr_assert(fabs(device[s] - alone[s]) <= 1e-4 * alone[s], "tp%d pp%d dp%d step %d: %.9g, %.9g alone", l[0],
                      l[1], l[2], s, device[s], alone[s]);
        }
    }
    cr_assert_eq(encoded_backend_live_bytes(), 0);
}

Test(train, checkpoints_move_between_the_device_and_the_cpu, .timeout = 180)
{
    double straight[8] = {0}, first[8] = {0}, rest[8] = {0};
    train_layout(2, 1, 1, NULL, 6, NULL, 0, 0, straight);
    /* Written from the device, resumed on the CPU; then the reverse. */
    for (int way = 0; way < 2; way++) {
        char run_dir[700];
        snprintf(run_dir, sizeof run_dir, "%s/run%d", dir, way);
        const kernel_backend *writer = way == 0 ? encoded_backend() : NULL;
        const kernel_backend *reader = way == 0 ? NULL : encoded_backend();
        memset(first, 0, sizeof first);
        memset(rest, 0, sizeof rest);
        train_layout(2, 1, 1, writer, 6, run_dir, 3, 0, first);
        train_layout(2, 1, 1, reader, 6, run_dir, 0, 1, rest);
        for (int s = 1; s <= 6; s++) {
            double got = s <= 3 ? first[s] : rest[s];
            cr_assert(got == straight[s], "%s: step %d: loss %.9g, %.9g uninterrupted",
                      way == 0 ? "device to cpu" : "cpu to device", s, got, straight[s]);
        }
    }
    cr_assert_eq(encoded_backend_live_bytes(), 0);
}

/* ------------------------------------------------------------ on a real GPU */

/* The CUDA backend against the CPU (cuBLAS sums in another order: 1e-4),
 * one GPU for every layout: ranks on threads share it. */
Test(train, the_gpu_trains_as_the_cpu_at_every_layout, .timeout = 300)
{
    if (cuda_device_count() == 0) cr_skip_test("no CUDA device");
    const kernel_backend *gpu = kernels_cuda(0);
    cr_assert_not_null(gpu, "%s", tp_errmsg());
    const int layouts[3][3] = {{1, 1, 1}, {2, 2, 1}, {1, 2, 2}};
    double cpu[8] = {0};
    train_layout(1, 1, 1, NULL, 5, NULL, 0, 0, cpu);
    for (int i = 0; i < 3; i++) {
        double device[8] = {0};
        const int *l = layouts[i];
        train_layout(l[0], l[1], l[2], gpu, 5, NULL, 0, 0, device);
        for (int s = 1; s <= 5; s++)
            cr_assert(fabs(device[s] - cpu[s]) <= 1e-4 * cpu[s], "tp%d pp%d dp%d step %d: %.9g on the GPU, %.9g on the CPU",
                      l[0], l[1], l[2], s, device[s], cpu[s]);
    }
    /* Sequence parallelism's kernels on the GPU, its gathers and reduce-scatters of device data through the
     * host-staged communicator (ranks on threads share the GPU; NCCL's: test_gpu.sh, with 2 GPUs or more). */
    double split[8] = {0};
    train_layout_sp(2, 2, 1, gpu, 5, NULL, 0, 0, 1, split);
    for (int s = 1; s <= 5; s++)
        cr_assert(fabs(split[s] - cpu[s]) <= 1e-4 * cpu[s], "tp2 pp2 with sequence parallelism, step %d: %.9g on the GPU, "
                  "%.9g on the CPU", s, split[s], cpu[s]);
    /* The interleaved schedule at (pp 2, V 2) of 4 layers, against the CPU's. */
    run_layers = 4;
    run_one_sequence = 1;
    double alone[8] = {0}, interleaved[8] = {0};
    train_layout(1, 1, 1, NULL, 5, NULL, 0, 0, alone);
    run_virtual_stages = 2;
    train_layout(1, 2, 1, gpu, 5, NULL, 0, 0, interleaved);
    run_layers = run_one_sequence = run_virtual_stages = 0;
    for (int s = 1; s <= 5; s++)
        cr_assert(fabs(interleaved[s] - alone[s]) <= 1e-4 * alone[s], "pp2 V2, step %d: %.9g on the GPU, %.9g on the CPU",
                  s, interleaved[s], alone[s]);
}

Test(train, checkpoints_move_between_the_gpu_and_the_cpu, .timeout = 300)
{
    if (cuda_device_count() == 0) cr_skip_test("no CUDA device");
    const kernel_backend *gpu = kernels_cuda(0);
    cr_assert_not_null(gpu, "%s", tp_errmsg());
    double straight[8] = {0};
    train_layout(2, 1, 1, NULL, 6, NULL, 0, 0, straight);
    for (int way = 0; way < 2; way++) {
        char run_dir[700];
        snprintf(run_dir, sizeof run_dir, "%s/gpu%d", dir, way);
        double first[8] = {0}, rest[8] = {0};
        train_layout(2, 1, 1, way == 0 ? gpu : NULL, 6, run_dir, 3, 0, first);
        train_layout(2, 1, 1, way == 0 ? NULL : gpu, 6, run_dir, 0, 1, rest);
        for (int s = 1; s <= 6; s++) {
            double got = s <= 3 ? first[s] : rest[s];
            cr_assert(fabs(got - straight[s]) <= 1e-4 * straight[s], "%s: step %d: loss %.9g, %.9g uninterrupted",
                      way == 0 ? "gpu to cpu" : "cpu to gpu", s, got, straight[s]);
        }
    }
}

/* ------------------------------------------------------------------- NCCL */

static void *make_nccl(void *arg)
{
    rank_slot *slot = arg;
    comm *device = NULL;
    slot->status = comm_nccl_create(&device, slot->c, kernels_cuda(0));
    if (!slot->status) comm_free(device);
    return NULL;
}

/* Without a GPU every rank fails alike, saying why, and none waits for
 * another (the verdict is agreed through the host communicator). */
Test(train, the_nccl_communicator_without_a_gpu_fails_on_every_rank, .timeout = 60)
{
    if (cuda_device_count() > 0) cr_skip_test("this machine has a GPU (tests/gpu/test_gpu.sh trains through NCCL)");
    rank_slot slots[4];
    memset(slots, 0, sizeof slots);
    run_ranks(2, 2, 1, make_nccl, slots);
    for (int r = 0; r < 4; r++) cr_assert_neq(slots[r].status, TP_OK, "rank %d made an NCCL communicator", r);
}

/* A group of one member (every tensor-parallel sum at tp 1) keeps device
 * data on the device: through the host, each of tiny's 2 x 5 + 1 sums a
 * micro-batch's forward and backward would cost a copy to the host and one
 * back. At tp1 the host sees only the loss: one read a step, of [3, N] for
 * each of its micro-batches (not one a micro-batch, which waits for each
 * forward to end); the losses are the CPU's bit for bit. */
Test(train, a_group_of_one_keeps_device_data_on_the_device, .timeout = 120)
{
    double cpu[8] = {0}, device[8] = {0};
    train_layout(1, 1, 1, NULL, 3, NULL, 0, 0, cpu);
    const kernel_backend *timed = kernels_timed(encoded_backend());
    cr_assert(timed, "%s", tp_errmsg());
    train_layout(1, 1, 1, timed, 3, NULL, 0, 0, device);
    for (int s = 1; s <= 3; s++) cr_assert(device[s] == cpu[s], "step %d: %.9g, %.9g on the CPU", s, device[s], cpu[s]);
    kernel_op_time times[64];
    int n = kernels_timed_read(times, 64);
    int64_t to_host = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(times[i].name, "to_host")) to_host = times[i].calls;
    }
    cr_assert_eq(to_host, 3, "3 steps of 2 micro-batches: the losses read once a step, %lld reads", (long long)to_host);
    /* More micro-batches a step than the device keeps statistics of (64):
     * read when full, the step's loss still the CPU's. */
    run_accumulate = 70;
    double many_cpu[4] = {0}, many_device[4] = {0};
    train_layout(1, 1, 1, NULL, 2, NULL, 0, 0, many_cpu);
    train_layout(1, 1, 1, encoded_backend(), 2, NULL, 0, 0, many_device);
    run_accumulate = 0;
    for (int s = 1; s <= 2; s++)
        cr_assert(many_device[s] == many_cpu[s] && many_cpu[s] > 0, "70 micro-batches, step %d: %.9g, %.9g on the CPU", s,
                  many_device[s], many_cpu[s]);
}
