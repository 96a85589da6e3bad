/* The layout planner (elastic/plan.h) over many model shapes and world
 * sizes: whatever it calls valid follows every rule, whatever it rejects
 * breaks one, nothing valid with more ranks is passed over, the global batch
 * is kept exactly, the current layout is kept when it can be, what cannot be
 * planned says why, and the memory estimate counts what the trainer really
 * allocates (trainer/model.h, built here at every stage of a layout). */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../elastic/plan.h"
#include "../../trainer/comm.h"
#include "../../trainer/model.h"
#include "../../trainer/schedule.h"
#include "../../trainer/zero.h"
#include "../support/fixture.h"

static gpt_config preset(const char *name)
{
    gpt_config c;
    cr_assert_eq(gpt_preset(name, &c), TP_OK, "%s", tp_errmsg());
    return c;
}

/* heads, kv_heads, head width, layers: GPT-2 defaults filled. */
static gpt_config shape(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t layers)
{
    gpt_config m = {.layers = layers, .dim = heads * head_dim, .heads = heads, .kv_heads = kv_heads, .vocab = 500,
                    .seq = 64};
    gpt_config_defaults(&m);
    cr_assert_eq(gpt_config_check(&m, 1, 1), TP_OK, "%s", tp_errmsg());
    return m;
}

static elastic_plan_request request(gpt_config model, int world, int64_t global_batch)
{
    elastic_plan_request r = {0};
    r.model = model;
    r.world = world;
    r.global_batch = global_batch;
    return r;
}

static int64_t micro_limit(const elastic_plan_request *r)
{
    return r->micro_batch ? r->micro_batch : 8;
}

static int node_allows(const elastic_plan_request *r, int tp)
{
    return !r->ranks_per_node || (tp <= r->ranks_per_node && r->ranks_per_node % tp == 0);
}

/* What the rules give (tp, pp), from their definition: the ranks it can use
 * (0: none) and the global batch it keeps. Without allow_batch_change, the
 * largest dp dividing the batch; with it, every rank that fits when the batch
 * is at least as large (the batch rounded down to a multiple of dp). */
static int ranks_by_rules(const elastic_plan_request *r, int tp, int pp, int64_t *batch)
{
    if (gpt_config_check(&r->model, tp, pp) != TP_OK || !node_allows(r, tp)) return 0;
    int most = r->world / (tp * pp), dp = most;
    while (r->global_batch % dp) dp--;
    *batch = r->global_batch;
    if (r->allow_batch_change && dp < most && r->global_batch >= most) {
        dp = most;
        *batch = r->global_batch / most * most;
    }
    return tp * pp * dp;
}

/* Every rule of plan.h, checked from its definition for a layout called valid. */
static void assert_follows_rules(const elastic_plan_request *r, const elastic_layout *l)
{
    cr_assert_eq(gpt_config_check(&r->model, l->tp, l->pp), TP_OK, "tp%d pp%d: %s", l->tp, l->pp, tp_errmsg());
    cr_assert(node_allows(r, l->tp), "tp%d: TP stays within a node of %d", l->tp, r->ranks_per_node);
    cr_assert_eq(l->ranks, l->tp * l->pp * l->dp);
    cr_assert_leq(l->ranks, r->world);
    cr_assert_eq(l->micro_batch * l->grad_accum * l->dp, l->global_batch, "micro x accum x dp == global batch");
    if (!r->allow_batch_change) cr_assert_eq(l->global_batch, r->global_batch, "the global batch is kept exactly");
    else cr_assert_leq(l->global_batch, r->global_batch, "a changed batch is lower");
    cr_assert_geq(l->micro_batch, 1);
    cr_assert_leq(l->micro_batch, micro_limit(r));
    if (r->memory_per_rank) cr_assert_leq(l->memory.total, r->memory_per_rank);
    const elastic_memory *m = &l->memory;
    cr_assert_eq(m->total, m->weights + m->gradients + m->optimizer + m->snapshot + m->activations);
    cr_assert_gt(m->weights, 0);
    cr_assert_gt(m->activations, 0);
    cr_assert_geq(l->comm_bytes_per_step, 0);
    if (l->ranks > 1) cr_assert_gt(l->comm_bytes_per_step, 0, "tp%d pp%d dp%d sends nothing", l->tp, l->pp, l->dp);
}

/* Without a memory limit: dp and the micro-batch are the largest the rules allow. */
static void assert_nothing_larger(const elastic_plan_request *r, const elastic_layout *l)
{
    int64_t batch = 0;
    cr_assert_eq(l->ranks, ranks_by_rules(r, l->tp, l->pp, &batch), "tp%d pp%d: dp %d is not the largest", l->tp,
                 l->pp, l->dp);
    cr_assert_eq(l->global_batch, batch);
    int64_t share = l->global_batch / l->dp;
    for (int64_t m = l->micro_batch + 1; m <= micro_limit(r) && m <= share; m++)
        cr_assert_neq(share % m, 0, "tp%d pp%d: micro-batch %lld divides %lld too", l->tp, l->pp, (long long)m,
                      (long long)share);
}

/* A bubble over the planner's target, from plan.h's definition. */
static double bubble_over_target(const elastic_layout *l)
{
    return l->bubble > PLAN_BUBBLE_TARGET ? l->bubble - PLAN_BUBBLE_TARGET : 0;
}

/* Checks every layout of the plan against the rules and the choice against
 * brute force: the most ranks any (tp, pp) following the rules can use. */
