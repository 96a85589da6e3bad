/* formats.h: a checkpoint's weights, merged, in the files inference tools
 * load (Hugging Face safetensors, llama.cpp's GGUF, a plain HDF5 file), and
 * safetensors weights back into a sharded checkpoint (docs/EXPORT.md).
 *
 * This library knows the file formats; what a tensor is called outside and
 * whether it is transposed comes from the caller (for GPT-2:
 * model/interop.h), as a list of export_tensor. Export streams each
 * tensor through buffers sized from a memory limit, reading only checksum-
 * verified blocks of the source; import checks every header rule and shape
 * before writing anything. Outputs are committed atomically: nothing appears
 * at the output path unless it is complete.
 *
 * Functions return a tp_status; the message of a failure in the calling
 * thread is tp_errmsg(). Nothing is printed. */
#ifndef TP_FORMATS_H
#define TP_FORMATS_H

#include <stdint.h>

#include "../ckpt/ckpt.h"

typedef enum { EXPORT_SAFETENSORS = 0, EXPORT_GGUF, EXPORT_HDF5 } export_format;

/* The mark export_run writes into every output, by which --force knows an
 * earlier export of ours (export_may_replace): safetensors `__metadata__`
 * EXPORT_MARK_KEY; GGUF's first key, EXPORT_MARK_KEY, a string; HDF5's root
 * attribute `format`. The value is EXPORT_MARK in each. */
#define EXPORT_MARK_KEY "tp_toolkit.format"
#define EXPORT_MARK "tp-toolkit merged weights"

/* "safetensors", "gguf", "hdf5". */
int export_format_parse(const char *text, export_format *out);

/* Buffers of an export when no limit is given. */
#define EXPORT_DEFAULT_MEMORY ((int64_t)1 << 30)

/* Hugging Face's default shard size ("5GB"). */
#define EXPORT_DEFAULT_SHARD_BYTES ((int64_t)5000000000)

/* One tensor as the outside world names it. */
typedef struct {
    const char *source; /* name in the checkpoint */
    const char *name;   /* name in the files */
    int transpose;      /* 2-D: stored [columns, rows] outside (Hugging Face's Conv1D is [in, out]) */
    /* Rows (axis 0) of the source as the outside holds them, before any
     * transposition: */
    int64_t rows;           /* 0: all; else the first rows only (a padded vocabulary cut to its tokens) */
    int64_t block_rows;     /* with blocks: the rows in blocks of this many... */
    const int64_t *blocks;  /* ...output block j being source block blocks[j], any block of the source (a fused
                               QKV's heads reordered, or one of its Q, K, V; with rows, the output's rows) */
    /* Import only: the checkpoint tensor is these outside tensors stacked
     * along axis 0 (a fused QKV from q_proj, k_proj and v_proj), name unused;
     * not with transpose. */
    const char *const *parts;
    int num_parts;
    /* Export only: a 1-D fp32 tensor computed here instead of read (source
     * unused): llama.cpp's rope_freqs of Llama 3's frequency scaling. */
    const float *values;
    int64_t num_values;
} export_tensor;

#define IMPORT_MAX_PARTS 4

/* GGUF metadata values, in the types llama.cpp checks for. */
typedef enum { EXPORT_KV_U32, EXPORT_KV_F32, EXPORT_KV_BOOL, EXPORT_KV_STRING, EXPORT_KV_STRINGS, EXPORT_KV_I32S } export_kv_type;

typedef struct {
    const char *key;
    export_kv_type type;
    uint32_t u32;               /* EXPORT_KV_U32, and EXPORT_KV_BOOL (0 or 1) */
    float f32;
    const char *string;
    const char *const *strings; /* count of them */
    const int32_t *i32s;        /* count of them */
    int64_t count;
} export_kv;

typedef struct {
    export_format format;
    int dtype;                  /* -1: as stored; else the tp_dtype of the output (GGUF keeps
                                   1-D tensors in fp32, as llama.cpp's converter does) */
    int64_t max_shard_bytes;    /* safetensors: tensor bytes per file; 0: EXPORT_DEFAULT_SHARD_BYTES */
    int64_t memory_limit;       /* buffers of all threads; 0: 1 GiB */
    int threads;                /* 0: all cores */
    int overwrite;              /* replace an existing output */
    const char *const *metadata; /* key, value, key, value, ..., NULL: safetensors __metadata__
                                    (after "format": "pt" and the mark) or root attributes of the
                                    HDF5 file (after `format`, the mark) */
    const export_kv *kvs;       /* GGUF metadata (after the mark; general.file_type is added from the dtype) */
    int num_kvs;
    const char *config_json;    /* safetensors: written as config.json beside the weights */
    void (*on_bytes)(void *ctx, int64_t bytes); /* progress, from worker threads */
    void *progress_ctx;
} export_options;

void export_options_init(export_options *options);

typedef struct {
    int tensors;
    int files;              /* weight files written */
    int64_t tensor_bytes;   /* bytes of tensor data written */
    int64_t buffer_memory;  /* buffers of all threads together */
    int threads;
} export_summary;

/* Bytes of tensor data export_run would write (for progress); fails as
 * export_run does on tensors that are missing or cannot be expressed. */
int export_output_bytes(ckpt_reader *source, const export_tensor *tensors, int count, const export_options *options,
                        int64_t *bytes);

/* Writes the listed tensors of source to out_path: a directory for
 * safetensors (model.safetensors, or numbered shards with
 * model.safetensors.index.json, plus config.json), a file for GGUF and HDF5.
 * Fails, naming the tensor, when a listed tensor is missing or cannot be
 * expressed (more than 4 dimensions in GGUF, transposing what is not 2-D). */
