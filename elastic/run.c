/* run.c: the run loop of tp-elastic (elastic.h, docs/ELASTIC.md).
 *
 * Each round: read the capacity, plan a layout for it, choose the newest
 * checkpoint that verifies, launch the trainer with --resume, and watch it:
 * its exit, its log (a step is progress; none for too long is a hang) and
 * the capacity (more ranks usable: ask the trainer to checkpoint and stop,
 * then relaunch larger). The trainer reshards at load when the layout
 * changed. Everything that happens is an event, appended to the events file
 * and handed to the caller; the state that a restarted orchestrator needs
 * (launches, restarts, the layout, the failure history) is in
 * <run_dir>/elastic/state.json, replaced atomically. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../ckpt/ckpt.h"
#include "../store/store.h"
#include "../common/clock.h"
#include "../common/error.h"
#include "../common/file.h"
#include "../common/json.h"
#include "elastic.h"

const char *const elastic_lost_names[ELASTIC_LOST_KINDS] = {"detection", "selection", "reshard",
                                                            "relaunch",  "lost_work", "startup"};
enum { LOST_DETECTION, LOST_SELECTION, LOST_RESHARD, LOST_RELAUNCH, LOST_WORK, LOST_STARTUP };

static atomic_int stop_requested;

void elastic_request_stop(void)
{
    atomic_fetch_add(&stop_requested, 1); /* counted: a second request ends the launch at once */
}

void elastic_run_options_init(elastic_run_options *o)
{
    memset(o, 0, sizeof *o);
    o->launcher = ELASTIC_LAUNCHER_MPIRUN;
    o->capacity.kind = ELASTIC_CAPACITY_WORLD;
    o->capacity.world = 1;
    o->min_world = 1;
    o->capacity_wait_seconds = 600;
    o->max_restarts = 10;
    o->backoff_seconds = 1;
    o->heartbeat_seconds = 60;
    o->heartbeat_multiple = 5; /* as NVIDIA's fault tolerance sizes its timeouts from observed intervals */
    o->start_seconds = 300;
    o->save_seconds = 600;
    o->grace_seconds = 10;
    o->poll_seconds = 0.2;
    o->repeat_limit = 3;
    o->verify_threads = 2;
    o->steps = 100;
}

double elastic_hang_allowance(const elastic_run_options *o, elastic_silence silence, double slowest_step_seconds)
{
    double base = silence == ELASTIC_SILENT_SAVE    ? o->save_seconds
                  : silence == ELASTIC_SILENT_START ? o->start_seconds
                                                    : o->heartbeat_seconds;
    double steps = o->heartbeat_multiple * slowest_step_seconds;
    return steps > base ? steps : base;
}

/* ------------------------------------------------------------- the state */

typedef struct {
    const elastic_run_options *o;
    char dir[4200];         /* <run_dir>/elastic */
    char state_path[4300], events_path[4300], log_path[4300], lock_path[4300];
    FILE *events;
    store_file *lock;        /* held for this orchestrator's life: orchestrator_lock */
    /* kept across orchestrator restarts */
    int launches, restarts, scale_changes, repeats, tp, pp;
    pid_t launch_pid; /* the launch running now (its process group), 0 when none */
    uint64_t launch_start; /* when it started (elastic_process_start), 0 when unknown */
    int64_t last_failure_step, steps_recomputed, last_step;
    double lost[ELASTIC_LOST_KINDS], wall_before;
    int trained;            /* the run has trained a step (its log holds one): the lost shares from here */
    double slowest_step;    /* seconds: the slowest step of any launch (elastic_hang_allowance) */
    /* this orchestrator's */
    int launches_before;    /* launches of earlier orchestrators (state.json) */
    int restarts_before;    /* their restarts: --max-restarts counts this orchestrator's alone */
    double startup_before;  /* their startup (state.json), and every other share of theirs: count_startup */
    double others_before;
    double started;
    double step_seconds_sum;
    int64_t step_count;
    double last_prune;      /* now_seconds() of the last --keep pass */
    char **kept;            /* checkpoints --keep left to their readers, each said once */
    int kept_count;
    /* The steps of the checkpoints known intact, the only ones --keep counts
     * among the newest: the one chosen (verified) and those the trainer
     * committed since (its log's save lines). One that failed to verify, or
     * was never looked at, counts for nothing. Reset at each choice. */
    int64_t *intact;
    int intact_count;
    char capacity_error[512]; /* why the capacity could not be read during a launch, said once; "" once read */
} run_state;

/* Appends the event (the object is consumed) and hands it to the caller. */
static int emit(run_state *s, const char *name, cJSON *event)
{
    if (!event) return tp_fail(TP_ERR_NOMEM, "out of memory writing an event");
    cJSON_AddStringToObject(event, "event", name);
    cJSON_AddNumberToObject(event, "time", unix_seconds());
    char *text = cJSON_PrintUnformatted(event);
    cJSON_Delete(event);
    if (!text) return tp_fail(TP_ERR_NOMEM, "out of memory writing an event");
    int status = TP_OK;
    if (fprintf(s->events, "%s\n", text) < 0 || fflush(s->events) != 0)
        status = tp_fail(TP_ERR_IO, "%s: cannot append: %s", s->events_path, strerror(errno));
    if (s->o->event) s->o->event(s->o->ctx, text);
    free(text);
    return status;
}

static cJSON *layout_json(const elastic_layout *l)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tp", l->tp);
    cJSON_AddNumberToObject(o, "pp", l->pp);
    cJSON_AddNumberToObject(o, "dp", l->dp);
    cJSON_AddNumberToObject(o, "micro_batch", (double)l->micro_batch);
    cJSON_AddNumberToObject(o, "grad_accum", (double)l->grad_accum);
    cJSON_AddNumberToObject(o, "global_batch", (double)l->global_batch);
    cJSON_AddNumberToObject(o, "ranks", l->ranks);
    cJSON_AddBoolToObject(o, "sequence_parallel", l->sequence_parallel);
    cJSON_AddNumberToObject(o, "zero", l->zero);
    return o;
}

static void count_startup(run_state *s);

static int save_state(run_state *s)
{
    count_startup(s); /* an orchestrator killed before the first step leaves its startup said */
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "launches", s->launches);
    cJSON_AddNumberToObject(o, "restarts", s->restarts);
    cJSON_AddNumberToObject(o, "scale_changes", s->scale_changes);
    cJSON_AddNumberToObject(o, "repeats", s->repeats);
    cJSON_AddNumberToObject(o, "tp", s->tp);
    cJSON_AddNumberToObject(o, "pp", s->pp);
    cJSON_AddNumberToObject(o, "launch_pid", s->launch_pid);
    cJSON_AddNumberToObject(o, "launch_start", (double)s->launch_start);
    cJSON_AddNumberToObject(o, "last_failure_step", (double)s->last_failure_step);
    cJSON_AddNumberToObject(o, "last_step", (double)s->last_step);
    cJSON_AddNumberToObject(o, "steps_recomputed", (double)s->steps_recomputed);
    cJSON_AddNumberToObject(o, "wall_seconds", s->wall_before + now_seconds() - s->started);
    cJSON_AddNumberToObject(o, "slowest_step_seconds", s->slowest_step);
    cJSON *lost = cJSON_AddObjectToObject(o, "lost_seconds");
    for (int i = 0; i < ELASTIC_LOST_KINDS; i++) cJSON_AddNumberToObject(lost, elastic_lost_names[i], s->lost[i]);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return tp_fail(TP_ERR_NOMEM, "out of memory writing %s", s->state_path);
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp", s->state_path);
    int fd = -1;
    int opened = tp_open_regular_flags(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644, &fd); /* a FIFO would block */
    if (opened) {
        free(text);
        return opened;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) close(fd);
    int status = f && fputs(text, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0 ? TP_OK : TP_ERR_IO;
    int err = errno;
    if (f && fclose(f) != 0 && !status) status = TP_ERR_IO, err = errno;
    free(text);
    if (!status && rename(tmp, s->state_path) != 0) status = TP_ERR_IO, err = errno;
    if (!status) return TP_OK;
    /* Not left behind (a full disk's half-written file, or one no rename
     * took): state.json, as it was, is the state. */
    unlink(tmp);
    return tp_fail(TP_ERR_IO, "%s: cannot write: %s", s->state_path, strerror(err));
}

/* A number of state.json within [min, max] (an integer where `integral`):
 * anything else is refused, naming it, expected against found (a cast of
 * 1e308 or -7 to a count is undefined, or nonsense). Absent: `fallback`
 * (a state file of an earlier version of tp-elastic). */
