/* model.h: the GPT-2 or Llama model of one rank: its pipeline stage's layers, with
 * tensor-parallel shards of the column- and row-parallel linears and of the
 * vocabulary (Megatron-LM's layout), forward and backward on micro-batches.
 *
 * Parameters live in one allocation (and so do gradients and the two Adam
 * moments), with a view per tensor of the catalogue (model/gpt.h) held on
 * this stage. Values depend only on the seed, the tensor's global name and
 * each element's global index, whatever the layout. */
#ifndef TP_MODEL_H
#define TP_MODEL_H

#include <stdint.h>

#include "comm.h"
#include "../kernels/kernels.h"
#include "../model/gpt.h"

typedef struct {
    const gpt_tensor *spec;  /* catalogue entry (global description) */
    int piece;               /* tp rank for split tensors, 0 for replicated ones */
    int64_t numel;           /* elements of the local piece */
    int64_t shape[CKPT_MAX_DIMS];
    float *data, *grad, *m, *v; /* the kernel backend's memory (on the device for CUDA) */
    int tied_copy;           /* the last stage's own copy of the tied token table */
    int owner;               /* this rank holds the stored copy: it writes the piece to
                                checkpoints and counts it in the gradient norm */
    int64_t norm_numel;      /* the leading elements counted in the gradient norm: numel, or a
                                shared key/value head's replica leaves out its rows (K < TP) */
    int64_t flat;            /* its first value's place in the flattened parameters (zero_unit) */
    int unit;                /* the zero_unit that holds it */
    int writer;              /* the data-parallel rank that writes its state to checkpoints (zero.h zero_lay_out) */
} param_view;

/* A run of consecutive views sharded as one over the data-parallel ranks
 * by a sharded optimizer (ZeRO; gpt_model_create's zero): its values, padded
 * with zeros to dp pieces of `piece`, occupy the flattened parameters'
 * [first, first + dp piece); data-parallel rank d keeps piece d, values
 * [first + d piece, first + (d + 1) piece), at offset `at` of its shard
 * (shard_params, shard_grads, shard_m, shard_v). ZeRO-1 has one unit, all
 * the parameters; ZeRO-3 one per layer and one per other tensor, each
 * gathered whole when a forward or backward needs it (FSDP's flat
 * parameters). */
typedef struct {
    int first_view, views;   /* params[first_view .. first_view + views) */
    int64_t first, piece, at;
    int64_t work_at;         /* ZeRO-3: its place in the work area while gathered, -1 when not */
} zero_unit;

/* The buffers of one micro-batch in flight through the head (last stage):
 * the final norm's output [rows, D] and statistics [rows], the logits
 * [B*T, vocab/tp] (an activation: fp32, or bf16 bits with bf16, two to a
 * float: 1.6 GB less for GPT-2 at micro-batch 16), the cross-entropy's row
 * max, sum and target logit [B*T] each, and their host copies (the same on the CPU), and this rank's own
 * row max [B*T] (before the max over tensor-parallel ranks). Fewer are in
 * flight than slots with the interleaved schedule, so they are a pool of
 * their own. Each buffer starts at a multiple of 16 bytes (its floats
 * rounded up by gpt_head_buffer_floats): the device's cross-entropy kernels
 * move a row's logits 16 bytes at a time only from such a start. */
static inline int64_t gpt_head_buffer_floats(int64_t count)
{
    return (count + 3) / 4 * 4;
}
typedef struct {
    void *lnf; /* an activation: fp32, or bf16 bits with bf16 (gpt_model.bf16) */
    void *logits;
    float *lnf_mean, *lnf_rstd, *row_max, *row_sum, *target_logit, *local_max;
    float *host_row_max, *host_row_sum, *host_target_logit;
} gpt_head;

/* Activations of one micro-batch in flight through this stage, in the
 * kernel backend's memory but for the host-side fields named so. */
