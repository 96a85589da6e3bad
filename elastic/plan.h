/* plan.h: choosing a layout (TP, PP, DP, micro-batch, accumulation) for the
 * ranks a run has now (docs/ELASTIC.md "Choosing a layout"). Pure functions
 * of the model's shape and the capacity: `tp-elastic plan` prints what they
 * find, `tp-elastic run` relaunches with what they pick.
 *
 * Rules: TP divides the heads, the KV heads and the MLP width and stays
 * within a node (TP <= ranks per node, dividing it); PP divides the layers
 * (model/gpt.h gpt_config_check decides both); the global batch is kept
 * exactly (micro_batch x grad_accum x DP == global batch); a layout must fit
 * in the memory per rank when one is given. Among the valid layouts the
 * planner prefers, in order: the most ranks used, the global batch nearest
 * the request, the current TP and PP, no ZeRO-3, the least pipeline bubble
 * over PLAN_BUBBLE_TARGET (idle time in every step, which memory that fits
 * does not buy back), the least memory per rank, the least communication,
 * the smaller TP. With allow_batch_change, a (TP, PP) whose
 * DP keeping the batch would leave ranks idle uses them all instead, at the
 * largest global batch below the request that its DP divides; a layout
 * keeping the request still wins among those using as many ranks. */
#ifndef TP_ELASTIC_PLAN_H
#define TP_ELASTIC_PLAN_H

#include <stdint.h>

#include "../model/gpt.h"

/* The pipeline bubble the planner lets be without interleaving: 5% of the
 * compute time (idle time against work: (pp - 1) / m for m micro-batches). */
#define PLAN_BUBBLE_TARGET 0.05

typedef struct {
    gpt_config model;
    int world;               /* ranks available (>= 1) */
    int ranks_per_node;      /* TP stays within a node; 0: all ranks on one node */
    int64_t global_batch;    /* sequences per optimizer step (>= 1) */
    int64_t micro_batch;     /* the largest micro-batch to use; 0: the planner's choice (up to 8) */
    int64_t memory_per_rank; /* bytes; 0: no limit */
    int current_tp, current_pp; /* the layout the run has now; 0: none */
    int allow_batch_change;  /* use ranks the global batch would leave idle, at a lower batch */
} elastic_plan_request;

/* Bytes per rank, on the rank with the most: the first pipeline stage (it
 * holds the embeddings and the most micro-batches in flight) or the last (the
 * logits and a copy of the tied token table). Counted as the trainer holds
 * them (plan.c says where): fp32 training with AdamW at the model's full
 * sequence; the vocabulary padded for tp counts here and nowhere else. */
typedef struct {
    int64_t weights;     /* parameters in their dtype, + an fp32 master copy when that is not fp32 */
    int64_t gradients;   /* fp32 */
    int64_t optimizer;   /* AdamW's two fp32 moments */
    int64_t snapshot;    /* the asynchronous checkpoint's copy of weights and moments (DP replica 0) */
    int64_t activations; /* 1F1B: the micro-batches in flight and the backward's working memory */
    int64_t total;       /* the sum of the above */
} elastic_memory;

typedef struct {
    int tp, pp, dp;
    int64_t micro_batch, grad_accum;
    int64_t global_batch;       /* micro_batch x grad_accum x dp */
    int ranks;                  /* tp x pp x dp: ranks used; world - ranks sit idle */
    elastic_memory memory;
    int64_t comm_bytes_per_step; /* sent per step by the rank that sends most: TP all-reduces, PP sends,
                                    the tied embedding's gradient, DP gradient all-reduce */
    int64_t without_savings;    /* bytes per rank it would need without ZeRO-1 and sequence parallelism (when
                                   either is chosen) */
    int zero;                   /* tp-train --zero 1: chosen first when the layout does not fit the memory per
                                   rank (dp > 1: a dp-th of the moments for no more traffic); --zero 3 when
                                   nothing else fits (a dp-th of the parameters and gradients too, for about
                                   1.5 x the accumulation times the data-parallel traffic) */
    int sequence_parallel;      /* tp-train --sequence-parallel: chosen when the layout fits the memory per
                                   rank only with it (it keeps 1/tp of the norms' and residuals' rows for
                                   a quarter more TP traffic: the backward gathers the norms' outputs again),
                                   with ZeRO-1 too where that alone does not fit */
    int virtual_stages;         /* tp-train --virtual-stages (1: 1F1B): chosen where the bubble is over
                                   PLAN_BUBBLE_TARGET, the fewest that bring it under (plan.c
                                   choose_virtual_stages) */
    double bubble;              /* the ideal bubble, (pp - 1) / (V x grad_accum) of the compute time; 0 at pp 1 */
    double bubble_one_chunk;    /* the same at V = 1 */
    int valid;
    char reason[256];           /* why not valid: the first rule it breaks */
} elastic_layout;

typedef struct {
    elastic_layout *layouts; /* every (tp, pp) considered, valid or not */
    int count;
    int chosen;              /* index into layouts; -1 when none is valid */
    int batch_changed;       /* the chosen one's global batch differs from the request's */
    char why[512];           /* why the chosen one, or why none */
} elastic_plan;

/* Fills *plan (free with elastic_plan_free). Fails (TP_ERR_ARG) only on a
 * request that makes no sense (world < 1, global batch < 1, a model
 * gpt_config_check refuses at tp = pp = 1); no valid layout is a plan with
 * chosen = -1 and `why` saying so, not a failure. */
int elastic_plan_make(const elastic_plan_request *request, elastic_plan *plan);
void elastic_plan_free(elastic_plan *plan);

/* The plan as a JSON object (malloc'ed; NULL without memory). */
char *elastic_plan_to_json(const elastic_plan_request *request, const elastic_plan *plan);

/* Memory per rank of one layout: the estimate the planner uses, with every
 * stage holding as many micro-batches as 1F1B lets it (the planner also caps
 * them by the accumulation, as the trainer does). Fails as gpt_config_check
 * does on a model that does not split over (tp, pp), with TP_ERR_ARG on a
 * degree or micro-batch below 1. zero: the ZeRO stage (0: none, 1 or 3)
 * over dp data-parallel ranks (nothing is sharded at dp 1). */
int elastic_memory_estimate(const gpt_config *model, int tp, int pp, int64_t micro_batch, int sequence_parallel,
                            int zero, int dp, elastic_memory *out);

#endif
