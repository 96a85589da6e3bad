#!/usr/bin/python3
"""Megatron-Core distributed checkpoints (``--ckpt-format torch_dist``) of the
model tests/support/megatron_fixture.py makes, written with PyTorch's own
distributed checkpoint (DCP) in Megatron-Core's layout, for tests of the C
reader. The same options give the same tensors as megatron_fixture.py, so
that a legacy checkpoint of the same model is the judge of this one.

    /usr/bin/python3 tests/support/megatron_dist_fixture.py OUT --names core \\
        --tp 2 --pp 2 [--numbered] [--optimizer] [--dp N]

What it writes under OUT (megatron/core/dist_checkpointing's layout):

    latest_checkpointed_iteration.txt   "1000" (or "release")
    iter_0001000/ (or release/)
        metadata.json   {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                         "common_backend": "torch", "common_backend_version": 1}
        common.pt       torch.save of what every rank shares: args (ckpt_format
                        torch_dist), checkpoint_version 3.0, iteration, the
                        optimizer's schedule
        .metadata, __R_N.distcp   the DCP checkpoint, every rank's chunks in
                        one process (ShardedTensors with several local shards)

Keys are the ShardedTensor keys Megatron-Core's GPTModel gives: a
homogeneous model's layers stacked along a leading axis,
decoder.layers.<module>.<param> [layers, ...], each chunk one layer of one
tensor-parallel rank (TransformerBlock.sharded_state_dict's prepended layer
axis); with --numbered, decoder.layers.<i>.<module>.<param> per layer (a
non-homogeneous model). Tensor-parallel cuts as Megatron-Core makes them:
the vocabulary, QKV and fc1 rows, the row-parallel weights' columns, a
SwiGLU fc1 as [gate; up] with rank r's two parts at r and tp + r of 2 tp
fragments. --dp N cuts each chunk again along its first dimension after
the layer axis over N data-parallel ranks (a data-parallel replica saves
nothing twice). Transformer Engine's _extra_state is a bytes entry
KEY/shard_<layer>_<layers> per layer. --optimizer: the Adam state in the
model's space, optimizer.state.exp_avg|exp_avg_sq.<key> (and fp32_param
below fp32), chunked as its parameter.
"""
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "formats"))
import dcp_torch  # noqa: E402  (PyTorch's DCP, 1.13 or 2.x, and the shim 1.13 needs)
import megatron_fixture as mf  # noqa: E402

import torch  # noqa: E402
from torch.distributed._shard.metadata import ShardMetadata  # noqa: E402
from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards  # noqa: E402

FINAL = {'final_norm.weight': 'decoder.final_layernorm.weight', 'final_norm.bias': 'decoder.final_layernorm.bias'}


def layer_keys(cfg):
    """{canonical suffix after layers.N.: Megatron-Core key suffix}"""
    out = collections.OrderedDict()
    for path, params, _ in mf.LAYER_SCHEMA[cfg.names]:
        for leaf, canon in params:
            out[canon] = path + '.' + leaf
    return out


def extra_modules(cfg):
    return [path for path, _, extra in mf.LAYER_SCHEMA[cfg.names] if extra]


def tp_boxes(shape, kind, tp):
    """[(rank, offsets, sizes)] of a canonical tensor's tensor-parallel cut."""
    if kind in ('vocab', 'col'):
        n = shape[0] // tp
        return [(r, [r * n] + [0] * (len(shape) - 1), [n] + list(shape[1:])) for r in range(tp)]
    if kind == 'row':
        n = shape[1] // tp
        return [(r, [0, r * n], [shape[0], n]) for r in range(tp)]
    if kind == 'glu':  # [gate; up]: rank r's parts are fragments r and tp + r of 2 tp
        n = shape[0] // (2 * tp)
        rest = list(shape[1:])
        return [(r, [f * n] + [0] * len(rest), [n] + rest) for r in range(tp) for f in (r, tp + r)]
    return [(0, [0] * len(shape), list(shape))]


