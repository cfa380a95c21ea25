"""Frame: one resolved frame of a backtrace."""
from __future__ import annotations

import functools
import importlib.machinery
import linecache
import os
import re
from dataclasses import dataclass
from typing import Optional

NATIVE = "native"
PYTHON = "python"


@dataclass(frozen=True, slots=True)
class Frame:
    """One resolved frame, native or Python.  Immutable, shared by the cache.

    kind      "native" or "python"
    ip        native: the pc as found on the stack (a return address, except
              for the innermost frame of a context); python: None
    module    native: path of the ELF object; python: the source file
    function  demangled function name, or Python qualified name (None if unknown)
    offset    native: pc - start of the function's symbol; when no symbol names
              the pc, pc - the module's load address (function is then None,
              or named by DWARF only: offset None); None for inlined calls
    file      source file (None if unknown)
    line      source line (None if unknown)
    inlined   True for a call the compiler inlined into the frame that follows it
    """

    kind: str
    ip: Optional[int]
    module: Optional[str]
    function: Optional[str]
    offset: Optional[int]
    file: Optional[str]
    line: Optional[int]
    inlined: bool = False

    def __post_init__(self) -> None:
        """Refuse what format() and users of the fields could not handle."""
        if self.kind not in (NATIVE, PYTHON):
            raise ValueError(f"kind must be {NATIVE!r} or {PYTHON!r}, got {self.kind!r}")
        native = self.kind == NATIVE
        _check("ip", self.ip, int, required=native, forbidden=not native)
        _check("offset", self.offset, int, forbidden=not native)
        _check("line", self.line, int)
        for name in ("module", "function", "file"):
            _check(name, getattr(self, name), str)
        if type(self.inlined) is not bool:
            raise TypeError(f"inlined must be a bool, got {type(self.inlined).__name__}")
        if native and self.ip < 0 or (self.offset is not None and self.offset < 0) or \
                (self.line is not None and self.line < 0):
            raise ValueError(f"ip, offset and line must be >= 0: {self.ip!r}, {self.offset!r}, {self.line!r}")

    def format(self, verbose: bool = False) -> str:
        """This frame as Backtrace.format() prints it, in the style of a Python
        traceback: a Python frame with its source line; a native frame as
        [module] function at file:line (verbose: also offset and address,
        and full paths)."""
        if self.kind == PYTHON:
            text = f'  File "{self.file}", line {self.line}, in {self.function}'
            if verbose or not (self.file and self.line):
                return text
            source = linecache.getline(self.file, self.line).strip()
            return f"{text}\n    {source}" if source else text
        if verbose or self.function is None:
            return self._format_verbose()
        text = f"  [{short_module(self.module)}] {self.function}" + (" (inlined)" if self.inlined else "")
        if self.file:
            text += f" at {short_path(self.file)}" + (f":{self.line}" if self.line else "")
        return text

    def _format_verbose(self) -> str:
        module = os.path.basename(self.module) if self.module else "??"
        if self.function is None:   # offset from the module's load address, if any
            where = f"+{self.offset:#x}" if self.offset is not None else ""
            text = f"  [{module}{where}] ?? at {self.ip:#x}"
        elif self.inlined:
            text = f"  [{module}] {self.function} (inlined)"
        else:
            where = f"+{self.offset:#x}" if self.offset is not None else ""
            text = f"  [{module}] {self.function}{where} at {self.ip:#x}"
        if self.file:
            text += f"\n    {self.file}" + (f":{self.line}" if self.line else "")
        return text


# Extension modules' file names carry the interpreter's ABI tag
# (_json.cpython-311-x86_64-linux-gnu.so): the default view shows _json.so.
_ABI_SUFFIXES = tuple(s for s in importlib.machinery.EXTENSION_SUFFIXES if s != ".so")


@functools.lru_cache(maxsize=4096)   # a few modules, printed again and again
def short_module(module: str | None) -> str:
    """The readable name of a native module: its file name, without an ABI tag."""
    if not module:
        return "??"
    name = os.path.basename(module)
    tag = next((s for s in _ABI_SUFFIXES if name.endswith(s)), None)
    return name[: -len(tag)] + ".so" if tag else name


# A versioned source tree's top directory: Python-3.11.7, glibc-2.36, greenlet-3.5.6.
_SOURCE_ROOT = re.compile(r"[A-Za-z][\w+]*-\d+(\.\d+)+[\w.+-]*")


@functools.lru_cache(maxsize=4096)
def short_path(path: str) -> str:
    """A source path as the default view prints it.

    Normalised (./ and a/../ removed); an absolute path inside a versioned
    source tree is shown relative to its top directory
    (/tmp/build/Python-3.11.7/Objects/call.c -> Objects/call.c); any other
    absolute path of more than three components as .../ and its last two;
    a relative path as it is.
    """
    path = os.path.normpath(path)
    if not os.path.isabs(path):
        return path
    parts = path.split("/")
    roots = [i for i, part in enumerate(parts[:-1]) if _SOURCE_ROOT.fullmatch(part)]
    if roots:
        return "/".join(parts[roots[-1] + 1:])
    return path if len(parts) <= 4 else ".../" + "/".join(parts[-2:])


def _check(name: str, value, kind: type, required: bool = False, forbidden: bool = False) -> None:
    """value is exactly of type kind (bool is not an int here), or None if allowed."""
    if value is None:
        if required:
            raise TypeError(f"{name} is required for a native frame")
        return
    if forbidden:
        raise ValueError(f"{name} must be None for a Python frame, got {value!r}")
    if type(value) is not kind:
        raise TypeError(f"{name} must be {kind.__name__} or None, got {type(value).__name__}")
