"""Reading a CPython of another version than btcore's own, from outside,
through the `_Py_DebugOffsets` that CPython 3.13+ keeps at the start of
`_PyRuntime` for out-of-process debuggers: the offsets of the fields a
stack needs (thread states, interpreter frames, code objects, strings),
so no struct of that version is compiled in.

The struct itself changes between minor versions (fields are added in the
middle of sections): its field order is listed here per version family,
and only the sections up to the unicode object's are read.  Garbage
(a wrong cookie, an offset past any struct's size) is refused: None.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from . import bounds

COOKIE = b"xdebugpy"

_SEQUENCES = [
    ("tuple_object", "size ob_item ob_size"),
    ("list_object", "size ob_item ob_size"),
]
_NUMBERS_BYTES = [
    ("dict_object", "size ma_keys ma_values"),
    ("float_object", "size ob_fval"),
    ("long_object", "size lv_tag ob_digit"),
    ("bytes_object", "size ob_size ob_sval"),
]
_INTERPRETER_314 = ("interpreter_state", "size id next threads_head threads_main gc imports_modules sysdict builtins "
                                         "ceval_gil gil_runtime_state gil_runtime_state_enabled "
                                         "gil_runtime_state_locked gil_runtime_state_holder code_object_generation "
                                         "tlbc_generation")
_FRAME_314 = ("interpreter_frame", "size previous executable instr_ptr localsplus owner stackpointer tlbc_index")
_CODE_314 = ("code_object", "size filename name qualname linetable firstlineno argcount localsplusnames "
                            "localspluskinds co_code_adaptive co_tlbc")
# (Include/internal/pycore_runtime.h in 3.13, pycore_debug_offsets.h from 3.14)
_SECTIONS = {
    0x030D: [
        ("runtime_state", "size finalizing interpreters_head"),
        ("interpreter_state", "size id next threads_head gc imports_modules sysdict builtins ceval_gil "
                              "gil_runtime_state gil_runtime_state_enabled gil_runtime_state_locked "
                              "gil_runtime_state_holder"),
        ("thread_state", "size prev next interp current_frame thread_id native_thread_id datastack_chunk status"),
        ("interpreter_frame", "size previous executable instr_ptr localsplus owner"),
        ("code_object", "size filename name qualname linetable firstlineno argcount localsplusnames "
                        "localspluskinds co_code_adaptive"),
        ("pyobject", "size ob_type"),
        ("type_object", "size tp_name tp_repr tp_flags"),
    ] + _SEQUENCES + _NUMBERS_BYTES + [("unicode_object", "size state length asciiobject_size")],
    0x030E: [
        ("runtime_state", "size finalizing interpreters_head"),
        _INTERPRETER_314,
        ("thread_state", "size prev next interp current_frame thread_id native_thread_id datastack_chunk status"),
        _FRAME_314,
        _CODE_314,
        ("pyobject", "size ob_type"),
        ("type_object", "size tp_name tp_repr tp_flags"),
    ] + _SEQUENCES + [("set_object", "size used table mask")] + _NUMBERS_BYTES + [
        ("unicode_object", "size state length asciiobject_size")],
    0x030F: [
        ("runtime_state", "size finalizing interpreters_head"),
        _INTERPRETER_314,
        ("thread_state", "size prev next interp current_frame base_frame last_profiled_frame "
                         "last_profiled_frame_seq thread_id native_thread_id datastack_chunk status holds_gil "
                         "gil_requested current_exception exc_state"),
        ("err_stackitem", "exc_value"),
        _FRAME_314,
        _CODE_314,
        ("pyobject", "size ob_type"),
        ("type_object", "size tp_name tp_repr tp_flags tp_basicsize tp_dictoffset"),
        ("heap_type_object", "size ht_cached_keys"),
    ] + _SEQUENCES + [("set_object", "size used table mask")] + _NUMBERS_BYTES + [
        ("unicode_object", "size state length asciiobject_size compactunicodeobject_size")],
}
# The owners of frames that are not Python frames but the shims each C call
# of the eval loop pushes (the frame-owner enum of pycore_frame.h, from
# 3.14 pycore_interpframe_structs.h): 3.13 CSTACK; 3.14 INTERPRETER and
# CSTACK; 3.15 INTERPRETER.
_SHIM_OWNERS = {0x030D: (3,), 0x030E: (3, 4), 0x030F: (3,)}
# Where the gc lists lie in the interpreter's gc state (struct
# _gc_runtime_state, which _Py_DebugOffsets locates but does not describe):
# (generations[], permanent_generation) per family, from pycore_gc.h (3.13)
# and pycore_interp_structs.h (3.14, 3.15) of default builds, measured with
# offsetof against each version's headers.  3.14 reverted its incremental
# collector before release: young/old[2] are the free-threaded layout only.
_GC_LISTS = {0x030D: (20, 104), 0x030E: (24, 96), 0x030F: (8, 80)}
_GC_GENERATION_SIZE = 24   # struct gc_generation: PyGC_Head, threshold, count
_GC_GENERATIONS = 3
_FRAME_OBJECT_F_FRAME = 24   # PyFrameObject.f_frame, after PyObject_HEAD and f_back (3.11-3.15)
_FRAME_OBJECT_DATA = {0x030D: 64, 0x030E: 72, 0x030F: 72}   # PyFrameObject._f_frame_data
_IFRAME_FRAME_OBJ = 48       # _PyInterpreterFrame.frame_obj (3.13-3.15)
_MAX_SHIMS = 4               # shims between two Python frames: one per eval-loop call
_TAG_BITS = 3          # 3.14+'s f_executable is a _PyStackRef: tag bits below the pointer
_MAX_OFFSET = 1 << 16  # no field of these structs lies further in
_COMPACT_EXTRA = 16    # PyCompactUnicodeObject: PyASCIIObject + utf8_length + utf8


@dataclass
class PortableLayout:
    """The offsets a dump reads, named as btc_remote_layout names them
    (btcore/process.py reads either), plus the frame walk's."""
    version_hex: int
    runtime_interp_head: int
    interp_next: int
    interp_threads_head: int
    tstate_next: int
    tstate_thread_id: int
    tstate_native_thread_id: int
    tstate_current_frame: int
    frame_previous: int
    frame_executable: int
    frame_instr_ptr: int
    frame_owner: int
    shim_owners: tuple
    code_filename: int
    code_qualname: int
    code_firstlineno: int
    code_linetable: int
    code_adaptive: int
    type_name: int
    unicode_state: int
    unicode_length: int
    ascii_data: int
    compact_data: int
    bytes_size: int
    bytes_data: int
    interp_gc_generations: int
    interp_gc_permanent: int
    gc_generation_size: int
    gc_ngenerations: int
    frame_object_f_frame: int
    frame_object_data: int
    code_type: int = 0   # the target's PyCode_Type (0: frames are not checked against it)
    tstate_cframe: int = -1     # 3.11: the current frame is tstate->cframe->current_frame
    frame_is_entry: int = -1    # 3.11: the frame says itself whether it is its eval-loop call's entry


