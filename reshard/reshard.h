/* reshard.h: converting a checkpoint to another tensor/pipeline layout.
 *
 * Every tensor goes through one code path driven by its partition
 * description (ckpt.h): a plan cuts each output piece into slabs of whole
 * checksum blocks; for each slab it lists the source rows to read and the
 * moves (strided copies, with dtype conversion, and zero fills for padding)
 * that place them. A CPU executor and a CUDA executor carry out the same
 * plan, so their outputs are identical. Memory stays within a limit whatever
 * the checkpoint size: slabs are sized from it, and sources are read only
 * where a slab needs them.
 *
 * Functions return a tp_status; the message of a failure in the calling
 * thread is tp_errmsg(). Nothing is printed. */
#ifndef TP_RESHARD_H
#define TP_RESHARD_H

#include <stdint.h>

#include "../ckpt/ckpt.h"

#define RESHARD_DEFAULT_MEMORY ((int64_t)1 << 30)

/* How a tool keeps to a memory limit (limit; 0: RESHARD_DEFAULT_MEMORY),
 * which bounds the process's resident memory: the most threads, up to
 * `threads`, whose equal shares of what the limit leaves beside what this
 * process holds now and the checkpoint library's allowance (CKPT_FIXED_MEMORY
 * once and CKPT_THREAD_MEMORY a thread; the CKPT_ZSTD_ ones for a writer of
 * zstd, when `zstd`) each hold `need` bytes of buffers; 0 when not one does.
 * *share gets each thread's share (at least need). The one home of the rule:
 * reshard's plan, the other formats' writers, export, the reading back of an
 * output and tp-ckpt's verify and copy size their threads here, each with
 * the need of the checkpoint at hand (its slabs, rows or pieces: a small
 * checkpoint needs little), never a fixed one where that is known. */
int reshard_threads_within(int64_t limit, int threads, int64_t need, int zstd, int64_t *share);

/* The refusal of a limit in which not one thread fits (TP_ERR_LIMIT: a
 * usage error, exit 2 in every program, cli_status_error): `what`
 * (a printf format) needs `need` bytes of buffers a thread. The message
 * gives the limit, the least limit that would do, the buffers, what the
 * process holds now and the allowance apart, every size in format_bytes'
 * units, and ends "raise --memory-limit". */
int reshard_memory_refusal(int64_t limit, int64_t need, int zstd, const char *what, ...)
    __attribute__((format(printf, 4, 5)));

/* Bytes a thread reads into when a checkpoint is read back whole (verified,
 * its digests computed, downloaded in parts and verified): slabs of up to
 * 16 MiB (ckpt_verify's, reshard_verify's; a download's parts are 8). What
 * an output not yet written is read back in when its writer does not say
 * what its pieces need (reshard_summary.read_back_bytes says it for this
 * format's); a checkpoint at hand needs its own, which is less where its
 * pieces are smaller (ckpt_reader_verify_thread_bytes,
 * ckpt_reader_transfer_thread_bytes). */
#define RESHARD_READ_BACK_BYTES CKPT_VERIFY_READ_BYTES

typedef enum { RESHARD_DEVICE_AUTO = 0, RESHARD_DEVICE_CPU, RESHARD_DEVICE_CUDA } reshard_device;

typedef struct {
    int tp, pp;                 /* target degrees; 0 keeps the source's */
    int virtual_stages;         /* target chunks of layers per stage (the interleaved schedule); 0: the
                                   source's where pp is kept, else 1 */
    int threads;                /* 0: all cores */
    int64_t memory_limit;       /* bytes for buffers and bookkeeping; 0: RESHARD_DEFAULT_MEMORY */
    reshard_device device;      /* AUTO: CUDA when a GPU is present and the plan converts dtypes, else the CPU */
    int param_dtype;            /* -1: keep; else the tp_dtype of parameters (role "param") */
    int compress_level;         /* -1: zstd 3 when the source is compressed, else none; 0: none */
    int drop_optimizer;         /* leave out every tensor whose role is not "param" */
    int overwrite;              /* replace an existing output */
    int update_latest;          /* point the output's parent `latest` at it */
    void (*on_bytes)(void *ctx, int64_t bytes_written); /* progress, from worker threads */
    void *progress_ctx;
    /* Another tool's checkpoint as the source (ckpt_reader_is_foreign): its
     * NaNs and infinities are counted as the output's rows are digested and
     * refused before the commit (TP_ERR_FORMAT, nothing written: the file,
     * tensor, counts and first index of the first tensor holding any, then
     * how many do) unless allow_nonfinite, which carries them as they are.
     * This format's own checkpoints are trusted as tp-train wrote them (it
     * writes none after a non-finite step) and are not counted. */
    int allow_nonfinite;
    ckpt_nonfinite *nonfinite; /* when not NULL: what was found in a foreign source, whether refused or carried */
} reshard_options;

void reshard_options_init(reshard_options *options);