static int state_number(const run_state *s, const cJSON *o, const char *name, double min, double max, int integral,
                        double fallback, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    *out = fallback;
    if (!v) return TP_OK;
    if (cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble >= min && v->valuedouble <= max &&
        (!integral || v->valuedouble == floor(v->valuedouble))) {
        *out = v->valuedouble;
        return TP_OK;
    }
    char *found = cJSON_PrintUnformatted(v);
    int status = tp_fail(TP_ERR_FORMAT, "%s: \"%s\": expected %s from %.17g to %.17g, got %s", s->state_path, name,
                         integral ? "an integer" : "a number", min, max, found ? found : "(unprintable)");
    free(found);
    return status;
}

/* The largest a pid can be (the kernel's PID_MAX_LIMIT, 2^22). */
#define PID_LIMIT 4194304.0
/* Steps and ticks: integers a double holds exactly. */
#define EXACT_LIMIT 9007199254740992.0

/* The furthest step of the trainer's log, and its steps recomputed
 * (open_state): each step line at or before the furthest step logged
 * before it. */
typedef struct {
    int64_t furthest, recomputed, count;
} logged_steps;

static void note_logged_step(void *ctx, const elastic_log_line *line)
{
    logged_steps *l = ctx;
    if (line->kind != ELASTIC_LOG_STEP) return;
    l->count++;
    if (line->step <= l->furthest) l->recomputed++;
    else l->furthest = line->step;
}

/* The state of an earlier orchestrator of this run, when there is one. */
static int load_state(run_state *s)
{
    char *text = NULL;
    int status = store_read_text_file(s->state_path, CKPT_CONFIG_MAX_BYTES, &text, NULL);
    if (status == TP_ERR_NOT_FOUND || (status && access(s->state_path, F_OK) != 0)) return TP_OK;
    if (status) return status;
    cJSON *o = NULL;
    status = tp_json_parse(text, strlen(text), s->state_path, &o);
    free(text);
    if (status) return status;
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return tp_fail(TP_ERR_FORMAT, "%s: expected a JSON object", s->state_path);
    }
    double v[15] = {0};
    const struct {
        const char *name;
        double min, max;
        int integral;
        double fallback;
    } fields[] = {
        {"launches", 0, INT_MAX, 1, 0},        {"restarts", 0, INT_MAX, 1, 0},
        {"scale_changes", 0, INT_MAX, 1, 0},   {"repeats", 0, INT_MAX, 1, 0},
        {"tp", 0, 1 << 20, 1, 0},              {"pp", 0, 1 << 20, 1, 0},
        {"launch_pid", 0, PID_LIMIT, 1, 0},    {"launch_start", 0, EXACT_LIMIT, 1, 0},
        {"last_failure_step", -1, EXACT_LIMIT, 1, -1}, {"last_step", 0, EXACT_LIMIT, 1, 0},
        {"steps_recomputed", 0, EXACT_LIMIT, 1, 0},    {"wall_seconds", 0, 1e12, 0, 0},
        {"slowest_step_seconds", 0, 1e9, 0, 0},
    };
    for (size_t i = 0; !status && i < sizeof fields / sizeof *fields; i++)
        status = state_number(s, o, fields[i].name, fields[i].min, fields[i].max, fields[i].integral,
                              fields[i].fallback, &v[i]);
    const cJSON *lost = cJSON_GetObjectItemCaseSensitive(o, "lost_seconds");
    if (!status && lost && !cJSON_IsObject(lost))
        status = tp_fail(TP_ERR_FORMAT, "%s: \"lost_seconds\": expected an object of seconds", s->state_path);
    for (int i = 0; !status && lost && i < ELASTIC_LOST_KINDS; i++) /* startup absent: an older state, 0 */
        status = state_number(s, lost, elastic_lost_names[i], 0, 1e12, 0, 0, &s->lost[i]);
    cJSON_Delete(o);
    if (status) return status;
    s->launches = (int)v[0];
    s->restarts = (int)v[1];
    s->scale_changes = (int)v[2];
    s->repeats = (int)v[3];
    s->tp = (int)v[4];
    s->pp = (int)v[5];
    s->launch_pid = (pid_t)v[6];
    s->launch_start = (uint64_t)v[7];
    s->last_failure_step = (int64_t)v[8];
    s->last_step = (int64_t)v[9];
    s->steps_recomputed = (int64_t)v[10];
    s->wall_before = v[11];
    s->slowest_step = v[12];
    return TP_OK;
}

static int make_dir(const char *path)
{
    if (mkdir(path, 0755) == 0 || errno == EEXIST) return TP_OK;
    return tp_fail(TP_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
}

/* A launch of an earlier orchestrator of this run that is still running
 * (it should have ended with it: PR_SET_PDEATHSIG) is ended before anything
 * else writes the run directory. The state file's word is not enough to
 * signal a process group: the pid may have been reused since (the
 * orchestrator killed with SIGKILL long ago), or the file damaged. Only a
 * group that is provably the launch's (elastic_launch_owned: the launch's
 * marker in its environment, its recorded start time) is ended; anything
 * else is left alone, and an event says why. */
static int end_earlier_launch(run_state *s)
{
    pid_t pid = s->launch_pid;
    if (pid == 0) return TP_OK;
    int owned = elastic_launch_owned(pid, s->launch_start);
    if (owned == TP_ERR_NOT_FOUND) {
        /* The leader is gone; ranks it left behind carry its marker. */
        elastic_end_leftovers(pid, s->o->grace_seconds);
        return TP_OK;
    }
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "pid", pid);
    if (owned) {
        char why[1200];
        snprintf(why, sizeof why, "%.300s: launch_pid %d not signalled: %.800s", s->state_path, (int)pid, tp_errmsg());
        cJSON_AddStringToObject(e, "why", why);
        return emit(s, "earlier_launch_skipped", e);
    }
    elastic_stop_group(pid, s->o->grace_seconds, NULL);
    return emit(s, "earlier_launch_ended", e);
}

/* One orchestrator per run: an exclusive flock on <state dir>/
 * orchestrator.lock, held for the orchestrator's life (the kernel releases
 * it when the process ends, kill -9 included: a held lock is a live
 * orchestrator, a free one a dead one), the storage's lock of the run
 * directory's `latest` (store/store.h). The holder's host, pid and start
 * time are written into the file, for the refusal of a second one. */
static int orchestrator_lock(run_state *s)
{
    snprintf(s->lock_path, sizeof s->lock_path, "%s/orchestrator.lock", s->dir);
    int fd = -1;
    /* created if missing, never truncated: the holder's record is there */
    TP_TRY(tp_open_regular_flags(s->lock_path, O_WRONLY | O_CREAT, 0644, &fd));
    close(fd);
    const store_ops *storage = store_posix();
    int status = storage->lock(storage, s->lock_path, 0, &s->lock);
    if (status == TP_ERR_EXISTS) {
        /* The holder writes its record just after it locks: a moment. */
        char *text = NULL;
        for (int i = 0; i < 50; i++) {
            free(text);
            text = NULL;
            if (store_read_text_file(s->lock_path, 4096, &text, NULL) == TP_OK && text[0]) break;
            struct timespec pause = {0, 20 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
        cJSON *o = text && text[0] ? cJSON_Parse(text) : NULL;
        free(text);
        const cJSON *host = cJSON_GetObjectItemCaseSensitive(o, "host");
        const cJSON *pid = cJSON_GetObjectItemCaseSensitive(o, "pid");
        const cJSON *started = cJSON_GetObjectItemCaseSensitive(o, "started");
        char when[64] = "an unknown time";
        if (cJSON_IsNumber(started)) {
            time_t t = (time_t)started->valuedouble;
            struct tm tm;
            if (gmtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
        }
        status = tp_fail(TP_ERR_EXISTS,
                         "another tp-elastic runs this run: host %s pid %d, started %s (it holds the lock on %s); "
                         "refusing to start a second orchestrator",
                         cJSON_IsString(host) ? host->valuestring : "(not recorded)",
                         cJSON_IsNumber(pid) ? (int)pid->valuedouble : -1, when, s->lock_path);
        cJSON_Delete(o);
        return status;
    }
    TP_TRY(status);
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "(unknown)");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "host", host);
    cJSON_AddNumberToObject(o, "pid", getpid());
    cJSON_AddNumberToObject(o, "started", unix_seconds());
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text) return tp_fail(TP_ERR_NOMEM, "out of memory writing %s", s->lock_path);
    /* The lock is on the open file, not on this descriptor: closing it
     * keeps the lock. */
    status = tp_open_regular_flags(s->lock_path, O_WRONLY | O_NOFOLLOW, 0, &fd);
    if (!status) {
        size_t n = strlen(text);
        text[n] = '\n';
        if (ftruncate(fd, 0) != 0 || write(fd, text, n + 1) != (ssize_t)(n + 1))
            status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", s->lock_path, strerror(errno));
        close(fd);
    }
    free(text);
    return status;
}

