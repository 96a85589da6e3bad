/* zero.h: moving ZeRO-1's Adam moments between the data-parallel ranks
 * that each keep a shard of them (model.h, gpt_model_create's zero) and
 * the ranks that write and read them in checkpoints. A view's moments are
 * written by the rank whose shard holds the view's first value, in its
 * data-parallel file (docs/FORMAT.md, format 1.6; rank 0: the shard's own
 * file), so that each rank writes about its own shard and none gathers
 * them all; they are read by the first rank of the group.
 *
 * The moments travel in chunks of at most ZERO_CHUNK values of each rank's
 * shard (all-gathers to save, reduce-scatters to load), so that no rank
 * holds more than dp x ZERO_CHUNK of them in flight beyond what it keeps.
 * Both are collective over each data-parallel group. */
#ifndef TP_TRAINER_ZERO_H
#define TP_TRAINER_ZERO_H

#include "model.h"

#define ZERO_CHUNK ((int64_t)1 << 20)

/* The data-parallel rank that writes a view's moments in checkpoints:
 * with ZeRO-1 the rank whose shard holds its first value; without, 0. */
int zero_moment_writer(const gpt_model *model, const param_view *view);

/* Every rank's moments into the checkpoint snapshots (host memory) of the
 * ranks that write them: moment_at[i] is the offset in this rank's snapshot
 * of view i's first moments, its second moments following numel values
 * later, or -1 where this rank does not write view i's moments. A rank that
 * writes none passes NULL for both. */
int zero_gather_moments(gpt_model *model, float *snapshot, const int64_t *moment_at);

/* The reverse, after a load: the first rank of each group passes both
 * moments of every local view in host memory (`moments`: [2, total], first
 * then second moments, each at the views' places in the flattened
 * parameters); every rank keeps its shard's. Other ranks pass NULL. */
int zero_scatter_moments(gpt_model *model, const float *moments);

#endif
