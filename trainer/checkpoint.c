/* checkpoint.c: asynchronous saves and layout-independent loads. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../common/memory.h"
#include "../common/clock.h"
#include "../reshard/reshard.h"
#include "checkpoint.h"
#include "zero.h"

/* A step saved again (a run resumed before it) replaces the checkpoint of
 * that step, not while a reader (an eval, a conversion) holds it: the save
 * waits this long for it to finish, rather than end the run. */
#define SAVE_WAITS_FOR_READERS 600.0

/* Catalogue entries a model view is saved as and loaded from: the parameter
 * and its two moments. */
typedef struct {
    int param, exp_avg, exp_avg_sq; /* indices into the catalogue, -1 if absent */
} view_entries;

/* The catalogue of what a checkpoint holds of the model (with the optimizer
 * state or not), and each model view's entries in it. */
typedef struct {
    gpt_tensor *catalog;
    int count;
    view_entries *entries; /* per model view */
} tensor_map;

static void tensor_map_free(tensor_map *map)
{
    free(map->catalog);
    free(map->entries);
    memset(map, 0, sizeof *map);
}

static int tensor_map_create(tensor_map *map, const gpt_model *m, int with_optimizer)
{
    memset(map, 0, sizeof *map);
    TP_TRY(gpt_catalog(&m->config, with_optimizer, &map->catalog, &map->count));
    map->entries = calloc((size_t)m->num_params + 1, sizeof *map->entries);
    if (!map->entries) {
        tensor_map_free(map);
        return tp_fail(TP_ERR_NOMEM, "out of memory for the checkpoint's catalogue");
    }
    /* The catalogue has the parameters first, in the model's order, then
     * the optimizer state, each entry naming its parameter. */
    for (int i = 0; i < m->num_params; i++) {
        int param = (int)(m->params[i].spec - m->catalog);
        map->entries[i] = (view_entries){param, -1, -1};
        for (int k = m->num_catalog; k < map->count; k++) {
            if (map->catalog[k].param_index != param) continue;
            if (map->catalog[k].role == GPT_ROLE_EXP_AVG) map->entries[i].exp_avg = k;
            if (map->catalog[k].role == GPT_ROLE_EXP_AVG_SQ) map->entries[i].exp_avg_sq = k;
        }
    }
    return TP_OK;
}

struct saver {
    gpt_model *model;
    int dump_grads;
    tensor_map map;
    /* What this rank writes, of each view it owns (param_view's owner): the
     * parameter (or gradient), the first rank of its data-parallel group
     * (ZeRO-3: its writer, param_view's writer); the moments, its writer.
     * Their offsets in the snapshot, -1 where another rank writes them; and per catalogue entry,
     * whether this rank's file holds its pieces of this rank's shard. */
    int64_t *param_at, *moment_at;
    char *here;
    float *snapshot;       /* per view written: data | m | v, each where this rank writes it (or the gradient alone) */
    int64_t snapshot_floats;
    pthread_t thread;      /* writes this rank's shard */
    int running, pending;
    atomic_int done;
    int status;
    char message[1024];
    pthread_t commit_thread; /* rank 0: commits once every shard is written */
    int committing, commit_threaded;
    atomic_int commit_done;
    int commit_status;
    char commit_message[1024];
    char *model_json, *rng;
    atomic_int snapshot_taken; /* parameters and moments may change again */
    void *mark;                /* the step's end in the device's work (mark_work): the snapshot copies after it */
    char path[4096];
    char owner[STORE_OWNER_MAX]; /* of the shared staging directories: rank 0's */
    /* A save to an object store (saver_start's url): each writing rank
     * stages its shard in its own local directory, under its own owner
     * name, uploads it and describes it; rank 0 gathers the descriptions
     * and uploads the index. No rank reads another's files: no file system
     * is shared. */
    char url[CKPT_PATH_MAX];        /* of the pending save; "" for a local one */
    char own_owner[STORE_OWNER_MAX];
    ckpt_run_claim *claim;          /* rank 0: the run directory's lease, checked before the index goes up */
    char *description;              /* this rank's shard, uploaded */
    char **descriptions;            /* rank 0: every rank's (world entries) */
    int upload_failed;              /* this rank's write went well, its upload did not */
    save_phases phases;             /* of the pending save: this rank's, then (rank 0) the slowest rank's */
    save_phases committed_phases[2];
    int failed;                     /* uploads that failed, not yet taken (at most two, as committed) */
    struct {
        int64_t step;
        char message[1024];
    } failed_upload[2];             /* the oldest first */
    int64_t step, consumed;
    uint64_t seed;
    char *schedule, *user;
    double stall;
    double started;             /* now_seconds() when the pending save began */
    int committed;              /* commits not yet taken by saver_take_committed (at most two: see there) */
    int64_t committed_step[2];
    double committed_seconds[2];
};

int checkpoint_staging_owner(comm *c, char *owner)
{
    int status = c->rank == 0 ? store_staging_owner(owner, STORE_OWNER_MAX) : TP_OK;
    TP_TRY(comm_agree(c, status, "staging owner"));
    return comm_broadcast(c, owner, STORE_OWNER_MAX, 0, COMM_HOST);
}

