"""3.14+'s Py_AsyncioModuleDebugOffsets (Modules/_asynciomodule.c): the
offsets of asyncio's task lists and Task fields that the _asyncio module
publishes for debuggers in its .AsyncioDebug section (13 words, by field).
Read from a file, by btcore.tasks for this process and by
btcore.remote_tasks for another one."""
from __future__ import annotations

import struct

SECTION = ".AsyncioDebug"
FIELDS = ("task_size task_name task_awaited_by task_is_task task_awaited_by_is_set task_coro task_node "
          "interp_size interp_tasks_head thread_size thread_running_loop thread_running_task "
          "thread_tasks_head").split()
_WORDS = struct.Struct(f"={len(FIELDS)}Q")


def offsets(path: str) -> dict | None:
    """{field: offset} from the ELF file at path; None if it has no such section or cannot be read."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    try:
        with open(path, "rb") as f:
            section = ELFFile(f).get_section_by_name(SECTION)
            data = section.data() if section is not None else b""
    except (OSError, ELFError, ValueError):
        return None
    return dict(zip(FIELDS, _WORDS.unpack_from(data))) if len(data) >= _WORDS.size else None
