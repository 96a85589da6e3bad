/* megatron_internal.h (private to formats/): what the Megatron writer
 * (megatron_write.c) reads of the checkpoint it takes as its template. */
#ifndef TP_FORMATS_MEGATRON_INTERNAL_H
#define TP_FORMATS_MEGATRON_INTERNAL_H

#include "megatron.h"

/* The file of each rank's state in an iteration's mp_rank_* directory. */
#define MEGATRON_RANK_FILE "model_optim_rng.pt"

/* `args` of the first rank file (an argparse.Namespace object). */
const pickle_value *megatron_args(const megatron_checkpoint *checkpoint);
/* A value of the first rank file's first model chunk, by its key in the
 * model dict (Megatron-Core's flat keys: "decoder.layers.0.self_attention.
 * linear_qkv._extra_state"); NULL when absent. */
const pickle_value *megatron_model_value(const megatron_checkpoint *checkpoint, const char *key);

/* A top-level value of the rank file of (pp_rank, tp_rank): "optimizer",
 * "rng_state", ...; NULL when absent. */
const pickle_value *megatron_rank_value(const megatron_checkpoint *checkpoint, int pp_rank, int tp_rank, const char *key);
/* The path of the rank file of (pp_rank, tp_rank), for messages. */
const char *megatron_rank_path(const megatron_checkpoint *checkpoint, int pp_rank, int tp_rank);
/* The bytes (size) of a tensor found in that rank file's values. */
int megatron_rank_tensor_read(const megatron_checkpoint *checkpoint, int pp_rank, int tp_rank, const pickle_value *tensor,
                              void *buf, int64_t size);

/* Megatron's weight-decay rule for a parameter (or its optimizer state):
 * none for biases and vectors (docs/MEGATRON.md section 7). */
int megatron_no_weight_decay(const ckpt_tensor_desc *tensor);
/* Whether optimizer param group g (of file) is the one without weight
 * decay: from its wd_mult, or its weight_decay. */
int megatron_group_no_weight_decay(const pickle_value *group, const char *file, int64_t g, int *out);

/* The iteration's directory of a Megatron checkpoint at path: from the
 * tracker file latest_checkpointed_iteration.txt, or path itself. */
int megatron_iteration_dir(const char *path, char *out, size_t size);

/* Whether the last component of path names an iteration's directory as
 * Megatron names them: iter_ and at least 7 digits, or release. */
int megatron_iteration_dir_name(const char *path);

/* The model, layout and training state of a file's `args`,
 * `checkpoint_version` and `iteration` (a rank file, or Megatron-Core's
 * common.pt): checked as megatron_open checks them. */
int megatron_config_read(const torch_archive *archive, megatron_config *config);
/* The same from the dict root (a rank file's, or Megatron-Core's common
 * state), file naming it in messages. */
int megatron_config_from(const char *file, const pickle_value *root, megatron_config *config);

/* The canonical name (megatron.h) of a model tensor at path (its keys
 * joined by '.', legacy or Megatron-Core's), whose layers are numbered from
 * global layer first_layer in a chunk of chunk_layers; *kind says whether
 * it is a tensor, to skip (_extra_state) or the tied head's copy. */
enum { MEGATRON_NAME_TENSOR, MEGATRON_NAME_SKIP, MEGATRON_NAME_HEAD_COPY };
int megatron_canonical_name(const megatron_config *config, const char *path, int64_t first_layer, int64_t chunk_layers,
                            char *out, size_t size, int *kind);
/* The logical shape, partition and anchor of a canonical name (d->name is
 * name, its dtype the model's). */
void megatron_describe(const megatron_config *config, const char *name, ckpt_tensor_desc *d);

#endif
