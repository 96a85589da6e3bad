/* lease.h: what the two claims held in an object store share (inside ckpt/
 * only): the run directory's lease (runclaim.c) and an upload's claim
 * (upload.c). Each is a small JSON object at a URL naming its holder,
 * renewed by a thread of the holder every quarter period so that others
 * see it alive (an object store has no locks, and no two machines' clocks
 * are compared: a watcher counts changes on its own clock), and lost when
 * another holder takes it over: the holder stops rather than write beside
 * it. The objects' fields and the rules of taking over differ and stay
 * with each claim. */
#ifndef TP_CKPT_LEASE_H
#define TP_CKPT_LEASE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#define CKPT_LEASE_HOLDER_MAX 512
#define CKPT_LEASE_LOST_MAX 512

/* "tp-train (pid 41 on host n1, since 2026-11-24T20:41:07Z)": a holder as
 * others are told of it. */
void ckpt_lease_describe_holder(const char *program, char *out, size_t out_size);

/* The period in seconds from the environment variable name (default
 * fallback, within [min, max]); TP_ERR_ARG naming the variable otherwise. */
int ckpt_lease_period(const char *name, double fallback, double min, double max, double *out);

/* Reads a claim object another holder may be rewriting or releasing:
 * read(path, found, record) is tried again a few times (about half a second
 * in all) while it fails as an object changing under the read would, then
 * its error stands. Torn (TP_ERR_FORMAT): a PUT to S3 replaces an object
 * whole, but a server that rewrites one in place (s3rver truncates the file
 * and writes it again; many WebDAV servers alike) can serve it short of its
 * length or half old, half new, during a renewal: that failed the loser of
 * two uploads with "not an upload's claim", and a trainer beside a live
 * writer with "not a JSON object", each instead of naming the holder.
 * Renewed between the read's HEAD and its GET (TP_ERR_CHECKSUM, S3's 412),
 * or released between them (TP_ERR_NOT_FOUND): read again, it is the new
 * one, or none. A store's own failures are not tried again here: the store
 * has retried them already. */
typedef int (*ckpt_lease_read_fn)(const char *path, int *found, void *record);
int ckpt_lease_read_settled(ckpt_lease_read_fn read, const char *path, int *found, void *record);

/* The renewal thread of a lease. renew(ctx, renewer) is called every
 * period/4 seconds, without the renewer's mutex held; it renews the
 * object and, when the lease is lost, calls ckpt_lease_set_lost, which
 * ends the renewals. */
typedef struct ckpt_lease_renewer ckpt_lease_renewer;
typedef void (*ckpt_lease_renew_fn)(void *ctx, ckpt_lease_renewer *renewer);

struct ckpt_lease_renewer {
    double period;
    ckpt_lease_renew_fn renew;
    void *ctx;
    pthread_t thread;
    int running;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
    int stopping;                  /* under mutex */
    atomic_int lost;
    char lost_why[CKPT_LEASE_LOST_MAX]; /* under mutex: the first reason given */
};

/* Sets up a renewer that is not yet running (ckpt_lease_renewer_start). */
void ckpt_lease_renewer_init(ckpt_lease_renewer *r, double period, ckpt_lease_renew_fn renew, void *ctx);
/* Starts the renewals: TP_ERR_NOMEM when no thread could be made. */
int ckpt_lease_renewer_start(ckpt_lease_renewer *r, const char *what);
/* Stops the renewals (waiting for one under way); nothing when not running. */
void ckpt_lease_renewer_stop(ckpt_lease_renewer *r);
/* Stops the renewals and frees what init set up. */
void ckpt_lease_renewer_destroy(ckpt_lease_renewer *r);
/* The lease is lost, for the reason why (the first reason stays). */
void ckpt_lease_set_lost(ckpt_lease_renewer *r, const char *why);
/* Whether the lease is lost; then its reason in why. */
int ckpt_lease_lost(ckpt_lease_renewer *r, char *why, size_t size);

#endif
