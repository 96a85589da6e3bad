/* upload.c: checkpoints into object stores.
 *
 * An object store has no renames, so the local commit's trick (a staging
 * directory renamed into place) is replaced by an order: every shard file
 * is uploaded (in parallel; S3 multipart for large ones), their sizes are
 * checked against the index, then index.json goes, then the run
 * directory's `latest`. A reader takes a checkpoint only by its index
 * (ckpt_resolve's rules), so it sees a remote checkpoint whole or not at
 * all; a shard uploaded by an interrupted upload is invisible and is
 * replaced by the next. The data's integrity travels with it: the reader
 * checks every block it reads against the block checksums, and those
 * against the index. Of two uploads to one URL at once, one is elected
 * before either sends anything (its claim, below); the other fails. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "../common/clock.h"
#include "../common/parallel.h"
#include "../common/parse.h"
#include "../common/path.h"
#include "commit.h"
#include "index.h"
#include "lease.h"

int ckpt_is_remote(const char *path)
{
    return store_is_remote(path);
}

/* Files (and parts) an upload or download keeps in flight. */
static int transfer_threads(const ckpt_upload_options *options)
{
    return options && options->threads > 0 ? options->threads : CKPT_TRANSFER_THREADS;
}

/* ------------------------------------------------------ one upload per URL */

/* Two uploads to one URL at once each found nothing there and went on: both
 * said "copied", and the URL held one's index over a mix of both's shards.
 * An object store has no lock, no rename, and on most servers no
 * conditional PUT (nginx's WebDAV and s3rver ignore If-None-Match; AWS S3
 * honours it since 2024): no test-and-set can be made of its requests. So
 * the uploads to a URL elect one of them through objects of their own, one
 * per writer (its claim, URL/tp-upload-claim.OWNER, naming it), and listings,
 * which show every object whose PUT was answered before them (the
 * read-after-write consistency of S3 and of a server's file system):
 *
 *   1. a writer puts its claim, "choosing", then lists the URL: of two
 *      writers, the later to put its claim sees the other's (each lists
 *      after its own PUT), so at least one of them sees the other;
 *   2. it puts its claim again, "chosen", naming the claims it saw;
 *   3. it reads each claim it saw, waiting while one is still choosing: X
 *      goes first when X did not see it (X listed before it claimed) or
 *      when each saw the other and X's name sorts first. It goes on only
 *      when it goes before every claim it saw; else it removes its claim,
 *      having sent nothing else, and fails naming X's writer.
 *
 * Of any two writers at most one goes on, and of two at once exactly one
 * (each waits only for the other's view, which the other publishes before
 * it waits in turn). A claim stays until its writer's index is up or its
 * failed upload is removed, so a writer coming later meets it or the
 * checkpoint; only its writer removes it, but for one proven stale:
 *
 * a writer killed outright leaves its claim. Without --force a URL holding
 * one is refused, naming its writer; --force takes it over once it is
 * proven stale: its writer is a process of this machine that is gone, or it
 * stayed unchanged for a period (TP_UPLOAD_CLAIM_SECONDS, default 30) while
 * a live writer renews its claim every quarter period. That proof alone
 * rests on time; a writer that could not renew for half a period takes its
 * claim for lost and stops (docs/STORES.md "Two uploads to one URL"). */

#define CLAIM_PREFIX "tp-upload-claim." /* no leading dot: nginx's WebDAV lists no such names */
#define CLAIM_SEEN_MAX 32        /* claims one writer may see at once; more: it gives way */
#define CLAIM_TEXT_MAX (16 << 10) /* bytes of a claim object */
#define CLAIM_WRITER_MAX 256
#define CLAIM_DEFAULT_SECONDS 30
#define CLAIM_MIN_SECONDS 2
#define CLAIM_MAX_SECONDS 3600

static int is_claim_name(const char *name)
{
    return strncmp(name, CLAIM_PREFIX, sizeof CLAIM_PREFIX - 1) == 0;
}

typedef struct {
    char owner[STORE_OWNER_MAX];   /* its identity: the object's name after the prefix */
    char writer[CLAIM_WRITER_MAX]; /* "tp-ckpt (pid 41 on host n1, since 2026-11-24T20:41:07Z)" */
    char host[64];
    long pid;
    int chosen; /* 0: choosing (listing); 1: chosen, saw[] its listing's claims */
    int num_saw;
    char saw[CLAIM_SEEN_MAX][STORE_OWNER_MAX];
    int64_t renewals;
} claim_record;

typedef struct {
    const store_ops *store;
    char url[CKPT_PATH_MAX];  /* the output */
    char path[CKPT_PATH_MAX]; /* this writer's claim */
    claim_record own;         /* under renewer.mutex once the renewals run */
    /* period: seconds a claim lives unchanged before it is stale; lost: the
     * claim vanished or could not be renewed: nothing more goes up */
    ckpt_lease_renewer renewer;
    double renewed;           /* when the claim was last renewed (the renewer's thread's) */
} upload_claim;

static int claim_path(const char *url, const char *owner, char *out)
{
    char name[sizeof CLAIM_PREFIX + STORE_OWNER_MAX];
    snprintf(name, sizeof name, "%s%s", CLAIM_PREFIX, owner);
    return tp_path_join(out, url, name);
}

static int write_claim(upload_claim *c)
{
    pthread_mutex_lock(&c->renewer.mutex);
    const claim_record *r = &c->own;
    cJSON *json = cJSON_CreateObject(), *saw = cJSON_CreateArray();
    int built = json && saw;
    if (built) {
        cJSON_AddStringToObject(json, "owner", r->owner);
        cJSON_AddStringToObject(json, "writer", r->writer);
        cJSON_AddStringToObject(json, "host", r->host);
        cJSON_AddNumberToObject(json, "pid", (double)r->pid);
        cJSON_AddStringToObject(json, "state", r->chosen ? "chosen" : "choosing");
        for (int i = 0; i < r->num_saw; i++) cJSON_AddItemToArray(saw, cJSON_CreateString(r->saw[i]));
        cJSON_AddItemToObject(json, "saw", saw);
        saw = NULL;
        cJSON_AddNumberToObject(json, "renewals", (double)r->renewals);
    }
    pthread_mutex_unlock(&c->renewer.mutex);
    char *text = built ? cJSON_PrintUnformatted(json) : NULL;
    cJSON_Delete(json);
    cJSON_Delete(saw);
    if (!text) return tp_fail(TP_ERR_NOMEM, "out of memory for the claim %s", c->path);
    int status = store_put_data(c->path, text, strlen(text));
    free(text);
    return status;
}

/* Reads the claim at path: TP_OK with *found 0 when there is none. One that
 * cannot be read as a claim is an error naming it: never taken as absent. */
static int read_claim(const char *path, int *found, void *record)
{
    claim_record *out = record;
    memset(out, 0, sizeof *out);
    *found = 0;
    cJSON *json = NULL;
    int present;
    TP_TRY(ckpt_read_json_if_present(path, CLAIM_TEXT_MAX, &present, &json));
    if (!present) return TP_OK;
    const cJSON *owner = cJSON_GetObjectItemCaseSensitive(json, "owner");
    const cJSON *writer = cJSON_GetObjectItemCaseSensitive(json, "writer");
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(json, "host");
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(json, "pid");
    const cJSON *state = cJSON_GetObjectItemCaseSensitive(json, "state");
    const cJSON *saw = cJSON_GetObjectItemCaseSensitive(json, "saw");
    const cJSON *renewals = cJSON_GetObjectItemCaseSensitive(json, "renewals");
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    int valid = cJSON_IsString(owner) && cJSON_IsString(writer) && cJSON_IsString(host) && cJSON_IsNumber(pid) &&
                cJSON_IsString(state) && cJSON_IsArray(saw) && cJSON_IsNumber(renewals) &&
                !strcmp(owner->valuestring, name + sizeof CLAIM_PREFIX - 1) &&
                (!strcmp(state->valuestring, "choosing") || !strcmp(state->valuestring, "chosen")) &&
                pid->valuedouble >= 1 && pid->valuedouble <= 4194304 && renewals->valuedouble >= 0 &&
                cJSON_GetArraySize(saw) <= CLAIM_SEEN_MAX;
    for (const cJSON *s = valid ? saw->child : NULL; s; s = s->next) {
        if (!cJSON_IsString(s)) {
            valid = 0;
            break;
        }
        snprintf(out->saw[out->num_saw++], sizeof out->saw[0], "%s", s->valuestring);
    }
    if (valid) {
        snprintf(out->owner, sizeof out->owner, "%s", owner->valuestring);
        snprintf(out->writer, sizeof out->writer, "%s", writer->valuestring);
        snprintf(out->host, sizeof out->host, "%s", host->valuestring);
        out->pid = (long)pid->valuedouble;
        out->chosen = !strcmp(state->valuestring, "chosen");
        out->renewals = (int64_t)renewals->valuedouble;
    }
    cJSON_Delete(json);
    if (!valid)
        return tp_fail(TP_ERR_FORMAT, "%s: not an upload's claim (owner matching its name, writer, host, pid, state "
                       "choosing or chosen, saw, renewals expected); remove it if no upload to that URL is under way",
                       path);
    *found = 1;
    return TP_OK;
}

