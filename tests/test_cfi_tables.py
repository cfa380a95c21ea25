"""The native CFI tables (native/capture/cfi_build.c) against pyelftools' decoding.

For libpython, libc and greenlet's C++ extension, every FDE pyelftools
decodes from .eh_frame must be described by btcore's rows, row by row: the
same CFA rule and the same rules for the return address and the registers
the architecture tracks (rbp and rbx on x86-64, x29 on aarch64), the same
return-address signing state (aarch64), from the same pcs, and nothing
outside the FDEs.  pyelftools takes seconds on
libpython, so its decoding is done once per module per session.

The garbage tests feed mutated copies of libc's .eh_frame to the C parser:
it must neither crash nor break the invariants lookups rely on.
"""
import bisect
import ctypes
import os
import random
import struct

import pytest
from elftools.dwarf.callframe import FDE, RegisterRule
from elftools.dwarf.constants import DW_CFA
from elftools.dwarf.dwarf_expr import DWARFExprParser
from elftools.elf.elffile import ELFFile

import conftest
from btcore._native import ffi, lib

# The interpreter's module, found at run time: the host's libpython, or
# Debian's statically linked python3.X executable.
LIBPYTHON = conftest.INTERPRETER_PATH


def _arch():
    sp, fp, aux = ffi.new("int *"), ffi.new("int *"), ffi.new("int *")
    name = lib.btc_arch(sp, fp, aux)
    return ffi.string(name).decode(), sp[0], fp[0], aux[0]


# DWARF numbers of the registers the rows track besides the return address
# (rsp, rbp, rbx on x86-64; sp, x29, x30 on aarch64, where x30 is the
# return-address column itself).
ARCH, SP, FP, AUX = _arch()


def _libc_path():
    # From the mappings, not through a symbol: under ci/asan.sh printf is ASan's interceptor.
    with open("/proc/self/maps") as f:
        return next(line.split()[-1] for line in f if os.path.basename(line.split()[-1]).startswith("libc.so."))


LIBC = _libc_path()
GNU_ARGS_SIZE = 0x2e
ROW_SIGNAL, ROW_RA_SIGNED = 1, 2

ROW = struct.Struct("<IiBBBBBBhhh")   # btc_cfi_row
assert ROW.size == ffi.sizeof("btc_cfi_row")


# ---- our rows ----

def function_address(func):
    return ctypes.cast(func, ctypes.c_void_p).value


def greenlet_text_address():
    import greenlet._greenlet as g
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == g.__file__ and "x" in fields[1]:
                return g.__file__, int(fields[0].split("-")[0], 16)
    raise AssertionError("greenlet's extension has no executable mapping")


def native_rows(pc):
    """[(pc, rules...)] of the module containing pc, relative to its bias."""
    bias = ffi.new("uintptr_t *")
    n = lib.btc_cfi_rows(pc, ffi.NULL, 0, bias)
    assert n > 0, "no CFI rows for the module at %#x" % pc
    out = ffi.new("btc_cfi_row[]", n)
    assert lib.btc_cfi_rows(pc, out, n, bias) == n
    return list(ROW.iter_unpack(ffi.buffer(out)))


def rules_of(row):
    """Everything a row says except where it starts."""
    return row[1:]


# ---- pyelftools' rows, in btc_cfi_row terms ----

CFA_NONE, CFA_REG, CFA_REG_DEREF, CFA_PLT, CFA_UNSUPPORTED = range(5)
RULE_SAME, RULE_UNDEFINED, RULE_AT_CFA, RULE_AT_REG, RULE_UNSUPPORTED = range(5)
UNSUPPORTED_CFA = (CFA_UNSUPPORTED, 0, 0)


def fits(value, bits):
    return -(1 << (bits - 1)) <= value < (1 << (bits - 1))


