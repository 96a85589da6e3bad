/* train.h: the training loop of tp-train. */
#ifndef TP_TRAIN_H
#define TP_TRAIN_H

#include <stdint.h>

#include "comm.h"
#include "../model/gpt.h"

typedef struct {
    gpt_config config;
    int64_t micro_batch, grad_accum, steps, seq;
    double lr, min_lr, weight_decay, clip, beta1, beta2, eps;
    int64_t warmup;
    uint64_t seed;
    const char *data;     /* token files (a glob); NULL: the synthetic dataset */
    const char *ckpt_dir; /* NULL: no checkpoints */
    int64_t ckpt_every;   /* 0: at the end and on SIGTERM/SIGUSR1 only */
    int sync_save;        /* write checkpoints in the foreground (for comparison) */
    int resume;
    int64_t stop_at;      /* > 0: checkpoint and exit after this step, as a preemption would */
    const char *log_path; /* one JSON object per step */
    int threads;
    const char *dump_dir; /* test hook: initial weights, batches, step-1 gradients and logits */
    int quiet;
} train_options;

/* Defaults: the synthetic dataset, lr 3e-4 with 10% warmup, AdamW (0.9,
 * 0.95, 1e-8), weight decay 0.1, clipping at 1.0. */
void train_options_init(train_options *options);

/* Learning rate of update `step` (counted from 1): linear warmup over
 * `warmup` steps, then cosine decay to min_lr at `steps`. */
double train_lr(const train_options *options, int64_t step);

/* Runs training on this rank; returns the process exit status. */
int train_run(const train_options *options, comm *c);

#endif
