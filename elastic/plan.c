/* plan.c: the layout planner (plan.h). For every (tp, pp) that fits the
 * world it finds the largest DP that keeps the global batch, the largest
 * micro-batch within the limit that divides a DP rank's share, estimates
 * memory and communication, and names the first rule a layout breaks; then
 * it picks by the preferences plan.h lists. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/dtype.h"
#include "../common/error.h"
#include "plan.h"

#define DEFAULT_MICRO_BATCH_LIMIT 8
#define GIB (1024.0 * 1024.0 * 1024.0)

/* "1.5 GiB", "12.0 MiB", "800 KiB": sizes in reasons. */
static const char *format_bytes(double bytes, char *out, size_t size)
{
    if (bytes >= GIB) snprintf(out, size, "%.2f GiB", bytes / GIB);
    else if (bytes >= 1024.0 * 1024.0) snprintf(out, size, "%.1f MiB", bytes / (1024.0 * 1024.0));
    else snprintf(out, size, "%.0f KiB", bytes / 1024.0);
    return out;
}

/* ------------------------------------------------------------- estimates */

static int64_t elements(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* Parameters each pipeline stage holds on one tensor-parallel rank (its
 * pieces, padding included); params_out has pp entries. */
static int stage_parameters(const gpt_config *model, int tp, int pp, int64_t *params_out)
{
    gpt_tensor *catalog = NULL;
    int count = 0;
    TP_TRY(gpt_catalog(model, 0, &catalog, &count));
    ckpt_layout layout = {tp, pp, 1, model->layers};
    memset(params_out, 0, (size_t)pp * sizeof *params_out);
    for (int i = 0; i < count; i++) {
        int64_t shape[CKPT_MAX_DIMS];
        ckpt_piece_shape(&catalog[i].desc, tp, shape);
        params_out[ckpt_tensor_stage(&catalog[i].desc, &layout)] += elements(shape, catalog[i].desc.ndim);
    }
    free(catalog);
    return TP_OK;
}

/* Activation bytes one micro-batch leaves per layer for the backward pass,
 * in fp32 (the trainer's activations): the estimate of Korthikanti et al.
 * (2022) for a transformer layer with tensor parallelism and no
 * recomputation, s*b*h*(10 + 24/t + 5*a*s/(h*t)) in 2-byte units, doubled for
 * 4-byte ones. s: sequence, b: micro-batch, h: dim, a: heads, t: tp. */
static double layer_activation_bytes(const gpt_config *m, int tp, int64_t micro_batch)
{
    double s = (double)m->seq, b = (double)micro_batch, h = (double)m->dim, a = (double)m->heads, t = tp;
    return 2.0 * s * b * h * (10.0 + 24.0 / t + 5.0 * a * s / (h * t));
}

int elastic_memory_estimate(const gpt_config *model, int tp, int pp, int64_t micro_batch, elastic_memory *out)
{
    memset(out, 0, sizeof *out);
    int64_t *params = calloc((size_t)pp, sizeof *params);
    if (!params) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int status = stage_parameters(model, tp, pp, params);
    size_t dtype_bytes = tp_dtype_size(model->dtype);
    /* 1F1B: stage k holds up to pp - k micro-batches' activations at once */
    for (int stage = 0; !status && stage < pp; stage++) {
        elastic_memory m;
        double p = (double)params[stage];
        m.weights = (int64_t)(p * (double)dtype_bytes) + (model->dtype == TP_FP32 ? 0 : (int64_t)(p * 4)); /* + master */
        m.gradients = (int64_t)(p * 4);
        m.optimizer = (int64_t)(p * 8); /* Adam: two fp32 moments */
        m.activations = (int64_t)(layer_activation_bytes(model, tp, micro_batch) * (double)(model->layers / pp) *
                                  (double)(pp - stage));
        m.total = m.weights + m.gradients + m.optimizer + m.activations;
        if (m.total > out->total) *out = m;
    }
    free(params);
    return status;
}

/* Bytes one rank sends per optimizer step (ring all-reduce: 2 (n-1)/n of
 * the buffer): TP, two all-reduces of the [micro_batch, seq, dim] fp32
 * activations per layer forward and two backward; PP, the activations
 * forward and their gradients backward per micro-batch; DP, the gradients of
 * the rank's parameters (fp32). */
static int64_t comm_bytes(const gpt_config *m, const elastic_layout *l, int64_t params_on_rank)
{
    double activation = (double)l->micro_batch * (double)m->seq * (double)m->dim * 4.0;
    double ring_tp = l->tp > 1 ? 2.0 * (l->tp - 1) / l->tp : 0, ring_dp = l->dp > 1 ? 2.0 * (l->dp - 1) / l->dp : 0;
    double tp_bytes = (double)l->grad_accum * (double)(m->layers / l->pp) * 4.0 * ring_tp * activation;
    double pp_bytes = l->pp > 1 ? (double)l->grad_accum * 2.0 * activation : 0;
    double dp_bytes = ring_dp * (double)params_on_rank * 4.0;
    return (int64_t)(tp_bytes + pp_bytes + dp_bytes);
}

/* ---------------------------------------------------------------- layouts */

static int64_t largest_divisor_at_most(int64_t n, int64_t limit)
{
    for (int64_t d = limit < n ? limit : n; d > 1; d--)
        if (n % d == 0) return d;
    return 1;
}

static int64_t micro_batch_limit(const elastic_plan_request *r)
{
    return r->micro_batch > 0 ? r->micro_batch : DEFAULT_MICRO_BATCH_LIMIT;
}

/* The batch split of (tp, pp) at `dp`, within memory when a limit is given:
 * the largest micro-batch that divides the share of a DP rank and fits. */
static void split_batch(const elastic_plan_request *r, elastic_layout *l, int64_t global_batch)
{
    int64_t share = global_batch / l->dp;
    l->global_batch = global_batch;
    for (int64_t m = largest_divisor_at_most(share, micro_batch_limit(r));; m = largest_divisor_at_most(share, m - 1)) {
        l->micro_batch = m;
        l->grad_accum = share / m;
        if (elastic_memory_estimate(&r->model, l->tp, l->pp, m, &l->memory) != TP_OK) {
            l->valid = 0;
            snprintf(l->reason, sizeof l->reason, "%s", tp_errmsg());
            return;
        }
        if (!r->memory_per_rank || l->memory.total <= r->memory_per_rank) return;
        if (m == 1) {
            l->valid = 0;
            char need[32], given[32];
            snprintf(l->reason, sizeof l->reason, "needs %s per rank at micro-batch 1, %s given",
                     format_bytes((double)l->memory.total, need, sizeof need),
                     format_bytes((double)r->memory_per_rank, given, sizeof given));
            return;
        }
    }
}

/* One (tp, pp): valid or the first rule it breaks. */
static void consider(const elastic_plan_request *r, int tp, int pp, elastic_layout *l)
{
    memset(l, 0, sizeof *l);
    l->tp = tp;
    l->pp = pp;
    l->valid = 1;
    if (r->ranks_per_node > 0 && (tp > r->ranks_per_node || r->ranks_per_node % tp != 0)) {
        l->valid = 0;
        snprintf(l->reason, sizeof l->reason, "tp %d does not fit in a node of %d ranks (TP stays within a node)", tp,
                 r->ranks_per_node);
        return;
    }
    if (gpt_config_check(&r->model, tp, pp) != TP_OK) {
        l->valid = 0;
        snprintf(l->reason, sizeof l->reason, "%s", tp_errmsg());
        return;
    }
    /* The largest DP that keeps the global batch exactly; with
     * allow_batch_change, every rank and the nearest lower batch instead
     * when that uses more ranks. */
    int64_t most = r->world / (tp * pp);
    l->dp = (int)largest_divisor_at_most(r->global_batch, most);
    int64_t batch = r->global_batch;
    if (r->allow_batch_change && l->dp < most && r->global_batch >= most) {
        l->dp = (int)most;
        batch = r->global_batch / most * most;
    }
    l->ranks = tp * pp * l->dp;
    split_batch(r, l, batch);
    if (!l->valid) return;
    int64_t *params = calloc((size_t)pp, sizeof *params);
    if (params && stage_parameters(&r->model, tp, pp, params) == TP_OK) {
        int64_t largest = 0;
        for (int s = 0; s < pp; s++)
            if (params[s] > largest) largest = params[s];
        l->comm_bytes_per_step = comm_bytes(&r->model, l, largest);
    }
    free(params);
}

/* Whether a is preferred to b (both valid). */
static int better(const elastic_plan_request *r, const elastic_layout *a, const elastic_layout *b)
{
    if (a->ranks != b->ranks) return a->ranks > b->ranks;
    int a_exact = a->global_batch == r->global_batch, b_exact = b->global_batch == r->global_batch;
    if (a_exact != b_exact) return a_exact;
    int a_current = a->tp == r->current_tp && a->pp == r->current_pp;
    int b_current = b->tp == r->current_tp && b->pp == r->current_pp;
    if (a_current != b_current) return a_current;
    if (a->memory.total != b->memory.total) return a->memory.total < b->memory.total;
    if (a->comm_bytes_per_step != b->comm_bytes_per_step) return a->comm_bytes_per_step < b->comm_bytes_per_step;
    return a->tp < b->tp;
}

static void explain(const elastic_plan_request *r, elastic_plan *plan)
{
    if (plan->chosen < 0) {
        int shown = 0;
        size_t used = (size_t)snprintf(plan->why, sizeof plan->why, "no layout is valid for %d ranks:", r->world);
        for (int i = 0; i < plan->count && shown < 3 && used < sizeof plan->why; i++, shown++)
            used += (size_t)snprintf(plan->why + used, sizeof plan->why - used, "%s tp%d pp%d: %s", shown ? ";" : "",
                                     plan->layouts[i].tp, plan->layouts[i].pp, plan->layouts[i].reason);
        return;
    }
    const elastic_layout *c = &plan->layouts[plan->chosen];
    char idle[64] = "all ranks used";
    if (c->ranks < r->world) snprintf(idle, sizeof idle, "%d of %d ranks idle", r->world - c->ranks, r->world);
    int current = c->tp == r->current_tp && c->pp == r->current_pp;
    char memory[32];
    snprintf(plan->why, sizeof plan->why, "%s; %s; global batch %lld %s; %s per rank", idle,
             current ? "keeps the current tp and pp"
             : r->current_tp ? "the current tp and pp use fewer ranks or do not fit"
                             : "the least memory among those using as many ranks",
             (long long)c->global_batch,
             c->global_batch == r->global_batch ? "kept" : "changed (--allow-batch-change)",
             format_bytes((double)c->memory.total, memory, sizeof memory));
}

int elastic_plan_make(const elastic_plan_request *r, elastic_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->chosen = -1;
    if (r->world < 1) return tp_fail(TP_ERR_ARG, "world %d: there must be at least one rank", r->world);
    if (r->global_batch < 1) return tp_fail(TP_ERR_ARG, "global batch %lld must be at least 1", (long long)r->global_batch);
    TP_TRY(gpt_config_check(&r->model, 1, 1));
    /* tp up to the heads, pp up to the layers, tp x pp within the world */
    int capacity = 0;
    for (int tp = 1; tp <= r->world && tp <= r->model.heads; tp++)
        for (int pp = 1; tp * pp <= r->world && pp <= r->model.layers; pp++) capacity++;
    plan->layouts = calloc((size_t)capacity, sizeof *plan->layouts);
    if (!plan->layouts) return tp_fail(TP_ERR_NOMEM, "out of memory planning for %d ranks", r->world);
    for (int tp = 1; tp <= r->world && tp <= r->model.heads; tp++)
        for (int pp = 1; tp * pp <= r->world && pp <= r->model.layers; pp++) {
            elastic_layout *l = &plan->layouts[plan->count++];
            consider(r, tp, pp, l);
            if (l->valid && (plan->chosen < 0 || better(r, l, &plan->layouts[plan->chosen])))
                plan->chosen = plan->count - 1;
        }
    if (plan->chosen >= 0) plan->batch_changed = plan->layouts[plan->chosen].global_batch != r->global_batch;
    explain(r, plan);
    return TP_OK;
}

void elastic_plan_free(elastic_plan *plan)
{
    free(plan->layouts);
    memset(plan, 0, sizeof *plan);
    plan->chosen = -1;
}

char *elastic_plan_to_json(const elastic_plan_request *r, const elastic_plan *plan)
{
    cJSON *o = cJSON_CreateObject(), *req = cJSON_AddObjectToObject(o, "request");
    cJSON_AddNumberToObject(req, "world", r->world);
    cJSON_AddNumberToObject(req, "ranks_per_node", r->ranks_per_node);
    cJSON_AddNumberToObject(req, "global_batch", (double)r->global_batch);
    cJSON_AddNumberToObject(req, "micro_batch_limit", (double)micro_batch_limit(r));
    cJSON_AddNumberToObject(req, "memory_per_rank", (double)r->memory_per_rank);
    cJSON_AddNumberToObject(req, "current_tp", r->current_tp);
    cJSON_AddNumberToObject(req, "current_pp", r->current_pp);
    cJSON_AddBoolToObject(req, "allow_batch_change", r->allow_batch_change);
    cJSON *list = cJSON_AddArrayToObject(o, "layouts");
    for (int i = 0; i < plan->count; i++) {
        const elastic_layout *l = &plan->layouts[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "tp", l->tp);
        cJSON_AddNumberToObject(e, "pp", l->pp);
        cJSON_AddBoolToObject(e, "valid", l->valid);
        if (l->valid) {
            cJSON_AddNumberToObject(e, "dp", l->dp);
            cJSON_AddNumberToObject(e, "micro_batch", (double)l->micro_batch);
            cJSON_AddNumberToObject(e, "grad_accum", (double)l->grad_accum);
            cJSON_AddNumberToObject(e, "global_batch", (double)l->global_batch);
            cJSON_AddNumberToObject(e, "ranks", l->ranks);
            cJSON *m = cJSON_AddObjectToObject(e, "memory_per_rank");
            cJSON_AddNumberToObject(m, "weights", (double)l->memory.weights);
            cJSON_AddNumberToObject(m, "gradients", (double)l->memory.gradients);
            cJSON_AddNumberToObject(m, "optimizer", (double)l->memory.optimizer);
            cJSON_AddNumberToObject(m, "activations", (double)l->memory.activations);
            cJSON_AddNumberToObject(m, "total", (double)l->memory.total);
            cJSON_AddNumberToObject(e, "comm_bytes_per_step", (double)l->comm_bytes_per_step);
        } else {
            cJSON_AddStringToObject(e, "reason", l->reason);
        }
        cJSON_AddItemToArray(list, e);
    }
    cJSON_AddNumberToObject(o, "chosen", plan->chosen);
    cJSON_AddBoolToObject(o, "batch_changed", plan->batch_changed);
    cJSON_AddStringToObject(o, "why", plan->why);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}