int export_run(ckpt_reader *source, const export_tensor *tensors, int count, const export_options *options,
               const char *out_path, export_summary *summary);

/* What --force may replace with an export (a store_replace_check; ctx: the
 * export_options): an earlier export of ours in the same format, known by
 * its mark (a safetensors file written before the mark by its
 * tp_toolkit.source_layout), and nothing else: never a run directory, nor
 * a file that merely has the format's signature (a checkpoint's shard is
 * an HDF5 file). A safetensors output is a directory holding marked
 * weights, config.json and the index (files, not directories of those
 * names), or nothing; an HDF5 file is asked
 * for its root attributes, which only a local one gives. Asked of a local
 * output when it is staged, and of a URL before anything is written; the
 * refusal says what the file is. */
int export_may_replace(const store_ops *storage, const char *path, void *ctx);

/* --------------------------------------------------------- any checkpoint */

/* ------------------------------------------------------------------ import */

/* A parsed safetensors file or sharded directory, validated against the
 * format's rules: 8-byte little-endian header length, a JSON header of
 * tensors with known dtypes and shapes whose data offsets are contiguous,
 * non-overlapping, start at 0 and cover the data exactly, no trailing bytes. */
typedef struct safetensors_set safetensors_set;

/* The largest header length a safetensors file may give, in bytes, read
 * or written: 32 MiB, below the reference implementation's 100,000,000
 * (MAX_HEADER_SIZE) on purpose. Real headers are a few MB (100,000 tensors
 * at ~100 bytes); a hostile one is parsed in up to 16 bytes of memory a byte
 * (tp_json_parse's bound), so 32 MiB caps that at about 0.5 GB where the
 * reference's limit allowed 1.6 GB (docs/RELIABILITY.md). */
#define SAFETENSORS_MAX_HEADER ((uint64_t)32 << 20)

/* path: a .safetensors file, or a directory holding model.safetensors or
 * model.safetensors.index.json and the shards it names, as
 * safetensors_model_dir decides (a directory holding both is refused:
 * transformers loads model.safetensors and ignores the index, so one of
 * them is stale and this reader would take the other model). */
int safetensors_open(safetensors_set **out, const char *path);

/* Whether path is a Hugging Face model directory as import reads it (its
 * config.json aside): a local directory holding model.safetensors
 * (*sharded 0, when sharded is not NULL) or model.safetensors.index.json
 * (1). The one place that tells what else it is, so that the refusal says
 * that and what to give instead: both files (transformers loads only
 * model.safetensors, so one is stale); this toolkit's checkpoint or run
 * directory; PyTorch pickles (pytorch_model.bin), which are not read;
 * safetensors shards without their index; GGUF; a file (GGUF, a PyTorch
 * file, a file of a model directory, named); a remote location. */
int safetensors_model_dir(const char *path, int *sharded);
void safetensors_close(safetensors_set *set);
/* What open found doubtful but not wrong, for its caller to say: "" or one
 * sentence naming the file (an index whose metadata.total_size matches
 * neither the shards' tensor bytes nor their file sizes). */
const char *safetensors_warning(const safetensors_set *set);

typedef struct {
    const char *name;
    const char *file;   /* the file holding it */
    tp_dtype dtype;   /* F32, BF16 or F16 (other dtypes fail on open only when imported) */
    int supported;      /* dtype is one of those three */
    const char *dtype_name;
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];
} safetensors_info;

int safetensors_count(const safetensors_set *set);
/* Tensor i, or by name (NULL when absent). */
const safetensors_info *safetensors_tensor(const safetensors_set *set, int i);
const safetensors_info *safetensors_find(const safetensors_set *set, const char *name);
/* Value of __metadata__ key, or NULL. */
const char *safetensors_metadata(const safetensors_set *set, const char *key);
/* Whether two tensors are equal: of one shape, and of one dtype with the
 * same bytes, or of two of F32, BF16 and F16 with the same values (NaN
 * equal to NaN). */
int safetensors_equal(safetensors_set *set, const char *a, const char *b, int *equal);

typedef struct {
    int threads;                /* 0: all cores */
    int overwrite;
    int update_latest;          /* point the output's parent `latest` at it */
    int compress_level;         /* 0: none */
    void (*on_bytes)(void *ctx, int64_t bytes);
    void *progress_ctx;
    /* Sources holding NaN or infinite values (safetensors, and Megatron checkpoints: gpt_megatron_import_run) are
     * refused (TP_ERR_FORMAT, nothing written) unless allow_nonfinite; the values are carried as they are. */
    int allow_nonfinite;
    ckpt_nonfinite *nonfinite; /* when not NULL: what was found, whether refused or imported */
    /* What the target's shapes were derived from ("config.json: hidden_size 64, ..."), said after a source of
     * the wrong shape; NULL: nothing. */
    const char *shapes_from;
} import_options;

void import_options_init(import_options *options);

/* Writes a checkpoint at out_path with layout: for each of the count
 * descriptions (the target tensors: names, shapes, partitions, dtypes),
 * map[i].name names its source in set and map[i].transpose says the source
 * is its transpose. Values are converted to the target dtype (exact when
 * widening or equal). Every source is checked for presence, dtype and shape
 * before anything is written. NaNs and infinities in the sources are
 * counted as they are converted and refused before the commit, naming the
 * first source tensor holding any (options->allow_nonfinite imports them;
 * options->nonfinite says what was found). */
int import_run(safetensors_set *set, const ckpt_tensor_desc *tensors, const export_tensor *map, int count,
               const ckpt_layout *layout, const ckpt_train_state *state, const import_options *options,
               const char *out_path);

#endif