static int open_state(run_state *s, const elastic_run_options *o)
{
    memset(s, 0, sizeof *s);
    s->o = o;
    s->started = now_seconds();
    s->last_failure_step = -1;
    if (o->state_dir) {
        snprintf(s->dir, sizeof s->dir, "%s", o->state_dir);
    } else if (ckpt_is_remote(o->run_dir)) {
        TP_TRY(ckpt_local_dir_for(o->run_dir, "elastic", s->dir, sizeof s->dir));
    } else {
        TP_TRY(make_dir(o->run_dir));
        snprintf(s->dir, sizeof s->dir, "%s/elastic", o->run_dir);
    }
    TP_TRY(make_dir(s->dir));
    snprintf(s->state_path, sizeof s->state_path, "%s/state.json", s->dir);
    snprintf(s->log_path, sizeof s->log_path, "%s/train.jsonl", s->dir);
    snprintf(s->events_path, sizeof s->events_path, "%s", o->events_path ? o->events_path : "");
    if (!o->events_path) snprintf(s->events_path, sizeof s->events_path, "%s/events.jsonl", s->dir);
    TP_TRY(orchestrator_lock(s));
    TP_TRY(load_state(s));
    s->launches_before = s->launches;
    /* --max-restarts and --repeat-limit are this invocation's: counted
     * across invocations, a run that had used them up could never be
     * continued, and a requeued job inherited the count of the one before.
     * The record (restarts in state.json and the summary) stays the run's. */
    s->restarts_before = s->restarts;
    s->repeats = 0;
    /* The trainer's log is read as it grows; a FIFO there would block the
     * reads (and the trainer): refused before anything is launched. */
    TP_TRY(tp_refuse_special(s->log_path));
    /* state.json is written at events, not at each step: after an
     * orchestrator killed with SIGKILL it names the step of the last event,
     * and the steps its launch logged since then, lost with it, were not
     * counted as recomputed ("0 steps recomputed" after 10 were). The
     * trainer's log, kept across launches, says how far the run got. */
    elastic_log_follower logged;
    elastic_log_follow(&logged, s->log_path, 0);
    logged_steps steps = {0, 0, 0};
    TP_TRY(elastic_log_read(&logged, note_logged_step, &steps));
    s->trained = steps.count > 0;
    s->startup_before = s->lost[LOST_STARTUP];
    for (int i = 0; i < ELASTIC_LOST_KINDS; i++)
        if (i != LOST_STARTUP) s->others_before += s->lost[i];
    if (steps.furthest > s->last_step) s->last_step = steps.furthest;
    /* Counted from the log, as the trainer computed them: counted at each
     * relaunch instead (the furthest step less the one resumed from), a
     * relaunch that failed before its first step counted the same steps
     * again (10 recomputed where 5 were). */
    if (steps.furthest > 0) s->steps_recomputed = steps.recomputed;
    /* So are the state's temporary file and the capacity's file, which a
     * FIFO would make fail later (the capacity only after a long wait). */
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp", s->state_path);
    TP_TRY(tp_refuse_special(tmp));
    if (o->capacity.kind == ELASTIC_CAPACITY_WORLD_FILE || o->capacity.kind == ELASTIC_CAPACITY_HOSTFILE)
        TP_TRY(tp_refuse_special(o->capacity.path));
    int fd = -1;
    TP_TRY(tp_open_regular_flags(s->events_path, O_WRONLY | O_CREAT | O_APPEND, 0644, &fd));
    s->events = fdopen(fd, "a");
    if (!s->events) {
        close(fd);
        return tp_fail(TP_ERR_IO, "%s: cannot append: %s", s->events_path, strerror(errno));
    }
    return TP_OK;
}

/* ------------------------------------------------------------ one launch */

/* END_PENDING: srun's step was held pending past --capacity-wait, and ended. */
typedef enum { END_FINISHED, END_FAILED, END_HUNG, END_SCALE, END_STOPPED, END_PENDING } launch_end;

typedef struct {
    run_state *s;
    const elastic_layout *layout;
    int world;
    int started;            /* the trainer's start line was seen */
    int64_t first_step, last_step;
    double launched, last_progress, first_step_time, load_seconds;
    int stop_line_finished;
    int stop_line_diverged; /* the trainer ended at a non-finite gradient norm: a relaunch would again */
    int stop_line_in_use;   /* the trainer was refused: another live run holds the run directory */
    int save_wait;          /* a save_wait line came after the last step line */
    double step_began;      /* the trainer's time of its last start or step line; 0: none yet */
    const char *output;     /* the launch's output (launch-N.out) */
    double pending_since;   /* when Slurm (or srun) said that it holds the step pending; 0: it does not */
    int step_created;       /* the step held pending was created since (follow_pending_step) */
    char pending_line[512]; /* srun's line or Slurm's saying so */
    double next_step_query; /* when Slurm is next asked whether the step is pending */
    /* what the first step of the launch reports */
    int have_checkpoint, reshard;
    int64_t resumed;
    int from_tp, from_pp;
} launch_watch;

static int emit(run_state *s, const char *name, cJSON *event);
static void prune_checkpoints(run_state *s);
static void note_intact(run_state *s, int64_t step);

/* Before the run's first step every second is lost, whatever it went to:
 * a wait for capacity below --min-world, an srun step held pending, the
 * first launch's load, launches that failed before they trained. What no
 * other share holds (a hang's detection does) is startup: this
 * orchestrator's time less the other shares it added, on top of what its
 * predecessors said (state.json). Computed afresh at each call, until the
 * first step freezes it. Left out, a run that gave up waiting for
 * capacity, or never got its step, had an effective training time of 100%
 * for training nothing. */
static void count_startup(run_state *s)
{
    if (s->trained) return;
    double others = 0;
    for (int i = 0; i < ELASTIC_LOST_KINDS; i++)
        if (i != LOST_STARTUP) others += s->lost[i];
    double rest = now_seconds() - s->started - (others - s->others_before);
    s->lost[LOST_STARTUP] = s->startup_before + (rest > 0 ? rest : 0);
}

/* The first step of a launch: it resumed (and resharded at load when the
 * layout changed); the time from the launch to here was lost to reshard
 * (the trainer's load time, when it resharded) and relaunch (the rest);
 * the run's first step ends its startup (count_startup), which holds them. */
static void first_step_seen(launch_watch *w)
{
    run_state *s = w->s;
    double to_first = w->first_step_time - w->launched, load = w->reshard ? w->load_seconds : 0;
    if (s->trained) {
        s->lost[LOST_RESHARD] += load;
        s->lost[LOST_RELAUNCH] += to_first - load > 0 ? to_first - load : 0;
    } else {
        count_startup(s);
        s->trained = 1;
    }
    if (w->reshard) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "from_tp", w->from_tp);
        cJSON_AddNumberToObject(e, "from_pp", w->from_pp);
        cJSON_AddNumberToObject(e, "to_tp", w->layout->tp);
        cJSON_AddNumberToObject(e, "to_pp", w->layout->pp);
        cJSON_AddNumberToObject(e, "seconds", w->load_seconds);
        cJSON_AddStringToObject(e, "how", "at load, by the trainer");
        emit(s, "reshard", e);
    }
    if (w->have_checkpoint) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "step", (double)w->first_step);
        cJSON_AddNumberToObject(e, "resumed_from", (double)w->resumed);
        cJSON_AddNumberToObject(e, "seconds_to_first_step", to_first);
        char layout[64];
        snprintf(layout, sizeof layout, "tp%d pp%d dp%d", w->layout->tp, w->layout->pp, w->layout->dp);
        cJSON_AddStringToObject(e, "layout", layout);
        emit(s, "resumed", e);
    }
}

