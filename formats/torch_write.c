/* torch_write.c: torch.save files written without PyTorch (torch_write.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <isa-l/crc.h>
#include <xxhash.h>

#include "../common/error.h"
#include "torch_write.h"

#define ALIGNMENT 64          /* PyTorch's writer aligns entry data to 64 bytes */
#define LOCAL_HEADER 30
#define CENTRAL_HEADER 46
#define ZIP32_MAX 0xFFFFFFFFu

typedef struct {
    char *name;
    int64_t offset, size; /* of the local header; of the data */
    uint32_t crc;
    int crc_after;        /* streamed: the local header's CRC-32 is filled in by torch_writer_finish */
} written_entry;

struct torch_writer {
    FILE *file;
    int owned;            /* the writer opened the file (and syncs and closes it) */
    int64_t base;         /* where the archive starts in the file */
    char path[4096];
    char archive[128];
    int64_t at;           /* bytes written */
    written_entry *entries;
    int count, capacity;
    int storages, written;  /* tensors emitted; storages written */
    int64_t *storage_bytes; /* per tensor emitted */
    int pickle_written;
    int in_storage;       /* a storage streamed in parts: part_left bytes still to come, part_crc so far */
    int64_t part_left;
    uint32_t part_crc;
    byte_buffer pickle;
    int force_zip64;      /* TP_TORCH_ZIP64=1: Zip64 fields everywhere (tests of files past 4 GiB) */
};

/* ------------------------------------------------------------------ bytes */

static void put_le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static int write_bytes(torch_writer *w, const void *data, size_t size)
{
    if (size && fwrite(data, 1, size, w->file) != size)
        return tp_fail(TP_ERR_IO, "%s: cannot write: %s", w->path, strerror(errno));
    w->at += (int64_t)size;
    return TP_OK;
}

/* crc carried over size more bytes: zip's CRC-32 (gzip's, reflected) by
 * ISA-L, which runs at tens of GB/s with carry-less multiplication where
 * zlib's table-driven crc32 ran at 7 and took a fifth of a Megatron
 * reshard's time. Its length is 64-bit. */
static uint32_t crc_more(uint32_t crc, const void *data, int64_t size)
{
    return size > 0 ? crc32_gzip_refl(crc, data, (uint64_t)size) : crc;
}

/* A stored entry's local header (with a Zip64 field for sizes past 4 GiB,
 * and an extra field padding the data to the alignment); its data follows. */
static int begin_entry(torch_writer *w, const char *name, int64_t size, uint32_t crc, int crc_after)
{
    if (w->count == w->capacity) {
        int next = w->capacity ? 2 * w->capacity : 32;
        written_entry *bigger = realloc(w->entries, (size_t)next * sizeof *bigger);
        if (!bigger) return tp_fail(TP_ERR_NOMEM, "out of memory");
        w->entries = bigger;
        w->capacity = next;
    }
    char full[512];
    int name_size = snprintf(full, sizeof full, "%s/%s", w->archive, name);
    written_entry *e = &w->entries[w->count];
    if (!(e->name = strdup(full))) return tp_fail(TP_ERR_NOMEM, "out of memory");
    w->count++;
    e->offset = w->at;
    e->size = size;
    e->crc = crc;
    e->crc_after = crc_after;
    int zip64 = size >= ZIP32_MAX || w->force_zip64;
    int extra = zip64 ? 20 : 0;
    int64_t data_at = e->offset + LOCAL_HEADER + name_size + extra;
    int pad = (int)((ALIGNMENT - (data_at + 4) % ALIGNMENT) % ALIGNMENT); /* after a 4-byte extra header */
    extra += 4 + pad;
    unsigned char h[LOCAL_HEADER + 512 + 20 + 4 + ALIGNMENT] = {0};
    memcpy(h, "PK\3\4", 4);
    put_le(h + 4, zip64 ? 45 : 20, 2); /* version needed */
    put_le(h + 14, e->crc, 4);
    put_le(h + 18, zip64 ? ZIP32_MAX : (uint64_t)size, 4);
    put_le(h + 22, zip64 ? ZIP32_MAX : (uint64_t)size, 4);
    put_le(h + 26, (uint64_t)name_size, 2);
    put_le(h + 28, (uint64_t)extra, 2);
    memcpy(h + LOCAL_HEADER, full, (size_t)name_size);
    unsigned char *x = h + LOCAL_HEADER + name_size;
    if (zip64) {
        put_le(x, 1, 2);
        put_le(x + 2, 16, 2);
        put_le(x + 4, (uint64_t)size, 8);
        put_le(x + 12, (uint64_t)size, 8);
        x += 20;
    }
    put_le(x, 0x4246, 2); /* "FB": PyTorch's padding field */
    put_le(x + 2, (uint64_t)pad, 2);
    return write_bytes(w, h, (size_t)(LOCAL_HEADER + name_size + extra));
}

static int add_entry(torch_writer *w, const char *name, const void *data, int64_t size)
{
    TP_TRY(begin_entry(w, name, size, crc_more(0, data, size), 0));
    return write_bytes(w, data, (size_t)size);
}

