/* elastic_run.c: `tp-elastic run` (docs/ELASTIC.md): options, the trainer's
 * command line, signals, the progress line and the summary; the loop itself
 * is elastic_run (elastic/elastic.h). */
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "../common/error.h"
#include "../elastic/elastic.h"
#include "../trainer/checkpoint.h"
#include "cli.h"
#include "elastic_commands.h"

#define PROGRAM "tp-elastic run"

static const char run_usage[] =
    "usage: tp-elastic run --ckpt-dir DIR [options] -- tp-train ARGS...\n"
    "Runs tp-train through a launcher and keeps it going: on a failure (a rank or node lost, a hang) it\n"
    "relaunches from the newest checkpoint that verifies, at the layout the planner picks for the ranks\n"
    "available, keeping the global batch; when capacity grows it asks the trainer to checkpoint and relaunches\n"
    "larger. ARGS give the model, --global-batch B (sequences per step), --steps and the rest (--micro-batch M:\n"
    "the largest to use). Without model flags (--dtype aside) a run with checkpoints goes on with the model and\n"
    "precision of its newest checkpoint that opens, as tp-train --resume does (the start line names it; a new run\n"
    "needs the flags: exit 2); flags other than the resumed checkpoint's are refused (exit 2).\n"
    "tp-elastic sets --tp/--pp/--dp, --grad-accum, --sequence-parallel, --virtual-stages, --zero, --ckpt-dir,\n"
    "--resume and --log itself and refuses them in ARGS, as any option tp-train lacks, --stop-at (give --steps\n"
    "the step to end at) and a word that is no option's value.\n"
    "\n"
    "capacity:  --world N | --world-file FILE (re-read when it changes) | --hostfile FILE (Open MPI's) |\n"
    "           inside a Slurm allocation, its nodes (asked of Slurm)\n"
    "           --launcher auto|mpirun|srun (auto: srun inside Slurm, else mpirun) --ranks-per-node G (inside\n"
    "           Slurm by default the job's cores on each node over tp-train's --threads, not its CPUs, which\n"
    "           are hardware threads on hyperthreaded nodes); srun gets --cpu-bind=cores and each rank its\n"
    "           cores' CPUs (--cpus-per-task)\n"
    "           --min-world M (1): below it, wait up to --capacity-wait S (600) for capacity; an srun step\n"
    "           Slurm holds pending (no free CPUs in the allocation yet) is waited for as long, not a hang\n"
    "failures:  --max-restarts K (10) --backoff S (1, doubled per failure) --repeat-limit N (3: failures at\n"
    "           one step without progress before giving up); both count this invocation's failures\n"
    "hangs:     --heartbeat-timeout S (60: no step for this long) --start-timeout S (300: to the first step)\n"
    "           --save-timeout S (600: a stop request's checkpoint, from the step line after the request)\n"
    "           --grace S (10: SIGTERM to SIGKILL)\n"
    "           --heartbeat-multiple M (5): each of these is at least M times the slowest step seen, so that\n"
    "           steps longer than the heartbeat are not hangs (0: the timeouts alone)\n"
    "planner:   --memory-per-rank SIZE --allow-batch-change\n"
    "record:    --events FILE (STATE/events.jsonl); state and trainer output in --state-dir STATE (DIR/elastic;\n"
    "           for a DIR in an object store, http(s):// or s3:// (docs/STORES.md): $TMPDIR/tp-elastic-HASH);\n"
    "           neither inside a checkpoint\n"
    "           --keep K: remove checkpoints older than the K newest intact ones (the one resumed from and those\n"
    "           the trainer committed since; none is removed without it)\n"
    "Exit status: 0 when the last step is reached, 1 when it gave up (the reason is printed), 2 on usage errors,\n"
    "the trainer's too (it exits 2 on its first launch: not relaunched, its error quoted).\n"
    "SIGINT or SIGTERM: the trainer checkpoints and stops; tp-elastic run again continues the run. A second one\n"
    "ends the trainer at once (SIGTERM, SIGKILL after --grace), without its checkpoint.\n";