static void on_log_line(void *ctx, const elastic_log_line *line)
{
    launch_watch *w = ctx;
    double now = now_seconds();
    switch (line->kind) {
    case ELASTIC_LOG_START:
        w->started = 1;
        w->load_seconds = line->seconds;
        w->last_progress = now;
        w->step_began = line->time;
        break;
    case ELASTIC_LOG_STEP: {
        /* How long the step took, by the trainer's clock: lines read
         * together after a pause of this process would look instant. That
         * clock is the wall's, which can be set forward: never more than
         * passed here between reading the two lines (last_progress: no
         * save_wait line came between them, or the step is not counted),
         * and a poll. A step that waited for a save is not a measure of a
         * step. */
        double took = line->time - w->step_began, passed = now - w->last_progress + w->s->o->poll_seconds;
        if (took > passed) took = passed;
        if (w->step_began > 0 && took > w->s->slowest_step && !w->save_wait) w->s->slowest_step = took;
        w->step_began = line->time;
        if (w->first_step < 0) {
            w->first_step = line->step;
            w->first_step_time = now;
            first_step_seen(w);
        } else {
            w->s->step_seconds_sum += now - w->last_progress;
            w->s->step_count++;
        }
        w->last_step = line->step;
        w->last_progress = now;
        w->save_wait = 0;
        if (line->step <= w->s->last_step) { /* computed before: recomputed, lost work */
            w->s->steps_recomputed++;
            w->s->lost[LOST_WORK] += w->s->step_count ? w->s->step_seconds_sum / (double)w->s->step_count : 0;
        }
        if (w->s->o->keep > 0 && now - w->s->last_prune >= 1.0) { /* --keep as the run goes, once a second */
            w->s->last_prune = now;
            prune_checkpoints(w->s);
        }
        if (line->step > w->s->last_step) w->s->last_step = line->step;
        if (w->s->o->progress)
            w->s->o->progress(w->s->o->ctx, line->step, w->s->o->steps, line->loss, w->layout, w->world,
                              w->s->restarts);
        break;
    }
    case ELASTIC_LOG_STOP:
        w->stop_line_finished = strcmp(line->reason, "finished") == 0;
        w->stop_line_diverged = strcmp(line->reason, "diverged") == 0;
        w->stop_line_in_use = strcmp(line->reason, "in_use") == 0;
        break;
    case ELASTIC_LOG_SAVE: /* committed by the trainer: intact, one of --keep's newest */
        note_intact(w->s, line->step);
        break;
    case ELASTIC_LOG_SAVE_WAIT: /* until its next step, the trainer has a save's allowance */
        w->save_wait = 1;
        w->last_progress = now;
        break;
    case ELASTIC_LOG_OTHER: break;
    }
}

static void pause_seconds(double seconds)
{
    struct timespec t = {(time_t)seconds, (long)((seconds - floor(seconds)) * 1e9)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR && !atomic_load(&stop_requested)) {
    }
}

/* The ranks a plan for `capacity` would use, or -1 when none fits. */
static int ranks_planned(run_state *s, const elastic_capacity *capacity, elastic_layout *chosen);

/* The trainer's command line for a layout: the user's arguments, then the
 * layout, the batch split, the checkpoint directory, --resume and the log. */
static int trainer_argv(run_state *s, const elastic_layout *l, char ***out)
{
    const elastic_run_options *o = s->o;
    int n = 0;
    while (o->train_argv[n]) n++;
    char **argv = calloc((size_t)n + 24, sizeof *argv);
    if (!argv) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int i = 0; i < n; i++) argv[k++] = strdup(o->train_argv[i]);
    char number[7][32];
    snprintf(number[0], 32, "%d", l->tp);
    snprintf(number[1], 32, "%d", l->pp);
    snprintf(number[2], 32, "%d", l->dp);
    snprintf(number[3], 32, "%lld", (long long)l->micro_batch);
    snprintf(number[4], 32, "%lld", (long long)l->global_batch);
    const char *extra[] = {"--tp", number[0], "--pp", number[1], "--dp", number[2], "--micro-batch", number[3],
                           "--global-batch", number[4], "--ckpt-dir", o->run_dir, "--resume", "--log", s->log_path};
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) argv[k++] = strdup(extra[i]);
    if (l->sequence_parallel) argv[k++] = strdup("--sequence-parallel"); /* the plan's choices (plan.h) */
    if (l->zero) {
        argv[k++] = strdup("--zero");
        argv[k++] = strdup(l->zero == 3 ? "3" : "1");
    }
    if (l->virtual_stages > 1) {
        char chunks[32];
        snprintf(chunks, sizeof chunks, "%d", l->virtual_stages);
        argv[k++] = strdup("--virtual-stages");
        argv[k++] = strdup(chunks);
    }
    for (int i = 0; i < k; i++)
        if (!argv[i]) {
            elastic_argv_free(argv);
            return tp_fail(TP_ERR_NOMEM, "out of memory");
        }
    *out = argv;
    return TP_OK;
}

/* Starts the launcher with the trainer's output in <dir>/launch-<n>.out. */
static int start_launch(run_state *s, const elastic_layout *l, const elastic_capacity *capacity, pid_t *pid,
                        char *output, size_t output_size)
{
    char **train = NULL, **argv = NULL, **env = NULL;
    TP_TRY(trainer_argv(s, l, &train));
    elastic_launch launch = {s->o->launcher, s->o->launcher_program, l->ranks, capacity, train, s->dir};
    int status = elastic_launch_argv(&launch, &argv);
    if (!status) status = elastic_launch_env(&launch, &env);
    elastic_argv_free(train);
    if (status) {
        elastic_argv_free(argv);
        return status;
    }
    snprintf(output, output_size, "%s/launch-%d.out", s->dir, s->launches + 1);
    int fd = -1;
    status = tp_open_regular_flags(output, O_WRONLY | O_CREAT | O_TRUNC, 0644, &fd); /* a FIFO would block */
    /* The child inherits stdout and stderr pointing at the file. */
    int saved_out = dup(1), saved_err = dup(2);
    if (!status) {
        dup2(fd, 1);
        dup2(fd, 2);
        status = elastic_spawn(argv, env, pid);
        dup2(saved_out, 1);
        dup2(saved_err, 2);
    }
    close(saved_out);
    close(saved_err);
    if (fd >= 0) close(fd);
    if (!status) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToObject(e, "layout", layout_json(l));
        cJSON_AddNumberToObject(e, "world", capacity->world);
        cJSON *nodes = cJSON_AddArrayToObject(e, "nodes");
        for (int i = 0; i < capacity->nodes; i++) cJSON_AddItemToArray(nodes, cJSON_CreateString(capacity->node_names[i]));
        cJSON *command = cJSON_AddArrayToObject(e, "command");
        for (char **a = argv; *a; a++) cJSON_AddItemToArray(command, cJSON_CreateString(*a));
        if (env[0]) {
            cJSON *settings = cJSON_AddArrayToObject(e, "environment");
            for (char **a = env; *a; a++) cJSON_AddItemToArray(settings, cJSON_CreateString(*a));
        }
        cJSON_AddStringToObject(e, "output", output);
        s->launches++;
        status = emit(s, "launch", e);
    }
    elastic_argv_free(argv);
    elastic_argv_free(env);
    return status;
}

/* Whether a line of output says something (not blank, not a launcher's
 * rule of dashes). */
static int says_something(const char *line, size_t length)
{
    for (size_t i = 0; i < length; i++)
        if (line[i] != '-' && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') return 1;
    return 0;
}

/* The trainer's last line of output that says something (its error, as a
 * rule its lines come before the launcher's own), for a one-line diagnosis:
 * the trainer's own last line ("tp-train: ...", its errors and usage
 * errors; not a warning), else the last line naming an error, else the last that says
 * something. The trainer's comes first: mpirun's banner that follows it
 * ("Exit code:    2") was quoted in its place. */
static void output_tail(const char *path, char *out, size_t size, int *no_space)
{
    char buffer[8192];
    out[0] = '\0';
    *no_space = 0;
    int fd = -1;
    if (tp_open_regular(path, &fd) != TP_OK) return; /* a FIFO would block */
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return;
    }
    fseek(f, 0, SEEK_END);
    long end = ftell(f), start = end > (long)sizeof buffer - 1 ? end - (long)sizeof buffer + 1 : 0;
    fseek(f, start, SEEK_SET);
    size_t n = fread(buffer, 1, sizeof buffer - 1, f);
    fclose(f);
    buffer[n] = '\0';
    *no_space = strstr(buffer, strerror(ENOSPC)) != NULL;
    const char *chosen = NULL, *error = NULL, *trainer = NULL;
    size_t chosen_length = 0, error_length = 0, trainer_length = 0;
    for (char *line = buffer; line < buffer + n;) {
        char *next = strchr(line, '\n');
        size_t length = next ? (size_t)(next - line) : strlen(line);
        if (says_something(line, length)) {
            chosen = line;
            chosen_length = length;
            if (memmem(line, length, "error", 5)) error = line, error_length = length;
            if (length > 9 && strncmp(line, "tp-train:", 9) == 0 && strncmp(line, "tp-train: warning:", 18) != 0)
                trainer = line, trainer_length = length;
        }
        line += length + 1;
    }
    if (error) chosen = error, chosen_length = error_length;
    if (trainer) chosen = trainer, chosen_length = trainer_length;
    if (!chosen) return;
    size_t length = chosen_length < size - 1 ? chosen_length : size - 1;
    memcpy(out, chosen, length);
    out[length] = '\0';
}

/* Whether a launch's output (its first 64 KiB) holds text: what a launcher
 * says before it starts any rank. The line that holds it goes to line (up
 * to size - 1 bytes) when line is not NULL. */