/* read_claim of another writer's claim, which that writer may be rewriting
 * (choosing, then chosen; renewals), read again while torn
 * (ckpt_lease_read_settled). */
static int read_claim_settled(const char *path, int *found, claim_record *out)
{
    return ckpt_lease_read_settled(read_claim, path, found, out);
}

/* Whether a claim's writer is provably gone: a process of this machine that
 * no longer exists. */
static int claim_writer_gone(const claim_record *r)
{
    return store_process_gone(r->host, (long)r->pid);
}

static int claim_saw(const claim_record *r, const char *owner)
{
    for (int i = 0; i < r->num_saw; i++)
        if (!strcmp(r->saw[i], owner)) return 1;
    return 0;
}

/* What a listing of the URL shows: this writer's claim, the others', and
 * the first entry that is not a claim (a checkpoint's, another output's). */
typedef struct {
    const char *own; /* this writer's owner; NULL: none */
    int own_seen, num_claims, too_many;
    char claims[CLAIM_SEEN_MAX - 1][STORE_OWNER_MAX]; /* a view holds them and its own */
    char other[CKPT_NAME_MAX + 1];
} url_scan;

static int scan_entry(void *ctx, const char *name)
{
    url_scan *s = ctx;
    if (!is_claim_name(name)) {
        if (!s->other[0]) snprintf(s->other, sizeof s->other, "%s", name);
        return TP_OK;
    }
    const char *owner = name + sizeof CLAIM_PREFIX - 1;
    if (s->own && !strcmp(owner, s->own)) s->own_seen = 1;
    else if (s->num_claims < CLAIM_SEEN_MAX - 1)
        snprintf(s->claims[s->num_claims++], sizeof s->claims[0], "%s", owner);
    else
        s->too_many = 1;
    return TP_OK;
}

static int scan_url(const store_ops *store, const char *url, const char *own, url_scan *out)
{
    memset(out, 0, sizeof *out);
    out->own = own;
    int status = store->list(store, url, scan_entry, out);
    return status == TP_ERR_NOT_FOUND ? TP_OK : status; /* nothing there */
}

/* A claim's writer known by its owner alone (HOST-PID-NONCE,
 * store_staging_owner), its claim gone before it was read (the upload
 * finished): "the upload of pid 41 on host n1 (its claim NAME)", as a
 * writer is named when its claim is read; CLAIM_WRITER_MAX bytes. */
static void describe_owner(const char *owner, char *out)
{
    char host[STORE_OWNER_MAX];
    long pid;
    if (store_owner_process(owner, host, sizeof host, &pid))
        snprintf(out, CLAIM_WRITER_MAX, "the upload of pid %ld on host %s (its claim %s%s)", pid, host, CLAIM_PREFIX,
                 owner);
    else
        snprintf(out, CLAIM_WRITER_MAX, "the upload of the claim %s%s", CLAIM_PREFIX, owner);
}

/* Whether the claim of owner, seen in this writer's listing, lets it go on:
 * TP_OK when the other gives way or is gone (its writer then in gone_writer,
 * CLAIM_WRITER_MAX bytes: it finished or gave up; or taken over, with
 * replace, when stale); else a failure naming its writer. */
static int claim_judge(upload_claim *c, const char *owner, int replace, char *gone_writer)
{
    char path[CKPT_PATH_MAX];
    TP_TRY(claim_path(c->url, owner, path));
    claim_record *seen = malloc(sizeof *seen), *now = malloc(sizeof *now);
    int found = 0, alive = 0;
    int status = seen && now ? read_claim_settled(path, &found, seen) : tp_fail(TP_ERR_NOMEM, "out of memory");
    double since = now_seconds(), pause = 0.02;
    while (!status) {
        if (!found) { /* its writer finished or gave up since the listing */
            if (seen->writer[0]) snprintf(gone_writer, CLAIM_WRITER_MAX, "%s", seen->writer);
            else describe_owner(owner, gone_writer);
            break;
        }
        int first = seen->chosen && (!claim_saw(seen, c->own.owner) || strcmp(seen->owner, c->own.owner) < 0);
        if (seen->chosen && !first) break; /* it gives way to this one */
        if (first && (!replace || alive)) {
            status = tp_fail(TP_ERR_EXISTS, "%s: another upload to it is under way: %s; this one gives way, having "
                             "sent nothing", c->url, seen->writer);
            break;
        }
        /* Still choosing, or going first beside a --force: alive (it
         * changes) or stale? */
        char stale[128] = "";
        if (claim_writer_gone(seen)) snprintf(stale, sizeof stale, "its process is gone from this machine");
        else if (now_seconds() - since > c->renewer.period)
            snprintf(stale, sizeof stale, "its claim stayed unchanged for %.0f s (TP_UPLOAD_CLAIM_SECONDS)", c->renewer.period);
        if (stale[0] && !replace) {
            status = tp_fail(TP_ERR_EXISTS, "%s holds what an upload that stopped left: %s: %s; --force replaces it",
                             c->url, seen->writer, stale);
            break;
        }
        if (stale[0]) { /* taken over: only its claim goes here, the rest with the replaced checkpoint */
            status = store_delete(path);
            break;
        }
        if (store_stopping()) { /* a signal: the upload fails at once, its clean-up waiting */
            status = tp_fail(TP_ERR_STATE, "%s: stopped while choosing", c->url);
            break;
        }
        sleep_seconds(pause);
        pause = pause * 2 < c->renewer.period / 8 ? pause * 2 : c->renewer.period / 8;
        status = read_claim_settled(path, &found, now);
        if (!status && found && (now->chosen != seen->chosen || now->renewals != seen->renewals)) {
            alive = 1;
            since = now_seconds();
        }
        if (!status && !found) snprintf(now->writer, sizeof now->writer, "%s", seen->writer); /* the last known */
        claim_record *swap = seen;
        seen = now;
        now = swap;
    }
    free(seen);
    free(now);
    return status;
}

/* Renews the claim every quarter period (ckpt_lease_renewer), so that a
 * --force watching it sees it alive. A claim removed meanwhile is lost,
 * never put back (its remover took it for a stopped upload's and replaces
 * what is there); so is one that could not be renewed for half a period (a
 * watcher may count it stale after a whole one). */
static void claim_renew(void *ctx, ckpt_lease_renewer *renewer)
{
    upload_claim *c = ctx;
    double start = now_seconds();
    int found = 0;
    claim_record *mine = malloc(sizeof *mine);
    int status = mine ? read_claim(c->path, &found, mine) : TP_ERR_NOMEM;
    free(mine);
    if (!status && !found) {
        ckpt_lease_set_lost(renewer, "its claim was removed by another writer, which took it for a stopped upload's");
    } else if (!status) {
        pthread_mutex_lock(&renewer->mutex);
        c->own.renewals++;
        pthread_mutex_unlock(&renewer->mutex);
        if (!(status = write_claim(c))) c->renewed = start;
    }
    if (status && now_seconds() - c->renewed > renewer->period / 2) {
        char why[300];
        snprintf(why, sizeof why, "its claim could not be renewed for %.0f s, half of TP_UPLOAD_CLAIM_SECONDS "
                 "(another writer may take it for a stopped upload's)", now_seconds() - c->renewed);
        ckpt_lease_set_lost(renewer, why);
    }
}

