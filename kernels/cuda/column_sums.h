/* column_sums.h: sums over the rows of [N, C] arrays, column by column, on
 * the GPU: the bias gradients of the products (linear.cu) and the weight
 * and bias gradients of the norms (norm.cu). CUDA C++, included by .cu
 * files only (the CPU emulation's C declaration: column_sums_emulation.h).
 *
 * One launch, in a fixed order (the same result every run, on every GPU,
 * since the cut depends on N, C and whether the rows split into 16-byte
 * chunks alone): a grid of (column tiles of COLUMN_TILE, row chunks) of
 * blocks of COLUMN_THREADS. Each thread holds VEC consecutive columns (its
 * lane's) and sums them over every thread_rows-th row of its block's chunk,
 * starting at its thread row; then thread t < COLUMN_TILE adds column t's
 * thread rows in order, into partials [chunks, OUTS, C]. The last block of
 * a tile to finish (an arrival counter per tile) adds the tile's partials in
 * chunk order to out[c] (+=), and sets the counter back to 0 for the next
 * call. Which block is last varies; the order of the sums does not.
 *
 * VEC is CHUNK (launch.h: one 16-byte load of bf16, two of fp32; a warp
 * reads 4 rows' 64 columns at a time) where every array the terms read
 * splits into chunks, else 1. A warp of a 2-byte load a thread (32 columns
 * of bf16 a row, as until 2026-11-29) kept too few bytes in flight: the
 * bias gradients' sums ran at 1,498 GB/s on an H200 (2026-11-28).
 *
 * The chunks give about COLUMN_TARGET_BLOCKS blocks, at least
 * COLUMN_MIN_ROWS rows each. One block per tile of all N rows (as at
 * first) left most of a GPU idle; a second launch for the chunks' totals
 * (2026-11-28) cost a launch's latency each time, 40 of them 0.23 ms of an
 * H200's bf16 step.
 *
 * A thread's work is written once, in __host__ __device__ functions: the
 * kernel and its CPU emulation (column_sums_emulate, below) both call them,
 * so tests without a GPU check the kernel's indexing (test_column_sums, and
 * test_norm_backward through the norms' emulation). */
#ifndef TP_KERNELS_CUDA_COLUMN_SUMS_H
#define TP_KERNELS_CUDA_COLUMN_SUMS_H

#include <stdint.h>
#include <stdlib.h>

extern "C" {
#include "../../common/error.h"
}
#include "launch.h"

#define COLUMN_THREADS 256       /* a block's threads */
#define COLUMN_TILE 64           /* a block's columns */
#define COLUMN_TARGET_BLOCKS 512 /* about 4 per SM of an H100, 5 of an A100 */
#define COLUMN_MIN_ROWS 128      /* rows a chunk at least: 4 a thread in chunks of columns, 32 a column a thread */

/* Loops unrolled on the device (loads of several rows in flight); the
 * host's compiler, for the emulation, does not know the pragma. */
#ifdef __CUDA_ARCH__
#define COLUMN_UNROLL _Pragma("unroll 4")
#define COLUMN_LOAD_PAST_L1(at) __ldcg(at) /* other SMs wrote it */
#else
#define COLUMN_UNROLL
#define COLUMN_LOAD_PAST_L1(at) (*(at))
#endif

/* A thread's columns (VEC) and the block's thread rows. */
template <int VEC> struct column_layout {
    static_assert(VEC == 1 || VEC == CHUNK, "a column or a chunk a thread");
    static constexpr int lanes = COLUMN_TILE / VEC;
    static constexpr int thread_rows = COLUMN_THREADS / lanes;
};

/* The partials' buffer and the tiles' arrival counters (column_sums.cu,
 * the counters zero between calls), grown as needed: begin takes them, with
 * a lock held from there until end, after the kernel is queued (another
 * thread's sums queue after it on the one stream, so then they are free). */
int cuda_column_partials_begin(float **partials, int64_t floats, unsigned **arrivals, int64_t tiles);
void cuda_column_partials_end(void);

/* Row chunks for N rows and `tiles` column tiles: 1 to COLUMN_TARGET_BLOCKS. */
static inline int64_t column_chunks(int64_t N, int64_t tiles)
{
    int64_t by_blocks = (COLUMN_TARGET_BLOCKS + tiles - 1) / tiles, by_rows = N / COLUMN_MIN_ROWS;
    int64_t chunks = by_blocks < by_rows ? by_blocks : by_rows;
    return chunks < 1 ? 1 : chunks;
}

/* VEC consecutive values at `at` (a multiple of 16 bytes when VEC is
 * CHUNK): one or two 16-byte loads on the device (load_chunk), one by one
 * on the host; the same values either way. */
