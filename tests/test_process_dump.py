"""python -m btcore dump: another process, from outside (btcore/remote/process.py,
btcore/remote/snapshot.py, native/remote/).

The target (tests/fixtures/dump_target.py) is a gevent program with
greenlets parked in Python, inside a C callback and in socket recv, and a
thread spinning in C with the GIL held.  Before it spins it writes what
btcore.collect(g) sees of every suspended greenlet, in-process: the oracle
the outside view is compared with, frame by frame (native frames by module
and offset, Python frames by function and line).
"""
import difflib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import conftest

from btcore._native import ffi, lib

pytestmark = pytest.mark.skipif(not conftest.DUMPS_OTHER_PROCESSES, reason=conftest.NO_DUMP_HERE)
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
WAIT = 120   # seconds: hang detection only



@pytest.fixture(scope="module")
def spin_so(tmp_path_factory):
    out = tmp_path_factory.mktemp("spin") / "spin.so"
    subprocess.run(["gcc", "-O2", "-g", "-shared", "-fPIC", "-o", str(out), os.path.join(FIXTURES, "spin.c")],
                   check=True, timeout=WAIT)
    return str(out)


@pytest.fixture(scope="module")
def target(chain, spin_so, tmp_path_factory):
    """(process, oracle) of a running dump_target.py, its spinner spinning."""
    folder = tmp_path_factory.mktemp("target")
    oracle, ready = folder / "oracle.json", folder / "ready"
    proc = subprocess.Popen([sys.executable, os.path.join(FIXTURES, "dump_target.py"), chain.so_path, spin_so,
                             str(oracle), str(ready), "600"])
    try:
        conftest.wait_until_ready(proc, ready, WAIT)
        yield proc, json.loads(oracle.read_text())["greenlets"]
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


@pytest.fixture(scope="module")
def inside_text(target, tmp_path_factory):
    """dump_all()'s text, written by the target while its greenlets were parked as they are now."""
    proc, _ = target
    oracle = next(p for p in proc.args if str(p).endswith("oracle.json"))
    with open(f"{oracle}.text") as f:
        return f.read()


