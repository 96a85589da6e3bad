/* fuzz_megatron_dist.c: libFuzzer target for Megatron-Core's torch_dist
 * checkpoints on top of the DCP reader: the input is the `.metadata` of an
 * iteration directory whose other files (data, common.pt, metadata.json)
 * are those of tests/data/megatron-dist/dp_reshardable, a checkpoint of the
 * distributed optimizer's dp_reshardable layout, so that inputs near the
 * seed reach the keys of its buckets, the layout of its buffers, the boxes
 * of flat ranges and the check of the main copies. Every tensor is then
 * read. It must open or fail with an error, never crash, hang or read
 * outside a file. `make fuzz` runs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../formats/megatron.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int copy_dist_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
    char buf[1 << 14];
    size_t n;
    int ok = in && out;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = 0;
    return ok;
}

static char dist_dir[256];
static const char *const dist_files[] = {"__0_0.distcp", "common.pt", "metadata.json"};

/* The directory goes with the process. */
static void remove_dist_dir(void)
{
    char path[400];
    for (size_t i = 0; i < sizeof dist_files / sizeof *dist_files; i++) {
        snprintf(path, sizeof path, "%s/%s", dist_dir, dist_files[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/.metadata", dist_dir);
    unlink(path);
    rmdir(dist_dir);
}

/* A copy of the fixture's files but .metadata, made once. */
static const char *fuzz_dist_dir(void)
{
    static int made;
    if (made) return dist_dir;
    made = 1;
    snprintf(dist_dir, sizeof dist_dir, "%s/tp-fuzz-megatron-dist-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    char from[512], to[512];
    int ok = mkdir(dist_dir, 0700) == 0;
    if (ok) atexit(remove_dist_dir);
    for (size_t i = 0; i < sizeof dist_files / sizeof *dist_files && ok; i++) {
        snprintf(from, sizeof from, "tests/data/megatron-dist/dp_reshardable/%s", dist_files[i]);
        snprintf(to, sizeof to, "%s/%s", dist_dir, dist_files[i]);
        ok = copy_dist_file(from, to);
    }
    if (!ok) dist_dir[0] = '\0';
    return dist_dir;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_dist_dir();
    if (!dir[0]) return 0;
    char path[400];
    snprintf(path, sizeof path, "%s/.metadata", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t written = fwrite(data, 1, size, f);
    if (fclose(f) != 0 || written != size) return 0;
    megatron_dist *m = NULL;
    if (megatron_dist_open(dir, &m) != 0) return 0;
    ckpt_reader *r = NULL;
    if (megatron_dist_reader_open(m, 1, 1, &r) == 0) {
        static unsigned char buf[1 << 20];
        for (int i = 0; i < ckpt_reader_num_tensors(r); i++) {
            ckpt_piece_info info;
            if (ckpt_reader_piece_info(r, i, 0, &info) == 0 && info.bytes <= (int64_t)sizeof buf)
                (void)ckpt_reader_read_piece(r, i, 0, buf, sizeof buf);
        }
        ckpt_reader_close(r);
    }
    megatron_dist_close(m);
    return 0;
}