class Oracle:
    """Turns pyelftools' decoded rules into the fields of a btc_cfi_row."""

    def __init__(self, dwarfinfo):
        self.expr = DWARFExprParser(dwarfinfo.structs)

    def ops(self, expr):
        return [(op.op_name, list(op.args)) for op in self.expr.parse_expr(expr)]

    def cfa(self, rule):
        """(cfa_kind, cfa_reg, cfa_off)"""
        if rule.expr is not None:
            return self.cfa_expression(self.ops(rule.expr))
        if rule.reg is None or rule.offset is None:
            return UNSUPPORTED_CFA
        if not (0 <= rule.reg <= 255 and fits(rule.offset, 32)):
            return UNSUPPORTED_CFA
        return (CFA_REG, rule.reg, rule.offset)

    @staticmethod
    def cfa_expression(ops):
        names = [name for name, _ in ops]
        if len(ops) == 2 and names[0].startswith("DW_OP_breg") and names[1] == "DW_OP_deref":
            return (CFA_REG_DEREF, int(names[0][len("DW_OP_breg"):]), ops[0][1][0])
        plt = ["DW_OP_breg7", "DW_OP_breg16", "DW_OP_lit15", "DW_OP_and", None,
               "DW_OP_ge", "DW_OP_lit3", "DW_OP_shl", "DW_OP_plus"]
        if (len(ops) == len(plt) and all(p is None or p == n for p, n in zip(plt, names))
                and ops[1][1] == [0] and names[4].startswith("DW_OP_lit")):
            return (CFA_PLT, int(names[4][len("DW_OP_lit"):]), ops[0][1][0])
        return UNSUPPORTED_CFA

    def register(self, regnum, rule):
        """(rule, offset) for one tracked register."""
        if rule is None or rule.type == RegisterRule.SAME_VALUE:
            return (RULE_SAME, 0)
        if rule.type == RegisterRule.UNDEFINED:
            return (RULE_UNDEFINED, 0)
        if rule.type == RegisterRule.OFFSET and fits(rule.arg, 16):
            return (RULE_AT_CFA, rule.arg)
        if rule.type == RegisterRule.REGISTER and rule.arg == regnum:
            return (RULE_SAME, 0)
        if rule.type == RegisterRule.EXPRESSION:
            ops = self.ops(rule.arg)
            # BTC_RULE_AT_REG keeps the base in 4 bits: rip and x29/sp cannot be one.
            bases = {"DW_OP_breg%d" % r: r for r in (SP, FP, AUX) if r < 16}
            if len(ops) == 1 and ops[0][0] in bases and fits(ops[0][1][0], 16):
                return (RULE_AT_REG | (bases[ops[0][0]] << 4), ops[0][1][0])
        return (RULE_UNSUPPORTED, 0)

    def rules(self, line, flags, ra_reg):
        """The row tuple (without pc) for one line of a decoded table."""
        kind, reg, off = self.cfa(line["cfa"])
        ra, ra_off = self.register(ra_reg, line.get(ra_reg))
        fp, fp_off = self.register(FP, line.get(FP)) if FP != ra_reg else (RULE_SAME, 0)
        aux, aux_off = self.register(AUX, line.get(AUX)) if AUX != ra_reg else (RULE_SAME, 0)
        return (off, kind, reg, flags, ra, fp, aux, ra_off, fp_off, aux_off)


def ra_sign_states(entry):
    """[(pc, signed)] after each instruction of the FDE (its CIE's first):
    pyelftools decodes DW_CFA_AARCH64_negate_ra_state as a no-op, so the
    return-address signing state is replayed here (remember/restore_state
    keep it with the row, as for every other rule)."""
    code_align = entry.cie.header["code_alignment_factor"]
    pc, signed, stack, states = entry.header["initial_location"], 0, [], []
    for ins in entry.cie.instructions + entry.instructions:
        if ins.opcode in (DW_CFA.advance_loc, DW_CFA.advance_loc1, DW_CFA.advance_loc2, DW_CFA.advance_loc4):
            pc += ins.args[0] * code_align
        elif ins.opcode == DW_CFA.set_loc:
            pc = ins.args[0]
        elif ins.opcode == DW_CFA.AARCH64_negate_ra_state and ARCH == "aarch64":
            signed ^= 1
        elif ins.opcode == DW_CFA.remember_state:
            stack.append(signed)
        elif ins.opcode == DW_CFA.restore_state and stack:
            signed = stack.pop()
        states.append((pc, signed))
    return states


