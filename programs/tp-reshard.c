/* tp-reshard: convert a checkpoint to another tensor/pipeline layout.
 * A thin layer over reshard.h; see `tp-reshard --help`. Exit status: 0
 * success, 1 failure (including a failed --verify), 2 usage. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../common/parallel.h"
#include "progress.h"
#include "../formats/dcp.h"
#include "../formats/megatron.h"
#include "../formats/registry.h"
#include "../model/interop.h"
#include "../reshard/reshard.h"

static const char *usage_text =
    "usage: tp-reshard CKPT --to LAYOUT [--from LAYOUT] [-o OUT] [options]\n"
    "\n"
    "Converts a checkpoint (weights and optimizer state) to another tensor/pipeline layout,\n"
    "streaming with bounded memory; the output is committed atomically.\n"
    "\n"
    "  --to LAYOUT              target degrees: tp4, pp2 or tp4pp2 (a degree not named is kept); tp4pp2v2:\n"
    "                           2 chunks of layers per stage, interleaved (pp named without v: one chunk)\n"
    "  --from LAYOUT            the source's degrees, checked against its metadata\n"
    "  --format tp|megatron|dcp|torch_dist  the output's format (default: the source's): this toolkit's,\n"
    "                           Megatron-LM's (from a Megatron-LM source or this toolkit's GPT), a PyTorch\n"
    "                           distributed checkpoint (docs/DCP.md), or Megatron-Core's torch_dist (from a\n"
    "                           Megatron-LM source or this toolkit's GPT; docs/MEGATRON.md)\n"
    "  --megatron-core RELEASE  the Megatron-Core that will load a torch_dist output: 0.18 or older keeps\n"
    "                           the common state in common.pt, 0.19 and later in the checkpoint (default)\n"
    "  --dcp-torch 2|1.13       the PyTorch that will load a DCP output (its class paths; default: a DCP\n"
    "                           source's, else 2)\n"
    "  --dcp-dp N               a DCP output's pieces cut again along dimension 0 over N data-parallel\n"
    "                           ranks, as FSDP with tensor parallelism writes (a file per rank)\n"
    "  --megatron-names legacy|legacy-layernorm|core|core-local\n"
    "                           the Megatron output's tensor names (default: the source's)\n"
    "  --true-vocab-size N      a Megatron source's true vocabulary (the tokenizer's size): its\n"
    "                           padding is then recomputed for the target TP, as Megatron's saver does\n"
    "  -o, --output DIR         output checkpoint (default: beside CKPT, named after the layout)\n"
    "  --threads N              worker threads (default: all cores)\n"
    "  --memory-limit SIZE      bound on memory, e.g. 512M or 4G (default 1G)\n"
    "  --device auto|cpu|cuda   where moves and conversions run (default auto: a GPU when present and\n"
    "                           the plan converts dtypes; plain copies stay on the CPU)\n"
    "  --dtype keep|fp32|bf16|fp16  parameter dtype (optimizer state stays fp32; default keep)\n"
    "  --compress zstd[:L]|none output compression (default: as the source)\n"
    "  --no-optim, --weights-only  leave out optimizer state (e.g. for inference)\n"
    "  --dry-run                print the plan: files, tensors, bytes, memory; write nothing\n"
    "  --verify                 after writing, prove the output equal to the source (digests)\n"
    "  --json                   print a machine-readable summary instead of text\n"
    "  --force                  replace an existing output\n"
    "  --progress               show progress even when stderr is not a terminal\n"
    "\n"
    "CKPT is a checkpoint directory, or a run directory (its latest checkpoint), a Megatron-LM\n"
    "legacy or Megatron-Core torch_dist checkpoint (docs/MEGATRON.md) or a\n"
    "PyTorch distributed checkpoint (docs/DCP.md), read without executing anything.\n";

#define die_usage(...) cli_usage_error("tp-reshard", __VA_ARGS__)
#define fail(...) cli_error("tp-reshard", __VA_ARGS__)

static void on_bytes(void *ctx, int64_t bytes)
{
    progress_add(ctx, bytes);
}

static void print_plan(const reshard_summary *s, const char *device, const char *source, const char *out)
{
    char read[32], written[32], buffers[32], limit[32], slab[32];
    format_bytes((double)s->bytes_read, read, sizeof read);
    format_bytes((double)s->bytes_written, written, sizeof written);
    format_bytes((double)s->buffer_memory, buffers, sizeof buffers);
    format_bytes((double)s->memory_limit, limit, sizeof limit);
    format_bytes((double)s->slab_bytes, slab, sizeof slab);
    char from[RESHARD_LAYOUT_TEXT_MAX], to[RESHARD_LAYOUT_TEXT_MAX];
    reshard_layout_text(&s->from, from);
    reshard_layout_text(&s->to, to);
    printf("plan: %s (%s) -> %s (%s)\n", source, from, out, to);
    printf("  files      %d shard files: shard_pp00_tp00.h5 .. shard_pp%02d_tp%02d.h5\n", s->files_written,
           s->to.pp - 1, s->to.tp - 1);
    printf("  tensors    %d (%lld pieces)%s\n", s->tensors, (long long)s->pieces_written,
           s->tensors_dropped ? ", optimizer state left out" : "");
    printf("  read       %s from the source\n", read);
    printf("  write      %s\n", written);
    printf("  work       %lld slabs on %d threads (%s), slabs up to %s\n", (long long)s->slabs, s->threads,
           device, slab);
    printf("  memory     %s of buffers within a limit of %s\n", buffers, limit);
}

static cJSON *layout_json(const ckpt_layout *l)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tp", l->tp);
    cJSON_AddNumberToObject(o, "pp", l->pp);
    if (ckpt_layout_chunks(l) > 1) cJSON_AddNumberToObject(o, "virtual_stages", ckpt_layout_chunks(l));
    return o;
}

/* The keys the plan (--dry-run --json) and the summary (--json) share. */
static cJSON *summary_json(const reshard_summary *s, const char *source, const char *out)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "source", source);
    cJSON_AddStringToObject(o, "output", out);
    cJSON_AddItemToObject(o, "from", layout_json(&s->from));
    cJSON_AddItemToObject(o, "to", layout_json(&s->to));
    cJSON_AddNumberToObject(o, "tensors", s->tensors);
    cJSON_AddNumberToObject(o, "bytes_read", (double)s->bytes_read);
    cJSON_AddNumberToObject(o, "bytes_written", (double)s->bytes_written);
    cJSON_AddNumberToObject(o, "threads", s->threads);
    cJSON_AddNumberToObject(o, "memory_limit", (double)s->memory_limit);
    cJSON_AddStringToObject(o, "device", s->device);
    if (s->device_reason) cJSON_AddStringToObject(o, "device_reason", s->device_reason);
    return o;
}

