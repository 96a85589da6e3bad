/* runclaim.c: one live writer per run directory (docs/FORMAT.md "Run
 * directories"). Two trainers on one directory would each replace the
 * other's step_N, so the second is refused at start, naming the first.
 *
 * Local: an flock on run_dir/.tp-run.lock, held for the run's life by an
 * open file: the kernel releases it when the process ends, however it ends,
 * so a held lock proves a live holder and a free one a dead (or finished)
 * one. The file names its holder for the refusal's message.
 *
 * An object store has no locks: the claim is a lease object,
 * run_dir/.tp-run.lease, naming its holder and renewed by a thread of the
 * holder every period/4 seconds (a counter, so that no two machines' clocks
 * are compared). A lease found there is live while it changes; it is taken
 * over only when provably dead: its holder is a process of this machine
 * that no longer exists, or it stayed unchanged for a whole period (its
 * holder's, as the lease records it in period_seconds, when longer than the
 * watcher's own). A lease is written, then read back after a pause, so
 * that of two trainers starting at once the one whose lease was overwritten
 * sees it and gives way. The writers of a step beside no run (who share a
 * local lock) hold a lease each, run_dir/.tp-run.writers/OWNER, which a
 * trainer starting lists (share_remote, check_writer_leases). The run's
 * local cache directory is locked as a local run directory too. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/clock.h"
#include "../common/file.h"
#include "../common/parse.h"
#include "internal.h"
#include "lease.h"

#define LOCK_NAME ".tp-run.lock"
#define LEASE_NAME ".tp-run.lease"
/* A writer's lease: WRITERS_DIR/OWNER, one object a writer (listed by its
 * own path: WebDAV servers leave a run directory's dot files out of its
 * listing). */
#define WRITERS_DIR ".tp-run.writers"
#define WRITERS_MAX 1024 /* leases a trainer reads there at start (a listing is untrusted) */
#define HOLDER_MAX CKPT_LEASE_HOLDER_MAX
#define LEASE_DEFAULT_SECONDS 30
#define LEASE_MIN_SECONDS 2
#define LEASE_MAX_SECONDS 3600
/* How long a lease's holder running on this machine is watched before it
 * is refused: a process that is ending (its launch torn down) is gone
 * within it; a live run's stays. */
#define RUNNING_GRACE_SECONDS 1.0
/* How long a local lock's holder that is ending (lock_past_ending_holder)
 * is waited for: the kernel's freeing of a process's memory, seconds at
 * the most. */
#define ENDING_WAIT_SECONDS 10.0

struct ckpt_run_claim {
    store_file *lock;               /* the local lock (the run directory, or a remote one's cache) */
    char lease_url[CKPT_PATH_MAX]; /* a remote run directory's lease; "" for a local one */
    char owner[STORE_OWNER_MAX];    /* this claim's identity inside the lease */
    char holder[HOLDER_MAX];       /* this claim as others are told of it */
    ckpt_lease_renewer renewer;    /* lost: the lease was taken by another holder, named in lost_why */
    int64_t renewals;              /* the renewer's thread's */
};

/* ------------------------------------------------------------------ local */

/* The refusal of a directory whose lock (at path, open as fd, which is
 * closed) is held: its holder, as the holder wrote itself there. */
static int refuse_local(const char *dir, const char *path, int fd)
{
    char seen[HOLDER_MAX] = "";
    ssize_t n = pread(fd, seen, sizeof seen - 1, 0);
    seen[n > 0 ? n : 0] = '\0';
    seen[strcspn(seen, "\n")] = '\0';
    close(fd);
    return tp_fail(TP_ERR_EXISTS, "%s is in use by %s: one run per directory (its lock %s is held)", dir,
                   seen[0] ? seen : "another process", path);
}

/* Whether the holder a held lock's file names (open as fd: "tp-train (pid
 * 41 on host n1, since ...)") is a process of this machine that is ending. */
static int holder_ending(int fd)
{
    char seen[HOLDER_MAX] = "", host[64];
    ssize_t n = pread(fd, seen, sizeof seen - 1, 0);
    seen[n > 0 ? n : 0] = '\0';
    const char *at = strstr(seen, " (pid ");
    long pid = 0;
    return at && sscanf(at, " (pid %ld on host %63[^,]", &pid, host) == 2 && store_process_ending(host, pid);
}

