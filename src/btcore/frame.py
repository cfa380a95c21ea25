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
