/* encoded_backend.h: a kernel backend for testing the device seam on a
 * machine without a device. Its "device memory" is host memory kept
 * encoded (every byte XOR 0x5A): only the backend's own copies and
 * operations decode it. Code that reads or writes a device pointer directly,
 * instead of through the backend, sees or leaves garbage, and the results of
 * a run differ from the CPU backend's, which they otherwise equal bit for bit
 * (the operations are the CPU's, on decoded data). Thread-safe: one lock
 * around every operation. */
#ifndef TP_TESTS_ENCODED_BACKEND_H
#define TP_TESTS_ENCODED_BACKEND_H

#include "../../kernels/kernels.h"

const kernel_backend *encoded_backend(void);

/* Bytes allocated and not yet released (leak check). */
size_t encoded_backend_live_bytes(void);

#endif
