#!/bin/sh
# make gpu-pack: everything a bare GPU machine needs to check and measure
# the CUDA path, in one archive (docs/GPU.md). A GPU machine of this project
# has a driver, the CUDA toolkit and a Python with PyTorch, and nothing of
# ours: no HDF5, MPI, OpenBLAS, Criterion, libcurl, and no package registry.
#
# The archive, tp-gpu-pack/ inside:
#   the repository's tracked files (scripts, tests, Python checks, docs)
#   build/bin, build/tests, build/bench   this CUDA build's binaries, debug
#       information stripped; each finds build/lib through its run path
#       ($ORIGIN/../lib, $ORIGIN/../../lib: see the Makefile)
#   build/bin/tp-mpirun   Open MPI's mpirun from the pack (programs/tp-mpirun.c)
#   build/lib             every shared library the binaries and Open MPI's
#       runtime load, except glibc's (the libc6 package's) and the driver's;
#       each with the run path $ORIGIN (DT_RPATH), so that it finds the
#       others beside it whoever loads it (patchelf)
#   build/mpi             mpirun, orted, the Open MPI and PMIx plugins whose
#       libraries are all in the pack (a single-node run needs no more),
#       their help texts and settings; their run paths lead to build/lib
#   PACK-INFO             the revision, build settings and library list
#   PACK-MANIFEST         the tracked files' SHA-256 (sha256sum -c's input)
#
#   BUILD (default build): the build, made with CUDA=1
#   PACK (default $BUILD/gpu-pack.tar.xz): the archive to write
#   PACK_LIMIT_MIB (default 48): the size it must stay under (a GPU
#     machine takes 64 MiB of files in all, the repository included)
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PACK=${PACK:-$BUILD/gpu-pack.tar.xz}
LIMIT_MIB=${PACK_LIMIT_MIB:-48}

fail() {
    echo "gpu-pack: $*" >&2
    exit 1
}
grep -q '^CUDA=1 ' "$BUILD/config" 2>/dev/null ||
    fail "$BUILD is not a CUDA build (its config: $(head -c 60 "$BUILD/config" 2>/dev/null || echo none)); make gpu-pack builds one"
for tool in ldd ompi_info orterun orted dpkg xz strip patchelf; do
    command -v $tool >/dev/null || fail "$tool is missing (make deps; patchelf is Debian's package patchelf)"
done

STAGE="$BUILD/gpu-pack.d"
ROOT_DIR="$STAGE/tp-gpu-pack"
rm -rf "$STAGE"
mkdir -p "$ROOT_DIR/build/lib" "$ROOT_DIR/build/mpi/bin" "$ROOT_DIR/build/mpi/lib/openmpi" \
    "$ROOT_DIR/build/mpi/lib/pmix" "$ROOT_DIR/build/mpi/share" "$ROOT_DIR/build/mpi/etc"

# The repository's tracked files, as they are in this tree; and their
# checksums, by which gpu-check.sh tells a pack made from another state of
# the repository than the one beside it.
git ls-files -z | tar --null -T - -cf - | tar -C "$ROOT_DIR" -xf -
git ls-files -z | xargs -0 sha256sum >"$ROOT_DIR/PACK-MANIFEST"

# This build's binaries, without their debug information (symbols stay, for
# backtraces).
(cd "$BUILD" && find bin tests bench -type f -perm -u+x ! -name '*.o' ! -name '*.d') | while read -r f; do
    mkdir -p "$ROOT_DIR/build/$(dirname "$f")"
    strip --strip-debug -o "$ROOT_DIR/build/$f" "$BUILD/$f"
done
[ -x "$ROOT_DIR/build/bin/tp-mpirun" ] || fail "$BUILD/bin/tp-mpirun is missing (make gpu-pack builds it)"
# The tests and tp-elastic run `mpirun` from PATH.
ln -s tp-mpirun "$ROOT_DIR/build/bin/mpirun"

