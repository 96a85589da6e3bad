/* fuzz_megatron_dist.c: libFuzzer target for Megatron-Core's torch_dist
 * checkpoints on top of the DCP reader: the input is the `.metadata` of an
 * iteration directory whose other files (data, common.pt, metadata.json)
 * are those of tests/data/megatron-dist/dp_reshardable, a checkpoint of the
 * distributed optimizer's dp_reshardable layout, so that inputs near the
 * seed reach the keys of its buckets, the layout of its buffers, the boxes
 * of flat ranges and the check of the main copies. Every tensor is then
 * read, as stored and told the true vocabulary. After a first line
 * "#common.pt", the input is the common.pt instead (the args, beside the
 * fixture's .metadata; seeds record its data.pkl's CRC-32 as 0, so that
 * mutations of the pickle are interpreted, not refused as damage). It must
 * open or fail with an error, never crash, hang or read outside a file.
 * `make fuzz` runs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../formats/megatron.h"
#include "../support/fuzz_read.h"
#include "../support/fuzz_scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_DIST_FIXTURE "tests/data/megatron-dist/dp_reshardable"

/* A copy of the fixture's files, made once. */
static const char *fuzz_dist_dir(void)
{
    static int made;
    static char dir[512];
    static const char *const files[] = {"__0_0.distcp", "common.pt", "metadata.json", ".metadata"};
    if (!made) made = 1, (void)fuzz_scratch_with_copies("megatron-dist", FUZZ_DIST_FIXTURE, files, 4, dir, sizeof dir);
    return dir;
}

/* Writes data as dir/name, the other fuzzed file (.metadata or common.pt)
 * put back to the fixture's where an earlier input replaced it. */
static int fuzz_dist_put(const char *dir, const char *name, const uint8_t *data, size_t size)
{
    static char replaced[16]; /* the name of the file an earlier input replaced */
    char path[600], fixture[600];
    if (replaced[0] && strcmp(replaced, name)) {
        snprintf(path, sizeof path, "%s/%s", dir, replaced);
        snprintf(fixture, sizeof fixture, FUZZ_DIST_FIXTURE "/%s", replaced);
        if (fuzz_copy_file(fixture, path)) return -1;
    }
    snprintf(replaced, sizeof replaced, "%s", name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return fuzz_write_file(path, data, size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_dist_dir();
    if (!dir[0]) return 0;
    const int common = size >= 11 && memcmp(data, "#common.pt\n", 11) == 0;
    if (common ? fuzz_dist_put(dir, "common.pt", data + 11, size - 11) : fuzz_dist_put(dir, ".metadata", data, size))
        return 0;
    megatron_dist *m = NULL;
    if (megatron_dist_open(dir, &m) != 0) return 0;
    /* Read as stored, then told the fixture's true vocabulary (30 tokens
     * in 32 rows: every box of the tables cut at the last token's row). */
    for (int told = 0; told < 2; told++) {
        if (told && megatron_dist_set_true_vocab(m, 30) != 0) break;
        ckpt_reader *r = NULL;
        if (megatron_dist_reader_open(m, 1, 1, &r) == 0) fuzz_read_tensors(r);
    }
    megatron_dist_close(m);
    return 0;
}
