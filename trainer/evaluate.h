/* evaluate.h: using a trained checkpoint: the loss on held-out token windows
 * (`tp-train eval`, at any layout under mpirun) and sampling text from it
 * (`tp-train generate`, one process). Both build the model from the
 * checkpoint's own configuration and read only its parameters. */
#ifndef TP_EVALUATE_H
#define TP_EVALUATE_H

#include <stdint.h>
#include <stdio.h>

#include "checkpoint.h"
#include "comm.h"

typedef struct {
    const char *ckpt;    /* a checkpoint, or a run directory (its newest intact checkpoint) */
    const char *data;    /* token files (docs/DATA.md), read as one stream */
    int64_t windows;     /* windows to evaluate; 0: every whole window of the stream */
    int64_t seq;         /* window length T; 0: the model's context length */
    int64_t micro_batch; /* windows per forward pass */
    int threads;         /* matrix-product threads per rank */
    checkpoint_warning warn; /* told when a damaged checkpoint is passed over; may be NULL */
    void *warn_ctx;
} eval_options;

/* Defaults: every window, the model's length, 4 windows per pass, 1 thread. */
void eval_options_init(eval_options *options);

typedef struct {
    double loss;      /* mean cross-entropy, nats per token */
    int64_t windows;  /* windows evaluated */
    int64_t tokens;   /* predicted tokens: windows x seq */
    int64_t seq;
    int64_t step;     /* the checkpoint's step */
    char path[4096];  /* the checkpoint loaded */
    int all_ranks_know; /* after a failure: 1 when every rank failed with it; 0 when others may wait on this
                           rank in a collective (the caller ends them: comm_abort) */
    int layout_refused; /* after a failure: the checkpoint's model does not divide into the layout asked for
                           (heads over tp, layers over pp): the command line's, on every rank */
} eval_result;

/* Mean cross-entropy over windows 0..N-1 of the token stream, where window
 * i has inputs tokens[i*T, i*T+T) and targets tokens[i*T+1, i*T+T+1).
 * Data-parallel replicas take consecutive shares of the windows. Collective;
 * every rank gets the result. Fails (tp_status) with the reason; see
 * out->all_ranks_know. */
int eval_run(const eval_options *options, comm *c, eval_result *out);

/* How the next token is drawn from a position's logits, in Hugging Face
 * transformers' order: divided by the temperature, kept to the top_k most
 * likely, then to the fewest most likely whose probabilities add up to
 * top_p at least. */
typedef struct {
    double temperature; /* 0: always the most likely token (top_k and top_p unused) */
    int64_t top_k;      /* 0: every token */
    double top_p;       /* in (0, 1]; 1: every token top_k kept */
} sampling_options;

/* A token's logit and id: the scratch of generate_sample_token, vocab of them. */
typedef struct {
    float logit;
    int32_t id;
} sample_candidate;

/* The token drawn from logits[vocab] (finite) with the uniform number u in
 * [0, 1); among equal logits the lower id ranks first (the most likely at
 * temperature 0, the one kept by top_k). scratch holds vocab candidates. */
int generate_sample_token(const float *logits, int64_t vocab, const sampling_options *sampling, double u,
                          sample_candidate *scratch);

typedef struct {
    const char *ckpt;
    const char *prompt;  /* text; its bytes are the first tokens */
    int64_t tokens;      /* tokens to generate */
    sampling_options sampling;
    uint64_t seed;
    int threads;
    checkpoint_warning warn; /* as eval_options' */
    void *warn_ctx;
} generate_options;

/* Defaults: 200 tokens, temperature 0.8 over every token, seed 1337, 1 thread. */
void generate_options_init(generate_options *options);

/* Samples text with the byte-level vocabulary (token = byte) and writes the
 * prompt and then each new token to out as it comes; tokens beyond the 256
 * bytes (a wider vocabulary) are written as <|id|>. The context keeps the
 * last seq tokens. Fails (tp_status) with the reason. */
int generate_run(const generate_options *options, FILE *out);

#endif
