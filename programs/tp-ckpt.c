/* tp-ckpt: inspect, verify, compare and synthesize checkpoints.
 * A thin layer over ckpt.h; see `tp-ckpt --help`. Exit status: 0 success,
 * 1 failure (damage found, checkpoints differ, an operation failed), 2 usage. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/parallel.h"
#include "progress.h"
#include "../formats/dcp.h"
#include "../formats/megatron.h"
#include "../formats/registry.h"
#include "../model/interop.h"
#include "../reshard/reshard.h"
#include "cli.h"
#include "synth.h"

static const char *usage_text =
    "usage: tp-ckpt <command> [options]\n"
    "\n"
    "commands:\n"
    "  info CKPT [--json]           layout, step, model and the tensor table (also of a\n"
    "                               Megatron checkpoint or a PyTorch distributed checkpoint)\n"
    "  verify CKPT [--threads N] [--memory-limit SIZE]\n"
    "                               check completeness and every checksum (exit 1 if damaged)\n"
    "  diff A B [--tol X] [--atol X] [--threads N] [--weights-only] [--true-vocab-size N]\n"
    "                               compare the merged tensors of two checkpoints, any layouts\n"
    "                               (default bit-exact; exit 1 if they differ)\n"
    "  synth -o DIR --tp T --pp P (--model M | [--arch gpt|llama] --layers L --dim D --heads H\n"
    "        --vocab V --seq S) [--kv-heads K] [--ffn F] [--swiglu] [--vocab-pad-multiple N]\n"
    "        [--dtype fp32|bf16|fp16] [--tied-embeddings|--untied-embeddings] [--norm-eps E]\n"
    "        [--rope-theta T] [--rope-scaling FACTOR[,LOW,HIGH,ORIGINAL]] [--optim] [--seed N]\n"
    "        [--step N] [--compress zstd[:LEVEL]|none] [--threads N] [--force] [--progress]\n"
    "                               write a deterministic GPT-2 or Llama checkpoint\n"
    "  export CKPT --format safetensors|gguf|hdf5 -o OUT [--dtype fp32|bf16|fp16]\n"
    "        [--max-shard-size SIZE] [--tokenizer DIR] [--name NAME] [--true-vocab-size N]\n"
    "        [--threads N] [--memory-limit SIZE] [--force] [--progress]\n"
    "                               merged weights for inference: a Hugging Face GPT-2\n"
    "                               directory, a llama.cpp GGUF file, or one HDF5 file\n"
    "  import DIR -o CKPT --tp T --pp P [--dtype fp32|bf16|fp16] [--vocab-pad-multiple N]\n"
    "        [--true-vocab-size N] [--threads N] [--compress zstd[:LEVEL]|none] [--force] [--progress]\n"
    "        [--allow-nonfinite]\n"
    "                               a Hugging Face GPT-2 or Llama (config.json + safetensors),\n"
    "                               or a Megatron GPT-2 or Llama, as a sharded checkpoint, to\n"
    "                               train from\n"
    "  copy SRC DST [--threads N] [--memory-limit SIZE] [--force] [--progress]\n"
    "                               upload a checkpoint to, or download it from, an object store\n"
    "                               (http(s)://, s3://bucket/prefix: docs/STORES.md); SRC may be a\n"
    "                               run directory (its newest checkpoint)\n"
    "\n"
    "CKPT is a checkpoint directory, or a run directory (its `latest` checkpoint); info, verify,\n"
    "diff and export also read Megatron-LM legacy and Megatron-Core torch_dist checkpoints\n"
    "(docs/MEGATRON.md) and PyTorch distributed checkpoints (DCP, docs/DCP.md).\n"
    "Run `tp-ckpt <command> --help` for a command's options.\n";

#define die_usage(...) cli_usage_error("tp-ckpt", __VA_ARGS__)
#define fail(...) cli_error("tp-ckpt", __VA_ARGS__)

/* A checkpoint of any format (formats/registry.h); with verify, this
 * toolkit's own read against its checksums; with every_damage (verify's
 * whole check), its missing or cut-short shard files failing their pieces,
 * not the open, and each shard file's metadata checked in a store too. */
static formats_source *open_or_die(const char *path, int verify, int every_damage, int64_t true_vocab, int *exit_code)
{
    cli_path("tp-ckpt", "the checkpoint's path", path);
    ckpt_read_options read;
    ckpt_read_options_init(&read);
    read.verify = verify;
    read.damaged_files_fail_pieces = every_damage;
    read.check_metadata = every_damage;
    formats_source_options options = {.read = &read, .true_vocab = true_vocab};
    formats_source *source = NULL;
    if (formats_source_open(path, NULL, &options, &source) != TP_OK) {
        *exit_code = fail("%s", tp_errmsg());
        return NULL;
    }
    return source;
}

/* The format of path, or NULL after saying why not. */
static const checkpoint_format *detect_or_fail(const char *path, int *exit_code)
{
    cli_path("tp-ckpt", "the checkpoint's path", path);
    const checkpoint_format *format = NULL;
    if (formats_detect(path, &format)) *exit_code = fail("%s", tp_errmsg());
    return format;
}

/* ------------------------------------------------------------------- info */

static void format_partition(const ckpt_tensor_desc *t, char *out, size_t size)
{
    const ckpt_partition *p = &t->partition;
    if (p->kind == CKPT_REPLICATED) {
        snprintf(out, size, "replicated");
        return;
    }
    int n = snprintf(out, size, "split axis %d", p->axis);
    if (p->num_segments > 1) {
        char segments[128];
        ckpt_shape_text(p->segments, p->num_segments, segments, sizeof segments);
        n += snprintf(out + n, size - (size_t)n, " segments %s", segments);
    }
    if (p->granule > 1) n += snprintf(out + n, size - (size_t)n, " granule %lld", (long long)p->granule);
    if (p->pad_multiple > 0) n += snprintf(out + n, size - (size_t)n, " pad x%lld", (long long)p->pad_multiple);
    if (p->replicate_small_segments) snprintf(out + n, size - (size_t)n, " (small segments replicated)");
}

static int64_t tensor_stored_bytes(const ckpt_reader *r, int i)
{
    int64_t bytes = 0;
    const ckpt_tensor_desc *t = ckpt_reader_tensor(r, i);
    for (int p = 0; p < ckpt_piece_count(t, ckpt_reader_layout(r)->tp); p++) {
        ckpt_piece_info info;
        if (ckpt_reader_piece_info(r, i, p, &info) == TP_OK) bytes += info.bytes;
    }
    return bytes;
}

/* The reader's index as a JSON object (NULL after a failure, said). */
static cJSON *index_object(const ckpt_reader *r)
{
    char *text = NULL;
    if (ckpt_reader_index_json(r, &text)) {
        fail("%s", tp_errmsg());
        return NULL;
    }
    cJSON *root = cJSON_Parse(text);
    free(text);
    return root;
}

/* Sets key to value in o, replacing what the index put there (its format:
 * this toolkit's), so that the object holds every key once. */
static void set_string(cJSON *o, const char *key, const char *value)
{
    cJSON_DeleteItemFromObjectCaseSensitive(o, key);
    cJSON_AddStringToObject(o, key, value);
}

static void print_object(cJSON *root)
{
    char *out = cJSON_Print(root);
    printf("%s\n", out);
    cJSON_free(out);
    cJSON_Delete(root);
}

/* The index, with the layout also at the top level (tp, pp, dp, num_layers,
 * virtual_stages), the resolved path, total bytes, and per tensor its piece
 * shape and bytes. */