/* TP_OK while the claim holds; else a failure saying why it was lost. */
static int claim_check_lost(upload_claim *c)
{
    char why[CKPT_LEASE_LOST_MAX];
    if (!c || !ckpt_lease_lost(&c->renewer, why, sizeof why)) return TP_OK;
    return tp_fail(TP_ERR_STATE, "%s: this upload stopped: %s; nothing of it is removed (the URL may be another "
                   "upload's now)", c->url, why);
}

/* Before the index: the claim is still there, and this writer's. */
static int claim_check(upload_claim *c)
{
    if (!c) return TP_OK;
    TP_TRY(claim_check_lost(c));
    int found = 0;
    claim_record *mine = malloc(sizeof *mine);
    int status = mine ? read_claim(c->path, &found, mine) : tp_fail(TP_ERR_NOMEM, "out of memory");
    free(mine);
    TP_TRY(status);
    if (!found)
        ckpt_lease_set_lost(&c->renewer, "its claim was removed by another writer, which took it for a stopped upload's");
    return claim_check_lost(c);
}

/* Frees the claim; with remove, its object goes first (never once lost:
 * it may be another's by then). */
static void claim_release(upload_claim *c, int remove)
{
    if (!c) return;
    ckpt_lease_renewer_destroy(&c->renewer);
    if (remove && !atomic_load(&c->renewer.lost)) store_delete(c->path);
    free(c);
}

/* This writer's claim on url, elected as above; *out NULL on a failure,
 * which leaves nothing of this writer at url. */
static int claim_take(const char *url, int replace, upload_claim **out)
{
    *out = NULL;
    upload_claim *c = calloc(1, sizeof *c);
    url_scan *scan = malloc(sizeof *scan);
    if (!c || !scan) {
        free(c);
        free(scan);
        return tp_fail(TP_ERR_NOMEM, "out of memory for an upload's claim");
    }
    double period;
    int status = ckpt_lease_period("TP_UPLOAD_CLAIM_SECONDS", CLAIM_DEFAULT_SECONDS, CLAIM_MIN_SECONDS,
                                   CLAIM_MAX_SECONDS, &period);
    ckpt_lease_renewer_init(&c->renewer, period, claim_renew, c);
    if (!status) status = store_for(url, &c->store);
    if (!status && (size_t)snprintf(c->url, sizeof c->url, "%s", url) >= sizeof c->url)
        status = tp_fail(TP_ERR_ARG, "path too long: %s", url);
    if (!status) status = store_staging_owner(c->own.owner, sizeof c->own.owner);
    if (!status) {
        store_host_name(c->own.host, sizeof c->own.host);
        c->own.pid = (long)getpid();
        ckpt_lease_describe_holder(program_invocation_short_name, c->own.writer, sizeof c->own.writer);
        status = claim_path(url, c->own.owner, c->path);
    }
    tp_fault_point("upload-claiming"); /* a test holds writers here: past their checks, nothing claimed */
    if (!status) status = write_claim(c);
    int placed = !status;
    tp_fault_point("upload-claimed");
    if (!status) status = scan_url(c->store, url, c->own.owner, scan);
    if (!status && !scan->own_seen)
        status = tp_fail(TP_ERR_EXISTS, "%s: the claim this upload made there vanished at once (another upload "
                         "removing what is there?); nothing was sent; try again", url);
    if (!status && scan->too_many)
        status = tp_fail(TP_ERR_EXISTS, "%s: more than %d uploads to it at once; this one gives way, having sent "
                         "nothing", url, CLAIM_SEEN_MAX - 1);
    if (!status) { /* its view, published before it waits for any other's */
        pthread_mutex_lock(&c->renewer.mutex);
        c->own.chosen = 1;
        c->own.num_saw = 0;
        snprintf(c->own.saw[c->own.num_saw++], sizeof c->own.saw[0], "%s", c->own.owner);
        for (int i = 0; i < scan->num_claims && c->own.num_saw < CLAIM_SEEN_MAX; i++)
            snprintf(c->own.saw[c->own.num_saw++], sizeof c->own.saw[0], "%s", scan->claims[i]);
        pthread_mutex_unlock(&c->renewer.mutex);
        status = write_claim(c);
    }
    if (!status) {
        c->renewed = now_seconds();
        status = ckpt_lease_renewer_start(&c->renewer, c->path);
    }
    char gone_writer[CLAIM_WRITER_MAX] = "";
    tp_fault_point("upload-judging"); /* a test holds a writer here: the others' claims listed, none read */
    for (int i = 0; !status && i < scan->num_claims; i++)
        status = claim_judge(c, scan->claims[i], replace, gone_writer);
    /* Chosen: once more, what is there now (a claim gone since the first
     * listing may have left a checkpoint; this one's must still be there). */
    char other[CKPT_NAME_MAX + 1];
    snprintf(other, sizeof other, "%s", scan->other);
    if (!status) status = scan_url(c->store, url, c->own.owner, scan);
    if (!status && !scan->own_seen)
        status = tp_fail(TP_ERR_EXISTS, "%s: the claim this upload made there vanished (another upload removing "
                         "what is there?); nothing was sent; try again", url);
    if (!status && !replace && (scan->other[0] || other[0]))
        status = tp_fail(TP_ERR_EXISTS, "%s exists already (--force replaces it): '%s' is there%s%s%s", url,
                         scan->other[0] ? scan->other : other,
                         gone_writer[0] ? ", put by another upload that finished while this one was choosing: " : "",
                         gone_writer, gone_writer[0] ? "; this one sent nothing" : "");
    free(scan);
    if (status) {
        ckpt_lease_renewer_stop(&c->renewer);
        if (placed) {
            char message[2048];
            snprintf(message, sizeof message, "%s", tp_errmsg());
            store_delete(c->path); /* its own claim alone: what is there is another's */
            tp_fail(status, "%s", message);
        }
        claim_release(c, 0);
        return status;
    }
    *out = c;
    return TP_OK;
}

typedef struct {
    const char *local_dir, *url;
    const ckpt_index *index;
    int threads;
    const ckpt_upload_options *options;
    upload_claim *claim;
} upload_job;

/* One shard file of `bytes` bytes up as the object remote (on `threads`
 * threads of parts), and its size there checked. */
static int put_shard_file(const char *local, const char *remote, int64_t bytes, int threads)
{
    TP_TRY(store_put_file(remote, local, 0, bytes, threads));
    return store_check_kept(remote, NULL, bytes); /* its bytes are checked by its block checksums when read */
}

/* index.json (or the file naming a foreign checkpoint's others) up as
 * remote, and read back whole: it is small, and it is what makes the
 * checkpoint exist. An index PUT answered 201 but not kept (or kept with a
 * byte changed) gave "copied", exit 0, and a `latest` naming a checkpoint
 * that no reader could open. A damaged one is removed rather than left
 * for a reader to meet as damage: its upload failed, nothing more. */
static int put_index(const char *remote, const void *data, size_t size)
{
    TP_TRY(store_put_data(remote, data, size));
    int status = store_check_kept(remote, data, (int64_t)size);
    if (status) {
        char message[2048];
        snprintf(message, sizeof message, "%s", tp_errmsg());
        store_delete(remote);
        return tp_fail(status, "%s", message);
    }
    return TP_OK;
}

static int upload_shard(void *ctx, int64_t f, int thread)
{
    (void)thread;
    upload_job *j = ctx;
    const ckpt_index_file *file = &j->index->files[f];
    TP_TRY(claim_check_lost(j->claim)); /* nothing more goes up once the claim is lost */
    char local[CKPT_PATH_MAX], remote[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(local, j->local_dir, file->name));
    TP_TRY(tp_path_join(remote, j->url, file->name));
    /* Parts of one file share the threads with other files: a checkpoint
     * of one large shard still goes up in parallel. */
    int part_threads = j->threads / j->index->num_files;
    TP_TRY(put_shard_file(local, remote, file->bytes, part_threads > 1 ? part_threads : 1));
    if (j->options && j->options->on_file) j->options->on_file(j->options->ctx, file->bytes);
    return TP_OK;
}