int saver_create(saver **out, gpt_model *m, int dump_grads)
{
    *out = NULL;
    saver *s = calloc(1, sizeof *s);
    if (!s) return tp_fail(TP_ERR_NOMEM, "out of memory for checkpoint snapshots");
    s->model = m;
    s->dump_grads = dump_grads;
    atomic_init(&s->snapshot_taken, 1);
    int status = checkpoint_staging_owner(m->comm, s->owner);
    if (!status) status = store_staging_owner(s->own_owner, sizeof s->own_owner);
    if (!status) status = tensor_map_create(&s->map, m, !dump_grads);
    if (!status) {
        size_t views = (size_t)m->num_params + 1;
        s->param_at = malloc(views * sizeof *s->param_at);
        s->moment_at = malloc(views * sizeof *s->moment_at);
        s->here = malloc((size_t)s->map.count + 1);
        if (!s->param_at || !s->moment_at || !s->here) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    if (status) {
        saver_free(s);
        return status;
    }
    /* The first rank writes every parameter (but with ZeRO-3) and, without
     * a sharded optimizer, every moment: all its shard's pieces. */
    int dp_rank = m->comm->dp_rank;
    memset(s->here, dp_rank == 0, (size_t)s->map.count);
    for (int i = 0; i < m->num_params; i++) {
        const param_view *v = &m->params[i];
        const view_entries *e = &s->map.entries[i];
        s->param_at[i] = s->moment_at[i] = -1;
        if (!v->owner) continue;
        int writes = v->writer == dp_rank;
        if (m->zero == 3 ? writes : dp_rank == 0) {
            s->param_at[i] = s->snapshot_floats;
            s->snapshot_floats += v->numel;
        }
        s->here[e->param] = (char)(s->param_at[i] >= 0);
        if (dump_grads) continue;
        s->here[e->exp_avg] = s->here[e->exp_avg_sq] = (char)writes;
        if (writes) {
            s->moment_at[i] = s->snapshot_floats;
            s->snapshot_floats += 2 * v->numel;
        }
    }
    *out = s;
    return TP_OK;
}

int saver_reserve(saver *s)
{
    const gpt_model *m = s->model;
    /* Only the ranks that write (saver_create). Pinned on a GPU: the
     * snapshot is copied beside the next step's work. */
    if (s->snapshot || !s->snapshot_floats) return TP_OK;
    return m->kernels->host_alloc((void **)&s->snapshot, (size_t)s->snapshot_floats * sizeof(float));
}

void saver_set_claim(saver *s, ckpt_run_claim *claim)
{
    s->claim = claim;
}

/* Where a save goes: this rank's staging owner, and its shard. */
static void shard_options(const saver *s, ckpt_write_options *options)
{
    const comm *c = s->model->comm;
    ckpt_write_options_init(options);
    options->overwrite = 1;
    options->wait_for_readers = SAVE_WAITS_FOR_READERS;
    options->shard_pp = c->pp_rank;
    options->shard_tp = c->tp_rank;
    options->shard_dp = c->dp_rank; /* the first rank: the shard's file; the others (ZeRO-1) their own */
    options->staging_owner = s->url[0] ? s->own_owner : s->owner;
}

/* An object store: the finished shard up, described for the commit. */
static int upload_shard(saver *s, const ckpt_layout *layout, const ckpt_write_options *options)
{
    ckpt_upload_options upload;
    ckpt_upload_options_init(&upload);
    upload.threads = 4; /* network-bound: few threads, the cores are training */
    free(s->description);
    s->description = NULL;
    return ckpt_shard_upload(s->path, layout, options, s->url, &upload, &s->description);
}

void saver_free(saver *s)
{
    if (!s) return;
    if (s->running) pthread_join(s->thread, NULL);
    if (s->committing && s->commit_threaded) pthread_join(s->commit_thread, NULL);
    free(s->description);
    comm_texts_free(s->descriptions, s->model->comm->world);
    cJSON_free(s->model_json);
    cJSON_free(s->rng);
    if (s->snapshot) s->model->kernels->host_release(s->snapshot);
    s->model->kernels->release_mark(s->mark);
    free(s->param_at);
    free(s->moment_at);
    free(s->here);
    tensor_map_free(&s->map);
    free(s->schedule);
    free(s->user);
    free(s);
}

double saver_take_stall_seconds(saver *s)
{
    double stall = s->stall;
    s->stall = 0;
    return stall;
}

/* Parameters and moments (or gradients) this rank writes into the
 * snapshot (host memory), in one call: on a GPU the copies wait for the
 * saved step's work alone (s->mark), not for the next step's that the
 * training thread has issued since, so that they run beside it. */
static int take_snapshot(saver *s)
{
    const gpt_model *m = s->model;
    host_copy *copies = malloc((size_t)(3 * m->num_params + 1) * sizeof *copies);
    if (!copies) return tp_fail(TP_ERR_NOMEM, "out of memory for the checkpoint snapshot's list of copies");
    int count = 0;
    for (int i = 0; i < m->num_params; i++) {
        const param_view *v = &m->params[i];
        size_t bytes = (size_t)v->numel * sizeof(float);
        /* A sharded optimizer's state: saver_start placed it (zero_gather_state). */
        if (s->param_at[i] >= 0 && m->zero != 3)
            copies[count++] = (host_copy){s->snapshot + s->param_at[i], s->dump_grads ? v->grad : v->data, bytes};
        if (s->moment_at[i] < 0 || !v->m) continue;
        copies[count++] = (host_copy){s->snapshot + s->moment_at[i], v->m, bytes};
        copies[count++] = (host_copy){s->snapshot + s->moment_at[i] + v->numel, v->v, bytes};
    }
    int status = m->kernels->to_host_background(s->mark, copies, count);
    free(copies);
    return status;
}

/* Background: the snapshot, then this rank's shard from it. The snapshot is
 * taken while the next step runs its forward and backward passes, which read
 * parameters and moments but do not change them; the optimizer waits for it
 * (saver_before_update). */
static void *write_shard(void *arg)
{
    saver *s = arg;
    int snapshot_status = take_snapshot(s);
    s->model->kernels->release_mark(s->mark);
    s->mark = NULL;
    atomic_store(&s->snapshot_taken, 1);
    /* Then training has the processor first: the shard is written in its gaps
     * (on Linux, nice applies to the calling thread; failure only costs speed). */
    (void)setpriority(PRIO_PROCESS, (id_t)gettid(), 10);
    gpt_model *m = s->model;
    comm *c = m->comm;
    ckpt_layout layout = {c->tp, c->pp, c->dp, m->config.layers, m->virtual_stages};
    ckpt_write_options options;
    shard_options(s, &options);
    ckpt_writer *w = NULL;
    int *ids = calloc((size_t)s->map.count + 1, sizeof *ids);
    int status = snapshot_status ? snapshot_status
                 : ids           ? ckpt_writer_create(&w, s->path, &layout, &options)
                                 : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->map.count && !status; i++)
        status = s->here[i] ? ckpt_writer_add_tensor(w, &s->map.catalog[i].desc, &ids[i])
                            : ckpt_writer_add_tensor_elsewhere(w, &s->map.catalog[i].desc, &ids[i]);
    for (int i = 0; i < m->num_params && !status; i++) {
        const param_view *v = &m->params[i];
        const view_entries *e = &s->map.entries[i];
        if (s->param_at[i] >= 0) status = ckpt_writer_put_piece(w, ids[e->param], v->piece, s->snapshot + s->param_at[i]);
        if (!status && s->moment_at[i] >= 0)
            status = ckpt_writer_put_piece(w, ids[e->exp_avg], v->piece, s->snapshot + s->moment_at[i]);
        if (!status && s->moment_at[i] >= 0)
            status = ckpt_writer_put_piece(w, ids[e->exp_avg_sq], v->piece, s->snapshot + s->moment_at[i] + v->numel);
    }
    if (status) snprintf(s->message, sizeof s->message, "%s", tp_errmsg());
    if (w) {
        if (status) ckpt_writer_abort(w);
        else if ((status = ckpt_writer_finish(w)) != TP_OK) snprintf(s->message, sizeof s->message, "%s", tp_errmsg());
    }
    double written = now_seconds();
    s->phases.write = written - s->started;
    if (!status && s->url[0] && (status = upload_shard(s, &layout, &options)) != TP_OK) {
        snprintf(s->message, sizeof s->message, "%s", tp_errmsg());
        s->upload_failed = 1;
    }
    s->phases.upload = now_seconds() - written;
    free(ids);
    s->status = status;
    atomic_store(&s->done, 1);
    return NULL;
}