/* The CRC-32s of streamed entries, known now, into their local headers. */
static int fill_streamed_crcs(torch_writer *w)
{
    if (fflush(w->file) != 0) return tp_fail(TP_ERR_IO, "%s: cannot write: %s", w->path, strerror(errno));
    for (int i = 0; i < w->count; i++) {
        if (!w->entries[i].crc_after) continue;
        unsigned char crc[4];
        put_le(crc, w->entries[i].crc, 4);
        if (pwrite(fileno(w->file), crc, 4, (off_t)(w->base + w->entries[i].offset + 14)) != 4)
            return tp_fail(TP_ERR_IO, "%s: cannot write: %s", w->path, strerror(errno));
    }
    return TP_OK;
}

/* The central directory, Zip64 records where needed, the end record. */
static int write_directory(torch_writer *w)
{
    int64_t start = w->at;
    for (int i = 0; i < w->count; i++) {
        const written_entry *e = &w->entries[i];
        int big_size = e->size >= ZIP32_MAX || w->force_zip64, big_offset = e->offset >= ZIP32_MAX || w->force_zip64;
        int extra = big_size || big_offset ? 4 + 8 * (2 * big_size + big_offset) : 0;
        size_t name_size = strlen(e->name);
        unsigned char h[CENTRAL_HEADER + 512 + 28] = {0};
        memcpy(h, "PK\1\2", 4);
        put_le(h + 4, 45, 2);
        put_le(h + 6, extra ? 45 : 20, 2);
        put_le(h + 16, e->crc, 4);
        put_le(h + 20, big_size ? ZIP32_MAX : (uint64_t)e->size, 4);
        put_le(h + 24, big_size ? ZIP32_MAX : (uint64_t)e->size, 4);
        put_le(h + 28, name_size, 2);
        put_le(h + 30, (uint64_t)extra, 2);
        put_le(h + 42, big_offset ? ZIP32_MAX : (uint64_t)e->offset, 4);
        memcpy(h + CENTRAL_HEADER, e->name, name_size);
        unsigned char *x = h + CENTRAL_HEADER + name_size;
        if (extra) {
            put_le(x, 1, 2);
            put_le(x + 2, (uint64_t)(extra - 4), 2);
            x += 4;
            if (big_size) {
                put_le(x, (uint64_t)e->size, 8);
                put_le(x + 8, (uint64_t)e->size, 8);
                x += 16;
            }
            if (big_offset) put_le(x, (uint64_t)e->offset, 8);
        }
        TP_TRY(write_bytes(w, h, CENTRAL_HEADER + name_size + (size_t)extra));
    }
    int64_t size = w->at - start;
    int zip64 = w->count >= 0xFFFF || start >= ZIP32_MAX || size >= ZIP32_MAX || w->force_zip64;
    if (zip64) {
        unsigned char z[56 + 20] = {0};
        memcpy(z, "PK\6\6", 4);
        put_le(z + 4, 44, 8);
        put_le(z + 12, 45, 2);
        put_le(z + 14, 45, 2);
        put_le(z + 24, (uint64_t)w->count, 8);
        put_le(z + 32, (uint64_t)w->count, 8);
        put_le(z + 40, (uint64_t)size, 8);
        put_le(z + 48, (uint64_t)start, 8);
        memcpy(z + 56, "PK\6\7", 4);
        put_le(z + 64, (uint64_t)(start + size), 8);
        put_le(z + 72, 1, 4);
        TP_TRY(write_bytes(w, z, sizeof z));
    }
    unsigned char end[22] = {0};
    memcpy(end, "PK\5\6", 4);
    put_le(end + 8, zip64 ? 0xFFFF : (uint64_t)w->count, 2);
    put_le(end + 10, zip64 ? 0xFFFF : (uint64_t)w->count, 2);
    put_le(end + 12, zip64 ? ZIP32_MAX : (uint64_t)size, 4);
    put_le(end + 16, zip64 ? ZIP32_MAX : (uint64_t)start, 4);
    return write_bytes(w, end, sizeof end);
}

/* ------------------------------------------------------------------ pickle */

static void op(byte_buffer *b, unsigned char code)
{
    buffer_put(b, &code, 1);
}

void pk_none(byte_buffer *b)
{
    op(b, 'N');
}

void pk_bool(byte_buffer *b, int value)
{
    op(b, value ? 0x88 : 0x89);
}

void pk_int(byte_buffer *b, int64_t value)
{
    unsigned char v[9];
    if (value >= 0 && value < 256) {
        op(b, 'K');
        v[0] = (unsigned char)value;
        buffer_put(b, v, 1);
    } else if (value >= INT32_MIN && value <= INT32_MAX) {
        op(b, 'J');
        put_le(v, (uint64_t)(int64_t)value, 4);
        buffer_put(b, v, 4);
    } else {
        op(b, 0x8a); /* LONG1 of 8 bytes, two's complement */
        v[0] = 8;
        put_le(v + 1, (uint64_t)value, 8);
        buffer_put(b, v, 9);
    }
}

void pk_float(byte_buffer *b, double value)
{
    uint64_t bits;
    memcpy(&bits, &value, 8);
    unsigned char v[8];
    for (int i = 0; i < 8; i++) v[i] = (unsigned char)(bits >> (56 - 8 * i)); /* big-endian */
    op(b, 'G');
    buffer_put(b, v, 8);
}