static int info_json(const ckpt_reader *r)
{
    cJSON *root = index_object(r);
    if (!root) return 1;
    const ckpt_layout *layout = ckpt_reader_layout(r);
    cJSON_AddStringToObject(root, "path", ckpt_reader_path(r));
    cJSON_AddNumberToObject(root, "tp", layout->tp);
    cJSON_AddNumberToObject(root, "pp", layout->pp);
    cJSON_AddNumberToObject(root, "dp", layout->dp);
    cJSON_AddNumberToObject(root, "num_layers", (double)layout->num_layers);
    cJSON_AddNumberToObject(root, "virtual_stages", ckpt_layout_chunks(layout));
    int64_t total = 0;
    for (int f = 0; f < ckpt_reader_num_files(r); f++) {
        int64_t bytes;
        ckpt_reader_file(r, f, &bytes);
        total += bytes;
    }
    cJSON_AddNumberToObject(root, "total_bytes", (double)total);
    int i = 0;
    cJSON *tensor;
    cJSON_ArrayForEach(tensor, cJSON_GetObjectItem(root, "tensors"))
    {
        const ckpt_tensor_desc *t = ckpt_reader_tensor(r, i);
        int64_t piece[CKPT_MAX_DIMS];
        ckpt_piece_shape(t, layout->tp, piece);
        cJSON *shape = cJSON_AddArrayToObject(tensor, "piece_shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)piece[d]));
        cJSON_AddNumberToObject(tensor, "bytes", (double)tensor_stored_bytes(r, i++));
    }
    print_object(root);
    return 0;
}

static void info_table(const ckpt_reader *r);

static void info_text(const ckpt_reader *r)
{
    const ckpt_layout *layout = ckpt_reader_layout(r);
    const ckpt_train_state *state = ckpt_reader_state(r);
    int major, minor;
    ckpt_reader_version(r, &major, &minor);
    int64_t total = 0, param_bytes = 0, optim_bytes = 0, param_elements = 0;
    for (int f = 0; f < ckpt_reader_num_files(r); f++) {
        int64_t bytes;
        ckpt_reader_file(r, f, &bytes);
        total += bytes;
    }
    int params = 0;
    for (int i = 0; i < ckpt_reader_num_tensors(r); i++) {
        const ckpt_tensor_desc *t = ckpt_reader_tensor(r, i);
        int64_t bytes = tensor_stored_bytes(r, i);
        if (strcmp(t->role, "param") == 0) {
            params++;
            param_bytes += bytes;
            int64_t n = 1;
            for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
            param_elements += n;
        } else {
            optim_bytes += bytes;
        }
    }
    char size[32], psize[32], osize[32];
    format_bytes((double)total, size, sizeof size);
    format_bytes((double)param_bytes, psize, sizeof psize);
    format_bytes((double)optim_bytes, osize, sizeof osize);
    printf("checkpoint   %s (format %d.%d)\n", ckpt_reader_path(r), major, minor);
    printf("step         %lld   consumed samples %lld\n", (long long)state->step,
           (long long)state->consumed_samples);
    char chunks[64] = "";
    if (ckpt_layout_chunks(layout) > 1) /* the interleaved schedule's */
        snprintf(chunks, sizeof chunks, " virtual_stages=%d", ckpt_layout_chunks(layout));
    printf("layout       tp=%d pp=%d%s dp=%d   layers=%lld   files=%d   %s on disk\n", layout->tp, layout->pp, chunks,
           layout->dp, (long long)layout->num_layers, ckpt_reader_num_files(r), size);
    printf("model        %s\n", state->model_json);
    printf("tensors      %d: %d parameters (%lld elements, %s), optimizer state %s\n\n",
           ckpt_reader_num_tensors(r), params, (long long)param_elements, psize, osize);
    info_table(r);
}

static void info_table(const ckpt_reader *r)
{
    const ckpt_layout *layout = ckpt_reader_layout(r);
    printf("%-44s %-5s %-16s %-16s %-48s %5s %12s\n", "name", "dtype", "shape", "padded",
           "partition", "stage", "bytes");
    for (int i = 0; i < ckpt_reader_num_tensors(r); i++) {
        const ckpt_tensor_desc *t = ckpt_reader_tensor(r, i);
        char shape[64], padded_text[64], partition[128];
        int64_t padded[CKPT_MAX_DIMS];
        ckpt_padded_shape(t, layout->tp, padded);
        ckpt_shape_text(t->shape, t->ndim, shape, sizeof shape);
        ckpt_shape_text(padded, t->ndim, padded_text, sizeof padded_text);
        format_partition(t, partition, sizeof partition);
        printf("%-44s %-5s %-16s %-16s %-48s %5d %12lld\n", t->name, tp_dtype_name(t->dtype), shape,
               padded_text, partition, ckpt_tensor_stage(t, layout), (long long)tensor_stored_bytes(r, i));
    }
}

/* A Megatron-LM legacy checkpoint: what the reader found and each
 * tensor's canonical name, description and name in the rank files. */
static int info_megatron(const char *path, int json)
{
    megatron_checkpoint *m;
    if (megatron_open(path, &m) != TP_OK) return fail("%s", tp_errmsg());
    const megatron_config *c = megatron_config_of(m);
    const ckpt_layout layout = megatron_layout(m);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "megatron-legacy");
    cJSON_AddStringToObject(root, "path", megatron_path(m));
    cJSON_AddStringToObject(root, "names", c->core_names ? "core" : "legacy");
    cJSON_AddNumberToObject(root, "checkpoint_version", c->checkpoint_version);
    cJSON_AddNumberToObject(root, "iteration", (double)c->iteration);
    cJSON_AddNumberToObject(root, "tp", c->tp);
    cJSON_AddNumberToObject(root, "pp", c->pp);
    cJSON_AddNumberToObject(root, "vpp", c->vpp);
    cJSON_AddNumberToObject(root, "num_layers", (double)c->num_layers);
    int refusal_status;
    const char *refusal = megatron_optimizer_refusal(m, &refusal_status);
    cJSON_AddBoolToObject(root, "optimizer_read", c->optimizer_read);
    cJSON_AddBoolToObject(root, "distributed_optimizer", c->distributed_optimizer);
    if (refusal) cJSON_AddStringToObject(root, "optimizer_refusal", refusal);
    cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
    int64_t parameters = 0, state_tensors = 0;
    for (int i = 0; i < megatron_num_tensors(m); i++) {
        const ckpt_tensor_desc *t = megatron_tensor(m, i);
        cJSON *tensor = cJSON_CreateObject();
        cJSON_AddStringToObject(tensor, "name", t->name);
        cJSON_AddStringToObject(tensor, "source", megatron_source_name(m, i));
        cJSON_AddStringToObject(tensor, "role", t->role ? t->role : "param");
        cJSON_AddStringToObject(tensor, "dtype", tp_dtype_name(t->dtype));
        cJSON *shape = cJSON_AddArrayToObject(tensor, "shape");
        int64_t n = 1;
        for (int d = 0; d < t->ndim; d++) {
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
            n *= t->shape[d];
        }
        if (t->role && strcmp(t->role, "param")) state_tensors++;
        else parameters += n;
        char partition[128];
        format_partition(t, partition, sizeof partition);
        cJSON_AddStringToObject(tensor, "partition", partition);
        cJSON_AddNumberToObject(tensor, "stage", ckpt_tensor_stage(t, &layout));
        cJSON_AddItemToArray(tensors, tensor);
    }
    if (json) {
        char *out = cJSON_Print(root);
        printf("%s\n", out);
        cJSON_free(out);
    } else {
        printf("checkpoint   %s (Megatron-LM, checkpoint_version %.1f, %s names)\n", megatron_path(m), c->checkpoint_version,
               c->core_names ? "Megatron-Core" : "legacy");
        if (c->iteration >= 0) printf("iteration    %lld\n", (long long)c->iteration);
        else printf("iteration    release\n");
        printf("layout       tp=%d pp=%d%s   layers=%lld   files=%d\n", c->tp, c->pp, c->vpp > 1 ? " (virtual pipeline)" : "",
               (long long)c->num_layers, c->tp * c->pp);
        if (c->vpp > 1) printf("             %d model chunks per stage\n", c->vpp);
        printf("model        hidden %lld, %lld heads in %lld query groups of %lld channels, ffn %lld%s, vocabulary %lld "
               "(padded), %s, %s, %s embeddings%s, %s\n",
               (long long)c->hidden, (long long)c->heads, (long long)c->query_groups, (long long)c->kv_channels,
               (long long)c->ffn, c->swiglu ? " (SwiGLU)" : "", (long long)c->padded_vocab,
               c->learned_positions ? "learned positions" : "no position embeddings", c->has_bias ? "biases" : "no biases",
               c->untied ? "untied" : "tied", c->tied_head_copy ? " (a copy on the last stage)" : "", tp_dtype_name(c->dtype));
        printf("tensors      %d, %lld parameters\n", megatron_num_tensors(m), (long long)parameters);
        if (c->optimizer_read)
            printf("optimizer    Adam moments%s, read%s: %lld tensors optim/ROLE/NAME\n",
                   c->dtype != TP_FP32 ? " and fp32 master weights" : "",
                   c->distributed_optimizer ? " from the distributed optimizer's distrib_optim.pt" : "", (long long)state_tensors);
        else if (refusal)
            printf("optimizer    %s: %s (the weights are read)\n", refusal_status == TP_ERR_FORMAT ? "damaged" : "not read",
                   refusal);
        printf("\n%-36s %-5s %-14s %-44s %5s  %s\n", "name", "dtype", "shape", "partition", "stage", "in the rank files");
        for (int i = 0; i < megatron_num_tensors(m); i++) {
            const ckpt_tensor_desc *t = megatron_tensor(m, i);
            char shape[64], partition[128];
            ckpt_shape_text(t->shape, t->ndim, shape, sizeof shape);
            format_partition(t, partition, sizeof partition);
            printf("%-36s %-5s %-14s %-44s %5d  %s\n", t->name, tp_dtype_name(t->dtype), shape, partition,
                   ckpt_tensor_stage(t, &layout), megatron_source_name(m, i));
        }
    }
    cJSON_Delete(root);
    megatron_close(m);
    return 0;
}

/* The other entries of a distributed checkpoint (dcp_entry_is_other: a
 * DCP's, a torch_dist checkpoint's), as info lists them: the JSON array
 * "others", or a table after the tensors' headed by what becomes of them. */
static void add_other_entries(cJSON *root, const dcp_checkpoint *d)
{
    cJSON *list = cJSON_AddArrayToObject(root, "others");
    for (int i = 0; i < dcp_num_entries(d); i++) {
        const dcp_entry *e = dcp_entry_at(d, i);
        if (!dcp_entry_is_other(e)) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "key", e->key);
        cJSON_AddStringToObject(o, "kind", e->kind == DCP_BYTES ? "bytes" : torch_dtype_name(e->dtype));
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        for (int k = 0; e->kind == DCP_TENSOR && k < e->ndim; k++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->shape[k]));
        cJSON_AddItemToArray(list, o);
    }
}

static void print_other_entries(const dcp_checkpoint *d, const char *heading)
{
    for (int i = 0, first = 1; i < dcp_num_entries(d); i++) {
        const dcp_entry *e = dcp_entry_at(d, i);
        if (!dcp_entry_is_other(e)) continue;
        if (first) printf("\n%-44s %-10s %s\n", heading, "kind", "shape");
        first = 0;
        char shape[64] = "";
        if (e->kind == DCP_TENSOR) ckpt_shape_text(e->shape, e->ndim, shape, sizeof shape);
        printf("%-44s %-10s %s\n", e->key, e->kind == DCP_BYTES ? "bytes" : torch_dtype_name(e->dtype), shape);
    }
}

static int count_other_entries(const dcp_checkpoint *d)
{
    int n = 0;
    for (int i = 0; d && i < dcp_num_entries(d); i++) n += dcp_entry_is_other(dcp_entry_at(d, i));
    return n;
}

/* A PyTorch distributed checkpoint: its tensors as read (described by the
 * description it carries, or plainly) and its other entries. */
static int info_dcp(const char *path, int json)
{
    dcp_checkpoint *d;
    ckpt_reader *r = NULL;
    if (dcp_open(path, &d) || dcp_reader_open(d, 0, 0, &r)) {
        int code = fail("%s", tp_errmsg());
        dcp_close(d);
        return code;
    }
    const char *torch = dcp_torch_version_of(d) == DCP_TORCH_1_13 ? "1.13" : "2";
    int others = count_other_entries(d), code = 0;
    if (json) {
        cJSON *root = index_object(r);
        code = root ? 0 : 1;
        if (root) {
            set_string(root, "format", "dcp");
            set_string(root, "path", dcp_path(d));
            cJSON_AddStringToObject(root, "torch", torch);
            cJSON_AddBoolToObject(root, "described", dcp_has_description(d));
            cJSON_AddNumberToObject(root, "total_bytes", (double)dcp_bytes(d));
            add_other_entries(root, d);
            print_object(root);
        }
    } else {
        char size[32];
        format_bytes((double)dcp_bytes(d), size, sizeof size);
        const ckpt_train_state *state = ckpt_reader_state(r);
        printf("checkpoint   %s (PyTorch distributed checkpoint, class paths of PyTorch %s)\n", dcp_path(d), torch);
        printf("description  %s\n", dcp_has_description(d)
                                         ? "tp-toolkit's, carried: partitions, stages, roles, state and digests"
                                         : "none: every tensor read as replicated, a parameter on the first stage");
        if (dcp_has_description(d))
            printf("step         %lld   consumed samples %lld\nlayers       %lld\nmodel        %s\n", (long long)state->step,
                   (long long)state->consumed_samples, (long long)ckpt_reader_layout(r)->num_layers, state->model_json);
        printf("files        %d data files and .metadata, %s\n", dcp_num_files(d), size);
        printf("tensors      %d read as tensors, %d other entries\n\n", ckpt_reader_num_tensors(r), others);
        info_table(r);
        print_other_entries(d, "other entries (carried by a DCP output)");
    }
    ckpt_reader_close(r);
    dcp_close(d);
    return code;
}

/* A Megatron-Core torch_dist checkpoint: the model from its common state, the
 * tensors under their canonical names, what of the optimizer was read. */
