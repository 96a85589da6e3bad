#!/usr/bin/python3
"""Generate small Megatron-LM *legacy* checkpoints (``--ckpt-format torch``) with
real PyTorch, for tests of the C checkpoint reader and resharder.

Run with Debian's interpreter, which has python3-torch and numpy:

    /usr/bin/python3 tests/support/megatron_fixture.py OUT --tp 2 --pp 2 \
        --full OUT/full.pt [--self-check]
    /usr/bin/python3 tests/support/megatron_fixture.py --self-check   # layout matrix
    /usr/bin/python3 tests/support/megatron_fixture.py --verify CKPT --full REF.pt

What it writes under OUT (the layout of megatron/training/checkpointing.py):

    latest_checkpointed_iteration.txt      "1000" (no newline) or "release"
    iter_0001000/ (or release/)
        mp_rank_TT/model_optim_rng.pt      when pp == 1
        mp_rank_TT_PPP/model_optim_rng.pt  when pp > 1
        .../distrib_optim.pt               with --dist-opt only

Each model_optim_rng.pt is a torch.save() zip whose pickled dict holds, in
Megatron's order: 'args' (argparse.Namespace), 'checkpoint_version' (3.0),
'iteration', 'model' (or 'model0', 'model1', ... with --vpp > 1),
'optimizer' and 'opt_param_scheduler' (with --optimizer / --dist-opt),
'rerun_state_machine' (unless --plain-args), 'rng_state' (a one-element list
of dicts) and 'num_floating_point_operations_so_far'.

Tensors are sharded as Megatron shards them: the vocabulary is padded to a
multiple of make_vocab_size_divisible_by * tp and split on dim 0; the fused
QKV weight is laid out per query group ([q heads of group g, k_g, v_g] for
each g) and its rows are chunked across TP ranks; column-parallel weights
(qkv, fc1, output layer) split on dim 0, row-parallel weights (attention
dense / linear_proj, fc2) on dim 1; with --swiglu fc1 is [gate; up] and
rank r holds [gate_r; up_r]; norms and row-parallel biases are replicated.
Layer numbers inside a file are local to its pipeline stage / model chunk.

--names picks the parameter naming:
  legacy            megatron/legacy/model (Sept 2023+): nested dicts
                    model['language_model']['embedding'|'encoder'|'output_layer'],
                    input_norm / post_attention_norm / final_norm, and
                    '_extra_state': None after each parallel linear (Dec 2023+)
  legacy-layernorm  the same, older names: input_layernorm /
                    post_attention_layernorm / final_layernorm, no _extra_state
  core              Megatron-Core GPTModel, Transformer Engine layer spec: flat
                    keys, linear_qkv.layer_norm_weight, TE '_extra_state'
  core-local        Megatron-Core GPTModel, local spec: input_layernorm /
                    pre_mlp_layernorm, '_extra_state': None on linears

Optimizer: --optimizer writes Megatron's non-distributed layout
(Float16OptimizerWithFloat16Params for fp16/bf16, FP32Optimizer for fp32);
--dist-opt the distributed optimizer's: param_groups only in the model file,
the state in distrib_optim.pt (data-parallel size 1), and every chunk's
parameters as views of one flat buffer, so they share a storage.

As in real checkpoints, model and optimizer storages are recorded on
'cuda:<rank % 8>' (--location cpu to avoid), and unless --plain-args is
given 'args' and 'rerun_state_machine' hold Megatron enum instances
(megatron.core.enums.ModelType, ...).  To load a file in Python:
install_megatron_stubs(); torch.load(path, map_location='cpu').

The reference file (--full PATH) is a torch.save() of a plain dict:
  'config'    dict of the settings (vocab: the true size; padded_vocab)
  'tensors'   unsharded tensors in the checkpoint dtype, canonical names:
              embedding.word_embeddings.weight [padded_vocab, h]
              embedding.position_embeddings.weight [max_pos, h] (learned abs.)
              layers.N.input_norm.{weight,bias}   (N global)
              layers.N.attention.qkv.{weight,bias}  grouped layout, as a TP=1
                                                    Megatron checkpoint has it
              layers.N.attention.dense.{weight,bias}
              layers.N.post_norm.{weight,bias}
              layers.N.mlp.fc1.{weight,bias}  ([gate; up] with --swiglu)
              layers.N.mlp.fc2.{weight,bias}
              final_norm.{weight,bias}, output_layer.weight (--untied)
  'unfused'   layers.N.attention.{q,k,v}.{weight,bias} in plain head order and
              layers.N.mlp.{gate,up}.{weight,bias} (--swiglu)
  'optimizer' (with --optimizer/--dist-opt) name -> {'param' (fp32 master),
              'exp_avg', 'exp_avg_sq'}, unsharded like 'tensors'
Every tensor is drawn from its own generator seeded by --seed and its name,
so checkpoints of one model in different layouts agree (the padding rows of
the vocabulary aside), and repeated runs write identical bytes.
"""

import argparse
import collections
import enum
import io
import json
import math
import os
import random
import shutil
import struct
import sys
import tempfile
import types
import zipfile
import zlib

import numpy as np
import torch
import torch.nn.functional as F

DTYPES = {'fp16': torch.float16, 'bf16': torch.bfloat16, 'fp32': torch.float32}
NAMINGS = ('legacy', 'legacy-layernorm', 'core', 'core-local')


# --------------------------------------------------------------------------
# Stand-ins for the Megatron classes that real checkpoints pickle.

_STUBS = None


def install_megatron_stubs():
    """Register stand-in modules megatron.core.enums (ModelType),
    megatron.core.transformer.enums (AttnBackend) and
    megatron.core.rerun_state_machine (RerunMode, RerunState, RerunDiagnostic)
    so that pickles naming them load without Megatron installed."""
    global _STUBS
    if _STUBS is not None:
        return _STUBS

    def module(name):
        mod = types.ModuleType(name)
        sys.modules[name] = mod
        parent, _, leaf = name.rpartition('.')
        if parent:
            setattr(sys.modules[parent], leaf, mod)
        return mod

    for name in ('megatron', 'megatron.core', 'megatron.core.transformer'):
        if name not in sys.modules:
            module(name)
    enums, tenums, rsm = (module('megatron.core.enums'),
                          module('megatron.core.transformer.enums'),
                          module('megatron.core.rerun_state_machine'))

    def make(mod, name, members, base=()):
        cls = enum.Enum(name, members, type=base[0] if base else None,
                        module=mod.__name__, qualname=name)
        # Pickle as cls(value), as CPython 3.6-3.10 and >= 3.11.7 do (the
        # Debian 3.11.2 running this would write getattr(cls, name)).
        cls.__reduce_ex__ = lambda self, proto: (self.__class__, (self._value_,))
        setattr(mod, name, cls)
        return cls

    # Values as in megatron/core/enums.py, megatron/core/transformer/enums.py
    # and megatron/core/rerun_state_machine.py (commit 183f568cf3).
    _STUBS = types.SimpleNamespace(
        ModelType=make(enums, 'ModelType', [('encoder_or_decoder', 1),
                                            ('encoder_and_decoder', 2),
                                            ('retro_encoder', 3),
                                            ('retro_decoder', 4)]),
        AttnBackend=make(tenums, 'AttnBackend', [('flash', 1), ('fused', 2),
                                                 ('unfused', 3), ('local', 4),
                                                 ('auto', 5)]),
        RerunMode=make(rsm, 'RerunMode', [('DISABLED', 'disabled'),
                                          ('VALIDATE_RESULTS', 'validate_results'),
                                          ('REPORT_DETERMINISM_STATS',
                                           'report_determinism_stats')], (str,)),
        RerunState=make(rsm, 'RerunState', [('NOT_RUNNING_YET', 0),
                                            ('INITIAL_RUN', 1),
                                            ('RERUNNING_IN_PLACE', 2),
                                            ('WILL_RERUN_FROM_CHECKPOINT', 3),
                                            ('RERUNNING_FROM_CHECKPOINT', 4),
                                            ('RERUNNING_AGAIN_FROM_CHECKPOINT', 5)]),
        RerunDiagnostic=make(rsm, 'RerunDiagnostic',
                             [('CORRECT_RESULT', 'correct_result'),
                              ('TRANSIENT_ERROR', 'transient_error'),
                              ('PERSISTENT_ERROR', 'persistent_error')], (str,)))
    return _STUBS


# --------------------------------------------------------------------------
# Configuration.

def vocab_size_with_padding(orig, divisible_by, tp):
    """Megatron's _vocab_size_with_padding / vocab_size_with_padding."""
    multiple = divisible_by * tp
    return int(math.ceil(orig / multiple) * multiple)


class Config:
    def __init__(self, o):
        self.tp, self.pp, self.vp = o.tp, o.pp, o.vpp
        self.layers, self.hidden, self.heads = o.layers, o.hidden, o.heads
        self.gqa = o.query_groups is not None
        self.groups = o.query_groups if self.gqa else o.heads
        self.kv_channels = o.hidden // o.heads
        self.ffn = o.ffn
        self.vocab, self.divisible_by = o.vocab, o.make_vocab_size_divisible_by
        self.padded_vocab = vocab_size_with_padding(o.vocab, self.divisible_by, o.tp)
        self.seq = o.seq
        self.max_pos = o.max_position_embeddings or o.seq
        self.swiglu, self.untied = o.swiglu, o.untied
        self.rope, self.rmsnorm = o.rope, o.rmsnorm
        self.rotary_base, self.rope_scaling = o.rotary_base, o.rope_scaling
        self.openai_gelu = o.openai_gelu
        self.bias, self.qkv_bias = not o.no_bias, o.qkv_bias
        self.names, self.dtype_name = o.names, o.dtype
        self.dtype = DTYPES[o.dtype]
        self.optimizer = o.optimizer or o.dist_opt
        self.dist_opt = o.dist_opt
        self.release, self.iteration, self.seed = o.release, o.iteration, o.seed
        self.plain_args, self.te_extra_state = o.plain_args, o.te_extra_state
        self.location = o.location
        self.global_batch = 8
        self.check()

    def check(self):
        def need(cond, msg):
            if not cond:
                raise SystemExit('megatron_fixture: ' + msg)
        need(self.hidden % self.heads == 0, 'hidden must be divisible by heads')
        need(self.heads % self.tp == 0, 'heads must be divisible by tp')
        need(self.heads % self.groups == 0, 'heads must be divisible by query groups')
        if self.groups % self.tp != 0:
            # megatron/legacy/model/transformer.py raises NotImplementedError;
            # Megatron-Core supports groups < tp since f7dfb99795 (2025-12-06).
            need(self.names.startswith('core') and self.tp % self.groups == 0,
                 'query groups must be a multiple of tp (core names also allow '
                 'tp to be a multiple of query groups)')
        need(self.ffn % self.tp == 0, 'ffn must be divisible by tp')
        need(self.layers % (self.pp * self.vp) == 0,
             'layers must be divisible by pp * vpp')
        need(self.vp == 1 or self.pp > 1, 'virtual pipeline needs pp > 1')

    def as_dict(self):
        keys = ('tp', 'pp', 'vp', 'layers', 'hidden', 'heads', 'gqa', 'groups',
                'kv_channels', 'ffn', 'vocab', 'divisible_by', 'padded_vocab',
                'seq', 'max_pos', 'swiglu', 'untied', 'rope', 'rmsnorm', 'bias',
                'qkv_bias', 'names', 'dtype_name', 'optimizer', 'dist_opt',
                'release', 'iteration', 'seed')
        return {k: getattr(self, k) for k in keys}


