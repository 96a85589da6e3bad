/* The model described once (model/gpt.h) and its interop tables
 * (model/interop.h): the options every program parses, the catalogue's
 * kinds, layers and names, the parameter count, GPT-2's byte-to-symbol
 * table, the size label llama.cpp's tools write, and the GGUF vocabulary of a
 * byte-level model. Expected values come from the definitions (GPT-2's
 * bytes_to_unicode, gguf-py's model_weight_count_rounded_notation), worked
 * out independently of the code under test. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../model/interop.h"
#include "../support/fixture.h"

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
        {"rope-scaling", "8,1,4,8192,extra", "got '8,1,4,8192,extra'"},
        {"rope-scaling", "8,1,4,8192,16", "got '8,1,4,8192,16'"},
        {"rope-scaling", "8,1,4,8192,", "got '8,1,4,8192,'"},
        {"rope-scaling", "8,", "got '8,'"},
        /* One rule for numbers (common/parse.h): strtod took blanks, '+' and hexadecimal here. */
        {"layers", " 2", "--layers expects an integer in 1..100000, got ' 2'"},
        {"layers", "+2", "--layers expects an integer in 1..100000, got '+2'"},
        {"norm-eps", " 1e-5", "--norm-eps expects a number in (0, 1), got ' 1e-5'"},
        {"norm-eps", "0x1p-17", "--norm-eps expects a number in (0, 1), got '0x1p-17'"},
        {"rope-theta", "+500000", "--rope-theta expects a number in (1, 1e12), got '+500000'"},
        {"rope-scaling", "0x20", "got '0x20'"},
        {"rope-scaling", "8, 1,4,8192", "got '8, 1,4,8192'"},
        {"depth", "3", "--depth is not a model option"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        gpt_options o = {0};
        cr_assert_eq(gpt_options_set(&o, refused[i].name, refused[i].value), TP_ERR_ARG, "--%s %s accepted",
                     refused[i].name, refused[i].value);
        cr_assert(strstr(tp_errmsg(), refused[i].says), "--%s %s: '%s' does not say '%s'", refused[i].name,
                  refused[i].value, tp_errmsg(), refused[i].says);
    }
    /* Contradicting flags: the last one won. Repeating one is no contradiction. */
    for (int order = 0; order < 2; order++) {
        gpt_options flags = {0};
        cr_assert_eq(gpt_options_set(&flags, order ? "untied-embeddings" : "tied-embeddings", NULL), TP_OK);
        cr_assert_eq(gpt_options_set(&flags, order ? "untied-embeddings" : "tied-embeddings", NULL), TP_OK);
        cr_assert_eq(gpt_options_set(&flags, order ? "tied-embeddings" : "untied-embeddings", NULL), TP_ERR_ARG);
        cr_assert(strstr(tp_errmsg(), "--tied-embeddings and --untied-embeddings contradict each other"), "%s",
                  tp_errmsg());
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

/* general.name is the name given, whole: a fixed buffer cut a 400-byte
 * name at 255 bytes, mid-character, and the GGUF held invalid UTF-8 (exit 0).
 * A name that is no UTF-8 is refused: GGUF's strings are UTF-8. */
Test(interop, the_gguf_name_is_kept_whole_and_utf8)
{
    gpt_config c;
    cr_assert_eq(gpt_preset("tiny", &c), TP_OK);
    char name[401];
    for (int i = 0; i < 200; i++) memcpy(name + 2 * i, "\xc3\xa9", 2); /* U+00E9, 200 times */
    name[400] = '\0';
    gpt_gguf_metadata *m = NULL;
    cr_assert_eq(gpt_gguf_metadata_create(&m, &c, name, NULL), TP_OK, "%s", tp_errmsg());
    int n;
    const export_kv *kvs = gpt_gguf_metadata_kvs(m, &n), *kv = find_kv(kvs, n, "general.name");
    cr_assert(kv && kv->type == EXPORT_KV_STRING);
    cr_assert_str_eq(kv->string, name, "%zu bytes written of 400", strlen(kv->string));
    gpt_gguf_metadata_free(m);
    m = NULL;
    cr_assert_eq(gpt_gguf_metadata_create(&m, &c, "ab\xff", NULL), TP_ERR_ARG);
    cr_assert_null(m);
    cr_assert(strstr(tp_errmsg(), "general.name is not valid UTF-8 (at byte 2)"), "%s", tp_errmsg());
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
    /* A checkpoint that names no model ({}: another tool's, converted under
     * its own names) is told as such, with the conversion that makes one. */
    cr_assert_eq(gpt_config_from_json("{}", &back), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "names no model (its model configuration is {})") &&
                  strstr(tp_errmsg(), "tp-ckpt import"), "%s", tp_errmsg());
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

/* Llama's names for Hugging Face and llama.cpp: the fused QKV listed as its
 * Q, K and V rows and the SwiGLU input as gate and up; for GGUF the rows of
 * each Q and K head in llama.cpp's order (convert_hf_to_gguf.py's permute:
 * [heads, 2, hd/2] -> [heads, hd/2, 2]), worked out here by hand. */
Test(interop, llama_names_rows_and_the_gguf_permutation)
{
    gpt_config c;
    cr_assert_eq(gpt_preset("llama-tiny", &c), TP_OK); /* 4 heads of 16, 2 KV heads, ffn 128, untied */
    gpt_name_map hf, gg;
    cr_assert_eq(gpt_name_map_create(&hf, &c, EXPORT_SAFETENSORS, "ignored."), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(gpt_name_map_create(&gg, &c, EXPORT_GGUF, ""), TP_OK, "%s", tp_errmsg());
    /* embeddings, 9 per layer, final norm, lm_head */
    cr_assert_eq(hf.count, 1 + 9 * 2 + 2, "%d", hf.count);
    cr_assert_eq(gg.count, hf.count);
    const export_tensor *q = NULL, *k = NULL, *v = NULL, *up = NULL, *gq = NULL, *gk = NULL;
    for (int i = 0; i < hf.count; i++) {
        const char *n = hf.tensors[i].name;
        if (!strcmp(n, "model.layers.1.self_attn.q_proj.weight")) q = &hf.tensors[i];
        if (!strcmp(n, "model.layers.1.self_attn.k_proj.weight")) k = &hf.tensors[i];
        if (!strcmp(n, "model.layers.1.self_attn.v_proj.weight")) v = &hf.tensors[i];
        if (!strcmp(n, "model.layers.1.mlp.up_proj.weight")) up = &hf.tensors[i];
        if (!strcmp(gg.tensors[i].name, "blk.1.attn_q.weight")) gq = &gg.tensors[i];
        if (!strcmp(gg.tensors[i].name, "blk.1.attn_k.weight")) gk = &gg.tensors[i];
    }
    cr_assert(q && k && v && up && gq && gk, "every part is named");
    cr_assert_str_eq(q->source, "model/layers.1.attn.qkv.weight");
    cr_assert(q->rows == 64 && !q->blocks, "Q: the first 4 x 16 rows");
    /* K, V: blocks of 32 rows (2 KV heads of 16); Q is blocks 0 and 1. */
    cr_assert(k->rows == 32 && k->block_rows == 32 && k->blocks[0] == 2, "K: rows 64..95");
    cr_assert(v->rows == 32 && v->block_rows == 32 && v->blocks[0] == 3, "V: rows 96..127");
    cr_assert(up->rows == 128 && up->block_rows == 128 && up->blocks[0] == 1, "up: rows 128..255");
    /* GGUF Q, row by row: output row h*16 + 2i + a is input row h*16 + 8a + i. */
    cr_assert_eq(gq->block_rows, 1);
    for (int h = 0; h < 4; h++)
        for (int i = 0; i < 8; i++)
            for (int a = 0; a < 2; a++) cr_assert_eq(gq->blocks[h * 16 + 2 * i + a], h * 16 + 8 * a + i);
    cr_assert(gk->rows == 32 && gk->blocks[0] == 64 && gk->blocks[1] == 72 && gk->blocks[2] == 65,
              "K starts after Q's 64 rows: %lld %lld %lld", (long long)gk->blocks[0], (long long)gk->blocks[1],
              (long long)gk->blocks[2]);
    gpt_name_map_free(&hf);
    gpt_name_map_free(&gg);
    /* Tied: no lm_head / output.weight; Llama 3 scaling: GGUF's rope_freqs. */
    cr_assert_eq(gpt_preset("llama-3.2-1b", &c), TP_OK);
    cr_assert_eq(gpt_name_map_create(&gg, &c, EXPORT_GGUF, ""), TP_OK, "%s", tp_errmsg());
    const export_tensor *last = &gg.tensors[gg.count - 1];
    cr_assert_str_eq(last->name, "rope_freqs.weight");
    cr_assert(last->values && last->num_values == 32, "[hd/2] computed values");
    /* Theta 500000, hd 64: frequency 0 (wavelength 2 pi) is kept, the last
     * (wavelength 2 pi 500000^(62/64), beyond 8192) divided by 32. */
    cr_assert(last->values[0] == 1.0f && last->values[31] == 32.0f, "%g %g", last->values[0], last->values[31]);
    for (int i = 0; i < gg.count; i++) cr_assert(strcmp(gg.tensors[i].name, "output.weight"), "tied: no output.weight");
    gpt_name_map_free(&gg);
}

Test(interop, llama_config_json_both_ways)
{
    gpt_config c, back;
    cr_assert_eq(gpt_preset("llama-3.2-1b", &c), TP_OK);
    char *json = gpt_hf_config_json(&c, TP_BF16);
    cr_assert(json && strstr(json, "\"LlamaForCausalLM\"") && strstr(json, "\"rope_type\":\t\"llama3\""), "%s", json);
    cr_assert_eq(gpt_hf_config_parse(json, "config.json", &back), TP_OK, "%s", tp_errmsg());
    cr_assert(back.arch == GPT_ARCH_LLAMA && back.layers == 16 && back.kv_heads == 8 && back.ffn == 8192 &&
              back.vocab == 128256 && !back.untied_embeddings && back.rope_theta == 500000 &&
              back.rope_scaling_factor == 32 && back.rope_original_seq == 8192 && back.norm_eps == 1e-5);
    free(json);
    /* LlamaConfig's defaults where keys are absent: untied, eps 1e-6, theta 10000, as many KV heads as heads. */
    cr_assert_eq(gpt_hf_config_parse("{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
                                     "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 50, "
                                     "\"max_position_embeddings\": 16}",
                                     "c.json", &back),
                 TP_OK, "%s", tp_errmsg());
    cr_assert(back.untied_embeddings && back.norm_eps == 1e-6 && back.rope_theta == 10000 && back.kv_heads == 4);
    cr_assert_neq(gpt_hf_config_parse("{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
                                      "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 50, "
                                      "\"max_position_embeddings\": 16, \"mlp_bias\": true}",
                                      "c.json", &back),
                  TP_OK);
    cr_assert(strstr(tp_errmsg(), "c.json: mlp_bias must be false"), "%s", tp_errmsg());
}

#define LLAMA_KEYS                                                                                                    \
    "\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, \"num_attention_heads\": 4, "         \
    "\"intermediate_size\": 96, \"vocab_size\": 50, \"max_position_embeddings\": 16"

/* A llama3 rope_scaling factor below 1 is refused, 0 as -2: this toolkit
 * stores 0 for "no scaling", so a factor 0 was imported as an unscaled
 * model. */
Test(interop, llama3_rope_factor_below_one_is_refused)
{
    const char *factors[] = {"0", "-2", "0.5"};
    for (size_t i = 0; i < sizeof factors / sizeof factors[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{" LLAMA_KEYS ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %s, \"low_freq_factor\": 1, "
                 "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}}",
                 factors[i]);
        gpt_config c;
        cr_assert_eq(gpt_hf_config_parse(json, "c.json", &c), TP_ERR_FORMAT, "factor %s: %s", factors[i], tp_errmsg());
        cr_assert(strstr(tp_errmsg(), "c.json: rope_scaling factor") && strstr(tp_errmsg(), "expected factor >= 1"),
                  "factor %s: %s", factors[i], tp_errmsg());
    }
}

/* GELU's tanh form under each of transformers' names is read; the exact
 * GELU is refused, naming the key. */
Test(interop, gelu_tanh_under_every_name_transformers_gives_it)
{
    const char *names[] = {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"};
    char json[512];
    gpt_config c;
    for (int i = 0; i < 3; i++) {
        snprintf(json, sizeof json, "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, "
                 "\"vocab_size\": 50, \"n_positions\": 16, \"activation_function\": \"%s\"}", names[i]);
        cr_assert_eq(gpt_hf_config_parse(json, "c.json", &c), TP_OK, "%s: %s", names[i], tp_errmsg());
    }
    cr_assert_eq(gpt_hf_config_parse("{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, "
                                     "\"vocab_size\": 50, \"n_positions\": 16, \"activation_function\": \"gelu\"}",
                                     "c.json", &c), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "c.json: activation_function gelu: tp-train computes GELU's tanh form"), "%s",
              tp_errmsg());
}

/* A number given as a string is said to be one, not reported as nan. */
Test(interop, a_number_given_as_a_string_is_named_a_string)
{
    gpt_config c;
    const char *gpt2 = "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, \"vocab_size\": 50, "
                       "\"n_positions\": 16, \"layer_norm_epsilon\": \"1e-5\"}";
    cr_assert_eq(gpt_hf_config_parse(gpt2, "c.json", &c), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "c.json: layer_norm_epsilon is a string, not a number"), "%s", tp_errmsg());
    cr_assert_eq(gpt_hf_config_parse("{" LLAMA_KEYS ", \"rms_norm_eps\": \"1e-5\"}", "c.json", &c), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "c.json: 'rms_norm_eps' is a string, not a number"), "%s", tp_errmsg());
}

/* "rope_theta": 10000, "rope_theta": 500000: cJSON read the first, Python's
 * json (transformers) the last; refused, naming the key. */
Test(interop, a_config_key_given_twice_is_refused)
{
    gpt_config c;
    cr_assert_eq(gpt_hf_config_parse("{" LLAMA_KEYS ", \"rope_theta\": 10000, \"rope_theta\": 500000}", "c.json", &c),
                 TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "c.json: key rope_theta appears twice"), "%s", tp_errmsg());
}

