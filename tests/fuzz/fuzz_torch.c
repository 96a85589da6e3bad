/* fuzz_torch.c: libFuzzer target for torch.save archives: the zip
 * container (central directory, Zip64 records, local headers), data.pkl
 * and the tensors' byte ranges. The input is a whole file, opened from
 * memory (a memfd) as a path; every tensor found is read. It must open or
 * fail with an error, never crash, hang or read outside the file. A
 * data.pkl whose bytes differ from its recorded CRC-32 is refused before it
 * is interpreted (an input recording 0 has none and is interpreted):
 * fuzz_pickle.c fuzzes the interpreter itself. `make fuzz` runs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../formats/torch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int read_tensor(void *ctx, const char *path, const pickle_value *tensor)
{
    (void)path;
    int64_t offset, bytes;
    if (torch_tensor_range(ctx, tensor, &offset, &bytes) != 0) return 0;
    static unsigned char buf[1 << 16];
    int64_t n = bytes < (int64_t)sizeof buf ? bytes : (int64_t)sizeof buf;
    (void)torch_tensor_read(ctx, tensor, buf, 0, n);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    if (fd < 0) fd = memfd_create("fuzz.pt", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    pickle_limits limits;
    pickle_limits_init(&limits);
    limits.max_memory = 64 << 20;
    torch_archive *archive = NULL;
    if (torch_archive_open(path, &limits, &archive) != 0) return 0;
    (void)pickle_walk_tensors(torch_archive_doc(archive), torch_archive_root(archive), read_tensor, archive);
    torch_archive_close(archive);
    return 0;
}