static void pk_text(byte_buffer *b, unsigned char code, const void *text, size_t size)
{
    unsigned char n[4];
    put_le(n, size, 4);
    op(b, code);
    buffer_put(b, n, 4);
    buffer_put(b, text, size);
}

void pk_string(byte_buffer *b, const char *text)
{
    pk_text(b, 'X', text, strlen(text));
}

void pk_global(byte_buffer *b, const char *module, const char *name)
{
    op(b, 'c');
    buffer_put_text(b, module);
    buffer_put_text(b, "\n");
    buffer_put_text(b, name);
    buffer_put_text(b, "\n");
}

void pk_dict_begin(byte_buffer *b)
{
    op(b, '}');
    op(b, '(');
}

void pk_ordered_dict_begin(byte_buffer *b)
{
    pk_global(b, "collections", "OrderedDict");
    op(b, ')');
    op(b, 'R');
    op(b, '(');
}

void pk_dict_end(byte_buffer *b)
{
    op(b, 'u');
}

/* "module.name" split at its last dot. */
static void pk_global_named(byte_buffer *b, const char *qualified)
{
    const char *dot = strrchr(qualified, '.');
    char module[512];
    snprintf(module, sizeof module, "%.*s", dot ? (int)(dot - qualified) : 0, qualified);
    pk_global(b, dot ? module : "builtins", dot ? dot + 1 : qualified);
}

void pk_list_begin(byte_buffer *b)
{
    op(b, ']');
    op(b, '(');
}

void pk_list_end(byte_buffer *b)
{
    op(b, 'e');
}

void pk_proto(byte_buffer *b)
{
    op(b, 0x80);
    op(b, 2);
}

void pk_stop(byte_buffer *b)
{
    op(b, '.');
}

void pk_mark(byte_buffer *b)
{
    op(b, '(');
}

void pk_tuple_end(byte_buffer *b)
{
    op(b, 't');
}

void pk_reduce(byte_buffer *b)
{
    op(b, 'R');
}

void pk_object_begin(byte_buffer *b, pk_memo *memo, const char *module, const char *name)
{
    if (memo) pk_shared_global(b, memo, module, name);
    else pk_global(b, module, name);
    op(b, ')');
    op(b, 0x81); /* NEWOBJ */
}

void pk_build(byte_buffer *b)
{
    op(b, 'b');
}

/* ---------------------------------------------------- values carried over */

/* What a written pickle may name. torch.load imports every global a pickle
 * names and calls the ones it applies, so a value read from a source file
 * (which pickle.c records, never runs) is written back only as data and
 * these: the classes the training state of real Megatron-LM rank files
 * holds (docs/MEGATRON.md section 10: args, rng_state's numpy arrays,
 * rerun_state_machine's and args' enums, Transformer Engine's _extra_state
 * before TE 2.0), each harmless to import and to call with any arguments.
 * Anything else is refused, naming where it is and what it names: a
 * converter that runs nothing must not carry a call into a file that
 * torch.load will run. */
enum {
    PK_CALLED = 1,   /* may be called (REDUCE, NEWOBJ) */
    PK_STATEFUL = 2, /* what calling it gives may be given state (BUILD) */
    PK_ENUM = 4,     /* an enum: getattr(cls, 'member') too, as Python 3.11.0 to 3.11.6 pickle members */
};
static const struct {
    const char *name;
    int uses;
} allowed_globals[] = {
    {"argparse.Namespace", PK_CALLED | PK_STATEFUL}, /* args: NEWOBJ, then BUILD of its attributes */
    {"torch.device", PK_CALLED},
    /* numpy's arrays, dtypes and scalars (rng_state's np_rng_state); numpy 2 names its module _core. */
    {"numpy.core.multiarray._reconstruct", PK_CALLED | PK_STATEFUL},
    {"numpy._core.multiarray._reconstruct", PK_CALLED | PK_STATEFUL},
    {"numpy.core.multiarray.scalar", PK_CALLED},
    {"numpy._core.multiarray.scalar", PK_CALLED},
    {"numpy.dtype", PK_CALLED | PK_STATEFUL},
    {"numpy.ndarray", 0},                     /* the class _reconstruct makes */
    {"_io.BytesIO", PK_CALLED | PK_STATEFUL}, /* Transformer Engine's _extra_state before TE 2.0 */
    /* Megatron's enums (megatron/core/enums.py, transformer/enums.py, rerun_state_machine.py). */
    {"megatron.core.enums.ModelType", PK_CALLED | PK_ENUM},
    {"megatron.core.transformer.enums.AttnBackend", PK_CALLED | PK_ENUM},
    {"megatron.core.rerun_state_machine.RerunMode", PK_CALLED | PK_ENUM},
    {"megatron.core.rerun_state_machine.RerunState", PK_CALLED | PK_ENUM},
    {"megatron.core.rerun_state_machine.RerunDiagnostic", PK_CALLED | PK_ENUM},
};
/* torch's dtypes, as a torch.dtype pickles itself (GLOBAL torch.float32):
 * args.params_dtype. */
