/* vector_clones.h: element-wise loops built for wider vectors where the
 * processor has them (AVX-512, AVX2), chosen when the program loads. The
 * arithmetic is the same in every clone (no contraction into FMA under
 * -std=c11), so are the results. */
#ifndef TP_VECTOR_CLONES_H
#define TP_VECTOR_CLONES_H

#if defined(__clang__)
/* Clang (14, Debian's, which builds the fuzzers) names the dispatcher of a
 * target_clones function NAME.ifunc, which a call from another file cannot
 * reach: the fuzzers no longer linked once the Megatron readers' replica
 * checks drew in ckpt/compare.c's calls of convert_to_f32. Built once, for
 * the baseline: the results are the same. */
#define VECTOR_CLONES
#else
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

#endif
