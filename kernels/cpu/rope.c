/* rope.c: rotary position embeddings (Hugging Face's rotate-half form) and
 * their frequencies, with Llama 3's frequency scaling. */
#include <math.h>

#include "../kernels.h"

void rope_frequencies(float *freq, int64_t hd, double theta, const rope_scaling *scaling)
{
    for (int64_t j = 0; j < hd / 2; j++) {
        /* As transformers computes inv_freq: the exponent 2j/hd in fp32, the
         * power in fp32 (torch's pow of a float tensor), then 1/x in fp32. */
        float exponent = (float)(2 * j) / (float)hd;
        float inv = 1.0f / powf((float)theta, exponent);
        if (scaling && scaling->factor > 0) {
            /* transformers' _compute_llama3_parameters: long wavelengths (low
             * frequencies) divided by factor, short ones kept, a smooth blend
             * between. */
            double original = scaling->original_seq, factor = scaling->factor;
            double low_wavelen = original / scaling->low_freq_factor;
            double high_wavelen = original / scaling->high_freq_factor;
            double wavelen = 2 * M_PI / inv;
            double scaled = wavelen > low_wavelen ? inv / factor : inv;
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                double smooth = (original / wavelen - scaling->low_freq_factor) /
                                (scaling->high_freq_factor - scaling->low_freq_factor);
                scaled = (1 - smooth) * scaled / factor + smooth * scaled;
            }
            inv = (float)scaled;
        }
        freq[j] = inv;
    }
}

void rope_table(float *cos_sin, const float *freq, int64_t T, int64_t hd)
{
    int64_t half = hd / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < half; j++) {
            /* The angle as transformers forms it (position x inv_freq in fp32),
             * its cosine and sine to fp32 precision. */
            float angle = (float)t * freq[j];
            cos_sin[(t * half + j) * 2] = (float)cos((double)angle);
            cos_sin[(t * half + j) * 2 + 1] = (float)sin((double)angle);
        }
}

/* Turns the Q and K heads of every row by the row's angles; direction -1
 * turns back (the transpose of the rotation). */
static void rope_apply(float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                       float direction)
{
    int64_t half = hd / 2, width = (Hq + 2 * Hkv) * hd;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            float *row = qkv + (b * T + t) * width;
            const float *cs = cos_sin + t * half * 2;
            for (int64_t h = 0; h < Hq + Hkv; h++) {
                float *x = row + h * hd;
                for (int64_t j = 0; j < half; j++) {
                    float c = cs[2 * j], s = direction * cs[2 * j + 1], a = x[j], e = x[j + half];
                    x[j] = a * c - e * s;
                    x[j + half] = e * c + a * s;
                }
            }
        }
}

void rope_forward(float *qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    rope_apply(qkv, cos_sin, B, T, Hq, Hkv, hd, 1.0f);
}

void rope_backward(float *d_qkv, const float *cos_sin, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    rope_apply(d_qkv, cos_sin, B, T, Hq, Hkv, hd, -1.0f);
}
