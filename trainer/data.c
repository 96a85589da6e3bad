/* data.c: token files (llm.c's two formats: a 256-int32 header with the
 * magic, the version and the token count, then uint16 or uint32 tokens as
 * the pair says), globs of them, and the synthetic dataset. Files stay open
 * and each window is read with pread(2): a mapping would kill the trainer
 * with SIGBUS, and no message, when a file is cut short under it, and would
 * hand the embedding whatever a rewrite in place put there; a read fails
 * with a message, and every token read is checked against the vocabulary
 * again. prepare writes token files from text, through the store's staging
 * (store/staging.h) as every output is. */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/error.h"
#include "../common/file.h"
#include "../common/random.h"
#include "../store/staging.h"
#include "../store/store.h"
#include "data.h"

#define SYNTH_KEEP 0.75 /* probability that a token follows the rule */
#define HEADER_BYTES ((int64_t)(DATA_HEADER_INTS * sizeof(int32_t))) /* where the tokens start */
#define READ_BYTES 32768 /* bytes of tokens per pread (on the stack) */

/* The formats read, by their (magic, version) pair: llm.c's GPT-2 and
 * Llama-3 shards (dev/data/data_common.py HEADERS_INFO). The pair is
 * checked whole: a known magic with another version may have another
 * layout, and reading it with this one would train on garbage. */
static const struct {
    int32_t magic, version;
    int width;        /* bytes per token */
    const char *type; /* of a token, for messages */
    const char *name; /* llm.c's */
} FORMATS[] = {
    {DATA_MAGIC_GPT2, DATA_VERSION_GPT2, 2, "uint16", "GPT-2"},
    {DATA_MAGIC_LLAMA3, DATA_VERSION_LLAMA3, 4, "uint32", "Llama-3"},
};
#define NUM_FORMATS ((int)(sizeof FORMATS / sizeof *FORMATS))

typedef struct {
    char *path; /* for messages */
    int fd;     /* -1 when not open */
    int width;  /* bytes per token, of its format (FORMATS) */
    int64_t count;
} token_file;

struct dataset {
    uint64_t seed;
    int64_t vocab;
    token_file *files;
    int num_files;
    int64_t total;
};

/* The header of the token file open as fd (path names it in messages): its
 * token count and format (an index into FORMATS), or TP_ERR_FORMAT saying
 * what is wrong. */
static int read_header(int fd, const char *path, int64_t *count_out, int *format_out)
{
    struct stat st;
    int32_t header[DATA_HEADER_INTS];
    if (fstat(fd, &st) != 0) return tp_fail(TP_ERR_IO, "%s: %s", path, strerror(errno));
    if (st.st_size < (off_t)sizeof header)
        return tp_fail(TP_ERR_FORMAT, "%s: not a token file (%lld bytes, shorter than its %zu-byte header)", path,
                       (long long)st.st_size, sizeof header);
    if (pread(fd, header, sizeof header, 0) != (ssize_t)sizeof header)
        return tp_fail(TP_ERR_IO, "%s: cannot read the header: %s", path, strerror(errno));
    int format = -1;
    for (int i = 0; i < NUM_FORMATS; i++)
        if (header[0] == FORMATS[i].magic && header[1] == FORMATS[i].version) format = i;
    if (format < 0) {
        char known[256] = "";
        for (int i = 0, n = 0; i < NUM_FORMATS; i++)
            n += snprintf(known + n, sizeof known - (size_t)n, "%smagic %d version %d, %s tokens (llm.c's %s shards)",
                          i ? "; " : "", FORMATS[i].magic, FORMATS[i].version, FORMATS[i].type, FORMATS[i].name);
        return tp_fail(TP_ERR_FORMAT, "%s: not a token file of a known format (magic %d, version %d; known: %s)", path,
                       header[0], header[1], known);
    }
    const int width = FORMATS[format].width;
    const char *type = FORMATS[format].type;
    int64_t count = header[2], bytes = (int64_t)st.st_size - (int64_t)sizeof header;
    if (count < 0)
        return tp_fail(TP_ERR_FORMAT, "%s: header says %lld tokens: a count below 0 (a damaged header)", path,
                       (long long)count);
    if (count < 2 && count * width <= bytes)
        return tp_fail(TP_ERR_FORMAT, "%s: holds %lld token%s; a token file needs at least 2 (an input and its target)",
                       path, (long long)count, count == 1 ? "" : "s");
    if (count < 2 || count * width > bytes)
        return tp_fail(TP_ERR_FORMAT,
                       "%s: header says %lld tokens (%lld bytes of %s), the file holds %lld (truncated?)", path,
                       (long long)count, (long long)count * width, type, (long long)(bytes / width));
    /* More than the header counts: tokens of another width (a Llama-3
     * file's uint32 ids under a GPT-2 header, read as uint16, would train on
     * every other one being 0), or a header written for a part of them.
     * llm.c refuses such a file too. */
    if (count * width < bytes)
        return tp_fail(TP_ERR_FORMAT,
                       "%s: header says %lld tokens (%lld bytes of %s), the file holds %lld bytes after the header "
                       "(tokens of another width, or a damaged header?)",
                       path, (long long)count, (long long)count * width, type, (long long)bytes);
    *count_out = count;
    *format_out = format;
    return TP_OK;
}