/* The seed of rng_json's first rank ("SEED:STEP", every rank's alike), as
 * rng_json writes it: 1, or 0 for another writer's state (an import). */
static int recorded_seed(const char *text, uint64_t *seed)
{
    cJSON *a = text ? cJSON_Parse(text) : NULL;
    const cJSON *state = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(a, 0), "state");
    unsigned long long value, step;
    char end;
    int found = cJSON_IsString(state) && sscanf(state->valuestring, "%16llx:%llu%c", &value, &step, &end) == 2;
    if (found) *seed = value;
    cJSON_Delete(a);
    return found;
}

static char *rng_json(const comm *c, uint64_t seed, int64_t step)
{
    /* The trainer draws its numbers from counters (seed, sample, element), so a
     * rank's state is the seed and the step it resumes at. */
    cJSON *a = cJSON_CreateArray();
    for (int r = 0; r < c->world; r++) {
        char state[64];
        snprintf(state, sizeof state, "%016llx:%llu", (unsigned long long)seed, (unsigned long long)step);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "pp", r / c->tp % c->pp);
        cJSON_AddNumberToObject(o, "tp", r % c->tp);
        cJSON_AddNumberToObject(o, "dp", r / (c->tp * c->pp));
        cJSON_AddStringToObject(o, "state", state);
        cJSON_AddItemToArray(a, o);
    }
    char *text = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    return text;
}

/* Rank 0, in the background: the commit (index, fsyncs, renames, latest). */
static void *commit_checkpoint(void *arg)
{
    saver *s = arg;
    gpt_model *m = s->model;
    comm *c = m->comm;
    ckpt_layout layout = {c->tp, c->pp, c->dp, m->config.layers, m->virtual_stages};
    ckpt_train_state state = {s->step, s->consumed, s->model_json, s->schedule, s->rng, s->user};
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.overwrite = 1;
    options.wait_for_readers = SAVE_WAITS_FOR_READERS;
    options.update_latest = 1;
    options.staging_owner = s->owner;
    double start = now_seconds();
    if (s->url[0])
        s->commit_status = ckpt_commit_uploaded(s->url, &layout, &state, (const char *const *)s->descriptions,
                                                c->world, s->claim, 1, &s->phases.bytes);
    else
        s->commit_status = ckpt_commit_staged(s->path, &layout, &state, &options);
    s->phases.index = now_seconds() - start;
    if (s->commit_status != TP_OK) snprintf(s->commit_message, sizeof s->commit_message, "%s", tp_errmsg());
    atomic_store(&s->commit_done, 1);
    return NULL;
}

/* A failed upload (of a shard or of the index, after the retries): the
 * checkpoint is not made, and training goes on (the next one goes up
 * whole); every rank keeps the message of the lowest rank that failed, for
 * saver_take_failed_upload. Collective. */
static int upload_lost(saver *s, int failed_here, const char *message)
{
    char said[1024] = "";
    int any;
    if (failed_here) snprintf(said, sizeof said, "%s", message);
    TP_TRY(comm_first_failure(s->model->comm, failed_here, said, sizeof said, &any));
    if (s->failed == 2) { /* not taken: the oldest goes */
        s->failed_upload[0] = s->failed_upload[1];
        s->failed = 1;
    }
    s->failed_upload[s->failed].step = s->step;
    snprintf(s->failed_upload[s->failed].message, sizeof s->failed_upload[0].message, "%s", said);
    s->failed++;
    s->pending = 0;
    return TP_OK;
}

/* Every shard is written (or failed): all ranks learn it; rank 0 starts the commit. */
static int finish_writes(saver *s)
{
    gpt_model *m = s->model;
    comm *c = m->comm;
    if (s->running) {
        pthread_join(s->thread, NULL);
        s->running = 0;
    }
    int failed, write_failed;
    TP_TRY(comm_any(c, s->status != TP_OK, &failed));
    if (failed) {
        /* Disk full or the like: what was written goes, the older
         * checkpoints stay (docs/RELIABILITY.md, "Training"). */
        ckpt_write_options options;
        shard_options(s, &options);
        if (s->url[0]) ckpt_stage_discard(s->path, &options); /* a shard not written whole */
        else if (c->rank == 0) ckpt_stage_discard(s->path, &options);
        TP_TRY(comm_any(c, s->status != TP_OK && !s->upload_failed, &write_failed));
        if (!write_failed) return upload_lost(s, s->status != TP_OK, s->message);
        s->pending = 0;
        return tp_fail(s->status ? s->status : TP_ERR_STATE, "checkpoint %s: %s", s->path,
                       s->status ? s->message : "another rank failed to write its shard");
    }
    if (s->url[0]) {
        comm_texts_free(s->descriptions, c->world);
        s->descriptions = NULL;
        TP_TRY(comm_gather_texts(c, s->description, 0, &s->descriptions));
        free(s->description);
        s->description = NULL;
        double slowest[2] = {s->phases.write, s->phases.upload};
        TP_TRY(comm_all_reduce(c, GROUP_WORLD, slowest, 2, COMM_DOUBLE, COMM_MAX, COMM_HOST));
        s->phases.write = slowest[0];
        s->phases.upload = slowest[1];
    }
    s->committing = 1;
    if (c->rank != 0) return TP_OK;
    cJSON_free(s->model_json);
    cJSON_free(s->rng);
    s->model_json = gpt_config_to_json(&m->config);
    s->rng = rng_json(c, s->seed, s->step);
    atomic_store(&s->commit_done, 0);
    s->commit_threaded = pthread_create(&s->commit_thread, NULL, commit_checkpoint, s) == 0;
    if (!s->commit_threaded) commit_checkpoint(s); /* no thread to be had: commit now */
    return TP_OK;
}