static int info_megatron_dist(const char *path, int json)
{
    megatron_dist *m;
    ckpt_reader *r = NULL;
    if (megatron_dist_open(path, &m) || megatron_dist_reader_open(m, 0, 0, &r)) {
        int code = fail("%s", tp_errmsg());
        megatron_dist_close(m);
        return code;
    }
    const megatron_config *c = megatron_dist_config(m);
    const dcp_checkpoint *d = megatron_dist_dcp(m);
    const char *refusal = megatron_dist_optimizer_refusal(m);
    int code = 0;
    if (json) {
        cJSON *root = index_object(r);
        code = root ? 0 : 1;
        if (root) {
            set_string(root, "format", "megatron-torch-dist");
            set_string(root, "path", megatron_dist_path(m));
            cJSON_AddStringToObject(root, "names", megatron_naming_name(c->naming));
            cJSON_AddNumberToObject(root, "iteration", (double)c->iteration);
            cJSON_AddNumberToObject(root, "checkpoint_version", c->checkpoint_version);
            cJSON_AddStringToObject(root, "common_state", megatron_dist_common_source(m));
            cJSON_AddNumberToObject(root, "saved_tp", c->tp);
            cJSON_AddNumberToObject(root, "saved_pp", c->pp);
            cJSON_AddBoolToObject(root, "optimizer_read", c->optimizer_read);
            if (c->optimizer_read) cJSON_AddStringToObject(root, "optimizer_layout", megatron_dist_optimizer_layout(m));
            if (refusal) cJSON_AddStringToObject(root, "optimizer_refusal", refusal);
            cJSON_AddNumberToObject(root, "total_bytes", (double)dcp_bytes(d));
            add_other_entries(root, d);
            print_object(root);
        }
    } else {
        char size[32];
        format_bytes((double)dcp_bytes(d), size, sizeof size);
        int entry = !strcmp(megatron_dist_common_source(m), "common_state");
        printf("checkpoint   %s (Megatron-Core torch_dist, checkpoint_version %.1f, %s names, common state %s)\n",
               megatron_dist_path(m), c->checkpoint_version, megatron_naming_name(c->naming),
               entry ? "in its common_state entry: 0.19+" : "in common.pt: up to 0.18");
        if (c->iteration >= 0) printf("iteration    %lld\n", (long long)c->iteration);
        else printf("iteration    release\n");
        printf("saved at     tp=%d pp=%d (read at any layout)   layers=%lld   %d data files, %s\n", c->tp, c->pp,
               (long long)c->num_layers, dcp_num_files(d), size);
        printf("model        hidden %lld, %lld heads in %lld query groups of %lld channels, ffn %lld%s, vocabulary %lld "
               "(padded), %s, %s, %s embeddings, %s\n",
               (long long)c->hidden, (long long)c->heads, (long long)c->query_groups, (long long)c->kv_channels,
               (long long)c->ffn, c->swiglu ? " (SwiGLU)" : "", (long long)c->padded_vocab,
               c->learned_positions ? "learned positions" : "no position embeddings", c->has_bias ? "biases" : "no biases",
               c->untied ? "untied" : "tied", tp_dtype_name(c->dtype));
        const char *layout = megatron_dist_optimizer_layout(m);
        if (c->optimizer_read && !strcmp(layout, "model space"))
            printf("optimizer    Adam state in the model's space, read: optim/ROLE/NAME\n");
        else if (c->optimizer_read)
            printf("optimizer    Adam state of the distributed optimizer, %s, read: optim/ROLE/NAME\n", layout);
        else if (refusal) printf("optimizer    not read: %s\n", refusal);
        printf("tensors      %d read as tensors, %d other entries (objects, states, counters)\n\n",
               ckpt_reader_num_tensors(r), count_other_entries(d));
        info_table(r);
        print_other_entries(d, "other entries (not read as tensors)");
    }
    ckpt_reader_close(r);
    megatron_dist_close(m);
    return code;
}

static int cmd_info(int argc, char **argv)
{
    int json = 0;
    static const struct option options[] = {{"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "jh", options, NULL)) != -1) {
        if (c == 'j') json = 1;
        else if (c == 'h') {
            printf("usage: tp-ckpt info CKPT [--json]\n"
                   "CKPT: a checkpoint or run directory of this toolkit, a Megatron-LM legacy\n"
                   "checkpoint (the directory with latest_checkpointed_iteration.txt, or an\n"
                   "iteration's directory), whose tensors are listed with their canonical names,\n"
                   "or a PyTorch distributed checkpoint (a directory with .metadata) or a\n"
                   "Megatron-Core torch_dist one, whose other entries (bytes, tensors of other\n"
                   "dtypes) are listed after its tensors.\n");
            return 0;
        } else die_usage("info: unknown option or missing value: '%s'", cli_rejected_option(argv));
    }
    if (optind != argc - 1) die_usage("info takes one checkpoint");
    int code = 0;
    const checkpoint_format *format = detect_or_fail(argv[optind], &code);
    if (!format) return code;
    /* What another tool's checkpoint says beyond its tensors. */
    if (!strcmp(format->name, "torch_dist")) return info_megatron_dist(argv[optind], json);
    if (!strcmp(format->name, "dcp")) return info_dcp(argv[optind], json);
    if (!strcmp(format->name, "megatron")) return info_megatron(argv[optind], json);
    formats_source *source = open_or_die(argv[optind], 0, 0, 0, &code);
    if (!source) return code;
    ckpt_reader *r = formats_source_reader(source);
    if (json) code = info_json(r);
    else info_text(r);
    formats_source_close(source);
    return code;
}

/* ----------------------------------------------------------------- verify */

static void verify_progress(void *bar, int64_t bytes) { progress_add(bar, bytes); }

/* Under --memory-limit (limit > 0), the line that says what the process
 * held at its peak, as tp-reshard's summary does: what a limit is checked
 * against. */
static void print_peak(int64_t limit)
{
    if (limit <= 0) return;
    char peak[32], given[32];
    format_bytes((double)cli_peak_rss_bytes(), peak, sizeof peak);
    format_bytes((double)limit, given, sizeof given);
    printf("peak memory %s (--memory-limit %s)\n", peak, given);
}

/* Threads for reading a checkpoint back whole (verify, copy) within
 * --memory-limit (0: none given, `threads` kept), asked once it is open (its
 * index is part of what the process holds), by the planner's rule: each
 * thread reads into `need` bytes, what it can hold of this checkpoint (its
 * largest piece's slab, capped at CKPT_VERIFY_READ_BYTES: a checkpoint of
 * kilobytes needs kilobytes). 0, after saying why, when not one fits (a
 * usage error, exit 2: not damage, which verify's exit 1 means). */
static int read_back_threads(int64_t limit, int threads, int64_t need, const char *what)
{
    if (limit <= 0) return threads;
    int64_t share;
    int fit = reshard_threads_within(limit, threads, need, 0, &share);
    if (fit < 1) cli_status_error("tp-ckpt", reshard_memory_refusal(limit, need, 0, "%s, reading in slabs", what));
    return fit;
}

/* A Megatron-LM checkpoint: what opening it checks (every rank file, its
 * zip and pickle, every tensor's shape on every rank and that its bytes lie
 * in the file, the optimizer state against the model), then every zip
 * entry of every file read against its CRC-32. */
static int verify_megatron(const char *path, int threads, int64_t limit)
{
    megatron_checkpoint *m;
    if (megatron_open(path, &m)) return fail("%s", tp_errmsg());
    threads = read_back_threads(limit, threads, MEGATRON_VERIFY_THREAD_BYTES, "verify");
    if (threads < 1) {
        megatron_close(m);
        return 2;
    }
    int64_t total = megatron_bytes(m);
    progress bar;
    progress_start(&bar, "verify", total, 0);
    megatron_verify_result result;
    int status = megatron_verify(m, threads, verify_progress, &bar, &result);
    double seconds = progress_finish(&bar);
    int bad = 0, refusal_status = 0;
    const char *refusal = megatron_optimizer_refusal(m, &refusal_status);
    if (status) {
        megatron_close(m);
        return fail("%s", tp_errmsg());
    }
    if (result.damaged) {
        fprintf(stderr, "tp-ckpt: error: %s: %d of %d files damaged, the first: %s\n", megatron_path(m), result.damaged,
                result.files, result.first_damage);
        bad = 1;
    }
    /* Copies that differ are said where every file matches its CRC-32s: a
     * damaged file explains its own (as a DCP's digests after its items). */
    const megatron_replica_result *replicas = &result.replicas;
    if (replicas->copies_differ && !result.damaged) {
        fprintf(stderr, "tp-ckpt: error: %s: %d of %d tensors stored more than once differ between their copies (%d of %d "
                "copies), the first: %s\n", megatron_path(m), replicas->tensors_differ, replicas->tensors,
                replicas->copies_differ, replicas->copies, replicas->first_difference);
        bad = 1;
    }
    if (refusal && refusal_status == TP_ERR_FORMAT) {
        fprintf(stderr, "tp-ckpt: error: %s: optimizer state damaged: %s\n", megatron_path(m), refusal);
        bad = 1;
    } else if (refusal) {
        printf("note: optimizer state not checked against the model: %s\n", refusal);
    }
    if (result.unchecked)
        printf("note: %d zip entries record no CRC-32 (saved with torch.serialization.set_crc32_options(False)): "
               "read, not checked\n", result.unchecked);
    char size[32];
    format_bytes((double)total, size, sizeof size);
    char copies[160] = "";
    if (replicas->copies)
        snprintf(copies, sizeof copies, "; every other copy (%d) of the %d tensors stored more than once equals the "
                 "copy read", replicas->copies, replicas->tensors);
    if (!bad)
        printf("ok: %s: %d files, %d zip entries (%s) match their CRC-32s, read in %.2f s%s; checked at open: every rank "
               "file, its zip and pickle, every tensor's shape on every rank and that its bytes lie in the file\n",
               megatron_path(m), result.files, result.entries - result.unchecked, size, seconds, copies);
    if (!bad) print_peak(limit);
    megatron_close(m);
    return bad ? 1 : 0;
}

/* A PyTorch distributed checkpoint: what opening it checks (.metadata,
 * every chunk's item: its archive, pickle, dtype and shape), every zip entry
 * of every item against its CRC-32, then every tensor read whole, and
 * compared with its logical digest where the checkpoint carries them. */
static int verify_dcp(const char *path, const checkpoint_format *format, int threads, int64_t limit)
{
    formats_source *source = NULL;
    formats_source_options options = {.threads = threads};
    if (formats_source_open(path, format, &options, &source)) return fail("%s", tp_errmsg());
    ckpt_reader *r = formats_source_reader(source);
    const megatron_dist *m = formats_source_megatron_dist(source);
    const dcp_checkpoint *d = formats_source_dcp(source);
    /* Each item's archive checked, its tensors read through boxes, a
     * torch_dist's copies compared: one after the other, so the most of the three. */
    int64_t need = ckpt_reader_verify_thread_bytes(r);
    if (need < TORCH_ARCHIVE_CHECK_BYTES) need = TORCH_ARCHIVE_CHECK_BYTES;
    if (m && need < MEGATRON_VERIFY_THREAD_BYTES) need = MEGATRON_VERIFY_THREAD_BYTES;
    threads = read_back_threads(limit, threads, need, "verify");
    if (threads < 1) {
        formats_source_close(source);
        return 2;
    }
    int64_t total = dcp_bytes(d);
    progress bar;
    progress_start(&bar, "verify", total, 0);
    dcp_verify_result items;
    int status = dcp_verify(d, threads, verify_progress, &bar, &items);
    /* Megatron-Core's common state is no item of the DCP's (common.pt) or a
     * raw bytes one (common_state): its torch.save's entries checked apart. */
    torch_archive_check_result common = {0, 0};
    if (!status && m) status = megatron_dist_check_common(m, &common);
    ckpt_verify_options verify = {threads, NULL, NULL};
    ckpt_verify_result result = {0};
    if (!status) status = ckpt_verify(r, &verify, &result);
    /* The distributed optimizer's bucket copies of a state stored more than
     * once (dp_reshardable), compared with the one read, as a legacy
     * checkpoint's copies are. */
    megatron_replica_result replicas = {0};
    if (!status && m) status = megatron_dist_check_replicas(m, threads, &replicas);
    double seconds = progress_finish(&bar);
    int bad = 0;
    if (status) bad = fail("%s", tp_errmsg());
    if (!status && items.damaged) {
        fprintf(stderr, "tp-ckpt: error: %s: %d of %d items damaged, the first: %s\n", dcp_path(d), items.damaged,
                items.items, items.first_damage);
        bad = 1;
    }
    if (!status && !items.damaged && result.damaged) {
        fprintf(stderr, "tp-ckpt: error: %s: %d of %d tensors differ from the digests the description records, the "
                "first: %s\n", dcp_path(d), result.damaged, ckpt_reader_num_tensors(r), result.damage[0].message);
        bad = 1;
    }
    /* Said where every item matches its CRC-32s: a damaged item explains its own. */
    if (!status && !items.damaged && replicas.copies_differ) {
        fprintf(stderr, "tp-ckpt: error: %s: %d of %d parameters whose optimizer state is stored more than once differ "
                "between their copies (%d of %d copies), the first: %s\n", dcp_path(d), replicas.tensors_differ,
                replicas.tensors, replicas.copies_differ, replicas.copies, replicas.first_difference);
        bad = 1;
    }
    if (!status && !bad && items.unchecked + common.unchecked)
        printf("note: %d items or zip entries record no CRC-32 (raw bytes entries, or torch.save with "
               "set_crc32_options(False)): read, not checked\n", items.unchecked + common.unchecked);
    if (!status && !bad && items.outside_bytes > 0) {
        char outside[32];
        format_bytes((double)items.outside_bytes, outside, sizeof outside);
        printf("note: %s of the data files lie in no item of .metadata: not read, not checked\n", outside);
    }
    char size[32];
    format_bytes((double)items.item_bytes, size, sizeof size);
    char copies[200] = "";
    if (replicas.copies)
        snprintf(copies, sizeof copies, "; every other copy (%d) of the state of the %d parameters the distributed "
                 "optimizer's buckets store more than once equals the copy read", replicas.copies, replicas.tensors);
    if (!bad)
        printf("ok: %s: %d items, %d zip entries (%s) match their CRC-32s%s%s%s; %d tensors read%s, in %.2f s%s\n",
               dcp_path(d), items.items, items.entries - items.unchecked, size, m ? ", and the common state's (" : "",
               m ? megatron_dist_common_source(m) : "", m ? ")" : "", ckpt_reader_num_tensors(r),
               dcp_has_description(d) ? ", each equal to the logical digest the description records"
               : m                    ? " under their canonical names (Megatron-Core torch_dist)"
                                      : " (the checkpoint records no digests of ours)", seconds, copies);
    if (!bad) print_peak(limit);
    ckpt_verify_result_free(&result);
    formats_source_close(source);
    return bad ? 1 : 0;
}

static int cmd_verify(int argc, char **argv)
{
    int64_t threads = parallel_cpu_count(), limit = 0;
    static const struct option options[] = {{"threads", required_argument, 0, 't'},
                                            {"memory-limit", required_argument, 0, 'm'},
                                            {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "t:h", options, NULL)) != -1) {
        if (c == 't') threads = cli_int("tp-ckpt", "--threads", optarg, 1, 1024);
        else if (c == 'm') limit = cli_size("tp-ckpt", "--memory-limit", optarg);
        else if (c == 'h') {
            printf("usage: tp-ckpt verify CKPT [--threads N] [--memory-limit SIZE]\n"
                   "Checks that every shard is present with its recorded size, that every tensor\n"
                   "matches its index entry, every block its checksum, and padding is zero.\n"
                   "Every damaged file and piece is reported; exit 1 if any.\n"
                   "  --threads N          reading threads (default: all cores)\n"
                   "  --memory-limit SIZE  bound on resident memory, e.g. 64M: fewer threads where it\n"
                   "                       leaves no room for more; too small for one is refused (exit 2)\n");
            return 0;
        } else die_usage("verify: unknown option or missing value: '%s'", cli_rejected_option(argv));
    }
    if (optind != argc - 1) die_usage("verify takes one checkpoint");
    int code = 0;
    const checkpoint_format *format = detect_or_fail(argv[optind], &code);
    if (!format) return code;
    /* Another tool's: what it records (CRC-32s, digests) checked as well. */
    if (!strcmp(format->name, "torch_dist") || !strcmp(format->name, "dcp"))
        return verify_dcp(argv[optind], format, (int)threads, limit);
    if (!strcmp(format->name, "megatron")) return verify_megatron(argv[optind], (int)threads, limit);
    formats_source *source = open_or_die(argv[optind], 1, 1, 0, &code); /* every damaged file reported */
    if (!source) return code;
    ckpt_reader *r = formats_source_reader(source);
    threads = read_back_threads(limit, (int)threads, ckpt_reader_verify_thread_bytes(r), "verify");
    if (threads < 1) {
        formats_source_close(source);
        return 2;
    }
    int64_t total = 0;
    for (int i = 0; i < ckpt_reader_num_tensors(r); i++)
        for (int p = 0; p < ckpt_piece_count(ckpt_reader_tensor(r, i), ckpt_reader_layout(r)->tp); p++) {
            ckpt_piece_info info;
            ckpt_reader_piece_info(r, i, p, &info);
            total += info.bytes;
        }
    progress bar;
    progress_start(&bar, "verify", total, 0);
    ckpt_verify_options verify = {(int)threads, verify_progress, &bar};
    ckpt_verify_result result;
    int status = ckpt_verify(r, &verify, &result);
    double seconds = progress_finish(&bar);
    if (status) {
        int code = fail("%s", tp_errmsg());
        formats_source_close(source);
        return code;
    }
    /* Pieces that failed because another writer replaced the checkpoint in
     * the store meanwhile (its index is not the one read at open) were read
     * from another checkpoint's files: that is said, not damage. */
    int changed = 0;
    if (result.damaged && ckpt_reader_changed(r, &changed) == TP_OK && changed) {
        fprintf(stderr, "tp-ckpt: error: %s changed while it was being read: its index.json is no longer the one "
                "read at open (another writer replaced or removed it: an upload with --force?); %d of %lld pieces did "
                "not match what was read first, which is no sign of damage: verify it again once nothing writes it\n",
                ckpt_reader_path(r), result.damaged, (long long)result.pieces);
        ckpt_verify_result_free(&result);
        formats_source_close(source);
        return 1;
    }
    /* A piece the system would not read (a permission, a disk's I/O error)
     * is said to be unreadable: nothing in the checkpoint is known wrong. */
    const char *previous = "";
    int unreadable = 0;
    for (int i = 0; i < result.damaged; i++) {
        int io = result.damage[i].status == TP_ERR_IO;
        unreadable += io;
        /* A damaged file fails each of its pieces with one message: once. */
        if (strcmp(result.damage[i].message, previous) != 0)
            fprintf(stderr, "tp-ckpt: %s: %s\n", io ? "unreadable" : "damaged", result.damage[i].message);
        previous = result.damage[i].message;
    }
    char size[32];
    format_bytes((double)result.bytes, size, sizeof size);
    if (result.damaged > unreadable)
        fprintf(stderr, "tp-ckpt: error: %s: %d of %lld pieces damaged\n", ckpt_reader_path(r),
                result.damaged - unreadable, (long long)result.pieces);
    if (unreadable)
        fprintf(stderr, "tp-ckpt: error: %s: %d of %lld pieces could not be read (not known damaged)\n",
                ckpt_reader_path(r), unreadable, (long long)result.pieces);
    int bad = result.damaged;
    if (!bad && ckpt_reader_is_foreign(r)) {
        /* The optimizer state the reader could not take: damaged fails, a
         * layout not read is said. */
        cJSON *origin = cJSON_Parse(ckpt_reader_state(r)->user_json ? ckpt_reader_state(r)->user_json : "{}");
        const cJSON *refusal = cJSON_GetObjectItemCaseSensitive(origin, "optimizer_refusal");
        if (cJSON_IsString(refusal) && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(origin, "optimizer_damaged"))) {
            fprintf(stderr, "tp-ckpt: error: %s: optimizer state damaged: %s\n", ckpt_reader_path(r), refusal->valuestring);
            bad = 1;
        } else if (cJSON_IsString(refusal)) {
            printf("note: optimizer state not checked: %s\n", refusal->valuestring);
        }
        cJSON_Delete(origin);
    }
    if (bad)
        ;
    else if (ckpt_reader_is_foreign(r))
        printf("ok: %s: %d tensors, %lld pieces, %s read in %.2f s; a Megatron-LM checkpoint has no checksums of its "
               "own: checked are every rank file, its zip and pickle, every tensor's shape on every rank and that "
               "its bytes lie in the file and read\n",
               ckpt_reader_path(r), ckpt_reader_num_tensors(r), (long long)result.pieces, size, seconds);
    else
        printf("ok: %s: %d tensors, %lld pieces, %s verified in %.2f s (%.0f MB/s)\n", ckpt_reader_path(r),
               ckpt_reader_num_tensors(r), (long long)result.pieces, size, seconds,
               seconds > 0 ? (double)result.bytes / seconds / 1e6 : 0.0);
    if (!bad) print_peak(limit);
    ckpt_verify_result_free(&result);
    formats_source_close(source);
    return bad ? 1 : 0;
}

