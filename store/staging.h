/* staging.h: outputs that appear whole or not at all (docs/RELIABILITY.md).
 *
 * Whatever is written is written under a staging name private to its
 * writer, <parent>/.<name>.<owner>.staging, locked by the writer while it
 * lives, and renamed into place (published) when complete. The entry is
 * first made under a claim name (the staging name + ".new") that no scan
 * takes for a dead writer's, then locked and renamed. The next writer to
 * the same path removes staging entries whose writers are gone (their
 * locks are free), kill -9 included. Checkpoints go through these steps
 * inside the checkpoint writer; other outputs (exports) use them directly.
 *
 * The store knows no kind of output: what --force may replace is the
 * caller's rule (may_replace), which for the toolkit's outputs is the
 * checkpoint library's run-directory rules (ckpt_may_replace_checkpoint,
 * ckpt_refuse_run_directory). */
#ifndef TP_STORE_STAGING_H
#define TP_STORE_STAGING_H

#include <stddef.h>

#include "store.h"

typedef struct store_staged store_staged;

/* Whether --force may replace what is at path in storage: TP_OK, or an
 * error that names what is there. */
typedef int (*store_replace_check)(const store_ops *storage, const char *path, void *ctx);

#define STORE_OWNER_MAX 128

typedef struct {
    int directory; /* stage a directory (else a file) */
    int overwrite; /* replace what is at the path (--force) when may_replace accepts it */
    store_replace_check may_replace; /* asked before anything is replaced; NULL: nothing is */
    void *ctx;
    const char *owner; /* owner part of the staging name; NULL: a fresh one, this writer's alone */
    /* With overwrite: how long publishing waits for the readers of what is
     * there to finish (0: refused at once, as a user's --force is; a
     * trainer saving a step again waits rather than fail the run). */
    double wait_for_readers;
    /* The bytes the output will take, when known (0: not known): refused at
     * once where the local file system of its parent has less room
     * (store_check_room). */
    int64_t bytes;
} store_stage_options;

/* Checks that path may be written (its parent exists; what is there only
 * with overwrite and when may_replace accepts it), removes dead writers'
 * staging entries of path and creates this writer's, locked. storage NULL:
 * the store of the path. */
int store_stage(const store_ops *storage, const char *path, const store_stage_options *options,
                store_staged **out);
/* The staging file or directory to write into. */
const char *store_staged_path(const store_staged *staged);
/* The path it is published at. */
const char *store_staged_target(const store_staged *staged);
/* Syncs the staging entry (files inside are the caller's to sync) and renames
 * it to its path: without overwrite never over something published there
 * meanwhile; with it, by atomic exchange, and not while a reader holds what
 * is there (a shared lock; waited for up to wait_for_readers seconds). Frees staged whatever the outcome; on failure
 * the staging entry is removed. */
int store_staged_publish(store_staged *staged);
/* Removes the staging entry; frees staged. */
void store_staged_discard(store_staged *staged);
/* Runs create(ctx), which makes something at the staging path by its name
 * (an HDF5 file, a file opened to be created), under the lock the signal
 * clean-up takes, unless the clean-up has run: then TP_ERR_STATE and
 * nothing is made. Without it, a writer thread could make the entry again
 * between the clean-up's removal of it and the process's death. */
int store_staged_create(store_staged *staged, int (*create)(void *ctx), void *ctx);
/* The staging entry with this staging path this process holds, or NULL. */
store_staged *store_staged_find(const char *staging);
/* The signal clean-up (for a signal-handling thread, before the process
 * dies of the signal): stops everything from starting (store_stopping),
 * removes every staging entry this process holds, waits until every
 * upload under way has ended (store_upload_end): each removes what it sent
 * on its own thread; then removes the scratch directories
 * (store_scratch_make). */
void store_discard_all_staged(void);
/* Whether store_discard_all_staged began: the process is being stopped.
 * From then on no write request (PUT, POST, MKCOL...) goes to an object
 * store, and one whose body is being sent is cut off (store/http.c): an
 * upload fails with TP_ERR_STATE, while its removals (DELETE) and the
 * listings they need go through. */
int store_stopping(void);
/* An upload to an object store is no staging entry: an object store has no
 * rename, and only the uploader knows what it sent (ckpt/upload.c
 * discard_upload). Between store_upload_begin and store_upload_end, before
 * anything at url changes until after a failure was cleaned up, the signal
 * clean-up waits for it, so that the process dies of the signal once url
 * holds what it held before (docs/STORES.md). Calls nest; begin fails
 * (TP_ERR_STATE, naming url) once the process is being stopped, and then
 * nothing may be sent. */
int store_upload_begin(const char *url);
void store_upload_end(void);
/* A local directory private to this process that is no output (a remote
 * output's local copy before its upload, ckpt/upload.c ckpt_output_begin):
 * made (one already there is fine) and registered, under the clean-up's
 * lock, so that a signal's clean-up either stops it from being made
 * (TP_ERR_STATE) or removes it, after the uploads ended. */
int store_scratch_make(const char *dir);
/* Forgets dir: removed (before the call, so that a signal meanwhile
 * removes the rest) or kept by the caller. */
void store_scratch_forget(const char *dir);
/* Removes the staging entries in dir whose writers are gone (a run
 * directory's, when a run starts). */
int store_remove_dead_staging(const char *dir);

/* ----------------------------------------------------------------- names */

/* A fresh owner name: host, process id and a nonce. Distributed writers of
 * one output share the one their committing process made. */
int store_staging_owner(char *out, size_t out_size);
/* The host and process id of an owner name (store_staging_owner's form,
 * HOST-PID-NONCE), host in host_size bytes; 0 when it is not of that form. */
int store_owner_process(const char *owner, char *host, size_t host_size, long *pid);
/* The owner name distributed writers of this process share by default. */
const char *store_process_owner(void);
/* This machine's name as owners carry it: letters, digits and '-' only. */
void store_host_name(char *out, size_t out_size);
/* Whether the process pid of host (store_host_name's form) is known to be
 * gone: host is this machine and no such process runs. Another machine's
 * is never known gone. */
int store_process_gone(const char *host, long pid);
/* Whether the process pid of host is known to be alive and running
 * program: host is this machine, such a process runs (an ended one not yet
 * reaped does not), and its name (the kernel's, /proc/PID/comm, at most 15
 * bytes) is program's. A pid taken by
 * another program since is not it; another machine's is never known. */
int store_process_running(const char *host, long pid, const char *program);
/* Whether the process pid of host is known to be ending: host is this
 * machine and the process has begun to exit (the kernel frees its memory,
 * then closes its files: its locks are held until then, over a second for
 * a large process) or has ended and is not yet reaped. */
int store_process_ending(const char *host, long pid);
/* "<parent>/.<base>.<owner>.staging": where owner writes path before it is
 * published (owner NULL: this process); out_size at least TP_PATH_MAX. */
int store_staging_path(const char *path, const char *owner, char *out, size_t out_size);
/* Whether a directory entry's name is a staging name. */
int store_is_staging_name(const char *name);
/* Whether a live writer (holding its lock) is writing path now: *live 1 or
 * 0, or the failure to list path's parent (a missing parent is 0). */
int store_staging_live(const store_ops *storage, const char *path, int *live);

#endif