/* The lock at path (its file open as fd), with flags. A holder that is
 * ending (killed: a rank of a launch tp-elastic tore down, which relaunches
 * or takes the run over at once) holds it until the kernel has freed its
 * memory and closed its files: waited for, up to ENDING_WAIT_SECONDS,
 * rather than refused as a live run (the takeover of a run under the
 * sanitizers was refused by a rank in its exit). */
static int lock_past_ending_holder(const char *path, int fd, int flags, store_file **out)
{
    const store_ops *posix = store_posix();
    double start = now_seconds();
    for (;;) {
        int status = posix->lock(posix, path, flags, out);
        if (status != TP_ERR_EXISTS || now_seconds() - start > ENDING_WAIT_SECONDS || !holder_ending(fd)) return status;
        sleep_seconds(0.02);
    }
}

/* The lock on dir's claim, exclusive (a run's) or with STORE_LOCK_SHARED
 * (the writers beside no run: they share it), the holder written in it. */
static int lock_local(const char *dir, const char *holder, int flags, store_file **out)
{
    const store_ops *posix = store_posix();
    char path[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(path, dir, LOCK_NAME));
    int fd = -1; /* a FIFO or a link put there is refused, never waited on or followed */
    TP_TRY(tp_open_regular_flags(path, O_RDWR | O_CREAT | O_NOFOLLOW, 0644, &fd));
    int status = lock_past_ending_holder(path, fd, flags, out);
    if (status == TP_ERR_EXISTS) return refuse_local(dir, path, fd);
    if (status == TP_OK) {
        size_t length = strlen(holder);
        if (ftruncate(fd, 0) != 0 || pwrite(fd, holder, length, 0) != (ssize_t)length ||
            pwrite(fd, "\n", 1, (off_t)length) != 1)
            status = tp_fail(TP_ERR_IO, "%s: cannot write the lock's holder: %s", path, strerror(errno));
    }
    close(fd);
    if (status && *out) {
        posix->close(*out);
        *out = NULL;
    }
    return status;
}

/* ------------------------------------------------------------------ lease */

typedef struct {
    char owner[STORE_OWNER_MAX];
    char holder[HOLDER_MAX];
    char host[64];
    long pid;
    int64_t renewals;
    double period; /* its holder's period_seconds (renewed every quarter of it); 0: not said */
} lease;

int ckpt_read_json_if_present(const char *path, int64_t max_bytes, int *found, cJSON **out)
{
    *found = 0;
    *out = NULL;
    char *text = NULL;
    int64_t size = 0;
    int status = store_read_text_file(path, max_bytes, &text, &size);
    if (status == TP_ERR_NOT_FOUND) return TP_OK;
    TP_TRY(status);
    status = tp_json_parse(text, (size_t)size, path, out);
    free(text);
    *found = status == TP_OK;
    return status;
}

/* Reads the lease once: TP_OK with *found 0 when there is none. A lease
 * that cannot be parsed is an error naming it: it is never taken as free. */
static int read_lease_once(const char *url, int *found, void *record)
{
    lease *out = record;
    memset(out, 0, sizeof *out);
    *found = 0;
    cJSON *json = NULL;
    int present;
    TP_TRY(ckpt_read_json_if_present(url, 64 << 10, &present, &json));
    if (!present) return TP_OK;
    const cJSON *owner = cJSON_GetObjectItemCaseSensitive(json, "owner");
    const cJSON *holder = cJSON_GetObjectItemCaseSensitive(json, "holder");
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(json, "host");
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(json, "pid");
    const cJSON *renewals = cJSON_GetObjectItemCaseSensitive(json, "renewals");
    if (!cJSON_IsString(owner) || !cJSON_IsString(holder) || !cJSON_IsString(host) || !cJSON_IsNumber(pid) ||
        !cJSON_IsNumber(renewals) || pid->valuedouble < 1 || pid->valuedouble > 4194304 ||
        renewals->valuedouble < 0 || renewals->valuedouble > 1e15) {
        cJSON_Delete(json);
        return tp_fail(TP_ERR_FORMAT, "%s: not a run lease (owner, holder, host, pid 1..4194304, renewals "
                       ">= 0 expected); remove it by hand if no run uses this directory", url);
    }
    snprintf(out->owner, sizeof out->owner, "%s", owner->valuestring);
    snprintf(out->holder, sizeof out->holder, "%s", holder->valuestring);
    snprintf(out->host, sizeof out->host, "%s", host->valuestring);
    out->pid = (long)pid->valuedouble;
    out->renewals = (int64_t)renewals->valuedouble;
    /* Written by every holder since the lease had one; a number out of
     * range is taken as not said (the watcher's own period then). */
    const cJSON *period = cJSON_GetObjectItemCaseSensitive(json, "period_seconds");
    if (cJSON_IsNumber(period) && period->valuedouble >= LEASE_MIN_SECONDS && period->valuedouble <= LEASE_MAX_SECONDS)
        out->period = period->valuedouble;
    cJSON_Delete(json);
    *found = 1;
    return TP_OK;
}

