"""A dump of a target whose memory is corrupt (docs/safety.md, "hostile
targets"; btcore/remote/bounds.py).

Each target (tests/fixtures/hostile_target.py) parks healthy greenlets and
one victim per corruption, then corrupts one field per victim with ctypes
at the offsets btcore reads: the greenlet, its StackState, its frame object
and interpreter frames, its code object and that code's name and line
table; a sleeping thread's state and frames; the gc lists.  Sentinel values
(0, -1, 2**63, 2**64-16, unaligned, self-cycles, huge counts), then seeded
random words.  Every dump must finish, give every healthy greenlet as a
dump of an uncorrupted target gives it, list each victim with a note (or
not at all, when nothing marks it a greenlet any more) and stay within the
memory bound: the dumper's peak RSS (VmHWM) at most MEMORY_BOUND above the
clean dump's.
"""
import json
import os
import subprocess
import sys

import pytest

import conftest

from btcore._native import ffi, lib

ON_311 = sys.version_info[:2] == (3, 11)
pytestmark = [pytest.mark.skipif(not conftest.DUMPS_OTHER_PROCESSES, reason=conftest.NO_DUMP_HERE),
              pytest.mark.skipif(not ON_311, reason="the corrupting target locates fields with 3.11's layout")]
HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "fixtures", "hostile_target.py")
WAIT = 120                  # seconds: hang detection only
MEMORY_BOUND = 100 << 20    # docs/safety.md: the dumper's peak over a clean dump's, whatever the target holds
HEALTHY = 6
VALUES = ["0", "-1", "2^63", "2^64-16", "unaligned", "self", "huge"]
GREENLET_FIELDS = ["greenlet.pimpl", "state.start", "state.stop", "state.copy", "state.saved", "state.frame",
                   "frameobj.f_frame", "frame.code", "frame.previous", "frame.prev_instr", "frame.flags",
                   "caller.code", "caller.previous", "caller.prev_instr", "code.type", "code.size", "code.filename",
                   "code.qualname", "code.firstlineno", "code.linetable", "qualname.length", "qualname.state",
                   "linetable.size"]
# What a corruption may leave valid as read, so that the victim shows no note: any entry flag and first line
# (frame.flags, code.firstlineno); 0 where greenlet or CPython write 0 too (no top frame, no interpreter frame,
# the end of a chain, an empty name or line table); a count 3 higher; a pointer's tag bits (the 3.12+ walk
# masks them: 3.14's tagged frame references); a string's state bits no reader uses (an address as state may
# hold valid ones).
MAY_PASS_UNNOTED = {"frame.flags", "code.firstlineno"}
MAY_PASS_UNNOTED_AS = {("state.frame", "0"), ("frameobj.f_frame", "0"), ("frame.previous", "0"),
                       ("caller.previous", "0"), ("qualname.length", "0"), ("linetable.size", "0"),
                       ("code.size", "unaligned"), ("qualname.length", "unaligned"), ("frame.code", "unaligned"),
                       ("caller.code", "unaligned"), ("qualname.state", "unaligned"), ("qualname.state", "huge"),
                       ("qualname.state", "2^63"), ("qualname.state", "self")}
SHARED_FIELDS = ["gc.next", "gc.prev", "gchead.next", "tstate.next", "tstate.thread_id",
                 "tstate.native_thread_id", "tstate.cframe", "cframe.current_frame"]

