/* dcp.h: PyTorch distributed checkpoints (torch.distributed.checkpoint,
 * "DCP": what torchtitan, FSDP and Megatron-Core's torch_dist backend
 * write), read without executing anything and written at any layout.
 * docs/DCP.md describes the layout.
 *
 * A DCP checkpoint is a directory: `.metadata`, a pickle of a Metadata
 * object (state_dict_metadata: per key of the saved state dict, a tensor's
 * dtype, global size and chunks, each a box of offsets and sizes, or a
 * bytes entry; storage_data: per (key, offset) the file, offset and
 * length of its item), and data files `__R_N.distcp`, each the items of
 * one rank one after the other: a tensor chunk is a complete torch.save
 * archive of that chunk, a bytes entry the bytes the planner serialized
 * (torch.save of the object). Class paths have moved between PyTorch
 * versions (torch.distributed._shard.checkpoint in 1.13): they are
 * matched by class name.
 *
 * Tensors of fp32, bf16 or fp16 with one to eight dimensions are read as
 * this project's tensors (ckpt.h), each chunk a box of its only piece at
 * tp 1 (ckpt_foreign_box; a chunk torch saved dense in another order, a
 * transposed one, as the boxes of its runs): reshard, export, diff and
 * verify work on any chunking, reading only the rows a piece needs. The
 * rest (bytes entries, tensors of other dtypes, scalars) are the
 * checkpoint's other entries, carried byte for byte by a DCP output and
 * left out of others.
 *
 * A DCP checkpoint this project wrote carries the description of the
 * checkpoint it was made from (a bytes entry, DCP_INDEX_KEY): partitions,
 * pipeline anchors, roles, training state and logical digests come back
 * from it, so a round trip through DCP is exact and digests prove it.
 * Other DCP checkpoints are described plainly: every tensor replicated,
 * on the first stage, a parameter, under its key as name.
 *
 * Functions return a tp_status; the message names the file and the key. */
#ifndef TP_FORMATS_DCP_H
#define TP_FORMATS_DCP_H

#include <stdint.h>

#include "../ckpt/ckpt.h"
#include "torch.h"

/* The bytes entry holding this project's description of the checkpoint. */
#define DCP_INDEX_KEY "tp_toolkit.index_json"

typedef struct dcp_checkpoint dcp_checkpoint;

/* Whether path is a DCP checkpoint (*found): a directory holding
 * `.metadata`. A store that fails to answer is an error, not a "no". */
int dcp_detect(const char *path, int *found);

/* Reads `.metadata` (bounded: at most DCP_METADATA_MAX bytes) and checks
 * that every chunk has an item in a data file of the directory, every
 * file is there, and every item lies inside its file. Items are not read. */
#define DCP_METADATA_MAX ((int64_t)1 << 30)
int dcp_open(const char *path, dcp_checkpoint **out);
void dcp_close(dcp_checkpoint *dcp);

const char *dcp_path(const dcp_checkpoint *dcp);

typedef enum { DCP_TENSOR, DCP_BYTES } dcp_entry_kind;

/* One chunk of a tensor, or a bytes entry's one item. */
typedef struct {
    int64_t offsets[TORCH_MAX_DIMS], sizes[TORCH_MAX_DIMS]; /* the box in the global tensor */
    int file;                                             /* dcp_file */
    int64_t item_offset, item_bytes;                      /* the item in its file */
} dcp_chunk;

typedef struct {
    const char *key;          /* the state dict's key ("model.layers.0.attention.wq.weight") */
    /* A tensor entry's name as this project's tensor (dcp_entry_is_tensor;
     * else NULL) where the checkpoint carries no description: its key
     * where that is a tensor name (ckpt_name_is_valid: "a/b.weight" too),
     * else the key with every byte outside [A-Za-z0-9._] written "-hh" in
     * hex (UTF-8 "é.weight" is "-c3-a9.weight"); NULL too where that
     * would be longer than CKPT_NAME_MAX. */
    const char *name;
    dcp_entry_kind kind;
    torch_dtype dtype;        /* tensors */
    int ndim;
    int64_t shape[TORCH_MAX_DIMS];
    int num_chunks;
    const dcp_chunk *chunks;
    int64_t chunk_index;      /* of its first chunk among the checkpoint's */
} dcp_entry;

