/* megatron_internal.h (private to formats/): what the Megatron writer
 * (megatron_write.c) reads of the checkpoint it takes as its template. */
#ifndef TP_FORMATS_MEGATRON_INTERNAL_H
#define TP_FORMATS_MEGATRON_INTERNAL_H

#include "megatron.h"

/* Megatron-Core's torch_dist checkpoints: the backend's description, the
 * common state's file (up to 0.18) and its bytes entry (0.19+:
 * dist_checkpointing/serialization.py save(): ShardedObject("common_state",
 * state, (1,), (0,)), its unique key KEY/shard_OFFSETS_SHAPE). */
#define MEGATRON_DIST_CONFIG "metadata.json"
#define MEGATRON_DIST_COMMON_FILE "common.pt"
#define MEGATRON_DIST_COMMON_KEY "common_state/shard_0_1"

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
/* The bytes (size) of a tensor found in that rank file's values (state a
 * writer carries over), its entry checked against its CRC-32
 * (torch_tensor_read_checked). */
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
/* Whether a canonical parameter is one of the vocabulary's tables (the word
 * embeddings, the output layer), whose rows Megatron pads. */
int megatron_is_vocabulary_table(const char *param);
/* A vocabulary table's rows and split (d's other fields kept): as stored,
 * padded; or, the true vocabulary told (config->true_vocab), its rows
 * padded as Megatron pads them for any tp (a multiple of
 * make_vocab_size_divisible_by x tp), so that a reshard pads it again for
 * its target. */
void megatron_describe_vocabulary(const megatron_config *config, ckpt_tensor_desc *d);
/* Sets config->true_vocab; refused (naming path) when true_vocab does not
 * pad to the stored rows at the checkpoint's tp. */
int megatron_config_set_true_vocab(megatron_config *config, const char *path, int64_t true_vocab);

/* A torch_dist checkpoint's common state as read (a dict: args,
 * checkpoint_version, iteration, the optimizer's param groups and step,
 * the schedule...), the archive holding it (for its tensors) and where it
 * was read (named in messages). */
const pickle_value *megatron_dist_common_state(const megatron_dist *checkpoint, const torch_archive **archive,
                                               const char **where);

/* ---------------------------------------------- what the writers share */

/* A save directory (both formats): the tracker file, the iteration's
 * directory (iter_NNNNNNN, or release for iteration -1) created under root
 * (its path in out), a small text file written whole and synced. */
#define MEGATRON_TRACKER_NAME "latest_checkpointed_iteration.txt"
int megatron_save_iteration_dir(const char *root, int64_t iteration, char *out, size_t size);
int megatron_save_tracker(const char *root, int64_t iteration);
int megatron_save_text(const char *path, const char *text);
/* Whether an entry of a save's iteration (level 1: in the iteration's
 * directory; 2: in a directory of it; -1: whether a level-1 entry is a
 * directory to look into) is one its writer writes. */
typedef int (*megatron_entry_is_ours)(int level, const char *name);
/* What --force may replace: nothing, or a save directory holding the
 * tracker and one iteration of only what ours accepts (kind and writes
 * name them in the refusal, which names the first stray entry). */
int megatron_save_may_replace(const store_ops *storage, const char *path, const char *kind, const char *writes,
                              megatron_entry_is_ours ours);

#include "torch_write.h"

/* The args a writer writes (megatron_args_write): the template's, carried
 * as data and known classes only (torch_write.h pk_value), with the
 * output's layout and the model family its names say; or, without a
 * template, written from the model. */
typedef struct {
    const megatron_config *model;
    megatron_naming naming;       /* the output's names */
    int tp, pp;                   /* the output's layout */
    const pickle_value *args;     /* the template's args (an argparse.Namespace), or NULL */
    const char *file;             /* where they were read, named in refusals */
    const char *ckpt_format;      /* "torch_dist": written as args.ckpt_format; NULL: the template's ("torch" without one) */
    /* args.no_save_optim and no_save_rng set to 0 or 1 (what the
     * checkpoint holds, which Megatron's loader reads); -1: the template's
     * (absent without one) */
    int no_optimizer, no_rng;
    /* The template's model family (use_legacy_models, use_mcore_models,
     * transformer_impl) kept: the output's names are its own (Transformer
     * Engine's names are also those of local modules with fused norms). */
    int keep_family;
} megatron_args_spec;
int megatron_args_write(byte_buffer *b, pk_memo *memo, const megatron_args_spec *spec);

