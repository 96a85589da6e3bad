/* megatron.h: Megatron-LM legacy checkpoints (`--ckpt-format torch`), read
 * as logical tensors with the partition descriptions of this project's
 * format (ckpt/ckpt.h), so that the planner, digests and verification
 * apply to them unchanged. docs/MEGATRON.md describes the layout.
 *
 * A checkpoint is a directory: latest_checkpointed_iteration.txt (a number
 * or "release"), iter_NNNNNNN/ or release/, and in it one torch.save file
 * per tensor- and pipeline-parallel rank, mp_rank_TT/model_optim_rng.pt
 * (pp 1) or mp_rank_TT_PPP/model_optim_rng.pt. Each holds `args` (the
 * model's shape and the layout), `checkpoint_version`, `iteration` and the
 * model's weights of that rank: `model`, or `model0`, `model1`, ... with a
 * virtual pipeline. Both namings are read: the legacy nested dicts
 * (language_model.embedding, encoder.layers.N.self_attention.
 * query_key_value, ...) and Megatron-Core's flat names (decoder.layers.N.
 * self_attention.linear_qkv, Transformer Engine's fused layer norms).
 *
 * Tensors get canonical names, global layer numbers and descriptions:
 *   embedding.word_embeddings.weight    [padded vocab, h]  split 0 (as stored, padded)
 *   embedding.position_embeddings.weight [positions, h]    replicated (learned positions)
 *   layers.N.input_norm.{weight,bias}                      replicated
 *   layers.N.attention.qkv.{weight,bias} [(heads + 2 groups) kv, h]
 *                                       split 0 ([q of the group's heads, k, v] per
 *                                       group), granule one group's rows (legacy
 *                                       names) or one head's (Megatron-Core, which
 *                                       cuts a group between ranks when tp > groups)
 *   layers.N.attention.dense.weight     [h, heads kv]      split 1, granule kv channels
 *   layers.N.attention.dense.bias, layers.N.post_norm.*    replicated
 *   layers.N.mlp.fc1.{weight,bias}      [ffn, h] split 0; SwiGLU: [2 ffn, h], segments [gate, up]
 *   layers.N.mlp.fc2.weight             [h, ffn]           split 1
 *   layers.N.mlp.fc2.bias, final_norm.{weight,bias}        replicated
 *   output_layer.weight                 [padded vocab, h]  split 0 (untied embeddings)
 * With tied embeddings and pp > 1 the last stage holds a copy of the word
 * embeddings (word_embeddings_for_head, or Core's output_layer); it is
 * checked to have the embedding's shape and is not a tensor of its own.
 *
 * Functions return a tp_status; the message names the file and tensor. */
#ifndef TP_FORMATS_MEGATRON_H
#define TP_FORMATS_MEGATRON_H

#include <stdint.h>

#include "../ckpt/ckpt.h"
#include "torch.h"

/* How a checkpoint names its tensors (docs/MEGATRON.md section 4). */
typedef enum {
    MEGATRON_NAMES_LEGACY,           /* megatron/legacy: input_norm, post_attention_norm, final_norm, _extra_state */
    MEGATRON_NAMES_LEGACY_LAYERNORM, /* older legacy: input_layernorm, post_attention_layernorm, final_layernorm */
    MEGATRON_NAMES_CORE,             /* Megatron-Core, Transformer Engine: linear_qkv.layer_norm_weight, ... */
    MEGATRON_NAMES_CORE_LOCAL,       /* Megatron-Core, local modules: input_layernorm, pre_mlp_layernorm */
} megatron_naming;

/* "legacy", "legacy-layernorm", "core", "core-local" and back. */
const char *megatron_naming_name(megatron_naming naming);
int megatron_naming_parse(const char *text, megatron_naming *out);

/* The modules a Megatron-Core model is built of (args.transformer_impl;
 * Megatron-LM's default is Transformer Engine's): their parameters'
 * registration order is the order of the distributed optimizer's buffers. */
