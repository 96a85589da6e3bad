/* torch_write.h (private to formats/): writing torch.save files that
 * torch.load reads: a zip archive of stored entries, each entry's data
 * aligned to 64 bytes as PyTorch aligns them, Zip64 records where sizes or
 * offsets need them, a CRC-32 per entry (ISA-L's); ARCHIVE/data.pkl, a
 * pickle of protocol 2 built with the pk_* calls, ARCHIVE/data/N per
 * tensor, ARCHIVE/version and ARCHIVE/byteorder. */
#ifndef TP_FORMATS_TORCH_WRITE_H
#define TP_FORMATS_TORCH_WRITE_H

#include <stdint.h>
#include <stdio.h>

#include "../common/buffer.h"
#include "../common/dtype.h"
#include "torch.h"

typedef struct torch_writer torch_writer;

/* A new file at path (a local path; the caller stages it); archive is the
 * folder name inside ("model_optim_rng"). As torch.save, the pickle comes
 * first in the archive, then the storages: the caller emits the whole
 * object (torch_writer_tensor for each tensor), calls
 * torch_writer_begin_storages, then gives each tensor's bytes in the same
 * order (torch_writer_storage), one at a time. */
int torch_writer_open(const char *path, const char *archive, torch_writer **out);
/* The same, appended to a file open for writing at its current position
 * (path names it in messages): a PyTorch distributed checkpoint's item.
 * Offsets inside are the archive's own; finishing flushes the file but
 * neither syncs nor closes it. */
int torch_writer_open_in(FILE *file, const char *path, const char *archive, torch_writer **out);
/* The pickle being built; the caller emits the saved object into it. */
byte_buffer *torch_writer_pickle(torch_writer *writer);
/* Emits, into the pickle, a row-major tensor of ndim dimensions of shape
 * and dtype, whose bytes come later as the next storage. */
int torch_writer_tensor(torch_writer *writer, torch_dtype dtype, int ndim, const int64_t *shape);
/* Ends the pickle and writes it (ARCHIVE/data.pkl). */
int torch_writer_begin_storages(torch_writer *writer);
/* The bytes of the next tensor emitted: size must be its size. */
int torch_writer_storage(torch_writer *writer, const void *data, int64_t size);
/* The next bytes of it, streamed: the storage is complete when its size has
 * come, in parts of any size (its CRC-32 taken as they pass). */
int torch_writer_storage_part(torch_writer *writer, const void *data, int64_t size);
/* Checks that every storage was written; writes version, byteorder and the
 * central directory; syncs and closes the file; frees writer, whatever the
 * outcome. */
int torch_writer_finish(torch_writer *writer);
/* Closes and frees without finishing (the caller removes the file). */
void torch_writer_abort(torch_writer *writer);

/* The pickle opcodes of the saved object: values, and containers opened
 * with their *_begin and closed with pk_end_* (MARK ... SETITEMS). */
void pk_none(byte_buffer *b);
void pk_bool(byte_buffer *b, int value);
void pk_int(byte_buffer *b, int64_t value);
void pk_float(byte_buffer *b, double value);
void pk_string(byte_buffer *b, const char *text);
void pk_global(byte_buffer *b, const char *module, const char *name);
void pk_dict_begin(byte_buffer *b);  /* {} then MARK: keys and values follow */
void pk_dict_end(byte_buffer *b);    /* SETITEMS */
void pk_ordered_dict_begin(byte_buffer *b); /* OrderedDict() then MARK (a module's state_dict()); pk_dict_end */
void pk_list_begin(byte_buffer *b);  /* [] then MARK: items follow */
void pk_list_end(byte_buffer *b);    /* APPENDS */
/* A pickle of its own (not a torch.save archive's): PROTO 2 first, STOP last. */
void pk_proto(byte_buffer *b);
void pk_stop(byte_buffer *b);
void pk_mark(byte_buffer *b);        /* MARK: a tuple's items follow */
void pk_tuple_end(byte_buffer *b);   /* TUPLE of the items since the MARK */
void pk_reduce(byte_buffer *b);      /* REDUCE: the callable below called with the tuple on top */
void pk_build(byte_buffer *b);       /* BUILD: the state on top given to the object below */
/* A value read by pickle.c from a source file, written back into the
 * pickle b: a Namespace, an enum, a dtype, a dict of them, an RNG state
 * with its tensors... Only data and an allow-list of classes go back (those
 * real Megatron-LM rank files hold: argparse.Namespace, torch dtypes,
 * numpy's arrays, dtypes and scalars, io.BytesIO, Megatron's enums), since
 * torch.load calls what a pickle names: any other call or global is refused
 * (TP_ERR_FORMAT), naming the file, the value's path in it
 * ("args.data_path[3]") and the class. Values are nested at most 64 deep.
 * Each value but numbers, None and bools is put in the pickle's memo and
 * written once: reached again, in the same call or a later one on the same
 * memo, it is a memo GET, so that references the source shares stay shared
 * and the output stays the size of the input. */
typedef struct pk_memo pk_memo;
/* The memo of one pickle (one per torch_writer's pickle). copy_budget
 * bounds the bytes of all the copies (pk_origin.copy) written with it. */
int pk_memo_create(int64_t copy_budget, pk_memo **out);
void pk_memo_free(pk_memo *memo);

/* A class or a string written once per pickle, as Python's pickler writes
 * what repeats: the first time with a PUT into memo, then as a GET of it
 * (a DCP .metadata names ChunkStorageMetadata, torch.Size and "offsets"
 * once per chunk: without them, three times PyTorch's opcodes). A failed
 * allocation marks b failed. */
void pk_shared_global(byte_buffer *b, pk_memo *memo, const char *module, const char *name);
void pk_shared_string(byte_buffer *b, pk_memo *memo, const char *text);
/* module.name.__new__(module.name): an object whose state follows, then
 * pk_build; its class shared through memo (NULL: written out). */
void pk_object_begin(byte_buffer *b, pk_memo *memo, const char *module, const char *name);

typedef int (*pk_tensor_fn)(void *ctx, const pickle_value *tensor);
typedef struct {
    const char *file;    /* the file the value was read from */
    const char *path;    /* where in it: "args.data_path", "optimizer.param_groups[0].lr" */
    pk_tensor_fn tensor; /* emits each tensor inside (torch_writer_tensor, its bytes given later); NULL: a tensor fails */
    void *ctx;
    int copy;            /* a copy of its own, sharing nothing written before (an entry given to every parameter:
                          * a tensor shared between parameters would be stepped once for each) */
} pk_origin;
int pk_value(byte_buffer *b, pk_memo *memo, const pickle_value *value, const pk_origin *from);
/* Whether pk_value would write value back (tensors: whether tensors may be
 * inside), the same refusals, nothing written: checked before a writer
 * starts. */
int pk_value_check(const pickle_value *value, const char *file, const char *path, int tensors);

#endif
