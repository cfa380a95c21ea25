"""Contracts checked directly, each by the input that tells a right
implementation from an off-by-one one (tests that a one-line mutation of the
product must fail; tests/mutations/run.py checks that they do):

* the stack view [lo, hi): the last readable word is hi - 8; hi, misaligned
  addresses and addresses below lo are refused;
* the walker refuses a frame whose CFA lies past the view's end, even when
  the return address itself would be readable;
* a read through a pipe (where process_vm_readv is missing: qemu-user)
  copies what is readable, exactly, and refuses an unreadable page and a
  size above a pipe's;
* the main thread's stack end is learnt once and given for addresses in
  that stack only (the kernel's [stack] mapping is the oracle);
* a thread's CPU clock is the kernel's for that thread (glibc's
  pthread_getcpuclockid() is the oracle), stays put while the thread
  sleeps and is refused for a thread that is not the interpreter's;
* the shared frame cache stays within its bound;
* a cached Python entry keeps its code object alive (its key holds the code
  object's address) until the cache drops the entry.
"""
import ctypes
import gc
import mmap
import platform
import subprocess
import sys
import threading
import time
import weakref

import pytest

import btcore
from btcore._native import ffi, lib

WORD = 8


@pytest.fixture
def view():
    """A 16-word buffer and the view [lo, hi) over its middle 8 words, so a
    read just past either end of the view is still inside the buffer (a
    wrongly accepted read returns a value instead of faulting)."""
    buf = ffi.new("uintptr_t[16]", [0x1000 + i for i in range(16)])
    lo = int(ffi.cast("uintptr_t", buf)) + 4 * WORD
    return buf, lo, lo + 8 * WORD


def read(lo, hi, addr):
    out = ffi.new("uintptr_t *")
    return out[0] if lib.btc_test_mem_read(lo, hi, addr, out) else None


def test_stack_view_reads_exactly_lo_to_hi(view):
    """Guards btc_mem_read's bounds: [lo, hi - 8] aligned, nothing else."""
    buf, lo, hi = view
    assert read(lo, hi, lo) == buf[4]
    assert read(lo, hi, hi - WORD) == buf[11]       # the last word of the view
    assert read(lo, hi, hi) is None                 # one word past it
    assert read(lo, hi, hi - WORD + 4) is None      # misaligned, straddling hi
    assert read(lo, hi, lo + 4) is None             # misaligned inside
    assert read(lo, hi, lo - WORD) is None          # below lo


def test_piped_read_copies_readable_memory_and_refuses_the_rest():
    """Guards btc_read_piped: the kernel checks the source, as for
    process_vm_readv; an unreadable page is refused, never faulted on."""
    src = bytes(range(256)) * 16   # 4,096 bytes: the most a pipe read takes
    at = ctypes.cast(ctypes.c_char_p(src), ctypes.c_void_p).value
    out = ffi.new("uint8_t[]", len(src) + 1)
    assert lib.btc_test_read_piped(at, len(src), out) == 1
    assert ffi.buffer(out, len(src))[:] == src
    assert lib.btc_test_read_piped(at, len(src) + 1, out) == 0   # above a pipe's size
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    page = libc.mmap(None, mmap.PAGESIZE, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)   # PROT_NONE
    assert page not in (None, ctypes.c_void_p(-1).value)
    try:
        assert lib.btc_test_read_piped(page, WORD, out) == 0
    finally:
        libc.munmap(ctypes.c_void_p(page), ctypes.c_size_t(mmap.PAGESIZE))
    assert lib.btc_test_read_piped(0, WORD, out) == 0


def _stack_mapping():
    """[lo, hi) of the kernel's [stack] mapping (the main thread's stack)."""
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith("[stack]"):
                lo, hi = line.split()[0].split("-")
                return int(lo, 16), int(hi, 16)
    pytest.skip("no [stack] mapping listed")


