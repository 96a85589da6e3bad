/* tp-reshard: convert a checkpoint to another tensor/pipeline layout.
 * A thin layer over reshard.h; see `tp-reshard --help`. Exit status: 0
 * success, 1 failure (including a failed --verify), 2 usage (a memory limit
 * too small for the run included). */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <limits.h>
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
    "                           the common state in common.pt, 0.19 and later in the checkpoint (default:\n"
    "                           a torch_dist source's release, else 0.19)\n"
    "  --dcp-torch 2|1.13       the PyTorch that will load a DCP output (its class paths; default: a DCP\n"
    "                           source's, else 2)\n"
    "  --dcp-dp N               a DCP output's pieces cut again along dimension 0 over N data-parallel\n"
    "                           ranks, as FSDP with tensor parallelism writes (a file per rank)\n"
    "  --megatron-names legacy|legacy-layernorm|core|core-local\n"
    "                           the Megatron output's tensor names (default: the source's; a torch_dist\n"
    "                           source's modules, its args.transformer_impl: local ones are core-local)\n"
    "  --true-vocab-size N      a Megatron source's true vocabulary (the tokenizer's size): its\n"
    "                           padding is then recomputed for the target TP, as Megatron's saver does\n"
    "  -o, --output DIR         output checkpoint (default: beside CKPT, named after the layout)\n"
    "  --threads N              worker threads (default: all cores)\n"
    "  --memory-limit SIZE      bound on memory, e.g. 512M or 4G (default 1G); too small: exit 2\n"
    "  --device auto|cpu|cuda   where moves and conversions run (default auto: a GPU when present and\n"
    "                           the plan converts dtypes; plain copies stay on the CPU; cuda: --format tp)\n"
    "  --dtype keep|fp32|bf16|fp16  parameter dtype (optimizer state stays fp32; default keep; --format tp:\n"
    "                           other outputs keep the source's dtypes)\n"
    "  --compress zstd[:L]|none output compression (default: as the source; zstd: --format tp)\n"
    "  --no-optim, --weights-only  leave out optimizer state (e.g. for inference)\n"
    "  --dry-run                print the plan: files, tensors, bytes, memory; write nothing\n"
    "  --verify                 after writing, prove the output equal to the source (digests); not\n"
    "                           offered for this toolkit's GPT written as Megatron's (exit 2)\n"
    "  --json                   print a machine-readable summary instead of text\n"
    "  --force                  replace an existing output\n"
    "  --progress               show progress even when stderr is not a terminal\n"
    "  --allow-nonfinite        another tool's checkpoint written in this toolkit's format (--format tp)\n"
    "                           with its NaN and infinite values as they are, with a warning (by\n"
    "                           default they fail the run, the first named, nothing written)\n"
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

static cJSON *layout_json(const ckpt_layout *l)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tp", l->tp);
    cJSON_AddNumberToObject(o, "pp", l->pp);
    if (ckpt_layout_chunks(l) > 1) cJSON_AddNumberToObject(o, "virtual_stages", ckpt_layout_chunks(l));
    return o;
}

/* The keys of the plan (--dry-run --json) and of the summary (--json): the
 * source and output, both layouts, then the format's own. */
static cJSON *plan_json(const formats_write_summary *s, ckpt_reader *source, const char *out)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "source", ckpt_reader_path(source));
    cJSON_AddStringToObject(o, "output", out);
    cJSON_AddItemToObject(o, "from", layout_json(ckpt_reader_saved_layout(source)));
    cJSON_AddItemToObject(o, "to", layout_json(&s->to));
    for (const cJSON *item = s->json ? s->json->child : NULL; item; item = item->next)
        cJSON_AddItemToObject(o, item->string, cJSON_Duplicate(item, 1));
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

/* The output: -o's, or the default beside the source. A local source named
 * "." or ".." (run/., or the directory one is in) is named by where it
 * leads: "._tp2pp1" would lie inside it. */
static const char *output_path(const char *out, const char *source, const ckpt_layout *to, char *buf, size_t size)
{
    if (out) return out;
    char parent[CKPT_PATH_MAX], base[CKPT_PATH_MAX], resolved[PATH_MAX];
    int dots = tp_split_path(source, parent, sizeof parent, base, sizeof base) != TP_OK;
    if (dots && !tp_path_is_url(source) && realpath(source, resolved)) source = resolved;
    default_output(source, to, buf, size);
    return buf;
}

