/* elastic.h: keeping a training run going (docs/ELASTIC.md). The run loop
 * launches tp-train through a real launcher (mpirun, or srun inside a Slurm
 * allocation), follows its progress through the trainer's log, notices
 * failures and hangs, picks a layout for the ranks available (plan.h) and
 * relaunches from the newest intact checkpoint, keeping the global batch.
 * Its state and events live in the run directory, so an orchestrator that
 * is killed and started again continues the run. The library never prints:
 * what happens reaches the caller as events (JSON) through a callback. */
#ifndef TP_ELASTIC_ELASTIC_H
#define TP_ELASTIC_ELASTIC_H

#include <stdint.h>
#include <sys/types.h>

#include "plan.h"

/* ------------------------------------------------------------- capacity */

typedef enum {
    ELASTIC_CAPACITY_WORLD,      /* a fixed number of ranks on this machine */
    ELASTIC_CAPACITY_WORLD_FILE, /* a file holding the number of ranks, re-read when it changes */
    ELASTIC_CAPACITY_HOSTFILE,   /* an Open MPI host file ("host slots=N" lines), re-read */
    ELASTIC_CAPACITY_SLURM,      /* the nodes of the Slurm allocation, asked of Slurm */
} elastic_capacity_kind;

typedef struct {
    elastic_capacity_kind kind;
    int world;           /* ELASTIC_CAPACITY_WORLD */
    char path[4096];     /* WORLD_FILE, HOSTFILE */
    char job_id[64];     /* SLURM */
    int ranks_per_node;  /* SLURM: tasks per node (0: the job's cores there, threads_per_rank a rank) */
    int threads_per_rank; /* SLURM: the trainer's compute threads per rank (tp-train --threads; 0: 1), each
                             a core of its own: a hardware thread more of a core adds no arithmetic units */
} elastic_capacity_source;

#define ELASTIC_MAX_NODES 256

typedef struct {
    int world;                           /* ranks available */
    int nodes;                           /* 0 when the source names none (WORLD, WORLD_FILE) */
    char node_names[ELASTIC_MAX_NODES][64];
    int node_ranks[ELASTIC_MAX_NODES];   /* ranks each node offers */
    int node_cpus[ELASTIC_MAX_NODES];    /* SLURM: each node's CPUs, hardware threads as Slurm counts them
                                            (0 elsewhere) */
    int node_cores[ELASTIC_MAX_NODES];   /* SLURM: the cores those CPUs are on (0 elsewhere) */
} elastic_capacity;

/* The capacity now. Fails naming the source when it cannot be read. */
int elastic_capacity_read(const elastic_capacity_source *source, elastic_capacity *out);

/* Whether Slurm holds pending the step that srun srun_pid (of this host)
 * asks of job job_id: the allocation has no free CPUs for it yet (`scontrol
 * -o show step JOB` lists it as StepId=JOB.TDB, State=PENDING, with
 * SrunHost:Pid=HOST:PID). *pending is 0 when Slurm lists the step running,
 * or not at all; when pending, Slurm's line goes to line (up to size - 1
 * bytes; line may be NULL). srun itself says so only when its first wait
 * for the step ends, after SlurmctldTimeout and up to 9 s more (120 s by
 * default). Fails when scontrol does. */
int elastic_slurm_step_pending(const char *job_id, pid_t srun_pid, int *pending, char *line, size_t size);

/* ---------------------------------------------------------------- launch */

typedef enum { ELASTIC_LAUNCHER_MPIRUN, ELASTIC_LAUNCHER_SRUN } elastic_launcher;

typedef struct {
    elastic_launcher launcher;
    const char *mpirun;  /* the launcher program ("mpirun", "srun") */
    int ranks;
    const elastic_capacity *capacity; /* where the ranks go (nodes and their ranks) */
    char *const *argv;   /* the trainer's command line, NULL-terminated */
    const char *work_dir; /* for the launch's host file */
} elastic_launch;

/* The launcher's command line (malloc'ed strings, NULL-terminated; free
 * with elastic_argv_free). */
int elastic_launch_argv(const elastic_launch *launch, char ***out);
void elastic_argv_free(char **argv);

/* What the launch's environment needs beyond ours: "NAME=VALUE" to set,
 * "NAME" to remove (NULL-terminated; free with elastic_argv_free). For srun,
 * the SLURM_* variables that describe the allocation, from the capacity read
 * now: they go stale when the job shrinks or grows, and srun refuses more
 * nodes than they say ("Only allocated 2 nodes asked for 3"). Empty for
 * mpirun. */
int elastic_launch_env(const elastic_launch *launch, char ***out);