/* Reads the lease, which its holder may be rewriting (renewals; a writer's
 * share): read again while torn (ckpt_lease_read_settled). */
static int read_lease(const char *url, int *found, lease *out)
{
    return ckpt_lease_read_settled(read_lease_once, url, found, out);
}

static int write_lease(const ckpt_run_claim *claim, int64_t renewals)
{
    char host[64], text[HOLDER_MAX + STORE_OWNER_MAX + 256];
    store_host_name(host, sizeof host);
    cJSON *json = cJSON_CreateObject();
    if (!json) return tp_fail(TP_ERR_NOMEM, "out of memory for a lease");
    cJSON_AddStringToObject(json, "owner", claim->owner);
    cJSON_AddStringToObject(json, "holder", claim->holder);
    cJSON_AddStringToObject(json, "host", host);
    cJSON_AddNumberToObject(json, "pid", (double)getpid());
    cJSON_AddNumberToObject(json, "renewals", (double)renewals);
    cJSON_AddNumberToObject(json, "period_seconds", claim->renewer.period);
    int fits = cJSON_PrintPreallocated(json, text, sizeof text, 0);
    cJSON_Delete(json);
    if (!fits) return tp_fail(TP_ERR_ARG, "%s: lease text too long", claim->lease_url);
    return store_put_data(claim->lease_url, text, strlen(text));
}

/* Whether a lease's holder is provably gone: a process of this machine
 * that no longer exists. */
static int holder_gone(const lease *l)
{
    return store_process_gone(l->host, l->pid);
}

/* The seconds a lease found there lives without renewal: its holder's
 * period where it says one (the holder renews every quarter of it, however
 * this process's TP_RUN_LEASE_SECONDS is set), never less than this
 * claim's own. */
static double lease_lifetime(const ckpt_run_claim *claim, const lease *l)
{
    return l->period > claim->renewer.period ? l->period : claim->renewer.period;
}

/* Whether a lease's holder is provably alive: a process of this machine
 * that runs the program its holder names ("tp-train (pid 41 on host n1,
 * since ...)"). Only this machine's processes can be asked; a holder
 * elsewhere is alive only while it renews. */
static int holder_running_here(const lease *l)
{
    char program[64];
    const char *end = strstr(l->holder, " (pid ");
    if (!end || end == l->holder || (size_t)(end - l->holder) >= sizeof program) return 0;
    memcpy(program, l->holder, (size_t)(end - l->holder));
    program[end - l->holder] = '\0';
    return store_process_running(l->host, l->pid, program);
}

/* The refusal of a live lease at url: a run's, or a writer's (a
 * checkpoint being written into the run directory beside no run); running
 * here: its holder is a live process of this machine (holder_running_here),
 * else it was seen renewed. */
static int refuse(const ckpt_run_claim *claim, const char *run_dir, const char *url, const lease *l, int running_here)
{
    int writer = strstr(url, "/" WRITERS_DIR "/") != NULL;
    if (running_here)
        return tp_fail(TP_ERR_EXISTS, "%s is in use by %s%s: one run per directory (its lease %s names process %ld "
                       "of this machine, which is running)", run_dir, l->holder,
                       writer ? ", writing a checkpoint into it" : "", url, l->pid);
    return tp_fail(TP_ERR_EXISTS, "%s is in use by %s%s: one run per directory (its lease %s is renewed; a "
                   "crashed %s's lease lapses %.0f s after its last renewal)", run_dir, l->holder,
                   writer ? ", writing a checkpoint into it" : "", url, writer ? "writer" : "run",
                   lease_lifetime(claim, l));
}

