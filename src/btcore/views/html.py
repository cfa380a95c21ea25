"""The HTML view of dump_all(): one self-contained page of every greenlet.

The page is btcore/views/page.html (inline CSS and JS, no network: its
Content-Security-Policy forbids any fetch) with the dump's JSON document
embedded in a <script type="application/json"> element.  The document is
JSON schema v2 (btcore/views/schema.py) plus fields the page needs (docs/api.md): per frame,
"folded" (hidden in the readable view) and "source" (a Python frame's
source line); "hubs", the ids of gevent hubs; and "greenlets" is written
as a table (_as_rows) to keep 10 000 greenlets under 2 MB.  Every "<", ">" and "&" in
the JSON is written as a \\u escape, so no string in it (greenlet names and
file paths are untrusted) can end the script element or open a comment;
the page inserts all text with textContent, never as markup.
"""
from __future__ import annotations

import functools
import json
import linecache
import os

from .dump import json_frames, json_document
from ..output import open_output
from .fold import Folded, fold
from ..capture.introspect import is_hub, snapshot

_DATA_MARK = "{{BTCORE_DATA}}"
# JSON's own escapes for the characters that could end or confuse the script element
_SCRIPT_SAFE = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"))


def page(infos=None, **more) -> str:
    """The HTML page of infos (default: a new snapshot()), as a string;
    more: another process's dump (dump.json_document)."""
    if infos is None:
        infos = snapshot()
    doc = _as_rows(json_document(infos, True, _page_frames_json, **more))
    doc["hubs"] = [id(info.greenlet) for info in infos if is_hub(info.greenlet)]
    return embed("page.html", doc)


def embed(template: str, doc) -> str:
    """The page `template` (a file of this package) with doc embedded as
    JSON in place of its data mark, every "<", ">" and "&" escaped."""
    data = json.dumps(doc, separators=(",", ":"))
    # str.replace, not str.translate with a dict: translate took 76 ms on a 1.5 MB
    # document, all of it in one C call holding the GIL (a render in a worker
    # thread must leave the event loop's thread its turns); replace takes ~1 ms.
    for char, escape in _SCRIPT_SAFE:
        data = data.replace(char, escape)
    return _template(template).replace(_DATA_MARK, data, 1)


def _as_rows(doc: dict) -> dict:
    """doc with "greenlets" as a table: "greenlet_fields" (the schema's keys)
    and "greenlet_rows" (one list of values per greenlet).  Half the bytes
    of 10 000 objects repeating their keys; the page rebuilds the objects."""
    greenlets = doc.pop("greenlets")
    fields = list(greenlets[0]) if greenlets else []
    doc["greenlet_fields"] = fields
    doc["greenlet_rows"] = [[g[field] for field in fields] for g in greenlets]
    return doc


def write_html(path) -> None:
    """Write the HTML page of every greenlet of the process (a new snapshot()) to path
    (a regular file: a FIFO, a directory or a device is refused with OSError)."""
    if not isinstance(path, (str, bytes, os.PathLike)):   # (an int would be taken for a descriptor)
        raise TypeError(f"write_html() takes a path, not {type(path).__name__}")
    text = page()
    with os.fdopen(open_output(path), "w", encoding="utf-8") as f:
        f.truncate()
        f.write(text)


# Every page's head: what it may load is nothing (no network, no other origin: the data are
# a target's strings), its inline script and style only.
_HEAD = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
"""


@functools.cache
def _template(name: str) -> str:
    """A page of this package (page.html, profile.html: from its <title> on) after the common head."""
    from importlib import resources   # here: ~10 ms of every 'python -m btcore', which mostly writes no page
    return _HEAD + resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _page_frames_json(bt) -> list:
    """The schema's frames of bt, each with "folded" and "source" added."""
    frames = bt.frames()
    entries = json_frames(bt)
    for entry, frame, folded in zip(entries, frames, _folded_marks(frames)):
        entry["folded"] = folded
        entry["source"] = _source_line(frame)
    return entries


def _folded_marks(frames) -> list:
    """For each frame, whether the readable view (fold()) hides it."""
    marks = []
    for item in fold(frames):
        marks.extend([True] * item.count if isinstance(item, Folded) else [False])
    return marks


def _source_line(frame) -> str | None:
    if frame.kind != "python" or not frame.file or not frame.line:
        return None
    return linecache.getline(frame.file, frame.line).strip() or None
