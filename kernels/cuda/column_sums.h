/* column_sums.h: sums over the rows of [N, C] arrays, column by column, on
 * the GPU: the bias gradients of the products (linear.cu) and the weight
 * and bias gradients of the norms (norm.cu). CUDA C++, included by .cu
 * files only.
 *
 * One launch, in a fixed order (the same result every run, on every GPU,
 * since the cut depends on N and C alone): a grid of (column tiles of
 * COL_TILE, row chunks); block (tile, chunk) sums its chunk's rows of its
 * columns, each of its COL_ROWS thread rows taking every COL_ROWS-th row,
 * then thread row 0 adding the thread rows' sums in order, into partials
 * [chunks, OUTS, C]. The last block of a tile to finish (an arrival counter
 * per tile) then adds the tile's partials in chunk order to out[c] (+=), and
 * sets the counter back to 0 for the next call. Which block is last varies;
 * the order of the sums does not.
 *
 * One block per tile of 32 columns and all N rows (as at first) left most of
 * a GPU idle: 24 blocks for C = 768 on 132 SMs, each thread walking N / 16
 * rows one after the other. The chunks give about COLUMN_TARGET_BLOCKS
 * blocks, at least COLUMN_MIN_ROWS rows a thread row. A second launch for
 * the chunks' totals (a thread a column, 2026-11-28) cost a launch's latency
 * each time: 40 of them, 0.23 ms of an H200's bf16 step, with the SMs idle. */
#ifndef TP_KERNELS_CUDA_COLUMN_SUMS_H
#define TP_KERNELS_CUDA_COLUMN_SUMS_H

#include <stdint.h>

#include "launch.h"

#define COL_TILE 32              /* columns per block */
#define COL_ROWS 16              /* thread rows per block */
#define COLUMN_TARGET_BLOCKS 512 /* about 4 per SM of an H100, 5 of an A100 */
#define COLUMN_MIN_ROWS 8        /* rows a thread row sums at least (per chunk) */
#define COLUMN_MAX_CHUNKS 1024

/* The partials' buffer and the tiles' arrival counters (column_sums.cu,
 * the counters zero between calls), grown as needed: begin takes them, with
 * a lock held from there until end, after the kernel is queued (another
 * thread's sums queue after it on the one stream, so then they are free). */
int cuda_column_partials_begin(float **partials, int64_t floats, unsigned **arrivals, int64_t tiles);
void cuda_column_partials_end(void);

/* Row chunks for N rows and `tiles` column tiles. */
static inline int64_t column_chunks(int64_t N, int64_t tiles)
{
    int64_t by_blocks = (COLUMN_TARGET_BLOCKS + tiles - 1) / tiles;
    int64_t by_rows = N / ((int64_t)COL_ROWS * COLUMN_MIN_ROWS);
    int64_t chunks = by_blocks < by_rows ? by_blocks : by_rows;
    return chunks < 1 ? 1 : chunks > COLUMN_MAX_CHUNKS ? COLUMN_MAX_CHUNKS : chunks;
}

/* term(n, c, s) adds row n's OUTS values of column c to s[0..OUTS). out0[c]
 * (and out1[c] when OUTS is 2 and out1 is not NULL: a norm without a bias)
 * += the column's sum. */
template <int OUTS, typename Term>
__global__ void column_sums_kernel(float *out0, float *out1, float *partials, unsigned *arrivals, Term term,
                                   int64_t N, int64_t C, int64_t rows_per_chunk)
{
    __shared__ float part[OUTS][COL_ROWS][COL_TILE + 1];
    __shared__ int last;
    int64_t chunks = gridDim.y;
    int64_t begin = blockIdx.y * rows_per_chunk, end = begin + rows_per_chunk < N ? begin + rows_per_chunk : N;
    for (int64_t tile = blockIdx.x; tile * COL_TILE < C; tile += gridDim.x) {
        int64_t c = tile * COL_TILE + threadIdx.x;
        float s[OUTS];
        for (int o = 0; o < OUTS; o++) s[o] = 0;
        if (c < C)
            for (int64_t n = begin + threadIdx.y; n < end; n += COL_ROWS) term(n, c, s);
        for (int o = 0; o < OUTS; o++) part[o][threadIdx.y][threadIdx.x] = s[o];
        __syncthreads();
        if (threadIdx.y == 0 && c < C)
            for (int o = 0; o < OUTS; o++) {
                float total = 0;
                for (int r = 0; r < COL_ROWS; r++) total += part[o][r][threadIdx.x];
                partials[((int64_t)blockIdx.y * OUTS + o) * C + c] = total;
            }
        /* This block's partials visible to every block before it counts itself in. */
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0 && threadIdx.y == 0) last = atomicAdd(&arrivals[tile], 1u) == (unsigned)(chunks - 1);
        __syncthreads();
        if (last) {
            __threadfence();
            if (threadIdx.y == 0 && c < C)
                for (int o = 0; o < OUTS; o++) {
                    float total = 0; /* in chunk order, whichever block is last; past L1 (__ldcg): other SMs wrote them */
                    for (int64_t chunk = 0; chunk < chunks; chunk++) total += __ldcg(&partials[(chunk * OUTS + o) * C + c]);
                    float *out = o == 0 ? out0 : out1;
                    if (out) out[c] += total;
                }
            if (threadIdx.x == 0 && threadIdx.y == 0) arrivals[tile] = 0; /* for the next call */
        }
        __syncthreads(); /* part and last are reused by the next tile */
    }
}

/* out0 (and out1) [C] += the column sums of term over N rows, queued on
 * cuda_state.stream; OUTS 1 or 2. */
template <int OUTS, typename Term>
static int column_sums(float *out0, float *out1, Term term, int64_t N, int64_t C)
{
    static_assert(OUTS == 1 || OUTS == 2, "one or two sums a column");
    if (N <= 0 || C <= 0) return TP_OK;
    int64_t tiles = (C + COL_TILE - 1) / COL_TILE, chunks = column_chunks(N, tiles);
    int64_t rows_per_chunk = (N + chunks - 1) / chunks;
    float *partials = NULL;
    unsigned *arrivals = NULL;
    int status = cuda_column_partials_begin(&partials, chunks * OUTS * C, &arrivals, tiles);
    if (status) return status;
    dim3 grid(tiles < MAX_BLOCKS ? (unsigned)tiles : MAX_BLOCKS, (unsigned)chunks), block(COL_TILE, COL_ROWS);
    column_sums_kernel<OUTS, Term><<<grid, block, 0, cuda_state.stream>>>(out0, out1, partials, arrivals, term, N, C,
                                                                          rows_per_chunk);
    LAUNCH_CHECK();
    cuda_column_partials_end();
    return TP_OK;
fail:
    cuda_column_partials_end();
    return TP_ERR_DEVICE;
}

#endif
