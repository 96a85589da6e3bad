/* tp-train: trains a GPT with tensor, pipeline and data parallelism, one
 * process per rank (mpirun -np N build/bin/tp-train ...). A thin layer over
 * train.h; see `tp-train --help`. Exit status: 0 success (also after a
 * checkpoint on SIGTERM, SIGUSR1, SIGHUP or a first SIGINT), 1 failure, 2 usage. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

#include "../common/clock.h"
#include "../common/fault.h"
#include "../common/json.h"
#include "../kernels/kernels.h"
#include "../trainer/comm_mpi.h"
#include "../trainer/data.h"
#include "../trainer/evaluate.h"
#include "../trainer/model.h"
#include "../trainer/schedule.h"
#include "../trainer/train.h"
#include "cli.h"

#define die_usage(...) cli_usage_error("tp-train", __VA_ARGS__)
#define fail(...) cli_error("tp-train", __VA_ARGS__)

static const char *usage_text =
    "usage: mpirun -np N tp-train [options]      train (N = tp x pp x dp)\n"
    "       tp-train prepare TEXT -o FILE [--force]   turn text into a token file (byte vocabulary, 256)\n"
    "       [mpirun -np N] tp-train eval --ckpt CKPT --data FILE [options]   loss on token windows\n"
    "       tp-train generate --ckpt CKPT --prompt TEXT [options]            sample text\n"
    "\n"
    CLI_MODEL_USAGE("fp32|bf16")
    "           (trains GPT-2: pre-LayerNorm, GELU, tied output; or Llama: RMSNorm, rotary positions, SwiGLU,\n"
    "           grouped-query attention, tied or untied output; --dtype fp32, or bf16: mixed precision,\n"
    "           matrix products with bf16 operands and fp32 sums, fp32 weights, optimizer and checkpoints)\n"
    "layout:    --tp T --pp P --dp D          (dp defaults to ranks / (tp x pp))\n"
    "           --sequence-parallel            the norms and residuals split by rows over the tp ranks\n"
    "           (all-gather and reduce-scatter in place of all-reduces: their activations take 1/tp)\n"
    "           --virtual-stages V             the interleaved schedule: V chunks of layers per stage, chunk c\n"
    "           of stage s the model's (c x pp + s)-th; pp 2 or more, layers a multiple of pp x V, and\n"
    "           micro-batches a step (--grad-accum) a multiple of pp: a bubble of (pp-1)/(V x A)\n"
    "batch:     --micro-batch B (4) --grad-accum A (1)  global batch = B x A x D sequences;\n"
    "           or --global-batch G (sequences per step): A = G / (B x D)\n"
    "optimizer: --steps N (100) --lr X (3e-4) --min-lr X (lr/10) --warmup N (steps/10)\n"
    "           --weight-decay X (0.1) --clip X (1.0; 0: no clipping) --seed N (1337)\n"
    "           --zero 1: ZeRO-1, the Adam moments split over the data-parallel ranks (each keeps 1/D of\n"
    "           them; gradients reduce-scattered, parameters all-gathered); --zero 3: ZeRO-3 (FSDP), the\n"
    "           parameters and gradients split as well, each layer's gathered when used and let go after;\n"
    "           each rank writes its part of checkpoints, which resume at any layout, with or without it\n"
    "data:      --data FILE|GLOB              token files (docs/DATA.md); default: synthetic data\n"
    "           llm.c's shards: GPT-2's (magic 20240520 version 1, uint16 tokens) or Llama 3's (magic 20240801\n"
    "           version 7, uint32 tokens), both in one glob too; a sample is a window of --seq + 1 tokens inside\n"
    "           one file: files shorter than that are never sampled (a warning names them)\n"
    "checkpoints: --ckpt-dir DIR|URL --ckpt-every N --resume [--sync-save] [--stop-at N] [--ckpt-cache DIR]\n"
    "           written asynchronously; SIGTERM, SIGUSR1, SIGHUP or a first SIGINT (Ctrl-C), or --stop-at: finish\n"
    "           the step, checkpoint, exit 0 (a second SIGINT ends it at once; a run resumed at or past\n"
    "           --stop-at N stops before training). --resume continues from the newest intact checkpoint, at any layout\n"
    "           (without model options, with its model and its run's --dtype); model options other than its\n"
    "           model, or no --data for a run trained on token files, are refused (exit 2);\n"
    "           without it, a --ckpt-dir that holds committed checkpoints is refused (exit 2): a new run never\n"
    "           replaces another's history. A checkpoint itself as --ckpt-dir is refused (exit 2): new\n"
    "           checkpoints go into a run directory, never inside a checkpoint (mkdir RUN; cp -r CKPT RUN/step_N).\n"
    "           Another tool's checkpoint (Megatron-LM, Megatron-Core torch_dist, PyTorch DCP) as --ckpt-dir is\n"
    "           refused (exit 2), naming the command that converts it (tp-ckpt import for Megatron's,\n"
    "           tp-reshard --format tp for a DCP that this toolkit wrote; Megatron's written by tp-reshard\n"
    "           --format tp keep Megatron's names and name no model: refused with that reason)\n"
    "           A URL (http(s)://, s3://bucket/prefix; docs/STORES.md): each rank writes its shard to\n"
    "           --ckpt-cache (default $TMPDIR/tp-train-cache-HASH, local to its node: no shared file\n"
    "           system) and uploads it in the background; rank 0 uploads the index last\n"
    "output:    --log FILE (rank 0; JSON lines: a start line per launch, steps, committed saves, a stop line;\n"
    "           appended to with --resume, so that one log holds a run across restarts) --quiet\n"
    "device:    --device cpu|cuda|auto (auto: GPUs when this build has CUDA and every rank has its own\n"
    "           GPU, else the CPU for all ranks; one process per GPU, local rank i on GPU i)\n"
    "           --share-gpus (with --device cuda): more ranks than GPUs, local rank i on GPU i mod G, their\n"
    "           messages through host copies instead of NCCL: every layout on one GPU, for tests\n"
    "other:     --threads N (compute threads per rank, 1)\n"
    "           --dump DIR: a test hook (tests/trainer/check_torch.py): the initial weights, every step's batches,\n"
    "           step 1's gradients and logits written into DIR for an independent model to check\n"
    "           --kernel-times: where the steps' time goes, operation by operation (rank 0, the steps after the\n"
    "           first): each kernel call timed on the host, then a wait for the device's share of it; the step\n"
    "           is slower so (no overlap of host and device): a table at the end, and a kernel_times line in --log\n"
    "testing aid (recovery tests): --fault die|hang|fail|slow --fault-step S [--fault-rank R (0)] [--fault-once FILE]:\n"
    "           after step S, rank R kills itself (SIGKILL), stops progressing (SIGTERM or SIGKILL ends it),\n"
    "           exits 1, or pauses 3 s and goes on (a straggler); with --fault-once only while FILE does not\n"
    "           exist (created as the fault fires).\n"
    "           --fault slow-steps --fault-step S [--fault-rank R]: from step S on, every step of rank R takes 2 s\n"
    "           longer (before its line; a model whose steps outlast a short heartbeat)\n"
    "           --fault fail-at-start: exit 1 at once, before training\n"
    "Run `tp-train eval --help` or `tp-train generate --help` for theirs.\n";

/* A failure only this rank may know of, while others wait on it in a
 * collective: it says why, then ends every rank. */
static void end_job(comm *c, const char *why)
{
    fprintf(stderr, "tp-train: error (rank %d): %s\n", c->rank, why);
    fflush(stderr);
    if (c->world > 1) comm_abort(c, 1);
}

static void warn_always(void *ctx, const char *text)
{
    (void)ctx;
    fprintf(stderr, "tp-train: warning: %s\n", text);
}

/* Every rank hears a warning; the first says it. */
static void warn_on_rank0(void *ctx, const char *text)
{
    const comm *c = ctx;
    if (c->rank == 0) warn_always(NULL, text);
}

