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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/memory.h"
#include "../common/clock.h"
#include "../kernels/kernels.h"
#include "../store/store.h"
#include "checkpoint.h"
#include "data.h"
#include "model.h"
#include "schedule.h"
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
    o->virtual_stages = 1;
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

void train_control_init(train_control *control)
{
    atomic_init(&control->stop, 0);
}

void train_request_stop(train_control *control)
{
    atomic_store(&control->stop, 1);
}

typedef struct {
    const train_options *o;
    comm *c;
    gpt_model *model;
    dataset *data;
    saver *saver;
    pipeline_op *ops; /* this stage's schedule of a step */
    int64_t num_ops;
    float *d_input[PIPELINE_GRAD_BUFFERS]; /* gradients sent to the previous stage, in turn (schedule.h) */
    float *d_output;  /* gradient received from the next stage */
    int dumping;         /* the test hook's step (dump_dir, the first): capture_logits */
    float *dumped_logits; /* its last micro-batch's logits [B*T, vocab_local], fp32 on the host (last stage) */
    double pipeline_wait; /* seconds waited for pipeline messages this step */
    double pipeline_span; /* seconds from the step's start to the end of this rank's pipeline */
    int *sample;      /* seq + 1 tokens */
    int64_t consumed; /* samples consumed before this step */
    int64_t global_batch;
    train_outcome *outcome;
    char save_dir[CKPT_PATH_MAX]; /* where checkpoints are written: ckpt_dir, or the local cache of a remote one */
    ckpt_run_claim *claim;        /* rank 0: the run directory is this run's alone while it lives */
    int last_upload_status;       /* of the upload of the newest step that ended, and its failure: */
    int64_t last_upload_step;     /* that step (0: none yet) */
    char last_upload_error[CKPT_PATH_MAX + 1200];
} trainer;

static void report(const trainer *t, train_report *r)
{
    if (!t->o->report) return;
    r->steps = t->o->steps;
    r->global_batch = t->global_batch;
    t->o->report(t->o->report_ctx, r);
}

static void warn(void *ctx, const char *text)
{
    const trainer *t = ctx;
    train_report r = {.kind = TRAIN_REPORT_WARNING, .text = text};
    report(t, &r);
}

/* Tokens and targets of micro-batch k of this replica. */
static int load_micro_batch(trainer *t, gpt_slot *slot, int64_t k)
{
    gpt_model *m = t->model;
    int64_t first = t->consumed + (int64_t)t->c->dp_rank * t->o->micro_batch * t->o->grad_accum + k * t->o->micro_batch;
    for (int64_t b = 0; b < m->B; b++) {
        TP_TRY(dataset_sample(t->data, first + b, m->T, t->sample));
        memcpy(slot->tokens + b * m->T, t->sample, (size_t)m->T * sizeof(int));
        memcpy(slot->targets + b * m->T, t->sample + 1, (size_t)m->T * sizeof(int));
    }
    return TP_OK;
}

/* The stage that sends a chunk's input (or receives its output's
 * gradient) runs it as its chunk `chunk` of: the same chunk on a
 * neighbour, or across the ring's wrap (the last stage's chunk c feeds the
 * first stage's chunk c + 1). */
static int sender_chunk_before(const comm *c, int chunk)
{
    return c->pp_rank == 0 ? chunk - 1 : chunk;
}

static int sender_chunk_after(const comm *c, int chunk)
{
    return c->pp_rank == c->pp - 1 ? chunk + 1 : chunk;
}

/* Test hook (dump_logits): the logits of the step's last micro-batch as its
 * forward leaves them, copied to the host (fp32; in bf16 their bits
 * widened: the values the cross-entropy read), before the backward writes
 * their gradient over them (kernels.h: in place). */
static int capture_logits(trainer *t, const gpt_slot *s)
{
    gpt_model *m = t->model;
    size_t count = (size_t)(m->B * m->T * m->vocab_local);
    if (!t->dumped_logits && !(t->dumped_logits = malloc(count * sizeof(float))))
        return tp_fail(TP_ERR_NOMEM, "out of memory for the logits to dump (%zu values)", count);
    if (!m->bf16) return gpt_model_to_host(m, t->dumped_logits, s->head->logits, (int64_t)count);
    uint16_t *bits = malloc(count * sizeof(uint16_t));
    int status = bits ? m->kernels->to_host(bits, s->head->logits, count * sizeof(uint16_t))
                      : tp_fail(TP_ERR_NOMEM, "out of memory for the logits to dump (%zu values)", count);
    if (!status) convert_to_f32(bits, TP_BF16, t->dumped_logits, (int64_t)count);
    free(bits);
    return status;
}

/* Seconds this rank waits for a pipeline message: the bubble, as the
 * trainer sees it (step report's pipeline_wait). */
static int timed_recv(trainer *t, comm_peer peer, float *data, int64_t n, int tag)
{
    double start = now_seconds();
    int status = comm_recv(t->c, peer, data, n, COMM_FLOAT, tag, t->model->stream);
    t->pipeline_wait += now_seconds() - start;
    return status;
}

static int forward_op(trainer *t, const pipeline_op *op)
{
    gpt_model *m = t->model;
    comm *c = t->c;
    gpt_slot *s = &m->slots[op->slot];
    int64_t n = m->rows * m->D; /* with sequence parallelism, this rank's rows go to its peer */
    int V = m->virtual_stages;
    /* The slot's output may still be on its way (schedule.h). */
    if (op->sends_done) TP_TRY(comm_wait_first_sends(c, op->sends_done, m->stream));
    /* Tokens for the embedding, targets for the loss: the model's first and last chunks alone read them. */
    if (gpt_model_chunk_is_first(m, op->chunk) || gpt_model_chunk_is_last(m, op->chunk))
        TP_TRY(load_micro_batch(t, s, op->micro));
    if (op->head >= 0) TP_TRY(gpt_model_bind_head(m, s, op->head));
    if (!gpt_model_chunk_is_first(m, op->chunk))
        TP_TRY(timed_recv(t, COMM_PREV_STAGE, s->input, n, pipeline_tag(op->micro, sender_chunk_before(c, op->chunk), V, 0)));
    TP_TRY(gpt_model_forward(m, s, op->chunk));
    if (gpt_model_chunk_is_last(m, op->chunk)) {
        if (t->dumping && op->micro == t->o->grad_accum - 1) TP_TRY(capture_logits(t, s));
    } else {
        TP_TRY(comm_send(c, COMM_NEXT_STAGE, gpt_model_output(m, s), n, COMM_FLOAT, pipeline_tag(op->micro, op->chunk, V, 0),
                         m->stream));
    }
    return TP_OK;
}

