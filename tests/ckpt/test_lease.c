/* What a run directory's lease and an upload's claim share (ckpt/lease.c):
 * a claim object read while its holder rewrites or releases it is read
 * again while it fails as one changing under the read (torn, TP_ERR_FORMAT;
 * renewed between HEAD and GET, TP_ERR_CHECKSUM; released between them,
 * TP_ERR_NOT_FOUND), a bounded number of times; a store's own failure is
 * not read again. */
#include <criterion/criterion.h>
#include <string.h>

#include "../../ckpt/lease.h"
#include "../../common/error.h"

/* A reader whose first `torn` reads fail with `failure`, then reads the
 * record whole. */
static struct {
    int calls, torn, failure;
} reader;

static char record[16];
static int found;

static int scripted_read(const char *path, int *found_out, void *out)
{
    reader.calls++;
    *found_out = 0;
    if (reader.calls <= reader.torn) return tp_fail(reader.failure, "%s: read %d torn", path, reader.calls);
    *found_out = 1;
    strcpy(out, "whole");
    return TP_OK;
}

/* ckpt_lease_read_settled of a reader failing `torn` times with `failure`. */
static int settle(int torn, int failure)
{
    reader.calls = 0;
    reader.torn = torn;
    reader.failure = failure;
    record[0] = '\0';
    found = 0;
    return ckpt_lease_read_settled(scripted_read, "s3://b/.tp-run.lease", &found, record);
}

Test(lease, torn_reads_are_read_again_until_whole)
{
    cr_assert_eq(settle(3, TP_ERR_FORMAT), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(reader.calls, 4, "three torn reads, then the whole one: %d reads", reader.calls);
    cr_assert(found);
    cr_assert_str_eq(record, "whole");
}

Test(lease, renewed_or_released_under_the_read_is_read_again)
{
    int changes[] = {TP_ERR_CHECKSUM, TP_ERR_NOT_FOUND};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(settle(1, changes[i]), TP_OK, "status %d: %s", changes[i], tp_errmsg());
        cr_assert_eq(reader.calls, 2, "status %d: read again once: %d reads", changes[i], reader.calls);
    }
}

Test(lease, a_claim_torn_for_ever_is_an_error_after_a_bounded_number_of_reads)
{
    cr_assert_eq(settle(1000, TP_ERR_FORMAT), TP_ERR_FORMAT);
    cr_assert_eq(reader.calls, 8, "read 8 times, then its error stands: %d reads", reader.calls);
    cr_assert(strstr(tp_errmsg(), "s3://b/.tp-run.lease: read 8 torn"), "the last read's error: %s", tp_errmsg());
}

Test(lease, a_store_failure_is_not_read_again)
{
    cr_assert_eq(settle(1000, TP_ERR_IO), TP_ERR_IO);
    cr_assert_eq(reader.calls, 1, "the store retried it already: %d reads", reader.calls);
}
