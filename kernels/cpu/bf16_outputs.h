/* bf16_outputs.h: the CPU's bf16 activations (kernels.h): an operation's
 * fp32 output rounded into bf16 bits. Apart from the bf16 products
 * (bf16_products.h), which bring oneDNN: the operations that write bf16
 * activations (norms, RoPE, the attention) are linked into programs that
 * never train, and must not load oneDNN there (tp-reshard's memory bound). */
#ifndef TP_BF16_OUTPUTS_H
#define TP_BF16_OUTPUTS_H

#include <stdint.h>

/* Room for the fp32 output of an operation whose bf16 twin writes bf16
 * bits: n floats of the calling thread's scratch (SCRATCH_BF16_OUTPUT),
 * rounded afterwards by round_to_bf16, so that the bits are those of
 * the fp32 operation's output by construction. TP_ERR_NOMEM naming `what`
 * and n when it cannot be had. */
int bf16_output_scratch(float **out, int64_t n, const char *what);

#endif