/* The plan, said before writing (--dry-run). */
static void print_plan(const formats_write_summary *s, ckpt_reader *source, const char *out)
{
    char from[RESHARD_LAYOUT_TEXT_MAX];
    cli_source_layout_text(source, from);
    printf("plan: %s (%s) -> %s (%s)\n", ckpt_reader_path(source), from, out, s->target);
    for (int i = 0; i < s->details; i++) printf("  %-10s %s\n", s->detail[i].label, s->detail[i].text);
}

static int run_write(void *plan, const char *path)
{
    return formats_write(plan, path);
}

/* Reopens the output through the registry as its format (its digests
 * computed where it records none of its own) and compares it with the
 * source; 0, or the exit code of a failure it reported. */
static int verify_written(ckpt_reader *source, const char *out, const checkpoint_format *format,
                          const formats_write_summary *s, int threads, reshard_verify_result *checked, double *seconds)
{
    formats_source *output = NULL;
    formats_source_options reopen = {.compute_digests = 1, .threads = threads, .true_vocab = s->true_vocab};
    int code = formats_source_open(out, format, &reopen, &output)
                   ? fail("%s", tp_errmsg())
                   : verify_output(source, formats_source_reader(output), threads, checked, seconds);
    formats_source_close(output);
    return code;
}

/* This toolkit's format written from a source that names no model of its
 * own (another tool's, its tensors under that tool's names and layout):
 * said, since the output looks like a checkpoint tp-train takes and is not
 * one (tp-train refuses it: gpt_config_from_json). */
static void print_no_model_note(formats_source *opened, const checkpoint_format *target, const char *out)
{
    const char *model = ckpt_reader_state(formats_source_reader(opened))->model_json;
    if (strcmp(target->name, "tp") || (model && strcmp(model, "{}"))) return;
    int megatron = formats_source_megatron(opened) || formats_source_megatron_dist(opened);
    printf("note: %s names no model: its tensors keep the source's names and layout, so tp-train neither resumes nor "
           "evaluates it%s\n", out, megatron ? "; tp-ckpt import converts a Megatron checkpoint for tp-train" : "");
}

/* Plans the output (--dry-run stops there), writes it (a URL locally, then
 * uploaded), verifies it when asked, and says what was done. */