typedef enum {
    MEGATRON_IMPL_TRANSFORMER_ENGINE, /* "transformer_engine": linear_proj, then linear_qkv with its fused norm, ... */
    MEGATRON_IMPL_LOCAL,              /* "local": input_layernorm, linear_proj, linear_qkv, pre_mlp_layernorm, ... */
    MEGATRON_IMPL_OTHER,              /* another one, or a layer spec of its own (args.spec) */
} megatron_impl;

typedef struct {
    int64_t iteration;           /* -1 for a release checkpoint */
    double checkpoint_version;
    int tp, pp, vpp;             /* vpp 1 without a virtual pipeline */
    int core_names;              /* Megatron-Core's flat names (else the legacy nested dicts) */
    megatron_naming naming;      /* in detail */
    int64_t stored_iteration;    /* `iteration` as the files hold it (also in a release checkpoint) */
    int64_t consumed_samples;    /* args.consumed_train_samples */
    int64_t num_layers, hidden, ffn, heads, query_groups, kv_channels;
    int64_t padded_vocab, vocab_divisible_by, max_positions;
    int64_t true_vocab;          /* the tokens of the vocabulary when told (megatron_set_true_vocab), else 0 */
    int swiglu, untied, learned_positions, has_bias, tied_head_copy;
    int openai_gelu;             /* GELU's tanh approximation (else the exact one) */
    int rmsnorm;                 /* RMSNorm (else LayerNorm) */
    int post_layernorm_residual; /* apply_residual_connection_post_layernorm */
    double norm_epsilon;
    /* Rotary embeddings (position_embedding_type "rope"): */
    double rotary_base;          /* rotary_base (10000 by default) */
    double rotary_percent;       /* the part of each head turned (1.0: all of it) */
    int rotary_interleaved;      /* pairs (2j, 2j+1) instead of (j, j + hd/2) */
    double rope_scaling_factor;  /* use_rope_scaling: Llama 3's scaling by rotary_scaling_factor
                                    (low 1, high 4, original length 8192, as Megatron fixes them); 0: none */
    int qk_layernorm;            /* norms of the queries and keys (Qwen 3, ...) */
    tp_dtype dtype;
    int has_optimizer;           /* an `optimizer` entry is in the rank files */
    int optimizer_read;          /* and its state was read: tensors optim/ROLE/NAME (megatron_optimizer_refusal says why not) */
    int distributed_optimizer;   /* read from the distributed optimizer's distrib_optim.pt files */
    megatron_impl impl;          /* args.transformer_impl (and args.spec) */
} megatron_config;

typedef struct megatron_checkpoint megatron_checkpoint;

/* Whether path is a Megatron legacy checkpoint (*found): a directory
 * holding latest_checkpointed_iteration.txt (whatever it holds), or a
 * directory named iter_NNNNNNN or release holding mp_rank_00/ or
 * mp_rank_00_000/ with a rank file. A store that fails to answer is an
 * error (a URL's server stalled), not a "no". */
int megatron_detect(const char *path, int *found);

/* Opens every rank file of the checkpoint at path (the directory with
 * latest_checkpointed_iteration.txt, or an iteration's directory) and checks
 * that args agree with the files found, that every tensor is known, present
 * on every rank of its stage with its expected piece shape and dtype. */
int megatron_open(const char *path, megatron_checkpoint **out);
void megatron_close(megatron_checkpoint *checkpoint);

const megatron_config *megatron_config_of(const megatron_checkpoint *checkpoint);
/* Tells the true size of the vocabulary (Megatron records only the padded
 * one): the word embeddings, output layer and their optimizer state are
 * then described as true_vocab rows, the rest Megatron's padding
 * (make_vocab_size_divisible_by x tp), which a reshard recomputes for its
 * target (zero rows, a table cut or padded: what a TP change needs).
 * Refused when true_vocab does not pad to the stored size at this tp. */
int megatron_set_true_vocab(megatron_checkpoint *checkpoint, int64_t true_vocab);
/* Megatron's padding of a vocabulary (_vocab_size_with_padding): its rows
 * to a multiple of make_vocab_size_divisible_by x tp. */
