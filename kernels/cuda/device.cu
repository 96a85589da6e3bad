/* device.cu: what the CUDA runtime says about a device, for reports. */
#include <stdio.h>

#include "check.h"

extern "C" {
#include "../kernels.h"
}

extern "C" void cuda_device_name(int device, char *name, size_t size)
{
    cudaDeviceProp properties;
    if (size == 0) return;
    name[0] = '\0';
    if (cudaGetDeviceProperties(&properties, device) == cudaSuccess) snprintf(name, size, "%s", properties.name);
}