template <int VEC, typename T> static __host__ __device__ inline void column_load(float *x, const T *at)
{
#ifdef __CUDA_ARCH__
    if constexpr (VEC == CHUNK)
        load_chunk(x, at);
    else
#endif
        for (int v = 0; v < VEC; v++) x[v] = load_value(&at[v]);
}

/* Row n's value of columns c.. c + VEC of x [N, C], fp32 or bf16 bits:
 * column_sums of it are a bias's gradient. */
template <typename In> struct column_of_values {
    const In *x;
    int64_t C;
    int chunks_fit() const { return ::chunks_fit(x, C); }
    template <int VEC> __host__ __device__ void add(int64_t n, int64_t c, float *s) const
    {
        float v[VEC];
        column_load<VEC>(v, &x[n * C + c]);
        for (int i = 0; i < VEC; i++) s[i] += v[i];
    }
};

/* The sums s[OUTS][VEC] of the thread at (row, lane) of the block of rows
 * [begin, end) whose first column is `first`: term.add of every
 * thread_rows-th row from begin + row, in order; zeros past C. */
template <int OUTS, int VEC, typename Term>
static __host__ __device__ inline void column_thread_sums(float *s, const Term &term, int64_t begin, int64_t end,
                                                          int row, int lane, int64_t first, int64_t C)
{
    int64_t c = first + (int64_t)lane * VEC;
    for (int i = 0; i < OUTS * VEC; i++) s[i] = 0;
    if (c >= C) return; /* VEC is 1 where C is not a multiple of CHUNK: a lane's columns are inside or all past */
    COLUMN_UNROLL
    for (int64_t n = begin + row; n < end; n += column_layout<VEC>::thread_rows) term.template add<VEC>(n, c, s);
}

/* Column t of a block's tile: its thread rows' sums, part [thread_rows]
 * [COLUMN_TILE + 1] (one output's), added in row order. */
template <int VEC> static __host__ __device__ inline float column_block_total(const float *part, int t)
{
    float total = 0;
    for (int r = 0; r < column_layout<VEC>::thread_rows; r++) total += part[r * (COLUMN_TILE + 1) + t];
    return total;
}

/* Output o of column c: the chunks' partials [chunks, OUTS, C] added in
 * chunk order. */
template <int OUTS> static __host__ __device__ inline float column_chunks_total(const float *partials, int64_t chunks,
                                                                                int o, int64_t C, int64_t c)
{
    float total = 0;
    for (int64_t chunk = 0; chunk < chunks; chunk++)
        total += COLUMN_LOAD_PAST_L1(&partials[(chunk * OUTS + o) * C + c]);
    return total;
}

/* term.add<VEC>(n, c, s) adds row n's OUTS values of columns c.. c + VEC to
 * s[o * VEC + v]. out0[c] (and out1[c] when OUTS is 2 and out1 is not NULL:
 * a norm without a bias) += the column's sum. */
template <int OUTS, int VEC, typename Term>
__global__ void __launch_bounds__(COLUMN_THREADS)
    column_sums_kernel(float *out0, float *out1, float *partials, unsigned *arrivals, Term term, int64_t N, int64_t C,
                       int64_t rows_per_chunk)
{
    typedef column_layout<VEC> layout;
    __shared__ float part[OUTS][layout::thread_rows][COLUMN_TILE + 1];
    __shared__ int last;
    int lane = (int)threadIdx.x % layout::lanes, row = (int)threadIdx.x / layout::lanes, t = (int)threadIdx.x;
    int64_t chunks = gridDim.y;
    int64_t begin = blockIdx.y * rows_per_chunk, end = begin + rows_per_chunk < N ? begin + rows_per_chunk : N;
    for (int64_t tile = blockIdx.x; tile * COLUMN_TILE < C; tile += gridDim.x) {
        int64_t first = tile * COLUMN_TILE, c = first + t; /* c: thread t's column of the totals */
        float s[OUTS * VEC];
        column_thread_sums<OUTS, VEC>(s, term, begin, end, row, lane, first, C);
        for (int o = 0; o < OUTS; o++)
            for (int v = 0; v < VEC; v++) part[o][row][lane * VEC + v] = s[o * VEC + v];
        __syncthreads();
        if (t < COLUMN_TILE && c < C)
            for (int o = 0; o < OUTS; o++)
                partials[((int64_t)blockIdx.y * OUTS + o) * C + c] = column_block_total<VEC>(&part[o][0][0], t);
        /* This block's partials visible to every block before it counts itself in. */
        __threadfence();
        __syncthreads();
        if (t == 0) last = atomicAdd(&arrivals[tile], 1u) == (unsigned)(chunks - 1);
        __syncthreads();
        if (last) {
            __threadfence();
            if (t < COLUMN_TILE && c < C)
                for (int o = 0; o < OUTS; o++) { /* in chunk order, whichever block is last */
                    float *out = o == 0 ? out0 : out1;
                    if (out) out[c] += column_chunks_total<OUTS>(partials, chunks, o, C, c);
                }
            if (t == 0) arrivals[tile] = 0; /* for the next call */
        }
        __syncthreads(); /* part and last are reused by the next tile */
    }
}

