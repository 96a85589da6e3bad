/* adamw.c: AdamW in the order of operations torch.optim.AdamW uses, so that
 * the two agree to the last bits as far as fp32 allows. */
#include <math.h>

#include "../kernels.h"
#include "vector_clones.h"
#include "workers.h"

/* The scalars every tensor of a step shares, in fp32 as the values use them. */
typedef struct {
    float step_size, bias2_sqrt, keep1, keep2, beta2, eps;
} adamw_scalars;

static VECTOR_CLONES void adamw_values(const adamw_scalars *s, float decay, float *param, const float *grad, float *m,
                                       float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float p = param[i] * decay, g = grad[i];
        float mi = m[i] + s->keep1 * (g - m[i]);        /* exp_avg.lerp_(grad, 1 - beta1) */
        float vi = v[i] * s->beta2 + s->keep2 * g * g; /* exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2) */
        float denom = sqrtf(vi) / s->bias2_sqrt + s->eps;
        param[i] = p + (-s->step_size) * mi / denom; /* addcdiv_(exp_avg, denom, value=-step_size) */
        m[i] = mi;
        v[i] = vi;
    }
}

typedef struct {
    const adamw_tensor *tensors;
    int count;
    float lr;
    adamw_scalars scalars;
} adamw_job;

/* Values [i0, i1) of the tensors' concatenation: the part of each tensor
 * that falls in it. */
static void adamw_span(void *ctx, int64_t i0, int64_t i1)
{
    const adamw_job *j = ctx;
    int64_t start = 0; /* of tensor t in the concatenation */
    for (int t = 0; t < j->count && start < i1; t++) {
        const adamw_tensor *x = &j->tensors[t];
        int64_t n = x->n > 0 ? x->n : 0;
        int64_t lo = i0 > start ? i0 - start : 0, hi = i1 - start < n ? i1 - start : n;
        start += n;
        if (hi <= lo) continue;
        /* Python's 1 - lr * weight_decay, in double, then fp32. */
        float decay = (float)(1.0 - (double)j->lr * (double)x->weight_decay);
        adamw_values(&j->scalars, decay, x->param + lo, x->grad + lo, x->m + lo, x->v + lo, hi - lo);
        if (x->param_bits) convert_from_f32(x->param + lo, x->param_bits + lo, TP_BF16, hi - lo); /* round_to_bf16's */
    }
}

void adamw_update_tensors(const adamw_tensor *tensors, int count, float lr, float beta1, float beta2, float eps,
                          int64_t step)
{
    /* Scalars in double, as Python computes them, then used in fp32. */
    double bias1 = 1.0 - pow((double)beta1, (double)step), bias2 = 1.0 - pow((double)beta2, (double)step);
    adamw_job job = {tensors, count, lr,
                     {(float)((double)lr / bias1), (float)sqrt(bias2), 1.0f - beta1, 1.0f - beta2, beta2, eps}};
    int64_t total = 0;
    for (int t = 0; t < count; t++) total += tensors[t].n > 0 ? tensors[t].n : 0;
    workers_for(total, 4, adamw_span, &job); /* a square root and two divisions per value */
}

void adamw_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step)
{
    adamw_tensor tensor = {param, m, v, grad, n, weight_decay, NULL};
    adamw_update_tensors(&tensor, 1, lr, beta1, beta2, eps, step);
}