static void print_json(cJSON *o)
{
    char *text = cJSON_Print(o);
    printf("%s\n", text);
    cJSON_free(text);
    cJSON_Delete(o);
}

/* Checks the written output against the source by logical digests; 0, or
 * the exit code of a failure it reported. *seconds: the time it took. */
static int verify_output(ckpt_reader *source, ckpt_reader *output, int threads, reshard_verify_result *checked,
                         double *seconds)
{
    double start = now_seconds();
    int code = 0;
    if (reshard_verify(source, output, threads, checked)) code = fail("%s", tp_errmsg());
    else if (checked->mismatches)
        code = fail("verification failed: %d of %d tensors differ from the source; first: %s", checked->mismatches,
                    checked->tensors, checked->first_mismatch);
    *seconds = now_seconds() - start;
    return code;
}

static void print_verified(const reshard_verify_result *checked, double seconds)
{
    printf("verified: %d tensors equal to the source (logical digests), in %.2f s\n", checked->tensors, seconds);
}

/* The end of a conversion to a foreign format: the output (NULL where
 * verify is 0 or opening it failed, then opened says so) checked against
 * the source, and the summary printed (JSON: summary, which this takes). */
/* After another format's write: with verify, the output reopened through
 * the registry as that format (its digests computed where it records none
 * of its own) and compared with the source; the summary printed as JSON, or
 * the verification said. true_vocab: a Megatron output's, as the source's. */
static int finish_foreign(ckpt_reader *source, const char *out, const char *format, int64_t true_vocab, int threads,
                          int verify, cJSON *summary, double seconds)
{
    reshard_verify_result checked = {0, 0, ""};
    double verify_seconds = 0;
    int code = 0;
    formats_source *output = NULL;
    formats_source_options reopen = {.compute_digests = 1, .threads = threads, .true_vocab = true_vocab};
    if (verify && formats_source_open(out, formats_find(format), &reopen, &output)) code = fail("%s", tp_errmsg());
    else if (verify && !(code = verify_output(source, formats_source_reader(output), threads, &checked, &verify_seconds)) &&
             !summary)
        print_verified(&checked, verify_seconds);
    formats_source_close(output);
    if (!code && summary) {
        cJSON_AddNumberToObject(summary, "seconds", seconds);
        cJSON_AddNumberToObject(summary, "peak_rss_bytes", (double)cli_peak_rss_bytes());
        if (verify) cJSON_AddBoolToObject(summary, "verified", 1);
        print_json(summary);
    } else {
        cJSON_Delete(summary);
    }
    return code;
}

static int execute_plan(void *plan, const char *out)
{
    return reshard_execute(plan, out);
}

/* Where the digits before `end` start (end itself when there are none). */
static size_t digits_before(const char *text, size_t end)
{
    while (end > 0 && isdigit((unsigned char)text[end - 1])) end--;
    return end;
}

/* Beside the source, named after it and the target layout: a source that is
 * itself a reshard output (name_tp2pp1, name_tp2pp2v2) gives name_tp4pp1,
 * not name_tp2pp1_tp4pp1. */
static void default_output(const char *source, const ckpt_layout *to, char *out, size_t size)
{
    size_t n = strlen(source);
    while (n > 1 && source[n - 1] == '/') n--;
    size_t end = n, k = digits_before(source, n);
    if (k < n && k >= 1 && source[k - 1] == 'v') { /* a vV after ppP */
        size_t j = digits_before(source, k - 1);
        if (j < k - 1) k = j;
    }
    if (k < n && k >= 2 && strncmp(source + k - 2, "pp", 2) == 0) {
        size_t j = digits_before(source, k - 2);
        if (j < k - 2 && j >= 3 && strncmp(source + j - 3, "_tp", 3) == 0) end = j - 3;
    }
    char layout[RESHARD_LAYOUT_TEXT_MAX];
    reshard_layout_text(to, layout);
    snprintf(out, size, "%.*s_%s", (int)end, source, layout);
}