/* A fused QKV's heads (blocks of kv_channels rows) as labels: query head h
 * is h, group g's key heads + g, its value heads + groups + g. */
static int64_t megatron_label(int64_t heads, int64_t groups, int64_t block)
{
    int64_t per_group = heads / groups, g = block / (per_group + 2), k = block % (per_group + 2);
    return k < per_group ? g * per_group + k : k == per_group ? heads + g : heads + groups + g;
}

/* This model's QKV piece of each rank, block by block (ckpt_piece_runs on
 * the catalogue's description: the partition code that writes the
 * trainer's checkpoints, replicated key/value heads included), equals the
 * block of Megatron's piece that gpt_megatron_qkv_degree and
 * gpt_megatron_qkv_block name, Megatron's rows being per group [q of its
 * heads, k, v] cut evenly (whole groups; a group whole where fewer groups
 * than ranks). Labels are worked out here from Megatron's layout. */
Test(megatron_qkv, every_block_of_every_rank_from_megatrons_rows)
{
    const int64_t cases[][3] = {{4, 4, 1}, {4, 2, 2}, {4, 2, 4}, {8, 2, 8}, {8, 4, 2}, {8, 8, 4},
                                {6, 2, 6}, {12, 3, 6}, {8, 1, 4}, {16, 4, 8}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t heads = cases[c][0], groups = cases[c][1], hd = 4;
        int tp = (int)cases[c][2];
        gpt_config config = {.arch = GPT_ARCH_LLAMA, .layers = 1, .dim = heads * hd, .heads = heads,
                             .kv_heads = groups, .vocab = 8, .seq = 4, .ffn = 48, .dtype = TP_FP32};
        gpt_config_defaults(&config);
        cr_assert_eq(gpt_config_check(&config, tp, 1), TP_OK, "%s", tp_errmsg());
        gpt_tensor *catalog = NULL;
        int count = 0;
        cr_assert_eq(gpt_catalog(&config, 0, &catalog, &count), TP_OK, "%s", tp_errmsg());
        const ckpt_tensor_desc *qkv = NULL;
        for (int i = 0; i < count; i++)
            if (catalog[i].kind == GPT_QKV_WEIGHT) qkv = &catalog[i].desc;
        cr_assert_not_null(qkv);
        for (int rank = 0; rank < tp; rank++) {
            ckpt_run runs[16];
            int64_t n = ckpt_piece_runs(qkv, tp, rank, runs, 16), j = 0;
            cr_assert_gt(n, 0);
            int megatron_piece = -1, degree = gpt_megatron_qkv_degree(groups, tp, rank, &megatron_piece);
            cr_assert(degree == (groups < tp ? groups : tp) && megatron_piece == rank / (tp / degree),
                      "heads %lld groups %lld tp %d rank %d: degree %d piece %d", (long long)heads, (long long)groups, tp,
                      rank, degree, megatron_piece);
            int64_t first = megatron_piece * ((heads + 2 * groups) / degree); /* Megatron's piece: an even cut */
            for (int64_t r = 0; r < n; r++) {
                cr_assert_geq(runs[r].logical_start, 0);
                for (int64_t row = 0; row < runs[r].length; row += hd, j++) {
                    int64_t ours = (runs[r].logical_start + row) / hd; /* [q; k; v]: head, group, group */
                    int64_t block = gpt_megatron_qkv_block(heads, groups, tp, rank, j);
                    cr_assert(block >= 0 && block < (heads + 2 * groups) / degree);
                    cr_assert_eq(megatron_label(heads, groups, first + block), ours,
                                 "heads %lld groups %lld tp %d rank %d block %lld: Megatron's %lld is %lld, ours %lld",
                                 (long long)heads, (long long)groups, tp, rank, (long long)j, (long long)(first + block),
                                 (long long)megatron_label(heads, groups, first + block), (long long)ours);
                }
            }
            cr_assert_eq(j, heads / tp + 2 * (groups < tp ? 1 : groups / tp));
        }
        free(catalog);
    }
}

