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

--distributed-optimizer LAYOUT: the state as Megatron-Core's
DistributedOptimizer.sharded_state_dict saves it (Megatron-LM d98e8a64dd,
megatron/core/optimizer/distrib_optimizer.py; docs/MEGATRON.md, "The
distributed optimizer in torch_dist"), over --optimizer-dp data-parallel
ranks, its buffers laid out as DistributedOptimizer.
_compute_per_buffer_param_layout lays them out (parameters in reverse
named_parameters() order of --transformer-impl's modules, 64-element
alignment, --bucket-size buckets on the first stage, a bucket of its own
for a tied embedding with pp > 1):
  dp_reshardable (the default since Megatron-Core 0.15): flat buckets,
      optimizer.distributed.dp_group_idx_<tp + pp tp>.gbuf_idx_<g>.
      dtype_(<param dtype>, <grad dtype>).bucket_idx_<b>.param|exp_avg|exp_avg_sq
      of [numel_unpadded], each data-parallel rank's parameters' parts and
      the padding between them chunks of their own (padding holds NaN,
      where Megatron leaves torch.empty's bytes);
  fully_reshardable (--dist-ckpt-optim-fully-reshardable): the state in
      the model's space, optimizer.state.param|exp_avg|exp_avg_sq.<key>,
      chunked as the parameter;
  fully_sharded_model_space (the default up to 0.14, written with PyTorch
      below 2.6 in 0.15): optimizer.state.fp32_param|exp_avg|exp_avg_sq.<key>,
      each data-parallel rank's flattened range of its tensor-parallel piece,
      saved in the N-D reformulation of strategies/torch.py at core_v0.15.0
      ([fragments..., piece elements]);
  dp_zero_gather_scatter (deprecated; --no-ckpt-fully-parallel-save up to
      0.14): each group's gathered state a pickle,
      optimizer.distributed.dp_group_idx_<g>.param_state/shard_0_1 (not read by
      tp-toolkit: the tests check that it says so).
"""
import collections
import copy
import json
import math
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


# --strided-chunks: the model's shards stored with their dimensions in
# reverse order (a [R, C] one with strides (1, R), as a transposed view's
# storage), which torch.save keeps: chunks dense in another order than
# row-major.
STRIDED_CHUNKS = False


def stored_reversed(t):
    """t, its storage in the reverse order of its dimensions (1-D: as it is)."""
    if t.dim() < 2:
        return t
    reverse = tuple(range(t.dim() - 1, -1, -1))
    out = t.permute(reverse).contiguous().permute(reverse)
    assert torch.equal(out, t)
    return out


def sharded(full, boxes):
    """A ShardedTensor of full whose local shards (all on rank 0) are boxes."""
    local = []
    for offsets, sizes in boxes:
        index = tuple(slice(o, o + s) for o, s in zip(offsets, sizes))
        meta = ShardMetadata(shard_offsets=list(offsets), shard_sizes=list(sizes), placement="rank:0/cpu")
        local.append(Shard(full[index].clone().contiguous(), meta))
    out = init_from_local_shards(local, list(full.shape))
    for shard in out.local_shards() if STRIDED_CHUNKS else ():
        # After the checks of init_from_local_shards, which take contiguous
        # shards only: DCP's writer torch.saves the tensor as it finds it.
        shard.tensor = stored_reversed(shard.tensor)
    return out


def state_dict(cfg, o, full, opt):
    """The DCP state dict: {key: ShardedTensor or object}."""
    keys = layer_keys(cfg)
    entries = collections.OrderedDict()  # key -> (global tensor, [(offsets, sizes)])
    key_of = {}  # canonical name -> (its key, its layer along a stacked key's first axis, or None)

    def add(key, tensor, boxes):
        cut = []
        for offsets, sizes in boxes:
            cut += dp_cut(offsets, sizes, o.dp) if o.dp > 1 else [(offsets, sizes)]
        entries[key] = (tensor, cut)

    for name, t in full.items():
        if name.startswith('layers.'):
            continue
        key = FINAL.get(name, name)
        key_of[name] = (key, None)
        add(key, t, [(off, size) for _, off, size in tp_boxes(t.shape, mf.split_kind(name, cfg), cfg.tp)])
    for suffix, key in keys.items():
        names = ['layers.%d.%s' % (i, suffix) for i in range(cfg.layers)]
        if names[0] not in full:
            continue
        kind = mf.split_kind(names[0], cfg)
        shape = full[names[0]].shape
        if o.numbered:
            for i, name in enumerate(names):
                key_of[name] = ('decoder.layers.%d.%s' % (i, key), None)
                add('decoder.layers.%d.%s' % (i, key), full[name],
                    [(off, size) for _, off, size in tp_boxes(shape, kind, cfg.tp)])
        else:
            for i, name in enumerate(names):
                key_of[name] = ('decoder.layers.' + key, i)
            stacked = torch.stack([full[n] for n in names])
            add('decoder.layers.' + key, stacked,
                [([i] + off, [1] + size) for i in range(cfg.layers) for _, off, size in tp_boxes(shape, kind, cfg.tp)])
    sd = collections.OrderedDict()
    dtype_of_key = {key: param_dtype(cfg, o, canon) for canon, (key, _) in key_of.items()}
    for key, (t, boxes) in entries.items():
        sd[key] = sharded(t.to(dtype_of_key.get(key, cfg.dtype)), boxes)
    layout = o.distributed_optimizer
    if layout in ('dp_reshardable', 'fully_sharded_model_space', 'dp_zero_gather_scatter'):
        sd.update(distributed_state(cfg, o, full, opt, key_of))
    elif opt is not None:
        # The non-distributed optimizer: the masters of 16-bit parameters as
        # fp32_param (Float16OptimizerWithFloat16Params.sharded_state_dict);
        # fully_reshardable: every parameter's main copy as param
        # (sharded_param_state_fully_reshardable keys the world tensors'
        # 'param', 'exp_avg', 'exp_avg_sq').
        if layout == 'fully_reshardable':
            roles = ['param', 'exp_avg', 'exp_avg_sq']
        else:
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
                if role == 'fp32_param' and dtype_of_key.get(key) == torch.float32:
                    continue  # fp32 parameters are their own masters (fp32_from_fp16_params: 16-bit ones only)
                field = 'param' if role in ('fp32_param', 'param') else role
                parts = [opt[n][field] for n in names]
                value = torch.stack(parts) if len(names) > 1 or (key.startswith('decoder.layers.') and not o.numbered) \
                    else parts[0]
                sd['optimizer.state.%s.%s' % (role, key)] = sharded(value.to(torch.float32), boxes)
    # Transformer Engine's (or Megatron-Core's local linears') _extra_state: objects, one per layer.
    for module in extra_modules(cfg):
        for i in range(cfg.layers):
            sd['decoder.layers.%s._extra_state/shard_%d_%d' % (module, i, cfg.layers)] = None
    return sd


# --------------------------------------------------------------------------
# The distributed optimizer's flat layouts, as Megatron-Core's code makes
# them (line numbers of Megatron-LM d98e8a64dd unless said).

def pad_to(n, divisor):
    return -(-n // divisor) * divisor


def buffer_layout(params, bucket_size, dp, pad_high):
    """DistributedOptimizer._compute_per_buffer_param_layout (distrib_optimizer.py
    506-589) with pad_param_start and pad_bucket_end (optimizer/param_layout.py
    24-43): params, [(id, numel, shared_embedding)] in named_parameters()
    order, laid out in reverse, each start padded to 64 elements; a bucket
    closes when it reaches bucket_size, and before and after a shared
    embedding (a bucket of its own); its end is padded to lcm(dp, 128)
    (lcm(dp, 128, 2^16) with pad_buckets_for_high_nccl_busbw). Returns
    ({id: (start, end, bucket)} in buffer order, [(bucket start, bucket end)],
    [numel_unpadded per bucket])."""
    divisor = math.lcm(dp, 128, 2 ** 16) if pad_high else math.lcm(dp, 128)
    index, bucket_indices, unpadded = {}, [], []

    def finalize(end, bucket_start, bucket_id):
        unpadded.append(end - bucket_start)
        bucket_end = pad_to(end, divisor)
        bucket_indices.append((bucket_start, bucket_end))
        return bucket_end, bucket_id + 1

    start = bucket_start = bucket_id = end = 0
    in_bucket = 0
    for pid, numel, shared in reversed(params):
        start = pad_to(start, 64)
        if shared and in_bucket:
            bucket_start, bucket_id = finalize(start, bucket_start, bucket_id)
            in_bucket, start = 0, bucket_start
        end = start + numel
        index[pid] = (start, end, bucket_id)
        in_bucket += 1
        if (bucket_size is not None and end - bucket_start >= bucket_size) or shared:
            bucket_start, bucket_id = finalize(end, bucket_start, bucket_id)
            in_bucket, start = 0, bucket_start
        else:
            start = end
    if in_bucket:
        finalize(end, bucket_start, bucket_id)
    return index, bucket_indices, unpadded


def rank_param_ranges(index, bucket, dp, dp_rank):
    """What data-parallel rank dp_rank owns of a bucket (start, end):
    _build_model_gbuf_range and _build_model_gbuf_param_range_map (134-256):
    [(id, its range in the rank's shard of the bucket ('gbuf_local'), its
    range in the flattened parameter ('param'))] in buffer order, and the
    shard's size."""
    bucket_start, bucket_end = bucket
    size = bucket_end - bucket_start
    assert size % dp == 0, "Each bucket's buffer size should be divisible by dp"
    local = size // dp
    world_start = bucket_start + dp_rank * local
    world_end = min(bucket_end, world_start + local)
    out = []
    for pid, (start, end, _) in index.items():
        local_start = max(0, start - world_start)
        local_end = min(world_end - world_start, end - world_start)
        if local_end > local_start:
            sub = max(0, world_start - start)
            out.append((pid, (local_start, local_end), (sub, sub + local_end - local_start)))
    return out, local


def chunk_params(cfg, o, full, pp_rank, vp_rank, tp_rank):
    """[(id, canonical name, the tensor-parallel piece's numel,
    shared_embedding)] of a model chunk in named_parameters() order:
    registration order of --transformer-impl's modules (Transformer Engine:
    linear_proj, linear_qkv with its fused norm, ...; local: input_layernorm
    first), the tied head's copy (its id ('head', name)) last."""
    order = copy.copy(cfg)
    order.names = 'core' if o.transformer_impl == 'transformer_engine' else 'core-local'
    out = []
    for _, key, canon, _ in mf.chunk_entries(order, pp_rank, vp_rank, full):
        if canon is None:
            continue
        head_copy = key == 'output_layer.weight' and not cfg.untied
        # LanguageModule.setup_embeddings_and_output_layer (language_module.py 255-291):
        # with pp > 1 the first stage's word embeddings and the last stage's copy.
        shared = canon == 'embedding.word_embeddings.weight' and cfg.pp > 1 and not cfg.untied
        numel = mf.shard(full[canon], mf.split_kind(canon, cfg), cfg.tp, tp_rank).numel()
        out.append((('head', canon) if head_copy else canon, canon, numel, shared))
    return out


def sharded_parts(shape, parts):
    """A ShardedTensor of global shape whose local shards (all on rank 0) are parts, [(offsets, tensor)]."""
    local = [Shard(t.contiguous(), ShardMetadata(shard_offsets=list(off), shard_sizes=list(t.shape),
                                                 placement="rank:0/cpu")) for off, t in parts]
    return init_from_local_shards(local, list(shape))


def is_norm(canon):
    return canon.startswith('final_norm.') or '.input_norm.' in canon or '.post_norm.' in canon


def param_dtype(cfg, o, canon):
    """A parameter's dtype: the model's, or fp32 for the norms with --fp32-norms."""
    return torch.float32 if o.fp32_norms and is_norm(canon) else cfg.dtype


def distributed_state(cfg, o, full, opt, key_of):
    """The state dict entries of DistributedOptimizer.sharded_state_dict
    (1462-1582) for dp_reshardable (sharded_param_state_dp_reshardable,
    1838-1986) or fully_sharded_model_space (sharded_param_state_fs_model_space,
    1988-2069, saved as strategies/torch.py at core_v0.15.0 saves a flattened
    ShardedTensor, 173-226)."""
    dp = o.optimizer_dp
    states = ('param', 'exp_avg', 'exp_avg_sq')  # ("param",) + optimizer_state_keys of Adam
    chunks = collections.OrderedDict()  # key -> (global shape, [(offsets, tensor)])
    objects = collections.OrderedDict()

    def put(key, shape, offsets, tensor):
        entry = chunks.setdefault(key, (list(shape), []))
        assert entry[0] == list(shape), (key, entry[0], shape)
        entry[1].append((offsets, tensor))

    for pp_rank in range(cfg.pp):
        for tp_rank in range(cfg.tp):
            # data_parallel_group_idx: the rank in the model-parallel group
            # (optimizer/__init__.py 1086, 1206), tensor-parallel rank fastest
            # (parallel_state.py generate_masked_orthogonal_rank_groups, 'tp-pp').
            group = pp_rank * cfg.tp + tp_rank
            prefix = 'optimizer.distributed.dp_group_idx_%d' % group
            per_bucket_numel, per_bucket_numel_unpadded = [], []
            gbuf_idx = 0
            zero_state = {'buckets_coalesced': True}
            for vp_rank in range(cfg.vp):
                params = chunk_params(cfg, o, full, pp_rank, vp_rank, tp_rank)
                canon_of = {pid: canon for pid, canon, _, _ in params}
                local_state = {}  # id -> {state: the tensor-parallel piece, flattened, fp32}
                for pid, canon in canon_of.items():
                    kind = mf.split_kind(canon, cfg)
                    local_state[pid] = {state: mf.shard(opt[canon][state], kind, cfg.tp, tp_rank).reshape(-1).float()
                                        for state in states}
                if o.replica_differs and (pp_rank, vp_rank, tp_rank) == (0, 0, 1):
                    # One rank's bug or flipped bit: tensor-parallel rank 1's copy of the state
                    # of the first replicated parameter, element 3, set to 5 (its copies on the
                    # other ranks keep the value).
                    pid = next(pid for pid, canon in canon_of.items() if mf.split_kind(canon, cfg) == 'rep')
                    local_state[pid][o.replica_differs] = local_state[pid][o.replica_differs].clone()
                    local_state[pid][o.replica_differs][3] = 5.0
                # A buffer per parameter dtype, in the order of their first
                # parameters (group_params_for_buffers, param_and_grad_buffer.py 888-950).
                dtypes = []
                for _, canon, _, _ in params:
                    if param_dtype(cfg, o, canon) not in dtypes:
                        dtypes.append(param_dtype(cfg, o, canon))
                for dtype in dtypes:
                    members = [p for p in params if param_dtype(cfg, o, p[1]) == dtype]
                    # Buckets by size on the first chunk of the first stage only (DDP's
                    # bucket_size, distributed_data_parallel.py 159-171).
                    bucket_size = o.bucket_size if pp_rank == 0 and vp_rank == 0 else None
                    index, buckets, unpadded = buffer_layout([(pid, n, shared) for pid, _, n, shared in members],
                                                             bucket_size, dp, o.pad_buckets_for_high_nccl_busbw)
                    dtype_key = (dtype, torch.float32 if cfg.dtype == torch.bfloat16 else dtype)
                    per_bucket_numel.append({dtype_key: [end - start for start, end in buckets]})
                    per_bucket_numel_unpadded.append({dtype_key: unpadded})
                    if o.distributed_optimizer == 'dp_zero_gather_scatter':
                        # get_parameter_state_dp_zero (1262-1411): per buffer, the buckets'
                        # gathered state cut to their unpadded sizes, concatenated.
                        world = {state: torch.zeros(sum(unpadded)) for state in states}
                        for pid, (start, end, b) in index.items():
                            at = sum(unpadded[:b]) + start - buckets[b][0]
                            for state in states:
                                world[state][at:at + end - start] = local_state[pid][state]
                        world['numel_unpadded'] = sum(unpadded)
                        zero_state[gbuf_idx] = {dtype_key: world}
                        gbuf_idx += 1
                        continue
                    for b, bucket in enumerate(buckets):
                        for d in range(dp):
                            ranges, local = rank_param_ranges(index, bucket, dp, d)
                            assert ranges, 'empty bucket encountered'  # 1909: Megatron refuses too
                            if o.distributed_optimizer == 'dp_reshardable':
                                dp_reshardable_bucket(prefix, gbuf_idx, dtype_key, b, unpadded[b], d, local, ranges,
                                                      local_state, put)
                            else:
                                model_space_ranges(cfg, full, ranges, canon_of, local_state, key_of, tp_rank, put)
                    gbuf_idx += 1
            if o.distributed_optimizer == 'dp_zero_gather_scatter':
                # sharded_param_state_dp_zero (1659-1690): one ShardedObject per group, saved by its
                # data-parallel rank 0.
                objects[prefix + '.param_state/shard_0_1'] = [zero_state]
                groups = {'param_groups': [mf.adam_group(cfg, wd, None) for wd in (1.0, 0.0)]}
                objects[prefix + '.optimizer/shard_0_1'] = [groups]
            if o.distributed_optimizer == 'dp_reshardable':
                # ShardedObjects saved by data-parallel rank 0 (1876-1887, 1535-1549): torch.save([data]).
                objects[prefix + '.per_bucket_numel/shard_0_1'] = [per_bucket_numel]
                objects[prefix + '.per_bucket_numel_unpadded/shard_0_1'] = [per_bucket_numel_unpadded]
                groups = {'param_groups': [mf.adam_group(cfg, wd, None) for wd in (1.0, 0.0)]}
                objects[prefix + '.optimizer/shard_0_1'] = [groups]
    sd = collections.OrderedDict()
    for key, (shape, parts) in chunks.items():
        sd[key] = sharded_parts(shape, parts)
    sd.update(objects)
    return sd


def dp_reshardable_bucket(prefix, gbuf_idx, dtype_key, bucket, numel_unpadded, d, local, ranges, local_state, put):
    """One data-parallel rank's ShardedTensors of one bucket (1889-1986):
    its parameters' parts and the padding between them (inserted where a
    gap lies below numel_unpadded), each at d * local + its gbuf_local start
    of the bucket's [numel_unpadded]."""
    items = [{'id': pid, 'start': gl[0], 'end': gl[1], 'sub': sub} for pid, gl, sub in ranges]
    pads = {}
    for i in range(-1, len(items)):
        next_start = local if i == len(items) - 1 else items[i + 1]['start']
        cur_end = 0 if i == -1 else items[i]['end']
        if next_start != cur_end and d * local + cur_end < numel_unpadded:
            pads[i + 1] = {'id': None, 'start': cur_end, 'end': next_start}
    for at in sorted(pads, reverse=True):
        items.insert(at, pads[at])
    key = '%s.gbuf_idx_%d.dtype_%s.bucket_idx_%d' % (prefix, gbuf_idx, dtype_key, bucket)
    for item in items:
        n = item['end'] - item['start']
        for state in ('param', 'exp_avg', 'exp_avg_sq'):
            if item['id'] is None:  # torch.empty's bytes in Megatron: NaN here, never to be read
                data = torch.full((n,), float('nan'))
            else:
                lo, hi = item['sub']
                data = local_state[item['id']][state][lo:hi]
            put('%s.%s' % (key, state), [numel_unpadded], [d * local + item['start']], data)


def model_space_ranges(cfg, full, ranges, canon_of, local_state, key_of, tp_rank, put):
    """fully_sharded_model_space: each parameter's flattened range this rank
    owns, optimizer.state.fp32_param|exp_avg|exp_avg_sq.KEY as the model's
    ShardedTensor with flattened_range (2013-2055; replica_id the model's
    (pp, tp) and the instance: a tensor-parallel replica and the tied head's
    copy, not main replicas, save nothing), saved in the N-D reformulation:
    global shape [fragments of each axis..., piece elements], the chunk at
    [the piece's fragment index..., range start] (strategies/torch.py
    173-226 and resharding.py 60-79 at core_v0.15.0). A SwiGLU fc1's piece
    is two halves at fragments r and tp + r, its range split between them
    (mlp.py apply_swiglu_sharded_factory, 318-370 at core_v0.15.0)."""
    for pid, _, (lo, hi) in ranges:
        if isinstance(pid, tuple):
            continue  # the tied head's copy
        canon = canon_of[pid]
        kind = mf.split_kind(canon, cfg)
        if kind == 'rep' and tp_rank > 0:
            continue
        key, layer = key_of[canon]
        shape = list(full[canon].shape)
        boxes = [(off, size) for r, off, size in tp_boxes(shape, kind, cfg.tp) if r == (0 if kind == 'rep' else tp_rank)]
        half = local_state[pid]['param'].numel() // len(boxes)  # a SwiGLU piece's halves, else the piece
        for k, (off, size) in enumerate(boxes):
            a, b = max(lo, k * half), min(hi, (k + 1) * half)
            if a >= b:
                continue
            cell = [o // s for o, s in zip(off, size)]
            frags = [g // s for g, s in zip(shape, size)]
            if layer is not None:
                cell, frags = [layer] + cell, [cfg.layers] + frags
            numel = math.prod(size)
            for state in ('param', 'exp_avg', 'exp_avg_sq'):
                data = local_state[pid][state][a:b].reshape([1] * len(cell) + [b - a])
                role = 'fp32_param' if state == 'param' else state
                put('optimizer.state.%s.%s' % (role, key), frags + [numel], cell + [a - k * half], data)


def common_state(cfg, o, opt):
    stubs = None if cfg.plain_args else mf.install_megatron_stubs()
    args = mf.make_args(cfg, stubs)
    args.ckpt_format = 'torch_dist'
    args.use_dist_ckpt = True
    state = {'args': args, 'checkpoint_version': 3.0, 'iteration': cfg.iteration,
             'num_floating_point_operations_so_far': 0.0}
    if opt is not None:
        state['opt_param_scheduler'] = {'max_lr': 3e-4, 'num_steps': cfg.iteration * cfg.global_batch,
                                        'lr_decay_style': 'cosine', 'min_lr': 3e-5}
    layout = o.distributed_optimizer
    if layout:
        # What Megatron-LM's args and save_checkpoint record (checkpointing.py
        # _build_sharded_state_dict_metadata 521-566, content_metadata 903).
        args.use_distributed_optimizer = True
        args.dist_ckpt_optim_fully_reshardable = layout == 'fully_reshardable'
        args.ckpt_fully_parallel_save = True
        args.transformer_impl = o.transformer_impl
        args.overlap_grad_reduce = o.bucket_size is not None
        args.ddp_bucket_size = o.bucket_size
        args.data_parallel_size = o.optimizer_dp
        state['content_metadata'] = {'distrib_optim_sharding_type': layout, 'singleton_local_shards': False,
                                     'chained_optim_avoid_prefix': True}
        # The optimizer's common part: the sharding type beside what is not
        # sharded (the fully reshardable layouts leave the state dict's
        # param_groups unwrapped, 1535-1582).
        state['optimizer'] = {'param_state_sharding_type': layout}
        if layout in ('fully_reshardable', 'fully_sharded_model_space'):
            state['optimizer']['optimizer'] = {'param_groups': [mf.adam_group(cfg, wd, None) for wd in (1.0, 0.0)]}
    return state


def main(argv):
    parser = mf.build_parser()
    parser.add_argument('--numbered', action='store_true', help='layers under numbered keys (non-homogeneous)')
    parser.add_argument('--strided-chunks', action='store_true',
                        help="the model's shards stored in the reverse order of their dimensions (not row-major)")
    parser.add_argument('--dp', type=int, default=1, help='data-parallel ranks each chunk is cut over')
    parser.add_argument('--distributed-optimizer', choices=('dp_reshardable', 'fully_reshardable',
                                                            'fully_sharded_model_space', 'dp_zero_gather_scatter'),
                        help="the distributed optimizer's state in this layout (implies --optimizer)")
    parser.add_argument('--optimizer-dp', type=int, default=1,
                        help="data-parallel ranks the distributed optimizer's state is sharded over")
    parser.add_argument('--bucket-size', type=int, default=None,
                        help='buckets of about this many elements on the first stage (--overlap-grad-reduce)')
    parser.add_argument('--pad-buckets-for-high-nccl-busbw', action='store_true')
    parser.add_argument('--replica-differs', choices=('param', 'exp_avg', 'exp_avg_sq'), default=None,
                        help="dp_reshardable: tensor-parallel rank 1's bucket copy of this state of stage 0's first "
                             "replicated parameter differs from the other ranks' at element 3 (set to 5)")
    parser.add_argument('--fp32-norms', action='store_true',
                        help='the norms kept in fp32 beside 16-bit weights (their own buffers in the distributed optimizer)')
    parser.add_argument('--transformer-impl', choices=('transformer_engine', 'local'), default=None,
                        help="the modules whose parameter order the optimizer's buffers follow "
                             "(default: transformer_engine with --names core, local with core-local)")
    o = parser.parse_args(argv)
    global STRIDED_CHUNKS
    STRIDED_CHUNKS = o.strided_chunks
    if not o.outdir:
        parser.error('OUTDIR is required')
    if not o.names.startswith('core'):
        parser.error('torch_dist checkpoints have Megatron-Core names: --names core or core-local')
    if o.distributed_optimizer:
        o.optimizer = True
    if o.transformer_impl is None:
        o.transformer_impl = 'transformer_engine' if o.names == 'core' else 'local'
    cfg = mf.Config(o)
    full, unfused, opt = mf.make_full(cfg)
    sub = 'release' if cfg.release else 'iter_%07d' % cfg.iteration
    path = os.path.join(o.outdir, sub)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, 'metadata.json'), 'w') as f:
        json.dump({'sharded_backend': 'torch_dist', 'sharded_backend_version': 1, 'common_backend': 'torch',
                   'common_backend_version': 1}, f)
    torch.save(common_state(cfg, o, opt), os.path.join(path, 'common.pt'))
    # ShardedTensors need a process group: this process, one rank holding every chunk.
    dcp_torch.alone(lambda rank, ranks: dcp_torch.save(state_dict(cfg, o, full, opt), path))
    with open(os.path.join(o.outdir, 'latest_checkpointed_iteration.txt'), 'w') as f:
        f.write('release' if cfg.release else str(cfg.iteration))
    if o.full:
        mf.write_full(cfg, o.full, full, unfused, opt)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