int64_t megatron_vocab_with_padding(int64_t vocab, int64_t divisible_by, int tp);
/* Why the rank files' optimizer state is not read, or NULL: it was, or
 * there is none. The weights are read either way. *status (when not NULL)
 * tells TP_ERR_LAYOUT, a layout not read (the distributed optimizer's
 * distrib_optim.pt, param groups the weight-decay rule does not explain),
 * from TP_ERR_FORMAT, state that contradicts the model (damaged). */
const char *megatron_optimizer_refusal(const megatron_checkpoint *checkpoint, int *status);
/* Bytes of the checkpoint's files (rank files, and distrib_optim.pt files where read). */
int64_t megatron_bytes(const megatron_checkpoint *checkpoint);

/* What megatron_check_replicas found. */
typedef struct {
    int tensors;                 /* tensors stored more than once, their copies compared */
    int copies;                  /* copies compared with the one read */
    int64_t bytes;               /* bytes read, the copies read included */
    int tensors_differ;          /* tensors with a copy not bitwise the one read */
    int copies_differ;           /* such copies */
    char first_difference[1536]; /* the first: tensor, both files, the first element differing, both values */
} megatron_replica_result;

/* Compares, bit for bit, every copy of a tensor stored more than once with
 * the copy the reader takes (threads tensors at a time): a replicated
 * tensor (norms, the biases of row-parallel layers, position embeddings)
 * and its optimizer state are in every tensor-parallel rank's file and read
 * from rank 0's; with tied embeddings and pp > 1 the last stage holds a
 * copy of the word embeddings (and of their optimizer state) and the first
 * stage's is read. Megatron keeps them equal (one all-reduced gradient, one
 * update); copies that differ are damage (a bug or a flipped bit on one
 * rank: which value is right cannot be told), counted in result, not
 * returned; a failure to read is. A NaN differs from a number, and from
 * another NaN of other bits. */
int megatron_check_replicas(const megatron_checkpoint *checkpoint, int threads, megatron_replica_result *result);
/* TP_OK where no copy differs; else TP_ERR_FORMAT saying path and result's
 * first difference (the tensor, both files, the element, both values) and
 * how many differ. One message for every reader that refuses copies that
 * differ (the legacy and torch_dist ones). */
int megatron_replicas_refusal(const char *path, const megatron_replica_result *result);
/* megatron_check_replicas, copies that differ refused (megatron_replicas_refusal):
 * what a tool whose output takes the copies read asks first (export,
 * import, a reader computing digests), since its output would hold one of
 * two values without a word. */
int megatron_refuse_differing_copies(const megatron_checkpoint *checkpoint, int threads);

/* Bytes of buffers one thread of megatron_verify (or of the torch_dist
 * reader's check of its copies) holds at most, whatever the checkpoint: a
 * zip entry read TORCH_ARCHIVE_CHECK_BYTES at a time, or a block of 1 MiB
 * of each of two copies of a tensor compared (megatron_check_replicas). */
#define MEGATRON_VERIFY_THREAD_BYTES ((int64_t)2 << 20)

/* What megatron_verify found. */
typedef struct {
    int files;              /* rank files, and distrib_optim.pt files where read */
    int entries, unchecked; /* zip entries read; of them, recording no CRC-32 to compare with */
    int damaged;            /* files with an entry whose CRC-32 differs */
    char first_damage[640]; /* the first such entry: file, entry, both CRC-32s */
    megatron_replica_result replicas; /* the copies of tensors stored more than once compared */
} megatron_verify_result;

/* Reads every zip entry of every file of the checkpoint and compares it
 * with the CRC-32 its archive records (threads files at a time): the
 * checksums a Megatron checkpoint has; then compares every copy of a tensor
 * stored more than once with the one read (megatron_check_replicas).
 * Damage is counted in result, not returned; a failure to read is.
 * on_bytes (may be NULL) hears the bytes of the files read, from worker
 * threads. */
int megatron_verify(const megatron_checkpoint *checkpoint, int threads, void (*on_bytes)(void *ctx, int64_t bytes),
                    void *ctx, megatron_verify_result *result);
/* The iteration's directory. */
const char *megatron_path(const megatron_checkpoint *checkpoint);
/* The layout of the checkpoint's files (dp 1). */
ckpt_layout megatron_layout(const megatron_checkpoint *checkpoint);