static int backward_op(trainer *t, const pipeline_op *op)
{
    gpt_model *m = t->model;
    comm *c = t->c;
    gpt_slot *s = &m->slots[op->slot];
    int64_t n = m->rows * m->D;
    int V = m->virtual_stages;
    float *d_input = op->grad_buffer >= 0 ? t->d_input[op->grad_buffer] : NULL; /* none: nothing goes back */
    if (op->sends_done) TP_TRY(comm_wait_first_sends(c, op->sends_done, m->stream)); /* d_input's last send */
    if (!gpt_model_chunk_is_last(m, op->chunk))
        TP_TRY(timed_recv(t, COMM_NEXT_STAGE, t->d_output, n, pipeline_tag(op->micro, sender_chunk_after(c, op->chunk), V, 1)));
    float scale = 1.0f / (float)(t->global_batch * m->T);
    TP_TRY(gpt_model_backward(m, s, op->chunk, t->d_output, d_input, scale));
    if (!gpt_model_chunk_is_first(m, op->chunk))
        TP_TRY(comm_send(c, COMM_PREV_STAGE, d_input, n, COMM_FLOAT, pipeline_tag(op->micro, op->chunk, V, 1), m->stream));
    return TP_OK;
}

/* The step's micro-batches through this stage in the order of its
 * schedule (schedule.h: 1F1B, or interleaved with virtual stages); their
 * losses then come from gpt_model_take_losses. */
static int run_pipeline(trainer *t)
{
    double start = now_seconds();
    t->pipeline_wait = 0;
    for (int64_t i = 0; i < t->num_ops; i++)
        TP_TRY(t->ops[i].backward ? backward_op(t, &t->ops[i]) : forward_op(t, &t->ops[i]));
    TP_TRY(comm_wait_sends(t->c, t->model->stream));
    t->pipeline_span = now_seconds() - start;
    return TP_OK;
}

/* The bubble as the trainer sees it: a rank idles in its pipeline while it
 * waits for a message, and after its last operation until the slowest rank
 * ends its own (the ideal bubble counts both: a stage's warm-up and drain).
 * The steps start together (the last one ended in collectives), so that
 * is the longest span less its own. Over the world: with dp > 1 a replica
 * also waits for the slowest one. Returns this rank's idle seconds and the
 * longest span. */
static int pipeline_idle(trainer *t, double *idle, double *longest)
{
    *longest = t->pipeline_span;
    if (t->c->pp > 1)
        TP_TRY(comm_all_reduce(t->c, GROUP_WORLD, longest, 1, COMM_DOUBLE, COMM_MAX, COMM_HOST));
    *idle = t->c->pp > 1 ? t->pipeline_wait + (*longest - t->pipeline_span) : 0;
    return TP_OK;
}

/* Gradients of the whole global batch on every rank that holds a piece: the
 * tied token table's two copies add theirs (not Llama's untied output
 * projection: a tensor of its own), then the data-parallel replicas. */
static int reduce_gradients(trainer *t)
{
    gpt_model *m = t->model;
    comm *c = t->c;
    if (c->pp > 1 && !m->config.untied_embeddings && (m->is_first || m->is_last)) {
        param_view *w = &m->params[m->is_first ? m->wte : m->wte_out];
        /* ZeRO-3: the two copies are units alone, split alike: piece by piece. */
        const zero_unit *u = &m->units[w->unit];
        TP_TRY(m->zero == 3 ? comm_all_reduce(c, GROUP_EMBED, m->shard_grads + u->at, u->piece, COMM_FLOAT, COMM_SUM,
                                              m->stream)
                            : comm_all_reduce(c, GROUP_EMBED, w->grad, w->numel, COMM_FLOAT, COMM_SUM, m->stream));
    }
    /* ZeRO-3 summed the rest over TP and the replicas after each use's backward. */
    TP_TRY(gpt_model_reduce_shared_kv(m));
    TP_TRY(gpt_model_reduce_sequence_parallel(m));
    /* ZeRO-1: each replica needs the sum of its shard alone, summed in
     * place (its gradients outside the shard are stale from here on). */
    if (m->zero == 1)
        TP_TRY(comm_reduce_scatter(c, GROUP_DP, m->memory + m->total, m->shard_grads, m->shard_len, COMM_FLOAT,
                                   m->stream));
    else if (!m->zero && c->dp > 1)
        TP_TRY(comm_all_reduce(c, GROUP_DP, m->memory + m->total, m->total, COMM_FLOAT, COMM_SUM, m->stream));
    return TP_OK;
}

/* The part of view v inside this rank's shard of a sharded optimizer:
 * elements [*first, *first + *count) of the view (the whole view without
 * one), at *in_shard in the shard; *count 0 when none. `numel`: the
 * view's leading elements considered. */
static void shard_part(const gpt_model *m, const param_view *v, int64_t numel, int64_t *first, int64_t *count,
                       int64_t *in_shard)
{
    *first = *in_shard = 0;
    *count = numel;
    if (!m->zero) return;
    const zero_unit *u = &m->units[v->unit];
    int64_t mine = u->first + m->comm->dp_rank * u->piece, end = v->flat + numel;
    int64_t lo = v->flat > mine ? v->flat : mine, hi = end < mine + u->piece ? end : mine + u->piece;
    *first = lo - v->flat;
    *count = hi > lo ? hi - lo : 0;
    *in_shard = u->at + (lo - mine);
}

/* Sum of squares of the gradients of the pieces this rank owns, in one call
 * to the backend (on a GPU, one wait instead of one per tensor); the
 * gradients of neighbouring owned pieces are adjacent in memory and make
 * one span. With a sharded optimizer, of the summed gradients of this
 * rank's shard. */
