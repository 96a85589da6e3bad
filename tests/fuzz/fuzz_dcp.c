/* fuzz_dcp.c: libFuzzer target for a PyTorch distributed checkpoint's
 * `.metadata`: the pickle (protocol 4, as torch writes it), its Metadata
 * read by class name, every key, size, chunk, storage item and file name
 * checked, each chunk's item located in the data files and every tensor
 * read. The input is the `.metadata` of a directory whose data files are
 * those of the fixture tests/data/dcp/cols2 (written by PyTorch), so that
 * inputs near the seeds reach the items. It must open or fail with an
 * error, never crash, hang or read outside a file. `make fuzz` runs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../formats/dcp.h"
#include "../support/fuzz_read.h"
#include "../support/fuzz_scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The directory: a copy of the fixture's data files, made once. */
static const char *fuzz_dcp_dir(void)
{
    static int made;
    static char dir[512];
    static const char *const files[] = {"__0_0.distcp", "__1_0.distcp"};
    if (!made) made = 1, (void)fuzz_scratch_with_copies("dcp", "tests/data/dcp/cols2", files, 2, dir, sizeof dir);
    return dir;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_dcp_dir();
    if (!dir[0]) return 0;
    char path[600];
    snprintf(path, sizeof path, "%s/.metadata", dir);
    if (fuzz_write_file(path, data, size)) return 0;
    dcp_checkpoint *dcp = NULL;
    if (dcp_open(dir, &dcp) != 0) return 0;
    for (int i = 0; i < dcp_num_entries(dcp); i++) {
        const dcp_entry *e = dcp_entry_at(dcp, i);
        void *bytes = NULL;
        int64_t n = 0;
        if (e->kind == DCP_BYTES && dcp_read_bytes(dcp, i, 1 << 20, &bytes, &n) == 0) free(bytes);
    }
    ckpt_reader *r = NULL;
    if (dcp_reader_open(dcp, 1, 1, &r) == 0) fuzz_read_tensors(r);
    dcp_close(dcp);
    return 0;
}