/* The output: -o's, or the default beside the source. */
static const char *output_path(const char *out, const char *source, const ckpt_layout *to, char *buf, size_t size)
{
    if (out) return out;
    default_output(source, to, buf, size);
    return buf;
}

/* The plan or summary of a Megatron-LM output, in the keys of the others. */
static cJSON *megatron_json(const megatron_write_plan *p, const ckpt_layout *from, const char *source, const char *out,
                            megatron_naming naming)
{
    cJSON *o = cJSON_CreateObject();
    ckpt_layout to = {.tp = p->tp, .pp = p->pp};
    cJSON_AddStringToObject(o, "source", source);
    cJSON_AddStringToObject(o, "output", out);
    cJSON_AddStringToObject(o, "format", "megatron-legacy");
    cJSON_AddStringToObject(o, "names", megatron_naming_name(naming));
    cJSON_AddItemToObject(o, "from", layout_json(from));
    cJSON_AddItemToObject(o, "to", layout_json(&to));
    cJSON_AddNumberToObject(o, "files", p->files);
    cJSON_AddNumberToObject(o, "tensors", p->tensors);
    cJSON_AddBoolToObject(o, "optimizer", p->optimizer);
    cJSON_AddNumberToObject(o, "bytes_written", (double)p->bytes);
    cJSON_AddNumberToObject(o, "threads", p->threads);
    cJSON_AddNumberToObject(o, "buffer_memory", (double)p->buffer_memory);
    return o;
}

typedef struct {
    ckpt_reader *source;
    const megatron_checkpoint *megatron;
    const megatron_write_options *options;
    megatron_write_plan *plan;
} megatron_job;

/* A Megatron source's reshard (a legacy one its own template; a torch_dist
 * one's model in the options), or this toolkit's GPT written as Megatron's. */
static int run_megatron_write(void *ctx, const char *path)
{
    megatron_job *j = ctx;
    return j->megatron || j->options->model ? megatron_write(j->source, j->megatron, j->options, path, j->plan)
                                            : gpt_megatron_write(j->source, j->options, path, j->plan);
}

/* A Megatron-LM source (its --from already checked) written back as a
 * Megatron-LM checkpoint at the target layout, planned first (--dry-run
 * stops there), verified by digests when asked. */
static int write_megatron(ckpt_reader *source, const megatron_checkpoint *megatron, const megatron_config *model,
                          const reshard_options *options, const char *source_path, const char *out, int naming, int verify,
                          int dry_run, int json, int force_progress)
{
    const megatron_config *c = megatron ? megatron_config_of(megatron) : model;
    const ckpt_layout *from = ckpt_reader_layout(source);
    char from_text[RESHARD_LAYOUT_TEXT_MAX];
    cli_source_layout_text(source, from_text);
    const char *source_name = megatron ? megatron_path(megatron) : ckpt_reader_path(source);
    const char *source_format = megatron ? "Megatron-LM " : model ? "Megatron-Core torch_dist " : "";
    megatron_write_options wo = {.tp = options->tp, .pp = options->pp, .naming = naming, .overwrite = options->overwrite,
                                 .threads = options->threads, .weights_only = options->drop_optimizer,
                                 .memory_limit = options->memory_limit, .model = megatron ? NULL : model};
    megatron_naming names = naming >= 0 ? (megatron_naming)naming : c ? c->naming : MEGATRON_NAMES_LEGACY;
    megatron_write_plan plan;
    if (megatron || model ? megatron_write_plan_create(source, megatron, &wo, &plan) : gpt_megatron_write(source, &wo, NULL, &plan))
        return fail("%s", tp_errmsg());
    char default_out[4200];
    out = output_path(out, source_path, &(ckpt_layout){.tp = plan.tp, .pp = plan.pp}, default_out, sizeof default_out);
    char written[32], buffers[32];
    format_bytes((double)plan.bytes, written, sizeof written);
    format_bytes((double)plan.buffer_memory, buffers, sizeof buffers);
    if (dry_run) {
        if (json) {
            print_json(megatron_json(&plan, from, source_name, out, names));
            return 0;
        }
        printf("plan: %s (%s%s) -> %s (Megatron-LM tp%dpp%d, %s names)\n", source_name, source_format, from_text, out,
               plan.tp, plan.pp, megatron_naming_name(names));
        printf("  files      %d rank files model_optim_rng.pt\n", plan.files);
        printf("  tensors    %d, %s\n", plan.tensors,
               plan.optimizer ? "weights and optimizer state" : "weights only");
        printf("  write      %s\n", written);
        printf("  work       %d rank files at once\n", plan.threads);
        printf("  memory     %s of piece buffers\n", buffers);
        if (plan.rank_state_dropped) printf("  note       the ranks' RNG states are left out: the layout changes\n");
        return 0;
    }
    progress bar;
    wo.on_bytes = on_bytes;
    wo.progress_ctx = &bar;
    progress_start(&bar, "reshard", plan.bytes, force_progress);
    /* A URL is written locally, then uploaded, its tracker file last. */
    megatron_job job = {source, megatron, &wo, &plan};
    int status = cli_write_output(out, options->overwrite, megatron_may_replace, NULL, options->threads, 0,
                                  run_megatron_write, &job);
    double seconds = progress_finish(&bar);
    if (status) return fail("%s", tp_errmsg());
    if (plan.rank_state_dropped)
        fprintf(stderr, "tp-reshard: warning: the ranks' RNG states were left out: they belong to the layout %s "
                        "(Megatron drops them on a change of layout too)\n", from_text);
    if (!json)
        printf("resharded %s (%s%s) -> %s (Megatron-LM tp%dpp%d, %s names): %d tensors, %s, %s written "
               "in %.2f s\n", source_name, source_format, from_text, out, plan.tp, plan.pp, megatron_naming_name(names),
               plan.tensors, plan.optimizer ? "weights and optimizer state" : "weights only", written, seconds);
    /* The output's vocabulary padded for its TP: described by the true size as the source is. */
    return finish_foreign(source, out, "megatron", c ? c->true_vocab : 0, options->threads, verify,
                          json ? megatron_json(&plan, from, source_name, out, names) : NULL, seconds);
}

