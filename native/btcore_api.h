/* The C API that btcore's Python layer calls through cffi.
 *
 * This file is read twice: by the C compiler (included by every native/ unit)
 * and by cffi's cdef parser, so it holds plain declarations only: no
 * #include, no #if, no inline code.
 */

/* ---- raw frames: what a capture stores (no strings, no symbols) ---- */

#define BTC_KIND_NATIVE 1
#define BTC_KIND_PYTHON 2

#define BTC_F_EXACT     1   /* native: addr is the interrupted/current pc, not a return address */
#define BTC_F_EVAL      2   /* native: this frame runs the interpreter's eval loop */
#define BTC_F_UNMERGED  4   /* the merge could not pair this frame; kept as is */
#define BTC_F_JOIN      8   /* first frame of a backtrace added by append() */
#define BTC_F_ENTRY    16   /* python: first Python frame of an eval-loop call */
#define BTC_F_INTERNAL 32   /* native: greenlet's own switching machinery */

typedef struct {
    uintptr_t addr;    /* native: pc; python: address of a code object we hold a reference to */
    int32_t   lasti;   /* python: offset of the current instruction in bytes; native: -1 */
    uint8_t   kind;    /* BTC_KIND_* */
    uint8_t   flags;   /* BTC_F_* */
    uint16_t  reserved;
} btc_frame;

/* ---- capture ---- */

#define BTC_WANT_PYTHON    1
#define BTC_WANT_NATIVE    2
#define BTC_WANT_INTERNALS 4
#define BTC_WANT_OWN_THREAD 8   /* the target greenlet belongs to the calling thread */
#define BTC_WANT_HIDE_CALLER 16 /* drop the innermost Python frame (btcore's API function) */
#define BTC_WANT_FROM_HOOK   32 /* called from the spawn hook: drop only btcore's own native frames */

/* Errors of btc_collect() (see btc_last_error() for the reason in words). */
#define BTC_E_UNSUPPORTED   -1   /* this interpreter/greenlet build is not one we can read */
#define BTC_E_RUNNING       -3   /* target greenlet runs in another thread right now */
#define BTC_E_LAYOUT        -4   /* greenlet's saved state failed validation */

/* Capture the stack of `target` into the btcore.Backtrace at address
 * `backtrace` (CPython's id(); the caller keeps it alive), setting its
 * slots: _raw (a bytearray of the btc_frame records captured), _refs (a
 * tuple of the code object of every Python frame, in frame order, so the
 * Backtrace keeps what it names valid), _capacity and truncated.
 * target: 0 for the calling thread (in a greenlet: down to its bottom), or
 * a greenlet of any thread (suspended: its own stack; not started or dead:
 * nothing).  limit: at most that many frames (<= capacity).
 * Returns 0 or a negative BTC_E_* code.  Runs with the GIL held. */
int btc_collect(uintptr_t target, uintptr_t backtrace, int capacity, int limit, int want);

/* Tell the capture where btcore.Backtrace's slots are (checked, once). */
int btc_bind_backtrace(uintptr_t backtrace_type);

#define BTC_DEFAULT_CAPACITY 64
#define BTC_MAX_CAPACITY 65536

/* Put the builtin collect() (native/capture/collect_builtin.c) into the module at
 * `module` (btcore.backtrace): it does the common calls in C and hands every other
 * call to python_impl, the Python collect().  doc is its __doc__, starting
 * with the text signature ("collect($module, /, ...)\n--\n\n"): copied.
 * Returns 0 or -1. */
int btc_install_collect(uintptr_t module, uintptr_t python_impl, uintptr_t backtrace_type,
                        const char *doc);

/* Learn where greenlet keeps a suspended greenlet's saved stack state, from
 * two suspended (non-main) greenlets of the calling thread whose stacks were
 * partly copied to the heap: saved1 and saved2 bytes (both > 0, different,
 * as their _stack_saved says), so exactly one place in greenlet's object can
 * match both.  Returns 0, or BTC_E_LAYOUT (see btc_last_error()) on a
 * greenlet build btcore does not recognise; until it succeeds, greenlet
 * targets fail. */
