/* elastic_plan.c: `tp-elastic plan` (docs/ELASTIC.md "Choosing a layout"):
 * the valid layouts for N ranks, each with its memory and communication,
 * the reasons of the rejected ones, and the one the planner picks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "../elastic/plan.h"
#include "../formats/registry.h"
#include "../model/interop.h"
#include "../reshard/reshard.h"
#include "../trainer/checkpoint.h"
#include "cli.h"
#include "elastic_commands.h"

#define PROGRAM "tp-elastic plan"

static const char plan_usage[] =
    "usage: tp-elastic plan --world N (--ckpt DIR | model flags) --global-batch B [options]\n"
    "Lists every (tp, pp) for N ranks: dp, micro-batch x accumulation (keeping the global batch B exactly),\n"
    "memory per rank and bytes sent per step, or why it is not valid; then the layout it picks and why.\n"
    "\n" CLI_MODEL_USAGE("fp32|bf16|fp16")
    "           --ckpt DIR: the model (and the current layout) of a checkpoint or run directory instead\n"
    "           (this toolkit's, a Megatron checkpoint, or a DCP checkpoint naming this toolkit's model), in the\n"
    "           precision its run trained in unless --dtype says how it will\n"
    "options:   --micro-batch M (8: the largest to use) --ranks-per-node G (TP stays within a node)\n"
    "           --memory-per-rank SIZE (e.g. 80G; no bound by default) --current tpTppP (prefer it)\n"
    "           --allow-batch-change --json\n"
    "A run's tp-train arguments may be pasted as they are: --tp T --pp P say the current layout (as --current);\n"
    "the rest change nothing here and are ignored: what the plan chooses itself (--dp, --grad-accum, --zero,\n"
    "--sequence-parallel, --virtual-stages) and the trainer's alone (--steps, --lr, --min-lr, --warmup,\n"
    "--weight-decay, --clip, --seed, --data, --ckpt-dir, --ckpt-every, --resume, --log, --quiet, --device, ...).\n"
    "Exit status: 0 when a layout is chosen, 1 when none is valid, 2 on usage errors.\n";

/* tpTppP, read as tp-reshard's --to reads it (reshard_parse_layout, whose
 * degrees follow the one rule for numbers): sscanf took "tp 2pp1",
 * "tp+2pp1" and "tp2pp 1", and wrapped "tp99999999999pp1" to tp 1215752191.
 * A degree not named is 1; a vV is taken and ignored, as a pasted
 * --virtual-stages is (the plan chooses V itself). */
static void parse_layout(const char *text, int *tp, int *pp)
{
    int virtual_stages = 0;
    if (reshard_parse_layout(text, tp, pp, &virtual_stages))
        cli_usage_error(PROGRAM, "--current takes tpTppP (tp2pp1): %s", tp_errmsg());
    if (!*tp) *tp = 1;
    if (!*pp) *pp = 1;
}

/* The model and layout of a checkpoint (a run directory resolves to its
 * newest committed one), of any format: a Megatron GPT's model as this
 * toolkit's (gpt_megatron_model), another's from the configuration it
 * records; the layout it was saved at. The precision is the one the run
 * trained in, as tp-train --resume takes it (the checkpoint's weights are
 * fp32 under bf16 mixed precision too: a bf16 run was planned as fp32,
 * without its bf16 copies and with fp32 activations), unless --dtype says
 * how it will train (given). */
static int from_checkpoint(const char *path, const gpt_options *given, elastic_plan_request *r)
{
    formats_source *source = NULL;
    TP_TRY(formats_source_open(path, NULL, NULL, &source));
    ckpt_reader *reader = formats_source_reader(source);
    const megatron_config *megatron = formats_source_megatron_config(source);
    const char *unfit = megatron ? gpt_megatron_unfit(megatron) : NULL;
    const char *model_json = ckpt_reader_state(reader)->model_json;
    int status = TP_OK;
    if (unfit) status = tp_fail(TP_ERR_ARG, "a Megatron GPT with %s, which this trainer does not compute", unfit);
    else if (megatron) r->model = gpt_megatron_model(megatron);
    else if (!model_json || !strcmp(model_json, "{}"))
        status = tp_fail(TP_ERR_ARG, "a %s that records no model of this toolkit's: give the model flags instead",
                         formats_source_format(source)->title);
    else status = gpt_config_from_json(model_json, &r->model);
    /* As checkpoint_run_model: without a record saying bf16 the run trains in fp32, whatever the weights' dtype
     * (a bf16 checkpoint of tp-ckpt synth or import was planned as bf16 and resumed in fp32). */
    if (!status && !megatron)
        r->model.dtype = checkpoint_record_bf16(ckpt_reader_state(reader)->user_json) ? TP_BF16 : TP_FP32;
    if (!status && given->dtype_given) r->model.dtype = given->explicit_shape.dtype;
    if (status) tp_fail_context(status, "%s: its model", path);
    if (!status && !r->current_tp) {
        r->current_tp = ckpt_reader_saved_layout(reader)->tp;
        r->current_pp = ckpt_reader_saved_layout(reader)->pp;
    }
    formats_source_close(source);
    return status;
}