static void check_plan(const elastic_plan_request *r)
{
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(r, &plan), TP_OK, "%s", tp_errmsg());
    int possible = 0;
    for (int tp = 1; tp <= r->world; tp++)
        for (int pp = 1; tp * pp <= r->world; pp++) {
            int64_t batch;
            int ranks = ranks_by_rules(r, tp, pp, &batch);
            if (ranks > possible) possible = ranks;
        }
    for (int i = 0; i < plan.count; i++) {
        const elastic_layout *l = &plan.layouts[i];
        if (l->valid) {
            assert_follows_rules(r, l);
            if (!r->memory_per_rank) assert_nothing_larger(r, l);
        } else {
            int64_t batch;
            cr_assert(l->reason[0], "an invalid layout says why");
            if (!r->memory_per_rank)
                cr_assert_eq(ranks_by_rules(r, l->tp, l->pp, &batch), 0, "tp%d pp%d is valid: %s", l->tp, l->pp,
                             l->reason);
        }
    }
    if (possible == 0 || r->memory_per_rank) {
        if (possible == 0) cr_assert_eq(plan.chosen, -1);
    } else {
        cr_assert_geq(plan.chosen, 0, "world %d batch %lld: %s", r->world, (long long)r->global_batch, plan.why);
        const elastic_layout *c = &plan.layouts[plan.chosen];
        cr_assert(c->valid);
        cr_assert_eq(c->ranks, possible,
                     "world %d batch %lld heads %lld layers %lld: the most ranks usable is %d, chosen uses %d", r->world,
                     (long long)r->global_batch, (long long)r->model.heads, (long long)r->model.layers, possible,
                     c->ranks);
        cr_assert_eq(plan.batch_changed, c->global_batch != r->global_batch);
        if (c->ranks == r->world) cr_assert(strstr(plan.why, "uses all"), "%s", plan.why);
        else cr_assert(strstr(plan.why, "idle"), "%s", plan.why);
        /* Unless kept as the current one, no layout as good on ranks and
         * batch idles less in a bubble over the target. */
        for (int i = 0; i < plan.count && !(c->tp == r->current_tp && c->pp == r->current_pp); i++) {
            const elastic_layout *l = &plan.layouts[i];
            if (l->valid && l->ranks == c->ranks && l->global_batch == c->global_batch)
                cr_assert_leq(bubble_over_target(c), bubble_over_target(l),
                              "world %d batch %lld: tp%d pp%d (bubble %.3f) chosen over tp%d pp%d (bubble %.3f)",
                              r->world, (long long)r->global_batch, c->tp, c->pp, c->bubble, l->tp, l->pp, l->bubble);
        }
    }
    cr_assert(plan.why[0]);
    elastic_plan_free(&plan);
}

/* ------------------------------------------------------------ properties */

Test(plan, presets_at_every_world_up_to_64)
{
    const char *names[] = {"tiny", "small", "gpt2-124m", "llama-tiny", "smollm2-135m", "tinyllama-1.1b"};
    const int64_t batches[] = {1, 6, 8, 12, 32, 48};
    for (int n = 0; n < 6; n++)
        for (int world = 1; world <= 64; world++)
            for (int b = 0; b < 6; b++) {
                elastic_plan_request r = request(preset(names[n]), world, batches[b]);
                check_plan(&r);
                r.ranks_per_node = 4;
                check_plan(&r);
                r.ranks_per_node = 6;
                r.micro_batch = 3;
                check_plan(&r);
            }
}

Test(plan, gqa_and_odd_shapes_at_every_world_up_to_64)
{
    const gpt_config models[] = {
        shape(12, 4, 16, 6), /* GQA: tp divides 4 KV heads, not only 12 heads */
        shape(8, 2, 8, 4),   /* GQA: 2 KV heads cap tp at 2 */
        shape(5, 5, 8, 5),   /* odd heads and layers */
        shape(7, 7, 8, 3),   /* prime heads */
        shape(9, 3, 8, 9),
        shape(1, 1, 32, 1), /* nothing to split: dp only */
    };
    const int64_t batches[] = {1, 7, 10, 16, 30};
    for (size_t n = 0; n < sizeof models / sizeof models[0]; n++)
        for (int world = 1; world <= 64; world++)
            for (int b = 0; b < 5; b++) {
                elastic_plan_request r = request(models[n], world, batches[b]);
                check_plan(&r);
                r.ranks_per_node = 3;
                check_plan(&r);
                r.ranks_per_node = 0;
                r.allow_batch_change = 1;
                check_plan(&r);
            }
}

Test(plan, random_shapes_follow_every_rule)
{
    seed_random(12);
    for (int i = 0; i < 400; i++) {
        gpt_config m = {0};
        int64_t head_dim = 8 * rnd(1, 4);
        m.heads = rnd(1, 16);
        m.kv_heads = m.heads % 2 == 0 && rnd(0, 1) ? m.heads / 2 : m.heads; /* GQA sometimes */
        m.dim = m.heads * head_dim;
        m.layers = rnd(1, 24);
        m.vocab = rnd(2, 1000);
        m.seq = 16 * rnd(1, 8);
        m.swiglu = rnd(0, 3) == 0;
        m.vocab_pad_multiple = rnd(1, 3) * 32;
        gpt_config_defaults(&m);
        elastic_plan_request r = request(m, (int)rnd(1, 64), rnd(1, 64));
        r.micro_batch = rnd(0, 1) ? rnd(1, 8) : 0;
        r.ranks_per_node = rnd(0, 1) ? (int)rnd(1, 8) : 0;
        r.allow_batch_change = rnd(0, 3) == 0;
        if (rnd(0, 1)) {
            r.current_tp = (int)rnd(1, 4);
            r.current_pp = (int)rnd(1, 4);
        }
        check_plan(&r);
    }
}

/* ------------------------------------------------------------- preferences */

static elastic_layout chosen_of(const elastic_plan_request *r, char *why, size_t why_size)
{
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(r, &plan), TP_OK, "%s", tp_errmsg());
    cr_assert_geq(plan.chosen, 0, "%s", plan.why);
    elastic_layout c = plan.layouts[plan.chosen];
    if (why) snprintf(why, why_size, "%s", plan.why);
    elastic_plan_free(&plan);
    return c;
}

Test(plan, keeps_the_current_layout_when_it_uses_as_many_ranks)
{
    char why[512];
    elastic_plan_request r = request(preset("small"), 8, 16);
    r.current_tp = 2;
    r.current_pp = 2;
    elastic_layout c = chosen_of(&r, why, sizeof why);
    cr_assert(c.tp == 2 && c.pp == 2 && c.dp == 2, "DP changes, TP and PP stay: tp%d pp%d dp%d", c.tp, c.pp, c.dp);
    cr_assert(strstr(why, "uses all 8 ranks") && strstr(why, "keeps the current tp2 pp2"), "%s", why);
    /* at 6 ranks tp2 pp2 uses 4, tp2 pp1 dp3 all 6: all ranks come first */
    r.world = 6;
    r.global_batch = 12;
    c = chosen_of(&r, why, sizeof why);
    cr_assert_eq(c.ranks, 6);
    cr_assert(strstr(why, "the current tp2 pp2 uses only 4 ranks"), "%s", why);
    /* a current layout that is not valid says why */
    r.current_tp = 4;
    r.current_pp = 1;
    c = chosen_of(&r, why, sizeof why);
    cr_assert(strstr(why, "the current tp4 pp1 is not valid (heads 6"), "%s", why);
}

