/* registry.h: every checkpoint format the toolkit reads, in one place: what
 * each is called, how a path is recognized as one, and how it is opened as
 * a source of tensors (a ckpt_reader; another tool's at tp 1 pp 1, its own
 * layout kept in its description). Programs ask the registry and never
 * chain the formats' detections themselves: a format added here (or with
 * formats_register) is read by every program.
 *
 * Detection asks the registered formats in order and takes the first that
 * recognizes the path (Megatron-Core's torch_dist before DCP, since it is a
 * DCP checkpoint with a tracker file of Megatron-LM's); this toolkit's own
 * format is the fallback, whose open says why a path is not one. */
#ifndef TP_FORMATS_REGISTRY_H
#define TP_FORMATS_REGISTRY_H

#include <stdint.h>

#include "../ckpt/ckpt.h"
#include "dcp.h"
#include "megatron.h"

typedef struct formats_source formats_source;

typedef struct {
    const ckpt_read_options *read; /* this toolkit's format (NULL: ckpt_read_options_init's) */
    int compute_digests;           /* another tool's: its tensors' logical digests computed (one read of
                                      everything; for --verify), where it records none of ours */
    int threads;                   /* opening another tool's (0: all cores) */
    int64_t true_vocab;            /* a Megatron-LM legacy source's true vocabulary size (0: not given) */
} formats_source_options;

typedef struct checkpoint_format {
    const char *name;  /* "tp", "megatron", "torch_dist", "dcp": as --format and JSON say it */
    const char *title; /* "Megatron-Core torch_dist": in messages */
    /* Whether path is one of this format (*found); NULL for the fallback. A
     * store that fails to answer is an error, not a "no". */
    int (*detect)(const char *path, int *found);
    /* Opens path into source (formats_source_attach gives it its handle and
     * reader). */
    int (*open)(const char *path, const formats_source_options *options, formats_source *source);
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
void formats_source_close(formats_source *source);

/* For a registered format's open: what the source holds (handle: the
 * format's own, closed by close after the reader; may be NULL). */
void formats_source_attach(formats_source *source, void *handle, void (*close)(void *handle), ckpt_reader *reader);

#endif