# --------------------------------------------------------------------------
# The unsharded ("merged") model and optimizer state.

def group_qkv(q, k, v, groups, hn):
    """[q heads; k heads; v heads] -> Megatron's per-group [q.., k_g, v_g]."""
    rest = q.shape[1:]
    q = q.reshape(groups, -1, *rest)
    k = k.reshape(groups, hn, *rest)
    v = v.reshape(groups, hn, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def ungroup_qkv(qkv, heads, groups, hn):
    rest = qkv.shape[1:]
    per = heads // groups
    x = qkv.reshape(groups, (per + 2) * hn, *rest)
    q, k, v = torch.split(x, [per * hn, hn, hn], dim=1)
    return (q.reshape(heads * hn, *rest), k.reshape(groups * hn, *rest),
            v.reshape(groups * hn, *rest))


def make_full(cfg):
    """Canonical fp32 tensors (names as in the module docstring).  Every tensor
    draws from its own generator seeded by (--seed, name), so the values do
    not depend on the parallel layout: the rows of the real vocabulary are
    the same whatever padding the TP size asks for."""
    h, hn = cfg.hidden, cfg.kv_channels
    T, U = collections.OrderedDict(), collections.OrderedDict()

    def rnd(name, *shape, scale=0.02, uniform=False):
        gen = torch.Generator().manual_seed(cfg.seed * 1000003 + zlib.crc32(name.encode()))
        draw = torch.rand if uniform else torch.randn
        return draw(*shape, generator=gen) * scale

    def vocab_table(name):
        rows = rnd(name, cfg.vocab, h)
        pad = rnd(name + '#padding', cfg.padded_vocab - cfg.vocab, h)
        T[name] = torch.cat([rows, pad])

    def norm(name):
        T[name + '.weight'] = 1.0 + rnd(name + '.weight', h, scale=0.1)
        if not cfg.rmsnorm:
            T[name + '.bias'] = rnd(name + '.bias', h)

    def fused(name, parts, rows, combine, cond=True):
        """Generate unfused parts, store them in U and their fusion in T."""
        for suffix, shape in (('weight', (h,)), ('bias', ())):
            if suffix == 'bias' and not cond:
                continue
            for part, n in zip(parts, rows):
                U['%s.%s.%s' % (name, part, suffix)] = rnd('%s.%s.%s' % (name, part, suffix),
                                                          n, *shape)
            yield suffix, combine(*[U['%s.%s.%s' % (name, part, suffix)] for part in parts])

    vocab_table('embedding.word_embeddings.weight')
    if not cfg.rope:
        T['embedding.position_embeddings.weight'] = rnd('embedding.position_embeddings.weight',
                                                        cfg.max_pos, h)
    for i in range(cfg.layers):
        p = 'layers.%d.' % i
        norm(p + 'input_norm')
        for suffix, t in fused(p + 'attention', 'qkv', (cfg.heads * hn, cfg.groups * hn,
                                                         cfg.groups * hn),
                               lambda q, k, v: group_qkv(q, k, v, cfg.groups, hn),
                               cfg.bias or cfg.qkv_bias):
            T[p + 'attention.qkv.' + suffix] = t
        T[p + 'attention.dense.weight'] = rnd(p + 'attention.dense.weight', h, cfg.heads * hn)
        if cfg.bias:
            T[p + 'attention.dense.bias'] = rnd(p + 'attention.dense.bias', h)
        norm(p + 'post_norm')
        if cfg.swiglu:
            for suffix, t in fused(p + 'mlp', ('gate', 'up'), (cfg.ffn, cfg.ffn),
                                   lambda g, u: torch.cat([g, u]), cfg.bias):
                T[p + 'mlp.fc1.' + suffix] = t
        else:
            T[p + 'mlp.fc1.weight'] = rnd(p + 'mlp.fc1.weight', cfg.ffn, h)
            if cfg.bias:
                T[p + 'mlp.fc1.bias'] = rnd(p + 'mlp.fc1.bias', cfg.ffn)
        T[p + 'mlp.fc2.weight'] = rnd(p + 'mlp.fc2.weight', h, cfg.ffn)
        if cfg.bias:
            T[p + 'mlp.fc2.bias'] = rnd(p + 'mlp.fc2.bias', h)
    norm('final_norm')
    if cfg.untied:
        vocab_table('output_layer.weight')

    opt = None
    if cfg.optimizer:
        opt = collections.OrderedDict(
            (name, {'param': t.clone(),
                    'exp_avg': rnd(name + '#exp_avg', *t.shape, scale=1e-3),
                    'exp_avg_sq': rnd(name + '#exp_avg_sq', *t.shape, scale=1e-6,
                                      uniform=True)})
            for name, t in T.items())
    return T, U, opt


def split_kind(name, cfg):
    """How Megatron splits a canonical tensor across TP ranks."""
    if name in ('embedding.word_embeddings.weight', 'output_layer.weight'):
        return 'vocab'                       # VocabParallelEmbedding / column
    if name.endswith(('attention.qkv.weight', 'attention.qkv.bias')):
        return 'col'
    if name.endswith(('mlp.fc1.weight', 'mlp.fc1.bias')):
        return 'glu' if cfg.swiglu else 'col'
    if name.endswith(('attention.dense.weight', 'mlp.fc2.weight')):
        return 'row'
    return 'rep'                             # norms, row biases, positions


def shard(t, kind, tp, r):
    if kind in ('vocab', 'col'):
        part = t.chunk(tp, 0)[r]
    elif kind == 'row':
        part = t.chunk(tp, 1)[r]
    elif kind == 'glu':
        gate, up = t.chunk(2, 0)
        part = torch.cat([gate.chunk(tp, 0)[r], up.chunk(tp, 0)[r]])
    else:
        part = t
    return part.contiguous().clone()


def merge(parts, kind):
    """Inverse of shard(), written the way tools/checkpoint's loaders do it."""
    if kind in ('vocab', 'col'):
        return torch.cat(parts, 0)
    if kind == 'row':
        return torch.cat(parts, 1)
    if kind == 'glu':
        halves = [p.chunk(2, 0) for p in parts]
        return torch.cat([torch.cat([g for g, _ in halves]),
                          torch.cat([u for _, u in halves])])
    for p in parts[1:]:
        if not torch.equal(p, parts[0]):
            raise AssertionError('replicated tensor differs across TP ranks')
    return parts[0]


# --------------------------------------------------------------------------
# Naming schemes.  Each layer is a list of (module path, [(leaf, canonical
# suffix)], extra) in module registration order; extra is None (no
# _extra_state), 'none' (Megatron-Core local linear: _extra_state = None) or
# 'te' (Transformer Engine module).

def _legacy_layer(inorm, pnorm, extra):
    return [
        (inorm, [('weight', 'input_norm.weight'), ('bias', 'input_norm.bias')], None),
        ('self_attention.query_key_value', [('weight', 'attention.qkv.weight'),
                                            ('bias', 'attention.qkv.bias')], extra),
        ('self_attention.dense', [('weight', 'attention.dense.weight'),
                                  ('bias', 'attention.dense.bias')], extra),
        (pnorm, [('weight', 'post_norm.weight'), ('bias', 'post_norm.bias')], None),
        ('mlp.dense_h_to_4h', [('weight', 'mlp.fc1.weight'), ('bias', 'mlp.fc1.bias')], extra),
        ('mlp.dense_4h_to_h', [('weight', 'mlp.fc2.weight'), ('bias', 'mlp.fc2.bias')], extra),
    ]


LAYER_SCHEMA = {
    'legacy': _legacy_layer('input_norm', 'post_attention_norm', 'none'),
    'legacy-layernorm': _legacy_layer('input_layernorm', 'post_attention_layernorm', None),
    'core': [
        ('self_attention.core_attention', [], 'te'),
        ('self_attention.linear_proj', [('weight', 'attention.dense.weight'),
                                        ('bias', 'attention.dense.bias')], 'te'),
        ('self_attention.linear_qkv', [('layer_norm_weight', 'input_norm.weight'),
                                       ('layer_norm_bias', 'input_norm.bias'),
                                       ('weight', 'attention.qkv.weight'),
                                       ('bias', 'attention.qkv.bias')], 'te'),
        ('mlp.linear_fc1', [('layer_norm_weight', 'post_norm.weight'),
                            ('layer_norm_bias', 'post_norm.bias'),
                            ('weight', 'mlp.fc1.weight'), ('bias', 'mlp.fc1.bias')], 'te'),
        ('mlp.linear_fc2', [('weight', 'mlp.fc2.weight'), ('bias', 'mlp.fc2.bias')], 'te'),
    ],
    'core-local': [
        ('input_layernorm', [('weight', 'input_norm.weight'), ('bias', 'input_norm.bias')], None),
        ('self_attention.linear_proj', [('weight', 'attention.dense.weight'),
                                        ('bias', 'attention.dense.bias')], 'none'),
        ('self_attention.linear_qkv', [('weight', 'attention.qkv.weight'),
                                       ('bias', 'attention.qkv.bias')], 'none'),
        ('pre_mlp_layernorm', [('weight', 'post_norm.weight'), ('bias', 'post_norm.bias')], None),
        ('mlp.linear_fc1', [('weight', 'mlp.fc1.weight'), ('bias', 'mlp.fc1.bias')], 'none'),
        ('mlp.linear_fc2', [('weight', 'mlp.fc2.weight'), ('bias', 'mlp.fc2.bias')], 'none'),
    ],
}

FINAL_NORM = {'legacy': 'final_norm', 'legacy-layernorm': 'final_layernorm',
              'core': 'decoder.final_layernorm', 'core-local': 'decoder.final_layernorm'}


def chunk_layout(cfg, pp_rank, vp_rank):
    """Global layer numbers and pre/post flags of one model chunk."""
    per_chunk = cfg.layers // (cfg.pp * cfg.vp)
    first = vp_rank * (cfg.layers // cfg.vp) + pp_rank * per_chunk
    pre = pp_rank == 0 and vp_rank == 0
    post = pp_rank == cfg.pp - 1 and vp_rank == cfg.vp - 1
    return list(range(first, first + per_chunk)), pre, post


def chunk_entries(cfg, pp_rank, vp_rank, have):
    """[(container, key, canonical or None, extra)] for one model chunk.

    container is the path of nested dicts Megatron builds by hand (legacy) or
    () (core); key is the module.state_dict() key inside it."""
    layers, pre, post = chunk_layout(cfg, pp_rank, vp_rank)
    legacy = cfg.names.startswith('legacy')
    enc = ('language_model', 'encoder') if legacy else ()
    lp = 'layers.%d.' if legacy else 'decoder.layers.%d.'
    out = []

    def module(container, path, params, extra, canon_prefix=''):
        for leaf, canon in params:
            if canon_prefix + canon in have:
                out.append((container, (path + '.' if path else '') + leaf,
                            canon_prefix + canon, None))
        if extra:
            out.append((container, (path + '.' if path else '') + '_extra_state',
                        None, extra))

    if pre:
        if legacy:
            module(('language_model', 'embedding', 'word_embeddings'), '',
                   [('weight', 'embedding.word_embeddings.weight')], None)
            module(('language_model', 'embedding', 'position_embeddings'), '',
                   [('weight', 'embedding.position_embeddings.weight')], None)
        else:
            module((), 'embedding.word_embeddings',
                   [('weight', 'embedding.word_embeddings.weight')], None)
            module((), 'embedding.position_embeddings',
                   [('weight', 'embedding.position_embeddings.weight')], None)
    for j, i in enumerate(layers):
        for path, params, extra in LAYER_SCHEMA[cfg.names]:
            if extra == 'te':
                extra = 'te-' + cfg.te_extra_state
            module(enc, lp % j + path, params, extra, 'layers.%d.' % i)
    if post:
        module(enc, FINAL_NORM[cfg.names], [('weight', 'final_norm.weight'),
                                            ('bias', 'final_norm.bias')], None)
        tied_copy = not cfg.untied and not pre      # pp > 1, tied embeddings
        if legacy:
            if cfg.untied:
                module(('language_model', 'output_layer'), '',
                       [('weight', 'output_layer.weight')],
                       'none' if cfg.names == 'legacy' else None)
            if tied_copy:
                module(('word_embeddings_for_head',), '',
                       [('weight', 'embedding.word_embeddings.weight')], None)
        else:
            head = 'output_layer.weight' if cfg.untied else 'embedding.word_embeddings.weight'
            module((), 'output_layer',
                   [('weight', head)] if cfg.untied or tied_copy else [], 'none')
    return out


# Megatron-Core's ColumnParallelLinear / RowParallelLinear override
# get_extra_state() to return None (commit efbfb5f05e, 2023-12-19); Transformer
# Engine modules return an empty uint8 tensor when FP8 is unused (TE >= 2.0) or,
# before that, an io.BytesIO holding torch.save(None).
class _Module(torch.nn.Module):
    pass


class _ExtraNone(torch.nn.Module):
    def get_extra_state(self):
        return None

    def set_extra_state(self, state):
        pass


class _ExtraTETensor(_ExtraNone):
    def get_extra_state(self):
        return torch.empty(0, dtype=torch.uint8)


class _ExtraTEBytesIO(_ExtraNone):
    def get_extra_state(self):
        buf = io.BytesIO()
        torch.save(None, buf)
        buf.seek(0)
        return buf


EXTRA_CLASS = {'none': _ExtraNone, 'te-tensor': _ExtraTETensor,
               'te-bytesio': _ExtraTEBytesIO}


def module_state_dict(items):
    """Build an nn.Module tree from [(key, tensor or extra kind)] and return
    its state_dict(), so ordering, '_metadata' and '_extra_state' come out
    exactly as torch writes them for Megatron's modules."""
    classes = {}
    for key, value in items:
        path, _, leaf = key.rpartition('.')
        if leaf == '_extra_state':
            classes[path] = EXTRA_CLASS[value]
    root = classes.get('', _Module)()
    for key, value in items:
        path, _, leaf = key.rpartition('.')
        mod, walked = root, []
        for part in path.split('.') if path else []:
            walked.append(part)
            if part not in mod._modules:
                mod.add_module(part, classes.get('.'.join(walked), _Module)())
            mod = mod._modules[part]
        if leaf != '_extra_state':
            mod.register_parameter(leaf, torch.nn.Parameter(value, requires_grad=False))
    return root.state_dict()


# --------------------------------------------------------------------------
# Distributed-optimizer buffer layout (megatron/core/distributed/
# param_and_grad_buffer.py after afb755f548, 2025-05-05; moved to
# DistributedOptimizer._compute_per_buffer_param_layout in 55b8111ad8):
# parameters in reverse order, each start padded to 64 elements, bucket end
# padded to lcm(dp, 128); a shared-embedding parameter gets a bucket of its
# own and starts at the padded end of the previous bucket.  bucket_size is
# None (no --overlap-grad-reduce) and dp == 1 here.

def buffer_layout(params, dp=1):
    """params: [(numel, shared_embedding)] in model order.
    Returns ([(start, end)] per param, [(bucket_start, bucket_end,
    numel_unpadded)], total numel)."""
    def pad(n, d):
        return int(math.ceil(n / d) * d)
    index, buckets = [None] * len(params), []
    start = bucket_start = 0
    in_bucket = 0
    end = 0
    for idx in reversed(range(len(params))):
        numel, shared = params[idx]
        start = pad(start, 64)
        if shared:
            if in_bucket:
                bend = pad(start, math.lcm(dp, 128))
                buckets.append((bucket_start, bend, start - bucket_start))
                bucket_start, in_bucket, start = bend, 0, bend
        end = start + numel
        index[idx] = (start, end)
        in_bucket += 1
        if shared:
            bend = pad(end, math.lcm(dp, 128))
            buckets.append((bucket_start, bend, end - bucket_start))
            bucket_start, in_bucket, start = bend, 0, bend
        else:
            start = end
    if in_bucket:
        buckets.append((bucket_start, pad(end, math.lcm(dp, 128)), end - bucket_start))
    return index, buckets, buckets[-1][1]


# --------------------------------------------------------------------------
# Writing.

def make_args(cfg, stubs):
    """argparse.Namespace with the fields Megatron and tools/checkpoint read."""
    a = collections.OrderedDict()
    a['num_layers'] = cfg.layers
    a['encoder_num_layers'] = cfg.layers
    a['hidden_size'] = cfg.hidden
    a['ffn_hidden_size'] = cfg.ffn
    a['num_attention_heads'] = cfg.heads
    a['group_query_attention'] = cfg.gqa
    a['num_query_groups'] = cfg.groups if cfg.gqa else 1   # argparse default 1
    a['kv_channels'] = cfg.kv_channels
    a['max_position_embeddings'] = cfg.max_pos
    a['position_embedding_type'] = 'rope' if cfg.rope else 'learned_absolute'
    a['add_position_embedding'] = not cfg.rope
    a['use_rotary_position_embeddings'] = cfg.rope
    a['rotary_base'] = cfg.rotary_base
    a['rotary_percent'] = 1.0
    a['rotary_interleaved'] = False
    a['use_rope_scaling'] = cfg.rope_scaling > 0
    a["rotary_scaling_factor"] = cfg.rope_scaling if cfg.rope_scaling > 0 else 8.0
    a['normalization'] = 'RMSNorm' if cfg.rmsnorm else 'LayerNorm'
    a['norm_epsilon'] = 1e-5
    a['apply_layernorm_1p'] = False
    a['add_bias_linear'] = cfg.bias
    a['add_qkv_bias'] = cfg.qkv_bias
    a['swiglu'] = cfg.swiglu
    a['squared_relu'] = False
    a['openai_gelu'] = cfg.openai_gelu
    a['untie_embeddings_and_output_weights'] = cfg.untied
    a['apply_query_key_layer_scaling'] = False
    a['attention_dropout'] = 0.1
    a['hidden_dropout'] = 0.1
    a['init_method_std'] = 0.02
    a['seq_length'] = cfg.seq
    a['encoder_seq_length'] = cfg.seq
    a['vocab_size'] = None
    a['padded_vocab_size'] = cfg.padded_vocab
    a['make_vocab_size_divisible_by'] = cfg.divisible_by
    a['tokenizer_type'] = 'GPT2BPETokenizer'
    a['vocab_file'] = 'gpt2-vocab.json'
    a['merge_file'] = 'gpt2-merges.txt'
    a['tokenizer_model'] = None
    a['bert_binary_head'] = True
    a['tensor_model_parallel_size'] = cfg.tp
    a['pipeline_model_parallel_size'] = cfg.pp
    a['virtual_pipeline_model_parallel_size'] = cfg.vp if cfg.vp > 1 else None
    a['num_layers_per_virtual_pipeline_stage'] = \
        cfg.layers // (cfg.pp * cfg.vp) if cfg.vp > 1 else None
    a['overlap_p2p_comm'] = cfg.vp > 1 and cfg.pp == 2
    a['expert_model_parallel_size'] = 1
    a['context_parallel_size'] = 1
    a['sequence_parallel'] = False
    a['data_parallel_size'] = 1
    a['world_size'] = cfg.tp * cfg.pp
    a['rank'] = 0
    a['num_experts'] = None
    a['fp16'] = cfg.dtype == torch.float16
    a['bf16'] = cfg.dtype == torch.bfloat16
    a['params_dtype'] = cfg.dtype
    a['accumulate_allreduce_grads_in_fp32'] = cfg.dtype == torch.bfloat16
    a['loss_scale'] = None
    a['initial_loss_scale'] = 2.0 ** 32
    a['use_distributed_optimizer'] = cfg.dist_opt
    a['optimizer'] = 'adam'
    a['lr'] = 3e-4
    a['min_lr'] = 3e-5
    a['lr_decay_style'] = 'cosine'
    a['lr_warmup_iters'] = 10
    a['weight_decay'] = 0.01
    a['adam_beta1'] = 0.9
    a['adam_beta2'] = 0.999
    a['adam_eps'] = 1e-8
    a['clip_grad'] = 1.0
    a['micro_batch_size'] = 1
    a['global_batch_size'] = cfg.global_batch
    a['train_iters'] = 2 * max(cfg.iteration, 1)
    a['seed'] = 1234 + cfg.seed
    a['data_parallel_random_init'] = False
    a['iteration'] = cfg.iteration
    a['consumed_train_samples'] = cfg.iteration * cfg.global_batch
    a['consumed_valid_samples'] = 0
    a['ckpt_format'] = 'torch'
    a['use_dist_ckpt'] = False
    a['save'] = '/checkpoints'
    a['load'] = None
    a['save_interval'] = 1000
    a['no_save_optim'] = not cfg.optimizer
    a['no_save_rng'] = False
    a['use_legacy_models'] = cfg.names.startswith('legacy')
    a['use_mcore_models'] = not cfg.names.startswith('legacy')
    a['transformer_impl'] = 'transformer_engine' if cfg.names == 'core' else 'local'
    a['spec'] = None
    if stubs is not None:
        a['attention_backend'] = stubs.AttnBackend.auto
        a['model_type'] = stubs.ModelType.encoder_or_decoder
    return argparse.Namespace(**a)


def rng_state(cfg, tp_rank, pp_rank):
    """One rank's RNG dict, seeded like megatron/training/initialize.py."""
    seed = 1234 + cfg.seed + 100 * pp_rank

    def cuda_state(s, offset):       # torch >= 2: 8-byte seed + 8-byte offset
        return torch.tensor(list(struct.pack('<Qq', s, offset)), dtype=torch.uint8)
    pyr, npr = random.Random(seed), np.random.RandomState(seed)
    gen = torch.Generator().manual_seed(seed)
    pyr.random(), npr.random_sample(), torch.rand(3, generator=gen)
    off = 4 * cfg.iteration
    return {
        'random_rng_state': pyr.getstate(),
        'np_rng_state': npr.get_state(),
        'torch_rng_state': gen.get_state(),
        'cuda_rng_state': cuda_state(seed, off),
        'rng_tracker_states': {
            'data-parallel-rng': cuda_state(seed, off),
            'model-parallel-rng': cuda_state(seed + 2718 + tp_rank, off),
            'expert-parallel-rng': cuda_state(seed + 1024, off),
        },
    }


def rerun_state(cfg, stubs):
    return [{
        'mode': stubs.RerunMode.DISABLED,
        'state': stubs.RerunState.NOT_RUNNING_YET,
        'current_iteration': cfg.iteration,
        'rerun_requested': False,
        'checkpoint_requested': False,
        'restart_again_requested': False,
        'continue_requested': False,
        'error_injector_checkpoint': {
            'error_injection_rate': 0,
            'error_injection_type': stubs.RerunDiagnostic.TRANSIENT_ERROR,
            'injected_error_type': None},
        'failed_validation_call': None,
        'initial_result': None,
        'suspicious_node': None,
        'suspicious_device': None,
        'data_iterator_checkpoints': None,
        'last_loss': None,
    }]


def no_weight_decay(key, t):
    # megatron/core/optimizer/__init__.py _get_param_groups default rule
    return key.endswith('.bias') or t.dim() == 1


def param_groups_of(keyed):
    """Group [(key, tensor)] like _get_param_groups; returns [(wd_mult, [idx])]."""
    groups = collections.OrderedDict()
    for idx, (key, t) in enumerate(keyed):
        groups.setdefault(0.0 if no_weight_decay(key, t) else 1.0, []).append(idx)
    return list(groups.items())


def adam_group(cfg, wd_mult, params):
    # Megatron's group keys, then apex/TE FusedAdam defaults, then 'step'
    # (FusedAdam keeps it per group); torch puts 'params' last.
    g = collections.OrderedDict()
    for k, v in (('wd_mult', wd_mult), ('lr_mult', 1.0), ('is_expert_parallel', False),
                 ('is_decoupled_lr', False), ('max_lr', 3e-4), ('min_lr', 3e-5),
                 ('lr', 1.5e-4), ('bias_correction', True), ('betas', (0.9, 0.999)),
                 ('eps', 1e-8), ('weight_decay', 0.01 * wd_mult), ('step', cfg.iteration)):
        g[k] = v
    if params is not None:
        g['params'] = params
    return dict(g)


# Real checkpoints are saved from GPU memory, so the persistent ids of model
# and optimizer storages name 'cuda:<local rank>'; RNG states are CPU tensors.
# A tagger registered ahead of torch's own reproduces that without a GPU, and
# a loader hook keeps such storages on the CPU when no GPU is present.
_FAKE_LOCATIONS = {}


def _fake_location_tag(storage):
    return _FAKE_LOCATIONS.get(storage.data_ptr())


def _keep_on_cpu(storage, location):
    if location.startswith('cuda') and not torch.cuda.is_available():
        return storage
    return None


def save_with_locations(obj, path, on_gpu, location):
    """torch.save(obj, path) tagging the tensors inside on_gpu as location."""
    if not getattr(save_with_locations, 'registered', False):
        torch.serialization.register_package(1, _fake_location_tag, _keep_on_cpu)
        save_with_locations.registered = True
    _FAKE_LOCATIONS.clear()

    def walk(x):
        if isinstance(x, torch.Tensor):
            if x.numel():
                _FAKE_LOCATIONS[x.storage().data_ptr()] = location
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
    if location != 'cpu':
        for x in on_gpu:
            walk(x)
    try:
        torch.serialization.save(obj, path)
    finally:
        _FAKE_LOCATIONS.clear()


def write_checkpoint(cfg, outdir, full, opt):
    stubs = None if cfg.plain_args else install_megatron_stubs()
    sub = 'release' if cfg.release else 'iter_%07d' % cfg.iteration
    os.makedirs(os.path.join(outdir, sub), exist_ok=True)
    args = make_args(cfg, stubs)
    n_params = sum(t.numel() for t in full.values())
    for pp_rank in range(cfg.pp):
        for tp_rank in range(cfg.tp):
            path = os.path.join(outdir, sub, rank_dir(cfg.pp, tp_rank, pp_rank))
            os.makedirs(path, exist_ok=True)
            sd = {'args': args, 'checkpoint_version': 3.0, 'iteration': cfg.iteration}
            rank_params = []           # [(key, canonical, model tensor)] in model order
            buffers = []               # per chunk, for --dist-opt
            for vp_rank in range(cfg.vp):
                entries = chunk_entries(cfg, pp_rank, vp_rank, full)
                tensors = [shard(full[c], split_kind(c, cfg), cfg.tp, tp_rank).to(cfg.dtype)
                           if c else None for _, _, c, _ in entries]
                if cfg.dist_opt:
                    plist = [(t.numel(), c == 'embedding.word_embeddings.weight'
                              and cfg.pp > 1 and not cfg.untied)
                             for t, (_, _, c, _) in zip(tensors, entries) if c]
                    index, buckets, total = buffer_layout(plist)
                    flat = torch.zeros(total, dtype=cfg.dtype)
                    views, k = [], 0
                    for t in tensors:
                        if t is None:
                            views.append(None)
                            continue
                        s, e = index[k]
                        flat[s:e].copy_(t.reshape(-1))
                        views.append(flat[s:e].view(t.shape))
                        k += 1
                    tensors = views
                    buffers.append((index, buckets, total))
                containers = collections.OrderedDict()
                for (cont, key, canon, extra), t in zip(entries, tensors):
                    containers.setdefault(cont, []).append((key, extra if canon is None else t))
                    if canon:
                        rank_params.append((key, canon, t))
                model = {}
                for cont, items in containers.items():
                    sdict = module_state_dict(items)
                    if not cont:
                        model = sdict
                        continue
                    node = model
                    for part in cont[:-1]:
                        node = node.setdefault(part, {})
                    node[cont[-1]] = sdict
                sd['model' if cfg.vp == 1 else 'model%d' % vp_rank] = model
            if cfg.optimizer:
                sd['optimizer'] = optimizer_state(cfg, rank_params, opt, tp_rank, outdir,
                                                  sub, pp_rank, buffers)
                steps = cfg.iteration * cfg.global_batch
                sd['opt_param_scheduler'] = {
                    'max_lr': 3e-4, 'lr_warmup_steps': 10 * cfg.global_batch,
                    'num_steps': steps, 'lr_decay_style': 'cosine',
                    'lr_decay_steps': 2 * max(cfg.iteration, 1) * cfg.global_batch,
                    'min_lr': 3e-5, 'start_wd': 0.01, 'end_wd': 0.01,
                    'wd_incr_style': 'constant',
                    'wd_incr_steps': 2 * max(cfg.iteration, 1) * cfg.global_batch}
            if stubs is not None:
                sd['rerun_state_machine'] = rerun_state(cfg, stubs)
            sd['rng_state'] = [rng_state(cfg, tp_rank, pp_rank)]
            sd['num_floating_point_operations_so_far'] = \
                6.0 * n_params * cfg.seq * cfg.global_batch * cfg.iteration
            gpu = 'cpu' if cfg.location == 'cpu' else 'cuda:%d' % ((pp_rank * cfg.tp + tp_rank) % 8)
            save_with_locations(sd, os.path.join(path, 'model_optim_rng.pt'),
                                [v for k, v in sd.items() if k.startswith(('model', 'optim'))],
                                gpu)
    with open(os.path.join(outdir, 'latest_checkpointed_iteration.txt'), 'w') as f:
        f.write('release' if cfg.release else str(cfg.iteration))


def rank_dir(pp, tp_rank, pp_rank):
    if pp == 1:
        return 'mp_rank_%02d' % tp_rank
    return 'mp_rank_%02d_%03d' % (tp_rank, pp_rank)


def optimizer_state(cfg, rank_params, opt, tp_rank, outdir, sub, pp_rank, buffers):
    """Megatron's Float16OptimizerWithFloat16Params / FP32Optimizer /
    DistributedOptimizer state_dict() for one rank."""
    def part(canon, key):
        return shard(opt[canon][key], split_kind(canon, cfg), cfg.tp, tp_rank)
    groups = param_groups_of([(k, t) for k, _, t in rank_params])
    order = [i for _, idxs in groups for i in idxs]     # torch's packed index order
    scaler = {'scale': torch.tensor(65536.0), 'growth_tracker': 0,
              'hysteresis_tracker': 2} if cfg.dtype == torch.float16 else None
    if cfg.dist_opt:
        out = {'optimizer': {'param_groups': [adam_group(cfg, wd, None) for wd, _ in groups]}}
        if scaler:
            out['grad_scaler'] = scaler
        write_distrib_optim(cfg, rank_params, part, buffers, os.path.join(
            outdir, sub, rank_dir(cfg.pp, tp_rank, pp_rank), 'distrib_optim.pt'))
        return out
    state, packed, n = {}, [], 0
    for wd, idxs in groups:
        packed.append(adam_group(cfg, wd, list(range(n, n + len(idxs)))))
        n += len(idxs)
    for new, i in enumerate(order):
        canon = rank_params[i][1]
        state[new] = {'exp_avg': part(canon, 'exp_avg'), 'exp_avg_sq': part(canon, 'exp_avg_sq')}
    inner = {'state': state, 'param_groups': packed}
    if cfg.dtype == torch.float32:
        return inner                                   # FP32Optimizer
    out = {'optimizer': inner}
    if scaler:
        out['grad_scaler'] = scaler
    out['fp32_from_fp16_params'] = [[part(rank_params[i][1], 'param') for i in idxs]
                                    for _, idxs in groups]
    return out


def write_distrib_optim(cfg, rank_params, part, buffers, path):
    """DistributedOptimizer.save_parameter_state() with dp == 1."""
    grad_dtype = torch.float32 if cfg.dtype != torch.float16 else torch.float16
    state, k = {'buckets_coalesced': True}, 0
    for gbuf_idx, (index, buckets, _) in enumerate(buffers):
        numel_unpadded = sum(b[2] for b in buckets)
        world = {key: torch.zeros(numel_unpadded, dtype=torch.float32)
                 for key in ('param', 'exp_avg', 'exp_avg_sq')}
        world['numel_unpadded'] = numel_unpadded
        for start, end in index:
            canon = rank_params[k][1]
            k += 1
            offset = 0                   # world tensors drop inter-bucket padding
            for bstart, bend, unpadded in buckets:
                if bstart <= start < bend:
                    break
                offset += unpadded
            for key in ('param', 'exp_avg', 'exp_avg_sq'):
                world[key][offset + start - bstart:offset + end - bstart] = \
                    part(canon, key).reshape(-1)
        state[gbuf_idx] = {(cfg.dtype, grad_dtype): world}
    torch.save(state, path)


def write_full(cfg, path, full, unfused, opt):
    ref = {'config': cfg.as_dict(),
           'tensors': collections.OrderedDict((k, v.to(cfg.dtype)) for k, v in full.items()),
           'unfused': collections.OrderedDict((k, v.to(cfg.dtype)) for k, v in unfused.items())}
    if opt is not None:
        ref['optimizer'] = opt
    torch.save(ref, path)


# --------------------------------------------------------------------------
# Reading back (the self-check): an independent merge in the manner of
# tools/checkpoint/loader_megatron.py and loader_mcore.py.

def zip_layout_check(path):
    """torch.save zip: archive-name prefix, data.pkl, version, data/N records
    stored uncompressed at 64-byte aligned offsets."""
    prefix = os.path.splitext(os.path.basename(path))[0] + '/'
    with open(path, 'rb') as f:
        raw = f.read()
    z = zipfile.ZipFile(io.BytesIO(raw))
    names = z.namelist()
    assert names[0] == prefix + 'data.pkl', names[:2]
    assert prefix + 'version' in names or prefix + '.data/version' in names
    for info in z.infolist():
        assert info.filename.startswith(prefix)
        assert info.compress_type == zipfile.ZIP_STORED
        fn_len, extra_len = struct.unpack('<HH', raw[info.header_offset + 26:
                                                     info.header_offset + 30])
        data_at = info.header_offset + 30 + fn_len + extra_len
        if info.filename.startswith(prefix + 'data/'):
            assert data_at % 64 == 0, (info.filename, data_at)
    assert z.read(prefix + 'data.pkl')[:2] == b'\x80\x02'   # pickle protocol 2


def flatten(model):
    """Yield (container tuple, key, value) from a chunk's model dict."""
    if 'language_model' in model or 'word_embeddings_for_head' in model:
        def walk(node, path):
            if isinstance(node, collections.OrderedDict):   # module.state_dict()
                for k, v in node.items():
                    yield path, k, v
            else:
                for k, v in node.items():
                    yield from walk(v, path + (k,))
        yield from walk(model, ())
    else:
        for k, v in model.items():
            yield (), k, v


def reverse_names(names):
    """Per-scheme map from (container, key suffix) to canonical suffix."""
    legacy = names.startswith('legacy')
    layer = {}
    for path, params, _ in LAYER_SCHEMA[names]:
        for leaf, canon in params:
            layer[path + '.' + leaf] = canon
    fn = FINAL_NORM[names]
    top = {(('language_model', 'embedding', 'word_embeddings') if legacy else (),
            'weight' if legacy else 'embedding.word_embeddings.weight'):
           'embedding.word_embeddings.weight',
           (('language_model', 'embedding', 'position_embeddings') if legacy else (),
            'weight' if legacy else 'embedding.position_embeddings.weight'):
           'embedding.position_embeddings.weight',
           (('language_model', 'encoder') if legacy else (), fn + '.weight'): 'final_norm.weight',
           (('language_model', 'encoder') if legacy else (), fn + '.bias'): 'final_norm.bias',
           (('language_model', 'output_layer') if legacy else (),
            'weight' if legacy else 'output_layer.weight'): 'output_layer.weight',
           (('word_embeddings_for_head',), 'weight'): 'embedding.word_embeddings.weight'}
    return layer, top, (('language_model', 'encoder') if legacy else ()), \
        ('layers.' if legacy else 'decoder.layers.')


def detect_names(model, args):
    keys = [k for _, k, _ in flatten(model)]
    if 'language_model' in model or 'word_embeddings_for_head' in model:
        if any('input_layernorm' in k or 'final_layernorm' in k for k in keys):
            return 'legacy-layernorm'
        return 'legacy'
    return 'core' if any('linear_qkv.layer_norm_weight' in k or 'core_attention._extra_state'
                         in k for k in keys) or getattr(args, 'transformer_impl', '') == \
        'transformer_engine' else 'core-local'


def rank_params(sd, pp_rank):
    """One file's parameters per model chunk: [(key, canonical, tensor,
    is the tied head copy)], in state-dict (= named_parameters) order."""
    args = sd['args']
    L, pp = args.num_layers, args.pipeline_model_parallel_size
    vp = args.virtual_pipeline_model_parallel_size or 1
    chunks = []
    for v in range(vp):
        model = sd['model'] if vp == 1 else sd['model%d' % v]
        names = detect_names(model, args)
        layer_map, top, enc, lp = reverse_names(names)
        base = v * (L // vp) + pp_rank * (L // (pp * vp))     # first global layer
        out, local = [], set()
        for cont, key, value in flatten(model):
            if key.endswith('_extra_state'):
                check_extra(names, key, value)
                continue
            if cont == enc and key.startswith(lp):
                j, rest = key[len(lp):].split('.', 1)
                local.add(int(j))
                canon = 'layers.%d.%s' % (base + int(j), layer_map[rest])
            else:
                canon = top[(cont, key)]
            head = cont == ('word_embeddings_for_head',) or (
                key == 'output_layer.weight' and not args.untie_embeddings_and_output_weights)
            out.append((key, canon, value, head))
        assert local == set(range(L // (pp * vp))), sorted(local)
        chunks.append(out)
    return chunks


def read_checkpoint(root):
    """Merge a legacy checkpoint directory into canonical tensors.

    Returns (args, merged tensors, merged optimizer state or None, files)."""
    with open(os.path.join(root, 'latest_checkpointed_iteration.txt')) as f:
        tag = f.read().strip()
    sub = 'release' if tag == 'release' else 'iter_%07d' % int(tag)
    subdirs = sorted(os.listdir(os.path.join(root, sub)))
    first = os.path.join(root, sub, subdirs[0], 'model_optim_rng.pt')
    args = torch.load(first, map_location='cpu', weights_only=False)['args']
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    assert subdirs == sorted(rank_dir(pp, t, p) for t in range(tp) for p in range(pp)), subdirs
    parts = collections.defaultdict(lambda: [None] * tp)     # canonical -> per rank
    opt_parts = collections.defaultdict(lambda: [None] * tp)
    head_copies, files = [], []
    for pp_rank in range(pp):
        for tp_rank in range(tp):
            files.append(os.path.join(root, sub, rank_dir(pp, tp_rank, pp_rank),
                                      'model_optim_rng.pt'))
            sd = torch.load(files[-1], map_location='cpu', weights_only=False)
            assert list(sd)[:3] == ['args', 'checkpoint_version', 'iteration']
            assert sd['checkpoint_version'] == 3.0
            chunks = rank_params(sd, pp_rank)
            for key, canon, value, head in (p for c in chunks for p in c):
                if head:
                    head_copies.append((tp_rank, value))
                    continue
                assert parts[canon][tp_rank] is None, canon
                parts[canon][tp_rank] = value
            if 'optimizer' in sd:
                read_optimizer(sd, chunks, tp_rank, pp_rank, files[-1], opt_parts)
    swiglu = types.SimpleNamespace(swiglu=args.swiglu)
    merged = collections.OrderedDict()
    for canon, ps in parts.items():
        assert all(p is not None for p in ps), canon
        merged[canon] = merge(ps, split_kind(canon, swiglu))
    if head_copies:
        copy = torch.cat([t for _, t in sorted(head_copies, key=lambda x: x[0])])
        assert torch.equal(copy, merged['embedding.word_embeddings.weight']), \
            'tied output copy differs from embedding'
    opt = None
    if opt_parts:
        opt = collections.OrderedDict()
        for (canon, key), ps in opt_parts.items():
            opt.setdefault(canon, {})[key] = merge(ps, split_kind(canon, swiglu))
    return args, merged, opt, files


def check_extra(names, key, value):
    if names == 'core' and key != 'output_layer._extra_state':
        assert (isinstance(value, torch.Tensor) and value.dtype == torch.uint8) or \
            isinstance(value, io.BytesIO), type(value)
    else:
        assert value is None and names != 'legacy-layernorm', (names, value)


def read_optimizer(sd, chunks, tp_rank, pp_rank, rank_file, out):
    """Map optimizer entries back to parameters: the order is the model's
    parameter order regrouped by the weight-decay rule (no names are stored)."""
    args = sd['args']
    params = [(key, canon, t) for c in chunks for key, canon, t, _ in c]
    groups = param_groups_of([(k, t) for k, _, t in params])
    order = [i for _, idxs in groups for i in idxs]
    o = sd['optimizer']
    if args.use_distributed_optimizer:
        dist = torch.load(os.path.join(os.path.dirname(rank_file), 'distrib_optim.pt'),
                          map_location='cpu', weights_only=False)
        assert dist['buckets_coalesced'] is True
        chunks = [[(key, canon, t) for key, canon, t, _ in c] for c in chunks]
        for gbuf_idx, chunk in enumerate(chunks):
            storages = {t.storage().data_ptr() for _, _, t in chunk}
            assert len(storages) == 1, 'dist-opt params should share one buffer'
            ((dtypes, world),) = dist[gbuf_idx].items()
            assert dtypes[0] == args.params_dtype
            shared = [c == 'embedding.word_embeddings.weight'
                      and args.pipeline_model_parallel_size > 1
                      and not args.untie_embeddings_and_output_weights for _, c, _ in chunk]
            index, buckets, _ = buffer_layout([(t.numel(), s) for (_, _, t), s in zip(chunk, shared)])
            assert world['numel_unpadded'] == sum(b[2] for b in buckets)
            for (key, canon, t), (start, end) in zip(chunk, index):
                assert t.storage_offset() == start, (key, t.storage_offset(), start)
                offset = 0
                for bstart, bend, unpadded in buckets:
                    if bstart <= start < bend:
                        break
                    offset += unpadded
                for name in ('param', 'exp_avg', 'exp_avg_sq'):
                    flat = world[name][offset + start - bstart:offset + end - bstart]
                    put(out, canon, name, tp_rank, flat.view(t.shape))
        return
    inner = o if args.params_dtype == torch.float32 else o['optimizer']
    assert [g['params'] for g in inner['param_groups']] == \
        [list(range(sum(len(i) for _, i in groups[:n]), sum(len(i) for _, i in groups[:n + 1])))
         for n in range(len(groups))]
    for new, i in enumerate(order):
        _, canon, t = params[i]
        st = inner['state'][new]
        assert st['exp_avg'].shape == t.shape and st['exp_avg'].dtype == torch.float32
        put(out, canon, 'exp_avg', tp_rank, st['exp_avg'])
        put(out, canon, 'exp_avg_sq', tp_rank, st['exp_avg_sq'])
    if args.params_dtype == torch.float32:             # the params are the masters
        for _, canon, t in params:
            put(out, canon, 'param', tp_rank, t)
    else:
        fp32 = [t for g in o['fp32_from_fp16_params'] for t in g]
        for new, i in enumerate(order):
            put(out, params[i][1], 'param', tp_rank, fp32[new])
        assert ('grad_scaler' in o) == (args.params_dtype == torch.float16)


def put(out, canon, key, tp_rank, t):
    slot = out[(canon, key)]
    if slot[tp_rank] is not None:          # tied copy on the last stage
        assert torch.equal(slot[tp_rank], t), canon
        return
    slot[tp_rank] = t


VOCAB_TENSORS = ('embedding.word_embeddings.weight', 'output_layer.weight')


def repadded_equal(got, ref):
    """A vocabulary table padded for another TP, as tools/checkpoint's
    savers re-pad (saver_megatron.py): cut to the new padded size, or
    extended by repeating the last row."""
    n = min(got.shape[0], ref.shape[0])
    if not torch.equal(got[:n], ref[:n]):
        return False
    return got.shape[0] <= n or torch.equal(got[n:], ref[-1:].expand(got.shape[0] - n, -1))


def verify(ckpt, ref_path, quiet=False):
    """Merge ckpt and compare with a --full reference; returns problems."""
    install_megatron_stubs()
    ref = torch.load(ref_path, map_location='cpu', weights_only=False)
    try:
        args, merged, opt, files = read_checkpoint(ckpt)
    except (AssertionError, KeyError, ValueError) as e:
        problems = ['%s: unreadable as a Megatron checkpoint: %s: %s'
                    % (ckpt, type(e).__name__, e)]
        return problems
    problems = []
    for path in files:
        try:
            zip_layout_check(path)
        except AssertionError as e:
            problems.append('%s: zip layout: %s' % (path, e))
    want = ref['tensors']
    if set(merged) != set(want):
        problems.append('names differ: missing %s extra %s' % (
            sorted(set(want) - set(merged)), sorted(set(merged) - set(want))))
    for name, t in want.items():
        got = merged.get(name)
        if got is None:
            continue
        if got.dtype != t.dtype:
            problems.append('%s: dtype %s != %s' % (name, got.dtype, t.dtype))
        elif name in VOCAB_TENSORS and got.shape != t.shape:
            if not repadded_equal(got, t):
                problems.append('%s: not the reference re-padded as Megatron\'s saver does' % name)
        elif got.shape != t.shape or not torch.equal(got, t):
            problems.append('%s: values differ' % name)
    cfg = ref['config']
    for i in range(cfg['layers'] if not problems else 0):
        p = 'layers.%d.' % i
        q, k, v = ungroup_qkv(merged[p + 'attention.qkv.weight'], cfg['heads'],
                              cfg['groups'], cfg['kv_channels'])
        for part, t in zip('qkv', (q, k, v)):
            if not torch.equal(t, ref['unfused'][p + 'attention.%s.weight' % part]):
                problems.append(p + 'attention.%s.weight: de-interleave mismatch' % part)
        if cfg['swiglu']:
            gate, up = merged[p + 'mlp.fc1.weight'].chunk(2)
            if not (torch.equal(gate, ref['unfused'][p + 'mlp.gate.weight']) and
                    torch.equal(up, ref['unfused'][p + 'mlp.up.weight'])):
                problems.append(p + 'mlp.fc1.weight: gate/up mismatch')
    if 'optimizer' in ref and opt is not None:
        for name, states in ref['optimizer'].items():
            for key, t in states.items():
                got = opt.get(name, {}).get(key)
                if got is not None and name in VOCAB_TENSORS and got.shape != t.shape:
                    equal = repadded_equal(got, t)
                else:
                    equal = got is not None and torch.equal(got, t)
                if not equal:
                    problems.append('optimizer %s.%s differs' % (name, key))
    elif ('optimizer' in ref) != (opt is not None):
        problems.append('optimizer presence differs from reference')
    if not quiet:
        print('%s: %d files, %d tensors, %s' % (ckpt, len(files), len(merged),
                                                'OK' if not problems else 'FAILED'))
    return problems


def check_rank_file(path, cfg):
    sd = torch.load(path, map_location='cpu', weights_only=False)
    rng = sd['rng_state']
    assert isinstance(rng, list) and len(rng) == 1
    r = rng[0]
    assert r['np_rng_state'][0] == 'MT19937' and r['np_rng_state'][1].dtype == np.uint32
    assert r['torch_rng_state'].dtype == torch.uint8 and r['cuda_rng_state'].numel() == 16
    assert set(r['rng_tracker_states']) == {'data-parallel-rng', 'model-parallel-rng',
                                            'expert-parallel-rng'}
    a = sd['args']
    assert isinstance(a, argparse.Namespace) and a.params_dtype == cfg.dtype
    assert a.padded_vocab_size == cfg.padded_vocab
    assert ('optimizer' in sd) == cfg.optimizer == ('opt_param_scheduler' in sd)
    with zipfile.ZipFile(path) as z:
        pkl = z.read('model_optim_rng/data.pkl')
    assert (b'cuda:' in pkl) == (cfg.location == 'cuda') and b'cpu' in pkl


SELF_CHECK_MATRIX = [
    '--tp 1 --pp 1',
    '--tp 2 --pp 1 --optimizer --dtype fp16',
    '--tp 2 --pp 2 --optimizer --dtype bf16',
    '--tp 2 --pp 2 --untied --swiglu --no-bias --rmsnorm --rope --names core',
    '--tp 8 --pp 1 --heads 8 --query-groups 8 --swiglu --ffn 128 --optimizer --dtype fp32',
    '--tp 4 --pp 2 --heads 8 --query-groups 2 --names core --te-extra-state bytesio',
    '--tp 2 --pp 4 --layers 8 --heads 4 --query-groups 2 --names core-local --release',
    '--tp 1 --pp 4 --layers 8 --names legacy-layernorm --untied',
    '--tp 2 --pp 2 --vpp 2 --layers 8 --optimizer --qkv-bias --no-bias',
    '--tp 2 --pp 2 --vpp 2 --layers 8 --names core --dist-opt --dtype bf16',
    '--tp 2 --pp 1 --dist-opt --dtype fp16 --swiglu --untied',
    '--tp 2 --pp 3 --layers 6 --dist-opt --dtype fp32 --names core-local --plain-args',
    '--tp 2 --pp 2 --location cpu --names core --swiglu --untied',
]


def generate(o):
    cfg = Config(o)
    full, unfused, opt = make_full(cfg)
    if os.path.exists(o.outdir) and os.listdir(o.outdir) and not o.force:
        raise SystemExit('megatron_fixture: %s is not empty (use --force)' % o.outdir)
    os.makedirs(o.outdir, exist_ok=True)
    write_checkpoint(cfg, o.outdir, full, opt)
    if o.full:
        write_full(cfg, o.full, full, unfused, opt)
    return cfg


def self_check(parser, extra_argv):
    runs = [extra_argv] if extra_argv else [s.split() for s in SELF_CHECK_MATRIX]
    failures = 0
    tmp = tempfile.mkdtemp(prefix='megatron_fixture.')
    try:
        for n, argv in enumerate(runs):
            out = os.path.join(tmp, 'ckpt%d' % n)
            ref = os.path.join(tmp, 'full%d.pt' % n)
            o = parser.parse_args([out, '--full', ref] + argv)
            cfg = generate(o)
            for d, _, fs in os.walk(out):
                for f in fs:
                    if f == 'model_optim_rng.pt':
                        check_rank_file(os.path.join(d, f), cfg)
            problems = verify(out, ref, quiet=True)
            # Determinism: a second run gives the same tensors.
            o2 = parser.parse_args([out + 'b', '--full', ref + 'b'] + argv)
            generate(o2)
            a, b = torch.load(ref, weights_only=False), torch.load(ref + 'b', weights_only=False)
            if any(not torch.equal(a['tensors'][k], b['tensors'][k]) for k in a['tensors']):
                problems.append('not deterministic')
            print('%-4s %-95s %s' % ('ok' if not problems else 'FAIL', ' '.join(argv),
                                     '; '.join(problems[:3])))
            failures += bool(problems)
            shutil.rmtree(out + 'b')
    finally:
        shutil.rmtree(tmp)
    print('self-check: %d of %d layouts failed' % (failures, len(runs)))
    return 1 if failures else 0



# --------------------------------------------------------------------------
# The logits judge of exports: a Megatron-LM GPT computed from the rank
# files (merged as above, Megatron's modules: the grouped fused QKV,
# LayerNorm, GELU exact or tanh with openai_gelu, tied output), against
# Hugging Face's GPT-2 computed from an exported safetensors directory
# (Conv1D weights [in, out], c_attn = [q; k; v], config.json's activation).

def read_safetensors(path):
    with open(path, 'rb') as f:
        raw = f.read()
    n = struct.unpack('<Q', raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data, out = raw[8 + n:], {}
    for name, info in header.items():
        if name == '__metadata__':
            continue
        a, b = info['data_offsets']
        if info['dtype'] == 'BF16':
            t = torch.frombuffer(bytearray(data[a:b]), dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(bytearray(data[a:b]), dtype={'F32': torch.float32, 'F16': torch.float16}[info['dtype']])
        out[name] = t.reshape(info['shape']).float()
    return out


GGUF_SCALARS = {0: '<B', 1: '<b', 2: '<H', 3: '<h', 4: '<I', 5: '<i', 6: '<f', 7: '<?', 10: '<Q', 11: '<q', 12: '<d'}
GGML_TYPES = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}


def read_gguf(path):
    """GGUF v3 (ggml's docs/gguf.md): ({key: value}, {name: fp32 tensor in torch's [out, in] layout})."""
    raw = open(path, 'rb').read()
    at = [4]

    def take(fmt):
        v = struct.unpack_from(fmt, raw, at[0])[0]
        at[0] += struct.calcsize(fmt)
        return v

    def string():
        n = take('<Q')
        at[0] += n
        return raw[at[0] - n:at[0]].decode('utf-8')

    def value(kind):
        if kind == 8:
            return string()
        if kind == 9:
            element, n = take('<I'), take('<Q')
            return [value(element) for _ in range(n)]
        return take(GGUF_SCALARS[kind])

    assert raw[:4] == b'GGUF' and take('<I') == 3
    n_tensors, n_kv = take('<Q'), take('<Q')
    kv = {}
    for _ in range(n_kv):
        key = string()
        kv[key] = value(take('<I'))
    infos = []
    for _ in range(n_tensors):
        name, n_dims = string(), take('<I')
        ne = [take('<Q') for _ in range(n_dims)]
        infos.append((name, list(reversed(ne)), take('<I'), take('<Q')))
    alignment = kv.get('general.alignment', 32)
    start = -(-at[0] // alignment) * alignment
    tensors = {}
    for name, shape, kind, offset in infos:
        dtype = GGML_TYPES[kind]
        count = int(np.prod(shape))
        data = bytearray(raw[start + offset:start + offset + count * torch.finfo(dtype).bits // 8])
        tensors[name] = torch.frombuffer(data, dtype=dtype).reshape(shape).float()
    return kv, tensors


def gguf_llama_as_hf(kv, G):
    """llama.cpp's llama tensors under Hugging Face's names and layouts:
    its converter (convert_hf_to_gguf.py, LlamaModel.permute) stores each
    head's q and k rows as [even rotary pairs' halves interleaved]; undone
    here by the inverse reshape."""
    heads, groups = kv['llama.attention.head_count'], kv['llama.attention.head_count_kv']
    h = kv['llama.embedding_length']
    cfg = {'model_type': 'llama', 'hidden_size': h, 'num_attention_heads': heads, 'num_key_value_heads': groups,
           'num_hidden_layers': kv['llama.block_count'], 'max_position_embeddings': kv['llama.context_length'],
           'rms_norm_eps': kv['llama.attention.layer_norm_rms_epsilon'], 'rope_theta': kv.get('llama.rope.freq_base', 10000.0),
           'hidden_act': 'silu', 'vocab_size': G['token_embd.weight'].shape[0], 'tie_word_embeddings': 'output.weight' not in G}

    def unpermute(w, n):
        return w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    W = {'model.embed_tokens.weight': G['token_embd.weight'], 'model.norm.weight': G['output_norm.weight']}
    if 'output.weight' in G:
        W['lm_head.weight'] = G['output.weight']
    for i in range(cfg['num_hidden_layers']):
        b, p = 'blk.%d.' % i, 'model.layers.%d.' % i
        W[p + 'self_attn.q_proj.weight'] = unpermute(G[b + 'attn_q.weight'], heads)
        W[p + 'self_attn.k_proj.weight'] = unpermute(G[b + 'attn_k.weight'], groups)
        for hf, gg in (('self_attn.v_proj', 'attn_v'), ('self_attn.o_proj', 'attn_output'),
                       ('input_layernorm', 'attn_norm'), ('post_attention_layernorm', 'ffn_norm'),
                       ('mlp.gate_proj', 'ffn_gate'), ('mlp.up_proj', 'ffn_up'), ('mlp.down_proj', 'ffn_down')):
            W[p + hf + '.weight'] = G[b + gg + '.weight']
    return cfg, W


def gguf_as_hf(kv, G):
    """llama.cpp's gpt2 tensors under Hugging Face's names and layouts."""
    if kv.get('general.architecture') == 'llama':
        return gguf_llama_as_hf(kv, G)
    cfg = {'n_embd': kv['gpt2.embedding_length'], 'n_head': kv['gpt2.attention.head_count'],
           'n_layer': kv['gpt2.block_count'], 'n_positions': kv['gpt2.context_length'],
           'layer_norm_epsilon': kv['gpt2.attention.layer_norm_epsilon'], 'vocab_size': G['token_embd.weight'].shape[0]}
    W = {'transformer.wte.weight': G['token_embd.weight'], 'transformer.wpe.weight': G['position_embd.weight'],
         'transformer.ln_f.weight': G['output_norm.weight'], 'transformer.ln_f.bias': G['output_norm.bias']}
    for i in range(cfg['n_layer']):
        for hf, gg, transposed in (('ln_1', 'attn_norm', False), ('attn.c_attn', 'attn_qkv', True),
                                   ('attn.c_proj', 'attn_output', True), ('ln_2', 'ffn_norm', False),
                                   ('mlp.c_fc', 'ffn_up', True), ('mlp.c_proj', 'ffn_down', True)):
            w = G['blk.%d.%s.weight' % (i, gg)]
            W['transformer.h.%d.%s.weight' % (i, hf)] = w.t() if transposed else w
            W['transformer.h.%d.%s.bias' % (i, hf)] = G['blk.%d.%s.bias' % (i, gg)]
    return cfg, W


def causal_attention(q, k, v):
    """q [heads, s, hn], k and v [heads, s, hn]."""
    s = q.shape[1]
    scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[2])
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float('-inf'))
    return torch.softmax(scores, -1) @ v


def megatron_rope(args, hn, s):
    """cos and sin [s, hn] of Megatron's RotaryEmbedding (not interleaved:
    _rotate_half), with _apply_scaling when use_rope_scaling (Llama 3: low
    1, high 4, original 8192, factor rotary_scaling_factor)."""
    assert getattr(args, 'rotary_percent', 1.0) == 1.0 and not getattr(args, 'rotary_interleaved', False)
    inv = 1.0 / (getattr(args, 'rotary_base', 10000) ** (torch.arange(0, hn, 2, dtype=torch.float32) / hn))
    if getattr(args, 'use_rope_scaling', False):
        factor = getattr(args, 'rotary_scaling_factor', getattr(args, 'rope_scaling_factor', 8.0))
        low_wavelen, high_wavelen = 8192 / 1.0, 8192 / 4.0
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
        medium = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        inv = torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    freqs = torch.outer(torch.arange(s, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def megatron_logits(args, T, tokens):
    """Megatron's GPT forward from merged canonical tensors: GPT-2 (learned
    positions, LayerNorm, biases, GELU) or Llama-shaped (rope, RMSNorm,
    SwiGLU, no biases, untied output), as its modules compute them."""
    h, np_, hn = args.hidden_size, args.num_attention_heads, args.kv_channels
    ng = args.num_query_groups if args.group_query_attention else np_
    eps = getattr(args, 'norm_epsilon', getattr(args, 'layernorm_epsilon', 1e-5))
    gelu = (lambda x: F.gelu(x, approximate='tanh')) if args.openai_gelu else F.gelu
    rope = getattr(args, 'position_embedding_type', 'learned_absolute') == 'rope'
    rms = getattr(args, 'normalization', 'LayerNorm') == 'RMSNorm'
    s = tokens.shape[0]
    zero = torch.zeros(())
    bias = lambda name: T.get(name, zero)  # noqa: E731  (add_bias_linear false: none stored)

    def norm(x, name):
        if rms:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * T[name + '.weight']
        return F.layer_norm(x, (h,), T[name + '.weight'], T[name + '.bias'], eps)

    x = T['embedding.word_embeddings.weight'][tokens]
    if not rope:
        x = x + T['embedding.position_embeddings.weight'][:s]
    else:
        cos, sin = megatron_rope(args, hn, s)
    for i in range(args.num_layers):
        p = 'layers.%d.' % i
        y = norm(x, p + 'input_norm')
        qkv = (y @ T[p + 'attention.qkv.weight'].t() + bias(p + 'attention.qkv.bias')).view(s, ng, (np_ // ng + 2) * hn)
        q, k, v = qkv.split([np_ // ng * hn, hn, hn], dim=2)
        q = q.reshape(s, np_, hn).transpose(0, 1)
        k = k.repeat_interleave(np_ // ng, dim=1).transpose(0, 1)
        v = v.repeat_interleave(np_ // ng, dim=1).transpose(0, 1)
        if rope:
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        a = causal_attention(q, k, v).transpose(0, 1).reshape(s, np_ * hn)
        x = x + a @ T[p + 'attention.dense.weight'].t() + bias(p + 'attention.dense.bias')
        y = norm(x, p + 'post_norm')
        y = y @ T[p + 'mlp.fc1.weight'].t() + bias(p + 'mlp.fc1.bias')
        if args.swiglu:
            gate, up = torch.chunk(y, 2, dim=-1)
            y = F.silu(gate) * up
        else:
            y = gelu(y)
        x = x + y @ T[p + 'mlp.fc2.weight'].t() + bias(p + 'mlp.fc2.bias')
    x = norm(x, 'final_norm')
    head = 'output_layer.weight' if args.untie_embeddings_and_output_weights else 'embedding.word_embeddings.weight'
    return x @ T[head].t()


def check_loss(ckpt, token_file, seq, windows, vocab):
    """Mean cross-entropy of Megatron's GPT (from the rank files of ckpt)
    over `windows` windows of `seq` tokens of token_file (a token file of
    docs/DATA.md: a 1024-byte header, then uint16 tokens), read as tp-train
    eval reads them: window i has inputs
    tokens[i*seq, (i+1)*seq) and the next tokens as targets), over the true
    vocabulary. Prints {"loss", "windows", "tokens"}."""
    install_megatron_stubs()
    args, merged, _, _ = read_checkpoint(ckpt)
    T = {k: v.float() for k, v in merged.items()}
    data = torch.from_numpy(np.fromfile(token_file, dtype=np.uint16, offset=1024).astype(np.int64))
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(windows):
            window = data[i * seq: i * seq + seq + 1]
            logits = megatron_logits(args, T, window[:-1])[:, :vocab]
            total += F.cross_entropy(logits.double(), window[1:], reduction='sum').item()
            count += seq
    print(json.dumps({'loss': total / count, 'windows': windows, 'tokens': count}))
    return []


def hf_gpt2_logits(cfg, W, tokens):
    h, heads = cfg['n_embd'], cfg['n_head']
    gelu = {'gelu': F.gelu, 'gelu_new': lambda x: F.gelu(x, approximate='tanh')}[cfg['activation_function']]
    eps, s = cfg['layer_norm_epsilon'], tokens.shape[0]
    g = lambda n: W['transformer.' + n]
    x = g('wte.weight')[tokens] + g('wpe.weight')[:s]
    for i in range(cfg['n_layer']):
        p = 'h.%d.' % i
        y = F.layer_norm(x, (h,), g(p + 'ln_1.weight'), g(p + 'ln_1.bias'), eps)
        q, k, v = (y @ g(p + 'attn.c_attn.weight') + g(p + 'attn.c_attn.bias')).split(h, dim=1)
        q, k, v = (t.reshape(s, heads, h // heads).transpose(0, 1) for t in (q, k, v))
        a = causal_attention(q, k, v).transpose(0, 1).reshape(s, h)
        x = x + a @ g(p + 'attn.c_proj.weight') + g(p + 'attn.c_proj.bias')
        y = F.layer_norm(x, (h,), g(p + 'ln_2.weight'), g(p + 'ln_2.bias'), eps)
        y = gelu(y @ g(p + 'mlp.c_fc.weight') + g(p + 'mlp.c_fc.bias'))
        x = x + y @ g(p + 'mlp.c_proj.weight') + g(p + 'mlp.c_proj.bias')
    x = F.layer_norm(x, (h,), g('ln_f.weight'), g('ln_f.bias'), eps)
    return x @ g('wte.weight').t()


def hf_llama_logits(cfg, W, tokens):
    """Hugging Face's LlamaForCausalLM (eager attention, rotate-half
    rotary, repeat_kv grouped queries, SwiGLU), from its own tensor names:
    every weight in fp32, whatever dtype the export stored."""
    h, heads, groups = cfg['hidden_size'], cfg['num_attention_heads'], cfg['num_key_value_heads']
    hd, eps, s = h // heads, cfg['rms_norm_eps'], tokens.shape[0]
    assert cfg['hidden_act'] == 'silu' and cfg.get('rope_scaling') is None, cfg
    g = lambda n: W[n].float()  # noqa: E731

    def rms(x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g(name)

    inv = 1.0 / (cfg['rope_theta'] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    emb = torch.cat((torch.outer(torch.arange(s, dtype=torch.float32), inv),) * 2, dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = g('model.embed_tokens.weight')[tokens]
    for i in range(cfg['num_hidden_layers']):
        p = 'model.layers.%d.' % i
        y = rms(x, p + 'input_layernorm.weight')
        q = (y @ g(p + 'self_attn.q_proj.weight').t()).view(s, heads, hd).transpose(0, 1)
        k = (y @ g(p + 'self_attn.k_proj.weight').t()).view(s, groups, hd).transpose(0, 1)
        v = (y @ g(p + 'self_attn.v_proj.weight').t()).view(s, groups, hd).transpose(0, 1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(heads // groups, dim=0), v.repeat_interleave(heads // groups, dim=0)
        a = causal_attention(q, k, v).transpose(0, 1).reshape(s, h)
        x = x + a @ g(p + 'self_attn.o_proj.weight').t()
        y = rms(x, p + 'post_attention_layernorm.weight')
        y = F.silu(y @ g(p + 'mlp.gate_proj.weight').t()) * (y @ g(p + 'mlp.up_proj.weight').t())
        x = x + y @ g(p + 'mlp.down_proj.weight').t()
    x = rms(x, 'model.norm.weight')
    head = 'model.embed_tokens.weight' if cfg.get('tie_word_embeddings', False) else 'lm_head.weight'
    return x @ g(head).t()


def check_logits(ckpt, export_dir, seed=7):
    """Problems (empty when the export computes the checkpoint's logits to
    1e-5 of their scale, on the true vocabulary)."""
    install_megatron_stubs()
    args, merged, _, _ = read_checkpoint(ckpt)
    T = {k: v.float() for k, v in merged.items()}
    if os.path.isdir(export_dir):
        cfg = json.load(open(os.path.join(export_dir, 'config.json')))
        W = read_safetensors(os.path.join(export_dir, 'model.safetensors'))
    else:
        # llama.cpp computes GELU's tanh form; Megatron's is taken here, so
        # that what is compared is where every weight went.
        cfg, W = gguf_as_hf(*read_gguf(export_dir))
        cfg['activation_function'] = 'gelu_new' if args.openai_gelu else 'gelu'
    vocab = cfg['vocab_size']
    llama = cfg.get('model_type') == 'llama'
    positions = cfg['max_position_embeddings'] if llama else cfg['n_positions']
    tokens = torch.randint(0, vocab, (min(positions, 24),), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = megatron_logits(args, T, tokens)[:, :vocab]
        got = (hf_llama_logits if llama else hf_gpt2_logits)(cfg, W, tokens)
    problems = []
    if got.shape != want.shape:
        return ['logits of shape %s, Megatron computes %s' % (tuple(got.shape), tuple(want.shape))]
    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
    if not err <= 1e-5:
        problems.append('logits differ: %.3g of their scale' % err)
    print('%s: logits of %d tokens over %d entries, %.2g of their scale from Megatron\'s' % (
        export_dir, tokens.shape[0], vocab, err))
    return problems

def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('outdir', nargs='?')
    p.add_argument('--tp', type=int, default=1)
    p.add_argument('--pp', type=int, default=1)
    p.add_argument('--vpp', type=int, default=1, help='model chunks per pipeline stage')
    p.add_argument('--layers', type=int, default=4)
    p.add_argument('--hidden', type=int, default=64)
    p.add_argument('--heads', type=int, default=4)
    p.add_argument('--query-groups', type=int, default=None,
                   help='enables group_query_attention')
    p.add_argument('--ffn', type=int, default=256)
    p.add_argument('--vocab', type=int, default=100, help='true vocabulary size')
    p.add_argument('--make-vocab-size-divisible-by', type=int, default=8)
    p.add_argument('--seq', type=int, default=32)
    p.add_argument('--max-position-embeddings', type=int, default=None)
    p.add_argument('--swiglu', action='store_true')
    p.add_argument('--untied', action='store_true')
    p.add_argument('--rope', action='store_true', help='no position embeddings')
    p.add_argument('--rmsnorm', action='store_true', help='norms without bias')
    p.add_argument('--rotary-base', type=int, default=10000, help='args.rotary_base (with --rope)')
    p.add_argument('--rope-scaling', type=float, default=0,
                   help="Llama 3's frequency scaling by this factor (args.use_rope_scaling, rotary_scaling_factor)")
    p.add_argument('--openai-gelu', action='store_true', help="GELU's tanh form (args.openai_gelu)")
    p.add_argument('--no-bias', action='store_true', help='add_bias_linear = False')
    p.add_argument('--qkv-bias', action='store_true')
    p.add_argument('--names', choices=NAMINGS, default='legacy')
    p.add_argument('--te-extra-state', choices=('tensor', 'bytesio'), default='tensor',
                   help='TE _extra_state form with --names core (TE >= 2.0 / older)')
    p.add_argument('--optimizer', action='store_true')
    p.add_argument('--dist-opt', action='store_true',
                   help='distributed optimizer: distrib_optim.pt, params share a buffer')
    p.add_argument('--release', action='store_true')
    p.add_argument('--iteration', type=int, default=1000)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--dtype', choices=sorted(DTYPES), default='fp16')
    p.add_argument('--plain-args', action='store_true',
                   help='no Megatron enum instances in args / rerun state')
    p.add_argument('--location', choices=('cuda', 'cpu'), default='cuda',
                   help="storage location recorded for model/optimizer tensors "
                        "(cuda: 'cuda:<rank %% 8>' as written from GPUs)")
    p.add_argument('--full', metavar='PATH', help='write the unsharded reference here')
    p.add_argument('--force', action='store_true', help='allow a non-empty OUTDIR')
    p.add_argument('--self-check', action='store_true',
                   help='generate, merge back and compare (a matrix when no OUTDIR)')
    p.add_argument('--verify', metavar='CKPT',
                   help='merge CKPT and compare it with --full PATH')
    p.add_argument('--loss', nargs=5, metavar=('CKPT', 'TOKENS', 'SEQ', 'WINDOWS', 'VOCAB'),
                   help="print the mean cross-entropy of CKPT (Megatron's GPT or Llama-shaped model, from its "
                        "rank files) over WINDOWS windows of SEQ tokens of TOKENS (uint16), on VOCAB tokens")
    p.add_argument('--logits', nargs=2, metavar=('CKPT', 'EXPORT'),
                   help="compare the logits of CKPT (Megatron's GPT, from its rank files) with those of "
                        "Hugging Face's GPT-2 computed from EXPORT: a safetensors directory, or a GGUF "
                        "file of llama.cpp's gpt2 (computed with Megatron's GELU)")
    return p


def main(argv):
    parser = build_parser()
    o = parser.parse_args(argv)
    if o.verify:
        if not o.full:
            parser.error('--verify needs --full REF.pt')
        problems = verify(o.verify, o.full)
        for line in problems:
            print('  ' + line)
        return 1 if problems else 0
    if o.loss:
        return 1 if check_loss(o.loss[0], o.loss[1], int(o.loss[2]), int(o.loss[3]), int(o.loss[4])) else 0
    if o.logits:
        problems = check_logits(o.logits[0], o.logits[1])
        for line in problems:
            print('  ' + line)
        return 1 if problems else 0
    if o.self_check and not o.outdir:
        return self_check(parser, [])
    if not o.outdir:
        parser.error('OUTDIR is required')
    generate(o)
    if o.self_check:
        ref = o.full
        tmp = None
        if not ref:
            tmp = tempfile.mkdtemp(prefix='megatron_fixture.')
            ref = os.path.join(tmp, 'full.pt')
            cfg = Config(o)
            full, unfused, opt = make_full(cfg)
            write_full(cfg, ref, full, unfused, opt)
        problems = verify(o.outdir, ref)
        for line in problems:
            print('  ' + line)
        if tmp:
            shutil.rmtree(tmp)
        return 1 if problems else 0
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
