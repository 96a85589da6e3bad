/* staging.c: outputs that appear whole or not at all (docs/RELIABILITY.md).
 *
 * Whatever the toolkit writes (checkpoints, exports) is written under a
 * staging name private to its writer, <parent>/.<base>.<owner>.staging, and
 * renamed into place once complete. The writer holds a lock on its staging
 * entry for as long as it lives; the lock goes when the process ends, however
 * it ends (kill -9 included), so an entry whose lock is free belongs to a dead
 * writer and the next writer to the same path removes it. Replacing what is
 * at the path (--force) is allowed only for what the caller's check
 * (may_replace) accepts: for the toolkit's outputs, the checkpoint library's
 * run-directory rules and the writer's own kind of output.
 *
 * Every staging entry this process holds is in a registry, so that a signal
 * handler thread can remove them all before the process dies
 * (store_discard_all_staged); that thread also waits for the uploads under
 * way (store_upload_begin), which remove what they sent themselves. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../common/error.h"
#include "../common/fault.h"
#include "../common/path.h"
#include "staging.h"
#include "store.h"

#define STAGING_SUFFIX ".staging"
#define CLAIM_SUFFIX ".new" /* a staging entry before its lock is taken */
/* What a replacement moved aside, where the store has no atomic exchange
 * (store_staged_publish): the staging name + ASIDE_SUFFIX. */
#define ASIDE_SUFFIX ".replaced"

