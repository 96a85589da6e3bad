/* Megatron-LM legacy checkpoints written by real PyTorch in Megatron's
 * structure (tests/support/megatron_fixture.py; skipped without
 * python3-torch): every tensor's pieces, placed by its partition
 * description, equal the unsharded tensor the fixture computed (its --full
 * file), for both namings, TP 1 to 8, PP 1 to 4, a virtual pipeline, GQA,
 * SwiGLU, untied embeddings, RoPE and RMSNorm without biases. Layouts the
 * reader does not take, and missing files, are refused naming the cause. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../common/error.h"
#include "../../formats/megatron.h"
#include "../support/fixture.h"

TestSuite(megatron, .init = make_dir, .fini = remove_dir, .timeout = 120);


/* Writes fixtures into dir/NAME (references dir/NAME.full.pt), one per
 * "NAME OPTIONS" string, in one Python process (importing torch takes
 * seconds). */
static void generate(const char *const *fixtures, int count)
{
    char command[8000];
    snprintf(command, sizeof command, "%s -c 'import torch, numpy' 2>/dev/null", fixture_python());
    if (system(command) != 0) cr_skip_test("python3-torch is not installed");
    int n = snprintf(command, sizeof command,
                     "%s -c 'import shlex, sys; sys.path.insert(0, \"tests/support\"); import megatron_fixture as m; "
                     "sys.exit(max(m.main(shlex.split(a)) or 0 for a in sys.argv[1:]))'",
                     fixture_python());
    for (int i = 0; i < count; i++) {
        char name[16];
        sscanf(fixtures[i], "%15s", name);
        n += snprintf(command + n, sizeof command - (size_t)n, " '%s/%s --full %s/%s.full.pt %s'", dir, name, dir, name,
                      fixtures[i] + strlen(name) + 1);
    }
    cr_assert_lt(n, (int)sizeof command);
    cr_assert_eq(system(command), 0, "%s (run from the repository root)", command);
}

typedef struct {
    const unsigned char *piece, *logical;
    size_t element;
    int64_t covered;
} compare_ctx;

static int compare_run(void *ctx, int64_t offset, int64_t logical_first, int64_t n)
{
    compare_ctx *c = ctx;
    cr_assert_geq(logical_first, 0, "a Megatron piece holds padding");
    cr_assert_eq(memcmp(c->piece + offset * (int64_t)c->element, c->logical + logical_first * (int64_t)c->element,
                        (size_t)(n * (int64_t)c->element)),
                 0, "elements [%lld, %lld) differ", (long long)logical_first, (long long)(logical_first + n));
    c->covered += n;
    return 0;
}