def signed_at(states, pc):
    """The signing state in effect at pc: after the last instruction at or before it."""
    i = bisect.bisect_right([p for p, _ in states], pc) - 1
    return states[i][1] if i >= 0 else 0


def collapse(rows):
    """Rows as (pc, rules) with a later row at the same pc winning and rows
    that change nothing dropped: the form the C tables keep."""
    out = []
    for pc, rules in rows:
        if out and out[-1][0] == pc:
            out.pop()
        if not out or out[-1][1] != rules:
            out.append((pc, rules))
    return out


def decode_with_pyelftools(path):
    """[(lo, hi, [(pc, rules)])] for every FDE, sorted, overlaps dropped the
    way the C build drops them (the later start loses)."""
    with open(path, "rb") as f:
        dwarfinfo = ELFFile(f).get_dwarf_info()
        oracle = Oracle(dwarfinfo)
        fdes = []
        for entry in dwarfinfo.EH_CFI_entries():
            if not isinstance(entry, FDE):
                continue
            lo = entry.header["initial_location"]
            hi = lo + entry.header["address_range"]
            if hi <= lo:
                continue
            # pyelftools 0.33 parses DW_CFA_GNU_args_size but its decoder
            # rejects it; it changes no rule, so leave it out.
            entry.instructions = [i for i in entry.instructions if i.opcode != GNU_ARGS_SIZE]
            cie = entry.cie.header
            signal = ROW_SIGNAL if b"S" in cie["augmentation"] else 0
            states = ra_sign_states(entry)
            lines = [(line["pc"], oracle.rules(line, signal | ROW_RA_SIGNED * signed_at(states, line["pc"]),
                                               cie["return_address_register"]))
                     for line in entry.get_decoded().table if line["pc"] < hi]
            fdes.append((lo, entry.offset, hi, collapse(lines)))
    fdes.sort()
    kept = []
    for lo, _, hi, rows in fdes:
        if kept and lo < kept[-1][1]:
            continue
        kept.append((lo, hi, rows))
    return kept


# ---- the comparison ----

NONE_RULES = (0, CFA_NONE, 0, 0, 0, 0, 0, 0, 0, 0)


def mismatches(ours, fdes, limit=20):
    """Differences between our rows and pyelftools' FDEs, in words."""
    pcs = [row[0] for row in ours]
    problems = []

    def covering(pc):
        i = bisect.bisect_right(pcs, pc) - 1
        return ours[i] if i >= 0 else None

    if pcs != sorted(set(pcs)):
        problems.append("row pcs are not strictly increasing")
    if ours and rules_of(ours[-1]) != NONE_RULES:
        problems.append("the last row does not end the covered range")
    starts = {lo for lo, _, _ in fdes}
    for lo, hi, expected in fdes:
        first = covering(lo)
        got = [(lo, rules_of(first))] if first else []
        i = bisect.bisect_right(pcs, lo)
        while i < len(ours) and ours[i][0] < hi:
            got.append((ours[i][0], rules_of(ours[i])))
            i += 1
        if collapse(got) != expected:
            problems.append("FDE [%#x, %#x): ours %s, pyelftools %s" % (lo, hi, collapse(got)[:6], expected[:6]))
        end = covering(hi)
        if hi not in starts and (end is None or rules_of(end) != NONE_RULES):
            problems.append("FDE [%#x, %#x) is not followed by a gap row" % (lo, hi))
        if len(problems) >= limit:
            break
    # Nothing outside the FDEs: every row that covers code starts inside one.
    fde_starts = [lo for lo, _, _ in fdes]
    for row in ours:
        if rules_of(row) == NONE_RULES:
            continue
        j = bisect.bisect_right(fde_starts, row[0]) - 1
        if j < 0 or row[0] >= fdes[j][1]:
            problems.append("row at %#x lies outside every FDE" % row[0])
            break
    return problems