/* RoPE as transformers reads it: version 5's rope_parameters (rope_theta
 * inside it), rope_scaling taken first where both are given, the "default"
 * type as no scaling, original_max_position_embeddings from the top level
 * or max_position_embeddings; other types and a partial rotary factor
 * refused naming the key. A rope_parameters was ignored: a Llama 3 of
 * theta 500000 scaled by 32 was imported at theta 10000, unscaled. */
Test(interop, rope_parameters_of_transformers_5_and_rope_scaling_of_4)
{
    static const struct {
        const char *keys;
        double theta, factor;
        int64_t original;
    } read[] = {
        {"\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 32.0, "
         "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}",
         500000, 32, 8192},
        {"\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000.0}", 500000, 0, 0},
        {"\"rope_theta\": 250000, \"rope_parameters\": {\"type\": \"default\"}", 250000, 0, 0},
        {"\"rope_theta\": 250000, \"rope_scaling\": {\"rope_type\": \"default\"}", 250000, 0, 0},
        {"\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
         "\"original_max_position_embeddings\": 4096}, \"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 32, "
         "\"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}", 10000, 8, 4096},
        {"\"rope_scaling\": null, \"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000, \"factor\": 32, "
         "\"low_freq_factor\": 1, \"high_freq_factor\": 4}, \"original_max_position_embeddings\": 2048", 500000, 32, 2048},
        {"\"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 32, \"low_freq_factor\": 1, \"high_freq_factor\": 4}",
         10000, 32, 16},
        {"\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e6, \"partial_rotary_factor\": 1.0}", 1e6, 0, 0},
        {"\"hidden_act\": \"swish\", \"mlp_bias\": null, \"attention_bias\": null", 10000, 0, 0},
    };
    for (size_t i = 0; i < sizeof read / sizeof *read; i++) {
        char json[1024];
        snprintf(json, sizeof json, "{" LLAMA_KEYS ", %s}", read[i].keys);
        gpt_config c;
        cr_assert_eq(gpt_hf_config_parse(json, "c.json", &c), TP_OK, "%s: %s", read[i].keys, tp_errmsg());
        cr_assert(c.rope_theta == read[i].theta && c.rope_scaling_factor == read[i].factor &&
                      (read[i].factor == 0 || (c.rope_original_seq == read[i].original && c.rope_low_freq_factor == 1 &&
                                               c.rope_high_freq_factor == 4)),
                  "%s: theta %g factor %g original %lld", read[i].keys, c.rope_theta, c.rope_scaling_factor,
                  (long long)c.rope_original_seq);
    }
    static const struct {
        const char *keys, *message;
    } refused[] = {
        {"\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4, \"original_max_position_embeddings\": 4096}",
         "c.json: rope_parameters: rope_type yarn: of the scaled types, Llama 3's (llama3) is computed"},
        {"\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}", "c.json: rope_scaling: rope_type linear"},
        {"\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": null}",
         "c.json: rope_parameters: 'rope_theta' is null, not a number"},
        {"\"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5}",
         "c.json: rope_parameters: partial_rotary_factor below 1"},
        {"\"partial_rotary_factor\": 0.5", "c.json: partial_rotary_factor below 1"},
        {"\"rope_parameters\": [10000]", "c.json: rope_parameters is an array, not an object"},
        {"\"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 0.5, \"low_freq_factor\": 1, \"high_freq_factor\": 4}",
         "c.json: rope_parameters factor 0.5: expected factor >= 1 (rope_parameters null for none)"},
        {"\"hidden_act\": \"gelu\"", "c.json: hidden_act gelu"},
        {"\"mlp_bias\": true", "c.json: mlp_bias must be false"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        char json[1024];
        snprintf(json, sizeof json, "{" LLAMA_KEYS ", %s}", refused[i].keys);
        gpt_config c;
        cr_assert_eq(gpt_hf_config_parse(json, "c.json", &c), TP_ERR_FORMAT, "%s: read", refused[i].keys);
        cr_assert(strstr(tp_errmsg(), refused[i].message), "%s: %s", refused[i].keys, tp_errmsg());
    }
}

