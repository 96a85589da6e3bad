/* tp-train generate's sampling (trainer/evaluate.h generate_sample_token):
 * the temperature, then top-k, then top-p, as Hugging Face transformers
 * applies them. Each case draws with u over a fine grid of [0, 1): the
 * share of the grid that gives a token is its probability, so a token kept
 * that should not be, or a weight computed over the wrong set, shows as a
 * share off by more than the grid's step. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>

#include "../../trainer/evaluate.h"

#define GRID 20000
#define MAX_VOCAB 8

/* share[t]: the fraction of the grid's u that draws token t. */
static void shares(const float *logits, int64_t vocab, sampling_options sampling, double *share)
{
    sample_candidate scratch[MAX_VOCAB];
    for (int64_t t = 0; t < vocab; t++) share[t] = 0;
    for (int i = 0; i < GRID; i++) {
        int token = generate_sample_token(logits, vocab, &sampling, (i + 0.5) / GRID, scratch);
        cr_assert(token >= 0 && token < vocab, "token %d outside the vocabulary of %lld", token, (long long)vocab);
        share[token] += 1.0 / GRID;
    }
}

/* The shares against expected[] (probabilities; 0 for tokens never drawn). */
static void expect_shares(const double *share, const double *expected, int64_t vocab, const char *what)
{
    for (int64_t t = 0; t < vocab; t++)
        cr_expect(fabs(share[t] - expected[t]) <= 2.0 / GRID, "%s: token %lld drawn for %.5f of u, expected %.5f", what,
                  (long long)t, share[t], expected[t]);
}

/* The draws over the grid against expected[] (see expect_shares). */
static void expect_draws(const float *logits, int64_t vocab, sampling_options sampling, const double *expected,
                         const char *what)
{
    double share[MAX_VOCAB];
    shares(logits, vocab, sampling, share);
    expect_shares(share, expected, vocab, what);
}

/* Logits whose probabilities at temperature 1 are 1 : 3 : 2 : 4 (tokens 0..3). */
static void weights_1324(float *logits)
{
    const double weight[4] = {1, 3, 2, 4};
    for (int t = 0; t < 4; t++) logits[t] = (float)log(weight[t]);
}

Test(sampling, temperature_zero_takes_the_most_likely_lowest_id_among_equals)
{
    const float logits[4] = {1, 3, 3, 0};
    sampling_options s = {.temperature = 0, .top_k = 3, .top_p = 0.1};
    sample_candidate scratch[4];
    for (double u = 0; u < 1; u += 0.125) cr_assert_eq(generate_sample_token(logits, 4, &s, u, scratch), 1);
}

Test(sampling, every_token_in_proportion_without_narrowing)
{
    float logits[4];
    weights_1324(logits);
    expect_draws(logits, 4, (sampling_options){.temperature = 1, .top_k = 0, .top_p = 1},
                 (const double[]){0.1, 0.3, 0.2, 0.4}, "temperature 1");
    /* Temperature 2 takes the square roots of the weights. */
    double root_total = 1 + sqrt(3) + sqrt(2) + 2;
    expect_draws(logits, 4, (sampling_options){.temperature = 2, .top_k = 4, .top_p = 1},
                 (const double[]){1 / root_total, sqrt(3) / root_total, sqrt(2) / root_total, 2 / root_total},
                 "temperature 2, top-k the whole vocabulary");
}

Test(sampling, top_k_keeps_the_k_most_likely_renormalized)
{
    float logits[4];
    weights_1324(logits);
    expect_draws(logits, 4, (sampling_options){.temperature = 1, .top_k = 2, .top_p = 1},
                 (const double[]){0, 3.0 / 7, 0, 4.0 / 7}, "top-k 2");
    expect_draws(logits, 4, (sampling_options){.temperature = 5, .top_k = 1, .top_p = 1},
                 (const double[]){0, 0, 0, 1}, "top-k 1 at temperature 5");
}

Test(sampling, top_k_among_equal_logits_keeps_the_lower_ids)
{
    const float logits[5] = {2, 5, 1, 5, 5};
    expect_draws(logits, 5, (sampling_options){.temperature = 1, .top_k = 2, .top_p = 1},
                 (const double[]){0, 0.5, 0, 0.5, 0}, "top-k 2 of three equal");
}

Test(sampling, top_p_keeps_the_fewest_most_likely_reaching_p)
{
    float logits[4];
    weights_1324(logits);
    /* Ranked 0.4 (token 3), 0.3 (1), 0.2 (2), 0.1 (0). */
    expect_draws(logits, 4, (sampling_options){.temperature = 1, .top_k = 0, .top_p = 0.35},
                 (const double[]){0, 0, 0, 1}, "top-p 0.35: the first alone");
    expect_draws(logits, 4, (sampling_options){.temperature = 1, .top_k = 0, .top_p = 0.5},
                 (const double[]){0, 3.0 / 7, 0, 4.0 / 7}, "top-p 0.5: 0.4 is short of it");
    expect_draws(logits, 4, (sampling_options){.temperature = 1, .top_k = 0, .top_p = 0.75},
                 (const double[]){0, 3.0 / 9, 2.0 / 9, 4.0 / 9}, "top-p 0.75");
    expect_draws(logits, 4, (sampling_options){.temperature = 1, .top_k = 0, .top_p = 1e-9},
                 (const double[]){0, 0, 0, 1}, "top-p near 0 keeps the first");
}

Test(sampling, top_p_counts_the_probabilities_top_k_left)
{
    float logits[4];
    weights_1324(logits);
    /* top-k 3 leaves 4 : 3 : 2 (4/9, 3/9, 2/9); top-p 0.75 then keeps 4 and
     * 3 (4/9 is short of it, 7/9 reaches it). Counted over all four tokens,
     * 0.4 + 0.3 = 0.7 would fall short and keep token 2 as well. */
    expect_draws(logits, 4, (sampling_options){.temperature = 1, .top_k = 3, .top_p = 0.75},
                 (const double[]){0, 3.0 / 7, 0, 4.0 / 7}, "top-k 3 then top-p 0.75");
}
