/* The layout planner (elastic/plan.h) over many model shapes and world
 * sizes: whatever it calls valid follows every rule, nothing valid with more
 * ranks is passed over, the global batch is kept exactly, the current layout
 * is kept when it can be, and what cannot be planned says why. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../elastic/plan.h"
#include "../support/fixture.h"

static gpt_config preset(const char *name)
{
    gpt_config c;
    cr_assert_eq(gpt_preset(name, &c), TP_OK, "%s", tp_errmsg());
    return c;
}

static elastic_plan_request request(gpt_config model, int world, int64_t global_batch)
{
    elastic_plan_request r = {0};
    r.model = model;
    r.world = world;
    r.global_batch = global_batch;
    return r;
}

/* Every rule of plan.h, checked from its definition for a layout called valid. */
static void assert_follows_rules(const elastic_plan_request *r, const elastic_layout *l)
{
    cr_assert_eq(gpt_config_check(&r->model, l->tp, l->pp), TP_OK, "tp%d pp%d: %s", l->tp, l->pp, tp_errmsg());
    cr_assert_eq(l->ranks, l->tp * l->pp * l->dp);
    cr_assert_leq(l->ranks, r->world);
    cr_assert_eq(l->micro_batch * l->grad_accum * l->dp, l->global_batch);
    if (!r->allow_batch_change) cr_assert_eq(l->global_batch, r->global_batch, "the global batch is kept exactly");
    cr_assert_leq(l->micro_batch, r->micro_batch ? r->micro_batch : 8);
    if (r->ranks_per_node) {
        cr_assert_leq(l->tp, r->ranks_per_node, "TP stays within a node");
        cr_assert_eq(r->ranks_per_node % l->tp, 0);
    }
    if (r->memory_per_rank) cr_assert_leq(l->memory.total, r->memory_per_rank);
    cr_assert_eq(l->memory.total, l->memory.weights + l->memory.gradients + l->memory.optimizer + l->memory.activations);
}

/* The most ranks any (tp, pp, dp) following the rules could use, by brute force. */
static int most_ranks_possible(const elastic_plan_request *r)
{
    int best = 0;
    for (int tp = 1; tp <= r->world; tp++)
        for (int pp = 1; tp * pp <= r->world; pp++) {
            if (gpt_config_check(&r->model, tp, pp) != TP_OK) continue;
            if (r->ranks_per_node && (tp > r->ranks_per_node || r->ranks_per_node % tp)) continue;
            for (int dp = r->world / (tp * pp); dp >= 1; dp--)
                if (r->global_batch % dp == 0) {
                    if (tp * pp * dp > best) best = tp * pp * dp;
                    break;
                }
        }
    return best;
}

static void check_plan(const elastic_plan_request *r)
{
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(r, &plan), TP_OK, "%s", tp_errmsg());
    for (int i = 0; i < plan.count; i++) {
        if (plan.layouts[i].valid) assert_follows_rules(r, &plan.layouts[i]);
        else cr_assert(plan.layouts[i].reason[0], "an invalid layout says why");
    }
    int possible = most_ranks_possible(r);
    if (possible == 0) {
        cr_assert_eq(plan.chosen, -1);
    } else {
        cr_assert_geq(plan.chosen, 0, "world %d batch %lld: %s", r->world, (long long)r->global_batch, plan.why);
        cr_assert_eq(plan.layouts[plan.chosen].ranks, possible, "world %d batch %lld heads %lld layers %lld: the most "
                     "ranks usable is %d, chosen uses %d", r->world, (long long)r->global_batch,
                     (long long)r->model.heads, (long long)r->model.layers, possible, plan.layouts[plan.chosen].ranks);
    }
    cr_assert(plan.why[0]);
    elastic_plan_free(&plan);
}

Test(plan, presets_at_every_world_up_to_64)
{
    const char *names[] = {"tiny", "small", "gpt2-124m"};
    const int64_t batches[] = {1, 6, 8, 12, 32, 48};
    for (int n = 0; n < 3; n++)
        for (int world = 1; world <= 64; world++)
            for (int b = 0; b < 6; b++) {
                elastic_plan_request r = request(preset(names[n]), world, batches[b]);
                check_plan(&r);
                r.ranks_per_node = 4;
                check_plan(&r);
            }
}

Test(plan, random_shapes_follow_every_rule)
{
    seed_random(12);
    for (int i = 0; i < 300; i++) {
        gpt_config m = {0};
        int64_t head_dim = 8 * rnd(1, 4);
        m.heads = rnd(1, 16);
        m.kv_heads = m.heads % 2 == 0 && rnd(0, 1) ? m.heads / 2 : m.heads; /* GQA sometimes */
        m.dim = m.heads * head_dim;
        m.layers = rnd(1, 24);
        m.vocab = rnd(2, 1000);
        m.seq = 16 * rnd(1, 8);
        gpt_config_defaults(&m);
        elastic_plan_request r = request(m, (int)rnd(1, 48), rnd(1, 64));
        r.micro_batch = rnd(0, 1) ? rnd(1, 8) : 0;
        r.ranks_per_node = rnd(0, 1) ? (int)rnd(1, 8) : 0;
        check_plan(&r);
    }
}