static const char *prepare_usage =
    "usage: tp-train prepare TEXT -o FILE [--force]\n"
    "Writes TEXT's bytes as tokens (vocabulary 256) in the llm.c token-file format (docs/DATA.md).\n"
    "\n"
    "  -o, --output FILE    the token file; it appears whole or not at all (written under a\n"
    "                       staging name of its own beside it, synced, renamed into place; removed\n"
    "                       on failure and on SIGINT, SIGTERM or SIGHUP)\n"
    "  --force              replace an existing FILE; only a token file (an earlier output)\n"
    "\n"
    "An existing FILE is refused (exit 1) without --force, and anything but a token file even with\n"
    "it; TEXT itself, by any path, is never replaced.\n";

static int prepare(int argc, char **argv)
{
    const char *out = NULL;
    int force = 0;
    enum { O_FORCE = 256 };
    static const struct option options[] = {{"output", required_argument, 0, 'o'}, {"force", no_argument, 0, O_FORCE},
                                            {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "o:h", options, NULL)) != -1) {
        if (c == 'o') out = cli_path("tp-train prepare", "-o", optarg);
        else if (c == O_FORCE) force = 1;
        else if (c == 'h') {
            fputs(prepare_usage, stdout);
            return 0;
        } else cli_usage_error("tp-train prepare", "unknown option or missing value: '%s'", cli_rejected_option(argv));
    }
    if (optind != argc - 1 || !out) cli_usage_error("tp-train prepare", "takes TEXT and -o FILE");
    if (cli_clean_up_on_signals() != 0) return fail("cannot set up signal handling: %s", strerror(errno));
    int status = dataset_prepare(argv[optind], out, force);
    if (status) return fail("%s", tp_errmsg()); /* exit 1, a refused output too, as tp-ckpt's and tp-reshard's */
    return 0;
}

/* The launch's communicator at tp x pp x dp, or the exit status of its
 * failure, said once by rank 0. Every rank reaches the same verdict on the
 * layout: one the model does not divide into (layout_error, when not
 * TP_OK) or one the ranks launched do not make is the command line's, a
 * usage error (2, pointing to `command`'s --help); a failure of MPI itself
 * is not (1). */
static int launch_comm(comm **cm, int *argc, char ***argv, int tp, int pp, int dp, int layout_error, const char *command)
{
    int created = layout_error ? layout_error : comm_mpi_create(cm, argc, argv, tp, pp, dp);
    if (!created) return 0;
    int usage = layout_error || created == TP_ERR_ARG;
    if (comm_mpi_rank() == 0) {
        if (usage) fprintf(stderr, "tp-train: %s (see %s --help)\n", tp_errmsg(), command);
        else fail("%s", tp_errmsg());
    }
    comm_mpi_finalize();
    return usage ? 2 : 1;
}

/* Another tool's checkpoint as --ckpt (eval and generate read this
 * toolkit's, at any layout): named with the command that converts it, exit
 * 2 as --ckpt-dir's refusal; 1 when it cannot be looked at. Rank 0 looks
 * and every rank of cm (NULL: this process alone) hears its verdict, as the
 * trainer's --ckpt-dir refusal: ranks that looked each for themselves
 * parted ways when only some could see CKPT (a node without the store),
 * those refused waiting in MPI_Finalize for the others, which waited in
 * the communicator's set-up, without a word. */
static int refuse_foreign_ckpt(comm *cm, const char *command, const char *ckpt)
{
    cli_foreign foreign = {0};
    int verdict = 0, rank = cm ? cm->rank : 0;
    if (rank == 0 && cli_foreign_checkpoint(ckpt, "CKPT", &foreign)) verdict = 1;
    else if (foreign.what[0]) verdict = 2;
    if (cm && comm_broadcast(cm, &verdict, sizeof verdict, 0, COMM_HOST)) verdict = 1;
    if (rank != 0 || !verdict) return verdict;
    if (verdict == 1) return fail("--ckpt %s: %s", ckpt, tp_errmsg());
    fprintf(stderr, "tp-train: --ckpt %s is %s, which tp-train %s reads once converted into this toolkit's format: %s, "
            "then give --ckpt CKPT%s\n", ckpt, foreign.what, command, foreign.convert, foreign.doc);
    return 2;
}

static const char *eval_usage =
    "usage: [mpirun -np N] tp-train eval --ckpt CKPT --data FILE [options]\n"
    "Mean cross-entropy of a checkpoint over the first N non-overlapping windows of the\n"
    "token files (read as one stream): window i has inputs tokens[i*T, i*T+T) and\n"
    "targets tokens[i*T+1, i*T+T+1). Any layout: N ranks = tp x pp x dp.\n"
    "\n"
    "  --ckpt CKPT          checkpoint, or run directory (its newest intact checkpoint), of this toolkit's\n"
    "                       format (another tool's is refused, naming the command that converts it)\n"
    "  --data FILE|GLOB     token files (docs/DATA.md): llm.c's GPT-2 (uint16 tokens) or Llama 3\n"
    "                       (uint32 tokens) shards, read as one stream\n"
    "  --windows N          windows to evaluate (default: every whole window)\n"
    "  --seq T              window length (default: the model's context length)\n"
    "  --tp T --pp P --dp D layout (default tp 1, pp 1, dp = ranks / (tp x pp))\n"
    "  --micro-batch B      windows per forward pass (4)\n"
    "  --threads N          compute threads per rank: products, attention, element-wise work (1)\n"
    "  --json               print {\"loss\", \"windows\", \"tokens\", \"seq\", \"step\"}\n";

static int eval_command(int argc, char **argv)
{
    eval_options o;
    eval_options_init(&o);
    int64_t tp = 1, pp = 1, dp = 0;
    int json = 0;
    enum { O_CKPT = 256, O_DATA, O_WINDOWS, O_SEQ, O_TP, O_PP, O_DP, O_MB, O_THREADS, O_JSON };
    static const struct option options[] = {
        {"ckpt", required_argument, 0, O_CKPT}, {"data", required_argument, 0, O_DATA},
        {"windows", required_argument, 0, O_WINDOWS}, {"seq", required_argument, 0, O_SEQ},
        {"tp", required_argument, 0, O_TP}, {"pp", required_argument, 0, O_PP}, {"dp", required_argument, 0, O_DP},
        {"micro-batch", required_argument, 0, O_MB}, {"threads", required_argument, 0, O_THREADS},
        {"json", no_argument, 0, O_JSON}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case O_CKPT: o.ckpt = cli_path("tp-train eval", "--ckpt", optarg); break;
        case O_DATA: o.data = cli_path("tp-train eval", "--data", optarg); break;
        case O_WINDOWS: o.windows = cli_int("tp-train eval", "--windows", optarg, 1, (int64_t)1 << 40); break;
        case O_SEQ: o.seq = cli_int("tp-train eval", "--seq", optarg, 1, (int64_t)1 << 31); break;
        case O_TP: tp = cli_int("tp-train eval", "--tp", optarg, 1, 4096); break;
        case O_PP: pp = cli_int("tp-train eval", "--pp", optarg, 1, 4096); break;
        case O_DP: dp = cli_int("tp-train eval", "--dp", optarg, 1, 1 << 20); break;
        case O_MB: o.micro_batch = cli_int("tp-train eval", "--micro-batch", optarg, 1, 1 << 20); break;
        case O_THREADS: o.threads = (int)cli_int("tp-train eval", "--threads", optarg, 1, 1024); break;
        case O_JSON: json = 1; break;
        case 'h': fputs(eval_usage, stdout); return 0;
        default: cli_usage_error("tp-train eval", "unknown option or missing value: '%s'", cli_rejected_option(argv));
        }
    }
    if (optind != argc) cli_usage_error("tp-train eval", "unexpected argument '%s'", argv[optind]);
    if (!o.ckpt || !o.data) cli_usage_error("tp-train eval", "needs --ckpt CKPT and --data FILE");
    int world = comm_mpi_world_size(&argc, &argv);
    if (!dp) dp = world / (tp * pp) > 0 ? world / (tp * pp) : 1;
    comm *cm = NULL;
    int created = launch_comm(&cm, &argc, &argv, (int)tp, (int)pp, (int)dp, TP_OK, "tp-train eval");
    if (created) return created;
    int refused = refuse_foreign_ckpt(cm, "eval", o.ckpt);
    if (refused) {
        comm_free(cm);
        return refused;
    }
    o.warn = warn_on_rank0;
    o.warn_ctx = cm;
    eval_result result;
    int status = eval_run(&o, cm, &result);
    /* A layout the checkpoint's model does not divide into (heads over
     * --tp, layers over --pp) is the command line's, as training's: a usage
     * error (2), known only once the checkpoint's model was read. */
    if (status && result.layout_refused && result.all_ranks_know) {
        if (cm->rank == 0) fprintf(stderr, "tp-train: %s (see tp-train eval --help)\n", tp_errmsg());
        comm_free(cm);
        return 2;
    }
    if (status && !result.all_ranks_know) end_job(cm, tp_errmsg());
    else if (status && cm->rank == 0) fail("%s", tp_errmsg());
    else if (cm->rank == 0) {
        char loss[TP_JSON_NUMBER_MAX];
        if (json)
            printf("{\"loss\": %s, \"windows\": %lld, \"tokens\": %lld, \"seq\": %lld, \"step\": %lld}\n",
                   tp_json_number(loss, "%.9g", result.loss), (long long)result.windows, (long long)result.tokens, (long long)result.seq,
                   (long long)result.step);
        else
            printf("loss %.6f (%.4f bits per token) over %lld window%s of %lld tokens: %s, step %lld, tp=%d pp=%d dp=%d\n",
                   result.loss, result.loss / 0.6931471805599453, (long long)result.windows,
                   result.windows == 1 ? "" : "s", (long long)result.seq, result.path, (long long)result.step, cm->tp,
                   cm->pp, cm->dp);
        /* Said (null in JSON) and a failure: a script that checks the exit
         * status recorded a NaN loss as an evaluation done. */
        if (!isfinite(result.loss))
            status = fail("the loss of %s is not finite: its weights (or the windows' sums) hold NaN or infinity",
                          result.path);
    }
    comm_free(cm);
    return status ? 1 : 0;
}