void ckpt_upload_options_init(ckpt_upload_options *options)
{
    memset(options, 0, sizeof *options);
}

/* A store as the replace checks see it: the uploads' claims hidden (they
 * are no part of what --force replaces; the election judges them). */
typedef struct {
    store_ops ops; /* first: a pointer to it is one to the whole */
    const store_ops *real;
} claims_hidden;

typedef struct {
    int (*visit)(void *ctx, const char *name);
    void *ctx;
} hidden_visit;

static int visit_unless_claim(void *ctx, const char *name)
{
    hidden_visit *h = ctx;
    return is_claim_name(name) ? TP_OK : h->visit(h->ctx, name);
}

static int list_hiding_claims(const store_ops *s, const char *dir, int (*visit)(void *ctx, const char *name),
                              void *ctx)
{
    const claims_hidden *h = (const claims_hidden *)s;
    hidden_visit x = {visit, ctx};
    return h->real->list(h->real, dir, visit_unless_claim, &x);
}

/* The rule of every remote output, asked before any work: nothing may be
 * at target unless replace, and then only what may_replace (the writer's
 * own check of a local target; NULL accepts nothing) accepts. An upload's
 * claim there is named: one under way is refused without --force, and a
 * stopped one's (or a live one's: the election tells them apart) is left
 * to --force. */
static int output_target_check(const store_ops *store, const char *target, int replace,
                               store_replace_check may_replace, void *ctx)
{
    store_stat st;
    TP_TRY(store->stat(store, target, &st));
    if (!st.exists) return TP_OK;
    if (!store->local_paths && st.is_dir) {
        url_scan *scan = malloc(sizeof *scan);
        claim_record *r = malloc(sizeof *r);
        char path[CKPT_PATH_MAX];
        int found = 0;
        int status = scan && r ? scan_url(store, target, NULL, scan) : tp_fail(TP_ERR_NOMEM, "out of memory");
        int claims_only = !status && scan->num_claims && !scan->other[0];
        if (!status && !replace && scan->num_claims) status = claim_path(target, scan->claims[0], path);
        if (!status && !replace && scan->num_claims) status = read_claim(path, &found, r);
        if (!status && found && claim_writer_gone(r))
            status = tp_fail(TP_ERR_EXISTS, "%s holds what an upload that stopped left: %s: its process is gone "
                             "from this machine; --force replaces it", target, r->writer);
        else if (!status && found)
            status = tp_fail(TP_ERR_EXISTS, "%s: an upload to it is under way, or stopped before it finished: %s "
                             "(--force replaces what a stopped one left)", target, r->writer);
        free(r);
        free(scan);
        TP_TRY(status);
        if (claims_only && replace) return TP_OK; /* nothing but claims: the election judges them */
    }
    if (!replace) return tp_fail(TP_ERR_EXISTS, "%s exists already (--force replaces it)", target);
    /* What --force replaces there is what it replaces on a disk: asked
     * now, before hours of writing, of what the upload will remove. */
    if (!may_replace) return tp_fail(TP_ERR_EXISTS, "%s exists already; nothing there is replaced", target);
    if (store->local_paths) return may_replace(store, target, ctx);
    claims_hidden view = {*store, store};
    view.ops.list = list_hiding_claims;
    return may_replace(&view.ops, target, ctx);
}

/* What url lists that keep() does not keep, removed: listed first, then
 * removed (a listing's visitor does not change what it lists). A url that
 * is not there holds nothing to remove where missing_is_empty. */
typedef int (*kept_name)(const void *ctx, const char *name);

typedef struct {
    ckpt_name_list removed;
    kept_name keep;
    const void *keep_ctx;
} removal_scan;

static int collect_unkept(void *ctx, const char *name)
{
    removal_scan *s = ctx;
    return s->keep(s->keep_ctx, name) ? TP_OK : ckpt_append_name(&s->removed, name);
}

static int remove_unkept(const store_ops *store, const char *url, int missing_is_empty, kept_name keep,
                         const void *keep_ctx)
{
    removal_scan scan = {{0}, keep, keep_ctx};
    int status = store->list(store, url, collect_unkept, &scan);
    if (status == TP_ERR_NOT_FOUND && missing_is_empty) status = TP_OK;
    for (int i = 0; !status && i < scan.removed.count; i++) {
        char path[CKPT_PATH_MAX];
        status = tp_path_join(path, url, scan.removed.names[i]);
        if (!status) status = store->remove_tree(store, path);
    }
    free(scan.removed.names);
    return status;
}

static int an_upload_claim(const void *ctx, const char *name)
{
    (void)ctx;
    return is_claim_name(name);
}

/* Everything at url but the uploads' claims, removed (what an elected
 * writer replaces or sent): another writer's claim is its own to remove. */
static int remove_all_but_claims(const store_ops *store, const char *url)
{
    return remove_unkept(store, url, 1, an_upload_claim, NULL);
}

/* Whether a store's directories exist apart from the objects in them
 * (WebDAV's collections; an S3 prefix is there only while keys are). */
static int store_keeps_directories(const store_ops *store)
{
    return strcmp(store->name, "webdav") == 0;
}

/* The elected writer leaving url: what it sent (and with replace what was
 * there) removed, then its claim. Where directories stay (WebDAV) and its
 * claim is all that is left, the directory goes with the claim in one
 * request: a writer claiming meanwhile then either meets this claim (and
 * gives way) or finds its own gone with it (and gives way); never is this
 * claim removed first and the directory after, which could take a claim
 * that had already won. */
static int claim_leave(upload_claim *c)
{
    TP_TRY(remove_all_but_claims(c->store, c->url));
    url_scan *scan = malloc(sizeof *scan);
    if (!scan) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int status = scan_url(c->store, c->url, c->own.owner, scan);
    int alone = !status && !scan->num_claims && !scan->other[0];
    free(scan);
    TP_TRY(status);
    ckpt_lease_renewer_stop(&c->renewer); /* never renewed back after it is removed */
    if (alone && store_keeps_directories(c->store)) return c->store->remove_tree(c->store, c->url);
    return store_delete(c->path);
}

/* An upload that failed before its index (or its files naming the others)
 * went up, or whose `latest` could not follow, leaves nothing at url: what
 * it sent, and with replace what was there (its index went first: no
 * reader could use it any more), is removed, so that the location reads as
 * before the command, empty, and a retry needs no --force. A signal is such
 * a failure: it cuts the upload's requests off (store/staging.h
 * store_stopping) and the process dies of it once this removal is done.
 * status and its message are kept; a removal that fails too is added to
 * the message. (A writer killed outright, SIGKILL or a lost node, still
 * leaves its objects: invisible without an index, docs/STORES.md.) With a
 * claim (a checkpoint or a directory: claim_take), other uploads' claims
 * stay, and nothing is removed once the claim is lost (what is there may
 * be another upload's by then); without one (a single file), url goes. */
static int discard_upload(const char *url, upload_claim *claim, int status)
{
    char message[2048];
    snprintf(message, sizeof message, "%s", tp_errmsg());
    if (claim && atomic_load(&claim->renewer.lost)) return tp_fail(status, "%s", message);
    const store_ops *store;
    int removed = TP_OK;
    if (claim) removed = claim_leave(claim);
    else if (!(removed = store_for(url, &store))) removed = store->remove_tree(store, url);
    if (removed)
        return tp_fail(status, "%s (and what was uploaded stays under %s: %s)", message, url, tp_errmsg());
    return tp_fail(status, "%s", message);
}


/* After a replacement is committed (its index up), the old checkpoint's
 * files that the new one does not have: removed, so that the location
 * holds the new checkpoint alone, as a local --force leaves its directory.
 * A reader of the new checkpoint never opens them (its index names none);
 * one still reading the old checkpoint already met its replaced index and
 * shards (a missing or changed object, docs/STORES.md "Reading"). Kept:
 * the index, its files and the uploads' claims (this writer's goes last). */
static int in_new_checkpoint(const void *ctx, const char *name)
{
    const ckpt_index *index = ctx;
    if (!strcmp(name, CKPT_INDEX_NAME) || is_claim_name(name)) return 1;
    for (int f = 0; f < index->num_files; f++)
        if (!strcmp(name, index->files[f].name)) return 1;
    return 0;
}