struct store_staged {
    const store_ops *storage;
    char path[TP_PATH_MAX];    /* the final name */
    char staging[TP_PATH_MAX]; /* where it is written */
    int directory, overwrite;
    double wait_for_readers;
    store_replace_check may_replace;
    void *ctx;
    store_file *lock; /* held while the entry lives */
    store_staged *next;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static store_staged *registry;
/* The scratch directories (store_scratch_make), under registry_lock. */
typedef struct scratch {
    char path[TP_PATH_MAX];
    struct scratch *next;
} scratch;
static scratch *scratches;
/* store_discard_all_staged began: nothing is created, published or
 * uploaded any more. Set under uploads_lock and read under either lock
 * (create_registered, publish: registry_lock; store_upload_begin:
 * uploads_lock), or without one by the transfers (store_stopping). */
static atomic_int stopping;
/* The uploads under way (store_upload_begin/end), which the clean-up waits
 * for. */
static pthread_mutex_t uploads_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t uploads_ended = PTHREAD_COND_INITIALIZER;
static int uploads;

static void registry_remove(store_staged *s)
{
    pthread_mutex_lock(&registry_lock);
    for (store_staged **p = &registry; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    pthread_mutex_unlock(&registry_lock);
}

/* ------------------------------------------------------------------ names */

/* This machine's name as it appears in owners: letters, digits and '-' only,
 * so that an owner never holds the '.' that separates it from the base. */
void store_host_name(char *out, size_t out_size)
{
    snprintf(out, out_size, "host");
    gethostname(out, out_size - 1);
    out[out_size - 1] = '\0';
    for (char *c = out; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-'))
            *c = '-';
}

int store_process_gone(const char *host, long pid)
{
    char here[64];
    store_host_name(here, sizeof here);
    return !strcmp(here, host) && pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* /proc/PID/stat of a process of this machine into text ("PID (NAME) STATE
 * ..."), one read: its name's closing ')', after which the other fields
 * follow (the name, at most 15 bytes, may hold ')' and spaces), or NULL
 * when there is no such process. */
static const char *proc_stat_read(long pid, char *text, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t n = fread(text, 1, size - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *open = strchr(text, '('), *close = strrchr(text, ')');
    return open && close && close > open && close[1] == ' ' ? close : NULL;
}

int store_process_running(const char *host, long pid, const char *program)
{
    char here[64], stat[512];
    store_host_name(here, sizeof here);
    if (strcmp(here, host) || pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno != EPERM)) return 0;
    const char *close = proc_stat_read(pid, stat, sizeof stat);
    if (!close) return 0;
    /* An ended process not yet reaped (a zombie: a trainer's rank 0 whose
     * launch was just torn down) answers kill(0) but holds nothing: its
     * lease was taken for a live run's, and tp-elastic's relaunch refused. */
    if (close[2] == 'Z' || close[2] == 'X' || close[2] == 'x') return 0;
    /* The pid alone could be another's by now (the holder died and its pid
     * was handed out again): its name must be the holder's program. */
    const char *open = strchr(stat, '(');
    size_t name = (size_t)(close - open - 1);
    size_t kept = strlen(program) < 15 ? strlen(program) : 15; /* the kernel keeps 15 bytes of a name */
    return kept && name == kept && strncmp(open + 1, program, kept) == 0;
}

/* The kernel's PF_EXITING (include/linux/sched.h), in /proc/PID/stat's
 * flags: set when the process starts to exit. */
#define PROCESS_EXITING 0x4u

int store_process_ending(const char *host, long pid)
{
    char here[64], stat[512];
    store_host_name(here, sizeof here);
    if (strcmp(here, host) || pid <= 0) return 0;
    const char *close = proc_stat_read(pid, stat, sizeof stat);
    char state = 0;
    unsigned long flags = 0; /* state, then ppid, pgrp, session, tty_nr, tpgid, flags */
    if (!close || sscanf(close + 1, " %c %*d %*d %*d %*d %*d %lu", &state, &flags) != 2) return 0;
    return state == 'Z' || state == 'X' || state == 'x' || (flags & PROCESS_EXITING) != 0;
}

int store_staging_owner(char *out, size_t out_size)
{
    char host[64];
    store_host_name(host, sizeof host);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    static _Atomic unsigned counter;
    unsigned nonce = (unsigned)(now.tv_nsec ^ (now.tv_sec << 20)) ^ (++counter * 2654435761u);
    if (snprintf(out, out_size, "%s-%ld-%08x", host, (long)getpid(), nonce) >= (int)out_size)
        return tp_fail(TP_ERR_ARG, "staging owner buffer too small");
    return TP_OK;
}

int store_owner_process(const char *owner, char *host, size_t host_size, long *pid)
{
    const char *nonce = strrchr(owner, '-');
    if (!nonce || nonce == owner) return 0;
    const char *pid_text = nonce;
    while (pid_text > owner && pid_text[-1] != '-') pid_text--;
    if (pid_text == owner || pid_text == nonce) return 0; /* no host, or no digits */
    char *end = NULL;
    long value = strtol(pid_text, &end, 10);
    if (end != nonce || value <= 0 || (size_t)(pid_text - 1 - owner) >= host_size) return 0;
    memcpy(host, owner, (size_t)(pid_text - 1 - owner));
    host[pid_text - 1 - owner] = '\0';
    *pid = value;
    return 1;
}

/* This process's owner name, made once. */
static char own_owner[STORE_OWNER_MAX];

static void make_process_owner(void)
{
    if (store_staging_owner(own_owner, sizeof own_owner) != TP_OK) snprintf(own_owner, sizeof own_owner, "%ld", (long)getpid());
}

const char *store_process_owner(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, make_process_owner);
    return own_owner;
}

int store_staging_path(const char *path, const char *owner, char *out, size_t out_size)
{
    char parent[TP_PATH_MAX], base[TP_PATH_MAX], hidden[TP_PATH_MAX + STORE_OWNER_MAX + 16];
    TP_TRY(tp_split_path(path, parent, sizeof parent, base, sizeof base));
    if (!owner) owner = store_process_owner();
    if (!owner[0] || strchr(owner, '.') || strchr(owner, '/'))
        return tp_fail(TP_ERR_ARG, "staging owner '%s' must be non-empty, without '.' or '/'", owner);
    snprintf(hidden, sizeof hidden, ".%s.%s" STAGING_SUFFIX, base, owner);
    if (out_size < TP_PATH_MAX) return tp_fail(TP_ERR_ARG, "path buffer too small");
    return tp_path_join(out, parent, hidden);
}

/* Whether directory entry `name` is a staging entry of `base`:
 * .<base>.<owner>.staging, the owner without '.'. */
static int is_staging_of(const char *name, const char *base)
{
    size_t n = strlen(name), b = strlen(base), suffix = strlen(STAGING_SUFFIX);
    if (n < 1 + b + 1 + 1 + suffix || name[0] != '.' || strncmp(name + 1, base, b) != 0 || name[1 + b] != '.' ||
        strncmp(name + n - suffix, STAGING_SUFFIX, suffix) != 0)
        return 0;
    for (const char *c = name + 2 + b; c < name + n - suffix; c++)
        if (*c == '.' || *c == '/') return 0;
    return 1;
}

int store_is_staging_name(const char *name)
{
    size_t n = strlen(name), suffix = strlen(STAGING_SUFFIX);
    return name[0] == '.' && n > suffix && strcmp(name + n - suffix, STAGING_SUFFIX) == 0;
}

/* Whether `name` is a staging name + suffix (CLAIM_SUFFIX, ASIDE_SUFFIX) of
 * base, or of any base when base is NULL. */
static int is_suffixed_of(const char *name, const char *suffix_text, const char *base)
{
    size_t n = strlen(name), suffix = strlen(suffix_text);
    char staging[256];
    if (n <= suffix || n - suffix >= sizeof staging || strcmp(name + n - suffix, suffix_text) != 0) return 0;
    memcpy(staging, name, n - suffix);
    staging[n - suffix] = '\0';
    return base ? is_staging_of(staging, base) : store_is_staging_name(staging);
}

static int is_claim_of(const char *name, const char *base)
{
    return is_suffixed_of(name, CLAIM_SUFFIX, base);
}

static int is_aside_of(const char *name, const char *base)
{
    return is_suffixed_of(name, ASIDE_SUFFIX, base);
}

/* Whether the claim or aside `name` (a staging name + suffix) was left by a
 * process of this machine that is gone. A claim lives only between its
 * creation and its lock being taken (create_registered), and an aside is
 * what was replaced, which its writer never locks, so a free lock says
 * nothing; the owner's host-pid-nonce does. One of another machine is never
 * judged dead. */
static int owner_gone(const char *name, const char *suffix)
{
    /* .<base>.<host>-<pid>-<nonce>.staging<suffix>: the owner is the part
     * between the last '.' before STAGING_SUFFIX and STAGING_SUFFIX. */
    size_t n = strlen(name) - strlen(suffix) - strlen(STAGING_SUFFIX);
    char owner[STORE_OWNER_MAX];
    const char *start = name + n;
    while (start > name && start[-1] != '.') start--;
    if ((size_t)(name + n - start) >= sizeof owner) return 0;
    memcpy(owner, start, (size_t)(name + n - start));
    owner[name + n - start] = '\0';
    char host[STORE_OWNER_MAX];
    long pid;
    return store_owner_process(owner, host, sizeof host, &pid) && store_process_gone(host, pid);
}

/* -------------------------------------------------- entries of dead writers */

typedef struct {
    const char *base; /* the entries of this base; NULL: of any base */
    char (*names)[256];
    int count, capacity;
} staging_list;

static int collect_staging(void *ctx, const char *name)
{
    staging_list *l = ctx;
    int match = (l->base ? is_staging_of(name, l->base) : store_is_staging_name(name)) || is_claim_of(name, l->base) ||
                is_aside_of(name, l->base);
    if (!match || strlen(name) >= 256) return TP_OK;
    if (l->count == l->capacity) {
        int capacity = l->capacity ? 2 * l->capacity : 8;
        char(*grown)[256] = realloc(l->names, (size_t)capacity * sizeof *grown);
        if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory listing staging entries");
        l->names = grown;
        l->capacity = capacity;
    }
    strcpy(l->names[l->count++], name);
    return TP_OK;
}

/* What a replacement without an atomic exchange left aside at `aside`,
 * its writer dead between moving the earlier output aside and renaming its
 * own into place (or before removing the earlier one): the earlier output
 * goes back to its name when nothing is there, so that a failed
 * replacement leaves it as it was (it stayed hidden under this name for
 * ever, and the output's name held nothing); when the new output was
 * published, the earlier one goes, as its writer was about to do. Under an
 * exclusive lock on the aside, so that of two scans one acts. */
static int restore_aside(const store_ops *s, const char *parent, const char *aside)
{
    size_t n = strlen(aside) - strlen(ASIDE_SUFFIX) - strlen(STAGING_SUFFIX);
    const char *owner_dot = aside + n;
    while (owner_dot > aside + 1 && owner_dot[-1] != '.') owner_dot--;
    /* .<base>.<owner>.staging.replaced: base is between the leading '.' and
     * the '.' before the owner. */
    char base[TP_PATH_MAX], entry[TP_PATH_MAX], path[TP_PATH_MAX];
    size_t base_len = (size_t)(owner_dot - 1 - (aside + 1));
    if (owner_dot <= aside + 2 || base_len >= sizeof base) return TP_OK;
    memcpy(base, aside + 1, base_len);
    base[base_len] = '\0';
    TP_TRY(tp_path_join(entry, parent, aside));
    TP_TRY(tp_path_join(path, parent, base));
    store_file *lock = NULL;
    int status = s->lock(s, entry, 0, &lock);
    if (status == TP_ERR_EXISTS || status == TP_ERR_NOT_FOUND) return TP_OK; /* another scan's */
    if (status) return status;
    int aside_there = 0, output_there = 0;
    status = store_exists(s, entry, &aside_there);
    if (!status && aside_there) status = store_exists(s, path, &output_there);
    if (!status && aside_there && !output_there) {
        status = s->rename(s, entry, path, STORE_RENAME_NOREPLACE);
        if (!status) status = s->sync_dir(s, parent);
        if (status) tp_fail_context(status, "restoring %s, which a replacement that died had moved aside to %s", path, entry);
    } else if (!status && aside_there) {
        status = s->remove_tree(s, entry);
        if (status) tp_fail_context(status, "removing %s, what a replacement that died had replaced", entry);
    }
    s->close(lock);
    return status;
}

/* Removes the listed entries whose writers are gone, and restores what a
 * dead replacement moved aside; counts the live ones (claims and asides
 * excepted: they are not staging entries). */
static int remove_dead(const store_ops *s, const char *parent, staging_list *l, int remove, int *live_out)
{
    char entry[TP_PATH_MAX];
    int status = TP_OK;
    *live_out = 0;
    /* Asides first: a dead writer's staging entry beside one may hold the
     * replacement, never published, and goes below. */
    for (int i = 0; remove && !status && i < l->count; i++)
        if (is_aside_of(l->names[i], NULL) && owner_gone(l->names[i], ASIDE_SUFFIX))
            status = restore_aside(s, parent, l->names[i]);
    for (int i = 0; !status && i < l->count; i++) {
        if (is_aside_of(l->names[i], NULL)) continue;
        if (tp_path_join(entry, parent, l->names[i])) continue;
        store_file *lock = NULL;
        int locked = s->lock(s, entry, 0, &lock); /* exclusive, at once */
        int claim = is_claim_of(l->names[i], NULL);
        if (locked == TP_ERR_EXISTS) {
            if (!claim) (*live_out)++;
        } else if (locked == TP_OK) {
            if (remove && (!claim || owner_gone(l->names[i], CLAIM_SUFFIX))) {
                status = s->remove_tree(s, entry);
                if (status) tp_fail_context(status, "removing %s, left by a writer that is gone", entry);
            }
            s->close(lock);
        } /* gone meanwhile: nothing to do */
    }
    return status;
}

int store_remove_dead_staging(const char *dir)
{
    const store_ops *s;
    TP_TRY(store_for(dir, &s));
    staging_list l = {NULL, NULL, 0, 0};
    int live = 0, status = s->list(s, dir, collect_staging, &l);
    if (status == TP_ERR_NOT_FOUND) status = TP_OK;
    if (!status) status = remove_dead(s, dir, &l, 1, &live);
    free(l.names);
    return status;
}

/* Visits every staging entry of path's base in its parent, with whether its
 * writer is alive (its lock is held). Entries of dead writers are removed
 * when remove_dead; *live_out counts the live ones. */
static int scan_staging(const store_ops *s, const char *path, int remove_dead_entries, int *live_out)
{
    char parent[TP_PATH_MAX], base[TP_PATH_MAX];
    *live_out = 0;
    TP_TRY(tp_split_path(path, parent, sizeof parent, base, sizeof base));
    staging_list l = {base, NULL, 0, 0};
    int status = s->list(s, parent, collect_staging, &l);
    if (status == TP_ERR_NOT_FOUND) status = TP_OK;
    if (!status) status = remove_dead(s, parent, &l, remove_dead_entries, live_out);
    free(l.names);
    return status;
}

int store_staging_live(const store_ops *s, const char *path, int *live)
{
    int count = 0;
    *live = 0;
    TP_TRY(scan_staging(s, path, 0, &count));
    *live = count > 0;
    return TP_OK;
}

/* ------------------------------------------------------------- replacing */

/* Whether what is at path may be replaced: TP_OK when nothing is there. */
static int check_replace(const store_staged *st)
{
    const store_ops *s = st->storage;
    int exists;
    TP_TRY(store_exists(s, st->path, &exists));
    struct stat link;
    int is_link = s->local_paths && lstat(st->path, &link) == 0 && S_ISLNK(link.st_mode);
    char target[TP_PATH_MAX] = "";
    if (is_link) {
        ssize_t n = readlink(st->path, target, sizeof target - 1);
        if (n > 0) target[n] = '\0';
    }
    /* A link to nothing: the output would be written whole, then not put
     * where the link is (the final rename replaces nothing). */
    if (!exists && is_link)
        return tp_fail(TP_ERR_EXISTS, "%s is a symbolic link (to %s, which does not exist); an output replaces no link: "
                       "give the path it points to", st->path, target[0] ? target : "?");
    if (!exists) return TP_OK;
    if (!st->overwrite)
        return tp_fail(TP_ERR_EXISTS, "%s already exists; refusing to replace it without --force", st->path);
    /* What may be replaced is the caller's rule (the checkpoint library's
     * run-directory rules for the toolkit's outputs); without one, nothing. */
    if (!st->may_replace)
        return tp_fail(TP_ERR_EXISTS, "%s already exists and this writer replaces nothing; not replaced", st->path);
    /* A replacement exchanges the entry at the path: a symbolic link would
     * go, and what it points to stay, whatever the check below saw there. */
    if (is_link)
        return tp_fail(TP_ERR_EXISTS, "%s is a symbolic link (to %s); --force replaces no link: give the path it points to",
                       st->path, target[0] ? target : "?");
    return st->may_replace(s, st->path, st->ctx);
}

/* ---------------------------------------------------------------- staging */

static void free_staged(store_staged *st)
{
    if (!st) return;
    registry_remove(st);
    if (st->lock) st->storage->close(st->lock);
    free(st);
}

/* Creates the staging entry locked and registers it: made under a claim name
 * that no scan takes for a dead writer's, locked, renamed to its staging
 * name, registered. All of it under the registry's lock, so that a signal's
 * clean-up (store_discard_all_staged, which takes that lock) runs either
 * before (nothing is created: the process is being stopped) or after (the
 * entry is registered and goes), never while only a claim or an
 * unregistered entry exists. */
static int create_registered(store_staged *st)
{
    const store_ops *s = st->storage;
    char claim[TP_PATH_MAX + 8];
    if (snprintf(claim, sizeof claim, "%s" CLAIM_SUFFIX, st->staging) >= TP_PATH_MAX)
        return tp_fail(TP_ERR_ARG, "path too long: %s", st->staging);
    pthread_mutex_lock(&registry_lock);
    int status = atomic_load(&stopping) ? tp_fail(TP_ERR_STATE, "%s: not started: the process is being stopped by a signal", st->path)
                           : s->remove_tree(s, claim);
    if (!status && st->directory) {
        status = s->make_dir(s, claim);
    } else if (!status) {
        store_file *file = NULL;
        status = s->open(s, claim, STORE_OPEN_CREATE, &file);
        if (!status) s->close(file);
    }
    if (!status) {
        tp_fault_point("staging-claimed");
        /* Waits: a scan may hold the claim's lock for an instant while it
         * looks at whether the claimer is alive (remove_dead). */
        status = s->lock(s, claim, STORE_LOCK_WAIT, &st->lock);
        if (!status) status = s->rename(s, claim, st->staging, STORE_RENAME_NOREPLACE);
        if (status) s->remove_tree(s, claim);
    }
    if (!status) {
        tp_fault_point("staging-renamed");
        st->next = registry;
        registry = st;
    }
    pthread_mutex_unlock(&registry_lock);
    return status;
}

int store_stage(const store_ops *storage, const char *path, const store_stage_options *options, store_staged **out)
{
    *out = NULL;
    char parent[TP_PATH_MAX], base[TP_PATH_MAX];
    TP_TRY(tp_split_path(path, parent, sizeof parent, base, sizeof base));
    if (strlen(path) >= TP_PATH_MAX) return tp_fail(TP_ERR_ARG, "path too long: %s", path);
    /* A local path ending in '/' names a directory, which a file cannot be
     * renamed to: a GGUF export to `-o m.gguf/` wrote the whole file and
     * then failed on the rename, naming its staging file. (A URL's
     * trailing slashes are dropped before it is sent: tp_path_canonical.) */
    size_t length = strlen(path);
    if (!options->directory && length > 1 && path[length - 1] == '/' && !store_is_remote(path))
        return tp_fail(TP_ERR_ARG, "%s ends with '/', which names a directory, but this output is a file: name it "
                       "without the '/'", path);
    if (!storage) TP_TRY(store_for(path, &storage));
    store_stat st;
    TP_TRY(storage->stat(storage, parent, &st));
    if (!st.exists)
        return tp_fail(TP_ERR_NOT_FOUND, "%s: parent directory %s does not exist", path, parent);
    if (!st.is_dir) return tp_fail(TP_ERR_NOT_FOUND, "%s: %s is a file, not a directory", path, parent);
    if (options->bytes > 0) {
        int status = store_check_room(storage, parent, options->bytes);
        if (status) return tp_fail_context(status, "%s", path);
    }
    store_staged *s = calloc(1, sizeof *s);
    if (!s) return tp_fail(TP_ERR_NOMEM, "out of memory");
    s->storage = storage;
    strcpy(s->path, path);
    s->directory = options->directory;
    s->overwrite = options->overwrite;
    s->wait_for_readers = options->wait_for_readers;
    s->may_replace = options->may_replace;
    s->ctx = options->ctx;
    int live = 0;
    char fresh[STORE_OWNER_MAX];
    const char *owner = options->owner;
    /* Dead writers' entries first: what a replacement that died left aside
     * goes back to its name (restore_aside) before what is there is judged. */
    int status = scan_staging(storage, path, 1, &live);
    if (!status) status = check_replace(s);
    if (!status && !owner) { /* a name of its own, even beside another writer of this process */
        status = store_staging_owner(fresh, sizeof fresh);
        owner = fresh;
    }
    if (!status) status = store_staging_path(path, owner, s->staging, sizeof s->staging);
    if (!status) status = create_registered(s);
    if (status) {
        free_staged(s);
        return status;
    }
    *out = s;
    return TP_OK;
}

const char *store_staged_path(const store_staged *staged)
{
    return staged->staging;
}

const char *store_staged_target(const store_staged *staged)
{
    return staged->path;
}

/* The lock on what is at st's path, taken as its readers let go, within
 * st->wait_for_readers seconds (outside the registry's lock, which a
 * signal's clean-up takes); *held NULL when nothing is there, or when the
 * wait ran out (then the publish refuses as it does at once). A stop by a
 * signal ends the wait. */
static int wait_for_readers(store_staged *st, store_file **held)
{
    const store_ops *s = st->storage;
    *held = NULL;
    double waited = 0, pause = 0.05;
    for (;;) {
        int exists = 0;
        if (atomic_load(&stopping)) return TP_OK;
        TP_TRY(store_exists(s, st->path, &exists));
        if (!exists) return TP_OK;
        int status = s->lock(s, st->path, 0, held);
        if (status != TP_ERR_EXISTS) return status;
        if (waited >= st->wait_for_readers) return TP_OK;
        struct timespec t = {0, (long)(pause * 1e9)};
        nanosleep(&t, NULL);
        waited += pause;
        if (pause < 0.5) pause *= 2;
    }
}

/* The entries of a directory output made durable before it is renamed into
 * place: those of every directory inside it, deepest first, then its own. An
 * fsync of a directory covers its own entries only, and outputs have
 * directories of their own (a Megatron-LM save's iter_N/mp_rank_XX holding
 * model_optim_rng.pt): synced at the top alone, a power loss after the
 * publish could leave the output under its final name without them. Local
 * file systems only; an object store has no directories to sync. */
#define SYNC_TREE_DEPTH_MAX 16

typedef struct {
    const store_ops *storage;
    const char *dir;
    int depth;
} sync_tree_walk;

static int sync_tree(const store_ops *s, const char *dir, int depth);

static int sync_subdirectory(void *ctx, const char *name)
{
    const sync_tree_walk *walk = ctx;
    char path[TP_PATH_MAX];
    store_stat info;
    TP_TRY(tp_path_join(path, walk->dir, name));
    TP_TRY(walk->storage->stat(walk->storage, path, &info));
    return info.exists && info.is_dir ? sync_tree(walk->storage, path, walk->depth + 1) : TP_OK;
}

static int sync_tree(const store_ops *s, const char *dir, int depth)
{
    if (depth > SYNC_TREE_DEPTH_MAX)
        return tp_fail(TP_ERR_STATE, "%s: directories nested deeper than %d in an output", dir, SYNC_TREE_DEPTH_MAX);
    if (s->local_paths) {
        sync_tree_walk walk = {s, dir, depth};
        TP_TRY(s->list(s, dir, sync_subdirectory, &walk));
    }
    return s->sync_dir(s, dir);
}

int store_staged_publish(store_staged *st)
{
    const store_ops *s = st->storage;
    char parent[TP_PATH_MAX], base[TP_PATH_MAX];
    int status = tp_split_path(st->path, parent, sizeof parent, base, sizeof base);
    if (!status && st->directory) {
        status = sync_tree(s, st->staging, 0);
    } else if (!status) {
        store_file *file = NULL;
        status = s->open(s, st->staging, STORE_OPEN_READ, &file);
        if (!status) status = s->sync(file);
        if (file) s->close(file);
    }
    /* What is at the path now, which another writer may have published since
     * this one started: replaced only with overwrite, and only when
     * replaceable. */
    if (!status) status = check_replace(st);
    /* The rename under the registry's lock: a signal's clean-up either finds
     * the output published or stops it from being published. */
    store_file *replaced = NULL; /* the lock on what is replaced */
    if (!status && st->overwrite && st->wait_for_readers > 0) status = wait_for_readers(st, &replaced);
    pthread_mutex_lock(&registry_lock);
    if (!status && atomic_load(&stopping))
        status = tp_fail(TP_ERR_STATE, "%s: not published: the process is being stopped by a signal", st->path);
    int exists = 1;
    if (!status && st->overwrite) status = store_exists(s, st->path, &exists);
    if (!status && (!st->overwrite || !exists)) {
        status = s->rename(s, st->staging, st->path, STORE_RENAME_NOREPLACE);
        if (status == TP_ERR_EXISTS)
            tp_fail(TP_ERR_EXISTS, "%s appeared while this output was written (another writer?); not replaced%s",
                    st->path, st->overwrite ? "" : " without --force");
        if (!status) status = s->sync_dir(s, parent);
    } else if (!status && !replaced) {
        /* Not while a reader holds what is there (ckpt_reader_open locks a
         * checkpoint shared): it would mix the two. */
        status = s->lock(s, st->path, 0, &replaced);
        if (status == TP_ERR_EXISTS)
            tp_fail(TP_ERR_EXISTS, "%s is being read (by another process, or by this one) or replaced by another writer; not "
                    "replaced (try again when it is done)", st->path);
    }
    if (!status && replaced) {
        /* Swapped atomically; the staging name then holds what was replaced. */
        status = s->rename(s, st->staging, st->path, STORE_RENAME_EXCHANGE);
        if (status == TP_ERR_STATE) {
            /* No atomic exchange in this store: move the old one aside first. */
            char aside[TP_PATH_MAX + 16];
            snprintf(aside, sizeof aside, "%s" ASIDE_SUFFIX, st->staging);
            status = s->remove_tree(s, aside);
            if (!status) status = s->rename(s, st->path, aside, STORE_RENAME_REPLACE);
            if (!status) status = s->rename(s, st->staging, st->path, STORE_RENAME_NOREPLACE);
            if (!status) status = s->sync_dir(s, parent);
            if (!status) status = s->remove_tree(s, aside);
        } else {
            if (!status) status = s->sync_dir(s, parent);
            if (!status) status = s->remove_tree(s, st->staging);
        }
    }
    pthread_mutex_unlock(&registry_lock);
    if (replaced) s->close(replaced);
    if (status) {
        store_staged_discard(st);
        return status;
    }
    free_staged(st);
    return TP_OK;
}

void store_staged_discard(store_staged *st)
{
    if (!st) return;
    /* Removed while still locked, so that no one takes it for a dead writer's
     * half-removed entry. */
    st->storage->remove_tree(st->storage, st->staging);
    free_staged(st);
}

store_staged *store_staged_find(const char *staging)
{
    pthread_mutex_lock(&registry_lock);
    store_staged *s = registry;
    while (s && strcmp(s->staging, staging) != 0) s = s->next;
    pthread_mutex_unlock(&registry_lock);
    return s;
}

int store_staged_create(store_staged *st, int (*create)(void *ctx), void *ctx)
{
    pthread_mutex_lock(&registry_lock);
    int status = atomic_load(&stopping) ? tp_fail(TP_ERR_STATE, "%s: not written: the process is being stopped by a signal", st->path)
                           : create(ctx);
    pthread_mutex_unlock(&registry_lock);
    return status;
}

void store_discard_all_staged(void)
{
    /* First of all, nothing new starts: no entry is created or published,
     * no upload begins, no write request goes out (store/http.c), and a
     * body being sent is cut off. */
    pthread_mutex_lock(&uploads_lock);
    atomic_store(&stopping, 1);
    pthread_mutex_unlock(&uploads_lock);
    /* Called from a signal-handling thread while other threads may still be
     * writing into these entries: removal is retried a few times, and what
     * is left is a dead writer's, which the next writer removes. */
    pthread_mutex_lock(&registry_lock);
    for (store_staged *s = registry; s; s = s->next)
        for (int attempt = 0; attempt < 5 && s->storage->remove_tree(s->storage, s->staging) != TP_OK; attempt++) {
        }
    pthread_mutex_unlock(&registry_lock);
    /* An object store has no staging name to remove: each upload, its
     * requests failing now, removes what it sent (ckpt/upload.c
     * discard_upload) on its own thread, and the process dies after. */
    pthread_mutex_lock(&uploads_lock);
    while (uploads > 0) pthread_cond_wait(&uploads_ended, &uploads_lock);
    pthread_mutex_unlock(&uploads_lock);
    /* Last, what the uploads read from (a remote output's local copy). */
    const store_ops *posix = store_posix();
    pthread_mutex_lock(&registry_lock);
    for (scratch *d = scratches; d; d = d->next)
        for (int attempt = 0; attempt < 5 && posix->remove_tree(posix, d->path) != TP_OK; attempt++) {
        }
    pthread_mutex_unlock(&registry_lock);
    tp_fault_point("signal-cleaned"); /* the window before the caller dies, held open by tests */
}

int store_stopping(void)
{
    return atomic_load(&stopping);
}

int store_upload_begin(const char *url)
{
    pthread_mutex_lock(&uploads_lock);
    int status = atomic_load(&stopping)
                     ? tp_fail(TP_ERR_STATE, "%s: not uploaded: the process is being stopped by a signal", url)
                     : TP_OK;
    if (!status) uploads++;
    pthread_mutex_unlock(&uploads_lock);
    return status;
}

void store_upload_end(void)
{
    pthread_mutex_lock(&uploads_lock);
    if (uploads > 0 && --uploads == 0) pthread_cond_broadcast(&uploads_ended);
    pthread_mutex_unlock(&uploads_lock);
}

int store_scratch_make(const char *dir)
{
    scratch *d = calloc(1, sizeof *d);
    if (!d) return tp_fail(TP_ERR_NOMEM, "out of memory");
    if ((size_t)snprintf(d->path, sizeof d->path, "%s", dir) >= sizeof d->path) {
        free(d);
        return tp_fail(TP_ERR_ARG, "path too long: %s", dir);
    }
    const store_ops *posix = store_posix();
    pthread_mutex_lock(&registry_lock);
    int status = atomic_load(&stopping)
                     ? tp_fail(TP_ERR_STATE, "%s: not made: the process is being stopped by a signal", dir)
                     : posix->make_dir(posix, dir);
    if (status == TP_ERR_EXISTS) status = TP_OK;
    if (!status) {
        d->next = scratches;
        scratches = d;
    }
    pthread_mutex_unlock(&registry_lock);
    if (status) free(d);
    return status;
}

void store_scratch_forget(const char *dir)
{
    pthread_mutex_lock(&registry_lock);
    for (scratch **p = &scratches; *p; p = &(*p)->next)
        if (!strcmp((*p)->path, dir)) {
            scratch *gone = *p;
            *p = gone->next;
            free(gone);
            break;
        }
    pthread_mutex_unlock(&registry_lock);
}