/* ------------------------------------------------------------------- diff */

typedef struct {
    int a, b;
    int shapes_differ; /* a difference: message gives both shapes */
    int status;        /* not a difference: a side could not be read (damage); message says why */
    char message[1024];
    ckpt_compare_result result;
} tensor_diff;

typedef struct {
    ckpt_reader *a, *b;
    tensor_diff *diffs;
    double rtol, atol;
} diff_job;

/* The rows diff compares at a time, per side and thread (fp32 after
 * widening). 16 MiB slabs, four buffers a thread, held 0.57 GB at 8
 * threads on a 547 MB checkpoint (glibc keeps freed large buffers in the
 * threads' arenas once its mmap threshold has risen to their size), 145 MB
 * on one; 1 MiB: 94 and 44 MB, in the same processor time (docs/BENCHMARKS.md). */
#define DIFF_SLAB_BYTES (1 << 20)

static int diff_one(void *ctx, int64_t i, int thread)
{
    (void)thread;
    diff_job *job = ctx;
    tensor_diff *d = &job->diffs[i];
    const ckpt_tensor_desc *ta = ckpt_reader_tensor(job->a, d->a), *tb = ckpt_reader_tensor(job->b, d->b);
    if (ta->ndim != tb->ndim || memcmp(ta->shape, tb->shape, sizeof *ta->shape * (size_t)ta->ndim)) {
        char shape_a[256], shape_b[256];
        ckpt_shape_text(ta->shape, ta->ndim, shape_a, sizeof shape_a);
        ckpt_shape_text(tb->shape, tb->ndim, shape_b, sizeof shape_b);
        snprintf(d->message, sizeof d->message, "shape %s in A, %s in B", shape_a, shape_b);
        d->shapes_differ = 1;
        return 0;
    }
    d->status = ckpt_compare_tensor(job->a, d->a, job->b, d->b, job->rtol, job->atol, DIFF_SLAB_BYTES, &d->result);
    if (d->status) snprintf(d->message, sizeof d->message, "%s", tp_errmsg());
    return 0;
}

static int worse_first(const void *x, const void *y)
{
    const tensor_diff *a = x, *b = y;
    int fa = a->shapes_differ || a->result.mismatches, fb = b->shapes_differ || b->result.mismatches;
    if (fa != fb) return fb - fa;
    if (a->result.max_rel_diff != b->result.max_rel_diff)
        return a->result.max_rel_diff < b->result.max_rel_diff ? 1 : -1;
    return a->result.max_abs_diff < b->result.max_abs_diff ? 1 : a->result.max_abs_diff > b->result.max_abs_diff ? -1 : 0;
}

/* A Megatron-LM checkpoint holds some tensors more than once (replicated
 * over the tensor-parallel ranks, the tied embeddings' copy) and its reader
 * reads one copy: copies that differ from it would pass unseen through a
 * comparison of the tensors read. They are damage, said as an error (1; 2
 * where they could not be read); 0 where every copy is the one read, or
 * the format stores each once. */
static int replicas_differ(formats_source *source, const char *side, int threads)
{
    megatron_checkpoint *m = formats_source_megatron(source);
    const megatron_dist *dist = formats_source_megatron_dist(source);
    if (!m && !dist) return 0;
    const char *path = m ? megatron_path(m) : megatron_dist_path(dist);
    megatron_replica_result r;
    if (m ? megatron_check_replicas(m, threads, &r) : megatron_dist_check_replicas(dist, threads, &r)) {
        fprintf(stderr, "tp-ckpt: error: %s (%s): the copies of tensors stored more than once not compared: %s\n", side,
                path, tp_errmsg());
        return 2;
    }
    if (r.copies_differ)
        fprintf(stderr, "tp-ckpt: error: %s (%s): %d of %d tensors stored more than once differ between their copies (%d of "
                "%d copies; the copies read are compared), the first: %s\n", side, path, r.tensors_differ,
                r.tensors, r.copies_differ, r.copies, r.first_difference);
    return r.copies_differ ? 1 : 0;
}

