/* zero.h: the sharded optimizer's units (model.h zero_unit): how the
 * flattened parameters split over the data-parallel ranks, ZeRO-3's
 * gathering of a unit whole when a forward or backward needs it, and the
 * moving of state between the shards and the ranks that write and read it
 * in checkpoints.
 *
 * Checkpoints: a view's moments (with ZeRO-3 its parameter as well) are
 * written by one rank of the group, chosen so that the ranks write about as
 * much (param_view's writer), in its data-parallel file (docs/FORMAT.md, formats 1.6 and 1.7;
 * rank 0: the shard's own file), so that each rank writes about its own
 * shard and none gathers them all; they are read by the first rank of the
 * group and handed out. They travel in chunks of at most ZERO_CHUNK values
 * of each rank's piece (all-gathers to save, reduce-scatters to load), so
 * that no rank holds more than dp x ZERO_CHUNK of them in flight beyond
 * what it keeps. All of these are collective over each data-parallel
 * group, but zero_lay_out. */
#ifndef TP_TRAINER_ZERO_H
#define TP_TRAINER_ZERO_H

#include "model.h"

#define ZERO_CHUNK ((int64_t)1 << 20)

/* Splits the model's views into units (model.h) for zero (0, 1 or 3) at its
 * data-parallel size: sets each view's flat, unit and writer, the model's
 * units, total, shard_len and (ZeRO-3) work_floats. Without a sharded
 * optimizer, one unit of the views packed one after the other, unsplit.
 * After the model's tensor indices (wte, layer ...) are set.
 *
 * A view's writer is the data-parallel rank that writes its moments (with
 * ZeRO-3 its parameter too) in checkpoints; without a sharded optimizer, 0.
 * The views stored here (param_view's owner) go, one after the other, to
 * the rank that has the fewest values to write so far (the first of
 * those), its state counting 2 values an element (3 with ZeRO-3's
 * parameter), and with ZeRO-1 rank 0 starting with every parameter, which
 * it writes: about equal writes, and snapshots, whatever the sizes of the
 * tensors. */
int zero_lay_out(gpt_model *model, int zero);

/* What a forward or backward of ZeRO-3 gathers: a local layer (0 ..
 * num_layers - 1), or these. */
enum { ZERO_USE_EMBEDDING = -1, ZERO_USE_HEAD = -2 };
enum { ZERO_PARAMS = 1, ZERO_GRADS = 2, ZERO_MOMENTS = 4 };

/* ZeRO-3: the units of a use, all-gathered whole into the work area, its
 * views' data pointing there (ZERO_PARAMS), and their grad to zeroed
 * gradients there (ZERO_GRADS). A no-op without ZeRO-3. */
int zero_gather_use(gpt_model *model, int use, int what);

/* ZeRO-3: the end of a use: gradients it gathered summed over the group
 * (reduce-scatter) and added to each rank's shard of them; its views'
 * pointers NULL again. A no-op without ZeRO-3. */
int zero_release_use(gpt_model *model);

/* The views of a use (at most GPT_LAYER_KINDS + 1 of them) into views;
 * returns how many. */
int zero_use_views(const gpt_model *model, int use, int *views);

/* Every rank's state into the checkpoint snapshots (host memory) of the
 * ranks that write it (param_view's writer): what is ZERO_MOMENTS and, with
 * ZeRO-3, ZERO_PARAMS or ZERO_GRADS (the summed gradients, in place of the
 * parameters: the test hook). param_at[i] is the offset in this rank's
 * snapshot of view i's parameter (or gradient), moment_at[i] that of its
 * first moments, its second moments following numel values later, -1 where
 * this rank does not write them. A rank that writes none passes NULL for
 * all three. Every rank passes the same `what`. */
int zero_gather_state(gpt_model *model, int what, float *snapshot, const int64_t *param_at, const int64_t *moment_at);

/* The reverse, after a load: the first rank of each group passes the
 * parameters (ZeRO-3: `params`, [total]) and both moments (`moments`:
 * [2, total], first then second) of every local view in host memory, each
 * at the views' places in the flattened parameters (flat); every rank keeps
 * its shard's of what is in `what` (ZERO_PARAMS, ZERO_MOMENTS). Other ranks
 * pass NULL. */
int zero_scatter_state(gpt_model *model, int what, const float *params, const float *moments);

/* The same a unit at a time, so that the first rank need hold one unit's
 * state at once (ZeRO-3's loads): zero_scatter_begin (collective over all
 * ranks: it agrees on the buffers), then zero_scatter_unit for units in the
 * same order on every rank of a data-parallel group (collective over it),
 * then zero_scatter_end (a unit that failed on one rank fails on every
 * rank of its group). The first rank passes the unit's parameters
 * (`params`, [zero_unit_span], from the unit's first value) and its first
 * and second moments (at `moments` and `moments` + moments_stride, as
 * long); other ranks pass NULL. */
typedef struct {
    int what;
    float *send, *host; /* [dp, chunk] in the backend's memory, and its host copy on a device */
} zero_scatter;
int zero_scatter_begin(gpt_model *model, int what, zero_scatter *scatter);
int zero_scatter_unit(gpt_model *model, zero_scatter *scatter, int unit, const float *params, const float *moments,
                      int64_t moments_stride);
void zero_scatter_end(gpt_model *model, zero_scatter *scatter);

/* Values of a unit in the flattened parameters, its padding included. */
int64_t zero_unit_span(const gpt_model *model, const zero_unit *unit);

/* The largest of the units' pieces (with a sharded optimizer, the largest
 * span is dp times as many values). */
int64_t zero_largest_piece(const gpt_model *model);

#endif