static int output_line(const char *path, const char *text, char *line, size_t size)
{
    char buffer[64 << 10];
    int fd = -1;
    if (tp_open_regular(path, &fd) != TP_OK) return 0; /* a FIFO would block */
    ssize_t n = read(fd, buffer, sizeof buffer - 1);
    close(fd);
    buffer[n > 0 ? n : 0] = '\0';
    const char *found = n > 0 ? memmem(buffer, (size_t)n, text, strlen(text)) : NULL;
    if (found && line) {
        const char *start = found;
        while (start > buffer && start[-1] != '\n') start--;
        size_t length = strcspn(start, "\r\n");
        if (length > size - 1) length = size - 1;
        memcpy(line, start, length);
        line[length] = '\0';
    }
    return found != NULL;
}

static int output_says(const char *path, const char *text)
{
    return output_line(path, text, NULL, 0);
}

/* Whether the device of path has (next to) nothing left: under 1 MiB free.
 * The trainer's output may not say so: it could not be written either. */
static int device_full(const char *path)
{
    struct statvfs v;
    return statvfs(path, &v) == 0 && (double)v.f_bavail * (double)v.f_frsize < 1024.0 * 1024.0;
}

static int capacity_changed(run_state *s, const elastic_layout *l, int *world_out)
{
    elastic_capacity now;
    if (elastic_capacity_read(&s->o->capacity, &now) != TP_OK) {
        /* Unreadable for now (a world file being rewritten, a typo): the
         * launch goes on at the capacity it has, and the error is an event
         * once, so that a mistake is not waited out in silence. */
        if (strncmp(s->capacity_error, tp_errmsg(), sizeof s->capacity_error - 1) != 0) {
            snprintf(s->capacity_error, sizeof s->capacity_error, "%s", tp_errmsg());
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "why", s->capacity_error);
            emit(s, "capacity_unreadable", e);
        }
        return 0;
    }
    s->capacity_error[0] = '\0';
    *world_out = now.world;
    elastic_layout next;
    int ranks = ranks_planned(s, &now, &next);
    /* grown: a plan would use more ranks; shrunk below what runs: stop
     * cleanly before the launcher notices */
    return (ranks > l->ranks) || now.world < l->ranks;
}

/* srun's step held pending: the allocation has no free CPUs for it yet
 * (another step of the job still ending, capacity shrinking). Slurm lists
 * it pending (elastic_slurm_step_pending, asked once a second inside an
 * allocation), and srun says so on its output ("srun: Job 77 step creation
 * temporarily disabled, retrying (Requested nodes are busy)", then "srun:
 * Step created for job 77" once Slurm gives it the CPUs), though only when
 * its first wait for the step ends (after SlurmctldTimeout, 120 s by
 * default). Until the step is created no trainer runs: a wait for
 * capacity, not a hang (it was ended as one at --start-timeout, its wait
 * counted as a hang's detection), bounded by --capacity-wait
 * (watch_launch); the start's allowance runs from the step's creation.
 * Said by a step_pending and a step_created event. */
static void follow_pending_step(run_state *s, launch_watch *w, pid_t pid, double now)
{
    if (w->step_created) return;
    int slurm_pending = -1; /* -1: not asked, or no answer */
    if (s->o->capacity.kind == ELASTIC_CAPACITY_SLURM && !w->started && now >= w->next_step_query) {
        w->next_step_query = now + 1;
        int pending = 0;
        char line[sizeof w->pending_line];
        if (elastic_slurm_step_pending(s->o->capacity.job_id, pid, &pending, line, sizeof line) == TP_OK) {
            slurm_pending = pending;
            if (pending && w->pending_since == 0) snprintf(w->pending_line, sizeof w->pending_line, "%s", line);
        }
    }
    if (w->pending_since == 0) {
        if (w->started) return;
        if (slurm_pending != 1 &&
            !output_line(w->output, "step creation temporarily disabled", w->pending_line, sizeof w->pending_line))
            return;
        w->pending_since = now;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "why", w->pending_line);
        cJSON_AddNumberToObject(e, "ranks", w->layout->ranks);
        cJSON_AddNumberToObject(e, "limit_seconds", s->o->capacity_wait_seconds);
        emit(s, "step_pending", e);
        return;
    }
    if (!w->started && slurm_pending != 0 && !output_says(w->output, "Step created for ")) return;
    w->step_created = 1;
    w->last_progress = now; /* the start's allowance from here: the load, a reshard */
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "pending_seconds", now - w->pending_since);
    emit(s, "step_created", e);
    w->pending_since = 0;
}

/* The scale_change event: from the launch's world to `world`, after its
 * last step; step_pending when the launch's step was still held pending. */
static void say_scale_change(run_state *s, const launch_watch *w, int world)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "from_world", w->world);
    cJSON_AddNumberToObject(e, "to_world", world);
    cJSON_AddNumberToObject(e, "step", (double)w->last_step);
    if (w->pending_since > 0) cJSON_AddBoolToObject(e, "step_pending", 1);
    emit(s, "scale_change", e);
}

/* Watches one launch until it ends; *status_out is the launcher's wait status. */
static launch_end watch_launch(run_state *s, pid_t pid, launch_watch *w, int *status_out, double *detection)
{
    const elastic_run_options *o = s->o;
    elastic_log_follower follower;
    struct stat st;
    elastic_log_follow(&follower, s->log_path, stat(s->log_path, &st) == 0 ? st.st_size : 0);
    w->launched = w->last_progress = now_seconds();
    int asked_stop = 0, asked_scale = 0;
    int64_t asked_at_step = -1; /* the last step logged when the trainer was asked to stop (stop or scale) */
    double stop_seen = 0; /* when a stop request came before the trainer started */
    double next_capacity_check = now_seconds() + 1;
    *detection = 0;
    for (;;) {
        pause_seconds(o->poll_seconds);
        elastic_log_read(&follower, on_log_line, w);
        int status = 0;
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid) {
            elastic_log_read(&follower, on_log_line, w);
            *status_out = status;
            if (asked_stop) return END_STOPPED;
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
                return asked_scale && !w->stop_line_finished ? END_SCALE : END_FINISHED;
            return END_FAILED;
        }
        double now = now_seconds();
        /* A second stop request (SIGINT, SIGTERM, SIGHUP again): whoever
         * asked will not wait for a checkpoint, nor for a trainer that is
         * hung; the launch is ended now (SIGTERM, SIGKILL after the grace).
         * Before, every request after the first was ignored. */
        if (atomic_load(&stop_requested) >= 2) {
            elastic_stop_group(pid, o->grace_seconds, status_out);
            return END_STOPPED;
        }
        if (atomic_load(&stop_requested) && !asked_stop) {
            /* The launcher forwards SIGUSR1: checkpoint and exit. Only once
             * the trainer has said it started: before its handler is set,
             * SIGUSR1 kills the ranks (srun's tasks died of it, or hung). A
             * trainer that does not start within the grace is stopped. */
            if (w->started) {
                asked_stop = 1;
                if (!asked_scale) asked_at_step = w->last_step;
                kill(pid, SIGUSR1);
            } else {
                if (stop_seen == 0) stop_seen = now;
                if (now - stop_seen > o->grace_seconds) {
                    elastic_stop_group(pid, o->grace_seconds, status_out);
                    return END_STOPPED;
                }
            }
        }
        /* A step Slurm holds pending is waited for as capacity is, up to
         * --capacity-wait; when the allocation changes meanwhile, it is
         * ended and the run re-planned (a scale change). No hang allowance
         * runs while it waits. */
        if (o->launcher == ELASTIC_LAUNCHER_SRUN) follow_pending_step(s, w, pid, now);
        if (w->pending_since > 0) {
            if (now - w->pending_since > o->capacity_wait_seconds) {
                elastic_stop_group(pid, o->grace_seconds, status_out);
                return END_PENDING;
            }
            if (now >= next_capacity_check) {
                next_capacity_check = now + 1;
                int world = 0;
                if (capacity_changed(s, w->layout, &world)) {
                    say_scale_change(s, w, world);
                    elastic_stop_group(pid, o->grace_seconds, status_out);
                    return END_SCALE;
                }
            }
            continue;
        }
        /* A hang: no progress within the allowance (the first step of a
         * launch loads and may reshard; a save may take long). Asked to
         * stop, the trainer finishes the step it is in, logs it, and only
         * then writes its checkpoint: a save's allowance from that step
         * line on, the step's until then. Given from the request itself, a
         * trainer hung in its step had --save-timeout (600 s) in place of
         * the heartbeat. */
        int saving = ((asked_stop || asked_scale) && w->last_step > asked_at_step) /* the stop's checkpoint */
                     || w->last_step >= o->steps /* the last checkpoint is written */
                     || w->save_wait;            /* the trainer waits for a checkpoint to be written */
        double allowance = elastic_hang_allowance(o,
                                                  saving              ? ELASTIC_SILENT_SAVE
                                                  : w->first_step < 0 ? ELASTIC_SILENT_START
                                                                      : ELASTIC_SILENT_STEP,
                                                  s->slowest_step);
        if (now - w->last_progress > allowance) {
            *detection = allowance;
            elastic_stop_group(pid, o->grace_seconds, status_out);
            return END_HUNG;
        }
        if (!asked_scale && !asked_stop && now >= next_capacity_check && w->first_step >= 0) {
            next_capacity_check = now + 1;
            int world = 0;
            if (capacity_changed(s, w->layout, &world)) {
                asked_scale = 1;
                /* The step the change came after: the log as it is now (a
                 * step logged between the read above and the capacity's
                 * change is one the run made before it; the event said the
                 * step before, and bench-elastic's node-down run, which
                 * downs a node once step 5 is logged, saw step 4). */
                elastic_log_read(&follower, on_log_line, w);
                say_scale_change(s, w, world);
                asked_at_step = w->last_step;
                kill(pid, SIGUSR1);
            }
        }
    }
}

