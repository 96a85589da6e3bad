#!/bin/sh
# The numerics under every path the CPU's products can take on x86-64, as
# far as environment variables can force them on this machine: OpenBLAS's
# kernel for this CPU or for Haswell (OPENBLAS_CORETYPE), oneDNN with this
# CPU's bf16 instructions or capped to the AVX-512 core without them or to
# AVX2 (ONEDNN_MAX_CPU_ISA), so that an AVX2-only machine's results are
# reproduced on an AVX-512 one. Under each: the unit tests of the products
# (test_bf16_products: exact sums of bf16-rounded operands; test_transformer:
# the fp32 layers), tp-train's start line naming the path it took, and
# tp-train against PyTorch (GPT-2 in fp32 and bf16, Llama in bf16), the
# judge under the same settings (its fp32 products are OpenBLAS's too).
# PyTorch's own bf16 products are chosen by the CPU's flags alone, which no
# variable caps: the judge does not use them (tests/trainer/
# mixed_precision.py), and both sides are measured against fp64 sums of the
# same bf16 operands instead (check_torch.py --bf16).
# tier: full
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/train_lib.sh"

use_open_mpi
TRAIN="$BIN/tp-train"
UNIT="$ROOT/${BUILD:-build}/tests/kernels"
# The settings this machine was started with come back after each path.
SAVED_CORETYPE=${OPENBLAS_CORETYPE-unset} SAVED_ISA=${ONEDNN_MAX_CPU_ISA-unset}
restore() {
    unset OPENBLAS_CORETYPE ONEDNN_MAX_CPU_ISA
    [ "$SAVED_CORETYPE" = unset ] || export OPENBLAS_CORETYPE="$SAVED_CORETYPE"
    [ "$SAVED_ISA" = unset ] || export ONEDNN_MAX_CPU_ISA="$SAVED_ISA"
}

# path NAME CORETYPE ISA: the checks with OPENBLAS_CORETYPE and
# ONEDNN_MAX_CPU_ISA set to CORETYPE and ISA ("-": unset, the library's own
# choice for this CPU).
path() {
    name=$1 coretype=$2 isa=$3
    unset OPENBLAS_CORETYPE ONEDNN_MAX_CPU_ISA
    [ "$coretype" = - ] || export OPENBLAS_CORETYPE="$coretype"
    [ "$isa" = - ] || export ONEDNN_MAX_CPU_ISA="$isa"
    expect_ok "$name: tp-train's start line" "$TRAIN" --model tiny --micro-batch 2 --steps 1 --quiet \
        --log "$WORK/$name.jsonl"
    kernels=$(events "$WORK/$name.jsonl" start cpu_kernels)
    echo "[$NAME] $name (OPENBLAS_CORETYPE=$coretype ONEDNN_MAX_CPU_ISA=$isa): $kernels"
    # What the settings force must show in the path taken.
    case $coretype in
    Haswell) check "$name: OpenBLAS's Haswell kernel" [ "${kernels#OpenBLAS Haswell,}" != "$kernels" ] ;;
    *) check "$name: an OpenBLAS kernel named" [ "${kernels#OpenBLAS [A-Za-z]}" != "$kernels" ] ;;
    esac
    case $isa in
    AVX2) check_all "$name: oneDNN at AVX2 at most, bf16 by sgemm" \
        'echo "$kernels" | grep -Eq "oneDNN (sse41|avx|avx2), bf16 products by sgemm on rounded operands"' ;;
    AVX512_CORE) check_all "$name: oneDNN without bf16 instructions, bf16 by sgemm" \
        'echo "$kernels" | grep -Eq "oneDNN (sse41|avx|avx2|avx512_core), bf16 products by sgemm on rounded operands"' ;;
    *) check "$name: a oneDNN ISA named" grep -q '"cpu_kernels":"OpenBLAS [^,]*, oneDNN [a-z0-9_]*, bf16 products by' \
        "$WORK/$name.jsonl" ;;
    esac
    expect_ok "$name: the products' unit tests" "$UNIT/test_bf16_products" --jobs 1
    expect_ok "$name: the layers' unit tests" "$UNIT/test_transformer" --jobs 1
    torch_check "$name-fp32" 1 --tp 1
    BF16=1 torch_check "$name-bf16" 1 --tp 1
    TORCH_MODEL=llama-tiny BF16=1 torch_check "$name-llama-bf16" 1 --tp 1
    torch_judge
    restore
}

path default - -
path haswell Haswell -
path avx512-core - AVX512_CORE
path avx2-haswell Haswell AVX2

finish