int megatron_num_tensors(const megatron_checkpoint *checkpoint);
const ckpt_tensor_desc *megatron_tensor(const megatron_checkpoint *checkpoint, int index);
/* The tensor's name in the rank files (e.g. "language_model.encoder.layers.0.
 * self_attention.query_key_value.weight", nested keys joined by '.'). */
const char *megatron_source_name(const megatron_checkpoint *checkpoint, int index);

/* Where tp_rank's piece of tensor index lies: the rank file and the byte
 * range in it (the piece is stored whole and row-major, as
 * ckpt_piece_shape says). */
int megatron_piece_range(const megatron_checkpoint *checkpoint, int index, int tp_rank, const char **file,
                         int64_t *offset, int64_t *size);
/* Reads tp_rank's piece of tensor index into buf (size bytes). */
int megatron_read_piece(const megatron_checkpoint *checkpoint, int index, int tp_rank, void *buf, int64_t size);

/* The checkpoint as a ckpt_reader of a foreign checkpoint (ckpt.h): the
 * tensors above, their pieces byte ranges of the rank files, the iteration
 * as the step; each tensor's logical digest computed when compute_digests
 * (a read of every byte), and with it every copy of a tensor stored more
 * than once compared with the one read (megatron_check_replicas): copies
 * that differ are refused (TP_ERR_FORMAT naming the tensor, both files, the
 * element and both values), since digests of the copy read would prove an
 * output equal to one of two values. The reader does not need the
 * checkpoint after. */
int megatron_reader_open(const megatron_checkpoint *checkpoint, int compute_digests, ckpt_reader **out);

typedef struct {
    int tp, pp;             /* the output's degrees; 0 keeps the template's */
    int naming;             /* a megatron_naming; -1: the template's */
    int overwrite;          /* replace an existing output */
    int threads;            /* rank files written at once; 0: all cores */
    int weights_only;       /* leave the optimizer state out */
    int64_t memory_limit;   /* piece buffers of all threads; 0: RESHARD_DEFAULT_MEMORY */
    int64_t block_bytes;    /* a piece streams through a buffer of about this size; 0: 256 KiB (tests make it small) */
    /* Without a template (NULL): the model to write, its args written from
     * it (the iteration its stored_iteration, tp and pp the default layout). */
    const megatron_config *model;
    /* Without a template: a torch_dist source (model its config), whose
     * common state's args are carried as a template's are (the output's
     * layout, format and names given them) and its work done
     * (num_floating_point_operations_so_far); NULL: args from the model. */
    const struct megatron_dist *dist;
    /* A source under other names than Megatron's canonical ones (this
     * toolkit's GPT); NULL: the source's names are canonical. */
    const struct megatron_source_names *names;
    void (*on_bytes)(void *ctx, int64_t bytes); /* progress: tensor bytes written, from worker threads */
    void *progress_ctx;
} megatron_write_options;

/* How a source under its own names gives Megatron's tensors: the index of
 * the source's tensor for a canonical name (-1: none), and a fused QKV's
 * piece at degree tp reordered from the source's layout into Megatron's
 * (blocks of kv_channels rows of block_bytes each; tp at most the query
 * groups, where both pieces hold the same whole groups: the writers read a
 * group whole where Megatron-Core cuts it between ranks). */
typedef struct megatron_source_names {
    int (*find)(void *ctx, const char *canonical);
    void (*qkv_to_megatron)(void *ctx, int tp, const void *piece, void *out, size_t block_bytes);
    void *ctx;
    /* The canonical name of the source's tensor index, or NULL (not one of
     * Megatron's): what the torch_dist writer keys tensors by. */
    const char *(*canonical)(void *ctx, int index);
} megatron_source_names;