typedef struct {
    int *tokens, *targets;       /* [B*T], host: the data loader fills them */
    int *kernel_tokens, *kernel_targets; /* the same in the backend's memory (the same buffer on the CPU) */
    float *input;                /* [rows, D]: embeddings (first stage) or the previous stage's output */
    /* Per local layer, consecutive: the norms' and residuals' [rows, D] (and
     * [rows] statistics), the others' [B*T, their width]. The activations
     * only products, the attention and the MLP's activation read (ln1, qkv,
     * attn, ln2, fc, gelu: void) are bf16 bits with bf16, else fp32
     * (gpt_model.bf16). */
    void *ln1, *qkv, *attn, *ln2, *fc, *gelu;
    float *ln1_mean, *ln1_rstd, *att_lse, *res1;
    float *ln2_mean, *ln2_rstd, *res2;
    gpt_head *head;              /* last stage: the head's buffers bound to the slot (gpt_model_bind_head) */
    double loss_sum;             /* sum of token losses (last stage), on the CPU; on a device: gpt_model_take_losses */
} gpt_slot;

typedef struct {
    gpt_config config;
    comm *comm;
    const kernel_backend *kernels; /* where parameters and activations live and are computed */
    comm_stream stream;          /* COMM_HOST, or COMM_DEVICE for a backend on a device */
    int bf16;                    /* mixed precision: matrix products and the attention with bf16 operands, the
                                    activations only they read kept in bf16 (gpt_slot); everything else, and
                                    every parameter and gradient, in fp32 */
    size_t activation_bytes;     /* of a value of those activations: 2 (bf16) or 4 */
    int64_t B, T;                /* micro-batch and sequence length */
    /* Sequence parallelism (Korthikanti et al. 2022): the norm and residual
     * regions hold only rows [row_first, row_first + rows) of the B*T rows
     * (rows = B*T / tp), all-gathered before the column-parallel linears and
     * reduce-scattered after the row-parallel ones instead of all-reduced.
     * Without it rows = B*T, row_first = 0. */
    int sequence_parallel;
    int64_t rows, row_first;
    float *gathered, *partial;   /* sequence parallelism: [B*T, D] each, shared by all slots */
    /* This stage's layers: num_layers of them in virtual_stages chunks of
     * chunk_layers (one chunk but with the interleaved schedule). Local
     * layer j of chunk c is global layer (c pp + pp_rank) chunk_layers + j
     * (ckpt_layout's rule); a slot holds the activations of one chunk. */
    int num_layers, virtual_stages, chunk_layers;
    int is_first, is_last;       /* holds the embedding (chunk 0) / the head (chunk virtual_stages - 1) */
    int llama;                   /* config.arch == GPT_ARCH_LLAMA */
    int64_t D, hd, heads_local, kv_local, qkv_local, attn_local, ffn_local;
    int64_t fc_local;            /* the fc's outputs: ffn_local, or 2 ffn_local for SwiGLU's [gate | up] */
    float *rope_cos_sin;         /* Llama: [T, hd/2, 2] rotary cos and sin, the backend's memory */
    int64_t vocab_local, vocab_first; /* rows of the (padded) token table held here */

    gpt_tensor *catalog;         /* every tensor of the model (gpt_catalog) */
    int num_catalog;
    param_view *params;
    int num_params;
    int64_t total;               /* elements of the flattened parameters (with a sharded optimizer, each
                                    unit padded to a multiple of dp with zeros: zero_unit) */
    float *memory;               /* params | grads | m | v, each `total`; with ZeRO-1 params | grads | this
                                    rank's shard of m and v; with ZeRO-3 this rank's shard of each, then the
                                    work area */
    /* A sharded optimizer (gpt_model_create's zero; 0 without, or at dp 1):
     * the data-parallel ranks split the flattened parameters into units
     * (zero_unit), rank d keeping piece d of each, its shard of shard_len
     * values. It updates that shard alone and keeps the Adam moments of it
     * alone (param_view's m and v are NULL). ZeRO-1 keeps every parameter
     * and gradient whole (its shard's are a range of them); ZeRO-3 keeps its
     * shard of them alone, and a view's data and grad are NULL but while a
     * forward or backward gathers its unit into the work area (zero.h). */
    int zero;
    zero_unit *units;
    int num_units;
    int64_t shard_len;
    float *shard_params, *shard_grads, *shard_m, *shard_v; /* shard_len each */
    /* ZeRO-3: the units of one use gathered whole (params, grads: work_floats each). */
    float *work_params, *work_grads;
    int64_t work_floats;
    int work_units[GPT_LAYER_KINDS + 1], num_work_units, work_what; /* gathered now (zero_gather_use) */
    int wte, wpe, lnf_w, lnf_b;  /* indices into params, -1 when not on this stage */
    int wte_out;                 /* the output projection: wte itself, the last stage's tied copy, or
                                    Llama's untied output.weight */
    int (*layer)[GPT_LAYER_KINDS]; /* per local layer and kind (from GPT_FIRST_LAYER_KIND): index into
                                      params, -1 for a kind the architecture lacks (Llama's biases) */

    int kv_sharers;              /* ranks holding each key/value head: tp / kv_heads when K < TP, else 1 */
    float *kv_grads;             /* K < TP: [K, 2, hd, D], the gradients of every key/value head, summed over TP */

    gpt_slot *slots;
    int num_slots;
    gpt_head *heads;             /* last stage: the head's buffers, num_heads of them */
    int num_heads;
    float *head_memory;
    float *scratch;              /* backward buffers and the attention's, shared by all slots */
    int64_t scratch_size;
    uint16_t *residual_bits;     /* bf16: [rows, D], the bf16 bits of the residual stream's gradient, written
                                    by the norms' backward beside it for the output projections' products */
    /* bf16: the bf16 copy of the weights the products read (weights16, a
     * uint16_t for each float of the parameters: of memory's first total,
     * or with ZeRO-3 of the work area), rounded from the fp32 weights once
     * a use (a layer, the head) after they change, not at every product.
     * gpt_model_weights_changed counts the changes (weights_generation);
     * weights16_made[use - ZERO_USE_HEAD] is the count a use's copy was
     * made at (with ZeRO-3 it is made at every gather). */
    uint16_t *weights16;
    int64_t weights_generation, *weights16_made;
    /* The step's losses (last stage): on the CPU their sum (losses_taken,
     * added at each forward); on a device each forward's row statistics
     * [3, B*T] (row max, sum, target logit) copied into loss_stats, on the
     * device, until gpt_model_take_losses reads them all at once (a full
     * loss_stats is read then: losses_taken keeps their sum); on a device
     * only the first tensor-parallel rank keeps them (the step reports its
     * loss). */
    double losses_taken;
    float *loss_stats, *host_loss_stats; /* losses_held micro-batches of [3, B*T] each */
    int losses_pending, losses_held;
} gpt_model;

