/* rundir.c: the rules of a run directory (docs/FORMAT.md "Run
 * directories"), in one place for every reader, writer and resume: which
 * entries are checkpoints (step_<digits>, committed: index.json present),
 * what `latest` names, which checkpoint a path means, and the order in
 * which a resume tries them, what a trainer may write its checkpoints into
 * (ckpt_run_dir_kind), what step a checkpoint named in one records and
 * whether an import may join one (ckpt_run_output_refusal), and what
 * --force may replace (never a run
 * directory; a checkpoint by a checkpoint): the rules staged outputs are
 * given (store_stage_options.may_replace). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define STEP_PREFIX "step_"
#define STEP_MAX_DIGITS 15 /* steps below 10^15 */

int64_t ckpt_step_of_name(const char *name)
{
    size_t prefix = strlen(STEP_PREFIX), digits = strlen(name) - (strlen(name) >= prefix ? prefix : 0);
    if (strncmp(name, STEP_PREFIX, prefix) != 0 || digits == 0 || digits > STEP_MAX_DIGITS) return -1;
    int64_t step = 0;
    for (const char *c = name + prefix; *c; c++) {
        if (*c < '0' || *c > '9') return -1;
        step = step * 10 + (*c - '0');
    }
    return step;
}

int ckpt_step_path(const char *run_dir, int64_t step, char *out, size_t out_size)
{
    if (step < 0 || step >= (int64_t)1000000000000000) return tp_fail(TP_ERR_ARG, "step %lld outside 0..10^15", (long long)step);
    if (out_size < CKPT_PATH_MAX) return tp_fail(TP_ERR_ARG, "path buffer too small");
    char name[32];
    snprintf(name, sizeof name, STEP_PREFIX "%08lld", (long long)step);
    return tp_path_join(out, run_dir, name);
}

/* Whether dir is a committed checkpoint (its index.json is there), as the
 * store says: a store that could not be asked (it did not answer, answered
 * an error, a redirect or garbage; a local disk's EIO) fails, naming the
 * index, and is never taken for a checkpoint that is not there: a resume
 * would take an older one, and overwrite this one with its next save. */
static int committed_in(const store_ops *storage, const char *dir, int *committed)
{
    char index[CKPT_PATH_MAX];
    *committed = 0;
    TP_TRY(tp_path_join(index, dir, CKPT_INDEX_NAME));
    return store_exists(storage, index, committed);
}

int ckpt_is_committed(const char *dir)
{
    const store_ops *storage;
    int committed = 0;
    return store_for(dir, &storage) == TP_OK && committed_in(storage, dir, &committed) == TP_OK && committed;
}

/* Whether path is a staging directory, or a checkpoint a live writer is
 * writing now. Only for a clearer refusal: a parent that cannot be listed
 * (a local directory above the run that its user may not read) counts as
 * no writer there, since what the caller asks next (is it committed?) asks
 * the store itself, and fails if the store cannot be asked. */
static int is_being_written(const store_ops *storage, const char *path)
{
    char parent[CKPT_PATH_MAX], base[CKPT_PATH_MAX];
    int live = 0;
    if (tp_split_path(path, parent, sizeof parent, base, sizeof base) != TP_OK) return 0;
    return store_is_staging_name(base) || (store_staging_live(storage, path, &live) == TP_OK && live);
}

/* The checkpoint `latest` in run_dir names, when it is a committed one
 * (*found 1). A `latest` that is missing, damaged (too long, NUL bytes),
 * replaced while read or names something else than a committed entry of
 * run_dir is no pointer
 * (*found 0); a store that cannot be asked fails. */