static int owned_sum_of_squares(const gpt_model *m, double *sumsq)
{
    const float **spans = malloc((size_t)(m->num_params > 0 ? m->num_params : 1) * sizeof *spans);
    int64_t *lengths = malloc((size_t)(m->num_params > 0 ? m->num_params : 1) * sizeof *lengths);
    int count = 0, status = TP_OK;
    if (!spans || !lengths) status = tp_fail(TP_ERR_NOMEM, "out of memory for the gradient norm's spans");
    for (int i = 0; !status && i < m->num_params; i++) {
        const param_view *v = &m->params[i];
        int64_t first, length, in_shard;
        shard_part(m, v, v->norm_numel, &first, &length, &in_shard);
        if (!v->owner || length == 0) continue;
        const float *grad = m->zero ? m->shard_grads + in_shard : v->grad + first;
        if (count && spans[count - 1] + lengths[count - 1] == grad) lengths[count - 1] += length;
        else spans[count] = grad, lengths[count++] = length;
    }
    if (!status) status = m->kernels->sum_of_squares(sumsq, spans, lengths, count);
    free(spans);
    free(lengths);
    return status;
}

/* AdamW on the pieces this rank updates (with a sharded optimizer, those
 * of its shard), in one call to the backend: one launch per few dozen
 * tensors on a GPU instead of one per tensor. In bf16 without ZeRO the
 * update writes the weights' bf16 copy too (gpt_model_update_bits): the
 * products' copy made in the update's pass, not in a pass of 49 launches
 * (GPT-2 124M) that reads the weights again. */
static int adamw_step(gpt_model *m, const train_options *o, double lr, int64_t step)
{
    adamw_tensor *tensors = malloc((size_t)(m->num_params > 0 ? m->num_params : 1) * sizeof *tensors);
    if (!tensors) return tp_fail(TP_ERR_NOMEM, "out of memory for the optimizer's list of tensors");
    int count = 0;
    for (int i = 0; i < m->num_params; i++) {
        param_view *v = &m->params[i];
        int64_t first, n, in_shard;
        shard_part(m, v, v->numel, &first, &n, &in_shard);
        if (n == 0) continue;
        tensors[count++] = (adamw_tensor){
            .param = m->zero ? m->shard_params + in_shard : v->data + first,
            .m = m->zero ? m->shard_m + in_shard : v->m,
            .v = m->zero ? m->shard_v + in_shard : v->v,
            .grad = m->zero ? m->shard_grads + in_shard : v->grad + first,
            .n = n,
            .weight_decay = v->spec->weight_decay ? (float)o->weight_decay : 0.0f,
            .param_bits = gpt_model_update_bits(m, i),
        };
    }
    int status = m->kernels->adamw_update_tensors(tensors, count, (float)lr, (float)o->beta1, (float)o->beta2,
                                                  (float)o->eps, step);
    free(tensors);
    return status;
}

/* Whether every weight is finite: a finite gradient norm times an absurd
 * learning rate can still overflow them. A sum of squares of the pieces
 * each rank updates (in double: weights up to 1e154 stay finite), over the
 * world; asked before a save alone (a pass over the weights), so that no
 * checkpoint holds them. Collective. */
static int weights_finite(trainer *t, int *finite)
{
    gpt_model *m = t->model;
    const float **spans = malloc((size_t)(m->num_params > 0 ? m->num_params : 1) * sizeof *spans);
    int64_t *lengths = malloc((size_t)(m->num_params > 0 ? m->num_params : 1) * sizeof *lengths);
    int count = 0, status = spans && lengths ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory for the weights' spans");
    for (int i = 0; !status && i < m->num_params; i++) {
        const param_view *v = &m->params[i];
        int64_t first, n, in_shard;
        shard_part(m, v, v->numel, &first, &n, &in_shard);
        if (n == 0) continue;
        spans[count] = m->zero ? m->shard_params + in_shard : v->data + first;
        lengths[count++] = n;
    }
    double sumsq = 0;
    if (!status) status = m->kernels->sum_of_squares(&sumsq, spans, lengths, count);
    free(spans);
    free(lengths);
    TP_TRY(comm_agree(t->c, status, "checking the weights"));
    TP_TRY(comm_all_reduce(t->c, GROUP_WORLD, &sumsq, 1, COMM_DOUBLE, COMM_SUM, COMM_HOST));
    *finite = isfinite(sumsq);
    return TP_OK;
}

/* Global norm (each stored piece counted once), clipping, AdamW. */
static int optimizer_step(trainer *t, int64_t step, double *norm_out, double *lr_out)
{
    gpt_model *m = t->model;
    comm *c = t->c;
    const train_options *o = t->o;
    const kernel_backend *k = m->kernels;
    double sumsq = 0;
    /* Without a sharded optimizer every replica holds the same sums: the first counts them. */
    if (m->zero || c->dp_rank == 0) TP_TRY(owned_sum_of_squares(m, &sumsq));
    TP_TRY(comm_all_reduce(c, GROUP_WORLD, &sumsq, 1, COMM_DOUBLE, COMM_SUM, COMM_HOST));
    float norm = (float)sqrt(sumsq);
    double lr = train_lr(o, step);
    *norm_out = norm;
    *lr_out = lr;
    /* A gradient holding NaN or infinity (every rank has the same sum): no
     * update, and the caller ends the run (train_steps). */
    if (!isfinite(norm)) return TP_OK;
    /* As torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when below 1. */
    float coef = (float)o->clip / (norm + 1e-6f);
    if (o->clip > 0 && coef < 1.0f)
        TP_TRY(m->zero ? k->scale_inplace(m->shard_grads, coef, m->shard_len)
                       : k->scale_inplace(m->memory + m->total, coef, m->total));
    TP_TRY(adamw_step(m, o, lr, step));
    /* ZeRO-1: every replica gets the others' updated shards, in place
     * (ZeRO-3 gathers them when it uses them). */
    if (m->zero == 1)
        TP_TRY(comm_all_gather(c, GROUP_DP, m->shard_params, m->memory, m->shard_len, COMM_FLOAT, m->stream));
    gpt_model_weights_updated(m); /* with their bf16 copies where gpt_model_update_bits named them */
    return TP_OK;
}

/* One directory of make_dirs, made durable in its parent when created: the
 * run directory holds the run's checkpoints, whose commits fsync the run
 * directory but not its parent, so a power loss could lose a new run
 * directory with every checkpoint committed in it. */
