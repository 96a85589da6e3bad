/* none.c: the CUDA entry points of a build without CUDA (make CUDA=0): there
 * is no device, and asking for one says why. */
#include "../../common/error.h"
#include "../kernels.h"
#include "attention_cudnn.h"
#include "attention_tf32x3.h"
#include "attention_tiled.h"
#include "column_sums_emulation.h"
#include "norm_emulation.h"
#include "products_lt.h"

#define NO_CUDA "this build has no CUDA support (rebuild with nvcc available)"

int cuda_device_count(void)
{
    return 0;
}

int cuda_built(void)
{
    return 0;
}

int cuda_convert_numbers(const void *in, tp_dtype in_format, void *out, tp_dtype out_format, int64_t n,
                         convert_overflow *overflow)
{
    (void)in, (void)in_format, (void)out, (void)out_format, (void)n, (void)overflow;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

struct cuda_mover {
    int unused;
};

int cuda_mover_create(cuda_mover **out, size_t staging_bytes, size_t output_bytes, int64_t max_moves)
{
    (void)staging_bytes, (void)output_bytes, (void)max_moves;
    *out = NULL;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

void *cuda_mover_staging(cuda_mover *mover)
{
    (void)mover;
    return NULL;
}

void *cuda_mover_output(cuda_mover *mover)
{
    (void)mover;
    return NULL;
}

int cuda_mover_run(cuda_mover *mover, size_t staging_used, tp_dtype src_format, size_t output_used,
                   tp_dtype dst_format, const strided_move *moves, int64_t count, convert_overflow *overflow)
{
    (void)mover, (void)staging_used, (void)src_format, (void)output_used, (void)dst_format, (void)moves, (void)count,
        (void)overflow;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

void cuda_mover_free(cuda_mover *mover)
{
    (void)mover;
}

const kernel_backend *kernels_cuda(int device)
{
    (void)device;
    tp_fail(TP_ERR_DEVICE, NO_CUDA);
    return NULL;
}

void cuda_device_name(int device, char *name, size_t size)
{
    (void)device;
    if (size) name[0] = '\0';
}

int cuda_group_id(unsigned char id[CUDA_GROUP_ID_BYTES])
{
    (void)id;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_group_create(cuda_group **out, const unsigned char id[CUDA_GROUP_ID_BYTES], int members, int member)
{
    (void)id, (void)members, (void)member;
    *out = NULL;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_group_all_reduce(cuda_group *group, void *data, int64_t count, int is_double, int is_max)
{
    (void)group, (void)data, (void)count, (void)is_double, (void)is_max;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_group_all_gather(cuda_group *group, const void *send, void *recv, int64_t count, int value_bytes)
{
    (void)group, (void)send, (void)recv, (void)count, (void)value_bytes;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_group_reduce_scatter(cuda_group *group, const void *send, void *recv, int64_t count, int is_double)
{
    (void)group, (void)send, (void)recv, (void)count, (void)is_double;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_group_send(cuda_group *group, int peer, const void *data, int64_t count, int is_double)
{
    (void)group, (void)peer, (void)data, (void)count, (void)is_double;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_group_recv(cuda_group *group, int peer, void *data, int64_t count, int is_double)
{
    (void)group, (void)peer, (void)data, (void)count, (void)is_double;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_group_wait_sends(cuda_group *group, int64_t sends)
{
    (void)group, (void)sends;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

void cuda_group_free(cuda_group *group)
{
    (void)group;
}

int cuda_attention_variant(const char *name)
{
    (void)name;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_deterministic_variant(const char *value)
{
    (void)value;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_tiled_forward_rows_variant(const char *value)
{
    (void)value;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_tiled_backward_rows_variant(const char *value)
{
    (void)value;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_attention_tiled_fits(int64_t B, int64_t Hq, int64_t hd)
{
    (void)B, (void)Hq, (void)hd;
    return 0;
}

int cuda_attention_tiled_emulate_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                                         int64_t Hkv, int64_t hd)
{
    (void)out, (void)lse, (void)qkv, (void)B, (void)T, (void)Hq, (void)Hkv, (void)hd;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_attention_tiled_emulate_backward(float *d_qkv, float *delta, const float *d_out, const float *qkv,
                                          const float *out, const float *lse, int64_t B, int64_t T, int64_t Hq,
                                          int64_t Hkv, int64_t hd)
{
    (void)d_qkv, (void)delta, (void)d_out, (void)qkv, (void)out, (void)lse, (void)B, (void)T, (void)Hq, (void)Hkv;
    (void)hd;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_column_sums_emulate(float *sums, const void *values, int values_bf16, int64_t N, int64_t C, int chunked)
{
    (void)sums, (void)values, (void)values_bf16, (void)N, (void)C, (void)chunked;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_layernorm_backward_emulate(float *d_in, uint16_t *d_in_bits, float *d_weight, float *d_bias,
                                    const float *d_out, const float *in, const float *weight, const float *mean,
                                    const float *rstd, int64_t N, int64_t C)
{
    (void)d_in, (void)d_in_bits, (void)d_weight, (void)d_bias, (void)d_out, (void)in, (void)weight, (void)mean;
    (void)rstd, (void)N, (void)C;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_rmsnorm_backward_emulate(float *d_in, uint16_t *d_in_bits, float *d_weight, const float *d_out,
                                  const float *in, const float *weight, const float *rstd, int64_t N, int64_t C)
{
    (void)d_in, (void)d_in_bits, (void)d_weight, (void)d_out, (void)in, (void)weight, (void)rstd, (void)N, (void)C;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cudnn_attention_shape_ok(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    (void)B, (void)T, (void)Hq, (void)Hkv, (void)hd;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cudnn_attention_load(char *version, size_t size)
{
    (void)version, (void)size;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cudnn_attention_check_graph(cudnn_attention_graph graph, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                int64_t hd, cudnn_attention_check *check)
{
    (void)graph, (void)B, (void)T, (void)Hq, (void)Hkv, (void)hd, (void)check;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cudnn_attention_prepare(cudnn_attention_graph graph, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                            const cudnn_attention_plan **plan)
{
    (void)graph, (void)B, (void)T, (void)Hq, (void)Hkv, (void)hd;
    *plan = NULL;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int64_t cudnn_attention_engine(const cudnn_attention_plan *plan)
{
    (void)plan;
    return -1;
}

size_t cudnn_attention_workspace_bytes(const cudnn_attention_plan *plan)
{
    (void)plan;
    return 0;
}

int cudnn_attention_run(const cudnn_attention_plan *plan, const cudnn_attention_tensors *tensors)
{
    (void)plan, (void)tensors;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int64_t cuda_lt_bias_epilogue_products(void)
{
    return 0;
}

int64_t cuda_lt_bias_epilogue_bits_products(void)
{
    return 0;
}

int64_t cuda_lt_gelu_epilogue_products(void)
{
    return 0;
}

int64_t cuda_lt_dgelu_epilogue_products(void)
{
    return 0;
}

const char *cuda_lt_last_refusal(void)
{
    return "none (" NO_CUDA ")";
}

int cuda_attention_tf32x3_fits(int64_t B, int64_t Hq, int64_t hd)
{
    (void)B, (void)Hq, (void)hd;
    return 0;
}

int cuda_attention_tf32x3_emulate_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t Hq,
                                          int64_t Hkv, int64_t hd)
{
    (void)out, (void)lse, (void)qkv, (void)B, (void)T, (void)Hq, (void)Hkv, (void)hd;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}

int cuda_attention_tf32x3_emulate_backward(float *d_qkv, float *delta, const float *d_out, const float *qkv,
                                           const float *out, const float *lse, int64_t B, int64_t T, int64_t Hq,
                                           int64_t Hkv, int64_t hd)
{
    (void)d_qkv, (void)delta, (void)d_out, (void)qkv, (void)out, (void)lse, (void)B, (void)T, (void)Hq, (void)Hkv;
    (void)hd;
    return tp_fail(TP_ERR_DEVICE, NO_CUDA);
}