/* Waits until a lease found there proves dead (its holder gone, or no
 * renewal for a whole period of its holder's) or alive (renewed:
 * refused). Watched for this claim's own period only, a holder of a
 * longer one (renewing every quarter of it) was taken for dead between
 * two renewals. */
static int wait_for_lease(ckpt_run_claim *claim, const char *run_dir, const char *url, const lease *found)
{
    double start = now_seconds(), lifetime = lease_lifetime(claim, found);
    lease seen = *found;
    int announced = 0;
    for (;;) {
        if (holder_gone(&seen)) return TP_OK;
        /* A holder running on this machine is refused at once rather than
         * watched for renewals (up to 30 s beside a live trainer here), but
         * for a moment's grace: one whose launch is being torn down (a rank
         * died, tp-elastic relaunches at once) is still exiting, and goes.
         * Its end is asked of this machine, not of the store: ten reads a
         * second of a lease its holder rewrites in place (as s3rver writes
         * objects) met the store's 500s, and their retries' warnings. The
         * lease is read once more when the grace is over: released
         * meanwhile, it is taken. */
        if (holder_running_here(&seen)) {
            if (now_seconds() - start < RUNNING_GRACE_SECONDS) {
                sleep_seconds(RUNNING_GRACE_SECONDS / 10);
                continue;
            }
            int present = 0;
            lease now;
            TP_TRY(read_lease(url, &present, &now));
            if (!present) return TP_OK; /* released */
            return refuse(claim, run_dir, url, &now, holder_running_here(&now));
        }
        if (now_seconds() - start > lifetime) return TP_OK; /* no renewal for a period */
        /* A live run's renewal comes within a quarter of its period; a
         * wait longer than a moment (up to a period: 30 s by default) is
         * said, not spent in silence. */
        if (!announced && now_seconds() - start >= 2) {
            char text[CKPT_PATH_MAX + HOLDER_MAX + 160];
            snprintf(text, sizeof text, "%s names %s: watching it for up to %.0f s to see whether it is renewed (a "
                     "live holder) or has lapsed", url, seen.holder, lifetime);
            store_notify(text);
            announced = 1;
        }
        sleep_seconds(claim->renewer.period / 8); /* a renewal seen soon, however long the lifetime */
        int present = 0;
        lease now;
        TP_TRY(read_lease(url, &present, &now));
        if (!present) return TP_OK; /* released */
        if (strcmp(now.owner, seen.owner) != 0 || now.renewals != seen.renewals) return refuse(claim, run_dir, url, &now, holder_running_here(&now));
    }
}

/* Every quarter period (ckpt_lease_renewer). A lease overwritten by
 * another holder is lost, not retaken: that holder believes it owns the
 * directory now. A store that fails to answer is tried again at the next
 * renewal. */
static void renew(void *ctx, ckpt_lease_renewer *renewer)
{
    ckpt_run_claim *claim = ctx;
    int present = 0;
    lease now;
    int status = read_lease(claim->lease_url, &present, &now);
    if (!status && present && strcmp(now.owner, claim->owner) != 0) ckpt_lease_set_lost(renewer, now.holder);
    else if (!status) write_lease(claim, ++claim->renewals);
}

static int collect_writer_lease(void *ctx, const char *name)
{
    ckpt_name_list *l = ctx;
    if (l->count == WRITERS_MAX)
        return tp_fail(TP_ERR_FORMAT, "%s: more than %d writers' leases in %s/: remove the stale ones by hand",
                       name, WRITERS_MAX, WRITERS_DIR);
    return ckpt_append_name(l, name);
}

/* A run starting refuses a live writer's lease there, as a local run's
 * exclusive lock refuses a writer's shared one: each found is watched
 * until it proves dead (then removed, so that no later run waits for it
 * again) or alive. */
static int check_writer_leases(ckpt_run_claim *claim, const char *run_dir)
{
    const store_ops *store;
    char writers[CKPT_PATH_MAX];
    TP_TRY(store_for(run_dir, &store));
    TP_TRY(tp_path_join(writers, run_dir, WRITERS_DIR));
    ckpt_name_list found = {0};
    int status = store->list(store, writers, collect_writer_lease, &found);
    if (status == TP_ERR_NOT_FOUND) status = TP_OK; /* no writer ever wrote there */
    for (int i = 0; i < found.count && !status; i++) {
        char url[CKPT_PATH_MAX];
        int present = 0;
        lease l;
        status = tp_path_join(url, writers, found.names[i]);
        if (!status) status = read_lease(url, &present, &l);
        if (!status && present) status = wait_for_lease(claim, run_dir, url, &l);
        if (!status && present) store_delete(url); /* proved dead */
    }
    free(found.names);
    return status;
}