static int make_dir_durable(const char *path)
{
    if (mkdir(path, 0755) != 0)
        return errno == EEXIST ? TP_OK : tp_fail(TP_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    char parent[TP_PATH_MAX], base[TP_PATH_MAX];
    const store_ops *posix;
    TP_TRY(tp_split_path(path, parent, sizeof parent, base, sizeof base));
    TP_TRY(store_for(parent, &posix));
    return posix->sync_dir(posix, parent);
}

/* mkdir -p */
static int make_dirs(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return tp_fail(TP_ERR_ARG, "path too long: %s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        TP_TRY(make_dir_durable(buf));
        *p = '/';
    }
    return make_dir_durable(buf);
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

/* The trainer's record of the run in a checkpoint (its user JSON): the
 * batch, where its data came from (token files: how many tokens they hold,
 * so that a resume on other files is said) and its precision (bf16 mixed
 * precision keeps fp32 weights: the model's dtype does not say it). */
static void run_record(const trainer *t, char *out, size_t size)
{
    char tokens[48] = "";
    if (t->o->data && t->data) snprintf(tokens, sizeof tokens, ",\"data_tokens\":%lld", (long long)dataset_tokens(t->data));
    snprintf(out, size,
             "{\"global_batch\":%lld,\"micro_batch\":%lld,\"grad_accum\":%lld,\"seq\":%lld,\"data\":\"%s\"%s,"
             "\"precision\":\"%s\"}",
             (long long)t->global_batch, (long long)t->o->micro_batch, (long long)t->o->grad_accum,
             (long long)t->model->T, t->o->data ? "files" : "synthetic", tokens, t->o->bf16 ? "bf16" : "fp32");
}

static int save(trainer *t, const char *path, const char *url, int64_t step, int sync, saver *with)
{
    char *schedule = schedule_json(t->o, step), user[256];
    run_record(t, user, sizeof user);
    save_state state = {step, t->consumed, schedule, user, t->o->seed};
    int status = saver_start(with ? with : t->saver, path, url, &state, sync);
    cJSON_free(schedule);
    return status;
}

/* Test hook: the batches of every step, and at the first step the gradients
 * and the logits of the last micro-batch of replica 0 (as its forward left
 * them: capture_logits), as checkpoints an independent reader can merge
 * (tests/trainer/check_torch.py). */
static int dump_batch(trainer *t)
{
    if (t->c->rank != 0) return TP_OK;
    char path[4200];
    snprintf(path, sizeof path, "%s/batches.bin", t->o->dump_dir);
    FILE *f = fopen(path, "ab");
    if (!f) return tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));
    for (int64_t i = 0; i < t->global_batch; i++) {
        int status = dataset_sample(t->data, t->consumed + i, t->model->T, t->sample);
        if (status) {
            fclose(f);
            return status;
        }
        fwrite(t->sample, sizeof(int), (size_t)t->model->T + 1, f);
    }
    return fclose(f) == 0 ? TP_OK : tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));
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
    d.partition = (ckpt_partition){.kind = CKPT_SPLIT, .axis = 1, .granule = 1, .pad_multiple = m->config.vocab_pad_multiple};
    ckpt_layout layout = {c->tp, c->pp, c->dp, m->config.layers, m->virtual_stages};
    char owner[STORE_OWNER_MAX];
    TP_TRY(checkpoint_staging_owner(c, owner));
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.overwrite = 1;
    options.staging_owner = owner;
    int status = c->rank == 0 ? ckpt_stage_prepare(path, &options) : TP_OK;
    TP_TRY(comm_agree(c, status, path));
    if (c->dp_rank == 0) {
        ckpt_write_options shard = options;
        shard.shard_pp = c->pp_rank;
        shard.shard_tp = c->tp_rank;
        ckpt_writer *w = NULL;
        int id;
        status = ckpt_writer_create(&w, path, &layout, &shard);
        if (!status) status = ckpt_writer_add_tensor(w, &d, &id);
        if (!status && m->is_last) status = ckpt_writer_put_piece(w, id, c->tp_rank, t->dumped_logits);
        if (w) status = status ? (ckpt_writer_abort(w), status) : ckpt_writer_finish(w);
    }
    status = comm_agree(c, status, path);
    if (c->rank == 0 && status) ckpt_stage_discard(path, &options);
    if (status) return status;
    if (c->rank == 0) status = ckpt_commit_staged(path, &layout, NULL, &options);
    return comm_agree(c, status, path);
}

static int dump_gradients(trainer *t)
{
    saver *grads = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/grads", t->o->dump_dir);
    TP_TRY(saver_create(&grads, t->model, 1));
    int status = save(t, path, NULL, 1, 1, grads);
    saver_free(grads);
    return status;
}

/* Where checkpoints are written: the checkpoint directory, or for an
 * object store the local cache they are uploaded from. The default cache
 * is named after the URL, so a run restarted on the same node finds it. */
static int choose_save_dir(const train_options *o, char out[CKPT_PATH_MAX])
{
    const char *dir = o->ckpt_dir;
    char cache[CKPT_PATH_MAX];
    if (ckpt_is_remote(o->ckpt_dir)) {
        TP_TRY(ckpt_local_dir_for(o->ckpt_dir, "train-cache", cache, sizeof cache));
        dir = o->ckpt_cache ? o->ckpt_cache : cache;
    }
    if (strlen(dir) >= CKPT_PATH_MAX) return tp_fail(TP_ERR_ARG, "path too long: %s", dir);
    strcpy(out, dir);
    return TP_OK;
}

/* Files of --data shorter than a window (seq + 1 tokens) are never
 * sampled, though eval's stream reads them: said once, naming a few, so
 * that a glob's short shards are not dropped without a word. */