/* Whether this trainer computes the model: GPT-2 (GELU MLP, as many
 * key/value heads as heads) or Llama, with fp32 parameters; fails with
 * TP_ERR_ARG saying what differs. */
int gpt_model_supported(const gpt_config *config);

/* Builds this rank's part of the model in the memory of `kernels` (NULL:
 * the CPU), every value zero: a checkpoint's to be loaded, or the initial
 * values of gpt_model_init_values. `slots` micro-batches (of one chunk)
 * in flight, `heads` of them through the head on the last stage (at least
 * 1 there); virtual_stages chunks of layers per stage (1: consecutive
 * layers); with zero 1, ZeRO-1: this rank keeps the Adam moments of its
 * 1/dp of the parameters only; with zero 3, ZeRO-3: its 1/dp of the
 * parameters, gradients and moments, each layer's gathered when used (the
 * fields above; nothing changes at dp 1); with bf16, bf16 mixed precision
 * (gpt_model.bf16: the kernels must have the *_bf16 operations).
 * Fails on a model gpt_model_supported refuses, or layers that do not
 * split into pp x virtual_stages chunks. */
int gpt_model_create(gpt_model **out, const gpt_config *config, comm *c, const kernel_backend *kernels,
                     int64_t micro_batch, int64_t seq, int slots, int heads, int sequence_parallel, int virtual_stages,
                     int zero, int bf16);

/* Binds head buffer `head` (0 .. heads - 1) to a slot before a forward
 * through the model's last chunk; slot k < heads starts bound to head k.
 * A no-op off the last stage. */
int gpt_model_bind_head(gpt_model *model, gpt_slot *slot, int head);

/* The parameters' initial values from the seed (docs/DATA.md "Initial
 * values"), the same at every layout. Only a run that starts afresh needs
 * them: 124M of them take a second or more. */
int gpt_model_init_values(gpt_model *model, uint64_t seed);
void gpt_model_free(gpt_model *model);

/* Bytes of the activations this rank keeps for the backward: every slot's
 * buffers, every head's, and with sequence parallelism its two [B*T, D]
 * buffers. */
int64_t gpt_model_activation_bytes(const gpt_model *model);

/* Bytes of the Adam moments this rank keeps: both moments of its
 * parameters, or with a sharded optimizer of its shard. */
int64_t gpt_model_optimizer_bytes(const gpt_model *model);