static int remove_stale(const char *url, const ckpt_index *index)
{
    const store_ops *store;
    TP_TRY(store_for(url, &store));
    int status = remove_unkept(store, url, 0, in_new_checkpoint, index);
    if (status)
        return tp_fail_context(status, "%s: replaced, but a file of the checkpoint it replaced could not be removed",
                               url);
    return TP_OK;
}

int ckpt_upload(const char *local_dir, const char *url, const ckpt_upload_options *options)
{
    if (!ckpt_is_remote(url)) return tp_fail(TP_ERR_ARG, "%s: not an http(s):// or s3:// location", url);
    int replace = options && options->replace;
    const store_ops *store;
    TP_TRY(store_for(url, &store));
    /* The output rule, as for every tool's remote output: a location that
     * holds anything (a run directory, another tool's files) is refused
     * without --force, and with it replaced only when it is a checkpoint. */
    TP_TRY(output_target_check(store, url, replace, ckpt_may_replace_checkpoint, NULL));
    char local_index[CKPT_PATH_MAX], remote_index[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(local_index, local_dir, CKPT_INDEX_NAME));
    TP_TRY(tp_path_join(remote_index, url, CKPT_INDEX_NAME));
    /* What goes up must read back whole there: a damaged local copy (or one
     * whose index disagrees with its files) is refused before any upload. */
    TP_TRY(ckpt_verify_checkpoint(local_dir, transfer_threads(options), NULL));
    char *text = NULL;
    int64_t text_size = 0;
    TP_TRY(store_read_text_file(local_index, CKPT_INDEX_MAX_BYTES, &text, &text_size));
    ckpt_index index;
    memset(&index, 0, sizeof index);
    int status = ckpt_index_parse(text, local_index, &index);
    /* From the first change at url until a failure is cleaned up, a signal
     * waits for this upload (store_upload_begin): its requests fail, what
     * it sent is removed here, and then the process dies of the signal. */
    int held = !status && !(status = store_upload_begin(url));
    /* One upload to a URL at a time: elected before anything is sent. */
    upload_claim *claim = NULL;
    if (!status) status = claim_take(url, replace, &claim);
    if (!status) status = ckpt_upload_begin(url, replace);
    int begun = claim != NULL;
    upload_job job = {local_dir, url, &index, transfer_threads(options), options, claim};
    if (!status && index.num_files > 0)
        status = parallel_for(index.num_files, index.num_files < job.threads ? index.num_files : job.threads,
                              upload_shard, &job);
    tp_fault_point("upload-before-index");
    if (!status) status = claim_check(claim);
    if (!status) status = put_index(remote_index, text, (size_t)text_size); /* before `latest` moves */
    int committed = !status;
    if (committed && replace) status = remove_stale(url, &index);
    /* `latest` is part of the upload: a checkpoint up without it (a signal
     * between the two) was refused to a plain retry, "holds a checkpoint
     * already", though the command had failed. */
    if (committed && !status && options && options->update_latest) {
        tp_fault_point("before-latest");
        if ((status = ckpt_upload_latest(url))) committed = 0;
    }
    if (status && begun && !committed) status = discard_upload(url, claim, status);
    claim_release(claim, committed); /* up: its claim goes (a failure to remove it leaves one stale in time) */
    if (held) store_upload_end();
    ckpt_index_free(&index);
    free(text);
    return status;
}

int ckpt_upload_begin(const char *url, int replace)
{
    if (!ckpt_is_remote(url)) return tp_fail(TP_ERR_ARG, "%s: not an http(s):// or s3:// location", url);
    const store_ops *store;
    TP_TRY(store_for(url, &store));
    char remote_index[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(remote_index, url, CKPT_INDEX_NAME));
    store_stat st = {0};
    TP_TRY(store->stat(store, remote_index, &st));
    if (!st.exists) return TP_OK;
    if (!replace) return tp_fail(TP_ERR_EXISTS, "%s holds a checkpoint already (--force replaces it)", url);
    /* The old checkpoint disappears first: never an index over new files. */
    return store_delete(remote_index);
}

int ckpt_shard_upload(const char *local_path, const ckpt_layout *layout, const ckpt_write_options *options,
                      const char *url, const ckpt_upload_options *upload, char **description)
{
    *description = NULL;
    char staging[CKPT_PATH_MAX], name[64], local[CKPT_PATH_MAX], remote[CKPT_PATH_MAX];
    TP_TRY(store_staging_path(local_path, options->staging_owner, staging, sizeof staging));
    store_staged *staged = store_staged_find(staging);
    if (!staged) return tp_fail(TP_ERR_STATE, "%s: no staging directory %s prepared by this process", local_path, staging);
    ckpt_shard_file_name(options->shard_pp, options->shard_tp, options->shard_dp, name, sizeof name);
    int status = tp_path_join(local, staging, name);
    if (!status) status = tp_path_join(remote, url, name);
    if (!status)
        status = ckpt_describe_shard(store_posix(), staging, layout, options->shard_pp, options->shard_tp, options->shard_dp,
                                     description);
    store_stat st = {0};
    if (!status) status = store_posix()->stat(store_posix(), local, &st);
    if (!status) status = put_shard_file(local, remote, st.size, transfer_threads(upload));
    if (!status && upload && upload->on_file) upload->on_file(upload->ctx, st.size);
    store_staged_discard(staged);
    if (status) {
        free(*description);
        *description = NULL;
    }
    return status;
}

int ckpt_commit_uploaded(const char *url, const ckpt_layout *layout, const ckpt_train_state *state,
                         const char *const *descriptions, int count, ckpt_run_claim *claim, int update_latest,
                         int64_t *bytes)
{
    char remote_index[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(remote_index, url, CKPT_INDEX_NAME));
    char *json = NULL;
    TP_TRY(ckpt_index_from_parts(layout, state, descriptions, count, url, &json, bytes));
    tp_fault_point("upload-before-index");
    int status = ckpt_run_claim_check(claim);
    if (!status) status = put_index(remote_index, json, strlen(json)); /* before `latest` moves */
    free(json);
    if (status || !update_latest) return status;
    tp_fault_point("before-latest");
    TP_TRY(ckpt_run_claim_check(claim)); /* nothing more beside a run that took the lease over meanwhile */
    return ckpt_upload_latest(url);
}

/* Reads of `latest` after its PUT before an older name there is taken for
 * what the store kept (ckpt_upload_latest). */
#define LATEST_READ_BACKS 5

int ckpt_upload_latest(const char *checkpoint_url)
{
    char run_url[CKPT_PATH_MAX], name[CKPT_NAME_MAX + 1], path[CKPT_PATH_MAX];
    TP_TRY(tp_split_path(checkpoint_url, run_url, sizeof run_url, name, sizeof name));
    TP_TRY(tp_path_join(path, run_url, CKPT_LATEST_NAME));
    /* Never backwards, as a local run's (ckpt_latest_update): step 15
     * uploaded after step 20 left `latest` on 15. An object store offers no
     * lock to compare and write under: two uploads of different steps at
     * the same instant can still both write it. */
    int64_t step = ckpt_step_of_name(name);
    char *current = NULL;
    int status = step >= 0 ? store_read_text_file(path, CKPT_NAME_MAX + 2, &current, NULL) : TP_ERR_NOT_FOUND;
    if (status == TP_OK) {
        current[strcspn(current, "\r\n")] = '\0';
        int64_t newest = ckpt_step_of_name(current);
        free(current);
        if (newest > step) return TP_OK; /* a newer checkpoint's: it stays */
    } else if (status == TP_ERR_IO) { /* the store did not answer; anything else there is replaced */
        return tp_fail_context(status, "%s: reading the run's latest before moving it", checkpoint_url);
    }
    char text[CKPT_NAME_MAX + 2];
    int n = snprintf(text, sizeof text, "%s\n", name);
    TP_TRY(store_put_data(path, text, (size_t)n));
    /* Read back, as an index is: a PUT answered 201 but not kept left the
     * older step's name there, a resume took it, and "copied" was said. A
     * newer step's name is another writer's, come meanwhile (it stays, as
     * above); an older one is read again for a moment (a store slow to show
     * an overwrite) before the upload fails. A read that meets it changing
     * (torn by a server rewriting it in place, or replaced between its HEAD
     * and its GET by another writer's move) is read again likewise. */
    char kept[CKPT_NAME_MAX + 2] = "";
    for (int attempt = 0; attempt < LATEST_READ_BACKS; attempt++) {
        if (attempt) sleep_seconds(0.25);
        char *seen = NULL;
        status = store_read_text_file(path, CKPT_NAME_MAX + 2, &seen, NULL);
        /* Missing: nothing kept (yet), said below after the last read. */
        if (status && (!store_read_changed(status) ||
                       (status != TP_ERR_NOT_FOUND && attempt == LATEST_READ_BACKS - 1)))
            return tp_fail_context(status, "%s: reading the run's latest back", checkpoint_url);
        snprintf(kept, sizeof kept, "%s", seen ? seen : "");
        free(seen);
        kept[strcspn(kept, "\r\n")] = '\0';
        if (!strcmp(kept, name) || (step >= 0 && ckpt_step_of_name(kept) > step)) return TP_OK;
    }
    return tp_fail(TP_ERR_IO, "%s: the store kept %s%s%s after its PUT of '%s' was answered as done (read back %d times "
                   "over %.2g s)", path, status ? "nothing" : "'", status ? "" : kept, status ? "" : "'", name,
                   LATEST_READ_BACKS, 0.25 * (LATEST_READ_BACKS - 1));
}

