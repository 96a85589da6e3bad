/* bf16_outputs.c: an operation's fp32 output rounded into bf16 bits
 * (bf16_outputs.h). */
#include "bf16_outputs.h"

#include "../../common/error.h"
#include "../../common/memory.h"
#include "../kernels.h"
#include "workers.h"

typedef struct {
    const float *x;
    uint16_t *out;
} rounding_job;

static void round_span(void *ctx, int64_t i0, int64_t i1)
{
    const rounding_job *j = ctx;
    convert_from_f32(j->x + i0, j->out + i0, TP_BF16, i1 - i0);
}

void round_to_bf16(uint16_t *out, const float *x, int64_t n)
{
    rounding_job job = {x, out};
    workers_for(n, 1, round_span, &job);
}

int bf16_output_scratch(float **out, int64_t n, const char *what)
{
    *out = scratch_buffer(SCRATCH_BF16_OUTPUT, (size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!*out)
        return tp_fail(TP_ERR_NOMEM, "out of memory for the %s's %lld values before rounding to bf16", what,
                       (long long)n);
    return TP_OK;
}
