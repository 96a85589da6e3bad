/* rope.c: rotary position embeddings (Llama), Hugging Face's conventions
 * (transformers' modeling_llama.py and modeling_rope_utils.py): the
 * frequencies with Llama 3's scaling, the table of their cos and sin, and
 * the rotation of the Q and K heads in place (or, for bf16 activations,
 * rounded into bf16 bits). The frequencies and the table
 * are rounded step by step as PyTorch rounds them (fp32), so that a model
 * trained here and one run by transformers see the same angles. */
#include <math.h>
#include <string.h>

#include "../../common/error.h"
#include "../convert_bits.h"
#include "../kernels.h"
#include "bf16_outputs.h"
#include "workers.h"

/* freq[hd/2]. HF: inv_freq = 1.0 / (base ** (arange(0, hd, 2).float() / hd)),
 * every step a float32 tensor op: the exponent 2j / hd is a float32
 * division, base is taken as a float32, the power is float32 and so is the
 * reciprocal. The power is computed here in double from the same float32
 * operands and rounded once to float32: the correctly rounded fp32 power,
 * which PyTorch's pow (within an ulp) gives too, and the same on every libm
 * (powf's last bit may differ between libraries). */
static void default_frequencies(float *freq, int64_t hd, double theta)
{
    float base = (float)theta;
    for (int64_t j = 0; j < hd / 2; j++) {
        float exponent = (float)(2 * j) / (float)hd;
        float power = (float)pow((double)base, (double)exponent);
        freq[j] = 1.0f / power;
    }
}

/* transformers' _compute_llama3_parameters, each tensor op in float32 as
 * PyTorch does it (Python floats taken as float32 operands):
 *   wavelen = 2 pi / inv_freq        (PyTorch: reciprocal(inv_freq) * 2 pi)
 *   inv_freq_llama = wavelen > low_freq_wavelen ? inv_freq / factor : inv_freq
 *   smooth = (original / wavelen - low) / (high - low)   (original / wavelen: reciprocal then product)
 *   smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
 *   medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen)
 * with low_freq_wavelen = original / low, high_freq_wavelen = original / high. */
static void llama3_scaling(float *freq, int64_t hd, const rope_scaling *scaling)
{
    /* Python floats, converted to float32 where they meet a tensor. */
    float factor = (float)scaling->factor, low = (float)scaling->low_freq_factor;
    float original = (float)scaling->original_seq;
    float low_freq_wavelen = (float)(scaling->original_seq / scaling->low_freq_factor);
    float high_freq_wavelen = (float)(scaling->original_seq / scaling->high_freq_factor);
    float spread = (float)(scaling->high_freq_factor - scaling->low_freq_factor), two_pi = (float)(2.0 * M_PI);
    for (int64_t j = 0; j < hd / 2; j++) {
        float inv_freq = freq[j];
        float wavelen = (1.0f / inv_freq) * two_pi;
        float llama = wavelen > low_freq_wavelen ? inv_freq / factor : inv_freq;
        float smooth = ((1.0f / wavelen) * original - low) / spread;
        float smoothed = (1.0f - smooth) * llama / factor + smooth * llama;
        int medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        freq[j] = medium ? smoothed : llama;
    }
}

void rope_frequencies(float *freq, int64_t hd, double theta, const rope_scaling *scaling)
{
    default_frequencies(freq, hd, theta);
    if (scaling && scaling->factor > 0) llama3_scaling(freq, hd, scaling);
}

/* cos_sin[T, hd/2, 2]. HF: freqs = inv_freq @ position_ids (float32; an
 * inner dimension of 1, so one float32 product t * freq[j]), then
 * cos(freqs), sin(freqs) in float32. The angle is that float32 product
 * (its rounding is part of the model's positions: at t = 8000 it moves the
 * angle by up to 5e-4); its cos and sin are computed in double and rounded
 * once, within half an ulp, where PyTorch's are within an ulp or so. */
void rope_table(float *cos_sin, const float *freq, int64_t T, int64_t hd)
{
    int64_t half = hd / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < half; j++) {
            float angle = (float)t * freq[j];
            cos_sin[(t * half + j) * 2] = (float)cos((double)angle);
            cos_sin[(t * half + j) * 2 + 1] = (float)sin((double)angle);
        }
}

