"""The architecture-specific parts of the walk (native/capture/arch/), each
against glibc's backtrace(), which unwinds with libgcc, an implementation
that shares no code with btcore's:

- a signal frame: the handler's return into the signal trampoline
  (x86-64: glibc's __restore_rt, walked by its CFI; aarch64: the vDSO's
  __kernel_rt_sigreturn or qemu-user's trampoline page, whose rt_sigframe
  the aarch64 unit reads);
- pointer authentication (aarch64): a chain compiled with
  -mbranch-protection=standard, whose return addresses are signed on a CPU
  that implements PAC (qemu's `max` model; ci/arm64.sh runs this file
  under it).
"""
import ctypes
import os

import pytest

import btcore
import conftest
from btcore._native import ffi, lib
from conftest import build_chain as bc
from oracles import BIG

ARCH = ffi.string(lib.btc_arch(ffi.new("int *"), ffi.new("int *"), ffi.new("int *"))).decode()
AT_HWCAP = 16
HWCAP_PACA = 1 << 30     # aarch64: address authentication with the A key
PACIASP = 0xd503233f     # hint #25: sign lr with sp as the modifier


def glibc_shares_our_outer_frames(chain, run):
    """Run the chain with glibc's backtrace() taken in its innermost native
    function and collect(python=False) in the Python callback above it:
    every frame glibc saw from that function's caller outward must be our
    outer suffix, address by address.  Returns (ours, glibc)."""
    _, lib_, _ = chain
    got = {}

    def in_callback(tag):
        got["bt"] = btcore.collect(python=False, capacity=BIG)
        return 0

    lib_.g_glibc_bt_enabled = 1
    try:
        chain.call(run, 0, in_callback)
    finally:
        lib_.g_glibc_bt_enabled = 0
    glibc = chain.glibc_backtrace()
    assert 4 <= len(glibc) < 1024, "glibc backtrace() missing or overflowed"
    assert not got["bt"].truncated
    ours = [f.ip for f in got["bt"].frames() if not f.inlined]
    shared = glibc[1:]
    k = len(ours) - len(shared)
    assert k > 0, (ours, glibc)
    assert [hex(a) for a in ours[k:]] == [hex(a) for a in shared], \
        "collect(python=False) disagrees with glibc backtrace() on the shared outer frames"
    return ours[k:], glibc


def in_function(addr, chain, which, size=4096):
    start = chain.fn_addr(which)
    return start < addr <= start + size


@conftest.skip_under_asan
def test_signal_frame_matches_glibc_backtrace(chain):
    """Guards the walk through a signal frame: inside a SIGUSR1 handler
    (chain_signal -> raise -> kernel -> handler -> Python), our native
    frames from the trampoline outward equal glibc's, so the interrupted
    frames (raise's, chain_signal's, the caller's) are all there."""
    shared, _ = glibc_shares_our_outer_frames(chain, chain.lib.chain_signal)
    assert any(in_function(a, chain, bc.FN_SIGNAL) for a in shared), "chain_signal's frame is missing"


def pac_chain(tmp_path_factory):
    flags = ["-mbranch-protection=standard"]
    return bc.build(tmp_path_factory.mktemp("chain_pac"), flags, name="_btfix_chain_pac")


def signs_return_addresses(chain, which):
    """Does the function start (within its first 4 instructions) with paciasp?"""
    words = (ctypes.c_uint32 * 4).from_address(chain.fn_addr(which))
    return PACIASP in list(words)


@pytest.mark.skipif(ARCH != "aarch64", reason="aarch64's pointer authentication")
@conftest.skip_under_asan
def test_signed_return_addresses_match_glibc_backtrace(tmp_path_factory):
    """Guards pointer authentication: through functions that sign their
    return address (paciasp; DW_CFA_AARCH64_negate_ra_state in their CFI),
    on a CPU that really signs (qemu's max model), the walk strips the
    signature and equals glibc's backtrace(); without stripping, the first
    signed return address would point nowhere and end the walk."""
    libc = ctypes.CDLL(None)
    libc.getauxval.restype = ctypes.c_ulong
    if not libc.getauxval(AT_HWCAP) & HWCAP_PACA:
        pytest.skip("CPU without pointer authentication (run under QEMU_CPU=max)")
    chain = pac_chain(tmp_path_factory)
    assert signs_return_addresses(chain, bc.FN_DESCEND)
    assert signs_return_addresses(chain, bc.FN_CHAIN_STATIC)
    shared, _ = glibc_shares_our_outer_frames(chain, chain.lib.chain_entry)
    assert in_function(shared[0], chain, bc.FN_CHAIN_STATIC)
    assert in_function(shared[1], chain, bc.FN_CHAIN_ENTRY)


def test_process_dump_refused_where_registers_are_not_parsed(monkeypatch):
    """Guards: on a machine but x86-64 (whose ptrace and core registers the dump parses), dumping
    another process raises DumpError before it stops anything (this is x86-64: the machine is faked)."""
    from btcore.remote import process
    if ARCH == "x86-64":
        monkeypatch.setattr(process.os, "uname", lambda: os.uname_result(("Linux", "host", "6.1", "#1", "aarch64")))
    monkeypatch.setattr(process, "snapshot_live", lambda *a, **k: pytest.fail("a thread was stopped"))
    with pytest.raises(process.DumpError, match="x86-64 only, not aarch64"):
        process.dump_process(os.getpid())
