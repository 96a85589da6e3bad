/* The model described once (model/gpt.h) and its interop tables
 * (model/interop.h): the options every program parses, the catalogue's
 * kinds, layers and names, the parameter count, GPT-2's byte-to-symbol
 * table, the size label llama.cpp's tools write, and the GGUF vocabulary of a
 * byte-level model. Expected values come from the definitions (GPT-2's
 * bytes_to_unicode, gguf-py's model_weight_count_rounded_notation), worked
 * out independently of the code under test. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "../../model/interop.h"

static gpt_config parsed(const char *const *pairs)
{
    gpt_options o = {0};
    for (int i = 0; pairs[i]; i += 2)
        cr_assert_eq(gpt_options_set(&o, pairs[i], pairs[i + 1]), TP_OK, "--%s %s: %s", pairs[i], pairs[i + 1],
                     tp_errmsg());
    gpt_config c;
    cr_assert_eq(gpt_options_finish(&o, &c), TP_OK, "%s", tp_errmsg());
    return c;
}

Test(options, a_preset_refined_by_explicit_sizes)
{
    gpt_config c = parsed((const char *const[]){"model", "tiny", NULL});
    cr_assert(c.layers == 2 && c.dim == 64 && c.heads == 4 && c.kv_heads == 4 && c.vocab == 256 && c.seq == 32);
    cr_assert(c.ffn == 256 && c.vocab_pad_multiple == 1 && c.dtype == TP_FP32 && !c.swiglu);
    /* Sizes that derive from others follow them, unless given. */
    c = parsed((const char *const[]){"model", "tiny", "dim", "128", "heads", "8", NULL});
    cr_assert(c.dim == 128 && c.heads == 8 && c.kv_heads == 8 && c.ffn == 512, "kv_heads %lld ffn %lld",
              (long long)c.kv_heads, (long long)c.ffn);
    c = parsed((const char *const[]){"model", "gpt2-124m", "kv-heads", "4", "ffn", "100", "swiglu", NULL, "dtype",
                                     "bf16", NULL});
    cr_assert(c.layers == 12 && c.vocab == 50257 && c.vocab_pad_multiple == 128 && c.kv_heads == 4 && c.ffn == 100);
    cr_assert(c.swiglu && c.dtype == TP_BF16);
    c = parsed((const char *const[]){"layers", "3", "dim", "48", "heads", "3", "vocab", "2", "seq", "7", NULL});
    cr_assert(c.kv_heads == 3 && c.ffn == 192 && c.vocab_pad_multiple == 1);
}