static const char *const torch_dtypes[] = {
    "float32",   "float64",      "float16",    "bfloat16",       "complex32",  "complex64", "complex128",
    "uint8",     "int8",         "int16",      "int32",          "int64",      "bool",      "uint16",
    "uint32",    "uint64",       "qint8",      "quint8",         "qint32",     "quint4x2",  "quint2x4",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
};

/* What a global may be used for (PK_*), or -1 when it may not be named. */
static int global_uses(const char *name)
{
    for (size_t i = 0; i < sizeof allowed_globals / sizeof *allowed_globals; i++)
        if (!strcmp(name, allowed_globals[i].name)) return allowed_globals[i].uses;
    if (!strncmp(name, "torch.", 6))
        for (size_t i = 0; i < sizeof torch_dtypes / sizeof *torch_dtypes; i++)
            if (!strcmp(name + 6, torch_dtypes[i])) return 0;
    return -1;
}

/* Values carried over are nested at most this deep (the reader's walks'
 * bound; Megatron's nest 5 deep), so that the recursion is bounded. */
#define CARRY_MAX_DEPTH 64
#define CARRY_PATH_MAX 512

/* Every value other than a number, None or a bool is put in the memo as
 * Python's pickler puts it (PUT after it is made; a list or dict before its
 * items, so that its items may refer back to it), and written once: a value
 * reached again, in this call or a later one on the same pickle, is a GET.
 * A source's shared references stay shared and the output stays the size of
 * the input (a list holding the previous level twice, 30 levels deep, is 30
 * lists, not 2^30). The table maps a value to its memo index, -1 while it is
 * being written and not yet put: reached then, it refers back to itself
 * through a tuple, a set or a call's arguments, which a pickle cannot
 * write (Python's pickler neither, but with a trick no checkpoint needs). */
typedef struct {
    const pickle_value **values; /* open addressing by address, a power of two of slots */
    int64_t *memo;
    size_t slots, count;
} carry_table;

/* The texts written once (pk_shared_global, pk_shared_string): a kind
 * ('c' a class, 'X' a string) then the text ("module\nname" of a class),
 * mapped to its memo index. */
typedef struct {
    char **texts; /* open addressing by the text's hash, a power of two of slots; owned */
    int64_t *memo;
    size_t slots, count;
} text_table;

struct pk_memo {
    carry_table written;   /* of the whole pickle */
    text_table shared;
    int64_t next;          /* the next memo index */
    int64_t copy_bytes, copy_budget;
};

static void table_free(carry_table *t)
{
    free(t->values);
    free(t->memo);
    memset(t, 0, sizeof *t);
}

static size_t slot_of(const carry_table *t, const pickle_value *v)
{
    size_t i = (size_t)(((uint64_t)(uintptr_t)v * 0x9E3779B97F4A7C15ull) >> 17) & (t->slots - 1);
    while (t->values[i] && t->values[i] != v) i = (i + 1) & (t->slots - 1);
    return i;
}

static int table_grow(carry_table *t)
{
    size_t slots = t->slots ? 2 * t->slots : 64;
    carry_table bigger = {calloc(slots, sizeof *bigger.values), malloc(slots * sizeof *bigger.memo), slots, t->count};
    if (!bigger.values || !bigger.memo) {
        table_free(&bigger);
        return tp_fail(TP_ERR_NOMEM, "out of memory for a table of %zu values written back", slots);
    }
    for (size_t i = 0; i < t->slots; i++)
        if (t->values[i]) {
            size_t j = slot_of(&bigger, t->values[i]);
            bigger.values[j] = t->values[i];
            bigger.memo[j] = t->memo[i];
        }
    table_free(t);
    *t = bigger;
    return TP_OK;
}

int pk_memo_create(int64_t copy_budget, pk_memo **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out) return tp_fail(TP_ERR_NOMEM, "out of memory");
    (*out)->copy_budget = copy_budget;
    return TP_OK;
}

static void text_table_free(text_table *t)
{
    for (size_t i = 0; i < t->slots; i++) free(t->texts[i]);
    free(t->texts);
    free(t->memo);
    memset(t, 0, sizeof *t);
}

static size_t text_slot(const text_table *t, const char *text)
{
    size_t i = (size_t)XXH3_64bits(text, strlen(text)) & (t->slots - 1);
    while (t->texts[i] && strcmp(t->texts[i], text)) i = (i + 1) & (t->slots - 1);
    return i;
}

/* The memo index of text written before (>= 0), or -1 after recording it
 * with the next index (*index), which the caller PUTs; -2: out of memory. */
static int64_t shared_text(pk_memo *memo, const char *text, int64_t *index)
{
    text_table *t = &memo->shared;
    if (2 * (t->count + 1) > t->slots) {
        size_t slots = t->slots ? 2 * t->slots : 64;
        text_table bigger = {calloc(slots, sizeof *bigger.texts), malloc(slots * sizeof *bigger.memo), slots, t->count};
        if (!bigger.texts || !bigger.memo) {
            text_table_free(&bigger);
            return -2;
        }
        for (size_t i = 0; i < t->slots; i++)
            if (t->texts[i]) {
                size_t j = text_slot(&bigger, t->texts[i]);
                bigger.texts[j] = t->texts[i];
                bigger.memo[j] = t->memo[i];
                t->texts[i] = NULL;
            }
        text_table_free(t);
        *t = bigger;
    }
    size_t slot = text_slot(t, text);
    if (t->texts[slot]) return t->memo[slot];
    if (!(t->texts[slot] = strdup(text))) return -2;
    t->count++;
    *index = t->memo[slot] = memo->next++;
    return -1;
}

