/* zero.h: moving ZeRO-1's Adam moments between the data-parallel ranks
 * that each keep a shard of them (model.h, gpt_model_create's zero) and
 * the first rank of the group, which reads and writes checkpoints for it.
 *
 * The moments travel in chunks of at most ZERO_CHUNK values of each rank's
 * shard (all-gathers to save, reduce-scatters to load), so that no rank
 * holds more than dp x ZERO_CHUNK of them in flight beyond what it keeps.
 * Both are collective over each data-parallel group. */
#ifndef TP_TRAINER_ZERO_H
#define TP_TRAINER_ZERO_H

#include "model.h"

#define ZERO_CHUNK ((int64_t)1 << 20)

/* Every rank's moments into the checkpoint snapshot of the first rank of
 * its group: host memory, laid out as the saver's (per view this rank owns,
 * in order: numel parameters, numel first moments, numel second moments),
 * of which this fills the moments. Other ranks pass NULL. */
int zero_gather_moments(gpt_model *model, float *snapshot);

/* The reverse, after a load: the first rank of each group passes both
 * moments of every local view in host memory (`moments`: [2, total], first
 * then second moments, each at the views' places in the flattened
 * parameters); every rank keeps its shard's. Other ranks pass NULL. */
int zero_scatter_moments(gpt_model *model, const float *moments);

#endif