# The dumper: python -m btcore dump, then its peak RSS on stderr's last line.
DUMPER = """
import sys
import btcore.__main__
rc = btcore.__main__.main(sys.argv[1:])
with open("/proc/self/status") as f:
    print(next(line.split()[1] for line in f if line.startswith("VmHWM:")), file=sys.stderr)
sys.exit(rc)
"""
# The one walker (native/remote/rpython.c) as it walks a 3.12+ target, over this 3.11 target: no entry flag in
# the frame, its code a tagged reference (3.14's), shims (owner 3 and up) skipped, and a suspended greenlet's entry frames told by the link greenlet
# would have saved in its frame object's spare storage (3.11's _f_frame_data, 48 bytes in: here whatever the
# frame holds there), followed through the greenlet's view of its stack. Its clean dump differs (fewer entry
# frames); each corrupt one is compared with it.
PORTABLE = """
import btcore.remote.snapshot
real = btcore.remote.snapshot.lib

class AsIfShims:
    def __getattr__(self, name):
        return getattr(real, name)

    def btc_remote_layout_of(self, version_hex, out):
        rc = real.btc_remote_layout_of(version_hex, out)
        out.frame_is_entry, out.shim_owner, out.frame_object_data, out.executable_tag_bits = -1, 3, 48, 3
        return rc

btcore.remote.snapshot.lib = AsIfShims()
"""


def layout_311():
    """The one layout table for this 3.11 interpreter (native/remote/pylayout.c)."""
    lay = ffi.new("btc_remote_layout *")
    assert lib.btc_remote_layout_of(sys.hexversion, lay) == 0
    return lay


def start_target(folder, spec, chain_so=None):
    """(process, its report) of a hostile target, once it has corrupted itself."""
    spec_path, ready = folder / "spec.json", folder / "ready.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.Popen([sys.executable, TARGET, str(spec_path), str(ready)] + ([chain_so] if chain_so else []))
    conftest.wait_until_ready(proc, ready, WAIT)
    return proc, json.loads(ready.read_text())


def dump(pid, portable=False):
    """(The JSON dump of pid, the dumper's peak RSS in bytes)."""
    done = subprocess.run([sys.executable, "-c", (PORTABLE if portable else "") + DUMPER, "dump", "--json",
                           str(pid)], capture_output=True, text=True, timeout=WAIT, cwd="/")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), int(done.stderr.split()[-1]) << 10


def comparable(frames):
    return [(f["kind"], f["function"], f["line"], os.path.basename(f["module"] or "")) for f in frames]


def by_greenlet(doc):
    """{address: (comparable frames, error)} of the dump's greenlets."""
    stacks = {s["id"]: s for s in doc["stacks"]}
    return {hex(g["id"]): (comparable(stacks[g["stack"]]["frames"]), g["error"]) for g in doc["greenlets"]
            if g["state"] == "suspended"}


def greenlet_errors(doc):
    return [g["error"] for g in doc["greenlets"] if g["state"] == "suspended" and g["error"]]


def healthy_view(doc, report):
    """The healthy greenlets' stacks, in the order the target spawned them."""
    dumped = by_greenlet(doc)
    assert set(report["healthy"]) <= set(dumped), "a healthy greenlet is missing from the dump"
    return [dumped[address] for address in report["healthy"]]


@pytest.fixture(scope="module")
def chain_so(chain):
    return chain.so_path


@pytest.fixture(scope="module")
def clean(chain_so, tmp_path_factory):
    """(healthy greenlets' stacks, the dumper's peak RSS, the same walked as a 3.12+ target) of a clean target."""
    proc, report = start_target(tmp_path_factory.mktemp("clean"), {"healthy": HEALTHY, "corrupt": []}, chain_so)
    try:
        doc, peak = dump(proc.pid)
        portable_doc, portable_peak = dump(proc.pid, portable=True)
        view = healthy_view(doc, report)
        assert all(not error for _, error in view), view
        assert any(f[1] == "chain_entry" for f in view[-1][0]), "no healthy greenlet parked inside C"
        return view, peak, healthy_view(portable_doc, report), portable_peak
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


