/* registry_write.c: the built-in formats' writers behind the registry
 * (registry.h): each plans with its library (reshard.h, megatron.h, dcp.h),
 * says what it will do in the words of a summary, and writes. What is
 * refused for every output, an optimizer state that was not read, is
 * refused here once. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "../common/parse.h"
#include "registry_write.h"

struct formats_write_plan {
    const checkpoint_format *format;
    const formats_writer *writer;
    void *state;
    formats_write_summary summary;
};

void formats_write_options_init(formats_write_options *o)
{
    memset(o, 0, sizeof *o);
    reshard_options_init(&o->reshard);
    o->dp = 1;
    o->naming = -1;
    o->torch_version = -1;
    o->common = MEGATRON_CORE_COMMON_ENTRY;
}

/* One line of --dry-run's plan: label, then the text. */
static void detail(formats_write_summary *s, const char *label, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void detail(formats_write_summary *s, const char *label, const char *fmt, ...)
{
    if (s->details >= FORMATS_WRITE_DETAILS) return;
    snprintf(s->detail[s->details].label, sizeof s->detail[s->details].label, "%s", label);
    va_list args;
    va_start(args, fmt);
    vsnprintf(s->detail[s->details].text, sizeof s->detail[s->details].text, fmt, args);
    va_end(args);
    s->details++;
}

/* The lines every writer's plan ends with: bytes written, the work at once, the buffers. */
static void detail_work(formats_write_summary *s, int64_t bytes, int rank_files, int64_t buffers, const char *of)
{
    char text[32];
    format_bytes((double)bytes, text, sizeof text);
    detail(s, "write", "%s", text);
    detail(s, "work", "%d rank files at once", rank_files);
    format_bytes((double)buffers, text, sizeof text);
    detail(s, "memory", "%s of %s", text, of);
}

/* What every foreign writer's summary holds: its layout, bytes and threads,
 * and the JSON keys they share (the format's own are added after). */
static void summarize(formats_write_summary *s, const char *format, int tp, int pp, int files, int tensors,
                      int64_t bytes, int threads, int64_t buffer_memory)
{
    s->to = (ckpt_layout){.tp = tp, .pp = pp};
    s->bytes_written = bytes;
    s->threads = threads;
    cJSON *j = s->json;
    cJSON_AddStringToObject(j, "format", format);
    cJSON_AddNumberToObject(j, "files", files);
    cJSON_AddNumberToObject(j, "tensors", tensors);
    cJSON_AddNumberToObject(j, "bytes_written", (double)bytes);
    cJSON_AddNumberToObject(j, "threads", threads);
    cJSON_AddNumberToObject(j, "buffer_memory", (double)buffer_memory);
}

/* What reading another tool's output back needs a thread (tp-reshard
 * --verify reopens it, its digests computed): each piece as the reader
 * presents it at the output's degree, through the bounce buffer of its
 * boxes, from the source's tensors (a Megatron output pads its vocabulary
 * by at most 128 rows a rank more, which the allowance covers). */
static void foreign_read_back(formats_write_summary *s, ckpt_reader *source)
{
    for (int i = 0; i < ckpt_reader_num_tensors(source); i++) {
        int64_t need = ckpt_tensor_verify_read_bytes(ckpt_reader_tensor(source, i), s->to.tp, 0, 1);
        if (need > s->read_back_bytes) s->read_back_bytes = need;
    }
}

/* Adds a sentence to the summary's warning (said after the write). */
static void warn(formats_write_summary *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(formats_write_summary *s, const char *fmt, ...)
{
    size_t used = strlen(s->warning);
    if (used && used + 2 < sizeof s->warning) {
        memcpy(s->warning + used, "; ", 3);
        used += 2;
    }
    va_list args;
    va_start(args, fmt);
    vsnprintf(s->warning + used, sizeof s->warning - used, fmt, args);
    va_end(args);
}

/* Fewer query groups than the output's ranks (a Megatron-Core model's
 * group cut between tp / groups ranks, megatron_check_layout): loaded by
 * Megatron-Core 0.16 and later only (f7dfb99795, 2025-12-06; before it,
 * Attention divide()s the groups by tp), said in the plan and after the
 * write. */
static void note_groups_cut(formats_write_summary *s, const megatron_config *c, int tp)
{
    if (c->query_groups % tp == 0) return;
    char text[200];
    snprintf(text, sizeof text, "%lld query groups over tp %d, each group's rows cut between %lld ranks: Megatron-Core "
             "0.16 and later load that, older releases cannot build the model", (long long)c->query_groups, tp,
             (long long)(tp / c->query_groups));
    detail(s, "note", "%s", text);
    warn(s, "%s", text);
}

static const char *optimizer_text(int optimizer)
{
    return optimizer ? "weights and optimizer state" : "weights only";
}

/* Chunks of layers interleaved over the stages are this toolkit's format's
 * alone: asked for, refused; a source's that --to did not name are said to
 * be left (the output's stages hold consecutive layers), not shown only by
 * the summary's layout. */
static int refuse_interleaved(ckpt_reader *source, const formats_write_options *o, const char *title,
                              formats_write_summary *s)
{
    int chunks = ckpt_layout_chunks(ckpt_reader_layout(source));
    if (o->reshard.virtual_stages == 0 && chunks > 1)
        warn(s, "the source's %d chunks of layers a stage (the interleaved schedule) are not kept: %s holds "
                "consecutive layers on each stage", chunks, title);
    if (o->reshard.virtual_stages <= 1) return TP_OK;
    ckpt_layout to = reshard_target_layout(ckpt_reader_layout(source), &o->reshard);
    char text[RESHARD_LAYOUT_TEXT_MAX];
    reshard_layout_text(&to, text);
    return tp_fail(TP_ERR_ARG, "--to %s: chunks of layers interleaved over the stages are written in this toolkit's "
                               "format only (--format tp), not as %s", text, title);
}

/* ---- this toolkit's format: reshard.h ---------------------------------- */

/* A Megatron-LM checkpoint under legacy names keeps a rank's query groups
 * whole (its fused QKV's granule is a group, megatron_describe): at a tp
 * the groups do not divide, the partition's refusal ("granules ... not
 * divisible by tp") is said as what it means, with the way that works. */
static int explain_groups(formats_source *source, const formats_write_options *o, int status)
{
    const megatron_checkpoint *m = formats_source_megatron(source);
    const megatron_config *c = m ? megatron_config_of(m) : NULL;
    ckpt_layout to = reshard_target_layout(ckpt_reader_layout(formats_source_reader(source)), &o->reshard);
    if (!c || c->naming >= MEGATRON_NAMES_CORE || c->query_groups % to.tp == 0) return status;
    return tp_fail_context(status, "%lld query groups do not divide over tp %d, and under Megatron's legacy names "
                           "each rank keeps whole groups (tp-ckpt import --tp %d converts it for tp-train, its key and "
                           "value heads replicated over the ranks sharing them)",
                           (long long)c->query_groups, to.tp, to.tp);
}

static int plan_own(formats_source *source, const formats_write_options *o, formats_write_summary *s, void **state)
{
    reshard_plan *plan = NULL;
    int status = reshard_plan_create(&plan, formats_source_reader(source), &o->reshard);
    if (status) return explain_groups(source, o, status);
    *state = plan;
    const reshard_summary *r = reshard_plan_summary(plan);
    char read[32], written[32], buffers[32], limit[32], slab[32];
    format_bytes((double)r->bytes_read, read, sizeof read);
    format_bytes((double)r->bytes_written, written, sizeof written);
    format_bytes((double)r->buffer_memory, buffers, sizeof buffers);
    format_bytes((double)r->memory_limit, limit, sizeof limit);
    format_bytes((double)r->slab_bytes, slab, sizeof slab);
    s->to = r->to;
    char to[RESHARD_LAYOUT_TEXT_MAX];
    reshard_layout_text(&r->to, to);
    snprintf(s->target, sizeof s->target, "%s", to);
    snprintf(s->contents, sizeof s->contents, "%d tensors, %s read", r->tensors, read);
    s->bytes_written = r->bytes_written;
    s->threads = r->threads;
    s->read_back_bytes = r->read_back_bytes;
    s->keeps_latest = 1;
    if (r->device_reason) snprintf(s->device, sizeof s->device, "%s: %s", r->device, r->device_reason);
    else snprintf(s->device, sizeof s->device, "%s", r->device);
    detail(s, "files", "%d shard files: shard_pp00_tp00.h5 .. shard_pp%02d_tp%02d.h5", r->files_written, r->to.pp - 1,
           r->to.tp - 1);
    detail(s, "tensors", "%d (%lld pieces)%s", r->tensors, (long long)r->pieces_written,
           r->tensors_dropped ? ", optimizer state left out" : "");
    detail(s, "read", "%s from the source", read);
    detail(s, "write", "%s", written);
    detail(s, "work", "%lld slabs on %d threads (%s), slabs up to %s", (long long)r->slabs, r->threads, s->device, slab);
    detail(s, "memory", "%s of buffers within a limit of %s", buffers, limit);
    cJSON *j = s->json;
    cJSON_AddStringToObject(j, "format", "tp");
    cJSON_AddNumberToObject(j, "tensors", r->tensors);
    cJSON_AddNumberToObject(j, "files", r->files_written);
    cJSON_AddNumberToObject(j, "pieces", (double)r->pieces_written);
    cJSON_AddNumberToObject(j, "bytes_read", (double)r->bytes_read);
    cJSON_AddNumberToObject(j, "bytes_written", (double)r->bytes_written);
    cJSON_AddNumberToObject(j, "threads", r->threads);
    cJSON_AddNumberToObject(j, "buffer_memory", (double)r->buffer_memory);
    cJSON_AddNumberToObject(j, "memory_limit", (double)r->memory_limit);
    cJSON_AddStringToObject(j, "device", r->device);
    if (r->device_reason) cJSON_AddStringToObject(j, "device_reason", r->device_reason);
    return TP_OK;
}

static int write_own(void *state, const char *path)
{
    return reshard_execute(state, path);
}

static void free_own(void *state)
{
    reshard_plan_free(state);
}

/* ---- the Megatron writers: a Megatron source's model, or a view -------- */

/* The model a Megatron writer writes: the source's, or its view's (this
 * toolkit's GPT under Megatron's names). */
typedef struct {
    const megatron_config *model;
    const megatron_source_names *names; /* NULL: the source's names are Megatron's */
    megatron_config viewed;
    megatron_source_names viewed_names;
    const formats_megatron_view *view;
    void *view_state;
} megatron_model;

static int megatron_model_open(formats_source *source, const formats_write_options *o, const char *title,
                               megatron_model *m)
{
    m->model = formats_source_megatron_config(source);
    if (m->model) return TP_OK;
    ckpt_reader *reader = formats_source_reader(source);
    if (!o->megatron_view)
        return tp_fail(TP_ERR_ARG, "%s: not a Megatron model, and no view of it as one: it is not written as %s",
                       ckpt_reader_path(reader), title);
    TP_TRY(o->megatron_view->open(reader, &m->viewed, &m->viewed_names, &m->view_state));
    m->view = o->megatron_view;
    m->model = &m->viewed;
    m->names = &m->viewed_names;
    return TP_OK;
}

static void megatron_model_close(megatron_model *m)
{
    if (m->view) m->view->close(m->view_state);
}

static const char *regrouped_refusal =
    "--verify compares logical digests, and a GPT written as Megatron's regroups its QKV: import it back "
    "(tp-ckpt import) and diff instead";

/* The formats whose checkpoints carry a Megatron model of their own (formats_source_megatron_config). */
static int megatron_source(const checkpoint_format *format)
{
    return !strcmp(format->name, "megatron") || !strcmp(format->name, "torch_dist");
}

int formats_write_unverifiable(const checkpoint_format *source, const checkpoint_format *target, char *why, size_t size)
{
    if (!megatron_source(target) || megatron_source(source)) return 0;
    size_t n = strlen(source->title); /* "PyTorch distributed checkpoint" says it already */
    int named = n >= 10 && !strcmp(source->title + n - 10, "checkpoint");
    snprintf(why, size, "--verify cannot prove a %s output of a %s%s: it is written through a view of this "
             "toolkit's GPT, every tensor renamed and each fused QKV regrouped into Megatron's per-group order, so "
             "its logical digests are not the source's; import it back (tp-ckpt import) and diff instead",
             target->title, source->title, named ? "" : " checkpoint");
    return 1;
}

typedef struct {
    ckpt_reader *source;
    const megatron_checkpoint *template;
    megatron_model model;
    megatron_write_options options;
    megatron_write_plan plan;
} megatron_state;

static void free_megatron(void *state)
{
    megatron_state *w = state;
    if (!w) return;
    megatron_model_close(&w->model);
    free(w);
}

/* The names of a Megatron-LM output by default: the source's. A torch_dist
 * source keys its layers under Transformer Engine's names whatever its
 * modules (gpt_layer_specs.py's sharded_state_dict_keys_map: its keys are
 * the same for both); its args.transformer_impl says which modules a
 * legacy rank file names (the local ones: core-local), as the reader of its
 * distributed optimizer's buffers takes it (docs/MEGATRON.md). */
static megatron_naming default_names(const megatron_model *m, const megatron_dist *dist)
{
    if (m->view) return MEGATRON_NAMES_LEGACY;
    if (dist && m->model->impl == MEGATRON_IMPL_LOCAL) return MEGATRON_NAMES_CORE_LOCAL;
    return m->model->naming;
}

static int plan_megatron(formats_source *source, const formats_write_options *o, formats_write_summary *s, void **state)
{
    ckpt_reader *reader = formats_source_reader(source);
    TP_TRY(refuse_interleaved(reader, o, "Megatron-LM's", s));
    megatron_state *w = calloc(1, sizeof *w);
    if (!w) return tp_fail(TP_ERR_NOMEM, "out of memory");
    *state = w;
    w->source = reader;
    w->template = formats_source_megatron(source);
    const megatron_dist *dist = formats_source_megatron_dist(source);
    TP_TRY(megatron_model_open(source, o, "Megatron-LM's", &w->model));
    if (w->model.view && o->verify) return tp_fail(TP_ERR_ARG, "%s", regrouped_refusal);
    if (dist && megatron_dist_config(dist)->optimizer_read && !o->reshard.drop_optimizer)
        return tp_fail(TP_ERR_ARG, "%s: the optimizer's state of a torch_dist checkpoint is not written as a legacy "
                                   "Megatron optimizer (its param groups and schedule belong to the run; --format tp or "
                                   "dcp keep it); --weights-only converts the weights", ckpt_reader_path(reader));
    megatron_naming names = o->naming >= 0 ? (megatron_naming)o->naming : default_names(&w->model, dist);
    w->options = (megatron_write_options){
        .tp = o->reshard.tp, .pp = o->reshard.pp, .naming = (int)names, .overwrite = o->reshard.overwrite,
        .threads = o->reshard.threads,
        /* a view's optimizer layout is not a Megatron run's */
        .weights_only = o->reshard.drop_optimizer || w->model.view,
        .memory_limit = o->reshard.memory_limit, .model = w->template ? NULL : w->model.model, .dist = dist,
        .names = w->model.names, .on_bytes = o->reshard.on_bytes, .progress_ctx = o->reshard.progress_ctx};
    TP_TRY(megatron_write_plan_create(reader, w->template, &w->options, &w->plan));
    const megatron_write_plan *p = &w->plan;
    summarize(s, "megatron-legacy", p->tp, p->pp, p->files, p->tensors, p->bytes, p->threads, p->buffer_memory);
    foreign_read_back(s, reader);
    snprintf(s->target, sizeof s->target, "Megatron-LM tp%dpp%d, %s names", p->tp, p->pp, megatron_naming_name(names));
    snprintf(s->contents, sizeof s->contents, "%d tensors, %s", p->tensors, optimizer_text(p->optimizer));
    /* The output's vocabulary padded for its TP: described by the true size, as the source is. */
    s->true_vocab = w->model.view ? 0 : w->model.model->true_vocab;
    detail(s, "files", "%d rank files model_optim_rng.pt", p->files);
    detail(s, "tensors", "%d, %s", p->tensors, optimizer_text(p->optimizer));
    detail_work(s, p->bytes, p->threads, p->buffer_memory, "piece buffers");
    if (p->rank_state_dropped) {
        char from[RESHARD_LAYOUT_TEXT_MAX];
        reshard_layout_text(ckpt_reader_saved_layout(reader), from);
        detail(s, "note", "the ranks' RNG states are left out: the layout changes");
        warn(s, "the ranks' RNG states were left out: they belong to the layout %s (Megatron drops them on a change of "
                "layout too)", from);
    }
    note_groups_cut(s, w->model.model, p->tp);
    cJSON_AddStringToObject(s->json, "names", megatron_naming_name(names));
    cJSON_AddBoolToObject(s->json, "optimizer", p->optimizer);
    return TP_OK;
}

static int write_megatron(void *state, const char *path)
{
    megatron_state *w = state;
    return megatron_write(w->source, w->template, &w->options, path, &w->plan);
}

/* ---- Megatron-Core torch_dist ----------------------------------------- */

typedef struct {
    ckpt_reader *source;
    megatron_model model;
    megatron_dist_write_options options;
    megatron_dist_write_plan plan;
} torch_dist_state;

static void free_torch_dist(void *state)
{
    torch_dist_state *w = state;
    if (!w) return;
    megatron_model_close(&w->model);
    free(w);
}

static int plan_torch_dist(formats_source *source, const formats_write_options *o, formats_write_summary *s,
                           void **state)
{
    ckpt_reader *reader = formats_source_reader(source);
    TP_TRY(refuse_interleaved(reader, o, "Megatron-Core's torch_dist", s));
    torch_dist_state *w = calloc(1, sizeof *w);
    if (!w) return tp_fail(TP_ERR_NOMEM, "out of memory");
    *state = w;
    w->source = reader;
    TP_TRY(megatron_model_open(source, o, "Megatron-Core's torch_dist", &w->model));
    if (o->verify && w->model.view) return tp_fail(TP_ERR_ARG, "%s", regrouped_refusal);
    /* A view's source: its optimizer state refused unless left out (its param groups are a Megatron run's). */
    w->options = (megatron_dist_write_options){
        .tp = o->reshard.tp, .pp = o->reshard.pp, .common = o->common,
        .torch_version = o->torch_version >= 0 ? (dcp_torch_version)o->torch_version : DCP_TORCH_2,
        .overwrite = o->reshard.overwrite, .threads = o->reshard.threads, .weights_only = o->reshard.drop_optimizer,
        .memory_limit = o->reshard.memory_limit, .model = w->model.model,
        .dist = formats_source_megatron_dist(source), .legacy = formats_source_megatron(source),
        .names = w->model.names, .on_bytes = o->reshard.on_bytes, .progress_ctx = o->reshard.progress_ctx};
    TP_TRY(megatron_dist_write_plan_create(reader, &w->options, &w->plan));
    const megatron_dist_write_plan *p = &w->plan;
    const char *common = o->common == MEGATRON_CORE_COMMON_FILE ? "common.pt: Megatron-Core up to 0.18"
                                                                : "the common_state entry: Megatron-Core 0.19+";
    summarize(s, "megatron-torch-dist", p->tp, p->pp, p->files, p->tensors, p->bytes, p->threads, p->buffer_memory);
    foreign_read_back(s, reader);
    snprintf(s->target, sizeof s->target, "Megatron-Core torch_dist tp%dpp%d, %s names, %s", p->tp, p->pp,
             megatron_naming_name(p->naming), common);
    snprintf(s->contents, sizeof s->contents, "%d tensors in %d chunks, %s", p->tensors, p->chunks,
             optimizer_text(p->optimizer));
    /* The output's vocabulary padded for its TP: described by the true size, as the source is. */
    s->true_vocab = w->model.view ? 0 : w->model.model->true_vocab;
    detail(s, "files", "%d data files __R_0.distcp, .metadata, metadata.json", p->files);
    detail(s, "tensors", "%d in %d chunks, %s", p->tensors, p->chunks, optimizer_text(p->optimizer));
    detail(s, "objects", "%d bytes entries%s", p->objects,
           p->rng ? ", the ranks' RNG states among them" : "; no RNG state (args.no_save_rng)");
    detail_work(s, p->bytes, p->threads, p->buffer_memory, "buffers");
    if (p->left_out) {
        char from[RESHARD_LAYOUT_TEXT_MAX];
        reshard_layout_text(ckpt_reader_saved_layout(reader), from);
        warn(s, "%d bytes entries of the source were left out (the ranks' RNG states: they belong to the layout %s; "
                "Megatron drops them on a change of layout too)", p->left_out, from);
    }
    note_groups_cut(s, w->model.model, p->tp);
    cJSON *j = s->json;
    cJSON_AddStringToObject(j, "names", megatron_naming_name(p->naming));
    cJSON_AddNumberToObject(j, "chunks", p->chunks);
    cJSON_AddNumberToObject(j, "others", p->objects);
    cJSON_AddBoolToObject(j, "optimizer", p->optimizer);
    cJSON_AddBoolToObject(j, "rng_state", p->rng);
    return TP_OK;
}

static int write_torch_dist(void *state, const char *path)
{
    torch_dist_state *w = state;
    return megatron_dist_write(w->source, &w->options, path, &w->plan);
}

/* ---- PyTorch distributed checkpoint: any source ----------------------- */

typedef struct {
    ckpt_reader *source;
    dcp_write_options options;
    dcp_write_plan plan;
} dcp_state;

static int plan_dcp(formats_source *source, const formats_write_options *o, formats_write_summary *s, void **state)
{
    ckpt_reader *reader = formats_source_reader(source);
    TP_TRY(refuse_interleaved(reader, o, "a PyTorch distributed checkpoint", s));
    dcp_state *w = calloc(1, sizeof *w);
    if (!w) return tp_fail(TP_ERR_NOMEM, "out of memory");
    *state = w;
    w->source = reader;
    /* A DCP source (not a torch_dist one: its entries are Megatron's) gives its other entries, its tensors' keys
     * and its torch's dialect. */
    const dcp_checkpoint *dcp = strcmp(formats_source_format(source)->name, "dcp") ? NULL : formats_source_dcp(source);
    dcp_torch_version torch = o->torch_version >= 0 ? (dcp_torch_version)o->torch_version
                              : dcp                 ? dcp_torch_version_of(dcp)
                                                    : DCP_TORCH_2;
    w->options = (dcp_write_options){
        .tp = o->reshard.tp, .pp = o->reshard.pp, .dp = o->dp > 1 ? o->dp : 1, .torch_version = torch,
        .overwrite = o->reshard.overwrite, .threads = o->reshard.threads, .weights_only = o->reshard.drop_optimizer,
        .memory_limit = o->reshard.memory_limit, .others_from = dcp, .keys_from = dcp, .on_bytes = o->reshard.on_bytes,
        .progress_ctx = o->reshard.progress_ctx};
    TP_TRY(dcp_write_plan_create(reader, &w->options, &w->plan));
    const dcp_write_plan *p = &w->plan;
    summarize(s, "dcp", p->tp, p->pp, p->files, p->tensors, p->bytes, p->threads, p->buffer_memory);
    s->read_back_bytes = p->read_back_bytes; /* by its chunks, which it knows */
    snprintf(s->target, sizeof s->target, "PyTorch distributed checkpoint, tp%dpp%d%s", p->tp, p->pp,
             p->dp > 1 ? ", pieces cut over data-parallel ranks" : "");
    snprintf(s->contents, sizeof s->contents, "%d tensors in %d chunks", p->tensors, p->chunks);
    if (p->dp > 1) detail(s, "dp", "%d data-parallel ranks each hold a part of every piece", p->dp);
    detail(s, "files", "%d data files __R_0.distcp and .metadata", p->files);
    detail(s, "tensors", "%d in %d chunks%s", p->tensors, p->chunks,
           o->reshard.drop_optimizer ? ", optimizer state left out" : "");
    if (p->others) detail(s, "others", "%d entries carried as they are", p->others);
    detail_work(s, p->bytes, p->threads, p->buffer_memory, "buffers");
    cJSON_AddNumberToObject(s->json, "chunks", p->chunks);
    cJSON_AddNumberToObject(s->json, "others", p->others);
    return TP_OK;
}

static int write_dcp(void *state, const char *path)
{
    dcp_state *w = state;
    return dcp_write(w->source, &w->options, path, &w->plan);
}

static void free_dcp(void *state)
{
    free(state);
}

const formats_writer formats_own_writer = {plan_own, write_own, free_own, ckpt_may_replace_checkpoint};
const formats_writer formats_megatron_writer = {plan_megatron, write_megatron, free_megatron, megatron_may_replace};
const formats_writer formats_torch_dist_writer = {plan_torch_dist, write_torch_dist, free_torch_dist,
                                                  megatron_dist_may_replace};
const formats_writer formats_dcp_writer = {plan_dcp, write_dcp, free_dcp, dcp_may_replace};

/* ---- the plan of any format ------------------------------------------- */

int formats_write_ignored_option(const checkpoint_format *format, const formats_write_options *o, char *why,
                                 size_t size)
{
    if (format->writer == &formats_own_writer) return 0;
    const reshard_options *r = &o->reshard;
    /* Each writer of another tool's format copies the source's values as
     * they are, uncompressed, on the CPU: a dtype in a Megatron checkpoint
     * is also its args' (params_dtype, bf16, fp16) and its optimizer's
     * masters, which no writer changes. Only the values that say so pass:
     * --dtype keep, --compress none, --device cpu or auto. */
    const char *own = "applies to this toolkit's format (--format tp)";
    if (r->param_dtype >= 0)
        snprintf(why, size, "--dtype %s %s: a %s output (--format %s) keeps the source's dtypes",
                 tp_dtype_name((tp_dtype)r->param_dtype), own, format->title, format->name);
    else if (r->compress_level > 0)
        snprintf(why, size, "--compress zstd:%d %s: a %s output (--format %s) is not compressed", r->compress_level, own,
                 format->title, format->name);
    else if (r->device == RESHARD_DEVICE_CUDA)
        snprintf(why, size, "--device cuda %s: a %s output (--format %s) is written on the CPU", own, format->title,
                 format->name);
    else
        return 0;
    return 1;
}

/* An optimizer state the source's reader left out is refused for every
 * output unless the options leave it out too: it is never dropped unsaid. */
static int refuse_unread_optimizer(formats_source *source, const formats_write_options *o)
{
    if (o->reshard.drop_optimizer) return TP_OK;
    const megatron_dist *dist = formats_source_megatron_dist(source);
    const char *why = dist ? megatron_dist_optimizer_refusal(dist) : NULL;
    if (why)
        return tp_fail(TP_ERR_LAYOUT, "%s: the optimizer's state is not read: %s; --weights-only converts the weights "
                                      "alone", ckpt_reader_path(formats_source_reader(source)), why);
    const megatron_checkpoint *megatron = formats_source_megatron(source);
    int status = TP_OK;
    why = megatron ? megatron_optimizer_refusal(megatron, &status) : NULL;
    if (why)
        return tp_fail(status ? status : TP_ERR_LAYOUT, "%s; --weights-only (--no-optim) converts the weights alone, as "
                                                        "Megatron's own converters do", why);
    return TP_OK;
}

int formats_write_plan_create(formats_source *source, const checkpoint_format *format,
                              const formats_write_options *options, formats_write_plan **out)
{
    *out = NULL;
    if (!format->writer)
        return tp_fail(TP_ERR_ARG, "%s checkpoints are read, not written", format->title);
    char why[256];
    if (formats_write_ignored_option(format, options, why, sizeof why)) return tp_fail(TP_ERR_ARG, "%s", why);
    TP_TRY(refuse_unread_optimizer(source, options));
    formats_write_plan *plan = calloc(1, sizeof *plan);
    cJSON *json = cJSON_CreateObject();
    if (!plan || !json) {
        free(plan);
        cJSON_Delete(json);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    plan->format = format;
    plan->writer = format->writer;
    plan->summary.json = json;
    int status = format->writer->plan(source, options, &plan->summary, &plan->state);
    if (status) {
        formats_write_plan_free(plan);
        return status;
    }
    *out = plan;
    return TP_OK;
}

const formats_write_summary *formats_write_plan_summary(const formats_write_plan *plan)
{
    return &plan->summary;
}

int formats_write(formats_write_plan *plan, const char *path)
{
    return plan->writer->write(plan->state, path);
}

void formats_write_plan_free(formats_write_plan *plan)
{
    if (!plan) return;
    if (plan->state) plan->writer->free_plan(plan->state);
    cJSON_Delete(plan->summary.json);
    free(plan);
}