/* ------------------------------------------------- files other than checkpoints */

static int names_an_index(const char *name);

typedef struct {
    const char *local, *url;
    char (*names)[CKPT_NAME_MAX + 1];
    const ckpt_upload_options *options;
    upload_claim *claim;
} files_job;

static int upload_named(void *ctx, int64_t i, int thread)
{
    (void)thread;
    files_job *j = ctx;
    TP_TRY(claim_check_lost(j->claim)); /* nothing more goes up once the claim is lost */
    char local[CKPT_PATH_MAX], remote[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(local, j->local, j->names[i]));
    TP_TRY(tp_path_join(remote, j->url, j->names[i]));
    store_stat st;
    TP_TRY(store_posix()->stat(store_posix(), local, &st));
    if (names_an_index(j->names[i]) && st.size <= CKPT_INDEX_MAX_BYTES) { /* read back whole, as index.json */
        char *data;
        int64_t size;
        TP_TRY(store_read_file(local, CKPT_INDEX_MAX_BYTES, &data, &size));
        int status = put_index(remote, data, (size_t)size);
        free(data);
        TP_TRY(status);
    } else {
        TP_TRY(store_put_file(remote, local, 0, st.size, 1));
        TP_TRY(store_check_kept(remote, NULL, st.size));
    }
    if (j->options && j->options->on_file) j->options->on_file(j->options->ctx, st.size);
    return TP_OK;
}

/* The files of a directory tree, as paths relative to its root (a
 * Megatron-LM checkpoint: iter_NNNNNNN/mp_rank_TT/model_optim_rng.pt). */
typedef struct {
    ckpt_name_list found;
    const char *root;
    char prefix[CKPT_NAME_MAX + 1]; /* of the directory being listed, "" or ending in '/' */
} name_list;

static int collect_name(void *ctx, const char *name)
{
    name_list *l = ctx;
    char relative[CKPT_NAME_MAX + 1], path[CKPT_PATH_MAX];
    if ((size_t)snprintf(relative, sizeof relative, "%s%s", l->prefix, name) >= sizeof relative)
        return tp_fail(TP_ERR_ARG, "%s/%s%s: path too long", l->root, l->prefix, name);
    TP_TRY(tp_path_join(path, l->root, relative));
    const store_ops *posix = store_posix();
    store_stat st;
    TP_TRY(posix->stat(posix, path, &st));
    if (st.is_dir) { /* its files, under its name */
        char saved[CKPT_NAME_MAX + 1];
        snprintf(saved, sizeof saved, "%s", l->prefix);
        if ((size_t)snprintf(l->prefix, sizeof l->prefix, "%s/", relative) >= sizeof l->prefix)
            return tp_fail(TP_ERR_ARG, "%s: path too long", path);
        int status = posix->list(posix, path, collect_name, l);
        snprintf(l->prefix, sizeof l->prefix, "%s", saved);
        return status;
    }
    return ckpt_append_name(&l->found, relative);
}

/* Files that name the others go last: an index.json, a Megatron-LM
 * checkpoint's latest_checkpointed_iteration.txt, a PyTorch distributed
 * checkpoint's .metadata (its readers take one as a whole checkpoint). */
static int names_an_index(const char *name)
{
    size_t length = strlen(name), n = strlen("index.json");
    const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    return (length >= n && !strcmp(name + length - n, "index.json")) || !strcmp(name, "latest_checkpointed_iteration.txt") ||
           !strcmp(base, ".metadata");
}

static int index_last(const void *a, const void *b)
{
    const char *x = a, *y = b;
    int ix = names_an_index(x), iy = names_an_index(y);
    return ix != iy ? ix - iy : strcmp(x, y);
}

/* ckpt_upload_files, the signal clean-up waiting for it (ckpt_upload). */
static int upload_files(const char *local, const char *url, const ckpt_upload_options *options);

int ckpt_upload_files(const char *local, const char *url, const ckpt_upload_options *options)
{
    TP_TRY(store_upload_begin(url));
    int status = upload_files(local, url, options);
    store_upload_end();
    return status;
}

static int upload_files(const char *local, const char *url, const ckpt_upload_options *options)
{
    const store_ops *posix = store_posix();
    store_stat st;
    int update_latest = options && options->update_latest;
    TP_TRY(posix->stat(posix, local, &st));
    if (!st.exists) return tp_fail(TP_ERR_NOT_FOUND, "%s: nothing to upload", local);
    if (!st.is_dir) { /* one object: made whole or not at all */
        TP_TRY(store_put_file(url, local, 0, st.size, transfer_threads(options)));
        if (options && options->on_file) options->on_file(options->ctx, st.size);
        int status = update_latest ? ckpt_upload_latest(url) : TP_OK;
        return status ? discard_upload(url, NULL, status) : TP_OK;
    }
    name_list listing = {.root = local};
    int status = posix->list(posix, local, collect_name, &listing);
    /* One upload to a URL at a time: elected before anything is sent. */
    upload_claim *claim = NULL;
    if (!status) status = claim_take(url, options && options->replace, &claim);
    /* What was there goes first, whole: no file of it stays beside the new
     * ones, and no tracker or index names files that are not there yet. */
    if (!status && options && options->replace) status = remove_all_but_claims(claim->store, url);
    int threads = transfer_threads(options);
    if (!status && listing.found.count)
        qsort(listing.found.names, (size_t)listing.found.count, sizeof *listing.found.names, index_last);
    int first_index = listing.found.count;
    while (first_index > 0 && names_an_index(listing.found.names[first_index - 1])) first_index--;
    files_job job = {local, url, listing.found.names, options, claim};
    int begun = claim != NULL;
    if (!status && first_index > 0)
        status = parallel_for(first_index, first_index < threads ? first_index : threads, upload_named, &job);
    if (!status && first_index < listing.found.count) tp_fault_point("upload-before-index");
    if (!status) status = claim_check(claim);
    for (int i = first_index; !status && i < listing.found.count; i++) status = upload_named(&job, i, 0);
    if (!status && update_latest) {
        tp_fault_point("before-latest");
        status = ckpt_upload_latest(url);
    }
    /* Nothing half-sent stays (discard_upload): whatever was at url was
     * removed first, or there was nothing (ckpt_output_begin). */
    if (status && begun) status = discard_upload(url, claim, status);
    claim_release(claim, !status);
    free(listing.found.names);
    return status;
}

/* ------------------------------------------------- outputs of the tools */

int ckpt_local_dir_for(const char *url, const char *purpose, char *out, size_t out_size)
{
    if ((size_t)snprintf(out, out_size, "%s/tp-%s-%016llx", tp_temporary_dir(), purpose,
                         (unsigned long long)XXH64(url, strlen(url), 0)) >= out_size)
        return tp_fail(TP_ERR_ARG, "TMPDIR too long");
    return TP_OK;
}

