"""Another process's memory (native/remote/rmem.c), read the way a dump's
stop reads it: chunks prefetched in batches and many ranges in one call,
large jobs shared with a second thread, slice by slice.  The oracle is /proc/PID/mem (the
kernel's other path into a process's memory, not process_vm_readv).
Where process_vm_readv is refused (qemu-user has none) the same reads must
come through /proc/PID/mem, with the same results.

The target maps 6 MiB of random bytes and unmaps three holes in it: a batch
of process_vm_readv stops at a hole, and the reads must go on after it, in
every slice of a shared job.
"""
import ctypes
import os
import random
import subprocess
import sys

import pytest

from btcore._native import ffi, lib

PAGE = 4096
REGION = 4000 * PAGE   # slices of IOV_MAX pages (a job is claimed in about 8 slices), across the holes
HOLES = (300, 301, 2900)   # page numbers unmapped (300-301: two pages in a row)

TARGET = f"""
import ctypes, mmap, os, sys
region = mmap.mmap(-1, {REGION})
region.write(os.urandom({REGION}))
base = ctypes.addressof(ctypes.c_char.from_buffer(region))
libc = ctypes.CDLL(None, use_errno=True)
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
for page in {HOLES!r}:
    assert libc.munmap(base + page * {PAGE}, {PAGE}) == 0
print(base, flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def target():
    """(pid, base address, oracle(addr, n) -> bytes or None)."""
    proc = subprocess.Popen([sys.executable, "-c", TARGET], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        base = int(proc.stdout.readline())
        mem = os.open(f"/proc/{proc.pid}/mem", os.O_RDONLY)

        def oracle(addr, n):
            try:
                data = os.pread(mem, n, addr)
            except OSError:
                return None
            return data if len(data) == n else None

        yield proc.pid, base, oracle
        os.close(mem)
    finally:
        proc.kill()
        proc.wait(timeout=60)


def process_vm_readv_works(pid, base):
    """Asked of the kernel directly (ctypes), not through btcore."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(8)
    iovec = ctypes.c_size_t * 2   # struct iovec {base, len}
    local, remote = iovec(ctypes.addressof(buf), 8), iovec(base, 8)
    return libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) == 8


@pytest.fixture
def memory(target):
    m = ffi.gc(lib.btc_rmem_open_pid(target[0]), lib.btc_rmem_close)
    return m


def test_the_oracle_sees_the_holes(target):
    pid, base, oracle = target
    assert oracle(base + 299 * PAGE, PAGE) is not None
    assert all(oracle(base + page * PAGE, PAGE) is None for page in HOLES)


def test_prefetched_pages_equal_the_process_memory_around_holes(target, memory):
    # guards: the slices of a shared prefetch read every page, go on past a page they cannot read, and mark
    # each page valid exactly when it was read.
    pid, base, oracle = target
    pages = [base + p * PAGE for p in range(REGION // PAGE)]
    random.Random(1).shuffle(pages)   # the prefetch sorts them itself
    lib.btc_rmem_prefetch(memory, pages, len(pages))
    after_prefetch = lib.btc_rmem_syscalls(memory)
    if process_vm_readv_works(pid, base):
        assert after_prefetch <= 16, f"{after_prefetch} syscalls for {len(pages)} pages: not batched"
    # else (qemu-user implements no process_vm_readv) the pages were read one by one through /proc/PID/mem
    buf = ffi.new("char[]", PAGE)
    for addr in sorted(pages):
        got = ffi.buffer(buf, PAGE)[:] if lib.btc_rmem_read(memory, addr, buf, PAGE) == 0 else None
        assert got == oracle(addr, PAGE), f"page {(addr - base) // PAGE}"
    assert lib.btc_rmem_syscalls(memory) == after_prefetch, "pages the prefetch covered were read again"


def test_many_ranges_read_at_once_equal_the_process_memory(target, memory):
    # guards: a shared read_many reads each range into its own place, and a range over a hole is not ok
    # while the ranges after it (in every slice) still are.
    pid, base, oracle = target
    rng = random.Random(2)
    ranges = []
    for _ in range(600):
        size = rng.randrange(1, 5 * PAGE)
        ranges.append((base + rng.randrange(0, REGION - size), size))
    for page in HOLES:   # ranges over each hole, in both halves of the job (in different slices)
        for at in (rng.randrange(len(ranges) // 2), rng.randrange(len(ranges) // 2, len(ranges))):
            ranges.insert(at, (base + page * PAGE - 100, 300))
    assert sum(size for _, size in ranges) > 2 << 20   # large enough for two readers
    dest = [ffi.new("uint8_t[]", size) for _, size in ranges]
    ok = ffi.new("uint8_t[]", len(ranges))
    lib.btc_rmem_read_many(memory, [a for a, _ in ranges], [s for _, s in ranges], dest, len(ranges), ok)
    expected = [oracle(a, s) for a, s in ranges]
    for i, ((addr, size), want) in enumerate(zip(ranges, expected)):
        assert bool(ok[i]) == (want is not None), f"range {i} at page {(addr - base) // PAGE}, {size} bytes"
        if want is not None:
            assert ffi.buffer(dest[i], size)[:] == want, f"range {i}: other bytes than the process holds"


def test_ranges_of_one_size_read_at_once_equal_the_process_memory(target, memory):
    # guards: btc_rmem_read_each reads range i into dest + i * size, also one that straddles two chunks (both
    # prefetched), says not ok for a range over a hole, at 0 or wrapping past the address space's end, and reads
    # the chunks together: a few syscalls, not one per chunk.
    pid, base, oracle = target
    size, rng = 448, random.Random(3)
    addresses = [base + rng.randrange(0, REGION - size) for _ in range(3000)]
    addresses += [base + 5 * PAGE - 100, base + 300 * PAGE - 100, base + 2900 * PAGE + 8, 0, (1 << 64) - 64]
    rng.shuffle(addresses)
    dest, ok = ffi.new("uint8_t[]", len(addresses) * size), ffi.new("uint8_t[]", len(addresses))
    lib.btc_rmem_read_each(memory, addresses, len(addresses), size, dest, ok)
    got = ffi.buffer(dest)[:]
    for i, addr in enumerate(addresses):
        want = oracle(addr, size) if 0 < addr < base + REGION else None
        assert bool(ok[i]) == (want is not None), f"range {i} at {addr:#x}"
        if want is not None:
            assert got[i * size:(i + 1) * size] == want, f"range {i}: other bytes than the process holds"
    if process_vm_readv_works(pid, base):
        assert lib.btc_rmem_syscalls(memory) <= 64, f"{lib.btc_rmem_syscalls(memory)} syscalls: not batched"


REFUSE = """
#include <errno.h>
#include <sys/uio.h>
ssize_t process_vm_readv(int pid, const struct iovec *local, unsigned long nlocal,
                         const struct iovec *remote, unsigned long nremote, unsigned long flags)
{
    errno = ENOSYS;   /* as qemu-user says; a seccomp filter says EPERM */
    return -1;
}
"""


def test_the_same_reads_where_process_vm_readv_is_refused(tmp_path):
    # guards: a prefetch refused process_vm_readv reads its pages through /proc/PID/mem instead of leaving
    # them in the cache as unreadable (a dump's stop would then see none of the target).
    (tmp_path / "refuse.c").write_text(REFUSE)
    shim = tmp_path / "refuse.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "refuse.c")], check=True, timeout=120)
    env = dict(os.environ, LD_PRELOAD=" ".join(filter(None, [os.environ.get("LD_PRELOAD"), str(shim)])))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "prefetched_pages or many_ranges"], env=env, capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(__file__))
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout + done.stderr