/* A target layout, checked against the model as Megatron would: layers
 * over pp, heads, query groups and ffn over tp, and a padded vocabulary
 * that is Megatron's for the target tp (unless the true size is known). */
int megatron_check_layout(const megatron_config *config, const ckpt_layout *to, megatron_naming naming);

/* Megatron-Core's key of a canonical tensor, a layer's in the form stacked
 * along a leading axis (decoder.layers.MODULE.LEAF, *layer its place; -1
 * for a tensor outside the layers), under naming's module names. */
int megatron_core_key(megatron_naming naming, const char *canonical, char *key, size_t size, int64_t *layer);
/* The i-th module of a layer with an _extra_state under naming
 * ("self_attention.linear_qkv"), or NULL past the last. */
const char *megatron_layer_extra_module(megatron_naming naming, int i);

/* The vocabulary's padding rows among rows [row0, row0 + count) of piece
 * piece at degree tp of source's tensor index, as Megatron's saver re-pads
 * a table (docs/MEGATRON.md section 9): the source's stored rows where it
 * has them (a larger table is cut), its last stored row repeated beyond (a
 * smaller one is extended); nothing (zeros) for this format's sources,
 * tensors without padding, and a source whose reader leaves its stored
 * padding out (!stored_padding: a torch_dist checkpoint, read as whole
 * tensors: its last row read would be a token's). buf holds those rows. */
int megatron_fill_vocabulary_padding(ckpt_reader *source, int stored_padding, int index, int tp, int piece, int64_t row0,
                                     int64_t count, void *buf);

/* ------------------------------------------------- modules and buffers
 * (megatron_modules.c) */

/* A module of a transformer layer, as Megatron builds it: its parameters
 * in the order it registers them (named_parameters()'s), their canonical
 * names after layers.N., and its _extra_state. */
enum { MEGATRON_NO_EXTRA, MEGATRON_EXTRA_NONE, MEGATRON_EXTRA_TE }; /* none, None, Transformer Engine's */
typedef struct {
    const char *module;       /* under layers.N. */
    const char *leaves[4];    /* its parameters, NULL-terminated */
    const char *canonical[4]; /* their canonical names after layers.N. */
    int extra;
} megatron_layer_module;

/* A layer's modules in registration order, NULL-terminated (module NULL):
 * of the legacy model, of Transformer Engine's modules (MEGATRON_NAMES_CORE)
 * or of Megatron-Core's local ones (MEGATRON_NAMES_CORE_LOCAL). */
const megatron_layer_module *megatron_layer_modules(megatron_naming naming);

/* The parameters of model chunk vp_rank of pipeline stage pp_rank of a
 * Megatron-Core GPT (c->impl's modules) in named_parameters() order: the
 * embeddings, the layers' parameters, the final norm, the output layer.
 * find(ctx, canonical) gives a parameter's index, or -1 where the model
 * has none (no biases, rotary positions); the tied embeddings' copy on the
 * last stage (pp > 1) is MEGATRON_HEAD_COPY. out has room for max;
 * *count receives how many. TP_ERR_LAYOUT for modules whose order is not
 * known (c->impl MEGATRON_IMPL_OTHER). */
#define MEGATRON_HEAD_COPY (-2)
int megatron_core_chunk_params(const megatron_config *c, int pp_rank, int vp_rank, int (*find)(void *ctx, const char *canonical),
                               void *ctx, int *out, int max, int *count);

/* A parameter of a distributed optimizer's buffer. */
typedef struct {
    int64_t numel; /* of its tensor-parallel piece */
    int shared;    /* Megatron's shared_embedding (tied embeddings with pp > 1): a bucket of its own */
    int bucket;    /* out: its bucket */
    int64_t start; /* out: its first element in the bucket */
} megatron_buffer_param;

/* Places a buffer's parameters (params, in named_parameters() order) in
 * its buckets as Megatron's distributed optimizer does (docs/MEGATRON.md
 * section 8): in reverse order, each start padded to 64 elements, a
 * shared embedding in a bucket of its own. Where else a bucket ends (at
 * --ddp-bucket-size elements) is taken from bucket_numel, the unpadded
 * size of each of num_buckets buckets as the checkpoint records them,
 * which must match: TP_ERR_FORMAT naming where, the bucket and both
 * sizes. Positions are bucket-relative, so the data-parallel size (which
 * pads buckets' ends) does not enter. */
int megatron_buffer_layout(megatron_buffer_param *params, int n, const int64_t *bucket_numel, int num_buckets,
                           const char *where);

#endif
