/* cli.h: what the command-line programs share: one-line errors and usage
 * errors, and the option getopt rejected. Programs own the process: these
 * print and exit, which the libraries never do. */
#ifndef TP_PROGRAMS_CLI_H
#define TP_PROGRAMS_CLI_H

#include <getopt.h>

#include "../common/parse.h"
#include "../formats/registry.h"
#include "../model/gpt.h"
#include "../reshard/reshard.h"

/* The model options every program takes (model/gpt.h gpt_option_names), for
 * a getopt_long table: getopt returns CLI_MODEL_OPTION and the option's
 * index tells which, for gpt_options_set(options, table[index].name, optarg). */
#define CLI_MODEL_OPTION 0x4D00
#define CLI_MODEL_LONG_OPTIONS                                                                                        \
    {"model", required_argument, 0, CLI_MODEL_OPTION}, {"layers", required_argument, 0, CLI_MODEL_OPTION},          \
        {"dim", required_argument, 0, CLI_MODEL_OPTION}, {"heads", required_argument, 0, CLI_MODEL_OPTION},         \
        {"kv-heads", required_argument, 0, CLI_MODEL_OPTION}, {"vocab", required_argument, 0, CLI_MODEL_OPTION},    \
        {"seq", required_argument, 0, CLI_MODEL_OPTION}, {"ffn", required_argument, 0, CLI_MODEL_OPTION},           \
        {"vocab-pad-multiple", required_argument, 0, CLI_MODEL_OPTION},                                             \
        {"dtype", required_argument, 0, CLI_MODEL_OPTION}, {"swiglu", no_argument, 0, CLI_MODEL_OPTION},          \
        {"arch", required_argument, 0, CLI_MODEL_OPTION}, {"norm-eps", required_argument, 0, CLI_MODEL_OPTION},     \
        {"rope-theta", required_argument, 0, CLI_MODEL_OPTION},                                                     \
        {"rope-scaling", required_argument, 0, CLI_MODEL_OPTION},                                                   \
        {"tied-embeddings", no_argument, 0, CLI_MODEL_OPTION}, {"untied-embeddings", no_argument, 0, CLI_MODEL_OPTION}

/* tp-train's own options (beyond the model's): its getopt_long table, and
 * what tp-elastic plan takes of a run's arguments pasted to it (each value
 * consumed as tp-train consumes it). getopt returns the CLI_TRAIN_* code. */
