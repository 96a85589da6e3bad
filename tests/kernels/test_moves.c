/* Strided moves with conversion: the CPU version against an element-by-element
 * reference, and the CUDA twin against the CPU bit for bit (skipped without a
 * GPU). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../kernels/kernels.h"

static uint64_t rng_state = 0xD1B54A32D192ED03ull;
static uint64_t next_random(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Random moves that write disjoint rows of a [rows, cols] destination. */
static int64_t random_moves(strided_move *moves, int64_t src_elements, int64_t rows, int64_t cols)
{
    int64_t n = 0, row = 0;
    while (row < rows) {
        int64_t repeat = 1 + (int64_t)(next_random() % 4);
        if (row + repeat > rows) repeat = rows - row;
        int64_t len = 1 + (int64_t)(next_random() % (uint64_t)cols);
        int64_t src_stride = (int64_t)(next_random() % 50);
        int64_t src = next_random() % 5 == 0 ? -1 : (int64_t)(next_random() % (uint64_t)(src_elements - len - src_stride * repeat));
        moves[n++] = (strided_move){src, src_stride, row * cols, cols, len, repeat};
        row += repeat;
    }
    return n;
}

/* Transposition with conversion against convert_numbers one element at a
 * time: every format pair, sizes that do and do not fill whole tiles,
 * strides wider than the rows, NaNs, infinities and subnormals among the
 * values; what lies outside the transposed box stays untouched. */
Test(moves, transpose_matches_element_reference)
{
    static const uint32_t specials[] = {0x7fc00001u, 0xff800000u, 0x7f800000u, 0x00000001u, 0x80400000u,
                                        0x3f7fffffu, 0x477fe000u, 0x33800000u};
    static const int64_t shapes[][2] = {{1, 1}, {37, 23}, {64, 32}, {3, 100}, {70, 65}};
    enum { MAX = 120 * 120 };
    static uint32_t src[MAX];
    static uint8_t got[MAX * 4], want[MAX * 4];
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int64_t rows = shapes[k][0], cols = shapes[k][1], in_stride = cols + 3, out_stride = rows + 5;
        for (int sf = 0; sf < 3; sf++) {
            for (int df = 0; df < 3; df++) {
                for (int i = 0; i < MAX; i++) src[i] = i % 11 == 0 ? specials[(i / 11) % 8] : (uint32_t)next_random();
                size_t ds = tp_dtype_size((tp_dtype)df), ss = tp_dtype_size((tp_dtype)sf);
                memset(got, 0x5A, sizeof got);
                memset(want, 0x5A, sizeof want);
                transpose_numbers(src, (tp_dtype)sf, rows, cols, in_stride, got, (tp_dtype)df, out_stride);
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = 0; c < cols; c++)
                        convert_numbers((uint8_t *)src + (r * in_stride + c) * (int64_t)ss, (tp_dtype)sf,
                                        want + (c * out_stride + r) * (int64_t)ds, (tp_dtype)df, 1);
                cr_assert_eq(memcmp(got, want, sizeof got), 0, "[%lld, %lld], formats %d -> %d", (long long)rows,
                             (long long)cols, sf, df);
            }
        }
    }
}

Test(moves, cpu_matches_element_reference)
{
    enum { SRC = 20000, ROWS = 64, COLS = 100 };
    for (int sf = 0; sf < 3; sf++) {
        for (int df = 0; df < 3; df++) {
            uint32_t src[SRC];
            for (int i = 0; i < SRC; i++) src[i] = (uint32_t)next_random();
            strided_move moves[ROWS];
            int64_t n = random_moves(moves, SRC / 2, ROWS, COLS);
            size_t ds = tp_dtype_size((tp_dtype)df), ss = tp_dtype_size((tp_dtype)sf);
            uint8_t got[ROWS * COLS * 4], want[ROWS * COLS * 4];
            memset(got, 0x5A, sizeof got);
            memset(want, 0x5A, sizeof want);
            moves_apply(src, (tp_dtype)sf, got, (tp_dtype)df, moves, n);
            for (int64_t m = 0; m < n; m++)
                for (int64_t r = 0; r < moves[m].repeat; r++)
                    for (int64_t i = 0; i < moves[m].len; i++) {
                        uint8_t *to = want + (moves[m].dst + r * moves[m].dst_stride + i) * (int64_t)ds;
                        if (moves[m].src < 0) memset(to, 0, ds);
                        else
                            convert_numbers((uint8_t *)src + (moves[m].src + r * moves[m].src_stride + i) * (int64_t)ss,
                                            (tp_dtype)sf, to, (tp_dtype)df, 1);
                    }
            cr_assert_eq(memcmp(got, want, sizeof got), 0, "formats %d -> %d", sf, df);
        }
    }
}