int ckpt_output_check(const char *target, int replace, store_replace_check may_replace, void *ctx)
{
    const store_ops *store;
    TP_TRY(store_for(target, &store));
    return output_target_check(store, target, replace, may_replace, ctx);
}

int ckpt_output_begin(const char *target, int replace, store_replace_check may_replace, void *ctx, char *local,
                      size_t local_size)
{
    if (!ckpt_is_remote(target)) {
        if (strlen(target) >= local_size) return tp_fail(TP_ERR_ARG, "path too long: %s", target);
        strcpy(local, target);
        return TP_OK;
    }
    const store_ops *store;
    TP_TRY(store_for(target, &store));
    TP_TRY(output_target_check(store, target, replace, may_replace, ctx));
    /* Written here first, committed, then uploaded: a private directory. */
    char owner[128], dir[CKPT_PATH_MAX];
    TP_TRY(store_staging_owner(owner, sizeof owner));
    if ((size_t)snprintf(dir, sizeof dir, "%s/tp-upload.%s", tp_temporary_dir(), owner) >= sizeof dir)
        return tp_fail(TP_ERR_ARG, "TMPDIR too long");
    /* Removed by a signal's clean-up too, whenever it comes: a copy left
     * there would be sent by nobody (store_scratch_make). */
    int status = store_scratch_make(dir);
    if (status) return tp_fail_context(status, "a local copy for the upload to %s", target);
    /* Named as the target is ("URL/step_3/" as "URL/step_3"). */
    char parent[CKPT_PATH_MAX], base[CKPT_NAME_MAX + 1];
    if (tp_split_path(target, parent, sizeof parent, base, sizeof base)) snprintf(base, sizeof base, "checkpoint");
    if ((size_t)snprintf(local, local_size, "%s/%s", dir, base) >= local_size) {
        rmdir(dir);
        store_scratch_forget(dir);
        return tp_fail(TP_ERR_ARG, "path too long: %s", target);
    }
    return TP_OK;
}

int ckpt_output_finish(const char *target, const char *local, int ok, const ckpt_upload_options *options,
                       int update_latest)
{
    if (!ckpt_is_remote(target)) return TP_OK;
    int status = TP_OK;
    ckpt_upload_options upload;
    if (options) upload = *options;
    else ckpt_upload_options_init(&upload);
    upload.update_latest = update_latest;
    if (ok) status = ckpt_is_committed(local) ? ckpt_upload(local, target, &upload)
                                              : ckpt_upload_files(local, target, &upload);
    char parent[CKPT_PATH_MAX], base[CKPT_NAME_MAX];
    int split = tp_split_path(local, parent, sizeof parent, base, sizeof base) == TP_OK;
    /* A written output whose upload failed stays: hours of work are not
     * thrown away for a network error; `tp-ckpt copy` sends it later. Not
     * when a signal stopped the upload: the user asked for nothing to be
     * left, and the signal's clean-up removes it (store_scratch_make). */
    if (ok && status && !store_stopping()) {
        if (split) store_scratch_forget(parent);
        return tp_fail_context(status, "the output stays in %s (tp-ckpt copy uploads it)", local);
    }
    const store_ops *posix = store_posix();
    posix->remove_tree(posix, local);
    if (split) {
        rmdir(parent);
        store_scratch_forget(parent); /* removed first: a signal meanwhile removes the rest */
    }
    return status;
}

/* ------------------------------------------------------------- downloads */

#define DOWNLOAD_PART ((int64_t)8 << 20) /* bytes per ranged GET and local write (one GET: below the split of large reads) */

typedef struct {
    const char *url, *dir; /* remote checkpoint, local staging directory */
    const ckpt_index *index;
    int64_t *first_part; /* [file]: its parts' first task number; [num_files]: the total */
    store_file **remote;  /* [file]: opened once, so that all its parts are read from one version (its ETag) */
    char **buffers;      /* [thread] */
    const ckpt_upload_options *options;
    const store_ops *store; /* the remote checkpoint's */
} download_job;

static int download_part(void *ctx, int64_t task, int thread)
{
    download_job *j = ctx;
    int f = 0;
    while (j->first_part[f + 1] <= task) f++;
    const ckpt_index_file *file = &j->index->files[f];
    int64_t offset = (task - j->first_part[f]) * DOWNLOAD_PART;
    int64_t size = file->bytes - offset < DOWNLOAD_PART ? file->bytes - offset : DOWNLOAD_PART;
    char local[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(local, j->dir, file->name));
    if (!j->buffers[thread] && !(j->buffers[thread] = malloc((size_t)DOWNLOAD_PART)))
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    const store_ops *store = j->store, *posix = store_posix();
    store_file *out = NULL;
    int status = size > 0 ? store->read_at(j->remote[f], j->buffers[thread], (size_t)size, offset) : TP_OK;
    if (!status) status = posix->open(posix, local, STORE_OPEN_WRITE, &out);
    if (!status && size > 0) status = posix->write_at(out, j->buffers[thread], (size_t)size, offset);
    if (!status && j->options && j->options->on_file) j->options->on_file(j->options->ctx, size);
    if (out) posix->close(out);
    return status;
}

int64_t ckpt_reader_transfer_thread_bytes(const ckpt_reader *r)
{
    int64_t part = 0;
    for (int f = 0; f < ckpt_reader_num_files(r); f++) {
        int64_t bytes = 0;
        ckpt_reader_file(r, f, &bytes);
        if (bytes > part) part = bytes;
    }
    if (part > DOWNLOAD_PART) part = DOWNLOAD_PART;
    /* A download thread holds about twice its part: 16 MiB a thread with
     * parts of 8 MiB (35, 51, 84 and 141 MiB on 1, 2, 4 and 8 threads,
     * docs/BENCHMARKS.md); counted once, 3 threads went to 68 MiB within
     * 64M. The verify after it reads into what the parts left. */
    int64_t download = 2 * part, verify = ckpt_reader_verify_thread_bytes(r);
    return download > verify ? download : verify;
}

/* Attempts of a download whose object changed under it (or came back
 * other than asked): each from the start. */
#define DOWNLOAD_ATTEMPTS 3

/* What one attempt read of the source, to tell when it fails a source that
 * changed under it (another attempt may find it whole) from a damaged one
 * (another attempt reads the same bytes). */
typedef struct {
    char resolved[CKPT_PATH_MAX]; /* the checkpoint (a run directory's newest) */
    char *index_text;             /* its index as read; NULL: not read */
    int num_files;
    char (*names)[CKPT_NAME_MAX + 1];
    int64_t *bytes;
    char (*versions)[128]; /* each file's version (ETag) its reads were pinned to; "": none came */
} download_seen;

static void download_seen_free(download_seen *seen)
{
    free(seen->index_text);
    free(seen->names);
    free(seen->bytes);
    free(seen->versions);
    memset(seen, 0, sizeof *seen);
}

/* Whether the source is still what the attempt read: the same checkpoint,
 * the same index, and every file at the version its reads were pinned to
 * (a fresh one-byte read of each tells its version now). 0 when anything
 * differs or cannot be told (a file none of whose reads came back, a store
 * without versions, a request failing): another attempt is then worth it. */
static int source_unchanged(const char *url, const download_seen *seen)
{
    const store_ops *store;
    char resolved[CKPT_PATH_MAX], path[CKPT_PATH_MAX];
    char *text = NULL;
    if (!seen->index_text || store_for(url, &store) || ckpt_resolve_in(store, url, resolved) ||
        strcmp(resolved, seen->resolved) || tp_path_join(path, resolved, CKPT_INDEX_NAME) ||
        store_read_text(store, path, CKPT_INDEX_MAX_BYTES, &text, NULL)) {
        free(text);
        return 0;
    }
    int same = !strcmp(text, seen->index_text);
    free(text);
    for (int f = 0; same && f < seen->num_files; f++) {
        if (seen->bytes[f] == 0) continue; /* nothing read, nothing to be damaged */
        if (!seen->versions[f][0]) return 0;
        store_file *file = NULL;
        char byte, now[128] = "";
        same = !tp_path_join(path, resolved, seen->names[f]) && !store->open(store, path, STORE_OPEN_READ, &file) &&
               !store->read_at(file, &byte, 1, 0);
        if (file) {
            store_file_version(store, file, now, sizeof now);
            store->close(file);
        }
        same = same && !strcmp(now, seen->versions[f]);
    }
    return same;
}