typedef struct {
    ckpt_reader *source;
    const dcp_write_options *options;
    dcp_write_plan *plan;
} dcp_job;

static int run_dcp_write(void *ctx, const char *path)
{
    dcp_job *j = ctx;
    return dcp_write(j->source, j->options, path, j->plan);
}

static cJSON *dcp_json(const dcp_write_plan *p, const ckpt_layout *from, const char *source, const char *out)
{
    cJSON *o = cJSON_CreateObject();
    ckpt_layout to = {.tp = p->tp, .pp = p->pp};
    cJSON_AddStringToObject(o, "source", source);
    cJSON_AddStringToObject(o, "output", out);
    cJSON_AddStringToObject(o, "format", "dcp");
    cJSON_AddItemToObject(o, "from", layout_json(from));
    cJSON_AddItemToObject(o, "to", layout_json(&to));
    cJSON_AddNumberToObject(o, "files", p->files);
    cJSON_AddNumberToObject(o, "tensors", p->tensors);
    cJSON_AddNumberToObject(o, "chunks", p->chunks);
    cJSON_AddNumberToObject(o, "others", p->others);
    cJSON_AddNumberToObject(o, "bytes_written", (double)p->bytes);
    cJSON_AddNumberToObject(o, "threads", p->threads);
    cJSON_AddNumberToObject(o, "buffer_memory", (double)p->buffer_memory);
    return o;
}

/* Any source written as a PyTorch distributed checkpoint at the target
 * layout, planned first (--dry-run stops there), verified by digests when
 * asked: the output carries the digests of what it holds. */
static int write_dcp(ckpt_reader *source, const dcp_checkpoint *dcp, const reshard_options *options, dcp_torch_version torch,
                     int dp, const char *source_path, const char *out, int verify, int dry_run, int json, int force_progress)
{
    const ckpt_layout *from = ckpt_reader_layout(source);
    char from_text[RESHARD_LAYOUT_TEXT_MAX];
    cli_source_layout_text(source, from_text);
    const char *source_name = ckpt_reader_path(source);
    dcp_write_options wo = {.tp = options->tp, .pp = options->pp, .dp = dp, .torch_version = torch, .overwrite = options->overwrite,
                            .threads = options->threads, .weights_only = options->drop_optimizer,
                            .memory_limit = options->memory_limit, .others_from = dcp};
    dcp_write_plan plan;
    if (dcp_write_plan_create(source, &wo, &plan)) return fail("%s", tp_errmsg());
    char default_out[4200];
    out = output_path(out, source_path, &(ckpt_layout){.tp = plan.tp, .pp = plan.pp}, default_out, sizeof default_out);
    char written[32], buffers[32];
    format_bytes((double)plan.bytes, written, sizeof written);
    format_bytes((double)plan.buffer_memory, buffers, sizeof buffers);
    if (dry_run) {
        if (json) {
            print_json(dcp_json(&plan, from, source_name, out));
            return 0;
        }
        printf("plan: %s (%s) -> %s (PyTorch distributed checkpoint, tp%dpp%d%s)\n", source_name, from_text, out,
               plan.tp, plan.pp, plan.dp > 1 ? ", pieces cut over data-parallel ranks" : "");
        if (plan.dp > 1) printf("  dp         %d data-parallel ranks each hold a part of every piece\n", plan.dp);
        printf("  files      %d data files __R_0.distcp and .metadata\n", plan.files);
        printf("  tensors    %d in %d chunks%s\n", plan.tensors, plan.chunks,
               options->drop_optimizer ? ", optimizer state left out" : "");
        if (plan.others) printf("  others     %d entries carried as they are\n", plan.others);
        printf("  write      %s\n", written);
        printf("  work       %d rank files at once\n", plan.threads);
        printf("  memory     %s of buffers\n", buffers);
        return 0;
    }
    progress bar;
    wo.on_bytes = on_bytes;
    wo.progress_ctx = &bar;
    progress_start(&bar, "reshard", plan.bytes, force_progress);
    dcp_job job = {source, &wo, &plan};
    int status = cli_write_output(out, options->overwrite, dcp_may_replace, NULL, options->threads, 0, run_dcp_write, &job);
    double seconds = progress_finish(&bar);
    if (status) return fail("%s", tp_errmsg());
    if (!json)
        printf("resharded %s (%s) -> %s (PyTorch distributed checkpoint, tp%dpp%d): %d tensors in %d chunks, %s "
               "written in %.2f s\n", source_name, from_text, out, plan.tp, plan.pp, plan.tensors, plan.chunks,
               written, seconds);
    return finish_foreign(source, out, "dcp", 0, options->threads, verify,
                          json ? dcp_json(&plan, from, source_name, out) : NULL, seconds);
}