/* Every tensor equals the reference, piece by piece; returns the tensors. */
static int check_against_full(const char *name, int tp, int pp)
{
    char path[700], full[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(full, sizeof full, "%s/%s.full.pt", dir, name);
    megatron_checkpoint *m;
    cr_assert_eq(megatron_open(path, &m), TP_OK, "%s", tp_errmsg());
    int found;
    cr_assert_eq(megatron_detect(path, &found), TP_OK, "%s", tp_errmsg());
    cr_assert(found);
    const megatron_config *c = megatron_config_of(m);
    cr_assert_eq(c->tp, tp);
    cr_assert_eq(c->pp, pp);
    torch_archive *reference;
    cr_assert_eq(torch_archive_open(full, NULL, &reference), TP_OK, "%s", tp_errmsg());
    const pickle_value *tensors = pickle_get(torch_archive_root(reference), "tensors");
    const pickle_value *optimizer = pickle_get(torch_archive_root(reference), "optimizer");
    cr_assert(tensors && tensors->kind == PICKLE_DICT);
    int params = 0, states = 0;
    for (int i = 0; i < megatron_num_tensors(m); i++) {
        const ckpt_tensor_desc *d = megatron_tensor(m, i);
        /* Optimizer state: the reference's unsharded state of the parameter
         * ("param" holds the fp32 master). */
        int state = d->role && strcmp(d->role, "param");
        const pickle_value *ref = state ? pickle_get(pickle_get(optimizer, d->param), strcmp(d->role, "master") ? d->role : "param")
                                        : pickle_get(tensors, d->name);
        cr_assert(ref, "%s: %s is not in the reference", name, d->name);
        if (state) cr_assert_eq(d->dtype, TP_FP32, "%s", d->name);
        states += state;
        params += !state;
        cr_assert_eq(ref->tensor->ndim, d->ndim, "%s", d->name);
        for (int k = 0; k < d->ndim; k++) cr_assert_eq(ref->tensor->shape[k], d->shape[k], "%s dim %d", d->name, k);
        int64_t offset, bytes;
        cr_assert_eq(torch_tensor_range(reference, ref, &offset, &bytes), TP_OK, "%s", tp_errmsg());
        unsigned char *logical = malloc((size_t)bytes);
        cr_assert_eq(torch_tensor_read(reference, ref, logical, 0, bytes), TP_OK);
        int64_t covered = 0, numel = bytes / (int64_t)tp_dtype_size(d->dtype);
        int ranks = d->partition.kind == CKPT_SPLIT ? tp : 1;
        for (int r = 0; r < tp; r++) {
            const char *file;
            int64_t piece_offset, piece_bytes;
            cr_assert_eq(megatron_piece_range(m, i, r, &file, &piece_offset, &piece_bytes), TP_OK, "%s", tp_errmsg());
            unsigned char *piece = malloc((size_t)piece_bytes + 1);
            cr_assert_eq(megatron_read_piece(m, i, r, piece, piece_bytes), TP_OK, "%s", tp_errmsg());
            int64_t shape[CKPT_MAX_DIMS];
            ckpt_piece_shape(d, tp, shape);
            compare_ctx ctx = {.piece = piece, .logical = logical, .element = tp_dtype_size(d->dtype)};
            cr_assert_eq(ckpt_piece_element_runs(d, tp, r, 0, shape[0], compare_run, &ctx), TP_OK, "%s", tp_errmsg());
            if (r < ranks) covered += ctx.covered;
            free(piece);
        }
        cr_assert_eq(covered, numel, "%s: pieces cover %lld of %lld elements", d->name, (long long)covered, (long long)numel);
        free(logical);
    }
    cr_assert_eq(tensors->dict.keys.count, params, "%s: the reference has %lld tensors, the reader %d", name,
                 (long long)tensors->dict.keys.count, params);
    /* Adam's two moments per parameter, and its fp32 master below fp32. */
    int per_param = optimizer ? (c->dtype == TP_FP32 ? 2 : 3) : 0;
    cr_assert_eq(states, per_param * params, "%s: %d optimizer tensors for %d parameters", name, states, params);
    cr_assert_eq(c->optimizer_read, optimizer != NULL, "%s", name);
    int count = params;
    torch_archive_close(reference);
    megatron_close(m);
    return count;
}

Test(megatron, every_layout_equals_the_reference)
{
    const char *fixtures[] = {
        "a --tp 2 --pp 2 --layers 4 --hidden 64 --heads 4 --ffn 128 --vocab 100 --make-vocab-size-divisible-by 128 --optimizer",
        "b --tp 4 --pp 1 --layers 2 --hidden 64 --heads 8 --query-groups 4 --ffn 96 --vocab 90 --swiglu --untied --names core "
        "--dtype bf16",
        "c --tp 2 --pp 2 --vpp 2 --layers 8 --hidden 32 --heads 4 --ffn 64 --vocab 60 --names legacy-layernorm",
        "d --tp 8 --pp 1 --layers 2 --hidden 64 --heads 8 --ffn 128 --vocab 50 --names core-local",
        "e --tp 1 --pp 4 --layers 4 --hidden 32 --heads 2 --ffn 64 --vocab 50 --release --rope --rmsnorm --no-bias --dtype fp32 "
        "--optimizer",
        "k --tp 2 --pp 2 --vpp 2 --layers 8 --hidden 32 --heads 4 --ffn 64 --vocab 60 --names core --dist-opt --dtype bf16",
    };
    generate(fixtures, 6);
    cr_assert_eq(check_against_full("a", 2, 2), 2 + 4 * 12 + 2);
    check_against_full("b", 4, 1);
    check_against_full("c", 2, 2);
    check_against_full("d", 8, 1);
    check_against_full("e", 1, 4);
    check_against_full("k", 2, 2); /* the state in distrib_optim.pt's flat buffers */

    char path[700];
    snprintf(path, sizeof path, "%s/a", dir);
    megatron_checkpoint *m;
    cr_assert_eq(megatron_open(path, &m), TP_OK, "%s", tp_errmsg());
    const megatron_config *c = megatron_config_of(m);
    cr_assert_eq(c->iteration, 1000);
    cr_assert_float_eq(c->checkpoint_version, 3.0, 0);
    cr_assert_eq(c->num_layers, 4);
    cr_assert_eq(c->padded_vocab, 256); /* 100 padded to a multiple of 128 x 2 */
    cr_assert(c->tied_head_copy);
    cr_assert(c->has_optimizer && c->optimizer_read);
    cr_assert_null(megatron_optimizer_refusal(m, NULL));
    cr_assert(!c->core_names);
    /* The true vocabulary: 100 tokens pad to 256 rows at tp 2; 300 do not. */
    cr_assert_eq(megatron_set_true_vocab(m, 300), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "300 tokens is padded to 512 rows for tp 2"), "%s", tp_errmsg());
    cr_assert_eq(megatron_set_true_vocab(m, 100), TP_OK, "%s", tp_errmsg());
    int vocab_tensors = 0;
    for (int i = 0; i < megatron_num_tensors(m); i++) {
        const ckpt_tensor_desc *d = megatron_tensor(m, i);
        if (strcmp(d->param, "embedding.word_embeddings.weight")) continue;
        vocab_tensors++; /* the weights, two moments, the master */
        cr_assert_eq(d->shape[0], 100, "%s", d->name);
        cr_assert_eq(d->partition.pad_multiple, 128, "%s", d->name);
        int64_t stored[CKPT_MAX_DIMS];
        ckpt_piece_shape(d, 2, stored);
        cr_assert_eq(stored[0], 128, "%s: pieces of %lld rows", d->name, (long long)stored[0]);
    }
    cr_assert_eq(vocab_tensors, 4);
    megatron_close(m);
    snprintf(path, sizeof path, "%s/b", dir);
    cr_assert_eq(megatron_open(path, &m), TP_OK, "%s", tp_errmsg());
    cr_assert(megatron_config_of(m)->core_names);
    cr_assert_eq(megatron_config_of(m)->query_groups, 4);
    cr_assert_eq(megatron_config_of(m)->dtype, TP_BF16);
    megatron_close(m);
    snprintf(path, sizeof path, "%s/c", dir);
    cr_assert_eq(megatron_open(path, &m), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(megatron_config_of(m)->vpp, 2);
    megatron_close(m);
    snprintf(path, sizeof path, "%s/e", dir);
    cr_assert_eq(megatron_open(path, &m), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(megatron_config_of(m)->iteration, -1); /* release */
    cr_assert(!megatron_config_of(m)->learned_positions);
    megatron_close(m);
}

/* The bytes of a file (its size in *size); the caller frees. */
static unsigned char *file_bytes(const char *path, long *size)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s: cannot open", path);
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    rewind(f);
    unsigned char *bytes = malloc((size_t)*size + 1);
    cr_assert_eq(fread(bytes, 1, (size_t)*size, f), (size_t)*size, "%s", path);
    fclose(f);
    return bytes;
}

/* Writes the checkpoint dir/NAME at tp as dir/OUT, each piece streamed
 * through a buffer of block_bytes (0: the default). */
static void write_streamed(const char *name, int64_t true_vocab, int tp, int64_t block_bytes, const char *out)
{
    char path[700], target[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(target, sizeof target, "%s/%s", dir, out);
    megatron_checkpoint *m;
    cr_assert_eq(megatron_open(path, &m), TP_OK, "%s", tp_errmsg());
    if (true_vocab) cr_assert_eq(megatron_set_true_vocab(m, true_vocab), TP_OK, "%s", tp_errmsg());
    ckpt_reader *source;
    cr_assert_eq(megatron_reader_open(m, 0, &source), TP_OK, "%s", tp_errmsg());
    megatron_write_options options = {.tp = tp, .naming = -1, .threads = 2, .block_bytes = block_bytes};
    megatron_write_plan plan;
    cr_assert_eq(megatron_write(source, m, &options, target, &plan), TP_OK, "%s", tp_errmsg());
    cr_assert(plan.optimizer, "%s: the optimizer state is written", out);
    ckpt_reader_close(source);
    megatron_close(m);
}

/* Rank files are streamed a block of rows at a time (the block stays in
 * the CPU's cache): blocks of one row and of a few rows that end inside
 * pieces, across the re-padded vocabulary rows, SwiGLU halves and
 * column-split pieces, write the same bytes as blocks holding whole pieces
 * (CRC-32s taken in parts included), and equal PyTorch's reference. */
Test(megatron, streamed_pieces_write_the_same_bytes)
{
    const char *fixtures[] = {
        "s --tp 4 --pp 1 --layers 2 --hidden 64 --heads 4 --ffn 96 --vocab 100 --make-vocab-size-divisible-by 8 --swiglu "
        "--untied --optimizer --dtype bf16",
    };
    generate(fixtures, 1);
    /* 100 bytes: one row (128 bytes of bf16) or 50 elements at a time;
     * 1000: 7 rows of 128 bytes, 3 rows of fp32 state. */
    const struct { int64_t true_vocab, block; const char *out; } writes[] = {
        {0, 0, "whole"}, {0, 100, "rows1"}, {0, 1000, "rows7"}, {100, 0, "pad-whole"}, {100, 1000, "pad-rows7"},
    };
    for (int i = 0; i < 5; i++) write_streamed("s", writes[i].true_vocab, 2, writes[i].block, writes[i].out);
    const char *same[][2] = {{"whole", "rows1"}, {"whole", "rows7"}, {"pad-whole", "pad-rows7"}};
    for (int i = 0; i < 3; i++) {
        for (int rank = 0; rank < 2; rank++) {
            char a[800], b[800];
            snprintf(a, sizeof a, "%s/%s/iter_0001000/mp_rank_%02d/model_optim_rng.pt", dir, same[i][0], rank);
            snprintf(b, sizeof b, "%s/%s/iter_0001000/mp_rank_%02d/model_optim_rng.pt", dir, same[i][1], rank);
            long size_a, size_b;
            unsigned char *bytes_a = file_bytes(a, &size_a), *bytes_b = file_bytes(b, &size_b);
            cr_assert_eq(size_a, size_b, "%s: %ld bytes, %s: %ld", a, size_a, b, size_b);
            cr_assert_eq(memcmp(bytes_a, bytes_b, (size_t)size_a), 0, "%s and %s differ", a, b);
            free(bytes_a);
            free(bytes_b);
        }
    }
    /* The padding changed with TP (tp4 pads 100 to 128 rows, tp2 to 112). */
    long whole, padded;
    char a[800];
    snprintf(a, sizeof a, "%s/whole/iter_0001000/mp_rank_00/model_optim_rng.pt", dir);
    free(file_bytes(a, &whole));
    snprintf(a, sizeof a, "%s/pad-whole/iter_0001000/mp_rank_00/model_optim_rng.pt", dir);
    free(file_bytes(a, &padded));
    cr_assert_lt(padded, whole);
    /* Every entry matches the CRC-32 recorded for it, taken in parts; a bit
     * flipped in a tensor's bytes is found by its entry's. */
    snprintf(a, sizeof a, "%s/whole", dir);
    megatron_checkpoint *written;
    cr_assert_eq(megatron_open(a, &written), TP_OK, "%s", tp_errmsg());
    megatron_verify_result verified;
    cr_assert_eq(megatron_verify(written, 2, NULL, NULL, &verified), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(verified.files, 2);
    cr_assert_gt(verified.entries, 10);
    cr_assert_eq(verified.unchecked, 0);
    cr_assert_eq(verified.damaged, 0, "%s", verified.first_damage);
    const char *file;
    int64_t offset, bytes;
    cr_assert_eq(megatron_piece_range(written, 0, 1, &file, &offset, &bytes), TP_OK, "%s", tp_errmsg());
    char flipped[700];
    snprintf(flipped, sizeof flipped, "%s", file);
    megatron_close(written);
    FILE *f = fopen(flipped, "r+b");
    unsigned char byte;
    cr_assert(f && fseek(f, offset + bytes / 2, SEEK_SET) == 0 && fread(&byte, 1, 1, f) == 1);
    byte ^= 0x10;
    cr_assert(fseek(f, offset + bytes / 2, SEEK_SET) == 0 && fwrite(&byte, 1, 1, f) == 1);
    fclose(f);
    cr_assert_eq(megatron_open(a, &written), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(megatron_verify(written, 2, NULL, NULL, &verified), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(verified.damaged, 1);
    cr_assert(strstr(verified.first_damage, "mp_rank_01/model_optim_rng.pt: entry model_optim_rng/data/") &&
                  strstr(verified.first_damage, "(damaged)"), "%s", verified.first_damage);
    megatron_close(written);
    /* The one-row blocks' output against PyTorch's unsharded tensors. */
    char full[700], copy[700];
    snprintf(full, sizeof full, "%s/s.full.pt", dir);
    snprintf(copy, sizeof copy, "%s/rows1.full.pt", dir);
    cr_assert_eq(symlink(full, copy), 0);
    check_against_full("rows1", 2, 1);
    /* This writer records each CRC-32 in the local header too (PyTorch's
     * uses data descriptors): a local header that disagrees with the
     * central directory is refused. data.pkl's header is at 0. */
    snprintf(a, sizeof a, "%s/rows1/iter_0001000/mp_rank_01/model_optim_rng.pt", dir);
    f = fopen(a, "r+b");
    unsigned char crc;
    cr_assert(f && fseek(f, 14, SEEK_SET) == 0 && fread(&crc, 1, 1, f) == 1);
    crc ^= 1;
    cr_assert(fseek(f, 14, SEEK_SET) == 0 && fwrite(&crc, 1, 1, f) == 1);
    fclose(f);
    snprintf(a, sizeof a, "%s/rows1", dir);
    megatron_checkpoint *m = NULL;
    cr_assert_neq(megatron_open(a, &m), TP_OK);
    cr_assert(strstr(tp_errmsg(), "data.pkl: its local header records CRC-32"), "%s", tp_errmsg());
}

static void expect_refused(const char *path, const char *needle)
{
    megatron_checkpoint *m = NULL;
    int status = megatron_open(path, &m);
    megatron_close(m);
    cr_assert_neq(status, TP_OK, "%s accepted", path);
    cr_assert(strstr(tp_errmsg(), needle), "'%s' not in: %s", needle, tp_errmsg());
}

Test(megatron, refusals_name_the_cause)
{
    const char *fixtures[] = {
        "f --tp 4 --pp 1 --layers 2 --hidden 64 --heads 8 --query-groups 2 --ffn 64 --vocab 50 --names core",
        "g --tp 2 --pp 2 --layers 2 --hidden 32 --heads 2 --ffn 64 --vocab 50",
    };
    generate(fixtures, 2);
    char path[700], file[800];
    /* Fewer query groups than ranks (Megatron-Core): read, a group's rows
     * cut between ranks at whole heads. */
    cr_assert_eq(check_against_full("f", 4, 1), 2 + 2 * 12 + 2);
    snprintf(path, sizeof path, "%s/g", dir);
    snprintf(file, sizeof file, "%s/iter_0001000/mp_rank_01_001/model_optim_rng.pt", path);
    cr_assert_eq(unlink(file), 0);
    expect_refused(path, "mp_rank_01_001/model_optim_rng.pt");
    snprintf(path, sizeof path, "%s/none", dir);
    expect_refused(path, "not a Megatron-LM checkpoint");
    int found = 1;
    cr_assert_eq(megatron_detect(path, &found), TP_OK, "%s", tp_errmsg());
    cr_assert(!found);
}

/* Optimizer state that cannot be read leaves the weights readable and says
 * why: a layout not read (the distributed optimizer's older files), and
 * state that contradicts the model (damaged: a moment of the wrong size, a
 * world tensor shorter than its parameters). */
Test(megatron, optimizer_state_not_read_is_said)
{
    const char *fixtures[] = {
        "h --tp 2 --pp 1 --layers 2 --hidden 32 --heads 2 --ffn 64 --vocab 50 --dist-opt --dtype bf16 --plain-args",
        "i --tp 2 --pp 1 --layers 2 --hidden 32 --heads 2 --ffn 64 --vocab 50 --optimizer --dtype fp32 --plain-args",
        "j --tp 2 --pp 2 --layers 2 --hidden 32 --heads 2 --ffn 64 --vocab 50 --dist-opt --dtype fp16 --plain-args",
    };
    generate(fixtures, 3);
    char path[700], command[4000];
    snprintf(command, sizeof command,
             "%s -c 'import sys, torch\n"
                    "def edit(f, change):\n"
                    "    sd = torch.load(f, map_location=\"cpu\", weights_only=False); change(sd); torch.save(sd, f)\n"
                    "edit(sys.argv[1], lambda sd: sd.pop(\"buckets_coalesced\"))\n"
                    "edit(sys.argv[2], lambda sd: sd[\"optimizer\"][\"state\"][3].update(exp_avg=torch.zeros(7)))\n"
                    "def cut(sd):\n"
                    "    world = sd[0][next(iter(sd[0]))]\n"
                    "    world[\"exp_avg\"] = world[\"exp_avg\"][:100].clone()\n"
                    "edit(sys.argv[3], cut)' "
                    "%s/h/iter_0001000/mp_rank_00/distrib_optim.pt %s/i/iter_0001000/mp_rank_01/model_optim_rng.pt "
                    "%s/j/iter_0001000/mp_rank_01_001/distrib_optim.pt",
             fixture_python(), dir, dir, dir);
    cr_assert_eq(system(command), 0, "%s", command);
    const char *names[] = {"h", "i", "j"};
    const char *why[] = {"without buckets_coalesced (Megatron-LM before April 2024) is not read yet",
                         "mp_rank_01/model_optim_rng.pt: tensor state[3].exp_avg is 7",
                         "exp_avg of model chunk 0 is not an fp32 vector of numel_unpadded"};
    const int statuses[] = {TP_ERR_LAYOUT, TP_ERR_FORMAT, TP_ERR_FORMAT};
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        megatron_checkpoint *m;
        cr_assert_eq(megatron_open(path, &m), TP_OK, "%s", tp_errmsg());
        int status = 0;
        const char *refusal = megatron_optimizer_refusal(m, &status);
        cr_assert(refusal && strstr(refusal, why[k]), "'%s' not in: %s", why[k], refusal ? refusal : "(read)");
        cr_assert_eq(status, statuses[k], "%s", refusal);
        const megatron_config *c = megatron_config_of(m);
        cr_assert(c->has_optimizer && !c->optimizer_read && !c->distributed_optimizer);
        for (int i = 0; i < megatron_num_tensors(m); i++)
            cr_assert_str_eq(megatron_tensor(m, i)->role, "param", "%s: %s kept", names[k], megatron_tensor(m, i)->name);
        megatron_close(m);
    }
}

/* The copies a checkpoint holds of a tensor besides the one read: (tp - 1)
 * of each replicated tensor (its optimizer state included), and with tied
 * embeddings over pp > 1 the last stage's copy of each piece of the word
 * embeddings and of their state. */
static int expected_copies(const megatron_checkpoint *m)
{
    const megatron_config *c = megatron_config_of(m);
    int copies = 0, word = 0;
    for (int i = 0; i < megatron_num_tensors(m); i++) {
        const ckpt_tensor_desc *t = megatron_tensor(m, i);
        if (t->partition.kind == CKPT_REPLICATED) copies += c->tp - 1;
        word += !strcmp(t->param ? t->param : t->name, "embedding.word_embeddings.weight");
    }
    return copies + (c->tied_head_copy ? word * c->tp : 0);
}

/* megatron_check_replicas of the checkpoint at dir/name, and what
 * megatron_verify and a reader computing digests make of it. */
static void check_copies(const char *name, int differ, const char *const *needles)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    megatron_checkpoint *m;
    cr_assert_eq(megatron_open(path, &m), TP_OK, "%s: %s", name, tp_errmsg());
    megatron_replica_result r;
    cr_assert_eq(megatron_check_replicas(m, 2, &r), TP_OK, "%s: %s", name, tp_errmsg());
    cr_assert_eq(r.copies, expected_copies(m), "%s: %d copies compared, %d expected", name, r.copies, expected_copies(m));
    cr_assert_gt(r.tensors, 0);
    cr_assert_eq(r.copies_differ, differ, "%s: %d copies differ, %d expected: %s", name, r.copies_differ, differ,
                 r.first_difference);
    for (int k = 0; needles && needles[k]; k++)
        cr_assert(strstr(r.first_difference, needles[k]), "%s: '%s' not in: %s", name, needles[k], r.first_difference);
    megatron_verify_result verified;
    cr_assert_eq(megatron_verify(m, 2, NULL, NULL, &verified), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(verified.damaged, 0, "%s", verified.first_damage); /* every file's CRC-32s match: torch.save wrote them */
    cr_assert_eq(verified.replicas.copies_differ, differ);
    cr_assert_str_eq(verified.replicas.first_difference, r.first_difference);
    /* The digests of the copies read would prove one of two values: refused. */
    ckpt_reader *reader = NULL;
    int status = megatron_reader_open(m, 1, &reader);
    ckpt_reader_close(reader);
    if (differ) {
        cr_assert_eq(status, TP_ERR_FORMAT, "%s: a reader computing digests opened it", name);
        cr_assert(strstr(tp_errmsg(), r.first_difference), "%s: %s", name, tp_errmsg());
    } else {
        cr_assert_eq(status, TP_OK, "%s: %s", name, tp_errmsg());
    }
    /* Without digests the copies read are read, as Megatron's converters read them. */
    cr_assert_eq(megatron_reader_open(m, 0, &reader), TP_OK, "%s", tp_errmsg());
    ckpt_reader_close(reader);
    megatron_close(m);
}

Test(megatron, copies_of_a_tensor_are_compared)
{
    const char *fixtures[] = {
        "r --tp 2 --pp 2 --layers 4 --hidden 32 --heads 4 --ffn 64 --vocab 50 --optimizer --dtype bf16 --plain-args",
        "s --tp 2 --pp 2 --layers 4 --hidden 32 --heads 4 --ffn 64 --vocab 50 --dist-opt --dtype fp16 --plain-args",
        "u --tp 4 --pp 1 --layers 2 --hidden 32 --heads 4 --ffn 64 --vocab 50 --optimizer --dtype fp32 --untied "
        "--names core --rmsnorm --plain-args",
    };
    generate(fixtures, 3);
    for (int k = 0; k < 3; k++) check_copies((const char *[]){"r", "s", "u"}[k], 0, NULL);
    /* Copies changed as one rank's bug or flipped bit would (torch.save
     * writes their CRC-32s): a replicated tensor's Adam moment on tp rank 1
     * (r1: the first of the stage's norms), the last stage's copy of the
     * tied embeddings' master weights (r2), tp rank 1's distrib_optim.pt
     * first moments of a stage (s1: its replicated parameters', and the
     * word embeddings' piece 1, which the last stage's copy no longer
     * equals; its master weights changed so, s2, no longer round to the
     * rank file's weights: the optimizer state is refused), every weight
     * and main copy NaN (s3: a diverged run, read), a NaN in tp rank 3's final norm (u1), the same NaN in every
     * copy (u2: equal, bit for bit). */
    char command[6000];
    snprintf(command, sizeof command,
             "%s -c 'import shutil, sys, torch\n"
             "d = sys.argv[1]\n"
             "def edit(name, f, change):\n"
             "    shutil.copytree(d + \"/\" + name[0], d + \"/\" + name, dirs_exist_ok=True)\n"
             "    for path in f.split():\n"
             "        path = d + \"/\" + name + \"/iter_0001000/\" + path\n"
             "        sd = torch.load(path, map_location=\"cpu\", weights_only=False); change(sd); torch.save(sd, path)\n"
             "def moment(sd):\n"
             "    st = sd[\"optimizer\"][\"optimizer\"][\"state\"]\n"
             "    st[[i for i in sorted(st) if st[i][\"exp_avg\"].dim() == 1][0]][\"exp_avg\"][5] += 1\n"
             "def master(sd):\n"
             "    g = [g for g in sd[\"optimizer\"][\"fp32_from_fp16_params\"] if g[0].dim() == 2][0]\n"
             "    g[-1][1, 2] += 1\n" /* the head copy's: the stage's last parameter */
             "def world(sd):\n"
             "    w = sd[0][next(iter(sd[0]))]; w[\"exp_avg\"] += 1\n"
             "def main_copies(sd):\n"
             "    w = sd[0][next(iter(sd[0]))]; w[\"param\"] += 1\n"
             "def nans(x):\n"
             "    if torch.is_tensor(x) and x.is_floating_point(): x.fill_(float(\"nan\"))\n"
             "    elif isinstance(x, dict): [nans(v) for v in x.values()]\n"
             "def negative_nan_main_copies(sd):\n"
             "    for chunk in (c for k, c in sd.items() if isinstance(k, int)):\n"
             "        for buffer in (b for b in chunk.values() if isinstance(b, dict) and \"param\" in b):\n"
             "            buffer[\"param\"].fill_(-float(\"nan\"))\n"
             "def diverged(sd):\n"
             "    negative_nan_main_copies(sd) if \"model\" not in sd else nans(sd[\"model\"])\n"
             "def nan(sd):\n"
             "    sd[\"model\"][\"decoder.final_layernorm.weight\"][5] = float(\"nan\")\n"
             "edit(\"r1\", \"mp_rank_01_001/model_optim_rng.pt\", moment)\n"
             "edit(\"r2\", \"mp_rank_00_001/model_optim_rng.pt\", master)\n"
             "edit(\"s1\", \"mp_rank_01_000/distrib_optim.pt\", world)\n"
             "edit(\"s2\", \"mp_rank_01_000/distrib_optim.pt\", main_copies)\n"
             "edit(\"s3\", \" \".join(\"mp_rank_%%02d_%%03d/%%s\" %% (t, p, f) for t in range(2) for p in range(2) "
             "for f in (\"model_optim_rng.pt\", \"distrib_optim.pt\")), diverged)\n"
             "edit(\"u1\", \"mp_rank_03/model_optim_rng.pt\", nan)\n"
             "edit(\"u2\", \" \".join(\"mp_rank_%%02d/model_optim_rng.pt\" %% t for t in range(4)), nan)' %s",
             fixture_python(), dir);
    cr_assert_eq(system(command), 0, "%s", command);
    const char *r1[] = {"optim/exp_avg/", "is replicated over the tensor-parallel ranks and its copies differ: element [5] is",
                        "/r1/iter_0001000/mp_rank_01_001/model_optim_rng.pt (tensor-parallel rank 1's copy)",
                        "/r1/iter_0001000/mp_rank_00_001/model_optim_rng.pt (rank 0's, the one read)", NULL};
    check_copies("r1", 1, r1);
    const char *r2[] = {"optim/master/embedding.word_embeddings.weight (fp32_from_fp16_params[",
                        "]) and its copy for the tied output layer differ: element [1, 2] of tensor-parallel piece 0 is",
                        "/r2/iter_0001000/mp_rank_00_001/model_optim_rng.pt (the copy)",
                        "/r2/iter_0001000/mp_rank_00_000/model_optim_rng.pt (the one read)", NULL};
    check_copies("r2", 1, r2);
    /* Stage 0 holds the position embeddings and 2 layers of 6 replicated tensors each. */
    const char *s1[] = {"optim/exp_avg/embedding.position_embeddings.weight (distrib_optim.pt chunk 0 exp_avg[",
                        "element [0, 0] is", "/s1/iter_0001000/mp_rank_01_000/distrib_optim.pt (tensor-parallel rank 1's copy)",
                        "/s1/iter_0001000/mp_rank_00_000/distrib_optim.pt (rank 0's, the one read)", NULL};
    check_copies("s1", 13 + 1, s1);
    char path[700];
    snprintf(path, sizeof path, "%s/s2", dir);
    megatron_checkpoint *m;
    cr_assert_eq(megatron_open(path, &m), TP_OK, "%s", tp_errmsg());
    int status = 0;
    const char *refusal = megatron_optimizer_refusal(m, &status);
    cr_assert(refusal && strstr(refusal, "/s2/iter_0001000/mp_rank_01_000/distrib_optim.pt: the main copy of ") &&
                  strstr(refusal, " is not the weight ") && strstr(refusal, "/s2/iter_0001000/mp_rank_01_000/model_optim_rng.pt holds"),
              "%s", refusal ? refusal : "(read)");
    cr_assert_eq(status, TP_ERR_FORMAT);
    megatron_close(m);
    /* A diverged run: every weight PyTorch's NaN, every main copy a NaN of
     * the other sign. The files belong together: the state is read (it was
     * refused as another rank's). */
    snprintf(path, sizeof path, "%s/s3", dir);
    cr_assert_eq(megatron_open(path, &m), TP_OK, "%s", tp_errmsg());
    refusal = megatron_optimizer_refusal(m, &status);
    cr_assert_null(refusal, "%s", refusal);
    megatron_close(m);
    const char *u1[] = {"final_norm.weight (decoder.final_layernorm.weight) is replicated over the tensor-parallel ranks "
                        "and its copies differ: element [5] is nan (0x7fc00000) in ",
                        "/u1/iter_0001000/mp_rank_03/model_optim_rng.pt (tensor-parallel rank 3's copy), 1", NULL};
    check_copies("u1", 1, u1);
    check_copies("u2", 0, NULL);
}

/* ------------------------------------------ the fuzzing corpus, replayed */

#define LLVMFuzzerTestOneInput fuzz_megatron_one
#include "../fuzz/fuzz_megatron.c"
#undef LLVMFuzzerTestOneInput

Test(megatron, fuzz_corpus)
{
    cr_assert_gt(replay_corpus("megatron", fuzz_megatron_one), 0);
}

#define LLVMFuzzerTestOneInput fuzz_megatron_write_one
#include "../fuzz/fuzz_megatron_write.c"
#undef LLVMFuzzerTestOneInput

/* The writer's corpus and the pickle corpus: each value carried over at
 * every place of a real rank file, written, judged. */
Test(megatron, fuzz_corpus_writer)
{
    cr_assert_gt(replay_corpus("megatron_write", fuzz_megatron_write_one), 0);
    cr_assert_gt(replay_corpus("pickle", fuzz_megatron_write_one), 0);
}
