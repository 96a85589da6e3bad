/* fuzz_megatron_write.c: libFuzzer target for the Megatron-LM writer's
 * carrying over of a source's non-tensor state (formats/megatron_write.c,
 * formats/torch_write.c pk_value). The input is a pickle stream (seeds:
 * tests/fuzz/corpus/pickle and corpus/megatron_write); the value it holds
 * is put in the tree of a real rank file with its optimizer
 * (tests/fuzz/corpus/megatron/opt.pt, opened once, from the repository
 * root) at places the writer carries values from, a set that a hash of the
 * input picks: an attribute of args, the parameter groups' eps, the loss
 * scaler, the schedule, the RNG and the rerun states, an entry added to the
 * first parameter's state (copied to every parameter); a value holding
 * tensors mostly where tensors may be. The checkpoint is then written at
 * its own layout.
 * The write must succeed or fail with an error, never crash, hang or grow
 * out of proportion, and:
 *   - a value pk_value_check refuses is never written;
 *   - what is written reads back (the torch.save reader), each carried
 *     value equal to the input's;
 *   - it names no global but the allow-listed ones;
 *   - the rank file is at most the one written without the value plus 32
 *     bytes per input byte and the bytes of the tensors inside, at each
 *     place and in each copy.
 * `make fuzz` runs it; tests/formats/test_megatron.c replays its corpus. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../common/error.h"
#include "../../formats/megatron.h"
#include "../../formats/megatron_internal.h"
#include "../../formats/torch.h"
#include "../../formats/torch_write.h"
#include "../../store/store.h"
#include "../support/fuzz_scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define WRITE_BASE_FILE "tests/fuzz/corpus/megatron/opt.pt"

static struct {
    char dir[512], source[600], out[600], written[4400];
    megatron_checkpoint *template;
    ckpt_reader *reader;
    long base_bytes; /* the rank file written without the input's value */
    int params;      /* parameters of the rank file: copies of a per-parameter entry */
} fuzz_write;

static void remove_tree(const char *path)
{
    (void)store_posix()->remove_tree(store_posix(), path);
}

/* Before the scratch directory goes (fuzz_scratch.h: its exit handler,
 * registered first, runs last). */
static void fuzz_write_cleanup(void)
{
    if (fuzz_write.reader) ckpt_reader_close(fuzz_write.reader);
    megatron_close(fuzz_write.template);
}

static void harness_broken(const char *what)
{
    fprintf(stderr, "fuzz_megatron_write: %s: %s (run from the repository root)\n", what, tp_errmsg());
    abort();
}

static int write_checkpoint(void)
{
    megatron_write_options options = {.naming = -1, .threads = 1};
    return megatron_write(fuzz_write.reader, fuzz_write.template, &options, fuzz_write.out, NULL);
}

static long written_bytes(void)
{
    struct stat st;
    return stat(fuzz_write.written, &st) == 0 ? (long)st.st_size : -1;
}

static void fuzz_write_init(void)
{
    if (fuzz_scratch_dir("megatron-write", fuzz_write.dir, sizeof fuzz_write.dir))
        harness_broken("the scratch directory");
    snprintf(fuzz_write.source, sizeof fuzz_write.source, "%s/source", fuzz_write.dir);
    snprintf(fuzz_write.out, sizeof fuzz_write.out, "%s/out", fuzz_write.dir);
    char rank_dir[700], file[800];
    snprintf(rank_dir, sizeof rank_dir, "%s/mp_rank_00", fuzz_write.source);
    snprintf(file, sizeof file, "%s/model_optim_rng.pt", rank_dir);
    if (mkdir(fuzz_write.source, 0700) != 0 || mkdir(rank_dir, 0700) != 0)
        harness_broken(fuzz_write.dir);
    atexit(fuzz_write_cleanup);
    if (fuzz_copy_file(WRITE_BASE_FILE, file)) harness_broken(file);
    if (megatron_open(fuzz_write.source, &fuzz_write.template) != 0) harness_broken("megatron_open");
    if (megatron_reader_open(fuzz_write.template, 0, &fuzz_write.reader) != 0) harness_broken("megatron_reader_open");
    char iteration_dir[4200];
    if (write_checkpoint() != 0) harness_broken("the rank file written as it is");
    if (megatron_iteration_dir(fuzz_write.out, iteration_dir, sizeof iteration_dir) != 0) harness_broken("its iteration");
    snprintf(fuzz_write.written, sizeof fuzz_write.written, "%s/mp_rank_00/model_optim_rng.pt", iteration_dir);
    fuzz_write.base_bytes = written_bytes();
    const pickle_value *state = pickle_get(pickle_get(megatron_rank_value(fuzz_write.template, 0, 0, "optimizer"), "optimizer"),
                                           "state");
    if (fuzz_write.base_bytes <= 0 || !state || state->kind != PICKLE_DICT) harness_broken("the base rank file");
    fuzz_write.params = (int)state->dict.keys.count;
    remove_tree(fuzz_write.out);
}

