/* cli.c: one-line errors of the command-line programs, and their clean-up
 * on signals. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../ckpt/ckpt.h"
#include "../common/path.h"
#include "../formats/registry.h"
#include "cli.h"

/* The handler only writes the signal's number to a pipe (all a handler may
 * do safely); a thread that waits on the pipe removes the partial outputs,
 * which takes locks and walks directories, and waits for the uploads under
 * way to remove what they sent (store_discard_all_staged: their requests
 * fail from then on, so they do on their own threads), then dies of the
 * signal. Threads
 * other libraries started before main (OpenBLAS) may take the signal, which
 * is why this is a handler and not sigwait with the signals blocked. */
static int signal_pipe[2] = {-1, -1};
/* Set once the clean-up began: the outputs it removes make the main
 * thread's writing fail, and the process must end by the signal, not by
 * that error's exit status (a caller waiting for 143 would read 1). */
static atomic_int dying;

/* At exit: while the clean-up runs, wait for the signal it raises. */
static void wait_for_the_signal(void)
{
    while (atomic_load(&dying)) pause();
}

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char byte = (unsigned char)sig;
    ssize_t ignored = write(signal_pipe[1], &byte, 1);
    (void)ignored;
    errno = saved;
}

static void *clean_up_thread(void *arg)
{
    (void)arg;
    unsigned char byte;
    ssize_t n;
    while ((n = read(signal_pipe[0], &byte, 1)) < 0 && errno == EINTR) {
    }
    if (n != 1) return NULL;
    atomic_store(&dying, 1);
    store_discard_all_staged();
    int sig = byte;
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    _exit(128 + sig); /* not reached: the default action ends the process */
}

int cli_catch_signal(int sig, void (*handler)(int))
{
    struct sigaction current;
    if (sigaction(sig, NULL, &current) != 0) return -1;
    if (current.sa_handler == SIG_IGN) return 0;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    return sigaction(sig, &action, NULL);
}

int cli_clean_up_on_signals(void)
{
    if (pipe2(signal_pipe, O_CLOEXEC) != 0) return -1;
    if (atexit(wait_for_the_signal) != 0) return -1;
    pthread_t thread;
    if (pthread_create(&thread, NULL, clean_up_thread, NULL) != 0) return -1;
    pthread_detach(thread);
    const int signals[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++)
        if (cli_catch_signal(signals[i], on_signal) != 0) return -1;
    return 0;
}

static const char *help_command;
static int usage_unsaid;

void cli_set_help_command(const char *command)
{
    help_command = command;
}

void cli_say_usage_errors(int say)
{
    usage_unsaid = !say;
}

void cli_usage_error(const char *program, const char *fmt, ...)
{
    /* One line, written at once: ranks of one job writing theirs in pieces
     * interleaved them ("tp-train: tp-train: ..."). */
    char message[4096];
    va_list args;
    va_start(args, fmt);
    int n = snprintf(message, sizeof message, "%s: ", program);
    if (n > 0 && (size_t)n < sizeof message) n += vsnprintf(message + n, sizeof message - (size_t)n, fmt, args);
    va_end(args);
    if (n > 0 && (size_t)n < sizeof message)
        snprintf(message + n, sizeof message - (size_t)n, " (see %s --help)\n", help_command ? help_command : program);
    if (strlen(message) > 0 && message[strlen(message) - 1] != '\n') strcpy(message + sizeof message - 5, "...\n");
    if (!usage_unsaid) fputs(message, stderr);
    exit(2);
}

static void print_store_notice(void *program, const char *text)
{
    fprintf(stderr, "%s: warning: %s\n", (const char *)program, text);
}

void cli_print_store_notices(const char *program)
{
    store_set_notice(print_store_notice, (void *)program);
}

static const char *stdout_program;

/* on_exit's handler: a program that would exit 0 with its output lost (a
 * full disk, a reader gone while SIGPIPE is ignored) exits 1 saying so. A
 * failing exit has said why already. */
static void check_stdout(int status, void *ctx)
{
    (void)ctx;
    errno = 0;
    int failed = ferror(stdout);
    if (fflush(stdout) != 0) failed = 1;
    if (!failed || status != 0) return;
    fprintf(stderr, "%s: error: cannot write standard output: %s\n", stdout_program,
            errno ? strerror(errno) : "a write failed");
    _exit(1);
}

int cli_check_stdout_at_exit(const char *program)
{
    stdout_program = program;
    return on_exit(check_stdout, NULL);
}