void pk_memo_free(pk_memo *memo)
{
    if (!memo) return;
    table_free(&memo->written);
    text_table_free(&memo->shared);
    free(memo);
}

typedef struct {
    byte_buffer *b;        /* NULL: checked, not written */
    pk_memo *memo;
    carry_table *table;    /* the memo's, or a copy's own */
    const pk_origin *from;
    int tensors;           /* tensors may be inside */
    char path[CARRY_PATH_MAX];
} carry_walk;

/* A memo opcode with its index: the 1-byte form below 256, else the 4-byte one. */
static void memo_op(byte_buffer *b, unsigned char short_op, unsigned char long_op, int64_t index)
{
    unsigned char v[4];
    if (index < 256) {
        op(b, short_op);
        v[0] = (unsigned char)index;
        buffer_put(b, v, 1);
    } else {
        op(b, long_op);
        put_le(v, (uint64_t)index, 4);
        buffer_put(b, v, 4);
    }
}

static void put_memo(carry_walk *w, size_t slot)
{
    int64_t index = w->memo->next++;
    w->table->memo[slot] = index;
    if (w->b) memo_op(w->b, 'q', 'r', index); /* BINPUT, LONG_BINPUT */
}

static void get_memo(carry_walk *w, int64_t index)
{
    if (w->b) memo_op(w->b, 'h', 'j', index); /* BINGET, LONG_BINGET */
}

/* kind then text, written once: a GET of it when written before, else
 * what write emits and a PUT. */
static void write_shared(byte_buffer *b, pk_memo *memo, char kind, const char *text, const char *second,
                         void (*write)(byte_buffer *, const char *, const char *))
{
    char stack[256], *key = stack;
    size_t size = strlen(text) + (second ? strlen(second) + 1 : 0) + 2;
    if (size > sizeof stack && !(key = malloc(size))) {
        b->failed = 1;
        return;
    }
    snprintf(key, size, "%c%s%s%s", kind, text, second ? "\n" : "", second ? second : "");
    int64_t index = 0, found = shared_text(memo, key, &index);
    if (key != stack) free(key);
    if (found == -2) b->failed = 1;
    else if (found >= 0) memo_op(b, 'h', 'j', found); /* BINGET, LONG_BINGET */
    else {
        write(b, text, second);
        memo_op(b, 'q', 'r', index); /* BINPUT, LONG_BINPUT */
    }
}

static void write_string(byte_buffer *b, const char *text, const char *unused)
{
    (void)unused;
    pk_string(b, text);
}

void pk_shared_global(byte_buffer *b, pk_memo *memo, const char *module, const char *name)
{
    write_shared(b, memo, 'c', module, name, pk_global);
}

void pk_shared_string(byte_buffer *b, pk_memo *memo, const char *text)
{
    write_shared(b, memo, 'X', text, NULL, write_string);
}

