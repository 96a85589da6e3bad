/* open.c: a checkpoint of any format the toolkit reads, as a ckpt_reader. */
#include <string.h>

#include "../common/error.h"
#include "dcp.h"
#include "formats.h"
#include "megatron.h"

int formats_open_checkpoint(const char *path, const ckpt_read_options *options, int compute_digests, ckpt_reader **out,
                            const char **format)
{
    *out = NULL;
    int dist, dcp, megatron;
    /* Megatron-Core's torch_dist is a DCP checkpoint and has a tracker file:
     * it is asked for first. */
    TP_TRY(megatron_dist_detect(path, &dist));
    if (dist) {
        if (format) *format = "megatron-torch-dist";
        megatron_dist *m;
        TP_TRY(megatron_dist_open(path, &m));
        int status = megatron_dist_reader_open(m, compute_digests, 0, out);
        megatron_dist_close(m);
        return status;
    }
    TP_TRY(dcp_detect(path, &dcp));
    if (dcp) {
        if (format) *format = "dcp";
        dcp_checkpoint *d;
        TP_TRY(dcp_open(path, &d));
        int status = dcp_reader_open(d, compute_digests, 0, out);
        dcp_close(d);
        return status;
    }
    TP_TRY(megatron_detect(path, &megatron));
    if (!megatron) {
        if (format) *format = "tp";
        return ckpt_reader_open(out, path, options);
    }
    if (format) *format = "megatron-legacy";
    megatron_checkpoint *m;
    TP_TRY(megatron_open(path, &m));
    int status = megatron_reader_open(m, compute_digests, out);
    megatron_close(m);
    return status;
}