static int latest_checkpoint(const store_ops *storage, const char *run_dir, char *out, int *found)
{
    char latest_path[CKPT_PATH_MAX];
    char *latest = NULL;
    int exists = 0;
    *found = 0;
    TP_TRY(tp_path_join(latest_path, run_dir, CKPT_LATEST_NAME));
    TP_TRY(store_exists(storage, latest_path, &exists));
    if (!exists) return TP_OK;
    int status = store_read_text(storage, latest_path, CKPT_PATH_MAX, &latest, NULL);
    /* Removed meanwhile, damaged, or replaced while it was read (an object
     * store's 412 to If-Match, as a committer moves it): no pointer, so the
     * newest committed step is taken, which a mover names once it is done. */
    if (store_read_changed(status)) return TP_OK;
    TP_TRY(status);
    latest[strcspn(latest, "\r\n")] = '\0';
    if (latest[0] && !strchr(latest, '/') && strcmp(latest, "..") != 0 && strcmp(latest, ".") != 0 &&
        tp_path_join(out, run_dir, latest) == TP_OK)
        status = committed_in(storage, out, found);
    free(latest);
    return status;
}

int ckpt_resolve_in(const store_ops *storage, const char *path, char *out)
{
    store_stat st;
    int written = is_being_written(storage, path), committed = 0, found = 0;
    if (written) TP_TRY(committed_in(storage, path, &committed));
    if (written && !committed)
        return tp_fail(TP_ERR_NOT_FOUND,
                       "%s is a checkpoint still being written (not committed); use a committed one", path);
    TP_TRY(storage->stat(storage, path, &st));
    if (!st.exists) return tp_fail(TP_ERR_NOT_FOUND, "%s: no such checkpoint: %s", path, strerror(ENOENT));
    if (!st.is_dir) return tp_fail(TP_ERR_NOT_FOUND, "%s is not a checkpoint: not a directory", path);
    TP_TRY(committed_in(storage, path, &committed));
    if (committed) {
        if (strlen(path) >= CKPT_PATH_MAX) return tp_fail(TP_ERR_ARG, "path too long: %s", path);
        strcpy(out, path);
        return TP_OK;
    }
    TP_TRY(latest_checkpoint(storage, path, out, &found));
    if (found) return TP_OK;
    /* No usable `latest`: the newest committed step_* directory. */
    ckpt_candidate *list = NULL;
    int count = 0;
    TP_TRY(ckpt_candidates_in(storage, path, &list, &count));
    strcpy(out, list[0].path);
    free(list);
    return TP_OK;
}

int ckpt_resolve(const char *path, char *out, size_t out_size)
{
    const store_ops *storage;
    if (out_size < CKPT_PATH_MAX) return tp_fail(TP_ERR_ARG, "path buffer too small");
    TP_TRY(store_for(path, &storage));
    return ckpt_resolve_in(storage, path, out);
}

int ckpt_store_failure(int status)
{
    return status == TP_ERR_IO;
}

static int by_step_descending(const void *a, const void *b)
{
    const ckpt_candidate *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : strcmp(x->path, y->path);
}

typedef struct {
    const store_ops *storage;
    const char *dir;
    ckpt_candidate *list;
    int count, capacity;
} listing;

static int add_candidate(void *ctx, const char *name)
{
    listing *l = ctx;
    int64_t step = ckpt_step_of_name(name);
    char candidate[CKPT_PATH_MAX];
    int committed = 0;
    if (step < 0 || tp_path_join(candidate, l->dir, name)) return TP_OK;
    /* A step whose index could not be asked about stops the listing: left
     * out, an older checkpoint would be taken for the newest. */
    TP_TRY(committed_in(l->storage, candidate, &committed));
    if (!committed) return TP_OK;
    if (l->count == l->capacity) {
        int capacity = l->capacity ? 2 * l->capacity : 16;
        ckpt_candidate *grown = realloc(l->list, (size_t)capacity * sizeof *grown);
        if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory listing %s", l->dir);
        l->list = grown;
        l->capacity = capacity;
    }
    strcpy(l->list[l->count].path, candidate);
    l->list[l->count++].step = step;
    return TP_OK;
}

int ckpt_append_name(ckpt_name_list *list, const char *name)
{
    if (list->count == list->capacity) {
        int grown_capacity = list->capacity ? 2 * list->capacity : 16;
        void *grown = realloc(list->names, (size_t)grown_capacity * sizeof *list->names);
        if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory");
        list->names = grown;
        list->capacity = grown_capacity;
    }
    snprintf(list->names[list->count++], sizeof *list->names, "%s", name);
    return TP_OK;
}