Test(plan, without_a_current_layout_the_least_memory)
{
    elastic_plan_request r = request(preset("gpt2-124m"), 8, 32);
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    const elastic_layout *c = &plan.layouts[plan.chosen];
    for (int i = 0; i < plan.count; i++)
        if (plan.layouts[i].valid && plan.layouts[i].ranks == c->ranks)
            cr_assert_geq(plan.layouts[i].memory.total, c->memory.total, "tp%d pp%d needs less than the chosen",
                          plan.layouts[i].tp, plan.layouts[i].pp);
    cr_assert(strstr(plan.why, "the least memory"), "%s", plan.why);
    elastic_plan_free(&plan);
}

/* Memory that fits buys no time: llama-tiny at 4 ranks, batch 1, took tp2
 * pp2 (one micro-batch through two stages: each idles half the step, a
 * bubble of 100%) over tp4 pp1 for 937 KiB per rank instead of 1001 (now 929
 * and 993: the backward no longer keeps a copy of the residual gradient). */
Test(plan, a_bubble_outweighs_memory_that_fits)
{
    char why[512];
    elastic_plan_request r = request(preset("llama-tiny"), 4, 1);
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK, "%s", tp_errmsg());
    const elastic_layout *tp2pp2 = NULL, *c = &plan.layouts[plan.chosen];
    for (int i = 0; i < plan.count; i++)
        if (plan.layouts[i].tp == 2 && plan.layouts[i].pp == 2) tp2pp2 = &plan.layouts[i];
    cr_assert(tp2pp2 && tp2pp2->valid && tp2pp2->ranks == 4 && tp2pp2->grad_accum == 1);
    cr_assert_float_eq(tp2pp2->bubble, 1.0, 1e-12);
    cr_assert(c->tp == 4 && c->pp == 1 && c->bubble == 0, "tp%d pp%d: %s", c->tp, c->pp, plan.why);
    cr_assert_lt(tp2pp2->memory.total, c->memory.total, "the case: tp2 pp2 needs less");
    cr_assert(strstr(plan.why, "(tp2 pp2 needs 913 KiB but idles in a pipeline bubble of 100.0% of its compute time)"), "%s",
              plan.why);
    cr_assert_null(strstr(plan.why, "the least memory"), "%s", plan.why);
    elastic_plan_free(&plan);
    /* The current layout still comes first: a run at tp2 pp2 stays there. */
    r.current_tp = r.current_pp = 2;
    elastic_layout kept = chosen_of(&r, why, sizeof why);
    cr_assert(kept.tp == 2 && kept.pp == 2, "%s", why);
    /* A bubble within the target counts as none: 64 micro-batches at pp 2
     * (1/64) against pp 1, and the least memory decides. */
    r = request(shape(1, 1, 64, 8), 2, 64);
    r.micro_batch = 1;
    elastic_layout deep = chosen_of(&r, why, sizeof why);
    cr_assert(deep.pp == 2 && deep.bubble > 0 && deep.bubble <= PLAN_BUBBLE_TARGET, "pp%d bubble %.3f: %s", deep.pp,
              deep.bubble, why);
    cr_assert(strstr(why, "the least memory of 2 layouts as good"), "%s", why);
}

Test(plan, idle_ranks_when_the_batch_allows_no_more)
{
    /* 7 ranks, 4 heads, 2 layers, batch 8: at most 4 ranks keep the batch */
    char why[512];
    elastic_plan_request r = request(preset("tiny"), 7, 8);
    elastic_layout c = chosen_of(&r, why, sizeof why);
    cr_assert_eq(c.ranks, 4);
    cr_assert_eq(c.micro_batch * c.grad_accum * c.dp, 8);
    cr_assert(strstr(why, "uses 4 of 7 ranks, 3 idle"), "%s", why);
    /* allowing the batch to change: all 7 as dp 7, batch 7 */
    r.allow_batch_change = 1;
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    cr_assert_eq(plan.layouts[plan.chosen].ranks, 7);
    cr_assert_eq(plan.layouts[plan.chosen].global_batch, 7);
    cr_assert(plan.batch_changed);
    cr_assert(strstr(plan.why, "global batch 7 instead of 8"), "%s", plan.why);
    elastic_plan_free(&plan);
}

Test(plan, a_changed_batch_is_the_largest_below_the_request)
{
    /* 8 ranks, batch 14, 2 heads, 1 layer: tp1 dp8 would keep 8, tp2 dp4 12 */
    elastic_plan_request r = request(shape(2, 2, 16, 1), 8, 14);
    r.allow_batch_change = 1;
    elastic_layout c = chosen_of(&r, NULL, 0);
    cr_assert_eq(c.ranks, 8);
    cr_assert_eq(c.global_batch, 12, "tp%d pp%d dp%d batch %lld", c.tp, c.pp, c.dp, (long long)c.global_batch);
    /* over the current layout when that reaches less */
    char why[512];
    r.current_tp = r.current_pp = 1;
    c = chosen_of(&r, why, sizeof why);
    cr_assert_eq(c.tp, 2);
    cr_assert(strstr(why, "global batch 12 instead of 14 (allowed to change); the current tp1 pp1 reaches only "
                          "global batch 8"), "%s", why);
    /* the request kept exactly wins when it uses as many ranks */
    r.global_batch = 16;
    c = chosen_of(&r, NULL, 0);
    cr_assert_eq(c.global_batch, 16);
}

Test(plan, ranks_per_node_keeps_tp_within_a_node)
{
    elastic_plan_request r = request(preset("gpt2-124m"), 16, 32);
    r.ranks_per_node = 2;
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    int seen_exceeds = 0;
    for (int i = 0; i < plan.count; i++) {
        const elastic_layout *l = &plan.layouts[i];
        if (l->tp == 4 && l->pp == 1) {
            cr_assert(!l->valid);
            cr_assert_str_eq(l->reason, "tp 4 exceeds 2 ranks per node (TP stays within a node)");
            seen_exceeds = 1;
        }
    }
    cr_assert(seen_exceeds);
    cr_assert_leq(plan.layouts[plan.chosen].tp, 2);
    elastic_plan_free(&plan);
    r.ranks_per_node = 6; /* tp 4 fits in size but not in number: 6 ranks hold one group of 4 and 2 left over */
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    for (int i = 0; i < plan.count; i++)
        if (plan.layouts[i].tp == 4)
            cr_assert_str_eq(plan.layouts[i].reason, "tp 4 does not divide 6 ranks per node (TP stays within a node)");
    elastic_plan_free(&plan);
}

Test(plan, divisibility_reasons_name_the_numbers)
{
    elastic_plan_request r = request(preset("gpt2-124m"), 8, 8);
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    for (int i = 0; i < plan.count; i++) {
        const elastic_layout *l = &plan.layouts[i];
        if (l->tp == 8) cr_assert(strstr(l->reason, "12") && strstr(l->reason, "8"), "%s", l->reason);
        if (l->tp == 1 && l->pp == 5) cr_assert(strstr(l->reason, "12") && strstr(l->reason, "5"), "%s", l->reason);
    }
    elastic_plan_free(&plan);
}