/* ------------------------------------------------ the places of a value */

enum { AT_ARGS, AT_EPS, AT_SCHEDULER, AT_GRAD_SCALER, AT_RNG, AT_RERUN, AT_STATE0, NUM_PLACES };
#define PLAIN_DATA_PLACES (1 << AT_ARGS | 1 << AT_EPS | 1 << AT_SCHEDULER) /* no tensors there */
#define MAX_NODES 8

typedef struct {
    unsigned mask;                  /* 1 << AT_*: where the value is */
    pickle_value *node[MAX_NODES];  /* template values overwritten in place by the input's root (a shallow copy) */
    pickle_value saved[MAX_NODES];
    int count;
    pickle_value *state0;           /* the first parameter's state, given the key "fuzz" */
    pickle_items keys, values;      /* its arrays before */
    pickle_value key;
} places;

static void place(places *p, int at, const pickle_value *node, const pickle_value *value)
{
    if (!(p->mask & 1u << at) || !node || p->count == MAX_NODES) return;
    /* The template is read-only to the writer; the harness edits its tree
     * and restores it after each write. */
    p->node[p->count] = (pickle_value *)node;
    p->saved[p->count] = *node;
    p->count++;
    *(pickle_value *)node = *value;
}

static int put_at(places *p, unsigned mask, const pickle_value *value)
{
    memset(p, 0, sizeof *p);
    p->mask = mask;
    const megatron_checkpoint *t = fuzz_write.template;
    const pickle_value *args = megatron_args(t)->object.state;
    place(p, AT_ARGS, args->dict.values.items[args->dict.values.count - 1], value);
    const pickle_value *optimizer = megatron_rank_value(t, 0, 0, "optimizer");
    const pickle_value *groups = pickle_get(pickle_get(optimizer, "optimizer"), "param_groups");
    for (int64_t g = 0; groups && g < groups->items.count; g++)
        place(p, AT_EPS, pickle_get(groups->items.items[g], "eps"), value);
    place(p, AT_GRAD_SCALER, pickle_get(optimizer, "grad_scaler"), value);
    place(p, AT_SCHEDULER, megatron_rank_value(t, 0, 0, "opt_param_scheduler"), value);
    place(p, AT_RNG, megatron_rank_value(t, 0, 0, "rng_state"), value);
    place(p, AT_RERUN, megatron_rank_value(t, 0, 0, "rerun_state_machine"), value);
    if (!(mask & 1u << AT_STATE0)) return 0;
    /* state[0]["fuzz"] = value, in arrays of the harness's. */
    p->state0 = pickle_get(pickle_get(optimizer, "optimizer"), "state")->dict.values.items[0];
    p->keys = p->state0->dict.keys;
    p->values = p->state0->dict.values;
    int64_t n = p->keys.count;
    pickle_value **keys = malloc((size_t)(n + 1) * sizeof *keys), **values = malloc((size_t)(n + 1) * sizeof *values);
    if (!keys || !values) {
        free(keys);
        free(values);
        return -1;
    }
    memcpy(keys, p->keys.items, (size_t)n * sizeof *keys);
    memcpy(values, p->values.items, (size_t)n * sizeof *values);
    p->key = (pickle_value){.kind = PICKLE_STRING, .text = {"fuzz", 4}};
    keys[n] = &p->key;
    values[n] = (pickle_value *)value;
    p->state0->dict.keys = (pickle_items){keys, n + 1, n + 1};
    p->state0->dict.values = (pickle_items){values, n + 1, n + 1};
    return 0;
}

static void restore(places *p)
{
    if (p->state0) {
        free(p->state0->dict.keys.items);
        free(p->state0->dict.values.items);
        p->state0->dict.keys = p->keys;
        p->state0->dict.values = p->values;
    }
    for (int i = p->count - 1; i >= 0; i--) *p->node[i] = p->saved[i];
}

/* ---------------------------------------------------------- the judges */

/* Equal as values, down to 70 deep and for at most *budget comparisons
 * (a shared DAG compared by paths is exponential: past the budget, equal). */