int ckpt_candidates_in(const store_ops *storage, const char *path, ckpt_candidate **out, int *count)
{
    *out = NULL;
    *count = 0;
    int committed = 0, has_latest = 0;
    TP_TRY(committed_in(storage, path, &committed));
    if (committed) { /* a checkpoint itself, not a run directory */
        ckpt_candidate *one = calloc(1, sizeof *one);
        if (!one) return tp_fail(TP_ERR_NOMEM, "out of memory");
        if (strlen(path) >= sizeof one->path) {
            free(one);
            return tp_fail(TP_ERR_ARG, "path too long: %s", path);
        }
        strcpy(one->path, path);
        char parent[CKPT_PATH_MAX], base[CKPT_PATH_MAX];
        one->step = tp_split_path(path, parent, sizeof parent, base, sizeof base) == TP_OK ? ckpt_step_of_name(base) : -1;
        *out = one;
        *count = 1;
        return TP_OK;
    }
    char latest[CKPT_PATH_MAX];
    TP_TRY(latest_checkpoint(storage, path, latest, &has_latest));
    listing l = {storage, path, NULL, 0, 0};
    int status = storage->list(storage, path, add_candidate, &l);
    ckpt_candidate *list = l.list;
    int n = l.count;
    if (!status && n == 0)
        status = tp_fail(TP_ERR_NOT_FOUND,
                         "%s is not a checkpoint: no %s, no usable '%s' pointer and no committed step_* directory",
                         path, CKPT_INDEX_NAME, CKPT_LATEST_NAME);
    if (status) {
        free(list);
        return status;
    }
    qsort(list, (size_t)n, sizeof *list, by_step_descending);
    /* What `latest` names goes first, whatever its step. */
    for (int k = 0; has_latest && k < n; k++) {
        if (strcmp(list[k].path, latest) != 0) continue;
        ckpt_candidate first = list[k];
        memmove(list + 1, list, (size_t)k * sizeof *list);
        list[0] = first;
        break;
    }
    *out = list;
    *count = n;
    return TP_OK;
}

int ckpt_candidates(const char *path, ckpt_candidate **out, int *count)
{
    const store_ops *storage;
    *out = NULL;
    *count = 0;
    TP_TRY(store_for(path, &storage));
    return ckpt_candidates_in(storage, path, out, count);
}

/* *step: the step recorded in the index of the checkpoint run_dir resolves
 * to; -1 when it resolves to none, or to one whose index is missing or
 * damaged. A store that cannot be asked fails: taken for -1, `latest` would
 * be moved back over the newest checkpoint. */
static int resolved_step(const store_ops *storage, const char *run_dir, int64_t *step)
{
    char resolved[CKPT_PATH_MAX], index_path[CKPT_PATH_MAX];
    *step = -1;
    int status = ckpt_resolve_in(storage, run_dir, resolved);
    if (status == TP_ERR_NOT_FOUND) return TP_OK; /* no committed checkpoint (or none yet) */
    TP_TRY(status);
    TP_TRY(tp_path_join(index_path, resolved, CKPT_INDEX_NAME));
    char *text = NULL;
    int64_t size = 0;
    status = store_read_text(storage, index_path, CKPT_INDEX_MAX_BYTES, &text, &size);
    if (status == TP_ERR_NOT_FOUND || status == TP_ERR_FORMAT) return TP_OK; /* gone meanwhile, or damaged */
    TP_TRY(status);
    cJSON *root = NULL;
    tp_json_parse(text, (size_t)size, index_path, &root);
    free(text);
    const cJSON *value = cJSON_GetObjectItemCaseSensitive(root, "step");
    if (cJSON_IsNumber(value)) *step = (int64_t)value->valuedouble;
    cJSON_Delete(root);
    return TP_OK;
}