/* The path of a part: path[at] on, appended (cut where too long). */
static size_t path_part(carry_walk *w, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static size_t path_part(carry_walk *w, size_t at, const char *fmt, ...)
{
    if (at >= sizeof w->path - 1) return at;
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(w->path + at, sizeof w->path - at, fmt, args);
    va_end(args);
    if (n < 0) return at;
    return at + (size_t)n < sizeof w->path - 1 ? at + (size_t)n : sizeof w->path - 1;
}

static int refuse(const carry_walk *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(const carry_walk *w, const char *fmt, ...)
{
    char why[700];
    va_list args;
    va_start(args, fmt);
    vsnprintf(why, sizeof why, fmt, args);
    va_end(args);
    return tp_fail(TP_ERR_FORMAT, "%s: %s %s", w->from->file, w->path, why);
}

#define ALLOWED_NOTE ", which is not written back: a converted checkpoint carries only data and known classes " \
                     "(argparse.Namespace, torch dtypes, numpy arrays, io.BytesIO, Megatron's enums)"

static int carry_value(carry_walk *w, const pickle_value *v, size_t at, int depth);

static int carry_child(carry_walk *w, const pickle_value *v, size_t at, int depth, size_t end)
{
    int status = carry_value(w, v, end, depth + 1);
    w->path[at] = 0;
    return status;
}

static int carry_items(carry_walk *w, const pickle_items *items, size_t at, int depth)
{
    for (int64_t i = 0; i < items->count; i++)
        TP_TRY(carry_child(w, items->items[i], at, depth, path_part(w, at, "[%lld]", (long long)i)));
    return TP_OK;
}

/* A dict's pairs: a key's value at .key ([key] for a number). */
static int carry_pairs(carry_walk *w, const pickle_value *dict, size_t at, int depth)
{
    for (int64_t i = 0; i < dict->dict.keys.count; i++) {
        const pickle_value *k = dict->dict.keys.items[i];
        TP_TRY(carry_child(w, k, at, depth, path_part(w, at, "{key %lld}", (long long)i)));
        size_t end = k->kind == PICKLE_STRING ? path_part(w, at, "%s%.80s", at ? "." : "", k->text.data)
                     : k->kind == PICKLE_INT || k->kind == PICKLE_BOOL ? path_part(w, at, "[%lld]", (long long)k->integer)
                                                                       : path_part(w, at, "[%s]", pickle_kind_name(k->kind));
        TP_TRY(carry_child(w, dict->dict.values.items[i], at, depth, end));
    }
    return TP_OK;
}

/* A call of a global (Python's REDUCE or NEWOBJ, then BUILD): checked
 * against the allow-list before anything of it is written. */
static int carry_object(carry_walk *w, const pickle_value *v, size_t at, int depth)
{
    const char *cls = v->object.cls;
    int uses = global_uses(cls);
    const pickle_value *args = v->object.args;
    /* getattr(Enum, 'member'): a member of an allowed enum by its name (no
     * dunder or private attribute). */
    pickle_value *const *a = args && args->kind == PICKLE_TUPLE && args->items.count == 2 ? args->items.items : NULL;
    if (!strcmp(cls, "builtins.getattr") && a && a[0]->kind == PICKLE_GLOBAL && global_uses(a[0]->text.data) >= 0 &&
        (global_uses(a[0]->text.data) & PK_ENUM) && a[1]->kind == PICKLE_STRING && a[1]->text.size > 0 &&
        a[1]->text.data[0] != '_')
        uses = PK_CALLED;
    if (uses < 0 || !(uses & PK_CALLED))
        return refuse(w, "is a call of %s%s", cls, ALLOWED_NOTE);
    if (v->object.state && !(uses & PK_STATEFUL))
        return refuse(w, "gives state (BUILD) to a call of %s, which takes none; not written back", cls);
    if (v->object.items || v->object.list)
        return refuse(w, "adds items to a call of %s, which takes none; not written back", cls);
    if (w->b) pk_global_named(w->b, cls);
    if (args) TP_TRY(carry_child(w, args, at, depth, path_part(w, at, "(args)")));
    else if (w->b) op(w->b, ')');
    if (w->b) op(w->b, v->object.newobj ? 0x81 : 'R');
    put_memo(w, slot_of(w->table, v)); /* found again: the table may have grown */
    if (v->object.state) {
        /* A Namespace's attributes at .name, other state at (state). */
        size_t end = v->object.state->kind == PICKLE_DICT ? at : path_part(w, at, "(state)");
        TP_TRY(carry_child(w, v->object.state, at, depth, end));
        if (w->b) op(w->b, 'b');
    }
    return TP_OK;
}

static int carry_value(carry_walk *w, const pickle_value *v, size_t at, int depth)
{
    switch (v->kind) { /* numbers, None and bools: written where they are */
    case PICKLE_NONE: if (w->b) pk_none(w->b); return TP_OK;
    case PICKLE_BOOL: if (w->b) pk_bool(w->b, (int)v->integer); return TP_OK;
    case PICKLE_INT: if (w->b) pk_int(w->b, v->integer); return TP_OK;
    case PICKLE_FLOAT: if (w->b) pk_float(w->b, v->real); return TP_OK;
    default: break;
    }
    if (2 * (w->table->count + 1) > w->table->slots) TP_TRY(table_grow(w->table));
    size_t slot = slot_of(w->table, v);
    if (w->table->values[slot]) {
        if (w->table->memo[slot] < 0)
            return refuse(w, "refers back to a value that holds it through a tuple, a set or a call's arguments, "
                             "which a pickle cannot write; not written back");
        get_memo(w, w->table->memo[slot]);
        return TP_OK;
    }
    if (depth >= CARRY_MAX_DEPTH) return refuse(w, "nests values more than %d deep; not written back", CARRY_MAX_DEPTH);
    w->table->values[slot] = v;
    w->table->memo[slot] = -1;
    w->table->count++;
    byte_buffer *b = w->b;
    switch (v->kind) {
    case PICKLE_STRING:
        if (b) pk_text(b, 'X', v->text.data, (size_t)v->text.size);
        break;
    case PICKLE_BYTES:
        if (b) pk_text(b, 'B', v->text.data, (size_t)v->text.size);
        break;
    case PICKLE_BIGINT:
        if (b) {
            unsigned char n[4];
            put_le(n, (uint64_t)v->text.size, 4);
            op(b, 0x8b); /* LONG4 */
            buffer_put(b, n, 4);
            buffer_put(b, v->text.data, (size_t)v->text.size);
        }
        break;
    case PICKLE_GLOBAL:
        if (global_uses(v->text.data) < 0) return refuse(w, "names %s%s", v->text.data, ALLOWED_NOTE);
        if (b) pk_global_named(b, v->text.data);
        break;
    case PICKLE_TUPLE: /* as Python writes them: (), TUPLE1 to TUPLE3, MARK ... TUPLE */
        if (b && (v->items.count == 0 || v->items.count > 3)) op(b, v->items.count ? '(' : ')');
        TP_TRY(carry_items(w, &v->items, at, depth));
        if (b && v->items.count) op(b, v->items.count <= 3 ? (unsigned char)(0x84 + v->items.count) : 't');
        break;
    case PICKLE_SET:
        if (b) {
            pk_global(b, "builtins", "set");
            op(b, '(');
            op(b, ']');
            op(b, '(');
        }
        TP_TRY(carry_items(w, &v->items, at, depth));
        if (b) {
            op(b, 'e');
            op(b, 't');
            op(b, 'R');
        }
        break;
    case PICKLE_LIST:
        if (b) op(b, ']');
        put_memo(w, slot);
        if (b) op(b, '(');
        TP_TRY(carry_items(w, &v->items, at, depth));
        if (b) op(b, 'e');
        return TP_OK;
    case PICKLE_DICT:
        if (b) op(b, '}');
        put_memo(w, slot);
        if (b) op(b, '(');
        TP_TRY(carry_pairs(w, v, at, depth));
        if (b) op(b, 'u');
        return TP_OK;
    case PICKLE_OBJECT:
        return carry_object(w, v, at, depth);
    case PICKLE_TENSOR:
        if (!w->tensors) return refuse(w, "is a tensor, which cannot be written back as plain data");
        if (b) TP_TRY(w->from->tensor(w->from->ctx, v));
        break;
    default:
        return refuse(w, "is a %s outside a tensor, which cannot be written back", pickle_kind_name(v->kind));
    }
    put_memo(w, slot_of(w->table, v));
    return TP_OK;
}

int pk_value(byte_buffer *b, pk_memo *memo, const pickle_value *value, const pk_origin *from)
{
    carry_walk *w = malloc(sizeof *w);
    if (!w) return tp_fail(TP_ERR_NOMEM, "out of memory");
    carry_table copy = {0};
    *w = (carry_walk){.b = b, .memo = memo, .table = from->copy ? &copy : &memo->written, .from = from,
                      .tensors = from->tensor != NULL};
    snprintf(w->path, sizeof w->path, "%s", from->path);
    size_t before = b->size;
    int status = carry_value(w, value, strlen(w->path), 0);
    table_free(&copy);
    free(w);
    if (!status && b->failed) status = tp_fail(TP_ERR_NOMEM, "%s: %s: out of memory writing it back", from->file, from->path);
    if (!status && from->copy && (memo->copy_bytes += (int64_t)(b->size - before)) > memo->copy_budget)
        status = tp_fail(TP_ERR_FORMAT, "%s: %s: its copies take more than %lld bytes, the bound for a value copied "
                         "to every parameter; not written back", from->file, from->path, (long long)memo->copy_budget);
    return status;
}

int pk_value_check(const pickle_value *value, const char *file, const char *path, int tensors)
{
    pk_memo memo = {0};
    pk_origin from = {.file = file, .path = path};
    carry_walk *w = malloc(sizeof *w);
    if (!w) return tp_fail(TP_ERR_NOMEM, "out of memory");
    *w = (carry_walk){.memo = &memo, .table = &memo.written, .from = &from, .tensors = tensors};
    snprintf(w->path, sizeof w->path, "%s", path);
    int status = carry_value(w, value, strlen(w->path), 0);
    table_free(&memo.written);
    free(w);
    return status;
}

/* ------------------------------------------------------------------ files */

static const char *storage_class(torch_dtype dtype)
{
    static const char *names[] = {"FloatStorage", "DoubleStorage", "HalfStorage", "BFloat16Storage",
                                  "LongStorage",  "IntStorage",    "ShortStorage", "CharStorage",
                                  "ByteStorage",  "BoolStorage",   "ComplexFloatStorage", "ComplexDoubleStorage"};
    return (unsigned)dtype < sizeof names / sizeof *names ? names[dtype] : "ByteStorage";
}

static void free_writer(torch_writer *w);

static int new_writer(const char *path, const char *archive, torch_writer **out)
{
    torch_writer *w = calloc(1, sizeof *w);
    if (!w) return tp_fail(TP_ERR_NOMEM, "out of memory");
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->archive, sizeof w->archive, "%s", archive);
    const char *force = getenv("TP_TORCH_ZIP64");
    w->force_zip64 = force && !strcmp(force, "1");
    op(&w->pickle, 0x80); /* PROTO 2, as torch.save writes */
    op(&w->pickle, 2);
    *out = w;
    return TP_OK;
}

int torch_writer_open(const char *path, const char *archive, torch_writer **out)
{
    *out = NULL;
    torch_writer *w;
    TP_TRY(new_writer(path, archive, &w));
    if (!(w->file = fopen(path, "wbx"))) {
        int err = errno;
        free_writer(w);
        return tp_fail(TP_ERR_IO, "%s: cannot create: %s", path, strerror(err));
    }
    w->owned = 1;
    *out = w;
    return TP_OK;
}

int torch_writer_open_in(FILE *file, const char *path, const char *archive, torch_writer **out)
{
    *out = NULL;
    off_t at = ftello(file);
    if (at < 0) return tp_fail(TP_ERR_IO, "%s: cannot tell the position: %s", path, strerror(errno));
    torch_writer *w;
    TP_TRY(new_writer(path, archive, &w));
    w->file = file;
    w->base = (int64_t)at;
    *out = w;
    return TP_OK;
}

byte_buffer *torch_writer_pickle(torch_writer *w)
{
    return &w->pickle;
}

int torch_writer_tensor(torch_writer *w, torch_dtype dtype, int ndim, const int64_t *shape)
{
    if (w->pickle_written) return tp_fail(TP_ERR_STATE, "%s: a tensor emitted after the pickle was written", w->path);
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= shape[d];
    if (w->storages % 64 == 0) {
        int64_t *bigger = realloc(w->storage_bytes, (size_t)(w->storages + 64) * sizeof *bigger);
        if (!bigger) return tp_fail(TP_ERR_NOMEM, "out of memory");
        w->storage_bytes = bigger;
    }
    w->storage_bytes[w->storages] = numel * (int64_t)torch_dtype_size(dtype);
    char key[32];
    snprintf(key, sizeof key, "%d", w->storages++);
    /* _rebuild_tensor_v2((storage id), 0, shape, strides, False, OrderedDict()) */
    byte_buffer *b = &w->pickle;
    pk_global(b, "torch._utils", "_rebuild_tensor_v2");
    op(b, '(');
    op(b, '(');
    pk_string(b, "storage");
    pk_global(b, "torch", storage_class(dtype));
    pk_string(b, key);
    pk_string(b, "cpu");
    pk_int(b, numel);
    op(b, 't');
    op(b, 'Q'); /* BINPERSID */
    pk_int(b, 0);
    op(b, '(');
    for (int d = 0; d < ndim; d++) pk_int(b, shape[d]);
    op(b, 't');
    op(b, '(');
    int64_t stride = 1, strides[TORCH_MAX_DIMS];
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = stride;
        stride *= shape[d];
    }
    for (int d = 0; d < ndim; d++) pk_int(b, strides[d]);
    op(b, 't');
    pk_bool(b, 0);
    pk_global(b, "collections", "OrderedDict");
    op(b, ')');
    op(b, 'R');
    op(b, 't');
    op(b, 'R');
    return TP_OK;
}