def test_main_stack_end_is_the_stack_mappings_end_for_its_addresses_only():
    """Guards btc_main_stack_end: another thread's main greenlet is captured
    up to the end the kernel gives the main thread's stack, read once."""
    lo, hi = _stack_mapping()
    assert lib.btc_test_main_stack_end(hi - WORD) == hi
    assert lib.btc_test_main_stack_end(hi - 64 * 1024) == hi
    assert lib.btc_test_main_stack_end(hi) == 0                     # one past its end
    assert lib.btc_test_main_stack_end(id(object())) == 0          # the heap, below the stack
    found = []
    thread = threading.Thread(target=lambda: found.append(lib.btc_test_main_stack_end(
        int(ffi.cast("uintptr_t", ffi.new("char[8]"))))))   # heap again, from a thread: the cache holds
    thread.start()
    thread.join()
    assert found == [0]
    assert lib.btc_test_main_stack_end(hi - WORD) == hi


def test_thread_cpu_clock_is_the_kernels_and_stands_still_while_the_thread_sleeps():
    """Guards btc_thread_cpu_ns, on which the profiler reuses an idle
    thread's last stack: equal to glibc's clock of that thread while it
    sleeps, moving when it runs, -1 for an ident that is no thread's."""
    go, went, done = threading.Event(), threading.Event(), threading.Event()

    def worker():
        go.wait()
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        went.set()
        done.wait()

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        time.sleep(0.05)   # parked in go.wait()
        clock = time.pthread_getcpuclockid(thread.ident)
        asleep = lib.btc_thread_cpu_ns(thread.ident)
        assert asleep == time.clock_gettime_ns(clock) > 0
        time.sleep(0.02)
        assert lib.btc_thread_cpu_ns(thread.ident) == asleep
        go.set()
        went.wait()
        time.sleep(0.02)   # parked in done.wait()
        after = lib.btc_thread_cpu_ns(thread.ident)
        assert after == time.clock_gettime_ns(clock)
        assert after - asleep >= 40_000_000   # its 50 ms of CPU
        assert lib.btc_thread_cpu_ns(threading.get_ident()) > 0
        assert lib.btc_thread_cpu_ns(12345) == -1
    finally:
        go.set()
        done.set()
        thread.join()


# A function whose CFI says: CFA = sp + 16, return address at CFA - 16 (at
# sp).  Unlike the usual CFA - 8, the return address of a frame whose CFA
# is hi + 8 lies inside the view, so only the walker's CFA check can refuse
# that frame.  (The return-address column: rip, 16, on x86-64; x30 on aarch64.)
ODD_CFI = r"""
__asm__(".text\n.globl odd_cfi\n.type odd_cfi,%%function\nodd_cfi:\n"
        ".cfi_startproc\n.cfi_def_cfa %s, 16\n.cfi_offset %d, -16\n"
        "nop\nnop\nnop\nret\n.cfi_endproc\n.size odd_cfi, .-odd_cfi\n");
""" % (("sp", 30) if platform.machine() == "aarch64" else ("%rsp", 16))


@pytest.fixture(scope="module")
def odd_cfi_pc(tmp_path_factory):
    """A pc inside odd_cfi, past its CFI's first row (the library stays loaded)."""
    import cffi
    d = tmp_path_factory.mktemp("odd_cfi")
    (d / "odd.c").write_text(ODD_CFI)
    so = d / "odd.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(d / "odd.c")], check=True)
    loader = cffi.FFI()
    loader.cdef("void odd_cfi(void);")
    odd = loader.dlopen(str(so))
    yield int(loader.cast("uintptr_t", odd.odd_cfi)) + 1
    del odd


def test_walker_refuses_a_frame_past_the_views_end(view, odd_cfi_pc):
    """Guards the walker's CFA bound: a CFA above hi ends the walk."""
    pc = odd_cfi_pc
    buf, lo, hi = view
    for i in range(16):
        buf[i] = pc       # every saved return address: back into odd_cfi
    pcs = ffi.new("uintptr_t[16]")

    # CFA = hi exactly: inside the view, the walk takes the step
    assert lib.btc_test_unwind(pc, hi - 16, lo, hi, pcs, 16) == 2
    assert list(pcs[0:2]) == [pc, pc]
    # CFA = hi + 8: refused, although the return address (at hi - 8) is readable
    assert read(lo, hi, hi - WORD) == pc
    assert lib.btc_test_unwind(pc, hi - 8, lo, hi, pcs, 16) == 1


