/* pickle.c: a data-only interpreter of Python's pickle opcodes (protocols
 * 2 to 5, and the few older ones Python still writes at protocol 2).
 *
 * The interpreter keeps Python's machine: a stack of values, a stack of
 * MARK positions and a memo indexed by the PUT opcodes. Where Python would
 * call a global (REDUCE, NEWOBJ, NEWOBJ_EX), it builds a value instead: the
 * globals torch.save writes for data are understood (tensors, storages,
 * OrderedDict, bytes, sets, Parameters); any other becomes an OBJECT that
 * records the call. Nothing is imported and nothing runs.
 *
 * Values are allocated from an arena charged against limits.max_memory,
 * with the stacks and the memo, so that no input takes memory out of
 * proportion: lengths are checked against the bytes left in the input
 * before anything is allocated for them. Containers are shared by
 * reference as in Python (BINGET of a list yields that list), so the tree
 * may hold cycles; pickle_walk_tensors marks what it entered. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "torch.h"

#define ARENA_BLOCK ((size_t)64 << 10)
#define WALK_MAX_DEPTH 64

typedef struct arena_block {
    struct arena_block *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
} arena_block;

struct pickle_doc {
    arena_block *blocks;
    int64_t charged, limit; /* bytes taken from the budget */
    const pickle_value *root;
    uint32_t walks;         /* walks so far, for pickle_value.walk_mark */
    const char *name;       /* of the pickle, for messages */
    size_t op_at;           /* the offset of the opcode being run */
};

void pickle_limits_init(pickle_limits *limits)
{
    limits->max_memory = (int64_t)512 << 20;
    limits->max_memo = (int64_t)1 << 22;
    limits->max_marks = 1000;
}

size_t torch_dtype_size(torch_dtype dtype)
{
    static const size_t sizes[] = {4, 8, 2, 2, 8, 4, 2, 1, 1, 1, 8, 16};
    return (unsigned)dtype < sizeof sizes / sizeof *sizes ? sizes[dtype] : 0;
}

int torch_dtype_to_tp(torch_dtype dtype, tp_dtype *out)
{
    switch (dtype) {
    case TORCH_FLOAT32: *out = TP_FP32; return 1;
    case TORCH_BFLOAT16: *out = TP_BF16; return 1;
    case TORCH_FLOAT16: *out = TP_FP16; return 1;
    default: return 0;
    }
}

torch_dtype torch_dtype_from_tp(tp_dtype dtype)
{
    return dtype == TP_BF16 ? TORCH_BFLOAT16 : dtype == TP_FP16 ? TORCH_FLOAT16 : TORCH_FLOAT32;
}

const char *torch_dtype_name(torch_dtype dtype)
{
    static const char *names[] = {"float32", "float64", "float16", "bfloat16", "int64",     "int32",
                                  "int16",   "int8",    "uint8",   "bool",     "complex64", "complex128"};
    return (unsigned)dtype < sizeof names / sizeof *names ? names[dtype] : "?";
}

const char *pickle_kind_name(pickle_kind kind)
{
    static const char *names[] = {"None", "bool",   "int",    "big int", "float",   "str",    "bytes", "tuple",
                                  "list", "set",    "dict",   "global",  "object",  "storage", "tensor"};
    return (unsigned)kind < sizeof names / sizeof *names ? names[kind] : "?";
}

/* ------------------------------------------------------------------ arena */

/* Charges bytes against the budget; fails naming the limit. */
static int charge(pickle_doc *doc, int64_t bytes)
{
    if (bytes < 0 || doc->charged > doc->limit - bytes)
        return tp_fail(TP_ERR_FORMAT, "%s: pickle at byte %zu: needs more than the limit of %lld bytes of memory",
                       doc->name, doc->op_at, (long long)doc->limit);
    doc->charged += bytes;
    return TP_OK;
}

static void *arena_alloc(pickle_doc *doc, size_t size)
{
    size = (size + 15) & ~(size_t)15;
    arena_block *b = doc->blocks;
    if (!b || b->size - b->used < size) {
        size_t want = size > ARENA_BLOCK ? size : ARENA_BLOCK;
        if (charge(doc, (int64_t)(want + sizeof *b))) return NULL;
        b = malloc(sizeof *b + want);
        if (!b) {
            tp_fail(TP_ERR_NOMEM, "out of memory");
            return NULL;
        }
        b->size = want;
        b->used = 0;
        b->next = doc->blocks;
        doc->blocks = b;
    }
    void *p = b->data + b->used;
    b->used += size;
    memset(p, 0, size);
    return p;
}