static int convert(formats_source *opened, const checkpoint_format *format, formats_write_options *options,
                   const char *out, int verify, int dry_run, int json, int force_progress)
{
    ckpt_reader *source = formats_source_reader(opened);
    /* An output named step_N in a run directory becomes its `latest` (a remote one's after the upload). */
    char parent[CKPT_PATH_MAX], base[CKPT_NAME_MAX + 1]; /* "RUN/step_3/" is step_3 */
    int in_run_directory = out && tp_split_path(out, parent, sizeof parent, base, sizeof base) == TP_OK &&
                           ckpt_step_of_name(base) >= 0;
    options->reshard.update_latest = in_run_directory && !ckpt_is_remote(out);
    progress bar;
    options->reshard.on_bytes = on_bytes;
    options->reshard.progress_ctx = &bar;
    formats_write_plan *plan = NULL;
    int planned = formats_write_plan_create(opened, format, options, &plan);
    if (planned) return cli_status_error("tp-reshard", planned); /* a limit too small for the write: exit 2 */
    const formats_write_summary *s = formats_write_plan_summary(plan);
    char default_out[4200];
    int named = out != NULL;
    out = output_path(out, formats_source_name(opened), &s->to, default_out, sizeof default_out);
    int same = 0;
    if (!named && !tp_path_within(out, formats_source_name(opened), &same) && same) {
        /* A source named after the target layout (ckpt_tp2pp2 --to tp2pp2):
         * its default output is itself, which --force would not change. */
        char layout[RESHARD_LAYOUT_TEXT_MAX];
        reshard_layout_text(&s->to, layout);
        formats_write_plan_free(plan);
        cli_usage_error("tp-reshard", "the default output, %s, is the input itself (named after %s already): give -o OUT",
                        out, layout);
    }
    /* --memory-limit bounds the whole run: the upload of a remote output
     * (which verifies the local copy first) and --verify read the output
     * back on no more threads than it leaves room for, as the write did; a
     * limit that leaves room for none is refused before anything is written
     * (the write alone may fit in less: 21 MiB against 35 for the verify of
     * docs/BENCHMARKS.md's checkpoint). Each thread holds what the output's
     * pieces need as the plan says (its largest piece's slab, up to 16 MiB,
     * and a converted tensor's source slab): a small output is read back in
     * little. */
    int asked = options->reshard.threads, remote = ckpt_is_remote(out);
    int64_t limit = options->reshard.memory_limit;
    int64_t need = s->read_back_bytes > 0 ? s->read_back_bytes : RESHARD_READ_BACK_BYTES;
    int upload_threads = reshard_verify_threads(limit, asked > 0 ? asked : CKPT_TRANSFER_THREADS, need);
    int threads = reshard_verify_threads(limit, asked > 0 ? asked : parallel_cpu_count(), need);
    if ((verify || remote) && (threads < 1 || upload_threads < 1)) {
        int refused = reshard_memory_refusal(limit, need, 0, "%s, reading the output back in slabs",
                                             verify ? "--verify" : "the upload");
        formats_write_plan_free(plan);
        return cli_status_error("tp-reshard", refused);
    }
    if (upload_threads < 1) upload_threads = 1; /* a local output's, read back by no one */
    if (threads < 1) threads = 1;
    if (dry_run) {
        /* The plan of a run that would be refused is refused as that run. */
        if (ckpt_output_check(out, options->reshard.overwrite, format->writer->may_replace, NULL)) {
            formats_write_plan_free(plan);
            return fail("%s", tp_errmsg());
        }
        if (json) print_json(plan_json(s, source, out));
        else print_plan(s, source, out);
        formats_write_plan_free(plan);
        return 0;
    }
    /* A reshard keeps the source's step: named step_N in a run directory, it must be N. */
    if (in_run_directory && s->keeps_latest) {
        char why[3 * CKPT_PATH_MAX + 512];
        int refused = 0;
        if (ckpt_run_output_refusal(out, ckpt_reader_state(source)->step, 0, why, sizeof why))
            refused = fail("%s", tp_errmsg());
        else if (why[0])
            refused = (fail("%s", why), 2); /* a usage error, as tp-ckpt's */
        if (refused) {
            formats_write_plan_free(plan);
            return refused;
        }
    } else if (in_run_directory) {
        /* Another tool's checkpoint named step_N among the run's: tp-train,
         * reaching step N, stopped there (ckpt_foreign_output_refusal). */
        char why[3 * CKPT_PATH_MAX + 512], what[160];
        snprintf(what, sizeof what, "a %s%s", format->title, strstr(format->title, "checkpoint") ? "" : " checkpoint");
        int refused = 0;
        if (ckpt_foreign_output_refusal(out, what, why, sizeof why)) refused = fail("%s", tp_errmsg());
        else if (why[0]) refused = (fail("%s", why), 2); /* a usage error, as the refusal above */
        if (refused) {
            formats_write_plan_free(plan);
            return refused;
        }
    }
    progress_start(&bar, "reshard", s->bytes_written, force_progress);
    int written = cli_write_output(out, options->reshard.overwrite, format->writer->may_replace, NULL, upload_threads,
                                   in_run_directory && s->keeps_latest, run_write, plan);
    int code = written ? cli_status_error("tp-reshard", written) : 0;
    double seconds = progress_finish(&bar);
    if (!code && s->warning[0]) fprintf(stderr, "tp-reshard: warning: %s\n", s->warning);
    const ckpt_nonfinite *nonfinite = options->reshard.nonfinite;
    if (!code && nonfinite && nonfinite->tensors)
        fprintf(stderr, "tp-reshard: warning: written with NaN or infinite values (--allow-nonfinite): %s\n",
                nonfinite->summary);
    reshard_verify_result checked = {0, 0, ""};
    double verify_seconds = 0;
    if (!code && verify) code = verify_written(source, out, format, s, threads, &checked, &verify_seconds);
    if (!code) {
        double gbps = seconds > 0 ? (double)s->bytes_written / seconds / 1e9 : 0;
        if (json) {
            cJSON *o = plan_json(s, source, out);
            cJSON_AddNumberToObject(o, "seconds", seconds);
            cJSON_AddNumberToObject(o, "gbps", gbps);
            cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)cli_peak_rss_bytes());
            if (verify) {
                cJSON_AddBoolToObject(o, "verified", 1);
                cJSON_AddNumberToObject(o, "verify_seconds", verify_seconds);
            }
            print_json(o);
        } else {
            char from[RESHARD_LAYOUT_TEXT_MAX], written[32], peak[32];
            cli_source_layout_text(source, from);
            format_bytes((double)s->bytes_written, written, sizeof written);
            format_bytes((double)cli_peak_rss_bytes(), peak, sizeof peak);
            printf("resharded %s (%s) -> %s (%s): %s, %s written in %.2f s (%.2f GB/s%s%s), peak memory %s\n",
                   ckpt_reader_path(source), from, out, s->target, s->contents, written, seconds, gbps,
                   s->device[0] ? ", " : "", s->device, peak);
            if (verify) print_verified(&checked, verify_seconds);
            print_no_model_note(opened, format, out);
        }
    }
    formats_write_plan_free(plan);
    return code;
}