enum {
    CLI_TRAIN_FIRST = 0x5400,
    CLI_TRAIN_TP = CLI_TRAIN_FIRST, CLI_TRAIN_PP, CLI_TRAIN_DP, CLI_TRAIN_MICRO_BATCH, CLI_TRAIN_GRAD_ACCUM,
    CLI_TRAIN_GLOBAL_BATCH, CLI_TRAIN_SEQUENCE_PARALLEL, CLI_TRAIN_VIRTUAL_STAGES, CLI_TRAIN_ZERO, CLI_TRAIN_STEPS,
    CLI_TRAIN_LR, CLI_TRAIN_MIN_LR, CLI_TRAIN_WARMUP, CLI_TRAIN_WEIGHT_DECAY, CLI_TRAIN_CLIP, CLI_TRAIN_SEED,
    CLI_TRAIN_DATA, CLI_TRAIN_CKPT_DIR, CLI_TRAIN_CKPT_EVERY, CLI_TRAIN_RESUME, CLI_TRAIN_SYNC_SAVE, CLI_TRAIN_LOG,
    CLI_TRAIN_THREADS, CLI_TRAIN_DUMP, CLI_TRAIN_QUIET, CLI_TRAIN_STOP_AT, CLI_TRAIN_FAULT, CLI_TRAIN_FAULT_STEP,
    CLI_TRAIN_FAULT_RANK, CLI_TRAIN_FAULT_ONCE, CLI_TRAIN_DEVICE, CLI_TRAIN_CKPT_CACHE, CLI_TRAIN_KERNEL_TIMES,
    CLI_TRAIN_SHARE_GPUS, CLI_TRAIN_LAST = CLI_TRAIN_SHARE_GPUS
};
#define CLI_TRAIN_LONG_OPTIONS                                                                                        \
    {"tp", required_argument, 0, CLI_TRAIN_TP}, {"pp", required_argument, 0, CLI_TRAIN_PP},                         \
        {"dp", required_argument, 0, CLI_TRAIN_DP}, {"micro-batch", required_argument, 0, CLI_TRAIN_MICRO_BATCH},  \
        {"grad-accum", required_argument, 0, CLI_TRAIN_GRAD_ACCUM},                                                 \
        {"global-batch", required_argument, 0, CLI_TRAIN_GLOBAL_BATCH},                                             \
        {"sequence-parallel", no_argument, 0, CLI_TRAIN_SEQUENCE_PARALLEL},                                         \
        {"virtual-stages", required_argument, 0, CLI_TRAIN_VIRTUAL_STAGES},                                         \
        {"zero", required_argument, 0, CLI_TRAIN_ZERO}, {"steps", required_argument, 0, CLI_TRAIN_STEPS},           \
        {"lr", required_argument, 0, CLI_TRAIN_LR}, {"min-lr", required_argument, 0, CLI_TRAIN_MIN_LR},            \
        {"warmup", required_argument, 0, CLI_TRAIN_WARMUP},                                                         \
        {"weight-decay", required_argument, 0, CLI_TRAIN_WEIGHT_DECAY},                                             \
        {"clip", required_argument, 0, CLI_TRAIN_CLIP}, {"seed", required_argument, 0, CLI_TRAIN_SEED},             \
        {"data", required_argument, 0, CLI_TRAIN_DATA}, {"ckpt-dir", required_argument, 0, CLI_TRAIN_CKPT_DIR},    \
        {"ckpt-every", required_argument, 0, CLI_TRAIN_CKPT_EVERY}, {"resume", no_argument, 0, CLI_TRAIN_RESUME},  \
        {"sync-save", no_argument, 0, CLI_TRAIN_SYNC_SAVE}, {"log", required_argument, 0, CLI_TRAIN_LOG},          \
        {"threads", required_argument, 0, CLI_TRAIN_THREADS}, {"dump", required_argument, 0, CLI_TRAIN_DUMP},      \
        {"quiet", no_argument, 0, CLI_TRAIN_QUIET}, {"stop-at", required_argument, 0, CLI_TRAIN_STOP_AT},          \
        {"fault", required_argument, 0, CLI_TRAIN_FAULT}, {"fault-step", required_argument, 0, CLI_TRAIN_FAULT_STEP}, \
        {"fault-rank", required_argument, 0, CLI_TRAIN_FAULT_RANK},                                                 \
        {"fault-once", required_argument, 0, CLI_TRAIN_FAULT_ONCE},                                                 \
        {"device", required_argument, 0, CLI_TRAIN_DEVICE}, {"ckpt-cache", required_argument, 0, CLI_TRAIN_CKPT_CACHE}, \
        {"kernel-times", no_argument, 0, CLI_TRAIN_KERNEL_TIMES}, {"share-gpus", no_argument, 0, CLI_TRAIN_SHARE_GPUS}

/* How the model options read in --help; DTYPES, the dtypes the program
 * takes ("fp32|bf16|fp16": tp-train trains in fp32 or bf16 only). */
#define CLI_MODEL_USAGE(DTYPES)                                                                                        \
    "model:     --model tiny|small|gpt2-124m|llama-tiny|smollm2-135m|tinyllama-1.1b|llama-3.2-1b,\n"                 \
    "           or [--arch gpt|llama] --layers L --dim D --heads H --vocab V --seq S; refined by\n"                     \
    "           [--ffn F (GPT 4D, Llama 8D/3 to 256)] [--kv-heads K (H)] [--swiglu] [--vocab-pad-multiple N (1)]\n"   \
    "           [--dtype " DTYPES "]; Llama: [--tied-embeddings|--untied-embeddings (untied)]\n"                       \
    "           [--norm-eps E (1e-5)] [--rope-theta T (10000)] [--rope-scaling FACTOR[,LOW,HIGH,ORIGINAL] (Llama 3)]\n"

