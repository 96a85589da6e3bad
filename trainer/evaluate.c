/* evaluate.c: the loss of a checkpoint on token windows, and sampling text
 * from it. Forward passes only, through the same model code as training, so
 * `eval` at any layout computes what training would (to summation order). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/random.h"
#include "../kernels/kernels.h"
#include "checkpoint.h"
#include "data.h"
#include "evaluate.h"
#include "model.h"

void eval_options_init(eval_options *o)
{
    memset(o, 0, sizeof *o);
    o->micro_batch = 4;
    o->threads = 1;
}

void generate_options_init(generate_options *o)
{
    memset(o, 0, sizeof *o);
    o->tokens = 200;
    o->sampling = (sampling_options){.temperature = 0.8, .top_k = 0, .top_p = 1.0};
    o->seed = 1337;
    o->threads = 1;
}

/* The model of the checkpoint at resolved (its configuration read with
 * checkpoint_model_config), built for inference at this rank's place in the
 * layout with fp32 parameters (a bf16 or fp16 checkpoint is widened on load),
 * for micro_batch windows of seq tokens (at most the model's positions). */
static int inference_model(gpt_config config, const char *resolved, comm *c, int64_t micro_batch, int64_t seq,
                           gpt_model **out)
{
    config.dtype = TP_FP32;
    int status = gpt_model_create(out, &config, c, NULL, micro_batch, seq, 1, 1, 0, 1, 0, 0);
    return status ? tp_fail_context(status, "%s", resolved) : TP_OK;
}

/* Inputs and targets of windows [first, first + valid) into a slot; rows of
 * a partly filled micro-batch repeat the first window and are not counted. */
static int fill_windows(const dataset *d, gpt_slot *s, int64_t B, int64_t T, int64_t first, int64_t valid,
                        int *window)
{
    for (int64_t b = 0; b < B; b++) {
        TP_TRY(dataset_read_tokens(d, (first + (b < valid ? b : 0)) * T, T + 1, window));
        memcpy(s->tokens + b * T, window, (size_t)T * sizeof(int));
        memcpy(s->targets + b * T, window + 1, (size_t)T * sizeof(int));
    }
    return TP_OK;
}

/* Forward passes of this replica's windows [first, last) through its
 * pipeline; *loss gets the loss sum on the last stage's first TP rank. */
static int forward_windows(gpt_model *m, const dataset *data, int64_t first, int64_t last, int *window, double *loss)
{
    comm *c = m->comm;
    int64_t B = m->B, T = m->T, passes = (last - first + B - 1) / B, n = m->rows * m->D;
    gpt_slot *s = &m->slots[0];
    for (int64_t k = 0; k < passes; k++) {
        int64_t start = first + k * B, valid = last - start < B ? last - start : B;
        int tag = (int)(k % (COMM_MAX_TAG + 1)); /* --windows goes to 2^40: passes beyond any MPI's tags */
        TP_TRY(fill_windows(data, s, B, T, start, valid, window));
        if (!m->is_first) TP_TRY(comm_recv(c, COMM_PREV_STAGE, s->input, n, COMM_FLOAT, tag, COMM_HOST));
        TP_TRY(gpt_model_forward(m, s, 0));
        if (!m->is_last) TP_TRY(comm_send(c, COMM_NEXT_STAGE, gpt_model_output(m, s), n, COMM_FLOAT, tag, COMM_HOST));
        TP_TRY(comm_wait_sends(c, COMM_HOST));
        if (m->is_last && c->tp_rank == 0) *loss += gpt_slot_loss(s, valid * T);
    }
    return TP_OK;
}