/* Tokens [first, first + count) of f into tokens (NULL: only checked),
 * each checked against the vocabulary: the file may have been cut short or
 * rewritten since it was opened, whole and in range. The width is decided
 * once a chunk, not once a token: this is the trainer's and eval's only
 * path to the tokens. */
static int read_file_tokens(const token_file *f, int64_t first, int64_t count, int64_t vocab, int *tokens)
{
    union { /* pread fills its bytes; the file's width says which view holds tokens */
        uint16_t u16[READ_BYTES / 2];
        uint32_t u32[READ_BYTES / 4];
    } chunk;
    const int width = f->width;
    for (int64_t done = 0; done < count;) {
        int64_t want = count - done < READ_BYTES / width ? count - done : READ_BYTES / width, got = 0;
        off_t at = (off_t)(HEADER_BYTES + (first + done) * width);
        while (got < want) {
            ssize_t n = pread(f->fd, (char *)&chunk + got * width, (size_t)((want - got) * width),
                              at + (off_t)(got * width));
            if (n < 0 && errno == EINTR) continue;
            if (n < 0)
                return tp_fail(TP_ERR_IO, "%s: cannot read token %lld: %s", f->path, (long long)(first + done + got),
                               strerror(errno));
            /* A regular file reads short only at its end: less than a token
             * is the end, and a token split by it is read again, whole or
             * not at all, by the next pread. */
            if (n < width)
                return tp_fail(TP_ERR_FORMAT,
                               "%s: ends before token %lld, though it held %lld tokens when opened (cut short while "
                               "in use?)",
                               f->path, (long long)(first + done + got), (long long)f->count);
            got += n / width;
        }
        /* Ids compared as int64: a uint32 id can exceed INT32_MAX, and one
         * below the vocabulary fits in an int (GPT_MAX_SIZE). */
        int64_t bad = -1, id = 0;
        if (width == 2) {
            for (int64_t i = 0; i < want; i++) {
                if ((int64_t)chunk.u16[i] >= vocab) {
                    bad = i;
                    id = chunk.u16[i];
                    break;
                }
                if (tokens) tokens[done + i] = chunk.u16[i];
            }
        } else {
            for (int64_t i = 0; i < want; i++) {
                if ((int64_t)chunk.u32[i] >= vocab) {
                    bad = i;
                    id = chunk.u32[i];
                    break;
                }
                if (tokens) tokens[done + i] = (int)chunk.u32[i];
            }
        }
        if (bad >= 0)
            return tp_fail(TP_ERR_FORMAT, "%s: token %lld at position %lld is outside the vocabulary of %lld", f->path,
                           (long long)id, (long long)(first + done + bad), (long long)vocab);
        done += want;
    }
    return TP_OK;
}

/* Opens the token file at path into f (which dataset_close then closes,
 * whole or not): its header and every token checked. */
static int open_file(token_file *f, const char *path, int64_t vocab)
{
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path) return tp_fail(TP_ERR_NOMEM, "out of memory");
    TP_TRY(tp_open_regular(path, &f->fd));
    int format;
    TP_TRY(read_header(f->fd, path, &f->count, &format));
    f->width = FORMATS[format].width;
    return read_file_tokens(f, 0, f->count, vocab, NULL);
}

int dataset_open(dataset **out, const char *pattern, int64_t vocab, uint64_t seed)
{
    *out = NULL;
    dataset *d = calloc(1, sizeof *d);
    if (!d) return tp_fail(TP_ERR_NOMEM, "out of memory");
    d->seed = seed;
    d->vocab = vocab;
    if (!pattern) {
        *out = d;
        return TP_OK;
    }
    /* A path that exists is that file, even when it reads as a pattern
     * (shard[1].bin); anything else is a glob. */
    glob_t g;
    char *literal[1] = {(char *)pattern};
    char **paths = literal;
    size_t num_paths = 1;
    struct stat st;
    int globbed = stat(pattern, &st) != 0;
    if (globbed) {
        int found = glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0;
        if (!found) {
            globfree(&g);
            free(d);
            return tp_fail(TP_ERR_NOT_FOUND, "%s: no such token file", pattern);
        }
        paths = g.gl_pathv;
        num_paths = g.gl_pathc;
    }
    d->files = calloc(num_paths, sizeof *d->files);
    int status = d->files ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < num_paths && !status; i++) {
        errno = 0;
        status = open_file(&d->files[d->num_files], paths[i], vocab);
        if (status && errno == EMFILE) /* each file stays open for the run */
            status = tp_fail_context(status, "%s matches %zu files, each held open for the run; the process may open "
                                     "fewer (ulimit -n; tp-train raises its soft limit to the hard one)",
                                     pattern, num_paths);
        if (d->files[d->num_files].path) d->num_files++; /* closed by dataset_close, whole or not */
        if (!status) d->total += d->files[d->num_files - 1].count;
    }
    if (globbed) globfree(&g);
    if (status) {
        dataset_close(d);
        return status;
    }
    *out = d;
    return TP_OK;
}

