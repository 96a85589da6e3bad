/* fixture.c: what the checkpoint and reshard tests share: a temporary
 * directory per test, a reproducible random source, random tensors with
 * random partitions, and naive references built from the format's
 * definition (docs/FORMAT.md): pieces, regions and logical digests. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <ftw.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "fixture.h"
#include "../../kernels/convert_bits.h"

char dir[512];
static pid_t dir_maker; /* a child forked by a test that exits leaves it alone */

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st, (void)type, (void)ftw;
    return remove(path);
}

/* At the test process's exit: the directory if a test left it. A skipped
 * test (cr_skip_test) ends its process without the suite's .fini, and left
 * an empty directory in /tmp at every make test. */
static void remove_dir_if_left(void)
{
    if (dir[0] && getpid() == dir_maker && access(dir, F_OK) == 0)
        (void)nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void make_dir(void)
{
    static int registered;
    if (!registered) registered = atexit(remove_dir_if_left) == 0;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof dir, "%s/tp-ckpt-test-XXXXXX", base);
    cr_assert_not_null(mkdtemp(dir));
    dir_maker = getpid();
}

/* In C, not `rm -rf`: the tests also run where there is no shell
 * (tests/gpu/test_gpu_pack.sh). */
void remove_dir(void)
{
    cr_assert_eq(nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS), 0, "cannot remove %s", dir);
}

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

void seed_random(uint64_t seed)
{
    rng_state = seed ? seed : 0x2545F4914F6CDD1Dull;
}