#undef LLAMA_KEYS

/* A checkpoint of another model is refused naming what differs: every
 * setting same_model compares, not only the six sizes (a Llama resumed with
 * other --kv-heads was "layers 2 dim 64 ..., this run has layers 2 dim 64
 * ...", the same words on both sides). */
Test(options, another_model_is_named_by_what_differs)
{
    gpt_config saved = parsed((const char *const[]){"model", "llama-tiny", NULL});
    struct {
        const char *const pairs[7];
        const char *saved, *run;
    } cases[] = {
        {{"model", "llama-tiny", "kv-heads", "1", NULL}, "kv_heads 2", "kv_heads 1"},
        {{"model", "llama-tiny", "tied-embeddings", NULL, NULL}, "untied embeddings", "tied embeddings"},
        {{"model", "llama-tiny", "norm-eps", "1e-6", NULL}, "norm_eps 1e-05", "norm_eps 1e-06"},
        /* apart beyond %g's six digits: each side's own digits */
        {{"model", "llama-tiny", "norm-eps", "1.0000001e-5", NULL}, "norm_eps 1e-05", "norm_eps 1.0000001e-05"},
        {{"model", "llama-tiny", "rope-theta", "10000.5", NULL}, "rope_theta 10000,", "rope_theta 10000.5"},
        {{"model", "llama-tiny", "rope-theta", "500000", NULL}, "rope_theta 10000", "rope_theta 500000"},
        {{"model", "llama-tiny", "rope-scaling", "8", NULL}, "rope_scaling none", "rope_scaling 8,1,4,8192"},
        {{"arch", "gpt", "layers", "2", "dim", "64", NULL}, "arch llama", "arch gpt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gpt_config run;
        if (i + 1 < sizeof cases / sizeof cases[0]) run = parsed(cases[i].pairs);
        else { /* a GPT of llama-tiny's sizes and MLP width */
            run = parsed((const char *const[]){"layers", "2", "dim", "64", "heads", "4", "vocab", "256", "seq", "32",
                                               "ffn", "128", NULL});
        }
        cr_assert_eq(gpt_config_check_same("ck", &saved, &run), TP_ERR_ARG, "case %zu", i);
        const char *m = tp_errmsg(), *other = strstr(m, "this run has");
        cr_assert(other, "%s", m);
        const char *first = strstr(m, cases[i].saved);
        cr_assert(first && first < other, "case %zu: the checkpoint's '%s' before 'this run has': %s", i,
                  cases[i].saved, m);
        cr_assert(strstr(other, cases[i].run), "case %zu: the run's '%s' after it: %s", i, cases[i].run, m);
    }
    cr_assert_eq(gpt_config_check_same("ck", &saved, &saved), TP_OK);
}

/* ------------------------------------------ the fuzzing corpus, replayed */

#define LLVMFuzzerTestOneInput fuzz_hf_one
#include "../fuzz/fuzz_hf.c"
#undef LLVMFuzzerTestOneInput

/* tests/fuzz/corpus/hf (config.json, tokenizer directories; crashes found
 * by `make fuzz` included) through the fuzz target: run from the root. */
Test(interop, fuzz_corpus_hf)
{
    cr_assert_gt(replay_corpus("hf", fuzz_hf_one), 0);
}
