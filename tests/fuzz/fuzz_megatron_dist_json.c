/* fuzz_megatron_dist_json.c: libFuzzer target for what Megatron-Core's
 * torch_dist reader parses before the DCP .metadata (formats/megatron_dist.c,
 * formats/megatron.c): the iteration's metadata.json (the backend, as
 * Megatron-Core's save_config writes it) and the save directory's tracker
 * latest_checkpointed_iteration.txt (an iteration number or "release").
 * The save directory is a copy of tests/data/megatron-dist/dp_reshardable
 * as its iteration 10. The input is metadata.json; after a first line
 * "#tracker", it is the tracker instead (metadata.json then the fixture's).
 * The checkpoint is detected (as the save directory and as the iteration's)
 * and opened; what opens must have the fixture's valid layout, whatever
 * else metadata.json holds. Each must succeed or fail with an error, never
 * crash, hang or read outside a file. `make fuzz` runs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../formats/megatron.h"
#include "../support/fuzz_scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_DIST_JSON_FIXTURE "tests/data/megatron-dist/dp_reshardable"
#define FUZZ_DIST_JSON_TRACKER "latest_checkpointed_iteration.txt"

/* The save directory (a tracker and iter_0000010, the fixture's files),
 * made once; its iteration's directory in iteration. */
static const char *fuzz_dist_json_save(char *iteration, size_t size)
{
    static int made;
    static char save[512], iter[600];
    static const char *const files[] = {"__0_0.distcp", "common.pt", "metadata.json", ".metadata"};
    if (!made) {
        made = 1;
        if (fuzz_scratch_dir("megatron-dist-json", save, sizeof save) == 0) {
            snprintf(iter, sizeof iter, "%s/iter_0000010", save);
            if (fuzz_scratch_with_copies("megatron-dist-json/iter_0000010", FUZZ_DIST_JSON_FIXTURE, files, 4, iter,
                                         sizeof iter))
                save[0] = '\0';
        }
    }
    snprintf(iteration, size, "%s", iter);
    return save;
}

static int fuzz_dist_json_put(const char *dir, const char *name, const void *data, size_t size)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return fuzz_write_file(path, data, size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char iteration[600], fixture[700], path[700];
    const char *save = fuzz_dist_json_save(iteration, sizeof iteration);
    if (!save[0]) return 0;
    const int tracker = size >= 9 && memcmp(data, "#tracker\n", 9) == 0;
    /* The other file put back to the fixture's (the tracker: iteration 10). */
    snprintf(fixture, sizeof fixture, FUZZ_DIST_JSON_FIXTURE "/metadata.json");
    snprintf(path, sizeof path, "%s/metadata.json", iteration);
    if (tracker ? fuzz_copy_file(fixture, path) : fuzz_dist_json_put(save, FUZZ_DIST_JSON_TRACKER, "10\n", 3))
        return 0;
    if (tracker ? fuzz_dist_json_put(save, FUZZ_DIST_JSON_TRACKER, data + 9, size - 9)
                : fuzz_dist_json_put(iteration, "metadata.json", data, size))
        return 0;
    int found = 0;
    (void)megatron_detect(save, &found);
    (void)megatron_dist_detect(save, &found);
    (void)megatron_dist_detect(iteration, &found);
    megatron_dist *m = NULL;
    if (megatron_dist_open(save, &m) == 0) {
        const megatron_config *config = megatron_dist_config(m);
        if (config->tp < 1 || config->pp < 1) __builtin_trap(); /* the fixture's layout, read whole */
        megatron_dist_close(m);
    }
    return 0;
}
