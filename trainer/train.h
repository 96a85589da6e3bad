/* train.h: the training loop. train_run trains one rank's part of the model
 * and returns an outcome; it never prints, exits or aborts, so tp-train, a
 * test or an orchestrator can drive it. Whoever drives it owns signals and
 * the process: a stop is asked for with train_request_stop (from a signal
 * handler, another thread or a report callback), and a failure that other
 * ranks may not know of is the caller's to end (comm_abort). */
#ifndef TP_TRAIN_H
#define TP_TRAIN_H

#include <stdatomic.h>
#include <stdint.h>

#include "../model/gpt.h"
#include "comm.h"

/* A request to stop: train_run finishes the step it is in (the next one,
 * when asked between steps, as from a report), checkpoints (when it has a
 * checkpoint directory) and returns TRAIN_STOPPED. Every rank stops after
 * the same step when any rank was asked. */
typedef struct {
    atomic_int stop;
} train_control;

void train_control_init(train_control *control);
/* Async-signal-safe: a signal handler may call it. */
void train_request_stop(train_control *control);

/* What train_run tells its caller as it goes; every rank gets every report
 * (losses and norms are global, the same on every rank). */
typedef enum {
    TRAIN_REPORT_START,   /* before the first step: what is trained, how */
    TRAIN_REPORT_RESUMED, /* from the checkpoint `text` */
    TRAIN_REPORT_STEP,    /* a step is done */
    TRAIN_REPORT_SAVED,   /* the checkpoint of `step` (`text`) is committed, after that step's report */
    TRAIN_REPORT_SAVE_WAIT, /* training waits for the checkpoint of `step` to be written before it starts
                               the next one: no step comes until then, and the trainer is not hung */
    TRAIN_REPORT_WARNING, /* `text` says what went wrong and was worked around */
    TRAIN_REPORT_UPLOADED, /* rank 0, a remote --ckpt-dir: the checkpoint of `step` is uploaded to `text`
                              (`seconds`, `bytes`, `phases`) */
} train_report_kind;

typedef struct {
    train_report_kind kind;
    int64_t step, steps;        /* this step (STEP), the first to run (START), the checkpoint's (RESUMED, SAVED);
                                   of how many */
    double loss, lr, grad_norm; /* STEP */
    double seconds;             /* STEP: the step's time; RESUMED: loading (and resharding) the checkpoint;
                                   SAVED: from the save's start at its step boundary to its commit */
    double checkpoint_stall;    /* STEP: seconds the step waited on checkpointing */
    double pipeline_wait;       /* STEP: the ranks' mean idle seconds in the pipeline (waiting for messages, and
                                   after its last operation until the slowest rank's end): the pipeline's
                                   bubble, with the messages' own time; 0 at pp 1 */
    double pipeline_seconds;    /* STEP: the longest rank's seconds in the pipeline (forwards and backwards) */
    double tokens_per_second;   /* STEP */
    int64_t global_batch;       /* sequences per step */
    int64_t consumed_samples;   /* RESUMED: where the data continues */
    double loss_floor;          /* START: the synthetic data's entropy rate, or -1 */
    int optimizer_loaded;       /* RESUMED: 0 when the checkpoint held no optimizer state */
    const char *text;           /* RESUMED, SAVED, UPLOADED: the checkpoint; WARNING: the message; START: which
                                   code computes the attention (gpt_model_attention_path) */
    int64_t bytes;              /* UPLOADED; START: the activations this rank keeps for the backward (its
                                   micro-batches in flight, and sequence parallelism's two buffers); RESUMED:
                                   the host memory the reporting rank (0) held at once for a sharded
                                   optimizer's state it read (load_result's host_state_bytes) */
    int64_t optimizer_bytes;    /* START: the Adam moments this rank keeps (with a sharded optimizer, its shard's) */
    int64_t parameter_bytes;    /* START: the parameters and gradients it keeps (gpt_model_parameter_bytes) */
    /* UPLOADED: the slowest rank's seconds writing its shard (snapshot included) and uploading it (describing
     * included), and rank 0's building and uploading the index and `latest` */
    struct {
        double write, upload, index;
    } phases;
} train_report;