def distinct_code_objects(n):
    """n functions, each its own code object, each returning a capture of
    its own frame (so every resolution below adds new cache entries)."""
    src = "".join(f"def f{i}():\n    return btcore.collect(native=False, limit=2)\n" for i in range(n))
    namespace = {"btcore": btcore}
    exec(compile(src, "<contracts>", "exec"), namespace)
    return [namespace[f"f{i}"] for i in range(n)]


@pytest.fixture
def small_cache():
    old = btcore.cache.maxsize
    btcore.cache.resize(50)
    yield btcore.cache
    btcore.cache.resize(old)


def test_frame_cache_stays_within_its_bound(small_cache):
    """Guards eviction: many distinct resolutions never grow the cache past maxsize."""
    for fn in distinct_code_objects(300):
        assert fn().frames()
        assert len(small_cache) <= 50
    assert len(small_cache) == 50


def test_cached_python_entry_keeps_its_code_object_alive():
    """Guards the pin: a cache key holds id(code), so the code object must
    live as long as the entry (else a new object at that address would
    resolve to the dead one's name)."""
    fn, = distinct_code_objects(1)
    code = weakref.ref(fn.__code__)
    bt = fn()
    assert bt.frames()[0].function == "f0"
    del fn, bt
    gc.collect()
    assert code() is not None, "the cached entry let its code object die"
    btcore.cache.clear()
    gc.collect()
    assert code() is None, "something other than the cache kept the code object"


def odd_cfi_row(pc):
    """The CFI row covering pc (odd_cfi's: CFA = sp + 16, return address at CFA - 16)."""
    bias = ffi.new("uintptr_t *")
    n = lib.btc_cfi_rows(pc, ffi.NULL, 0, bias)
    rows = ffi.new("btc_cfi_row[]", n)
    assert lib.btc_cfi_rows(pc, rows, n, bias) == n
    covering = [i for i in range(n) if rows[i].pc <= pc - bias[0]][-1]
    assert (rows[covering].cfa_off, rows[covering].ra_off) == (16, -16)
    return ffi.new("btc_cfi_row *", rows[covering])   # a copy: `rows + covering` would not keep rows alive


def test_plain_frames_are_read_in_place_only_inside_the_view(view, odd_cfi_pc):
    """Guards the walker's one bounds test per plain frame (unwind.c
    frame_at): the frame [sp, CFA) is read in place only when it lies
    in the view; at CFA = hi + 8 (its return address, at hi - 8, readable)
    or sp = lo - 8, the rule interpreter takes the frame, read by read."""
    buf, lo, hi = view
    row = odd_cfi_row(odd_cfi_pc)
    regs = ffi.new("uintptr_t[4]")
    out = ffi.new("uintptr_t[5]")

    def plain_step(sp):
        regs[1] = sp
        return lib.btc_test_plain_step(row, regs, lo, hi, out)

    assert plain_step(hi - 16) == 1 and out[0] == buf[10] and out[1] == hi   # CFA = hi: inside
    assert plain_step(hi - 8) == 2      # CFA = hi + 8
    assert plain_step(lo) == 1 and out[0] == buf[4]
    assert plain_step(lo - WORD) == 2   # the frame starts below the view
    assert plain_step(lo + 4) == 2      # misaligned


def test_walk_before_the_eval_loop_is_known_still_merges():
    """The walker caches per pc whether it runs the eval loop; a native walk
    made before the eval loop's ranges are found (btc_backtrace first, in a
    fresh process) must not leave the eval loop's pcs cached as plain
    native frames: the first collect() merges as it does anywhere else."""
    # Every part of btcore imported before the walk: a library loaded between the walk and collect() (greenlet,
    # by a part imported on first use) would empty the walker's cache anyway, and the test could not fail.
    code = ("import btcore; btcore._load_all()\n"
            "from btcore._native import ffi, lib\n"
            "buf = ffi.new('uintptr_t[]', 64)\n"
            "import sys; first = sys.argv[1] == 'walk'\n"
            "assert not first or lib.btc_backtrace(buf, 64) > 3\n"
            "def f(): return btcore.collect()\n"
            "print([fr.kind for fr in f().frames()][:4])\n")
    runs = [subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, timeout=120)
            for how in ("walk", "plain")]
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    assert runs[0].stdout == runs[1].stdout
    assert "native" in runs[0].stdout and runs[0].stdout.startswith("['python'")