void dataset_close(dataset *d)
{
    if (!d) return;
    for (int i = 0; i < d->num_files; i++) {
        if (d->files[i].fd >= 0) close(d->files[i].fd);
        free(d->files[i].path);
    }
    free(d->files);
    free(d);
}

int64_t dataset_tokens(const dataset *d)
{
    return d->total;
}

int64_t dataset_longest_file(const dataset *d)
{
    int64_t longest = 0;
    for (int i = 0; i < d->num_files; i++)
        if (d->files[i].count > longest) longest = d->files[i].count;
    return longest;
}

int dataset_files_shorter_than(const dataset *d, int64_t window, const char **names, int64_t *counts, int max_names)
{
    int shorter = 0;
    for (int i = 0; i < d->num_files; i++) {
        if (d->files[i].count >= window) continue;
        if (shorter < max_names) {
            names[shorter] = d->files[i].path;
            counts[shorter] = d->files[i].count;
        }
        shorter++;
    }
    return shorter;
}

int dataset_read_tokens(const dataset *d, int64_t first, int64_t count, int *tokens)
{
    if (first < 0 || count < 0 || first + count > d->total)
        return tp_fail(TP_ERR_ARG, "tokens [%lld, %lld) are not inside the %lld of the token files", (long long)first,
                       (long long)(first + count), (long long)d->total);
    for (int i = 0; i < d->num_files && count > 0; i++) {
        const token_file *f = &d->files[i];
        if (first >= f->count) {
            first -= f->count;
            continue;
        }
        int64_t n = f->count - first < count ? f->count - first : count;
        TP_TRY(read_file_tokens(f, first, n, d->vocab, tokens));
        tokens += n;
        count -= n;
        first = 0;
    }
    return TP_OK;
}

int dataset_sample(const dataset *d, int64_t index, int64_t seq, int *tokens)
{
    uint64_t z = splitmix64(d->seed ^ splitmix64((uint64_t)index));
    if (!d->num_files) {
        /* The rule: next = (5 * previous + 3) mod vocab. */
        tokens[0] = (int)(z % (uint64_t)d->vocab);
        for (int64_t t = 1; t <= seq; t++) {
            z = splitmix64(z);
            double u = (double)(z >> 11) * 0x1.0p-53;
            tokens[t] = u < SYNTH_KEEP ? (int)((5 * (int64_t)tokens[t - 1] + 3) % d->vocab)
                                       : (int)(splitmix64(z ^ 0xA5A5A5A5ull) % (uint64_t)d->vocab);
        }
        return TP_OK;
    }
    /* A window of seq + 1 tokens inside one file. */
    int64_t windows = 0;
    for (int i = 0; i < d->num_files; i++) windows += d->files[i].count > seq ? d->files[i].count - seq : 0;
    int64_t w = windows > 0 ? (int64_t)(z % (uint64_t)windows) : 0;
    for (int i = 0; i < d->num_files; i++) {
        int64_t n = d->files[i].count > seq ? d->files[i].count - seq : 0;
        if (w < n) return read_file_tokens(&d->files[i], w, seq + 1, d->vocab, tokens);
        w -= n;
    }
    return tp_fail(TP_ERR_ARG, "%s: no token file holds a window of %lld tokens (sequence length %lld + 1)",
                   d->files[0].path, (long long)(seq + 1), (long long)seq);
}

double dataset_loss_floor(const dataset *d)
{
    if (d->num_files) return -1;
    double V = (double)d->vocab, hit = SYNTH_KEEP + (1 - SYNTH_KEEP) / V, miss = (1 - SYNTH_KEEP) / V;
    return -(hit * log(hit) + (V - 1) * miss * log(miss));
}

/* ------------------------------------------------------------- prepare */

/* What --force may replace with a token file (a store_replace_check): an
 * earlier token file, whole (what --data reads); anything else is refused,
 * saying what it is. */