/* --true-vocab-size N (true_vocab > 0) given for the source at path: a
 * usage error unless its format pads a vocabulary (a Megatron checkpoint's);
 * `what` names what path is ("a Hugging Face directory"; NULL: the
 * format's title). A path that surely names nothing (a store that answered
 * so) is left to the open's "no such checkpoint", not refused naming the
 * format a missing path falls back to. */
void cli_check_true_vocab(const char *program, int64_t true_vocab, const checkpoint_format *format, const char *path,
                          const char *what);

/* The command-line word getopt just rejected (an unknown option, or one
 * missing its value), for a one-line message; set opterr = 0 before parsing. */
const char *cli_rejected_option(char *const argv[]);

/* "PROGRAM: message (see PROGRAM --help)" on stderr, then exit status 2;
 * after cli_set_help_command, "(see COMMAND --help)". */
void cli_usage_error(const char *program, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
/* Whether usage errors are said (default 1): the ranks of a job but the
 * first exit with status 2 without a word, the first says it once. */
void cli_say_usage_errors(int say);
/* The command whose --help a usage error points to ("tp-ckpt diff": a
 * subcommand's options are in its own --help, not the program's). */
void cli_set_help_command(const char *command);

/* Option values; text that is not one is a usage error naming the option
 * and what it takes. */
int64_t cli_int(const char *program, const char *option, const char *text, int64_t min, int64_t max);
double cli_number(const char *program, const char *option, const char *text); /* >= 0 */
int64_t cli_size(const char *program, const char *option, const char *text);  /* bytes, >= 1: 512M, 4G */
int cli_compress(const char *program, const char *text); /* zstd level of zstd[:L] (3 for zstd), 0 for none */
/* A path given on the command line (-o OUT, copy's SRC and DST): text, or,
 * when empty, a usage error naming what it is for ("-o is empty: ..."),
 * never a path the system is asked to create (exit 1, "path '' is empty"). */
const char *cli_path(const char *program, const char *what, const char *text);

/* Installs handler for sig (SA_RESTART), unless sig was ignored when the
 * program started: a program run under nohup, or as a background job of a
 * script, keeps ignoring what its starter told it to ignore, as Unix
 * programs do. -1 on a failed sigaction. */
int cli_catch_signal(int sig, void (*handler)(int));

/* On SIGINT, SIGTERM or SIGHUP (those not ignored at the start, see
 * cli_catch_signal): removes the partial outputs this process is writing
 * and lets its uploads remove what they sent to an object store
 * (store_discard_all_staged), then dies of the signal, so that the exit
 * status says which; cli_error says nothing meanwhile. Fails only when no
 * thread can be started. */
int cli_clean_up_on_signals(void);

/* The share of its run directory's claim (ckpt_run_claim_share) that an
 * output named RUN/step_N is written under, *out NULL for any other: never
 * into a run a live trainer holds (its lock, or in an object store its
 * lease), whatever writes it (synth, import, copy, export, tp-reshard, in
 * any format), and no trainer starts there meanwhile. Taken before anything
 * is written; released with ckpt_run_claim_release. */
int cli_claim_run_output(const char *target, ckpt_run_claim **out);

/* Writes a checkpoint output at target, local or remote: write(ctx, path)
 * writes it at path, which is target itself when local, or a local copy
 * that is then uploaded (ckpt_output_begin/finish; `latest` of a remote
 * run directory follows with update_latest). With replace, may_replace
 * (given replace_ctx) is the writer's own check of what a local target
 * holds, asked of a remote one before anything is written. TP_OK or the
 * first failure. */
int cli_write_output(const char *target, int replace, store_replace_check may_replace, void *replace_ctx, int threads,
                     int update_latest, int (*write)(void *ctx, const char *path), void *ctx);

/* Refuses an output that is its input, lies inside it (it would be written
 * into the source: a stray entry in a checkpoint, or with --force one of
 * its files replaced) or holds it (--force would replace the input with
 * the output): one line on stderr naming both, and 2, the exit status of
 * a usage error, before anything is read or written. 0 when they are apart
 * (tp_path_within); a path that cannot be resolved is left for the command
 * itself to report. */
int cli_output_apart(const char *program, const char *input, const char *output);

/* Whether path is a checkpoint or lies inside one (a directory step_N,
 * committed or being written, or any committed checkpoint), looking at
 * path itself when it exists, else from its parent up: 1, with the
 * checkpoint's resolved path in ckpt; 0 when apart, or when neither path
 * nor its parent resolves (the command's own open reports that). One rule
 * for whatever a command would write among a checkpoint's files: tp-elastic
 * report's picture, tp-elastic run's state directory and events. */
int cli_checkpoint_around(const char *path, char *ckpt, size_t size);

/* The source's layout for a summary: the one it was saved at
 * (ckpt_reader_saved_layout: a torch_dist checkpoint, or a DCP one with
 * this toolkit's description, is read as whole tensors at tp 1 pp 1). */
void cli_source_layout_text(ckpt_reader *source, char out[RESHARD_LAYOUT_TEXT_MAX]);

/* Another tool's checkpoint (formats/registry.h), which the trainer reads
 * only once converted into this toolkit's format. */
typedef struct {
    char what[160];                        /* "a PyTorch distributed checkpoint (.metadata)"; empty: ours */
    char convert[2 * CKPT_PATH_MAX + 96]; /* the command that converts it into the target given */
    const char *step;                     /* what its N is called: "iteration" (Megatron's) or "step" */
    const char *doc;                      /* " (docs/DCP.md)", or "" */
} cli_foreign;

/* Whether path is another tool's checkpoint: then out says what it is and
 * how to convert it into target, else out->what is empty. Fails when the
 * path cannot be looked at. */
int cli_foreign_checkpoint(const char *path, const char *target, cli_foreign *out);

/* Whether a trainer refuses --ckpt-dir (resume: with --resume): then *why
 * says why and what to do instead, else it is left empty. Refused: another
 * tool's checkpoint (formats/registry.h; tp-train neither resumes from one
 * nor writes its run beside one: --resume found no step_* there, started
 * afresh and wrote step_* beside the tracker); a committed checkpoint of
 * this toolkit (a source: new checkpoints inside it made a run directory of
 * it, which a later --resume passed over); without resume, a run directory
 * holding committed checkpoints (a new run replaced their step_N and left
 * `latest` naming the old run's: ckpt_run_dir_kind). tp-elastic run, which
 * always resumes, refuses the same before launching (it relaunched the
 * trainer's refusal). Fails when the directory cannot be looked at. */
int cli_ckpt_dir_refusal(const char *dir, int resume, char *why, size_t size);

/* This process's peak resident memory so far, in bytes (getrusage). */
int64_t cli_peak_rss_bytes(void);

/* Prints the stores' notices (store_set_notice: an object store asking to
 * slow down, being waited out) as "PROGRAM: warning: TEXT" lines on stderr. */
void cli_print_store_notices(const char *program);

/* At an exit of status 0, standard output is flushed; when a write to it
 * failed (a full disk: `> /dev/full`; a reader gone with SIGPIPE ignored),
 * "PROGRAM: error: cannot write standard output: REASON" and exit 1, as
 * coreutils do. Returns on_exit's result. */
int cli_check_stdout_at_exit(const char *program);

/* "PROGRAM: error: message" on stderr; returns 1, the failure exit status.
 * Once the signal clean-up began (cli_clean_up_on_signals), nothing: the
 * caller waits there for the signal to end the process. */
int cli_error(const char *program, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The failure of a library call that returned `status`: "PROGRAM: error:
 * tp_errmsg()" as cli_error says it, and the exit status it calls for: 2
 * for a limit the user gave too small for the work (TP_ERR_LIMIT: a usage
 * error, as docs/TOOLS.md's conventions have it, not damage or a failed
 * operation), else 1. */
int cli_status_error(const char *program, int status);

#endif