typedef struct reshard_plan reshard_plan;

/* The layout a plan writes: the source's, with the degrees the options
 * name (a pp named without virtual_stages: one chunk per stage). */
ckpt_layout reshard_target_layout(const ckpt_layout *from, const reshard_options *options);

/* What a plan will do; figures are exact for the bytes written and read. */
typedef struct {
    ckpt_layout from, to;
    int tensors;              /* output tensors */
    int tensors_dropped;      /* optimizer state left out */
    int64_t pieces_written;
    int files_written;
    int64_t bytes_read;       /* from the source, whole checksum blocks */
    int64_t bytes_written;    /* tensor bytes of the output, uncompressed */
    int64_t slabs;
    int threads;
    int64_t slab_bytes;       /* largest slab: staging and output buffer, each */
    int64_t buffer_memory;    /* buffers of all threads together */
    int64_t read_back_bytes;  /* buffers one thread holds reading the output back (reshard_verify, and the
                                 ckpt_verify before an upload): the largest verified read of an output piece
                                 (ckpt_tensor_verify_read_bytes) and, where a dtype changes, the largest
                                 source slab digested converted beside it (both kept by the thread), and then
                                 what the source's reader keeps a thread (ckpt_reader_read_thread_bytes) */
    int64_t memory_limit;
    const char *device;       /* "cpu" or "cuda" */
    const char *device_reason; /* why --device auto chose it; NULL when the options named the device */
} reshard_summary;

/* Checks that every tensor of the source can be laid out at the target and
 * sizes the slabs for the memory limit. Fails, naming the tensor and the
 * dimension, when a target degree does not divide a segment or the layers. */
int reshard_plan_create(reshard_plan **out, ckpt_reader *source, const reshard_options *options);
const reshard_summary *reshard_plan_summary(const reshard_plan *plan);
void reshard_plan_free(reshard_plan *plan);

/* Writes the output checkpoint at out_path (committed atomically: nothing is
 * visible there unless it completes; nor when a foreign source holds NaN or
 * infinite values, unless options.allow_nonfinite). */
int reshard_execute(reshard_plan *plan, const char *out_path);

typedef struct {
    int tensors;          /* compared */
    int mismatches;       /* tensors whose digest differs */
    char first_mismatch[512]; /* why the first differing tensor differs */
} reshard_verify_result;

/* Proves an output equal to its source without merging anything: every
 * output piece is read and checked against its checksums and digest part,
 * and every tensor's logical digest is compared with the source's (for
 * tensors whose dtype changed, with the digest of the converted source
 * values, computed from the source). */
int reshard_verify(ckpt_reader *source, ckpt_reader *output, int threads, reshard_verify_result *result);
/* Threads, up to `threads`, that may read an output back within a memory
 * limit (limit; 0: RESHARD_DEFAULT_MEMORY) after it is written: reshard_verify,
 * reopening it to compute its digests, verifying and uploading it to an object
 * store. The limit bounds the whole run, not the write alone, and each such
 * thread holds `need` bytes of buffers beside its scratch
 * (reshard_threads_within): what the output's pieces need
 * (reshard_summary.read_back_bytes), or where that is not known (need <= 0)
 * slabs of RESHARD_READ_BACK_BYTES. 0 when not one fits: a limit the write
 * fits in (its slabs may be a checksum block) may leave no room to read it
 * back, and is refused before anything is written (reshard_memory_refusal). */
int reshard_verify_threads(int64_t limit, int threads, int64_t need);

/* Reads piece `piece` of tensor `index` of source as it is laid out at degree
 * tp (target: the source's description, the dtype possibly changed) into
 * out, reading only the source regions that piece needs. */
int reshard_read_piece(ckpt_reader *source, int index, const ckpt_tensor_desc *target, int tp, int piece,
                       void *out, size_t out_size);
/* The same for rows [row0, row0 + row_count) of that piece alone (row_count
 * -1: to its end), so that a writer can stream a piece through a buffer that
 * stays in the CPU's cache. */
int reshard_read_piece_rows(ckpt_reader *source, int index, const ckpt_tensor_desc *target, int tp, int piece,
                            int64_t row0, int64_t row_count, void *out, size_t out_size);

/* Message of the last failure in this thread. */
const char *tp_errmsg(void);

/* Parses "tp4", "pp2", "tp4pp2" (either order), and "tp4pp2v2": pp
 * followed by vV, V >= 2 chunks of layers per stage (the interleaved
 * schedule), which needs pp >= 2. A degree not named is 0 (virtual_stages
 * too: V is not written). */
int reshard_parse_layout(const char *text, int *tp, int *pp, int *virtual_stages);

/* "tp4pp2", or "tp4pp2v2" with several chunks per stage: the text
 * reshard_parse_layout reads. */
#define RESHARD_LAYOUT_TEXT_MAX 40
void reshard_layout_text(const ckpt_layout *layout, char out[RESHARD_LAYOUT_TEXT_MAX]);

#endif