void pickle_free(pickle_doc *doc)
{
    if (!doc) return;
    for (arena_block *b = doc->blocks, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    free(doc);
}

const pickle_value *pickle_root(const pickle_doc *doc)
{
    return doc->root;
}

/* Growable arrays of the interpreter (stack, marks, memo, containers'
 * items) live outside the arena, charged as they grow, freed at the end
 * (the containers' by the arena copy made when they stop growing: see
 * items_push). */
static int grow(pickle_doc *doc, void **array, int64_t *capacity, int64_t need, size_t element)
{
    if (need <= *capacity) return TP_OK;
    int64_t next = *capacity ? *capacity : 8;
    while (next < need) next *= 2;
    TP_TRY(charge(doc, (next - *capacity) * (int64_t)element));
    void *bigger = realloc(*array, (size_t)next * element);
    if (!bigger) return tp_fail(TP_ERR_NOMEM, "out of memory");
    *array = bigger;
    *capacity = next;
    return TP_OK;
}

/* ------------------------------------------------------------------ values */

typedef struct {
    pickle_doc *doc;
    const unsigned char *data;
    size_t size, at, op_at; /* op_at: offset of the opcode being run */
    const char *name;
    pickle_limits limits;
    pickle_value **stack;
    int64_t depth, stack_capacity;
    int64_t *marks;
    int64_t num_marks, marks_capacity;
    pickle_value **memo;
    int64_t memo_capacity, memo_count; /* memo_count: indices set (Python's len(memo)) */
    /* Every container's item arrays, so that they can be freed. */
    pickle_items **containers;
    int64_t num_containers, containers_capacity;
    unsigned char op;
} machine;

static int fail_at(machine *m, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_at(machine *m, int status, const char *fmt, ...)
{
    char why[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(why, sizeof why, fmt, args);
    va_end(args);
    return tp_fail(status, "%s: pickle opcode 0x%02x at byte %zu: %s", m->name, m->op, m->op_at, why);
}

static pickle_value *new_value(machine *m, pickle_kind kind)
{
    pickle_value *v = arena_alloc(m->doc, sizeof *v);
    if (v) v->kind = kind;
    return v;
}

/* A copy of text in the arena, NUL-terminated. */
static const char *arena_text(machine *m, const void *text, size_t size)
{
    char *copy = arena_alloc(m->doc, size + 1);
    if (!copy) return NULL;
    memcpy(copy, text, size);
    copy[size] = 0;
    return copy;
}

static pickle_value *new_text(machine *m, pickle_kind kind, const void *text, size_t size)
{
    pickle_value *v = new_value(m, kind);
    if (!v || !(v->text.data = arena_text(m, text, size))) return NULL;
    v->text.size = (int64_t)size;
    return v;
}

static pickle_value *new_integer(machine *m, pickle_kind kind, int64_t integer)
{
    pickle_value *v = new_value(m, kind);
    if (v) v->integer = integer;
    return v;
}

/* Registers a container's arrays to be freed with the machine's. */
static int track(machine *m, pickle_items *items)
{
    TP_TRY(grow(m->doc, (void **)&m->containers, &m->containers_capacity, m->num_containers + 1,
                sizeof *m->containers));
    m->containers[m->num_containers++] = items;
    return TP_OK;
}

static pickle_value *new_container(machine *m, pickle_kind kind)
{
    pickle_value *v = new_value(m, kind);
    if (!v) return NULL;
    if (kind == PICKLE_DICT) {
        if (track(m, &v->dict.keys) || track(m, &v->dict.values)) return NULL;
    } else if (track(m, &v->items)) {
        return NULL;
    }
    return v;
}

static int items_push(machine *m, pickle_items *items, pickle_value *value)
{
    TP_TRY(grow(m->doc, (void **)&items->items, &items->capacity, items->count + 1, sizeof *items->items));
    items->items[items->count++] = value;
    return TP_OK;
}

/* Pairs are kept in the order set; a key set twice is kept twice and
 * pickle_get finds the last, the value Python's dict would hold. (A scan
 * for the old key would make hostile input quadratic.) */
static int dict_set(machine *m, pickle_value *dict, pickle_value *key, pickle_value *value)
{
    TP_TRY(items_push(m, &dict->dict.keys, key));
    return items_push(m, &dict->dict.values, value);
}

/* ------------------------------------------------------------------ input */

static int need(machine *m, size_t n)
{
    if (m->size - m->at < n)
        return fail_at(m, TP_ERR_FORMAT, "needs %zu more bytes, %zu left (truncated)", n, m->size - m->at);
    return TP_OK;
}

static uint64_t read_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* A length prefix of n bytes, checked against what is left. */
static int read_length(machine *m, int n, size_t *out)
{
    TP_TRY(need(m, (size_t)n));
    uint64_t length = read_le(m->data + m->at, n);
    m->at += (size_t)n;
    if (length > m->size - m->at)
        return fail_at(m, TP_ERR_FORMAT, "a length of %llu bytes, %zu left (truncated or hostile)",
                       (unsigned long long)length, m->size - m->at);
    *out = (size_t)length;
    return TP_OK;
}

/* A text line (GLOBAL's module and name, INT, GET/PUT), without its '\n'. */
static int read_line(machine *m, const char **text, size_t *size)
{
    const unsigned char *start = m->data + m->at;
    const unsigned char *end = memchr(start, '\n', m->size - m->at);
    if (!end) return fail_at(m, TP_ERR_FORMAT, "a text argument without its newline (truncated)");
    *text = (const char *)start;
    *size = (size_t)(end - start);
    m->at += *size + 1;
    return TP_OK;
}

/* A decimal line as Python's INT, GET and PUT write it. */
static int read_decimal(machine *m, int64_t *out)
{
    const char *text;
    size_t size;
    TP_TRY(read_line(m, &text, &size));
    char digits[32];
    if (size == 0 || size >= sizeof digits) return fail_at(m, TP_ERR_FORMAT, "a decimal argument of %zu characters", size);
    memcpy(digits, text, size);
    digits[size] = 0;
    char *end;
    long long v = strtoll(digits, &end, 10);
    if (*end) return fail_at(m, TP_ERR_FORMAT, "'%s' is not a decimal integer", digits);
    *out = v;
    return TP_OK;
}

/* ------------------------------------------------------------------ stacks */

/* The failure of an allocation from the arena (past the memory limit, or
 * out of memory), its message naming the pickle and the opcode's offset. */
static int allocation_failed(const machine *m)
{
    return tp_fail_context(TP_ERR_FORMAT, "%s: pickle at byte %zu", m->name, m->op_at);
}

/* Pushes v; a NULL v is an allocation that failed. */
static int push(machine *m, pickle_value *v)
{
    if (!v) return allocation_failed(m);
    TP_TRY(grow(m->doc, (void **)&m->stack, &m->stack_capacity, m->depth + 1, sizeof *m->stack));
    m->stack[m->depth++] = v;
    return TP_OK;
}

/* The stack's base: the last MARK, or 0. Values below it belong to an
 * outer construction and may not be popped. */
static int64_t base(const machine *m)
{
    return m->num_marks ? m->marks[m->num_marks - 1] : 0;
}

static int pop(machine *m, pickle_value **out)
{
    if (m->depth <= base(m)) return fail_at(m, TP_ERR_FORMAT, "pops an empty stack");
    *out = m->stack[--m->depth];
    return TP_OK;
}

static int top(machine *m, pickle_value **out)
{
    if (m->depth <= base(m)) return fail_at(m, TP_ERR_FORMAT, "needs a value on an empty stack");
    *out = m->stack[m->depth - 1];
    return TP_OK;
}

/* Pops everything above the last MARK, and the MARK: items [*first, depth). */
static int pop_mark(machine *m, int64_t *first)
{
    if (!m->num_marks) return fail_at(m, TP_ERR_FORMAT, "needs a MARK and there is none");
    *first = m->marks[--m->num_marks];
    return TP_OK;
}

static int memo_put(machine *m, int64_t index, pickle_value *v)
{
    if (index < 0 || index >= m->limits.max_memo)
        return fail_at(m, TP_ERR_FORMAT, "memo index %lld beyond the limit of %lld", (long long)index,
                       (long long)m->limits.max_memo);
    int64_t old = m->memo_capacity;
    TP_TRY(grow(m->doc, (void **)&m->memo, &m->memo_capacity, index + 1, sizeof *m->memo));
    if (m->memo_capacity > old) memset(m->memo + old, 0, (size_t)(m->memo_capacity - old) * sizeof *m->memo);
    if (!m->memo[index]) m->memo_count++;
    m->memo[index] = v;
    return TP_OK;
}

static int memo_get(machine *m, int64_t index)
{
    if (index < 0 || index >= m->memo_capacity || !m->memo[index])
        return fail_at(m, TP_ERR_FORMAT, "memo index %lld was never stored", (long long)index);
    return push(m, m->memo[index]);
}

static pickle_value *tuple_of(machine *m, pickle_value **items, int64_t count)
{
    pickle_value *t = new_container(m, PICKLE_TUPLE);
    for (int64_t i = 0; t && i < count; i++)
        if (items_push(m, &t->items, items[i])) return NULL;
    return t;
}

/* ------------------------------------------------------------ torch's calls */

static int is_integer(const pickle_value *v)
{
    return v->kind == PICKLE_INT || v->kind == PICKLE_BOOL;
}

static int is_sequence(const pickle_value *v)
{
    return v->kind == PICKLE_TUPLE || v->kind == PICKLE_LIST;
}

static const struct {
    const char *cls;
    torch_dtype dtype;
} storage_classes[] = {
    {"torch.FloatStorage", TORCH_FLOAT32},       {"torch.DoubleStorage", TORCH_FLOAT64},
    {"torch.HalfStorage", TORCH_FLOAT16},        {"torch.BFloat16Storage", TORCH_BFLOAT16},
    {"torch.LongStorage", TORCH_INT64},          {"torch.IntStorage", TORCH_INT32},
    {"torch.ShortStorage", TORCH_INT16},         {"torch.CharStorage", TORCH_INT8},
    {"torch.ByteStorage", TORCH_UINT8},          {"torch.BoolStorage", TORCH_BOOL},
    {"torch.ComplexFloatStorage", TORCH_COMPLEX64}, {"torch.ComplexDoubleStorage", TORCH_COMPLEX128},
    {"torch.UntypedStorage", TORCH_UINT8},
};

/* BINPERSID's id: ('storage', storage class, key, location, numel). */
static int persistent_load(machine *m, pickle_value *pid, pickle_value **out)
{
    if (pid->kind != PICKLE_TUPLE || pid->items.count != 5 || !pickle_is_string(pid->items.items[0], "storage"))
        return fail_at(m, TP_ERR_FORMAT, "a persistent id that is not ('storage', class, key, location, numel)");
    pickle_value **f = pid->items.items;
    if (f[1]->kind != PICKLE_GLOBAL || f[2]->kind != PICKLE_STRING || f[3]->kind != PICKLE_STRING ||
        f[4]->kind != PICKLE_INT || f[4]->integer < 0)
        return fail_at(m, TP_ERR_FORMAT, "a storage's persistent id of other types than (global, str, str, int >= 0)");
    int found = -1;
    for (size_t i = 0; i < sizeof storage_classes / sizeof *storage_classes; i++)
        if (strcmp(f[1]->text.data, storage_classes[i].cls) == 0) found = (int)i;
    if (found < 0) return fail_at(m, TP_ERR_FORMAT, "storage of unknown class %s", f[1]->text.data);
    if (f[2]->text.size == 0 || memchr(f[2]->text.data, '/', (size_t)f[2]->text.size) ||
        strlen(f[2]->text.data) != (size_t)f[2]->text.size)
        return fail_at(m, TP_ERR_FORMAT, "storage key '%s' is not a plain entry name", f[2]->text.data);
    pickle_value *s = new_value(m, PICKLE_STORAGE);
    if (!s) return allocation_failed(m);
    s->storage.key = f[2]->text.data;
    s->storage.location = f[3]->text.data;
    s->storage.dtype = storage_classes[found].dtype;
    s->storage.numel = f[4]->integer;
    if ((uint64_t)s->storage.numel > (UINT64_MAX >> 5) / torch_dtype_size(s->storage.dtype))
        return fail_at(m, TP_ERR_FORMAT, "storage %s of %lld elements", s->storage.key, (long long)s->storage.numel);
    *out = s;
    return TP_OK;
}

/* _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
 * backward_hooks[, metadata]) and _rebuild_tensor(storage, storage_offset,
 * size, stride). Shape and strides are checked against the storage. */
static int rebuild_tensor(machine *m, const pickle_value *args, pickle_value **out)
{
    if (args->kind != PICKLE_TUPLE || args->items.count < 4)
        return fail_at(m, TP_ERR_FORMAT, "a tensor rebuilt from other than (storage, offset, size, stride, ...)");
    pickle_value **a = args->items.items;
    if (a[0]->kind != PICKLE_STORAGE || a[1]->kind != PICKLE_INT || !is_sequence(a[2]) || !is_sequence(a[3]))
        return fail_at(m, TP_ERR_FORMAT, "a tensor rebuilt from (%s, %s, %s, %s), not (storage, int, tuple, tuple)",
                       pickle_kind_name(a[0]->kind), pickle_kind_name(a[1]->kind), pickle_kind_name(a[2]->kind),
                       pickle_kind_name(a[3]->kind));
    const pickle_value *storage = a[0];
    int64_t ndim = a[2]->items.count;
    if (ndim > TORCH_MAX_DIMS || a[3]->items.count != ndim)
        return fail_at(m, TP_ERR_FORMAT, "a tensor of %lld dimensions and %lld strides (at most %d)", (long long)ndim,
                       (long long)a[3]->items.count, TORCH_MAX_DIMS);
    pickle_value *t = new_value(m, PICKLE_TENSOR);
    pickle_tensor *view = t ? arena_alloc(m->doc, sizeof *view) : NULL;
    if (!view) return allocation_failed(m);
    t->tensor = view;
    view->storage = storage;
    view->offset = a[1]->integer;
    view->ndim = (int)ndim;
    if (t->tensor->offset < 0) return fail_at(m, TP_ERR_FORMAT, "tensor storage offset %lld", (long long)t->tensor->offset);
    int empty = 0;
    for (int d = 0; d < ndim; d++) {
        const pickle_value *size = a[2]->items.items[d], *stride = a[3]->items.items[d];
        if (size->kind != PICKLE_INT || stride->kind != PICKLE_INT || size->integer < 0 || stride->integer < 0)
            return fail_at(m, TP_ERR_FORMAT, "tensor dimension %d: size and stride must be integers >= 0", d);
        view->shape[d] = size->integer;
        view->stride[d] = stride->integer;
        if (size->integer == 0) empty = 1;
    }
    /* The last element's index, offset + sum (shape - 1) * stride, must lie
     * in the storage; each term is bounded first so that nothing overflows. */
    uint64_t last = (uint64_t)t->tensor->offset, limit = (uint64_t)storage->storage.numel;
    for (int d = 0; d < ndim && !empty; d++) {
        uint64_t span = (uint64_t)(t->tensor->shape[d] - 1), stride = (uint64_t)t->tensor->stride[d];
        if (stride && span > (limit + 1) / stride) goto outside;
        last += span * stride;
        if (last >= limit) goto outside;
    }
    if (!empty && last >= limit) goto outside;
    *out = t;
    return TP_OK;
outside:
    return fail_at(m, TP_ERR_FORMAT, "a tensor reaching past the %lld elements of storage %s",
                   (long long)storage->storage.numel, storage->storage.key);
}

/* latin-1 encoding of a str, as _codecs.encode(text, 'latin1') gives bytes
 * at protocol 2: every code point below 256 is one byte. */
static int latin1_bytes(machine *m, const pickle_value *text, pickle_value **out)
{
    const unsigned char *s = (const unsigned char *)text->text.data;
    int64_t n = text->text.size, size = 0;
    unsigned char *bytes = arena_alloc(m->doc, (size_t)n + 1);
    if (!bytes) return allocation_failed(m);
    for (int64_t i = 0; i < n; i++) {
        if (s[i] < 0x80) {
            bytes[size++] = s[i];
        } else if ((s[i] == 0xc2 || s[i] == 0xc3) && i + 1 < n && (s[i + 1] & 0xc0) == 0x80) {
            bytes[size++] = (unsigned char)((s[i] & 0x03) << 6 | (s[i + 1] & 0x3f));
            i++;
        } else {
            return fail_at(m, TP_ERR_FORMAT, "_codecs.encode of a str beyond latin-1");
        }
    }
    pickle_value *v = new_value(m, PICKLE_BYTES);
    if (!v) return allocation_failed(m);
    v->text.data = (const char *)bytes;
    v->text.size = size;
    *out = v;
    return TP_OK;
}

/* A set, or a dict from a sequence of (key, value) pairs. */
static int container_from(machine *m, pickle_kind kind, const pickle_value *source, pickle_value **out)
{
    pickle_value *c = new_container(m, kind);
    if (!c) return allocation_failed(m);
    if (source && !is_sequence(source) && source->kind != PICKLE_SET)
        return fail_at(m, TP_ERR_FORMAT, "a %s made from a %s", pickle_kind_name(kind), pickle_kind_name(source->kind));
    for (int64_t i = 0; source && i < source->items.count; i++) {
        pickle_value *item = source->items.items[i];
        if (kind == PICKLE_SET) {
            TP_TRY(items_push(m, &c->items, item));
        } else {
            if (item->kind != PICKLE_TUPLE || item->items.count != 2)
                return fail_at(m, TP_ERR_FORMAT, "a dict made from a sequence of other than pairs");
            TP_TRY(dict_set(m, c, item->items.items[0], item->items.items[1]));
        }
    }
    *out = c;
    return TP_OK;
}

/* What calling `callable` with `args` (a tuple) gives, as a value: torch's
 * data globals are understood, any other call is recorded as an OBJECT. */
static int call(machine *m, pickle_value *callable, pickle_value *args, int depth, pickle_value **out)
{
    if (args->kind != PICKLE_TUPLE) return fail_at(m, TP_ERR_FORMAT, "a call with %s arguments", pickle_kind_name(args->kind));
    const char *name = callable->kind == PICKLE_GLOBAL ? callable->text.data : NULL;
    int64_t n = args->items.count;
    pickle_value **a = args->items.items;
    if (name) {
        if (!strcmp(name, "torch._utils._rebuild_tensor_v2") || !strcmp(name, "torch._utils._rebuild_tensor"))
            return rebuild_tensor(m, args, out);
        /* _rebuild_parameter(data, requires_grad, backward_hooks[, state]): the data. */
        if ((!strcmp(name, "torch._utils._rebuild_parameter") ||
             !strcmp(name, "torch._utils._rebuild_parameter_with_state")) && n >= 1 && a[0]->kind == PICKLE_TENSOR) {
            *out = a[0];
            return TP_OK;
        }
        /* _rebuild_from_type_v2(func, new_type, args, state): func(*args) as
         * a tensor of type new_type (a Parameter or a subclass). */
        if (!strcmp(name, "torch._tensor._rebuild_from_type_v2") && n >= 3) {
            if (depth > 4) return fail_at(m, TP_ERR_FORMAT, "_rebuild_from_type_v2 nested more than 4 deep");
            return call(m, a[0], a[2], depth + 1, out);
        }
        if (!strcmp(name, "collections.OrderedDict") || !strcmp(name, "builtins.dict") ||
            !strcmp(name, "__builtin__.dict"))
            return container_from(m, PICKLE_DICT, n ? a[0] : NULL, out);
        if (!strcmp(name, "builtins.set") || !strcmp(name, "builtins.frozenset") || !strcmp(name, "__builtin__.set") ||
            !strcmp(name, "__builtin__.frozenset"))
            return container_from(m, PICKLE_SET, n ? a[0] : NULL, out);
        if ((!strcmp(name, "_codecs.encode")) && n == 2 && a[0]->kind == PICKLE_STRING &&
            (pickle_is_string(a[1], "latin1") || pickle_is_string(a[1], "latin-1")))
            return latin1_bytes(m, a[0], out);
        if (!strcmp(name, "torch.Size") && n == 1 && is_sequence(a[0])) {
            *out = tuple_of(m, a[0]->items.items, a[0]->items.count);
            return *out ? TP_OK : push(m, NULL);
        }
        /* copyreg._reconstructor(cls, base, state): an instance of cls. */
        if (!strcmp(name, "copyreg._reconstructor") && n >= 1 && a[0]->kind == PICKLE_GLOBAL) name = a[0]->text.data;
    }
    pickle_value *o = new_value(m, PICKLE_OBJECT);
    if (!o) return allocation_failed(m);
    o->object.cls = name ? name : "(a call of a computed value)";
    o->object.args = args;
    *out = o;
    return TP_OK;
}

/* ------------------------------------------------------------ the machine */

static int op_setitems(machine *m, pickle_value *target, int64_t first)
{
    if ((m->depth - first) % 2) return fail_at(m, TP_ERR_FORMAT, "SETITEMS with an odd number of values");
    if (target->kind == PICKLE_OBJECT) {
        if (!target->object.items && !(target->object.items = new_container(m, PICKLE_DICT))) return allocation_failed(m);
        target = target->object.items;
    }
    if (target->kind != PICKLE_DICT) return fail_at(m, TP_ERR_FORMAT, "sets items of a %s", pickle_kind_name(target->kind));
    for (int64_t i = first; i < m->depth; i += 2) TP_TRY(dict_set(m, target, m->stack[i], m->stack[i + 1]));
    m->depth = first;
    return TP_OK;
}

static int op_appends(machine *m, pickle_value *target, int64_t first, int set)
{
    if (target->kind == PICKLE_OBJECT && !set) {
        if (!target->object.list && !(target->object.list = new_container(m, PICKLE_LIST))) return allocation_failed(m);
        target = target->object.list;
    }
    if (target->kind != (set ? PICKLE_SET : PICKLE_LIST))
        return fail_at(m, TP_ERR_FORMAT, "%s to a %s", set ? "adds items" : "appends", pickle_kind_name(target->kind));
    for (int64_t i = first; i < m->depth; i++) TP_TRY(items_push(m, &target->items, m->stack[i]));
    m->depth = first;
    return TP_OK;
}

/* The target of APPEND(S)/SETITEM(S)/ADDITEMS: the value below `first`. */
static int target_below(machine *m, int64_t first, pickle_value **out)
{
    if (first <= base(m)) return fail_at(m, TP_ERR_FORMAT, "has no container to add to");
    *out = m->stack[first - 1];
    return TP_OK;
}

static int op_global(machine *m, const char *module, size_t module_size, const char *name, size_t name_size)
{
    if (module_size == 0 || name_size == 0 || module_size + name_size > 512)
        return fail_at(m, TP_ERR_FORMAT, "a global named by %zu and %zu characters", module_size, name_size);
    if (memchr(module, 0, module_size) || memchr(name, 0, name_size))
        return fail_at(m, TP_ERR_FORMAT, "a global whose name holds a NUL");
    char full[520];
    snprintf(full, sizeof full, "%.*s.%.*s", (int)module_size, module, (int)name_size, name);
    /* Python 2's module names, as protocol-2 pickles of Python 3 keep them. */
    if (!strncmp(full, "__builtin__.", 12)) {
        char mapped[530];
        snprintf(mapped, sizeof mapped, "builtins.%s", full + 12);
        return push(m, new_text(m, PICKLE_GLOBAL, mapped, strlen(mapped)));
    }
    return push(m, new_text(m, PICKLE_GLOBAL, full, strlen(full)));
}

static int step(machine *m, int *stopped)
{
    m->op_at = m->doc->op_at = m->at;
    TP_TRY(need(m, 1));
    m->op = m->data[m->at++];
    pickle_value *a = NULL, *b = NULL, *c = NULL;
    int64_t first = 0;
    size_t n = 0;
    switch (m->op) {
    case 0x80: /* PROTO */
        TP_TRY(need(m, 1));
        if (m->data[m->at] > 5) return fail_at(m, TP_ERR_VERSION, "pickle protocol %d (at most 5 is known)", m->data[m->at]);
        m->at++;
        return TP_OK;
    case 0x95: /* FRAME: a length that only groups opcodes */
        TP_TRY(need(m, 8));
        m->at += 8;
        return TP_OK;
    case '.': /* STOP */
        *stopped = 1;
        return TP_OK;
    case '(': /* MARK */
        if (m->num_marks >= m->limits.max_marks)
            return fail_at(m, TP_ERR_FORMAT, "more than %d MARKs open (nested too deep)", m->limits.max_marks);
        TP_TRY(grow(m->doc, (void **)&m->marks, &m->marks_capacity, m->num_marks + 1, sizeof *m->marks));
        m->marks[m->num_marks++] = m->depth;
        return TP_OK;
    case '0': /* POP */
        if (m->depth == base(m) && m->num_marks) { /* Python pops the mark itself */
            m->num_marks--;
            return TP_OK;
        }
        return pop(m, &a);
    case '1': /* POP_MARK */
        TP_TRY(pop_mark(m, &first));
        m->depth = first;
        return TP_OK;
    case '2': /* DUP */
        TP_TRY(top(m, &a));
        return push(m, a);
    case 'N': return push(m, new_value(m, PICKLE_NONE));
    case 0x88: return push(m, new_integer(m, PICKLE_BOOL, 1)); /* NEWTRUE */
    case 0x89: return push(m, new_integer(m, PICKLE_BOOL, 0)); /* NEWFALSE */
    case 'J': /* BININT */
        TP_TRY(need(m, 4));
        m->at += 4;
        return push(m, new_integer(m, PICKLE_INT, (int32_t)(uint32_t)read_le(m->data + m->at - 4, 4)));
    case 'K': /* BININT1 */
        TP_TRY(need(m, 1));
        return push(m, new_integer(m, PICKLE_INT, m->data[m->at++]));
    case 'M': /* BININT2 */
        TP_TRY(need(m, 2));
        m->at += 2;
        return push(m, new_integer(m, PICKLE_INT, (int64_t)read_le(m->data + m->at - 2, 2)));
    case 'I': { /* INT: decimal; "01"/"00" are True/False */
        const char *text;
        TP_TRY(read_line(m, &text, &n));
        if (n == 2 && text[0] == '0' && (text[1] == '0' || text[1] == '1'))
            return push(m, new_integer(m, PICKLE_BOOL, text[1] == '1'));
        m->at -= n + 1;
        int64_t v;
        TP_TRY(read_decimal(m, &v));
        return push(m, new_integer(m, PICKLE_INT, v));
    }
    case 0x8a: /* LONG1 */
    case 0x8b: /* LONG4 */
        TP_TRY(read_length(m, m->op == 0x8a ? 1 : 4, &n));
        if (n <= 8) {
            uint64_t v = read_le(m->data + m->at, (int)n);
            if (n > 0 && n < 8 && (m->data[m->at + n - 1] & 0x80)) v |= ~(uint64_t)0 << (8 * n); /* sign */
            m->at += n;
            return push(m, new_integer(m, PICKLE_INT, (int64_t)v));
        }
        m->at += n;
        return push(m, new_text(m, PICKLE_BIGINT, m->data + m->at - n, n));
    case 'G': { /* BINFLOAT: big-endian double */
        TP_TRY(need(m, 8));
        uint64_t bits = 0;
        for (int i = 0; i < 8; i++) bits = bits << 8 | m->data[m->at + i];
        m->at += 8;
        pickle_value *v = new_value(m, PICKLE_FLOAT);
        if (v) memcpy(&v->real, &bits, 8);
        return push(m, v);
    }
    case 'X': /* BINUNICODE */
    case 0x8c: /* SHORT_BINUNICODE */
    case 0x8d: /* BINUNICODE8 */
        TP_TRY(read_length(m, m->op == 'X' ? 4 : m->op == 0x8c ? 1 : 8, &n));
        m->at += n;
        return push(m, new_text(m, PICKLE_STRING, m->data + m->at - n, n));
    case 'B': /* BINBYTES */
    case 'C': /* SHORT_BINBYTES */
    case 0x8e: /* BINBYTES8 */
    case 0x96: /* BYTEARRAY8 */
    case 'T': /* BINSTRING: Python 2 str, read as bytes */
    case 'U': /* SHORT_BINSTRING */
        TP_TRY(read_length(m, m->op == 'C' || m->op == 'U' ? 1 : m->op == 'B' || m->op == 'T' ? 4 : 8, &n));
        m->at += n;
        return push(m, new_text(m, PICKLE_BYTES, m->data + m->at - n, n));
    case 0x98: /* READONLY_BUFFER */
        return top(m, &a);
    case 0x97: /* NEXT_BUFFER */
        return fail_at(m, TP_ERR_FORMAT, "an out-of-band buffer (protocol 5), which a file cannot hold");
    case ')': return push(m, new_container(m, PICKLE_TUPLE)); /* EMPTY_TUPLE */
    case ']': return push(m, new_container(m, PICKLE_LIST));  /* EMPTY_LIST */
    case '}': return push(m, new_container(m, PICKLE_DICT));  /* EMPTY_DICT */
    case 0x8f: return push(m, new_container(m, PICKLE_SET));  /* EMPTY_SET */
    case 0x85: /* TUPLE1 */
    case 0x86: /* TUPLE2 */
    case 0x87: { /* TUPLE3 */
        int64_t k = m->op - 0x84;
        if (m->depth - base(m) < k) return fail_at(m, TP_ERR_FORMAT, "makes a tuple of %lld from fewer values", (long long)k);
        pickle_value *t = tuple_of(m, m->stack + m->depth - k, k);
        m->depth -= k;
        return push(m, t);
    }
    case 't': /* TUPLE */
    case 'l': /* LIST */
    case 0x91: { /* FROZENSET */
        TP_TRY(pop_mark(m, &first));
        pickle_value *t = new_container(m, m->op == 't' ? PICKLE_TUPLE : m->op == 'l' ? PICKLE_LIST : PICKLE_SET);
        for (int64_t i = first; t && i < m->depth; i++)
            if (items_push(m, &t->items, m->stack[i])) return allocation_failed(m);
        m->depth = first;
        return push(m, t);
    }
    case 'd': { /* DICT: the pairs above the MARK */
        TP_TRY(pop_mark(m, &first));
        if ((m->depth - first) % 2) return fail_at(m, TP_ERR_FORMAT, "DICT with an odd number of values");
        pickle_value *d = new_container(m, PICKLE_DICT);
        for (int64_t i = first; d && i < m->depth; i += 2)
            if (dict_set(m, d, m->stack[i], m->stack[i + 1])) return allocation_failed(m);
        m->depth = first;
        return push(m, d);
    }
    case 'a': /* APPEND */
        TP_TRY(pop(m, &a));
        TP_TRY(top(m, &b));
        first = m->depth;
        TP_TRY(push(m, a));
        return op_appends(m, b, first, 0);
    case 'e': /* APPENDS */
    case 0x90: /* ADDITEMS */
        TP_TRY(pop_mark(m, &first));
        TP_TRY(target_below(m, first, &b));
        return op_appends(m, b, first, m->op == 0x90);
    case 's': /* SETITEM */
        if (m->depth - base(m) < 3) return fail_at(m, TP_ERR_FORMAT, "SETITEM with fewer than 3 values");
        return op_setitems(m, m->stack[m->depth - 3], m->depth - 2);
    case 'u': /* SETITEMS */
        TP_TRY(pop_mark(m, &first));
        TP_TRY(target_below(m, first, &b));
        return op_setitems(m, b, first);
    case 'c': { /* GLOBAL: module\nname\n */
        const char *module, *name;
        size_t module_size, name_size;
        TP_TRY(read_line(m, &module, &module_size));
        TP_TRY(read_line(m, &name, &name_size));
        return op_global(m, module, module_size, name, name_size);
    }
    case 0x93: /* STACK_GLOBAL */
        TP_TRY(pop(m, &b));
        TP_TRY(pop(m, &a));
        if (a->kind != PICKLE_STRING || b->kind != PICKLE_STRING)
            return fail_at(m, TP_ERR_FORMAT, "STACK_GLOBAL of a %s and a %s", pickle_kind_name(a->kind), pickle_kind_name(b->kind));
        return op_global(m, a->text.data, (size_t)a->text.size, b->text.data, (size_t)b->text.size);
    case 'Q': /* BINPERSID */
        TP_TRY(pop(m, &a));
        TP_TRY(persistent_load(m, a, &b));
        return push(m, b);
    case 'R': /* REDUCE: callable(*args) */
        TP_TRY(pop(m, &b));
        TP_TRY(pop(m, &a));
        TP_TRY(call(m, a, b, 0, &c));
        return push(m, c);
    case 0x81: /* NEWOBJ: cls.__new__(cls, *args) */
        TP_TRY(pop(m, &b));
        TP_TRY(pop(m, &a));
        TP_TRY(call(m, a, b, 0, &c));
        if (c->kind == PICKLE_OBJECT) c->object.newobj = 1;
        return push(m, c);
    case 0x92: /* NEWOBJ_EX: cls.__new__(cls, *args, **kwargs) */
        TP_TRY(pop(m, &c));
        TP_TRY(pop(m, &b));
        TP_TRY(pop(m, &a));
        TP_TRY(call(m, a, b, 0, &c));
        return push(m, c);
    case 'b': /* BUILD: state for the object below */
        TP_TRY(pop(m, &b));
        TP_TRY(top(m, &a));
        /* An OrderedDict's attributes (a state_dict's _metadata) and a
         * tensor's Python state are not data this reader needs. */
        if (a->kind == PICKLE_OBJECT) a->object.state = b;
        return TP_OK;
    case 'q': /* BINPUT */
        TP_TRY(need(m, 1));
        TP_TRY(top(m, &a));
        return memo_put(m, m->data[m->at++], a);
    case 'r': /* LONG_BINPUT */
        TP_TRY(need(m, 4));
        TP_TRY(top(m, &a));
        m->at += 4;
        return memo_put(m, (int64_t)read_le(m->data + m->at - 4, 4), a);
    case 0x94: /* MEMOIZE: at index len(memo) */
        TP_TRY(top(m, &a));
        return memo_put(m, m->memo_count, a);
    case 'p': { /* PUT */
        int64_t index;
        TP_TRY(read_decimal(m, &index));
        TP_TRY(top(m, &a));
        return memo_put(m, index, a);
    }
    case 'h': /* BINGET */
        TP_TRY(need(m, 1));
        return memo_get(m, m->data[m->at++]);
    case 'j': /* LONG_BINGET */
        TP_TRY(need(m, 4));
        m->at += 4;
        return memo_get(m, (int64_t)read_le(m->data + m->at - 4, 4));
    case 'g': { /* GET */
        int64_t index;
        TP_TRY(read_decimal(m, &index));
        return memo_get(m, index);
    }
    default:
        return fail_at(m, TP_ERR_FORMAT, "an opcode this reader does not interpret%s",
                       m->op == 0x82 || m->op == 0x83 || m->op == 0x84 ? " (an extension code)" :
                       strchr("FLSVPio", m->op) ? " (a protocol 0 opcode)" : "");
    }
}

int pickle_load(const void *data, size_t size, const char *name, const pickle_limits *limits, pickle_doc **out)
{
    *out = NULL;
    pickle_doc *doc = calloc(1, sizeof *doc);
    if (!doc) return tp_fail(TP_ERR_NOMEM, "out of memory");
    machine m = {.doc = doc, .data = data, .size = size, .name = name ? name : "pickle"};
    if (limits) m.limits = *limits;
    else pickle_limits_init(&m.limits);
    doc->limit = m.limits.max_memory;
    doc->name = m.name;
    int status = TP_OK, stopped = 0;
    while (!status && !stopped) status = step(&m, &stopped);
    if (!status && m.depth != 1)
        status = tp_fail(TP_ERR_FORMAT, "%s: pickle ends with %lld values on the stack, not 1", m.name, (long long)m.depth);
    if (!status) doc->root = m.stack[0];
    /* Containers' arrays move into the arena, so that the doc owns all. */
    for (int64_t i = 0; i < m.num_containers; i++) {
        pickle_items *items = m.containers[i];
        if (!status && items->count) {
            pickle_value **copy = arena_alloc(doc, (size_t)items->count * sizeof *copy);
            if (copy) memcpy(copy, items->items, (size_t)items->count * sizeof *copy);
            else status = tp_fail_context(TP_ERR_FORMAT, "%s", m.name);
            free(items->items);
            items->items = copy;
        } else {
            free(items->items);
            items->items = NULL;
        }
        items->capacity = items->count;
    }
    free(m.containers);
    free(m.stack);
    free(m.marks);
    free(m.memo);
    if (status) {
        pickle_free(doc);
        return status;
    }
    *out = doc;
    return TP_OK;
}

/* ------------------------------------------------------------------ lookups */

int pickle_is_string(const pickle_value *value, const char *text)
{
    return value && value->kind == PICKLE_STRING && (size_t)value->text.size == strlen(text) &&
           memcmp(value->text.data, text, (size_t)value->text.size) == 0;
}

const pickle_value *pickle_get(const pickle_value *value, const char *key)
{
    if (value && value->kind == PICKLE_OBJECT) value = value->object.state;
    if (!value || value->kind != PICKLE_DICT) return NULL;
    for (int64_t i = value->dict.keys.count - 1; i >= 0; i--)
        if (pickle_is_string(value->dict.keys.items[i], key)) return value->dict.values.items[i];
    return NULL;
}

const pickle_value *pickle_get_int(const pickle_value *value, int64_t key)
{
    if (!value || value->kind != PICKLE_DICT) return NULL;
    for (int64_t i = value->dict.keys.count - 1; i >= 0; i--) {
        const pickle_value *k = value->dict.keys.items[i];
        if (is_integer(k) && k->integer == key) return value->dict.values.items[i];
    }
    return NULL;
}

/* ------------------------------------------------------------------ walks */

typedef struct {
    uint32_t mark;
    char path[4096];
    int (*visit)(void *ctx, const char *path, const pickle_value *tensor);
    void *ctx;
} walk_state;

static int walk(walk_state *w, const pickle_value *v, size_t path_size, int depth);

/* Appends ".part" (or "part" at the root) to the path and walks v. */
static int walk_child(walk_state *w, const pickle_value *v, size_t path_size, int depth, const char *part, size_t part_size)
{
    size_t dot = path_size ? 1 : 0;
    if (path_size + dot + part_size + 1 > sizeof w->path)
        return tp_fail(TP_ERR_FORMAT, "a path of more than %zu characters: %.200s...", sizeof w->path, w->path);
    if (dot) w->path[path_size] = '.';
    memcpy(w->path + path_size + dot, part, part_size);
    w->path[path_size + dot + part_size] = 0;
    int status = walk(w, v, path_size + dot + part_size, depth + 1);
    w->path[path_size] = 0;
    return status;
}

static int walk(walk_state *w, const pickle_value *v, size_t path_size, int depth)
{
    if (v->kind == PICKLE_TENSOR) return w->visit(w->ctx, w->path, v);
    int container = v->kind == PICKLE_DICT || v->kind == PICKLE_LIST || v->kind == PICKLE_TUPLE ||
                    v->kind == PICKLE_SET || v->kind == PICKLE_OBJECT;
    if (!container || v->walk_mark == w->mark) return TP_OK;
    if (depth >= WALK_MAX_DEPTH)
        return tp_fail(TP_ERR_FORMAT, "nested more than %d deep at %.300s", WALK_MAX_DEPTH, w->path);
    ((pickle_value *)v)->walk_mark = w->mark;
    char index[32];
    if (v->kind == PICKLE_DICT) {
        for (int64_t i = 0; i < v->dict.keys.count; i++) {
            const pickle_value *k = v->dict.keys.items[i];
            if (k->kind == PICKLE_STRING) {
                TP_TRY(walk_child(w, v->dict.values.items[i], path_size, depth, k->text.data, strlen(k->text.data)));
            } else if (is_integer(k)) {
                int n = snprintf(index, sizeof index, "%lld", (long long)k->integer);
                TP_TRY(walk_child(w, v->dict.values.items[i], path_size, depth, index, (size_t)n));
            }
        }
    } else if (v->kind == PICKLE_OBJECT) {
        const pickle_value *parts[] = {v->object.state, v->object.items, v->object.list};
        for (int i = 0; i < 3; i++)
            if (parts[i]) TP_TRY(walk(w, parts[i], path_size, depth + 1));
    } else {
        for (int64_t i = 0; i < v->items.count; i++) {
            int n = snprintf(index, sizeof index, "%lld", (long long)i);
            TP_TRY(walk_child(w, v->items.items[i], path_size, depth, index, (size_t)n));
        }
    }
    return TP_OK;
}

int pickle_walk_tensors(const pickle_doc *doc, const pickle_value *root,
                        int (*visit)(void *ctx, const char *path, const pickle_value *tensor), void *ctx)
{
    walk_state *w = malloc(sizeof *w);
    if (!w) return tp_fail(TP_ERR_NOMEM, "out of memory");
    w->mark = ++((pickle_doc *)doc)->walks;
    w->path[0] = 0;
    w->visit = visit;
    w->ctx = ctx;
    int status = walk(w, root, 0, 0);
    free(w);
    return status;
}