template <int OUTS, int VEC, typename Term>
static int column_sums_launch(float *out0, float *out1, const Term &term, int64_t N, int64_t C)
{
    int64_t tiles = (C + COLUMN_TILE - 1) / COLUMN_TILE;
    int64_t chunks = column_chunks(N, tiles), rows_per_chunk = (N + chunks - 1) / chunks;
    float *partials = NULL;
    unsigned *arrivals = NULL;
    int status = cuda_column_partials_begin(&partials, chunks * OUTS * C, &arrivals, tiles);
    if (status) return status;
    dim3 grid(tiles < MAX_BLOCKS ? (unsigned)tiles : MAX_BLOCKS, (unsigned)chunks);
    column_sums_kernel<OUTS, VEC, Term><<<grid, COLUMN_THREADS, 0, cuda_state.stream>>>(out0, out1, partials, arrivals,
                                                                                          term, N, C, rows_per_chunk);
    LAUNCH_CHECK();
    cuda_column_partials_end();
    return TP_OK;
fail:
    cuda_column_partials_end();
    return TP_ERR_DEVICE;
}

/* column_sums_kernel<OUTS, VEC> worked on the CPU (host memory), for tests
 * of its indexing without a GPU: its blocks one after the other, the
 * chunks of a tile in reverse order (the last block adds the chunks in
 * chunk order whichever it is), each block's threads in turn, with the
 * kernel's own per-thread functions. out0 (and out1) += as the kernel adds. */
template <int OUTS, int VEC, typename Term>
static int column_sums_emulate(float *out0, float *out1, const Term &term, int64_t N, int64_t C)
{
    typedef column_layout<VEC> layout;
    if (N <= 0 || C <= 0) return TP_OK;
    int64_t tiles = (C + COLUMN_TILE - 1) / COLUMN_TILE, chunks = column_chunks(N, tiles);
    int64_t rows_per_chunk = (N + chunks - 1) / chunks;
    float *partials = (float *)malloc((size_t)(chunks * OUTS * C) * sizeof(float));
    float *part = (float *)malloc(sizeof(float) * OUTS * layout::thread_rows * (COLUMN_TILE + 1));
    if (!partials || !part) {
        free(partials), free(part);
        return tp_fail(TP_ERR_NOMEM, "column sums' emulation: %lld chunks of %lld columns", (long long)chunks,
                       (long long)C);
    }
    for (int64_t tile = 0; tile < tiles; tile++) {
        int64_t first = tile * COLUMN_TILE;
        for (int64_t chunk = chunks - 1; chunk >= 0; chunk--) {
            int64_t begin = chunk * rows_per_chunk, end = begin + rows_per_chunk < N ? begin + rows_per_chunk : N;
            for (int t = 0; t < COLUMN_THREADS; t++) {
                int lane = t % layout::lanes, row = t / layout::lanes;
                float s[OUTS * VEC];
                column_thread_sums<OUTS, VEC>(s, term, begin, end, row, lane, first, C);
                for (int o = 0; o < OUTS; o++)
                    for (int v = 0; v < VEC; v++)
                        part[(o * layout::thread_rows + row) * (COLUMN_TILE + 1) + lane * VEC + v] = s[o * VEC + v];
            }
            for (int t = 0; t < COLUMN_TILE && first + t < C; t++)
                for (int o = 0; o < OUTS; o++)
                    partials[(chunk * OUTS + o) * C + first + t] =
                        column_block_total<VEC>(&part[o * layout::thread_rows * (COLUMN_TILE + 1)], t);
        }
        for (int t = 0; t < COLUMN_TILE && first + t < C; t++)
            for (int o = 0; o < OUTS; o++) {
                float *out = o == 0 ? out0 : out1;
                if (out) out[first + t] += column_chunks_total<OUTS>(partials, chunks, o, C, first + t);
            }
    }
    free(partials), free(part);
    return TP_OK;
}

/* out0 (and out1) [C] += the column sums of term over N rows, queued on
 * cuda_state.stream; OUTS 1 or 2. term.chunks_fit(): whether every array
 * it reads splits into chunks (chunks_fit, launch.h). */
template <int OUTS, typename Term>
static int column_sums(float *out0, float *out1, const Term &term, int64_t N, int64_t C)
{
    static_assert(OUTS == 1 || OUTS == 2, "one or two sums a column");
    if (N <= 0 || C <= 0) return TP_OK;
    return term.chunks_fit() ? column_sums_launch<OUTS, CHUNK>(out0, out1, term, N, C)
                             : column_sums_launch<OUTS, 1>(out0, out1, term, N, C);
}

#endif