static int take_lease(ckpt_run_claim *claim, const char *run_dir)
{
    TP_TRY(tp_path_join(claim->lease_url, run_dir, LEASE_NAME));
    int present = 0;
    lease found;
    int status = read_lease(claim->lease_url, &present, &found);
    if (!status && present) status = wait_for_lease(claim, run_dir, claim->lease_url, &found);
    if (!status) status = write_lease(claim, 0);
    if (status) {
        /* Refused, or the store failed before this claim wrote a lease: the
         * one there is another's (a live run's), never removed by this one
         * on its way out (a refused trainer deleted the live run's lease,
         * and a third took it over and ended that run). */
        claim->lease_url[0] = '\0';
        return status;
    }
    /* Of two writers at once, the later lease stands: each reads back after
     * a pause longer than a PUT takes, and the overwritten one gives way. */
    sleep_seconds(claim->renewer.period / 8 < 1 ? claim->renewer.period / 8 : 1);
    TP_TRY(read_lease(claim->lease_url, &present, &found));
    if (!present || strcmp(found.owner, claim->owner) != 0) {
        char url[CKPT_PATH_MAX];
        snprintf(url, sizeof url, "%s", claim->lease_url);
        claim->lease_url[0] = '\0'; /* not ours: never removed by us */
        if (!present) return tp_fail(TP_ERR_IO, "%s: the lease written there vanished", run_dir);
        return refuse(claim, run_dir, url, &found, 0);
    }
    /* Once this run's lease stands, renewed (a writer's lease is watched
     * for up to a period): a writer starting now sees it (the writer looks
     * again after writing its own), one before is seen here. */
    status = ckpt_lease_renewer_start(&claim->renewer, claim->lease_url);
    if (!status) status = check_writer_leases(claim, run_dir);
    if (status) {
        char message[1024]; /* the removal's own failure would replace it */
        snprintf(message, sizeof message, "%s", tp_errmsg());
        ckpt_lease_renewer_stop(&claim->renewer);
        store_delete(claim->lease_url);
        claim->lease_url[0] = '\0';
        return tp_fail(status, "%s", message);
    }
    return TP_OK;
}

int ckpt_run_claim_take(const char *run_dir, const char *local_dir, const char *program, ckpt_run_claim **out)
{
    *out = NULL;
    ckpt_run_claim *claim = calloc(1, sizeof *claim);
    if (!claim) return tp_fail(TP_ERR_NOMEM, "out of memory for a run directory's claim");
    double period;
    int status = ckpt_lease_period("TP_RUN_LEASE_SECONDS", LEASE_DEFAULT_SECONDS, LEASE_MIN_SECONDS, LEASE_MAX_SECONDS,
                                   &period);
    ckpt_lease_renewer_init(&claim->renewer, period, renew, claim);
    ckpt_lease_describe_holder(program, claim->holder, sizeof claim->holder);
    if (!status) status = store_staging_owner(claim->owner, sizeof claim->owner);
    if (!status) status = lock_local(local_dir ? local_dir : run_dir, claim->holder, 0, &claim->lock);
    if (!status && store_is_remote(run_dir)) status = take_lease(claim, run_dir);
    if (status) {
        ckpt_run_claim_release(claim);
        return status;
    }
    *out = claim;
    return TP_OK;
}

/* A writer's share of a run directory in an object store, where leases
 * are not shared. A live run's lease refuses it, as a live run's lock does:
 * watched until it proves dead (its holder gone from this machine, or no
 * renewal for a period: a crashed run's) or alive. Then the writer's own
 * lease, run_dir/.tp-run.writers/OWNER (one object a writer), renewed while
 * it writes, refuses a run starting meanwhile (check_writer_leases); the
 * run's lease is read again once the writer's stands, for a run that
 * started between the two. Before, `tp-reshard -o URL/step_N` beside a
 * trainer took its `latest` over, and a trainer started beside such a
 * writer was not refused. */