/* ------------------------------------------------------------------ memory */

Test(plan, memory_limit_rejects_and_lowers_the_micro_batch)
{
    elastic_plan_request r = request(preset("gpt2-124m"), 8, 32);
    elastic_layout free_choice = chosen_of(&r, NULL, 0);
    r.memory_per_rank = free_choice.memory.total - 1;
    elastic_layout tight = chosen_of(&r, NULL, 0);
    cr_assert_leq(tight.memory.total, r.memory_per_rank);
    cr_assert_eq(tight.micro_batch * tight.grad_accum * tight.dp, 32);
    /* the micro-batch comes down before a layout is given up */
    r = request(preset("gpt2-124m"), 1, 8);
    elastic_layout at8 = chosen_of(&r, NULL, 0);
    r.memory_per_rank = at8.memory.total - 1;
    elastic_layout lower = chosen_of(&r, NULL, 0);
    cr_assert_lt(lower.micro_batch, at8.micro_batch);
    cr_assert_eq(lower.micro_batch * lower.grad_accum, 8);
}

Test(plan, nothing_fits_gives_no_choice_and_every_reason)
{
    elastic_plan_request r = request(preset("gpt2-124m"), 4, 32);
    r.memory_per_rank = 1 << 20; /* 1 MiB */
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    cr_assert_eq(plan.chosen, -1);
    cr_assert(strstr(plan.why, "no layout is valid for 4 ranks"), "%s", plan.why);
    cr_assert(strstr(plan.why, "tp1 pp1: needs ") && strstr(plan.why, "1.0 MiB given"), "%s", plan.why);
    for (int i = 0; i < plan.count; i++) cr_assert(!plan.layouts[i].valid);
    char *text = elastic_plan_to_json(&r, &plan);
    cJSON *o = cJSON_Parse(text);
    cr_assert_eq(cJSON_GetObjectItem(o, "chosen")->valueint, -1);
    cJSON_Delete(o);
    free(text);
    elastic_plan_free(&plan);
}

Test(plan, memory_estimate_adds_up)
{
    gpt_config m = preset("gpt2-124m");
    m.vocab_pad_multiple = 1; /* the pieces hold padding rows, the parameter count does not */
    int64_t params = 0;
    cr_assert_eq(gpt_parameter_count(&m, &params), TP_OK);
    elastic_memory one, split;
    cr_assert_eq(elastic_memory_estimate(&m, 1, 1, 1, 0, 0, 1, &one), TP_OK);
    /* fp32 at tp1 pp1: 4 bytes per parameter (the tied output once), 4 of gradient, 8 of moments */
    cr_assert_eq(one.weights, params * 4);
    cr_assert_eq(one.gradients, params * 4);
    cr_assert_eq(one.optimizer, params * 8);
    cr_assert_eq(one.snapshot, params * 12);
    cr_assert_eq(elastic_memory_estimate(&m, 4, 2, 1, 0, 0, 1, &split), TP_OK);
    cr_assert_lt(split.weights * 4, one.weights, "tp4 pp2 holds under a quarter per rank");
    elastic_memory more;
    cr_assert_eq(elastic_memory_estimate(&m, 1, 1, 4, 0, 0, 1, &more), TP_OK);
    cr_assert_eq(more.weights, one.weights);
    cr_assert_gt(more.activations, 3 * one.activations, "activations grow with the micro-batch");
    m.dtype = TP_BF16;
    elastic_memory bf16;
    cr_assert_eq(elastic_memory_estimate(&m, 1, 1, 1, 0, 0, 1, &bf16), TP_OK);
    cr_assert_eq(bf16.weights, params * 2 + params * 4, "bf16 weights and their fp32 master copy");
    cr_assert_eq(elastic_memory_estimate(&m, 5, 1, 1, 0, 0, 1, &bf16), TP_ERR_LAYOUT, "heads 12 by tp 5: %s", tp_errmsg());
}

/* floats of one slot: from its first buffer to the end of its last (trainer/model.c slot_init). */
static int64_t slot_floats_of(const gpt_model *m)
{
    const gpt_slot *s = &m->slots[0];
    return s->res2 + m->chunk_layers * m->rows * m->D - s->input;
}

/* floats of one head (last stage): from its first buffer to the end of its last. */
static int64_t head_floats_of(const gpt_model *m)
{
    if (!m->is_last) return 0;
    const gpt_head *h = &m->heads[0];
    /* Each buffer starts at 16 bytes (the device's 16-byte loads of a row of logits need it) */
    const void *buffers[] = {h->lnf, h->lnf_mean, h->lnf_rstd, h->logits, h->row_max, h->row_sum, h->target_logit,
                             h->local_max};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        cr_assert_eq((uintptr_t)buffers[i] % 16, 0, "the head's buffer %zu starts %zu bytes past 16", i,
                     (size_t)((uintptr_t)buffers[i] % 16));
    /* local_max is carved last (trainer/model.c head_init), its floats rounded up as the others' */
    return h->local_max + gpt_head_buffer_floats(m->B * m->T) - (const float *)h->lnf;
}

/* What rank (stage, tp rank 0) of (tp, pp) with V virtual stages and
 * grad_accum micro-batches a step allocates, built by the trainer with the
 * slots its schedule needs; with bf16, the trainer of bf16 mixed precision. */