def dp_cut(offsets, sizes, dp):
    """A box cut along its first dimension into dp parts, as torch.chunk cuts."""
    n = sizes[0]
    part = -(-n // dp)
    out = []
    for k in range(dp):
        lo = k * part
        if lo >= n:
            break
        o, s = list(offsets), list(sizes)
        o[0] += lo
        s[0] = min(part, n - lo)
        out.append((o, s))
    return out


def sharded(full, boxes):
    """A ShardedTensor of full whose local shards (all on rank 0) are boxes."""
    local = []
    for offsets, sizes in boxes:
        index = tuple(slice(o, o + s) for o, s in zip(offsets, sizes))
        meta = ShardMetadata(shard_offsets=list(offsets), shard_sizes=list(sizes), placement="rank:0/cpu")
        local.append(Shard(full[index].clone().contiguous(), meta))
    return init_from_local_shards(local, list(full.shape))


def state_dict(cfg, o, full, opt):
    """The DCP state dict: {key: ShardedTensor or object}."""
    keys = layer_keys(cfg)
    entries = collections.OrderedDict()  # key -> (global tensor, [(offsets, sizes)])

    def add(key, tensor, boxes):
        cut = []
        for offsets, sizes in boxes:
            cut += dp_cut(offsets, sizes, o.dp) if o.dp > 1 else [(offsets, sizes)]
        entries[key] = (tensor, cut)

    for name, t in full.items():
        if name.startswith('layers.'):
            continue
        key = FINAL.get(name, name)
        add(key, t, [(off, size) for _, off, size in tp_boxes(t.shape, mf.split_kind(name, cfg), cfg.tp)])
    for suffix, key in keys.items():
        names = ['layers.%d.%s' % (i, suffix) for i in range(cfg.layers)]
        if names[0] not in full:
            continue
        kind = mf.split_kind(names[0], cfg)
        shape = full[names[0]].shape
        if o.numbered:
            for i, name in enumerate(names):
                add('decoder.layers.%d.%s' % (i, key), full[name],
                    [(off, size) for _, off, size in tp_boxes(shape, kind, cfg.tp)])
        else:
            stacked = torch.stack([full[n] for n in names])
            add('decoder.layers.' + key, stacked,
                [([i] + off, [1] + size) for i in range(cfg.layers) for _, off, size in tp_boxes(shape, kind, cfg.tp)])
    sd = collections.OrderedDict()
    for key, (t, boxes) in entries.items():
        sd[key] = sharded(t.to(cfg.dtype), boxes)
    if opt is not None:
        roles = ['exp_avg', 'exp_avg_sq'] + (['fp32_param'] if cfg.dtype != torch.float32 else [])
        canonical = {}
        for name in full:
            if name.startswith('layers.'):
                suffix = name.split('.', 2)[2]
                canonical.setdefault('decoder.layers.' + keys[suffix], []).append(name)
            else:
                canonical[FINAL.get(name, name)] = [name]
        for key, (t, boxes) in entries.items():
            if o.numbered and key.startswith('decoder.layers.'):
                i, rest = key[len('decoder.layers.'):].split('.', 1)
                names = ['layers.%s.%s' % (i, next(s for s, k in keys.items() if k == rest))]
            else:
                names = canonical[key]
            for role in roles:
                field = 'param' if role == 'fp32_param' else role
                parts = [opt[n][field] for n in names]
                value = torch.stack(parts) if len(names) > 1 or (key.startswith('decoder.layers.') and not o.numbered) \
                    else parts[0]
                sd['optimizer.state.%s.%s' % (role, key)] = sharded(value.to(torch.float32), boxes)
    # Transformer Engine's (or Megatron-Core's local linears') _extra_state: objects, one per layer.
    for module in extra_modules(cfg):
        for i in range(cfg.layers):
            sd['decoder.layers.%s._extra_state/shard_%d_%d' % (module, i, cfg.layers)] = None
    return sd


def common_state(cfg, opt):
    stubs = None if cfg.plain_args else mf.install_megatron_stubs()
    args = mf.make_args(cfg, stubs)
    args.ckpt_format = 'torch_dist'
    args.use_dist_ckpt = True
    state = {'args': args, 'checkpoint_version': 3.0, 'iteration': cfg.iteration,
             'num_floating_point_operations_so_far': 0.0}
    if opt is not None:
        state['opt_param_scheduler'] = {'max_lr': 3e-4, 'num_steps': cfg.iteration * cfg.global_batch,
                                        'lr_decay_style': 'cosine', 'min_lr': 3e-5}
    return state


def main(argv):
    parser = mf.build_parser()
    parser.add_argument('--numbered', action='store_true', help='layers under numbered keys (non-homogeneous)')
    parser.add_argument('--dp', type=int, default=1, help='data-parallel ranks each chunk is cut over')
    o = parser.parse_args(argv)
    if not o.outdir:
        parser.error('OUTDIR is required')
    if not o.names.startswith('core'):
        parser.error('torch_dist checkpoints have Megatron-Core names: --names core or core-local')
    cfg = mf.Config(o)
    full, unfused, opt = mf.make_full(cfg)
    sub = 'release' if cfg.release else 'iter_%07d' % cfg.iteration
    path = os.path.join(o.outdir, sub)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, 'metadata.json'), 'w') as f:
        json.dump({'sharded_backend': 'torch_dist', 'sharded_backend_version': 1, 'common_backend': 'torch',
                   'common_backend_version': 1}, f)
    torch.save(common_state(cfg, opt), os.path.join(path, 'common.pt'))
    # ShardedTensors need a process group: this process, one rank holding every chunk.
    dcp_torch.alone(lambda rank, ranks: dcp_torch.save(state_dict(cfg, o, full, opt), path))
    with open(os.path.join(o.outdir, 'latest_checkpointed_iteration.txt'), 'w') as f:
        f.write('release' if cfg.release else str(cfg.iteration))
    if o.full:
        mf.write_full(cfg, o.full, full, unfused, opt)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