def read(memory, runtime: int, version_hex: int) -> PortableLayout | None:
    """The layout of a target of version_hex from its _PyRuntime's debug
    offsets, or None (a version listed nowhere here, or garbage)."""
    family = version_hex >> 16
    sections = _SECTIONS.get(family)
    if sections is None:
        return None
    names = [f"{section}.{field}" for section, fields in sections for field in fields.split()]
    head = memory.read(runtime, 24 + 8 * len(names))
    if head is None or head[:8] != COOKIE:
        return None
    version, free_threaded = struct.unpack_from("<QQ", head, 8)
    if version >> 16 != family or free_threaded:
        return None   # free-threaded builds lay objects out otherwise
    o = dict(zip(names, struct.unpack_from(f"<{len(names)}Q", head, 24)))
    if any(value >= _MAX_OFFSET for name, value in o.items() if not name.endswith(".size")):
        return None
    return PortableLayout(
        version_hex=version,
        runtime_interp_head=o["runtime_state.interpreters_head"],
        interp_next=o["interpreter_state.next"], interp_threads_head=o["interpreter_state.threads_head"],
        tstate_next=o["thread_state.next"], tstate_thread_id=o["thread_state.thread_id"],
        tstate_native_thread_id=o["thread_state.native_thread_id"],
        tstate_current_frame=o["thread_state.current_frame"],
        frame_previous=o["interpreter_frame.previous"], frame_executable=o["interpreter_frame.executable"],
        frame_instr_ptr=o["interpreter_frame.instr_ptr"], frame_owner=o["interpreter_frame.owner"],
        shim_owners=_SHIM_OWNERS[family],
        code_filename=o["code_object.filename"], code_qualname=o["code_object.qualname"],
        code_firstlineno=o["code_object.firstlineno"], code_linetable=o["code_object.linetable"],
        code_adaptive=o["code_object.co_code_adaptive"], type_name=o["type_object.tp_name"],
        unicode_state=o["unicode_object.state"], unicode_length=o["unicode_object.length"],
        ascii_data=o["unicode_object.asciiobject_size"],
        compact_data=o.get("unicode_object.compactunicodeobject_size",
                           o["unicode_object.asciiobject_size"] + _COMPACT_EXTRA),
        bytes_size=o["bytes_object.ob_size"], bytes_data=o["bytes_object.ob_sval"],
        interp_gc_generations=o["interpreter_state.gc"] + _GC_LISTS[family][0],
        interp_gc_permanent=o["interpreter_state.gc"] + _GC_LISTS[family][1],
        gc_generation_size=_GC_GENERATION_SIZE, gc_ngenerations=_GC_GENERATIONS,
        frame_object_f_frame=_FRAME_OBJECT_F_FRAME, frame_object_data=_FRAME_OBJECT_DATA[family])