static int ranks_planned(run_state *s, const elastic_capacity *capacity, elastic_layout *chosen)
{
    const elastic_run_options *o = s->o;
    elastic_plan_request request = {0};
    request.model = o->model;
    request.world = capacity->world;
    request.ranks_per_node = o->ranks_per_node;
    if (!request.ranks_per_node && capacity->nodes > 0) {
        request.ranks_per_node = capacity->node_ranks[0];
        for (int i = 1; i < capacity->nodes; i++)
            if (capacity->node_ranks[i] < request.ranks_per_node) request.ranks_per_node = capacity->node_ranks[i];
    }
    request.global_batch = o->global_batch;
    request.micro_batch = o->micro_batch;
    request.memory_per_rank = o->memory_per_rank;
    request.current_tp = s->tp;
    request.current_pp = s->pp;
    request.allow_batch_change = o->allow_batch_change;
    elastic_plan plan;
    if (capacity->world < 1 || elastic_plan_make(&request, &plan) != TP_OK) return -1;
    int ranks = -1;
    if (plan.chosen >= 0) {
        *chosen = plan.layouts[plan.chosen];
        ranks = chosen->ranks;
    }
    elastic_plan_free(&plan);
    return ranks;
}

/* ------------------------------------------------------------------ run */

/* Whether the checkpoint at path was said to be kept for its reader already
 * (it is then not said again at every pass); remembered when not, and
 * forgotten (forget) once it is removed: a relaunch may write that step
 * again, and that one's reader is news. */
static int kept_already(run_state *s, const char *path, int forget)
{
    for (int i = 0; i < s->kept_count; i++)
        if (strcmp(s->kept[i], path) == 0) {
            if (forget) {
                free(s->kept[i]);
                s->kept[i] = s->kept[--s->kept_count];
            }
            return 1;
        }
    if (forget) return 0;
    char *copy = strdup(path);
    char **grown = copy ? realloc(s->kept, (size_t)(s->kept_count + 1) * sizeof *grown) : NULL;
    if (!grown) { /* said again next time: no harm */
        free(copy);
        return 0;
    }
    s->kept = grown;
    s->kept[s->kept_count++] = copy;
    return 0;
}

/* Records that the checkpoint of `step` is intact (s->intact); said once. */
static void note_intact(run_state *s, int64_t step)
{
    for (int i = 0; i < s->intact_count; i++)
        if (s->intact[i] == step) return;
    int64_t *grown = realloc(s->intact, (size_t)(s->intact_count + 1) * sizeof *grown);
    if (!grown) return; /* not counted: --keep keeps one more, no harm */
    s->intact = grown;
    s->intact[s->intact_count++] = step;
}

static int is_intact(const run_state *s, int64_t step)
{
    for (int i = 0; i < s->intact_count; i++)
        if (s->intact[i] == step) return 1;
    return 0;
}

/* --keep K: removes committed checkpoints older than the K newest intact
 * ones (s->intact). A checkpoint that failed to verify is not one of them:
 * counted, it left the one resumed from, the only good one, to be removed
 * as the run went (a damaged step 20 kept as "the newest", step 15 removed,
 * and after the next failure nothing to resume from). So the one resumed
 * from stays until the trainer has committed a newer one, and a checkpoint
 * not known intact is never the reason another goes. Nothing is removed
 * without --keep. One that another process is reading (tp-reshard, an
 * export, an eval: it holds the checkpoint's read lock) is kept, and tried
 * again at the next pass: removed under it, the reader failed calling the
 * vanished files damaged. An event says so once per checkpoint. */
static void prune_checkpoints(run_state *s)
{
    const elastic_run_options *o = s->o;
    if (o->keep < 1) return;
    ckpt_candidate *list = NULL;
    int n = 0;
    if (ckpt_candidates(o->run_dir, &list, &n) != TP_OK) return;
    /* newest first, `latest` first of all: sort by step, newest first */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && list[j].step > list[j - 1].step; j--) {
            ckpt_candidate t = list[j];
            list[j] = list[j - 1];
            list[j - 1] = t;
        }
    /* the K-th newest intact one: everything older goes */
    int first_removed = n;
    for (int i = 0, counted = 0; i < n && first_removed == n; i++)
        if (list[i].step >= 0 && is_intact(s, list[i].step) && ++counted == o->keep) first_removed = i + 1;
    const store_ops *storage = NULL;
    for (int i = first_removed; i < n; i++) {
        if (list[i].step < 0) continue;
        if (!storage && store_for(list[i].path, &storage) != TP_OK) break;
        int removed = store_remove_unless_read(storage, list[i].path);
        if (removed == TP_ERR_EXISTS && kept_already(s, list[i].path, 0)) continue;
        if (removed == TP_OK) kept_already(s, list[i].path, 1);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "path", list[i].path);
        cJSON_AddNumberToObject(e, "keep", o->keep);
        if (removed == TP_ERR_EXISTS) {
            cJSON_AddStringToObject(e, "why", tp_errmsg());
            emit(s, "checkpoint_kept", e);
            continue;
        }
        if (removed) cJSON_AddStringToObject(e, "error", tp_errmsg());
        emit(s, "checkpoint_removed", e);
    }
    free(list);
}

static void on_rejected(void *ctx, const char *path, const char *why)
{
    run_state *s = ctx;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "path", path);
    cJSON_AddStringToObject(e, "why", why);
    emit(s, "checkpoint_rejected", e);
}

/* How a wait for capacity ended. */
enum { CAPACITY_READY, CAPACITY_GAVE_UP, CAPACITY_STOPPED };

/* Waits until the capacity reaches min_world (CAPACITY_READY), the wait's
 * limit (CAPACITY_GAVE_UP, why says so) or a stop request
 * (CAPACITY_STOPPED). */
static int wait_for_capacity(run_state *s, elastic_capacity *capacity, char *why, size_t why_size)
{
    const elastic_run_options *o = s->o;
    double start = now_seconds();
    int announced = 0;
    for (;;) {
        int status = elastic_capacity_read(&o->capacity, capacity);
        if (!status && capacity->world >= o->min_world) return CAPACITY_READY;
        if (!announced) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "world", status ? -1 : capacity->world);
            cJSON_AddNumberToObject(e, "min_world", o->min_world);
            if (status) cJSON_AddStringToObject(e, "why", tp_errmsg());
            emit(s, "waiting_for_capacity", e);
            announced = 1;
        }
        if (atomic_load(&stop_requested)) return CAPACITY_STOPPED;
        if (now_seconds() - start > o->capacity_wait_seconds) {
            snprintf(why, why_size, "capacity stayed below --min-world %d for %.0f s (%s)", o->min_world,
                     now_seconds() - start, status ? tp_errmsg() : "too few ranks");
            return CAPACITY_GAVE_UP;
        }
        pause_seconds(o->poll_seconds > 0.5 ? o->poll_seconds : 0.5);
    }
}

static void fill_summary(run_state *s, elastic_summary *out, int finished)
{
    count_startup(s);
    memset(out, 0, sizeof *out);
    out->finished = finished;
    out->trained = s->trained;
    out->step = s->last_step;
    out->launches = s->launches;
    out->restarts = s->restarts;
    out->scale_changes = s->scale_changes;
    out->steps_recomputed = s->steps_recomputed;
    out->wall_seconds = s->wall_before + now_seconds() - s->started;
    double lost = 0;
    for (int i = 0; i < ELASTIC_LOST_KINDS; i++) lost += out->lost_seconds[i] = s->lost[i];
    out->training_seconds = s->trained && out->wall_seconds - lost > 0 ? out->wall_seconds - lost : 0;
}

/* A stop asked for (SIGINT, SIGTERM, SIGHUP) while no trainer runs: the
 * run ends, with nothing lost. Returns 1 (the run is over). */