def libc_printf():
    # libc's own printf: through the default scope it could be another
    # library's (ASan's interceptor, under ci/asan.sh).
    return function_address(ctypes.CDLL(LIBC).printf)


MODULES = {
    "libpython": lambda: (LIBPYTHON, function_address(ctypes.pythonapi.Py_Initialize)),
    "libc": lambda: (LIBC, libc_printf()),
    "greenlet": greenlet_text_address,
}


@pytest.fixture(scope="module", params=sorted(MODULES))
def module_cfi(request):
    """(name, our rows, pyelftools' FDEs) per module, decoded once."""
    path, pc = MODULES[request.param]()
    return request.param, native_rows(pc), decode_with_pyelftools(path)


def test_rows_equal_pyelftools(module_cfi):
    name, ours, fdes = module_cfi
    assert len(fdes) > 50, name
    assert mismatches(ours, fdes) == []


def test_fde_ranges_equal_pyelftools(module_cfi):
    """btc_cfi_fde_range(pc): the [lo, hi) of the one FDE covering pc, as
    pyelftools lists them (rows merge across FDEs, the ranges must not);
    none in the gaps between FDEs.  evalloop.c relies on it to find the
    unnamed parts of a stripped interpreter's eval loop."""
    name, _, fdes = module_cfi
    _, pc = MODULES[name]()
    bias = ffi.new("uintptr_t *")
    assert lib.btc_cfi_rows(pc, ffi.NULL, 0, bias) > 0
    lo_p, hi_p = ffi.new("uintptr_t *"), ffi.new("uintptr_t *")
    rng = random.Random(7)
    for lo, hi, _ in (fdes if len(fdes) <= 500 else rng.sample(fdes, 500)):
        for p in sorted({lo, hi - 1, rng.randrange(lo, hi)}):
            assert lib.btc_cfi_fde_range(bias[0] + p, lo_p, hi_p) == 0, (name, hex(p))
            assert (lo_p[0] - bias[0], hi_p[0] - bias[0]) == (lo, hi), (name, hex(p))
    gaps = [(a[1], b[0]) for a, b in zip(fdes, fdes[1:]) if a[1] < b[0]]
    assert gaps, name
    for a, b in gaps[:300]:
        assert lib.btc_cfi_fde_range(bias[0] + a, lo_p, hi_p) == -1, (name, hex(a))
        assert lib.btc_cfi_fde_range(bias[0] + b - 1, lo_p, hi_p) == -1, (name, hex(b - 1))


@pytest.mark.skipif(ARCH != "x86-64", reason="x86-64's CFI forms")
def test_rows_use_the_expression_forms(module_cfi):
    """The shapes the C code recognises really occur: PLT stubs in every
    module; in libc, the signal trampoline __restore_rt (CFA = *(rsp + 160),
    registers saved at rsp + offset in the ucontext)."""
    name, ours, _ = module_cfi
    assert CFA_PLT in {row[2] for row in ours}, name
    if name == "libc":
        restore_rt = [row for row in ours if row[4] & ROW_SIGNAL]
        assert len(restore_rt) == 1
        _, off, kind, reg, _, ra, rbp, rbx, *_ = restore_rt[0]
        assert (kind, reg, off) == (CFA_REG_DEREF, SP, 160)
        assert ra == rbp == rbx == RULE_AT_REG | (SP << 4)


@pytest.mark.skipif(ARCH != "aarch64", reason="aarch64's pointer authentication")
def test_rows_follow_return_address_signing(module_cfi):
    """Debian's arm64 binaries sign return addresses (-mbranch-protection):
    their FDEs toggle the signing state with DW_CFA_AARCH64_negate_ra_state,
    which the rows must keep (an FDE with an opcode the parser rejects would
    have no rows at all, and test_rows_equal_pyelftools would see it)."""
    name, ours, _ = module_cfi
    if name == "libc":
        assert any(row[4] & ROW_RA_SIGNED for row in ours)


