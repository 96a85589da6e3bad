/* vector_clones.h: element-wise loops built for wider vectors where the
 * processor has them (AVX-512, AVX2), chosen when the program loads. The
 * arithmetic is the same in every clone (no contraction into FMA under
 * -std=c11), so are the results. */
#ifndef TP_VECTOR_CLONES_H
#define TP_VECTOR_CLONES_H

#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

#endif
