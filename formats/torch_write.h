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
/* module.name.__new__(module.name): an object whose state follows, then pk_build. */
void pk_object_begin(byte_buffer *b, const char *module, const char *name);
void pk_build(byte_buffer *b);       /* BUILD: the state on top given to the object below */
/* A value read by pickle.c, written back: a Namespace, an enum, a dtype, a
 * dict of them... Tensors and storages fail (TP_ERR_ARG). */
int pk_value(byte_buffer *b, const pickle_value *value);
/* The same, with each tensor inside handed to tensor (which emits it:
 * torch_writer_tensor, its bytes given later): an RNG state, a loss
 * scale, copied with their data. */
typedef int (*pk_tensor_fn)(void *ctx, const pickle_value *tensor);
int pk_value_with(byte_buffer *b, const pickle_value *value, pk_tensor_fn tensor, void *ctx);

#endif