/* The commit is done on rank 0: all ranks learn its outcome. */
static int finish_commit(saver *s)
{
    comm *c = s->model->comm;
    if (s->commit_threaded) pthread_join(s->commit_thread, NULL);
    s->committing = s->commit_threaded = 0;
    s->pending = 0;
    int failed;
    TP_TRY(comm_any(c, c->rank == 0 && s->commit_status != TP_OK, &failed));
    if (failed && s->url[0]) return upload_lost(s, c->rank == 0, s->commit_message);
    if (failed)
        return tp_fail(c->rank == 0 ? s->commit_status : TP_ERR_STATE, "checkpoint %s: %s", s->path,
                       c->rank == 0 ? s->commit_message : "commit failed on rank 0");
    if (s->committed == 2) { /* not taken: the oldest goes */
        s->committed_step[0] = s->committed_step[1];
        s->committed_seconds[0] = s->committed_seconds[1];
        s->committed_phases[0] = s->committed_phases[1];
        s->committed = 1;
    }
    s->committed_step[s->committed] = s->step;
    s->committed_seconds[s->committed] = now_seconds() - s->started;
    s->committed_phases[s->committed] = s->phases;
    s->committed++;
    return TP_OK;
}

int saver_take_failed_upload(saver *s, int64_t *step, char *message, size_t size)
{
    if (!s->failed) return 0;
    *step = s->failed_upload[0].step;
    snprintf(message, size, "%s", s->failed_upload[0].message);
    s->failed_upload[0] = s->failed_upload[1];
    s->failed--;
    return 1;
}

int saver_take_committed(saver *s, int64_t *step, double *seconds, save_phases *phases)
{
    if (!s->committed) return 0;
    *step = s->committed_step[0];
    *seconds = s->committed_seconds[0];
    if (phases) *phases = s->committed_phases[0];
    s->committed_step[0] = s->committed_step[1];
    s->committed_seconds[0] = s->committed_seconds[1];
    s->committed_phases[0] = s->committed_phases[1];
    s->committed--;
    return 1;
}

void saver_before_update(saver *s)
{
    if (atomic_load(&s->snapshot_taken)) return;
    double start = now_seconds();
    struct timespec pause = {0, 20000};
    while (!atomic_load(&s->snapshot_taken)) nanosleep(&pause, NULL);
    s->stall += now_seconds() - start;
}

int saver_poll(saver *s, int wait)
{
    if (!s->pending) return TP_OK;
    double start = now_seconds();
    comm *c = s->model->comm;
    int status = TP_OK, not_done = 0;
    if (!s->committing) {
        status = comm_any(c, s->running && !wait && !atomic_load(&s->done), &not_done);
        if (!status && !not_done) status = finish_writes(s);
    }
    if (!status && s->committing) {
        status = comm_any(c, c->rank == 0 && !wait && !atomic_load(&s->commit_done), &not_done);
        if (!status && !not_done) status = finish_commit(s);
    }
    s->stall += now_seconds() - start;
    return status;
}

int64_t saver_pending_step(const saver *s)
{
    return s->pending ? s->step : -1;
}

/* A save to an object store that could not stage its files in the local
 * cache (path's parent), status: when the cache itself is gone (removed
 * while the run went on: a cleaner of /tmp, an operator), says so. It is
 * not made again: it held the lock that keeps other trainers out of it
 * (docs/FORMAT.md, the local cache of a remote run is locked as a run
 * directory), which went with it, and whoever removed it may do so again
 * under the next save; every checkpoint already uploaded is in the store,
 * where --resume finds it. */
static int cache_gone(const char *path, int status)
{
    char cache[CKPT_PATH_MAX], name[CKPT_PATH_MAX];
    struct stat st;
    if (tp_split_path(path, cache, sizeof cache, name, sizeof name) != TP_OK || stat(cache, &st) == 0 ||
        errno != ENOENT)
        return status;
    return tp_fail(TP_ERR_NOT_FOUND, "the local cache %s, where checkpoints are staged before they go up, is gone "
                   "(removed while the run went on?); not made again, as the lock it held for this run went with it: "
                   "tp-train --resume continues from the newest checkpoint in the store", cache);
}