int btc_greenlet_learn(uintptr_t greenlet_type, uintptr_t g1, intptr_t saved1,
                       uintptr_t g2, intptr_t saved2);

/* What btc_greenlet_learn found: StackState's offset in greenlet's C++
 * object, that object's size (measured at its allocation) and the end of
 * the bytes the scan read.  Returns 0 once learned, else -1. */
int btc_greenlet_layout(size_t *state_off, size_t *object_size, size_t *scan_end);

/* Why the last btc_collect() on this thread returned an error, in words. */
const char *btc_last_error(void);

/* ---- spawn tracking (spawn.c) ---- */

/* Remember greenlet's type (id(greenlet.greenlet)) and its original tp_new,
 * and put the builtin _spawn_node(g) into the module namespace dict at
 * `namespace`.  Once, before the others.  Returns 0 or -1. */
int btc_spawn_install(uintptr_t namespace, uintptr_t greenlet_type);
/* Hook greenlet creation (greenlet.greenlet's tp_new and that of every
 * subclass still holding it): each greenlet created from now on records its
 * creating stack (at most capacity frames; Python frames, and native ones
 * if native) and its spawner's ancestry.  Also updates the settings when
 * already on.  Returns 0, or -1 for bad arguments / not installed. */
int btc_spawn_enable(int capacity, int native);
/* Stop recording and put the original tp_new back wherever the hook is.
 * Records already made stay with their greenlets. */
void btc_spawn_disable(void);
int btc_spawn_enabled(void);
/* The capacity given to the last btc_spawn_enable() (32 before any). */
int btc_spawn_capacity(void);
/* Live records (one per tracked greenlet, and per spawner that was not
 * tracked itself) and interned sites, for tests and benchmarks. */
void btc_spawn_counts(int64_t *records, int64_t *sites);
/* A type's tp_new slot, for tests: creation restored exactly. */
uintptr_t btc_type_new_slot(uintptr_t type);

/* ---- resolution ---- */

typedef struct {
    const char *module;     /* path of the ELF object, NULL if the pc is in none */
    uintptr_t   module_base;/* load bias of that object */
    uint64_t    module_id;  /* that object's btc_module_key() identity */
    const char *symbol;     /* raw (mangled) symbol name, NULL if none covers the pc */
    uintptr_t   symbol_addr;/* absolute address of that symbol */
} btc_syminfo;

/* Name the function containing pc (already adjusted: pass pc-1 for return
 * addresses).  The strings are copied into buf (truncated to size), so they
 * outlive a concurrent dlclose of the module.  Returns 0, or -1 when no
 * loaded module contains pc. */
int btc_describe_native(uintptr_t pc, btc_syminfo *out, char *buf, size_t size);

/* What names the code at pc across loads and unloads: the id of the module
 * containing it (unique in the process: a library loaded where another one
 * was gets a new id) and pc's offset in it; 0 and pc if no module contains
 * it.  Returns the module list's generation the answer belongs to: until
 * btc_modules_generation changes, the answer for pc stays the same. */
uint64_t btc_module_key(uintptr_t pc, uint64_t *module_id, uintptr_t *offset);
/* Changes whenever the module list is rebuilt (after dlopen/dlclose, seen
 * by the next capture or lookup). */
extern uint64_t btc_modules_generation;

/* Demangle a C++ (Itanium) name; returns 0 and fills buf on success. */
int btc_demangle(const char *name, char *buf, size_t size);

/* ---- introspection for tests and benchmarks ---- */

