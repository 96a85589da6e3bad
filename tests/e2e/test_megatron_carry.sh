#!/bin/sh
# What the Megatron-LM writer carries over from its source's rank files
# besides tensors (args, the optimizer's parameter groups and loss scaler,
# the schedule, the RNG states, Transformer Engine's extra state) goes back
# as data and known classes only (issue 51, defects 3 and 6): a call planted
# in a rank file (builtins.exec, os.system), which the reader records and
# never runs, is refused by tp-reshard naming the file, its key and its
# class, nothing written and nothing run; what is written names only the
# allow-listed globals and torch.load reads it; a 30-level DAG of shared
# lists in args (2^30 leaves when expanded) is written in moments, shared
# again, the output the size of its input. Skipped without python3-torch.
# tier: full
. "$(dirname "$0")/lib.sh"
RS="$BIN/tp-reshard"
CK="$BIN/tp-ckpt"
FIXTURE="$ROOT/tests/support/megatron_fixture.py"

skip_without_python 'torch, numpy' "python3-torch is not installed"

MARKER="$WORK/payload-ran"

# plant VARIANT SRC DST: a copy of SRC whose every rank file holds VARIANT.
plant() {
    "$PY" - "$ROOT/tests/support" "$1" "$2" "$3" "$MARKER" <<'PYEOF'
import glob, io, os, shutil, sys, torch
sys.path.insert(0, sys.argv[1])
import megatron_fixture
megatron_fixture.install_megatron_stubs()
variant, src, dst, marker = sys.argv[2:6]
shutil.copytree(src, dst)

class Call:
    def __init__(self, f, arg):
        self.f, self.arg = f, arg

    def __reduce__(self):
        return (self.f, (self.arg,))

run_exec = Call(exec, "open(%r, 'w').write('ran')" % marker)
run_system = Call(os.system, "touch '%s'" % marker)
for path in sorted(glob.glob(os.path.join(dst, "iter_*", "mp_rank_*", "model_optim_rng.pt"))):
    sd = torch.load(path, map_location="cpu", weights_only=False)
    optimizer = sd["optimizer"].get("optimizer", sd["optimizer"])
    if variant == "args":
        sd["args"].data_path = ["a", "b", "c", run_exec]
    elif variant == "param_groups":
        optimizer["param_groups"][0]["lr_hook"] = run_system
    elif variant == "scheduler":
        sd["opt_param_scheduler"]["hook"] = run_exec
    elif variant == "rng_state":
        sd["rng_state"][0]["hook"] = run_system
    elif variant == "extra_state":  # a BytesIO whose torch.save holds a call, as TE would torch.load it
        inner = io.BytesIO()
        torch.save(run_exec, inner)
        inner.seek(0)
        for key in sd["model"]:
            if key.endswith("_extra_state") and isinstance(sd["model"][key], io.BytesIO):
                sd["model"][key] = inner
    elif variant == "dag":
        x = "leaf"
        for _ in range(30):
            x = [x, x]
        sd["args"].data_path = x
    torch.save(sd, path)
PYEOF
}

# judge_output DIR...: each rank file names only the allow-listed globals
# (read from its pickle's opcodes, nothing loaded) and torch.load reads it.
judge_output() {
    "$PY" - "$ROOT/tests/support" "$@" <<'PYEOF'
import glob, os, pickletools, sys, torch, zipfile
sys.path.insert(0, sys.argv[1])
import megatron_fixture
megatron_fixture.install_megatron_stubs()
allowed = {"argparse Namespace", "collections OrderedDict", "torch._utils _rebuild_tensor_v2", "builtins set",
           "builtins getattr", "torch device", "numpy.core.multiarray _reconstruct", "numpy._core.multiarray _reconstruct",
           "numpy.core.multiarray scalar", "numpy._core.multiarray scalar", "numpy dtype", "numpy ndarray", "_io BytesIO",
           "megatron.core.enums ModelType", "megatron.core.transformer.enums AttnBackend",
           "megatron.core.rerun_state_machine RerunMode", "megatron.core.rerun_state_machine RerunState",
           "megatron.core.rerun_state_machine RerunDiagnostic"}
files = 0
for out in sys.argv[2:]:
    for path in sorted(glob.glob(os.path.join(out, "iter_*", "mp_rank_*", "model_optim_rng.pt"))):
        z = zipfile.ZipFile(path)
        pkl = z.read([n for n in z.namelist() if n.endswith("/data.pkl")][0])
        for op, arg, _ in pickletools.genops(pkl):
            if op.name == "STACK_GLOBAL":
                sys.exit("%s: a STACK_GLOBAL" % path)
            if op.name == "GLOBAL" and arg not in allowed and not (arg.startswith("torch ") and
                                                                    (arg.endswith("Storage") or "." not in arg)):
                sys.exit("%s names %s" % (path, arg))
        torch.load(path, map_location="cpu", weights_only=False)
        files += 1
if not files:
    sys.exit("no rank files")
print("%d rank files name only allowed globals and load" % files)
PYEOF
}