/* What a write does, decided before anything is written. */
typedef struct {
    int tp, pp;             /* the output's layout */
    int files, tensors;     /* rank files; the source's tensors written (optimizer state included) */
    int64_t bytes;          /* tensor data, all rank files together */
    int64_t largest_buffer; /* bytes a thread buffers at most (and as much staging): a block of rows streamed,
                             * or a whole piece where a QKV is reordered */
    int threads;            /* rank files written at once, within the memory limit */
    int64_t buffer_memory;  /* threads x twice the largest buffer */
    int optimizer;          /* the optimizer state is written */
    int rank_state_dropped; /* the ranks' RNG (and rerun) states are left out: the layout changes */
} megatron_write_plan;

/* The plan of megatron_write with these arguments, and every refusal it
 * would make, without writing anything. */
int megatron_write_plan_create(ckpt_reader *source, const megatron_checkpoint *template,
                               const megatron_write_options *options, megatron_write_plan *plan);

/* Writes source (tensors with this reader's canonical names, at any
 * layout: a Megatron checkpoint's reader, or its reshard) as a Megatron-LM
 * legacy checkpoint at out: latest_checkpointed_iteration.txt and the
 * iteration's directory of rank files that torch.load reads, with
 * template's args (the parallel sizes changed), checkpoint_version 3.0 and
 * iteration. When the source has the optimizer state (optim/ROLE/NAME, as
 * megatron_reader_open gives it) and weights_only is not set, each rank's
 * optimizer state dict is written as Megatron's optimizers write it, with
 * the template's param-group settings, loss scaler and schedule (the
 * distributed optimizer's distrib_optim.pt is not written: refused, unless
 * weights_only). Each
 * rank's RNG and rerun state is carried over when the layout is the
 * template's and left out otherwise (report says so; Megatron does the
 * same on a change of layout). What is carried over from the template
 * goes back as data and known classes only (torch_write.h pk_value:
 * argparse.Namespace, torch dtypes, numpy arrays, Megatron's enums, an
 * io.BytesIO holding torch.save(None)), since torch.load calls what a
 * pickle names: a call of anything else is refused before anything is
 * written, naming the file, its key ("args.data_path[3]") and its class;
 * what the template shares is shared again (memo GETs), so that the output
 * stays the size of its input. The output is staged and appears whole or
 * not at all. Refused, naming the cause: a layout the model does not
 * divide into, and a padded vocabulary that is not a multiple of the
 * target's padding, a piece that does not fit the memory limit. plan
 * (may be NULL) receives what was done. */
int megatron_write(ckpt_reader *source, const megatron_checkpoint *template, const megatron_write_options *options,
                   const char *out, megatron_write_plan *plan);

/* What --force may replace with a Megatron output (a store_replace_check,
 * also asked of a URL before anything is written): nothing that is a run
 * directory of the toolkit, and only a directory holding what the writer
 * writes: latest_checkpointed_iteration.txt and one iteration directory
 * (iter_NNNNNNN or release) of mp_rank_* directories of rank files.
 * Otherwise TP_ERR_EXISTS naming what is there (a second iteration: a
 * run's history; mp_rank_*: an iteration, not a save directory). ctx is
 * unused. */
int megatron_may_replace(const store_ops *storage, const char *path, void *ctx);

/* ------------------------------------------- Megatron-Core torch_dist */

/* Megatron-Core's distributed checkpoints (`--ckpt-format torch_dist`, its
 * default): the iteration's directory holds metadata.json (the backend,
 * "torch_dist") and a PyTorch distributed checkpoint (formats/dcp.h) under
 * Megatron-Core's keys; the common state (what every rank shares: args,
 * checkpoint_version, iteration) is common.pt beside them up to
 * Megatron-Core 0.18, and since 0.19 the checkpoint's bytes entry
 * common_state/shard_0_1 (a torch.save of [state]). A homogeneous model's layers
 * are stacked along a leading axis (decoder.layers.self_attention.
 * linear_qkv.weight [layers, rows, hidden], each chunk one layer of one
 * rank); a non-homogeneous one's are numbered (decoder.layers.N. ...);
 * Transformer Engine's _extra_state and other objects are bytes entries.
 * They are read as the canonical tensors above, each layer a tensor of its
 * own, whatever the chunking; the optimizer's state where it is stored in
 * the model's space (optimizer.state.exp_avg|exp_avg_sq|fp32_param.KEY, as
 * the non-distributed optimizer and the distributed one's
 * fully_reshardable layout store it), as optim/ROLE/NAME. */
