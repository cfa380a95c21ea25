"""cffi build script: compiles native/ into the extension btcore._native.

Run by setuptools during `pip install .` (see setup.py); nothing is compiled
at import time.  Every native/*.c and native/cpython/*.c is part of the
module; a CPython-version unit compiles to nothing on other versions.
"""
import glob
import os
import sysconfig

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE = os.path.join(os.path.dirname(HERE), "native")


def _sources():
    found = glob.glob(os.path.join(NATIVE, "*.c")) + glob.glob(os.path.join(NATIVE, "cpython", "*.c"))
    # setuptools wants paths relative to setup.py
    return sorted(os.path.relpath(p, os.path.dirname(HERE)) for p in found)


def _cdef():
    with open(os.path.join(NATIVE, "btcore_api.h")) as f:
        return f.read()


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "btcore._native",
    '#include "btcore_api.h"\n',
    sources=_sources(),
    include_dirs=[NATIVE, sysconfig.get_paths()["include"]],
    define_macros=[("_GNU_SOURCE", "1")],
    extra_compile_args=["-O2", "-g", "-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wno-unused-function"],
    libraries=["dl", "pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
