/* checkpoint.c: asynchronous saves and layout-independent loads. */
#include <cjson/cJSON.h>
#include <dirent.h>
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
#include "../common/progress.h"
#include "../reshard/reshard.h"
#include "checkpoint.h"

/* Catalogue entries a saved view writes: the parameter and its two moments. */
typedef struct {
    int param, exp_avg, exp_avg_sq; /* indices into the save catalogue, -1 if absent */
} view_entries;

struct saver {
    gpt_model *model;
    int dump_grads;
    gpt_tensor *catalog;
    int count;
    view_entries *entries; /* per model view */
    float *snapshot;       /* per saved view: data | m | v (or the gradient alone) */
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
    char path[4096];
    int64_t step, consumed;
    uint64_t seed;
    char *schedule, *user;
    double stall;
};

static int find_entry(const saver *s, const char *name)
{
    for (int i = 0; i < s->count; i++)
        if (strcmp(s->catalog[i].name, name) == 0) return i;
    return -1;
}

int saver_create(saver **out, gpt_model *m, int dump_grads, char *err, size_t err_size)
{
    *out = NULL;
    saver *s = calloc(1, sizeof *s);
    if (!s) return snprintf(err, err_size, "out of memory"), -1;
    s->model = m;
    s->dump_grads = dump_grads;
    atomic_init(&s->snapshot_taken, 1);
    if (gpt_catalog(&m->config, !dump_grads, &s->catalog, &s->count)) goto nomem;
    s->entries = calloc((size_t)m->num_params + 1, sizeof *s->entries);
    if (!s->entries) goto nomem;
    int per_view = dump_grads ? 1 : 3;
    for (int i = 0; i < m->num_params; i++) {
        const char *name = m->params[i].spec->name, *base = name + strlen("model/");
        char optim[CKPT_NAME_MAX + 32];
        s->entries[i].param = find_entry(s, name);
        snprintf(optim, sizeof optim, "optim/exp_avg/%s", base);
        s->entries[i].exp_avg = find_entry(s, optim);
        snprintf(optim, sizeof optim, "optim/exp_avg_sq/%s", base);
        s->entries[i].exp_avg_sq = find_entry(s, optim);
        if (m->params[i].owner) s->snapshot_floats += per_view * m->params[i].numel;
    }
    /* Only the first data-parallel replica writes. */
    if (m->comm->dp_rank == 0 && s->snapshot_floats) {
        s->snapshot = alloc_pages((size_t)s->snapshot_floats * sizeof(float));
        if (!s->snapshot) goto nomem;
    }
    *out = s;
    return 0;
nomem:
    saver_free(s);
    return snprintf(err, err_size, "out of memory for checkpoint snapshots"), -1;
}

void saver_prefault(saver *s)
{
    if (s->snapshot) memset(s->snapshot, 0, (size_t)s->snapshot_floats * sizeof(float));
}