def run_dump(*args, env=None):
    done = subprocess.run([sys.executable, "-m", "btcore", "dump", *args], capture_output=True, text=True,
                          timeout=WAIT, cwd="/", env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def comparable(frames):
    """Physical native frames by module and offset, Python frames by name and line."""
    out = []
    for f in frames:
        if f["kind"] == "native" and not f["inlined"]:
            out.append(["native", os.path.basename(f["module"] or "?"), f["offset"], f["function"]])
        elif f["kind"] == "python":
            out.append(["python", f["function"], f["line"]])
    return out


def greenlets_of(doc):
    """{address (hex): comparable frames} of the dump's suspended greenlets (the JSON schema of dump_all: each
    greenlet names its stack; an outside dump's ids are the target's addresses)."""
    stacks = {s["id"]: s for s in doc["stacks"]}
    return {hex(g["id"]): comparable(stacks[g["stack"]]["frames"]) for g in doc["greenlets"]
            if g["state"] == "suspended"}


def thread_stacks(doc):
    """The running stacks of the dump's threads."""
    running = {g["stack"] for g in doc["greenlets"] if g["state"] == "running"}
    return [s for s in doc["stacks"] if s["id"] in running]


def spinner_stack(doc):
    return next(s for s in thread_stacks(doc) if any(f["function"] == "btfix_spin" for f in s["frames"]))


def check_against_oracle(doc, oracle):
    dumped = greenlets_of(doc)
    assert set(dumped) == set(oracle), "the dump lists other greenlets than the process itself sees"
    for address, frames in oracle.items():
        assert dumped[address] == frames, f"greenlet {address}: outside view differs from collect(g)"
    kinds = {tuple(f[1] for f in frames if f[0] == "python") for frames in oracle.values()}
    assert any("<lambda>" in k for k in kinds), "no greenlet parked inside the C callback"
    assert any("SocketMixin.recv" in k for k in kinds), "no greenlet parked in socket recv"
    assert () in kinds, "no greenlet parked without a Python frame"


def test_live_dump_shows_every_greenlet_as_the_process_itself_does(target):
    # guards: the outside view of every suspended greenlet equals collect(g) inside.
    proc, oracle = target
    check_against_oracle(json.loads(run_dump("--json", str(proc.pid))), oracle)


# The dump of a target whose greenlet build is not btcore's (as if build-ids differed: another greenlet release,
# or a target on another CPython version): greenlet's offsets are learned from the target's own objects.
LEARNING_DUMPER = """
import itertools, sys
import btcore.remote.snapshot, btcore.__main__
calls = itertools.count()
btcore.remote.snapshot.file_build_id = lambda path: b"%d" % next(calls)   # never twice alike
sys.exit(btcore.__main__.main(sys.argv[1:]))
"""


def test_a_greenlet_build_not_btcores_is_read_through_offsets_learned_from_the_target(target):
    # guards: greenlet's offsets learned from the target's greenlet objects (btcore/remote/greenlet_offsets.py) give the
    # same outside view of every suspended greenlet as collect(g) inside.
    proc, oracle = target
    check_against_oracle(dump_with(LEARNING_DUMPER, proc.pid), oracle)


def dump_with(dumper: str, pid: int) -> dict:
    """The JSON dump of pid made by a dumper script (python -m btcore dump with one part of btcore replaced),
    which must note nothing."""
    done = subprocess.run([sys.executable, "-c", dumper, "dump", "--json", str(pid)],
                          capture_output=True, text=True, timeout=WAIT, cwd="/")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert not doc["notes"], doc["notes"]
    return doc


ON_311 = sys.version_info[:2] == (3, 11)
NOT_311 = "3.11's entry flag is a byte of the frame (a 3.11 interpreter's own frames are the test's input)"


def layout_311():
    """The one layout table for this 3.11 interpreter (native/remote/pylayout.c)."""
    lay = ffi.new("btc_remote_layout *")
    assert lib.btc_remote_layout_of(sys.hexversion, lay) == 0
    return lay


@pytest.mark.skipif(not ON_311, reason=NOT_311)
def test_a_frame_read_while_it_changes_gives_an_entry_flag_not_garbage():
    # guards: is_entry, a C bool in the target's frame, is read as a byte: a frame read while it changes (the
    # rehearsal reads a running target) may hold any value there, and loading such a bool is undefined (UBSan
    # caught one in a CI run of the many-dumps test). Here: 185 in it reads as "entry", 0 in its caller as not
    # (the outermost frame, which ends the chain, is an entry whatever it says).
    import ctypes
    from btcore.remote.snapshot import Memory
    lay = layout_311()
    code = test_a_frame_read_while_it_changes_gives_an_entry_flag_not_garbage.__code__
    frames, frame_object = [ctypes.create_string_buffer(256) for _ in range(3)], ctypes.create_string_buffer(64)
    at = [ctypes.addressof(f) for f in frames]
    for i, (flag, lasti) in enumerate([(185, 2), (0, 4), (0, 6)]):
        ctypes.c_void_p.from_address(at[i] + lay.frame_executable).value = id(code)
        ctypes.c_void_p.from_address(at[i] + lay.frame_instr_ptr).value = id(code) + lay.code_adaptive + lasti
        ctypes.c_uint8.from_address(at[i] + lay.frame_is_entry).value = flag
        ctypes.c_void_p.from_address(at[i] + lay.frame_previous).value = at[i + 1] if i < 2 else 0
    ctypes.c_void_p.from_address(ctypes.addressof(frame_object) + lay.frame_object_f_frame).value = at[0]
    memory = Memory(lib.btc_rmem_open_pid(os.getpid()))
    try:
        out = ffi.new("btc_remote_pyframe[4]")
        assert lib.btc_remote_object_frames(memory.handle, lay, ctypes.addressof(frame_object), out, 4) == 3
        assert [(f.code, f.lasti, f.entry) for f in out[0:3]] == [(id(code), 2, 1), (id(code), 4, 0), (id(code), 6, 1)]
    finally:
        memory.close()


def suspended_groups(text):
    """Sorted (count, body) of the text dump's groups of suspended greenlets, header lines aside: their
    frames as printed (folded), not the names or threads of their members (names are not read from outside)."""
    import re
    groups = []
    for section in text.split("\n=== stack ")[1:]:
        lines = section.split("\n=== thread ")[0].rstrip("\n").split("\n")   # the tree follows the last group
        head = re.fullmatch(r"\d+: (\d+) greenlets?, suspended ===", lines[0])
        body = [ln for ln in lines[1:] if not ln.startswith(("  e.g. ", "  thread: ", "  threads: ", "  last ran"))]
        if head:
            groups.append((int(head.group(1)), "\n".join(body)))
    return sorted(groups)


def test_outside_text_equals_dump_all_inside(target, inside_text):
    # guards: one back half: the outside dump's stacks are Backtraces grouped, folded and printed by views/dump.py,
    # so every group of suspended greenlets (in Python, in a C callback, in socket recv, in Cython) reads as
    # dump_all() printed it inside the target, frame for frame, folded lines included.
    proc, _ = target
    outside = suspended_groups(run_dump(str(proc.pid)))
    inside = suspended_groups(inside_text)
    assert len(inside) >= 5 and sum(count for count, _ in inside) >= 7, inside_text
    assert any("... " in body and "interpreter frame" in body for _, body in inside), "nothing folded inside"
    assert outside == inside, "\n".join(difflib.unified_diff(
        [f"{n} {line}" for n, body in inside for line in body.split("\n")],
        [f"{n} {line}" for n, body in outside for line in body.split("\n")], "inside", "outside", lineterm=""))


def test_outside_html_is_write_htmls_page(target):
    # guards: --format html is the page write_html() writes (btcore/views/html.py), with the target's document.
    proc, _ = target
    page = run_dump("--format", "html", str(proc.pid))
    import re
    doc = json.loads(re.search(r'<script type="application/json" id="btcore-data">(.*?)</script>', page,
                               re.S).group(1))
    assert doc["version"] == 2 and doc["pid"] == proc.pid and doc["source"] == f"process {proc.pid}"
    assert "greenlet_rows" in doc and any(f.get("folded") for s in doc["stacks"] for f in s["frames"])


def test_live_dump_shows_the_thread_stuck_in_c_with_the_gil(target):
    # guards: a thread spinning in C is walked from its registers through C into Python.
    proc, _ = target
    stack = spinner_stack(json.loads(run_dump("--json", str(proc.pid))))
    names = [f["function"] for f in stack["frames"]]
    assert names.index("btfix_spin") < names.index("Thread.run") < names.index("start_thread")


def vdso_functions_at(pid, pc):
    """Names of the function symbols of pid's vDSO that hold pc: the oracle is the target's own vDSO image,
    read from /proc/PID/mem and parsed by pyelftools (clock_gettime and __vdso_clock_gettime are aliases)."""
    from elftools.elf.elffile import ELFFile
    with open(f"/proc/{pid}/maps") as f:
        lo, hi = next([int(x, 16) for x in line.split()[0].split("-")] for line in f if line.rstrip().endswith("[vdso]"))
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(lo)
        elf = ELFFile(io.BytesIO(mem.read(hi - lo)))
    vaddr = pc - lo + min(s["p_vaddr"] for s in elf.iter_segments() if s["p_type"] == "PT_LOAD")
    return {s.name for s in elf.get_section_by_name(".dynsym").iter_symbols()
            if s["st_info"]["type"] == "STT_FUNC" and s["st_value"] <= vaddr < s["st_value"] + s["st_size"]}


def test_a_thread_inside_the_vdso_is_named_from_its_symbols(target, tmp_path):
    # guards: the vDSO's file lives until the dump has named its frames (it went with the dump's memory, before
    # the renderers named them: every vDSO frame was "??"), and goes when the command ends. The spinner calls
    # clock_gettime in a loop: most dumps catch it inside the vDSO.
    proc, _ = target
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    for _ in range(40):
        inner = spinner_stack(json.loads(run_dump("--json", str(proc.pid), env=env)))["frames"][0]
        if os.path.basename(inner["module"] or "") == "linux-vdso.so.1":
            break
    else:
        pytest.fail(f"the spinner was not caught inside the vDSO in 40 dumps (last: {inner})")
    names = vdso_functions_at(proc.pid, inner["ip"])
    assert names and inner["function"] in names, (inner, names)
    assert list(tmp_path.iterdir()) == []


def test_text_dump_groups_the_identical_greenlets(target):
    # guards: the text view groups greenlets with identical stacks, like dump_all.
    proc, _ = target
    text = run_dump(str(proc.pid))
    assert text.startswith(f"Process dump, process {proc.pid}: ")   # what the crash report's helper part says
    assert "=== stack " in text and "2 greenlets, suspended" in text   # wait_in_python(3) twice
    assert "in wait_in_c_callback" in text and "btfix::Walker<int>::descend(int)" in text


def test_no_native_and_threads_only(target):
    # guards: --no-native drops every native frame; --threads-only lists no greenlet.
    proc, _ = target
    doc = json.loads(run_dump("--json", "--no-native", "--threads-only", str(proc.pid)))
    assert doc["stacks"] and thread_stacks(doc) == doc["stacks"]
    assert all(f["kind"] == "python" for s in doc["stacks"] for f in s["frames"])
    assert any(f["function"] == "Thread.run" for s in doc["stacks"] for f in s["frames"])


@pytest.mark.skipif(conftest.UNDER_ASAN, reason="gcore writes ASan's reserved shadow and heap: a 71 GB core")
def test_core_file_dump_equals_the_live_view(target, tmp_path):
    # guards: a core file (gcore) gives the same greenlets and frames as the process did.
    proc, oracle = target
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}   # no ASan in gdb (ci/asan.sh)
    subprocess.run(["gcore", "-o", str(tmp_path / "core"), str(proc.pid)], check=True, capture_output=True,
                   timeout=WAIT, env=env)
    core = str(tmp_path / f"core.{proc.pid}")
    doc = json.loads(run_dump("--json", "--core", core, "--exe", sys.executable))
    check_against_oracle(doc, oracle)
    names = [f["function"] for f in spinner_stack(doc)["frames"]]
    assert "btfix_spin" in names and "Thread.run" in names