/* The true vocabulary told to diff applies to the sides that pad theirs
 * (Megatron's), so that a padded table compares with its true rows
 * elsewhere; 0 for the others. Refused when neither pads. */
static int64_t diff_side_vocab(const char *path, int64_t true_vocab, int *pads, int *exit_code)
{
    *pads = 0;
    if (!true_vocab) return 0;
    const checkpoint_format *format = detect_or_fail(path, exit_code);
    if (!format) return -1;
    *pads = format->pads_vocabulary;
    return *pads ? true_vocab : 0;
}


static int cmd_diff(int argc, char **argv)
{
    double rtol = 0, atol = 0;
    int64_t threads = parallel_cpu_count(), true_vocab = 0;
    int weights_only = 0;
    static const struct option options[] = {{"tol", required_argument, 0, 'r'}, {"atol", required_argument, 0, 'a'},
                                            {"threads", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'},
                                            {"weights-only", no_argument, 0, 'w'},
                                            {"true-vocab-size", required_argument, 0, 'V'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "r:a:t:h", options, NULL)) != -1) {
        if (c == 'w') weights_only = 1;
        else if (c == 'r') rtol = cli_number("tp-ckpt", "--tol", optarg);
        else if (c == 'a') atol = cli_number("tp-ckpt", "--atol", optarg);
        else if (c == 't') threads = cli_int("tp-ckpt", "--threads", optarg, 1, 1024);
        else if (c == 'V') true_vocab = cli_int("tp-ckpt", "--true-vocab-size", optarg, 1, (int64_t)1 << 40);
        else if (c == 'h') {
            printf("usage: tp-ckpt diff A B [--tol X] [--atol X] [--threads N] [--weights-only] [--true-vocab-size N]\n"
                   "Compares the merged (logical) tensors of two checkpoints of any layouts\n"
                   "(with --weights-only the parameters alone, not the optimizer state).\n"
                   "Elements match when bit-identical or |a-b| <= atol + tol * max(|a|,|b|)\n"
                   "(both finite); the default is bit-exact: +0 and -0 differ. Each differing\n"
                   "tensor's largest difference is shown with its place and both values.\n"
                   "--true-vocab-size N: the vocabulary without Megatron's padding, for the\n"
                   "sides that are Megatron checkpoints (legacy or torch_dist): their tables'\n"
                   "first N rows are compared, so that they compare with an export, an\n"
                   "import or a Megatron checkpoint padded for another tensor-parallel size.\n"
                   "Exit 0 when equal, 1 otherwise.\n");
            return 0;
        } else die_usage("diff: unknown option or missing value: '%s'", cli_rejected_option(argv));
    }
    if (optind != argc - 2) die_usage("diff takes two checkpoints");
    int code = 0, pads_a, pads_b;
    int64_t vocab_a = diff_side_vocab(argv[optind], true_vocab, &pads_a, &code);
    if (vocab_a < 0) return code;
    int64_t vocab_b = diff_side_vocab(argv[optind + 1], true_vocab, &pads_b, &code);
    if (vocab_b < 0) return code;
    if (true_vocab && !pads_a && !pads_b)
        die_usage("diff: --true-vocab-size applies to a Megatron checkpoint (legacy or torch_dist); neither %s nor %s is "
                  "one", argv[optind], argv[optind + 1]);
    formats_source *source_a = open_or_die(argv[optind], 1, 0, vocab_a, &code);
    if (!source_a) return code;
    formats_source *source_b = open_or_die(argv[optind + 1], 1, 0, vocab_b, &code);
    if (!source_b) {
        formats_source_close(source_a);
        return code;
    }
    ckpt_reader *a = formats_source_reader(source_a), *b = formats_source_reader(source_b);
    int damaged = replicas_differ(source_a, "A", (int)threads);
    damaged |= replicas_differ(source_b, "B", (int)threads);
    int na = ckpt_reader_num_tensors(a), nb = ckpt_reader_num_tensors(b), only = 0, n = 0;
    tensor_diff *diffs = calloc((size_t)na + 1, sizeof *diffs);
    for (int i = 0; i < na; i++) {
        if (weights_only && !ckpt_tensor_is_param(ckpt_reader_tensor(a, i))) continue;
        int j = ckpt_reader_find(b, ckpt_reader_tensor(a, i)->name);
        if (j < 0) {
            printf("only in A: %s\n", ckpt_reader_tensor(a, i)->name);
            only++;
        } else {
            diffs[n++] = (tensor_diff){i, j, 0, 0, "", {0}};
        }
    }
    for (int j = 0; j < nb; j++)
        if ((!weights_only || ckpt_tensor_is_param(ckpt_reader_tensor(b, j))) && ckpt_reader_find(a, ckpt_reader_tensor(b, j)->name) < 0) {
            printf("only in B: %s\n", ckpt_reader_tensor(b, j)->name);
            only++;
        }
    const ckpt_train_state *sa = ckpt_reader_state(a), *sb = ckpt_reader_state(b);
    if (sa->step != sb->step)
        printf("note: steps differ (%lld vs %lld)\n", (long long)sa->step, (long long)sb->step);
    if (strcmp(sa->model_json, sb->model_json) != 0) printf("note: model configurations differ\n");
    /* A distributed checkpoint's other entries (a DCP's or a torch_dist
     * one's: int64 and 0-dimensional tensors, bytes: step counters,
     * schedulers, RNG states, Megatron's common state and extra states)
     * are not tensors compared here: said, so that "equal" is not taken to
     * cover them. */
    int others_a = count_other_entries(formats_source_dcp(source_a)),
        others_b = count_other_entries(formats_source_dcp(source_b));
    if (others_a || others_b)
        printf("note: other entries of a distributed checkpoint not compared (%d in A, %d in B: tensors of other dtypes "
               "or without dimensions, bytes entries; tp-ckpt info lists them)\n", others_a, others_b);
    /* Values are compared as fp32: a bf16 tensor equals its fp32 widening, so
     * that "bit-exact" would not say that the stored dtypes differ. */
    int other_dtypes = 0, first_other = -1;
    for (int i = 0; i < n; i++)
        if (ckpt_reader_tensor(a, diffs[i].a)->dtype != ckpt_reader_tensor(b, diffs[i].b)->dtype) {
            if (first_other < 0) first_other = i;
            other_dtypes++;
        }
    if (other_dtypes)
        printf("note: %d tensors stored in other dtypes (%s: %s in A, %s in B), compared as fp32 values\n", other_dtypes,
               ckpt_reader_tensor(a, diffs[first_other].a)->name,
               tp_dtype_name(ckpt_reader_tensor(a, diffs[first_other].a)->dtype),
               tp_dtype_name(ckpt_reader_tensor(b, diffs[first_other].b)->dtype));
    diff_job job = {a, b, diffs, rtol, atol};
    parallel_for(n, (int)threads, diff_one, &job);
    qsort(diffs, (size_t)n, sizeof *diffs, worse_first);
    int differing = 0, unreadable = 0;
    int64_t elements = 0;
    for (int i = 0; i < n; i++) {
        elements += diffs[i].result.elements;
        differing += diffs[i].shapes_differ || diffs[i].result.mismatches;
        unreadable += diffs[i].status != 0;
    }
    if (differing) {
        printf("%-44s %14s %14s %12s %12s\n", "tensor", "mismatches", "elements", "max abs", "max rel");
        for (int i = 0; i < n && i < 10 && (diffs[i].shapes_differ || diffs[i].result.mismatches); i++) {
            const tensor_diff *d = &diffs[i];
            const ckpt_tensor_desc *ta = ckpt_reader_tensor(a, d->a), *tb = ckpt_reader_tensor(b, d->b);
            if (d->shapes_differ) {
                printf("%-44s %s\n", ta->name, d->message);
                continue;
            }
            printf("%-44s %14lld %14lld %12.4g %12.4g\n", ta->name, (long long)d->result.mismatches,
                   (long long)d->result.elements, d->result.max_abs_diff, d->result.max_rel_diff);
            /* Where: the element of the largest difference, both values as stored. */
            char place[200], va[64], vb[64];
            ckpt_element_place(ta->shape, NULL, ta->ndim, d->result.worst_index, place, sizeof place);
            ckpt_element_text(d->result.worst_a, ta->dtype, va, sizeof va);
            ckpt_element_text(d->result.worst_b, tb->dtype, vb, sizeof vb);
            printf("    largest at [%s]: A %s %s, B %s %s\n", place, va, tp_dtype_name(ta->dtype), vb,
                   tp_dtype_name(tb->dtype));
        }
    }
    /* A tensor that could not be read is neither equal nor different: the
     * comparison failed (damage), said as an error, whatever else differs. */
    for (int i = 0, said = 0; i < n && said < 10; i++)
        if (diffs[i].status) {
            fprintf(stderr, "tp-ckpt: error: %s not compared: %s\n", ckpt_reader_tensor(a, diffs[i].a)->name,
                    diffs[i].message);
            said++;
        }
    int differ = differing || only;
    if (unreadable)
        fprintf(stderr, "tp-ckpt: error: %d of %d common tensors could not be read and were not compared%s\n",
                unreadable, n, differ ? "; of the others, some differ" : "");
    else if (differ)
        fprintf(stderr, "tp-ckpt: checkpoints differ: %d of %d common tensors differ, %d tensors in one only\n",
                differing, n, only);
    else if (damaged)
        fprintf(stderr, "tp-ckpt: error: the %d tensors read are equal%s, %s (above): the checkpoints are %s\n", n,
                rtol == 0 && atol == 0 ? "" : " within tolerance",
                damaged & 1 ? "not every copy of them" : "their other copies could not be compared",
                damaged & 1 ? "not equal" : "not known to be equal");
    else
        printf("equal: %d tensors, %lld elements%s\n", n, (long long)elements,
               rtol == 0 && atol == 0 ? ", bit-exact" : " within tolerance");
    /* A Megatron table's padding rows differ from any other layout's: a note
     * after the verdict, never in place of it (it once began a chain of its
     * own, and a difference or damage was then also said to be "equal"). */
    int shapes_differ = 0;
    for (int i = 0; i < n; i++) shapes_differ |= diffs[i].shapes_differ;
    if (shapes_differ && !true_vocab &&
        (formats_source_format(source_a)->pads_vocabulary || formats_source_format(source_b)->pads_vocabulary))
        fprintf(stderr, "tp-ckpt: note: a Megatron checkpoint's tables hold its vocabulary padded; with "
                "--true-vocab-size N their first N rows are compared\n");
    /* Two formats' checkpoints of one model name their tensors each by its
     * own tool's rule (model/layers.0.attn.qkv.weight against Megatron's
     * layers.0.attention.qkv.weight, its QKV in other rows): nothing is in
     * common, and a list of "only in" lines would read as two models. */
    const checkpoint_format *format_a = formats_source_format(source_a), *format_b = formats_source_format(source_b);
    if (n == 0 && na > 0 && nb > 0 && format_a != format_b)
        fprintf(stderr, "tp-ckpt: note: no tensor name is common to A (%s) and B (%s): each names its tensors by its "
                "own tool's rule; convert one side to the other's format (tp-ckpt import for a Megatron GPT or Llama, "
                "tp-reshard --format for this toolkit's GPT; docs/TOOLS.md) and compare that\n",
                format_a->title, format_b->title);
    free(diffs);
    formats_source_close(source_a);
    formats_source_close(source_b);
    return differ || unreadable || damaged ? 1 : 0;
}

/* ------------------------------------------------------------------ synth */

static void synth_progress(void *ctx, int64_t bytes)
{
    progress_add(ctx, bytes);
}