int cli_error(const char *program, const char *fmt, ...)
{
    /* A failure while the signal's clean-up runs is that clean-up's doing
     * (an upload cut off, an output removed under its writer): the process
     * dies of the signal and says nothing more (the line was cut midway by
     * that death, "tp-ckpt: error: " alone). */
    if (atomic_load(&dying)) wait_for_the_signal();
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "%s: error: ", program);
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    return 1;
}

int cli_status_error(const char *program, int status)
{
    int code = cli_error(program, "%s", tp_errmsg());
    return status == TP_ERR_LIMIT ? 2 : code;
}

void cli_check_true_vocab(const char *program, int64_t true_vocab, const checkpoint_format *format, const char *path,
                          const char *what)
{
    if (true_vocab <= 0 || format->pads_vocabulary) return;
    const store_ops *store;
    int exists = 1;
    if (store_for(path, &store) == TP_OK && store_exists(store, path, &exists) != TP_OK) exists = 1;
    if (exists)
        cli_usage_error(program, "--true-vocab-size applies to a Megatron checkpoint (legacy or torch_dist), not to %s (%s)",
                        path, what ? what : format->title);
}

const char *cli_rejected_option(char *const argv[])
{
    /* An unknown letter inside a cluster (-xj): getopt stays on that word
     * until its last letter, so the word before it is no answer. */
    static char letter[3];
    const char *word = optind > 0 ? argv[optind] : NULL;
    if (optopt > ' ' && optopt < 127 && word && word[0] == '-' && word[1] != '-' && strchr(word + 1, optopt)) {
        snprintf(letter, sizeof letter, "-%c", optopt);
        return letter;
    }
    return optind > 1 ? argv[optind - 1] : "?";
}

int64_t cli_int(const char *program, const char *option, const char *text, int64_t min, int64_t max)
{
    int64_t value;
    if (parse_int(text, min, max, &value))
        cli_usage_error(program, "%s expects an integer in %lld..%lld, got '%s'", option, (long long)min, (long long)max,
                        text);
    return value;
}

double cli_number(const char *program, const char *option, const char *text)
{
    double value;
    int status = parse_double(text, &value);
    if (status == PARSE_RANGE)
        cli_usage_error(program, "%s %s is %s", option, text,
                        isinf(strtod(text, NULL)) ? "beyond the largest number a double holds (about 1.8e308)"
                                                  : "below the smallest number a double holds (about 4.9e-324): it "
                                                    "would be 0");
    if (status || value < 0)
        cli_usage_error(program, "%s expects a non-negative decimal number such as 0.5 or 3e-4, got '%s'", option, text);
    return value;
}

int64_t cli_size(const char *program, const char *option, const char *text)
{
    int64_t value = 0;
    int status = parse_size(text, &value);
    if (status == PARSE_FRACTION)
        cli_usage_error(program, "%s %s is not a whole number of bytes (1.5K is 1536 bytes; 1.5 is not a size)", option,
                        text);
    if (status == PARSE_RANGE)
        cli_usage_error(program, "%s %s is more than the largest size, 2^63 - 1 bytes", option, text);
    if (status && isdigit((unsigned char)text[0]) && text[strlen(text) - 1] == 'b') /* 1Gb, 64Kb */
        cli_usage_error(program, "%s %s: b is bits; a size is in bytes, B (1GB or 1GiB: 2^30 bytes)", option, text);
    if (status)
        cli_usage_error(program, "%s expects a size such as 4096, 512M, 1.5G or 4GiB (a decimal number of bytes, or of "
                        "binary units K, M, G or T), got '%s'", option, text);
    if (value < 1) cli_usage_error(program, "%s expects a size of at least 1 byte, got '%s'", option, text);
    return value;
}

const char *cli_path(const char *program, const char *what, const char *text)
{
    if (!text[0]) cli_usage_error(program, "%s is empty: give a path", what);
    if (tp_url_has_user_info(text)) /* not repeated: the message would show the secret */
        cli_usage_error(program, "%s: credentials in URLs are refused (they would show in logs): give them in the "
                        "environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for s3://)", what);
    if (tp_url_refuse_unencoded(text)) cli_usage_error(program, "%s: %s", what, tp_errmsg()); /* at once, as given */
    return text;
}

int cli_compress(const char *program, const char *text)
{
    int64_t level;
    if (strcmp(text, "none") == 0) return 0;
    if (strcmp(text, "zstd") == 0) return 3;
    if (strncmp(text, "zstd:", 5) == 0 && parse_int(text + 5, 1, 22, &level) == 0) return (int)level;
    cli_usage_error(program, "--compress expects zstd, zstd:LEVEL (1..22) or none, got '%s'", text);
}