static int share_remote(ckpt_run_claim *claim, const char *run_dir)
{
    char run_lease[CKPT_PATH_MAX], name[STORE_OWNER_MAX + 32];
    int present = 0, again = 0;
    lease before, now;
    TP_TRY(tp_path_join(run_lease, run_dir, LEASE_NAME));
    TP_TRY(read_lease(run_lease, &present, &before));
    if (present) TP_TRY(wait_for_lease(claim, run_dir, run_lease, &before));
    TP_TRY(store_staging_owner(claim->owner, sizeof claim->owner));
    snprintf(name, sizeof name, "%s/%s", WRITERS_DIR, claim->owner);
    TP_TRY(tp_path_join(claim->lease_url, run_dir, name));
    int status = write_lease(claim, 0);
    if (status) {
        claim->lease_url[0] = '\0'; /* nothing of this claim's to remove */
        return status;
    }
    status = ckpt_lease_renewer_start(&claim->renewer, claim->lease_url);
    if (!status) status = read_lease(run_lease, &again, &now);
    /* A lease already waited out, unchanged, is not waited for twice. */
    if (!status && again && (!present || strcmp(now.owner, before.owner) != 0 || now.renewals != before.renewals))
        status = wait_for_lease(claim, run_dir, run_lease, &now);
    return status; /* refused: the caller's release stops the renewals and removes this lease */
}

int ckpt_run_claim_share(const char *run_dir, const char *program, ckpt_run_claim **out)
{
    *out = NULL;
    ckpt_run_claim *claim = calloc(1, sizeof *claim);
    if (!claim) return tp_fail(TP_ERR_NOMEM, "out of memory for a run directory's claim");
    double period = 0;
    int status = store_is_remote(run_dir) ? ckpt_lease_period("TP_RUN_LEASE_SECONDS", LEASE_DEFAULT_SECONDS,
                                                              LEASE_MIN_SECONDS, LEASE_MAX_SECONDS, &period)
                                          : TP_OK;
    ckpt_lease_renewer_init(&claim->renewer, period, renew, claim); /* started for an object store's writer lease */
    ckpt_lease_describe_holder(program, claim->holder, sizeof claim->holder);
    if (!status && store_is_remote(run_dir)) status = share_remote(claim, run_dir);
    else if (!status) status = lock_local(run_dir, claim->holder, STORE_LOCK_SHARED, &claim->lock);
    if (status) {
        ckpt_run_claim_release(claim);
        return status;
    }
    *out = claim;
    return TP_OK;
}

int ckpt_run_claim_free(const char *run_dir)
{
    if (store_is_remote(run_dir)) return TP_OK; /* a lease is judged by waiting for it: the claimant's */
    char path[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(path, run_dir, LOCK_NAME));
    int fd = -1; /* nothing made: a directory never claimed stays as it is */
    int status = tp_open_regular_flags(path, O_RDONLY | O_NOFOLLOW, 0, &fd);
    if (status == TP_ERR_NOT_FOUND) return TP_OK; /* never claimed (or no directory yet) */
    TP_TRY(status);
    /* Shared, for a moment: a holder's exclusive lock refuses it. */
    const store_ops *posix = store_posix();
    store_file *probe = NULL;
    status = lock_past_ending_holder(path, fd, STORE_LOCK_SHARED, &probe);
    if (status == TP_ERR_EXISTS) return refuse_local(run_dir, path, fd);
    close(fd);
    if (probe) posix->close(probe);
    return status == TP_ERR_NOT_FOUND ? TP_OK : status; /* removed meanwhile: no claim there either */
}

int ckpt_run_claim_check(ckpt_run_claim *claim)
{
    char to[HOLDER_MAX];
    if (!claim || !ckpt_lease_lost(&claim->renewer, to, sizeof to)) return TP_OK;
    return tp_fail(TP_ERR_STATE, "%s: this run's lease was taken over by %s (were its renewals held up for %.0f "
                   "s?); stopping rather than write beside it", claim->lease_url, to, claim->renewer.period);
}

void ckpt_run_claim_release(ckpt_run_claim *claim)
{
    if (!claim) return;
    ckpt_lease_renewer_destroy(&claim->renewer);
    if (claim->lease_url[0] && !atomic_load(&claim->renewer.lost)) store_delete(claim->lease_url);
    if (claim->lock) store_posix()->close(claim->lock);
    free(claim);
}