int torch_writer_begin_storages(torch_writer *w)
{
    op(&w->pickle, '.');
    if (w->pickle.failed) return tp_fail(TP_ERR_NOMEM, "out of memory");
    w->pickle_written = 1;
    return add_entry(w, "data.pkl", w->pickle.data, (int64_t)w->pickle.size);
}

int torch_writer_storage_part(torch_writer *w, const void *data, int64_t size)
{
    if (!w->in_storage) {
        if (!w->pickle_written || w->written >= w->storages)
            return tp_fail(TP_ERR_STATE, "%s: storage %d written out of order (%d emitted)", w->path, w->written,
                           w->storages);
        char entry[48];
        snprintf(entry, sizeof entry, "data/%d", w->written);
        w->part_left = w->storage_bytes[w->written++];
        TP_TRY(begin_entry(w, entry, w->part_left, 0, 1));
        w->part_crc = 0;
        w->in_storage = 1;
    }
    if (size > w->part_left)
        return tp_fail(TP_ERR_STATE, "%s: storage %d: %lld bytes more than its size", w->path, w->written - 1,
                       (long long)(size - w->part_left));
    w->part_crc = crc_more(w->part_crc, data, size);
    TP_TRY(write_bytes(w, data, (size_t)size));
    w->part_left -= size;
    if (w->part_left == 0) {
        w->entries[w->count - 1].crc = w->part_crc;
        w->in_storage = 0;
    }
    return TP_OK;
}

