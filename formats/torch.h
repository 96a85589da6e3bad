/* torch.h: files written by torch.save, read without executing anything.
 *
 * A torch.save file (PyTorch 1.6 and later) is a zip archive of stored
 * entries under one folder, the archive's name: ARCHIVE/data.pkl (a pickle
 * of the saved object), ARCHIVE/data/KEY (the bytes of each storage),
 * ARCHIVE/version and, since PyTorch 2.1, ARCHIVE/byteorder.
 *
 * data.pkl is read by a data-only interpreter of the pickle opcodes of
 * protocols 2 to 5 (pickle.c): it builds a tree of values and calls nothing.
 * Globals that torch.save writes for data become values (tensors, storages,
 * OrderedDict, bytes, sets); any other global (numpy's RNG state,
 * argparse.Namespace, enums, classes of the saving program) applied to its
 * arguments becomes an opaque object that keeps its class name, its
 * arguments and the state BUILD gave it, so that a caller can still read
 * the attributes of a Namespace. Every size is bounded (pickle_limits);
 * a hostile pickle ends in one error naming the opcode and its offset.
 *
 * A tensor is never loaded by the interpreter: it is a storage key, a
 * dtype, an offset, a shape and strides, read later as a byte range of the
 * archive (torch_tensor_range).
 *
 * Functions return a tp_status; the message of a failure in the calling
 * thread is tp_errmsg(). Nothing is printed. */
#ifndef TP_FORMATS_TORCH_H
#define TP_FORMATS_TORCH_H

#include <stddef.h>
#include <stdint.h>

#include "../common/dtype.h"

/* ------------------------------------------------------------------ pickle */

typedef enum {
    PICKLE_NONE,
    PICKLE_BOOL,    /* integer: 0 or 1 */
    PICKLE_INT,     /* integer: fits in 64 bits */
    PICKLE_BIGINT,  /* text: the little-endian two's-complement bytes of a longer integer */
    PICKLE_FLOAT,   /* real */
    PICKLE_STRING,  /* text: UTF-8, NUL-terminated (size excludes the NUL; may hold NULs) */
    PICKLE_BYTES,   /* text */
    PICKLE_TUPLE,   /* items */
    PICKLE_LIST,    /* items */
    PICKLE_SET,     /* items (set and frozenset) */
    PICKLE_DICT,    /* keys and values, in insertion order (dict and OrderedDict) */
    PICKLE_GLOBAL,  /* text: "module.name", a global not called (torch.float16, a class) */
    PICKLE_OBJECT,  /* a global applied to arguments: object */
    PICKLE_STORAGE, /* a torch storage: storage */
    PICKLE_TENSOR,  /* a torch tensor: tensor */
} pickle_kind;

typedef enum {
    TORCH_FLOAT32,
    TORCH_FLOAT64,
    TORCH_FLOAT16,
    TORCH_BFLOAT16,
    TORCH_INT64,
    TORCH_INT32,
    TORCH_INT16,
    TORCH_INT8,
    TORCH_UINT8,
    TORCH_BOOL,
    TORCH_COMPLEX64,
    TORCH_COMPLEX128,
} torch_dtype;

/* Bytes of one element. */
size_t torch_dtype_size(torch_dtype dtype);
/* This project's dtype of a torch dtype: whether it is one (fp32, bf16,
 * fp16), and which. */
int torch_dtype_to_tp(torch_dtype dtype, tp_dtype *out);
/* The torch dtype of one of this project's. */
torch_dtype torch_dtype_from_tp(tp_dtype dtype);
/* "float32", "bfloat16", ... as torch names them. */
const char *torch_dtype_name(torch_dtype dtype);

#define TORCH_MAX_DIMS 16

typedef struct pickle_value pickle_value;

typedef struct {
    pickle_value **items;
    int64_t count, capacity;
} pickle_items;

typedef struct {
    const pickle_value *storage; /* a PICKLE_STORAGE */
    int64_t offset;              /* in elements of the storage */
    int ndim;
    int64_t shape[TORCH_MAX_DIMS], stride[TORCH_MAX_DIMS]; /* strides in elements */
} pickle_tensor;

