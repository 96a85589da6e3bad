/* fixture.h: shared helpers of the checkpoint and reshard tests. */
#ifndef TP_TEST_FIXTURE_H
#define TP_TEST_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "../../ckpt/ckpt.h"

/* A fresh temporary directory per test (TestSuite .init/.fini). */
extern char dir[512];
void make_dir(void);
void remove_dir(void);

/* xorshift64, so failures reproduce. */
void seed_random(uint64_t seed);
uint64_t next_random(void);
int64_t rnd(int64_t lo, int64_t hi); /* inclusive */

int64_t elements_of(const int64_t *shape, int ndim);

/* bytes of random numbers in dtype: random bits (infinities, NaNs,
 * subnormals among them), but for finite magnitudes beyond fp16's range,
 * folded into it (exponent's top bit cleared), so that a conversion to
 * any dtype holds them: one that would overflow fails (kernels.h
 * convert_overflow). */
void random_numbers(uint8_t *data, size_t bytes, tp_dtype dtype);

typedef struct {
    ckpt_tensor_desc desc;
    char name[64];
    uint8_t *logical; /* the logical tensor, row-major, stored dtype */
} test_tensor;

/* 3..max random tensors that split at every degree in tps (segments without
 * padding are multiples of every degree); logical data random bytes. */
int random_tensors(test_tensor *out, int max, const int *tps, int num_tps, int64_t layers);

/* Naive: rank's stored piece of t at degree tp, element by element. */
void build_piece(const ckpt_tensor_desc *t, int tp, int rank, const uint8_t *logical, uint8_t *out);

/* Writes and commits the tensors at a layout, pieces whole or in slabs. */
void write_tensors(const char *path, const ckpt_layout *layout, test_tensor *tensors, int n, int compress,
                   int64_t step);

/* Naive: the box [start, start + count) of the logical tensor. */
void extract(const test_tensor *t, const int64_t *start, const int64_t *count, uint8_t *out);

/* Runs every file of tests/fuzz/corpus/<target> through one (a fuzz
 * target's LLVMFuzzerTestOneInput); returns how many there were. A crash
 * fails the test (Criterion runs it in a child). */
int replay_corpus(const char *target, int (*one)(const uint8_t *data, size_t size));

/* The Python of fixtures and judges: TP_PYTHON (run-tests.py gives the
 * forking server of tests/tools/pyfork.c, which loaded PyTorch once) or
 * Debian's /usr/bin/python3. */
const char *fixture_python(void);

/* Refreshes the index_checksum of an index.json a test changed on purpose
 * (an implementation of its own of docs/FORMAT.md's seal). */
void reseal_index(const char *file);

/* Replaces the first match of the extended regular expression FROM in
 * PATH/index.json with TO, and reseals it (in C: the tests also run where
 * there is no shell, tests/gpu/test_gpu_pack.sh). */
void edit_index(const char *path, const char *from, const char *to);

/* The logical digest straight from its definition. */
uint64_t naive_digest(const uint8_t *logical, size_t element_size, int64_t n);

#endif