typedef struct {
    ckpt_reader *source;
    const megatron_dist_write_options *options;
    megatron_dist_write_plan *plan;
} torch_dist_job;

/* A Megatron source's own model, or this toolkit's GPT (model/interop.h). */
static int run_torch_dist_write(void *ctx, const char *path)
{
    torch_dist_job *j = ctx;
    return j->options->model ? megatron_dist_write(j->source, j->options, path, j->plan)
                             : gpt_megatron_dist_write(j->source, j->options, path, j->plan);
}

static cJSON *torch_dist_json(const megatron_dist_write_plan *p, const ckpt_layout *from, const char *source, const char *out)
{
    cJSON *o = dcp_json(&(dcp_write_plan){.tp = p->tp, .pp = p->pp, .files = p->files, .tensors = p->tensors,
                                          .chunks = p->chunks, .others = p->objects, .bytes = p->bytes,
                                          .threads = p->threads, .buffer_memory = p->buffer_memory},
                        from, source, out);
    cJSON_ReplaceItemInObject(o, "format", cJSON_CreateString("megatron-torch-dist"));
    cJSON_AddStringToObject(o, "names", megatron_naming_name(p->naming));
    cJSON_AddBoolToObject(o, "optimizer", p->optimizer);
    cJSON_AddBoolToObject(o, "rng_state", p->rng);
    return o;
}

/* Any source with a Megatron model (a Megatron-LM legacy or torch_dist
 * checkpoint, this toolkit's GPT) written as a Megatron-Core torch_dist
 * checkpoint at the target layout, planned first (--dry-run stops there),
 * verified by digests when asked (read back with the torch_dist reader). */
static int write_torch_dist(ckpt_reader *source, megatron_dist_write_options *wo, const char *source_path, const char *out,
                            int verify, int dry_run, int json, int force_progress)
{
    const ckpt_layout *from = ckpt_reader_layout(source);
    char from_text[RESHARD_LAYOUT_TEXT_MAX];
    cli_source_layout_text(source, from_text);
    const char *source_name = ckpt_reader_path(source);
    if (verify && !wo->model)
        return fail("--verify compares logical digests, and a GPT written as Megatron's regroups its QKV: import it back "
                    "(tp-ckpt import) and diff instead");
    if (verify && wo->model->true_vocab > 0)
        return fail("--verify compares logical tensors, and a torch_dist checkpoint is read with its tables as stored, "
                    "padded for its tp (its reader is not told the true vocabulary): convert it back to Megatron-LM's "
                    "format at the same tp and compare that instead");
    megatron_dist_write_plan plan;
    if (wo->model ? megatron_dist_write_plan_create(source, wo, &plan) : gpt_megatron_dist_write(source, wo, NULL, &plan))
        return fail("%s", tp_errmsg());
    char default_out[4200];
    out = output_path(out, source_path, &(ckpt_layout){.tp = plan.tp, .pp = plan.pp}, default_out, sizeof default_out);
    char written[32], buffers[32];
    format_bytes((double)plan.bytes, written, sizeof written);
    format_bytes((double)plan.buffer_memory, buffers, sizeof buffers);
    const char *common = wo->common == MEGATRON_CORE_COMMON_FILE ? "common.pt: Megatron-Core up to 0.18"
                                                                 : "the common_state entry: Megatron-Core 0.19+";
    if (dry_run) {
        if (json) {
            print_json(torch_dist_json(&plan, from, source_name, out));
            return 0;
        }
        printf("plan: %s (%s) -> %s (Megatron-Core torch_dist tp%dpp%d, %s names, %s)\n", source_name, from_text, out,
               plan.tp, plan.pp, megatron_naming_name(plan.naming), common);
        printf("  files      %d data files __R_0.distcp, .metadata, metadata.json\n", plan.files);
        printf("  tensors    %d in %d chunks, %s\n", plan.tensors, plan.chunks,
               plan.optimizer ? "weights and optimizer state" : "weights only");
        printf("  objects    %d bytes entries%s\n", plan.objects,
               plan.rng ? ", the ranks' RNG states among them" : "; no RNG state (args.no_save_rng)");
        printf("  write      %s\n", written);
        printf("  work       %d rank files at once\n", plan.threads);
        printf("  memory     %s of buffers\n", buffers);
        return 0;
    }
    progress bar;
    wo->on_bytes = on_bytes;
    wo->progress_ctx = &bar;
    progress_start(&bar, "reshard", plan.bytes, force_progress);
    torch_dist_job job = {source, wo, &plan};
    int status = cli_write_output(out, wo->overwrite, megatron_dist_may_replace, NULL, wo->threads, 0,
                                  run_torch_dist_write, &job);
    double seconds = progress_finish(&bar);
    if (status) return fail("%s", tp_errmsg());
    if (plan.left_out)
        fprintf(stderr, "tp-reshard: warning: %d bytes entries of the source were left out (the ranks' RNG states: "
                        "they belong to the layout %s; Megatron drops them on a change of layout too)\n",
                plan.left_out, from_text);
    if (!json)
        printf("resharded %s (%s) -> %s (Megatron-Core torch_dist tp%dpp%d, %s names, %s): %d tensors in %d chunks, %s, "
               "%s written in %.2f s\n", source_name, from_text, out, plan.tp, plan.pp, megatron_naming_name(plan.naming),
               common, plan.tensors, plan.chunks, plan.optimizer ? "weights and optimizer state" : "weights only",
               written, seconds);
    return finish_foreign(source, out, "torch_dist", 0, wo->threads, verify,
                          json ? torch_dist_json(&plan, from, source_name, out) : NULL, seconds);
}