static void warn_short_files(trainer *t)
{
    enum { NAMED = 3 };
    const char *names[NAMED];
    int64_t counts[NAMED], window = t->o->seq + 1;
    int shorter = dataset_files_shorter_than(t->data, window, names, counts, NAMED);
    if (!shorter) return;
    char text[2048];
    int n = snprintf(text, sizeof text, "--data %s: ", t->o->data);
    for (int i = 0; i < shorter && i < NAMED && n < (int)sizeof text; i++)
        n += snprintf(text + n, sizeof text - (size_t)n, "%s%s (%lld tokens)", i ? ", " : "", names[i],
                      (long long)counts[i]);
    if (shorter > NAMED && n < (int)sizeof text)
        n += snprintf(text + n, sizeof text - (size_t)n, " and %d more", shorter - NAMED);
    if (n < (int)sizeof text)
        snprintf(text + n, sizeof text - (size_t)n,
                 ": %s fewer tokens than a window of %lld (--seq %lld + 1), never sampled in training (a sample is a "
                 "window inside one file)",
                 shorter == 1 ? "holds" : "hold", (long long)window, (long long)t->o->seq);
    warn(t, text);
}

/* Everything a run needs before its first step; the same verdict on every rank. */
static int set_up(trainer *t)
{
    const train_options *o = t->o;
    comm *c = t->c;
    int slots = 0, chunks = o->virtual_stages > 1 ? o->virtual_stages : 1;
    int64_t activations = 0; /* floats of a gradient between stages: [rows, D] (model.h) */
    int status = pipeline_schedule(c->pp, c->pp_rank, chunks, o->grad_accum, &t->ops, &t->num_ops, &slots);
    pipeline_buffers buffers = pipeline_buffers_used(t->ops, t->num_ops);
    if (!status)
        status = gpt_model_create(&t->model, &o->config, c, o->kernels, o->micro_batch, o->seq, slots, buffers.heads,
                                  o->sequence_parallel, chunks, o->zero, o->bf16);
    if (!status) status = dataset_open(&t->data, o->data, o->config.vocab, o->seed);
    /* A sample is a window inside one file (with fewer, it was all zeros). */
    if (!status && o->data && dataset_longest_file(t->data) <= o->seq)
        status = tp_fail(TP_ERR_ARG, "%s: %lld tokens%s, fewer than a window of %lld (--seq %lld + 1; a sample is a "
                         "window inside one file)", o->data, (long long)dataset_longest_file(t->data),
                         dataset_tokens(t->data) > dataset_longest_file(t->data) ? " in its longest file" : "",
                         (long long)o->seq + 1, (long long)o->seq);
    if (!status) activations = t->model->rows * t->model->D;
    if (!status) status = saver_create(&t->saver, t->model, 0);
    if (!status && o->ckpt_dir) status = saver_reserve(t->saver);
    if (!status) {
        const kernel_backend *k = t->model->kernels;
        size_t bytes = (size_t)activations * sizeof(float);
        t->sample = malloc((size_t)(o->seq + 1) * sizeof(int));
        if (!t->sample) status = tp_fail(TP_ERR_NOMEM, "out of memory for activations");
        if (!status) status = k->alloc((void **)&t->d_output, bytes);
        for (int b = 0; b < buffers.grad_buffers && !status; b++) status = k->alloc((void **)&t->d_input[b], bytes);
    }
    if (!status && o->ckpt_dir) status = choose_save_dir(o, t->save_dir);
    /* A store that refuses us (credentials, permissions) is said before
     * the first step, not after the run when the last upload fails. */
    if (!status && o->ckpt_dir && c->rank == 0 && ckpt_is_remote(o->ckpt_dir)) {
        const store_ops *store = NULL;
        store_stat st;
        status = store_for(o->ckpt_dir, &store);
        if (!status) status = store->stat(store, o->ckpt_dir, &st);
    }
    /* A remote run's cache is every rank's own (a node's, or its own). */
    int remote = o->ckpt_dir && ckpt_is_remote(o->ckpt_dir);
    if (!status && o->ckpt_dir && (c->rank == 0 || remote)) status = make_dirs(t->save_dir);
    /* One trainer per run directory: a second would replace this one's
     * step_N with its own. Nothing is touched before the claim is held. */
    status = comm_agree(c, status, "setting up");
    if (!status && o->ckpt_dir) {
        if (c->rank == 0) status = ckpt_run_claim_take(o->ckpt_dir, t->save_dir, "tp-train", &t->claim);
        /* Said as such on the stop line: an orchestrator must not take the
         * holder's checkpoints for this launch's (tp-elastic gives up). */
        if (c->rank == 0 && status == TP_ERR_EXISTS) t->outcome->end = TRAIN_IN_USE;
        status = comm_agree_root(c, status, "claiming the run directory");
    }
    /* Saves of an earlier run killed meanwhile: half-written, theirs to remove. */
    if (!status && o->ckpt_dir && (c->rank == 0 || remote)) status = store_remove_dead_staging(t->save_dir);
    if (!status) saver_set_claim(t->saver, t->claim);
    status = comm_agree(c, status, "setting up");
    if (!status && o->data) warn_short_files(t);
    return status;
}

/* Appends ", WHAT NOW (was THEN)" to text where key of the saved object
 * differs from this launch's (a key the checkpoint lacks: nothing said). */
static void note_change(char *text, size_t size, const char *what, const cJSON *now, const cJSON *then,
                        const char *key)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(now, key), *b = cJSON_GetObjectItemCaseSensitive(then, key);
    if (!cJSON_IsNumber(a) || !cJSON_IsNumber(b)) return;
    double x = a->valuedouble, y = b->valuedouble;
    if (fabs(x - y) <= 1e-12 * fmax(fabs(x), fabs(y))) return;
    size_t n = strlen(text);
    snprintf(text + n, size - n, "%s%s %g (was %g)", n ? ", " : "", what, x, y);
}

/* What the checkpoint resumed was trained with (its schedule and the
 * trainer's record of the run) against what this launch would save: a
 * launch that forgot --data would train the run's weights on synthetic
 * data (refused); one with another schedule or global batch is said (the
 * run goes on with this launch's: extending --steps stretches the cosine,
 * on purpose or not). The seed has its own warning. */
