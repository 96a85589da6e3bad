/* description.c: an index.json text read for what it describes (ckpt.h). */
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "index.h"
#include "internal.h"

struct ckpt_description {
    ckpt_index index;
};

int ckpt_description_parse(const char *text, const char *where, ckpt_description **out)
{
    *out = NULL;
    ckpt_description *d = calloc(1, sizeof *d);
    if (!d) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int status = ckpt_index_parse(text, where, &d->index);
    if (status) {
        free(d);
        return status;
    }
    /* Parsing may move the copies: their strings point into them again. */
    for (int i = 0; i < d->index.num_tensors; i++) ckpt_tensor_copy_rebind(&d->index.tensors[i].tensor);
    *out = d;
    return TP_OK;
}

void ckpt_description_free(ckpt_description *d)
{
    if (!d) return;
    ckpt_index_free(&d->index);
    free(d);
}

const ckpt_layout *ckpt_description_layout(const ckpt_description *d)
{
    return &d->index.layout;
}

const ckpt_train_state *ckpt_description_state(const ckpt_description *d)
{
    return &d->index.state;
}

int ckpt_description_count(const ckpt_description *d)
{
    return d->index.num_tensors;
}

const ckpt_tensor_desc *ckpt_description_tensor(const ckpt_description *d, int index)
{
    return index >= 0 && index < d->index.num_tensors ? &d->index.tensors[index].tensor.desc : NULL;
}

uint64_t ckpt_description_digest(const ckpt_description *d, int index)
{
    return index >= 0 && index < d->index.num_tensors ? d->index.tensors[index].digest : 0;
}

int ckpt_description_json(const ckpt_layout *layout, const ckpt_train_state *state, int count,
                          const ckpt_tensor_desc *tensors, const uint64_t *digests, char **out)
{
    *out = NULL;
    /* The index of the same tensors stored at tp 1 pp 1, one shard file:
     * the descriptions, the state and the digests are what a reader takes
     * from it; where bytes lie, nothing. */
    ckpt_index index = {.major = CKPT_FORMAT_MAJOR, .minor = CKPT_FORMAT_MINOR};
    index.layout = (ckpt_layout){1, 1, 1, layout->num_layers, 1};
    int status = ckpt_layout_check(&index.layout);
    if (!status) status = ckpt_index_set_state(&index, state);
    index.files = calloc(1, sizeof *index.files);
    index.tensors = calloc((size_t)count + 1, sizeof *index.tensors);
    if (!status && (!index.files || !index.tensors)) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!status) {
        index.num_files = 1;
        ckpt_shard_file_name(0, 0, 0, index.files[0].name, sizeof index.files[0].name);
    }
    for (int i = 0; i < count && !status; i++) {
        ckpt_index_tensor *it = &index.tensors[i];
        status = ckpt_tensor_copy_init(&it->tensor, &tensors[i]);
        if (status) break;
        index.num_tensors = i + 1;
        const ckpt_tensor_desc *t = &it->tensor.desc;
        it->stage = 0;
        it->block_rows = ckpt_piece_block_rows(t, 1);
        it->order = i;
        it->digest = digests ? digests[i] : 0;
        it->num_pieces = 1;
        if (!(it->pieces = calloc(1, sizeof *it->pieces))) {
            status = tp_fail(TP_ERR_NOMEM, "out of memory");
            break;
        }
        ckpt_index_piece *ip = &it->pieces[0];
        snprintf(ip->file, sizeof ip->file, "%s", index.files[0].name);
        ckpt_piece_shape(t, 1, ip->shape);
        ip->bytes = ckpt_padded_bytes(t, 1);
        ip->digest = it->digest;
        index.files[0].bytes += ip->bytes;
    }
    if (!status) status = ckpt_index_to_json(&index, out);
    ckpt_index_free(&index);
    return status;
}
