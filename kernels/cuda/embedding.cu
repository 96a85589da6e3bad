/* embedding.cu: the token embedding and the classifier's cross-entropy on
 * the GPU, the twins of cpu/embedding.c. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>

#include <cub/device/device_radix_sort.cuh>

extern "C" {
#include "../../common/error.h"
#include "../kernels.h"
}
#include "internal.h"
#include "launch.h"

/* ============================================== embedding and cross-entropy */

/* out[n,c] = table[token - first, c] for tokens held here, else 0. */
static __global__ void embedding_forward_kernel(float *out, const int *tokens, const float *table, int64_t N, int64_t C,
                                                int64_t first, int64_t rows)
{
    ROWS_OF_BLOCK(n, N) {
        int64_t row = (int64_t)tokens[n] - first;
        int held = row >= 0 && row < rows;
        COLUMNS_OF_THREAD(c, C) out[n * C + c] = held ? table[row * C + c] : 0.0f;
    }
}

/* d_table[token - first, c] += d_out[n,c], the positions n of a token in
 * ascending order, as the CPU adds them (embedding.c): the same bits, every
 * run. A token may come several times in the batch; atomics would add its
 * rows in whatever order the threads arrive (the last bits of a repeated
 * token's row then varied from run to run). So the positions are first
 * sorted by token (CUB's radix sort, stable: a token's positions stay
 * ascending), and the blocks of each run of one token (grid x: the sorted
 * positions, the first of a run working; grid y: slices of EMBEDDING_COLUMNS
 * columns, a thread a column) read the row's columns once, add the run's
 * gradients in order and write them once. A frequent token (a comma: a few
 * percent of text, hundreds of positions at micro-batch 16) is then C /
 * EMBEDDING_COLUMNS blocks each walking its run, their loads in flight
 * together (unrolled), not one block.
 *
 * sorted[N]: the tokens in order (as unsigned: a negative token, never held,
 * sorts last), positions[N]: where each came from. */
#define EMBEDDING_COLUMNS 128

/* The end of the run of sorted[i]: the first index past it (sorted ascends). */
static __device__ int64_t run_end(const unsigned *sorted, int64_t i, int64_t N)
{
    unsigned token = sorted[i];
    int64_t low = i + 1, high = N; /* the end is in [low, high] */
    while (low < high) {
        int64_t mid = low + (high - low) / 2;
        if (sorted[mid] == token) low = mid + 1;
        else high = mid;
    }
    return low;
}

static __global__ void embedding_backward_runs_kernel(float *d_table, const unsigned *sorted, const int *positions,
                                                      const float *d_out, int64_t N, int64_t C, int64_t first,
                                                      int64_t rows)
{
    int64_t c = (int64_t)blockIdx.y * EMBEDDING_COLUMNS + threadIdx.x;
    ROWS_OF_BLOCK(i, N) {
        unsigned token = sorted[i];
        if (i > 0 && sorted[i - 1] == token) continue; /* inside a run: its first position's blocks add it */
        int64_t row = (int64_t)(int)token - first;
        if (row < 0 || row >= rows || c >= C) continue;
        int64_t end = run_end(sorted, i, N);
        float sum = d_table[row * C + c];
#pragma unroll 8
        for (int64_t j = i; j < end; j++) sum += d_out[(int64_t)positions[j] * C + c];
        d_table[row * C + c] = sum;
    }
}

static __global__ void positions_kernel(int *positions, int64_t N)
{
    GRID_STRIDE(n, N) positions[n] = (int)n;
}

/* The sort's buffers (the sorted tokens, the positions before and after, and
 * CUB's own), one for the process: embedding_lock is held from taking them
 * to queueing their last use. */
static cuda_scratch sort_scratch;
static pthread_mutex_t embedding_lock = PTHREAD_MUTEX_INITIALIZER;

