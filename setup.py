# cffi compiles the native unwind core (native/) into btcore._native at install time.
from setuptools import setup

setup(cffi_modules=["src/btcore/_build.py:ffibuilder"])
