/* fuzz_safetensors.c: libFuzzer target for the safetensors reader: the input
 * is a whole .safetensors file (8-byte header length, JSON header, data),
 * opened from memory (a memfd) as import opens a file. It must open or fail
 * with an error, never crash, hang or take memory out of proportion.
 * `make fuzz` runs it. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../formats/formats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    if (fd < 0) fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    safetensors_set *set = NULL;
    if (safetensors_open(&set, path) == TP_OK) {
        int n = safetensors_count(set);
        for (int i = 0; i < n; i++) {
            const safetensors_info *t = safetensors_tensor(set, i);
            if (!t || safetensors_find(set, t->name) != t) __builtin_trap();
        }
        (void)safetensors_metadata(set, "format");
        safetensors_close(set);
    }
    return 0;
}