int cli_claim_run_output(const char *target, ckpt_run_claim **out)
{
    *out = NULL;
    char run_dir[CKPT_PATH_MAX], name[CKPT_PATH_MAX];
    /* A step_N of a run directory is the run's whatever wrote it: an output
     * of that name becomes (or replaces) one of its checkpoints. Before,
     * only the writers that move `latest` asked, and `tp-ckpt copy DIR
     * URL/run/step_N` (an upload, which took no claim) replaced a live
     * trainer's step with --force. */
    if (tp_split_path(target, run_dir, sizeof run_dir, name, sizeof name) != TP_OK || ckpt_step_of_name(name) < 0)
        return TP_OK;
    if (!ckpt_is_remote(target)) {
        /* Said as any output's missing parent is (store_stage), not as the
         * claim's lock file that cannot be made in it. */
        store_stat parent = {0};
        TP_TRY(store_posix()->stat(store_posix(), run_dir, &parent));
        if (!parent.exists) return tp_fail(TP_ERR_NOT_FOUND, "%s: parent directory %s does not exist", target, run_dir);
    }
    return ckpt_run_claim_share(run_dir, program_invocation_short_name, out);
}

int cli_write_output(const char *target, int replace, store_replace_check may_replace, void *replace_ctx, int threads,
                     int update_latest, int (*write)(void *ctx, const char *path), void *ctx)
{
    /* The run's claim first: a live run refuses this output before its
     * target is even looked at (in an object store, a live run's lease
     * refuses such a writer, whose own lease refuses a trainer meanwhile). */
    ckpt_run_claim *claim = NULL;
    TP_TRY(cli_claim_run_output(target, &claim));
    char local[CKPT_PATH_MAX];
    int status = ckpt_output_begin(target, replace, may_replace, replace_ctx, local, sizeof local);
    if (status) {
        ckpt_run_claim_release(claim);
        return status;
    }
    status = write(ctx, local);
    ckpt_upload_options upload;
    ckpt_upload_options_init(&upload);
    upload.replace = replace;
    upload.threads = threads;
    int uploaded = ckpt_output_finish(target, local, status == TP_OK, &upload, update_latest);
    ckpt_run_claim_release(claim);
    return status ? status : uploaded;
}

int cli_checkpoint_around(const char *path, char *ckpt, size_t size)
{
    char parent[TP_PATH_MAX], base[TP_PATH_MAX], dir[PATH_MAX];
    if (!realpath(path, dir) &&
        (tp_split_path(path, parent, sizeof parent, base, sizeof base) || !realpath(parent, dir)))
        return 0;
    for (;;) {
        char up[TP_PATH_MAX], name[TP_PATH_MAX];
        if (tp_split_path(dir, up, sizeof up, name, sizeof name)) return 0; /* the root */
        if (ckpt_step_of_name(name) >= 0 || ckpt_is_committed(dir)) {
            snprintf(ckpt, size, "%s", dir);
            return 1;
        }
        if (strcmp(up, dir) == 0) return 0;
        snprintf(dir, sizeof dir, "%s", up);
    }
}

int cli_output_apart(const char *program, const char *input, const char *output)
{
    int output_in_input = 0, input_in_output = 0;
    if (tp_path_within(output, input, &output_in_input) || tp_path_within(input, output, &input_in_output)) return 0;
    if (output_in_input && input_in_output)
        cli_error(program, "the output %s is the input %s itself: an output is written outside its input", output, input);
    else if (output_in_input)
        cli_error(program, "the output %s lies inside the input %s: an output is never written into its input; choose a path "
                  "outside it", output, input);
    else if (input_in_output)
        cli_error(program, "the input %s lies inside the output %s, which --force would replace with the output; choose an "
                  "output that does not hold the input", input, output);
    return output_in_input || input_in_output ? 2 : 0;
}

int64_t cli_peak_rss_bytes(void)
{
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage)) return 0;
    return (int64_t)usage.ru_maxrss * 1024; /* ru_maxrss is in KiB on Linux */
}

void cli_source_layout_text(ckpt_reader *source, char out[RESHARD_LAYOUT_TEXT_MAX])
{
    reshard_layout_text(ckpt_reader_saved_layout(source), out);
}

