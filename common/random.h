/* random.h: splitmix64, the counter-based mixer behind every value the
 * project derives from a seed and an index (initialization, synthetic data,
 * sampling) and behind the digest keys of docs/FORMAT.md, so that they all
 * mean the same function. */
#ifndef TP_RANDOM_H
#define TP_RANDOM_H

#include <stdint.h>

static inline uint64_t splitmix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif
