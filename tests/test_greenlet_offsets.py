"""Where greenlet keeps a suspended greenlet's saved stack and top frame,
learned from another process's greenlet objects (btcore/remote/greenlet_offsets.py).

The oracle is the other way btcore learns the same offsets: in-process,
from greenlets whose spilled stack sizes it knows and an allocator hook
that measures greenlet's C++ object (native/capture/greenlet_context.c),
plus the word equal to id(g.gr_frame).  learned() reads only memory, here
this process's own through the remote reader, as it reads a target's.
"""
import ctypes
import os
import random
import threading
import types

import greenlet
import pytest

from btcore.remote import greenlet_offsets
from btcore._native import lib
from btcore.remote.snapshot import Memory


@pytest.fixture
def memory():
    m = Memory(lib.btc_rmem_open_pid(os.getpid()))
    yield m
    m.close()


def park(depth):
    if depth:
        return park(depth - 1)
    greenlet.getcurrent().parent.switch()


def frame_type():
    return id(types.FrameType)


@pytest.fixture
def greenlets():
    """Suspended greenlets of several depths, one never started, one dead."""
    gs = [greenlet.greenlet(park) for _ in range(6)]
    for depth, g in enumerate(gs[:4]):
        g.switch(depth)
    gs[4].switch(0)
    gs[4].throw(greenlet.GreenletExit)   # dead; gs[5] never started
    yield gs
    for g in gs[:4]:
        g.throw(greenlet.GreenletExit)


def test_learned_from_greenlet_objects_equal_the_in_process_offsets(memory, greenlets):
    # guards: the offsets learned from memory alone (a main greenlet's mark, every StackState plausible, the top
    # frame a frame object) are those the in-process learning finds through greenlets in known states.
    objects = [id(greenlet.getcurrent())] + [id(g) for g in greenlets]
    assert greenlet_offsets.learned(memory, objects, id(greenlet.greenlet), frame_type()) == \
        greenlet_offsets.local()


def test_without_a_main_greenlet_nothing_is_learned(memory, greenlets):
    # guards: StackState is placed only where a main greenlet marks it (stack_stop = -1), never guessed.
    with pytest.raises(greenlet_offsets.Unlearnable, match="StackState"):
        greenlet_offsets.learned(memory, [id(g) for g in greenlets], id(greenlet.greenlet), frame_type())


def test_without_a_frame_the_top_frame_is_not_guessed(memory):
    # guards: with no suspended greenlet holding a Python frame, no word is taken for the top frame.  (A fresh
    # thread: a main greenlet that has switched keeps its last top frame on some greenlet/CPython versions.)
    def learn():
        unstarted = greenlet.greenlet(lambda: None)
        objects = [id(greenlet.getcurrent()), id(unstarted)]
        try:
            greenlet_offsets.learned(memory, objects, id(greenlet.greenlet), frame_type())
        except greenlet_offsets.Unlearnable as e:
            raised.append(str(e))

    raised = []
    worker = threading.Thread(target=learn)
    worker.start()
    worker.join()
    assert len(raised) == 1 and "top frame" in raised[0], raised


def test_garbage_objects_are_refused(memory):
    # guards: objects whose implementation is random bytes, or a type that is not greenlet's, teach nothing.
    rng = random.Random(7)
    junk = [ctypes.create_string_buffer(bytes(rng.getrandbits(8) for _ in range(512))) for _ in range(8)]
    fakes = [ctypes.create_string_buffer(32 + 8) for _ in junk]
    for fake, block in zip(fakes, junk):
        ctypes.c_void_p.from_address(ctypes.addressof(fake) + 32).value = ctypes.addressof(block)
    objects = [ctypes.addressof(f) for f in fakes]
    with pytest.raises(greenlet_offsets.Unlearnable):
        greenlet_offsets.learned(memory, objects, id(greenlet.greenlet), frame_type())
    with pytest.raises(greenlet_offsets.Unlearnable, match="greenlet 3.x"):
        greenlet_offsets.learned(memory, [id(greenlet.getcurrent())], id(int), frame_type())
    with pytest.raises(greenlet_offsets.Unlearnable, match="readable"):
        greenlet_offsets.learned(memory, [8, 16], id(greenlet.greenlet), frame_type())