void saver_free(saver *s)
{
    if (!s) return;
    if (s->running) pthread_join(s->thread, NULL);
    if (s->committing && s->commit_threaded) pthread_join(s->commit_thread, NULL);
    cJSON_free(s->model_json);
    cJSON_free(s->rng);
    free(s->snapshot);
    free(s->entries);
    free(s->catalog);
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

/* Parameters and moments (or gradients) into the snapshot, in the order the
 * writer reads them. */
static void take_snapshot(saver *s)
{
    const gpt_model *m = s->model;
    float *to = s->snapshot;
    for (int i = 0; i < m->num_params; i++) {
        const param_view *v = &m->params[i];
        if (!v->owner) continue;
        const float *sources[3] = {s->dump_grads ? v->grad : v->data, v->m, v->v};
        for (int k = 0; k < (s->dump_grads ? 1 : 3); k++, to += v->numel)
            memcpy(to, sources[k], (size_t)v->numel * sizeof(float));
    }
}

/* Background: the snapshot, then this rank's shard from it. The snapshot is
 * taken while the next step runs its forward and backward passes, which read
 * parameters and moments but do not change them; the optimizer waits for it
 * (saver_before_update). */
static void *write_shard(void *arg)
{
    saver *s = arg;
    take_snapshot(s);
    atomic_store(&s->snapshot_taken, 1);
    /* Then training has the processor first: the shard is written in its gaps
     * (on Linux, nice applies to the calling thread; failure only costs speed). */
    (void)setpriority(PRIO_PROCESS, (id_t)gettid(), 10);
    gpt_model *m = s->model;
    comm *c = m->comm;
    ckpt_layout layout = {c->tp, c->pp, c->dp, m->config.layers};
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.shard_pp = c->pp_rank;
    options.shard_tp = c->tp_rank;
    ckpt_writer *w = NULL;
    int *ids = calloc((size_t)s->count + 1, sizeof *ids);
    int status = ids ? ckpt_writer_create(&w, s->path, &layout, &options) : TP_ERR_NOMEM;
    for (int i = 0; i < s->count && !status; i++) status = ckpt_writer_add_tensor(w, &s->catalog[i].desc, &ids[i]);
    const float *p = s->snapshot;
    for (int i = 0; i < m->num_params && !status; i++) {
        const param_view *v = &m->params[i];
        if (!v->owner) continue;
        int which[3] = {s->entries[i].param, s->entries[i].exp_avg, s->entries[i].exp_avg_sq};
        for (int k = 0; k < (s->dump_grads ? 1 : 3) && !status; k++) {
            status = ckpt_writer_put_piece(w, ids[which[k]], v->piece, p);
            p += v->numel;
        }
    }
    if (status) snprintf(s->message, sizeof s->message, "%s", tp_errmsg());
    if (w) {
        if (status) ckpt_writer_abort(w);
        else if ((status = ckpt_writer_finish(w)) != TP_OK) snprintf(s->message, sizeof s->message, "%s", tp_errmsg());
    }
    free(ids);
    s->status = status;
    atomic_store(&s->done, 1);
    return NULL;
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
    ckpt_layout layout = {c->tp, c->pp, c->dp, m->config.layers};
    ckpt_train_state state = {s->step, s->consumed, s->model_json, s->schedule, s->rng, s->user};
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.overwrite = 1;
    options.update_latest = 1;
    s->commit_status = ckpt_commit_staged(s->path, &layout, &state, &options);
    if (s->commit_status != TP_OK) snprintf(s->commit_message, sizeof s->commit_message, "%s", tp_errmsg());
    atomic_store(&s->commit_done, 1);
    return NULL;
}

/* Every shard is written (or failed): all ranks learn it; rank 0 starts the commit. */
static int finish_writes(saver *s, char *err, size_t err_size)
{
    gpt_model *m = s->model;
    comm *c = m->comm;
    if (s->running) {
        pthread_join(s->thread, NULL);
        s->running = 0;
    }
    int failed = s->status != TP_OK;
    if (c->ops->max_ints(c, GROUP_WORLD, &failed, 1)) return snprintf(err, err_size, "%s", c->error), -1;
    if (failed) {
        s->pending = 0;
        snprintf(err, err_size, "checkpoint %s: %s", s->path,
                 s->status ? s->message : "another rank failed to write its shard");
        return -1;
    }
    s->committing = 1;
    if (c->rank != 0) return 0;
    cJSON_free(s->model_json);
    cJSON_free(s->rng);
    s->model_json = gpt_config_to_json(&m->config);
    s->rng = rng_json(c, s->seed, s->step);
    atomic_store(&s->commit_done, 0);
    s->commit_threaded = pthread_create(&s->commit_thread, NULL, commit_checkpoint, s) == 0;
    if (!s->commit_threaded) commit_checkpoint(s); /* no thread to be had: commit now */
    return 0;
}

/* The commit is done on rank 0: all ranks learn its outcome. */
static int finish_commit(saver *s, char *err, size_t err_size)
{
    comm *c = s->model->comm;
    if (s->commit_threaded) pthread_join(s->commit_thread, NULL);
    s->committing = s->commit_threaded = 0;
    s->pending = 0;
    int failed = c->rank == 0 && s->commit_status != TP_OK;
    if (c->ops->max_ints(c, GROUP_WORLD, &failed, 1)) return snprintf(err, err_size, "%s", c->error), -1;
    if (failed) {
        snprintf(err, err_size, "checkpoint %s: %s", s->path, c->rank == 0 ? s->commit_message : "commit failed on rank 0");
        return -1;
    }
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

int saver_poll(saver *s, int wait, char *err, size_t err_size)
{
    if (!s->pending) return 0;
    double start = now_seconds();
    comm *c = s->model->comm;
    int result = 0;
    if (!s->committing) {
        int not_done = s->running && !wait && !atomic_load(&s->done);
        if (c->ops->max_ints(c, GROUP_WORLD, &not_done, 1)) result = (snprintf(err, err_size, "%s", c->error), -1);
        else if (!not_done) result = finish_writes(s, err, err_size);
    }
    if (result == 0 && s->committing) {
        int not_done = c->rank == 0 && !wait && !atomic_load(&s->commit_done);
        if (c->ops->max_ints(c, GROUP_WORLD, &not_done, 1)) result = (snprintf(err, err_size, "%s", c->error), -1);
        else if (!not_done) result = finish_commit(s, err, err_size);
    }
    s->stall += now_seconds() - start;
    return result;
}

int saver_start(saver *s, const char *path, const save_state *state, int sync, char *err, size_t err_size)
{
    gpt_model *m = s->model;
    comm *c = m->comm;
    if (s->pending && saver_poll(s, 1, err, err_size) < 0) return -1;
    double start = now_seconds();
    snprintf(s->path, sizeof s->path, "%s", path);
    s->step = state->step;
    s->consumed = state->consumed_samples;
    s->seed = state->seed;
    free(s->schedule);
    free(s->user);
    s->schedule = strdup(state->schedule_json ? state->schedule_json : "{}");
    s->user = strdup(state->user_json ? state->user_json : "{}");
    int failed = 0;
    char message[1024] = "";
    if (c->rank == 0) {
        ckpt_write_options options;
        ckpt_write_options_init(&options);
        options.overwrite = 1;
        if (ckpt_stage_prepare(path, &options) != TP_OK) {
            snprintf(message, sizeof message, "%s", tp_errmsg());
            failed = 1;
        }
    }
    if (c->ops->max_ints(c, GROUP_WORLD, &failed, 1)) return snprintf(err, err_size, "%s", c->error), -1;
    if (failed) return snprintf(err, err_size, "checkpoint %s: %s", path, message[0] ? message : "cannot stage"), -1;
    s->status = TP_OK;
    atomic_store(&s->done, 1);
    atomic_store(&s->snapshot_taken, 1);
    if (c->dp_rank == 0) {
        atomic_store(&s->done, 0);
        atomic_store(&s->snapshot_taken, 0);
        if (pthread_create(&s->thread, NULL, write_shard, s) != 0) {
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
    if (sync) return saver_poll(s, 1, err, err_size) < 0 ? -1 : 0;
    return 0;
}

/* ------------------------------------------------------------------- load */

static int64_t step_of(const char *name)
{
    if (strncmp(name, "step_", 5) != 0 || !name[5]) return -1;
    char *end = NULL;
    long long v = strtoll(name + 5, &end, 10);
    return *end ? -1 : v;
}

typedef struct {
    char path[4096];
    int64_t step;
} candidate;

static int by_step_desc(const void *a, const void *b)
{
    const candidate *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

/* The checkpoint dir names first (its latest), then every other committed
 * step_* beside it, newest first. */
static int candidates(const char *dir, candidate **out, char *err, size_t err_size)
{
    char first[4096];
    if (ckpt_resolve(dir, first, sizeof first) != TP_OK) return snprintf(err, err_size, "%s", tp_errmsg()), -1;
    candidate *list = calloc(1, sizeof *list);
    int n = 0, capacity = 1;
    snprintf(list[n++].path, sizeof list[0].path, "%s", first);
    struct stat st;
    char index[4200];
    snprintf(index, sizeof index, "%s/index.json", dir);
    if (stat(index, &st) == 0) {
        *out = list;
        return n; /* a checkpoint itself, not a run directory */
    }
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        int64_t step = step_of(e->d_name);
        if (step < 0) continue;
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        snprintf(index, sizeof index, "%s/index.json", path);
        if (stat(index, &st) != 0 || strcmp(path, first) == 0) continue;
        if (n == capacity) {
            capacity *= 2;
            list = realloc(list, (size_t)capacity * sizeof *list);
        }
        snprintf(list[n].path, sizeof list[n].path, "%s", path);
        list[n++].step = step;
    }
    if (d) closedir(d);
    if (n > 2) qsort(list + 1, (size_t)n - 1, sizeof *list, by_step_desc);
    *out = list;
    return n;
}

static int same_model(const gpt_config *a, const gpt_config *b)
{
    return a->layers == b->layers && a->dim == b->dim && a->heads == b->heads && a->kv_heads == b->kv_heads &&
           a->vocab == b->vocab && a->seq == b->seq && a->ffn == b->ffn && a->swiglu == b->swiglu;
}

/* Reads one tensor's piece for a view; name NULL-checked by the caller. */
static int read_view(ckpt_reader *r, const char *name, const ckpt_tensor_desc *desc, int tp, int piece, float *out,
                     int64_t numel, char *message, size_t size)
{
    int index = ckpt_reader_find(r, name);
    if (index < 0) return 1; /* absent */
    if (reshard_read_piece(r, index, desc, tp, piece, out, (size_t)numel * sizeof(float)) != TP_OK) {
        snprintf(message, size, "%s", tp_errmsg());
        return -1;
    }
    return 0;
}

static int load_one(gpt_model *m, const char *path, int with_optimizer, load_result *out, char *message, size_t size)
{
    ckpt_reader *r = NULL;
    if (ckpt_reader_open(&r, path, NULL) != TP_OK) return snprintf(message, size, "%s", tp_errmsg()), -1;
    const ckpt_train_state *state = ckpt_reader_state(r);
    gpt_config config;
    char err[256];
    int status = 0;
    if (gpt_config_from_json(state->model_json, &config, err, sizeof err)) {
        snprintf(message, size, "%s: %s", path, err);
        status = -1;
    } else if (!same_model(&config, &m->config)) {
        const gpt_config *ours = &m->config;
        snprintf(message, size,
                 "%s holds another model: layers %lld dim %lld heads %lld ffn %lld vocab %lld seq %lld, this run has "
                 "layers %lld dim %lld heads %lld ffn %lld vocab %lld seq %lld",
                 path, (long long)config.layers, (long long)config.dim, (long long)config.heads, (long long)config.ffn,
                 (long long)config.vocab, (long long)config.seq, (long long)ours->layers, (long long)ours->dim,
                 (long long)ours->heads, (long long)ours->ffn, (long long)ours->vocab, (long long)ours->seq);
        status = -1;
    }
    int missing_optimizer = 0;
    for (int i = 0; i < m->num_params && !status; i++) {
        param_view *v = &m->params[i];
        const char *name = v->spec->name, *base = name + strlen("model/");
        char optim[CKPT_NAME_MAX + 32];
        int got = read_view(r, name, &v->spec->desc, m->comm->tp, v->piece, v->data, v->numel, message, size);
        if (got > 0) snprintf(message, size, "%s: tensor %s missing", path, name), got = -1;
        if (got < 0) {
            status = -1;
            break;
        }
        float *moments[2] = {v->m, v->v};
        const char *roles[2] = {"exp_avg", "exp_avg_sq"};
        missing_optimizer |= !with_optimizer;
        for (int k = 0; k < 2 && !status && with_optimizer; k++) {
            snprintf(optim, sizeof optim, "optim/%s/%s", roles[k], base);
            got = read_view(r, optim, &v->spec->desc, m->comm->tp, v->piece, moments[k], v->numel, message, size);
            if (got < 0) status = -1;
            if (got > 0) {
                memset(moments[k], 0, (size_t)v->numel * sizeof(float));
                missing_optimizer = 1;
            }
        }
    }
    if (!status) {
        out->step = state->step;
        out->consumed_samples = state->consumed_samples;
        out->optimizer_loaded = !missing_optimizer;
        snprintf(out->path, sizeof out->path, "%s", ckpt_reader_path(r));
    }
    ckpt_reader_close(r);
    return status;
}

int checkpoint_load(gpt_model *m, const char *dir, int with_optimizer, load_result *out, char *err, size_t err_size)
{
    comm *c = m->comm;
    candidate *list = NULL;
    int n = candidates(dir, &list, err, err_size);
    int found = n, any_found = n > 0;
    if (c->ops->max_ints(c, GROUP_WORLD, &any_found, 1)) return snprintf(err, err_size, "%s", c->error), -1;
    if (found < 0 || !any_found) {
        free(list);
        return -1;
    }
    for (int k = 0; k < n; k++) {
        char message[8192] = ""; /* a path (up to 4096) and why */
        int failed = load_one(m, list[k].path, with_optimizer, out, message, sizeof message) != 0;
        /* The lowest failing rank tells everyone why. */
        int flag = failed ? c->world - c->rank : 0;
        if (c->ops->max_ints(c, GROUP_WORLD, &flag, 1)) break;
        if (!flag) {
            int optimizer = out->optimizer_loaded ? 0 : 1;
            c->ops->max_ints(c, GROUP_WORLD, &optimizer, 1);
            out->optimizer_loaded = !optimizer;
            free(list);
            return 0;
        }
        c->ops->broadcast_bytes(c, message, sizeof message, c->world - flag);
        if (c->rank == 0) {
            if (k + 1 < n)
                fprintf(stderr, "tp-train: checkpoint %s is unusable (%s); falling back to %s\n", list[k].path, message,
                        list[k + 1].path);
            else
                snprintf(err, err_size, "no intact checkpoint in %s; the last tried, %s, is unusable: %s", dir,
                         list[k].path, message);
        } else if (k + 1 == n) {
            snprintf(err, err_size, "no intact checkpoint in %s: %s", dir, message);
        }
    }
    free(list);
    return -1;
}

int checkpoint_model_config(const char *path, gpt_config *out, char *resolved, size_t resolved_size, char *err,
                            size_t err_size)
{
    /* The checkpoints checkpoint_load would try, in its order: the first that opens. */
    candidate *list = NULL;
    int n = candidates(path, &list, err, err_size), status = -1;
    for (int k = 0; k < n && status; k++) {
        ckpt_reader *r = NULL;
        if (ckpt_reader_open(&r, list[k].path, NULL) != TP_OK) {
            snprintf(err, err_size, "%s", tp_errmsg());
            continue;
        }
        char why[256];
        status = gpt_config_from_json(ckpt_reader_state(r)->model_json, out, why, sizeof why);
        if (status) snprintf(err, err_size, "%s: %s", ckpt_reader_path(r), why);
        else snprintf(resolved, resolved_size, "%s", ckpt_reader_path(r));
        ckpt_reader_close(r);
    }
    free(list);
    return status;
}
