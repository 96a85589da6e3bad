/* adamw.c: AdamW in the order of operations torch.optim.AdamW uses, so that
 * the two agree to the last bits as far as fp32 allows. */
#include <math.h>

#include "../kernels.h"

void adamw_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step)
{
    /* Scalars in double, as Python computes them, then used in fp32. */
    double bias1 = 1.0 - pow((double)beta1, (double)step), bias2 = 1.0 - pow((double)beta2, (double)step);
    float decay = (float)(1.0 - (double)lr * (double)weight_decay);
    float step_size = (float)((double)lr / bias1), bias2_sqrt = (float)sqrt(bias2);
    float keep1 = 1.0f - beta1, keep2 = 1.0f - beta2;
    for (int64_t i = 0; i < n; i++) {
        float p = param[i] * decay, g = grad[i];
        float mi = m[i] + keep1 * (g - m[i]); /* exp_avg.lerp_(grad, 1 - beta1) */
        float vi = v[i] * beta2 + keep2 * g * g; /* exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2) */
        float denom = sqrtf(vi) / bias2_sqrt + eps;
        param[i] = p + (-step_size) * mi / denom; /* addcdiv_(exp_avg, denom, value=-step_size) */
        m[i] = mi;
        v[i] = vi;
    }
}