/* Whether out names a checkpoint of a run directory (step_N), whose `latest`
 * then follows it. */
static int output_in_run_directory(const char *out)
{
    char parent[CKPT_PATH_MAX], base[CKPT_NAME_MAX + 1]; /* "RUN/step_3/" is step_3 */
    return tp_split_path(out, parent, sizeof parent, base, sizeof base) == TP_OK && ckpt_step_of_name(base) >= 0;
}

/* ckpt_run_output_refusal for a checkpoint recording step at out: 0 when it
 * may be written there, else 2 (a usage error) after one line saying why,
 * or 1 when the run directory cannot be looked at. */
static int run_output_refused(const char *out, int64_t step, int new_model)
{
    char why[3 * CKPT_PATH_MAX + 512];
    if (ckpt_run_output_refusal(out, step, new_model, why, sizeof why)) return fail("%s", tp_errmsg());
    if (!why[0]) return 0;
    cli_error("tp-ckpt", "%s", why);
    return 2;
}

typedef struct {
    const gpt_config *config;
    const ckpt_layout *layout;
    const ckpt_write_options *write_options;
    const synth_gpt_options *synth;
    int tensors;
} synth_job;

static int run_synth(void *ctx, const char *path)
{
    synth_job *j = ctx;
    return synth_gpt(path, j->config, j->layout, j->write_options, j->synth, &j->tensors);
}