static elastic_memory stage_allocation(const gpt_config *config, int tp, int pp, int V, int64_t grad_accum, int stage,
                                       int64_t micro_batch, int sp, int zero, int dp, int bf16)
{
    comm *c = NULL;
    cr_assert_eq(comm_local_create(&c), TP_OK);
    cr_assert_eq(comm_place(c, stage * tp, tp * pp * dp, tp, pp, dp), TP_OK);
    gpt_model *m = NULL;
    pipeline_op *ops;
    int64_t count;
    int slots;
    cr_assert_eq(pipeline_schedule(pp, stage, V, grad_accum, &ops, &count, &slots), TP_OK, "%s", tp_errmsg());
    pipeline_buffers buffers = pipeline_buffers_used(ops, count);
    free(ops);
    cr_assert_eq(gpt_model_create(&m, config, c, NULL, micro_batch, config->seq, slots, buffers.heads, sp, V, zero,
                                  bf16),
                 TP_OK, "%s", tp_errmsg());
    cr_assert_eq(m->num_heads, m->is_last ? buffers.heads : 0);
    elastic_memory out = {0};
    int64_t written = 0, moments = 0, N = micro_batch * config->seq;
    for (int i = 0; i < m->num_params; i++) {
        int first_writes = m->params[i].writer == 0;
        written += m->params[i].owner && (m->zero != 3 || first_writes) ? m->params[i].numel : 0;
        moments += m->params[i].owner && first_writes ? m->params[i].numel : 0;
    }
    /* model.h: params | grads | m | v, or with ZeRO-1 params | grads | a shard's m and v, or with ZeRO-3 a
     * shard of each, then the work area: params | grads of one use */
    int64_t W = m->work_floats;
    /* + with bf16 the products' bf16 copy of the weights (of the work area with ZeRO-3) */
    out.weights = 4 * (m->zero == 3 ? m->shard_len + W : m->total);
    if (m->bf16) out.weights += 2 * (m->zero == 3 ? W : m->total);
    out.gradients = 4 * (m->zero == 3 ? m->shard_len + W : m->total);
    out.optimizer = 8 * (m->zero ? m->shard_len : m->total);
    cr_assert_eq(out.weights + out.gradients, gpt_model_parameter_bytes(m));
    /* trainer/checkpoint.c: the parameters this rank writes (the owned views, or with ZeRO-3 those whose first
     * value is in its shard), m and v of those whose moments it writes */
    out.snapshot = 4 * written + 8 * moments;
    /* + d_output [rows, D] and, on a stage that sends gradients back, PIPELINE_GRAD_BUFFERS d_input [rows, D]
     * (trainer/train.c); Llama's rotary table [T, hd] and, with K < TP, the key/value gradients [K, 2 hd, D] */
    int64_t llama = (m->rope_cos_sin ? m->T * m->hd : 0) + (m->kv_grads ? 2 * config->kv_heads * m->hd * m->D : 0);
    /* + sequence parallelism's two [N, D] buffers to gather into */
    int64_t gathering = m->gathered ? 2 * N * m->D : 0;
    /* + in bf16 the residual stream's gradient's bits [rows, D], two to a float */
    int64_t residual_bits = m->residual_bits ? (m->rows * m->D + 1) / 2 : 0;
    /* The rule train.c's allocation follows, checked here on its own: gradients go back from every chunk but the
     * model's first. */
    int64_t grad_buffers = stage > 0 || V > 1 ? PIPELINE_GRAD_BUFFERS : 0;
    cr_assert_eq(buffers.grad_buffers, grad_buffers);
    out.activations = 4 * (slots * slot_floats_of(m) + m->num_heads * head_floats_of(m) + m->scratch_size + (1 + grad_buffers) * m->rows * m->D + llama +
                           gathering + residual_bits);
    out.total = out.weights + out.gradients + out.optimizer + out.snapshot + out.activations;
    gpt_model_free(m);
    comm_free(c);
    return out;
}

/* What the planner reports of (tp, pp): the stage whose allocation is the largest (the first of equals). */
static elastic_memory trainer_memory(const gpt_config *config, int tp, int pp, int V, int64_t grad_accum,
                                     int64_t micro_batch, int sp, int zero, int dp, int bf16)
{
    elastic_memory most = {0};
    for (int stage = 0; stage < pp; stage++) {
        elastic_memory m = stage_allocation(config, tp, pp, V, grad_accum, stage, micro_batch, sp, zero, dp, bf16);
        if (m.total > most.total) most = m;
    }
    return most;
}

/* tp-train --dtype bf16 (mixed precision: the model's dtype bf16 to the
 * planner, fp32 weights and bf16 activations to the trainer): the
 * activations the trainer allocates, its bf16 regions at two values an
 * element, odd counts rounded up (seq 9 at micro-batch 1); and its weights,
 * 6 bytes a value: the fp32 master and the products' bf16 copy. */
Test(plan, bf16_activations_are_what_the_trainer_allocates)
{
    const char *names[] = {"tiny", "llama-tiny", "tiny"}; /* the third with odd widths: dim 27, 3 heads of 9 */
    for (int n = 0; n < 3; n++)
        for (int tp = 1; tp <= 2; tp++)
            for (int pp = 1; pp <= 2; pp++)
                for (int sp = 0; sp <= (tp > 1); sp++)
                    for (int64_t seq = 8; seq <= 9; seq++)
                        for (int z = 0; z < 2; z++) { /* micro-batch 1 alone; micro-batch 2 with ZeRO-3 over 2 */
                            int64_t micro = z ? 2 : 1;
                            int zero = z ? 3 : 0, dp = z ? 2 : 1;
                            gpt_config config = preset(names[n]);
                            config.seq = seq;
                            if (n == 2) config.dim = 27, config.heads = config.kv_heads = 3, config.ffn = 4 * 27;
                            if (gpt_config_check(&config, tp, pp) != TP_OK || (sp && seq % tp)) continue;
                            elastic_memory trainer = trainer_memory(&config, tp, pp, 1, pp, micro, sp, zero, dp, 1);
                            int64_t most = trainer.activations, weights = trainer.weights;
                            gpt_config planned = config;
                            planned.dtype = TP_BF16;
                            elastic_memory estimate;
                            cr_assert_eq(elastic_memory_estimate(&planned, tp, pp, micro, sp, zero, dp, &estimate), TP_OK);
                            elastic_memory fp32;
                            cr_assert_eq(elastic_memory_estimate(&config, tp, pp, micro, sp, zero, dp, &fp32), TP_OK);
                            cr_assert_eq(estimate.activations, most,
                                         "%s tp%d pp%d sp%d seq %lld micro %lld zero %d: bf16 activations planned %lld, "
                                         "trainer %lld",
                                         names[n], tp, pp, sp, (long long)seq, (long long)micro, zero,
                                         (long long)estimate.activations, (long long)most);
                            cr_assert_lt(estimate.activations, fp32.activations, "bf16 activations take less than fp32");
                            cr_assert_eq(estimate.weights, weights, "%s tp%d pp%d: bf16 weights planned %lld, trainer %lld",
                                         names[n], tp, pp, (long long)estimate.weights, (long long)weights);
                        }
}

/* With ZeRO-1 over 3 ranks too: the parameters padded to 3 equal shards,
 * a shard's moments; and with ZeRO-3 over 3 ranks: each unit padded to 3
 * pieces, a shard of everything and the work area of the largest use. */