/* Turns the Q and K heads of every row of qkv[B,T,(Hq+2Hkv)*hd] (the first
 * (Hq+Hkv)*hd values of the row) by the row's angles; `sign` +1 turns
 * forward, -1 back (the transpose, which is also the inverse):
 *   x'[j] = a cos - sign b sin,  x'[j + hd/2] = b cos + sign a sin,
 * with a = x[j], b = x[j + hd/2]. Rows r0..r1 of the B*T. */
typedef struct {
    float *qkv;
    const float *cos_sin;
    int64_t T, Hq, Hkv, hd;
    float sign;
} rotate_job;

static void rotate_rows(void *ctx, int64_t r0, int64_t r1)
{
    const rotate_job *q = ctx;
    int64_t half = q->hd / 2, stride = (q->Hq + 2 * q->Hkv) * q->hd;
    for (int64_t r = r0; r < r1; r++) {
        const float *cs = q->cos_sin + (r % q->T) * half * 2;
        float *row = q->qkv + r * stride;
        for (int64_t h = 0; h < q->Hq + q->Hkv; h++) {
            float *x = row + h * q->hd;
            for (int64_t j = 0; j < half; j++) {
                float c = cs[2 * j], s = q->sign * cs[2 * j + 1];
                float lo = x[j], hi = x[j + half];
                x[j] = lo * c - hi * s;
                x[j + half] = hi * c + lo * s;
            }
        }
    }
}

static void rotate(float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                   float sign)
{
    rotate_job job = {qkv, cos_sin, T, Hq, Hkv, hd, sign};
    workers_for(B * T, 2 * (Hq + Hkv) * hd, rotate_rows, &job);
}

void rope_forward(float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    rotate(qkv, cos_sin, B, T, Hq, Hkv, hd, 1.0f);
}

void rope_backward(float *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    rotate(d_qkv, cos_sin, B, T, Hq, Hkv, hd, -1.0f);
}

int rope_forward_bf16(uint16_t *out, const float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq,
                      int64_t Hkv, int64_t hd)
{
    int64_t n = B * T * (Hq + 2 * Hkv) * hd;
    float *rotated;
    TP_TRY(bf16_output_scratch(&rotated, n, "rotary embedding"));
    memcpy(rotated, qkv, (size_t)n * sizeof(float));
    rotate(rotated, cos_sin, B, T, Hq, Hkv, hd, 1.0f);
    round_to_bf16(out, rotated, n);
    return TP_OK;
}

/* The turned values of rows r0..r1 rounded back: the pairs of each Q and K
 * head. V's bits, and a head's last value when hd is odd (no pair), stay as
 * they are, as on a GPU (widening and rounding would quiet a signalling
 * NaN). */
typedef struct {
    uint16_t *bits;
    const float *turned;
    int64_t width, turned_heads, hd;
} round_back_job;

static void round_back_rows(void *ctx, int64_t r0, int64_t r1)
{
    const round_back_job *j = ctx;
    int64_t paired = j->hd / 2 * 2;
    for (int64_t row = r0; row < r1; row++)
        for (int64_t head = 0; head < j->turned_heads; head++)
            for (int64_t i = row * j->width + head * j->hd, end = i + paired; i < end; i++) {
                uint32_t bits;
                memcpy(&bits, &j->turned[i], sizeof bits);
                j->bits[i] = bits_f32_to_bf16(bits);
            }
}

int rope_backward_bf16(uint16_t *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                       int64_t hd)
{
    int64_t n = B * T * (Hq + 2 * Hkv) * hd;
    float *turned;
    TP_TRY(bf16_output_scratch(&turned, n, "rotary embedding's gradient"));
    convert_to_f32(d_qkv, TP_BF16, turned, n);
    rotate(turned, cos_sin, B, T, Hq, Hkv, hd, -1.0f);
    round_back_job job = {d_qkv, turned, (Hq + 2 * Hkv) * hd, Hq + Hkv, hd};
    workers_for(B * T, (Hq + Hkv) * hd, round_back_rows, &job);
    return TP_OK;
}