typedef struct {
    uint32_t pc;         /* first pc the row covers, relative to the module's load bias */
    int32_t  cfa_off;
    uint8_t  cfa_kind;   /* BTC_CFA_* */
    uint8_t  cfa_reg;    /* DWARF register number; the threshold literal for BTC_CFA_PLT */
    uint8_t  flags;      /* BTC_ROW_* */
    uint8_t  ra_rule;    /* BTC_RULE_* for the return address ... */
    uint8_t  fp_rule;    /* ... the frame pointer (rbp, x29) ... */
    uint8_t  aux_rule;   /* ... and rbx on x86-64 (unused on aarch64: see btc_arch()) */
    int16_t  ra_off;
    int16_t  fp_off;
    int16_t  aux_off;
} btc_cfi_row;

#define BTC_ROW_SIGNAL    1   /* the FDE belongs to a signal trampoline (CIE augmentation 'S') */
#define BTC_ROW_RA_SIGNED 2   /* aarch64: the return address is signed here (pointer authentication:
                                 DW_CFA_AARCH64_negate_ra_state toggles it) */

#define BTC_CFA_NONE      0   /* no FDE covers this pc: the walk stops here */
#define BTC_CFA_REG       1   /* CFA = reg + off */
#define BTC_CFA_REG_DEREF 2   /* CFA = *(reg + off)        (DW_CFA_def_cfa_expression) */
#define BTC_CFA_PLT       3   /* CFA = rsp + off + ((rip & 15) >= cfa_reg ? 8 : 0) (PLT stubs) */
#define BTC_CFA_UNSUPPORTED 4 /* an expression we do not evaluate: the walk stops here */

/* A register rule is kind | (base register << 4) for BTC_RULE_AT_REG. */
#define BTC_RULE_SAME        0   /* unchanged from the callee */
#define BTC_RULE_UNDEFINED   1   /* not recoverable (for the return address: outermost frame) */
#define BTC_RULE_AT_CFA      2   /* saved at CFA + off */
#define BTC_RULE_AT_REG      3   /* saved at base register + off (DW_CFA_expression: bregN off) */
#define BTC_RULE_UNSUPPORTED 4

/* The architecture the walker was built for: its name ("x86-64",
 * "aarch64"), NULL where native walks are not supported; and the DWARF
 * numbers of the registers besides the return address that rows describe:
 * sp (a CFA base), the frame pointer (fp_rule) and aux (aux_rule; on aarch64
 * x30, which is the return-address column itself, so aux_rule stays SAME). */
const char *btc_arch(int *sp, int *fp, int *aux);

/* Copy the CFI rows of the module containing pc into out (at most max);
 * returns the number of rows the module has (build the table if needed), or
 * -1 when no module contains pc.  *bias receives the module's load bias. */
int btc_cfi_rows(uintptr_t pc, btc_cfi_row *out, int max, uintptr_t *bias);

/* [lo, hi) (absolute) of the FDE that covers pc, in the loaded module
 * containing pc; 0, or -1 if no FDE covers it. */
int btc_cfi_fde_range(uintptr_t pc, uintptr_t *lo, uintptr_t *hi);

/* The eval loop's code ranges [lo, hi) as the merge sees them (named parts
 * first, then unnamed parts found from their jumps); returns how many there
 * are (writes at most max). */
int btc_eval_ranges(uintptr_t *lo, uintptr_t *hi, int max);

/* Native-only capture of the calling C stack, for benchmarks and
 * differential tests: writes return addresses like glibc's backtrace(),
 * starting with the caller of this function. */
int btc_backtrace(uintptr_t *out, int max);

/* Test-only: btc_mem_read() through the stack view [lo, hi) (no spill):
 * 1 and *out set if the aligned 8-byte word at addr may be read, else 0. */
int btc_test_mem_read(uintptr_t lo, uintptr_t hi, uintptr_t addr, uintptr_t *out);

/* Test-only: btc_unwind() from the exact pc ip and stack pointer sp (fp,
 * aux zero) through the stack view [lo, hi); writes the frames' pcs (at most
 * max, <= 16) and returns how many. */