int torch_writer_storage(torch_writer *w, const void *data, int64_t size)
{
    if (w->in_storage || !w->pickle_written || w->written >= w->storages || size != w->storage_bytes[w->written])
        return tp_fail(TP_ERR_STATE, "%s: storage %d of %lld bytes out of order (%d emitted)", w->path, w->written,
                       (long long)size, w->storages);
    return torch_writer_storage_part(w, data, size);
}

static void free_writer(torch_writer *w)
{
    for (int i = 0; i < w->count; i++) free(w->entries[i].name);
    free(w->entries);
    free(w->storage_bytes);
    free(w->pickle.data);
    free(w);
}

int torch_writer_finish(torch_writer *w)
{
    int status = w->pickle_written && w->written == w->storages && !w->in_storage
                     ? TP_OK
                     : tp_fail(TP_ERR_STATE, "%s: %d of %d storages written", w->path, w->written, w->storages);
    if (!status) status = add_entry(w, "version", "3\n", 2);
    if (!status) status = add_entry(w, "byteorder", "little", 6);
    if (!status) status = fill_streamed_crcs(w);
    if (!status) status = write_directory(w);
    if (!status && fflush(w->file) != 0) status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", w->path, strerror(errno));
    if (w->owned) {
        if (!status && fsync(fileno(w->file)) != 0)
            status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", w->path, strerror(errno));
        if (fclose(w->file) != 0 && !status) status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", w->path, strerror(errno));
    }
    free_writer(w);
    return status;
}

void torch_writer_abort(torch_writer *w)
{
    if (!w) return;
    if (w->owned) fclose(w->file);
    free_writer(w);
}
