/* fuzz_scratch.h: the fuzzers' scratch directories, for inputs that are a
 * directory's files (a checkpoint's .metadata beside its data files): one
 * directory a process under TMPDIR, made at the first call and removed
 * whole when the process exits (libFuzzer ends -max_total_time with exit;
 * each Criterion test that replays a corpus is a process), a subdirectory
 * in it for each fuzzer (tests/formats/test_megatron.c runs two in one
 * process). No run leaves one behind. */
#ifndef TP_FUZZ_SCRATCH_H
#define TP_FUZZ_SCRATCH_H

#include <stddef.h>

/* The subdirectory `name` of the process's scratch directory, made if it
 * is not there, its path in out; 0, or -1 when it cannot be made. */
int fuzz_scratch_dir(const char *name, char *out, size_t size);

/* The subdirectory `name` (fuzz_scratch_dir) holding copies of the count
 * files named in from_dir (a fixture's data files beside the fuzzed one),
 * made once a process; 0, or -1 (out then "") when it cannot be made. */
int fuzz_scratch_with_copies(const char *name, const char *from_dir, const char *const *files, int count, char *out,
                             size_t size);

/* Copies the file at `from` to `to`; 0, or -1 when a read or write failed. */
int fuzz_copy_file(const char *from, const char *to);

/* Writes size bytes of data as the file at path, a new file in place of
 * any there (removed first: ext4 flushes a file truncated by fopen "wb" to
 * disk when it is closed, which made the fuzzers of files wait on the disk
 * at every input); 0, or -1 when the write failed. */
int fuzz_write_file(const char *path, const void *data, size_t size);

#endif