static int compare_settings(trainer *t, const load_result *loaded)
{
    const train_options *o = t->o;
    char *schedule_text = schedule_json(o, 0), record[256];
    run_record(t, record, sizeof record);
    cJSON *run = cJSON_Parse(loaded->run_json), *schedule = cJSON_Parse(loaded->schedule_json);
    cJSON *run_now = cJSON_Parse(record), *schedule_now = cJSON_Parse(schedule_text);
    cJSON_free(schedule_text);
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(run, "data");
    int status = TP_OK;
    if (!o->data && cJSON_IsString(data) && !strcmp(data->valuestring, "files")) {
        t->outcome->options_refused = 1; /* every rank read the same record */
        status = tp_fail(TP_ERR_ARG, "--resume: %s was trained on token files (--data), and this launch gives no --data: "
                         "it would train the run's weights on synthetic data from here on; give --data (the run's files)",
                         loaded->path);
    }
    char changed[1024] = "";
    note_change(changed, sizeof changed, "--lr", schedule_now, schedule, "lr");
    note_change(changed, sizeof changed, "--min-lr", schedule_now, schedule, "min_lr");
    note_change(changed, sizeof changed, "--warmup", schedule_now, schedule, "warmup");
    note_change(changed, sizeof changed, "--steps", schedule_now, schedule, "total_steps");
    note_change(changed, sizeof changed, "global batch", run_now, run, "global_batch");
    /* Other token files (the sample index would go on into another
     * dataset) or the same grown: said by their size, unsaid before. */
    note_change(changed, sizeof changed, "--data tokens", run_now, run, "data_tokens");
    const cJSON *precision = cJSON_GetObjectItemCaseSensitive(run, "precision");
    if (cJSON_IsString(precision) && strcmp(precision->valuestring, o->bf16 ? "bf16" : "fp32")) {
        size_t n = strlen(changed);
        snprintf(changed + n, sizeof changed - n, "%s--dtype %s (was %s)", n ? ", " : "", o->bf16 ? "bf16" : "fp32",
                 precision->valuestring);
    }
    if (!status && o->data && cJSON_IsString(data) && !strcmp(data->valuestring, "synthetic")) {
        size_t n = strlen(changed);
        snprintf(changed + n, sizeof changed - n, "%stoken files (was synthetic data)", n ? ", " : "");
    }
    if (!status && changed[0]) {
        char text[1024 + 4200];
        snprintf(text, sizeof text, "%s was trained with other settings than this launch's: %s; the run goes on with "
                 "this launch's", loaded->path, changed);
        warn(t, text);
    }
    cJSON_Delete(run);
    cJSON_Delete(schedule);
    cJSON_Delete(run_now);
    cJSON_Delete(schedule_now);
    return status;
}

/* Loads the newest checkpoint of --ckpt-dir when --resume finds one (then
 * *loaded is 1), else leaves the model as it is. */
static int resume(trainer *t, int64_t *start_step, int *loaded_one)
{
    const train_options *o = t->o;
    *start_step = 0;
    *loaded_one = 0;
    if (!o->resume || !o->ckpt_dir) return TP_OK;
    /* A job script passes --resume every time: a directory without any
     * committed checkpoint yet starts afresh (one that has checkpoints but
     * none intact stops the run, in checkpoint_load). */
    int exists, any;
    TP_TRY(checkpoint_any(t->c, o->ckpt_dir, &exists, &any));
    if (!exists) return TP_OK;
    if (!any) {
        char text[4200];
        snprintf(text, sizeof text, "--resume: no checkpoint in %s yet; starting afresh", o->ckpt_dir);
        warn(t, text);
        return TP_OK;
    }
    load_result loaded;
    double start = now_seconds();
    int status = checkpoint_load(t->model, o->ckpt_dir, 1, warn, t, &loaded);
    if (status) {
        t->outcome->options_refused = loaded.other_model; /* the flags' fault, not the checkpoint's */
        return status;
    }
    *loaded_one = 1;
    *start_step = loaded.step;
    t->consumed = loaded.consumed_samples;
    train_report r = {.kind = TRAIN_REPORT_RESUMED, .step = loaded.step, .consumed_samples = loaded.consumed_samples,
                      .optimizer_loaded = loaded.optimizer_loaded, .text = loaded.path,
                      .seconds = now_seconds() - start, .bytes = loaded.host_state_bytes};
    report(t, &r);
    /* The seed draws the samples: another one changes the data order from
     * here on (on purpose, to step past a bad batch; or a --seed forgotten). */
    if (loaded.seed_recorded && loaded.seed != o->seed) {
        char text[4400];
        snprintf(text, sizeof text, "--seed %llu, but %s was trained with --seed %llu: the samples from here on are "
                 "not the ones the run would have drawn", (unsigned long long)o->seed, loaded.path,
                 (unsigned long long)loaded.seed);
        warn(t, text);
    }
    return compare_settings(t, &loaded);
}

static int dump_initial(trainer *t)
{
    char path[4200];
    if (t->c->rank == 0) {
        mkdir(t->o->dump_dir, 0755);
        snprintf(path, sizeof path, "%s/batches.bin", t->o->dump_dir);
        remove(path);
    }
    snprintf(path, sizeof path, "%s/init", t->o->dump_dir);
    return save(t, path, NULL, 0, 1, NULL);
}

/* One step: the pipeline, gradients, the update, the global loss. */
static int train_step(trainer *t, int64_t step, int first, train_report *r)
{
    const train_options *o = t->o;
    comm *c = t->c;
    double loss_sum = 0;
    if (o->dump_dir) TP_TRY(dump_batch(t));
    TP_TRY(gpt_model_zero_grads(t->model));
    t->dumping = o->dump_dir && first && t->model->is_last && c->dp_rank == 0; /* dump_logits' writers */
    TP_TRY(run_pipeline(t));
    t->dumping = 0;
    double idle;
    TP_TRY(pipeline_idle(t, &idle, &r->pipeline_seconds));
    TP_TRY(reduce_gradients(t));
    if (o->dump_dir && first) {
        /* ZeRO-1: the summed gradients whole, as without it (the test hook's
         * only use of the gradients' region after the reduction; ZeRO-3's
         * saver gathers them to their writers). */
        if (t->model->zero == 1)
            TP_TRY(comm_all_gather(c, GROUP_DP, t->model->shard_grads, t->model->memory + t->model->total,
                                   t->model->shard_len, COMM_FLOAT, t->model->stream));
        TP_TRY(dump_gradients(t));
        TP_TRY(dump_logits(t));
    }
    /* The losses of the step's forwards: on a device read now, once, before
     * the update is queued (the read waits for the backward, as the
     * gradient norm's does next; after the update it would wait for that
     * too, and the next step would start on an idle GPU). */
    if (t->model->is_last) TP_TRY(gpt_model_take_losses(t->model, &loss_sum));
    saver_before_update(t->saver);
    TP_TRY(optimizer_step(t, step, &r->grad_norm, &r->lr));
    /* The loss of the step: last stage, first TP rank of each replica. */
    /* With it, the ranks' mean idle time in the pipeline. */
    double sums[2] = {t->model->is_last && c->tp_rank == 0 ? loss_sum : 0, idle};
    TP_TRY(comm_all_reduce(c, GROUP_WORLD, sums, 2, COMM_DOUBLE, COMM_SUM, COMM_HOST));
    r->loss = sums[0] / (double)(t->global_batch * t->model->T);
    r->pipeline_wait = sums[1] / c->world;
    t->consumed += t->global_batch;
    return TP_OK;
}

