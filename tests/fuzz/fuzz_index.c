/* fuzz_index.c: libFuzzer target for the index parser (index.json text to
 * ckpt_index). Whatever the text, parsing ends in TP_OK or an error naming
 * the file, never a crash, a hang or an overflow; a parsed index is
 * serialized again and must parse back. `make fuzz` runs it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../ckpt/index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
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
