/* fuzz_pickle.c: libFuzzer target for the data-only pickle interpreter.
 * The input is a pickle stream (data.pkl of a torch.save file, or anything
 * else). It must load or fail with an error, never crash, hang or take
 * memory out of proportion; a loaded tree is walked for its tensors and
 * looked up, which must end even on cyclic trees. Limits are small so
 * that the memory bound is reached often. `make fuzz` runs it. */
#include <stdint.h>
#include <string.h>

#include "../../formats/torch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int count_tensor(void *ctx, const char *path, const pickle_value *tensor)
{
    if (!path || tensor->kind != PICKLE_TENSOR || tensor->tensor->ndim > TORCH_MAX_DIMS) __builtin_trap();
    ++*(int64_t *)ctx;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pickle_limits limits;
    pickle_limits_init(&limits);
    limits.max_memory = 64 << 20;
    limits.max_memo = 1 << 16;
    limits.max_marks = 200;
    pickle_doc *doc = NULL;
    if (pickle_load(data, size, "fuzz.pkl", &limits, &doc) != 0) return 0;
    int64_t tensors = 0;
    const pickle_value *root = pickle_root(doc);
    (void)pickle_walk_tensors(doc, root, count_tensor, &tensors);
    (void)pickle_get(root, "model");
    (void)pickle_get(pickle_get(root, "args"), "num_layers");
    (void)pickle_get_int(pickle_get(root, "state"), 0);
    pickle_free(doc);
    return 0;
}
