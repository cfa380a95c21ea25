"""What the default (readable) view of a Backtrace folds away, as data.

format(verbose=True) shows every frame.  The default view replaces each run
of consecutive frames of the two kinds below with one marker line that
counts them ("... 4 interpreter frames"):

* call plumbing: a native frame of the interpreter itself (libpython, or the
  python executable when the interpreter is linked into it) whose function
  is named in CALL_PLUMBING.  These functions only carry a call from one
  frame to the next (vectorcall dispatch, bound-method and slot wrappers,
  the eval loop's entry); the function that was called - a builtin such as
  builtin_sorted, a method of a C type, any C extension - is not among them
  and stays shown.  Folded wherever they are.
* start-up: the outermost frames of a backtrace (of each part joined by
  append()), from the process or thread entry inwards, as long as each is
  named in START_UP (native) or belongs to the interpreter's start-up Python
  code (runpy, threading's bootstrap) or is call plumbing; frames with no
  name on the way are passed over and stay shown.

Never folded: a frame with no function name, a frame of any module other
than the interpreter (extension modules, libc outside start-up, C++), a
Python frame outside the start-up run.  When a name is unknown the frame
is shown: a stripped interpreter gives a longer default view, never a
wrong one.  The names are the same in CPython 3.11 to 3.15 except where a
comment says otherwise; a name a version lacks simply never matches, so
one table serves every version.
"""
from __future__ import annotations

import functools
import os
import re
import sys

from ..capture.frame import NATIVE, PYTHON, Frame

# Each entry is a function name, or a name prefix followed by *.
# Functions that deliver a call: the caller is a Python frame or C code, the
# callee the next frame that is shown.
CALL_PLUMBING = (
    # Objects/call.c, Include/internal/pycore_call.h
    "PyObject_Call", "_PyObject_Call", "PyObject_CallObject", "PyObject_CallOneArg",
    "PyObject_CallNoArgs", "_PyObject_CallNoArgs*", "PyObject_CallFunction*", "_PyObject_CallFunction*",
    "PyObject_CallMethod*", "_PyObject_CallMethod*", "PyEval_Call*", "object_vacall", "callmethod",
    "PyObject_Vectorcall*", "_PyObject_Vectorcall*", "PyVectorcall_Call", "_PyObject_FastCall*",
    "_PyObject_MakeTpCall", "_PyObject_Call_Prepend", "_PyFunction_Vectorcall", "PyCFunction_Call",
    # Python/ceval.c, Include/internal/pycore_ceval.h
    "_PyEval_Vector", "_PyEval_EvalFrame", "PyEval_EvalCode", "PyEval_EvalCodeEx",
    # 3.14+: calls made by the eval loop through stack references
    "_Py_VectorCall_StackRefSteal", "_Py_VectorCallInstrumentation_StackRefSteal", "_PyObject_MaybeCallSpecial*",
    # Objects/classobject.c, descrobject.c, methodobject.c: bound methods and
    # method descriptors of C functions
    "method_vectorcall", "method_vectorcall_*", "method_call", "cfunction_vectorcall_*", "cfunction_call",
    "wrapperdescr_call", "wrapper_call",
    # Objects/typeobject.c: calling a class, and special methods written in Python
    "type_call", "slot_tp_*", "slot_nb_*", "slot_sq_*", "slot_mp_*", "slot_am_*",
    "vectorcall_method", "vectorcall_unbound", "call_unbound*", "call_method", "wrap_*",
)

# The process's and each thread's entry, down to the program's first frame.
START_UP = (
    "_start", "__libc_start_main*", "__libc_start_call_main", "main",   # glibc, the executable
    "clone", "clone3", "start_thread",                                  # a thread's entry (glibc)
    "Py_BytesMain", "Py_Main", "Py_RunMain", "pymain_*",                # Modules/main.c
    "PyRun_*", "_PyRun_*", "pyrun_*", "run_mod", "run_eval_code_obj",   # Python/pythonrun.c
    "builtin_exec", "builtin_exec_impl",                                # runpy's exec() of __main__
    "thread_run", "t_bootstrap", "pythread_wrapper",                    # Modules/_threadmodule.c
)

