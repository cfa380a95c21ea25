"""python -m btcore demo: merged native + Python backtraces, live.
python -m btcore decode [FILE...]: backtrace tokens in logs, resolved in place.
python -m btcore dump PID | --core CORE --exe PYTHON: every thread and every
suspended greenlet of another process (or a core file), from outside.
python -m btcore profile -- COMMAND: a sampling profile of every greenlet of
a Python program run under it (btcore/profile/run.py); python -m btcore
profile PID: the same of a running process, sampled from outside
(btcore/profile/remote.py).

With gevent installed (pip install 'btcore[demo]'), the demo is the
showcase (btcore/views/showcase.py): a gevent program whose greenlets are parked
in Python code, in C callbacks, in socket recv, on Event/Queue/Lock waits,
in a 3-generation spawn tree, and btcore.dump_all() of all of them, grouped
and as a tree.  Without gevent, or with --greenlet: the current stack going
Python -> C -> Python, then plain greenlets parked at different places, each
in the readable default view; then the first again with every frame
(format(verbose=True)).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import sys

import greenlet

import btcore


def _park():
    """Suspend the calling greenlet (back to whoever switched into it)."""
    return greenlet.getcurrent().parent.switch()


def _through_sorted():
    # builtin sorted() (C) calls the key function (Python), which parks.
    return sorted([3, 1, 2], key=lambda item: _park() or item)


def _through_regex():
    # the _sre C module calls the replacement function, which parks.
    return re.sub(r"\d", lambda match: _park() or "#", "a1b")


def _through_json():
    # the _json C module calls object_hook, which parks.
    return json.loads('{"a": 1}', object_hook=lambda obj: _park() or obj)


def _deep_python(depth):
    if depth:
        return _deep_python(depth - 1)
    return _park()


class _Worker(greenlet.greenlet):
    """A greenlet with a name, which format()'s header line shows."""

    def __init__(self, name, run):
        super().__init__(run)
        self.name = name

    def __repr__(self):
        return f"<Worker {self.name!r}>"


def _show(title, text):
    print(f"=== {title}")
    print(text)
    print()


def demo() -> int:
    def current_stack(item):
        _show("the current stack, inside sorted()'s key callback", btcore.collect())
        return item

    sorted([1], key=current_stack)   # one item: one call of the key function

    parked = {
        "inside sorted() -> key callback": _Worker("sorter", _through_sorted),
        "inside re.sub() -> replacement callback": _Worker("regex", _through_regex),
        "inside json.loads() -> object_hook": _Worker("json", _through_json),
        "5 Python calls deep": _Worker("deep", lambda: _deep_python(5)),
    }
    for g in parked.values():
        g.switch()
    for title, g in parked.items():
        saved = f"{g._stack_saved} bytes of its stack copied to the heap"
        _show(f"a greenlet parked {title} ({saved})", btcore.collect(g).format())
    first_title, first = next(iter(parked.items()))
    _show(f"the greenlet parked {first_title} again, every frame: format(verbose=True)",
          btcore.collect(first).format(verbose=True))
    for g in parked.values():
        g.throw(greenlet.GreenletExit)
    return 0


def decode_text(lines, out, verbose: bool = False) -> None:
    """Copy lines to out with every token replaced by its backtrace, resolved
    here (Backtrace.format()); a token that cannot be decoded stays, followed
    by the reason.  A token seen again (among the last 4096 distinct ones) is
    not decoded again."""
    from .codec import TOKEN_IN_TEXT
    done = {}

    def resolved(match) -> str:
        token = match.group(0)
        if token not in done:
            if len(done) >= 4096:
                done.clear()
            try:
                done[token] = btcore.decode(token).format(verbose=verbose)
            except ValueError as e:
                done[token] = f"{token} (btcore: {e})"
        return done[token]

    for piece in _pieces(lines):
        out.write(TOKEN_IN_TEXT.sub(resolved, piece))