static int token_file_may_replace(const store_ops *storage, const char *path, void *ctx)
{
    (void)storage;
    (void)ctx;
    const char *only = "--force replaces only a token file (an earlier output of prepare, docs/DATA.md)";
    struct stat st;
    if (stat(path, &st) != 0) return TP_OK; /* gone meanwhile */
    if (!S_ISREG(st.st_mode))
        return tp_fail(TP_ERR_EXISTS, "%s is %s, not a token file; %s", path,
                       S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket", only);
    int fd;
    int status = tp_open_regular(path, &fd);
    if (!status) {
        int64_t count;
        int format;
        status = read_header(fd, path, &count, &format);
        close(fd);
    }
    if (!status) return TP_OK;
    char what[512];
    snprintf(what, sizeof what, "%s", tp_errmsg());
    return tp_fail(TP_ERR_EXISTS, "%s; %s", what, only);
}

/* The input (open as in) is never replaced by its own tokens, whatever
 * path names it for the output: another name, a symbolic or hard link. */
static int refuse_input_as_output(FILE *in, const char *text_path, const char *out_path)
{
    struct stat from, to;
    if (fstat(fileno(in), &from) != 0 || stat(out_path, &to) != 0) return TP_OK;
    if (from.st_dev != to.st_dev || from.st_ino != to.st_ino) return TP_OK;
    return tp_fail(TP_ERR_EXISTS, "%s is the input %s (the same file); prepare never replaces its input, even with --force",
                   out_path, text_path);
}

/* Bytes read from the text at a time: their tokens, twice as many bytes,
 * go out in writes large enough to start their writeback at once. */
#define PREPARE_CHUNK ((size_t)1 << 19)

/* Tokens of every byte of in, written to out after the header's place;
 * *count_out: how many. */
static int write_tokens(FILE *in, const char *text_path, const store_ops *s, store_file *out, int64_t *count_out)
{
    unsigned char *bytes = malloc(PREPARE_CHUNK);
    uint16_t *tokens = malloc(PREPARE_CHUNK * sizeof *tokens);
    int status = bytes && tokens ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    int64_t count = 0;
    size_t got;
    while (!status && (got = fread(bytes, 1, PREPARE_CHUNK, in)) > 0) {
        /* The header counts in an int32: an endless input (/dev/zero) or a
         * larger one stops here, not after writing all of it. */
        if (count + (int64_t)got > INT32_MAX) {
            status = tp_fail(TP_ERR_FORMAT, "%s: more than %d bytes: a token file holds 2 to %d tokens", text_path,
                             INT32_MAX, INT32_MAX);
            break;
        }
        for (size_t i = 0; i < got; i++) tokens[i] = bytes[i]; /* byte-level vocabulary: token = byte */
        status = s->write_at(out, tokens, got * sizeof *tokens, HEADER_BYTES + count * (int64_t)sizeof *tokens);
        count += (int64_t)got;
    }
    if (!status && ferror(in)) status = tp_fail(TP_ERR_IO, "%s: cannot read: %s", text_path, strerror(errno));
    free(bytes);
    free(tokens);
    *count_out = count;
    return status;
}

int dataset_prepare(const char *text_path, const char *out_path, int overwrite)
{
    FILE *in = fopen(text_path, "rb");
    if (!in) return tp_fail(TP_ERR_IO, "%s: cannot open: %s", text_path, strerror(errno));
    const store_ops *s = store_posix();
    store_stage_options stage = {.overwrite = overwrite, .may_replace = token_file_may_replace};
    store_staged *staged = NULL;
    store_file *out = NULL;
    int64_t count = 0;
    int status = refuse_input_as_output(in, text_path, out_path);
    struct stat st; /* a file known too large is refused before a byte is written */
    if (!status && fstat(fileno(in), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > INT32_MAX)
        status = tp_fail(TP_ERR_FORMAT, "%s: %lld bytes: a token file holds 2 to %d tokens", text_path,
                         (long long)st.st_size, INT32_MAX);
    if (!status) status = store_stage(s, out_path, &stage, &staged);
    /* The staging file exists (store_stage made it): opened, never made
     * again, so that a signal's clean-up that removed it stays done. */
    if (!status) status = s->open(s, store_staged_path(staged), STORE_OPEN_WRITE, &out);
    if (!status) status = write_tokens(in, text_path, s, out, &count);
    fclose(in);
    if (!status && count < 2)
        status = tp_fail(TP_ERR_FORMAT, "%s: %lld bytes: a token file holds 2 to %d tokens", text_path,
                         (long long)count, INT32_MAX);
    if (!status) {
        int32_t header[DATA_HEADER_INTS] = {DATA_MAGIC_GPT2, DATA_VERSION_GPT2, (int32_t)count};
        status = s->write_at(out, header, sizeof header, 0);
    }
    if (out) s->close(out);
    if (!status) return store_staged_publish(staged); /* synced, then renamed; removed on failure */
    store_staged_discard(staged);
    return status;
}