expect_ok "fixture: legacy names tp2, the optimizer, enums and numpy RNG states" "$PY" "$FIXTURE" "$WORK/m" --tp 2 \
    --layers 2 --hidden 32 --heads 4 --ffn 64 --vocab 90 --make-vocab-size-divisible-by 16 --optimizer
expect_ok "fixture: Core names, Transformer Engine's extra state as an io.BytesIO" "$PY" "$FIXTURE" "$WORK/c" --tp 2 \
    --layers 2 --hidden 32 --heads 4 --ffn 64 --vocab 90 --make-vocab-size-divisible-by 16 --optimizer --names core \
    --te-extra-state bytesio

# What real files hold goes back, at the same layout (RNG states carried) and another.
expect_ok "the same layout: args, optimizer, schedule, RNG and rerun states carried" "$RS" "$WORK/m" --to tp2 \
    -o "$WORK/m_tp2"
expect_ok "another layout" "$RS" "$WORK/m" --to tp1 -o "$WORK/m_tp1"
expect_ok "Core names, the BytesIO extra states carried" "$RS" "$WORK/c" --to tp2 -o "$WORK/c_tp2"
expect_ok "their rank files name only allowed globals, and torch.load reads them" judge_output "$WORK/m_tp2" \
    "$WORK/m_tp1" "$WORK/c_tp2"
check "RNG states carried" "$PY" -c '
import sys, torch
sys.path.insert(0, sys.argv[1])
import megatron_fixture
megatron_fixture.install_megatron_stubs()
a = torch.load(sys.argv[2] + "/iter_0001000/mp_rank_01/model_optim_rng.pt", map_location="cpu", weights_only=False)
b = torch.load(sys.argv[3] + "/iter_0001000/mp_rank_01/model_optim_rng.pt", map_location="cpu", weights_only=False)
assert (a["rng_state"][0]["np_rng_state"][1] == b["rng_state"][0]["np_rng_state"][1]).all()
assert a["args"].model_type == b["args"].model_type and a["rerun_state_machine"] == b["rerun_state_machine"]
' "$ROOT/tests/support" "$WORK/m" "$WORK/m_tp2"

# Calls planted where the writer carries values from: refused, nothing written, nothing run.
# refused VARIANT SOURCE WHAT PATTERN: tp-reshard SOURCE at its layout must refuse.
refused() {
    plant "$1" "$2" "$WORK/$1" || { failed "plant $1"; return; }
    expect_error "$3: refused naming the file, key and class" 1 "$4" "$RS" "$WORK/$1" --to tp2 -o "$WORK/$1_out"
    check "$3: nothing written" test ! -e "$WORK/$1_out"
    check "$3: nothing ran" test ! -e "$MARKER"
}
refused args "$WORK/m" "builtins.exec in args.data_path" \
    'mp_rank_00/model_optim_rng.pt: args\.data_path\[3\] is a call of builtins\.exec'
refused param_groups "$WORK/m" "os.system in a parameter group" \
    'mp_rank_00/model_optim_rng.pt: optimizer\.optimizer\.param_groups\[0\]\.lr_hook is a call of (posix|os)\.system'
refused scheduler "$WORK/m" "builtins.exec in opt_param_scheduler" \
    'opt_param_scheduler\.hook is a call of builtins\.exec'
refused rng_state "$WORK/m" "os.system in rng_state" \
    'mp_rank_00/model_optim_rng.pt: rng_state\[0\]\.hook is a call of (posix|os)\.system'
refused extra_state "$WORK/c" "a BytesIO extra state whose torch.save holds builtins.exec" \
    '_extra_state.*holds other than torch\.save\(None\)'
expect_error "at another layout too" 1 'args\.data_path\[3\] is a call of builtins\.exec' "$RS" "$WORK/args" --to tp1 \
    -o "$WORK/args_tp1"