def check(doc, peak, report, clean_view, clean_peak, value=None, strict=True):
    """Finished (dump() checks the exit status), the healthy greenlets as in the clean dump, each victim
    noted or unlisted, within the memory bound."""
    assert peak <= clean_peak + MEMORY_BOUND, f"the dumper peaked {(peak - clean_peak) >> 20} MiB over a clean dump"
    running = {g["stack"] for g in doc["greenlets"] if g["state"] == "running"}
    assert any(s["id"] in running and s["frames"] for s in doc["stacks"]), "no thread's stack"
    dumped = by_greenlet(doc)
    if strict:
        assert healthy_view(doc, report) == clean_view, "a corrupt greenlet changed a healthy one's stack"
    else:   # a corrupt gc list may hide greenlets after it: the listed ones are whole
        kept = [dumped[a] for a in report["healthy"] if a in dumped]
        assert all(v in clean_view for v in kept), "a corrupt list changed a healthy greenlet's stack"
    unnoted = [field for address, field in report["victims"].items()
               if address in dumped and not dumped[address][1] and field not in MAY_PASS_UNNOTED
               and (field, value) not in MAY_PASS_UNNOTED_AS]
    return unnoted


def run_case(folder, spec, chain_so, clean, value=None, strict=True):
    clean_view, clean_peak, portable_view, portable_peak = clean
    proc, report = start_target(folder, spec, chain_so)
    try:
        doc, peak = dump(proc.pid)
        unnoted = check(doc, peak, report, clean_view, clean_peak, value, strict)
        portable_doc, peak = dump(proc.pid, portable=True)
        unnoted += check(portable_doc, peak, report, portable_view, portable_peak, value, strict)
        return unnoted, doc
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


@pytest.mark.parametrize("value", VALUES)
def test_one_corrupt_field_per_greenlet_costs_that_greenlet_a_note(value, chain_so, clean, tmp_path):
    # guards: every field a dump reads of a greenlet (greenlet, StackState, frames, code, names, line table),
    # set to a sentinel, leaves the dump whole (the other greenlets as in a clean dump, both tables) and notes
    # the victim, within the memory bound (remote/bounds.py; native/remote/rpython.c).
    spec = {"healthy": HEALTHY, "corrupt": [[field, value] for field in GREENLET_FIELDS]}
    unnoted, _ = run_case(tmp_path, spec, chain_so, clean, value)
    assert not unnoted, f"victims shown without a note: {unnoted}"


@pytest.mark.parametrize("value", VALUES)
def test_corrupt_thread_states_and_gc_lists_leave_a_dump(value, chain_so, clean, tmp_path):
    # guards: a sleeping thread's state and frames and the gc lists (links of a greenlet, a generation's head),
    # set to a sentinel: the dump finishes within the bound (loops end: _linked, the gc walk's loop watch), the
    # listed greenlets are whole, and the dump says its lists are broken.
    spec = {"healthy": HEALTHY, "corrupt": [[field, value] for field in SHARED_FIELDS]}
    _, doc = run_case(tmp_path, spec, chain_so, clean, value, strict=False)
    if value != "unaligned":   # the low 2 bits of a gc link are flags: +3 leaves a valid link
        assert any("gc lists end before their head" in note for note in doc["notes"]), doc["notes"]


@pytest.mark.parametrize("first_seed", range(0, 48, 8))
def test_random_corruption_of_greenlets_and_frames(first_seed, chain_so, clean, tmp_path):
    # guards: seeded random words in 8 victims' greenlet, StackState, frames and code objects: the dump
    # finishes, the healthy greenlets are whole, within the memory bound (48 seeds in all).
    spec = {"healthy": HEALTHY, "corrupt": [], "random": [[seed, 6] for seed in range(first_seed, first_seed + 8)]}
    run_case(tmp_path, spec, chain_so, clean)


def test_a_huge_instruction_offset_is_refused_not_allocated(chain_so, clean, tmp_path):
    # guards: prev_instr += 0x7ffff000 (the 2.1 GB case): the frame's line is unknown and noted, no
    # code object of that size is built (bounds.line checks the offset against the code's size).
    _, doc = run_case(tmp_path, {"healthy": HEALTHY, "corrupt": [["frame.prev_instr", "huge"]]}, chain_so, clean)
    notes = greenlet_errors(doc)
    assert any("instruction offset" in n and "outside its code" in n for n in notes), notes


