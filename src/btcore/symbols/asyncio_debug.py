"""3.14+'s Py_AsyncioModuleDebugOffsets (Modules/_asynciomodule.c): the
offsets of asyncio's task lists and Task fields that the _asyncio module
publishes for debuggers in its .AsyncioDebug section (13 words, by field).
Read from a file (through native/symbols/elf.c, btcore's one ELF reader),
by btcore.capture.tasks for this process and by btcore.remote.tasks for another
one."""
from __future__ import annotations

import struct

from .elf_files import section_head

SECTION = ".AsyncioDebug"
FIELDS = ("task_size task_name task_awaited_by task_is_task task_awaited_by_is_set task_coro task_node "
          "interp_size interp_tasks_head thread_size thread_running_loop thread_running_task "
          "thread_tasks_head").split()
_WORDS = struct.Struct(f"={len(FIELDS)}Q")


def offsets(path: str) -> dict | None:
    """{field: offset} from the ELF file at path; None if it has no such section or cannot be read."""
    data = section_head(path, SECTION, _WORDS.size)
    return dict(zip(FIELDS, _WORDS.unpack(data))) if data is not None and len(data) == _WORDS.size else None
