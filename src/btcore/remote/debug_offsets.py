"""Reading a CPython of another version than btcore's own, from outside,
through the `_Py_DebugOffsets` that CPython 3.13+ keeps at the start of
`_PyRuntime` for out-of-process debuggers: the offsets of the fields a
stack needs (thread states, interpreter frames, code objects, strings),
so no struct of that version is compiled in.  They complete the one layout
table (btc_remote_layout, native/remote/pylayout.c), which the one walker
(native/remote/rpython.c) reads every version with.

The struct itself changes between minor versions (fields are added in the
middle of sections): its field order is listed here per version family,
and only the sections up to the unicode object's are read.  Garbage
(a wrong cookie, an offset past any struct's size) is refused.
"""
from __future__ import annotations

import struct

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
_MAX_OFFSET = 1 << 16  # no field of these structs lies further in
_COMPACT_EXTRA = 16    # PyCompactUnicodeObject: PyASCIIObject + utf8_length + utf8
# The table's fields (native/btcore_api.h, btc_remote_layout) that the debug offsets give, by their names there.
_FIELDS = {
    "runtime_interp_head": "runtime_state.interpreters_head",
    "interp_next": "interpreter_state.next", "interp_threads_head": "interpreter_state.threads_head",
    "tstate_next": "thread_state.next", "tstate_thread_id": "thread_state.thread_id",
    "tstate_native_thread_id": "thread_state.native_thread_id",
    "tstate_current_frame": "thread_state.current_frame",
    "frame_previous": "interpreter_frame.previous", "frame_executable": "interpreter_frame.executable",
    "frame_instr_ptr": "interpreter_frame.instr_ptr", "frame_owner": "interpreter_frame.owner",
    "code_filename": "code_object.filename", "code_qualname": "code_object.qualname",
    "code_firstlineno": "code_object.firstlineno", "code_linetable": "code_object.linetable",
    "code_adaptive": "code_object.co_code_adaptive", "type_name": "type_object.tp_name",
    "unicode_state": "unicode_object.state", "unicode_length": "unicode_object.length",
    "ascii_data": "unicode_object.asciiobject_size",
    "bytes_size": "bytes_object.ob_size", "bytes_data": "bytes_object.ob_sval",
}


def published(memory, runtime: int, family: int) -> tuple | None:
    """(The interpreter's version, {"section.field": offset}) of the debug
    offsets at runtime, for a version family listed here (None: another
    family, or garbage)."""
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
    return version, o


def fill(memory, runtime: int, lay) -> bool:
    """Complete lay (a btc_remote_layout that btc_remote_layout_of() filled
    with its version family's constants) from the _PyRuntime's debug
    offsets at runtime; False for a version listed nowhere here, or
    garbage."""
    found = published(memory, runtime, lay.version_hex >> 16)
    if found is None:
        return False
    version, o = found
    lay.version_hex = version
    for field, name in _FIELDS.items():
        setattr(lay, field, o[name])
    lay.compact_data = o.get("unicode_object.compactunicodeobject_size",
                             o["unicode_object.asciiobject_size"] + _COMPACT_EXTRA)
    lay.interp_gc_generations += o["interpreter_state.gc"]   # the table gives them in the gc state
    lay.interp_gc_permanent += o["interpreter_state.gc"]
    return True