static const char *generate_usage =
    "usage: tp-train generate --ckpt CKPT --prompt TEXT [options]\n"
    "Continues TEXT with the model of a checkpoint (any layout; one process), using the\n"
    "byte-level vocabulary: each byte is a token. Tokens beyond the 256 bytes print as <|id|>.\n"
    "CKPT: a checkpoint or run directory of this toolkit's format (another tool's is refused,\n"
    "naming the command that converts it); TEXT: at least one byte.\n"
    "\n"
    "  --tokens N           tokens to generate (200)\n"
    "  --temperature X      sampling temperature; 0 picks the most likely token (0.8)\n"
    "  --top-k K            draw from the K most likely tokens alone (0: every token)\n"
    "  --top-p P            then from the fewest most likely whose probabilities add up to P\n"
    "                       at least, 0 < P <= 1 (1: every token); both after the temperature,\n"
    "                       as Hugging Face transformers applies them\n"
    "  --seed N             random seed of the sampling (1337)\n"
    "  --threads N          compute threads (1)\n";

static int generate_command(int argc, char **argv)
{
    generate_options o;
    generate_options_init(&o);
    enum { O_CKPT = 256, O_PROMPT, O_TOKENS, O_TEMPERATURE, O_TOP_K, O_TOP_P, O_SEED, O_THREADS };
    static const struct option options[] = {
        {"ckpt", required_argument, 0, O_CKPT}, {"prompt", required_argument, 0, O_PROMPT},
        {"tokens", required_argument, 0, O_TOKENS}, {"temperature", required_argument, 0, O_TEMPERATURE},
        {"top-k", required_argument, 0, O_TOP_K}, {"top-p", required_argument, 0, O_TOP_P},
        {"seed", required_argument, 0, O_SEED}, {"threads", required_argument, 0, O_THREADS},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case O_CKPT: o.ckpt = cli_path("tp-train generate", "--ckpt", optarg); break;
        case O_PROMPT: o.prompt = optarg; break;
        case O_TOKENS: o.tokens = cli_int("tp-train generate", "--tokens", optarg, 0, (int64_t)1 << 30); break;
        case O_TEMPERATURE: o.sampling.temperature = cli_number("tp-train generate", "--temperature", optarg); break;
        case O_TOP_K: o.sampling.top_k = cli_int("tp-train generate", "--top-k", optarg, 0, INT32_MAX); break;
        case O_TOP_P:
            o.sampling.top_p = cli_number("tp-train generate", "--top-p", optarg);
            if (!(o.sampling.top_p > 0 && o.sampling.top_p <= 1))
                cli_usage_error("tp-train generate", "--top-p expects a number above 0 and at most 1, got '%s'", optarg);
            break;
        case O_SEED: o.seed = (uint64_t)cli_int("tp-train generate", "--seed", optarg, 0, INT64_MAX); break;
        case O_THREADS: o.threads = (int)cli_int("tp-train generate", "--threads", optarg, 1, 1024); break;
        case 'h': fputs(generate_usage, stdout); return 0;
        default: cli_usage_error("tp-train generate", "unknown option or missing value: '%s'", cli_rejected_option(argv));
        }
    }
    if (optind != argc) cli_usage_error("tp-train generate", "unexpected argument '%s'", argv[optind]);
    if (!o.ckpt || !o.prompt) cli_usage_error("tp-train generate", "needs --ckpt CKPT and --prompt TEXT");
    if (!o.prompt[0]) cli_usage_error("tp-train generate", "--prompt is empty: give at least one byte to continue");
    /* One process writes the text: under mpirun every rank wrote its own
     * into one stream, interleaved. */
    int world = comm_mpi_world_size(&argc, &argv);
    if (world > 1) {
        if (comm_mpi_rank() == 0)
            fprintf(stderr, "tp-train: generate runs as one process (it was started as %d ranks): start it without "
                    "mpirun (see tp-train generate --help)\n", world);
        comm_mpi_finalize();
        return 2;
    }
    int refused = refuse_foreign_ckpt(NULL, "generate", o.ckpt);
    if (refused) {
        comm_mpi_finalize();
        return refused;
    }
    o.warn = warn_always;
    int code = generate_run(&o, stdout) ? fail("%s", tp_errmsg()) : 0;
    comm_mpi_finalize();
    return code;
}

/* --------------------------------------------------------------- training */

static train_control control;

/* SIGTERM and SIGUSR1 (a scheduler's preemption), SIGHUP (the terminal
 * gone) and a first SIGINT (Ctrl-C): finish the step, checkpoint, exit 0
 * (SIGHUP's default killed the run with no checkpoint of its last steps). A second SIGINT ends the
 * program at once: the first put back its default action (sigaction is
 * async-signal-safe). */
static void on_signal(int signal)
{
    if (signal == SIGINT) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(SIGINT, &dfl, NULL);
    }
    train_request_stop(&control);
}

typedef struct {
    const comm *c;
    const train_options *o;
    int quiet;
    const char *log_path;
    FILE *log;                /* rank 0, --log */
    int log_failed;           /* a write to it failed (said once) */
    int resumed;
    int64_t resumed_step;
    char resumed_from[4200];  /* the checkpoint's path */
    double load_seconds;      /* loading and resharding it */
    double started;           /* now_seconds() at the program's start */
    char device[160];         /* "cpu", or "cuda:I NAME" */
    double flops_per_token;   /* training FLOPs (gpt_training_flops_per_token) */
    double peak_flops;        /* of the whole job, dense bf16; 0 when unknown (the CPU) */
    int kernel_times;         /* --kernel-times: the backend is kernels_timed's */
    int64_t timed_steps;      /* steps since its times were reset (after the first step) */
    double timed_seconds;     /* their time */
} reporter;

/* Model FLOPs utilization of a rate of tokens per second, or -1 when the
 * peak is unknown. */
static double mfu(const reporter *p, double tokens_per_second)
{
    return p->peak_flops > 0 ? tokens_per_second * p->flops_per_token / p->peak_flops : -1;
}

/* The log's line written out; a failed write (a full disk) is said once:
 * tp-elastic, which reads the log for progress, would take the run for
 * hung, and a silent log would hide why. */
static void flush_log(reporter *p)
{
    if (fflush(p->log) == 0 && !ferror(p->log)) return;
    if (!p->log_failed) {
        char text[4400];
        snprintf(text, sizeof text, "cannot write the log %s: %s; its lines are lost from here on", p->log_path,
                 errno ? strerror(errno) : "a write failed");
        fprintf(stderr, "tp-train: warning: %s\n", text);
    }
    p->log_failed = 1;
    clearerr(p->log);
}

