/* checkpoint.h: the trainer's checkpoints through the ckpt and reshard
 * libraries. Every rank of data-parallel replica 0 writes its own shard; one
 * process commits. Saving is asynchronous: the step stalls only while
 * parameters and optimizer state are copied into a snapshot, a background
 * thread writes it, and the commit happens at a later step boundary once
 * every shard is written. Loading works at any layout: each rank reads only
 * the regions of its own pieces (reshard_read_piece). */
#ifndef TP_TRAINER_CHECKPOINT_H
#define TP_TRAINER_CHECKPOINT_H

#include <stdint.h>

#include "model.h"

typedef struct saver saver;

/* The owner name of the staging directories the ranks share (rank 0's, which
 * prepares and commits them), told to every rank. Collective. */
int checkpoint_staging_owner(comm *c, char *owner /* STORE_OWNER_MAX bytes */);

/* What goes into the training state of a checkpoint. */
typedef struct {
    int64_t step;
    int64_t consumed_samples;
    const char *schedule_json;
    const char *user_json;
    uint64_t seed;
} save_state;

/* A checkpoint writer for the model; values: parameters and Adam moments, or
 * (dump_grads) the gradients in the parameters' places. Functions return a
 * tp_status; collective ones return the same verdict on every rank. */
int saver_create(saver **out, gpt_model *model, int dump_grads);
void saver_free(saver *s);

/* The snapshot buffer (host memory, resident), now rather than at the first
 * save, so that no save's stall includes taking it; for runs that will
 * checkpoint. A run without checkpoints never takes it. */
int saver_reserve(saver *s);

/* Rank 0: the run directory's claim, checked before a remote checkpoint's
 * index goes up (nothing goes up beside a run that took the lease over). */
struct ckpt_run_claim;
void saver_set_claim(saver *s, struct ckpt_run_claim *claim);

/* Starts a checkpoint at path (a staging directory first; committed later).
 * With url (else NULL) the checkpoint goes to that object-store location:
 * path is then a local directory of this rank's (its node's cache) where
 * its shard is written before it is uploaded, and removed after; no file
 * system needs to be shared by the ranks (docs/STORES.md). A failed upload
 * loses that checkpoint, not the run (saver_take_failed_upload); so does a
 * claim found lost before the index goes up.
 * With sync, returns once it is committed. Collective over all ranks. */
int saver_start(saver *s, const char *path, const char *url, const save_state *state, int sync);

/* Waits, if need be, until a save in progress has copied the parameters and
 * moments aside (it does so in the background, while forward and backward
 * passes run). Call before changing them. */
void saver_before_update(saver *s);

/* Advances a pending save without waiting: once every shard is written,
 * rank 0 commits it in the background; once committed, all ranks learn it.
 * With wait, finishes both. Collective. */
int saver_poll(saver *s, int wait);

/* The step of the save still in progress (written or committed in the
 * background), or -1 when none: a saver_start now would wait for it. */
int64_t saver_pending_step(const saver *s);

/* Takes the oldest save committed (and known to every rank) and not yet
 * taken: its step, and the seconds from its saver_start to then; 0 when
 * none. Two are kept: a step boundary can finish the pending save and a
 * synchronous one after it; take them after each boundary. */
/* A save's phases, for a remote one (rank 0): the slowest rank's seconds
 * writing its shard and uploading it, and the index's upload. */
typedef struct {
    int64_t bytes; /* uploaded */
    double write, upload, index;
} save_phases;
int saver_take_committed(saver *s, int64_t *step, double *seconds, save_phases *phases /* may be NULL */);

/* A save to an object store whose upload failed (after the retries) and
 * that is not taken yet, the oldest first: 1 with its step and why (the same
 * on every rank), else 0. Two are kept, as saver_take_committed's: a step
 * boundary can lose the pending save and a synchronous one after it. */
int saver_take_failed_upload(saver *s, int64_t *step, char *message, size_t size);

/* Seconds the caller has spent in saver_start/saver_poll since the last
 * call (the training stall due to checkpointing); resets the count. */
double saver_take_stall_seconds(saver *s);

typedef struct {
    int64_t step;
    int64_t consumed_samples;
    char path[4096];
    int optimizer_loaded;
    int seed_recorded; /* the trainer's rng state names the seed of the run that wrote it: */
    uint64_t seed;     /* that seed (which draws the samples) */
    /* The training state's schedule and the trainer's record of the run
     * (global batch, data: files or synthetic), as saved ("" when longer
     * than these or absent): what a resume compares with its own. */
    char schedule_json[512], run_json[512];
    int64_t host_state_bytes; /* this rank's: the host memory it held at once for a sharded optimizer's state it
                                 read, besides what it keeps and the staging of at most dp x 1M values on a
                                 device: on a first replica (dp rank 0) both moments whole with ZeRO-1, and one
                                 unit's parameters and moments (the largest unit's size) with ZeRO-3; else 0 */
    int other_model;          /* set, on every rank, when the load failed because the newest checkpoint holds
                                 another model than this run's (gpt_config_check_same): the launch's flags are
                                 wrong, not the checkpoint (no older one is tried) */
} load_result;

/* Told, on every rank, when a checkpoint is passed over: `text` names it,
 * why it is unusable and which one is tried instead. */
typedef void (*checkpoint_warning)(void *ctx, const char *text);

/* Loads the newest intact checkpoint under dir (a run directory or a
 * checkpoint): rank 0 lists the candidates; every rank of the first
 * data-parallel replica reads its pieces, verifying their checksums, and
 * hands them to the other replicas over its data-parallel group (a store
 * sees the checkpoint read once, whatever dp is); if any rank finds damage,
 * all fall back to the next older one (and warn, when given, says so). Without with_optimizer only the parameters are read
 * (evaluation). Collective; fails with the reason of the last one tried when
 * none is usable. */
int checkpoint_load(gpt_model *model, const char *dir, int with_optimizer, checkpoint_warning warn, void *warn_ctx,
                    load_result *out);

/* Whether dir exists and whether it holds any committed checkpoint, as
 * rank 0 finds them: one listing of a store, not one per rank. Collective. */
int checkpoint_any(comm *c, const char *dir, int *dir_exists, int *any);

/* The model configuration of the checkpoint a path names (as ckpt_resolve
 * finds it), with its resolved path; for building a model to load it into.
 * Rank 0 alone lists and opens it (in an object store those are requests)
 * and sends it to the others; its failure, with its message, is every
 * rank's. Collective. */
int checkpoint_model_config(comm *c, const char *path, gpt_config *out, char *resolved, size_t resolved_size);

/* The model a resume given no model shape trains (tp-train --resume, and
 * tp-elastic run, which plans the layouts of the trainer it launches so),
 * read by this process alone (before a communicator exists: each rank of a
 * launch reads it): the configuration of the newest checkpoint of the run
 * at path that opens, in checkpoint_load's order, with its resolved path;
 * out->dtype is the precision it trains in: given's --dtype when given
 * (given may be NULL), else the run's as the trainer recorded it (TP_BF16
 * for bf16 mixed precision; TP_FP32 when fp32 or not recorded). Fails with
 * TP_ERR_NOT_FOUND when path holds no checkpoint, TP_ERR_IO when its store
 * could not be read, and with the last checkpoint's error when none opens. */
int checkpoint_run_model(const char *path, const gpt_options *given, gpt_config *out, char *resolved,
                         size_t resolved_size);

/* Whether the trainer's record of a run (a checkpoint's user JSON, may be
 * NULL) says bf16 mixed precision: the checkpoint's own dtype is its
 * weights', fp32 then too. */
int checkpoint_record_bf16(const char *user_json);

#endif