int eval_run(const eval_options *o, comm *c, eval_result *out)
{
    memset(out, 0, sizeof *out);
    out->all_ranks_know = 1;
    kernels_set_threads(o->threads);
    gpt_model *m = NULL;
    dataset *data = NULL;
    int *window = NULL;
    int64_t T = o->seq;
    gpt_config config;
    char resolved[4096];
    int status = checkpoint_model_config(c, o->ckpt, &config, resolved, sizeof resolved);
    if (!status && T == 0) T = config.seq;
    if (!status && T > config.seq)
        status = tp_fail(TP_ERR_ARG, "--seq %lld exceeds the %lld positions of the model in %s", (long long)T,
                         (long long)config.seq, resolved);
    if (!status) status = dataset_open(&data, o->data, config.vocab, 0);
    int64_t available = 0, windows = o->windows;
    if (!status) {
        available = (dataset_tokens(data) - 1) / T; /* each window also needs the token after it */
        if (windows == 0) windows = available;
        if (available < 1 || windows > available)
            status = tp_fail(TP_ERR_ARG, "%s: %lld tokens hold %lld windows of %lld tokens (plus one target), %s %lld",
                             o->data, (long long)dataset_tokens(data), (long long)available, (long long)T,
                             o->windows ? "asked for" : "need at least", (long long)(windows ? windows : 1));
    }
    /* A forward pass takes at most the windows of the largest replica's
     * share: a micro-batch beyond them was computed (and allocated: 883 MB
     * for one window at --micro-batch 2048 of the tiny model) for nothing. */
    int64_t share = windows / c->dp + (windows % c->dp != 0);
    if (!status) {
        status = inference_model(config, resolved, c, o->micro_batch < share ? o->micro_batch : share, T, &m);
        out->layout_refused = status == TP_ERR_LAYOUT; /* every rank's model is the same: so is the verdict */
    }
    if (!status && !(window = malloc((size_t)(T + 1) * sizeof(int)))) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    status = comm_agree_first(c, status, o->ckpt);
    load_result loaded;
    if (!status) status = checkpoint_load(m, o->ckpt, 0, o->warn, o->warn_ctx, &loaded);
    /* This replica's windows, in micro-batches through its pipeline: from
     * here a rank may fail while others wait for it. */
    double loss = 0;
    if (!status) {
        out->all_ranks_know = 0;
        int64_t first = windows * c->dp_rank / c->dp, last = windows * (c->dp_rank + 1) / c->dp;
        status = forward_windows(m, data, first, last, window, &loss);
        if (!status) status = comm_all_reduce(c, GROUP_WORLD, &loss, 1, COMM_DOUBLE, COMM_SUM, COMM_HOST);
    }
    if (!status) {
        out->all_ranks_know = 1;
        out->loss = loss / (double)(windows * T);
        out->windows = windows;
        out->tokens = windows * T;
        out->seq = T;
        out->step = loaded.step;
        snprintf(out->path, sizeof out->path, "%s", loaded.path);
    }
    free(window);
    dataset_close(data);
    gpt_model_free(m);
    return status;
}

/* ------------------------------------------------------------------ generate */

static int most_likely_first(const void *x, const void *y)
{
    const sample_candidate *a = x, *b = y;
    if (a->logit != b->logit) return a->logit > b->logit ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

int generate_sample_token(const float *logits, int64_t vocab, const sampling_options *sampling, double u,
                          sample_candidate *scratch)
{
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; i++)
        if (logits[i] > logits[best]) best = i;
    double temperature = sampling->temperature;
    if (temperature <= 0) return (int)best;
    int64_t kept = vocab;
    sample_candidate *c = scratch;
    for (int64_t i = 0; i < vocab; i++) c[i] = (sample_candidate){logits[i], (int32_t)i};
    int narrowed = (sampling->top_k > 0 && sampling->top_k < vocab) || sampling->top_p < 1;
    /* Only a narrowing needs the tokens ranked; the whole vocabulary is
     * drawn from in id order, as before the options existed. */
    if (narrowed) qsort(c, (size_t)vocab, sizeof *c, most_likely_first);
    if (sampling->top_k > 0 && sampling->top_k < kept) kept = sampling->top_k;
    double total = 0;
    for (int64_t i = 0; i < kept; i++) total += exp((double)(c[i].logit - logits[best]) / temperature);
    if (sampling->top_p < 1) {
        /* A token is kept while the probability of those ranked before it
         * is below top_p: the first one always. */
        double before = 0;
        int64_t i = 0;
        for (; i < kept && before < sampling->top_p * total; i++)
            before += exp((double)(c[i].logit - logits[best]) / temperature);
        kept = i;
        total = before;
    }
    double target = u * total, running = 0;
    for (int64_t i = 0; i < kept; i++) {
        running += exp((double)(c[i].logit - logits[best]) / temperature);
        if (running > target) return c[i].id;
    }
    return (int)best; /* rounding left target at the very end */
}

/* A failed write (a full disk, a reader gone with SIGPIPE ignored) ends
 * the generation: the rest would be computed for nobody. */