int btc_test_unwind(uintptr_t ip, uintptr_t sp, uintptr_t lo, uintptr_t hi, uintptr_t *pcs, int max);

/* Build a CFI table from `data` as if it were a module's .eh_frame (no
 * .eh_frame_hdr, readable range = the buffer) and check the table's
 * invariants; for fuzz tests.  Returns the row count, -1 if no table could be
 * built, -2 if the table breaks an invariant lookups rely on. */
int btc_cfi_selftest_garbage(const uint8_t *data, size_t size);

/* ---- symbolization: source locations from DWARF (symbols/symbolize.c) ---- */

typedef struct {
    const char *function;   /* raw name: mangled when DWARF has a linkage name; NULL if unknown */
    const char *file;       /* path as the compiler recorded it; NULL if unknown */
    int line;               /* 0 if unknown */
} btc_srcframe;

/* Like `addr2line -f -i` for the module-relative address vaddr (pc minus
 * load bias) in the ELF file at path, or in its separate debug file (found
 * by build-id under the debug root, or by .gnu_debuglink).  Innermost
 * inlined call first, the physical function last.  Without DWARF for
 * vaddr: one frame named from the symbol table (.symtab, else .dynsym;
 * the nearest preceding function when none contains vaddr), file NULL.
 * Strings are copied into buf, so they stay valid whatever other threads
 * do.  Returns the number of frames written (at most max), 0 when neither
 * DWARF nor a symbol covers vaddr (or the file is unreadable), -1 when buf
 * is too small.
 * Thread-safe; call it without the GIL (it may read and decode for ms). */
int btc_symbolize_file(const char *path, uintptr_t vaddr, btc_srcframe *out, int max,
                       char *buf, size_t size);

/* Bytes held by the per-file DWARF caches. */
size_t btc_symbolize_memory(void);
/* Keep at most max_files files decoded (default 16, clamped to 1..64);
 * the least recently used one is dropped first. */
void btc_symbolize_limit(int max_files);
/* Drop every cached file. */
void btc_symbolize_reset(void);
/* Where separate debug files live (default /usr/lib/debug); drops the cache. */
void btc_symbolize_debug_root(const char *dir);

/* ---- codec: module identity for compact tokens (capture/modules.c, symbols/symbolize.c) ---- */

/* A record of a Backtrace built by btcore.decode(): the frame came from a
 * token, and the Backtrace's _refs holds what it names (a Python frame's
 * name, file and line, or a module's build-id, path and module-relative pc). */
#define BTC_KIND_DECODED 3

#define BTC_BUILD_ID_MAX 32

typedef struct {
    const char *path;      /* as the loader reports it (the executable: /proc/self/exe); copied into buf */
    uintptr_t   bias;      /* load bias */
    uintptr_t   lo, hi;    /* span of its executable PT_LOAD segments (absolute) */
    uint8_t     build_id[BTC_BUILD_ID_MAX];
    int         build_id_len;   /* 0: the module has no NT_GNU_BUILD_ID note (or a longer one) */
} btc_modinfo;

/* The loaded ELF objects with an executable segment, in the loader's order,
 * each with the build-id read from its mapped PT_NOTE segments (what is
 * loaded, whatever the file on disk is now).  Writes at most max; returns
 * how many objects there are, or -1 when buf is too small for the paths. */
int btc_loaded_modules(btc_modinfo *out, int max, char *buf, size_t size);

/* The symbol-table name (raw, mangled) covering the module-relative address
 * vaddr in the ELF file at path, as btc_describe_native() names a loaded
 * module's pc; copied into buf.  *sym_vaddr: the symbol's start.  Returns 0,
 * or -1 when no symbol covers vaddr or the file cannot be read.  The last
 * few files are kept open (keyed by path, device, inode, size and mtime). */
int btc_file_symbol(const char *path, uintptr_t vaddr, char *buf, size_t size, uintptr_t *sym_vaddr);