struct pickle_value {
    pickle_kind kind;
    uint32_t walk_mark; /* the last walk that entered this container (pickle_walk) */
    union {
        int64_t integer;
        double real;
        struct {
            const char *data;
            int64_t size;
        } text;
        pickle_items items;
        struct {
            pickle_items keys, values;
        } dict;
        struct {
            const char *cls;     /* "module.name" of the global called */
            pickle_value *args;  /* what it was called with (a tuple, or NULL) */
            pickle_value *state; /* what BUILD gave it (NULL if nothing) */
            pickle_value *items; /* a DICT of what SETITEM(S) added (a defaultdict's items), or NULL */
            pickle_value *list;  /* a LIST of what APPEND(S) added, or NULL */
            int newobj;          /* made by NEWOBJ (cls.__new__), not by calling cls */
        } object;
        struct {
            const char *key;      /* the entry ARCHIVE/data/KEY */
            const char *location; /* "cpu", "cuda:0", ... */
            torch_dtype dtype;
            int64_t numel;        /* elements of dtype */
        } storage;
        /* Apart from the value: inline, its 264 bytes made every value of
         * a tree (an int, a string) that size: a DCP `.metadata` of 7.4 MB
         * took 231 MB to read. */
        const pickle_tensor *tensor;
    };
};

typedef struct {
    int64_t max_memory;   /* bytes of the tree and the interpreter's stacks (default 512 MiB) */
    int64_t max_memo;     /* highest memo index + 1 (default 1 << 22) */
    int max_marks;        /* MARKs open at once (default 1000) */
} pickle_limits;

void pickle_limits_init(pickle_limits *limits);

/* A pickle read into a tree; owns every value. */
typedef struct pickle_doc pickle_doc;

/* Interprets data[0, size); name goes into messages ("a.pt:data.pkl").
 * limits may be NULL for the defaults. */
int pickle_load(const void *data, size_t size, const char *name, const pickle_limits *limits, pickle_doc **out);
void pickle_free(pickle_doc *doc);
const pickle_value *pickle_root(const pickle_doc *doc);

/* "dict", "tensor", ... */
const char *pickle_kind_name(pickle_kind kind);

/* The value of a string key of a DICT, or the attribute of an OBJECT whose
 * state is a dict (an argparse.Namespace); NULL when absent or when value
 * is neither. */
const pickle_value *pickle_get(const pickle_value *value, const char *key);
/* The value of an integer key of a DICT (optimizer state); NULL when absent. */
const pickle_value *pickle_get_int(const pickle_value *value, int64_t key);
/* Whether value is a STRING equal to text. */
int pickle_is_string(const pickle_value *value, const char *text);

/* Calls visit for every tensor reachable from root, with its path (keys
 * and list indices joined by '.'); a container reached twice is entered
 * once, so shared and cyclic structures end. A nonzero return of visit
 * stops the walk and is returned; paths deeper than 64 containers fail.
 * A walk marks the containers it enters: walks of one doc must not run at
 * the same time. */
int pickle_walk_tensors(const pickle_doc *doc, const pickle_value *root,
                        int (*visit)(void *ctx, const char *path, const pickle_value *tensor), void *ctx);

/* ------------------------------------------------------------- torch.save */

typedef struct torch_archive torch_archive;

/* Opens a torch.save file of any store (a local path or a URL, as
 * store/store.h says): reads the zip's central directory and data.pkl, checks
 * data.pkl, version and byteorder against the CRC-32s the zip records
 * (TP_ERR_CHECKSUM naming the file, the entry and both values), that every
 * storage a tensor uses is an entry holding at least its bytes and that
 * every tensor lies inside its storage. The format before
 * PyTorch 1.6 (a bare pickle stream) is refused with a message. */
int torch_archive_open(const char *path, const pickle_limits *limits, torch_archive **out);
/* The same for an archive held in bytes [base, base + bytes) of a file
 * (bytes -1: to its end): an item of a PyTorch distributed checkpoint;
 * version (NULL or "": any) as zip_open_range takes it. */
int torch_archive_open_range(const char *path, int64_t base, int64_t bytes, const char *version,
                             const pickle_limits *limits, torch_archive **out);