def test_a_code_pointer_past_the_address_space_is_noted(chain_so, clean, tmp_path):
    # guards: f_code = 2**64-16 (the OverflowError, exit 1): Memory.read refuses ranges past the
    # address space (bounds.readable), the frame's code is noted as not a code object (the walker, which checks
    # each frame's code type, leaves the frame out and says so).
    _, doc = run_case(tmp_path, {"healthy": HEALTHY, "corrupt": [["frame.code", "2^64-16"]]}, chain_so, clean)
    notes = greenlet_errors(doc)
    assert any("not a code object" in n or "no code object" in n for n in notes), notes


@pytest.mark.parametrize("value", ["self", "0"])
def test_a_heap_copy_over_its_own_state_or_missing_is_noted_as_inconsistent(value, chain_so, clean, tmp_path):
    # guards: StackState.stack_copy = the state's own object (readable: its bytes decode to whatever they
    # decode to, at times a stack with no note, CI's ASan lane at stop 36) or 0 with a saved part: greenlet
    # never writes either, so the dump says the state is inconsistent (rpython.c's inconsistent()).
    _, doc = run_case(tmp_path, {"healthy": HEALTHY, "corrupt": [["state.copy", value]]}, chain_so, clean)
    notes = greenlet_errors(doc)
    assert notes and all("not one greenlet writes" in n for n in notes), notes


def test_a_self_linked_frame_chain_is_cut_with_a_note(chain_so, clean, tmp_path):
    # guards: frame.previous = the frame itself: the walker stops at the loop (Brent's watch in rpython.c), with
    # 3.11's table and walking as for 3.12+, and says so.
    clean_view, clean_peak, portable_view, portable_peak = clean
    proc, report = start_target(tmp_path, {"healthy": HEALTHY, "corrupt": [["caller.previous", "self"]]}, chain_so)
    try:
        victim = next(iter(report["victims"]))
        for portable in (False, True):
            frames, error = by_greenlet(dump(proc.pid, portable)[0])[victim]
            assert error and "loops" in error, error
            assert sum(f[0] == "python" for f in frames) == 2, frames   # the victim's two frames, once each
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


def test_a_greenlet_whose_top_frame_is_unreadable_keeps_its_native_frames(chain_so, clean, tmp_path):
    # guards: an unreadable top frame (BTC_REMOTE_BAD_FRAME) costs the greenlet its Python frames only: its
    # StackState is sound, so its saved stack is walked as a healthy greenlet's is.  Oracle: a healthy greenlet
    # parked in the same Event.wait, whose native frames are the victim's less the eval loop's (which the
    # healthy one shows as its merged Python frames).
    proc, report = start_target(tmp_path, {"healthy": 2, "corrupt": [["state.frame", "2^63"]]})
    try:
        victim = next(iter(report["victims"]))
        for portable in (False, True):
            dumped = by_greenlet(dump(proc.pid, portable)[0])
            frames, error = dumped[victim]
            assert error and "top frame cannot be read" in error, error
            assert frames and all(f[0] == "native" for f in frames), frames
            healthy = [f for f in dumped[report["healthy"][0]][0] if f[0] == "native"]
            assert [f for f in frames if f[1] != "_PyEval_EvalFrameDefault"] == healthy, (frames, healthy)
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


# ---- the bounds themselves, on values made here ----

def test_reads_past_the_address_space_or_the_size_bound_are_refused():
    # guards: Memory.read asks nothing of the target outside bounds.readable (an address past 2**64, a size
    # past MAX_READ: cffi's OverflowError, a buffer of any size), and reads what lies inside.
    from btcore.remote import bounds
    from btcore.remote.snapshot import Memory
    here = ffi.new("char[]", b"hostile")
    memory = Memory(lib.btc_rmem_open_pid(os.getpid()))
    try:
        at = int(ffi.cast("uintptr_t", here))
        assert memory.read(at, 7) == b"hostile"
        assert memory.read((1 << 64) - 16, 64) is None
        big = ffi.new("char[]", bounds.MAX_READ + 1)   # all of it readable: only the size bound refuses it
        assert memory.read(int(ffi.cast("uintptr_t", big)), bounds.MAX_READ + 1) is None
        assert memory.read(-8, 8) is None
    finally:
        memory.close()


