/* schedule.h: the order in which a pipeline stage runs a step's
 * micro-batches through its chunks of layers.
 *
 * One chunk per stage: 1F1B (PipeDream-Flush, Narayanan et al. 2021):
 * stage s runs pp - s - 1 forwards, then alternates one forward and one
 * backward, then drains the backwards.
 *
 * V chunks per stage (the interleaved schedule of the same paper, as
 * Megatron-LM orders it): chunk c of stage s is the model's chunk
 * c pp + s. Forwards go in groups of pp micro-batches through chunk 0, then
 * the same group through chunk 1, ..., chunk V-1, then the next group;
 * backwards likewise from chunk V-1 down. Stage s runs
 * 2 (pp - s - 1) + (V - 1) pp forwards first (all of them when there are
 * only pp micro-batches), then alternates, then drains. The micro-batches
 * of a step must be a multiple of pp.
 *
 * Each (micro-batch, chunk) keeps its activations in a slot from its
 * forward to its backward (the schedule assigns the lowest free one); a
 * backward's gradient for the previous stage goes out of one of
 * PIPELINE_GRAD_BUFFERS buffers, in turn. Before an operation overwrites a
 * buffer, the send from it must have completed: the schedule says how many
 * of the stage's first sends must have (those up to the slot's previous
 * forward, or the buffer's previous backward). Waiting for every send
 * instead deadlocks the interleaved schedule when sends complete only once
 * received (MPI's rendezvous for large messages): a later send's receiver
 * may be waiting for this stage; so does a gradient kept in the slot that
 * the next forward takes. A slot's output was received before its
 * backward could run. Pure functions: the trainer follows them, the tests
 * simulate every stage at once with them. */
#ifndef TP_SCHEDULE_H
#define TP_SCHEDULE_H

#include <stdint.h>

#define PIPELINE_GRAD_BUFFERS 2

typedef struct {
    int backward;  /* 0: forward, 1: backward */
    int64_t micro; /* micro-batch of the step */
    int chunk;     /* this stage's chunk, 0 .. V-1 */
    int slot;      /* where its activations live */
    int head;      /* the model's last chunk on the last stage: where its head's (logits') live, from a pool
                      of its own (few are in flight: each slot keeping one would cost a [B*T, vocab/tp] each);
                      -1 otherwise */
    int grad_buffer; /* a backward: the buffer its gradient for the previous stage goes out of; -1 */
    int sends;     /* whether it sends a message: a forward but the model's last chunk's, a backward but the
                      first's */
    int64_t sends_done; /* the stage's first sends_done sends of the step must have completed before it
                           (0: none) */
} pipeline_op;

/* Whether pp stages with `chunks` chunks each can run micro_batches in a
 * step (TP_ERR_ARG saying why not). */
int pipeline_check(int pp, int chunks, int64_t micro_batches);

/* Stage `stage`'s 2 x micro_batches x chunks operations in order (*ops
 * malloc'ed, *count of them) and the slots they use (*slots). A chunk is
 * the model's first or last by the stage's place: chunk 0 of stage 0 sends
 * no gradient back, chunk V-1 of stage pp-1 no output on. */
int pipeline_schedule(int pp, int stage, int chunks, int64_t micro_batches, pipeline_op **ops, int64_t *count,
                      int *slots);

/* The buffers a stage's schedule uses besides its slots: heads, its
 * largest `head` + 1 (0 off the last stage); gradient buffers,
 * PIPELINE_GRAD_BUFFERS where a backward sends a gradient back, else 0
 * (stage 0 with one chunk). */
typedef struct {
    int heads, grad_buffers;
} pipeline_buffers;

pipeline_buffers pipeline_buffers_used(const pipeline_op *ops, int64_t count);

/* The idle fraction of an ideal step (equal time per chunk, free
 * messages): (pp - 1) / (chunks x micro_batches) of the busy time. */
double pipeline_bubble_fraction(int pp, int chunks, int64_t micro_batches);

/* Message tags: the micro-batch, the sending chunk and the direction, so
 * that every message between two stages has its own (at pp 2 a stage's
 * next is also its previous). */
static inline int pipeline_tag(int64_t micro, int sender_chunk, int chunks, int backward)
{
    return (int)(2 * (micro * chunks + sender_chunk) + backward);
}

#endif