int saver_start(saver *s, const char *path, const char *url, const save_state *state, int sync)
{
    gpt_model *m = s->model;
    comm *c = m->comm;
    if (s->pending) TP_TRY(saver_poll(s, 1));
    double start = now_seconds();
    s->started = start;
    memset(&s->phases, 0, sizeof s->phases);
    snprintf(s->path, sizeof s->path, "%s", path);
    if (url && strlen(url) >= sizeof s->url) return tp_fail(TP_ERR_ARG, "URL too long: %s", url);
    snprintf(s->url, sizeof s->url, "%s", url ? url : "");
    s->step = state->step;
    s->consumed = state->consumed_samples;
    s->seed = state->seed;
    free(s->schedule);
    free(s->user);
    s->schedule = strdup(state->schedule_json ? state->schedule_json : "{}");
    s->user = strdup(state->user_json ? state->user_json : "{}");
    int staged = saver_reserve(s), failed, begin_failed = 0;
    ckpt_write_options options;
    shard_options(s, &options);
    char begin_error[1024] = "";
    if (url) {
        /* A step saved again (a run resumed before it): its old index goes
         * before any rank uploads a shard (the comm_any below orders them). */
        if (!staged && c->rank == 0 && (staged = ckpt_upload_begin(s->url, 1)) != TP_OK) {
            begin_failed = 1;
            snprintf(begin_error, sizeof begin_error, "%s", tp_errmsg());
        }
        if (!staged && s->snapshot_floats) staged = ckpt_stage_prepare(path, &options);
    } else if (c->rank == 0 && !staged) {
        staged = ckpt_stage_prepare(path, &options);
    }
    TP_TRY(comm_any(c, staged != TP_OK, &failed));
    if (failed && s->url[0]) {
        /* The store did not answer whether the step is there (an outage
         * through every retry): this checkpoint is lost as a failed upload
         * is, nothing of it written and an older one of the step left as it
         * is, and training goes on; a failure of this machine's staging
         * stays an error. */
        int other;
        TP_TRY(comm_any(c, staged != TP_OK && !begin_failed, &other));
        if (!other) {
            if (s->snapshot_floats) ckpt_stage_discard(path, &options);
            return upload_lost(s, begin_failed, begin_error);
        }
    }
    if (failed) {
        if (s->url[0] && s->snapshot_floats) ckpt_stage_discard(path, &options);
        if (staged && s->url[0]) staged = cache_gone(path, staged);
        if (staged) return tp_fail_context(staged, "checkpoint %s", s->url[0] ? s->url : path);
        return tp_fail(TP_ERR_STATE, "checkpoint %s: another rank cannot stage it", s->url[0] ? s->url : path);
    }
    /* A sharded optimizer: the moments (ZeRO-3: and parameters, or
     * gradients) of every shard into their writers' snapshots, now
     * (collective; the writer's thread must not communicate). */
    int sharded = s->dump_grads ? ZERO_GRADS : ZERO_PARAMS | ZERO_MOMENTS;
    TP_TRY(zero_gather_state(m, sharded, s->snapshot, s->snapshot ? s->param_at : NULL,
                             s->snapshot ? s->moment_at : NULL));
    s->status = TP_OK;
    s->upload_failed = 0;
    atomic_store(&s->done, 1);
    atomic_store(&s->snapshot_taken, 1);
    if (s->snapshot_floats) {
        /* The saved step's end in the device's work: issued before this
         * call. Without one (a failed mark) the snapshot waits for all the
         * work issued when it starts: slower, the same contents, and no rank
         * leaves the save alone. */
        if (m->kernels->mark_work(&s->mark) != TP_OK) s->mark = NULL;
        atomic_store(&s->done, 0);
        atomic_store(&s->snapshot_taken, 0);
        if (pthread_create(&s->thread, NULL, write_shard, s) != 0) {
            m->kernels->release_mark(s->mark);
            s->mark = NULL;
            s->status = TP_ERR_STATE;
            snprintf(s->message, sizeof s->message, "cannot start the checkpoint writer thread");
            atomic_store(&s->done, 1);
            atomic_store(&s->snapshot_taken, 1);
        } else {
            s->running = 1;
        }
    }
    s->pending = 1;
    s->stall += now_seconds() - start;
    return sync ? saver_poll(s, 1) : TP_OK;
}

/* ------------------------------------------------------------------- load */

/* Reads one tensor's piece for a view into out (the model's memory: on a
 * device through a host buffer; or host memory when host_out); *absent says
 * the checkpoint has no such tensor. */
static int read_view(const gpt_model *m, ckpt_reader *r, const char *name, const ckpt_tensor_desc *desc, int piece,
                     float *out, int host_out, int64_t numel, int *absent)
{
    int index = ckpt_reader_find(r, name);
    *absent = index < 0;
    if (*absent) return TP_OK;
    size_t bytes = (size_t)numel * sizeof(float);
    if (host_out || !m->kernels->on_device) return reshard_read_piece(r, index, desc, m->comm->tp, piece, out, bytes);
    float *host = alloc_pages(bytes);
    if (!host) return tp_fail(TP_ERR_NOMEM, "out of memory reading %s (%zu bytes)", name, bytes);
    int status = reshard_read_piece(r, index, desc, m->comm->tp, piece, host, bytes);
    if (!status) status = gpt_model_from_host(m, out, host, numel);
    free(host);
    return status;
}

/* The checkpoint at path opened on the first replica (r), with the model
 * it holds checked against this run's (*other_model when it differs: the
 * checkpoint is whole, the run's flags are not its model's). */
static int open_for_load(const gpt_model *m, const char *path, const char *index_text, ckpt_reader **r,
                         int *other_model)
{
    ckpt_read_options options;
    ckpt_read_options_init(&options);
    options.index_text = index_text;
    options.sizes_on_read = 1; /* no HEAD of each shard by each reader */
    TP_TRY(ckpt_reader_open(r, path, &options));
    gpt_config config;
    int status = gpt_config_from_json(ckpt_reader_state(*r)->model_json, &config);
    if (status) return tp_fail_context(status, "%s", path);
    status = gpt_config_check_same(path, &config, &m->config);
    if (status) *other_model = 1;
    return status;
}

/* View i's parameter into `param` (host memory where host_param, else the
 * model's) and, where asked (moments[k] not NULL), its first and second
 * moments (host memory where host_moments); a checkpoint without them
 * leaves them zero and sets *missing_optimizer. */
static int read_view_state(gpt_model *m, ckpt_reader *r, const char *path, const tensor_map *map, int i, float *param,
                           int host_param, float *const moments[2], int host_moments, int *missing_optimizer)
{
    const param_view *v = &m->params[i];
    const view_entries *e = &map->entries[i];
    int absent;
    TP_TRY(read_view(m, r, v->spec->name, &v->spec->desc, v->piece, param, host_param, v->numel, &absent));
    if (absent) return tp_fail(TP_ERR_FORMAT, "%s: tensor %s missing", path, v->spec->name);
    const int moment_ids[2] = {e->exp_avg, e->exp_avg_sq};
    for (int k = 0; k < 2; k++) {
        if (moment_ids[k] < 0 || !moments[k]) { /* not asked for */
            *missing_optimizer = 1;
            continue;
        }
        TP_TRY(read_view(m, r, map->catalog[moment_ids[k]].name, &v->spec->desc, v->piece, moments[k], host_moments,
                         v->numel, &absent));
        if (absent) { /* a checkpoint without optimizer state: it starts afresh */
            if (host_moments) memset(moments[k], 0, (size_t)v->numel * sizeof(float));
            else TP_TRY(m->kernels->zero(moments[k], (size_t)v->numel * sizeof(float)));
            *missing_optimizer = 1;
        }
    }
    return TP_OK;
}

