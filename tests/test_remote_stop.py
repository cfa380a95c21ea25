"""What a stop of another process reads, and what it no longer reads.

Greenlets are found without walking the old gc lists (btcore/remote/snapshot.py's _find_greenlets,
native/remote/rpython.c's btc_remote_gc_known): the youngest list and those whose head or count changed are
walked, and the greenlets an earlier complete walk found are checked.  A greenlet made between two stops and moved into an old list meanwhile (a collection,
gc.freeze()) must still be listed; one freed since must not be.

A profiler's stop takes an unchanged greenlet's saved stack from the previous stop's copy (Room.alternate,
btc_remote_greenlet_spills); a greenlet that ran and parked again with the same state must not be shown with
that copy."""
import gc
import os
import subprocess
import sys
import time

import greenlet
import pytest

from btcore.remote import snapshot as remote

import conftest

pytestmark = pytest.mark.skipif(conftest.UNDER_QEMU, reason="qemu-user: process_vm_readv is not emulated: the "
                                "reader falls back to other reads, whose syscall counts these tests measure")
from btcore._native import ffi, lib

WAIT = 60

# Parks 200 greenlets, collects (so that the interpreter's objects lie in the oldest generation), then for each
# line of its stdin makes one more parked greenlet, does what the line says and prints its address.
TARGET = """
import asyncio, gc, sys, greenlet
main = greenlet.getcurrent()
parked = []

def spawn():
    g = greenlet.greenlet(main.switch)
    g.switch()
    parked.append(g)
    return g

for _ in range(200):
    spawn()
gc.collect()
print("ready", flush=True)
for line in sys.stdin:
    g = spawn()
    {"young": lambda: gc.collect(0), "oldest": gc.collect, "freeze": gc.freeze, "none": lambda: None}[line.strip()]()
    print(hex(id(g)), flush=True)
"""