Test(moves, cuda_twin_is_bit_identical)
{
    if (cuda_device_count() == 0)
        cr_skip_test("no CUDA device (%s)", cuda_built() ? "built with CUDA" : "built without CUDA");
    enum { SRC = 1 << 20, ROWS = 512, COLS = 1000 };
    cuda_mover *mover;
    cr_assert_eq(cuda_mover_create(&mover, SRC * 4, ROWS * COLS * 4, ROWS), TP_OK, "%s", tp_errmsg());
    uint32_t *src = cuda_mover_staging(mover);
    uint8_t *cpu = malloc(ROWS * COLS * 4);
    strided_move moves[ROWS];
    for (int sf = 0; sf < 3; sf++) {
        for (int df = 0; df < 3; df++) {
            for (int i = 0; i < SRC; i++) src[i] = (uint32_t)next_random();
            int64_t n = random_moves(moves, SRC / 2, ROWS, COLS);
            size_t bytes = (size_t)ROWS * COLS * tp_dtype_size((tp_dtype)df);
            memset(cpu, 0, bytes);
            memset(cuda_mover_output(mover), 0, bytes);
            convert_overflow cpu_overflow = moves_apply(src, (tp_dtype)sf, cpu, (tp_dtype)df, moves, n), gpu_overflow;
            cr_assert_eq(cuda_mover_run(mover, SRC * tp_dtype_size((tp_dtype)sf), (tp_dtype)sf, bytes,
                                        (tp_dtype)df, moves, n, &gpu_overflow),
                         TP_OK, "%s", tp_errmsg());
            /* Random bits overflow often when narrowing: the GPU counts them as the CPU does. */
            cr_assert_eq(gpu_overflow.count, cpu_overflow.count, "formats %d -> %d: %lld overflows, the CPU %lld", sf,
                         df, (long long)gpu_overflow.count, (long long)cpu_overflow.count);
            cr_assert_eq(gpu_overflow.largest, cpu_overflow.largest, "formats %d -> %d: largest %g, the CPU %g", sf,
                         df, gpu_overflow.largest, cpu_overflow.largest);
            /* Elements no move writes are undefined on the device: compare the written ones. */
            size_t ds = tp_dtype_size((tp_dtype)df);
            const uint8_t *gpu = cuda_mover_output(mover);
            for (int64_t m = 0; m < n; m++)
                for (int64_t r = 0; r < moves[m].repeat; r++) {
                    size_t at = (size_t)(moves[m].dst + r * moves[m].dst_stride) * ds;
                    cr_assert_eq(memcmp(cpu + at, gpu + at, (size_t)moves[m].len * ds), 0, "formats %d -> %d, move %lld",
                                 sf, df, (long long)m);
                }
        }
    }
    free(cpu);
    cuda_mover_free(mover);
}

/* Moves and transposition report the overflows of what they convert, and
 * only of that: an element left behind is not counted. */
Test(moves, overflows_counted)
{
    float src[8] = {1e6f, 2.0f, -7e4f, 65504.0f, 3e38f, INFINITY, NAN, -2e9f};
    uint16_t dst[8];
    strided_move some = {0, 4, 0, 2, 3, 2}; /* [0, 3) and [4, 7) */
    convert_overflow o = moves_apply(src, TP_FP32, dst, TP_FP16, &some, 1);
    cr_assert_eq(o.count, 3, "1e6, -7e4 and 3e38 (not inf, NaN nor 65504): %lld", (long long)o.count);
    cr_assert_eq(o.largest, 3e38f);
    o = moves_apply(src, TP_FP32, dst, TP_BF16, &some, 1);
    cr_assert_eq(o.count, 0, "bf16 holds them all");
    /* [2, 4] -> [4, 2]: 1e6, 2, -7e4, 65504 and 3e38, inf, NaN, -2e9 */
    o = transpose_numbers(src, TP_FP32, 2, 4, 4, dst, TP_FP16, 2);
    cr_assert_eq(o.count, 4);
    cr_assert_eq(o.largest, 3e38f);
    o = transpose_numbers(src, TP_FP32, 1, 2, 4, dst, TP_FP16, 1);
    cr_assert_eq(o.count, 1);
    cr_assert_eq(o.largest, 1e6f);
}