@pytest.mark.parametrize("mutate", ["offset", "rule", "drop", "extra", "signal"])
def test_comparison_catches_a_changed_row(module_cfi, mutate):
    """The comparison is sharp enough to see one wrong row."""
    name, ours, fdes = module_cfi
    rows = list(ours)
    i = next(i for i in range(len(rows) // 2, len(rows)) if rows[i][2] == CFA_REG and rows[i][1] > 8)
    r = list(rows[i])
    if mutate == "offset":
        r[1] += 8
    elif mutate == "rule":
        r[5] = RULE_UNSUPPORTED
    elif mutate == "signal":
        r[4] ^= 1
    if mutate == "drop":
        del rows[i]
    elif mutate == "extra":
        r[0] += 1
        r[1] += 8
        rows.insert(i + 1, tuple(r))
    else:
        rows[i] = tuple(r)
    assert mismatches(rows, fdes, limit=1) != [], (name, mutate)


# ---- garbage ----

@pytest.fixture(scope="module")
def libc_eh_frame():
    with open(LIBC, "rb") as f:
        return ELFFile(f).get_section_by_name(".eh_frame").data()


def build_from_bytes(data):
    buf = ffi.from_buffer(bytearray(data))   # a copy: the parser must never write
    return lib.btc_cfi_selftest_garbage(buf, len(data))


def test_linear_walk_matches_the_search_table_path(libc_eh_frame):
    """A copy of .eh_frame with no header and no mapping around it (the
    linear walk) gives as many rows as the loaded module (the header's table)."""
    loaded = len(native_rows(libc_printf()))
    assert build_from_bytes(libc_eh_frame) == loaded


def mutations(data, rng):
    """Buffers derived from a real .eh_frame, each broken in one way."""
    n = len(data)
    for _ in range(120):
        b = bytearray(data)
        for _ in range(rng.randint(1, 40)):
            b[rng.randrange(n)] = rng.randrange(256)
        yield b
    for _ in range(40):   # lengths and CIE pointers: the fields that steer the walk
        b = bytearray(data)
        at = rng.randrange(0, n - 4) & ~3
        b[at:at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\xff\xff\xff\x7f", b"\x01\x00\x00\x00",
                                   b"\x00\x00\x00\x00", struct.pack("<I", rng.randrange(1 << 32))])
        yield b
    for _ in range(40):
        yield data[:rng.randrange(n)]
    for _ in range(40):
        at = rng.randrange(n)
        yield data[at:at + rng.randrange(1, 4096)]
    for _ in range(40):
        a, b = sorted(rng.randrange(n) for _ in range(2))
        yield data[:a] + data[b:] + data[a:b]


def test_garbage_never_crashes(libc_eh_frame):
    rng = random.Random(1234)
    results = []
    for buf in mutations(libc_eh_frame, rng):
        r = build_from_bytes(buf)
        assert r != -2, "table invariants broken"
        results.append(r)
    assert max(results) > 1000   # most mutations still leave most FDEs usable


def test_noise_never_crashes():
    rng = random.Random(99)
    for size in [0, 1, 3, 4, 7, 8, 16, 64, 1000, 65536]:
        for _ in range(20):
            assert build_from_bytes(bytes(rng.randrange(256) for _ in range(size))) != -2
    for filler in [b"\x00", b"\xff", b"\x80", b"\x7f"]:
        assert build_from_bytes(filler * 4096) in (-1, 0)
    # A CIE whose program is nothing but remember_state, then one FDE using it.
    cie = struct.pack("<IIB", 0, 0, 1) + b"zR\x00" + b"\x01\x78\x10\x01\x1b" + b"\x0a" * 64
    cie = struct.pack("<I", len(cie) - 4) + cie[4:]
    fde_body = struct.pack("<IiI", len(cie) + 4, -0x1000, 0x100) + b"\x00" + b"\x0a" * 40 + b"\x41" * 20
    fde = struct.pack("<I", len(fde_body)) + fde_body
    assert build_from_bytes(cie + fde + b"\x00" * 4) != -2


# ---- the walker's plain form (unwind.c) against the rule interpreter ----

PLAIN_STACK_WORDS = 1 << 17   # 1 MiB: every frame of these modules fits


def _plain_modules(chain):
    modules = {name: MODULES[name]()[1] for name in MODULES}
    modules["chain"] = chain.fn_addr(1)   # the test extension (tests/fixtures/chain.cpp)
    return modules


def test_plain_rows_step_as_the_interpreter(chain):
    """Every row of libpython, libc, greenlet and the chain fixture that the
    walker precompiles to its plain form (CFA = sp + K or fp + K, the return
    address and every saved register in the frame) steps one frame exactly as the
    rule interpreter does with that row (step()), and as the row says (read
    here from a stack whose every word is distinct); the rows it does not
    precompile are left to the interpreter.  The rows themselves equal
    pyelftools' decoding (test_rows_equal_pyelftools), so each pc gets the
    same caller registers from the plain form as from the DWARF CFI."""
    stack = ffi.new("uintptr_t[]", PLAIN_STACK_WORDS)
    lo = int(ffi.cast("uintptr_t", stack))
    hi = lo + PLAIN_STACK_WORDS * 8
    for i in range(PLAIN_STACK_WORDS):
        stack[i] = (lo + 8 * i) ^ 0x5A5A0000
    regs = ffi.new("uintptr_t[4]", [0x1111, lo, lo + 0x1000, 0xB0B0B0B0])   # fp: a frame base on the stack
    out = ffi.new("uintptr_t[5]")
    word = lambda addr: stack[(addr - lo) // 8]
    fp_based = {}
    for name, pc in _plain_modules(chain).items():
        bias = ffi.new("uintptr_t *")
        n = lib.btc_cfi_rows(pc, ffi.NULL, 0, bias)
        rows = ffi.new("btc_cfi_row[]", n)
        assert lib.btc_cfi_rows(pc, rows, n, bias) == n
        counts = {-1: 0, 0: 0, 1: 0, 2: 0}
        from_fp = []
        for i in range(n):
            row = rows[i]
            if row.cfa_kind == CFA_NONE:
                continue
            got = lib.btc_test_plain_step(rows + i, regs, lo, hi, out)
            counts[got] += 1
            assert got != 0, (name, hex(row.pc))
            if got == 1 and row.cfa_reg == FP:
                from_fp.append(i)
            if got == 1:
                cfa = (regs[2] if row.cfa_reg == FP else lo) + row.cfa_off
                expect = [word(cfa + row.ra_off), cfa,
                          word(cfa + row.fp_off) if row.fp_rule == RULE_AT_CFA else regs[2],
                          word(cfa + row.aux_off) if row.aux_rule == RULE_AT_CFA else regs[3], cfa]
                if ARCH == "aarch64":
                    expect[3] = expect[0]   # the caller's lr: the return address
                assert list(out) == expect, (name, hex(row.pc))
        # Many rows take the plain form (the fast path is a common case: 57-60%
        # here, 74% of Debian's static python3.15, whose rows are mostly from fp:
        # 27% before those were plain), and the others exist (the
        # interpreter is still exercised).
        # On aarch64 none may: Debian's arm64 binaries sign their return
        # addresses, and a signed row is never plain (its RA needs stripping).
        assert counts[1] > (0.1 * n if ARCH == "x86_64" else -1), (name, counts)
        assert counts[-1] > 0 and counts[2] == 0, (name, counts)
        fp_based[name] = len(from_fp)
        # fp far below sp, just below it (the CFA above sp, the slots saved below fp under it), misaligned,
        # just below the view's end (the CFA past it), at it, wrapping
        for fp in (lo - 64, lo - 8, lo + 0x1004, hi - 8, hi, (1 << 64) - 8):
            hostile = ffi.new("uintptr_t[4]", [0x1111, lo, fp, 0xB0B0B0B0])
            for i in from_fp:   # a frame from such an fp is never stepped as a plain one
                assert lib.btc_test_plain_step(rows + i, hostile, lo, hi, out) == 2, (name, hex(rows[i].pc), hex(fp))
    assert sum(fp_based.values()) > 0, fp_based   # rows from fp: in libc, and throughout a 3.14+ interpreter