int dcp_num_entries(const dcp_checkpoint *dcp);
const dcp_entry *dcp_entry_at(const dcp_checkpoint *dcp, int index);
/* The entry of that key, or -1. */
int dcp_find(const dcp_checkpoint *dcp, const char *key);
/* The entry a tensor of this name is read from, or -1: the entry of that
 * name (dcp_entry.name: a plain key, kept as it is), else the entry of the
 * key dcp_key_of(name) (a name of this project's, written with '.' for
 * '/'). The readers' rule for a description's names, and a DCP output's
 * for the keys of a DCP source's tensors (dcp_write_options.keys_from). */
int dcp_find_tensor(const dcp_checkpoint *dcp, const char *name);
/* Whether an entry is read as a tensor of this project (else an other entry):
 * fp32, bf16 or fp16, of 1 to 8 dimensions, none of size 0. */
int dcp_entry_is_tensor(const dcp_entry *entry);
/* Whether an entry is an other entry (not read as a tensor, and not the
 * description DCP_INDEX_KEY): what info lists, diff leaves uncompared and a
 * DCP output carries. */
int dcp_entry_is_other(const dcp_entry *entry);

int dcp_num_files(const dcp_checkpoint *dcp);
/* Name (relative to the directory) and size in bytes of data file i. */
const char *dcp_file(const dcp_checkpoint *dcp, int i, int64_t *bytes);
/* Bytes of `.metadata` and every data file. */
int64_t dcp_bytes(const dcp_checkpoint *dcp);

/* Reads a bytes entry's item whole (at most max bytes) into *data (malloc'ed). */
int dcp_read_bytes(const dcp_checkpoint *dcp, int entry, int64_t max, void **data, int64_t *size);

/* The checkpoint as a ckpt_reader of a foreign checkpoint at tp 1 pp 1:
 * every chunk's item opened to locate its tensor (threads items at once;
 * 0: all cores), described by the carried description or plainly;
 * compute_digests reads every byte to compute the logical digests (else a
 * carried description's recorded ones, which ckpt_verify then checks). */
int dcp_reader_open(const dcp_checkpoint *dcp, int compute_digests, int threads, ckpt_reader **out);

/* Whether the checkpoint carries this project's description. */
int dcp_has_description(const dcp_checkpoint *dcp);

typedef struct {
    int items;              /* items read (tensor chunks and bytes entries) */
    int entries, unchecked; /* zip entries read; of them, recording no CRC-32 to compare with */
    int damaged;            /* items with an entry whose CRC-32 differs */
    char first_damage[640]; /* the first such entry: file, item, entry, both CRC-32s */
    int64_t item_bytes;     /* bytes of the items read */
    int64_t outside_bytes;  /* bytes of the data files in no item (not read: a tail, or gaps) */
} dcp_verify_result;

/* Reads every item whole and compares each zip entry of the torch.save
 * archives with the CRC-32 it records (threads items at a time): the
 * checksums a DCP checkpoint has. Damage is counted in result, not
 * returned; a failure to read is. on_bytes (may be NULL) hears the bytes
 * read, from worker threads. */
int dcp_verify(const dcp_checkpoint *dcp, int threads, void (*on_bytes)(void *ctx, int64_t bytes), void *ctx,
               dcp_verify_result *result);

/* ------------------------------------------------------------- writing */

/* The PyTorch whose torch.distributed.checkpoint.load reads the output:
 * the class paths of its `.metadata`. */
typedef enum {
    DCP_TORCH_2 = 0, /* torch.distributed.checkpoint.metadata, as PyTorch 2.4 and later write it */
    DCP_TORCH_1_13,  /* torch.distributed._shard.checkpoint, PyTorch 1.13 */
} dcp_torch_version;