/* The same for an archive held in data[0, size) (the caller's, kept while
 * it is open), name in messages: a torch.save held in an io.BytesIO of a
 * pickle (Transformer Engine's extra state). */
int torch_archive_open_memory(const char *name, const void *data, int64_t size, const pickle_limits *limits,
                              torch_archive **out);
void torch_archive_close(torch_archive *archive);

const pickle_doc *torch_archive_doc(const torch_archive *archive);
const pickle_value *torch_archive_root(const torch_archive *archive);
const char *torch_archive_path(const torch_archive *archive);
/* Bytes of the archive (of its file, for a whole file). */
int64_t torch_archive_bytes(const torch_archive *archive);
/* The version of its file that its reads were pinned to (an object's ETag;
 * "" on a local file system): a later reader of the same file pins its own
 * handle to it (ckpt_foreign.versions). */
void torch_archive_version(const torch_archive *archive, char *out, size_t size);

/* The whole of a contiguous tensor (size: its bytes) into buf, its
 * storage's entry read whole and compared with the CRC-32 the archive
 * records (TP_ERR_CHECKSUM naming the file, the entry and both values):
 * for the small tensors a writer copies from a source (its RNG and common
 * state), whose reads no check of the source's tensors covers. */
int torch_tensor_read_checked(const torch_archive *archive, const pickle_value *tensor, void *buf, int64_t size);

/* Every entry of the archive read and compared with the CRC-32 its zip
 * records: TP_ERR_CHECKSUM naming the file and entry at the first that
 * differs. Entries recording none (PyTorch's set_crc32_options(False)) are
 * counted as unchecked. on_bytes (may be NULL) hears the bytes read. */
typedef struct {
    int entries;   /* entries read */
    int unchecked; /* of them, recording no CRC-32 */
} torch_archive_check_result;
#define TORCH_ARCHIVE_CHECK_BYTES ((int64_t)1 << 20) /* read at a time: the buffer of a check */
int torch_archive_check(torch_archive *archive, torch_archive_check_result *result,
                        void (*on_bytes)(void *ctx, int64_t bytes), void *ctx);

/* Elements of a tensor (the product of its shape). */
int64_t torch_tensor_numel(const pickle_value *tensor);
/* Whether a tensor's elements are row-major and dense (its strides those
 * of its shape; dimensions of size 1 may have any stride). */
int torch_tensor_is_contiguous(const pickle_value *tensor);

/* Whether a tensor's elements are dense in some order of its dimensions
 * (each element once, no gaps: a transposed or channels_last tensor, which
 * torch.save writes with its strides): order receives its dimensions from
 * the outermost in memory to the innermost (stride 1), those of size 1
 * last (a contiguous tensor's: its dimensions in order, those of size 1
 * moved last). */
int torch_tensor_dense_order(const pickle_value *tensor, int order[TORCH_MAX_DIMS]);

/* Where a contiguous tensor's bytes are in the archive's file:
 * [*offset, *offset + *size). TP_ERR_FORMAT naming the tensor for a
 * non-contiguous one. */
int torch_tensor_range(const torch_archive *archive, const pickle_value *tensor, int64_t *offset, int64_t *size);
/* torch_tensor_range of a dense tensor in any order (torch_tensor_dense_order;
 * TP_ERR_FORMAT for one whose strides overlap or leave gaps): its bytes
 * are its elements in that order. */
int torch_tensor_dense_range(const torch_archive *archive, const pickle_value *tensor, int64_t *offset, int64_t *size);

/* The zip entry holding a tensor's storage, so that a reader of the
 * tensor's bytes checks them as it reads: the entry's bytes
 * [offset, offset + size) in the archive's file, the CRC-32 the archive
 * records for them (recorded 0 when none is, PyTorch's
 * set_crc32_options(False)) and the entry's name. */
typedef struct {
    int64_t offset, size;
    uint32_t crc32;
    int recorded;
    const char *entry;
} torch_storage_entry;
int torch_tensor_storage_entry(const torch_archive *archive, const pickle_value *tensor, torch_storage_entry *out);

/* Reads bytes [from, from + size) of a contiguous tensor's data into buf. */
int torch_tensor_read(const torch_archive *archive, const pickle_value *tensor, void *buf, int64_t from, int64_t size);

#endif