def test_permission_error_says_what_to_change(target):
    # guards: a dump the system refuses gives one message naming the fix, not a traceback.
    proc, _ = target
    script = textwrap.dedent(f"""
        import os, btcore
        dump, refused = btcore.dump_process, btcore.DumpPermissionError   # imported while root
        os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
        try:
            dump({proc.pid})
        except refused as e:
            print(e)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT, cwd="/")
    assert done.returncode == 0, done.stderr
    assert f"cannot read process {proc.pid}" in done.stdout
    assert "run the dump as root" in done.stdout


def test_a_process_that_is_gone_is_a_clear_error():
    # guards: no such process -> DumpError with the pid, exit status 1.
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=WAIT)
    done = subprocess.run([sys.executable, "-m", "btcore", "dump", str(proc.pid)], capture_output=True,
                          text=True, timeout=WAIT)
    assert done.returncode == 1 and f"no process {proc.pid}" in done.stderr


@pytest.mark.parametrize("kind, why", [("missing", "No such file or directory"), ("directory", "a directory"),
                                       ("fifo", "a FIFO"), ("text", "is not a core file")])
def test_a_core_path_that_is_not_a_core_file_is_a_clear_error(kind, why, tmp_path):
    # guards: --core names a regular file or is refused in one line, never a traceback, and a FIFO is not opened
    # (opening it would wait for a writer that never comes: the command hung).
    path = tmp_path / kind
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "text":
        path.write_text("not a core\n" * 100)
    done = subprocess.run([sys.executable, "-m", "btcore", "dump", "--core", str(path)], capture_output=True,
                          text=True, timeout=WAIT / 4)   # hang detection: the command takes about a second
    assert done.returncode == 1 and done.stderr.startswith("btcore dump: ") and why in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1


DUMPER = """
import io, sys, btcore
pid, count = int(sys.argv[1]), int(sys.argv[2])
for n in range(count):
    try:
        btcore.dump_process(pid, io.StringIO(), threads_only=n % 2 == 1)
    except btcore.DumpError:
        print(n)   # only once the worker has finished
        break
else:
    print(count)
"""


def test_the_target_keeps_working_through_many_dumps(tmp_path):
    # guards: stops and detaches leave the target as it was (its own checks pass, no signal lost).
    worker = subprocess.Popen([sys.executable, os.path.join(FIXTURES, "dump_worker.py"), str(tmp_path / "started")],
                              stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + WAIT
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline and worker.poll() is None, "the worker did not start"
            time.sleep(0.05)
        # One process makes the dumps, through the API, one after the other.
        dumper = subprocess.run([sys.executable, "-c", DUMPER, str(worker.pid), "200"], capture_output=True,
                                text=True, timeout=WAIT * 3, cwd="/")
        assert dumper.returncode == 0, dumper.stderr
        dumps = int(dumper.stdout)
        assert worker.poll() is None, "the worker stopped while it was dumped"
        worker.send_signal(signal.SIGUSR1)   # a signal after the dumps still reaches it
        out, _ = worker.communicate(timeout=WAIT)
    finally:
        worker.kill()
    assert worker.returncode == 0, out
    assert out.startswith("ok"), out
    assert dumps == 200


def test_the_stop_reads_the_target_in_a_few_syscalls(target):
    # guards: the stop re-reads what a rehearsal walked, in batches (not one syscall per chunk of the gc lists).
    from btcore.remote.process import process_stacks
    proc, oracle = target
    snap, stacks = process_stacks(proc.pid)
    assert sum(1 for s in stacks if s.kind == "greenlet") == len(oracle)
    assert snap.stopped_reads <= 16, f"{snap.stopped_reads} syscalls read the target while it was stopped"


PARKED_IN_C = """
import importlib.util, sys, gevent, gevent.event
spec = importlib.util.spec_from_file_location("_btfix_chain", sys.argv[1])
chain = importlib.util.module_from_spec(spec)
spec.loader.exec_module(chain)
event = gevent.event.Event()
chain.ffi.def_extern(name="chain_py_callback")(lambda tag: event.wait() and 0)
parked = [gevent.spawn(chain.lib.chain_entry, 0), gevent.spawn(event.wait)]
gevent.sleep(0)
with open(sys.argv[2], "w") as f:
    f.write("ready")
gevent.sleep(600)
"""


def test_a_module_file_is_read_once_across_dumps_and_again_once_it_changed(chain, tmp_path):
    # guards: a module's image and table belong to its file and outlive the dump that read them (rmodules.c,
    # "Kept files"): dumping the same process again reads no file; a file whose mtime changed is another file,
    # read again, alone; a fork child reads them again.  Every stack of the target stays where it is between the
    # dumps (greenlets parked, one inside a C callback of its own copy of the chain fixture; the hub in epoll_wait).
    from btcore.remote.process import process_stacks
    so, ready = tmp_path / "_btfix_chain.so", tmp_path / "ready"
    shutil.copy(chain.so_path, so)
    proc = subprocess.Popen([sys.executable, "-c", PARKED_IN_C, str(so), str(ready)])
    try:
        conftest.wait_until_ready(proc, ready, WAIT)
        parked = lambda stacks: [s.frames for s in stacks if s.kind == "greenlet"]   # noqa: E731
        _, first = process_stacks(proc.pid)
        assert any(f.module == str(so) for frames in parked(first) for f in frames)
        read = lib.btc_rmodules_images_read()
        _, again = process_stacks(proc.pid)
        assert lib.btc_rmodules_images_read() == read
        assert parked(again) == parked(first)
        now = time.time_ns()
        os.utime(so, ns=(now, now + 1))
        _, changed = process_stacks(proc.pid)
        assert lib.btc_rmodules_images_read() == read + 1
        assert parked(changed) == parked(first)
        child = os.fork()   # a fork child forgets the kept files (their lock may be held by a thread it lacks)
        if child == 0:
            try:
                before = lib.btc_rmodules_images_read()
                _, forked = process_stacks(proc.pid)
                os._exit(0 if parked(forked) == parked(first) and lib.btc_rmodules_images_read() > before else 3)
            except BaseException:
                os._exit(4)
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


def test_kept_module_files_are_bounded_the_longest_unused_dropped_first(spin_so, tmp_path):
    # guards: the files a dump let go of are kept up to a bound (rmodules.c, MAX_KEPT), the longest unused
    # dropped first: 40 distinct files (copies of one library: 40 inodes) made into tables by one set and let
    # go; then the last of them is found kept, the first was dropped.
    from elftools.elf.elffile import ELFFile
    with open(spin_so, "rb") as f:
        code = next(seg["p_vaddr"] for seg in ELFFile(f).iter_segments()
                    if seg["p_type"] == "PT_LOAD" and seg["p_flags"] & 1)
    copies = [str(tmp_path / f"copy{i}.so") for i in range(40)]
    for path in copies:
        shutil.copy(spin_so, path)
    lo, hi, bias = ffi.new("uintptr_t[4]"), ffi.new("uintptr_t[4]"), ffi.new("uintptr_t *")

    def tables_of(paths) -> int:
        """Images read to make the tables of these files in one set, then let go."""
        before, modules = lib.btc_rmodules_images_read(), ffi.gc(lib.btc_rmodules_new(), lib.btc_rmodules_free)
        for i, path in enumerate(paths):
            assert lib.btc_rmodules_add(modules, ffi.NULL, os.fsencode(path), (i + 1) << 24, 0, bias) == 0
            lib.btc_rmodules_eval_ranges(modules, bias[0] + code, lo, hi, 4)   # makes its table first
        ffi.release(modules)
        return lib.btc_rmodules_images_read() - before

    assert tables_of(copies) == 40
    assert tables_of(copies[-1:]) == 0
    assert tables_of(copies[:1]) == 1


# A dumper that pauses inside the stopped window (test-only: it wraps btcore's
# own functions): "copy" after the copies are made, "detach" after the first
# thread is let go.  It has a thread of its own, as applications do (then the
# kernel may hand SIGINT to any thread that does not block it).  It prints
# the dump, or "interrupted" and waits for its stdin to close; with a fourth
# argument, "cli", it is python -m btcore dump PID (its main()).
PAUSING_DUMPER = """
import os, signal, sys, threading, time, btcore, btcore.remote.snapshot as remote
pid, where, marker = int(sys.argv[1]), sys.argv[2], sys.argv[3]
cli = sys.argv[4:] == ["cli"]
signal.signal(signal.SIGINT, signal.default_int_handler)   # a shell's background job starts with SIGINT ignored
threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()

def pause():   # long enough for a loaded machine to look at the target meanwhile; the test may end it sooner
    open(marker, "w").close()
    end = time.monotonic() + float(os.environ.get("PAUSE_SECONDS", "5"))
    while os.path.exists(marker) and time.monotonic() < end:
        time.sleep(0.01)

real_gather, real_lib = remote.gather, remote.lib

def gather(target, regs_of, threads_only, room=None):
    copied = real_gather(target, regs_of, threads_only, room)
    if where == "copy" and not room.rehearsal:
        pause()
    return copied

class Lib:
    def __getattr__(self, name):
        return getattr(real_lib, name)

    def btc_ptrace_detach(self, tid, signal):
        done = real_lib.btc_ptrace_detach(tid, signal)
        if where == "detach":
            pause()
        return done

remote.gather, remote.lib = gather, Lib()
if cli:
    from btcore.__main__ import main
    sys.exit(main(["dump", str(pid)]))
try:
    btcore.dump_process(pid, sys.stdout)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.stdin.read()
"""


def thread_states(pid):
    """{tid: State letter} of pid's threads (t: stopped by a tracer)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            out[int(tid)] = next(line.split()[1] for line in f if line.startswith("State:"))
    return out


def start_worker(tmp_path):
    worker = subprocess.Popen([sys.executable, os.path.join(FIXTURES, "dump_worker.py"), str(tmp_path / "started")],
                              stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + WAIT
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline and worker.poll() is None, "the worker did not start"
        time.sleep(0.05)
    return worker


def start_pausing_dumper(pid, where, marker, *cli, env=None):
    dumper = subprocess.Popen([sys.executable, "-c", PAUSING_DUMPER, str(pid), where, str(marker), *cli],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                              env=env)
    deadline = time.monotonic() + WAIT
    while not marker.exists():
        assert time.monotonic() < deadline and dumper.poll() is None, "the dumper did not reach its pause"
        time.sleep(0.01)
    return dumper


@pytest.mark.parametrize("where", ["copy", "detach"])
def test_ctrl_c_in_the_stopped_window_still_resumes_the_target(tmp_path, where):
    # guards: SIGINT to the dumper while the target is stopped (copying, or between two detaches) lets every
    # thread of the target run again, also when the dumper lives on after KeyboardInterrupt.
    worker = start_worker(tmp_path)
    dumper = None
    try:
        dumper = start_pausing_dumper(worker.pid, where, tmp_path / "paused")
        assert "t" in thread_states(worker.pid).values(), "the pause is not inside the stopped window"
        dumper.send_signal(signal.SIGINT)
        assert dumper.stdout.readline() == "interrupted\n", dumper.stderr.read()
        assert "t" not in thread_states(worker.pid).values(), "a thread of the target is left stopped"
        dumper.stdin.close()
        assert dumper.wait(timeout=WAIT) == 0, dumper.stderr.read()
        worker.send_signal(signal.SIGUSR1)   # it still runs, and its own checks pass
        out, _ = worker.communicate(timeout=WAIT)
        assert worker.returncode == 0 and out.startswith("ok"), out
    finally:
        worker.kill()
        if dumper is not None:
            dumper.kill()


def test_a_target_named_with_bytes_that_are_not_utf8_is_dumped(tmp_path):
    # guards: /proc's texts of the target (stat, status: its name in them) are read whatever bytes it named
    # itself with (prctl PR_SET_NAME); the dump failed with UnicodeDecodeError after every stop.
    ready = tmp_path / "ready"
    renamed = "import ctypes\nctypes.CDLL(None).prctl(15, b'w\\xff\\xfeorker', 0, 0, 0)\n"   # PR_SET_NAME
    source = renamed + PARKED
    proc = subprocess.Popen([sys.executable, "-c", source, str(ready)])
    try:
        conftest.wait_until_ready(proc, ready, WAIT)
        assert open(f"/proc/{proc.pid}/comm", "rb").read() == b"w\xff\xfeorker\n"
        done = subprocess.run([sys.executable, "-m", "btcore", "dump", str(proc.pid)], capture_output=True,
                              text=True, timeout=WAIT, cwd="/")
        assert done.returncode == 0 and "=== stack 1: 3 greenlets, suspended ===" in done.stdout, done.stderr
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


PARKED_IN_FILES_OF_ITS_OWN = """
import ctypes, os, sys
sys.path.insert(0, sys.argv[3])
import parked_here
ctypes.CDLL(os.path.join(sys.argv[3], "_btfix_chain.so"))   # loaded by this name: the import below finds it loaded
""" + PARKED_IN_C.replace("gevent.spawn(event.wait)]", "gevent.spawn(parked_here.park, event)]").replace(
    "with open(sys.argv[2]", """import btcore
with open(sys.argv[2] + ".inside", "w", encoding="utf-8", errors="strict") as inside:
    btcore.dump_all(inside)
with open(sys.argv[2] + ".json", "w", encoding="utf-8") as inside:
    btcore.dump_all(inside, format="json")
with open(sys.argv[2]""")


def _strings_of(document: str) -> str:
    """A JSON document's strings as they are (a lone surrogate of a path too), in one text."""
    return json.dumps(json.loads(document), ensure_ascii=False)


def test_a_target_whose_files_are_named_with_bytes_that_are_not_utf8_is_dumped(chain, tmp_path):
    # guards: paths are the file system's bytes, not UTF-8 text (os.fsdecode / os.fsencode): the target's maps
    # are read as such (snapshot.open_live: a mapped file named so failed every dump, UnicodeDecodeError), its
    # module is opened by that very name (its C frames named), its code's file name is read exactly as the
    # target holds it (bounds.Names.string), and text goes out escaped where the stream's codec cannot write a
    # lone surrogate (dump.write_text), inside the target as from outside, as Python's tracebacks do.
    # (3.13+ import an extension only by a UTF-8 path: it is loaded by its own path first, then imported through
    # a symbolic link, which the loader finds loaded)
    where = tmp_path / os.fsdecode(b"caf\xe9\xff")
    where.mkdir()
    so, ready, source = where / "_btfix_chain.so", tmp_path / "ready", where / "parked_here.py"
    shutil.copy(chain.so_path, so)
    (tmp_path / "_btfix_chain.so").symlink_to(so)
    source.write_text("def park(event):\n    event.wait()\n")
    escaped = str(source).encode("utf-8", "backslashreplace").decode()   # .../caf\udce9\udcff/parked_here.py
    proc = subprocess.Popen([sys.executable, "-c", PARKED_IN_FILES_OF_ITS_OWN, str(tmp_path / "_btfix_chain.so"),
                             str(ready), str(where)])
    try:
        conftest.wait_until_ready(proc, ready, WAIT)
        inside = (tmp_path / "ready.inside").read_text()
        assert f'File "{escaped}", line 2, in park' in inside and "chain_entry" in inside, inside
        assert str(so) in _strings_of((tmp_path / "ready.json").read_text())
        from btcore.remote.process import process_stacks
        _, stacks = process_stacks(proc.pid)
        frames = [f for s in stacks if s.kind == "greenlet" for f in s.frames]
        assert any(f.module == str(so) and f.function == "chain_entry" for f in frames)
        assert any(f.file == str(source) and f.function == "park" and f.line == 2 for f in frames)
        strict = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
        text = subprocess.run([sys.executable, "-m", "btcore", "dump", str(proc.pid)], capture_output=True,
                              text=True, timeout=WAIT, cwd="/", env=strict)
        assert text.returncode == 0 and f'File "{escaped}", line 2, in park' in text.stdout, text.stderr
        doc = subprocess.run([sys.executable, "-m", "btcore", "dump", "--json", str(proc.pid)], capture_output=True,
                             text=True, timeout=WAIT, cwd="/", env=strict)
        assert doc.returncode == 0 and str(so) in _strings_of(doc.stdout), doc.stderr
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


def test_a_target_another_tracer_holds_is_refused_naming_that_tracer(tmp_path):
    # guards: a thread has one tracer at a time; a dump of a target that another process traces (gdb, strace,
    # another dump: here a dump paused inside its stopped window) says which process holds it, not that this
    # one lacks CAP_SYS_PTRACE; and the target runs again once the first dump is done.
    worker = start_worker(tmp_path)
    dumper = None
    try:
        paused = tmp_path / "paused"
        dumper = start_pausing_dumper(worker.pid, "copy", paused, env={**os.environ, "PAUSE_SECONDS": str(WAIT)})
        second = subprocess.run([sys.executable, "-m", "btcore", "dump", str(worker.pid)], capture_output=True,
                                text=True, timeout=WAIT, cwd="/")
        assert second.returncode == 1, second.stderr
        assert f"traced by process {dumper.pid} (" in second.stderr and "CAP_SYS_PTRACE" not in second.stderr
        paused.unlink()   # the first dump goes on
        out, err = dumper.communicate(timeout=WAIT)
        assert dumper.returncode == 0 and "greenlets" in out, err
        assert "t" not in thread_states(worker.pid).values()
    finally:
        worker.kill()
        if dumper is not None:
            dumper.kill()


def test_sigterm_to_the_dump_command_resumes_the_target_and_removes_its_files(tmp_path):
    # guards: python -m btcore dump handles SIGTERM (a supervisor's stop, timeout(1)) as Ctrl-C: sent while
    # the target is stopped, the target runs again first, the dump's vDSO copy is removed, the command says
    # so and exits with 128 + SIGTERM (by default SIGTERM killed it where it stood, its folder left behind).
    worker = start_worker(tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    dumper = None
    try:
        dumper = start_pausing_dumper(worker.pid, "copy", tmp_path / "paused", "cli",
                                      env={**os.environ, "TMPDIR": str(scratch)})
        assert "t" in thread_states(worker.pid).values(), "the pause is not inside the stopped window"
        assert [p.name[:12] for p in scratch.iterdir()] == ["btcore-vdso-"]
        dumper.send_signal(signal.SIGTERM)
        _, stderr = dumper.communicate(timeout=WAIT)
        assert dumper.returncode == 128 + signal.SIGTERM, stderr
        assert stderr.endswith("btcore dump: terminated (SIGTERM)\n") and "Traceback" not in stderr, stderr
        assert "t" not in thread_states(worker.pid).values(), "a thread of the target is left stopped"
        assert list(scratch.iterdir()) == []
    finally:
        worker.kill()
        if dumper is not None:
            dumper.kill()


def test_a_target_that_dies_while_stopped_gives_a_partial_dump_and_a_note(tmp_path):
    # guards: a target killed inside the stopped window (left a zombie: its parent has not reaped it) ends the
    # dump with what was read and a note, without a hang or a traceback.
    worker = start_worker(tmp_path)
    try:
        dumper = start_pausing_dumper(worker.pid, "copy", tmp_path / "paused")
        worker.kill()   # not reaped until the dump is done
        out, err = dumper.communicate(timeout=WAIT)
        assert dumper.returncode == 0, err
        assert "note: the process exited during the dump" in out, out
        assert "Process dump, process" in out
    finally:
        worker.kill()
        worker.wait(timeout=WAIT)


SID_ROOT = os.environ.get("BTCORE_SID_ROOT", "/var/cache/btcore/sid")
OTHER_TARGET = """
import json, sys, threading, time

def stack():
    out, f = [], sys._getframe(1)
    while f:
        out.append([f.f_code.co_qualname, f.f_lineno])
        f = f.f_back
    return out

def inner(main):
    if main:
        print(json.dumps(stack()), flush=True) or time.sleep(600)
    else:
        started.set() or time.sleep(600)

def outer(main):
    inner(main)

started = threading.Event()
threading.Thread(target=outer, args=(False,), daemon=True).start()
started.wait()
outer(True)
"""




def _has_gevent(version: str, path: str) -> bool:
    """Has the chroot's venv of path (if it is one) gevent and greenlet installed?"""
    if not path.startswith("/opt/btcore-venv-"):
        return True
    site = f"{SID_ROOT}{os.path.dirname(os.path.dirname(path))}/lib/python{version}/site-packages"
    return all(os.path.isdir(f"{site}/{package}") for package in ("gevent", "greenlet"))


def sid_python(version: str, path: str) -> str:
    """An interpreter of the sid chroot (ci/sid-matrix.sh builds it, with a venv per version that has gevent),
    or a skip; .ci/run runs these tests again after that lane with BTCORE_REQUIRE_SID=1: a failure there."""
    if os.path.lexists(SID_ROOT + path) and os.geteuid() == 0 and _has_gevent(version, path):
        return path   # (a venv's python links into the chroot)
    why = (f"no CPython {version} in a sid chroot here (ci/sid-matrix.sh builds it; chroot needs root; a venv "
           f"whose install was cut short has no gevent): {path}")
    if os.environ.get("BTCORE_REQUIRE_SID") == "1":
        pytest.fail(why)
    pytest.skip(why)


def dump_in_chroot(python: str, source: str) -> tuple:
    """(process, the JSON line it printed first, the JSON dump of it made then) of source run by python in the
    sid chroot; the process is gone on return."""
    proc = subprocess.Popen(["chroot", SID_ROOT, python, "-B", "-c", source], stdout=subprocess.PIPE, text=True)
    try:
        oracle = json.loads(proc.stdout.readline())
        return proc, oracle, json.loads(run_dump("--json", str(proc.pid)))
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


@pytest.mark.parametrize("version", ["3.13", "3.14", "3.15"])
def test_a_target_on_another_cpython_is_read_through_its_debug_offsets(version):
    # guards: a 3.13-3.15 target (in a chroot: its files named from the host) gives its threads' Python frames,
    # read through the _Py_DebugOffsets in its _PyRuntime, equal to what it sees of itself, merged in place.
    proc, oracle, doc = dump_in_chroot(sid_python(version, f"/usr/bin/python{version}"), OTHER_TARGET)
    threads = thread_stacks(doc)
    assert len(threads) == 2
    main_stack = next(g["stack"] for g in doc["greenlets"] if g["name"] == f"Thread {proc.pid} (main thread)")
    main = next(s for s in threads if s["id"] == main_stack)
    python = [[f["function"], f["line"]] for f in main["frames"] if f["kind"] == "python"]
    assert python == oracle
    other = next(s for s in threads if s is not main)
    names = [f["function"] for f in other["frames"] if f["kind"] == "python"]
    assert names[:2] == ["inner", "outer"] and "Thread.run" in names
    # The Python frames stand where the eval loop's native frames were, though the stripped interpreter names
    # only a small part of that loop (the rest is found from its jumps): inside PyEval_EvalCode, outside sleep.
    names = [f["function"] for f in main["frames"]]
    assert names.index("clock_nanosleep") < names.index("inner") < names.index("<module>") < \
        names.index("PyEval_EvalCode")


OTHER_GEVENT_TARGET = """
import json, gevent, gevent.event, greenlet

def stack(f):
    out = []
    while f:
        out.append([f.f_code.co_qualname, f.f_lineno])
        f = f.f_back
    return out

event = gevent.event.Event()

def wait_deeper(n):
    if n:
        return wait_deeper(n - 1)
    event.wait()

def report(gs):
    print(json.dumps({hex(id(g)): stack(g.gr_frame) for g in gs}), flush=True)

main = greenlet.getcurrent()
workers = [gevent.spawn(wait_deeper, n) for n in range(3)]
gevent.spawn(report, workers + [main])
gevent.sleep(600)
"""


@pytest.mark.parametrize("version", ["3.13", "3.14", "3.15"])
def test_greenlets_of_a_target_on_another_cpython_are_listed(version):
    # guards: every suspended greenlet of a 3.13-3.15 gevent target, its main greenlet too, is found through its
    # gc lists (their place per version) and read with greenlet offsets learned from its own objects: its Python
    # frames are those CPython gives (gr_frame), merged among gevent's compiled frames, innermost and outermost.
    _, oracle, doc = dump_in_chroot(sid_python(version, f"/opt/btcore-venv-{version}/bin/python"),
                                    OTHER_GEVENT_TARGET)
    assert not doc["notes"], doc["notes"]
    dumped = greenlets_of(doc)
    assert {address: [f[1:] for f in frames if f[0] == "python"] for address, frames in dumped.items()} == oracle
    for address, frames in dumped.items():
        names = [f[3] if f[0] == "native" else f[1] for f in frames]
        assert frames[0][0] == frames[-1][0] == "native", f"greenlet {address}: Python frames not merged in place"
        if address != next(reversed(oracle)):   # a worker, parked in Event.wait (Cython) called from Python
            first = next(i for i, f in enumerate(frames) if f[0] == "python")
            assert "gevent._gevent_cevent.Event.wait [cython]" in names[:first], names


# A thread and a suspended, spilled greenlet whose chains have one call from C in their middle (map calls
# called_from_c through a new eval-loop call) and plain Python calls elsewhere (run inline since 3.11).
ENTRY_TARGET = """
import json, greenlet, time

def called_from_c(park):
    park()
    return 0

def direct(park):
    return list(map(called_from_c, [park]))

def top(park):
    return direct(park)

main = greenlet.getcurrent()
g = greenlet.greenlet(lambda: top(main.switch))
g.switch()
greenlet.greenlet(lambda: [0] * 4096 and main.switch()).switch()   # spills g's stack
top(lambda: print(json.dumps(hex(id(g))), flush=True) or time.sleep(600))
"""


@pytest.mark.parametrize("version", ["3.13", "3.14", "3.15"])
def test_entry_frames_of_a_target_on_another_cpython_split_the_merge(version):
    # guards: the one walker's entry frames on a 3.13-3.15 target (the eval loop's shims on a thread's chain;
    # on a suspended greenlet's, exposed by greenlet, the links it saved, read through the greenlet's heap copy
    # of its stack): the frame map called starts an eval-loop call, so native frames (map's, the eval loop's
    # entry) lie between it and its caller, where a walk without entries would merge them together.
    proc, address, doc = dump_in_chroot(sid_python(version, f"/opt/btcore-venv-{version}/bin/python"), ENTRY_TARGET)
    assert not doc["notes"], doc["notes"]
    stacks_by_id = {s["id"]: s for s in doc["stacks"]}
    main = next(stacks_by_id[g["stack"]] for g in doc["greenlets"]
                if g["state"] == "running" and g["name"].startswith(f"Thread {proc.pid} "))
    stacks = {"thread": comparable(main["frames"]), "greenlet": greenlets_of(doc)[address]}
    for kind, frames in stacks.items():
        names = [f[1] if f[0] == "python" else None for f in frames]
        inner, outer = names.index("called_from_c"), names.index("direct")
        assert inner < outer and None in names[inner:outer], f"{kind}: {names}"
        assert names[outer + 1] == "top", f"{kind}: a plain call is merged in one eval-loop frame: {names}"



PARKED = """
import sys, gevent
parked = [gevent.spawn(gevent.sleep, 600) for _ in range(3)]
gevent.sleep(0)
with open(sys.argv[1], "w") as f:
    f.write("ready")
gevent.sleep(600)
"""

AHEAD_DUMPER = """
import io, os, sys, time
from btcore.remote import process
made = []
class Counted(process._Ahead):
    def __init__(self, todo):
        made.append(sorted({os.path.basename(path) for path, _ in todo}))
        super().__init__(todo)
process._Ahead = Counted
def threads():
    return len(os.listdir("/proc/self/task"))
before, pid = threads(), int(sys.argv[1])
cold = io.StringIO()
process.dump_process(pid, cold)
deadline = time.monotonic() + 10   # joined: its work is done; the OS thread itself ends right after
while threads() > before and time.monotonic() < deadline:
    time.sleep(0.01)
after_cold = threads()
process.dump_process(pid, io.StringIO())   # every native frame named already
os.sched_getaffinity = lambda _: {0}
process._FILE_FRAMES.clear()
process.dump_process(pid, io.StringIO())   # one CPU: nothing to gain from a thread
print(len(made), "libc.so.6" in made[0], after_cold - before, "epoll_wait" in cold.getvalue())
"""


def test_native_frames_are_named_ahead_in_a_thread_gone_with_the_dump(tmp_path):
    # guards: a cold dump names its native frames ahead in a thread of its own (process._Ahead), the frames no
    # dump has named (the hub's libc frame among them); that thread has done its work when dump_process()
    # returns and then ends (on 3.13-3.14 it was still listed in /proc a moment after the join); a dump whose
    # frames are all named already, or on one CPU, starts none.
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU here: no naming ahead")
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", PARKED, str(ready)])
    try:
        conftest.wait_until_ready(proc, ready, WAIT)
        done = subprocess.run([sys.executable, "-c", AHEAD_DUMPER, str(proc.pid)], capture_output=True, text=True,
                              timeout=WAIT)
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "True", "0", "True"]
