"""Frame: one resolved frame of a backtrace."""
from __future__ import annotations

import os
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

    def format(self) -> str:
        """One line (two with a source location), in the style of a Python traceback."""
        if self.kind == PYTHON:
            return f'  File "{self.file}", line {self.line}, in {self.function}'
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