Test(plan, keeps_the_current_layout_when_it_uses_as_many_ranks)
{
    elastic_plan_request r = request(preset("small"), 8, 16);
    elastic_plan plan;
    r.current_tp = 2;
    r.current_pp = 2;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    cr_assert_eq(plan.layouts[plan.chosen].tp, 2);
    cr_assert_eq(plan.layouts[plan.chosen].pp, 2);
    cr_assert_eq(plan.layouts[plan.chosen].dp, 2, "DP changes, TP and PP stay");
    cr_assert(strstr(plan.why, "keeps the current"), "%s", plan.why);
    elastic_plan_free(&plan);
    /* at 6 ranks tp2pp2 uses 4; tp2pp1dp3 uses all 6: all ranks come first */
    r.world = 6;
    r.global_batch = 12;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    cr_assert_eq(plan.layouts[plan.chosen].ranks, 6);
    elastic_plan_free(&plan);
}

Test(plan, idle_ranks_when_the_batch_allows_no_more)
{
    /* 7 ranks, 4 heads, 2 layers, batch 8: at most 4 ranks keep the batch */
    elastic_plan_request r = request(preset("tiny"), 7, 8);
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    cr_assert_eq(plan.layouts[plan.chosen].ranks, 4);
    cr_assert(strstr(plan.why, "3 of 7 ranks idle"), "%s", plan.why);
    elastic_plan_free(&plan);
    /* allowing the batch to change: all 7 as dp7, batch 7 */
    r.allow_batch_change = 1;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    cr_assert_eq(plan.layouts[plan.chosen].ranks, 7);
    cr_assert_eq(plan.layouts[plan.chosen].global_batch, 7);
    cr_assert(plan.batch_changed);
    elastic_plan_free(&plan);
}

Test(plan, memory_limit_rejects_and_lowers_the_micro_batch)
{
    elastic_plan_request r = request(preset("gpt2-124m"), 8, 32);
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    elastic_layout free_choice = plan.layouts[plan.chosen];
    elastic_plan_free(&plan);
    r.memory_per_rank = free_choice.memory.total - 1;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    cr_assert_geq(plan.chosen, 0);
    cr_assert_leq(plan.layouts[plan.chosen].memory.total, r.memory_per_rank);
    elastic_plan_free(&plan);
    r.memory_per_rank = 1 << 20; /* 1 MiB: nothing fits */
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    cr_assert_eq(plan.chosen, -1);
    cr_assert(strstr(plan.why, "per rank"), "%s", plan.why);
    elastic_plan_free(&plan);
}

Test(plan, memory_estimate_adds_up)
{
    gpt_config m = preset("gpt2-124m");
    m.vocab_pad_multiple = 1; /* the pieces hold padding rows, the parameter count does not */
    int64_t params = 0;
    cr_assert_eq(gpt_parameter_count(&m, &params), TP_OK);
    elastic_memory one, split;
    cr_assert_eq(elastic_memory_estimate(&m, 1, 1, 1, &one), TP_OK);
    /* fp32 at tp1 pp1: weights are 4 bytes per parameter (the tied output once) */
    cr_assert_eq(one.weights, params * 4);
    cr_assert_eq(one.optimizer, 2 * one.weights);
    cr_assert_eq(elastic_memory_estimate(&m, 4, 2, 1, &split), TP_OK);
    cr_assert_lt(split.weights * 4, one.weights, "tp4 pp2 holds under a quarter per rank");
    m.dtype = TP_BF16;
    elastic_memory bf16;
    cr_assert_eq(elastic_memory_estimate(&m, 1, 1, 1, &bf16), TP_OK);
    cr_assert_eq(bf16.weights, params * 2 + params * 4, "bf16 weights and their fp32 master copy");
}

Test(plan, nonsense_requests_fail)
{
    elastic_plan plan;
    elastic_plan_request r = request(preset("tiny"), 0, 8);
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_ERR_ARG);
    r = request(preset("tiny"), 4, 0);
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_ERR_ARG);
}

Test(plan, json_lists_every_layout)
{
    elastic_plan_request r = request(preset("tiny"), 4, 8);
    elastic_plan plan;
    cr_assert_eq(elastic_plan_make(&r, &plan), TP_OK);
    char *text = elastic_plan_to_json(&r, &plan);
    cr_assert_not_null(text);
    cJSON *o = cJSON_Parse(text);
    cr_assert_not_null(o);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "layouts")), plan.count);
    cr_assert_eq(cJSON_GetObjectItem(o, "chosen")->valueint, plan.chosen);
    cJSON_Delete(o);
    free(text);
    elastic_plan_free(&plan);
}
