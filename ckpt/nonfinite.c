/* nonfinite.c: the sentence that names the NaN and infinite values found in
 * the sources of a conversion into this format (ckpt.h ckpt_nonfinite), one
 * shape for every source: "FILE: tensor NAME [SHAPE] holds N NaNs and M
 * infinite values, the first at [I, J]; K tensors in all hold NaN or
 * infinite values (V values)". */
#include <stdio.h>
#include <string.h>

#include "ckpt.h"

void ckpt_nonfinite_init(ckpt_nonfinite *found)
{
    memset(found, 0, sizeof *found);
}

void ckpt_nonfinite_note(ckpt_nonfinite *found, const char *file, const char *name, const int64_t *shape, int ndim,
                         convert_nonfinite counted)
{
    if (!counted.nans && !counted.infinities) return;
    found->values += counted.nans + counted.infinities;
    if (!found->tensors++) {
        int64_t index[CKPT_MAX_DIMS], rest = counted.first;
        for (int k = ndim - 1; k >= 0; k--) {
            index[k] = shape[k] ? rest % shape[k] : 0;
            rest = shape[k] ? rest / shape[k] : 0;
        }
        char at[160], shape_text[160];
        ckpt_shape_text(index, ndim > 0 ? ndim : 1, at, sizeof at);
        ckpt_shape_text(shape, ndim, shape_text, sizeof shape_text);
        snprintf(found->summary, sizeof found->summary,
                 "%s: tensor %s %s holds %lld NaN%s and %lld infinite value%s, the first at %s", file, name, shape_text,
                 (long long)counted.nans, counted.nans == 1 ? "" : "s", (long long)counted.infinities,
                 counted.infinities == 1 ? "" : "s", at);
        found->first_length = strlen(found->summary);
        return;
    }
    /* The count of all so far replaces the last one said. */
    size_t n = found->first_length;
    if (n < sizeof found->summary)
        snprintf(found->summary + n, sizeof found->summary - n,
                 "; %d tensors in all hold NaN or infinite values (%lld values)", found->tensors,
                 (long long)found->values);
}

int ckpt_nonfinite_check(const ckpt_nonfinite *found, int allow, const char *done, const char *carries)
{
    if (!found->tensors || allow) return TP_OK;
    return tp_fail(TP_ERR_FORMAT, "%s: nothing %s (--allow-nonfinite %s them as they are)", found->summary, done,
                   carries);
}