/* Fault injection for tests of recovery (tp-elastic): the program, which
 * owns the process, does it; the trainer library never exits or raises. */
typedef enum { FAULT_NONE, FAULT_DIE, FAULT_HANG, FAULT_FAIL, FAULT_SLOW, FAULT_SLOW_STEPS, FAULT_FAIL_AT_START } fault_kind;

/* How long --fault slow pauses: longer than tp-elastic's once-a-second look at
 * capacity, shorter than any heartbeat timeout a test sets. */
static const double fault_slow_seconds = 3.0;
/* How much longer each step of --fault slow-steps takes: a model whose steps
 * outlast a short heartbeat (tp-elastic's allowance grows with them). */
static const double fault_slow_steps_seconds = 2.0;

typedef struct {
    fault_kind kind;
    int64_t step;
    int rank;
    const char *once; /* fires only while this file does not exist; created as it fires */
} fault_plan;

static fault_plan fault;

static void log_stop(FILE *log, int64_t step, const char *reason, const char *error, const double *peak_rss,
                     int world);

/* Step `step` on rank `rank` is done, its line not yet written: with --fault
 * slow-steps, from step S on, it takes longer (every time: no --fault-once). */
static void maybe_slow_step(int rank, int64_t step)
{
    if (fault.kind == FAULT_SLOW_STEPS && step >= fault.step && rank == fault.rank)
        sleep_seconds(fault_slow_steps_seconds);
}

/* After step `step` on rank `rank`: the injected fault, when it is due (the
 * step's log line is written). */
static void maybe_fault(int rank, int64_t step, FILE *log)
{
    if (fault.kind == FAULT_NONE || fault.kind == FAULT_FAIL_AT_START || fault.kind == FAULT_SLOW_STEPS ||
        step != fault.step || rank != fault.rank)
        return;
    if (fault.once) {
        FILE *marker = fopen(fault.once, "wx"); /* exclusive: fails when it exists */
        if (!marker) return;                     /* fired before */
        fclose(marker);
    }
    fflush(NULL);
    char why[200];
    switch (fault.kind) {
    case FAULT_DIE: raise(SIGKILL); break;
    case FAULT_HANG:
        /* As a rank stuck in a collective: no more progress or log lines;
         * SIGUSR1 still asks for a stop that never comes, SIGTERM (its
         * default action) and SIGKILL end it. */
        signal(SIGTERM, SIG_DFL);
        for (;;) pause();
    case FAULT_FAIL:
        snprintf(why, sizeof why, "injected failure after step %lld (--fault fail)", (long long)step);
        if (log) log_stop(log, step, "failed", why, NULL, 0);
        fprintf(stderr, "tp-train: error (rank %d): %s\n", rank, why);
        _exit(1);
    case FAULT_SLOW: sleep_seconds(fault_slow_seconds); break;
    default: break;
    }
}

/* Whether rank 0 can write the log at path: opened to append (and removed
 * again when this made it), so that a run whose metrics a script reads is
 * refused at once rather than trained for hours without them. */
static int log_writable(const char *path)
{
    struct stat st;
    int existed = stat(path, &st) == 0;
    if (existed && S_ISDIR(st.st_mode)) {
        errno = EISDIR;
        return 0;
    }
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return 0;
    close(fd);
    if (!existed) unlink(path);
    return 1;
}

/* Opens the log: appended to when continuing a run, else emptied first;
 * written at its end always (O_APPEND): a launch refused beside a live run
 * appends its stop line whole, and the run's next lines go after it, not
 * over it from an older offset. */
static FILE *open_log(const char *path, int append)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (append ? 0 : O_TRUNC), 0666);
    FILE *f = fd >= 0 ? fdopen(fd, "a") : NULL;
    if (!f) {
        fprintf(stderr, "tp-train: warning: %s: %s; not logging\n", path, strerror(errno));
        if (fd >= 0) close(fd);
    }
    return f;
}

/* text as a JSON string, quotes included, into out; "null" for NULL. */
static void json_string(const char *text, char *out, size_t size)
{
    snprintf(out, size, "null");
    if (!text) return;
    cJSON *value = cJSON_CreateString(text);
    char *quoted = value ? cJSON_PrintUnformatted(value) : NULL;
    if (quoted) snprintf(out, size, "%s", quoted);
    free(quoted);
    cJSON_Delete(value);
}

/* The log's first line of a launch: the step it continues from (0 when
 * fresh), its layout and batch split, the checkpoint it resumed from (its
 * name, step_NNNNNNNN) and the seconds its load and resharding took, and the
 * seconds from the program's start to here (MPI, model, the load). */
static void log_start(reporter *p, const train_report *r)
{
    const train_options *o = p->o;
    char from[4300], device[400], cpu_kernels[400], attention[2200];
    json_string(p->device, device, sizeof device);
    json_string(kernels_cpu_paths(), cpu_kernels, sizeof cpu_kernels);
    json_string(r->text, attention, sizeof attention); /* which code computes the attention */
    const char *name = strrchr(p->resumed_from, '/');
    json_string(p->resumed ? (name ? name + 1 : p->resumed_from) : NULL, from, sizeof from);
    fprintf(p->log,
            "{\"event\":\"start\",\"step\":%lld,\"tp\":%d,\"pp\":%d,\"dp\":%d,\"micro_batch\":%lld,"
            "\"grad_accum\":%lld,\"global_batch\":%lld,\"world\":%d,\"device\":%s,\"cpu_kernels\":%s,\"attention\":%s,"
            "\"dtype\":\"%s\","
            "\"sequence_parallel\":%s,\"virtual_stages\":%d,\"zero\":%d,\"optimizer_bytes\":%lld,\"parameter_bytes\":%lld,\"activation_bytes\":%lld,\"resumed_from\":%s,"
            "\"load_seconds\":%.3f,\"startup_seconds\":%.3f,\"time\":%.6f}\n",
            (long long)r->step - 1, p->c->tp, p->c->pp, p->c->dp, (long long)o->micro_batch, (long long)o->grad_accum,
            (long long)r->global_batch, p->c->world, device, cpu_kernels, attention, o->bf16 ? "bf16" : "fp32",
            o->sequence_parallel ? "true" : "false", o->virtual_stages, o->zero, (long long)r->optimizer_bytes, (long long)r->parameter_bytes,
            (long long)r->bytes,
            from,
            p->resumed ? p->load_seconds : 0.0,
            now_seconds() - p->started, unix_seconds());
    flush_log(p);
}

/* Every rank's peak resident memory in bytes, in world order (malloc'ed),
 * or NULL when it cannot be gathered: the stop line then goes without. */
static double *gather_peak_rss(comm *cm)
{
    double mine = (double)cli_peak_rss_bytes();
    double *all = malloc((size_t)cm->world * sizeof *all);
    if (all && comm_all_gather(cm, GROUP_WORLD, &mine, all, 1, COMM_DOUBLE, COMM_HOST) == TP_OK) return all;
    free(all);
    return NULL;
}

/* The log's last line of a launch (none when it is killed), with every
 * rank's peak resident memory in world order when peak_rss is not NULL. */
static void log_stop(FILE *log, int64_t step, const char *reason, const char *error, const double *peak_rss,
                     int world)
{
    char quoted[2200];
    json_string(error, quoted, sizeof quoted);
    fprintf(log, "{\"event\":\"stop\",\"step\":%lld,\"reason\":\"%s\"", (long long)step, reason);
    if (error) fprintf(log, ",\"error\":%s", quoted);
    if (peak_rss) {
        fprintf(log, ",\"peak_rss_bytes\":[");
        for (int r = 0; r < world; r++) fprintf(log, "%s%.0f", r ? "," : "", peak_rss[r]);
        fprintf(log, "]");
    }
    fprintf(log, ",\"time\":%.6f}\n", unix_seconds());
    fflush(log);
}