#include "dcp.h"

typedef struct megatron_dist megatron_dist;

/* Whether path is one (*found): its iteration's directory (path, or the
 * one its tracker file names) holds metadata.json. */
int megatron_dist_detect(const char *path, int *found);
/* Reads metadata.json, the DCP metadata and the common state (the model,
 * checked as megatron_open checks args), and maps every tensor to its
 * canonical name, checking its shape against the model. Refused, naming
 * it: another backend (zarr), no common state, a tensor it does not know. */
int megatron_dist_open(const char *path, megatron_dist **out);
void megatron_dist_close(megatron_dist *checkpoint);
const megatron_config *megatron_dist_config(const megatron_dist *checkpoint);
/* The iteration's directory. */
const char *megatron_dist_path(const megatron_dist *checkpoint);
const dcp_checkpoint *megatron_dist_dcp(const megatron_dist *checkpoint);
/* Why the optimizer's state is not read (another layout), or NULL. */
const char *megatron_dist_optimizer_refusal(const megatron_dist *checkpoint);
/* The layout the optimizer's state was read from, or NULL (none, or not
 * read): "model space" (the non-distributed optimizer's), or the
 * distributed optimizer's "fully_reshardable", "fully_sharded_model_space"
 * or "dp_reshardable". */
const char *megatron_dist_optimizer_layout(const megatron_dist *checkpoint);
/* Where the common state was read: "common.pt" (up to 0.18) or
 * "common_state" (the entry, 0.19+). */
const char *megatron_dist_common_source(const megatron_dist *checkpoint);
/* Every zip entry of the common state's torch.save (common.pt, or the
 * archive the common_state entry holds) read and compared with its CRC-32
 * (torch_archive_check): common.pt is no item of dcp_verify's, and the
 * common_state entry is a raw bytes item that records no CRC-32 of its own. */
int megatron_dist_check_common(const megatron_dist *checkpoint, torch_archive_check_result *result);
/* The checkpoint as a foreign reader at tp 1 pp 1 (its layers the model's):
 * every chunk's item located (threads at once; 0: all cores); digests
 * computed with compute_digests. */
int megatron_dist_reader_open(const megatron_dist *checkpoint, int compute_digests, int threads, ckpt_reader **out);
/* The distributed optimizer's dp_reshardable buckets hold a parameter's
 * state once per buffer that holds the parameter: a replicated parameter's
 * (the norms, the biases of row-parallel layers) on every tensor-parallel
 * rank, the tied word embeddings' on the first and the last stage; the
 * reader takes tensor-parallel rank 0's, the first stage's. Compares, bit
 * for bit, every other copy with that one (threads: locating the chunks),
 * as megatron_check_replicas does a legacy checkpoint's: copies that differ
 * are damage counted in result (the first described: the state, the
 * element in the piece, both values, files and bucket keys), not returned;
 * a failure to read is. Nothing to compare (another layout, tp 1 without
 * tied copies) is TP_OK with result zero. */
int megatron_dist_check_replicas(const megatron_dist *checkpoint, int threads, megatron_replica_result *result);
/* megatron_dist_check_replicas, copies that differ refused (megatron_replicas_refusal):
 * what a reader computing digests and a tool whose output takes the copies read ask first. */
int megatron_dist_refuse_differing_copies(const megatron_dist *checkpoint, int threads);
/* megatron_set_true_vocab for a torch_dist checkpoint (its tables stored
 * whole, padded for the tp it was saved at): the rows past true_vocab are
 * Megatron's padding, left out. Before megatron_dist_reader_open. */
int megatron_dist_set_true_vocab(megatron_dist *checkpoint, int64_t true_vocab);

/* ------------------------------------ Megatron-Core torch_dist written */

/* Where the output keeps its common state, as the Megatron-Core release
 * that will load it does (megatron/core/dist_checkpointing/serialization.py,
 * changed by 40b1fd37c1 "deprecate common strategy", 2026-07-08, first
 * released in core_v0.19.0). */