Test(plan, memory_estimate_is_what_the_trainer_allocates)
{
    const char *names[] = {"tiny", "small", "llama-tiny"}; /* llama-tiny: 2 key/value heads, untied */
    const int tps[] = {1, 2, 4}, pps[] = {1, 2}, zeros[] = {0, 1, 3}, dps[] = {1, 3, 3};
    for (int n = 0; n < 3; n++)
        for (int t = 0; t < 3; t++)
            for (int p = 0; p < 2; p++)
                for (int64_t micro = 1; micro <= 2; micro++)
                for (int sp = 0; sp <= (tps[t] > 1); sp++)
                for (int z = 0; z < 3; z++) {
                    gpt_config config = preset(names[n]);
                    config.vocab = 250; /* padding: 250 rows at tp 4 are 252 */
                    if (gpt_config_check(&config, tps[t], pps[p]) != TP_OK) continue;
                    elastic_memory estimate,
                        most = trainer_memory(&config, tps[t], pps[p], 1, pps[p], micro, sp, zeros[z], dps[z], 0);
                    cr_assert_eq(elastic_memory_estimate(&config, tps[t], pps[p], micro, sp, zeros[z], dps[z], &estimate),
                                 TP_OK);
                    cr_assert(memcmp(&estimate, &most, sizeof most) == 0,
                              "%s tp%d pp%d micro %lld sp %d zero %d dp %d: estimate weights %lld gradients %lld "
                              "optimizer %lld snapshot %lld activations %lld total %lld, trainer %lld %lld %lld %lld "
                              "%lld %lld",
                              names[n], tps[t], pps[p], (long long)micro, sp, zeros[z], dps[z], (long long)estimate.weights,
                              (long long)estimate.gradients, (long long)estimate.optimizer,
                              (long long)estimate.snapshot, (long long)estimate.activations, (long long)estimate.total,
                              (long long)most.weights, (long long)most.gradients, (long long)most.optimizer,
                              (long long)most.snapshot, (long long)most.activations, (long long)most.total);
                }
}

/* The layout chosen for r (tp2 now, with its micro-batch) under `limit`
 * bytes a rank: tp2 and the micro-batch kept, with the ZeRO stage and
 * sequence parallelism expected, and `reason` in what the plan says. */
static elastic_layout chosen_under(elastic_plan_request *r, int64_t limit, int zero, int sequence_parallel,
                                   const char *reason)
{
    char why[512];
    r->memory_per_rank = limit;
    elastic_layout c = chosen_of(r, why, sizeof why);
    cr_assert(c.tp == 2 && c.micro_batch == r->micro_batch && c.zero == zero &&
                  c.sequence_parallel == sequence_parallel,
              "limit %lld: tp%d dp%d micro %lld zero %d sp %d: %s", (long long)limit, c.tp, c.dp,
              (long long)c.micro_batch, c.zero, c.sequence_parallel, why);
    cr_assert(strstr(why, reason) != NULL, "%s", why);
    return c;
}

/* ZeRO-1 is chosen first when a layout with dp > 1 does not fit the memory
 * per rank (a dp-th of the moments for the same traffic), sequence
 * parallelism where ZeRO-1 alone does not fit, both where neither alone
 * does; none without a limit, and none at dp 1. */
Test(plan, zero1_when_memory_needs_it)
{
    gpt_config model = preset("gpt2-124m");
    elastic_memory plain, zero, split, both;
    cr_assert_eq(elastic_memory_estimate(&model, 2, 1, 4, 0, 0, 1, &plain), TP_OK);
    cr_assert_eq(elastic_memory_estimate(&model, 2, 1, 4, 0, 1, 4, &zero), TP_OK);
    cr_assert_eq(elastic_memory_estimate(&model, 2, 1, 4, 1, 0, 1, &split), TP_OK);
    cr_assert_eq(elastic_memory_estimate(&model, 2, 1, 4, 1, 1, 4, &both), TP_OK);
    cr_assert(zero.optimizer * 4 >= plain.optimizer && zero.optimizer * 4 < plain.optimizer + 64 &&
                  zero.activations == plain.activations,
              "%lld %lld", (long long)zero.optimizer, (long long)plain.optimizer);
    elastic_memory refused;
    cr_assert_eq(elastic_memory_estimate(&model, 2, 1, 4, 0, 0, 0, &refused), TP_ERR_ARG);
    /* 8 ranks, batch 32, micro-batch up to 4, tp2 pp1 now: dp 4. */
    elastic_plan_request r = request(model, 8, 32);
    r.micro_batch = 4;
    r.current_tp = 2;
    r.current_pp = 1;
    char why[512];
    elastic_layout free_run = chosen_of(&r, why, sizeof why);
    cr_assert(free_run.tp == 2 && free_run.dp == 4 && !free_run.zero && !free_run.sequence_parallel, "%s", why);
    /* Between ZeRO-1's estimate and the plain one: ZeRO-1 alone, for the same traffic. */
    int64_t limit = (zero.total + plain.total) / 2;
    cr_assert(zero.total < limit && limit < plain.total);
    elastic_layout tight = chosen_under(&r, limit, 1, 0, "with ZeRO-1 (");
    cr_assert_eq(tight.dp, 4);
    cr_assert_eq(tight.memory.total, zero.total);
    cr_assert_eq(tight.without_savings, plain.total);
    cr_assert_eq(tight.comm_bytes_per_step, free_run.comm_bytes_per_step);
    /* Under what either saves alone, over both: both. */
    int64_t either = zero.total < split.total ? zero.total : split.total;
    limit = (both.total + either) / 2;
    cr_assert(both.total < limit && limit < either);
    tight = chosen_under(&r, limit, 1, 1, "with ZeRO-1 and sequence parallelism (");
    cr_assert_eq(tight.memory.total, both.total);
    /* dp 1: nothing to shard. */
    r = request(model, 2, 8);
    r.micro_batch = 4;
    r.current_tp = 2;
    r.current_pp = 1;
    r.memory_per_rank = (zero.total + plain.total) / 2;
    elastic_layout alone = chosen_of(&r, why, sizeof why);
    cr_assert(!(alone.tp == 2 && alone.dp == 1 && alone.zero), "%s", why);
}

/* ZeRO-3 is chosen only where nothing cheaper fits: under ZeRO-1 with
 * sequence parallelism's memory; it keeps about a dp-th of the parameters
 * and gradients besides the moments, and sends more over the data-parallel
 * group (each unit gathered twice and its gradients reduce-scattered per
 * micro-batch), which the plan says. */