uint64_t next_random(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
void random_numbers(uint8_t *data, size_t bytes, tp_dtype dtype)
{
    for (size_t b = 0; b < bytes; b++) data[b] = (uint8_t)next_random();
    size_t size = tp_dtype_size(dtype);
    for (size_t at = 0; at + size <= bytes; at += size) {
        uint32_t x = 0;
        if (dtype == TP_FP32) memcpy(&x, data + at, 4);
        else x = (uint32_t)(data[at] | data[at + 1] << 8) << (dtype == TP_BF16 ? 16 : 0);
        if (dtype != TP_FP16 && bits_f32_overflows_f16(x)) data[at + size - 1] &= 0xbf; /* 2^(e-128) */
    }
}

int64_t rnd(int64_t lo, int64_t hi) { return lo + (int64_t)(next_random() % (uint64_t)(hi - lo + 1)); }

int64_t elements_of(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

/* Naive: the stored piece of `rank`, element by element from the logical
 * tensor, using the definition of the partition (docs/FORMAT.md), replicated
 * segments included: every holder of a replicated granule gets its values. */
void build_piece(const ckpt_tensor_desc *t, int tp, int rank, const uint8_t *logical, uint8_t *out)
{
    size_t es = tp_dtype_size(t->dtype);
    int64_t pshape[CKPT_MAX_DIMS];
    ckpt_piece_shape(t, tp, pshape);
    int64_t n = elements_of(pshape, t->ndim);
    int axis = t->partition.axis;
    for (int64_t e = 0; e < n; e++) {
        int64_t idx[CKPT_MAX_DIMS] = {0}, rest = e;
        for (int d = t->ndim - 1; d >= 0; d--) {
            idx[d] = rest % pshape[d];
            rest /= pshape[d];
        }
        int64_t logical_axis = idx[axis];
        if (t->partition.kind == CKPT_SPLIT) {
            /* Walk the segments: local index -> segment, offset in share. */
            /* The defaults: no segment list is one segment, granule 0 is 1. */
            int segments = t->partition.num_segments ? t->partition.num_segments : 1;
            int64_t granule = t->partition.granule ? t->partition.granule : 1;
            int64_t local = idx[axis], seg_logical = 0;
            logical_axis = -1;
            for (int s = 0; s < segments; s++) {
                int64_t size = t->partition.num_segments ? t->partition.segments[s] : t->shape[axis];
                int64_t padded = size, unit = tp * t->partition.pad_multiple * granule;
                if (unit) padded = (size + unit - 1) / unit * unit;
                int64_t share = padded / tp;
                int64_t granules = size / granule;
                if (t->partition.replicate_small_segments && granules < tp) {
                    /* Replicated (format 1.4): rank holds granule rank / (tp / granules), as its
                     * tp / granules neighbours do. */
                    share = granule;
                    if (local < share) {
                        logical_axis = seg_logical + rank / (tp / granules) * granule + local;
                        break;
                    }
                } else if (local < share) {
                    int64_t k = rank * share + local;
                    logical_axis = k < size ? seg_logical + k : -1;
                    break;
                }
                local -= share;
                seg_logical += size;
            }
        }
        if (logical_axis < 0) {
            memset(out + e * es, 0, es);
            continue;
        }
        int64_t flat = 0;
        for (int d = 0; d < t->ndim; d++) flat = flat * t->shape[d] + (d == axis ? logical_axis : idx[d]);
        memcpy(out + e * es, logical + flat * es, es);
    }
}


/* Random tensors that split at degree tp: GQA-like segments, padding, axis 0 or 1. */
static int64_t gcd(int64_t a, int64_t b) { return b ? gcd(b, a % b) : a; }

int random_tensors(test_tensor *out, int max, const int *tps, int num_tps, int64_t layers)
{
    int64_t lcm = 1;
    for (int i = 0; i < num_tps; i++) lcm = lcm / gcd(lcm, tps[i]) * tps[i];
    int n = (int)rnd(3, max);
    for (int i = 0; i < n; i++) {
        test_tensor *t = &out[i];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s/t%d.w", i % 2 ? "model" : "optim/exp_avg", i);
        t->desc.name = t->name;
        t->desc.role = i % 2 ? "param" : "exp_avg";
        t->desc.dtype = (tp_dtype)rnd(0, 2);
        t->desc.ndim = (int)rnd(1, 3);
        for (int d = 0; d < t->desc.ndim; d++) t->desc.shape[d] = rnd(1, 40);
        t->desc.anchor = (ckpt_anchor)rnd(0, 2);
        t->desc.layer = rnd(0, layers - 1);
        if (rnd(0, 3) > 0) {
            ckpt_partition *p = &t->desc.partition;
            p->kind = CKPT_SPLIT;
            p->axis = (int)rnd(0, t->desc.ndim - 1);
            p->granule = rnd(1, 3);
            p->num_segments = (int)rnd(1, 3);
            p->pad_multiple = rnd(0, 1) ? rnd(1, 2) : 0;
            int64_t total = 0;
            for (int s = 0; s < p->num_segments; s++) {
                /* Without padding a segment must divide: a multiple of every degree's granules. */
                p->segments[s] = p->granule * (p->pad_multiple ? rnd(1, 30) : lcm * rnd(1, 6));
                total += p->segments[s];
            }
            t->desc.shape[p->axis] = total;
        }
        size_t bytes = (size_t)elements_of(t->desc.shape, t->desc.ndim) * tp_dtype_size(t->desc.dtype);
        t->logical = malloc(bytes);
        random_numbers(t->logical, bytes, t->desc.dtype);
        for (int k = 0; k < num_tps; k++)
            cr_assert_eq(ckpt_tensor_check(&t->desc, tps[k]), TP_OK, "%s", tp_errmsg());
    }
    return n;
}

void write_tensors(const char *path, const ckpt_layout *layout, test_tensor *tensors, int n,
                          int compress, int64_t step)
{
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.compress_level = compress;
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_create(&w, path, layout, &options), TP_OK, "%s", tp_errmsg());
    for (int i = 0; i < n; i++) {
        int id;
        cr_assert_eq(ckpt_writer_add_tensor(w, &tensors[i].desc, &id), TP_OK, "%s", tp_errmsg());
        int64_t pshape[CKPT_MAX_DIMS];
        ckpt_piece_shape(&tensors[i].desc, layout->tp, pshape);
        size_t es = tp_dtype_size(tensors[i].desc.dtype);
        int64_t row = elements_of(pshape + 1, tensors[i].desc.ndim - 1) * (int64_t)es;
        uint8_t *piece = malloc((size_t)(pshape[0] * row));
        int64_t block = ckpt_writer_block_rows(w, id);
        for (int p = 0; p < ckpt_piece_count(&tensors[i].desc, layout->tp); p++) {
            build_piece(&tensors[i].desc, layout->tp, p, tensors[i].logical, piece);
            /* Whole pieces, or block-aligned slabs written last-first. */
            if (rnd(0, 1)) {
                cr_assert_eq(ckpt_writer_put_piece(w, id, p, piece), TP_OK, "%s", tp_errmsg());
            } else {
                for (int64_t start = (pshape[0] - 1) / block * block; start >= 0; start -= block) {
                    int64_t rows = pshape[0] - start < block ? pshape[0] - start : block;
                    cr_assert_eq(ckpt_writer_put_rows(w, id, p, start, rows, piece + start * row), TP_OK,
                                 "%s", tp_errmsg());
                }
            }
        }
        free(piece);
    }
    ckpt_train_state state = {step, step * 8, "{\"arch\":\"test\"}", NULL, "[{\"rank\":0}]", NULL};
    cr_assert_eq(ckpt_writer_commit(w, &state), TP_OK, "%s", tp_errmsg());
}

/* Naive extraction of a box from the logical tensor. */
void extract(const test_tensor *t, const int64_t *start, const int64_t *count, uint8_t *out)
{
    size_t es = tp_dtype_size(t->desc.dtype);
    int64_t n = elements_of(count, t->desc.ndim);
    for (int64_t e = 0; e < n; e++) {
        int64_t rest = e, flat = 0, idx[CKPT_MAX_DIMS];
        for (int d = t->desc.ndim - 1; d >= 0; d--) {
            idx[d] = rest % count[d];
            rest /= count[d];
        }
        for (int d = 0; d < t->desc.ndim; d++) flat = flat * t->desc.shape[d] + start[d] + idx[d];
        memcpy(out + e * es, t->logical + flat * es, es);
    }
}

/* The logical digest straight from its definition in docs/FORMAT.md. */
static uint64_t mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t naive_digest(const uint8_t *logical, size_t element_size, int64_t n)
{
    uint64_t d = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t x = 0;
        memcpy(&x, logical + i * (int64_t)element_size, element_size);
        uint64_t k = (uint32_t)mix64(0x7470636B70744B00ull + (uint64_t)(i % 4096)) | 1u;
        uint64_t f = mix64(0x7470636B70744600ull + (uint64_t)(i / 4096)) | 1u;
        d += x * k * f;
    }
    return d;
}