typedef struct {
    gpt_config config;
    int64_t micro_batch, grad_accum, steps, seq;
    double lr, min_lr, weight_decay, clip, beta1, beta2, eps;
    int64_t warmup;
    uint64_t seed;
    const char *data;     /* token files (a glob); NULL: the synthetic dataset */
    const char *ckpt_dir; /* NULL: no checkpoints; a local path or an object-store URL */
    const char *ckpt_cache; /* a remote ckpt_dir: the local directory each rank writes its shard to before
                               uploading it; any node's own (NULL: $TMPDIR/tp-train-cache-HASH) */
    int64_t ckpt_every;   /* 0: at the end and on a stop request only */
    int sync_save;        /* write checkpoints in the foreground (for comparison) */
    int resume;
    int64_t stop_at;      /* > 0: checkpoint and stop after this step, as a stop request would; a run
                             resumed at this step or past it stops before training (TRAIN_STOPPED) */
    int threads;
    const struct kernel_backend *kernels; /* where the model computes; NULL: the CPU */
    int bf16;             /* mixed precision: matrix products with bf16 operands, fp32 master weights and state */
    int sequence_parallel; /* the norm and residual regions split over the TP ranks by rows (tp > 1) */
    int zero;             /* 1: ZeRO-1, the Adam moments split over the data-parallel ranks (gradients
                             reduce-scattered, each rank updates its shard, parameters all-gathered);
                             3: ZeRO-3, the parameters and gradients as well, each layer's gathered when
                             used (trainer/zero.h) */
    int virtual_stages;   /* chunks of layers per pipeline stage, in the interleaved schedule (1, the default: one;
                             0 reads as 1) */
    const char *dump_dir; /* test hook: initial weights, batches, step-1 gradients and logits */
    train_control *control; /* NULL: no stop requests */
    void (*report)(void *ctx, const train_report *report); /* NULL: silent */
    void *report_ctx;
} train_options;

/* Defaults: the synthetic dataset, lr 3e-4 with 10% warmup, AdamW (0.9,
 * 0.95, 1e-8), weight decay 0.1, clipping at 1.0. */
void train_options_init(train_options *options);

/* Learning rate of update `step` (counted from 1): linear warmup over
 * `warmup` steps, then cosine decay to min_lr at `steps`. */
double train_lr(const train_options *options, int64_t step);

typedef enum {
    TRAIN_FINISHED, /* every step ran */
    TRAIN_STOPPED,  /* stopped by request (or --stop-at) after `step`, checkpoint committed; or, with no step
                       run (steps_run 0), resumed at or past stop_at: nothing trained, nothing saved */
    TRAIN_FAILED,   /* `reason` says why */
    TRAIN_DIVERGED, /* a failure: the gradient norm went non-finite after `step`; `reason` says what to do */
    TRAIN_IN_USE,   /* a failure: --ckpt-dir is another live run's (ckpt_run_claim_take, rank 0 knows); nothing was
                       done; `reason` names the holder */
} train_end;

typedef struct {
    train_end end;
    int64_t step;              /* the last step done (the step resumed from when none ran) */
    int64_t steps_run;
    int64_t checkpoints;       /* written during the run (all committed unless it failed) */
    char last_checkpoint[4200]; /* "" when none */
    double seconds, stall_seconds, first_loss, last_loss;
    int all_ranks_know;        /* TRAIN_FAILED, TRAIN_DIVERGED, TRAIN_IN_USE: every rank failed with it; 0: maybe only this rank, while
                                  others wait on it in a collective (the caller ends them: comm_abort) */
    int options_refused;       /* TRAIN_FAILED before any step, on every rank: this launch's options contradict the
                                  run it resumes (another model than its checkpoint's; no --data for a run on token
                                  files), as a usage error would; other failures leave it 0 */
    char reason[2048];         /* TRAIN_FAILED, TRAIN_DIVERGED, TRAIN_IN_USE */
} train_outcome;

/* Trains this rank's part. Returns TP_OK when finished or stopped, else the
 * failure's status (with tp_errmsg() equal to outcome->reason). Collective. */
int train_run(const train_options *options, comm *c, train_outcome *outcome);

#endif
