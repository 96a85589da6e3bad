/* train.c: the training loop. Each step takes the global batch of samples
 * [consumed, consumed + global batch) (global batch = micro-batch x
 * accumulation x data-parallel degree), runs micro-batches through the
 * pipeline in the 1F1B order, sums gradients of the tied token table between
 * the first and last stages and over data-parallel replicas, clips by the
 * global norm and applies AdamW. Losses are normalized by the tokens of the
 * global batch, so any layout computes the same sums. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/memory.h"
#include "../common/progress.h"
#include "../kernels/kernels.h"
#include "checkpoint.h"
#include "data.h"
#include "model.h"
#include "train.h"

void train_options_init(train_options *o)
{
    memset(o, 0, sizeof *o);
    o->micro_batch = 4;
    o->grad_accum = 1;
    o->steps = 100;
    o->lr = 3e-4;
    o->min_lr = -1; /* lr / 10 */
    o->warmup = -1; /* steps / 10 */
    o->weight_decay = 0.1;
    o->clip = 1.0;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->seed = 1337;
    o->threads = 1;
}

double train_lr(const train_options *o, int64_t step)
{
    double min_lr = o->min_lr >= 0 ? o->min_lr : o->lr / 10;
    int64_t warmup = o->warmup >= 0 ? o->warmup : o->steps / 10;
    if (step <= warmup) return o->lr * (double)step / (double)(warmup > 0 ? warmup : 1);
    if (step >= o->steps) return min_lr;
    double progress = (double)(step - warmup) / (double)(o->steps - warmup);
    return min_lr + 0.5 * (o->lr - min_lr) * (1.0 + cos(3.141592653589793 * progress));
}

static volatile sig_atomic_t stop_requested;

static void on_signal(int signal)
{
    (void)signal;
    stop_requested = 1;
}

typedef struct {
    const train_options *o;
    comm *c;
    gpt_model *model;
    dataset *data;
    saver *saver;
    float **d_input;  /* per slot: gradient sent to the previous stage */
    float *d_output;  /* gradient received from the next stage */
    int *sample;      /* seq + 1 tokens */
    int64_t consumed; /* samples consumed before this step */
    int64_t global_batch;
    FILE *log;
    char err[1024];
    /* For the summary at exit. */
    int64_t steps_run, saves;
    double seconds, stall_seconds, first_loss, last_loss;
    char last_checkpoint[4200];
} trainer;

