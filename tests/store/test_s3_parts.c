/* The part size of S3 multipart uploads (store_s3_part_bytes): the size
 * asked for while it keeps to S3's 10,000 parts; larger, in whole MiB, where
 * it would not; files S3 cannot take refused by name. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../../common/error.h"
#include "../../store/store.h"

#define MiB ((int64_t)1 << 20)
#define GiB ((int64_t)1 << 30)

Test(s3_parts, the_part_size_asked_for_while_it_keeps_to_10000_parts)
{
    int64_t part = 0;
    cr_assert_eq(store_s3_part_bytes(8 * GiB, 64 * MiB, &part), TP_OK);
    cr_assert_eq(part, 64 * MiB, "8 GiB in 128 parts of 64 MiB");
    cr_assert_eq(store_s3_part_bytes(10000 * 64 * MiB, 64 * MiB, &part), TP_OK);
    cr_assert_eq(part, 64 * MiB, "exactly 10,000 parts");
}

Test(s3_parts, larger_parts_past_10000)
{
    int64_t part = 0, length = 10000 * 64 * MiB + 1; /* one byte more: 10,001 parts of 64 MiB */
    cr_assert_eq(store_s3_part_bytes(length, 64 * MiB, &part), TP_OK);
    cr_assert_eq(part, 65 * MiB, "%lld", (long long)part);
    cr_assert_leq((length + part - 1) / part, 10000);
    length = (int64_t)1 << 40; /* 1 TiB at 5 MiB parts would be 209,716 */
    cr_assert_eq(store_s3_part_bytes(length, 5 * MiB, &part), TP_OK);
    cr_assert_eq(part % MiB, 0);
    cr_assert_leq((length + part - 1) / part, 10000);
    cr_assert_gt((length + (part - MiB) - 1) / (part - MiB), 10000, "the smallest whole MiB that keeps to 10,000");
}

Test(s3_parts, what_s3_cannot_take)
{
    int64_t part = 0;
    cr_assert_eq(store_s3_part_bytes((int64_t)5 << 40, 64 * MiB, &part), TP_OK, "5 TiB: S3's largest object");
    cr_assert_leq(part, 5 * GiB);
    cr_assert_eq(store_s3_part_bytes(((int64_t)5 << 40) + 1, 64 * MiB, &part), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "5 TiB") != NULL, "%s", tp_errmsg());
}
