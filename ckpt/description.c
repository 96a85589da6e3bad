/* description.c: an index.json text read for what it describes (ckpt.h). */
#include <stdlib.h>

#include "../common/error.h"
#include "index.h"

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