/* Starts argv in a process group of its own; *pid is the group's leader.
 * Every process of the launch carries ELASTIC_LAUNCH_MARKER=<pid> in its
 * environment: the launcher's ranks are in process groups of their own
 * (Open MPI's are) and outlive it for seconds, so they are found by it. */
#define ELASTIC_LAUNCH_MARKER "TP_ELASTIC_LAUNCH"
int elastic_spawn(char *const *argv, char *const *env, pid_t *pid); /* env: as elastic_launch_env's, or NULL */

/* When process pid started (clock ticks after boot, /proc/PID/stat's
 * starttime): recorded with a launch's pid, so that the pid, reused since,
 * is not taken for the launch. TP_ERR_NOT_FOUND when there is no such
 * process. */
int elastic_process_start(pid_t pid, uint64_t *ticks);

/* Whether pid is provably the leader of a launch (elastic_spawn's) that
 * still runs, before its group is signalled on the word of a state file:
 * not 0, 1, negative, this process or its group; the leader of its process
 * group; carrying ELASTIC_LAUNCH_MARKER=pid; and, when start_ticks is not
 * 0, started then. TP_OK when it is; TP_ERR_NOT_FOUND when there is no such
 * process; TP_ERR_STATE saying why not otherwise. */
int elastic_launch_owned(pid_t pid, uint64_t start_ticks);

/* Ends the group: SIGTERM, then SIGKILL after grace_seconds; waits for the
 * leader and returns its wait status in *status_out (may be NULL); then
 * ends the launch's leftovers (elastic_end_leftovers). Groups 0 and 1 and
 * this process's are never signalled (TP_ERR_ARG). */
int elastic_stop_group(pid_t pid, double grace_seconds, int *status_out);

/* Ends the processes of this machine that carry launch's marker (ranks a
 * launcher that ended left behind): SIGTERM, SIGKILL after grace_seconds.
 * Returns how many were still there at the SIGKILL. */
int elastic_end_leftovers(pid_t launch, double grace_seconds);

/* ----------------------------------------------------- the trainer's log */

/* One line of the trainer's --log (JSON lines; docs/TOOLS.md). */
typedef enum {
    ELASTIC_LOG_START,
    ELASTIC_LOG_STEP,
    ELASTIC_LOG_STOP,
    ELASTIC_LOG_SAVE_WAIT, /* the trainer waits for a checkpoint of `step` to be written */
    ELASTIC_LOG_SAVE,      /* the trainer committed the checkpoint of `step` */
    ELASTIC_LOG_OTHER
} elastic_log_kind;

typedef struct {
    elastic_log_kind kind;
    int64_t step;
    double loss;    /* step: NaN when the log says null (the loss went non-finite) */
    double seconds; /* start: load_seconds, the trainer's time to its first step's start */
    double time;    /* the trainer's clock when it wrote the line (Unix seconds; 0: not given) */
    char reason[64];
} elastic_log_line;

/* Follows a growing log: reads the complete lines added since the last call. */
typedef struct {
    char path[4096];
    int64_t offset;
    char partial[4096];
} elastic_log_follower;

void elastic_log_follow(elastic_log_follower *follower, const char *path, int64_t from_offset);
/* Calls visit for each new complete line; a line that is not JSON is skipped. */
int elastic_log_read(elastic_log_follower *follower, void (*visit)(void *ctx, const elastic_log_line *line), void *ctx);

/* ----------------------------------------------------------- checkpoints */

/* The newest checkpoint of run_dir that verifies (every block checksum),
 * with the layout and step it holds; rejected ones are passed to `rejected`
 * with why. TP_ERR_NOT_FOUND when there is no checkpoint at all;
 * TP_ERR_CHECKSUM when there are some and none verifies. A checkpoint the store
 * could not read (ckpt_store_failure) is no rejection: the choice stops
 * there with that error, naming it, as the trainer's resume does. */
typedef struct {
    char path[4096];
    int64_t step;
    int tp, pp;
    gpt_config model; /* the model it holds, when it names one (has_model) */
    int has_model;
    double seconds; /* spent verifying */
} elastic_checkpoint;

int elastic_choose_checkpoint(const char *run_dir, int threads,
                              void (*rejected)(void *ctx, const char *path, const char *why), void *ctx,
                              elastic_checkpoint *out);

/* -------------------------------------------------------------- the run */