# Start-up Python code: (file name ending, qualified names or None for all).
START_UP_PYTHON = (
    ("<frozen runpy>", None),
    ("/runpy.py", None),
    ("/threading.py", ("Thread._bootstrap", "Thread._bootstrap_inner")),
)

# gcc and clang name the parts they split out of a function foo foo.cold,
# foo.part.0, foo.isra.0, foo.constprop.0, foo.lto_priv.0, foo.llvm.123.
_CLONE_SUFFIX = re.compile(r"(\.(cold|part|isra|constprop|lto_priv|llvm)(\.\d+)?)+$")
_INTERPRETER = re.compile(r"(lib)?python\d+(\.\d+)*[a-z]*(\.so(\.\d+)*)?")
_EXECUTABLE = os.path.realpath(sys.executable) if sys.executable else None


def _matcher(patterns):
    """A test for names listed in patterns: each a name, or a prefix followed by *."""
    exact = frozenset(p for p in patterns if not p.endswith("*"))
    prefixes = tuple(p[:-1] for p in patterns if p.endswith("*"))
    return lambda name: name in exact or name.startswith(prefixes)


_is_plumbing_name = _matcher(CALL_PLUMBING)
_is_start_up_name = _matcher(START_UP)


@functools.lru_cache(maxsize=4096)   # format() asks again for every frame it prints
def _native_kind(module: str | None, function: str | None) -> tuple:
    """(call plumbing?, start-up?) for a named native frame of a known module."""
    if not module or not function:
        return False, False
    name = _CLONE_SUFFIX.sub("", function)
    in_interpreter = module == _EXECUTABLE or bool(_INTERPRETER.fullmatch(os.path.basename(module)))
    return in_interpreter and _is_plumbing_name(name), _is_start_up_name(name)


def is_plumbing(frame: Frame) -> bool:
    """A frame of the interpreter's call machinery (see CALL_PLUMBING)."""
    return frame.kind == NATIVE and _native_kind(frame.module, frame.function)[0]


def is_start_up(frame: Frame) -> bool:
    """A frame of the process's or a thread's entry (see START_UP)."""
    if frame.kind == PYTHON:
        return any(frame.file and frame.file.endswith(tail) and (names is None or frame.function in names)
                   for tail, names in START_UP_PYTHON)
    return _native_kind(frame.module, frame.function)[1]


class Folded:
    """A run of hidden frames, shown as one marker line."""

    __slots__ = ("count", "start_up")

    def __init__(self, count: int, start_up: bool):
        self.count, self.start_up = count, start_up

    def format(self) -> str:
        kind = "start-up" if self.start_up else "interpreter"
        plural = "s" if self.count != 1 else ""
        return f"  ... {self.count} {kind} frame{plural}"


def _start_up(frames: list, hidden: list) -> set:
    """Indexes of the start-up frames: from the outermost frame inwards, each
    start-up or plumbing frame, passing over (and leaving shown) frames with
    no name, up to the first other frame; none if no frame is named in
    START_UP."""
    found = set()
    for i in reversed(range(len(frames))):
        if hidden[i] or is_start_up(frames[i]):
            found.add(i)
        elif frames[i].kind == PYTHON or frames[i].function:
            break
    return found if any(not hidden[i] for i in found) else set()


def fold(frames: list) -> list:
    """frames (innermost first) with each run of hidden frames replaced by a Folded."""
    hidden = [is_plumbing(f) for f in frames]
    start_up = _start_up(frames, hidden)
    out = []
    for i, frame in enumerate(frames):
        if not (hidden[i] or i in start_up):
            out.append(frame)
        elif out and isinstance(out[-1], Folded):
            out[-1].start_up = out[-1].start_up or i in start_up
            out[-1].count += 1
        else:
            out.append(Folded(1, i in start_up))
    return out