static int same(const pickle_value *a, const pickle_value *b, int depth, long *budget)
{
    if (a == b || --*budget < 0 || depth > 70) return 1;
    if (!a || !b) return (a ? a : b)->kind == PICKLE_TUPLE && (a ? a : b)->items.count == 0;
    if (a->kind != b->kind) return 0;
    switch (a->kind) {
    case PICKLE_NONE: return 1;
    case PICKLE_BOOL:
    case PICKLE_INT: return a->integer == b->integer;
    case PICKLE_FLOAT: return memcmp(&a->real, &b->real, sizeof a->real) == 0;
    case PICKLE_STRING:
    case PICKLE_BYTES:
    case PICKLE_BIGINT:
    case PICKLE_GLOBAL: return a->text.size == b->text.size && memcmp(a->text.data, b->text.data, (size_t)a->text.size) == 0;
    case PICKLE_TUPLE:
    case PICKLE_LIST:
    case PICKLE_SET:
        if (a->items.count != b->items.count) return 0;
        for (int64_t i = 0; i < a->items.count; i++)
            if (!same(a->items.items[i], b->items.items[i], depth + 1, budget)) return 0;
        return 1;
    case PICKLE_DICT:
        if (a->dict.keys.count != b->dict.keys.count) return 0;
        for (int64_t i = 0; i < a->dict.keys.count; i++)
            if (!same(a->dict.keys.items[i], b->dict.keys.items[i], depth + 1, budget) ||
                !same(a->dict.values.items[i], b->dict.values.items[i], depth + 1, budget))
                return 0;
        return 1;
    case PICKLE_OBJECT:
        return !strcmp(a->object.cls, b->object.cls) && a->object.newobj == b->object.newobj &&
               same(a->object.args, b->object.args, depth + 1, budget) &&
               (!a->object.state == !b->object.state) &&
               (!a->object.state || same(a->object.state, b->object.state, depth + 1, budget)) &&
               !a->object.items && !b->object.items && !a->object.list && !b->object.list;
    case PICKLE_TENSOR:
        if (a->tensor->storage->storage.dtype != b->tensor->storage->storage.dtype || a->tensor->ndim != b->tensor->ndim) return 0;
        return memcmp(a->tensor->shape, b->tensor->shape, (size_t)a->tensor->ndim * sizeof *a->tensor->shape) == 0;
    default: return 0;
    }
}

/* The globals a written file may name, listed again here (not taken from
 * the writer, so that a change there is judged). */
static int allowed(const char *name)
{
    static const char *const names[] = {
        "argparse.Namespace", "torch.device", "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct",
        "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar", "numpy.dtype", "numpy.ndarray", "_io.BytesIO",
        "megatron.core.enums.ModelType", "megatron.core.transformer.enums.AttnBackend",
        "megatron.core.rerun_state_machine.RerunMode", "megatron.core.rerun_state_machine.RerunState",
        "megatron.core.rerun_state_machine.RerunDiagnostic", "builtins.getattr",
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(name, names[i])) return 1;
    return !strncmp(name, "torch.", 6) && !strchr(name + 6, '.'); /* a dtype */
}

#define SEEN_SLOTS (1 << 16)

/* Every global named in v (each container entered once, up to SEEN_SLOTS). */
static int only_allowed(const pickle_value *v, const pickle_value **seen, int depth)
{
    if (depth > 70) return 1;
    if (v->kind == PICKLE_GLOBAL) return allowed(v->text.data);
    int container = v->kind == PICKLE_TUPLE || v->kind == PICKLE_LIST || v->kind == PICKLE_SET ||
                    v->kind == PICKLE_DICT || v->kind == PICKLE_OBJECT;
    if (!container) return 1;
    size_t i = ((uintptr_t)v >> 4) & (SEEN_SLOTS - 1), probes = 0;
    while (seen[i] && seen[i] != v && probes++ < SEEN_SLOTS) i = (i + 1) & (SEEN_SLOTS - 1);
    if (seen[i] == v || probes >= SEEN_SLOTS) return 1;
    seen[i] = v;
    if (v->kind == PICKLE_OBJECT) {
        if (!allowed(v->object.cls)) return 0;
        const pickle_value *parts[] = {v->object.args, v->object.state, v->object.items, v->object.list};
        for (int k = 0; k < 4; k++)
            if (parts[k] && !only_allowed(parts[k], seen, depth + 1)) return 0;
        return 1;
    }
    const pickle_items *lists[2] = {v->kind == PICKLE_DICT ? &v->dict.keys : &v->items,
                                    v->kind == PICKLE_DICT ? &v->dict.values : NULL};
    for (int k = 0; k < 2; k++)
        for (int64_t j = 0; lists[k] && j < lists[k]->count; j++)
            if (!only_allowed(lists[k]->items[j], seen, depth + 1)) return 0;
    return 1;
}

static int add_tensor_bytes(void *ctx, const char *path, const pickle_value *t)
{
    (void)path;
    int64_t *tensors = ctx; /* bytes, count */
    tensors[0] += torch_tensor_numel(t) * (int64_t)torch_dtype_size(t->tensor->storage->storage.dtype);
    tensors[1]++;
    return 0;
}