def test_line_tables_whose_last_entry_runs_past_their_end_are_refused():
    # guards: bounds.linetable_ok: CPython's co_lines trusts a table; a cut inside an entry must be refused,
    # a cut between entries (where the next byte starts one: bit 7, as only entry heads have it) accepted.
    import email.message
    from btcore.remote import bounds
    with open(email.message.__file__) as f:
        codes = [compile(f.read(), email.message.__file__, "exec")]
    for code in codes:   # and the code objects inside it
        codes.extend(c for c in code.co_consts if hasattr(c, "co_linetable"))
    tables = [code.co_linetable for code in codes]
    assert len(tables) > 50
    checked = 0
    for table in tables:
        assert bounds.linetable_ok(table)
        for cut in range(1, len(table)):
            assert bounds.linetable_ok(table[:cut]) == bool(table[cut] & 0x80), (table, cut)
            checked += 1
    assert checked > 500
    assert not bounds.linetable_ok(b"\x01")   # no entry head


def test_saved_stacks_are_copied_only_on_one_stack_and_within_the_budget():
    # guards: btc_remote_greenlet_fit: a saved stack is copied when the greenlet's stack lies in one mapping
    # (a thread's stack: a corrupt range or size claims more) and, in order, while the budget lasts.
    MAIN = (1 << 64) - 1
    lo, hi = ffi.new("uintptr_t[]", [0x10000, 0x40000]), ffi.new("uintptr_t[]", [0x20000, 0x50000])
    states = [  # (start, stop, saved): the bytes it should be given, or 0
        (0x11000, 0x12000, 100, 100),     # on the first stack
        (0x11000, 0x30000, 100, 0),       # its stop past that stack
        (0x30000, 0x31000, 100, 0),       # on no stack
        (0x4f000, MAIN, 0x2000, 0),       # a main greenlet whose saved part runs past its stack
        (0x4f000, MAIN, 0x800, 0x800),    # one whose saved part is on it
        (0x41000, 0x48000, 0x5000, 0),    # on the second stack, past the budget left
        (0x41000, 0x48000, 0x100, 0x100),  # fits what is left
    ]
    gs = ffi.new("btc_remote_greenlet[]", len(states))
    for g, (start, stop, saved, _) in zip(gs, states):
        g.start, g.stop, g.saved = start, stop, saved
    total = lib.btc_remote_greenlet_fit(gs, len(states), lo, hi, 2, 0x1000)
    assert total == sum(take for *_, take in states)
    assert [g.bad == lib.BTC_REMOTE_BAD_SKIPPED for g in gs] == [take == 0 for *_, take in states]


def test_a_name_or_line_table_pointer_to_another_object_is_refused():
    # guards: bounds.Names checks a name's and a line table's type (the CI failure: co_filename pointing at the
    # code object itself was read as a str whose state and length are the code's own words). An int whose words
    # at a compact ASCII str's offsets hold a valid state, a length of 3 and "abc" is refused as a str and as
    # bytes; real ones are read.
    import ctypes
    import types
    from btcore.remote import bounds
    from btcore.remote.snapshot import Memory
    lay = layout_311()
    impostor = ctypes.create_string_buffer(lay.ascii_data + 8)   # an object of type int, as memory holds it
    base = ctypes.addressof(impostor)
    ctypes.c_uint64.from_address(base + 8).value = id(int)
    ctypes.c_uint64.from_address(base + lay.unicode_length).value = 3   # = a bytes object's size, 3
    ctypes.c_uint64.from_address(base + lay.unicode_state).value = (1 << 2) | (1 << 5) | (1 << 6)  # kind 1, compact, ascii
    ctypes.memmove(base + lay.ascii_data, b"abc", 3)
    memory = Memory(lib.btc_rmem_open_pid(os.getpid()))
    try:
        typed = bounds.Names(memory, lay, bounds.Types(id(types.CodeType), id(str), id(bytes)))
        assert bounds.Names(memory, lay, bounds.Types()).string(base) == "abc"   # the impostor, unchecked
        assert typed.string(base) is None and typed._linetable(base) is None
        code = typed.code(id(test_a_name_or_line_table_pointer_to_another_object_is_refused.__code__))
        assert code.qualname == "test_a_name_or_line_table_pointer_to_another_object_is_refused" and not code.error
        assert code.filename == __file__
    finally:
        memory.close()