static void on_report(void *ctx, const train_report *r)
{
    reporter *p = ctx;
    const train_options *o = p->o;
    if (r->kind == TRAIN_REPORT_STEP) maybe_slow_step(p->c->rank, r->step);
    if (p->c->rank != 0) {
        if (r->kind == TRAIN_REPORT_STEP) maybe_fault(p->c->rank, r->step, NULL);
        return;
    }
    const gpt_config *g = &o->config;
    switch (r->kind) {
    case TRAIN_REPORT_RESUMED:
        p->resumed = 1;
        p->resumed_step = r->step;
        p->load_seconds = r->seconds;
        snprintf(p->resumed_from, sizeof p->resumed_from, "%s", r->text);
        if (!p->quiet)
            printf("resumed from %s at step %lld (%lld samples consumed)%s\n", r->text, (long long)r->step,
                   (long long)r->consumed_samples, r->optimizer_loaded ? "" : "; no optimizer state, starting it afresh");
        break;
    case TRAIN_REPORT_START:
        /* With --resume the log continues the run's, whether or not there
         * was a checkpoint to resume from. */
        if (p->log_path) p->log = open_log(p->log_path, o->resume || p->resumed_step > 0);
        if (p->log) log_start(p, r);
        if (p->quiet) break;
        if (o->resume && !p->resumed) printf("no checkpoint in %s yet: starting from scratch\n", o->ckpt_dir);
        printf("training %lld-layer %s (dim %lld, %lld heads, vocab %lld, seq %lld) at tp=%d pp=%d dp=%d on %s: global "
               "batch %lld x %lld tokens\n",
               (long long)g->layers, g->arch == GPT_ARCH_LLAMA ? "Llama" : "GPT", (long long)g->dim, (long long)g->heads, (long long)g->vocab, (long long)o->seq,
               p->c->tp, p->c->pp, p->c->dp, p->device, (long long)r->global_batch, (long long)o->seq);
        if (r->text) printf("attention: %s\n", r->text);
        if (r->loss_floor > 0) printf("synthetic data: the loss can fall to %.4f\n", r->loss_floor);
        break;
    case TRAIN_REPORT_STEP:
        if (!p->quiet) {
            printf("step %5lld/%lld | loss %.6f | lr %.3e | norm %.4f | %.0f tok/s | %.1f ms", (long long)r->step,
                   (long long)r->steps, r->loss, r->lr, r->grad_norm, r->tokens_per_second, r->seconds * 1e3);
            if (mfu(p, r->tokens_per_second) >= 0) printf(" | MFU %.1f%%", 100 * mfu(p, r->tokens_per_second));
            if (r->checkpoint_stall > 0) printf(" | checkpoint stall %.1f ms", r->checkpoint_stall * 1e3);
            printf("\n");
        }
        if (p->log) {
            /* A diverged step's loss and norm are NaN: null, so that the line stays JSON (tp_json_number). */
            char n[9][TP_JSON_NUMBER_MAX];
            fprintf(p->log,
                    "{\"step\":%lld,\"loss\":%s,\"lr\":%s,\"grad_norm\":%s,\"tokens_per_s\":%s,\"ms\":%s,"
                    "\"ckpt_stall_ms\":%s,\"pipeline_ms\":%s,\"pipeline_wait_ms\":%s,",
                    (long long)r->step, tp_json_number(n[0], "%.9g", r->loss), tp_json_number(n[1], "%.9g", r->lr),
                    tp_json_number(n[2], "%.9g", r->grad_norm), tp_json_number(n[3], "%.1f", r->tokens_per_second),
                    tp_json_number(n[4], "%.3f", r->seconds * 1e3), tp_json_number(n[5], "%.3f", r->checkpoint_stall * 1e3),
                    tp_json_number(n[6], "%.3f", r->pipeline_seconds * 1e3),
                    tp_json_number(n[7], "%.3f", r->pipeline_wait * 1e3));
            if (mfu(p, r->tokens_per_second) >= 0)
                fprintf(p->log, "\"mfu\":%s,", tp_json_number(n[8], "%.4f", mfu(p, r->tokens_per_second)));
            fprintf(p->log, "\"time\":%.6f}\n", unix_seconds());
            flush_log(p);
        }
        fflush(stdout);
        /* The first step's warm-up (allocations, cuBLAS's first choices) is left out of the kernel times. */
        if (p->kernel_times && p->timed_steps++ == 0) {
            kernels_timed_reset();
            p->timed_seconds = 0;
        } else if (p->kernel_times) {
            p->timed_seconds += r->seconds;
        }
        maybe_fault(0, r->step, p->log);
        break;
    case TRAIN_REPORT_SAVED:
        if (p->log) {
            fprintf(p->log, "{\"event\":\"save\",\"step\":%lld,\"seconds\":%.3f,\"time\":%.6f}\n",
                    (long long)r->step, r->seconds, unix_seconds());
            flush_log(p);
        }
        break;
    case TRAIN_REPORT_SAVE_WAIT:
        /* Before a wait with no step line: tp-elastic then allows a save's
         * time instead of taking the trainer for hung. */
        if (p->log) {
            fprintf(p->log, "{\"event\":\"save_wait\",\"step\":%lld,\"time\":%.6f}\n", (long long)r->step,
                    unix_seconds());
            flush_log(p);
        }
        break;
    case TRAIN_REPORT_UPLOADED:
        if (!p->quiet)
            printf("uploaded the checkpoint of step %lld to %s: %.1f MB in %.2f s\n", (long long)r->step, r->text,
                   (double)r->bytes / 1e6, r->seconds);
        if (p->log) {
            fprintf(p->log,
                    "{\"event\":\"upload\",\"step\":%lld,\"seconds\":%.3f,\"bytes\":%lld,\"write_seconds\":%.3f,"
                    "\"upload_seconds\":%.3f,\"index_seconds\":%.3f,\"time\":%.6f}\n",
                    (long long)r->step, r->seconds, (long long)r->bytes, r->phases.write, r->phases.upload,
                    r->phases.index, unix_seconds());
            flush_log(p);
        }
        break;
    case TRAIN_REPORT_WARNING: warn_always(NULL, r->text); break;
    }
    fflush(stdout);
}

/* --kernel-times: per step, each operation's calls, issue and wait, then
 * the trainer's own time around them; in the log as one kernel_times line. */
static void report_kernel_times(reporter *p, int64_t step)
{
    kernel_op_time times[64];
    int n = kernels_timed_read(times, 64);
    int64_t steps = p->timed_steps - 1;
    if (steps <= 0) {
        if (!p->quiet) printf("kernel times: one step only (the first is warm-up and left out): nothing to show\n");
        return;
    }
    double in_ops = 0;
    for (int i = 0; i < n; i++) in_ops += times[i].issue_seconds + times[i].wait_seconds;
    double outside = p->timed_seconds - in_ops;
    if (!p->quiet) {
        int width = 26; /* at least; wider for a longer operation's name */
        for (int i = 0; i < n; i++)
            if ((int)strlen(times[i].name) > width) width = (int)strlen(times[i].name);
        printf("kernel times on %s, per step (steps after the first: %lld; each call then a wait for the device):\n",
               p->device, (long long)steps);
        printf("  %-*s %8s %10s %10s %7s\n", width, "operation", "calls", "issue ms", "wait ms", "share");
        for (int i = 0; i < n; i++)
            printf("  %-*s %8.1f %10.3f %10.3f %6.1f%%\n", width, times[i].name,
                   (double)times[i].calls / (double)steps, times[i].issue_seconds * 1e3 / (double)steps,
                   times[i].wait_seconds * 1e3 / (double)steps,
                   100 * (times[i].issue_seconds + times[i].wait_seconds) / p->timed_seconds);
        printf("  %-*s %8s %10.3f %10s %6.1f%%\n", width, "(the trainer, outside)", "",
               outside * 1e3 / (double)steps, "", 100 * outside / p->timed_seconds);
        printf("  %-*s %8s %10.3f\n", width, "step", "", p->timed_seconds * 1e3 / (double)steps);
    }
    if (p->log) {
        /* step: the last step done, as every line of the log has one. */
        fprintf(p->log,
                "{\"event\":\"kernel_times\",\"step\":%lld,\"steps\":%lld,\"step_ms\":%.3f,\"outside_ms\":%.3f,\"ops\":[",
                (long long)step, (long long)steps, p->timed_seconds * 1e3 / (double)steps, outside * 1e3 / (double)steps);
        for (int i = 0; i < n; i++)
            fprintf(p->log, "%s{\"op\":\"%s\",\"calls\":%.3f,\"issue_ms\":%.4f,\"wait_ms\":%.4f}", i ? "," : "",
                    times[i].name, (double)times[i].calls / (double)steps, times[i].issue_seconds * 1e3 / (double)steps,
                    times[i].wait_seconds * 1e3 / (double)steps);
        fprintf(p->log, "],\"time\":%.6f}\n", unix_seconds());
        flush_log(p);
    }
}

