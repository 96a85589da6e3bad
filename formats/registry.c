/* registry.c: the checkpoint formats, in one place (registry.h). Each
 * built-in format is a detect and an open over its reader (megatron.h,
 * dcp.h, ckpt.h) and a writer (registry_write.c); formats_register adds
 * others before them. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/error.h"
#include "registry.h"
#include "registry_write.h"

struct formats_source {
    const checkpoint_format *format;
    ckpt_reader *reader;
    /* The format's own handle: one of the built-ins', or a registered one's. */
    megatron_checkpoint *megatron;
    megatron_dist *dist;
    dcp_checkpoint *dcp;
    void *handle;
    void (*close_handle)(void *handle);
    char *name; /* formats_source_name */
};

static int open_megatron(const char *path, const formats_source_options *o, formats_source *s)
{
    TP_TRY(megatron_open(path, &s->megatron));
    if (o->true_vocab) TP_TRY(megatron_set_true_vocab(s->megatron, o->true_vocab));
    /* compute_digests compares them itself (megatron_reader_open). */
    if (o->compare_copies && !o->compute_digests) TP_TRY(megatron_refuse_differing_copies(s->megatron, o->threads));
    return megatron_reader_open(s->megatron, o->compute_digests, &s->reader);
}

static int open_megatron_dist(const char *path, const formats_source_options *o, formats_source *s)
{
    TP_TRY(megatron_dist_open(path, &s->dist));
    if (o->true_vocab) TP_TRY(megatron_dist_set_true_vocab(s->dist, o->true_vocab));
    /* compute_digests compares them itself (megatron_dist_reader_open). */
    if (o->compare_copies && !o->compute_digests) TP_TRY(megatron_dist_refuse_differing_copies(s->dist, o->threads));
    return megatron_dist_reader_open(s->dist, o->compute_digests, o->threads, &s->reader);
}

/* A DCP checkpoint carrying this toolkit's description has digests to
 * check against: they are computed only where it has none. */
static int open_dcp(const char *path, const formats_source_options *o, formats_source *s)
{
    TP_TRY(dcp_open(path, &s->dcp));
    return dcp_reader_open(s->dcp, o->compute_digests && !dcp_has_description(s->dcp), o->threads, &s->reader);
}

static int open_own(const char *path, const formats_source_options *o, formats_source *s)
{
    ckpt_read_options defaults;
    ckpt_read_options_init(&defaults);
    return ckpt_reader_open(&s->reader, path, o->read ? o->read : &defaults);
}

static const checkpoint_format builtin[] = {
    {"torch_dist", "Megatron-Core torch_dist", megatron_dist_detect, open_megatron_dist, &formats_torch_dist_writer, 1},
    {"dcp", "PyTorch distributed checkpoint", dcp_detect, open_dcp, &formats_dcp_writer, 0},
    {"megatron", "Megatron-LM legacy", megatron_detect, open_megatron, &formats_megatron_writer, 1},
    {"tp", "tp-toolkit", NULL, open_own, &formats_own_writer, 0}, /* the fallback: asked last */
};
#define NUM_BUILTIN ((int)(sizeof builtin / sizeof builtin[0]))

#define REGISTERED_MAX 16
static const checkpoint_format *registered[REGISTERED_MAX];
static int num_registered;
static pthread_mutex_t registered_lock = PTHREAD_MUTEX_INITIALIZER;

int formats_register(const checkpoint_format *format)
{
    if (!format->name || !format->detect || !format->open)
        return tp_fail(TP_ERR_ARG, "a format needs a name, a detect and an open");
    const formats_writer *w = format->writer;
    if (w && (!w->plan || !w->write || !w->free_plan || !w->may_replace))
        return tp_fail(TP_ERR_ARG, "the format %s: a writer needs a plan, a write, a free_plan and a may_replace",
                       format->name);
    if (formats_find(format->name)) return tp_fail(TP_ERR_EXISTS, "a format named %s exists already", format->name);
    pthread_mutex_lock(&registered_lock);
    int status = num_registered < REGISTERED_MAX
                     ? TP_OK
                     : tp_fail(TP_ERR_NOMEM, "no room for the format %s (%d at most)", format->name, REGISTERED_MAX);
    if (!status) registered[num_registered++] = format;
    pthread_mutex_unlock(&registered_lock);
    return status;
}