int cli_foreign_checkpoint(const char *path, const char *target, cli_foreign *out)
{
    memset(out, 0, sizeof *out);
    const checkpoint_format *format;
    TP_TRY(formats_detect(path, &format));
    if (!strcmp(format->name, "tp")) {
        /* No other tool's checkpoint: a Hugging Face model directory (what
         * tp-ckpt import reads) is named, not left to be "not a checkpoint". */
        char config[CKPT_PATH_MAX + 32], single[CKPT_PATH_MAX + 32], sharded[CKPT_PATH_MAX + 48];
        snprintf(config, sizeof config, "%s/config.json", path);
        snprintf(single, sizeof single, "%s/model.safetensors", path);
        snprintf(sharded, sizeof sharded, "%s/model.safetensors.index.json", path);
        if (store_is_remote(path) || access(config, F_OK) || (access(single, F_OK) && access(sharded, F_OK)))
            return TP_OK;
        snprintf(out->what, sizeof out->what, "a Hugging Face model directory (config.json, safetensors)");
        snprintf(out->convert, sizeof out->convert, "tp-ckpt import %s -o %s --tp T --pp P", path, target);
        out->step = "step, 0 for a model imported from Hugging Face";
        out->doc = " (docs/EXPORT.md \"Import\")";
        return TP_OK;
    }
    char above[CKPT_PATH_MAX], base[CKPT_NAME_MAX + 1] = ""; /* "iter_0000010/" is iter_0000010 */
    tp_split_path(path, above, sizeof above, base, sizeof base);
    int megatron = !strcmp(format->name, "megatron"), dist = !strcmp(format->name, "torch_dist");
    int dcp = !strcmp(format->name, "dcp");
    if (dist) snprintf(out->what, sizeof out->what, "a Megatron-Core distributed checkpoint (metadata.json)");
    else if (dcp) snprintf(out->what, sizeof out->what, "a PyTorch distributed checkpoint (.metadata)");
    else if (megatron && (!strncmp(base, "iter_", 5) || !strcmp(base, "release")))
        snprintf(out->what, sizeof out->what, "an iteration of a Megatron-LM checkpoint (mp_rank_* rank files)");
    else if (megatron)
        snprintf(out->what, sizeof out->what, "a Megatron-LM checkpoint (latest_checkpointed_iteration.txt)");
    else snprintf(out->what, sizeof out->what, "a %s checkpoint", format->title);
    /* Megatron's are imported (their model mapped to this toolkit's GPT);
     * the others are resharded into this toolkit's format. */
    if (megatron || dist)
        snprintf(out->convert, sizeof out->convert, "tp-ckpt import %s -o %s --tp T --pp P", path, target);
    else snprintf(out->convert, sizeof out->convert, "tp-reshard %s --to tpTppP --format tp -o %s", path, target);
    out->step = megatron || dist ? "iteration" : "step";
    out->doc = megatron || dist ? " (docs/MEGATRON.md)" : dcp ? " (docs/DCP.md)" : "";
    return TP_OK;
}

int cli_ckpt_dir_refusal(const char *dir, int resume, char *why, size_t size)
{
    cli_foreign foreign;
    TP_TRY(cli_foreign_checkpoint(dir, "RUN/step_N", &foreign));
    why[0] = '\0';
    if (foreign.what[0]) {
        snprintf(why, size, "--ckpt-dir %s is %s, not a tp-train run directory: to train from it, convert it into a run "
                 "directory (mkdir RUN; %s, N its %s), then give --ckpt-dir RUN --resume%s", dir, foreign.what,
                 foreign.convert, foreign.step, foreign.doc);
        return TP_OK;
    }
    /* This toolkit's: a run's history is continued only when asked, and no
     * checkpoint is written inside another. */
    ckpt_dir_kind kind;
    ckpt_candidate newest;
    TP_TRY(ckpt_run_dir_kind(dir, &kind, &newest));
    if (kind == CKPT_DIR_RUN && !resume)
        snprintf(why, size, "--ckpt-dir %s holds the checkpoints of a run (the newest: %s): pass --resume to continue "
                 "it, or choose another directory for a new run", dir, newest.path);
    if (kind != CKPT_DIR_CHECKPOINT) return TP_OK;
    char parent[CKPT_PATH_MAX], name[CKPT_PATH_MAX], step[64] = "N";
    if (newest.step >= 0) snprintf(step, sizeof step, "%08lld", (long long)newest.step);
    int in_run = tp_split_path(dir, parent, sizeof parent, name, sizeof name) == TP_OK && ckpt_step_of_name(name) >= 0;
    snprintf(why, size, "--ckpt-dir %s is a checkpoint, not a run directory, and no checkpoint is written inside "
             "another: to train from it, give a run directory that holds it (mkdir RUN; %s %s RUN/step_%s), then "
             "--ckpt-dir RUN --resume%s%s%s%s", dir, ckpt_is_remote(dir) ? "tp-ckpt copy" : "cp -r", dir, step,
             in_run ? "; or --ckpt-dir " : "", in_run ? parent : "",
             in_run ? " --resume to continue the run it belongs to (from that run's newest checkpoint)" : "",
             resume ? "" : "; for a new run, choose another directory");
    return TP_OK;
}
