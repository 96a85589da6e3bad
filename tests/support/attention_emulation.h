/* attention_emulation.h: the checks that the CUDA attention kernels'
 * CPU emulations (kernels/cuda/attention_tiled.h, attention_tf32x3.h) make
 * against the CPU backend's attention, one shape at a time. */
#ifndef TP_TEST_ATTENTION_EMULATION_H
#define TP_TEST_ATTENTION_EMULATION_H
#include <stdint.h>

/* The emulations' signatures (attention_tiled.h). */
typedef int (*emulated_attention_forward)(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                                          int64_t Hkv, int64_t hd);
typedef int (*emulated_attention_backward)(float *d_qkv, float *delta, const float *d_out, const float *qkv,
                                           const float *out, const float *lse, int64_t B, int64_t T, int64_t Hq,
                                           int64_t Hkv, int64_t hd);

/* shape: B, T, Hq, Hkv, hd. The test's failure unless the emulated forward
 * gives the CPU's out and lse, and the emulated backward (on the CPU's out
 * and lse, its d_qkv from garbage: every element has its writer) the CPU's
 * d_qkv and delta = d_out . out: each within 1e-4 relative + 1e-5 absolute,
 * as test_cuda_backend's tolerance for the GPU's attention (the sums run in
 * another order). Failures name `way` (the kernels and their choices), the
 * tensor, the element and the shape. */
void attention_emulation_check_forward(emulated_attention_forward forward, const int64_t *shape, const char *way);
void attention_emulation_check_backward(emulated_attention_backward backward, const int64_t *shape, const char *way);
#endif