Test(options, the_same_bounds_for_every_program)
{
    const struct {
        const char *name, *value, *says;
    } refused[] = {
        {"vocab", "1", "--vocab expects an integer in 2..2147483648"},
        {"layers", "100001", "--layers expects an integer in 1..100000"},
        {"dim", "0", "--dim expects an integer in 1..2147483648"},
        {"heads", "x", "--heads expects an integer"},
        {"vocab-pad-multiple", "1048577", "--vocab-pad-multiple expects an integer in 1..1048576"},
        {"dtype", "fp64", "--dtype expects fp32, bf16 or fp16"},
        {"model", "gpt9", "--model expects tiny, small, gpt2-124m, llama-tiny"},
        {"arch", "mamba", "--arch expects gpt or llama"},
        {"norm-eps", "1", "--norm-eps expects a number in (0, 1)"},
        {"rope-theta", "0.5", "--rope-theta expects a number in (1, 1e12)"},
        {"rope-scaling", "8,1,4,x", "--rope-scaling expects FACTOR[,LOW,HIGH,ORIGINAL]"},
        {"depth", "3", "--depth is not a model option"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        gpt_options o = {0};
        cr_assert_eq(gpt_options_set(&o, refused[i].name, refused[i].value), TP_ERR_ARG, "--%s %s accepted",
                     refused[i].name, refused[i].value);
        cr_assert(strstr(tp_errmsg(), refused[i].says), "--%s %s: '%s' does not say '%s'", refused[i].name,
                  refused[i].value, tp_errmsg(), refused[i].says);
    }
    gpt_options o = {0};
    cr_assert_eq(gpt_options_set(&o, "layers", "2"), TP_OK);
    gpt_config c;
    cr_assert_eq(gpt_options_finish(&o, &c), TP_ERR_ARG, "a shape without dim, heads, vocab and seq");
    cr_assert(strstr(tp_errmsg(), "--model or all of --layers --dim --heads --vocab --seq"), "%s", tp_errmsg());
    /* The check behind the parser refuses what the parser would. */
    gpt_config one = {.layers = 1, .dim = 8, .heads = 2, .vocab = 1, .seq = 4};
    gpt_config_defaults(&one);
    cr_assert_eq(gpt_config_check(&one, 1, 1), TP_ERR_ARG);
    for (const char *const *name = gpt_option_names; *name; name++) {
        gpt_options any = {0};
        const char *value = !strcmp(*name, "model")      ? "tiny"
                            : !strcmp(*name, "dtype")    ? "fp16"
                            : !strcmp(*name, "arch")     ? "llama"
                            : !strcmp(*name, "norm-eps") ? "1e-6"
                                                         : "2";
        int status = gpt_options_set(&any, *name, value);
        cr_assert_eq(status, TP_OK, "listed option --%s is not taken: %s", *name, tp_errmsg());
    }
}

Test(catalogue, kinds_layers_and_names_agree)
{
    gpt_config c;
    cr_assert_eq(gpt_preset("tiny", &c), TP_OK);
    c.dtype = TP_BF16; /* with master copies too */
    gpt_tensor *t = NULL;
    int n = 0;
    cr_assert_eq(gpt_catalog(&c, 1, &t, &n), TP_OK, "%s", tp_errmsg());
    int params = 4 + GPT_LAYER_KINDS * (int)c.layers;
    cr_assert_eq(n, 4 * params, "parameters, masters and two moments");
    int64_t elements = 0;
    for (int i = 0; i < n; i++) {
        char want[CKPT_NAME_MAX + 1];
        const gpt_tensor *p = &t[t[i].param_index];
        cr_assert_eq(p->role, GPT_ROLE_PARAM);
        cr_assert(p->kind == t[i].kind && p->layer == t[i].layer, "%s belongs to %s", t[i].name, p->name);
        cr_assert_eq(gpt_tensor_kind_in_layer(t[i].kind), t[i].layer >= 0, "%s", t[i].name);
        if (t[i].layer >= 0) snprintf(want, sizeof want, "layers.%lld.%s", (long long)t[i].layer, gpt_tensor_kind_name(t[i].kind));
        else snprintf(want, sizeof want, "%s", gpt_tensor_kind_name(t[i].kind));
        const char *suffix = strchr(t[i].name, '/') + 1;
        if (t[i].role != GPT_ROLE_PARAM) suffix = strchr(suffix, '/') + 1; /* optim/<role>/... */
        cr_assert_str_eq(suffix, want);
        cr_assert_str_eq(t[i].desc.name, t[i].name);
        cr_assert_str_eq(t[i].desc.param, p->name);
        if (t[i].role == GPT_ROLE_PARAM) {
            int64_t e = 1;
            for (int d = 0; d < t[i].desc.ndim; d++) e *= t[i].desc.shape[d];
            elements += e;
        } else {
            cr_assert_eq(t[i].desc.dtype, TP_FP32, "%s: optimizer state is fp32", t[i].name);
        }
    }
    int64_t parameters = 0;
    cr_assert_eq(gpt_parameter_count(&c, &parameters), TP_OK);
    cr_assert_eq(parameters, elements);
    free(t);
    cr_assert_eq(gpt_preset("gpt2-124m", &c), TP_OK);
    cr_assert_eq(gpt_parameter_count(&c, &parameters), TP_OK);
    cr_assert_eq(parameters, 124439808, "GPT-2 124M has 124,439,808 parameters (tied head)");
    /* 6 x 124,439,808 + 12 x 12 layers x 768 x 1024 positions. */
    double flops = 0;
    cr_assert_eq(gpt_training_flops_per_token(&c, 1024, &flops), TP_OK);
    cr_assert_eq(flops, 859885056.0, "training FLOPs per token of GPT-2 124M at 1024: %.0f", flops);
}

Test(interop, byte_symbols_are_gpt2s)
{
    /* Worked out from bytes_to_unicode: printable bytes stand for
     * themselves, the others for 256, 257, ... in increasing order. */
    const struct {
        int byte;
        const char *symbol;
    } known[] = {{0, "\xc4\x80"},  {10, "\xc4\x8a"}, {32, "\xc4\xa0"},  {33, "!"},          {126, "~"},
                 {127, "\xc4\xa1"}, {160, "\xc5\x82"}, {173, "\xc5\x83"}, {174, "\xc2\xae"}, {255, "\xc3\xbf"}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        char s[4];
        gpt_byte_symbol(known[i].byte, s);
        cr_assert_str_eq(s, known[i].symbol, "byte %d", known[i].byte);
    }
    char all[256][4];
    for (int b = 0; b < 256; b++) gpt_byte_symbol(b, all[b]);
    for (int a = 0; a < 256; a++)
        for (int b = a + 1; b < 256; b++) cr_assert_str_neq(all[a], all[b], "bytes %d and %d share a symbol", a, b);
}

Test(interop, size_labels_as_llama_cpp_writes_them)
{
    const struct {
        int64_t parameters;
        const char *label;
    } cases[] = {{124439808, "124M"}, {1500000000, "1.5B"}, {1557611200, "1.6B"}, {354823168, "355M"},
                 {110000, "110K"},    {7000, "7.0K"},       {999999, "1000K"},    {500, "0.50K"},
                 {2000000000000LL, "2.0T"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char label[32];
        gpt_size_label(cases[i].parameters, label, sizeof label);
        cr_assert_str_eq(label, cases[i].label, "%lld parameters", (long long)cases[i].parameters);
    }
}

static const export_kv *find_kv(const export_kv *kvs, int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (strcmp(kvs[i].key, key) == 0) return &kvs[i];
    return NULL;
}

Test(interop, a_byte_model_gets_a_byte_vocabulary)
{
    gpt_config c;
    cr_assert_eq(gpt_preset("tiny", &c), TP_OK); /* vocabulary 256 */
    gpt_gguf_metadata *m = NULL;
    cr_assert_eq(gpt_gguf_metadata_create(&m, &c, "tiny", NULL), TP_OK, "%s", tp_errmsg());
    int n;
    const export_kv *kvs = gpt_gguf_metadata_kvs(m, &n);
    const export_kv *model = find_kv(kvs, n, "tokenizer.ggml.model"), *tokens = find_kv(kvs, n, "tokenizer.ggml.tokens");
    const export_kv *merges = find_kv(kvs, n, "tokenizer.ggml.merges"), *add_bos = find_kv(kvs, n, "tokenizer.ggml.add_bos_token");
    const export_kv *eos = find_kv(kvs, n, "tokenizer.ggml.eos_token_id"), *label = find_kv(kvs, n, "general.size_label");
    cr_assert(model && tokens && merges && add_bos && eos && label);
    cr_assert_str_eq(model->string, "gpt2");
    cr_assert_eq(tokens->count, 256);
    for (int b = 0; b < 256; b++) {
        char s[4];
        gpt_byte_symbol(b, s);
        cr_assert_str_eq(tokens->strings[b], s, "token %d", b);
    }
    cr_assert_eq(merges->count, 0);
    cr_assert(add_bos->type == EXPORT_KV_BOOL && add_bos->u32 == 0, "no BOS is added to what is tokenized");
    cr_assert(eos->u32 < 256, "the EOS exists");
    char want[32];
    int64_t parameters = 0;
    cr_assert_eq(gpt_parameter_count(&c, &parameters), TP_OK);
    gpt_size_label(parameters, want, sizeof want);
    cr_assert_str_eq(label->string, want);
    gpt_gguf_metadata_free(m);
    /* Another vocabulary without a tokenizer: none. */
    c.vocab = 250;
    cr_assert_eq(gpt_gguf_metadata_create(&m, &c, "tiny", NULL), TP_OK, "%s", tp_errmsg());
    kvs = gpt_gguf_metadata_kvs(m, &n);
    cr_assert_str_eq(find_kv(kvs, n, "tokenizer.ggml.model")->string, "no_vocab");
    cr_assert_null(find_kv(kvs, n, "tokenizer.ggml.tokens"));
    gpt_gguf_metadata_free(m);
}

/* Llama: the real models' parameter counts (worked out from their
 * config.json: embeddings, per layer q, k, v, o, gate, up, down and two
 * norms, the final norm, and lm_head when untied), the catalogue without
 * biases or position table, and the configuration through JSON and back. */
Test(catalogue, llama_models_have_their_parameter_counts)
{
    const struct {
        const char *preset;
        int64_t parameters;
    } models[] = {{"tinyllama-1.1b", 1100048384}, {"llama-3.2-1b", 1235814400}, {"smollm2-135m", 134515008}};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        gpt_config c;
        int64_t parameters = 0;
        cr_assert_eq(gpt_preset(models[i].preset, &c), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(c.arch, GPT_ARCH_LLAMA);
        cr_assert_eq(gpt_parameter_count(&c, &parameters), TP_OK);
        cr_assert_eq(parameters, models[i].parameters, "%s: %lld parameters", models[i].preset, (long long)parameters);
    }
    gpt_config c;
    cr_assert_eq(gpt_preset("llama-tiny", &c), TP_OK);
    gpt_tensor *t = NULL;
    int n = 0;
    cr_assert_eq(gpt_catalog(&c, 1, &t, &n), TP_OK, "%s", tp_errmsg());
    int params = 2 + 6 * (int)c.layers + 1; /* embeddings, 6 per layer, final norm, output */
    cr_assert_eq(n, 3 * params, "fp32: parameters and two moments, got %d", n);
    cr_assert_str_eq(t[params - 1].name, "model/output.weight");
    cr_assert_eq(t[params - 1].desc.anchor, CKPT_ANCHOR_LAST);
    for (int i = 0; i < n; i++) {
        cr_assert(!strstr(t[i].name, ".bias") && !strstr(t[i].name, "pos_embed"), "%s", t[i].name);
        if (t[i].kind == GPT_FC_WEIGHT)
            cr_assert(t[i].desc.shape[0] == 2 * c.ffn && t[i].desc.partition.num_segments == 2, "[gate; up]");
    }
    free(t);
}

Test(options, llama_flags_and_json)
{
    gpt_config c = parsed((const char *const[]){"arch", "llama", "layers", "2", "dim", "96", "heads", "6", "kv-heads",
                                                "2", "vocab", "300", "seq", "64", NULL});
    cr_assert(c.arch == GPT_ARCH_LLAMA && c.swiglu && c.untied_embeddings, "Hugging Face's defaults: untied");
    cr_assert_eq(c.ffn, 256, "8/3 x 96 = 256, a multiple of 256: %lld", (long long)c.ffn);
    cr_assert(c.norm_eps == 1e-5 && c.rope_theta == 10000 && c.rope_scaling_factor == 0);
    c = parsed((const char *const[]){"model", "llama-tiny", "tied-embeddings", NULL, "rope-scaling", "8", "rope-theta",
                                     "500000", "norm-eps", "1e-6", NULL});
    cr_assert(!c.untied_embeddings && c.rope_theta == 500000 && c.norm_eps == 1e-6);
    cr_assert(c.rope_scaling_factor == 8 && c.rope_low_freq_factor == 1 && c.rope_high_freq_factor == 4 &&
              c.rope_original_seq == 8192, "Llama 3's defaults beside a given factor");
    char *json = gpt_config_to_json(&c);
    gpt_config back;
    cr_assert_eq(gpt_config_from_json(json, &back), TP_OK, "%s: %s", json, tp_errmsg());
    cr_assert(back.arch == c.arch && back.layers == c.layers && back.dim == c.dim && back.heads == c.heads &&
                  back.kv_heads == c.kv_heads && back.vocab == c.vocab && back.seq == c.seq && back.ffn == c.ffn &&
                  back.swiglu == c.swiglu && back.vocab_pad_multiple == c.vocab_pad_multiple &&
                  back.dtype == c.dtype && back.untied_embeddings == c.untied_embeddings &&
                  back.norm_eps == c.norm_eps && back.rope_theta == c.rope_theta &&
                  back.rope_scaling_factor == c.rope_scaling_factor &&
                  back.rope_low_freq_factor == c.rope_low_freq_factor &&
                  back.rope_high_freq_factor == c.rope_high_freq_factor && back.rope_original_seq == c.rope_original_seq,
              "the configuration through JSON and back: %s", json);
    free(json);
    /* A configuration written before Llama has no arch: GPT. */
    cr_assert_eq(gpt_config_from_json("{\"layers\":2,\"dim\":64,\"heads\":4,\"kv_heads\":4,\"vocab\":256,\"seq\":32,"
                                      "\"ffn\":256,\"mlp\":\"gelu\",\"vocab_pad_multiple\":1,\"dtype\":\"fp32\"}",
                                      &back),
                 TP_OK);
    cr_assert_eq(back.arch, GPT_ARCH_GPT);
    /* Refusals name what is wrong. */
    gpt_options o = {0};
    cr_assert_eq(gpt_options_set(&o, "model", "tiny"), TP_OK);
    cr_assert_eq(gpt_options_set(&o, "rope-theta", "1e4"), TP_OK);
    cr_assert_neq(gpt_options_finish(&o, &c), TP_OK);
    cr_assert(strstr(tp_errmsg(), "--arch llama"), "%s", tp_errmsg());
    cr_assert_eq(gpt_options_set(&o, "arch", "llama"), TP_OK);
    cr_assert_neq(gpt_options_finish(&o, &c), TP_OK);
    cr_assert(strstr(tp_errmsg(), "contradicts --model tiny"), "%s", tp_errmsg());
    cr_assert_neq(gpt_options_set(&o, "rope-scaling", "0.5"), TP_OK);
    cr_assert_neq(gpt_options_set(&o, "arch", "mamba"), TP_OK);
    cr_assert(gpt_option_is_flag("untied-embeddings") && !gpt_option_is_flag("rope-theta"));
}