static void print_summary(const train_outcome *out, const reporter *p, int64_t global_batch)
{
    const train_options *o = p->o;
    if (out->end == TRAIN_STOPPED && out->steps_run == 0)
        printf("stopped at step %lld, where the run resumed: --stop-at %lld was reached before; no step trained, "
               "no checkpoint written\n", (long long)out->step, (long long)o->stop_at);
    else if (out->end == TRAIN_STOPPED)
        printf("stopped after step %lld%s\n", (long long)out->step, o->ckpt_dir ? "; checkpoint committed" : "");
    if (out->steps_run == 0) {
        /* Resumed at --steps or past it: nothing to train, said rather than
         * an exit 0 without a word. */
        if (out->end != TRAIN_STOPPED)
            printf("done: nothing to train: the run resumed at step %lld, and --steps is %lld\n", (long long)out->step,
                   (long long)o->steps);
        return;
    }
    double tokens_per_second = (double)(out->steps_run * global_batch * o->seq) / out->seconds;
    printf("done: %lld steps in %.2f s (%.0f tokens/s", (long long)out->steps_run, out->seconds, tokens_per_second);
    if (mfu(p, tokens_per_second) >= 0) printf(", MFU %.1f%% of %s", 100 * mfu(p, tokens_per_second), p->device);
    printf("), loss %.4f -> %.4f", out->first_loss, out->last_loss);
    if (out->checkpoints)
        printf("; %lld checkpoint%s (training stalled %.1f ms for them), last %s", (long long)out->checkpoints,
               out->checkpoints == 1 ? "" : "s", out->stall_seconds * 1e3, out->last_checkpoint);
    printf("\n");
}

/* Every token file of --data stays open for the run (read by offset as
 * samples are drawn): the soft limit on descriptors, often 1024, ended a
 * run of 1,100 shards at start ("Too many open files"). Raised to the hard
 * limit, which needs no privilege; what it cannot raise, the open's error
 * still names. */
static void raise_open_files_limit(void)
{
    struct rlimit limit;
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
        limit.rlim_cur = limit.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &limit);
    }
}

