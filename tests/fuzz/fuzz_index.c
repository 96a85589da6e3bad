/* fuzz_index.c: libFuzzer target for the index parser (index.json text to
 * ckpt_index). Whatever the text, parsing ends in TP_OK or an error naming
 * the file, never a crash, a hang or an overflow; a parsed index is
 * serialized again and must parse back. The index's tensors are parsed one
 * at a time (tp_json_parse_deferring): the text read so must be accepted
 * exactly where a whole parse accepts it, and read the same. `make fuzz`
 * runs it. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../ckpt/index.h"
#include "../../common/json.h"

/* Aborts unless text, its "tensors" read element by element, is accepted
 * and read as a whole parse accepts and reads it. Below 60 KiB, where a
 * whole parse's memory bound (16 bytes a byte of text, plus a MiB) refuses
 * nothing: cJSON takes at most about 32 (a node of 64 bytes for a value of
 * two), so the parts' own bounds cannot accept what it refused. */
static void check_deferred_parse(const char *text, size_t size)
{
    if (size >= 60 << 10) return;
    cJSON *whole = NULL, *rest = NULL;
    tp_json_span *spans = NULL;
    int64_t count = 0;
    int whole_status = tp_json_parse(text, size, "t", &whole);
    int status = tp_json_parse_deferring(text, size, "t", "tensors", &rest, &spans, &count);
    if (status == TP_ERR_STATE) abort();
    cJSON *array = status ? NULL : cJSON_GetObjectItemCaseSensitive(rest, "tensors");
    for (int64_t k = 0; k < count && !status; k++) {
        cJSON *element = NULL;
        status = tp_json_parse(text + spans[k].offset, spans[k].length, "t", &element);
        if (!status) cJSON_AddItemToArray(array, element);
    }
    if (!whole_status != !status || (!status && !cJSON_Compare(whole, rest, 1))) abort();
    cJSON_Delete(whole);
    cJSON_Delete(rest);
    free(spans);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    check_deferred_parse(text, size);
    ckpt_index index;
    if (ckpt_index_parse(text, "index.json", &index) == TP_OK) {
        /* What parsed describes sizes the arithmetic can take. */
        for (int i = 0; i < index.num_tensors; i++) {
            const ckpt_tensor_desc *t = &index.tensors[i].tensor.desc;
            (void)ckpt_padded_bytes(t, index.layout.tp);
            (void)ckpt_piece_block_rows(t, index.layout.tp);
        }
        char *json = NULL;
        if (ckpt_index_to_json(&index, &json) == TP_OK) {
            ckpt_index again;
            if (ckpt_index_parse(json, "index.json (again)", &again) != TP_OK) abort();
            ckpt_index_free(&again);
        }
        free(json);
        ckpt_index_free(&index);
    }
    free(text);
    return 0;
}
