/* fuzz_megatron_dist.c: libFuzzer target for Megatron-Core's torch_dist
 * checkpoints on top of the DCP reader: the input is the `.metadata` of an
 * iteration directory whose other files (data, common.pt, metadata.json)
 * are those of tests/data/megatron-dist/dp_reshardable, a checkpoint of the
 * distributed optimizer's dp_reshardable layout, so that inputs near the
 * seed reach the keys of its buckets, the layout of its buffers, the boxes
 * of flat ranges and the check of the main copies. Every tensor is then
 * read, as stored and told the true vocabulary. It must open or fail with an error, never crash, hang or read
 * outside a file. `make fuzz` runs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../formats/megatron.h"
#include "../support/fuzz_read.h"
#include "../support/fuzz_scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A copy of the fixture's files but .metadata, made once. */
static const char *fuzz_dist_dir(void)
{
    static int made;
    static char dir[512];
    static const char *const files[] = {"__0_0.distcp", "common.pt", "metadata.json"};
    if (!made)
        made = 1, (void)fuzz_scratch_with_copies("megatron-dist", "tests/data/megatron-dist/dp_reshardable", files, 3,
                                                 dir, sizeof dir);
    return dir;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_dist_dir();
    if (!dir[0]) return 0;
    char path[600];
    snprintf(path, sizeof path, "%s/.metadata", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t written = fwrite(data, 1, size, f);
    if (fclose(f) != 0 || written != size) return 0;
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