static int embedding_backward_sorted(float *d_table, const int *tokens, const float *d_out, int64_t N, int64_t C,
                                     int64_t first, int64_t rows)
{
    if (N > INT32_MAX || (C + EMBEDDING_COLUMNS - 1) / EMBEDDING_COLUMNS > MAX_BLOCKS)
        return tp_fail(TP_ERR_ARG, "embedding backward: %lld tokens of %lld columns (at most %d and %lld)",
                       (long long)N, (long long)C, INT32_MAX, (long long)MAX_BLOCKS * EMBEDDING_COLUMNS);
    const unsigned *keys = (const unsigned *)tokens;
    size_t cub_bytes = 0;
    CUDA_TRY(cub::DeviceRadixSort::SortPairs(NULL, cub_bytes, keys, (unsigned *)NULL, (const int *)NULL, (int *)NULL,
                                             (int)N, 0, 32, cuda_state.stream));
    {
        void *parts[4];
        size_t bytes[4] = {(size_t)N * sizeof(unsigned), (size_t)N * sizeof(int), (size_t)N * sizeof(int),
                           cub_bytes};
        TP_TRY(cuda_scratch_parts(&sort_scratch, "the embedding gradient's sort", parts, bytes, 4));
        unsigned *sorted = (unsigned *)parts[0];
        int *unsorted_positions = (int *)parts[1], *positions = (int *)parts[2];
        positions_kernel<<<blocks_for(N, THREADS), THREADS, 0, cuda_state.stream>>>(unsorted_positions, N);
        LAUNCH_CHECK();
        CUDA_TRY(cub::DeviceRadixSort::SortPairs(parts[3], cub_bytes, keys, sorted, unsorted_positions, positions,
                                                 (int)N, 0, 32, cuda_state.stream));
        dim3 grid(blocks_for(N, 1), (unsigned)((C + EMBEDDING_COLUMNS - 1) / EMBEDDING_COLUMNS));
        embedding_backward_runs_kernel<<<grid, EMBEDDING_COLUMNS, 0, cuda_state.stream>>>(d_table, sorted, positions,
                                                                                         d_out, N, C, first, rows);
        LAUNCH_CHECK();
    }
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_embedding_forward(float *out, const int *tokens, const float *table, int64_t N, int64_t C,
                           int64_t first, int64_t rows)
{
    ENTER();
    if (N <= 0 || C <= 0) return TP_OK;
    embedding_forward_kernel<<<blocks_for(N, 1), THREADS, 0, cuda_state.stream>>>(out, tokens, table, N, C, first,
                                                                               rows);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_embedding_backward(float *d_table, const int *tokens, const float *d_out, int64_t N, int64_t C,
                            int64_t first, int64_t rows)
{
    ENTER();
    if (N <= 0 || C <= 0) return TP_OK;
    {
        pthread_mutex_lock(&embedding_lock);
        int status = embedding_backward_sorted(d_table, tokens, d_out, N, C, first, rows);
        pthread_mutex_unlock(&embedding_lock);
        return status;
    }
fail:
    return TP_ERR_DEVICE;
}

/* Columns of this rank that are real vocabulary (not padding), as embedding.c. */
static int64_t valid_columns(int64_t V, int64_t first, int64_t vocab)
{
    int64_t valid = vocab - first;
    return valid < 0 ? 0 : valid > V ? V : valid;
}

/* Values x[0..count) into a thread's running maximum m and its sum s of
 * exp(x - m): the new maximum first (fmaxf passes a NaN by), the sum
 * rescaled once when it grows, then count independent exponentials. A
 * -infinity adds nothing (exp(-inf - -inf) would be NaN); a NaN makes the
 * sum NaN, as the CPU's. */
static __device__ inline void softmax_sums_add(float *m, float *s, const float *x, int count)
{
    float grown = *m;
#pragma unroll
    for (int i = 0; i < CHUNK; i++)
        if (i < count) grown = fmaxf(grown, x[i]);
    if (grown > *m) {
        *s *= expf(*m - grown); /* 0 from -inf: s was 0 (or NaN, kept) */
        *m = grown;
    }
#pragma unroll
    for (int i = 0; i < CHUNK; i++)
        if (i < count) *s += x[i] == -INFINITY ? 0.0f : expf(x[i] - *m);
}

/* A block per row, each logit read once: each thread keeps the maximum of
 * its columns and its sum of exponentials relative to it; then the block's
 * maximum, and the threads' sums made relative to it and added.
 * -infinity and 0 for a row without valid columns, as the CPU; a NaN logit
 * makes the sum NaN. CHUNKED (chunks_fit: the rows in 16-byte pieces):
 * each thread takes CHUNK columns at a time, one or two 16-byte loads;
 * else a column at a time. In: float, or uint16_t for bf16 logits
 * (widened, exact): the same thread's columns in the same order, so the
 * same bits, for the bf16 logits as for their widened values. */
template <typename In, bool CHUNKED>
static __global__ void row_stats_kernel(float *row_max, float *sum, const In *logits, int64_t N, int64_t V,
                                        int64_t valid)
{
    ROWS_OF_BLOCK(n, N) {
        float m = -INFINITY, s = 0, x[CHUNK];
        if (CHUNKED)
            for (int64_t c = threadIdx.x * (int64_t)CHUNK; c < valid; c += (int64_t)blockDim.x * CHUNK) {
                load_chunk(x, &logits[n * V + c]); /* within the row: c < valid <= V, V a multiple of CHUNK */
                softmax_sums_add(&m, &s, x, (int)(valid - c < CHUNK ? valid - c : CHUNK));
            }
        else
            COLUMNS_OF_THREAD(v, valid) {
                x[0] = load_value(&logits[n * V + v]);
                softmax_sums_add(&m, &s, x, 1);
            }
        float max = block_max(m);
        float total = block_sum(s == 0.0f ? 0.0f : s * expf(m - max)); /* s is 0 only without a finite column */
        if (threadIdx.x == 0) {
            row_max[n] = max;
            sum[n] = total;
        }
    }
}

static __global__ void rescale_sum_kernel(float *sum, const float *local_max, const float *global_max, int64_t N)
{
    GRID_STRIDE(n, N) if (local_max[n] != -INFINITY) sum[n] *= expf(local_max[n] - global_max[n]);
}

/* The target's logit when its column is held here (any of the V columns, as
 * the CPU: targets are real tokens, never padding), else 0. */
template <typename In>
static __global__ void target_logit_kernel(float *target, const In *logits, const int *targets, int64_t N, int64_t V,
                                           int64_t first)
{
    GRID_STRIDE(n, N) {
        int64_t column = (int64_t)targets[n] - first;
        target[n] = column >= 0 && column < V ? load_value(&logits[n * V + column]) : 0.0f;
    }
}

/* d = scale softmax - scale at the target's column; zero in padding columns.
 * Out: float, or uint16_t for d_logits as bf16 bits rounded as the products
 * round their operands (classifier_backward_bf16; store_value, launch.h);
 * In: float, or uint16_t for bf16 logits. CHUNKED (chunks_fit, both
 * arrays): CHUNK columns a thread at a time, in 16-byte pieces; each
 * value's arithmetic the same either way. d_logits may be logits (in
 * place): a thread reads its columns before it stores their gradients. */
static __device__ inline float softmax_gradient(float logit, float max, float total, float scale, int is_target)
{
    float d = scale * expf(logit - max) / total;
    return is_target ? d - scale : d;
}

template <typename Out, typename In, bool CHUNKED>
static __global__ void crossentropy_backward_kernel(Out *d_logits, const In *logits, const float *row_max,
                                                    const float *sum, const int *targets, int64_t N, int64_t V,
                                                    int64_t first, int64_t valid, float scale)
{
    ROWS_OF_BLOCK(n, N) {
        float max = row_max[n], total = sum[n];
        int64_t target = (int64_t)targets[n] - first;
        if (CHUNKED)
            for (int64_t c = threadIdx.x * (int64_t)CHUNK; c < V; c += (int64_t)blockDim.x * CHUNK) {
                float x[CHUNK] = {0};
                if (c < valid) load_chunk(x, &logits[n * V + c]);
#pragma unroll
                for (int i = 0; i < CHUNK; i++)
                    x[i] = c + i < valid ? softmax_gradient(x[i], max, total, scale, c + i == target) : 0.0f;
                store_chunk(&d_logits[n * V + c], x);
            }
        else
            COLUMNS_OF_THREAD(v, V) {
                int64_t i = n * V + v;
                store_value(&d_logits[i], v < valid ? softmax_gradient(load_value(&logits[i]), max, total, scale,
                                                                       v == target)
                                                    : 0.0f);
            }
    }
}

template <typename In>
static int row_stats_as(float *row_max, float *sum, const In *logits, int64_t N, int64_t V, int64_t first,
                        int64_t vocab)
{
    int64_t valid = valid_columns(V, first, vocab);
    ENTER();
    if (N <= 0) return TP_OK;
    if (chunks_fit(logits, V))
        row_stats_kernel<In, true><<<blocks_for(N, 1), THREADS, 0, cuda_state.stream>>>(row_max, sum, logits, N, V,
                                                                                      valid);
    else
        row_stats_kernel<In, false><<<blocks_for(N, 1), THREADS, 0, cuda_state.stream>>>(row_max, sum, logits, N, V,
                                                                                       valid);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_crossentropy_row_stats(float *row_max, float *sum, const float *logits, int64_t N, int64_t V, int64_t first,
                                int64_t vocab)
{
    return row_stats_as(row_max, sum, logits, N, V, first, vocab);
}

int cuda_crossentropy_row_stats_bf16(float *row_max, float *sum, const uint16_t *logits, int64_t N, int64_t V,
                                     int64_t first, int64_t vocab)
{
    return row_stats_as(row_max, sum, logits, N, V, first, vocab);
}

int cuda_crossentropy_rescale_sum(float *sum, const float *local_max, const float *global_max, int64_t N)
{
    ENTER();
    if (N <= 0) return TP_OK;
    rescale_sum_kernel<<<blocks_for(N, THREADS), THREADS, 0, cuda_state.stream>>>(sum, local_max, global_max, N);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

template <typename In>
static int target_logit_as(float *target, const In *logits, const int *targets, int64_t N, int64_t V, int64_t first)
{
    ENTER();
    if (N <= 0) return TP_OK;
    target_logit_kernel<<<blocks_for(N, THREADS), THREADS, 0, cuda_state.stream>>>(target, logits, targets, N, V, first);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_crossentropy_target_logit(float *target, const float *logits, const int *targets, int64_t N,
                                   int64_t V, int64_t first)
{
    return target_logit_as(target, logits, targets, N, V, first);
}

int cuda_crossentropy_target_logit_bf16(float *target, const uint16_t *logits, const int *targets, int64_t N,
                                        int64_t V, int64_t first)
{
    return target_logit_as(target, logits, targets, N, V, first);
}

/* The backward's kernel, chunked where both arrays' rows split into chunks. */
template <typename Out, typename In>
static int crossentropy_backward_as(Out *d_logits, const In *logits, const float *row_max, const float *sum,
                                    const int *targets, int64_t N, int64_t V, int64_t first, int64_t valid, float scale)
{
    if (chunks_fit(logits, V) && chunks_fit(d_logits, V))
        crossentropy_backward_kernel<Out, In, true><<<blocks_for(N, 1), THREADS, 0, cuda_state.stream>>>(
            d_logits, logits, row_max, sum, targets, N, V, first, valid, scale);
    else
        crossentropy_backward_kernel<Out, In, false><<<blocks_for(N, 1), THREADS, 0, cuda_state.stream>>>(
            d_logits, logits, row_max, sum, targets, N, V, first, valid, scale);
    LAUNCH_CHECK();
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

int cuda_crossentropy_backward(float *d_logits, const float *logits, const float *row_max, const float *sum,
                               const int *targets, int64_t N, int64_t V, int64_t first, int64_t vocab,
                               float scale)
{
    int64_t valid = valid_columns(V, first, vocab);
    ENTER();
    if (N <= 0 || V <= 0) return TP_OK;
    TP_TRY(crossentropy_backward_as(d_logits, logits, row_max, sum, targets, N, V, first, valid, scale));
    return TP_OK;
fail:
    return TP_ERR_DEVICE;
}

/* d_logits written once, as bf16 bits over the logits (each thread reads
 * its values before it stores their gradients there), then the two products
 * read them as they are (cuda_matmul_backward_bf16: a d_out of bf16 bits,
 * as every bf16 gradient a product reads), as they read in (the final
 * norm's bf16 bits) and the weight (the table's bf16 copy, weight[V,C]
 * bits): no second array of the logits' size. The same bits as rounding
 * crossentropy_backward's values. */
int cuda_classifier_backward_bf16(float *d_in, float *d_weight, uint16_t *logits, const float *row_max,
                                  const float *sum, const int *targets, const uint16_t *in, const uint16_t *weight,
                                  int64_t N, int64_t C, int64_t V, int64_t first, int64_t vocab, float scale)
{
    int64_t valid = valid_columns(V, first, vocab);
    ENTER();
    if (N <= 0) return TP_OK;
    if (V > 0) { /* without columns, the products below still zero d_in, as the CPU's */
        TP_TRY(crossentropy_backward_as(logits, logits, row_max, sum, targets, N, V, first, valid, scale));
    }
    return cuda_matmul_backward_bf16(d_in, d_weight, NULL, logits, in, weight, N, C, V);
fail:
    return TP_ERR_DEVICE;
}
