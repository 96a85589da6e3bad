/* tp-train: trains a GPT with tensor, pipeline and data parallelism, one
 * process per rank (mpirun -np N build/bin/tp-train ...). A thin layer over
 * train.h; see `tp-train --help`. Exit status: 0 success (also after a
 * checkpoint on SIGTERM/SIGUSR1), 1 failure, 2 usage. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../trainer/comm.h"
#include "../trainer/data.h"
#include "../trainer/evaluate.h"
#include "../trainer/train.h"

#define die_usage(...) cli_usage_error("tp-train", __VA_ARGS__)
#define fail(...) cli_error("tp-train", __VA_ARGS__)

static const char *usage_text =
    "usage: mpirun -np N tp-train [options]      train (N = tp x pp x dp)\n"
    "       tp-train prepare TEXT -o FILE        turn text into a token file (byte vocabulary, 256)\n"
    "       [mpirun -np N] tp-train eval --ckpt CKPT --data FILE [options]   loss on token windows\n"
    "       tp-train generate --ckpt CKPT --prompt TEXT [options]            sample text\n"
    "\n"
    "model:     --model tiny|small|gpt2-124m, or --layers L --dim D --heads H --vocab V --seq S [--ffn F]\n"
    "           [--vocab-pad-multiple N]  (GPT-2: pre-LayerNorm, GELU, tied output; fp32)\n"
    "layout:    --tp T --pp P --dp D          (dp defaults to ranks / (tp x pp))\n"
    "batch:     --micro-batch B (4) --grad-accum A (1)  global batch = B x A x D sequences\n"
    "optimizer: --steps N (100) --lr X (3e-4) --min-lr X (lr/10) --warmup N (steps/10)\n"
    "           --weight-decay X (0.1) --clip X (1.0) --seed N (1337)\n"
    "data:      --data FILE|GLOB              token files (docs/DATA.md); default: synthetic data\n"
    "checkpoints: --ckpt-dir DIR --ckpt-every N --resume [--sync-save] [--stop-at N]\n"
    "           written asynchronously; SIGTERM or SIGUSR1 (or --stop-at): finish the step,\n"
    "           checkpoint, exit 0. --resume continues from the newest intact checkpoint, at any layout\n"
    "output:    --log FILE (JSON lines: step, loss, lr, grad_norm, tokens_per_s) --quiet\n"
    "other:     --threads N (matrix-product threads per rank, 1)\n"
    "Run `tp-train eval --help` or `tp-train generate --help` for theirs.\n";

static int64_t int_option(const char *name, const char *text, int64_t min, int64_t max)
{
    int64_t v;
    if (parse_int(text, min, max, &v)) die_usage("%s expects an integer in %lld..%lld, got '%s'", name, (long long)min, (long long)max, text);
    return v;
}

static double double_option(const char *name, const char *text)
{
    double v;
    if (parse_double(text, &v) || v < 0) die_usage("%s expects a non-negative number, got '%s'", name, text);
    return v;
}

static int preset(const char *name, gpt_config *c)
{
    if (strcmp(name, "tiny") == 0) *c = (gpt_config){.layers = 2, .dim = 64, .heads = 4, .vocab = 256, .seq = 32};
    else if (strcmp(name, "small") == 0) *c = (gpt_config){.layers = 6, .dim = 384, .heads = 6, .vocab = 256, .seq = 256};
    else if (strcmp(name, "gpt2-124m") == 0)
        *c = (gpt_config){.layers = 12, .dim = 768, .heads = 12, .vocab = 50257, .seq = 1024, .vocab_pad_multiple = 128};
    else return -1;
    return 0;
}

static int prepare(int argc, char **argv)
{
    const char *out = NULL;
    static const struct option options[] = {{"output", required_argument, 0, 'o'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "o:h", options, NULL)) != -1) {
        if (c == 'o') out = optarg;
        else if (c == 'h') {
            printf("usage: tp-train prepare TEXT -o FILE\nWrites TEXT's bytes as tokens (vocabulary 256) in the "
                   "llm.c token-file format (docs/DATA.md).\n");
            return 0;
        } else die_usage("prepare: unknown option or missing value: '%s'", cli_rejected_option(argv));
    }
    if (optind != argc - 1 || !out) die_usage("prepare takes TEXT and -o FILE");
    char err[512];
    if (dataset_prepare(argv[optind], out, err, sizeof err)) return fail("%s", err);
    return 0;
}

static const char *eval_usage =
    "usage: [mpirun -np N] tp-train eval --ckpt CKPT --data FILE [options]\n"
    "Mean cross-entropy of a checkpoint over the first N non-overlapping windows of the\n"
    "token files (read as one stream): window i has inputs tokens[i*T, i*T+T) and\n"
    "targets tokens[i*T+1, i*T+T+1). Any layout: N ranks = tp x pp x dp.\n"
    "\n"
    "  --ckpt CKPT          checkpoint, or run directory (its newest intact checkpoint)\n"
    "  --data FILE|GLOB     token files (docs/DATA.md)\n"
    "  --windows N          windows to evaluate (default: every whole window)\n"
    "  --seq T              window length (default: the model's context length)\n"
    "  --tp T --pp P --dp D layout (default tp 1, pp 1, dp = ranks / (tp x pp))\n"
    "  --micro-batch B      windows per forward pass (4)\n"
    "  --threads N          matrix-product threads per rank (1)\n"
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
        case O_CKPT: o.ckpt = optarg; break;
        case O_DATA: o.data = optarg; break;
        case O_WINDOWS: o.windows = int_option("--windows", optarg, 1, (int64_t)1 << 40); break;
        case O_SEQ: o.seq = int_option("--seq", optarg, 1, (int64_t)1 << 31); break;
        case O_TP: tp = int_option("--tp", optarg, 1, 4096); break;
        case O_PP: pp = int_option("--pp", optarg, 1, 4096); break;
        case O_DP: dp = int_option("--dp", optarg, 1, 1 << 20); break;
        case O_MB: o.micro_batch = int_option("--micro-batch", optarg, 1, 1 << 20); break;
        case O_THREADS: o.threads = (int)int_option("--threads", optarg, 1, 1024); break;
        case O_JSON: json = 1; break;
        case 'h': fputs(eval_usage, stdout); return 0;
        default: die_usage("eval: unknown option or missing value: '%s'", cli_rejected_option(argv));
        }
    }
    if (optind != argc) die_usage("eval: unexpected argument '%s'", argv[optind]);
    if (!o.ckpt || !o.data) die_usage("eval needs --ckpt CKPT and --data FILE");
    int world = comm_mpi_world_size(&argc, &argv);
    if (!dp) dp = world / (tp * pp) > 0 ? world / (tp * pp) : 1;
    char err[8192];
    comm *cm = NULL;
    if (comm_mpi_create(&cm, &argc, &argv, (int)tp, (int)pp, (int)dp, err, sizeof err)) {
        int code = comm_mpi_rank() == 0 ? fail("%s", err) : 1;
        comm_mpi_finalize();
        return code;
    }
    eval_result result;
    int status = eval_run(&o, cm, &result, err, sizeof err);
    if (cm->rank == 0) {
        if (status) fail("%s", err);
        else if (json)
            printf("{\"loss\": %.9g, \"windows\": %lld, \"tokens\": %lld, \"seq\": %lld, \"step\": %lld}\n",
                   result.loss, (long long)result.windows, (long long)result.tokens, (long long)result.seq,
                   (long long)result.step);
        else
            printf("loss %.6f (%.4f bits per token) over %lld windows of %lld tokens: %s, step %lld, tp=%d pp=%d dp=%d\n",
                   result.loss, result.loss / 0.6931471805599453, (long long)result.windows, (long long)result.seq,
                   result.path, (long long)result.step, cm->tp, cm->pp, cm->dp);
    }
    cm->ops->free(cm);
    return status ? 1 : 0;
}

static const char *generate_usage =
    "usage: tp-train generate --ckpt CKPT --prompt TEXT [options]\n"
    "Continues TEXT with the model of a checkpoint (any layout; one process), using the\n"
    "byte-level vocabulary: each byte is a token. Tokens beyond the 256 bytes print as <|id|>.\n"
    "\n"
    "  --tokens N           tokens to generate (200)\n"
    "  --temperature X      sampling temperature; 0 picks the most likely token (0.8)\n"
    "  --seed N             random seed of the sampling (1337)\n"
    "  --threads N          matrix-product threads (1)\n";

static int generate_command(int argc, char **argv)
{
    generate_options o;
    generate_options_init(&o);
    enum { O_CKPT = 256, O_PROMPT, O_TOKENS, O_TEMPERATURE, O_SEED, O_THREADS };
    static const struct option options[] = {
        {"ckpt", required_argument, 0, O_CKPT}, {"prompt", required_argument, 0, O_PROMPT},
        {"tokens", required_argument, 0, O_TOKENS}, {"temperature", required_argument, 0, O_TEMPERATURE},
        {"seed", required_argument, 0, O_SEED}, {"threads", required_argument, 0, O_THREADS},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case O_CKPT: o.ckpt = optarg; break;
        case O_PROMPT: o.prompt = optarg; break;
        case O_TOKENS: o.tokens = int_option("--tokens", optarg, 0, (int64_t)1 << 30); break;
        case O_TEMPERATURE: o.temperature = double_option("--temperature", optarg); break;
        case O_SEED: o.seed = (uint64_t)int_option("--seed", optarg, 0, INT64_MAX); break;
        case O_THREADS: o.threads = (int)int_option("--threads", optarg, 1, 1024); break;
        case 'h': fputs(generate_usage, stdout); return 0;
        default: die_usage("generate: unknown option or missing value: '%s'", cli_rejected_option(argv));
        }
    }
    if (optind != argc) die_usage("generate: unexpected argument '%s'", argv[optind]);
    if (!o.ckpt || !o.prompt) die_usage("generate needs --ckpt CKPT and --prompt TEXT");
    char err[8192];
    if (generate_run(&o, stdout, err, sizeof err)) return fail("%s", err);
    return 0;
}

int main(int argc, char **argv)
{
    opterr = 0; /* rejected options are reported in one line */
    if (argc > 1 && strcmp(argv[1], "prepare") == 0) return prepare(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "eval") == 0) return eval_command(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "generate") == 0) return generate_command(argc - 1, argv + 1);
    int first = argc > 1 && strcmp(argv[1], "train") == 0 ? 2 : 1;
    train_options o;
    train_options_init(&o);
    gpt_config config = {0};
    const char *model = NULL;
    int64_t tp = 1, pp = 1, dp = 0;
    enum { O_MODEL = 256, O_LAYERS, O_DIM, O_HEADS, O_VOCAB, O_SEQ, O_FFN, O_PAD, O_TP, O_PP, O_DP, O_MB, O_ACCUM,
           O_STEPS, O_LR, O_MIN_LR, O_WARMUP, O_WD, O_CLIP, O_SEED, O_DATA, O_CKPT, O_EVERY, O_RESUME, O_SYNC, O_LOG,
           O_THREADS, O_DUMP, O_QUIET, O_STOP };
    static const struct option options[] = {
        {"model", required_argument, 0, O_MODEL}, {"layers", required_argument, 0, O_LAYERS},
        {"dim", required_argument, 0, O_DIM}, {"heads", required_argument, 0, O_HEADS},
        {"vocab", required_argument, 0, O_VOCAB}, {"seq", required_argument, 0, O_SEQ},
        {"ffn", required_argument, 0, O_FFN}, {"vocab-pad-multiple", required_argument, 0, O_PAD},
        {"tp", required_argument, 0, O_TP}, {"pp", required_argument, 0, O_PP}, {"dp", required_argument, 0, O_DP},
        {"micro-batch", required_argument, 0, O_MB}, {"grad-accum", required_argument, 0, O_ACCUM},
        {"steps", required_argument, 0, O_STEPS}, {"lr", required_argument, 0, O_LR},
        {"min-lr", required_argument, 0, O_MIN_LR}, {"warmup", required_argument, 0, O_WARMUP},
        {"weight-decay", required_argument, 0, O_WD}, {"clip", required_argument, 0, O_CLIP},
        {"seed", required_argument, 0, O_SEED}, {"data", required_argument, 0, O_DATA},
        {"ckpt-dir", required_argument, 0, O_CKPT}, {"ckpt-every", required_argument, 0, O_EVERY},
        {"resume", no_argument, 0, O_RESUME}, {"sync-save", no_argument, 0, O_SYNC},
        {"log", required_argument, 0, O_LOG}, {"threads", required_argument, 0, O_THREADS},
        {"dump", required_argument, 0, O_DUMP}, {"quiet", no_argument, 0, O_QUIET},
        {"stop-at", required_argument, 0, O_STOP},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const int64_t big = (int64_t)1 << 31;
    int c;
    optind = first;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case O_MODEL: model = optarg; break;
        case O_LAYERS: config.layers = int_option("--layers", optarg, 1, 100000); break;
        case O_DIM: config.dim = int_option("--dim", optarg, 1, big); break;
        case O_HEADS: config.heads = int_option("--heads", optarg, 1, big); break;
        case O_VOCAB: config.vocab = int_option("--vocab", optarg, 2, big); break;
        case O_SEQ: config.seq = int_option("--seq", optarg, 1, big); break;
        case O_FFN: config.ffn = int_option("--ffn", optarg, 1, big); break;
        case O_PAD: config.vocab_pad_multiple = int_option("--vocab-pad-multiple", optarg, 1, 1 << 20); break;
        case O_TP: tp = int_option("--tp", optarg, 1, 4096); break;
        case O_PP: pp = int_option("--pp", optarg, 1, 4096); break;
        case O_DP: dp = int_option("--dp", optarg, 1, 1 << 20); break;
        case O_MB: o.micro_batch = int_option("--micro-batch", optarg, 1, big); break;
        case O_ACCUM: o.grad_accum = int_option("--grad-accum", optarg, 1, big); break;
        case O_STEPS: o.steps = int_option("--steps", optarg, 1, (int64_t)1 << 40); break;
        case O_LR: o.lr = double_option("--lr", optarg); break;
        case O_MIN_LR: o.min_lr = double_option("--min-lr", optarg); break;
        case O_WARMUP: o.warmup = int_option("--warmup", optarg, 0, (int64_t)1 << 40); break;
        case O_WD: o.weight_decay = double_option("--weight-decay", optarg); break;
        case O_CLIP: o.clip = double_option("--clip", optarg); break;
        case O_SEED: o.seed = (uint64_t)int_option("--seed", optarg, 0, INT64_MAX); break;
        case O_DATA: o.data = optarg; break;
        case O_CKPT: o.ckpt_dir = optarg; break;
        case O_EVERY: o.ckpt_every = int_option("--ckpt-every", optarg, 0, (int64_t)1 << 40); break;
        case O_RESUME: o.resume = 1; break;
        case O_SYNC: o.sync_save = 1; break;
        case O_LOG: o.log_path = optarg; break;
        case O_THREADS: o.threads = (int)int_option("--threads", optarg, 1, 1024); break;
        case O_DUMP: o.dump_dir = optarg; break;
        case O_QUIET: o.quiet = 1; break;
        case O_STOP: o.stop_at = int_option("--stop-at", optarg, 1, (int64_t)1 << 40); break;
        case 'h': fputs(usage_text, stdout); return 0;
        default: die_usage("unknown option or missing value: '%s'", cli_rejected_option(argv));
        }
    }
    if (optind != argc) die_usage("unexpected argument '%s'", argv[optind]);
    if (model) {
        gpt_config shape = config;
        if (preset(model, &config)) die_usage("--model expects tiny, small or gpt2-124m, got '%s'", model);
        /* Explicit shape flags refine the preset. */
        if (shape.layers) config.layers = shape.layers;
        if (shape.dim) config.dim = shape.dim;
        if (shape.heads) config.heads = shape.heads;
        if (shape.vocab) config.vocab = shape.vocab;
        if (shape.seq) config.seq = shape.seq;
        if (shape.ffn) config.ffn = shape.ffn;
        if (shape.vocab_pad_multiple) config.vocab_pad_multiple = shape.vocab_pad_multiple;
    }
    if (!config.layers || !config.dim || !config.heads || !config.vocab || !config.seq)
        die_usage("give --model or all of --layers --dim --heads --vocab --seq");
    config.dtype = TP_FP32;
    gpt_config_defaults(&config);
    o.config = config;
    o.seq = config.seq;
    if (o.resume && !o.ckpt_dir) die_usage("--resume needs --ckpt-dir");

    int world = comm_mpi_world_size(&argc, &argv);
    if (!dp) dp = world / (tp * pp) > 0 ? world / (tp * pp) : 1;
    char err[512];
    comm *cm = NULL;
    /* Every rank reaches the same verdict on the layout; rank 0 says it. */
    if (gpt_config_check(&config, (int)tp, (int)pp, err, sizeof err) ||
        comm_mpi_create(&cm, &argc, &argv, (int)tp, (int)pp, (int)dp, err, sizeof err)) {
        int code = comm_mpi_rank() == 0 ? fail("%s", err) : 1;
        comm_mpi_finalize();
        return code;
    }
    int status = train_run(&o, cm);
    cm->ops->free(cm);
    return status;
}