/* Where a load puts what the first replica reads: the model's memory, or
 * with a sharded optimizer host buffers that zero.h hands out. */
typedef struct {
    float *moments;     /* ZeRO-1, first replica: [2, total], first then second moments at flat */
    float *unit_state;  /* ZeRO-3, first replica: [3, unit_span] (or [1, ...] without the moments): a unit's
                           parameters, first and second moments, each from the unit's first value */
    int64_t unit_span;  /* the largest unit's span */
    int64_t host_bytes; /* what moments or unit_state hold (load_result's host_state_bytes) */
    zero_scatter scatter; /* ZeRO-3, every rank: the unit being handed out */
} load_buffers;

/* ZeRO-3: the first replica reads a unit's views into unit_state and hands
 * them out (zero_scatter_unit) before it reads the next, so that it holds
 * one unit's state at once, not the whole stage's. *read_status is its
 * verdict so far: the group stops at the unit where it failed. Returns a
 * failure to hand a unit out (of the communicator, or of a rank's copies:
 * the same on the group). Collective over each data-parallel group. */
static int load_units(gpt_model *m, ckpt_reader *r, const char *path, const tensor_map *map, load_buffers *b,
                      int *read_status, int *missing_optimizer)
{
    int root = m->comm->dp_rank == 0, with_moments = (b->scatter.what & ZERO_MOMENTS) != 0;
    int64_t span = b->unit_span;
    for (int k = 0; k < m->num_units; k++) {
        const zero_unit *u = &m->units[k];
        if (root && !*read_status) {
            for (int kind = 0; kind < (with_moments ? 3 : 1); kind++) /* the padding, and moments not read */
                memset(b->unit_state + kind * span, 0, (size_t)zero_unit_span(m, u) * sizeof(float));
            for (int i = u->first_view; i < u->first_view + u->views && !*read_status; i++) {
                int64_t at = m->params[i].flat - u->first;
                float *const moments[2] = {with_moments ? b->unit_state + span + at : NULL,
                                           with_moments ? b->unit_state + 2 * span + at : NULL};
                *read_status = read_view_state(m, r, path, map, i, b->unit_state + at, 1, moments, 1, missing_optimizer);
            }
        }
        int failed = *read_status != TP_OK;
        TP_TRY(comm_all_reduce(m->comm, GROUP_DP, &failed, 1, COMM_INT, COMM_MAX, COMM_HOST));
        if (failed) return TP_OK;
        TP_TRY(zero_scatter_unit(m, &b->scatter, k, root ? b->unit_state : NULL, root ? b->unit_state + span : NULL,
                                 span));
    }
    return TP_OK;
}

/* Loads the views of map (with the moments when it has them) from the
 * checkpoint at path, whose index.json rank 0 read (index_text): the first
 * replica reads, into the model's memory or, with a sharded optimizer, into
 * b's buffers; with ZeRO-3 every rank of each group takes its shard unit by
 * unit (load_units). Returns a failure of the first replica's reading (the
 * others return TP_OK): the checkpoint is unusable. *handing_out is a
 * failure to hand ZeRO-3's units out, which no other checkpoint mends;
 * *other_model says the checkpoint holds another model than the run's. */
static int load_one(gpt_model *m, const char *path, const char *index_text, const tensor_map *map, load_buffers *b,
                    load_result *out, int *handing_out, int *other_model)
{
    *handing_out = TP_OK;
    *other_model = 0;
    /* Only the first data-parallel replica reads; the others get its values
     * over their group (a store sees each piece read once, not dp times:
     * docs/SCALE.md). */
    int root = m->comm->dp_rank == 0;
    if (!root && m->zero != 3) return TP_OK;
    ckpt_reader *r = NULL;
    int status = root ? open_for_load(m, path, index_text, &r, other_model) : TP_OK, missing_optimizer = 0;
    if (m->zero == 3) *handing_out = load_units(m, r, path, map, b, &status, &missing_optimizer);
    for (int i = 0; i < m->num_params && m->zero != 3 && !status; i++) {
        param_view *v = &m->params[i];
        float *const moments[2] = {m->zero ? (b->moments ? b->moments + v->flat : NULL) : v->m,
                                   m->zero ? (b->moments ? b->moments + m->total + v->flat : NULL) : v->v};
        status = read_view_state(m, r, path, map, i, v->data, 0, moments, m->zero != 0, &missing_optimizer);
    }
    if (root && !status && !*handing_out) {
        const ckpt_train_state *state = ckpt_reader_state(r);
        out->step = state->step;
        out->consumed_samples = state->consumed_samples;
        out->optimizer_loaded = !missing_optimizer;
        out->seed_recorded = recorded_seed(state->rng_json, &out->seed);
        if (state->schedule_json && strlen(state->schedule_json) < sizeof out->schedule_json)
            snprintf(out->schedule_json, sizeof out->schedule_json, "%s", state->schedule_json);
        if (state->user_json && strlen(state->user_json) < sizeof out->run_json)
            snprintf(out->run_json, sizeof out->run_json, "%s", state->user_json);
        out->host_state_bytes = b->host_bytes;
        snprintf(out->path, sizeof out->path, "%s", ckpt_reader_path(r));
    }
    if (r) ckpt_reader_close(r);
    return status;
}

/* After the first replica loaded a checkpoint: its parameters (and
 * moments) to every replica, over each data-parallel group (a sum with the
 * others' zeros; a sharded optimizer's moments, from `moments`, to their
 * shards; ZeRO-3's state went out unit by unit as it was read), and what it
 * learnt of the checkpoint to every rank. Collective. */