def test_garbage_target_images_through_the_remote_readers():
    # guards: the readers (gc walk, greenlet states, the saved-stack plan, both frame walkers, code objects,
    # names, line tables) over 3 000 seeded mutations of well-formed target images: results within their bounds,
    # no exception, no crash (a child process: tests/fuzz_remote.py; ci/fuzz.py runs it coverage-guided).
    done = subprocess.run([sys.executable, os.path.join(HERE, "fuzz_remote.py"), "3000", "--seed", "25"],
                          capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3000 images" in done.stdout


def test_the_fuzz_seed_holds_sound_greenlets():
    # guards: tests/fuzz_remote.py's mutations start from greenlets a dump reads whole (suspended, state sound,
    # heap copy read, both Python frames walked; one saved whole), so the fuzzing reaches the copies, the frame
    # walk and the walk's input; a check added to the reader that the seed breaks would leave them unreached.
    sys.path.insert(0, HERE)
    import fuzz_remote
    read = fuzz_remote.read_greenlets(fuzz_remote.seed())
    assert [(bad, bool(copied), nframes) for bad, copied, _, nframes in read] == [(0, True, 2)] * 3
    assert [whole for _, _, whole, _ in read] == [False, False, True]


def test_spawn_records_are_read_as_spawn_c_keeps_them():
    # guards: native/remote/rspawn.c over a hand-built image of spawn.c's records (tests/fuzz_remote.py's seed:
    # a record per greenlet, two sites, each chain a record then a tuple copy ending in Ellipsis): every chain's
    # object, links and cut, each site read once with its frames and its truncation.
    sys.path.insert(0, HERE)
    import fuzz_remote
    image = fuzz_remote.seed()
    chains, sites = fuzz_remote.read_spawn(image)
    greenlets = [gc + 16 for gc in fuzz_remote._gc_list(fuzz_remote._Image.of(image), fuzz_remote.BASE)]
    assert [c[0] for c in chains] == greenlets and len(greenlets) == 3
    assert sites == [([0x400000, 0x400001, 0x400002], False, True), ([0x400000, 0x400001], True, True)]
    spawner = {link[1] for c in chains for link in c[1]}
    assert len(spawner) == 1 and all(c[2] for c in chains)   # cut: older generations were dropped
    assert [[site for site, _ in c[1]] for c in chains] == [[0, 1], [1, 1], [0, 1]]


CORRUPT_SPAWN_CAPACITY = """
import ctypes, os, sys, time
import gevent
from elftools.elf.elffile import ELFFile
import btcore
from btcore import _native
btcore.enable_spawn_tracking()
parked = [gevent.spawn(gevent.sleep, 600) for _ in range(3)]
gevent.sleep(0.01)
path = os.path.realpath(_native.__file__)
with open(path, "rb") as f:   # pyelftools finds the hidden global, /proc/self/maps where the module lies
    value = ELFFile(f).get_section_by_name(".symtab").get_symbol_by_name("btc_spawn_exported")[0]["st_value"]
base = min(int(line.split("-")[0], 16) for line in open("/proc/self/maps") if line.rstrip().endswith(path))
ctypes.c_uint32.from_address(base + value + _native.ffi.offsetof("btc_spawn_export", "capacity")).value = \
    int(sys.argv[1])
open(sys.argv[2], "w").write("ready")
time.sleep(600)
"""


@pytest.mark.parametrize("capacity", [0, 65537, 2**32 - 1])
def test_a_spawn_export_claiming_a_capacity_out_of_bounds_is_refused_with_a_note(capacity, tmp_path):
    # guards: remote_spawn.gather reads the target's btc_spawn_exported and trusts only its magic: a chain
    # capacity outside btcore's bounds (none shown, or joined to no bound) shows no spawn site and says why.
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", CORRUPT_SPAWN_CAPACITY, str(capacity), str(ready)])
    try:
        conftest.wait_until_ready(proc, ready, WAIT)
        doc, _ = dump(proc.pid)
        assert any(f"claim chains of {capacity} frames" in note for note in doc["notes"]), doc["notes"]
        assert not any(stack["spawn_sites"] for stack in doc["stacks"])
        assert sum(g["state"] == "suspended" for g in doc["greenlets"]) >= 3   # the dump itself is whole
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


def test_code_objects_are_read_within_their_bounds_and_the_dumps_budget():
    # guards: bounds.Names over this process's own memory: a code object is read only when its type is the code
    # type, a name past MAX_STRING is refused with a note, and once the dump's name budget is spent codes are
    # left unnamed with a note (never more read).
    import types
    from btcore.remote import bounds
    from btcore.remote.snapshot import Memory
    long_name = "f" * (bounds.MAX_STRING + 1)
    scope = {}
    exec(f"def {long_name}(): pass\ndef short(): pass\ndef other(): pass", scope)
    memory = Memory(lib.btc_rmem_open_pid(os.getpid()))
    try:
        long_code, short_code = scope[long_name].__code__, scope["short"].__code__
        budget = (len("<string>") + len(long_code.co_linetable)   # the long name is refused unread
                  + len("short") + len("<string>") + len(short_code.co_linetable))
        names = bounds.Names(memory, layout_311(), bounds.Types(id(types.CodeType), id(str),
                                                                                       id(bytes)), budget=budget)
        assert names.code(id(scope)).error == "not a code object"
        long_read = names.code(id(long_code))
        assert long_read.qualname is None and "name" in long_read.error and long_read.filename == "<string>"
        short = names.code(id(short_code))
        assert (short.qualname, short.error, short.units) == ("short", None, len(short_code.co_code) // 2)
        assert names.left == 0
        spent = names.code(id(scope["other"].__code__))
        assert spent.qualname is None and "budget" in spent.error
    finally:
        memory.close()


def test_a_corrupt_greenlet_before_a_healthy_one_leaves_it_its_heap_copy():
    # guards: btc_remote_greenlet_spills gives each batched read to the greenlet it was made for.  A bad
    # greenlet is given no copy, so its spill_at is its successor's: matched by where the copy went, it took
    # the successor's read as its own, and the healthy greenlet's Python frames were read from no copy.
    saved = [ffi.new("char[]", b"first's saved stack, corrupt..."), ffi.new("char[]", b"second's saved stack!")]
    gs = ffi.new("btc_remote_greenlet[]", 2)
    for g, copy in zip(gs, saved):
        g.start, g.stop, g.saved, g.copy = 0x11000, 0x12000, len(ffi.string(copy)), int(ffi.cast("uintptr_t", copy))
    gs[0].bad = lib.BTC_REMOTE_BAD_INCONSISTENT
    spill = ffi.new("uint8_t[]", 4096)
    m = ffi.gc(lib.btc_rmem_open_pid(os.getpid()), lib.btc_rmem_close)
    lib.btc_remote_greenlet_spills(m, gs, 2, spill, len(spill), ffi.NULL, 0, ffi.NULL, 0)
    assert (gs[0].copied, gs[1].copied) == (0, 1)
    assert bytes(ffi.buffer(spill + gs[1].spill_at, gs[1].saved)) == b"second's saved stack!"
