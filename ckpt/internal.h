/* internal.h: what the ckpt/ sources share and users of ckpt.h do not see. */
#ifndef TP_CKPT_INTERNAL_H
#define TP_CKPT_INTERNAL_H

#include <hdf5.h>
#include <stdint.h>

#include "../common/fault.h"
#include "../common/json.h"
#include "../kernels/kernels.h"
#include "ckpt.h"

/* The JSON object of a small file at path (local or a URL) when there is
 * one: TP_OK with *found 0 when nothing is there; a store's failure or text
 * that is not JSON (tp_json_parse) is an error naming path, never taken as
 * absent. Leases and upload claims are read so. */
int ckpt_read_json_if_present(const char *path, int64_t max_bytes, int *found, struct cJSON **out);

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tp-ckpt writes little-endian files with positioned I/O and needs a little-endian host"
#endif

/* ------------------------------------------------------------------ errors */

/* As tp_fail(TP_ERR_HDF5, ...), with the innermost message of HDF5's error
 * stack appended. */
int ckpt_fail_hdf5(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Library setup: registers the zstd filter once and silences HDF5's error
 * printing in the calling thread. Every entry point that may reach HDF5 calls
 * it; cheap after the first call in a thread. */
int ckpt_library_init(void);

/* ------------------------------------------------------------------ format */

#define CKPT_INDEX_NAME "index.json"
#define CKPT_LATEST_NAME "latest"
#define CKPT_FORMAT_TAG "tp-ckpt"
#define CKPT_TENSOR_GROUP "tensors"
#define CKPT_CHECKSUM_GROUP "checksums"
#define CKPT_BLOCK_TARGET_BYTES ((int64_t)1 << 20) /* checksum block and zstd chunk */

/* "shard_pp%02d_tp%02d.h5", and with dp > 0 (a data-parallel file, format
 * 1.6) "shard_pp%02d_tp%02d_dp%02d.h5". */
void ckpt_shard_file_name(int pp, int tp, int dp, char *out, size_t out_size);
/* Whether name is a shard file's name as ckpt_shard_file_name writes it
 * (*pp, *tp, *dp from it; dp 0 for the shard file). */
int ckpt_shard_file_parse(const char *name, int *pp, int *tp, int *dp);

/* Rows per checksum block for a piece whose rows hold row_bytes bytes. */
int64_t ckpt_block_rows_for(int64_t rows, int64_t row_bytes);

/* Whether two normalized descriptions (ckpt_tensor_copy_init) are the same. */
int ckpt_tensor_equal(const ckpt_tensor_desc *a, const ckpt_tensor_desc *b);

/* Helpers for the partition arithmetic. */
int64_t ckpt_segment_padded(const ckpt_partition *p, int s, int tp);
int64_t ckpt_piece_axis_size(const ckpt_partition *p, int tp);
/* ckpt_piece_element_runs, leaving replicas out with primary_only (digests). */
int ckpt_piece_element_runs_of(const ckpt_tensor_desc *t, int tp, int piece, int64_t row0, int64_t row1,
                               int primary_only, ckpt_element_run_fn visit, void *ctx);

/* Piece geometry as the writer and reader see it: rows along axis 0. */
typedef struct {
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];
    int64_t rows;       /* shape[0] */
    int64_t row_bytes;  /* bytes of one index along axis 0 */
    int64_t bytes;      /* rows * row_bytes */
    int64_t block_rows; /* rows per checksum block */
    int64_t num_blocks;
} ckpt_piece_geometry;

void ckpt_piece_geometry_init(ckpt_piece_geometry *g, const ckpt_tensor_desc *t, int tp,
                              int64_t block_rows);

/* XXH3-64 of a block; the piece checksum is XXH3-64 of the block hashes as
 * little-endian uint64 values (docs/FORMAT.md "Checksums"). */
uint64_t ckpt_hash_block(const void *data, size_t bytes);
uint64_t ckpt_hash_blocks(const uint64_t *block_hashes, int64_t num_blocks);
void ckpt_format_checksum(uint64_t checksum, char out[17]);
int ckpt_parse_checksum(const char *text, uint64_t *out);

/* Seeds of the digest keys (docs/FORMAT.md "Logical digests"). */
#define CKPT_DIGEST_KEY_SEED 0x7470636B70744B00ull   /* "tpckptK\0" */
#define CKPT_DIGEST_BLOCK_SEED 0x7470636B70744600ull /* "tpckptF\0" */
uint64_t ckpt_digest_block_key(uint64_t block);

/* Digest contribution of rows [row0, row1) of a piece held in data (padding
 * excluded). */
