#!/usr/bin/python3
"""The Python route users run today to change the tensor-parallel size of a
Megatron-LM legacy checkpoint: torch.load every rank file, torch.cat the
shards of each tensor along its split dimension (the two halves of a
SwiGLU fc1 apart), torch.chunk them for the target, torch.save each new
rank file with the same structure and args. Used by `make bench-megatron`
as the baseline. Pipeline size 1, a target TP that divides the source's.

With the non-distributed optimizer's state in the rank files, it is
merged and split alike: the state has no names, so the parameters are
numbered as Megatron numbers them (named_parameters() order regrouped by
weight decay) to know how each entry splits; param groups, loss scaler and
schedule are copied, the RNG states dropped (as Megatron drops them on a
change of layout).

Usage: megatron_reshard_baseline.py SRC DST TP
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))
import megatron_fixture  # noqa: E402  (Megatron's enum classes, for torch.load)


def kind(key, swiglu):
    """How Megatron splits the tensor at key across TP ranks."""
    if key.endswith("_extra_state"):
        return "rep"
    if "word_embeddings" in key or key.endswith("output_layer.weight"):
        return "col"
    if any(s in key for s in ("query_key_value.", "linear_qkv.weight", "linear_qkv.bias")):
        return "col"
    if any(s in key for s in ("dense_h_to_4h.", "linear_fc1.weight", "linear_fc1.bias")):
        return "glu" if swiglu else "col"
    if any(key.endswith(s) for s in ("self_attention.dense.weight", "linear_proj.weight", "dense_4h_to_h.weight",
                                     "linear_fc2.weight")):
        return "row"
    return "rep"


def merge(parts, how):
    if how == "col":
        return torch.cat(parts, 0)
    if how == "row":
        return torch.cat(parts, 1)
    if how == "glu":
        halves = [p.chunk(2, 0) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0)
    return parts[0]


def split(full, how, n, i):
    if how == "col":
        return full.chunk(n, 0)[i].clone()
    if how == "row":
        return full.chunk(n, 1)[i].clone()
    if how == "glu":
        gate, up = full.chunk(2, 0)
        return torch.cat([gate.chunk(n, 0)[i], up.chunk(n, 0)[i]])
    return full


def walk(dicts, path, swiglu, out_count):
    """The tensors of dicts (one per source rank) merged, then split for the
    out_count target ranks: a list of out_count dicts of the same shape."""
    outs = [type(dicts[0])() for _ in range(out_count)]
    for key, value in dicts[0].items():
        full_key = path + "." + key if path else key
        if isinstance(value, dict):
            for o, sub in zip(outs, walk([d[key] for d in dicts], full_key, swiglu, out_count)):
                o[key] = sub
        elif isinstance(value, torch.Tensor) and kind(full_key, swiglu) != "rep":
            how = kind(full_key, swiglu)
            full = merge([d[key] for d in dicts], how)
            for i, o in enumerate(outs):
                o[key] = split(full, how, out_count, i)
        else:
            for o in outs:
                o[key] = value
    return outs


def parameters(model, path=""):
    """[(key, tensor)] of a model dict in named_parameters() order."""
    out = []
    for key, value in model.items():
        full_key = path + "." + key if path else key
        if isinstance(value, dict):
            out += parameters(value, full_key)
        elif isinstance(value, torch.Tensor) and not key.endswith("_extra_state"):
            out.append((full_key, value))
    return out


def optimizer(sds, swiglu, model_kinds):
    """The optimizer state dicts of sds (one per source rank) merged into
    one, entry by entry as its parameter splits."""
    o = sds[0]["optimizer"]
    wrapped = "fp32_from_fp16_params" in o
    inner = [sd["optimizer"]["optimizer"] if wrapped else sd["optimizer"] for sd in sds]
    groups = megatron_fixture.param_groups_of(model_kinds)
    order = [i for _, idxs in groups for i in idxs]
    kinds = [kind(model_kinds[i][0], swiglu) for i in order]
    state = {}
    for n, how in enumerate(kinds):
        state[n] = {k: merge([st["state"][n][k] for st in inner], how) if isinstance(v, torch.Tensor) and how != "rep"
                    else v for k, v in inner[0]["state"][n].items()}
    merged_inner = {"state": state, "param_groups": inner[0]["param_groups"]}
    if not wrapped:
        return merged_inner
    out = {k: v for k, v in o.items() if k not in ("optimizer", "fp32_from_fp16_params")}
    out["optimizer"] = merged_inner
    masters, n = [], 0
    for g, group in enumerate(o["fp32_from_fp16_params"]):
        masters.append([merge([sd["optimizer"]["fp32_from_fp16_params"][g][j] for sd in sds], kinds[n + j])
                        for j in range(len(group))])
        n += len(group)
    out["fp32_from_fp16_params"] = masters
    return out


def main(src, dst, tp):
    megatron_fixture.install_megatron_stubs()
    with open(os.path.join(src, "latest_checkpointed_iteration.txt")) as f:
        tag = f.read().strip()
    sub = "release" if tag == "release" else "iter_%07d" % int(tag)
    first = torch.load(os.path.join(src, sub, "mp_rank_00", "model_optim_rng.pt"), map_location="cpu", weights_only=False)
    args = first["args"]
    old = args.tensor_model_parallel_size
    assert args.pipeline_model_parallel_size == 1 and old % tp == 0
    group = old // tp
    for r in range(tp):
        # The source ranks whose shards make target rank r.
        sds = [first if r * group + k == 0 else
               torch.load(os.path.join(src, sub, "mp_rank_%02d" % (r * group + k), "model_optim_rng.pt"),
                          map_location="cpu", weights_only=False) for k in range(group)]
        model = walk([sd["model"] for sd in sds], "", args.swiglu, 1)[0]
        out_args = type(args)(**vars(args))
        out_args.tensor_model_parallel_size = tp
        sd = {"args": out_args, "checkpoint_version": sds[0]["checkpoint_version"], "iteration": sds[0]["iteration"],
              "model": model}
        if "optimizer" in sds[0]:
            sd["optimizer"] = optimizer(sds, args.swiglu, parameters(sds[0]["model"]))
            sd["opt_param_scheduler"] = sds[0]["opt_param_scheduler"]
        os.makedirs(os.path.join(dst, sub, "mp_rank_%02d" % r), exist_ok=True)
        torch.save(sd, os.path.join(dst, sub, "mp_rank_%02d" % r, "model_optim_rng.pt"))
    with open(os.path.join(dst, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(tag)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
