"""Checks the include graph of the sources against the declared layering.

The libraries form a strict stack (README.md "Layout of the source"): each
may include its own headers and the public headers of the libraries below
it, never those above, never another library's private headers, and never
the programs'. Programs (programs/) may include the public headers of any
library. Some system headers have one home: HDF5 is the checkpoint
library's, libcurl and OpenSSL the store library's, MPI the MPI
communicator's, the CUDA runtime the CUDA kernels', oneDNN and OpenMP the
CPU's bf16 products'.
Tests and benchmarks may include anything. A few calls are kept out of the
sources altogether (FORBIDDEN_CALLS, each with its reason). A build without
CUDA (make CUDA=0) links kernels/cuda/none.c in place of the .cu files: it
defines every function the headers it includes declare (NO_CUDA_STAND_IN),
or that build fails to link where `make test`'s, with CUDA, does not.

Usage: check-layers.py [ROOT]   exit 0 when the graph follows the rules,
1 with one line per violation otherwise.
"""
import fnmatch
import os
import re
import sys

# The libraries, lowest first.
LAYERS = ["common", "kernels", "store", "ckpt", "reshard", "formats", "model", "trainer", "elastic"]

# What a library offers the ones above it and the programs.
PUBLIC_HEADERS = [
    "common/*.h",
    "kernels/kernels.h",
    "store/store.h",
    "store/staging.h",
    "ckpt/ckpt.h",
    "reshard/reshard.h",
    "formats/formats.h",
    "formats/torch.h",
    "formats/megatron.h",
    "formats/dcp.h",
    "formats/registry.h",
    "model/gpt.h",
    "model/interop.h",
    "trainer/*.h",
    "elastic/elastic.h",
    "elastic/plan.h",
]

# System headers (or patterns of them) and the only places that may include them.
OWNED_SYSTEM_HEADERS = {
    "hdf5.h": ["ckpt/*"],
    "curl/*": ["store/*"],
    "openssl/*": ["store/*"],
    "mpi.h": ["trainer/comm_mpi.c"],
    "cuda_runtime.h": ["kernels/cuda/*"],
    "oneapi/dnnl/dnnl.h": ["kernels/cpu/bf16_products.c"],
    "omp.h": ["kernels/cpu/bf16_products.c"],
}

# Calls no source of the toolkit makes, and why.
FORBIDDEN_CALLS = {
    "asprintf": "the sanitized build suppresses leaks under glibc's vasprintf (tests/lsan.supp)",
    "vasprintf": "the sanitized build suppresses leaks under glibc's vasprintf (tests/lsan.supp)",
}
CALL = re.compile(r"\b(%s)\s*\(" % "|".join(FORBIDDEN_CALLS))

PROGRAMS = "programs"
EXEMPT = ["tests", "bench"]
SOURCE = re.compile(r".*\.(c|h|cu)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def module_of(path):
    return path.split("/", 1)[0]


def is_public(header):
    return any(fnmatch.fnmatch(header, pattern) for pattern in PUBLIC_HEADERS)


def sources(root):
    for top in LAYERS + [PROGRAMS]:
        for folder, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if SOURCE.match(name):
                    yield os.path.relpath(os.path.join(folder, name), root)


def check_file(root, path):
    """Yields a line for each include of path that breaks a rule."""
    module = module_of(path)
    allowed = LAYERS[: LAYERS.index(module) + 1] if module in LAYERS else LAYERS + [PROGRAMS]
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    for number, line in enumerate(lines, 1):
        call = CALL.search(line)
        if call:
            yield "%s:%d: calls %s, which the toolkit does not: %s" % (
                path, number, call.group(1), FORBIDDEN_CALLS[call.group(1)])
        match = INCLUDE.match(line)
        if not match:
            continue
        kind, name = match.groups()
        where = "%s:%d" % (path, number)
        if kind == "<":
            for owned, homes in OWNED_SYSTEM_HEADERS.items():
                if fnmatch.fnmatch(name, owned) and not any(fnmatch.fnmatch(path, home) for home in homes):
                    yield "%s: includes <%s>, which only %s may include" % (where, name, " ".join(homes))
            continue
        target = os.path.normpath(os.path.join(os.path.dirname(path), name))
        if target.startswith("..") or not os.path.isfile(os.path.join(root, target)):
            yield "%s: includes \"%s\", which is not a file of the source tree" % (where, name)
            continue
        other = module_of(target)
        if other == module:
            continue
        if other not in allowed:
            yield "%s: includes %s: %s may use only %s" % (where, target, module, " ".join(allowed[:-1]) or "nothing")
        elif not is_public(target):
            yield "%s: includes %s, a private header of %s (public: its %s)" % (
                where, target, other,
                " ".join(p for p in PUBLIC_HEADERS if module_of(p) == other))


# The stand-in for the CUDA entry points and the headers that declare them.
NO_CUDA_STAND_IN = "kernels/cuda/none.c"


def no_cuda_gaps(root):
    """Functions declared by the headers the stand-in includes (from the
    CUDA folder) that it does not define."""
    path = os.path.join(root, NO_CUDA_STAND_IN)
    if not os.path.isfile(path):
        return []
    stand_in = re.sub(r"/\*.*?\*/", "", open(path, errors="replace").read(), flags=re.S)
    defined = set(re.findall(r"\b(\w+)\s*\([^;{]*\)\s*\{", stand_in))
    gaps = []
    for name in re.findall(r'#include\s+"([^"]+\.h)"', stand_in):
        header = os.path.normpath(os.path.join(os.path.dirname(NO_CUDA_STAND_IN), name))
        if module_of(header) != "kernels" or not header.startswith("kernels/cuda/"):
            continue
        text = re.sub(r"/\*.*?\*/", "", open(os.path.join(root, header), errors="replace").read(), flags=re.S)
        for declared in re.findall(r"^[A-Za-z_][\w \*]*?\b(\w+)\s*\([^;{]*\)\s*;", text, re.M):
            if declared not in defined:
                gaps.append("%s: declares %s, which %s does not define (a build without CUDA fails to link)" % (
                    header, declared, NO_CUDA_STAND_IN))
    return gaps


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    root = os.path.abspath(root)
    for top in LAYERS + [PROGRAMS]:
        if not os.path.isdir(os.path.join(root, top)):
            print("check-layers: %s has no %s/ folder" % (root, top), file=sys.stderr)
            return 1
    violations = [v for path in sources(root) for v in check_file(root, path)] + no_cuda_gaps(root)
    for v in violations:
        print("check-layers: " + v, file=sys.stderr)
    if violations:
        print("check-layers: %d line%s break the layering (%s, programs on top) or its rules" % (
            len(violations), "" if len(violations) == 1 else "s", " < ".join(LAYERS)), file=sys.stderr)
        return 1
    print("layers: %s < programs; every include follows them, no source calls %s" % (
        " < ".join(LAYERS), " or ".join(FORBIDDEN_CALLS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