/* The i-th format asked: the registered ones, then the built-ins; NULL past the end. */
static const checkpoint_format *format_at(int i)
{
    pthread_mutex_lock(&registered_lock);
    const checkpoint_format *f = i < num_registered ? registered[i] : NULL;
    int n = num_registered;
    pthread_mutex_unlock(&registered_lock);
    if (i >= n && i - n < NUM_BUILTIN) f = &builtin[i - n];
    return f;
}

const checkpoint_format *formats_find(const char *name)
{
    const checkpoint_format *f;
    for (int i = 0; (f = format_at(i)) != NULL; i++)
        if (!strcmp(f->name, name)) return f;
    return NULL;
}

int formats_detect(const char *path, const checkpoint_format **out)
{
    /* A location no store serves is refused first, naming its scheme, not
     * the first file a format's detect would look for there. */
    const store_ops *store;
    TP_TRY(store_for(path, &store));
    /* A directory this process may not read is said to be that, not a
     * missing file of the first format asked (Megatron's tracker). */
    struct stat st;
    if (!store_is_remote(path) && stat(path, &st) == 0 && S_ISDIR(st.st_mode) && access(path, R_OK | X_OK) != 0)
        return tp_fail(TP_ERR_IO, "%s: cannot read the directory: %s", path, strerror(errno));
    const checkpoint_format *f;
    for (int i = 0; (f = format_at(i)) != NULL; i++) {
        int found = 1;
        /* A detect looks for a file of its format (Megatron's tracker first):
         * its failure (a store that cannot be reached) names the location
         * given, then the file. */
        if (f->detect) {
            int status = f->detect(path, &found);
            if (status) return tp_fail_context(status, "%s: cannot tell its checkpoint format", path);
        }
        if (found) {
            *out = f;
            return TP_OK;
        }
    }
    return tp_fail(TP_ERR_STATE, "no checkpoint format to read %s", path); /* not reached: the fallback has none */
}

int formats_source_open(const char *path, const checkpoint_format *format, const formats_source_options *options,
                        formats_source **out)
{
    *out = NULL;
    formats_source_options defaults = {0};
    if (!options) options = &defaults;
    if (!format) TP_TRY(formats_detect(path, &format));
    formats_source *s = calloc(1, sizeof *s);
    if (!s) return tp_fail(TP_ERR_NOMEM, "out of memory");
    s->format = format;
    int status = format->open(path, options, s);
    /* Refused once open, so that a path that is no checkpoint says that. */
    if (!status && options->true_vocab && !format->pads_vocabulary)
        status = tp_fail(TP_ERR_ARG, "%s: a true vocabulary size applies to a Megatron checkpoint (Megatron-LM legacy or "
                         "Megatron-Core torch_dist), not to this one (%s)", path, format->title);
    /* Named as given: a run directory's default output is named after the
     * run directory, beside it (after the step it read, run/step_N_tp2pp1,
     * it lay inside the input, where -o is refused). */
    if (!status && !(s->name = strdup(path)))
        status = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (status) {
        formats_source_close(s);
        return status;
    }
    *out = s;
    return TP_OK;
}

void formats_source_attach(formats_source *s, void *handle, void (*close)(void *handle), ckpt_reader *reader)
{
    s->handle = handle;
    s->close_handle = close;
    s->reader = reader;
}

const checkpoint_format *formats_source_format(const formats_source *s)
{
    return s->format;
}

ckpt_reader *formats_source_reader(const formats_source *s)
{
    return s->reader;
}

megatron_checkpoint *formats_source_megatron(const formats_source *s)
{
    return s->megatron;
}

const megatron_dist *formats_source_megatron_dist(const formats_source *s)
{
    return s->dist;
}

const dcp_checkpoint *formats_source_dcp(const formats_source *s)
{
    return s->dist ? megatron_dist_dcp(s->dist) : s->dcp;
}

const megatron_config *formats_source_megatron_config(const formats_source *s)
{
    return s->megatron ? megatron_config_of(s->megatron) : s->dist ? megatron_dist_config(s->dist) : NULL;
}

const char *formats_source_name(const formats_source *s)
{
    return s->name;
}

void formats_source_close(formats_source *s)
{
    if (!s) return;
    free(s->name);
    ckpt_reader_close(s->reader);
    megatron_close(s->megatron);
    megatron_dist_close(s->dist);
    dcp_close(s->dcp);
    if (s->close_handle) s->close_handle(s->handle);
    free(s);
}
