/* The units of the torch_dist writer (formats/megatron_dist_write.c): the
 * release that says where the common state goes, Megatron-Core's keys of
 * the canonical names (and back, through the reader's own mapping), and
 * dcp_write's stacking of tensors along a leading axis of their entry,
 * read back through PyTorch's DCP layout by the DCP reader, with its
 * refusals. The whole writer is judged end to end by
 * tests/e2e/test_torch_dist_write.sh against Megatron-Core's own files. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../formats/dcp_internal.h"
#include "../../formats/megatron_internal.h"
#include "../support/fixture.h"

TestSuite(megatron_dist_write, .init = make_dir, .fini = remove_dir, .timeout = 60);

Test(megatron_dist_write, release_says_where_the_common_state_goes)
{
    static const struct {
        const char *text;
        megatron_core_common want;
    } ok[] = {{"0.13", MEGATRON_CORE_COMMON_FILE}, {"0.18", MEGATRON_CORE_COMMON_FILE},
              {"0.18.2", MEGATRON_CORE_COMMON_FILE}, {"0.19", MEGATRON_CORE_COMMON_ENTRY},
              {"0.19.0", MEGATRON_CORE_COMMON_ENTRY}, {"0.20", MEGATRON_CORE_COMMON_ENTRY},
              {"1.0", MEGATRON_CORE_COMMON_ENTRY}};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        megatron_core_common got = ok[i].want == MEGATRON_CORE_COMMON_FILE ? MEGATRON_CORE_COMMON_ENTRY
                                                                           : MEGATRON_CORE_COMMON_FILE;
        cr_assert_eq(megatron_core_release_parse(ok[i].text, &got), TP_OK, "%s: %s", ok[i].text, tp_errmsg());
        cr_assert_eq(got, ok[i].want, "%s", ok[i].text);
    }
    const char *bad[] = {"", "latest", "0", "0.x", "0.19a", "0.19.", "-1.2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        megatron_core_common got;
        cr_assert_eq(megatron_core_release_parse(bad[i], &got), TP_ERR_ARG, "'%s' refused", bad[i]);
        cr_assert(strstr(tp_errmsg(), "a Megatron-Core release") != NULL, "%s", tp_errmsg());
    }
}

/* Every canonical name a GPT or Llama has, under both Megatron-Core
 * namings: the key written, and the reader's mapping of it back. */
