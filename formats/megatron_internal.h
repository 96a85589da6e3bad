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

#endif
