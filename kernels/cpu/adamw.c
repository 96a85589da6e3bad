/* adamw.c: AdamW in the order of operations torch.optim.AdamW uses, so that
 * the two agree to the last bits as far as fp32 allows. */
#include <math.h>

#include "../kernels.h"
#include "vector_clones.h"
#include "workers.h"

typedef struct {
    float *param, *m, *v;
    const float *grad;
    float decay, step_size, bias2_sqrt, keep1, keep2, beta2, eps;
} adamw_job;

static VECTOR_CLONES void adamw_span(void *ctx, int64_t i0, int64_t i1)
{
    const adamw_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) {
        float p = j->param[i] * j->decay, g = j->grad[i];
        float mi = j->m[i] + j->keep1 * (g - j->m[i]); /* exp_avg.lerp_(grad, 1 - beta1) */
        float vi = j->v[i] * j->beta2 + j->keep2 * g * g; /* exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2) */
        float denom = sqrtf(vi) / j->bias2_sqrt + j->eps;
        j->param[i] = p + (-j->step_size) * mi / denom; /* addcdiv_(exp_avg, denom, value=-step_size) */
        j->m[i] = mi;
        j->v[i] = vi;
    }
}

void adamw_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step)
{
    /* Scalars in double, as Python computes them, then used in fp32. */
    double bias1 = 1.0 - pow((double)beta1, (double)step), bias2 = 1.0 - pow((double)beta2, (double)step);
    adamw_job job = {param, m, v, grad, (float)(1.0 - (double)lr * (double)weight_decay), (float)((double)lr / bias1),
                     (float)sqrt(bias2), 1.0f - beta1, 1.0f - beta2, beta2, eps};
    workers_for(n, 4, adamw_span, &job); /* a square root and two divisions per element */
}