/* The written rank file read back: each place holds the input's value. */
static void judge(const pickle_value *value, unsigned mask)
{
    torch_archive *a = NULL;
    if (torch_archive_open(fuzz_write.written, NULL, &a) != 0) __builtin_trap(); /* unreadable output */
    const pickle_value *root = torch_archive_root(a), *optimizer = pickle_get(root, "optimizer");
    const pickle_value *args = pickle_get(root, "args")->object.state;
    const pickle_value *got[8];
    int n = 0;
    if (mask & 1u << AT_ARGS) got[n++] = args->dict.values.items[args->dict.values.count - 1];
    if (mask & 1u << AT_GRAD_SCALER) got[n++] = pickle_get(optimizer, "grad_scaler");
    if (mask & 1u << AT_SCHEDULER) got[n++] = pickle_get(root, "opt_param_scheduler");
    if (mask & 1u << AT_RNG) got[n++] = pickle_get(root, "rng_state");
    if (mask & 1u << AT_RERUN) got[n++] = pickle_get(root, "rerun_state_machine");
    const pickle_value *groups = pickle_get(pickle_get(optimizer, "optimizer"), "param_groups");
    for (int64_t g = 0; (mask & 1u << AT_EPS) && g < groups->items.count && n < 8; g++)
        got[n++] = pickle_get(groups->items.items[g], "eps");
    for (int i = 0; i < n; i++) {
        long budget = 100000;
        if (!got[i] || !same(value, got[i], 0, &budget)) __builtin_trap(); /* carried value differs */
    }
    const pickle_value *state = pickle_get(pickle_get(optimizer, "optimizer"), "state");
    for (int64_t k = 0; (mask & 1u << AT_STATE0) && k < state->dict.values.count; k++) {
        long budget = 100000;
        const pickle_value *copy = pickle_get(state->dict.values.items[k], "fuzz");
        if (!copy || !same(value, copy, 0, &budget)) __builtin_trap(); /* a parameter's copy differs */
    }
    const pickle_value **seen = calloc(SEEN_SLOTS, sizeof *seen);
    if (seen && !only_allowed(root, seen, 0)) __builtin_trap(); /* a global outside the allow-list was written */
    free(seen);
    torch_archive_close(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!fuzz_write.template) fuzz_write_init();
    if (size > (1 << 20)) return 0;
    pickle_limits limits;
    pickle_limits_init(&limits);
    limits.max_memory = 64 << 20;
    limits.max_memo = 1 << 16;
    limits.max_marks = 200;
    pickle_doc *doc = NULL;
    if (pickle_load(data, size, "fuzz.pkl", &limits, &doc) != 0) return 0;
    const pickle_value *value = pickle_root(doc);
    /* Tensors of the input read the base file's storages; their bytes go
     * along at every place: kept small, for the memory bound. */
    int64_t tensors[2] = {0, 0};
    if (pickle_walk_tensors(doc, value, add_tensor_bytes, tensors) != 0 || tensors[0] > (16 << 20)) {
        pickle_free(doc);
        return 0;
    }
    int64_t tensor_bytes = tensors[0];
    uint32_t hash = 2166136261u; /* FNV-1a: the same input, the same places */
    for (size_t i = 0; i < size; i++) hash = (hash ^ data[i]) * 16777619u;
    unsigned mask = hash % ((1u << NUM_PLACES) - 1) + 1;
    if (tensors[1] && (hash >> 28)) mask = (mask & ~PLAIN_DATA_PLACES) ? mask & ~PLAIN_DATA_PLACES : 1u << AT_RNG;
    places p;
    if (put_at(&p, mask, value) != 0) {
        pickle_free(doc);
        return 0;
    }
    /* Checked as the writer meets it: a place holds a copy of the root
     * (place), another object than the root itself, so that a root that
     * holds itself through a tuple, (L,) with L = [(L,)], becomes a copy
     * holding the root: a pickle writes that (the root, then the copy). */
    int refused = pk_value_check(p.count ? p.node[0] : value, "fuzz.pkl", "value", 1) != 0;
    int status = write_checkpoint();
    restore(&p);
    if (status == 0) {
        if (refused) __builtin_trap(); /* a value the check refuses was written */
        long bytes = written_bytes();
        int64_t copies = p.count + (mask & 1u << AT_STATE0 ? fuzz_write.params : 0);
        if (bytes < 0 || bytes > fuzz_write.base_bytes + (int64_t)(32 * size + (size_t)tensor_bytes) * copies + 65536)
            __builtin_trap(); /* out of proportion */
        judge(value, mask);
    }
    remove_tree(fuzz_write.out);
    pickle_free(doc);
    return 0;
}