static int share_over_replicas(gpt_model *m, int with_optimizer, const float *moments, load_result *out)
{
    comm *c = m->comm;
    if (m->zero != 3 && c->dp > 1) {
        size_t bytes = (size_t)m->total * sizeof(float);
        int moments_in_memory = with_optimizer && !m->zero;
        if (c->dp_rank != 0) {
            TP_TRY(m->kernels->zero(m->memory, bytes));
            if (moments_in_memory) TP_TRY(m->kernels->zero(m->memory + 2 * m->total, 2 * bytes));
        }
        TP_TRY(comm_all_reduce(c, GROUP_DP, m->memory, m->total, COMM_FLOAT, COMM_SUM, m->stream));
        if (moments_in_memory)
            TP_TRY(comm_all_reduce(c, GROUP_DP, m->memory + 2 * m->total, 2 * m->total, COMM_FLOAT, COMM_SUM, m->stream));
        if (with_optimizer) TP_TRY(zero_scatter_state(m, ZERO_MOMENTS, NULL, moments));
    }
    int64_t own = out->host_state_bytes;
    TP_TRY(comm_broadcast(c, out, (int64_t)sizeof *out, 0, COMM_HOST)); /* rank 0 read it */
    out->host_state_bytes = own;
    return TP_OK;
}

/* The checkpoints of dir to try, as rank 0 lists them, told to every rank
 * (one listing of a store, not one per rank). Collective. */
static int shared_candidates(comm *c, const char *dir, ckpt_candidate **list, int *count)
{
    *list = NULL;
    *count = 0;
    int64_t n = 0;
    int status = c->rank == 0 ? ckpt_candidates(dir, list, count) : TP_OK;
    n = *count;
    TP_TRY(comm_agree_root(c, status, dir));
    TP_TRY(comm_broadcast(c, &n, (int64_t)sizeof n, 0, COMM_HOST));
    if (c->rank != 0 && n > 0 && !(*list = calloc((size_t)n, sizeof **list))) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    status = comm_agree(c, status, dir);
    if (!status && n > 0) status = comm_broadcast(c, *list, n * (int64_t)sizeof **list, 0, COMM_HOST);
    if (status) {
        free(*list);
        *list = NULL;
        return status;
    }
    *count = (int)n;
    return TP_OK;
}

/* The index.json of the checkpoint at path as rank 0 reads it, to every
 * rank (its store sees one read of it, not one per reader). *failed, the
 * status of rank 0's read when it could not read it (its reason in
 * tp_errmsg there; elsewhere TP_ERR_NOT_FOUND); a failure of the
 * communicator is returned. Collective. */
static int shared_index_text(comm *c, const char *path, char **text, int *failed)
{
    *text = NULL;
    *failed = c->rank == 0 ? ckpt_read_index_text(path, text) : TP_OK;
    int status = comm_broadcast_text(c, text, 0);
    if (!status && !*text && !*failed)
        *failed = tp_fail(TP_ERR_NOT_FOUND, "%s: rank 0 could not read its index.json", path);
    if (status) {
        free(*text);
        *text = NULL;
    }
    return status;
}

int checkpoint_any(comm *c, const char *dir, int *dir_exists, int *any)
{
    *any = *dir_exists = 0;
    int found = 0, exists = 0, status = TP_OK;
    if (c->rank == 0) {
        const store_ops *store = NULL;
        store_stat st = {0};
        status = store_for(dir, &store);
        if (!status) status = store->stat(store, dir, &st);
        ckpt_candidate *list = NULL;
        int count = 0;
        exists = !status && st.exists;
        /* None committed is "none yet"; a store that could not say is its failure. */
        int listed = exists ? ckpt_candidates(dir, &list, &count) : TP_ERR_NOT_FOUND;
        if (!listed) found = count > 0;
        else if (listed != TP_ERR_NOT_FOUND) status = listed;
        free(list);
    }
    TP_TRY(comm_agree_root(c, status, dir));
    TP_TRY(comm_any(c, exists, dir_exists));
    return comm_any(c, found, any);
}

