/* fuzz_megatron.c: libFuzzer target for the Megatron-LM reader on top of
 * the torch.save one: the input is the rank file of a tp1 pp1 checkpoint
 * (mp_rank_00/model_optim_rng.pt in the process's scratch directory), whose
 * args, model dicts, optimizer state (parameter groups, state entries,
 * fp32 masters) and RNG states are interpreted; the reader then reads every
 * piece for its digests. It must open or fail with an error, never crash,
 * hang or read outside the file. The seeds *_pickle_crc0.pt record their
 * data.pkl's CRC-32 as 0 (tests/fuzz/zero_crc.py): with the real one,
 * every mutation of the pickle was refused as damage before the args were
 * read. `make fuzz` runs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../formats/megatron.h"
#include "../support/fuzz_scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char file[640];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char fuzz_dir[512];
    static int made;
    if (!made) {
        made = 1;
        if (fuzz_scratch_dir("megatron", fuzz_dir, sizeof fuzz_dir) == 0) {
            char rank_dir[600];
            snprintf(rank_dir, sizeof rank_dir, "%s/mp_rank_00", fuzz_dir);
            snprintf(file, sizeof file, "%s/model_optim_rng.pt", rank_dir);
            if (mkdir(rank_dir, 0700) != 0) file[0] = '\0';
        }
    }
    if (!file[0]) return 0;
    if (fuzz_write_file(file, data, size)) return 0;
    megatron_checkpoint *m = NULL;
    if (megatron_open(fuzz_dir, &m) == 0) {
        ckpt_reader *r = NULL;
        if (megatron_reader_open(m, 1, &r) == 0) ckpt_reader_close(r);
    }
    megatron_close(m);
    return 0;
}