check "nothing written" test ! -e "$WORK/args_tp1"
# The torch_dist writer carries the same state into its common state: the
# same allow-list.
expect_error "written as torch_dist: refused the same" 1 'args\.data_path\[3\] is a call of builtins\.exec' "$RS" \
    "$WORK/args" --format torch_dist --to tp2 --weights-only -o "$WORK/args_td"
check "nothing written" test ! -e "$WORK/args_td"
check "nothing ran" test ! -e "$MARKER"
# A torch_dist source's args are carried into a legacy output's rank files
# too (they were written from the model): the same allow-list, checked
# before anything is written.
expect_ok "a clean torch_dist checkpoint, its common state in common.pt" "$RS" "$WORK/m" --format torch_dist --to tp2 \
    --weights-only --megatron-core 0.18 -o "$WORK/m_td"
expect_ok "a call planted in its args" "$PY" - "$ROOT/tests/support" "$WORK/m_td/iter_0001000/common.pt" "$MARKER" <<'PYEOF'
import sys, torch
sys.path.insert(0, sys.argv[1])
import megatron_fixture
megatron_fixture.install_megatron_stubs()
path, marker = sys.argv[2:4]

class Call:
    def __reduce__(self):
        return (exec, ("open(%r, 'w').write('ran')" % marker,))

state = torch.load(path, map_location="cpu", weights_only=False)
state["args"].data_path = ["a", "b", "c", Call()]
torch.save(state, path)
PYEOF
expect_error "torch_dist -> legacy: refused naming common.pt and the key" 1 \
    'm_td/iter_0001000/common.pt: args\.data_path\[3\] is a call of builtins\.exec' "$RS" "$WORK/m_td" --format megatron \
    --to tp2 --weights-only -o "$WORK/m_td_legacy"
check "nothing written" test ! -e "$WORK/m_td_legacy"
check "nothing ran" test ! -e "$MARKER"
# The RNG states belong to a rank: at another layout they are left out, as
# Megatron leaves them (with a warning), and so is what they hold.
expect_ok "rng_state at another layout: left out" "$RS" "$WORK/rng_state" --to tp1 -o "$WORK/rng_state_tp1"
check "said so" grep -q "warning: the ranks' RNG states were left out" "$WORK/.err"
expect_ok "its rank file names only allowed globals, and torch.load reads it" judge_output "$WORK/rng_state_tp1"
# Our own format carries no pickle: the tensors convert.
expect_ok "--format tp converts the source holding a call" "$RS" "$WORK/args" --to tp1 --format tp -o "$WORK/args_tp"
check "nothing ran at all" test ! -e "$MARKER"

# A 30-level DAG of shared lists in args.data_path: written in moments (the
# limit, enforced, is far above), as shared lists, the output the size of
# the input (expanded, it would be 2^30 leaves).
expect_ok "plant the DAG" plant dag "$WORK/m" "$WORK/dag"
start=$(date +%s)
expect_ok "tp-reshard of the DAG to tp1 ends within 60 s" timeout 60 "$RS" "$WORK/dag" --to tp1 -o "$WORK/dag_tp1"
expect_ok "and at its own layout" timeout 60 "$RS" "$WORK/dag" --to tp2 -o "$WORK/dag_tp2"
echo "[$NAME] the DAG written twice in $(($(date +%s) - start)) s"
size_in=$(du -sb "$WORK/dag" | cut -f1)
for out in dag_tp1 dag_tp2; do
    size_out=$(du -sb "$WORK/$out" 2>/dev/null | cut -f1)
    echo "[$NAME] $out: ${size_out:-no} bytes written from $size_in"
    check_all "$out: ${size_out:-no} bytes, under 10 x the input's $size_in" \
        '[ -n "$size_out" ] && [ "$size_out" -lt $((10 * size_in)) ]'
done
expect_ok "torch.load: args.data_path is the DAG, its lists shared" "$PY" - "$ROOT/tests/support" "$WORK/dag_tp1" \
    "$WORK/dag_tp2" <<'PYEOF'
import glob, sys, torch
sys.path.insert(0, sys.argv[1])
import megatron_fixture
megatron_fixture.install_megatron_stubs()
for out in sys.argv[2:]:
    for path in glob.glob(out + "/iter_*/mp_rank_*/model_optim_rng.pt"):
        x = torch.load(path, map_location="cpu", weights_only=False)["args"].data_path
        for level in range(30):
            assert isinstance(x, list) and len(x) == 2 and x[0] is x[1], (path, level)
            x = x[0]
        assert x == "leaf", path
PYEOF
expect_ok "verify" "$CK" verify "$WORK/dag_tp1"

finish