/* "3.2 MiB", "1.50 GiB"; width pads on the left (the table). */
static void print_bytes(double bytes, int width)
{
    if (bytes >= 1024.0 * 1024 * 1024) printf("%*.2f GiB", width, bytes / (1024.0 * 1024 * 1024));
    else printf("%*.1f MiB", width, bytes / (1024.0 * 1024));
}

static void print_request(const elastic_plan_request *r)
{
    printf("%d ranks, global batch %lld, micro-batch up to %lld", r->world, (long long)r->global_batch,
           (long long)(r->micro_batch ? r->micro_batch : 8));
    if (r->model.dtype != TP_FP32) printf(", %s", tp_dtype_name(r->model.dtype)); /* fp32 is said by nothing */
    if (r->ranks_per_node) printf(", %d ranks per node", r->ranks_per_node);
    if (r->memory_per_rank) {
        printf(", ");
        print_bytes((double)r->memory_per_rank, 0);
        printf(" per rank");
    }
    if (r->current_tp) printf(", current tp%d pp%d", r->current_tp, r->current_pp);
    printf("\n");
}

/* One row: the layout's split, memory and communication, or why it is not valid. */
static void print_layout(const elastic_layout *l, int chosen)
{
    if (!l->valid) {
        printf("%4d %3d   not valid: %s\n", l->tp, l->pp, l->reason);
        return;
    }
    printf("%4d %3d %3d %6lld %6lld %6d ", l->tp, l->pp, l->dp, (long long)l->micro_batch, (long long)l->grad_accum,
           l->ranks);
    print_bytes((double)l->memory.total, 9);
    printf(" ");
    print_bytes((double)l->comm_bytes_per_step, 9);
    printf(" %3s %4s %2d %6.1f%%%s\n", l->sequence_parallel ? "on" : "-", l->zero == 3 ? "3" : l->zero ? "1" : "-", l->virtual_stages,
           100 * l->bubble, chosen ? "   <- chosen" : "");
}

static void print_plan(const elastic_plan_request *r, const elastic_plan *plan)
{
    print_request(r);
    printf("  tp  pp  dp  micro  accum  ranks   memory/rank    comm/step  sp zero  v  bubble\n");
    for (int i = 0; i < plan->count; i++) print_layout(&plan->layouts[i], i == plan->chosen);
    if (plan->chosen < 0) return;
    const elastic_layout *c = &plan->layouts[plan->chosen];
    char chunks[40] = "";
    if (c->virtual_stages > 1) snprintf(chunks, sizeof chunks, " virtual-stages %d", c->virtual_stages);
    printf("chosen: tp%d pp%d dp%d micro %lld accum %lld%s%s%s (%s)\n", c->tp, c->pp, c->dp,
           (long long)c->micro_batch, (long long)c->grad_accum, c->sequence_parallel ? " sequence-parallel" : "",
           c->zero == 3 ? " zero 3" : c->zero ? " zero 1" : "", chunks, plan->why);
    printf("memory per rank: weights %.1f MiB, gradients %.1f MiB, optimizer %.1f MiB, checkpoint snapshot %.1f MiB, "
           "activations %.1f MiB\n",
           c->memory.weights / 1048576.0, c->memory.gradients / 1048576.0, c->memory.optimizer / 1048576.0,
           c->memory.snapshot / 1048576.0, c->memory.activations / 1048576.0);
}

