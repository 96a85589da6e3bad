/* fuzz_read.h: what the fuzzers of readers of foreign checkpoints do with a
 * reader that opened: read every tensor's first piece (up to 1 MiB, so that
 * an input claiming huge pieces costs nothing), then close it. A read may
 * fail (damage found); it must never crash or read outside its files. */
#ifndef TP_FUZZ_READ_H
#define TP_FUZZ_READ_H

#include "../../ckpt/ckpt.h"

static inline void fuzz_read_tensors(ckpt_reader *r)
{
    static unsigned char buf[1 << 20];
    for (int i = 0; i < ckpt_reader_num_tensors(r); i++) {
        ckpt_piece_info info;
        if (ckpt_reader_piece_info(r, i, 0, &info) == 0 && info.bytes <= (int64_t)sizeof buf)
            (void)ckpt_reader_read_piece(r, i, 0, buf, sizeof buf);
    }
    ckpt_reader_close(r);
}

#endif