static int write_token(FILE *out, int token)
{
    errno = 0;
    if (token < 256) fputc(token, out);
    else fprintf(out, "<|%d|>", token);
    if (fflush(out) != 0 || ferror(out))
        return tp_fail(TP_ERR_IO, "cannot write the text: %s", errno ? strerror(errno) : "a write failed");
    return TP_OK;
}

int generate_run(const generate_options *o, FILE *out)
{
    size_t prompt_len = strlen(o->prompt);
    if (prompt_len == 0) return tp_fail(TP_ERR_ARG, "the prompt is empty: give at least one byte to continue");
    comm *c = NULL;
    TP_TRY(comm_local_create(&c));
    kernels_set_threads(o->threads);
    gpt_config config;
    char resolved[4096];
    gpt_model *m = NULL;
    sample_candidate *candidates = NULL;
    int *context = NULL, status = checkpoint_model_config(c, o->ckpt, &config, resolved, sizeof resolved);
    /* The window: the whole context when it fits, else the last seq tokens. */
    int64_t T = (int64_t)prompt_len + o->tokens;
    if (!status && T > config.seq) T = config.seq;
    for (size_t i = 0; i < prompt_len && !status; i++)
        if ((unsigned char)o->prompt[i] >= config.vocab)
            status = tp_fail(TP_ERR_ARG, "prompt byte %u at offset %zu is outside the model's vocabulary of %lld",
                             (unsigned char)o->prompt[i], i, (long long)config.vocab);
    /* A model of another vocabulary (GPT-2's 50257, Llama's) was trained on
     * a tokenizer's ids: bytes in and bytes out mean nothing to it, and its
     * text came out as noise without a word. */
    if (!status && config.vocab > 256 && o->warn) {
        char text[400];
        snprintf(text, sizeof text, "the model's vocabulary has %lld tokens, more than the 256 bytes tp-train "
                 "prepare writes: the prompt is read as byte ids and ids print as bytes (beyond 255 as <|id|>), which "
                 "is text only for a model trained on byte-level token files", (long long)config.vocab);
        o->warn(o->warn_ctx, text);
    }
    if (!status) status = inference_model(config, resolved, c, 1, T, &m);
    load_result loaded;
    if (!status) status = checkpoint_load(m, o->ckpt, 0, o->warn, o->warn_ctx, &loaded);
    if (!status && (!(context = calloc((size_t)T, sizeof *context)) ||
                    !(candidates = malloc((size_t)config.vocab * sizeof *candidates))))
        status = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (status) goto done;
    int64_t len = 0;
    for (size_t i = prompt_len > (size_t)T ? prompt_len - (size_t)T : 0; i < prompt_len; i++)
        context[len++] = (unsigned char)o->prompt[i];
    fwrite(o->prompt, 1, prompt_len, out);
    fflush(out);
    gpt_slot *s = &m->slots[0];
    int64_t V = m->vocab_local; /* tp = 1: every (padded) column is here */
    for (int64_t k = 0; k < o->tokens && !status; k++) {
        /* Causal attention: positions after len - 1 do not change its logits. */
        memcpy(s->tokens, context, (size_t)T * sizeof(int));
        memset(s->targets, 0, (size_t)T * sizeof(int));
        status = gpt_model_forward(m, s, 0);
        if (status) break;
        double u = (double)(splitmix64(o->seed ^ splitmix64((uint64_t)k)) >> 11) * 0x1.0p-53;
        const float *logits = (const float *)s->head->logits + (len - 1) * V; /* fp32: inference_model's models are */
        /* NaN compares false: sampling would pick token 0 every time and
         * print text of zero bytes as if the model had chosen it. */
        for (int64_t i = 0; i < m->config.vocab && !status; i++)
            if (!isfinite(logits[i]))
                status = tp_fail(TP_ERR_FORMAT, "%s: the logit of token %lld is %g after %lld generated tokens: the "
                                 "checkpoint's weights give no finite logits (NaN or infinite values in it?)",
                                 loaded.path, (long long)i, (double)logits[i], (long long)k);
        if (status) break;
        int token = generate_sample_token(logits, m->config.vocab, &o->sampling, u, candidates);
        status = write_token(out, token);
        if (status) break;
        if (len == T) {
            memmove(context, context + 1, (size_t)(T - 1) * sizeof *context);
            len--;
        }
        context[len++] = token;
    }
    if (!status) fputc('\n', out);
done:
    free(context);
    free(candidates);
    gpt_model_free(m);
    comm_free(c);
    return status;
}