static int stopped_while_idle(run_state *s, elastic_summary *summary)
{
    fill_summary(s, summary, 0);
    snprintf(summary->reason, sizeof summary->reason, "stopped on request");
    return 1;
}

static int give_up(run_state *s, elastic_summary *summary, const char *why)
{
    fill_summary(s, summary, 0);
    snprintf(summary->reason, sizeof summary->reason, "%s", why);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "why", why);
    cJSON_AddNumberToObject(e, "step", (double)s->last_step);
    return emit(s, "give_up", e);
}

static void describe_exit(int status, char *out, size_t size)
{
    if (WIFEXITED(status)) snprintf(out, size, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status)) snprintf(out, size, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else snprintf(out, size, "wait status %d", status);
}

/* One round: plan, choose, launch, watch. Returns 1 when the run is over
 * (finished, gave up or stopped), 0 to go on. */
static int round_once(run_state *s, elastic_summary *summary, int *status_out)
{
    const elastic_run_options *o = s->o;
    char why[8192];
    elastic_capacity capacity;
    *status_out = TP_OK;
    double waiting = now_seconds();
    int waited = wait_for_capacity(s, &capacity, why, sizeof why);
    /* Once the run has trained, time waiting for capacity is time without
     * training, lost to relaunch: left out, it counted as training (an
     * ETTR of 93% for a run that had trained 83% of its wall time). Before
     * the first step it is startup's (count_startup). */
    if (s->trained) s->lost[LOST_RELAUNCH] += now_seconds() - waiting;
    if (waited == CAPACITY_STOPPED) return stopped_while_idle(s, summary);
    if (waited == CAPACITY_GAVE_UP) return *status_out = give_up(s, summary, why), 1;
    elastic_layout layout;
    if (ranks_planned(s, &capacity, &layout) < 0) {
        snprintf(why, sizeof why, "no valid layout for %d ranks (tp-elastic plan --world %d says why)", capacity.world,
                 capacity.world);
        return *status_out = give_up(s, summary, why), 1;
    }
    /* The checkpoint to resume from. */
    elastic_checkpoint chosen = {0};
    int64_t resumed = 0;
    int have_checkpoint = 0;
    double selecting = now_seconds();
    int status = elastic_choose_checkpoint(o->run_dir, o->verify_threads, on_rejected, s, &chosen);
    /* None committed: the run starts. Anything else (a store that could not
     * be read, or checkpoints none of which verifies) is not "no
     * checkpoint": launched, the trainer stops at the same failure, and the
     * launches were counted as a bug of the trainer's. */
    if (status == TP_ERR_CHECKSUM) {
        snprintf(why, sizeof why, "no checkpoint to resume from: %s (each one's damage is a checkpoint_rejected "
                 "event); the trainer's resume would refuse them too; restore an intact one, or give another "
                 "--ckpt-dir for a new run", tp_errmsg());
        return *status_out = give_up(s, summary, why), 1;
    }
    if (status && status != TP_ERR_NOT_FOUND) {
        snprintf(why, sizeof why, "cannot choose the checkpoint to resume from: %s", tp_errmsg());
        return *status_out = give_up(s, summary, why), 1;
    }
    s->intact_count = 0; /* what is intact now: the choice's verdict, then the trainer's saves */
    if (!status) {
        note_intact(s, chosen.step);
        have_checkpoint = 1;
        resumed = chosen.step;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "path", chosen.path);
        cJSON_AddNumberToObject(e, "step", (double)chosen.step);
        cJSON_AddNumberToObject(e, "seconds", chosen.seconds);
        emit(s, "checkpoint_chosen", e);
        /* Model flags other than the checkpoint's: the trainer refuses to
         * resume, and every relaunch would alike (it was launched
         * --repeat-limit times and called a bug). The caller's usage error,
         * in the trainer's words, before any launch. */
        if (chosen.has_model && gpt_config_check_same(chosen.path, &chosen.model, &o->model)) {
            snprintf(why, sizeof why, "%s", tp_errmsg());
            *status_out = give_up(s, summary, why);
            summary->usage_error = 1;
            return 1;
        }
        prune_checkpoints(s);
        if (chosen.step > s->last_step) s->last_step = chosen.step;
        if (chosen.step >= o->steps) {
            fill_summary(s, summary, 1);
            return emit(s, "finished", cJSON_CreateObject()), 1;
        }
    }
    if (s->trained) s->lost[LOST_SELECTION] += now_seconds() - selecting;
    int reshard = have_checkpoint && (chosen.tp != layout.tp || chosen.pp != layout.pp);
    s->tp = layout.tp;
    s->pp = layout.pp;
    pid_t pid = 0;
    char output[4400];
    double launched = now_seconds();
    if ((*status_out = start_launch(s, &layout, &capacity, &pid, output, sizeof output))) return 1;
    s->launch_pid = pid;
    if (elastic_process_start(pid, &s->launch_start) != TP_OK) s->launch_start = 0; /* gone already */
    /* Unrecorded, the launch could not be told from a stranger's process
     * by a restarted orchestrator: not run without its record. */
    if ((*status_out = save_state(s))) {
        elastic_stop_group(pid, o->grace_seconds, NULL);
        return 1;
    }
    launch_watch w = {.s = s, .layout = &layout, .world = capacity.world, .first_step = -1, .last_step = resumed,
                      .launched = launched, .last_progress = launched, .output = output,
                      .have_checkpoint = have_checkpoint,
                      .reshard = reshard, .resumed = resumed, .from_tp = chosen.tp, .from_pp = chosen.pp};
    int wait_status = 0;
    double detection = 0;
    launch_end end = watch_launch(s, pid, &w, &wait_status, &detection);
    /* Ranks of a launcher that ended (a rank failed) linger for seconds and
     * could still write in the run directory: none is left for the next. */
    elastic_end_leftovers(pid, o->grace_seconds);
    s->launch_pid = 0;
    s->launch_start = 0;
    char exit_text[128];
    describe_exit(wait_status, exit_text, sizeof exit_text);
    /* A launch that ended before its first step trained nothing: its time
     * (less a hang's allowance, detection's) is lost to relaunch, as a wait
     * below --min-world is, once the run has trained (before, startup
     * holds it): a step Slurm held pending until it ended, a launcher that
     * failed, a trainer that died loading. A launch that stepped counts its
     * time to the first step there (first_step_seen). Before, only a
     * pending one was counted: the load of a relaunch that then failed
     * counted as training. */
    if (w.first_step < 0 && s->trained && now_seconds() - w.launched > detection)
        s->lost[LOST_RELAUNCH] += now_seconds() - w.launched - detection;
    if (end == END_FINISHED && w.last_step >= o->steps) {
        prune_checkpoints(s);
        fill_summary(s, summary, 1);
        if ((*status_out = save_state(s))) return 1;
        return emit(s, "finished", cJSON_CreateObject()), 1;
    }
    if (end == END_STOPPED) {
        fill_summary(s, summary, 0);
        snprintf(summary->reason, sizeof summary->reason, "stopped on request at step %lld", (long long)w.last_step);
        if ((*status_out = save_state(s))) return 1;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "step", (double)w.last_step);
        return emit(s, "stopped", e), 1;
    }
    if (end == END_PENDING) {
        snprintf(why, sizeof why,
                 "srun's job step stayed pending for the %.0f s of --capacity-wait: Slurm had no free CPUs in the "
                 "allocation for its %d ranks (%s; scontrol show step JOB shows the job's steps that hold "
                 "them); the trainer never ran (%s)",
                 o->capacity_wait_seconds, layout.ranks, w.pending_line, output);
        return *status_out = give_up(s, summary, why), 1;
    }
    if (end == END_SCALE) {
        s->scale_changes++;
        return (*status_out = save_state(s)) != TP_OK;
    }
    /* A failure: a rank or node lost (the launcher's exit), or a hang. */
    double failed_at = now_seconds();
    s->lost[LOST_DETECTION] += detection;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "kind", end == END_HUNG ? "hang" : "exit");
    cJSON_AddStringToObject(e, "status", exit_text);
    cJSON_AddNumberToObject(e, "step", (double)w.last_step);
    if (end == END_HUNG) { /* silent for this long; the slowest step is why when it is over the heartbeat */
        cJSON_AddNumberToObject(e, "allowance_seconds", detection);
        cJSON_AddNumberToObject(e, "slowest_step_seconds", s->slowest_step);
    }
    cJSON_AddStringToObject(e, "output", output);
    emit(s, end == END_HUNG ? "hang" : "failure", e);
    int progressed = w.last_step > s->last_failure_step;
    s->repeats = progressed ? 1 : s->repeats + 1;
    s->last_failure_step = w.last_step;
    s->restarts++;
    if ((*status_out = save_state(s))) return 1;
    /* A stop line that says a relaunch would fail alike: another live run
     * took the run directory since this run started (the check before the
     * first launch: every relaunch would be refused, and its checkpoints,
     * chosen next, are not this run's progress); or the trainer diverged
     * (from the same checkpoint it would again at the same step). Given up
     * at once, quoting the trainer's error. */
    char diverged[160];
    snprintf(diverged, sizeof diverged, "the trainer diverged at step %lld (its gradient norm not finite), which a "
             "relaunch from the same checkpoint would repeat", (long long)w.last_step);
    const char *final = end != END_FAILED      ? NULL
                        : w.stop_line_in_use   ? "the trainer was refused the run directory, which another live run "
                                                 "holds; nothing is launched beside it, and its checkpoints are not "
                                                 "this run's"
                        : w.stop_line_diverged ? diverged
                                               : NULL;
    /* Exit status 2 is tp-train's usage error (a value it refuses: --lr
     * abc): on this orchestrator's first launch, before the trainer said it
     * started, it is the arguments given, which every relaunch would repeat
     * (it was relaunched --repeat-limit times, then called a bug, quoting
     * mpirun's banner). Not relaunched; the caller's usage error. */
    if (end == END_FAILED && !final && !w.started && s->launches == s->launches_before + 1 &&
        WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 2) {
        char tail[600];
        int no_space = 0;
        output_tail(output, tail, sizeof tail, &no_space);
        snprintf(why, sizeof why, "the trainer refused its arguments (exit status 2 on the first launch, before it "
                 "started; not relaunched): %s (%s)", tail[0] ? tail : "it said nothing", output);
        *status_out = give_up(s, summary, why);
        summary->usage_error = 1;
        return 1;
    }
    /* Open MPI's mpirun refuses to start as root unless told, and no
     * launcher starts a program it cannot find: every relaunch would fail
     * alike (it was relaunched --repeat-limit times, then called a bug of
     * the trainer's, quoting the banner's last line). */
    if (end == END_FAILED && !final && output_says(output, "mpirun has detected an attempt to run as root")) {
        snprintf(why, sizeof why, "mpirun refuses to run as root (%s): run tp-elastic as another user, or set "
                 "OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 to let it", output);
        return *status_out = give_up(s, summary, why), 1;
    }
    if (end == END_FAILED && !final && !w.started &&
        (output_says(output, "was unable to find the specified executable") /* a name not on PATH */ ||
         output_says(output, "or execute an executable") /* a path: missing, or not executable */ ||
         output_says(output, "execve(): ") /* srun's slurmstepd */)) {
        snprintf(why, sizeof why, "the launcher could not start the trainer's program %s (%s): give its path "
                 "(build/bin/tp-train) after --, or put its directory on PATH", o->train_argv[0], output);
        return *status_out = give_up(s, summary, why), 1;
    }
    if (final) {
        char tail[600];
        int no_space = 0;
        output_tail(output, tail, sizeof tail, &no_space);
        snprintf(why, sizeof why, "%s; the trainer's error (%s): %s", final, output, tail);
        return *status_out = give_up(s, summary, why), 1;
    }
    if (s->repeats >= o->repeat_limit) {
        char tail[600];
        int no_space = 0;
        output_tail(output, tail, sizeof tail, &no_space);
        /* Failing at one step again and again is a bug, unless the disk is
         * full: then it is that, and freeing space is the cure. */
        const char *full = device_full(s->dir) ? s->dir : NULL;
        if (!ckpt_is_remote(o->run_dir) && device_full(o->run_dir)) full = o->run_dir;
        /* srun whose step Slurm held pending (the allocation's CPUs or
         * nodes taken by another step) never started the trainer: ended at
         * --start-timeout, it says "Cancelled pending job step", then
         * "Unable to create step ...: Job/step already completing or
         * completed", which was quoted as the trainer's bug. */
        int pending = !w.started && output_says(output, "Cancelled pending job step");
        if (pending)
            snprintf(why, sizeof why,
                     "srun's job step never started, %d times in a row (%s): Slurm held it pending for the %.0f s "
                     "of --start-timeout, the allocation's CPUs or nodes taken by another step of the job (squeue -s "
                     "shows them); the trainer never ran (%s)",
                     s->repeats, exit_text, o->start_seconds, output);
        else if (full || no_space)
            snprintf(why, sizeof why,
                     "the trainer failed %d times in a row at step %lld without progress (%s): no space left on the "
                     "device of %.1000s; free space there and run tp-elastic again; the last line of its output (%.1000s): %s",
                     s->repeats, (long long)w.last_step, exit_text, full ? full : o->run_dir, output, tail);
        else
            snprintf(why, sizeof why,
                     "the trainer failed %d times in a row at step %lld without progress (%s): a bug, not a fault; "
                     "the last line of its output (%s): %s",
                     s->repeats, (long long)w.last_step, exit_text, output, tail);
        return *status_out = give_up(s, summary, why), 1;
    }
    if (s->restarts - s->restarts_before > o->max_restarts) {
        snprintf(why, sizeof why, "%d restarts used up (--max-restarts %d); the last failure: %s at step %lld",
                 s->restarts - s->restarts_before - 1, o->max_restarts, exit_text, (long long)w.last_step);
        return *status_out = give_up(s, summary, why), 1;
    }
    double backoff = o->backoff_seconds * pow(2, s->repeats - 1);
    pause_seconds(backoff < 60 ? backoff : 60);
    s->lost[LOST_RELAUNCH] += now_seconds() - failed_at;
    return atomic_load(&stop_requested) ? stopped_while_idle(s, summary) : 0;
}