int ckpt_run_dir_kind(const char *path, ckpt_dir_kind *kind, ckpt_candidate *newest)
{
    const store_ops *storage;
    *kind = CKPT_DIR_FREE;
    memset(newest, 0, sizeof *newest);
    newest->step = -1;
    TP_TRY(store_for(path, &storage));
    ckpt_candidate *list = NULL;
    int count = 0, status = ckpt_candidates_in(storage, path, &list, &count);
    /* Nothing committed: absent (a store's missing prefix lists nothing), empty, or leftovers of killed saves. */
    if (status == TP_ERR_NOT_FOUND) return TP_OK;
    TP_TRY(status);
    *newest = list[0]; /* what a resume tries first: `latest`, else the newest step_* */
    free(list);
    if (strcmp(newest->path, path) == 0) {
        *kind = CKPT_DIR_CHECKPOINT;
        TP_TRY(resolved_step(storage, path, &newest->step)); /* its index's: a checkpoint may have any name */
    } else {
        *kind = CKPT_DIR_RUN;
    }
    return TP_OK;
}

int ckpt_run_output_refusal(const char *out, int64_t step, int new_model, char *why, size_t size)
{
    why[0] = '\0';
    char run_dir[CKPT_PATH_MAX], name[CKPT_PATH_MAX]; /* "RUN/step_3/" is step_3 */
    if (tp_split_path(out, run_dir, sizeof run_dir, name, sizeof name) != TP_OK) return TP_OK;
    int64_t named = ckpt_step_of_name(name);
    if (named < 0) return TP_OK;
    if (named != step) {
        snprintf(why, size, "the output %s is named for step %lld, but the checkpoint records step %lld: a run "
                 "directory orders its checkpoints by the step in their names (so do `latest` and a resume); name it "
                 "%s/" STEP_PREFIX "%08lld", out, (long long)named, (long long)step, run_dir, (long long)step);
        return TP_OK;
    }
    if (!new_model) return TP_OK;
    ckpt_dir_kind kind;
    ckpt_candidate newest;
    TP_TRY(ckpt_run_dir_kind(run_dir, &kind, &newest));
    if (kind == CKPT_DIR_CHECKPOINT) {
        snprintf(why, size, "%s is a checkpoint, not a run directory, and no checkpoint is written inside another: "
                 "choose a new run directory (mkdir RUN; -o RUN/%s)", run_dir, name);
        return TP_OK;
    }
    if (kind != CKPT_DIR_RUN) return TP_OK;
    const store_ops *storage;
    ckpt_candidate *list = NULL;
    int count = 0;
    TP_TRY(store_for(run_dir, &storage));
    TP_TRY(ckpt_candidates_in(storage, run_dir, &list, &count));
    const char *other = NULL;
    for (int k = 0; k < count && !other; k++) {
        char above[CKPT_PATH_MAX], base[CKPT_PATH_MAX];
        if (tp_split_path(list[k].path, above, sizeof above, base, sizeof base) != TP_OK || strcmp(base, name) != 0)
            other = list[k].path;
    }
    if (other)
        snprintf(why, size, "%s holds the checkpoints of a run (%s): a model written beside them would share their "
                 "run directory, whose `latest` stays on the newest, so tp-train --resume would continue that run; "
                 "choose a new run directory (mkdir RUN; -o RUN/%s)", run_dir, other, name);
    free(list);
    return TP_OK;
}

int ckpt_foreign_output_refusal(const char *out, const char *what, char *why, size_t size)
{
    why[0] = '\0';
    char run_dir[CKPT_PATH_MAX], name[CKPT_PATH_MAX]; /* "RUN/step_3/" is step_3 */
    if (tp_split_path(out, run_dir, sizeof run_dir, name, sizeof name) != TP_OK || ckpt_step_of_name(name) < 0)
        return TP_OK;
    ckpt_dir_kind kind;
    ckpt_candidate newest;
    TP_TRY(ckpt_run_dir_kind(run_dir, &kind, &newest));
    if (kind == CKPT_DIR_RUN)
        snprintf(why, size, "%s is a run directory, where %s names one of the run's checkpoints, which %s is not "
                 "(tp-train, reaching that step, would stop there rather than replace it): give the output another "
                 "name", run_dir, name, what);
    return TP_OK;
}

