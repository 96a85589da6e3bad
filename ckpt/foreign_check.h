/* foreign_check.h (private to ckpt/): the checksums a foreign checkpoint
 * records, checked as its reader reads (foreign_check.c). */
#ifndef TP_CKPT_FOREIGN_CHECK_H
#define TP_CKPT_FOREIGN_CHECK_H

#include <stdint.h>

#include "ckpt.h"

typedef struct foreign_checks foreign_checks;

/* The ranges (ckpt_foreign_check) of files[0..num_files) to check; the
 * same range given twice is kept once, overlapping different ones refused. */
int foreign_checks_create(const ckpt_foreign_check *ranges, int count, const char *const *files, int num_files,
                          foreign_checks **out);
void foreign_checks_free(foreign_checks *checks);

/* n bytes of file at offset were read into data: the ranges they continue
 * take them; TP_ERR_CHECKSUM naming the file and entry when a range is
 * then whole and its CRC-32 differs (and for every later read of it).
 * NULL checks: nothing to do. */
int foreign_checks_note(foreign_checks *checks, int file, int64_t offset, const void *data, int64_t n);

/* Every range read in part is read to its end with read(ctx, file, buf, n,
 * offset) and compared; a mismatch fails as foreign_checks_note does.
 * *checked (may be NULL): ranges found whole and matching. */
int foreign_checks_finish(foreign_checks *checks, int (*read)(void *ctx, int file, void *buf, int64_t n, int64_t offset),
                          void *ctx, int *checked);

#endif