def _pieces(f):
    """The text of f (a text file) in pieces of at most _PIECE characters
    more than a token's most, each ending where no token can go on: a line,
    or a part of a longer line (a file without newlines, /dev/zero)."""
    from .codec import MAX_TOKEN_CHARS, WORD_CHARACTERS
    most, carry = MAX_TOKEN_CHARS + _PIECE, ""
    while piece := _read_piece(f):
        piece, carry = carry + piece, ""
        if not piece.endswith("\n") and len(piece) < most:
            cut = len(piece.rstrip(WORD_CHARACTERS))   # after it, maybe a token the next piece goes on with
            piece, carry = piece[:cut], piece[cut:]
        yield piece
    yield carry


def _read_piece(f) -> str:
    try:
        return f.readline(_PIECE)
    except OSError as e:   # told apart from a failed write of the output
        raise _Unreadable(e.errno, e.strerror) from None


class _Unreadable(OSError):
    """An input file's read failed."""


_PIECE = 1 << 16


def decode_files(paths, verbose: bool) -> int:
    """decode's work: the text of each file (standard input: none, or "-"), its tokens resolved, to standard
    output; a file that cannot be read is said on standard error, and the others are decoded."""
    failed = False
    sys.stdout.reconfigure(errors="surrogateescape")
    for path in paths or ["-"]:
        if path == "-":
            if sys.stdin is None:
                return _say("decode", "standard input is closed")
            sys.stdin.reconfigure(errors="surrogateescape", newline="")   # the bytes out as they came in
            decode_text(sys.stdin, sys.stdout, verbose)
            continue
        try:
            f = open(path, encoding="utf-8", errors="surrogateescape", newline="")
        except OSError as e:
            failed = _say("decode", f"{path}: {_reason(e)}") != 0
            continue
        with f:
            try:
                decode_text(f, sys.stdout, verbose)
            except _Unreadable as e:
                failed = _say("decode", f"{path}: {_reason(e)}") != 0
    return 1 if failed else 0


def _say(command: str, text: str) -> int:
    """text said on standard error as command's; 1 (an exit status)."""
    if sys.stderr is not None:
        print(f"btcore {command}: {text}", file=sys.stderr)
    return 1


def _reason(e: Exception) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)


def _add_dump_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("dump", help="every thread's stack and every suspended greenlet of another process "
                       "(or of a core file), native and Python frames merged; nothing runs inside it")
    p.add_argument("pid", nargs="?", type=int, help="the process to dump (stopped only while its state is copied)")
    p.add_argument("--core", help="dump this core file (gcore makes one) instead of a live process")
    p.add_argument("--exe", help="the executable that made the core file (checked against its mapped files)")
    p.add_argument("--json", action="store_true", help="JSON instead of text (--format json)")
    p.add_argument("--format", choices=("text", "json", "html"), default="text",
                   help="text, JSON (the schema of dump_all(format='json')) or the HTML page of write_html() "
                   "(default text)")
    p.add_argument("--no-native", action="store_true", help="Python frames only")
    p.add_argument("--threads-only", action="store_true", help="running stacks only, no suspended greenlets")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each thread to stop (default 5)")
    p.add_argument("--tokens", action="store_true", help="text: each stack followed by its token "
                   "(python -m btcore decode reads it back)")
    p.add_argument("--crash-record", type=_address, metavar="ADDRESS",
                   help="the crash report's helper: the handler's record at this address of the crashed process, "
                   "named and encoded, first (implies --tokens)")
    return p