def thread_frames(memory, lay: PortableLayout, tstate: int, most: int) -> list:
    """[(code, instruction offset, entry)] of a thread state, innermost
    first, at most `most`."""
    holder = memory.word(tstate + lay.tstate_cframe) if lay.tstate_cframe >= 0 else tstate
    if not holder:
        return []   # a thread state being made or torn down
    frame = memory.word(holder + lay.tstate_current_frame)
    return frame_chain(memory, lay, frame, most) if frame is not None else [(0, bounds.CUT_UNREADABLE, False)]


def greenlet_frames(stack, lay: PortableLayout, frame_object: int, most: int) -> list:
    """The same from a suspended greenlet's top frame object.  stack: the
    target's memory as that greenlet sees it (btcore/remote.py SpilledStack).

    greenlet "exposes" a suspended greenlet's frames (as in-process capture
    reads them: native/capture/cpython/chain.h): each frame's `previous`
    skips the shims, and the original link is kept in the first word of its
    frame object's spare storage.  A frame is the entry frame of its
    eval-loop call when that original link leads, through shims on the
    greenlet's own stack, to the exposed one."""
    return frame_chain(stack, lay, stack.word(frame_object + lay.frame_object_f_frame), most, exposed=True)


def frame_chain(memory, lay: PortableLayout, frame: int | None, most: int, exposed: bool = False) -> list:
    """The chain from interpreter frame `frame`.  The eval loop's shim
    frames are not Python frames: the frame below one (called first by that
    C call of the eval loop) is its entry frame, as is the last frame.  A
    chain that meets garbage (an unreadable or misaligned frame, a loop)
    ends in a frame of code 0 saying why (bounds.CUT_*), as the native walk's
    does; so does one that left out a frame without code."""
    out, seen, why, skipped = [], set(), None, False
    for _ in range(2 * most):   # shims take steps too
        if not frame or len(out) >= most:
            break
        owner, previous = memory.read(frame + lay.frame_owner, 1), memory.word(frame + lay.frame_previous)
        if frame & 7 or frame in seen or owner is None or previous is None:
            why = bounds.CUT_LOOP if frame in seen else bounds.CUT_UNREADABLE
            break
        seen.add(frame)
        if owner[0] in lay.shim_owners:
            if out:
                out[-1] = out[-1][:2] + (True,)
        else:
            code = _code_of(memory, lay, frame)
            instr = memory.word(frame + lay.frame_instr_ptr)
            if code and instr:
                out.append((code, bounds.lasti_field(instr - code - lay.code_adaptive),
                            _entry(memory, lay, frame, previous, exposed)))
            else:
                skipped = True
        frame = previous
    if out:
        out[-1] = out[-1][:2] + (True,)
    why = why or (bounds.CUT_SKIPPED if skipped else None)
    return out + [(0, why, False)] if why else out


def _entry(memory, lay: PortableLayout, frame: int, previous: int, exposed: bool) -> bool:
    """Is this Python frame the first of its eval-loop call (as far as the
    frame itself, or greenlet's saved link, tells: a shim after it marks
    it too, in frame_chain)?"""
    if lay.frame_is_entry >= 0:
        flag = memory.read(frame + lay.frame_is_entry, 1)
        return bool(flag and flag[0])
    return exposed and _saved_link_ends_call(memory, lay, frame, previous)


def _saved_link_ends_call(stack, lay: PortableLayout, frame: int, exposed: int) -> bool:
    """Does the link greenlet saved for frame differ from its exposed one
    and reach it through shims only, all on the greenlet's stack?"""
    frame_object = stack.word(frame + _IFRAME_FRAME_OBJ)
    saved = stack.word(frame_object + lay.frame_object_data) if frame_object else None
    if saved == exposed:
        return False
    for _ in range(_MAX_SHIMS):
        if not saved or not stack.holds(saved):
            return False
        owner, previous = stack.read(saved + lay.frame_owner, 1), stack.word(saved + lay.frame_previous)
        if owner is None or owner[0] not in lay.shim_owners:
            return False
        if previous == exposed or not exposed:
            return True
        saved = previous
    return False


def _code_of(memory, lay: PortableLayout, frame: int) -> int:
    """The frame's code object (0: none, or not a code object)."""
    code = (memory.word(frame + lay.frame_executable) or 0) & ~_TAG_BITS
    if code and lay.code_type and memory.word(code + 8) != lay.code_type:   # ob_type
        return 0
    return code