int elastic_run(const elastic_run_options *o, elastic_summary *summary)
{
    memset(summary, 0, sizeof *summary);
    if (!o->run_dir || !o->train_argv || !o->train_argv[0] || o->global_batch < 1 || o->steps < 1)
        return tp_fail(TP_ERR_ARG, "elastic_run needs a run directory, a trainer command, a global batch and steps");
    run_state s;
    int status = open_state(&s, o);
    if (status) {
        if (s.events) fclose(s.events);
        if (s.lock) store_posix()->close(s.lock);
        return status;
    }
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "pid", getpid());
    cJSON_AddNumberToObject(e, "earlier_launches", s.launches);
    cJSON_AddNumberToObject(e, "steps", (double)o->steps);
    cJSON_AddNumberToObject(e, "global_batch", (double)o->global_batch);
    /* Where the model came from, on the first line: a run resumed without
     * model flags would otherwise not say which model it plans for. */
    cJSON_AddStringToObject(e, "model_from", o->model_from ? o->model_from : "arguments");
    status = emit(&s, "orchestrator_start", e);
    if (!status) status = end_earlier_launch(&s);
    /* A run directory another live run holds (a tp-train started by hand:
     * its claim, ckpt_run_claim_take) is refused before any launch: each
     * launch would be refused by it, and its checkpoints then taken for this
     * run's progress (its last step for this run finished). After the
     * earlier launch of this run, which held it, ended. */
    int claimed = status ? TP_OK : ckpt_run_claim_free(o->run_dir);
    if (claimed) status = tp_fail_context(claimed, "refusing to launch the trainer");
    while (!status && !round_once(&s, summary, &status)) {
    }
    if (!status) {
        cJSON *sum = cJSON_CreateObject();
        cJSON_AddBoolToObject(sum, "finished", summary->finished);
        cJSON_AddBoolToObject(sum, "trained", summary->trained);
        cJSON_AddNumberToObject(sum, "step", (double)summary->step);
        cJSON_AddNumberToObject(sum, "launches", summary->launches);
        cJSON_AddNumberToObject(sum, "restarts", summary->restarts);
        cJSON_AddNumberToObject(sum, "scale_changes", summary->scale_changes);
        cJSON_AddNumberToObject(sum, "steps_recomputed", (double)summary->steps_recomputed);
        cJSON_AddNumberToObject(sum, "wall_seconds", summary->wall_seconds);
        cJSON_AddNumberToObject(sum, "training_seconds", summary->training_seconds);
        cJSON_AddNumberToObject(sum, "ettr", summary->wall_seconds > 0 ? summary->training_seconds / summary->wall_seconds : 0);
        cJSON *lost = cJSON_AddObjectToObject(sum, "lost_seconds");
        for (int i = 0; i < ELASTIC_LOST_KINDS; i++) cJSON_AddNumberToObject(lost, elastic_lost_names[i], summary->lost_seconds[i]);
        if (summary->reason[0]) cJSON_AddStringToObject(sum, "reason", summary->reason);
        status = emit(&s, "summary", sum);
        if (!status) status = save_state(&s);
    }
    fclose(s.events);
    store_posix()->close(s.lock); /* the next orchestrator may start */
    for (int i = 0; i < s.kept_count; i++) free(s.kept[i]);
    free(s.kept);
    free(s.intact);
    return status;
}
