/* registry.h: every checkpoint format the toolkit reads and writes, in one
 * place: what each is called, how a path is recognized as one, how it is
 * opened as a source of tensors (a ckpt_reader; another tool's at tp 1 pp 1,
 * its own layout kept in its description), and how any source is written
 * as one at a layout (planned first, then written). Programs ask the
 * registry and never chain the formats' detections or writers themselves:
 * a format added here (or with formats_register) is read, and where it has
 * a writer written, by every program.
 *
 * Detection asks the registered formats in order and takes the first that
 * recognizes the path (Megatron-Core's torch_dist before DCP, since it is a
 * DCP checkpoint with a tracker file of Megatron-LM's); this toolkit's own
 * format is the fallback, whose open says why a path is not one. */
#ifndef TP_FORMATS_REGISTRY_H
#define TP_FORMATS_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "../ckpt/ckpt.h"
#include "../reshard/reshard.h"
#include "dcp.h"
#include "megatron.h"

typedef struct formats_source formats_source;
typedef struct formats_write_options formats_write_options;
typedef struct formats_write_summary formats_write_summary;

typedef struct {
    const ckpt_read_options *read; /* this toolkit's format (NULL: ckpt_read_options_init's) */
    int compute_digests;           /* another tool's: its tensors' logical digests computed (one read of
                                      everything; for --verify), where it records none of ours */
    int compare_copies;            /* another tool's: every copy of a tensor stored more than once (Megatron's
                                      replicated tensors and their optimizer state) compared with the one read,
                                      copies that differ refused (TP_ERR_FORMAT), as compute_digests does: for a
                                      tool whose output takes the copies read (export, import) */
    int threads;                   /* opening another tool's (0: all cores) */
    int64_t true_vocab;            /* a Megatron source's true vocabulary size (legacy or torch_dist; 0: not given) */
} formats_source_options;

/* How a format is written. plan checks that source can be written with
 * options, fills summary and keeps what write needs in *state (released by
 * free_plan, also after a failed plan); write writes it at path (a local
 * directory: a remote output is staged by the caller), whole or not at
 * all. may_replace: what --force may replace with it. */
typedef struct formats_writer {
    int (*plan)(formats_source *source, const formats_write_options *options, formats_write_summary *summary,
                void **state);
    int (*write)(void *state, const char *path);
    void (*free_plan)(void *state);
    store_replace_check may_replace;
} formats_writer;

typedef struct checkpoint_format {
    const char *name;  /* "tp", "megatron", "torch_dist", "dcp": as --format and JSON say it */
    const char *title; /* "Megatron-Core torch_dist": in messages */
    /* Whether path is one of this format (*found); NULL for the fallback. A
     * store that fails to answer is an error, not a "no". */
    int (*detect)(const char *path, int *found);
    /* Opens path into source (formats_source_attach gives it its handle and
     * reader). */
    int (*open)(const char *path, const formats_source_options *options, formats_source *source);
    const struct formats_writer *writer; /* NULL: the format is read, not written */
    /* Its tables of the vocabulary are stored padded as Megatron pads them,
     * and its open takes formats_source_options.true_vocab (Megatron-LM's
     * legacy format, Megatron-Core's torch_dist); a true_vocab given to
     * another format is refused. */
    int pads_vocabulary;
} checkpoint_format;

/* Adds a format, asked before the built-in ones (a test's, a new one). */
int formats_register(const checkpoint_format *format);
/* The format of that name, or NULL. */
const checkpoint_format *formats_find(const char *name);
/* The format path is in (this toolkit's when no other recognizes it). */
int formats_detect(const char *path, const checkpoint_format **out);

/* path opened as a source of tensors, of the format detected (format NULL)
 * or of the one given. options may be NULL (the defaults). */
int formats_source_open(const char *path, const checkpoint_format *format, const formats_source_options *options,
                        formats_source **out);
const checkpoint_format *formats_source_format(const formats_source *source);
/* Its tensors (owned by the source, closed with it). */
ckpt_reader *formats_source_reader(const formats_source *source);
/* The format's own handle, where the source is of that format (else NULL). */
megatron_checkpoint *formats_source_megatron(const formats_source *source);
const megatron_dist *formats_source_megatron_dist(const formats_source *source);
/* The DCP container: a DCP checkpoint's, or a torch_dist one's. */
const dcp_checkpoint *formats_source_dcp(const formats_source *source);
/* The Megatron model of a Megatron-LM or torch_dist source, else NULL. */
const megatron_config *formats_source_megatron_config(const formats_source *source);
/* What names the checkpoint read (a default output is named after it): the
 * path given (a run directory, not the step read in it). */
const char *formats_source_name(const formats_source *source);
void formats_source_close(formats_source *source);