Test(plan, zero3_when_nothing_cheaper_fits)
{
    gpt_config model = preset("gpt2-124m");
    elastic_memory plain, both, zero3, zero3_sp;
    cr_assert_eq(elastic_memory_estimate(&model, 2, 1, 2, 0, 0, 1, &plain), TP_OK);
    cr_assert_eq(elastic_memory_estimate(&model, 2, 1, 2, 1, 1, 4, &both), TP_OK);
    cr_assert_eq(elastic_memory_estimate(&model, 2, 1, 2, 0, 3, 4, &zero3), TP_OK);
    cr_assert_eq(elastic_memory_estimate(&model, 2, 1, 2, 1, 3, 4, &zero3_sp), TP_OK);
    cr_assert_eq(elastic_memory_estimate(&model, 2, 1, 2, 0, 2, 4, &plain), TP_ERR_ARG, "no ZeRO-2");
    cr_assert_eq(elastic_memory_estimate(&model, 2, 1, 2, 0, 0, 1, &plain), TP_OK);
    /* The parameters and gradients a rank keeps: a quarter, and the largest use (the token table and the
     * position table, 20M of the 62M parameters at tp2) gathered; the moments: a quarter. At micro-batch 2
     * (at 4 the activations outweigh what ZeRO-3 saves beyond ZeRO-1 with sequence parallelism). */
    cr_assert_lt(zero3.weights, plain.weights * 3 / 5, "%lld %lld", (long long)zero3.weights, (long long)plain.weights);
    cr_assert_eq(zero3.gradients, zero3.weights);
    cr_assert(zero3.optimizer * 4 >= plain.optimizer && zero3.optimizer * 4 < plain.optimizer + 1024);
    cr_assert_lt(zero3.total, both.total);
    cr_assert_lt(zero3_sp.total, zero3.total);
    elastic_plan_request r = request(model, 8, 32);
    r.micro_batch = 2;
    r.current_tp = 2;
    r.current_pp = 1;
    char why[512];
    elastic_layout free_run = chosen_of(&r, why, sizeof why);
    elastic_layout tight = chosen_under(&r, (zero3.total + both.total) / 2, 3, 0, "with ZeRO-3 (");
    cr_assert_eq(tight.dp, 4);
    cr_assert_eq(tight.memory.total, zero3.total);
    cr_assert_gt(tight.comm_bytes_per_step, free_run.comm_bytes_per_step);
    chosen_under(&r, (zero3_sp.total + zero3.total) / 2, 3, 1, "with ZeRO-3 and sequence parallelism (");
    /* Without a current layout to keep, one that fits without ZeRO-3 comes first, however much less memory
     * ZeRO-3 leaves: here the 8 ranks at tp4 or pp2 (with ZeRO-1 or sequence parallelism if need be). */
    r.current_tp = r.current_pp = 0;
    r.memory_per_rank = (zero3.total + both.total) / 2;
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK, "%s", tp_errmsg());
    int without = 0;
    for (int i = 0; i < plan.count; i++)
        without += plan.layouts[i].valid && plan.layouts[i].ranks == 8 && plan.layouts[i].zero != 3;
    cr_assert(without > 0 && plan.chosen >= 0 && plan.layouts[plan.chosen].zero != 3, "%s", plan.why);
    elastic_plan_free(&plan);
}

/* Sequence parallelism is chosen when a layout fits the memory per rank only
 * with it, and said; not otherwise (it costs a quarter more TP traffic). */
Test(plan, sequence_parallelism_when_memory_needs_it)
{
    gpt_config model = preset("gpt2-124m");
    elastic_memory plain, split;
    cr_assert_eq(elastic_memory_estimate(&model, 4, 1, 8, 0, 0, 1, &plain), TP_OK);
    cr_assert_eq(elastic_memory_estimate(&model, 4, 1, 8, 1, 0, 1, &split), TP_OK);
    cr_assert(split.activations < plain.activations && split.weights == plain.weights, "%lld %lld",
              (long long)split.activations, (long long)plain.activations);
    cr_assert_eq(elastic_memory_estimate(&model, 1, 1, 8, 1, 0, 1, &split), TP_ERR_ARG, "tp 1 has nothing to split");
    /* 4 ranks, batch 8, micro-batch up to 8, tp4 pp1 now. */
    elastic_plan_request r = request(model, 4, 8);
    r.micro_batch = 8;
    r.current_tp = 4;
    r.current_pp = 1;
    char why[512];
    elastic_layout free_run = chosen_of(&r, why, sizeof why);
    cr_assert_eq(free_run.sequence_parallel, 0, "no memory limit: no sequence parallelism (%s)", why);
    /* A limit under what every layout needs at micro-batch 8 without it, over tp4's with it. */
    cr_assert_eq(elastic_memory_estimate(&model, 4, 1, 8, 0, 0, 1, &plain), TP_OK);
    cr_assert_eq(elastic_memory_estimate(&model, 4, 1, 8, 1, 0, 1, &split), TP_OK);
    r.memory_per_rank = (plain.total + split.total) / 2;
    elastic_layout tight = chosen_of(&r, why, sizeof why);
    cr_assert(tight.tp == 4 && tight.micro_batch == 8 && tight.sequence_parallel, "tp%d micro %lld sp %d: %s", tight.tp,
              (long long)tight.micro_batch, tight.sequence_parallel, why);
    cr_assert_eq(tight.memory.total, split.total);
    cr_assert_eq(tight.without_savings, plain.total);
    cr_assert(strstr(why, "with sequence parallelism (") != NULL, "%s", why);
    /* Its communication: more TP traffic than the same layout without it. */
    cr_assert(tight.comm_bytes_per_step > free_run.comm_bytes_per_step, "%lld %lld",
              (long long)tight.comm_bytes_per_step, (long long)free_run.comm_bytes_per_step);
}

/* The interleaved schedule is chosen where the pipeline's bubble is over
 * 5% of the step: the fewest virtual stages that bring it under, within the
 * memory per rank, its memory what the trainer allocates; not otherwise. */