int main(int argc, char **argv)
{
    opterr = 0; /* rejected options are reported in one line */
    if (cli_clean_up_on_signals() != 0) return fail("cannot set up signal handling: %s", strerror(errno));
    cli_print_store_notices("tp-reshard");
    cli_check_stdout_at_exit("tp-reshard");
    reshard_options options;
    reshard_options_init(&options);
    const char *to = NULL, *from = NULL, *out = NULL, *output_format = NULL;
    int naming = -1;
    int64_t true_vocab = 0;
    dcp_torch_version dcp_torch = DCP_TORCH_2;
    megatron_core_common mcore_common = MEGATRON_CORE_COMMON_ENTRY;
    int mcore_given = 0;
    int dcp_torch_given = 0, dcp_dp = 1, dcp_dp_given = 0;
    int dry_run = 0, verify = 0, json = 0, force_progress = 0;
    enum { O_TO = 256, O_FROM, O_THREADS, O_MEMORY, O_DEVICE, O_DTYPE, O_COMPRESS, O_NO_OPTIM, O_DRY, O_VERIFY,
           O_JSON, O_FORCE, O_PROGRESS, O_FORMAT, O_NAMES, O_TRUE_VOCAB, O_DCP_TORCH, O_DCP_DP, O_MCORE,
           O_ALLOW_NONFINITE };
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
        {"megatron-core", required_argument, 0, O_MCORE}, {"allow-nonfinite", no_argument, 0, O_ALLOW_NONFINITE},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "o:h", long_options, NULL)) != -1) {
        switch (c) {
        case 'o': out = cli_path("tp-reshard", "-o", optarg); break;
        case O_TO: to = optarg; break;
        case O_FROM: from = optarg; break;
        case O_FORMAT:
            if (!formats_find(optarg) || !formats_find(optarg)->writer) /* a format the registry writes */
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
        case O_DCP_DP:
            dcp_dp = (int)cli_int("tp-reshard", "--dcp-dp", optarg, 1, 4096);
            dcp_dp_given = 1;
            break;
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
        case O_ALLOW_NONFINITE: options.allow_nonfinite = 1; break;
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
    if (formats_detect(cli_path("tp-reshard", "the source's path", argv[optind]), &format)) return fail("%s", tp_errmsg());
    cli_check_true_vocab("tp-reshard", true_vocab, format, argv[optind], NULL);
    /* --verify of an output it cannot prove: refused before the source is
     * read (its digests computed) or anything written, a usage error. */
    char unverifiable[512];
    if (verify && formats_write_unverifiable(format, output_format ? formats_find(output_format) : format, unverifiable,
                                             sizeof unverifiable))
        die_usage("%s", unverifiable);
    ckpt_read_options read;
    ckpt_read_options_init(&read);
    read.through_index = 1;
    formats_source_options source_options = {
        .read = &read, .compute_digests = verify, .threads = options.threads, .true_vocab = true_vocab};
    formats_source *opened;
    if (formats_source_open(argv[optind], format, &source_options, &opened)) return fail("%s", tp_errmsg());
    int apart = out ? cli_output_apart("tp-reshard", argv[optind], out) : 0;
    if (apart) {
        formats_source_close(opened);
        return apart;
    }
    /* The layout it was saved at: another tool's checkpoint is read at tp 1
     * (whole tensors), but --from names what its writer saved, as the
     * summary line does. */
    const ckpt_layout *layout = ckpt_reader_saved_layout(formats_source_reader(opened));
    if ((from_tp && from_tp != layout->tp) || (from_pp && from_pp != layout->pp) ||
        (from_chunks && from_chunks != ckpt_layout_chunks(layout))) {
        char source_layout[RESHARD_LAYOUT_TEXT_MAX];
        reshard_layout_text(layout, source_layout);
        int code = fail("--from %s does not match %s, which is %s", from, ckpt_reader_path(formats_source_reader(opened)),
                        source_layout);
        formats_source_close(opened);
        return code;
    }
    /* The output's format (the source's by default) writes it (formats/registry.h). */
    const checkpoint_format *target = output_format ? formats_find(output_format) : format;
    /* An option of another output is an error whatever its value (--dcp-dp 1
     * too): it was given for an output this is not, and would be ignored. */
    if (dcp_dp_given && strcmp(target->name, "dcp")) die_usage("--dcp-dp applies to a DCP output (--format dcp)");
    if (dcp_torch_given && strcmp(target->name, "dcp") && strcmp(target->name, "torch_dist"))
        die_usage("--dcp-torch applies to a DCP or torch_dist output (--format dcp|torch_dist)");
    if (mcore_given && strcmp(target->name, "torch_dist"))
        die_usage("--megatron-core applies to a torch_dist output (--format torch_dist)");
    /* NaNs and infinities are counted where another tool's checkpoint
     * becomes this toolkit's (reshard/reshard.h): the flag would promise a
     * check that this toolkit's own source, or another format's output,
     * does not make. */
    if (options.allow_nonfinite && (!strcmp(format->name, "tp") || strcmp(target->name, "tp")))
        die_usage("--allow-nonfinite applies to another tool's checkpoint written in this toolkit's format (--format "
                  "tp): %s", !strcmp(format->name, "tp") ? "this toolkit's own checkpoints are not counted"
                                                         : "other outputs carry NaN and infinite values as they are");
    ckpt_nonfinite nonfinite; /* what the writer of this toolkit's format found; nothing for other outputs */
    ckpt_nonfinite_init(&nonfinite);
    options.nonfinite = &nonfinite;
    /* torch_dist keys are Megatron-Core's whatever the modules: no names to choose (they were ignored). */
    if (naming >= 0 && strcmp(target->name, "megatron"))
        die_usage("--megatron-names applies to a Megatron-LM legacy output (--format megatron)");
    formats_write_options write_options;
    formats_write_options_init(&write_options);
    write_options.reshard = options;
    char ignored[256]; /* --dtype, --compress, --device cuda: this toolkit's format's alone */
    if (formats_write_ignored_option(target, &write_options, ignored, sizeof ignored)) die_usage("%s", ignored);
    write_options.dp = dcp_dp;
    write_options.naming = naming;
    write_options.torch_version = dcp_torch_given ? (int)dcp_torch : -1;
    /* The common state where the source's Megatron-Core keeps it (a
     * torch_dist source's own release, as --dcp-torch takes a DCP
     * source's); another source's output is for 0.19 and later. */
    const megatron_dist *dist_source = formats_source_megatron_dist(opened);
    if (!mcore_given && dist_source && strcmp(megatron_dist_common_source(dist_source), "common_state"))
        mcore_common = MEGATRON_CORE_COMMON_FILE;
    write_options.common = mcore_common;
    write_options.verify = verify;
    write_options.megatron_view = &gpt_megatron_view; /* this toolkit's GPT written as Megatron's */
    int code = convert(opened, target, &write_options, out, verify, dry_run, json, force_progress);
    formats_source_close(opened);
    return code;
}
