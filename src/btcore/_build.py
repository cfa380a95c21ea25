"""cffi build script: compiles native/ into the extension btcore._native.

Run by setuptools during `pip install .` (see setup.py); nothing is compiled
at import time.  Every .c file under native/, in any folder, is part of the
module; a CPython-version unit compiles to nothing on other versions.
"""
import glob
import os
import sysconfig

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))   # src/btcore -> checkout root
NATIVE = os.path.join(ROOT, "native")


def _sources():
    found = glob.glob(os.path.join(NATIVE, "**", "*.c"), recursive=True)
    # setuptools wants paths relative to setup.py
    return sorted(os.path.relpath(p, ROOT) for p in found)


def _cdef():
    with open(os.path.join(NATIVE, "btcore_api.h")) as f:
        return f.read()


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
# btcore's entry points read interpreter state and reference counts, so they
# run with the GIL held.  cffi's generated wrappers release it around every
# call (Py_BEGIN/END_ALLOW_THREADS, expanded after this preamble); taking it
# back inside would cost two GIL hand-offs (~300 ns) per call, more than a
# whole capture.  Entry points doing slow work (reading symbols and debug
# info from files) release the GIL themselves.
PREAMBLE = """
#include "btcore_api.h"
#undef Py_BEGIN_ALLOW_THREADS
#undef Py_END_ALLOW_THREADS
#define Py_BEGIN_ALLOW_THREADS {
#define Py_END_ALLOW_THREADS }
"""

# BTCORE_SANITIZE=1 (ci/asan.sh): AddressSanitizer + UBSan. -fno-wrapv
# undoes Python's -fwrapv, which would hide signed overflow from UBSan.
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-wrapv"] \
    if os.environ.get("BTCORE_SANITIZE") == "1" else []
# BTCORE_FUZZ=1 (ci/fuzz.sh, with CC=clang): ASan plus libFuzzer's coverage
# counters, which atheris reads to steer its mutations into the parsers.
# Their runtime is not linked in: atheris' asan_with_fuzzer.so, preloaded,
# provides it.  No -flto there: clang's LTO needs a linker plugin the
# machine may lack.
FUZZ = os.environ.get("BTCORE_FUZZ") == "1"
LINK_SANITIZE = SANITIZE
if FUZZ:
    SANITIZE, LINK_SANITIZE = ["-fsanitize=address,fuzzer-no-link", "-fno-omit-frame-pointer"], []
# BTCORE_LTO=0 (tests/mutations/run.py): no link-time optimisation, so a
# compiler cache can reuse every unit but the mutated one (with -flto the
# link compiles the whole program again); the product is always built with it.
LTO = [] if FUZZ or os.environ.get("BTCORE_LTO") == "0" else ["-flto"]

ffibuilder.set_source(
    "btcore._native",
    PREAMBLE,
    sources=_sources(),
    include_dirs=[NATIVE, sysconfig.get_paths()["include"]],
    define_macros=[("_GNU_SOURCE", "1")],
    # -flto: the walk crosses units on every frame (table lookup, module
    # lookup, frame-chain reader); link-time inlining removes those calls.
    extra_compile_args=["-O2", "-g", "-std=gnu11", "-fvisibility=hidden", *LTO, "-Wall",
                        "-Wno-unused-function", *SANITIZE],
    extra_link_args=[*LTO, "-O2", *LINK_SANITIZE],
    libraries=["dl", "pthread"],
    py_limited_api=False,  # the core reads CPython internals of one version
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
