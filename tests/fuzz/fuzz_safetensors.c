/* fuzz_safetensors.c: libFuzzer target for the safetensors reader. The input
 * is a whole .safetensors file (8-byte header length, JSON header, data),
 * opened from memory (a memfd) as import opens a file; or, after a first
 * line "#index", a model.safetensors.index.json over two small files
 * (a.safetensors holding x, b.safetensors holding y) in a directory. It must
 * open or fail with an error, never crash, hang or take memory out of
 * proportion. `make fuzz` runs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../formats/formats.h"
#include "../support/fuzz_scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char index_dir[512];

static int write_file(const char *name, const void *data, size_t size)
{
    char path[640];
    snprintf(path, sizeof path, "%s/%s", index_dir, name);
    return fuzz_write_file(path, data, size);
}

/* The directory of the index mode, made once. */
static int make_index_dir(void)
{
    if (index_dir[0]) return 0;
    if (fuzz_scratch_dir("safetensors", index_dir, sizeof index_dir)) return index_dir[0] = '\0', -1;
    for (int i = 0; i < 2; i++) {
        char file[128];
        int n = snprintf(file + 8, sizeof file - 8, "{\"%c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                         i ? 'y' : 'x');
        uint64_t length = (uint64_t)n;
        memcpy(file, &length, 8);
        memset(file + 8 + n, 0, 4);
        if (write_file(i ? "b.safetensors" : "a.safetensors", file, (size_t)n + 12)) return -1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    safetensors_set *set = NULL;
    int status;
    if (size >= 7 && memcmp(data, "#index\n", 7) == 0) {
        if (make_index_dir() || write_file("model.safetensors.index.json", data + 7, size - 7)) return 0;
        status = safetensors_open(&set, index_dir);
    } else {
        static int fd = -1;
        if (fd < 0) fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) return 0;
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        status = safetensors_open(&set, path);
    }
    if (status == TP_OK) {
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