Test(megatron_dist_write, core_keys_read_back_as_their_canonical_names)
{
    static const char *const layer[] = {"input_norm.weight", "input_norm.bias", "attention.qkv.weight", "attention.qkv.bias",
                                        "attention.dense.weight", "attention.dense.bias", "post_norm.weight",
                                        "post_norm.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight",
                                        "mlp.fc2.bias"};
    static const char *const outside[] = {"embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
                                          "final_norm.weight", "final_norm.bias", "output_layer.weight"};
    megatron_naming namings[] = {MEGATRON_NAMES_CORE, MEGATRON_NAMES_CORE_LOCAL};
    for (int n = 0; n < 2; n++) {
        megatron_config c = {.naming = namings[n], .core_names = 1, .num_layers = 6, .untied = 1, .learned_positions = 1,
                             .has_bias = 1, .tp = 1, .pp = 1, .vpp = 1};
        for (int i = 0; i < (int)(sizeof layer / sizeof *layer) + (int)(sizeof outside / sizeof *outside); i++) {
            char canonical[256], key[256], numbered[300], back[256];
            int in_layer = i < (int)(sizeof layer / sizeof *layer);
            if (in_layer) snprintf(canonical, sizeof canonical, "layers.%d.%s", 5 - i % 6, layer[i]);
            else snprintf(canonical, sizeof canonical, "%s", outside[i - (int)(sizeof layer / sizeof *layer)]);
            int64_t at;
            cr_assert_eq(megatron_core_key(namings[n], canonical, key, sizeof key, &at), TP_OK, "%s", tp_errmsg());
            cr_assert_eq(at, in_layer ? 5 - i % 6 : -1, "%s: its place along the layers", canonical);
            /* The stacked key's layer numbered, as the reader names one layer of it. */
            if (in_layer) snprintf(numbered, sizeof numbered, "decoder.layers.%lld.%s", (long long)at, key + strlen("decoder.layers."));
            else snprintf(numbered, sizeof numbered, "%s", key);
            int kind;
            cr_assert_eq(megatron_canonical_name(&c, numbered, 0, c.num_layers, back, sizeof back, &kind), TP_OK, "%s: %s",
                         numbered, tp_errmsg());
            cr_assert(kind == MEGATRON_NAME_TENSOR && !strcmp(back, canonical), "%s -> %s -> %s (%s names)", canonical, key,
                      back, megatron_naming_name(namings[n]));
        }
    }
    char key[256];
    int64_t at;
    cr_assert_eq(megatron_core_key(MEGATRON_NAMES_CORE, "final_norm.weight", key, sizeof key, &at), TP_OK);
    cr_assert_str_eq(key, "decoder.final_layernorm.weight");
    cr_assert_eq(megatron_core_key(MEGATRON_NAMES_CORE, "layers.2.input_norm.weight", key, sizeof key, &at), TP_OK);
    cr_assert_str_eq(key, "decoder.layers.self_attention.linear_qkv.layer_norm_weight", "Transformer Engine's fused norm");
    cr_assert_eq(megatron_core_key(MEGATRON_NAMES_CORE_LOCAL, "layers.2.post_norm.weight", key, sizeof key, &at), TP_OK);
    cr_assert_str_eq(key, "decoder.layers.pre_mlp_layernorm.weight", "the local module's norm");
    cr_assert_eq(megatron_core_key(MEGATRON_NAMES_CORE, "layers.0.attention.rotary.weight", key, sizeof key, &at),
                 TP_ERR_NOT_FOUND);
    cr_assert(strstr(tp_errmsg(), "layers.0.attention.rotary.weight: not a tensor of Megatron-Core's GPT") != NULL, "%s",
              tp_errmsg());
    /* The modules whose _extra_state a layer has: Transformer Engine's core attention too. */
    cr_assert_str_eq(megatron_layer_extra_module(MEGATRON_NAMES_CORE, 0), "self_attention.core_attention");
    int count[2] = {0, 0};
    for (int n = 0; n < 2; n++)
        while (megatron_layer_extra_module(namings[n], count[n])) count[n]++;
    cr_assert(count[0] == 5 && count[1] == 4, "%d and %d modules with an extra state", count[0], count[1]);
}

/* dcp_write's hooks: tensors w.0 .. w.N-1 stacked under the key w. */
typedef struct {
    int64_t stack;         /* the size of the leading axis said */
    int same_place;        /* every tensor says place 0 */
    int last_on_middle;    /* w.2 says place 1, w.1's */
} stacking;

typedef struct {
    stacking s;
    ckpt_reader *source;
} stack_ctx;

static int stack_key_of(void *ctx, int tensor, char *key, size_t size, int64_t *index, int64_t *stack, int *skip)
{
    stack_ctx *c = ctx;
    const char *name = ckpt_reader_tensor(c->source, tensor)->name;
    snprintf(key, size, "w");
    *skip = 0;
    *index = c->s.same_place ? 0 : atoi(strchr(name, '.') + 1);
    if (c->s.last_on_middle && *index == 2) *index = 1;
    *stack = c->s.stack;
    return TP_OK;
}

/* Three tensors [6, 4] split on rows at tp 2, each of a layer. */
static void write_three(const char *path, test_tensor *t)
{
    for (int i = 0; i < 3; i++) {
        memset(&t[i], 0, sizeof t[i]);
        snprintf(t[i].name, sizeof t[i].name, "w.%d", i);
        t[i].desc = (ckpt_tensor_desc){.name = t[i].name, .role = "param", .dtype = TP_FP32, .ndim = 2, .shape = {6, 4},
                                       .partition = {.kind = CKPT_SPLIT, .axis = 0}, .anchor = CKPT_ANCHOR_LAYER,
                                       .layer = i};
        t[i].logical = malloc(6 * 4 * sizeof(float));
        for (int e = 0; e < 24; e++) ((float *)t[i].logical)[e] = (float)(100 * i + e);
    }
    ckpt_layout layout = {.tp = 2, .pp = 1, .dp = 1, .num_layers = 3, .virtual_stages = 1};
    write_tensors(path, &layout, t, 3, 0, 7);
}