/* Bytes of the parameters and gradients this rank keeps: both whole, or
 * with ZeRO-3 its shard of them and the work area they are gathered in. */
int64_t gpt_model_parameter_bytes(const gpt_model *model);

/* Which code computes this rank's attention and why (the kernels' own
 * text, kernel_backend's describe_attention), for the start line. On a GPU
 * in bf16 it builds cuDNN's graphs for the model's shape. */
void gpt_model_attention_path(const gpt_model *model, char *text, size_t size);

/* Zeroes every gradient (with ZeRO-3, this rank's shard of them). */
int gpt_model_zero_grads(gpt_model *model);

/* Copies between a parameter view's `count` values at `values` (data,
 * grad, m or v: the backend's memory) and host memory. */
int gpt_model_to_host(const gpt_model *model, float *host, const float *values, int64_t count);
int gpt_model_from_host(const gpt_model *model, float *values, const float *host, int64_t count);

/* Says the weights changed (initial values, a checkpoint loaded, an
 * optimizer step): with bf16 their bf16 copy is made anew before each
 * use's next product. Whatever writes parameters calls it. */
void gpt_model_weights_changed(gpt_model *model);

/* Where an optimizer step writes param view `index`'s bf16 copy as it
 * updates the view (adamw_tensor.param_bits): in bf16 without ZeRO, the
 * copy of each weight the products read (a layer's four, the head's output
 * projection); NULL for the others, and with ZeRO (ZeRO-1 gathers the
 * updated weights after the step, ZeRO-3 gathers at each use). The step
 * then calls gpt_model_weights_updated instead of gpt_model_weights_changed:
 * the copies it wrote are current, no pass rounds them again before the
 * products. */
uint16_t *gpt_model_update_bits(gpt_model *model, int index);
void gpt_model_weights_updated(gpt_model *model);

/* Forward of chunk `chunk` of this stage's layers (0 with one chunk) on a
 * slot whose tokens/targets (first/last chunk of the model) and input
 * (other chunks) are set. The model's last chunk adds the token losses,
 * and the gradient scale for backward is loss_scale (1 / tokens in the
 * global batch). */
int gpt_model_forward(gpt_model *model, gpt_slot *slot, int chunk);

/* Whether a chunk of this stage begins (embedding) or ends (head) the model. */
int gpt_model_chunk_is_first(const gpt_model *model, int chunk);
int gpt_model_chunk_is_last(const gpt_model *model, int chunk);

/* A chunk's output [rows, D] after a forward: what the next chunk receives. */
const float *gpt_model_output(const gpt_model *model, const gpt_slot *slot);

/* Backward of a slot's chunk; d_output is the gradient of its output
 * [rows, D] (unused on the model's last chunk); on return d_input holds the
 * gradient of its input (unused on the first). */
int gpt_model_backward(gpt_model *model, gpt_slot *slot, int chunk, const float *d_output, float *d_input,
                       float loss_scale);

/* With fewer key/value heads than TP ranks (each replicated over the ranks
 * that share it), sums the gradients of each head's replicas over those
 * ranks, so that they stay equal; a no-op otherwise. After the backward of
 * a step's last micro-batch, on every TP rank alike. */
int gpt_model_reduce_shared_kv(gpt_model *model);

/* With sequence parallelism, sums over TP the gradients of the tensors each
 * rank computed from its own rows only (the norms' weights and biases, the
 * position table), so that they stay equal; a no-op otherwise. After the
 * backward of a step's last micro-batch. */
int gpt_model_reduce_sequence_parallel(gpt_model *model);

/* Sum of the token losses (nats) of rows [0, rows) of a slot after its
 * forward on the last stage; the forward's loss_sum is that of all rows.
 * On the CPU backend (on a device the row statistics stay there:
 * gpt_model_take_losses); NAN on a device. */
double gpt_slot_loss(const gpt_slot *slot, int64_t rows);

/* The sum of the token losses of the forwards through the head since the
 * last call (last stage; on a device the first tensor-parallel rank's, 0
 * elsewhere), and forgets them. On a device the statistics of every
 * forward are read at once here: one read a step, not one a micro-batch,
 * which would wait for each forward to end. */
int gpt_model_take_losses(gpt_model *model, double *loss_sum);

/* Index into params of the view of catalogue entry `entry` (not the tied
 * copy), or -1 when this stage does not hold it. */
int gpt_model_find(const gpt_model *model, int entry);

#endif