static int fail_with(trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail_with(trainer *t, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(t->err, sizeof t->err, fmt, args);
    va_end(args);
    return -1;
}
#define FAIL fail_with

/* Tokens and targets of micro-batch k of this replica. */
static void load_micro_batch(trainer *t, gpt_slot *slot, int64_t k)
{
    gpt_model *m = t->model;
    int64_t first = t->consumed + (int64_t)t->c->dp_rank * t->o->micro_batch * t->o->grad_accum + k * t->o->micro_batch;
    for (int64_t b = 0; b < m->B; b++) {
        dataset_sample(t->data, first + b, m->T, t->sample);
        memcpy(slot->tokens + b * m->T, t->sample, (size_t)m->T * sizeof(int));
        memcpy(slot->targets + b * m->T, t->sample + 1, (size_t)m->T * sizeof(int));
    }
}

static int forward_micro_batch(trainer *t, int64_t k)
{
    gpt_model *m = t->model;
    comm *c = t->c;
    gpt_slot *s = &m->slots[k % m->num_slots];
    int64_t n = m->B * m->T * m->D;
    if (k >= m->num_slots && c->ops->wait_sends(c)) return FAIL(t, "%s", c->error); /* slot reused */
    load_micro_batch(t, s, k);
    if (!m->is_first && c->ops->recv_prev(c, s->input, n, (int)k)) return FAIL(t, "%s", c->error);
    if (gpt_model_forward(m, s)) return FAIL(t, "%s", c->error);
    if (!m->is_last && c->ops->send_next(c, gpt_model_output(m, s), n, (int)k)) return FAIL(t, "%s", c->error);
    return 0;
}

static int backward_micro_batch(trainer *t, int64_t k)
{
    gpt_model *m = t->model;
    comm *c = t->c;
    gpt_slot *s = &m->slots[k % m->num_slots];
    int64_t n = m->B * m->T * m->D;
    float *d_input = t->d_input[k % m->num_slots];
    if (!m->is_last && c->ops->recv_next(c, t->d_output, n, (int)k)) return FAIL(t, "%s", c->error);
    float scale = 1.0f / (float)(t->global_batch * m->T);
    if (gpt_model_backward(m, s, t->d_output, d_input, scale)) return FAIL(t, "%s", c->error);
    if (!m->is_first && c->ops->send_prev(c, d_input, n, (int)k)) return FAIL(t, "%s", c->error);
    return 0;
}

/* 1F1B: stage s runs P - s - 1 forwards, then alternates one forward and one
 * backward, then drains the backwards. Returns the loss sum of this stage. */
static int run_pipeline(trainer *t, double *loss_sum)
{
    gpt_model *m = t->model;
    int64_t M = t->o->grad_accum, warmup = t->c->pp - t->c->pp_rank - 1, f = 0, b = 0;
    if (warmup > M) warmup = M;
    *loss_sum = 0;
    for (; f < warmup; f++)
        if (forward_micro_batch(t, f)) return -1;
    for (; f < M; f++, b++) {
        if (forward_micro_batch(t, f)) return -1;
        if (m->is_last) *loss_sum += m->slots[f % m->num_slots].loss_sum; /* no warmup on the last stage */
        if (backward_micro_batch(t, b)) return -1;
    }
    for (; b < M; b++)
        if (backward_micro_batch(t, b)) return -1;
    return t->c->ops->wait_sends(t->c) ? FAIL(t, "%s", t->c->error) : 0;
}

/* Gradients of the whole global batch on every rank that holds a piece: the
 * tied token table's two copies add theirs, then the data-parallel replicas. */
static int reduce_gradients(trainer *t)
{
    gpt_model *m = t->model;
    comm *c = t->c;
    if (c->pp > 1 && (m->is_first || m->is_last)) {
        param_view *w = &m->params[m->is_first ? m->wte : m->wte_out];
        if (c->ops->sum_floats(c, GROUP_EMBED, w->grad, w->numel)) return FAIL(t, "%s", c->error);
    }
    if (c->dp > 1 && c->ops->sum_floats(c, GROUP_DP, m->memory + m->total, m->total)) return FAIL(t, "%s", c->error);
    return 0;
}

/* Global norm (each stored piece counted once), clipping, AdamW. */
static int optimizer_step(trainer *t, int64_t step, double *norm_out, double *lr_out)
{
    gpt_model *m = t->model;
    comm *c = t->c;
    const train_options *o = t->o;
    double sumsq = 0;
    if (c->dp_rank == 0)
        for (int i = 0; i < m->num_params; i++) {
            const param_view *v = &m->params[i];
            if (!v->owner) continue;
            for (int64_t k = 0; k < v->numel; k++) sumsq += (double)v->grad[k] * v->grad[k];
        }
    if (c->ops->sum_doubles(c, GROUP_WORLD, &sumsq, 1)) return FAIL(t, "%s", c->error);
    float norm = (float)sqrt(sumsq);
    /* As torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when below 1. */
    float coef = (float)o->clip / (norm + 1e-6f);
    if (o->clip > 0 && coef < 1.0f)
        for (int64_t k = 0; k < m->total; k++) m->memory[m->total + k] *= coef;
    double lr = train_lr(o, step);
    for (int i = 0; i < m->num_params; i++) {
        param_view *v = &m->params[i];
        adamw_update(v->data, v->grad, v->m, v->v, v->numel, (float)lr, (float)o->beta1, (float)o->beta2,
                     (float)o->eps, v->spec->weight_decay ? (float)o->weight_decay : 0.0f, step);
    }
    *norm_out = norm;
    *lr_out = lr;
    return 0;
}

/* mkdir -p */
static int make_dirs(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static char *schedule_json(const train_options *o, int64_t step)
{
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "kind", "cosine");
    cJSON_AddNumberToObject(s, "lr", o->lr);
    cJSON_AddNumberToObject(s, "min_lr", o->min_lr >= 0 ? o->min_lr : o->lr / 10);
    cJSON_AddNumberToObject(s, "warmup", (double)(o->warmup >= 0 ? o->warmup : o->steps / 10));
    cJSON_AddNumberToObject(s, "total_steps", (double)o->steps);
    cJSON_AddNumberToObject(s, "step", (double)step);
    char *text = cJSON_PrintUnformatted(s);
    cJSON_Delete(s);
    return text;
}

static int save(trainer *t, const char *path, int64_t step, int sync, saver *with)
{
    char *schedule = schedule_json(t->o, step), user[256];
    snprintf(user, sizeof user,
             "{\"global_batch\":%lld,\"micro_batch\":%lld,\"grad_accum\":%lld,\"seq\":%lld,\"data\":\"%s\"}",
             (long long)t->global_batch, (long long)t->o->micro_batch, (long long)t->o->grad_accum,
             (long long)t->model->T, t->o->data ? "files" : "synthetic");
    save_state state = {step, t->consumed, schedule, user, t->o->seed};
    int status = saver_start(with ? with : t->saver, path, &state, sync, t->err, sizeof t->err);
    cJSON_free(schedule);
    return status;
}

static void step_path(const trainer *t, int64_t step, char *out, size_t size)
{
    snprintf(out, size, "%s/step_%08lld", t->o->ckpt_dir, (long long)step);
}

/* Test hook: the batches of every step, and at the first step the gradients
 * and the logits of the last micro-batch of replica 0 (the one the last
 * stage's slot still holds), as checkpoints an independent reader can merge
 * (tests/trainer/check_torch.py). */
static int dump_batch(trainer *t)
{
    if (t->c->rank != 0) return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/batches.bin", t->o->dump_dir);
    FILE *f = fopen(path, "ab");
    if (!f) return FAIL(t, "%s: %s", path, strerror(errno));
    for (int64_t i = 0; i < t->global_batch; i++) {
        dataset_sample(t->data, t->consumed + i, t->model->T, t->sample);
        fwrite(t->sample, sizeof(int), (size_t)t->model->T + 1, f);
    }
    return fclose(f) == 0 ? 0 : FAIL(t, "%s: %s", path, strerror(errno));
}

static int dump_logits(trainer *t)
{
    gpt_model *m = t->model;
    comm *c = t->c;
    char path[4200];
    snprintf(path, sizeof path, "%s/logits", t->o->dump_dir);
    int64_t N = m->B * m->T;
    ckpt_tensor_desc d = {.name = "dump/logits", .dtype = TP_FP32, .ndim = 2, .shape = {N, m->config.vocab},
                          .anchor = CKPT_ANCHOR_LAST};
    d.partition = (ckpt_partition){CKPT_SPLIT, 1, 0, {0}, 1, m->config.vocab_pad_multiple};
    ckpt_layout layout = {c->tp, c->pp, c->dp, m->config.layers};
    int status = 0;
    if (c->rank == 0) {
        ckpt_write_options options;
        ckpt_write_options_init(&options);
        options.overwrite = 1;
        status = ckpt_stage_prepare(path, &options);
    }
    int failed = status != 0;
    c->ops->max_ints(c, GROUP_WORLD, &failed, 1);
    if (failed) return FAIL(t, "%s: %s", path, tp_errmsg());
    if (c->dp_rank == 0) {
        ckpt_write_options options;
        ckpt_write_options_init(&options);
        options.shard_pp = c->pp_rank;
        options.shard_tp = c->tp_rank;
        ckpt_writer *w = NULL;
        int id;
        status = ckpt_writer_create(&w, path, &layout, &options);
        if (!status) status = ckpt_writer_add_tensor(w, &d, &id);
        if (!status && m->is_last) status = ckpt_writer_put_piece(w, id, c->tp_rank, m->slots[0].logits);
        if (w) status = status ? (ckpt_writer_abort(w), status) : ckpt_writer_finish(w);
    }
    failed = status != 0;
    c->ops->max_ints(c, GROUP_WORLD, &failed, 1);
    if (failed) return FAIL(t, "%s: %s", path, status ? tp_errmsg() : "another rank failed");
    if (c->rank == 0) {
        ckpt_write_options options;
        ckpt_write_options_init(&options);
        options.overwrite = 1;
        status = ckpt_commit_staged(path, &layout, NULL, &options);
    }
    failed = status != 0;
    c->ops->max_ints(c, GROUP_WORLD, &failed, 1);
    return failed ? FAIL(t, "%s: %s", path, tp_errmsg()) : 0;
}

static int dump_gradients(trainer *t)
{
    saver *grads = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/grads", t->o->dump_dir);
    if (saver_create(&grads, t->model, 1, t->err, sizeof t->err)) return -1;
    int status = save(t, path, 1, 1, grads);
    saver_free(grads);
    return status;
}

static void log_step(trainer *t, int64_t step, double loss, double lr, double norm, double seconds, double stall)
{
    double tokens = (double)(t->global_batch * t->model->T);
    if (t->c->rank != 0) return;
    if (!t->o->quiet) {
        printf("step %5lld/%lld | loss %.6f | lr %.3e | norm %.4f | %.0f tok/s | %.1f ms", (long long)step,
               (long long)t->o->steps, loss, lr, norm, tokens / seconds, seconds * 1e3);
        if (stall > 0) printf(" | checkpoint stall %.1f ms", stall * 1e3);
        printf("\n");
    }
    if (t->log) {
        fprintf(t->log,
                "{\"step\":%lld,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"tokens_per_s\":%.1f,\"ms\":%.3f,"
                "\"ckpt_stall_ms\":%.3f}\n",
                (long long)step, loss, lr, norm, tokens / seconds, seconds * 1e3, stall * 1e3);
        fflush(t->log);
    }
    fflush(stdout);
}

int train_run(const train_options *o, comm *c)
{
    trainer t;
    memset(&t, 0, sizeof t);
    t.o = o;
    t.c = c;
    t.global_batch = o->micro_batch * o->grad_accum * c->dp;
    kernels_set_threads(o->threads);
    int status = 0, slots = (int)(o->grad_accum < c->pp - c->pp_rank ? o->grad_accum : c->pp - c->pp_rank);
    char err[512];
    if (gpt_model_create(&t.model, &o->config, c, o->micro_batch, o->seq, slots, o->seed, err, sizeof err))
        status = FAIL(&t, "%s", err);
    if (!status && dataset_open(&t.data, o->data, o->config.vocab, o->seed, err, sizeof err))
        status = FAIL(&t, "%s", err);
    if (!status && o->data && dataset_tokens(t.data) <= o->seq)
        status = FAIL(&t, "%s: %lld tokens, fewer than a sequence of %lld", o->data,
                      (long long)dataset_tokens(t.data), (long long)o->seq + 1);
    if (!status && saver_create(&t.saver, t.model, 0, err, sizeof err)) status = FAIL(&t, "%s", err);
    if (!status && o->ckpt_dir) saver_prefault(t.saver);
    if (!status) {
        t.sample = malloc((size_t)(o->seq + 1) * sizeof(int));
        t.d_output = alloc_pages((size_t)(t.model->B * t.model->T * t.model->D) * sizeof(float));
        t.d_input = calloc((size_t)slots, sizeof *t.d_input);
        if (!t.sample || !t.d_output || !t.d_input) status = FAIL(&t, "out of memory");
        for (int s = 0; s < slots && !status; s++)
            if (!(t.d_input[s] = alloc_pages((size_t)(t.model->B * t.model->T * t.model->D) * sizeof(float))))
                status = FAIL(&t, "out of memory");
    }
    if (!status && o->ckpt_dir && c->rank == 0 && make_dirs(o->ckpt_dir))
        status = FAIL(&t, "%s: cannot create: %s", o->ckpt_dir, strerror(errno));
    int local_failed = status != 0, any = local_failed;
    c->ops->max_ints(c, GROUP_WORLD, &any, 1);
    if (any) {
        if (local_failed) fprintf(stderr, "tp-train: error: %s\n", t.err);
        goto done;
    }

    int64_t start_step = 0;
    if (o->resume && o->ckpt_dir) {
        struct stat st;
        if (stat(o->ckpt_dir, &st) == 0) {
            load_result loaded;
            if (checkpoint_load(t.model, o->ckpt_dir, 1, &loaded, t.err, sizeof t.err)) {
                if (c->rank == 0) fprintf(stderr, "tp-train: error: %s\n", t.err);
                status = -1;
                goto done;
            }
            start_step = loaded.step;
            t.consumed = loaded.consumed_samples;
            if (c->rank == 0 && !o->quiet)
                printf("resumed from %s at step %lld (%lld samples consumed)%s\n", loaded.path, (long long)start_step,
                       (long long)t.consumed, loaded.optimizer_loaded ? "" : "; no optimizer state, starting it afresh");
        } else if (c->rank == 0 && !o->quiet) {
            printf("no checkpoint in %s yet: starting from scratch\n", o->ckpt_dir);
        }
    }
    if (c->rank == 0 && o->log_path) {
        t.log = fopen(o->log_path, start_step ? "a" : "w");
        if (!t.log) fprintf(stderr, "tp-train: warning: %s: %s; not logging\n", o->log_path, strerror(errno));
    }
    if (c->rank == 0 && !o->quiet) {
        double floor = dataset_loss_floor(t.data);
        printf("training %lld-layer GPT (dim %lld, %lld heads, vocab %lld, seq %lld) at tp=%d pp=%d dp=%d: global batch "
               "%lld x %lld tokens\n",
               (long long)o->config.layers, (long long)o->config.dim, (long long)o->config.heads,
               (long long)o->config.vocab, (long long)o->seq, c->tp, c->pp, c->dp, (long long)t.global_batch,
               (long long)o->seq);
        if (floor > 0) printf("synthetic data: the loss can fall to %.4f\n", floor);
    }
    if (o->dump_dir) {
        char path[4200];
        snprintf(path, sizeof path, "%s/init", o->dump_dir);
        if (c->rank == 0) {
            mkdir(o->dump_dir, 0755);
            snprintf(path, sizeof path, "%s/batches.bin", o->dump_dir);
            remove(path);
            snprintf(path, sizeof path, "%s/init", o->dump_dir);
        }
        if (save(&t, path, 0, 1, NULL)) goto fail;
    }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_signal;
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGUSR1, &action, NULL);

    for (int64_t step = start_step + 1; step <= o->steps; step++) {
        double start = now_seconds(), loss_sum = 0, norm = 0, lr = 0;
        if (o->dump_dir && dump_batch(&t)) goto fail;
        gpt_model_zero_grads(t.model);
        if (run_pipeline(&t, &loss_sum) || reduce_gradients(&t)) goto fail;
        if (o->dump_dir && step == start_step + 1 && (dump_gradients(&t) || dump_logits(&t))) goto fail;
        saver_before_update(t.saver);
        if (optimizer_step(&t, step, &norm, &lr)) goto fail;
        /* The loss of the step: last stage, first TP rank of each replica. */
        double loss = t.model->is_last && c->tp_rank == 0 ? loss_sum : 0;
        if (c->ops->sum_doubles(c, GROUP_WORLD, &loss, 1)) goto comm_fail;
        loss /= (double)(t.global_batch * t.model->T);
        t.consumed += t.global_batch;
        /* Checkpoints: finish a pending one, start a new one, or stop on a signal. */
        int stop = stop_requested || (o->stop_at > 0 && step == o->stop_at);
        if (c->ops->max_ints(c, GROUP_WORLD, &stop, 1)) goto comm_fail;
        double stall = 0;
        if (o->ckpt_dir) {
            if (saver_poll(t.saver, stop, t.err, sizeof t.err) < 0) goto fail;
            int due = (o->ckpt_every > 0 && step % o->ckpt_every == 0) || step == o->steps || stop;
            if (due) {
                char path[4200];
                step_path(&t, step, path, sizeof path);
                if (save(&t, path, step, o->sync_save || stop, NULL)) goto fail;
                snprintf(t.last_checkpoint, sizeof t.last_checkpoint, "%s", path);
                t.saves++;
            }
            stall = saver_take_stall_seconds(t.saver);
        }
        double seconds = now_seconds() - start;
        log_step(&t, step, loss, lr, norm, seconds, stall);
        if (t.steps_run++ == 0) t.first_loss = loss;
        t.last_loss = loss;
        t.seconds += seconds;
        t.stall_seconds += stall;
        if (stop) {
            if (c->rank == 0 && !o->quiet)
                printf("stopped after step %lld%s\n", (long long)step, o->ckpt_dir ? "; checkpoint committed" : "");
            goto summary;
        }
    }
    if (o->ckpt_dir && saver_poll(t.saver, 1, t.err, sizeof t.err) < 0) goto fail;
summary:
    if (c->rank == 0 && !o->quiet && t.steps_run > 0) {
        printf("done: %lld steps in %.2f s (%.0f tokens/s), loss %.4f -> %.4f", (long long)t.steps_run, t.seconds,
               (double)(t.steps_run * t.global_batch * t.model->T) / t.seconds, t.first_loss, t.last_loss);
        if (t.saves)
            printf("; %lld checkpoint%s (training stalled %.1f ms for them), last %s", (long long)t.saves,
                   t.saves == 1 ? "" : "s", t.stall_seconds * 1e3, t.last_checkpoint);
        printf("\n");
    }
    goto done;
comm_fail:
    snprintf(t.err, sizeof t.err, "%s", c->error);
fail:
    fprintf(stderr, "tp-train: error (rank %d): %s\n", c->rank, t.err);
    fflush(stderr);
    /* Other ranks may be waiting on this one in a collective: end them all. */
    if (c->world > 1) c->ops->abort(c, 1);
    status = -1;
done:
    if (t.log) fclose(t.log);
    for (int s = 0; t.d_input && s < slots; s++) free(t.d_input[s]);
    free(t.d_input);
    free(t.d_output);
    free(t.sample);
    saver_free(t.saver);
    dataset_close(t.data);
    gpt_model_free(t.model);
    return status ? 1 : 0;
}