int checkpoint_load(gpt_model *m, const char *dir, int with_optimizer, checkpoint_warning warn, void *warn_ctx,
                    load_result *out)
{
    comm *c = m->comm;
    ckpt_candidate *list = NULL;
    tensor_map map;
    int n = 0, root = c->dp_rank == 0;
    load_buffers b = {0};
    memset(out, 0, sizeof *out);
    int status = shared_candidates(c, dir, &list, &n);
    if (!status) status = tensor_map_create(&map, m, with_optimizer);
    else memset(&map, 0, sizeof map);
    if (!status && m->zero == 1 && with_optimizer && root) {
        if (!(b.moments = calloc((size_t)(2 * m->total), sizeof *b.moments)))
            status = tp_fail(TP_ERR_NOMEM, "out of memory for the moments of %lld parameters", (long long)m->total);
        b.host_bytes = 2 * m->total * (int64_t)sizeof(float);
    }
    if (m->zero == 3) {
        b.unit_span = zero_largest_piece(m) * c->dp;
        int64_t floats = (with_optimizer ? 3 : 1) * b.unit_span;
        if (!status && root && !(b.unit_state = malloc((size_t)floats * sizeof *b.unit_state)))
            status = tp_fail(TP_ERR_NOMEM, "out of memory for a unit's state (%lld values)", (long long)floats);
        b.host_bytes = root ? floats * (int64_t)sizeof(float) : 0;
    }
    status = comm_agree(c, status, dir);
    if (!status) status = zero_scatter_begin(m, m->zero == 3 ? ZERO_PARAMS | (with_optimizer ? ZERO_MOMENTS : 0) : 0,
                                             &b.scatter);
    for (int k = 0; k < n && !status; k++) {
        char message[8192] = "", unasked[8192] = ""; /* a path (up to 4096) and why */
        char *index_text = NULL;
        int failed = TP_OK; /* this rank's failure to read the checkpoint */
        status = shared_index_text(c, list[k].path, &index_text, &failed);
        if (status) break;
        memset(out, 0, sizeof *out);
        int handing_out = TP_OK, any_handing_out, other_model = 0, any_other_model;
        if (!failed) failed = load_one(m, list[k].path, index_text, &map, &b, out, &handing_out, &other_model);
        free(index_text);
        if (failed) snprintf(message, sizeof message, "%s", tp_errmsg());
        /* A store that could not be asked (ckpt_store_failure) says nothing
         * of the checkpoint: it ends the load, naming what was asked. An
         * older checkpoint taken instead would be trained on, and its next
         * save would replace this one. Damage moves on to the next. */
        int unanswered = ckpt_store_failure(failed), any_failed, any_unanswered = 0;
        if (unanswered) snprintf(unasked, sizeof unasked, "%s", message);
        status = comm_first_failure(c, failed, message, sizeof message, &any_failed);
        if (!status) status = comm_first_failure(c, unanswered, unasked, sizeof unasked, &any_unanswered);
        /* A failure to hand the state out is not the checkpoint's: it ends the load. */
        if (!status) status = comm_any(c, handing_out != TP_OK, &any_handing_out);
        if (!status && any_handing_out)
            status = handing_out ? handing_out
                                 : tp_fail(TP_ERR_COMM, "another rank failed to hand out %s's state", list[k].path);
        /* Nor is another model: an older checkpoint of the run holds it too,
         * or, worse, one that matches the flags by chance would be taken. */
        if (!status) status = comm_any(c, other_model, &any_other_model);
        if (!status && any_other_model) {
            out->other_model = 1;
            status = tp_fail(TP_ERR_ARG, "%s", message); /* gpt_config_check_same's, saying what to do */
        }
        if (!status && any_unanswered)
            status = tp_fail(TP_ERR_IO, "%s; %s could not be read, and no older checkpoint is taken in its place "
                             "(resume when the store answers)", unasked, list[k].path);
        if (!status && !any_failed) {
            /* Each first replica's own view, taken before rank 0's result
             * is handed to every rank (share_over_replicas): a stage whose
             * pieces lack the moments is said, whichever rank read it. */
            int lacks_optimizer = c->dp_rank == 0 && !out->optimizer_loaded, missing = 0;
            status = share_over_replicas(m, with_optimizer, b.moments, out);
            if (!status) status = comm_any(c, lacks_optimizer, &missing);
            out->optimizer_loaded = !missing;
            break;
        }
        if (status) break;
        if (k + 1 < n) {
            if (warn) {
                char text[8192 + 2 * CKPT_PATH_MAX + 64];
                snprintf(text, sizeof text, "checkpoint %s is unusable (%s); falling back to %s", list[k].path, message,
                         list[k + 1].path);
                warn(warn_ctx, text);
            }
        } else {
            status = tp_fail(TP_ERR_NOT_FOUND, "no intact checkpoint in %s; the last tried, %s, is unusable: %s", dir,
                             list[k].path, message);
        }
    }
    zero_scatter_end(m, &b.scatter);
    gpt_model_weights_changed(m); /* loaded or partly overwritten: their bf16 copy is made anew */
    free(list);
    free(b.moments);
    free(b.unit_state);
    tensor_map_free(&map);
    return status;
}

/* The model configuration of the first checkpoint that opens of those
 * checkpoint_load would try, in its order; *bf16 (may be NULL), whether the
 * trainer's record of its run says bf16 mixed precision. */
static int model_config_of(const char *path, gpt_config *out, int *bf16, char *resolved, size_t resolved_size)
{
    ckpt_candidate *list = NULL;
    int n = 0, status = ckpt_candidates(path, &list, &n);
    for (int k = 0; k < n; k++) {
        ckpt_reader *r = NULL;
        status = ckpt_reader_open(&r, list[k].path, NULL);
        if (ckpt_store_failure(status)) break; /* not an older checkpoint's model in its place */
        if (status) continue;
        status = gpt_config_from_json(ckpt_reader_state(r)->model_json, out);
        if (status) tp_fail_context(status, "%s", ckpt_reader_path(r));
        else snprintf(resolved, resolved_size, "%s", ckpt_reader_path(r));
        if (!status && bf16) *bf16 = checkpoint_record_bf16(ckpt_reader_state(r)->user_json);
        ckpt_reader_close(r);
        if (!status) break;
    }
    free(list);
    return status;
}

int checkpoint_record_bf16(const char *user_json)
{
    cJSON *run = cJSON_Parse(user_json ? user_json : "");
    const cJSON *precision = cJSON_GetObjectItemCaseSensitive(run, "precision");
    int bf16 = cJSON_IsString(precision) && !strcmp(precision->valuestring, "bf16");
    cJSON_Delete(run);
    return bf16;
}

int checkpoint_run_model(const char *path, const gpt_options *given, gpt_config *out, char *resolved,
                         size_t resolved_size)
{
    int bf16 = 0;
    TP_TRY(model_config_of(path, out, &bf16, resolved, resolved_size));
    /* The checkpoint's own dtype is its weights' (fp32 under bf16 mixed
     * precision too): the run's record says how it trained, which a resume
     * keeps unless told (a forgotten --dtype bf16 went on in fp32). */
    out->dtype = given && given->dtype_given ? given->explicit_shape.dtype : bf16 ? TP_BF16 : TP_FP32;
    return TP_OK;
}

int checkpoint_model_config(comm *c, const char *path, gpt_config *out, char *resolved, size_t resolved_size)
{
    /* Rank 0 sends the resolved path, a newline, then the configuration's JSON. */
    char *text = NULL;
    int status = TP_OK;
    if (c->rank == 0) {
        status = model_config_of(path, out, NULL, resolved, resolved_size);
        char *json = status ? NULL : gpt_config_to_json(out);
        size_t length = json ? strlen(resolved) + strlen(json) + 2 : 0;
        if (!status && !(json && (text = malloc(length)))) status = tp_fail(TP_ERR_NOMEM, "out of memory");
        if (!status) snprintf(text, length, "%s\n%s", resolved, json);
        cJSON_free(json);
    }
    status = comm_agree_root(c, status, path);
    if (!status) status = comm_broadcast_text(c, &text, 0);
    if (!status && c->rank != 0) {
        char *newline = text ? strchr(text, '\n') : NULL;
        if (!newline) status = tp_fail(TP_ERR_COMM, "%s: the checkpoint's model arrived without its path", path);
        else {
            *newline = '\0';
            snprintf(resolved, resolved_size, "%s", text);
            status = gpt_config_from_json(newline + 1, out);
        }
    }
    free(text);
    return status;
}