static int download_once(const char *url, const char *local_dir, const ckpt_upload_options *options,
                         download_seen *seen);

int ckpt_download(const char *url, const char *local_dir, const ckpt_upload_options *options)
{
    for (int attempt = 1;; attempt++) {
        download_seen seen;
        memset(&seen, 0, sizeof seen);
        int status = download_once(url, local_dir, options, &seen);
        /* A checksum or format failure is what a change mid-download looks
         * like (a new ETag, a block that fails its checksum), and what a
         * damaged stored checkpoint looks like: told apart by whether the
         * source is still what was read. Nothing was published. Anything
         * else (the network after its retries, a local disk) is not made
         * better by starting again. */
        int again = 0;
        if (status == TP_ERR_CHECKSUM || status == TP_ERR_FORMAT) {
            char message[2048];
            snprintf(message, sizeof message, "%s", tp_errmsg());
            if (source_unchanged(url, &seen))
                status = tp_fail(status, "%s: the stored checkpoint is damaged: its index and every file kept their "
                                 "versions (ETags) through the download, so another download would read the same "
                                 "bytes: %s", seen.resolved, message);
            else if (attempt == DOWNLOAD_ATTEMPTS)
                status = tp_fail(status, "%s: no whole version of it could be downloaded in %d attempts, each from "
                                 "the start (it changed between them): %s", url, DOWNLOAD_ATTEMPTS, message);
            else
                again = 1;
        }
        download_seen_free(&seen);
        if (!again) return status;
    }
}

/* The downloaded copy at dir (staged, ours) verified: every block against
 * its checksum, the index against the files. A damaged piece is named by
 * the file it came from in the store (the staging copy goes with the
 * failure). */
static int verify_download(const char *dir, const char *resolved, int threads)
{
    ckpt_read_options ours;
    ckpt_read_options_init(&ours);
    ours.holder = 1; /* the staging entry is ours, locked */
    ckpt_reader *r = NULL;
    int status = ckpt_reader_open(&r, dir, &ours);
    if (status) return tp_fail_context(status, "%s: its download", resolved);
    ckpt_verify_options verify = {.threads = threads};
    ckpt_verify_result result;
    status = ckpt_verify(r, &verify, &result);
    if (!status && result.damaged) {
        const ckpt_damage *first = &result.damage[0];
        ckpt_piece_info info;
        ckpt_reader_piece_info(r, first->tensor, first->piece, &info);
        /* The piece's message names the staging copy of the file: the store's is named instead. */
        char local[CKPT_PATH_MAX + 2];
        const char *what = first->message;
        if (!tp_path_join(local, dir, info.file) && strlen(local) + 2 < sizeof local) {
            strcat(local, ": ");
            if (!strncmp(what, local, strlen(local))) what += strlen(local);
        }
        status = tp_fail(first->status, "%s/%s as downloaded: %lld of %lld pieces damaged, the first: %s", resolved,
                         info.file, (long long)result.damaged, (long long)result.pieces, what);
    }
    ckpt_verify_result_free(&result);
    ckpt_reader_close(r);
    return status;
}

static int download_once(const char *url, const char *local_dir, const ckpt_upload_options *options,
                         download_seen *seen)
{
    if (!ckpt_is_remote(url)) return tp_fail(TP_ERR_ARG, "%s: not an http(s):// or s3:// location", url);
    const store_ops *store, *posix = store_posix();
    TP_TRY(store_for(url, &store));
    char resolved[CKPT_PATH_MAX], remote_index[CKPT_PATH_MAX];
    TP_TRY(ckpt_resolve_in(store, url, resolved));
    snprintf(seen->resolved, sizeof seen->resolved, "%s", resolved);
    TP_TRY(tp_path_join(remote_index, resolved, CKPT_INDEX_NAME));
    char *text = NULL;
    int64_t text_size = 0;
    TP_TRY(store_read_text(store, remote_index, CKPT_INDEX_MAX_BYTES, &text, &text_size));
    ckpt_index index;
    memset(&index, 0, sizeof index);
    int status = (seen->index_text = strdup(text)) ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!status) status = ckpt_index_parse(text, remote_index, &index);
    if (!status && index.num_files > 0) {
        seen->names = calloc((size_t)index.num_files, sizeof *seen->names);
        seen->bytes = calloc((size_t)index.num_files, sizeof *seen->bytes);
        seen->versions = calloc((size_t)index.num_files, sizeof *seen->versions);
        if (!seen->names || !seen->bytes || !seen->versions) status = tp_fail(TP_ERR_NOMEM, "out of memory");
        for (int f = 0; !status && f < index.num_files; f++) {
            snprintf(seen->names[f], sizeof seen->names[f], "%s", index.files[f].name);
            seen->bytes[f] = index.files[f].bytes;
        }
        if (!status) seen->num_files = index.num_files;
    }
    store_stage_options stage = {.directory = 1, .overwrite = options && options->replace,
                                 .may_replace = ckpt_may_replace_checkpoint};
    store_staged *staged = NULL;
    if (!status) status = store_stage(posix, local_dir, &stage, &staged);
    const char *dir = staged ? store_staged_path(staged) : NULL;
    int threads = transfer_threads(options);
    download_job job = {resolved, dir, &index, calloc((size_t)index.num_files + 1, sizeof(int64_t)),
                        calloc((size_t)index.num_files + 1, sizeof(store_file *)),
                        calloc((size_t)threads, sizeof(char *)), options, store};
    if (!status && (!job.first_part || !job.remote || !job.buffers)) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int f = 0; !status && f < index.num_files; f++) {
        char remote[CKPT_PATH_MAX];
        status = tp_path_join(remote, resolved, index.files[f].name);
        if (!status) status = store->open(store, remote, STORE_OPEN_READ, &job.remote[f]);
    }
    /* Every file at its full size first, then its parts in parallel. */
    for (int f = 0; !status && f < index.num_files; f++) {
        char local[CKPT_PATH_MAX];
        store_file *file = NULL;
        status = tp_path_join(local, dir, index.files[f].name);
        if (!status) status = posix->open(posix, local, STORE_OPEN_CREATE, &file);
        if (!status) status = posix->resize(file, index.files[f].bytes);
        if (file) posix->close(file);
        job.first_part[f + 1] = job.first_part[f] + (index.files[f].bytes + DOWNLOAD_PART - 1) / DOWNLOAD_PART;
    }
    int64_t tasks = job.first_part ? job.first_part[index.num_files] : 0;
    if (!status && tasks > 0) status = parallel_for(tasks, tasks < threads ? (int)tasks : threads, download_part, &job);
    for (int f = 0; !status && f < index.num_files; f++) { /* durable before the index names them */
        char local[CKPT_PATH_MAX];
        store_file *file = NULL;
        status = tp_path_join(local, dir, index.files[f].name);
        if (!status) status = posix->open(posix, local, STORE_OPEN_WRITE, &file);
        if (!status) status = posix->sync(file);
        if (file) posix->close(file);
    }
    if (!status) status = store_write_file_atomic(posix, dir, CKPT_INDEX_NAME, text, (size_t)text_size);
    /* Trusted only once checked: the copy is verified (every block against
     * its checksum, the index against the files) before it is visible. */
    if (!status) status = verify_download(dir, resolved, threads);
    if (staged) {
        if (status) store_staged_discard(staged);
        else status = store_staged_publish(staged);
    }
    for (int f = 0; job.remote && f < index.num_files; f++) {
        if (!job.remote[f]) continue;
        if (f < seen->num_files) store_file_version(store, job.remote[f], seen->versions[f], sizeof seen->versions[f]);
        store->close(job.remote[f]);
    }
    free(job.remote);
    for (int t = 0; job.buffers && t < threads; t++) free(job.buffers[t]);
    free(job.buffers);
    free(job.first_part);
    ckpt_index_free(&index);
    free(text);
    return status;
}