/* Whether a checkpoint is due after step: every --ckpt-every, the last step, a stop. */
static int save_due(const train_options *o, int64_t step, int stop)
{
    return (o->ckpt_every > 0 && step % o->ckpt_every == 0) || step == o->steps || stop;
}

/* Checkpoints after a step: finish a pending one, start one when due. */
static int checkpoint_after(trainer *t, int64_t step, int stop)
{
    const train_options *o = t->o;
    train_outcome *out = t->outcome;
    TP_TRY(saver_poll(t->saver, stop));
    if (!save_due(o, step, stop)) return TP_OK;
    int64_t pending = saver_pending_step(t->saver);
    if (pending >= 0) { /* the previous save is still being written: it must end first */
        train_report r = {.kind = TRAIN_REPORT_SAVE_WAIT, .step = pending};
        report(t, &r);
    }
    TP_TRY(ckpt_run_claim_check(t->claim)); /* a lease taken over: never write beside its new holder */
    char path[CKPT_PATH_MAX], url[CKPT_PATH_MAX];
    int remote = ckpt_is_remote(o->ckpt_dir);
    TP_TRY(ckpt_step_path(t->save_dir, step, path, sizeof path));
    if (remote) TP_TRY(ckpt_step_path(o->ckpt_dir, step, url, sizeof url));
    TP_TRY(save(t, path, remote ? url : NULL, step, o->sync_save || stop, NULL));
    out->checkpoints++;
    snprintf(out->last_checkpoint, sizeof out->last_checkpoint, "%s", remote ? url : path);
    return TP_OK;
}

/* Saves committed at the last step boundary, told after that step's
 * report; for an object store, uploaded (or failed: a warning, since the
 * next checkpoint goes up whole; the last one must arrive,
 * finish_uploads). The run's verdict on its uploads is that of the newest
 * step's, whatever order they are taken in: a stop's save, synchronous,
 * commits after the pending one has failed, and both are taken here. */
static int report_saves(trainer *t)
{
    int64_t step;
    double seconds;
    save_phases phases;
    char message[1024];
    int remote = ckpt_is_remote(t->o->ckpt_dir);
    while (saver_take_committed(t->saver, &step, &seconds, &phases)) {
        char path[CKPT_PATH_MAX];
        TP_TRY(ckpt_step_path(remote ? t->o->ckpt_dir : t->save_dir, step, path, sizeof path));
        train_report r = {.kind = TRAIN_REPORT_SAVED, .step = step, .seconds = seconds, .text = path};
        report(t, &r);
        if (!remote) continue;
        if (step >= t->last_upload_step) {
            t->last_upload_status = TP_OK;
            t->last_upload_step = step;
        }
        train_report u = {.kind = TRAIN_REPORT_UPLOADED, .step = step, .seconds = seconds, .text = path,
                          .bytes = phases.bytes, .phases = {phases.write, phases.upload, phases.index}};
        report(t, &u);
    }
    while (saver_take_failed_upload(t->saver, &step, message, sizeof message)) {
        char text[sizeof t->last_upload_error];
        snprintf(text, sizeof text, "upload of the checkpoint of step %lld failed: %s", (long long)step, message);
        warn(t, text);
        if (step < t->last_upload_step) continue; /* a newer one went up */
        t->last_upload_status = TP_ERR_IO;
        t->last_upload_step = step;
        snprintf(t->last_upload_error, sizeof t->last_upload_error, "%s", text);
    }
    return TP_OK;
}

/* The end of a run with a remote checkpoint directory: its last checkpoint
 * uploaded, or the run fails saying why. The same on every rank. */
static int finish_uploads(trainer *t)
{
    if (!t->o->ckpt_dir || !ckpt_is_remote(t->o->ckpt_dir) || !t->last_upload_status) return TP_OK;
    return tp_fail(t->last_upload_status, "%s", t->last_upload_error);
}

/* Logs a step's line r, its clock started at start. */
static void report_step(trainer *t, train_report *r, double start)
{
    r->seconds = now_seconds() - start;
    r->tokens_per_second = (double)(t->global_batch * t->model->T) / r->seconds;
    report(t, r);
}

/* A step whose gradient norm is not finite (the run diverged: a learning
 * rate too high, bad data, a kernel gone wrong): its line is logged, its
 * update was not applied, the saves already under way are committed, and
 * the run ends, as Megatron's check for NaN in the loss and gradients ends
 * one. Training on would write checkpoints of NaN weights after the last
 * good ones (and tp-elastic --keep would prune those). Every rank holds the
 * same norm, so all end here together. weights: the norm was finite but the
 * update left weights that are not (weights_finite, asked before a save).
 * The step's line r (its clock started at start) is logged here. */