typedef enum {
    MEGATRON_CORE_COMMON_ENTRY = 0, /* 0.19 and later: the bytes entry common_state/shard_0_1 (the default) */
    MEGATRON_CORE_COMMON_FILE,      /* up to 0.18: common.pt beside .metadata */
} megatron_core_common;
/* A release "0.N" (or "0.N.M"): 0.18 and earlier keep common.pt, 0.19 and later the entry. */
int megatron_core_release_parse(const char *text, megatron_core_common *out);

typedef struct {
    int tp, pp;                   /* the output's layout; 0: the model's */
    megatron_core_common common;
    dcp_torch_version torch_version; /* the class paths of .metadata: 2 for Megatron-Core (the default) */
    int overwrite, threads;
    int weights_only;             /* leave the optimizer state out */
    int64_t memory_limit;         /* buffers of all threads; 0: RESHARD_DEFAULT_MEMORY */
    /* The model (required): its args are written from the template's or from it. */
    const megatron_config *model;
    /* A torch_dist source: its common state carried (args with the
     * output's layout, the optimizer's param groups and step, the
     * schedule), its _extra_state objects, and its RNG states where the
     * layout is its own. */
    const megatron_dist *dist;
    /* A legacy source: its args, and with the optimizer its first rank
     * file's param groups, step, loss scaler and schedule. */
    const megatron_checkpoint *legacy;
    /* A source under other names than Megatron's (this toolkit's GPT; its
     * canonical() required); NULL: the source's names are canonical. */
    const megatron_source_names *names;
    void (*on_bytes)(void *ctx, int64_t bytes); /* progress: tensor bytes written, from worker threads */
    void *progress_ctx;
} megatron_dist_write_options;

typedef struct {
    int tp, pp;
    megatron_naming naming;       /* the output's keys: core (Transformer Engine's fused norms) or core-local */
    int files;                    /* data files __R_0.distcp, one per rank */
    int tensors, chunks;          /* the source's tensors written (optimizer state included), their chunks */
    int entries;                  /* the keys of the checkpoint's tensors (layers stacked) */
    int objects;                  /* bytes entries: carried from a torch_dist source, or written (common_state, _extra_state) */
    int left_out;                 /* bytes entries of a torch_dist source left out (its RNG states on a change of layout) */
    int64_t bytes;                /* tensor data written */
    int threads;
    int64_t buffer_memory;
    int optimizer;                /* the optimizer state is written */
    int rng;                      /* the ranks' RNG states are carried (args.no_save_rng otherwise) */
} megatron_dist_write_plan;

/* The plan of megatron_dist_write, and every refusal it would make,
 * without writing anything. */
int megatron_dist_write_plan_create(ckpt_reader *source, const megatron_dist_write_options *options,
                                    megatron_dist_write_plan *plan);

/* Writes source (tensors under Megatron's canonical names, or options->
 * names) as a Megatron-Core torch_dist checkpoint at out, as Megatron-Core's
 * dist_checkpointing.save writes one (docs/MEGATRON.md "Writing"):
 * latest_checkpointed_iteration.txt and the iteration's directory of
 * metadata.json, the PyTorch distributed checkpoint (a data file per
 * rank; layers stacked along a leading axis, each chunk one layer of one
 * rank's piece; the vocabulary padded for the target tp) and the common
 * state (common.pt or the common_state entry); the Adam state in the
 * model's space (optimizer.state.exp_avg|exp_avg_sq|fp32_param.KEY) where
 * the source has it; args.no_save_optim and no_save_rng say what is left
 * out, for Megatron's loader. Staged: it appears whole or not at all. */
int megatron_dist_write(ckpt_reader *source, const megatron_dist_write_options *options, const char *out,
                        megatron_dist_write_plan *plan);

/* What --force may replace with a torch_dist output (a store_replace_check):
 * nothing that is a run directory of the toolkit, and only a directory
 * holding what the writer writes (the tracker and one iteration directory
 * of metadata.json, common.pt, .metadata and __R_0.distcp files). */
int megatron_dist_may_replace(const store_ops *storage, const char *path, void *ctx);

#endif