int main(int argc, char **argv)
{
    opterr = 0; /* rejected options are reported in one line */
    if (cli_clean_up_on_signals() != 0) return fail("cannot set up signal handling: %s", strerror(errno));
    cli_print_store_notices("tp-reshard");
    reshard_options options;
    reshard_options_init(&options);
    const char *to = NULL, *from = NULL, *out = NULL, *output_format = NULL;
    int naming = -1;
    int64_t true_vocab = 0;
    dcp_torch_version dcp_torch = DCP_TORCH_2;
    megatron_core_common mcore_common = MEGATRON_CORE_COMMON_ENTRY;
    int mcore_given = 0;
    int dcp_torch_given = 0, dcp_dp = 1;
    int dry_run = 0, verify = 0, json = 0, force_progress = 0;
    enum { O_TO = 256, O_FROM, O_THREADS, O_MEMORY, O_DEVICE, O_DTYPE, O_COMPRESS, O_NO_OPTIM, O_DRY, O_VERIFY,
           O_JSON, O_FORCE, O_PROGRESS, O_FORMAT, O_NAMES, O_TRUE_VOCAB, O_DCP_TORCH, O_DCP_DP, O_MCORE };
    static const struct option long_options[] = {
        {"to", required_argument, 0, O_TO}, {"from", required_argument, 0, O_FROM},
        {"output", required_argument, 0, 'o'}, {"threads", required_argument, 0, O_THREADS},
        {"memory-limit", required_argument, 0, O_MEMORY}, {"device", required_argument, 0, O_DEVICE},
        {"dtype", required_argument, 0, O_DTYPE}, {"compress", required_argument, 0, O_COMPRESS},
        {"no-optim", no_argument, 0, O_NO_OPTIM}, {"weights-only", no_argument, 0, O_NO_OPTIM}, {"dry-run", no_argument, 0, O_DRY},
        {"verify", no_argument, 0, O_VERIFY}, {"json", no_argument, 0, O_JSON}, {"force", no_argument, 0, O_FORCE},
        {"progress", no_argument, 0, O_PROGRESS}, {"format", required_argument, 0, O_FORMAT},
        {"megatron-names", required_argument, 0, O_NAMES}, {"true-vocab-size", required_argument, 0, O_TRUE_VOCAB},
        {"dcp-torch", required_argument, 0, O_DCP_TORCH}, {"dcp-dp", required_argument, 0, O_DCP_DP},
        {"megatron-core", required_argument, 0, O_MCORE},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "o:h", long_options, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case O_TO: to = optarg; break;
        case O_FROM: from = optarg; break;
        case O_FORMAT:
            if (strcmp(optarg, "tp") && strcmp(optarg, "megatron") && strcmp(optarg, "dcp") && strcmp(optarg, "torch_dist"))
                die_usage("--format expects tp, megatron, dcp or torch_dist, got '%s'", optarg);
            output_format = optarg;
            break;
        case O_DCP_TORCH:
            if (dcp_torch_version_parse(optarg, &dcp_torch)) die_usage("--dcp-torch: %s", tp_errmsg());
            dcp_torch_given = 1;
            break;
        case O_MCORE:
            if (megatron_core_release_parse(optarg, &mcore_common)) die_usage("--megatron-core: %s", tp_errmsg());
            mcore_given = 1;
            break;
        case O_DCP_DP: dcp_dp = (int)cli_int("tp-reshard", "--dcp-dp", optarg, 1, 4096); break;
        case O_TRUE_VOCAB: true_vocab = cli_int("tp-reshard", "--true-vocab-size", optarg, 1, (int64_t)1 << 40); break;
        case O_NAMES: {
            megatron_naming parsed;
            if (megatron_naming_parse(optarg, &parsed)) die_usage("--megatron-names: %s", tp_errmsg());
            naming = (int)parsed;
            break;
        }
        case O_THREADS: options.threads = (int)cli_int("tp-reshard", "--threads", optarg, 1, 1024); break;
        case O_MEMORY: options.memory_limit = cli_size("tp-reshard", "--memory-limit", optarg); break;
        case O_DEVICE:
            if (strcmp(optarg, "auto") == 0) options.device = RESHARD_DEVICE_AUTO;
            else if (strcmp(optarg, "cpu") == 0) options.device = RESHARD_DEVICE_CPU;
            else if (strcmp(optarg, "cuda") == 0) options.device = RESHARD_DEVICE_CUDA;
            else die_usage("--device expects auto, cpu or cuda, got '%s'", optarg);
            break;
        case O_DTYPE: {
            tp_dtype dtype;
            if (strcmp(optarg, "keep") == 0) options.param_dtype = -1;
            else if (tp_dtype_parse(optarg, &dtype) == TP_OK) options.param_dtype = (int)dtype;
            else die_usage("--dtype expects keep, fp32, bf16 or fp16, got '%s'", optarg);
            break;
        }
        case O_COMPRESS: options.compress_level = cli_compress("tp-reshard", optarg); break;
        case O_NO_OPTIM: options.drop_optimizer = 1; break;
        case O_DRY: dry_run = 1; break;
        case O_VERIFY: verify = 1; break;
        case O_JSON: json = 1; break;
        case O_FORCE: options.overwrite = 1; break;
        case O_PROGRESS: force_progress = 1; break;
        case 'h': fputs(usage_text, stdout); return 0;
        default: die_usage("unknown option or missing value: '%s'", cli_rejected_option(argv));
        }
    }
    if (optind != argc - 1) die_usage(optind >= argc ? "missing CKPT" : "one checkpoint at a time");
    if (!to) die_usage("--to is required (e.g. --to tp4pp2)");
    if (reshard_parse_layout(to, &options.tp, &options.pp, &options.virtual_stages)) die_usage("--to: %s", tp_errmsg());
    int from_tp = 0, from_pp = 0, from_chunks = 0;
    if (from && reshard_parse_layout(from, &from_tp, &from_pp, &from_chunks)) die_usage("--from: %s", tp_errmsg());

    /* Any format the toolkit reads (formats/registry.h). Another tool's is
     * read without digests of its own: they are computed (one read of it)
     * only when --verify needs them. This toolkit's is read once, every
     * block checked against its checksum, through the index alone: HDF5's
     * per-piece metadata was a tenth of the time (docs/BENCHMARKS.md, issue
     * 28); `tp-ckpt verify` checks it. */
    const checkpoint_format *format;
    if (formats_detect(argv[optind], &format)) return fail("%s", tp_errmsg());
    if (true_vocab && strcmp(format->name, "megatron")) die_usage("--true-vocab-size applies to a Megatron-LM legacy source");
    ckpt_read_options read;
    ckpt_read_options_init(&read);
    read.through_index = 1;
    formats_source_options source_options = {
        .read = &read, .compute_digests = verify, .threads = options.threads, .true_vocab = true_vocab};
    formats_source *opened;
    if (formats_source_open(argv[optind], format, &source_options, &opened)) return fail("%s", tp_errmsg());
    ckpt_reader *source = formats_source_reader(opened);
    const megatron_checkpoint *megatron = formats_source_megatron(opened);
    const megatron_dist *dist = formats_source_megatron_dist(opened);
    const dcp_checkpoint *dcp = !strcmp(format->name, "dcp") ? formats_source_dcp(opened) : NULL;
    const ckpt_layout *layout = ckpt_reader_layout(source);
    if ((from_tp && from_tp != layout->tp) || (from_pp && from_pp != layout->pp) ||
        (from_chunks && from_chunks != ckpt_layout_chunks(layout))) {
        char source_layout[RESHARD_LAYOUT_TEXT_MAX];
        reshard_layout_text(layout, source_layout);
        int code = fail("--from %s does not match %s, which is %s", from, ckpt_reader_path(source), source_layout);
        formats_source_close(opened);
        return code;
    }
    int dcp_out = output_format ? !strcmp(output_format, "dcp") : dcp != NULL;
    if (dcp_dp > 1 && !dcp_out) die_usage("--dcp-dp applies to a DCP output (--format dcp)");
    int megatron_out = output_format ? !strcmp(output_format, "megatron") : megatron != NULL;
    int torch_dist_out = output_format ? !strcmp(output_format, "torch_dist") : dist != NULL;
    if (mcore_given && !torch_dist_out) die_usage("--megatron-core applies to a torch_dist output (--format torch_dist)");
    /* torch_dist keys are Megatron-Core's whatever the modules: no names to choose (they were ignored). */
    if (naming >= 0 && !megatron_out)
        die_usage("--megatron-names applies to a Megatron-LM legacy output (--format megatron)");
    if (options.virtual_stages > 1 && (dcp_out || megatron_out || torch_dist_out)) {
        int code = fail("--to %s: chunks of layers interleaved over the stages are written in this toolkit's format "
                        "only (--format tp)", to);
        formats_source_close(opened);
        return code;
    }
    if (dist && megatron_dist_optimizer_refusal(dist) && !options.drop_optimizer) { /* not left out unsaid */
        int code = fail("%s: the optimizer's state is not read: %s; --weights-only converts the weights alone", argv[optind],
                        megatron_dist_optimizer_refusal(dist));
        formats_source_close(opened);
        return code;
    }
    if (dcp_out) {
        if (dcp && !dcp_torch_given) dcp_torch = dcp_torch_version_of(dcp);
        int code = write_dcp(source, dcp, &options, dcp_torch, dcp_dp, argv[optind], out, verify, dry_run, json, force_progress);
        formats_source_close(opened);
        return code;
    }
    if (torch_dist_out) {
        megatron_dist_write_options wo = {.tp = options.tp, .pp = options.pp, .common = mcore_common,
                                          .torch_version = dcp_torch, .overwrite = options.overwrite,
                                          .threads = options.threads, .weights_only = options.drop_optimizer,
                                          .memory_limit = options.memory_limit, .dist = dist, .legacy = megatron,
                                          .model = dist ? megatron_dist_config(dist) : megatron ? megatron_config_of(megatron) : NULL};
        int code = write_torch_dist(source, &wo, argv[optind], out, verify, dry_run, json, force_progress);
        formats_source_close(opened);
        return code;
    }
    const char *refusal = NULL;
    /* This toolkit's GPT written as Megatron's regroups each fused QKV: the
     * logical tensors differ, so digests cannot prove it; an import back
     * and a diff can (docs/TOOLS.md). */
    if (megatron_out && !megatron && !dist && verify)
        refusal = "--verify compares logical digests, and a GPT written as Megatron's regroups its QKV: import it back "
                  "(tp-ckpt import) and diff instead";
    else if (megatron && megatron_optimizer_refusal(megatron, NULL) && !options.drop_optimizer)
        refusal = megatron_optimizer_refusal(megatron, NULL);
    else if (megatron_out && dist && megatron_dist_config(dist)->optimizer_read && !options.drop_optimizer)
        refusal = "the optimizer's state of a torch_dist checkpoint is not written as a legacy Megatron optimizer (its param "
                  "groups and schedule belong to the run; --format tp or dcp keep it); --weights-only converts the weights";
    if (refusal) {
        int code = megatron && megatron_optimizer_refusal(megatron, NULL) == refusal
                       ? fail("%s; --weights-only (--no-optim) converts the weights alone, as Megatron's own converters do",
                              refusal)
                       : fail("%s: %s", argv[optind], refusal);
        formats_source_close(opened);
        return code;
    }
    if (megatron_out) {
        int code = write_megatron(source, megatron, dist ? megatron_dist_config(dist) : NULL, &options, argv[optind], out,
                                  naming, verify, dry_run, json, force_progress);
        formats_source_close(opened);
        return code;
    }
    char default_out[4200];
    ckpt_layout target = reshard_target_layout(layout, &options);
    out = output_path(out, ckpt_reader_path(source), &target, default_out, sizeof default_out);
    const char *base = strrchr(out, '/') ? strrchr(out, '/') + 1 : out;
    int update_latest = ckpt_step_of_name(base) >= 0;
    /* A remote output is written locally, then uploaded (its `latest` too). */
    options.update_latest = update_latest && !ckpt_is_remote(out);

    progress bar;
    options.on_bytes = on_bytes;
    options.progress_ctx = &bar;
    reshard_plan *plan = NULL;
    if (reshard_plan_create(&plan, source, &options)) {
        int code = fail("%s", tp_errmsg());
        formats_source_close(opened);
        return code;
    }
    const reshard_summary *s = reshard_plan_summary(plan);
    /* Said once, in the plan or the summary, so that an error stays one line. */
    char device[160];
    if (s->device_reason) snprintf(device, sizeof device, "%s: %s", s->device, s->device_reason);
    else snprintf(device, sizeof device, "%s", s->device);
    if (dry_run) {
        if (json) {
            cJSON *o = summary_json(s, ckpt_reader_path(source), out);
            cJSON_AddNumberToObject(o, "files", s->files_written);
            cJSON_AddNumberToObject(o, "pieces", (double)s->pieces_written);
            cJSON_AddNumberToObject(o, "buffer_memory", (double)s->buffer_memory);
            print_json(o);
        } else {
            print_plan(s, device, ckpt_reader_path(source), out);
        }
        reshard_plan_free(plan);
        formats_source_close(opened);
        return 0;
    }

    progress_start(&bar, "reshard", s->bytes_written, force_progress);
    int status = cli_write_output(out, options.overwrite, ckpt_may_replace_checkpoint, NULL, options.threads, update_latest,
                                  execute_plan, plan);
    double seconds = progress_finish(&bar);
    int code = 0;
    if (status) code = fail("%s", tp_errmsg());
    reshard_verify_result checked = {0, 0, ""};
    double verify_seconds = 0;
    if (!code && verify) {
        ckpt_reader *output = NULL;
        if (ckpt_reader_open(&output, out, NULL)) code = fail("%s", tp_errmsg());
        else code = verify_output(source, output, s->threads, &checked, &verify_seconds);
        ckpt_reader_close(output);
    }
    if (!code) {
        double gbps = seconds > 0 ? (double)s->bytes_written / seconds / 1e9 : 0;
        if (json) {
            cJSON *o = summary_json(s, ckpt_reader_path(source), out);
            cJSON_AddNumberToObject(o, "seconds", seconds);
            cJSON_AddNumberToObject(o, "gbps", gbps);
            cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)cli_peak_rss_bytes());
            if (verify) {
                cJSON_AddBoolToObject(o, "verified", 1);
                cJSON_AddNumberToObject(o, "verify_seconds", verify_seconds);
            }
            print_json(o);
        } else {
            char read[32], written[32], peak[32];
            format_bytes((double)s->bytes_read, read, sizeof read);
            format_bytes((double)s->bytes_written, written, sizeof written);
            format_bytes((double)cli_peak_rss_bytes(), peak, sizeof peak);
            char from_text[RESHARD_LAYOUT_TEXT_MAX], to_text[RESHARD_LAYOUT_TEXT_MAX];
            cli_source_layout_text(source, from_text);
            reshard_layout_text(&s->to, to_text);
            printf("resharded %s (%s) -> %s (%s): %d tensors, %s read, %s written in %.2f s "
                   "(%.2f GB/s, %s), peak memory %s\n",
                   ckpt_reader_path(source), from_text, out, to_text, s->tensors, read, written, seconds, gbps, device,
                   peak);
            if (verify) print_verified(&checked, verify_seconds);
        }
    }
    reshard_plan_free(plan);
    formats_source_close(opened);
    return code;
}