static void on_signal(int sig)
{
    (void)sig;
    elastic_request_stop();
}

typedef struct {
    int terminal;
    int64_t last_printed;
} printer;

static void on_event(void *ctx, const char *json)
{
    printer *p = ctx;
    cJSON *o = cJSON_Parse(json);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "event");
    /* Steps are the progress line's; every other event gets a line. */
    if (cJSON_IsString(name) && strcmp(name->valuestring, "summary") != 0) {
        if (p->terminal) fputs("\r\033[K", stderr);
        printf("tp-elastic: %s\n", json);
        fflush(stdout);
    }
    cJSON_Delete(o);
}

static void on_progress(void *ctx, int64_t step, int64_t steps, double loss, const elastic_layout *l, int world,
                        int restarts)
{
    printer *p = ctx;
    if (p->terminal) {
        fprintf(stderr, "\r\033[Kstep %lld/%lld | loss %.4f | tp%d pp%d dp%d | world %d | restarts %d", (long long)step,
                (long long)steps, loss, l->tp, l->pp, l->dp, world, restarts);
    } else if (step - p->last_printed >= 10 || step == steps) {
        fprintf(stderr, "tp-elastic: step %lld/%lld loss %.4f tp%d pp%d dp%d world %d restarts %d\n", (long long)step,
                (long long)steps, loss, l->tp, l->pp, l->dp, world, restarts);
        p->last_printed = step;
    }
}

/* Options tp-elastic owns: the user may not give them to the trainer. */
static const char *const owned[] = {"--tp", "--pp", "--dp", "--grad-accum", "--ckpt-dir", "--resume", "--log",
                                    "--sequence-parallel", "--virtual-stages", "--zero", NULL};

/* Options of tp-train that make no sense under tp-elastic, and why. */
static const struct {
    const char *name, *why;
} refused[] = {
    /* The trainer's clean stop before --steps (exit 0) cannot be told from a
     * launch that ended early: it was relaunched as a failure, 3 times, and
     * called a bug. */
    {"--stop-at", "--stop-at would end each launch before --steps, which tp-elastic takes for a failure; give "
                  "--steps the step to end at (a later tp-elastic run with more --steps continues the run)"},
};

/* tp-train's option named by `word` ("--name" or "--name=value"; the
 * model's and the trainer's, as tp-train takes them), NULL when it has none
 * of that name. */
static const struct option *train_option(const char *word)
{
    static const struct option options[] = {CLI_MODEL_LONG_OPTIONS, CLI_TRAIN_LONG_OPTIONS, {0, 0, 0, 0}};
    size_t length = strcspn(word + 2, "=");
    for (int k = 0; options[k].name; k++)
        if (strlen(options[k].name) == length && strncmp(word + 2, options[k].name, length) == 0) return &options[k];
    return NULL;
}

/* Reads what the orchestrator needs from the trainer's arguments: the model
 * options (*model; finished into o->model when they give its shape), the
 * global batch, the micro-batch limit and the steps. An option tp-train
 * does not have is refused here, before any launch. */
