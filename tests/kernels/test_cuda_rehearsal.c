/* test_cuda_rehearsal.c: test_cuda_backend's GPU tests run on the encoded
 * backend standing in for the GPU (see there): the tests themselves checked
 * on every machine, before a GPU runs them. */
#define CUDA_TESTS_REHEARSAL 1
#include "test_cuda_backend.c"
