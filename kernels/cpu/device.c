/* device.c: choosing a kernel backend, and the peak throughput of the GPUs
 * we know (for the model FLOPs utilization the trainer reports). */
#include <stdio.h>
#include <string.h>

#include "../../common/error.h"
#include "../kernels.h"

int kernels_gpu_for(int local_rank)
{
    return cuda_built() && cuda_device_count() > local_rank;
}

int kernels_gpu_index(int local_rank, int gpus, int share_gpus, int *index)
{
    *index = -1;
    if (gpus <= 0) return tp_fail(TP_ERR_DEVICE, "--device cuda: no CUDA device on this machine");
    if (local_rank < 0) return tp_fail(TP_ERR_ARG, "local rank %d: not a rank", local_rank);
    if (share_gpus) {
        *index = local_rank % gpus;
        return TP_OK;
    }
    if (local_rank >= gpus)
        return tp_fail(TP_ERR_DEVICE,
                       "--device cuda: local rank %d needs GPU %d, but this machine has %d (one process per GPU; "
                       "--share-gpus puts several on one)",
                       local_rank, local_rank, gpus);
    *index = local_rank;
    return TP_OK;
}

int kernels_choose(const char *device, int local_rank, int share_gpus, const kernel_backend **out)
{
    *out = NULL;
    int want_cuda = strcmp(device, "cuda") == 0, automatic = strcmp(device, "auto") == 0;
    if (strcmp(device, "cpu") == 0 || (automatic && !kernels_gpu_for(local_rank))) {
        *out = kernels_cpu();
        return TP_OK;
    }
    if (!want_cuda && !automatic)
        return tp_fail(TP_ERR_ARG, "--device takes cpu, cuda or auto, not '%s'", device);
    if (!cuda_built()) return tp_fail(TP_ERR_DEVICE, "--device cuda: this build has no CUDA support (rebuild with nvcc)");
    int index;
    TP_TRY(kernels_gpu_index(local_rank, cuda_device_count(), want_cuda && share_gpus, &index));
    *out = kernels_cuda(index);
    return *out ? TP_OK : TP_ERR_DEVICE; /* kernels_cuda said why */
}

double gpu_peak_bf16_flops(const char *name)
{
    /* Dense (no sparsity) bf16 tensor-core peaks from the vendors' data
     * sheets, most specific names first. */
    static const struct {
        const char *match;
        double tflops;
    } table[] = {
        {"H200", 989.4}, {"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"H100", 989.4}, /* SXM */
        {"A100", 312.0}, {"L40S", 362.05},     {"A10G", 70.0},      {"L4", 121.0},
    };
    for (size_t i = 0; name && i < sizeof table / sizeof table[0]; i++)
        if (strstr(name, table[i].match)) return table[i].tflops * 1e12;
    return 0;
}