# Open MPI's runtime: mpirun and orted, the plugins, help texts, settings.
ompi_path() { ompi_info --path "$1" --parsable | sed -n "s/^path:$1://p"; }
OMPI_PKGLIB=$(ompi_path pkglibdir)
cp -L "$(command -v orterun)" "$(command -v orted)" "$ROOT_DIR/build/mpi/bin/"
cp -r "$(ompi_path pkgdatadir)" "$ROOT_DIR/build/mpi/share/openmpi"
cp "$(ompi_path sysconfdir)"/*.conf "$ROOT_DIR/build/mpi/etc/"
# One machine without ssh: mpirun starts every rank itself.
printf '\n# tp-gpu-pack: one machine, no ssh: mpirun starts every rank itself\nplm = isolated\n' \
    >>"$ROOT_DIR/build/mpi/etc/openmpi-mca-params.conf"

# glibc's libraries (the libc6 package): the GPU machine has its own.
GLIBC=$(dpkg -L libc6 | sed -n 's|.*/\(lib[^/]*\.so[^/]*\)$|\1|p; s|.*/\(ld-linux[^/]*\)$|\1|p' | sort -u)
is_glibc() { echo "$GLIBC" | grep -qx "$1"; }

# The plugins, but those for network fabrics (InfiniBand, UCX, libfabric,
# PSM: their stacks would double the pack, and one machine has no use for
# them) and OpenSHMEM's: Open MPI skips a plugin that is absent.
FABRIC='^lib(ucp|ucs|uct|ucm|fabric|ibverbs|rdmacm|efa|psm|psm2|psm_infinipath|infinipath|nl-[a-z0-9-]*|oshmem)\.so'
# copy_single_node DEST PLUGIN...: copies the plugins that load no fabric
# library (one ldd for all: "PLUGIN:" lines, then what each loads).
copy_single_node() {
    dest=$1
    shift
    ldd "$@" 2>/dev/null | awk -v fabric="$FABRIC" '
        /^[^\t].*:$/ { plugin = substr($0, 1, length($0) - 1); keep[plugin] = 1; next }
        $2 == "=>" && $1 ~ fabric { keep[plugin] = 0 }
        END { for (p in keep) if (keep[p]) print p }' | xargs -r cp -t "$dest"
}
copy_single_node "$ROOT_DIR/build/mpi/lib/openmpi" "$OMPI_PKGLIB"/*.so
# PMIx, which Open MPI's pmix plugin loads, has plugins and help texts of its own.
PMIX_LIB=$(ldd "$ROOT_DIR"/build/mpi/lib/openmpi/mca_pmix_*.so 2>/dev/null | awk '$1 ~ /^libpmix\.so/ {print $3}' | head -n 1)
[ -n "$PMIX_LIB" ] || fail "Open MPI's PMIx plugin or libpmix is missing"
PMIX_DIR=$(dirname "$(readlink -f "$PMIX_LIB")")
[ -d "$PMIX_DIR/pmix" ] && copy_single_node "$ROOT_DIR/build/mpi/lib/pmix" "$PMIX_DIR"/pmix/*.so
[ -d "$PMIX_DIR/../share/pmix" ] && cp -r "$PMIX_DIR/../share/pmix" "$ROOT_DIR/build/mpi/share/pmix"
[ -f "$PMIX_DIR/../share/pmix-mca-params.conf" ] && cp "$PMIX_DIR/../share/pmix-mca-params.conf" "$ROOT_DIR/build/mpi/etc/"

# Every library that the binaries and plugins load (ldd follows them all),
# as "soname path", glibc's and the driver's left out; one that ldd cannot
# find on this machine is an error.
ldd $(find "$ROOT_DIR/build" -type f \( -perm -u+x -o -name '*.so' \)) 2>/dev/null |
    awk '$2 == "=>" {print $1, $3}' | sort -u >"$STAGE/loaded"
: >"$STAGE/libraries"
while read -r name path; do
    is_glibc "$name" && continue
    case $name in libcuda.so* | libnvidia*) continue ;; esac
    [ "$path" = "not" ] && fail "$name, loaded by the build or Open MPI, is not found on this machine"
    echo "$name $path" >>"$STAGE/libraries"
    cp -L "$path" "$ROOT_DIR/build/lib/$name"
done <"$STAGE/loaded"
LIBS=$(awk '{print $1}' "$STAGE/libraries")

# Run paths of the pack's own. Debian builds Open MPI's libraries, plugins,
# mpirun and orted with DT_RUNPATH /usr/lib/x86_64-linux-gnu/openmpi/lib; a
# library's DT_RUNPATH replaces, for its own dependencies, the DT_RPATH of
# the program that loads it, so tp-train found libmpi.so.40 in build/lib and
# then not libopen-rte.so.40 beside it (it ran only under tp-mpirun, which set
# LD_LIBRARY_PATH). Every bundled library, plugin, mpirun and orted gets a
# run path relative to itself that reaches build/lib, the libraries that had
# none too (each then loads whoever loads it, or on its own). DT_RPATH, as
# the programs have (the Makefile): searched before LD_LIBRARY_PATH, so that
# a machine's own Open MPI on it (NVIDIA's containers put HPC-X's there,
# with the same sonames) does not replace a bundled library's siblings.
# set_run_path RUNPATH DIR: every ELF file in DIR (not below) gets RUNPATH.
set_run_path() {
    find "$2" -maxdepth 1 -type f -exec patchelf --force-rpath --set-rpath "$1" {} + ||
        fail "patchelf could not set the run path $1 of the files in $2"
}
# shellcheck disable=SC2016 # $ORIGIN is the loader's, not the shell's
{
    set_run_path '$ORIGIN' "$ROOT_DIR/build/lib"
    set_run_path '$ORIGIN/../../../lib' "$ROOT_DIR/build/mpi/lib/openmpi"
    set_run_path '$ORIGIN/../../../lib' "$ROOT_DIR/build/mpi/lib/pmix"
    set_run_path '$ORIGIN/../../lib' "$ROOT_DIR/build/mpi/bin"
}

CUDA_VERSION=$(sed -n 's/.*NVCC=\([^ ]*\).*/\1/p' "$BUILD/config" | xargs -I{} sh -c '{} --version' 2>/dev/null |
    sed -n 's/.*release \([0-9.]*\).*/\1/p')
{
    echo "revision: $(git describe --always --dirty 2>/dev/null || echo unknown)"
    echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), glibc $(ldd --version | sed -n '1s/.* //p')"
    echo "CUDA: ${CUDA_VERSION:-unknown}"
    echo "build: $(cat "$BUILD/config")"
    echo "libraries: $(echo "$LIBS" | tr '\n' ' ')"
    echo "Open MPI plugins: $(ls "$ROOT_DIR/build/mpi/lib/openmpi" | wc -l), PMIx plugins: $(ls "$ROOT_DIR/build/mpi/lib/pmix" | wc -l)"
} >"$ROOT_DIR/PACK-INFO"

mkdir -p "$(dirname "$PACK")"
# xz's fastest preset with a 64 MiB dictionary: the programs and unit tests
# each carry the same CUDA kernels (about 7 MB a binary, nine of them),
# which a dictionary that long stores once. 38.5 MiB in 23 s on 2 cores
# (248 MB of tar), where -6 (8 MiB) gave 40.8 in 51 s and -2 (2 MiB) 55.8,
# over the bound, in 14; unpacking takes 64 MiB of memory.
tar -C "$STAGE" -cf - tp-gpu-pack | xz --lzma2=preset=1,dict=64MiB -T0 >"$PACK.tmp"
mv "$PACK.tmp" "$PACK"
rm -rf "$STAGE"
size=$(stat -c %s "$PACK")
mib=$(awk -v s="$size" 'BEGIN {printf "%.1f", s / 1048576}')
[ "$size" -le $((LIMIT_MIB * 1048576)) ] || fail "$PACK is $mib MiB, over the limit of $LIMIT_MIB MiB"
echo "gpu-pack: $PACK, $mib MiB (limit $LIMIT_MIB MiB)"