int main(int argc, char **argv)
{
    opterr = 0; /* rejected options are reported in one line */
    raise_open_files_limit();
    /* Every rank parses the same command line: the first says its usage
     * errors, once (each said it, its pieces interleaved with the others'). */
    cli_say_usage_errors(comm_launcher_rank() == 0);
    cli_print_store_notices("tp-train");
    cli_check_stdout_at_exit("tp-train");
    if (argc > 1 && strcmp(argv[1], "prepare") == 0) return prepare(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "eval") == 0) return eval_command(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "generate") == 0) return generate_command(argc - 1, argv + 1);
    int first = argc > 1 && strcmp(argv[1], "train") == 0 ? 2 : 1;
    train_options o;
    train_options_init(&o);
    gpt_options model = {0};
    const char *log_path = NULL;
    int quiet = 0, kernel_times = 0, share_gpus = 0, ckpt_every_given = 0;
    int64_t tp = 1, pp = 1, dp = 0, global_batch = 0;
    int accum_given = 0;
    const char *fault_detail = NULL; /* the last of --fault-step, --fault-rank, --fault-once given */
    double started = now_seconds();
    static const struct option options[] = {
        CLI_MODEL_LONG_OPTIONS, CLI_TRAIN_LONG_OPTIONS, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *device = "auto";
    const int64_t big = (int64_t)1 << 31;
    int c, index = 0;
    optind = first;
    while ((c = getopt_long(argc, argv, "h", options, &index)) != -1) {
        switch (c) {
        case CLI_MODEL_OPTION:
            if (gpt_options_set(&model, options[index].name, optarg)) die_usage("%s", tp_errmsg());
            break;
        case CLI_TRAIN_TP: tp = cli_int("tp-train", "--tp", optarg, 1, 4096); break;
        case CLI_TRAIN_PP: pp = cli_int("tp-train", "--pp", optarg, 1, 4096); break;
        case CLI_TRAIN_DP: dp = cli_int("tp-train", "--dp", optarg, 1, 1 << 20); break;
        case CLI_TRAIN_MICRO_BATCH: o.micro_batch = cli_int("tp-train", "--micro-batch", optarg, 1, big); break;
        case CLI_TRAIN_GRAD_ACCUM:
            o.grad_accum = cli_int("tp-train", "--grad-accum", optarg, 1, big);
            accum_given = 1;
            break;
        case CLI_TRAIN_GLOBAL_BATCH: global_batch = cli_int("tp-train", "--global-batch", optarg, 1, big); break;
        case CLI_TRAIN_FAULT:
            if (strcmp(optarg, "die") == 0) fault.kind = FAULT_DIE;
            else if (strcmp(optarg, "hang") == 0) fault.kind = FAULT_HANG;
            else if (strcmp(optarg, "fail") == 0) fault.kind = FAULT_FAIL;
            else if (strcmp(optarg, "slow") == 0) fault.kind = FAULT_SLOW;
            else if (strcmp(optarg, "slow-steps") == 0) fault.kind = FAULT_SLOW_STEPS;
            else if (strcmp(optarg, "fail-at-start") == 0) fault.kind = FAULT_FAIL_AT_START;
            else die_usage("--fault takes die, hang, fail, slow, slow-steps or fail-at-start, not '%s'", optarg);
            break;
        case CLI_TRAIN_FAULT_STEP:
            fault.step = cli_int("tp-train", "--fault-step", optarg, 1, (int64_t)1 << 40);
            fault_detail = "--fault-step";
            break;
        case CLI_TRAIN_FAULT_RANK:
            fault.rank = (int)cli_int("tp-train", "--fault-rank", optarg, 0, 1 << 20);
            fault_detail = "--fault-rank";
            break;
        case CLI_TRAIN_FAULT_ONCE:
            fault.once = cli_path("tp-train", "--fault-once", optarg);
            fault_detail = "--fault-once";
            break;
        case CLI_TRAIN_STEPS: o.steps = cli_int("tp-train", "--steps", optarg, 1, (int64_t)1 << 40); break;
        case CLI_TRAIN_LR: o.lr = cli_number("tp-train", "--lr", optarg); break;
        case CLI_TRAIN_MIN_LR: o.min_lr = cli_number("tp-train", "--min-lr", optarg); break;
        case CLI_TRAIN_WARMUP: o.warmup = cli_int("tp-train", "--warmup", optarg, 0, (int64_t)1 << 40); break;
        case CLI_TRAIN_WEIGHT_DECAY: o.weight_decay = cli_number("tp-train", "--weight-decay", optarg); break;
        case CLI_TRAIN_CLIP: o.clip = cli_number("tp-train", "--clip", optarg); break;
        case CLI_TRAIN_SEED: o.seed = (uint64_t)cli_int("tp-train", "--seed", optarg, 0, INT64_MAX); break;
        case CLI_TRAIN_DATA: o.data = cli_path("tp-train", "--data", optarg); break;
        case CLI_TRAIN_CKPT_DIR: o.ckpt_dir = cli_path("tp-train", "--ckpt-dir", optarg); break;
        case CLI_TRAIN_CKPT_CACHE: o.ckpt_cache = cli_path("tp-train", "--ckpt-cache", optarg); break;
        case CLI_TRAIN_CKPT_EVERY:
            o.ckpt_every = cli_int("tp-train", "--ckpt-every", optarg, 0, (int64_t)1 << 40);
            ckpt_every_given = 1;
            break;
        case CLI_TRAIN_RESUME: o.resume = 1; break;
        case CLI_TRAIN_SYNC_SAVE: o.sync_save = 1; break;
        case CLI_TRAIN_LOG: log_path = cli_path("tp-train", "--log", optarg); break;
        case CLI_TRAIN_THREADS: o.threads = (int)cli_int("tp-train", "--threads", optarg, 1, 1024); break;
        case CLI_TRAIN_DUMP: o.dump_dir = cli_path("tp-train", "--dump", optarg); break;
        case CLI_TRAIN_QUIET: quiet = 1; break;
        case CLI_TRAIN_KERNEL_TIMES: kernel_times = 1; break;
        case CLI_TRAIN_SHARE_GPUS: share_gpus = 1; break;
        case CLI_TRAIN_STOP_AT: o.stop_at = cli_int("tp-train", "--stop-at", optarg, 1, (int64_t)1 << 40); break;
        case CLI_TRAIN_SEQUENCE_PARALLEL: o.sequence_parallel = 1; break;
        case CLI_TRAIN_ZERO:
            o.zero = (int)cli_int("tp-train", "--zero", optarg, 0, 3);
            if (o.zero == 2) die_usage("--zero 2 (gradients split, parameters whole) is not offered: --zero 1 or 3");
            break;
        case CLI_TRAIN_VIRTUAL_STAGES:
            o.virtual_stages = (int)cli_int("tp-train", "--virtual-stages", optarg, 1, 4096);
            break;
        case CLI_TRAIN_DEVICE:
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda") && strcmp(optarg, "auto"))
                die_usage("--device takes cpu, cuda or auto, not '%s'", optarg);
            device = optarg;
            break;
        case 'h': fputs(usage_text, stdout); return 0;
        default: die_usage("unknown option or missing value: '%s'", cli_rejected_option(argv));
        }
    }
    if (optind != argc) die_usage("unexpected argument '%s'", argv[optind]);
    if (share_gpus && strcmp(device, "cuda"))
        die_usage("--share-gpus applies to --device cuda (auto gives each rank a GPU of its own, or none)");
    if (o.resume && o.ckpt_dir && !gpt_options_shape_given(&model)) {
        /* The run's model, and its precision unless --dtype says: what a
         * resume would otherwise have to repeat (and a forgotten --dtype
         * bf16 went on in fp32). */
        char resolved[4096];
        if (checkpoint_run_model(o.ckpt_dir, &model, &o.config, resolved, sizeof resolved))
            die_usage("--resume without model options takes the model of the run's newest checkpoint, and %s has none "
                      "that opens (%s): give --model, or all of --layers --dim --heads --vocab --seq",
                      o.ckpt_dir, tp_errmsg());
    } else if (gpt_options_finish(&model, &o.config)) {
        die_usage("%s", tp_errmsg());
    }
    /* --dtype bf16: mixed precision; the weights (and checkpoints) stay fp32. */
    if (o.config.dtype == TP_BF16) {
        o.bf16 = 1;
        o.config.dtype = TP_FP32;
    }
    if (gpt_model_supported(&o.config)) die_usage("%s", tp_errmsg());
    o.seq = o.config.seq;
    if (o.resume && !o.ckpt_dir) die_usage("--resume needs --ckpt-dir");
    /* Checkpoints' options without a place for them do nothing: said (once,
     * by the first rank), not refused, since a reference run may share an
     * orchestrated run's options, tp-elastic adding --ckpt-dir to those. */
    const char *saves_without_dir = ckpt_every_given ? "--ckpt-every" : o.sync_save ? "--sync-save"
                                    : o.ckpt_cache   ? "--ckpt-cache" : NULL;
    if (saves_without_dir && !o.ckpt_dir && comm_launcher_rank() == 0)
        fprintf(stderr, "tp-train: warning: %s without --ckpt-dir: no checkpoint is written\n", saves_without_dir);
    /* The cosine decays from --lr to --min-lr: above it, the rate would grow all run long. */
    if (o.min_lr > o.lr)
        die_usage("--min-lr %g is above --lr %g: the schedule decays from --lr to --min-lr", o.min_lr, o.lr);
    if (o.sequence_parallel && tp < 2)
        die_usage("--sequence-parallel splits the rows of the norms and residuals over the tensor-parallel ranks: it "
                  "needs --tp 2 or more");
    if (o.sequence_parallel && (o.micro_batch * o.seq) % tp)
        die_usage("--sequence-parallel: micro-batch %lld x sequence %lld = %lld rows do not divide over tp %lld",
                  (long long)o.micro_batch, (long long)o.seq, (long long)(o.micro_batch * o.seq), (long long)tp);
    if (o.virtual_stages > 1 && pp < 2)
        die_usage("--virtual-stages interleaves chunks of layers over the pipeline stages: it needs --pp 2 or more");
    if (o.virtual_stages > 1 && o.config.layers % (pp * o.virtual_stages))
        die_usage("--virtual-stages %d: %lld layers do not split into pp %lld x %d = %lld chunks of equal size",
                  o.virtual_stages, (long long)o.config.layers, (long long)pp, o.virtual_stages,
                  (long long)(pp * o.virtual_stages));
    /* A detail of a fault without the fault would do nothing: said, not ignored. */
    if (fault_detail && fault.kind == FAULT_NONE)
        die_usage("%s details a fault injection: it needs --fault die|hang|fail|slow|slow-steps", fault_detail);
    if (fault_detail && fault.kind == FAULT_FAIL_AT_START)
        die_usage("--fault fail-at-start fails every rank before step 1: %s does not apply", fault_detail);
    if (fault.once && fault.kind == FAULT_SLOW_STEPS)
        die_usage("--fault-once does not apply to --fault slow-steps (every step from S on is slow, at every launch)");
    if (fault.kind != FAULT_NONE && fault.kind != FAULT_FAIL_AT_START && fault.step < 1)
        die_usage("--fault %s needs --fault-step S", fault.kind == FAULT_DIE    ? "die"
                                                      : fault.kind == FAULT_HANG ? "hang"
                                                      : fault.kind == FAULT_SLOW ? "slow"
                                                      : fault.kind == FAULT_SLOW_STEPS ? "slow-steps"
                                                                                 : "fail");

    int world = comm_mpi_world_size(&argc, &argv);
    if (!dp) dp = world / (tp * pp) > 0 ? world / (tp * pp) : 1;
    if (fault.kind != FAULT_NONE && fault.rank >= world) {
        if (comm_mpi_rank() == 0)
            fprintf(stderr, "tp-train: --fault-rank %d, but there are %d ranks (see tp-train --help)\n", fault.rank,
                    world);
        comm_mpi_finalize();
        return 2;
    }
    if (fault.kind == FAULT_FAIL_AT_START) {
        int code = comm_mpi_rank() == 0 ? fail("injected failure at start (--fault fail-at-start)") : 1;
        comm_mpi_finalize();
        return code;
    }
    /* --global-batch: the accumulation that keeps it at this dp; every rank
     * reaches the same verdict, rank 0 says it. */
    const char *batch_error = NULL;
    char batch_text[256];
    if (global_batch && global_batch % (o.micro_batch * dp) != 0) {
        snprintf(batch_text, sizeof batch_text,
                 "--global-batch %lld is not a multiple of micro-batch %lld x dp %lld", (long long)global_batch,
                 (long long)o.micro_batch, (long long)dp);
        batch_error = batch_text;
    } else if (global_batch && accum_given && o.grad_accum * o.micro_batch * dp != global_batch) {
        snprintf(batch_text, sizeof batch_text,
                 "--grad-accum %lld gives a global batch of %lld, not --global-batch %lld (give one of them)",
                 (long long)o.grad_accum, (long long)(o.grad_accum * o.micro_batch * dp), (long long)global_batch);
        batch_error = batch_text;
    } else if (global_batch) {
        o.grad_accum = global_batch / (o.micro_batch * dp);
    }
    if (!batch_error && pipeline_check((int)pp, o.virtual_stages, o.grad_accum)) {
        snprintf(batch_text, sizeof batch_text, "%s", tp_errmsg());
        batch_error = batch_text;
    }
    if (batch_error) {
        if (comm_mpi_rank() == 0) fprintf(stderr, "tp-train: %s (see tp-train --help)\n", batch_error);
        comm_mpi_finalize();
        return 2;
    }
    comm *cm = NULL;
    int created = launch_comm(&cm, &argc, &argv, (int)tp, (int)pp, (int)dp, gpt_config_check(&o.config, (int)tp, (int)pp),
                              "tp-train");
    if (created) return created;
    /* A --ckpt-dir refused (another tool's checkpoint, one of ours, or
     * without --resume a run directory with checkpoints: cli.h) is refused
     * before anything is written there (the run's claim, a save). Rank 0
     * looks (a few requests to an object store) and every rank hears its
     * verdict: 1 refused, 2 the look failed. */
    char refused[4 * CKPT_PATH_MAX + 512] = "";
    int verdict = 0;
    if (o.ckpt_dir && cm->rank == 0 && cli_ckpt_dir_refusal(o.ckpt_dir, o.resume, refused, sizeof refused)) verdict = 2;
    else if (refused[0]) verdict = 1;
    /* --log: rank 0 writes it, and looks too (verdict 3: it cannot). */
    int log_errno = 0;
    if (!verdict && log_path && cm->rank == 0 && !log_writable(log_path)) {
        log_errno = errno;
        verdict = 3;
    }
    if ((o.ckpt_dir || log_path) && comm_broadcast(cm, &verdict, sizeof verdict, 0, COMM_HOST)) verdict = 2;
    if (verdict == 3) {
        if (cm->rank == 0) fail("--log %s: cannot write it: %s", log_path, strerror(log_errno));
        comm_free(cm);
        return 1;
    }
    if (verdict) {
        if (cm->rank == 0 && verdict == 1) fprintf(stderr, "tp-train: %s\n", refused);
        else if (cm->rank == 0) fail("--ckpt-dir %s: %s", o.ckpt_dir, tp_errmsg());
        comm_free(cm);
        return verdict == 1 ? 2 : 1;
    }
    /* The device: each rank its own (local rank i on GPU i), every rank told
     * whether all have one. Rank 0 says why it has none; when it has one,
     * each rank without says why. */
    const kernel_backend *kernels = NULL;
    int local_rank = comm_mpi_local_rank();
    /* auto is one verdict for the whole job: GPUs only when every rank has
     * its own. Four ranks on a machine with one GPU all run on the CPU;
     * chosen rank by rank, rank 0 alone would take the GPU and wait for the
     * others in NCCL's setup while they waited for it elsewhere, forever. */
    if (strcmp(device, "auto") == 0) {
        int any_lacks = 1;
        if (comm_any(cm, !kernels_gpu_for(local_rank), &any_lacks)) {
            if (cm->rank == 0) fprintf(stderr, "tp-train: error: choosing the device: %s\n", tp_errmsg());
            comm_free(cm);
            return 1;
        }
        device = any_lacks ? "cpu" : "cuda";
    }
    int chosen = kernels_choose(device, local_rank, share_gpus, &kernels), rank0_failed = chosen != TP_OK;
    if (comm_broadcast(cm, &rank0_failed, sizeof rank0_failed, 0, COMM_HOST)) rank0_failed = 1;
    if (chosen && cm->rank == 0) fprintf(stderr, "tp-train: error: %s\n", tp_errmsg());
    else if (chosen && !rank0_failed) fprintf(stderr, "tp-train: error (rank %d): %s\n", cm->rank, tp_errmsg());
    if (comm_agree(cm, chosen, "choosing the device")) {
        comm_free(cm);
        return 1;
    }
    if (kernel_times && !(kernels = kernels_timed(kernels))) { /* one process, one backend: cannot fail but so said */
        fprintf(stderr, "tp-train: error: --kernel-times: %s\n", tp_errmsg());
        comm_free(cm);
        return 1;
    }
    o.kernels = kernels;
    reporter rep = {.c = cm, .o = &o, .quiet = quiet, .log_path = log_path, .started = started,
                    .kernel_times = kernel_times};
    if (kernels->on_device) {
        char name[128];
        int gpus = cuda_device_count(), gpu = local_rank;
        if (share_gpus) kernels_gpu_index(local_rank, gpus, 1, &gpu); /* chosen so above: cannot fail */
        cuda_device_name(gpu, name, sizeof name);
        /* Shared, the job's peak is that of the GPUs it has (one machine's), not of its ranks. */
        int used = share_gpus && cm->world > gpus ? gpus : cm->world;
        snprintf(rep.device, sizeof rep.device, "cuda:%d %s%s", gpu, name,
                 used < cm->world ? " (shared by the ranks)" : "");
        rep.peak_flops = gpu_peak_bf16_flops(name) * used;
    } else {
        snprintf(rep.device, sizeof rep.device, "cpu");
    }
    if (gpt_training_flops_per_token(&o.config, o.seq, &rep.flops_per_token)) rep.peak_flops = 0;
    train_control_init(&control);
    o.control = &control;
    int unhandled = TP_OK;
    if (cli_catch_signal(SIGTERM, on_signal) || cli_catch_signal(SIGUSR1, on_signal) ||
        cli_catch_signal(SIGHUP, on_signal) || cli_catch_signal(SIGINT, on_signal)) {
        unhandled = tp_fail(TP_ERR_IO, "cannot handle SIGTERM, SIGUSR1, SIGHUP and SIGINT: %s", strerror(errno));
        fprintf(stderr, "tp-train: error (rank %d): %s\n", cm->rank, tp_errmsg());
    }
    if (comm_agree(cm, unhandled, "handling SIGTERM, SIGUSR1, SIGHUP and SIGINT")) {
        comm_free(cm);
        return 1;
    }
    o.report = on_report;
    o.report_ctx = &rep;
    /* Ranks on GPUs sum device data with NCCL; one rank alone needs no communicator on the device. */
    comm *device_comm = NULL;
    if (kernels->on_device && cm->world > 1 && !share_gpus) { /* shared GPUs: through the host (train_run) */
        int made = comm_nccl_create(&device_comm, cm, kernels);
        if (made) {
            if (cm->rank == 0) fprintf(stderr, "tp-train: error: %s\n", tp_errmsg());
            comm_free(cm);
            return 1;
        }
    }
    train_outcome outcome;
    int status = train_run(&o, device_comm ? device_comm : cm, &outcome);
    /* Each rank's peak resident memory, for the stop line: what a layout, or
     * ZeRO, keeps on each rank. A collective, so only when this rank
     * succeeded (one that failed alone ends the job below). */
    double *peak_rss = NULL;
    if (!status && rep.log_path) peak_rss = gather_peak_rss(cm);
    if (!status && kernel_times && cm->rank == 0) report_kernel_times(&rep, outcome.step);
    /* The stop line first: a failure only this rank knows ends the job. A
     * failure before training began (no start line) is logged too, appended:
     * the log may be a live run's (a launch refused as in_use truncated it,
     * and the run wrote on past its old offset, NUL bytes before). */
    if (cm->rank == 0 && log_path && !rep.log && status) rep.log = open_log(log_path, 1);
    if (rep.log) {
        log_stop(rep.log, outcome.step,
                 outcome.end == TRAIN_FINISHED  ? "finished"
                 : outcome.end == TRAIN_STOPPED ? "stopped"
                 : outcome.end == TRAIN_DIVERGED ? "diverged"
                 : outcome.end == TRAIN_IN_USE   ? "in_use"
                                                 : "failed",
                 status ? outcome.reason : NULL, peak_rss, cm->world);
        if (fclose(rep.log) != 0 && !rep.log_failed)
            fprintf(stderr, "tp-train: warning: cannot write the log %s: %s; its stop line is lost\n", rep.log_path,
                    strerror(errno));
        rep.log = NULL;
    }
    if (status && !outcome.all_ranks_know) end_job(cm, outcome.reason);
    else if (status && cm->rank == 0) fail("%s", outcome.reason);
    else if (!status && cm->rank == 0 && !quiet) print_summary(&outcome, &rep, o.micro_batch * o.grad_accum * cm->dp);
    free(peak_rss);
    comm_free(device_comm);
    comm_free(cm);
    /* Options the resumed run contradicts (another model, no --data) are a
     * usage error, as launch_comm's and refuse_foreign_ckpt's: a retrying
     * job script or tp-elastic relaunches no such launch. */
    return !status ? 0 : outcome.options_refused ? 2 : 1;
}