@pytest.fixture
def target():
    proc = subprocess.Popen([sys.executable, "-c", TARGET], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        wait_until_reading(proc.pid)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def wait_until_reading(pid: int) -> None:
    """Until pid sleeps in read(2) on its stdin: past "ready" it still runs on to its first read (slowly, on a
    loaded machine under ASan), and a walk made meanwhile may see its old gc lists change (ci32: the first stop
    then walked every list)."""
    read_nr = {"x86_64": "0", "aarch64": "63"}.get(os.uname().machine)
    deadline = time.monotonic() + WAIT
    while read_nr is not None and time.monotonic() < deadline:
        with open(f"/proc/{pid}/syscall") as f:
            if f.read().split()[0] == read_nr:
                return
        time.sleep(0.01)


def objects_of_every_list(t) -> int:
    """How many objects a complete walk of the target's gc lists passes (now, while it runs)."""
    heads = t.gc_heads(next(t.interpreters()))
    visited, broken = ffi.new("uint64_t *"), ffi.new("int *")
    out = ffi.new("uintptr_t[]", 1 << 12)
    t.memory.forget()
    lib.btc_remote_gc_instances(t.memory.handle, heads, len(heads), t.greenlet_type, out, 1 << 12, visited, broken)
    return visited[0]


def next_stop(target, room):
    """A later stop of the same target, as the outside profiler makes it."""
    chunks = target.memory.chunks()
    target.memory.forget()
    return remote.stop_and_copy(target, chunks, room, False, 5.0)


@pytest.mark.parametrize("move", ["none", "young", "oldest", "freeze"])
def test_a_greenlet_made_between_two_stops_is_listed_wherever_it_went(target, move):
    # guards: a greenlet made after the last walk is in the youngest list, or was moved out of it by a collection
    # (gc.collect(0): to the middle generation; gc.collect(): to the oldest) or by gc.freeze() (to the permanent
    # generation): the stop sees that list's tail link and count changed, and walks it.
    t = remote.open_live(target.pid)
    try:
        chunks, room = remote.rehearse(t, False)
        first = remote.stop_and_copy(t, chunks, room, False, 5.0)
        assert len(first.greenlets) == 200   # (the main greenlet runs)
        target.stdin.write(move + "\n")
        target.stdin.flush()
        made = int(target.stdout.readline(), 16)
        second = next_stop(t, room)
        listed = {g.address for g in second.greenlets}
        assert made in listed and len(listed) == 201
        assert not second.notes
        # (walking every list, the stop reads the pages the rehearsal's walk of them read, together)
        assert second.stopped_reads <= 16, second.stopped_reads
        everything = objects_of_every_list(t)
        if move in ("none", "young"):   # the oldest lists as they were: not walked
            assert second.gc_walked < everything / 4, (second.gc_walked, everything)
        else:
            assert second.gc_walked > everything / 2, (second.gc_walked, everything)
    finally:
        t.memory.close()


def test_the_first_stop_walks_the_young_list_only(target):
    # guards: the rehearsal's complete walk (made while the target runs, trusted since the older lists did not
    # change meanwhile) spares the stop the older lists: it walks a fraction of the objects the gc holds.
    t = remote.open_live(target.pid)
    try:
        chunks, room = remote.rehearse(t, False)
        snap = remote.stop_and_copy(t, chunks, room, False, 5.0)
        assert len(snap.greenlets) == 200
        everything = objects_of_every_list(t)
        assert 0 < snap.gc_walked < everything / 4, (snap.gc_walked, everything)
    finally:
        t.memory.close()


class Slotted(greenlet.greenlet):
    # a size of its own (pymalloc's 416-byte class): no other object of this test takes a freed one's block
    __slots__ = tuple(f"s{i}" for i in range(40))


def test_a_freed_greenlet_is_not_taken_for_a_live_one():
    # guards: btc_remote_gc_known's check of a greenlet found before: freed, its block keeps its type and (in
    # pymalloc's free list) a non-zero first word, but its reference count is 0.
    memory = remote.Memory(lib.btc_rmem_open_pid(os.getpid()))
    main = greenlet.getcurrent()
    freed = [Slotted(main.switch) for _ in range(2)]
    live = Slotted(main.switch)
    addresses = [id(g) for g in freed]
    known = ffi.new("uintptr_t[]", addresses + [id(live)])
    out, visited, broken = ffi.new("uintptr_t[]", 16), ffi.new("uint64_t *"), ffi.new("int *")
    heads = ffi.new("uintptr_t[]", [0])   # no list walked: only the known ones are checked
    del freed
    gc.collect()
    memory.forget()
    n = lib.btc_remote_gc_known(memory.handle, heads, 0, heads, 0, id(greenlet.greenlet), known, 3, out, 16, visited,
                                broken)
    assert list(out[0:n]) == [id(live)]
    type_word = memory.word(addresses[0] + 8)   # the freed block still names its type (freed last: the list
    # is freed from its end, and pymalloc links the first word of a freed block to the block freed before)
    assert type_word == id(Slotted) or type_word is None


# One greenlet parked at the first of two switches in one function: each line of stdin moves it to the other
# (same function, same frame object, same depth: the same saved state, most likely the same heap copy address).
SEESAW = """
import sys, greenlet
main = greenlet.getcurrent()

def seesaw():
    while True:
        main.switch()   # first
        main.switch()   # second

g = greenlet.greenlet(seesaw)
g.switch()
print(hex(id(g)), flush=True)
for line in sys.stdin:
    g.switch()
    print("moved", flush=True)
"""


def test_a_profilers_stop_reuses_unchanged_copies_and_never_shows_a_stale_one(tmp_path):
    # guards: a sample takes an unchanged greenlet's saved stack from the previous sample's copy (reused, not
    # read from the target); a greenlet that ran and parked again with the same state but other Python frames is
    # left out of that sample with a note, and read from the target at the next: its stack is then the new one.
    from btcore.profile.remote import STALE_COPY, ProcessProfiler
    proc = subprocess.Popen([sys.executable, "-c", SEESAW], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        address = int(proc.stdout.readline(), 16)
        profiler = ProcessProfiler(proc.pid, native=False)
        try:
            snaps = []
            real_stop = profiler._stop
            profiler._stop = lambda: snaps.append(real_stop()) or snaps[-1]

            def mine():
                return next(g for g in snaps[-1].greenlets if g.address == address)

            profiler.sample()
            assert not mine().reused   # the first sample has no previous copy
            profiler.sample()
            assert mine().reused       # nothing ran: the previous sample's copy
            parked_at = {line for _, line in stacks_of(profiler, address)}
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "moved"
            profiler.sample()
            moved = mine()
            if moved.reused:   # same state as before: left out of the sample, with the note
                assert STALE_COPY in profiler.notes
                profiler.sample()
                assert not mine().reused
            assert {line for _, line in stacks_of(profiler, address)} - parked_at, "the new place is never shown"
        finally:
            profiler.close()
    finally:
        proc.kill()
        proc.wait()


def stacks_of(profiler, address):
    """{(function, line)} of seesaw's frames in the profile's parked stacks so far."""
    out = set()
    for stack in profiler.profile.stacks("wall"):
        for frame in stack:
            if frame.startswith("seesaw ("):
                out.add(("seesaw", frame.rsplit(":", 1)[-1].rstrip(")")))
    return out


def test_the_stop_reads_again_what_the_rehearsal_gathered_not_what_learning_the_target_walked(target):
    # guards: learning how to read the target's asyncio tasks walks every gc list (3.11-3.13: for the sets that
    # hold tasks; 3.13+: for the task types), as learning its greenlets does; what that walk read is forgotten
    # before the rehearsal gathers, for the stop reads again every chunk the rehearsal read (3.14, one parked
    # greenlet: 1,142 of 1,441 chunks, 0.7 ms of a 1.3 ms stop).
    t = remote.open_live(target.pid)
    try:
        chunks, room = remote.rehearse(t, False)
        objects_of_every_list(t)
        every = t.memory.chunks()[1]
        assert 0 < chunks[1] < every / 4, (chunks[1], every)
    finally:
        t.memory.close()