Test(plan, virtual_stages_when_the_bubble_is_large)
{
    /* One head: tp 1 only. 2 ranks, batch 8 of micro-batches of 1: pp 2 (the least memory) with 8 micro-batches,
     * a bubble of 1/8; V 2 leaves 1/16 > 5%, 8 layers allow no V 3, so V 4: 1/32. */
    gpt_config model = shape(1, 1, 64, 8);
    elastic_plan_request r = request(model, 2, 8);
    r.micro_batch = 1;
    char why[512];
    elastic_layout l = chosen_of(&r, why, sizeof why);
    cr_assert(l.tp == 1 && l.pp == 2 && l.grad_accum == 8, "tp%d pp%d accum %lld: %s", l.tp, l.pp,
              (long long)l.grad_accum, why);
    cr_assert_eq(l.virtual_stages, 4, "%d: %s", l.virtual_stages, why);
    cr_assert_float_eq(l.bubble, 1.0 / 32, 1e-12);
    cr_assert_float_eq(l.bubble_one_chunk, 1.0 / 8, 1e-12);
    cr_assert(strstr(why, "interleaved over 4 virtual stages: an ideal bubble of 3.1% of the compute time instead of 12.5%"),
              "%s", why);
    /* Its memory: what the trainer allocates with V 4 at 8 micro-batches, on its largest stage. */
    elastic_memory most = trainer_memory(&model, 1, 2, 4, 8, 1, 0, 0, 1, 0);
    cr_assert(memcmp(&l.memory, &most, sizeof most) == 0, "estimate %lld, trainer %lld", (long long)l.memory.total,
              (long long)most.total);
    /* The same in bf16: the planner's bf16 activations and weights at V 4 are the trainer's too. */
    elastic_plan_request r16 = r;
    r16.model.dtype = TP_BF16;
    elastic_layout l16 = chosen_of(&r16, why, sizeof why);
    cr_assert(l16.pp == 2 && l16.virtual_stages == 4, "bf16: pp%d V%d: %s", l16.pp, l16.virtual_stages, why);
    elastic_memory most16 = trainer_memory(&model, 1, 2, 4, 8, 1, 0, 0, 1, 1);
    cr_assert_eq(l16.memory.activations, most16.activations, "bf16 at V 4: activations planned %lld, trainer %lld",
                 (long long)l16.memory.activations, (long long)most16.activations);
    cr_assert(memcmp(&l16.memory, &most16, sizeof most16) == 0, "bf16 at V 4: estimate %lld, trainer %lld",
              (long long)l16.memory.total, (long long)most16.total);
    cr_assert_lt(l16.memory.activations, l.memory.activations, "bf16 activations take less than fp32");
    /* V 2 keeps more than V 4 here (5 slots of 2 layers on stage 0 against 9 of one) and more than 1F1B (2 of
     * 4): under V 4's memory, 1F1B, with fewer pipeline messages (V each way per micro-batch), and why says so. */
    elastic_memory v2 = trainer_memory(&model, 1, 2, 2, 8, 1, 0, 0, 1, 0);
    cr_assert_gt(v2.total, l.memory.total);
    r.memory_per_rank = l.memory.total - 1;
    elastic_layout tight = chosen_of(&r, why, sizeof why);
    cr_assert(tight.pp == 2 && tight.virtual_stages == 1, "pp%d V%d: %s", tight.pp, tight.virtual_stages, why);
    cr_assert(strstr(why, "12.5% of the compute time (virtual stages would not fit"), "%s", why);
    cr_assert(tight.comm_bytes_per_step < l.comm_bytes_per_step, "%lld %lld", (long long)tight.comm_bytes_per_step,
              (long long)l.comm_bytes_per_step);
    /* Between V 4's and V 2's: V 4 (V 2 passed over). */
    r.memory_per_rank = (l.memory.total + v2.total) / 2;
    cr_assert_eq(chosen_of(&r, why, sizeof why).virtual_stages, 4, "%s", why);
    /* Batch 5: 5 micro-batches at pp 2 are not a multiple of it: 1F1B, and why says so. */
    r.memory_per_rank = 0;
    r.global_batch = 5;
    elastic_layout odd = chosen_of(&r, why, sizeof why);
    if (odd.pp == 2) {
        cr_assert_eq(odd.virtual_stages, 1);
        cr_assert(strstr(why, "the accumulation is not a multiple of pp: no virtual stages"), "%s", why);
    }
    /* A small bubble is left alone: 64 micro-batches at pp 2, 1/64 < 5%. */
    r.global_batch = 64;
    elastic_layout deep = chosen_of(&r, why, sizeof why);
    cr_assert_eq(deep.virtual_stages, 1, "%s", why);
    /* The JSON says it. */
    r.global_batch = 8;
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    char *json = elastic_plan_to_json(&r, &plan);
    cJSON *o = cJSON_Parse(json);
    cJSON *chosen = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "layouts"), plan.chosen);
    cr_assert_eq(cJSON_GetObjectItem(chosen, "virtual_stages")->valueint, 4);
    cr_assert_float_eq(cJSON_GetObjectItem(chosen, "bubble")->valuedouble, 1.0 / 32, 1e-12);
    cJSON_Delete(o);
    free(json);
    elastic_plan_free(&plan);
}

/* -------------------------------------------------------------- the rest */

Test(plan, communication_grows_with_the_degrees)
{
    elastic_plan_request r = request(preset("gpt2-124m"), 1, 8);
    elastic_layout alone = chosen_of(&r, NULL, 0);
    cr_assert_eq(alone.comm_bytes_per_step, 0, "one rank sends nothing");
    r.world = 2;
    r.current_tp = 1;
    r.current_pp = 1;
    elastic_layout dp2 = chosen_of(&r, NULL, 0);
    cr_assert_eq(dp2.dp, 2);
    /* ring all-reduce of 2: the gradients once, 4 bytes each */
    cr_assert_eq(dp2.comm_bytes_per_step, dp2.memory.gradients);
}

Test(plan, nonsense_requests_fail)
{
    elastic_plan plan;
    elastic_plan_request r = request(preset("tiny"), 0, 8);
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_ERR_ARG);
    cr_assert_eq(plan.chosen, -1);
    r = request(preset("tiny"), 4, 0);
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_ERR_ARG);
    r = request(preset("tiny"), 4, 8);
    r.micro_batch = -1;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_ERR_ARG);
    r = request(preset("tiny"), 4, 8);
    r.model.heads = 0;
    cr_assert_neq(elastic_plan_make(&r, &plan), TP_OK);
}

Test(plan, json_lists_every_layout)
{
    elastic_plan_request r = request(preset("tiny"), 7, 8);
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    char *text = elastic_plan_to_json(&r, &plan);
    cr_assert_not_null(text);
    cJSON *o = cJSON_Parse(text);
    cr_assert_not_null(o);
    const cJSON *request = cJSON_GetObjectItem(o, "request"), *layouts = cJSON_GetObjectItem(o, "layouts");
    cr_assert_eq(cJSON_GetObjectItem(request, "world")->valueint, 7);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(request, "model"), "heads")->valueint, 4);
    cr_assert_eq(cJSON_GetArraySize(layouts), plan.count);
    cr_assert_eq(cJSON_GetObjectItem(o, "chosen")->valueint, plan.chosen);
    const cJSON *c = cJSON_GetArrayItem(layouts, plan.chosen);
    cr_assert_eq(cJSON_GetObjectItem(c, "idle")->valueint, 3);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "memory_per_rank"), "total")->valuedouble,
                 (double)plan.layouts[plan.chosen].memory.total);
    cr_assert_str_eq(cJSON_GetObjectItem(o, "why")->valuestring, plan.why);
    cJSON_Delete(o);
    free(text);
    elastic_plan_free(&plan);
}