static int end_diverged(trainer *t, int64_t step, int64_t start_step, int weights, train_report *r, double start)
{
    train_outcome *out = t->outcome;
    report_step(t, r, start);
    out->step = step - 1;
    if (t->o->ckpt_dir) {
        TP_TRY(saver_poll(t->saver, 1));
        TP_TRY(report_saves(t));
        TP_TRY(finish_uploads(t));
    }
    out->all_ranks_know = 1;
    out->end = TRAIN_DIVERGED;
    /* The run's newest checkpoint: one this launch wrote, or the one it resumed from. */
    char newest[4300] = "";
    if (out->checkpoints > 0) snprintf(newest, sizeof newest, "%s", out->last_checkpoint);
    else if (start_step > 0)
        snprintf(newest, sizeof newest, "the one of step %lld this run resumed from", (long long)start_step);
    return tp_fail(TP_ERR_STATE, "step %lld: %s; %s%s%s", (long long)step,
                   weights ? "the weights are not finite after its update (the run diverged: a learning rate too "
                             "high): no checkpoint of them written"
                           : "the gradient norm is not finite (the run diverged: a learning rate too high, or bad "
                             "data): the step's update was not applied and no checkpoint of it written",
                   newest[0] ? "the newest checkpoint, " : "",
                   newest[0] ? newest : "train again with a lower --lr",
                   newest[0] ? ", holds the last finite weights: resume from it with a lower --lr" : "");
}

static int train_steps(trainer *t, int64_t start_step)
{
    const train_options *o = t->o;
    comm *c = t->c;
    train_outcome *out = t->outcome;
    /* --stop-at N, resumed at step N or past it: the checkpoint of that step
     * (or of a later one) is there already; a stop before any step, with
     * nothing trained and nothing saved. */
    if (o->stop_at > 0 && start_step >= o->stop_at && start_step < o->steps) {
        out->end = TRAIN_STOPPED;
        return TP_OK;
    }
    for (int64_t step = start_step + 1; step <= o->steps; step++) {
        train_report r = {.kind = TRAIN_REPORT_STEP, .step = step};
        double start = now_seconds();
        TP_TRY(train_step(t, step, step == start_step + 1, &r));
        if (!isfinite(r.grad_norm)) return end_diverged(t, step, start_step, 0, &r, start);
        int stop;
        int asked = (o->control && atomic_load(&o->control->stop)) || (o->stop_at > 0 && step == o->stop_at);
        TP_TRY(comm_any(c, asked, &stop));
        int finite = 1;
        if (o->ckpt_dir && save_due(o, step, stop)) TP_TRY(weights_finite(t, &finite));
        if (!finite) return end_diverged(t, step, start_step, 1, &r, start);
        /* The checkpoint of a stop is written after the step's line: it is
         * synchronous, and a trainer killed once it is committed (a grace
         * period ending) must not leave a checkpoint of a step its log
         * never told. Other saves are in the step's time and stall. */
        if (o->ckpt_dir && !stop) {
            TP_TRY(checkpoint_after(t, step, stop));
            r.checkpoint_stall = saver_take_stall_seconds(t->saver);
        }
        report_step(t, &r, start);
        if (out->steps_run++ == 0) out->first_loss = r.loss;
        out->last_loss = r.loss;
        out->step = step;
        out->seconds += r.seconds;
        out->stall_seconds += r.checkpoint_stall;
        if (o->ckpt_dir && stop) {
            TP_TRY(checkpoint_after(t, step, stop));
            out->stall_seconds += saver_take_stall_seconds(t->saver);
        }
        if (o->ckpt_dir) TP_TRY(report_saves(t));
        if (stop) {
            out->end = TRAIN_STOPPED;
            return finish_uploads(t);
        }
    }
    if (o->ckpt_dir) {
        TP_TRY(saver_poll(t->saver, 1));
        TP_TRY(report_saves(t));
    }
    out->end = TRAIN_FINISHED;
    return finish_uploads(t);
}

int train_run(const train_options *o, comm *c, train_outcome *outcome)
{
    trainer t;
    memset(&t, 0, sizeof t);
    memset(outcome, 0, sizeof *outcome);
    t.o = o;
    t.c = c;
    t.outcome = outcome;
    /* Data on a device crosses a host communicator through host copies. */
    comm *staged = NULL;
    if (o->kernels && o->kernels->on_device && !c->ops->handles_device) {
        int status = comm_staged_create(&staged, c, o->kernels);
        if (status) {
            outcome->end = TRAIN_FAILED;
            snprintf(outcome->reason, sizeof outcome->reason, "%s", tp_errmsg());
            return status;
        }
        t.c = staged;
    }
    t.global_batch = o->micro_batch * o->grad_accum * c->dp;
    kernels_set_threads(o->threads);
    /* Failures before the first step are agreed on by every rank; after it,
     * one rank may fail while others wait for it in a collective. */
    int64_t start_step = 0;
    int loaded = 0;
    int status = set_up(&t);
    if (!status) status = resume(&t, &start_step, &loaded);
    /* Initial values only for a run that starts afresh: a resumed one would
     * overwrite them (124M take a second or more of every relaunch). */
    if (!status && !loaded) status = comm_agree(t.c, gpt_model_init_values(t.model, o->seed), "setting up");
    outcome->step = start_step;
    outcome->all_ranks_know = 1;
    if (!status) {
        char attention[1024];
        gpt_model_attention_path(t.model, attention, sizeof attention);
        train_report r = {.kind = TRAIN_REPORT_START, .step = start_step + 1, .text = attention,
                          .loss_floor = dataset_loss_floor(t.data), .bytes = gpt_model_activation_bytes(t.model),
                          .optimizer_bytes = gpt_model_optimizer_bytes(t.model),
                          .parameter_bytes = gpt_model_parameter_bytes(t.model)};
        report(&t, &r);
        if (o->dump_dir) status = dump_initial(&t);
    }
    if (!status) {
        outcome->all_ranks_know = 0;
        status = train_steps(&t, start_step);
    }
    if (status) {
        if (outcome->end != TRAIN_DIVERGED && outcome->end != TRAIN_IN_USE) outcome->end = TRAIN_FAILED;
        snprintf(outcome->reason, sizeof outcome->reason, "%s", tp_errmsg());
    }
    if (t.model) {
        const kernel_backend *k = t.model->kernels;
        for (int b = 0; b < PIPELINE_GRAD_BUFFERS; b++) k->release(t.d_input[b]);
        k->release(t.d_output);
    }
    free(t.ops);
    free(t.sample);
    free(t.dumped_logits);
    saver_free(t.saver);
    ckpt_run_claim_release(t.claim); /* after the last save and upload ended */
    dataset_close(t.data);
    gpt_model_free(t.model);
    comm_free(staged);
    if (status) tp_fail(status, "%s", outcome->reason);
    return status;
}
