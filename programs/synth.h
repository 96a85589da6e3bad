/* synth.h: deterministic synthetic checkpoints for tests and benchmarks
 * (`tp-ckpt synth`, bench_ckpt): test data, so it lives with the programs,
 * not in the checkpoint library.
 *
 * Element i (flat row-major index into the logical, unpadded tensor) of a
 * tensor with seed name N holds, in fp32 arithmetic:
 *   h = XXH3_64bits(N)
 *   z = (seed * 0x9E3779B97F4A7C15 ^ h) + (i + 1) * 0xD1B54A32D192ED03   (mod 2^64)
 *   z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9;  z = (z ^ z >> 27) * 0x94D049BB133111EB;
 *   z = z ^ z >> 31                                                      (splitmix64)
 *   u = ((z >> 40) - 2^23) / 2^23          in [-1, 1), exact in fp32
 *   value = mean + scale * u               (two fp32 roundings)
 * then rounded to the stored dtype (nearest, ties to even). Padding is zero.
 * The contents depend on the seed, the seed name and the global index only,
 * never on the layout, so checkpoints synthesized at any two layouts are
 * logically identical. */
#ifndef TP_PROGRAMS_SYNTH_H
#define TP_PROGRAMS_SYNTH_H

#include "../model/gpt.h"

typedef struct {
    ckpt_tensor_desc desc;
    const char *seed_name; /* whose values it holds: desc.name, or the parameter for a master copy */
    float mean, scale;
} synth_tensor;

typedef struct {
    uint64_t seed;
    int threads;                               /* 0: all cores */
    void (*on_bytes)(void *ctx, int64_t bytes); /* progress, called from worker threads */
    void *ctx;
} synth_options;

/* Writes and commits a checkpoint of the given tensors at path. */
int synth_write(const char *path, const ckpt_layout *layout, const ckpt_write_options *write_options,
                const synth_tensor *tensors, int count, const ckpt_train_state *state,
                const synth_options *options);

/* The values of n consecutive flat indices starting at first. */
void synth_fill(uint64_t seed, uint64_t name_hash, float mean, float scale, int64_t first,
                int64_t n, float *out);
uint64_t synth_name_hash(const char *seed_name);

/* A GPT checkpoint (model/gpt.h's catalogue, with the optimizer state when
 * asked) with a plausible training state: a cosine schedule at `step`, a
 * random-number state per rank. Every tensor gets distinct nonzero values,
 * so that misplaced elements show. */
typedef struct {
    uint64_t seed;
    int64_t step;
    int optimizer;
    int threads;                               /* 0: all cores */
    void (*on_bytes)(void *ctx, int64_t bytes); /* progress, called from worker threads */
    void *ctx;
} synth_gpt_options;

/* Bytes of tensor data synth_gpt writes. */
int synth_gpt_bytes(const gpt_config *config, const ckpt_layout *layout, int optimizer, int64_t *bytes);

int synth_gpt(const char *path, const gpt_config *config, const ckpt_layout *layout,
              const ckpt_write_options *write_options, const synth_gpt_options *options, int *tensors_written);

#endif
