"""Shared fixtures for btcore's tests.

``chain``: the native call-chain fixture (tests/fixtures/chain.cpp), compiled
once per session with cffi (API mode, C++, -O2 -g, no frame pointers) into a
temporary directory.  It unpacks as ``ffi, lib, so_path``; see
tests/fixtures/build_chain.py for the callback helpers.

``chain_symbols``: name -> (start, end) absolute address ranges of the chain's
functions, read from the .so's symbol table with pyelftools (an oracle
independent of btcore's own symbolizer).
"""
import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_build_chain():
    name = "btfix_build_chain"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "fixtures", "build_chain.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


build_chain = _load_build_chain()


@pytest.fixture(scope="session")
def chain(tmp_path_factory):
    return build_chain.build(tmp_path_factory.mktemp("chain_build"))


@pytest.fixture(scope="session")
def chain_symbols(chain):
    """{symbol name (raw, as in .symtab): (start, end)} absolute, for FUNC symbols."""
    from elftools.elf.elffile import ELFFile

    syms = {}
    with open(chain.so_path, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        assert symtab is not None, "fixture .so has no .symtab"
        for s in symtab.iter_symbols():
            if s["st_info"]["type"] == "STT_FUNC" and s["st_value"]:
                syms[s.name] = (s["st_value"], s["st_value"] + s["st_size"])
    bias = chain.fn_addr(build_chain.FN_CHAIN_ENTRY) - syms["chain_entry"][0]
    return {name: (lo + bias, hi + bias) for name, (lo, hi) in syms.items()}