int elastic_plan_main(int argc, char **argv)
{
    enum { O_WORLD = 1, O_CKPT, O_RPN, O_MEMORY, O_CURRENT, O_ALLOW, O_JSON, O_HELP };
    /* The trainer's options too (--global-batch and --micro-batch are the
     * plan's own as well), so that a run's arguments can be pasted. */
    static const struct option options[] = {
        CLI_MODEL_LONG_OPTIONS, CLI_TRAIN_LONG_OPTIONS,
        {"world", required_argument, 0, O_WORLD}, {"ckpt", required_argument, 0, O_CKPT},
        {"ranks-per-node", required_argument, 0, O_RPN}, {"memory-per-rank", required_argument, 0, O_MEMORY},
        {"current", required_argument, 0, O_CURRENT}, {"allow-batch-change", no_argument, 0, O_ALLOW},
        {"json", no_argument, 0, O_JSON}, {"help", no_argument, 0, O_HELP}, {0, 0, 0, 0}};
    elastic_plan_request r = {0};
    gpt_options model = {0};
    const char *ckpt = NULL;
    int json = 0, model_given = 0, c, index = 0;
    int64_t train_tp = 0, train_pp = 0; /* tp-train's --tp and --pp: its default of 1 for the one not given */
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, &index)) != -1) {
        switch (c) {
        case CLI_MODEL_OPTION:
            if (gpt_options_set(&model, options[index].name, optarg)) cli_usage_error(PROGRAM, "%s", tp_errmsg());
            /* --dtype with --ckpt says how the run will train, as tp-train --resume's. */
            if (strcmp(options[index].name, "dtype") != 0) model_given = 1;
            break;
        case O_WORLD: r.world = (int)cli_int(PROGRAM, "--world", optarg, 1, 1 << 20); break;
        case O_CKPT: ckpt = cli_path(PROGRAM, "--ckpt", optarg); break;
        case CLI_TRAIN_GLOBAL_BATCH:
            r.global_batch = cli_int(PROGRAM, "--global-batch", optarg, 1, (int64_t)1 << 30);
            break;
        case CLI_TRAIN_MICRO_BATCH: r.micro_batch = cli_int(PROGRAM, "--micro-batch", optarg, 1, 1 << 20); break;
        case CLI_TRAIN_TP: train_tp = cli_int(PROGRAM, "--tp", optarg, 1, 4096); break;
        case CLI_TRAIN_PP: train_pp = cli_int(PROGRAM, "--pp", optarg, 1, 4096); break;
        case O_RPN: r.ranks_per_node = (int)cli_int(PROGRAM, "--ranks-per-node", optarg, 1, 1 << 20); break;
        case O_MEMORY: r.memory_per_rank = cli_size(PROGRAM, "--memory-per-rank", optarg); break;
        case O_CURRENT: parse_layout(optarg, &r.current_tp, &r.current_pp); break;
        case O_ALLOW: r.allow_batch_change = 1; break;
        case O_JSON: json = 1; break;
        case O_HELP: fputs(plan_usage, stdout); return 0;
        default:
            /* The trainer's other options: nothing the plan depends on. */
            if (c >= CLI_TRAIN_FIRST && c <= CLI_TRAIN_LAST) break;
            cli_usage_error(PROGRAM, "unknown option or missing value: '%s'", cli_rejected_option(argv));
        }
    }
    if (train_tp || train_pp) {
        int tp = train_tp ? (int)train_tp : 1, pp = train_pp ? (int)train_pp : 1;
        if (r.current_tp && (r.current_tp != tp || r.current_pp != pp))
            cli_usage_error(PROGRAM, "--tp %d --pp %d and --current tp%dpp%d name two current layouts", tp, pp,
                            r.current_tp, r.current_pp);
        r.current_tp = tp;
        r.current_pp = pp;
    }
    if (optind != argc) cli_usage_error(PROGRAM, "unexpected argument '%s'", argv[optind]);
    if (!r.world) cli_usage_error(PROGRAM, "--world N is required");
    if (!r.global_batch) cli_usage_error(PROGRAM, "--global-batch B is required");
    if (ckpt && model_given) cli_usage_error(PROGRAM, "give the model flags or --ckpt, not both");
    if (ckpt) {
        if (from_checkpoint(ckpt, &model, &r)) return cli_error(PROGRAM, "%s", tp_errmsg());
    } else if (gpt_options_finish(&model, &r.model)) {
        cli_usage_error(PROGRAM, "%s (or --ckpt DIR)", tp_errmsg());
    }
    elastic_plan plan;
    if (elastic_plan_make(&r, &plan)) return cli_error(PROGRAM, "%s", tp_errmsg());
    if (json) {
        char *text = elastic_plan_to_json(&r, &plan);
        if (!text) {
            elastic_plan_free(&plan);
            return cli_error(PROGRAM, "out of memory");
        }
        printf("%s\n", text);
        free(text);
    } else {
        print_plan(&r, &plan);
    }
    int chosen = plan.chosen;
    char why[sizeof plan.why];
    snprintf(why, sizeof why, "%s", plan.why);
    elastic_plan_free(&plan);
    return chosen >= 0 ? 0 : cli_error(PROGRAM, "%s", why);
}
