"""CPython 3.11's layout, for a btcore of another version reading a 3.11
target from outside.  3.11 publishes no _Py_DebugOffsets: these are the
offsets of its default (not debug) x86-64 build, measured with offsetof on
3.11.7's internal headers; tests/test_process_dump.py checks them against
the ones a btcore built for 3.11 compiles in (native/remote/rpython.c), and
dumps a 3.11 target through them.  Internal structs keep their layout
within a minor version.

What 3.11 does otherwise than 3.13+: the current frame hangs off
tstate->cframe; a frame records whether it is the entry of its eval-loop
call (is_entry), no shim frames exist, and f_code is a plain pointer.
"""
from __future__ import annotations

from .debug_offsets import PortableLayout

FAMILY = 0x030B


def layout(version_hex: int) -> PortableLayout | None:
    """The layout of a 3.11 target (version_hex its Py_Version), else None."""
    if version_hex >> 16 != FAMILY:
        return None
    return PortableLayout(
        version_hex=version_hex,
        runtime_interp_head=40, interp_next=0, interp_threads_head=16,
        tstate_next=8, tstate_thread_id=152, tstate_native_thread_id=160,
        tstate_cframe=56, tstate_current_frame=8,   # _PyCFrame.current_frame
        frame_previous=48, frame_executable=32, frame_instr_ptr=56, frame_owner=69, frame_is_entry=68,
        shim_owners=(),
        code_filename=112, code_qualname=128, code_firstlineno=72, code_linetable=136, code_adaptive=184,
        type_name=24, unicode_state=32, unicode_length=16, ascii_data=48, compact_data=72,
        bytes_size=16, bytes_data=32,
        interp_gc_generations=672, interp_gc_permanent=752, gc_generation_size=24, gc_ngenerations=3,
        frame_object_f_frame=24, frame_object_data=0)