int replay_corpus(const char *target, int (*one)(const uint8_t *data, size_t size))
{
    char corpus[512];
    snprintf(corpus, sizeof corpus, "tests/fuzz/corpus/%s", target);
    DIR *d = opendir(corpus);
    cr_assert(d, "%s (run from the repository root)", corpus);
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char file[1024];
        snprintf(file, sizeof file, "%s/%s", corpus, e->d_name);
        FILE *f = fopen(file, "rb");
        cr_assert(f, "%s", file);
        cr_assert_eq(fseek(f, 0, SEEK_END), 0);
        long size = ftell(f);
        rewind(f);
        uint8_t *data = malloc((size_t)size + 1);
        cr_assert(data && fread(data, 1, (size_t)size, f) == (size_t)size, "%s", file);
        fclose(f);
        one(data, (size_t)size);
        free(data);
        count++;
    }
    closedir(d);
    return count;
}

/* The file's text into text[size], ended by a NUL; returns its length. */
static size_t read_text(const char *file, char *text, size_t size)
{
    FILE *f = fopen(file, "rb");
    cr_assert(f, "%s", file);
    size_t n = fread(text, 1, size - 1, f);
    fclose(f);
    text[n] = '\0';
    return n;
}

void reseal_index(const char *file)
{
    /* The seal as docs/FORMAT.md defines it, computed here on its own: the
     * 16 hex digits of the last "index_checksum" member become XXH3-64 of
     * every byte before its key. */
    static char text[1 << 22];
    size_t n = read_text(file, text, sizeof text);
    static const char key[] = "\"index_checksum\":";
    char *at = NULL;
    for (char *p = text; (p = strstr(p, key)) != NULL; p++) at = p;
    cr_assert(at, "%s: no index_checksum to refresh", file);
    char *digits = strchr(at + strlen(key), '"');
    cr_assert(digits && strlen(digits) > 17 && digits[17] == '"', "%s: index_checksum is not a string of 16", file);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(text, (size_t)(at - text)));
    memcpy(digits + 1, hex, 16);
    FILE *f = fopen(file, "wb");
    cr_assert(f, "%s", file);
    cr_assert_eq(fwrite(text, 1, n, f), n);
    fclose(f);
}

void edit_index(const char *path, const char *from, const char *to)
{
    char file[700];
    snprintf(file, sizeof file, "%s/index.json", path);
    static char text[1 << 20];
    read_text(file, text, sizeof text);
    regex_t pattern;
    regmatch_t match;
    cr_assert_eq(regcomp(&pattern, from, REG_EXTENDED), 0, "%s", from);
    cr_assert_eq(regexec(&pattern, text, 1, &match, 0), 0, "%s: no match of %s", file, from);
    regfree(&pattern);
    FILE *f = fopen(file, "wb");
    cr_assert(f, "%s", file);
    fwrite(text, 1, (size_t)match.rm_so, f);
    fputs(to, f);
    fputs(text + match.rm_eo, f);
    cr_assert_eq(fclose(f), 0);
    reseal_index(file); /* the deeper check must answer, not the index's seal */
}

const char *fixture_python(void)
{
    const char *python = getenv("TP_PYTHON");
    return python && *python ? python : "/usr/bin/python3";
}