def _address(text: str) -> int:
    """An address argument: 0x7f..., or decimal."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an address: {text!r} (0x... or decimal)") from None
    if not 0 <= value < 1 << 64:
        raise argparse.ArgumentTypeError(f"not an address: {text!r} (0 to 2**64 - 1)")
    return value


def _add_profile_parser(sub) -> argparse.ArgumentParser:
    from .profile.rates import DEFAULT_RATE, OUTSIDE_RATE
    p = sub.add_parser("profile", help="btcore's sampling profiler: where every greenlet spends its time, running "
                       "or parked, of a Python program run under it (-- COMMAND) or of a running process, sampled "
                       "from outside (PID)", usage="python -m btcore profile [-o FILE] [--format F] [--rate HZ] "
                       "[--duration S] [--group-by G] [--mode M] (-- COMMAND ... | PID)")
    p.add_argument("pid", nargs="?", help="a running process to sample from outside (stopped for a few ms at each "
                   "sample; nothing runs inside it)")
    p.add_argument("-o", "--output", default="btcore-profile.pb.gz",
                   help="the file to write (default btcore-profile.pb.gz); its name picks the format: .pb.gz or "
                   ".pprof: pprof, .txt or .collapsed: collapsed stacks, .html: flame graphs")
    p.add_argument("--format", choices=("pprof", "collapsed", "html"), help="the format, whatever the name")
    p.add_argument("--rate", type=int, help=f"samples per second, 1 to 1000 (default {DEFAULT_RATE} inside a "
                   f"program, {OUTSIDE_RATE} from outside: each sample stops the process)")
    p.add_argument("--duration", type=float, help="seconds to record (default: until the program exits, or "
                   "Ctrl-C; the program keeps running after)")
    p.add_argument("--group-by", choices=("name", "spawn", "none"), default="name",
                   help="the first frame of each stack: the greenlet's name without its number, its spawn site "
                   "(spawn tracking is turned on for it; -- COMMAND only), or none (default name)")
    p.add_argument("--mode", choices=("wall", "cpu"), default="wall",
                   help="collapsed stacks only: every greenlet (wall) or the running ones (cpu); pprof and html "
                   "hold both (default wall)")
    return p


def profile_command(args, parser) -> int:
    from .profile.rates import DEFAULT_RATE, MAX_RATE, OUTSIDE_RATE
    from .output import check_output
    from .profile.formats import format_for
    from .profile.run import run
    command = args.program
    if not command and args.pid is None:
        parser.error("give the program to run after --, e.g. python -m btcore profile -- python app.py, "
                     "or the PID of a running process")
    if command and args.pid is not None:
        parser.error("give a PID or a program to run after --, not both")
    if args.pid is not None and not re.fullmatch(r"[0-9]+", args.pid):
        parser.error(f"{args.pid!r} is not a PID (a program to run goes after --)")
    if args.rate is None:
        args.rate = DEFAULT_RATE if command else OUTSIDE_RATE
    if not 1 <= args.rate <= MAX_RATE:
        parser.error(f"--rate must be from 1 to {MAX_RATE}, got {args.rate}")
    if args.duration is not None and not 0 < args.duration < float("inf"):
        parser.error(f"--duration must be a positive number of seconds, got {args.duration}")
    try:
        fmt = format_for(args.output, args.format)
    except ValueError as e:
        parser.error(str(e))
    try:   # before the recording, not after it: a FIFO, a directory, a device, a folder not there or not ours
        check_output(args.output)
    except OSError as e:
        parser.error(f"cannot write {args.output}: {e.strerror or e}")
    settings = {"output": os.path.abspath(args.output), "format": fmt, "rate": args.rate,
                "duration": args.duration, "mode": args.mode,
                "group_by": None if args.group_by == "none" else args.group_by}
    if command:
        return run(command, settings)
    if settings["group_by"] == "spawn":
        parser.error("--group-by spawn needs the program run under the profiler (-- COMMAND): "
                     "spawn sites are not read from outside")
    from .profile.remote import profile_command_outside
    _as_a_tool()
    return profile_command_outside(int(args.pid), settings)


# What this process keeps of the DWARF it decodes, when it is btcore's own command reading another process:
# a process of its own, gone when done, unlike a program calling btcore (BTC_SYMBOLIZE_DEFAULT_BUDGET, 6 MiB,
# which made a dump of 10,000 gevent greenlets decode some units twice: 8 ms).
_TOOL_BUDGET = 64 << 20


def _as_a_tool() -> None:
    """Set up a command that reads another process: its DWARF budget, and
    SIGTERM (a supervisor's stop, timeout(1)) handled as Ctrl-C is, where by
    default it killed the command as it stood: a profile's recording lost,
    the dump's vDSO copy left in the temporary directory."""
    from ._native import lib
    lib.btc_symbolize_budget(_TOOL_BUDGET)
    signal.signal(signal.SIGTERM, _raise_terminated)


def _raise_terminated(signum, frame):
    from .errors import Terminated
    raise Terminated()


def dump_command(args, parser) -> int:
    if (args.pid is None) == (args.core is None):
        parser.error("give a PID or --core CORE (not both)")
    if args.json and args.format not in ("text", "json"):
        parser.error(f"--json and --format {args.format} say different things: give one")
    fmt = "json" if args.json else args.format
    if args.crash_record is not None and fmt != "text":
        parser.error("--crash-record writes text (the record's token first): not with --format " + fmt)
    from .remote.process import DumpError, check_target, dump_process
    try:
        check_target(args.pid, args.core, args.exe, args.timeout)
    except (TypeError, ValueError) as e:
        parser.error(str(e))
    _as_a_tool()
    try:
        dump_process(args.pid, core=args.core, exe=args.exe, format=fmt,
                     native=not args.no_native, threads_only=args.threads_only, timeout=args.timeout,
                     tokens=args.tokens or args.crash_record is not None, crash_record=args.crash_record)
    except DumpError as e:
        print(f"btcore dump: {e}", file=sys.stderr)
        return 1
    return 0


def _split_command(argv: list) -> tuple:
    """(argv before the first "--", the command after it or []): profile's
    program is everything after "--", whatever it looks like."""
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, []


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    argv, program = _split_command(argv) if argv[:1] == ["profile"] else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m btcore", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo_parser = sub.add_parser("demo", help="print merged backtraces of parked greenlets: gevent's, or plain ones")
    demo_parser.add_argument("--greenlet", action="store_true",
                             help="the plain-greenlet demo, even when gevent is installed")
    demo_parser.add_argument("--format", choices=("text", "json", "html"), default="text",
                             help="the gevent showcase's dump format (default: text)")
    decode_parser = sub.add_parser("decode", help="replace every backtrace token (btc4....) in the text of FILEs "
                                   "(or standard input) by the backtrace it holds, resolved here")
    decode_parser.add_argument("files", nargs="*", metavar="FILE")
    decode_parser.add_argument("--verbose", action="store_true", help="every frame, with addresses (format(verbose=True))")
    parsers = {"dump": _add_dump_parser(sub), "profile": _add_profile_parser(sub)}   # (their errors, usages)
    args = parser.parse_args(argv)
    args.program = program
    if sys.stdout is None and args.command != "profile":
        return _say(args.command, "standard output is closed: nothing to write to")
    try:
        status = _run_command(args, parsers.get(args.command, parser))
        if sys.stdout is not None:
            sys.stdout.flush()   # what is still buffered fails here (a full disk), not at the interpreter's exit
        return status
    except KeyboardInterrupt as e:   # a dump's target runs again first (remote.signals_deferred)
        from .errors import Terminated
        sig = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
        _say(args.command, "terminated (SIGTERM)" if sig == signal.SIGTERM else "interrupted (Ctrl-C)")
        return 128 + sig
    except BrokenPipeError:   # what reads the output went away (| head): nothing more to say, as a C tool
        _drop_output()
        return 128 + signal.SIGPIPE
    except OSError as e:   # the output not written (a full disk, a closed descriptor), a file not read
        status = _say(args.command, f"{_reason(e)}" + (f": {e.filename}" if e.filename else ""))
        try:   # a file not read: what was written so far goes out
            if sys.stdout is not None:
                sys.stdout.flush()
        except OSError:
            _drop_output()
        return status


def _drop_output() -> None:
    """Standard output onto /dev/null, once writing to it failed: on 3.14 a failed flush keeps its bytes
    (3.11 drops them), and the interpreter's flush at exit would fail again ("Exception ignored while
    flushing sys.stdout", status 120 instead of the command's)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _run_command(args, parser) -> int:
    if args.command == "profile":
        return profile_command(args, parser)
    if args.command == "dump":
        return dump_command(args, parser)
    if args.command == "decode":
        return decode_files(args.files, args.verbose)
    if args.command == "demo":
        if args.greenlet:
            return demo()
        if importlib.util.find_spec("gevent") is None:
            print("(gevent is not installed: the plain-greenlet demo; pip install 'btcore[demo]' "
                  "for the whole-process dump of a gevent program)\n", file=sys.stderr)
            return demo()
        from .views import showcase
        return showcase.run(["--format", args.format])
    return 2


if __name__ == "__main__":
    sys.exit(main())
