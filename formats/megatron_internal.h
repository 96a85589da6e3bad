/* megatron_internal.h (private to formats/): what the Megatron writer
 * (megatron_write.c) reads of the checkpoint it takes as its template. */
#ifndef TP_FORMATS_MEGATRON_INTERNAL_H
#define TP_FORMATS_MEGATRON_INTERNAL_H

#include "megatron.h"

/* `args` of the first rank file (an argparse.Namespace object). */
const pickle_value *megatron_args(const megatron_checkpoint *checkpoint);
/* A value of the first rank file's first model chunk, by its key in the
 * model dict (Megatron-Core's flat keys: "decoder.layers.0.self_attention.
 * linear_qkv._extra_state"); NULL when absent. */
const pickle_value *megatron_model_value(const megatron_checkpoint *checkpoint, const char *key);

/* A top-level value of the rank file of (pp_rank, tp_rank): "optimizer",
 * "rng_state", ...; NULL when absent. */
const pickle_value *megatron_rank_value(const megatron_checkpoint *checkpoint, int pp_rank, int tp_rank, const char *key);
/* The bytes (size) of a tensor found in that rank file's values. */
int megatron_rank_tensor_read(const megatron_checkpoint *checkpoint, int pp_rank, int tp_rank, const pickle_value *tensor,
                              void *buf, int64_t size);

/* Megatron's weight-decay rule for a parameter (or its optimizer state):
 * none for biases and vectors (docs/MEGATRON.md section 7). */
int megatron_no_weight_decay(const ckpt_tensor_desc *tensor);
/* Whether optimizer param group g (of file) is the one without weight
 * decay: from its wd_mult, or its weight_decay. */
int megatron_group_no_weight_decay(const pickle_value *group, const char *file, int64_t g, int *out);

#endif