/* Removes the temporary files of `latest` updates that died before their
 * rename: with the run directory locked, no update is under way. */
static int remove_dead_temporary(void *ctx, const char *name)
{
    const char *run_dir = ((const void **)ctx)[0];
    const store_ops *storage = ((const void **)ctx)[1];
    char path[CKPT_PATH_MAX];
    if (strncmp(name, "." CKPT_LATEST_NAME ".tmp.", strlen(CKPT_LATEST_NAME) + 6) == 0 &&
        tp_path_join(path, run_dir, name) == TP_OK)
        storage->remove_tree(storage, path);
    return TP_OK;
}

int ckpt_latest_update(const store_ops *storage, const char *run_dir, const char *name, int64_t step)
{
    /* Compare and write under the run directory's lock, so that two writers
     * committing at once cannot move `latest` backwards. */
    if (ckpt_step_of_name(name) < 0) return TP_OK; /* `latest` names step_* checkpoints only */
    store_file *lock = NULL;
    TP_TRY(storage->lock(storage, run_dir, STORE_LOCK_WAIT, &lock));
    const void *ctx[2] = {run_dir, storage};
    int status = storage->list(storage, run_dir, remove_dead_temporary, (void *)ctx);
    int64_t current = -1;
    if (!status) status = resolved_step(storage, run_dir, &current);
    if (!status && current <= step) { /* never move `latest` backwards */
        char line[CKPT_PATH_MAX + 2];
        int n = snprintf(line, sizeof line, "%s\n", name);
        status = store_write_file_atomic(storage, run_dir, CKPT_LATEST_NAME, line, (size_t)n);
    }
    storage->close(lock);
    return status;
}

/* ------------------------------------------------- what --force replaces */

/* What a run directory holds that no --force replaces: its history. */
static int visit_history(void *ctx, const char *name)
{
    (void)ctx;
    return ckpt_step_of_name(name) >= 0 || strcmp(name, CKPT_LATEST_NAME) == 0 ? TP_ERR_EXISTS : TP_OK;
}

int ckpt_refuse_run_directory(const store_ops *s, const char *path)
{
    store_stat st;
    TP_TRY(s->stat(s, path, &st));
    if (!st.exists || !st.is_dir) return TP_OK;
    int status = s->list(s, path, visit_history, NULL);
    if (status == TP_ERR_EXISTS)
        return tp_fail(TP_ERR_EXISTS,
                       "%s is a run directory (it holds step_* checkpoints or 'latest'); --force never replaces "
                       "a run's history: choose another output",
                       path);
    return status;
}

typedef struct {
    char stray[256];
} checkpoint_scan;

static int visit_checkpoint_entry(void *ctx, const char *name)
{
    checkpoint_scan *c = ctx;
    size_t n = strlen(name);
    int shard = strncmp(name, "shard_pp", 8) == 0 && n > 3 && strcmp(name + n - 3, ".h5") == 0;
    if (shard || strcmp(name, CKPT_INDEX_NAME) == 0) return TP_OK;
    snprintf(c->stray, sizeof c->stray, "%s", name);
    return TP_ERR_EXISTS;
}

int ckpt_replaceable_checkpoint(const store_ops *s, const char *path)
{
    store_stat st;
    TP_TRY(s->stat(s, path, &st));
    if (!st.exists) return TP_OK;
    if (!st.is_dir) return tp_fail(TP_ERR_EXISTS, "%s is a file, not a checkpoint; --force replaces only checkpoints", path);
    checkpoint_scan c = {""};
    int status = s->list(s, path, visit_checkpoint_entry, &c);
    if (status == TP_ERR_EXISTS)
        return tp_fail(TP_ERR_EXISTS,
                       "%s holds '%s', which is not part of a checkpoint; --force replaces only checkpoints "
                       "(remove the directory yourself if it is to go)",
                       path, c.stray);
    return status;
}

int ckpt_may_replace_checkpoint(const store_ops *storage, const char *path, void *ctx)
{
    (void)ctx;
    TP_TRY(ckpt_refuse_run_directory(storage, path));
    return ckpt_replaceable_checkpoint(storage, path);
}