/* For a registered format's open: what the source holds (handle: the
 * format's own, closed by close after the reader; may be NULL). */
void formats_source_attach(formats_source *source, void *handle, void (*close)(void *handle), ckpt_reader *reader);

/* How a source under another model's names is seen as a Megatron model, so
 * that the Megatron writers can write it (this toolkit's GPT:
 * gpt_megatron_view, model/interop.h, a layer above). open fills model and
 * names (their context in *state, released by close). */
typedef struct {
    int (*open)(ckpt_reader *source, megatron_config *model, megatron_source_names *names, void **state);
    void (*close)(void *state);
} formats_megatron_view;

struct formats_write_options {
    /* The layout (tp, pp; virtual_stages in this toolkit's format only),
     * threads, memory limit, overwrite, drop_optimizer, progress; dtype,
     * compression and device of this toolkit's format (reshard.h). */
    reshard_options reshard;
    int dp;                          /* dcp: each piece cut again over dp data-parallel ranks (0, 1: not) */
    int naming;                      /* megatron: a megatron_naming; -1: the source's */
    int torch_version;               /* dcp, torch_dist: a dcp_torch_version; -1: a DCP source's, else 2 */
    megatron_core_common common;     /* torch_dist: where its common state goes */
    int verify;                      /* the output is to be proven equal by logical digests: refused where a
                                        format regroups tensors so that they cannot be */
    const formats_megatron_view *megatron_view; /* NULL: a source without a Megatron model is not written as one */
};

void formats_write_options_init(formats_write_options *options);

/* Whether --verify cannot prove `target` written from a checkpoint of the
 * format `source` (1, why saying so and what proves it instead) or can (0).
 * A Megatron output (legacy or torch_dist) of a source that is not
 * Megatron's is written through a view of this toolkit's GPT
 * (formats_megatron_view): every tensor renamed and each fused QKV
 * regrouped into Megatron's per-group order, so its logical digests are not
 * the source's, and reading it back maps nothing back. Asked by the
 * Megatron writers' plans, and by a program before it reads the source (a
 * usage error). */
int formats_write_unverifiable(const checkpoint_format *source, const checkpoint_format *target, char *why,
                               size_t size);

/* Whether format's writer would ignore one of options (1, why saying which
 * option, its value and the format) or honour them all (0): --dtype,
 * --compress and --device cuda are this toolkit's format's alone (the
 * reshard engine converts, compresses and runs on a GPU; the other writers
 * copy the source's dtypes, uncompressed, on the CPU). Asked by
 * formats_write_plan_create, and by a program first (a usage error). */
int formats_write_ignored_option(const checkpoint_format *format, const formats_write_options *options, char *why,
                                 size_t size);

#define FORMATS_WRITE_DETAILS 8

/* What a write will do, decided before anything is written, in the words
 * a program prints: "plan: SOURCE (FROM) -> OUT (target)", then each
 * detail; after it, "resharded SOURCE (FROM) -> OUT (target): contents, N
 * written in ...". */
struct formats_write_summary {
    ckpt_layout to;                  /* the output's layout (a default output is named after it) */
    char target[256];                /* "Megatron-LM tp2pp1, legacy names" */
    char contents[256];              /* "12 tensors in 24 chunks, weights only" */
    int64_t bytes_written;           /* tensor data */
    int threads;
    char device[160];                /* where conversions run ("cpu", "cuda: why"); "": the CPU, said nowhere */
    int keeps_latest;                /* written in a run directory, the output becomes its `latest` */
    int details;
    struct {
        char label[12];              /* "files", "tensors", "memory" */
        char text[256];
    } detail[FORMATS_WRITE_DETAILS];
    char warning[512];               /* said after the write, or "": what a change of layout leaves out */
    int64_t true_vocab;              /* the output reopened for --verify with this vocabulary (a Megatron output's) */
    int64_t read_back_bytes;         /* buffers a thread holds reading the output back (--verify, an upload's verify),
                                        from its pieces (reshard_summary's); 0: not said, RESHARD_READ_BACK_BYTES */
    cJSON *json;                     /* the format's keys of --json ("format", "files", ...); owned by the plan */
};

typedef struct formats_write_plan formats_write_plan;

/* Plans writing source as format (one with a writer) with options: fails,
 * naming the source and why, where the format cannot hold it (an
 * optimizer state not read is refused unless options drop it) or would
 * ignore an option (formats_write_ignored_option). */
int formats_write_plan_create(formats_source *source, const checkpoint_format *format,
                              const formats_write_options *options, formats_write_plan **out);
const formats_write_summary *formats_write_plan_summary(const formats_write_plan *plan);
/* Writes the plan's output at path (a local directory), whole or not at all. */
int formats_write(formats_write_plan *plan, const char *path);
void formats_write_plan_free(formats_write_plan *plan);

#endif