typedef struct {
    const char *run_dir;           /* --ckpt-dir: checkpoints (a local path or an object-store URL) */
    const char *state_dir;         /* state, events, trainer output; NULL: <run_dir>/elastic, or for a URL
                                      $TMPDIR/tp-elastic-HASH of it */
    const char *events_path;       /* NULL: <state_dir>/events.jsonl */
    elastic_launcher launcher;
    const char *launcher_program;  /* NULL: "mpirun" or "srun" */
    elastic_capacity_source capacity;
    int min_world;                 /* below it: wait for capacity */
    double capacity_wait_seconds;  /* how long to wait below min_world before giving up */
    int max_restarts;              /* failures relaunched; scale changes do not count */
    double backoff_seconds;        /* the first restart's delay, doubled each failure (capped at 60 s) */
    double heartbeat_seconds;      /* no step for this long: a hang (elastic_hang_allowance) */
    double heartbeat_multiple;     /* every allowance is at least this many times the slowest step seen */
    double start_seconds;          /* allowance for the first step of a launch (load, reshard) */
    double save_seconds;           /* allowance while a checkpoint is saved */
    double grace_seconds;          /* SIGTERM to SIGKILL */
    double poll_seconds;           /* how often capacity and progress are looked at */
    int repeat_limit;              /* failures at one step without progress before giving up */
    int ranks_per_node;            /* for the planner; 0: from the capacity */
    int64_t memory_per_rank;
    int allow_batch_change;
    int keep;                      /* > 0: keep only the newest `keep` checkpoints */
    int verify_threads;
    gpt_config model;              /* what the planner sizes (its dtype: the precision it trains in) */
    const char *model_from;        /* the checkpoint the model was taken from (the trainer's arguments gave
                                      none); NULL: the trainer's arguments */
    int64_t global_batch, micro_batch, steps;
    char *const *train_argv;       /* tp-train and the user's arguments (no layout, no --resume) */
    /* Called with each event as a JSON object text (also appended to the events file). */
    void (*event)(void *ctx, const char *json);
    /* Called with each step the trainer logs, for a progress line. */
    void (*progress)(void *ctx, int64_t step, int64_t steps, double loss, const elastic_layout *layout, int world,
                     int restarts);
    void *ctx;
} elastic_run_options;

void elastic_run_options_init(elastic_run_options *options);

/* What a launch is silent in: loading to its first step, a step, or a save
 * (a stop request's checkpoint, from the step line after the request; the last step's checkpoint; a
 * logged save_wait). */
typedef enum { ELASTIC_SILENT_START, ELASTIC_SILENT_STEP, ELASTIC_SILENT_SAVE } elastic_silence;

/* How long a launch may be silent before it is a hang: start_seconds,
 * heartbeat_seconds or save_seconds, and never less than
 * heartbeat_multiple times the slowest step the run has taken
 * (slowest_step_seconds: the longest time between the trainer's start or
 * step line and its next step line, by its clock but no longer than seen
 * here, a save waited for excepted). A model
 * whose steps outlast the heartbeat is then not taken for hung, and a hang
 * of a fast one is still found at the heartbeat. */
double elastic_hang_allowance(const elastic_run_options *options, elastic_silence silence,
                              double slowest_step_seconds);

/* The shares of the wall time lost (docs/ELASTIC.md "State and events"):
 * detection, selection, reshard, relaunch, lost work, and startup (the time
 * before the run's first step that no other share holds: waits for
 * capacity, an srun step held pending, the first load). */
#define ELASTIC_LOST_KINDS 6

typedef struct {
    int finished;            /* the last step was reached */
    int trained;             /* a step was trained (the trainer's log holds one): 0, and the effective
                                training time is none, training_seconds 0 */
    int64_t step;            /* the last step logged */
    int launches, restarts, scale_changes;
    int64_t steps_recomputed;
    double wall_seconds, training_seconds; /* training: wall time less every lost share; 0 untrained */
    double lost_seconds[ELASTIC_LOST_KINDS]; /* named by elastic_lost_names */
    char reason[1024];       /* why it gave up */
    int usage_error;         /* the trainer refused its arguments (exit status 2 on the first launch): the
                                caller's usage error, not relaunched */
} elastic_summary;

extern const char *const elastic_lost_names[ELASTIC_LOST_KINDS];

/* Runs until the trainer finishes every step, or gives up (restarts used
 * up, a failure that repeats without progress, capacity below min_world for
 * too long); *summary says which. Fails only on the orchestrator's own
 * errors (the run directory not writable). */
int elastic_run(const elastic_run_options *options, elastic_summary *summary);

/* Asks a running elastic_run to stop the trainer (checkpoint and exit) and
 * return; a second request ends the launch at once (SIGTERM, SIGKILL after
 * grace_seconds) without waiting for the checkpoint. Async-signal-safe. */
void elastic_request_stop(void);

#endif
