/* fuzz_hf.c: libFuzzer target for the Hugging Face files the toolkit reads
 * beside safetensors (model/interop.c): a config.json (what `tp-ckpt
 * import` reads first) and a tokenizer directory (what `tp-ckpt export
 * --format gguf --tokenizer DIR` reads). The input's first line says which:
 *   "#tokenizer": tokenizer.json, and after a line "#config",
 *                 tokenizer_config.json (absent without one);
 *   "#vocab":     vocab.json, and after a line "#merges", merges.txt;
 *   else:         the whole input is a config.json.
 * A config.json that parses is checked as import checks it, its catalogue
 * built (up to 64 layers: import refuses more layers than its files hold
 * tensors) and written back as config.json, which must parse to the same
 * model. A tokenizer is read for a GPT-2 of 64 tokens (a Llama's when
 * tokenizer.json); its vocabulary must have 64 tokens. Each must succeed or
 * fail with an error, never crash, hang or take memory out of proportion.
 * `make fuzz` runs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../model/gpt.h"
#include "../../model/interop.h"
#include "../support/fuzz_scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_HF_VOCAB 64

/* Writes size bytes at dir/name; data NULL removes the file. */
static int put_file(const char *dir, const char *name, const uint8_t *data, size_t size)
{
    char path[640];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!data) return unlink(path) == 0 || access(path, F_OK) != 0 ? 0 : -1;
    return fuzz_write_file(path, data, size);
}

/* The input split at the first line `separator`: [data, *first) and
 * [*second, end), or the whole of it and NULL. */
static void split_at(const uint8_t *data, size_t size, const char *separator, size_t *first, const uint8_t **second,
                     size_t *second_size)
{
    *first = size, *second = NULL, *second_size = 0;
    size_t n = strlen(separator);
    for (size_t i = 0; i + n <= size; i++)
        if ((i == 0 || data[i - 1] == '\n') && memcmp(data + i, separator, n) == 0) {
            *first = i;
            *second = data + i + n;
            *second_size = size - i - n;
            return;
        }
}

static void fuzz_config(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return;
    memcpy(text, data, size);
    text[size] = '\0';
    gpt_config c;
    if (gpt_hf_config_parse(text, "config.json", &c) == TP_OK && gpt_config_check(&c, 1, 1) == TP_OK &&
        c.layers <= 64) {
        gpt_tensor *catalog = NULL;
        int count = 0;
        if (gpt_catalog(&c, 0, &catalog, &count) == TP_OK) free(catalog);
        int64_t parameters;
        (void)gpt_parameter_count(&c, &parameters);
        char *json = gpt_hf_config_json(&c, TP_FP32);
        gpt_config again;
        if (json && gpt_hf_config_parse(json, "config.json (again)", &again) != TP_OK) __builtin_trap();
        if (json && gpt_config_check_same("config.json (again)", &c, &again) != TP_OK) __builtin_trap();
        free(json);
    }
    free(text);
}

static void fuzz_tokenizer(const uint8_t *data, size_t size, int hf)
{
    static char dirs[2][512];
    char *dir = dirs[hf];
    if (!dir[0] && fuzz_scratch_dir(hf ? "hf-tokenizer" : "hf-vocab", dir, sizeof dir)) return (void)(dir[0] = '\0');
    size_t first, second_size;
    const uint8_t *second;
    split_at(data, size, hf ? "#config\n" : "#merges\n", &first, &second, &second_size);
    const char *names[2] = {hf ? "tokenizer.json" : "vocab.json", hf ? "tokenizer_config.json" : "merges.txt"};
    if (put_file(dir, names[0], data, first) || put_file(dir, names[1], second, second_size)) return;
    gpt_config c;
    if (gpt_preset(hf ? "llama-tiny" : "tiny", &c) != TP_OK) __builtin_trap();
    gpt_config_defaults(&c);
    c.vocab = FUZZ_HF_VOCAB;
    gpt_gguf_metadata *m = NULL;
    if (gpt_gguf_metadata_create(&m, &c, "fuzz", dir) != TP_OK) return;
    int count = 0;
    const export_kv *kvs = gpt_gguf_metadata_kvs(m, &count);
    for (int i = 0; i < count; i++)
        if (!strcmp(kvs[i].key, "tokenizer.ggml.tokens") && kvs[i].count != FUZZ_HF_VOCAB) __builtin_trap();
    gpt_gguf_metadata_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size >= 11 && memcmp(data, "#tokenizer\n", 11) == 0) fuzz_tokenizer(data + 11, size - 11, 1);
    else if (size >= 7 && memcmp(data, "#vocab\n", 7) == 0) fuzz_tokenizer(data + 7, size - 7, 0);
    else fuzz_config(data, size);
    return 0;
}