static int cmd_synth(int argc, char **argv)
{
    gpt_options model = {0};
    ckpt_layout layout = {1, 1, 1, 0, 1};
    ckpt_write_options write_options;
    ckpt_write_options_init(&write_options);
    const char *out = NULL;
    int optim = 0, force_progress = 0;
    int64_t seed = 1234, step = 0, threads = 0;
    enum { O_TP = 256, O_PP, O_OPTIM, O_SEED, O_STEP, O_COMPRESS, O_THREADS, O_FORCE, O_PROGRESS };
    static const struct option options[] = {
        CLI_MODEL_LONG_OPTIONS,
        {"tp", required_argument, 0, O_TP}, {"pp", required_argument, 0, O_PP},
        {"optim", no_argument, 0, O_OPTIM}, {"seed", required_argument, 0, O_SEED},
        {"step", required_argument, 0, O_STEP}, {"compress", required_argument, 0, O_COMPRESS},
        {"threads", required_argument, 0, O_THREADS}, {"force", no_argument, 0, O_FORCE},
        {"progress", no_argument, 0, O_PROGRESS}, {"output", required_argument, 0, 'o'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c, index = 0;
    while ((c = getopt_long(argc, argv, "o:h", options, &index)) != -1) {
        switch (c) {
        case CLI_MODEL_OPTION:
            if (gpt_options_set(&model, options[index].name, optarg)) die_usage("%s", tp_errmsg());
            break;
        case 'o': out = cli_path("tp-ckpt", "-o", optarg); break;
        case O_TP: layout.tp = (int)cli_int("tp-ckpt", "--tp", optarg, 1, 4096); break;
        case O_PP: layout.pp = (int)cli_int("tp-ckpt", "--pp", optarg, 1, 4096); break;
        case O_OPTIM: optim = 1; break;
        case O_SEED: seed = cli_int("tp-ckpt", "--seed", optarg, 0, INT64_MAX); break;
        case O_STEP: step = cli_int("tp-ckpt", "--step", optarg, 0, (int64_t)1 << 50); break;
        case O_COMPRESS: write_options.compress_level = cli_compress("tp-ckpt", optarg); break;
        case O_THREADS: threads = cli_int("tp-ckpt", "--threads", optarg, 1, 1024); break;
        case O_FORCE: write_options.overwrite = 1; break;
        case O_PROGRESS: force_progress = 1; break;
        case 'h':
            printf("usage: tp-ckpt synth -o DIR --tp T --pp P [model options] [--optim] [--seed N] [--step N]\n"
                   "        [--compress zstd[:LEVEL]|none] [--threads N] [--force] [--progress]\n"
                   CLI_MODEL_USAGE("fp32|bf16|fp16")
                   "Writes a GPT-style checkpoint whose values depend only on the seed and each\n"
                   "element's global index (docs/TOOLS.md), so any two layouts are logically equal.\n");
            return 0;
        default: die_usage("synth: unknown option or missing value: '%s'", cli_rejected_option(argv));
        }
    }
    if (optind != argc) die_usage("synth: unexpected argument '%s'", argv[optind]);
    if (!out) die_usage("synth needs -o DIR");
    gpt_config config;
    if (gpt_options_finish(&model, &config)) die_usage("synth needs a model: %s", tp_errmsg());
    if (gpt_config_check(&config, layout.tp, layout.pp)) return fail("%s", tp_errmsg());
    layout.num_layers = config.layers;
    int refused = run_output_refused(out, step, 0);
    if (refused) return refused;
    int update_latest = output_in_run_directory(out);
    write_options.update_latest = update_latest && !ckpt_is_remote(out); /* a remote one after the upload */
    progress bar;
    synth_gpt_options so = {(uint64_t)seed, step, optim, (int)threads, synth_progress, &bar};
    int64_t total = 0;
    if (synth_gpt_bytes(&config, &layout, optim, &total)) return fail("%s", tp_errmsg());
    progress_start(&bar, "synth", total, force_progress);
    synth_job job = {&config, &layout, &write_options, &so, 0};
    int status = cli_write_output(out, write_options.overwrite, ckpt_may_replace_checkpoint, NULL, (int)threads, update_latest, run_synth, &job);
    int tensors = job.tensors;
    double seconds = progress_finish(&bar);
    if (status) return fail("%s", tp_errmsg());
    char size[32];
    format_bytes((double)total, size, sizeof size);
    printf("wrote %s: %d tensors, tp=%d pp=%d, %s in %.2f s (%.0f MB/s)\n", out, tensors, layout.tp, layout.pp, size,
           seconds, seconds > 0 ? (double)total / seconds / 1e6 : 0.0);
    return 0;
}

/* ----------------------------------------------------------------- export */

static const char *export_usage =
    "usage: tp-ckpt export CKPT --format safetensors|gguf|hdf5 -o OUT [options]\n"
    "Merges the weights of a checkpoint of any layout (this toolkit's GPT-2 or Llama, or a\n"
    "Megatron GPT-2's or Llama's, legacy or torch_dist) into the files inference tools load:\n"
    "  safetensors  OUT is a directory: config.json and model.safetensors (or numbered shards\n"
    "               and model.safetensors.index.json) for transformers' GPT2LMHeadModel or\n"
    "               LlamaForCausalLM\n"
    "  gguf         OUT is a file for llama.cpp's gpt2 or llama architecture\n"
    "  hdf5         OUT is one HDF5 file of every parameter under its checkpoint name\n"
    "\n"
    "  --dtype fp32|bf16|fp16   dtype of the weights (default: as stored; GGUF keeps 1-D in fp32)\n"
    "  --max-shard-size SIZE    safetensors: bytes per file, 512M or 2G (binary units; default\n"
    "                           5000000000, Hugging Face's 5GB)\n"
    "  --tokenizer DIR          gguf: a Hugging Face tokenizer.json (BPE), or a GPT-2 tokenizer\n"
    "                           (vocab.json, merges.txt), a directory or a URL; default no_vocab\n"
    "                           (bytes for 256 tokens)\n"
    "  --name NAME              gguf: general.name (default \"GPT-2 (tp-toolkit)\", \"Llama (tp-toolkit)\")\n"
    "  --true-vocab-size N      a Megatron GPT's vocabulary without Megatron's padding (legacy or\n"
    "                           torch_dist; default: the padded table, as stored)\n"
    "  --threads N              worker threads (default: all cores)\n"
    "  --memory-limit SIZE      bound on buffers (default 1G); too small for one thread: exit 2\n"
    "  --force                  replace an existing output\n"
    "  --progress               show progress even when stderr is not a terminal\n"
    "An option of another format than --format's (--name with safetensors) is refused (exit 2).\n"
    "Nothing appears at OUT unless the export completes.\n";

static void count_bytes(void *ctx, int64_t bytes)
{
    progress_add(ctx, bytes);
}

typedef struct {
    ckpt_reader *reader;
    const export_tensor *tensors;
    int count;
    const export_options *options;
    export_summary *summary;
} export_job;

static int run_export(void *ctx, const char *path)
{
    export_job *j = ctx;
    return export_run(j->reader, j->tensors, j->count, j->options, path, j->summary);
}

/* A Megatron checkpoint's tables converted without --true-vocab-size keep
 * its padding rows (as Hugging Face's converter keeps them): said, with the
 * range the tokenizer's size lies in, since a model that predicts tokens
 * no tokenizer has is not what a user converting for inference expects. */
static void note_vocabulary_padding(const megatron_config *m)
{
    if (!m || m->true_vocab > 0 || m->padded_vocab <= 0) return;
    int64_t multiple = m->vocab_divisible_by * m->tp;
    if (multiple <= 1) return;
    printf("note: the vocabulary tables keep Megatron's padding: %lld rows, a multiple of %lld "
           "(make_vocab_size_divisible_by %lld x tp %d), so the tokenizer has %lld to %lld tokens; "
           "--true-vocab-size N (the tokenizer's size) leaves the padding rows out\n",
           (long long)m->padded_vocab, (long long)multiple, (long long)m->vocab_divisible_by, m->tp,
           (long long)(m->padded_vocab - multiple + 1), (long long)m->padded_vocab);
}

static int cmd_export(int argc, char **argv)
{
    export_options options;
    export_options_init(&options);
    gpt_export_request request = {NULL, NULL};
    const char *out = NULL, *format = NULL;
    int force_progress = 0;
    enum { O_FORMAT = 256, O_DTYPE, O_SHARD, O_TOKENIZER, O_NAME, O_THREADS, O_MEMORY, O_FORCE, O_PROGRESS, O_TRUE_VOCAB };
    int64_t true_vocab = 0;
    static const struct option long_options[] = {
        {"format", required_argument, 0, O_FORMAT}, {"dtype", required_argument, 0, O_DTYPE},
        {"max-shard-size", required_argument, 0, O_SHARD}, {"tokenizer", required_argument, 0, O_TOKENIZER},
        {"name", required_argument, 0, O_NAME}, {"threads", required_argument, 0, O_THREADS},
        {"memory-limit", required_argument, 0, O_MEMORY}, {"force", no_argument, 0, O_FORCE},
        {"progress", no_argument, 0, O_PROGRESS}, {"output", required_argument, 0, 'o'},
        {"true-vocab-size", required_argument, 0, O_TRUE_VOCAB},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    tp_dtype dtype;
    while ((c = getopt_long(argc, argv, "o:h", long_options, NULL)) != -1) {
        switch (c) {
        case 'o': out = cli_path("tp-ckpt", "-o", optarg); break;
        case O_FORMAT: format = optarg; break;
        case O_DTYPE:
            if (tp_dtype_parse(optarg, &dtype)) die_usage("--dtype: %s", tp_errmsg());
            options.dtype = (int)dtype;
            break;
        case O_SHARD: options.max_shard_bytes = cli_size("tp-ckpt", "--max-shard-size", optarg); break;
        case O_TOKENIZER: request.tokenizer_dir = optarg; break;
        case O_NAME: request.name = optarg; break;
        case O_THREADS: options.threads = (int)cli_int("tp-ckpt", "--threads", optarg, 1, 1024); break;
        case O_MEMORY: options.memory_limit = cli_size("tp-ckpt", "--memory-limit", optarg); break;
        case O_FORCE: options.overwrite = 1; break;
        case O_PROGRESS: force_progress = 1; break;
        case O_TRUE_VOCAB: true_vocab = cli_int("tp-ckpt", "--true-vocab-size", optarg, 1, (int64_t)1 << 40); break;
        case 'h': fputs(export_usage, stdout); return 0;
        default: die_usage("export: unknown option or missing value: '%s'", cli_rejected_option(argv));
        }
    }
    if (optind != argc - 1) die_usage("export takes one checkpoint");
    if (!format || !out) die_usage("export needs --format and -o OUT");
    if (export_format_parse(format, &options.format)) die_usage("--format: %s", tp_errmsg());
    /* An option that would be ignored is refused (as tp-reshard's): these apply to one format each. */
    static const char *const format_names[] = {"safetensors", "gguf", "hdf5"};
    const struct {
        const char *option;
        int given;
        export_format format;
        const char *what;
    } one_format[] = {{"--max-shard-size", options.max_shard_bytes > 0, EXPORT_SAFETENSORS, "the bytes per safetensors file"},
                      {"--tokenizer", request.tokenizer_dir != NULL, EXPORT_GGUF, "the vocabulary GGUF carries"},
                      {"--name", request.name != NULL, EXPORT_GGUF, "GGUF's general.name"}};
    for (size_t i = 0; i < sizeof one_format / sizeof one_format[0]; i++)
        if (one_format[i].given && options.format != one_format[i].format)
            die_usage("%s (%s) applies to --format %s only, not %s", one_format[i].option, one_format[i].what,
                      format_names[one_format[i].format], format_names[options.format]);
    int code = 0;
    const checkpoint_format *source_format = detect_or_fail(argv[optind], &code);
    if (!source_format) return code;
    cli_check_true_vocab("tp-ckpt", true_vocab, source_format, argv[optind], NULL);
    ckpt_read_options read;
    ckpt_read_options_init(&read);
    read.verify = 1;
    /* The export takes one copy of each tensor stored more than once (a
     * Megatron checkpoint's replicated tensors): the others are compared
     * with it first, since an output of one of two values proves nothing. */
    formats_source_options source_options = {
        .read = &read, .compare_copies = 1, .true_vocab = true_vocab, .threads = options.threads};
    formats_source *source = NULL;
    if (formats_source_open(argv[optind], source_format, &source_options, &source)) return fail("%s", tp_errmsg());
    if ((code = cli_output_apart("tp-ckpt", argv[optind], out))) {
        formats_source_close(source);
        return code;
    }
    char among[2 * CKPT_PATH_MAX + 256];
    code = ckpt_foreign_output_refusal(out, "an export", among, sizeof among) ? fail("%s", tp_errmsg()) : 0;
    if (!code && among[0]) code = (cli_error("tp-ckpt", "%s", among), 2); /* a usage error, as run_output_refused's */
    if (code) {
        formats_source_close(source);
        return code;
    }
    ckpt_reader *r = formats_source_reader(source);
    /* A Megatron GPT (legacy or torch_dist): its config for the names and
     * shapes; another tool's checkpoint names its model only when it
     * carries this toolkit's description (a DCP written by tp-reshard).
     * HDF5 takes every tensor under its own name: no model needed. */
    const megatron_config *megatron = formats_source_megatron_config(source);
    if (!megatron && options.format != EXPORT_HDF5 && ckpt_reader_is_foreign(r) &&
        !strcmp(ckpt_reader_state(r)->model_json, "{}")) {
        code = fail("%s: a %s that names no model of this toolkit's: an export maps a GPT-2 or Llama of this toolkit "
                    "(a DCP checkpoint tp-reshard wrote from one names it) or of Megatron (export the Megatron checkpoint "
                    "itself)", argv[optind], source_format->title);
        formats_source_close(source);
        return code;
    }
    gpt_export *job = NULL;
    const export_tensor *tensors = NULL;
    int count = 0;
    int64_t total = 0;
    if (megatron ? gpt_export_create_megatron(&job, r, megatron, &request, &options) : gpt_export_create(&job, r, &request, &options))
        code = fail("%s", tp_errmsg());
    if (!code) tensors = gpt_export_tensors(job, &count);
    if (!code && export_output_bytes(r, tensors, count, &options, &total)) code = fail("%s", tp_errmsg());
    if (!code) {
        progress bar;
        progress_start(&bar, "export", total, force_progress);
        options.on_bytes = count_bytes;
        options.progress_ctx = &bar;
        export_summary summary;
        export_job run = {r, tensors, count, &options, &summary};
        int status = cli_write_output(out, options.overwrite, export_may_replace, &options, options.threads, 0, run_export, &run);
        double seconds = progress_finish(&bar);
        if (status) {
            code = cli_status_error("tp-ckpt", status); /* a limit too small for a row: exit 2 */
        } else {
            char size[32], layout[RESHARD_LAYOUT_TEXT_MAX];
            format_bytes((double)summary.tensor_bytes, size, sizeof size);
            cli_source_layout_text(r, layout);
            printf("exported %s (step %lld, %s) to %s: %d tensors in %d file%s, %s in %.2f s (%.0f MB/s)\n",
                   ckpt_reader_path(r), (long long)ckpt_reader_state(r)->step, layout, out,
                   summary.tensors, summary.files, summary.files == 1 ? "" : "s", size, seconds,
                   seconds > 0 ? (double)summary.tensor_bytes / seconds / 1e6 : 0.0);
            note_vocabulary_padding(megatron);
        }
    }
    gpt_export_free(job);
    formats_source_close(source);
    return code;
}

/* ----------------------------------------------------------------- import */

static const char *import_usage =
    "usage: tp-ckpt import DIR -o CKPT --tp T --pp P [options]\n"
    "Writes a Hugging Face GPT-2 or Llama (DIR: config.json and model.safetensors, or shards\n"
    "with model.safetensors.index.json) as a sharded checkpoint at layout tpTppP, weights\n"
    "only, step 0: tp-train --resume starts from it (name it RUN/step_00000000). A Llama's\n"
    "q/k/v_proj and gate/up_proj become its fused tensors; fewer key/value heads than tp\n"
    "are replicated.\n"
    "\n"
    "  --dtype fp32|bf16|fp16   dtype of the parameters (default fp32, what tp-train trains in)\n"
    "  --vocab-pad-multiple N   pad the vocabulary to a multiple of tp x N (default 1)\n"
    "  --threads N              worker threads (default: all cores)\n"
    "  --compress zstd[:L]|none output compression (default none)\n"
    "  --force                  replace an existing checkpoint\n"
    "  --progress               show progress even when stderr is not a terminal\n"
    "  --allow-nonfinite        import NaN and infinite values as they are, with a warning\n"
    "                           (by default they fail the import, the first named; a Megatron\n"
    "                           checkpoint's weights and optimizer state alike)\n"
    "Every tensor is checked (presence, dtype, shape, the file's own rules) before\n"
    "anything is written, and every value as it is converted (NaN and infinities);\n"
    "nothing appears at CKPT unless the import completes.\n"
    "\n"
    "DIR may be a Megatron checkpoint (Megatron-LM legacy or Megatron-Core torch_dist) of a GPT-2\n"
    "trained with the tanh GELU (--openai-gelu) or of a Llama (docs/MEGATRON.md): its weights and\n"
    "optimizer state, in its dtype, at its iteration (name it RUN/step_NNNNNNNN to resume it):\n"
    "  --true-vocab-size N      its vocabulary without Megatron's padding (default: the padded\n"
    "                           table)\n";

typedef struct {
    gpt_import *job;
    const import_options *options;
} import_job;

static int run_import(void *ctx, const char *path)
{
    import_job *j = ctx;
    return gpt_import_run(j->job, j->options, path);
}

typedef struct {
    gpt_megatron_import *job;
    const import_options *options;
} megatron_import_job;

static int run_megatron_import(void *ctx, const char *path)
{
    megatron_import_job *j = ctx;
    return gpt_megatron_import_run(j->job, j->options, path);
}

/* What an import with --allow-nonfinite carried, said on stderr. */
static void warn_nonfinite(const ckpt_nonfinite *found)
{
    if (found->tensors)
        fprintf(stderr, "tp-ckpt: warning: imported with NaN or infinite values (--allow-nonfinite): %s\n",
                found->summary);
}

/* A Megatron-LM GPT-2 as this trainer's checkpoint. */
static int import_megatron(const char *dir, const checkpoint_format *format, const char *out, int tp, int pp,
                           int64_t true_vocab, import_options *options, int force_progress)
{
    formats_source *source = NULL;
    /* Every copy of a tensor stored more than once compared with the one imported (as export's). */
    formats_source_options source_options = {.compare_copies = 1, .true_vocab = true_vocab, .threads = options->threads};
    gpt_megatron_import *job = NULL;
    int code = 0;
    if (formats_source_open(dir, format, &source_options, &source) ||
        gpt_megatron_import_open(&job, formats_source_megatron_config(source), formats_source_reader(source), tp, pp))
        code = fail("%s", tp_errmsg());
    ckpt_reader *r = source ? formats_source_reader(source) : NULL;
    const megatron_config *m = source ? formats_source_megatron_config(source) : NULL;
    /* Megatron's iteration is the step it records; its weights are another model than a run's. */
    if (!code) code = run_output_refused(out, ckpt_reader_state(r)->step, 1);
    if (!code) {
        int update_latest = output_in_run_directory(out);
        options->update_latest = update_latest && !ckpt_is_remote(out);
        progress bar;
        progress_start(&bar, "import", gpt_megatron_import_bytes(job), force_progress);
        options->on_bytes = count_bytes;
        options->progress_ctx = &bar;
        megatron_import_job run = {job, options};
        int status = cli_write_output(out, options->overwrite, ckpt_may_replace_checkpoint, NULL, options->threads, update_latest,
                                      run_megatron_import, &run);
        double seconds = progress_finish(&bar);
        char bytes[32];
        format_bytes((double)gpt_megatron_import_bytes(job), bytes, sizeof bytes);
        if (status) code = fail("%s", tp_errmsg());
        else {
            warn_nonfinite(options->nonfinite);
            printf("imported %s (%s tp%dpp%d, iteration %lld) to %s: %d tensors at tp=%d pp=%d, %s in %.2f s\n",
                   ckpt_reader_path(r), format->title, m->tp, m->pp, (long long)ckpt_reader_state(r)->step, out,
                   gpt_megatron_import_count(job), tp, pp, bytes, seconds);
            note_vocabulary_padding(m);
            if (gpt_megatron_import_rounded(job))
                printf("note: %d parameters stored in fp32 beside %s ones (the norms) are %s in this toolkit's model; "
                       "their fp32 values are kept as their masters (an export of the Megatron checkpoint itself keeps "
                       "them fp32)\n", gpt_megatron_import_rounded(job), tp_dtype_name(m->dtype), tp_dtype_name(m->dtype));
        }
    }
    gpt_megatron_import_close(job);
    formats_source_close(source);
    return code;
}

static int cmd_import(int argc, char **argv)
{
    import_options options;
    import_options_init(&options);
    gpt_import_request request = {0, 0, TP_FP32, 1};
    const char *out = NULL;
    int force_progress = 0;
    enum { O_TP = 256, O_PP, O_DTYPE, O_PAD, O_THREADS, O_COMPRESS, O_FORCE, O_PROGRESS, O_TRUE_VOCAB, O_ALLOW_NONFINITE };
    ckpt_nonfinite nonfinite;
    ckpt_nonfinite_init(&nonfinite);
    options.nonfinite = &nonfinite;
    int64_t true_vocab = 0;
    int shape_given = 0;
    static const struct option long_options[] = {
        {"tp", required_argument, 0, O_TP}, {"pp", required_argument, 0, O_PP},
        {"true-vocab-size", required_argument, 0, O_TRUE_VOCAB},
        {"dtype", required_argument, 0, O_DTYPE}, {"vocab-pad-multiple", required_argument, 0, O_PAD},
        {"threads", required_argument, 0, O_THREADS}, {"compress", required_argument, 0, O_COMPRESS},
        {"force", no_argument, 0, O_FORCE}, {"progress", no_argument, 0, O_PROGRESS},
        {"allow-nonfinite", no_argument, 0, O_ALLOW_NONFINITE},
        {"output", required_argument, 0, 'o'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "o:h", long_options, NULL)) != -1) {
        switch (c) {
        case 'o': out = cli_path("tp-ckpt", "-o", optarg); break;
        case O_TP: request.tp = (int)cli_int("tp-ckpt", "--tp", optarg, 1, 4096); break;
        case O_PP: request.pp = (int)cli_int("tp-ckpt", "--pp", optarg, 1, 4096); break;
        case O_DTYPE:
            if (tp_dtype_parse(optarg, &request.dtype)) die_usage("--dtype: %s", tp_errmsg());
            shape_given = 1;
            break;
        case O_PAD:
            request.vocab_pad_multiple = cli_int("tp-ckpt", "--vocab-pad-multiple", optarg, 1, 1 << 20);
            shape_given = 1;
            break;
        case O_TRUE_VOCAB: true_vocab = cli_int("tp-ckpt", "--true-vocab-size", optarg, 1, (int64_t)1 << 40); break;
        case O_THREADS: options.threads = (int)cli_int("tp-ckpt", "--threads", optarg, 1, 1024); break;
        case O_COMPRESS: options.compress_level = cli_compress("tp-ckpt", optarg); break;
        case O_FORCE: options.overwrite = 1; break;
        case O_PROGRESS: force_progress = 1; break;
        case O_ALLOW_NONFINITE: options.allow_nonfinite = 1; break;
        case 'h': fputs(import_usage, stdout); return 0;
        default: die_usage("import: unknown option or missing value: '%s'", cli_rejected_option(argv));
        }
    }
    if (optind != argc - 1) die_usage("import takes one Hugging Face directory or Megatron-LM checkpoint");
    if (!out || !request.tp || !request.pp) die_usage("import needs -o CKPT, --tp and --pp");
    const char *dir = argv[optind];
    /* A Megatron GPT (legacy or torch_dist), or else a Hugging Face directory. */
    int code = 0;
    const checkpoint_format *format = detect_or_fail(dir, &code);
    if (!format) return code;
    int megatron = !strcmp(format->name, "megatron") || !strcmp(format->name, "torch_dist");
    /* What the input is, said before anything is read from it (config.json
     * of a GGUF file was "m.gguf/config.json: cannot open"): another tool's
     * checkpoint, named with its conversion, or else what
     * safetensors_model_dir finds in place of a model directory. */
    cli_foreign foreign;
    if (!megatron && strcmp(format->name, "tp") && cli_foreign_checkpoint(dir, out, &foreign) == TP_OK && foreign.what[0])
        return fail("%s is %s, which import does not read: convert it with %s%s", dir, foreign.what, foreign.convert,
                    foreign.doc);
    if (!megatron && safetensors_model_dir(dir, NULL)) return fail("%s", tp_errmsg());
    if ((code = cli_output_apart("tp-ckpt", dir, out))) return code;
    if (megatron && shape_given)
        die_usage("--dtype and --vocab-pad-multiple apply to a Hugging Face directory (a Megatron checkpoint keeps "
                  "its dtype and padding)");
    cli_check_true_vocab("tp-ckpt", true_vocab, format, dir, strcmp(format->name, "tp") ? NULL : "a Hugging Face directory");
    if (megatron) return import_megatron(dir, format, out, request.tp, request.pp, true_vocab, &options, force_progress);
    if ((code = run_output_refused(out, 0, 1))) return code; /* a Hugging Face model starts at step 0 */
    gpt_import *job = NULL;
    if (gpt_import_open(&job, dir, &request)) return fail("%s", tp_errmsg());
    int update_latest = output_in_run_directory(out);
    options.update_latest = update_latest && !ckpt_is_remote(out); /* a remote one after the upload */
    progress bar;
    progress_start(&bar, "import", gpt_import_bytes(job), force_progress);
    options.on_bytes = count_bytes;
    options.progress_ctx = &bar;
    import_job run = {job, &options};
    int status = cli_write_output(out, options.overwrite, ckpt_may_replace_checkpoint, NULL, options.threads, update_latest,
                                  run_import, &run);
    double seconds = progress_finish(&bar);
    if (status) {
        code = fail("%s", tp_errmsg());
    } else {
        /* Said with what was imported: a refusal stays one line. */
        if (gpt_import_warning(job)[0]) fprintf(stderr, "tp-ckpt: warning: %s\n", gpt_import_warning(job));
        warn_nonfinite(&nonfinite);
        char bytes[32];
        format_bytes((double)gpt_import_bytes(job), bytes, sizeof bytes);
        printf("imported %s to %s: %d tensors at tp=%d pp=%d, %s in %.2f s\n", dir, out, gpt_import_count(job),
               request.tp, request.pp, bytes, seconds);
    }
    gpt_import_close(job);
    return code;
}

/* ------------------------------------------------------------------- copy */

typedef struct {
    const char *source;
    const ckpt_upload_options *options;
} copy_job;

static int download_into(void *ctx, const char *path)
{
    const copy_job *j = ctx;
    return ckpt_download(j->source, path, j->options);
}

static void copied_bytes(void *ctx, int64_t bytes)
{
    progress_add(ctx, bytes);
}

static int cmd_copy(int argc, char **argv)
{
    int threads = 0, force = 0, force_progress = 0;
    int64_t limit = 0;
    enum { O_THREADS = 256, O_MEMORY, O_FORCE, O_PROGRESS };
    static const struct option options[] = {{"threads", required_argument, 0, O_THREADS},
                                            {"memory-limit", required_argument, 0, O_MEMORY},
                                            {"force", no_argument, 0, O_FORCE},
                                            {"progress", no_argument, 0, O_PROGRESS},
                                            {"help", no_argument, 0, 'h'},
                                            {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case O_THREADS: threads = (int)cli_int("tp-ckpt", "--threads", optarg, 1, 256); break;
        case O_MEMORY: limit = cli_size("tp-ckpt", "--memory-limit", optarg); break;
        case O_FORCE: force = 1; break;
        case O_PROGRESS: force_progress = 1; break;
        case 'h':
            printf("usage: tp-ckpt copy SRC DST [--threads N (8)] [--memory-limit SIZE] [--force] [--progress]\n"
                   "Copies a checkpoint to or from an object store: files in parallel, the index last,\n"
                   "so that DST shows the checkpoint whole or not at all. SRC may be a run directory\n"
                   "(its newest checkpoint); a DST named step_N updates its run directory's latest.\n"
                   "--memory-limit bounds resident memory (e.g. 64M): fewer transfers where it leaves\n"
                   "no room for more; too small for one is refused (exit 2).\n");
            return 0;
        default: die_usage("copy: unknown option or missing value: '%s'", cli_rejected_option(argv));
        }
    }
    if (optind != argc - 2) die_usage("copy takes SRC and DST");
    const char *source = cli_path("tp-ckpt", "copy's SRC", argv[optind]);
    const char *target = cli_path("tp-ckpt", "copy's DST", argv[optind + 1]);
    if (!ckpt_is_remote(source) && !ckpt_is_remote(target))
        die_usage("copy moves checkpoints to or from an object store; both %s and %s are local", source, target);
    int apart = cli_output_apart("tp-ckpt", source, target);
    if (apart) return apart;
    /* Another tool's checkpoint (DCP, Megatron-LM's, Megatron-Core's) is
     * read by every other command, but copied by none: said so, not "not a
     * checkpoint" (a Megatron-LM one still was after DCP's was named). */
    const checkpoint_format *format = NULL;
    if (!formats_detect(source, &format) && strcmp(format->name, "tp")) {
        size_t n = strlen(format->title); /* "PyTorch distributed checkpoint" says it already */
        int named = n >= 10 && !strcmp(format->title + n - 10, "checkpoint");
        return fail("%s is a %s%s: copy moves this toolkit's checkpoints (tp-reshard %s --to LAYOUT -o DST writes it "
                    "to a store)", source, format->title, named ? "" : " checkpoint", source);
    }
    ckpt_reader *r = NULL;
    if (ckpt_reader_open(&r, source, NULL)) return fail("%s", tp_errmsg());
    char resolved[CKPT_PATH_MAX];
    snprintf(resolved, sizeof resolved, "%s", ckpt_reader_path(r));
    int64_t total = 0;
    for (int f = 0; f < ckpt_reader_num_files(r); f++) {
        int64_t bytes = 0;
        ckpt_reader_file(r, f, &bytes);
        total += bytes;
    }
    int64_t step = ckpt_reader_state(r)->step;
    /* Sized while the source is open: its index is read again to copy it. */
    if (limit > 0)
        threads = read_back_threads(limit, threads > 0 ? threads : CKPT_TRANSFER_THREADS,
                                    ckpt_reader_transfer_thread_bytes(r), "copy");
    ckpt_reader_close(r);
    if (limit > 0 && threads < 1) return 2;
    /* A DST named step_N must record step N, as every writer's output (it
     * named step_00000100 a checkpoint of step 200, and `latest` followed). */
    int refused = run_output_refused(target, step, 0);
    if (refused) return refused;
    progress bar;
    ckpt_upload_options upload;
    ckpt_upload_options_init(&upload);
    upload.threads = threads;
    upload.replace = force;
    upload.on_file = copied_bytes;
    upload.ctx = &bar;
    int update_latest = output_in_run_directory(target);
    progress_start(&bar, "copy", total, force_progress);
    int status;
    if (!ckpt_is_remote(resolved)) { /* straight up: no local copy needed */
        upload.update_latest = update_latest;
        ckpt_run_claim *claim = NULL; /* as every writer of a step into a run directory (cli_write_output) */
        status = cli_claim_run_output(target, &claim);
        if (!status) status = ckpt_upload(resolved, target, &upload);
        ckpt_run_claim_release(claim);
    } else {
        copy_job job = {resolved, &upload};
        status = cli_write_output(target, force, ckpt_may_replace_checkpoint, NULL, threads, update_latest, download_into,
                                  &job);
    }
    double seconds = progress_finish(&bar);
    if (status) return fail("%s", tp_errmsg());
    char size[32];
    format_bytes((double)total, size, sizeof size);
    printf("copied %s to %s: %s in %.2f s (%.0f MB/s)\n", resolved, target, size, seconds,
           seconds > 0 ? (double)total / seconds / 1e6 : 0.0);
    print_peak(limit);
    return 0;
}

int main(int argc, char **argv)
{
    opterr = 0; /* rejected options are reported in one line */
    if (cli_clean_up_on_signals() != 0) return fail("cannot set up signal handling: %s", strerror(errno));
    cli_print_store_notices("tp-ckpt");
    cli_check_stdout_at_exit("tp-ckpt");
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(usage_text, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *command = argv[1];
    argv[1] = argv[0];
    argc--;
    argv++;
    static const struct {
        const char *name, *help;
        int (*run)(int argc, char **argv);
    } commands[] = {{"info", "tp-ckpt info", cmd_info},       {"verify", "tp-ckpt verify", cmd_verify},
                    {"diff", "tp-ckpt diff", cmd_diff},       {"synth", "tp-ckpt synth", cmd_synth},
                    {"export", "tp-ckpt export", cmd_export}, {"import", "tp-ckpt import", cmd_import},
                    {"copy", "tp-ckpt copy", cmd_copy}};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(command, commands[i].name) == 0) {
            cli_set_help_command(commands[i].help); /* a usage error points to the command's own --help */
            return commands[i].run(argc, argv);
        }
    die_usage("unknown command '%s'", command);
    return 2;
}