Test(megatron_dist_write, stacked_entries_read_back_by_layer)
{
    char src[600], out[600];
    snprintf(src, sizeof src, "%s/src", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    test_tensor t[3];
    write_three(src, t);
    ckpt_reader *source;
    cr_assert_eq(ckpt_reader_open(&source, src, NULL), TP_OK, "%s", tp_errmsg());
    stack_ctx ctx = {{.stack = 3}, source};
    struct dcp_write_hooks hooks = {.ctx = &ctx, .key_of = stack_key_of, .no_description = 1};
    dcp_write_options options = {.tp = 2, .pp = 1, .threads = 2, .hooks = &hooks};
    dcp_write_plan plan;
    cr_assert_eq(dcp_write(source, &options, out, &plan), TP_OK, "%s", tp_errmsg());
    cr_assert(plan.tensors == 3 && plan.chunks == 6, "%d tensors in %d chunks", plan.tensors, plan.chunks);
    dcp_checkpoint *d;
    cr_assert_eq(dcp_open(out, &d), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(dcp_num_entries(d), 1, "one entry, no description");
    const dcp_entry *e = dcp_entry_at(d, 0);
    cr_assert(!strcmp(e->key, "w") && e->ndim == 3 && e->shape[0] == 3 && e->shape[1] == 6 && e->shape[2] == 4);
    cr_assert_eq(e->num_chunks, 6);
    int seen[3][2] = {{0}};
    for (int k = 0; k < e->num_chunks; k++) {
        const dcp_chunk *c = &e->chunks[k];
        cr_assert(c->sizes[0] == 1 && c->sizes[1] == 3 && c->sizes[2] == 4 && c->offsets[2] == 0,
                  "each chunk one layer of one rank's piece");
        seen[c->offsets[0]][c->offsets[1] / 3]++;
    }
    for (int l = 0; l < 3; l++) cr_assert(seen[l][0] == 1 && seen[l][1] == 1, "layer %d: both pieces once", l);
    /* Read back as the stacked tensor it is: layer l is w.l. */
    ckpt_reader *r;
    cr_assert_eq(dcp_reader_open(d, 1, 2, &r), TP_OK, "%s", tp_errmsg());
    int k = ckpt_reader_find(r, "w");
    cr_assert(k >= 0);
    float got[3 * 24];
    int64_t start[3] = {0, 0, 0}, count[3] = {3, 6, 4};
    cr_assert_eq(ckpt_reader_read_region(r, k, start, count, got, sizeof got), TP_OK, "%s", tp_errmsg());
    for (int l = 0; l < 3; l++)
        cr_assert_eq(memcmp(got + 24 * l, t[l].logical, 24 * sizeof(float)), 0, "layer %d is w.%d", l, l);
    ckpt_reader_close(r);
    dcp_close(d);

    /* Refused before anything is written: a stack that does not add up,
     * two tensors in one place. */
    ctx.s.stack = 4;
    cr_assert_eq(dcp_write_plan_create(source, &options, &plan), TP_ERR_LAYOUT);
    cr_assert(strstr(tp_errmsg(), "w stacks 3 tensors along an axis of 4") != NULL, "%s", tp_errmsg());
    ctx.s = (stacking){.stack = 3, .same_place = 1};
    cr_assert_eq(dcp_write_plan_create(source, &options, &plan), TP_ERR_LAYOUT);
    cr_assert(strstr(tp_errmsg(), "both take place 0 of w") != NULL, "%s", tp_errmsg());
    /* The two that take one place named, not the stack's first and one of them. */
    ctx.s = (stacking){.stack = 3, .last_on_middle = 1};
    cr_assert_eq(dcp_write_plan_create(source, &options, &plan), TP_ERR_LAYOUT);
    cr_assert(strstr(tp_errmsg(), "tensors w.1 and w.2 both take place 1 of w") != NULL, "%s", tp_errmsg());
    ctx.s = (stacking){.stack = 0};
    cr_assert_eq(dcp_write_plan_create(source, &options, &plan), TP_ERR_LAYOUT, "unstacked under one key");
    cr_assert(strstr(tp_errmsg(), "two tensors are written under the key w") != NULL, "%s", tp_errmsg());
    ckpt_reader_close(source);
    for (int i = 0; i < 3; i++) free(t[i].logical);
}