static void read_train_args(char **args, elastic_run_options *o, gpt_options *model)
{
    memset(model, 0, sizeof *model);
    int have_batch = 0, options_began = 0;
    for (int i = 1; args[i]; i++) {
        const char *a = args[i];
        /* Among the options, a word that is no option's value (an option's
         * value is stepped over below): tp-train refuses it, and each
         * launch was refused. Words before the first option are a
         * wrapper's own (`sh script.sh --model ...`, as tests launch). */
        if (strncmp(a, "--", 2) != 0) {
            if (options_began)
                cli_usage_error(PROGRAM, "tp-train takes no argument '%s' that is not an option's value", a);
            continue;
        }
        options_began = 1;
        const struct option *known = train_option(a);
        if (!known) cli_usage_error(PROGRAM, "tp-train has no option %s (tp-train --help lists them)", a);
        for (size_t k = 0; k < sizeof refused / sizeof *refused; k++)
            if (strcmp(known->name, refused[k].name + 2) == 0) cli_usage_error(PROGRAM, "%s", refused[k].why);
        for (int k = 0; owned[k]; k++)
            if (strcmp(known->name, owned[k] + 2) == 0)
                cli_usage_error(PROGRAM, "%s is tp-elastic's to set; leave it out of the trainer's arguments",
                                owned[k]);
        const char *equals = strchr(a, '='), *value = equals ? equals + 1 : args[i + 1];
        int flag = known->has_arg == no_argument;
        if (flag && equals) cli_usage_error(PROGRAM, "trainer option --%s takes no value", known->name);
        if (!flag && !value) cli_usage_error(PROGRAM, "trainer option %s needs a value", a);
        const char *name = known->name;
        if (known->val == CLI_MODEL_OPTION && gpt_options_set(model, name, flag ? "" : value))
            cli_usage_error(PROGRAM, "%s", tp_errmsg());
        if (strcmp(name, "global-batch") == 0) {
            o->global_batch = cli_int(PROGRAM, "--global-batch", value, 1, (int64_t)1 << 30);
            have_batch = 1;
        }
        if (strcmp(name, "micro-batch") == 0) o->micro_batch = cli_int(PROGRAM, "--micro-batch", value, 1, 1 << 20);
        if (strcmp(name, "steps") == 0) o->steps = cli_int(PROGRAM, "--steps", value, 1, (int64_t)1 << 40);
        /* a core for each compute thread of a rank, where Slurm says the nodes' cores */
        if (strcmp(name, "threads") == 0)
            o->capacity.threads_per_rank = (int)cli_int(PROGRAM, "--threads", value, 1, 1024);
        if (!flag && !equals) i++;
    }
    if (!have_batch) cli_usage_error(PROGRAM, "the trainer's arguments need --global-batch B (sequences per step)");
    /* Without a shape, the model is the run's (run_model), once the run
     * directory is known to be one. */
    if (gpt_options_shape_given(model) && gpt_options_finish(model, &o->model))
        cli_usage_error(PROGRAM, "the trainer's model: %s", tp_errmsg());
}

/* The model of a run resumed without model flags: its newest checkpoint's
 * that opens, and the precision it trained in unless --dtype says, as
 * tp-train --resume takes it (checkpoint_run_model, the one reader of
 * both). The launches then get no model flags either, and each trainer
 * takes the model itself the same way: the one choice that cannot diverge
 * from what was planned here. Flags written back from the configuration
 * could (a preset's or a Llama's fields no flag spells exactly, as
 * --norm-eps printed short), and the trainer would refuse every launch as a
 * model change. The chosen checkpoint is still compared with this model
 * before each launch (elastic_run), as with flags. Exit 2 when there is no
 * model to take (a new run: no checkpoint yet; or none opens), 1 when the
 * store could not be read. */
static int run_model(elastic_run_options *o, const gpt_options *given, char *from, size_t from_size)
{
    int status = checkpoint_run_model(o->run_dir, given, &o->model, from, from_size);
    if (status == TP_ERR_IO)
        return cli_error(PROGRAM, "the trainer's arguments give no model, and the checkpoints of %s to take it from "
                         "could not be read: %s", o->run_dir, tp_errmsg());
    if (status == TP_ERR_NOT_FOUND)
        cli_usage_error(PROGRAM, "the trainer's arguments give no model, and %s has no checkpoint to take it from "
                        "(a new run): give the trainer --model, or all of --layers --dim --heads --vocab --seq",
                        o->run_dir);
    if (status)
        cli_usage_error(PROGRAM, "the trainer's arguments give no model, and no checkpoint of %s opens to take it "
                        "from (%s): give the trainer --model, or all of --layers --dim --heads --vocab --seq",
                        o->run_dir, tp_errmsg());
    o->model_from = from;
    return 0;
}