/* "2", "1.13" and back. */
int dcp_torch_version_parse(const char *text, dcp_torch_version *out);
/* The PyTorch whose class paths a checkpoint's `.metadata` uses. */
dcp_torch_version dcp_torch_version_of(const dcp_checkpoint *dcp);

typedef struct {
    int tp, pp;                      /* the output's layout; 0: the source's */
    int dp;                          /* data-parallel ranks that cut every box again along dimension 0, as
                                        FSDP with tensor parallelism shards (torch.chunk's parts); 0 or 1: none */
    dcp_torch_version torch_version;
    int overwrite;                   /* replace an existing DCP checkpoint at the output */
    int threads;                     /* rank files written at once; 0: all cores */
    int weights_only;                /* leave out every tensor whose role is not "param" */
    int64_t memory_limit;            /* buffers of all threads; 0: RESHARD_DEFAULT_MEMORY */
    /* A DCP source whose other entries (bytes, tensors of other dtypes)
     * the output carries byte for byte; NULL: none. */
    const dcp_checkpoint *others_from;
    /* The DCP checkpoint source reads (dcp_reader_open), whose tensors
     * are written under the keys they were read from (dcp_find_tensor),
     * so that a state dict's key comes out as it went in ("a/b.weight",
     * a UTF-8 key); NULL: every tensor under dcp_key_of(name). */
    const dcp_checkpoint *keys_from;
    /* What a format built on DCP changes (dcp_internal.h; formats/ only); NULL: plain DCP. */
    const struct dcp_write_hooks *hooks;
    void (*on_bytes)(void *ctx, int64_t bytes); /* progress: tensor bytes written, from worker threads */
    void *progress_ctx;
} dcp_write_options;

/* What a write does, decided before anything is written. */
typedef struct {
    int tp, pp, dp;
    int files;          /* data files: one per rank, tp x pp x dp */
    int tensors;        /* the source's tensors written */
    int chunks;         /* their chunks: a piece's runs along its split axis (padding and replicas left out) */
    int others;         /* other entries carried */
    int64_t bytes;      /* tensor data written */
    int threads;
    int64_t buffer_memory;
    /* Buffers a thread holds reading the output back verified (a plain DCP
     * one: hooks NULL; else 0), as the reader presents it (tp1, each chunk a
     * box): the largest whole tensor's verified read, and beside it the
     * bounce buffer of the largest chunk narrower than its tensor
     * (ckpt_tensor_box_bounce_bytes): chunks of whole rows take none. */
    int64_t read_back_bytes;
} dcp_write_plan;

int dcp_write_plan_create(ckpt_reader *source, const dcp_write_options *options, dcp_write_plan *plan);

/* Writes source (any reader) as a DCP checkpoint at out: one data file per
 * rank of the layout (rank (pp_stage x tp + tp_rank) x dp + dp_rank), each
 * rank's pieces cut into the boxes of the global tensor it holds (and with
 * dp, those cut again along dimension 0), each tensor under its name
 * with '/' written '.' ("model.layers.0.attn.qkv.weight",
 * "optim.exp_avg.layers.0.attn.qkv.weight"; a DCP source's under its own
 * key, options->keys_from), a replicated tensor written
 * once (by tensor rank 0 of its stage), the source's description as the
 * bytes entry DCP_INDEX_KEY. The output is staged and appears whole or not
 * at all. plan (may be NULL) receives what was done. */
int dcp_write(ckpt_reader *source, const dcp_write_options *options, const char *out, dcp_write_plan *plan);

/* What --force may replace with a DCP output (a store_replace_check, also
 * asked of a URL before anything is written): not a run directory of the
 * toolkit, and only a directory holding what the writer writes, .metadata
 * and __R_0.distcp files. Otherwise TP_ERR_EXISTS naming what is there.
 * ctx is unused. */
int dcp_may_replace(const store_ops *storage, const char *path, void *ctx);

/* The key a tensor of this project is written under: name with '/' as '.'. */
void dcp_key_of(const char *name, char *key, size_t size);

#endif