uint64_t ckpt_digest_rows(const ckpt_tensor_desc *tensor, int tp, int piece, int64_t row0, int64_t row1,
                          const void *data);
/* The same, and the NaNs and infinities of those elements added to *found
 * (first: the flat logical index; NULL: not counted), in the digest's pass. */
uint64_t ckpt_digest_rows_counting(const ckpt_tensor_desc *tensor, int tp, int piece, int64_t row0, int64_t row1,
                                   const void *data, convert_nonfinite *found);

/* HDF5 type of a stored dtype (file and memory, little-endian); caller closes. */
hid_t ckpt_h5_type(tp_dtype dtype);

/* zstd chunk codec shared by the HDF5 filter and the direct chunk paths. */
int ckpt_zstd_compress(const void *src, size_t src_size, void *dst, size_t dst_capacity,
                       int level, size_t *out_size);
int ckpt_zstd_decompress(const void *src, size_t src_size, void *dst, size_t dst_size);
size_t ckpt_zstd_bound(size_t src_size);

/* HDF5's byte shuffle (filter 2) and its inverse; stored chunks are
 * shuffle then zstd (docs/FORMAT.md "Compression"). */
void ckpt_shuffle(const void *in, void *out, size_t bytes, size_t element_size);
void ckpt_unshuffle(const void *in, void *out, size_t bytes, size_t element_size);

/* Filter-mask bits of a chunk: which pipeline stages were skipped. */
#define CKPT_MASK_NO_SHUFFLE 1u
#define CKPT_MASK_NO_ZSTD 2u

/* HDF5 attribute helpers: return TP_OK or a status with the message set. */
int ckpt_h5_write_string(hid_t obj, const char *name, const char *value); /* fixed-length */
int ckpt_h5_write_vlen_string(hid_t obj, const char *name, const char *value);
/* A dataset (and link) access property list on which following an external
 * link fails. */
hid_t ckpt_h5_link_access(void);
/* Refuses soft, external and user-defined links anywhere in the file and
 * datasets whose data lies in other files (external storage, virtual). */
int ckpt_h5_check_links(hid_t file, const char *path);
int ckpt_h5_check_dataset_storage(hid_t dset, const char *where);
/* Where block `block` (rows block x block_rows on) of a chunked dataset
 * lies in its file, its stored size and filter mask; an error naming where
 * and the block when the chunk is not allocated. */
int ckpt_h5_chunk_location(hid_t dset, int64_t block, int64_t block_rows, const char *where, uint64_t *address,
                           uint64_t *size, unsigned *filter_mask);
/* Whether a piece's dataset has the piece's stored shape (g), and whether
 * its stored type is dtype's (ckpt_h5_type): the commit and the reader
 * check both. */
void ckpt_h5_dataset_form(hid_t dset, const ckpt_piece_geometry *g, tp_dtype dtype, int *shape_ok, int *type_ok);
int ckpt_h5_write_i64s(hid_t obj, const char *name, const int64_t *values, int count);
int ckpt_h5_write_u64(hid_t obj, const char *name, uint64_t value);
int ckpt_h5_read_string(hid_t obj, const char *name, char *out, size_t out_size);
int ckpt_h5_read_i64s(hid_t obj, const char *name, int64_t *values, int max_count, int *count);
/* An attribute of one integer that later format versions added and writers
 * may leave out: *value read when it is there (left as it is otherwise),
 * *present (may be NULL) says which. */
int ckpt_h5_read_optional_i64(hid_t obj, const char *name, int64_t *value, int *present);
int ckpt_h5_read_u64(hid_t obj, const char *name, uint64_t *value);
hid_t ckpt_h5_file_access(void); /* property list: alignment, libver, no file locking */

/* ----------------------------------------------------------- file system */


/* Points run_dir's `latest` at checkpoint `name` of that step, unless what
 * the run directory resolves to now is newer: `latest` never moves back. */
int ckpt_latest_update(const store_ops *storage, const char *run_dir, const char *name, int64_t step);

/* ckpt_resolve and ckpt_candidates in a given store (out: CKPT_PATH_MAX). */
int ckpt_resolve_in(const store_ops *storage, const char *path, char *out);
int ckpt_candidates_in(const store_ops *storage, const char *path, ckpt_candidate **out, int *count);

/* A growing array of names, for the visitors of a listing: start it {0};
 * the caller frees names. */
typedef struct {
    char (*names)[CKPT_NAME_MAX + 1];
    int count, capacity;
} ckpt_name_list;

/* Appends name to list. */
int ckpt_append_name(ckpt_name_list *list, const char *name);

#endif
