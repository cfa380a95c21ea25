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
    offset    native: pc - function start; pc - load address of the module when
              no symbol covers the pc; None for inlined calls and for a pc in
              no module
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
        """One line, in the style of a Python traceback."""
        if self.kind == PYTHON:
            return f'  File "{self.file}", line {self.line}, in {self.function}'
        where = self.function or "??"
        if self.function and self.offset is not None and not self.inlined:
            where += f"+{self.offset:#x}"
        module = os.path.basename(self.module) if self.module else "??"
        text = f"  [{module}] {where}"
        text += " (inlined)" if self.inlined else f" at {self.ip:#x}" if self.ip is not None else ""
        if self.file:
            text += f"\n    {self.file}" + (f":{self.line}" if self.line else "")
        return text