int elastic_run_main(int argc, char **argv)
{
    enum { O_CKPT = 1, O_LAUNCHER, O_WORLD, O_WORLD_FILE, O_HOSTFILE, O_MIN, O_RESTARTS, O_HEARTBEAT, O_START, O_SAVE,
           O_GRACE, O_BACKOFF, O_REPEAT, O_EVENTS, O_RPN, O_MEMORY, O_ALLOW, O_WAIT, O_KEEP, O_HELP, O_STATE,
           O_MULTIPLE };
    static const struct option options[] = {
        {"ckpt-dir", required_argument, 0, O_CKPT}, {"launcher", required_argument, 0, O_LAUNCHER},
        {"world", required_argument, 0, O_WORLD}, {"world-file", required_argument, 0, O_WORLD_FILE},
        {"hostfile", required_argument, 0, O_HOSTFILE}, {"min-world", required_argument, 0, O_MIN},
        {"max-restarts", required_argument, 0, O_RESTARTS}, {"heartbeat-timeout", required_argument, 0, O_HEARTBEAT},
        {"start-timeout", required_argument, 0, O_START}, {"save-timeout", required_argument, 0, O_SAVE},
        {"grace", required_argument, 0, O_GRACE}, {"backoff", required_argument, 0, O_BACKOFF},
        {"repeat-limit", required_argument, 0, O_REPEAT}, {"events", required_argument, 0, O_EVENTS},
        {"ranks-per-node", required_argument, 0, O_RPN}, {"memory-per-rank", required_argument, 0, O_MEMORY},
        {"allow-batch-change", no_argument, 0, O_ALLOW}, {"capacity-wait", required_argument, 0, O_WAIT},
        {"keep", required_argument, 0, O_KEEP}, {"state-dir", required_argument, 0, O_STATE},
        {"heartbeat-multiple", required_argument, 0, O_MULTIPLE},
        {"help", no_argument, 0, O_HELP}, {0, 0, 0, 0}};
    elastic_run_options o;
    elastic_run_options_init(&o);
    const char *launcher = "auto";
    int capacity_given = 0;
    opterr = 0;
    optind = 1;
    int c;
    /* '+': stop at the first word that is not an option (the "--"). */
    while ((c = getopt_long(argc, argv, "+", options, NULL)) != -1) {
        switch (c) {
        case O_CKPT: o.run_dir = optarg; break;
        case O_LAUNCHER: launcher = optarg; break;
        case O_WORLD:
            o.capacity.kind = ELASTIC_CAPACITY_WORLD;
            o.capacity.world = (int)cli_int(PROGRAM, "--world", optarg, 1, 1 << 20);
            capacity_given++;
            break;
        case O_WORLD_FILE:
        case O_HOSTFILE:
            o.capacity.kind = c == O_WORLD_FILE ? ELASTIC_CAPACITY_WORLD_FILE : ELASTIC_CAPACITY_HOSTFILE;
            if (strlen(optarg) >= sizeof o.capacity.path) cli_usage_error(PROGRAM, "path too long: %s", optarg);
            strcpy(o.capacity.path, optarg);
            capacity_given++;
            break;
        case O_MIN: o.min_world = (int)cli_int(PROGRAM, "--min-world", optarg, 1, 1 << 20); break;
        case O_RESTARTS: o.max_restarts = (int)cli_int(PROGRAM, "--max-restarts", optarg, 0, 1 << 20); break;
        case O_HEARTBEAT: o.heartbeat_seconds = cli_number(PROGRAM, "--heartbeat-timeout", optarg); break;
        case O_MULTIPLE: o.heartbeat_multiple = cli_number(PROGRAM, "--heartbeat-multiple", optarg); break;
        case O_START: o.start_seconds = cli_number(PROGRAM, "--start-timeout", optarg); break;
        case O_SAVE: o.save_seconds = cli_number(PROGRAM, "--save-timeout", optarg); break;
        case O_GRACE: o.grace_seconds = cli_number(PROGRAM, "--grace", optarg); break;
        case O_BACKOFF: o.backoff_seconds = cli_number(PROGRAM, "--backoff", optarg); break;
        case O_REPEAT: o.repeat_limit = (int)cli_int(PROGRAM, "--repeat-limit", optarg, 1, 1000); break;
        case O_EVENTS: o.events_path = optarg; break;
        case O_STATE: o.state_dir = optarg; break;
        case O_RPN: o.ranks_per_node = (int)cli_int(PROGRAM, "--ranks-per-node", optarg, 1, 1 << 20); break;
        case O_MEMORY: o.memory_per_rank = cli_size(PROGRAM, "--memory-per-rank", optarg); break;
        case O_ALLOW: o.allow_batch_change = 1; break;
        case O_WAIT: o.capacity_wait_seconds = cli_number(PROGRAM, "--capacity-wait", optarg); break;
        case O_KEEP: o.keep = (int)cli_int(PROGRAM, "--keep", optarg, 1, 1 << 20); break;
        case O_HELP: fputs(run_usage, stdout); return 0;
        default: cli_usage_error(PROGRAM, "unknown option or missing value: '%s'", cli_rejected_option(argv));
        }
    }
    if (!o.run_dir) cli_usage_error(PROGRAM, "--ckpt-dir DIR is required");
    if (capacity_given > 1) cli_usage_error(PROGRAM, "give one of --world, --world-file and --hostfile");
    /* getopt steps over the "--" that ends the options */
    if (optind < 2 || strcmp(argv[optind - 1], "--") != 0 || optind >= argc)
        cli_usage_error(PROGRAM, "the trainer's command line goes after '--' (-- tp-train ARGS...)");
    char **train = argv + optind;
    gpt_options model;
    read_train_args(train, &o, &model);
    o.train_argv = train;
    const char *job = getenv("SLURM_JOB_ID");
    if (strcmp(launcher, "auto") == 0) launcher = job && !capacity_given ? "srun" : "mpirun";
    if (strcmp(launcher, "srun") == 0) {
        o.launcher = ELASTIC_LAUNCHER_SRUN;
        if (!capacity_given) {
            if (!job) cli_usage_error(PROGRAM, "--launcher srun outside a Slurm allocation needs --world or a file");
            o.capacity.kind = ELASTIC_CAPACITY_SLURM;
            snprintf(o.capacity.job_id, sizeof o.capacity.job_id, "%s", job);
            o.capacity.ranks_per_node = o.ranks_per_node;
        }
    } else if (strcmp(launcher, "mpirun") == 0) {
        o.launcher = ELASTIC_LAUNCHER_MPIRUN;
        if (!capacity_given) cli_usage_error(PROGRAM, "mpirun needs the capacity: --world N, --world-file or --hostfile");
    } else {
        cli_usage_error(PROGRAM, "--launcher takes auto, mpirun or srun, not '%s'", launcher);
    }
    /* A fixed world never grows: below --min-world, the run waited
     * --capacity-wait (600 s) for capacity that could not come, then gave up.
     * Once the capacity's source is known: inside a Slurm allocation the
     * default (a world of 1, before the allocation is taken as the source)
     * refused every --min-world over 1 as "more than --world 1". */
    if (o.capacity.kind == ELASTIC_CAPACITY_WORLD && o.min_world > o.capacity.world)
        cli_usage_error(PROGRAM, "--min-world %d is more than --world %d, which never changes: nothing could run",
                        o.min_world, o.capacity.world);
    /* A capacity file is re-read as the run goes, and a moment unreadable
     * there (being rewritten) is waited out; at the start, one missing or
     * holding anything but its number is a mistake, refused at once rather
     * than waited on for --capacity-wait. So is a Slurm that does not
     * answer at the start (its controller unreachable from here, its
     * commands missing): said as that, not waited on as too few nodes. */
    if (o.capacity.kind != ELASTIC_CAPACITY_WORLD) {
        elastic_capacity first;
        if (elastic_capacity_read(&o.capacity, &first)) {
            if (o.capacity.kind == ELASTIC_CAPACITY_SLURM)
                return cli_error(PROGRAM, "cannot read the nodes of Slurm job %s (does its controller answer?): %s",
                                 o.capacity.job_id, tp_errmsg());
            return cli_error(PROGRAM, "%s", tp_errmsg());
        }
    }
    /* Another tool's checkpoint, or one of ours, is no run directory: said
     * once, before the state directory is made in it, not relaunched (the
     * trainer refuses it, and that refusal was retried). The trainer is
     * launched with --resume: a run directory with checkpoints is
     * continued. */
    char refused[4 * 4096 + 512] = "";
    if (cli_ckpt_dir_refusal(o.run_dir, 1, refused, sizeof refused)) return cli_error(PROGRAM, "%s", tp_errmsg());
    if (refused[0]) {
        cli_error(PROGRAM, "%s", refused);
        return 2; /* as tp-train's refusal */
    }
    char model_from[4096];
    if (!gpt_options_shape_given(&model) && run_model(&o, &model, model_from, sizeof model_from)) return 1;
    /* The state directory and the events file are written as the run goes:
     * inside a checkpoint, --keep removed them with it (events, the
     * trainer's log and state.json gone, then "state.json.tmp: cannot
     * open"), and nothing is written among a checkpoint's files anyway. */
    const char *written[][2] = {{"--state-dir", o.state_dir}, {"--events", o.events_path}};
    for (size_t i = 0; i < sizeof written / sizeof *written; i++) {
        char ckpt[4200];
        if (written[i][1] && cli_checkpoint_around(written[i][1], ckpt, sizeof ckpt))
            cli_usage_error(PROGRAM, "%s %s lies inside the checkpoint %s: tp-elastic writes nothing into a "
                            "checkpoint; choose a path outside it", written[i][0], written[i][1], ckpt);
    }
    printer p = {isatty(2), 0};
    o.event = on_event;
    o.progress = on_progress;
    o.ctx = &p;
    const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
        if (cli_catch_signal(stop_signals[i], on_signal))
            return cli_error(PROGRAM, "cannot handle %s: %s", strsignal(stop_signals[i]), strerror(errno));
    elastic_summary s;
    if (elastic_run(&o, &s)) return cli_error(PROGRAM, "%s", tp_errmsg());
    if (p.terminal) fputs("\r\033[K", stderr);
    double lost = 0;
    for (int i = 0; i < ELASTIC_LOST_KINDS; i++) lost += s.lost_seconds[i];
    printf("%s at step %lld: %d launch%s, %d restart%s, %d scale change%s, %lld step%s recomputed\n",
           s.finished ? "finished" : "stopped", (long long)s.step, s.launches, s.launches == 1 ? "" : "es", s.restarts,
           s.restarts == 1 ? "" : "s", s.scale_changes, s.scale_changes == 1 ? "" : "s", (long long)s.steps_recomputed,
           s.steps_recomputed == 1 ? "" : "s");
    printf("wall %.1f s, lost %.1f s (", s.wall_seconds, lost);
    for (int i = 0; i < ELASTIC_LOST_KINDS; i++)
        printf("%s%s %.1f s", i ? ", " : "", elastic_lost_names[i], s.lost_seconds[i]);
    /* A run that trained no step has no effective training time: not the
     * 100% of a wall time of which nothing else was said lost. */
    if (!s.trained) printf("), effective training time none (no step trained)\n");
    else printf("), effective training time %.1f%%\n", s.wall_seconds > 0 ? 100 * s.training_seconds / s.wall_seconds : 0);
    if (!s.finished && s.reason[0]) cli_error(PROGRAM, "%s", s.reason);
    return s.finished ? 0 : s.usage_error ? 2 : 1;
}
