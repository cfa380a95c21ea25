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
#define BTC_F_SIGNAL   64   /* native: a signal return stub (libc's __restore_rt): the interrupted
                               code "returns" to its first instruction, so it is named at addr */

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
#define BTC_WANT_THREAD      64 /* target is another thread's ident: its Python frames only */

/* Errors of btc_collect() (see btc_last_error() for the reason in words). */
#define BTC_E_UNSUPPORTED   -1   /* this interpreter/greenlet build is not one we can read */
#define BTC_E_RUNNING       -3   /* target greenlet runs in another thread right now */
#define BTC_E_LAYOUT        -4   /* greenlet's saved state failed validation */
#define BTC_E_NOMEMORY      -5   /* out of memory (raised as MemoryError) */

/* Capture the stack of `target` into the btcore.Backtrace at address
 * `backtrace` (CPython's id(); the caller keeps it alive), setting its
 * slots: _raw (a bytearray of the btc_frame records captured), _refs (a
 * tuple of the code object of every Python frame, in frame order, so the
 * Backtrace keeps what it names valid), _capacity and truncated.
 * target: 0 for the calling thread (in a greenlet: down to its bottom), or
 * a greenlet of any thread (suspended: its own stack; not started or dead:
 * nothing), or with BTC_WANT_THREAD the threading ident of another thread
 * (the Python frames it runs: its native frames are not readable from
 * here).  limit: at most that many frames (<= capacity).
 * Returns 0 or a negative BTC_E_* code.  Runs with the GIL held. */
int btc_collect(uintptr_t target, uintptr_t backtrace, int capacity, int limit, int want);

/* A stamp of the suspended greenlet at address target, telling whether it
 * moved since an earlier stamp: a 64-bit hash of its Python frames (code
 * object and instruction of each, as collect(g, native=False) reads them)
 * and of where its native stack stopped (its saved sp and the size of its
 * saved stack part), computed without allocating.  0 when it cannot be
 * read (then capture it).  The profiler's test for reusing a capture. */
uint64_t btc_greenlet_stamp(uintptr_t target);

/* Tell the capture where btcore.Backtrace's slots are (checked, once). */
int btc_bind_backtrace(uintptr_t backtrace_type);

#define BTC_DEFAULT_CAPACITY 64
#define BTC_MAX_CAPACITY 65536

/* Put the builtin collect() (native/capture/collect_builtin.c) into the module at
 * `module` (btcore.capture.backtrace): it does the common calls in C and hands every other
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

/* ---- asyncio tasks (cpython/asyncio_lists.c) ---- */

/* Put the builtins _asyncio_task_lists(task_type, node_offset) and
 * _asyncio_layout() into the module namespace dict at `namespace` on
 * CPython 3.14+ (3.14's per-thread task lists); nothing elsewhere.  0 or -1. */
int btc_asyncio_install(uintptr_t namespace);

/* ---- spawn tracking (spawn.c) ---- */

/* Install the builtins _greenlets_among(objects) (the objects of a list
 * that are greenlet_type's instances) and _known_states(known, current,
 * phases, phase) (the profiler's greenlets by state) into namespace
 * (capture/introspect.py's globals; greenlet_objects.c).  Returns 0, or -1. */
int btc_install_greenlet_objects(uintptr_t namespace, uintptr_t greenlet_type);
/* Remember greenlet's type (id(greenlet.greenlet)) and its original tp_new,
 * and put the builtins _spawn_chain(g, limit), _spawn_creator(g) and _spawn_task_hook(...) (asyncio
 * tasks) into the module namespace dict at `namespace`.  Once, before the others.  Returns 0 or -1. */
int btc_spawn_install(uintptr_t namespace, uintptr_t greenlet_type);
/* Frames of a whole spawn chain's Backtrace by default (every generation):
 * a gunicorn + Flask handler's chain over three generations fits. */
#define BTC_SPAWN_DEFAULT_CAPACITY 1024
/* The most frames one spawn site records (its innermost ones). */
#define BTC_SPAWN_SITE_FRAMES 256
/* Hook greenlet creation (greenlet.greenlet's tp_new and that of every
 * subclass still holding it): each greenlet created from now on records its
 * creating stack (at most min(capacity, BTC_SPAWN_SITE_FRAMES) frames;
 * Python frames, and native ones if native) and a link to its spawner's
 * record.  Also updates the settings when already on.  Returns 0, or -1
 * for bad arguments / not installed. */
int btc_spawn_enable(int capacity, int native);
/* Stop recording and put the original tp_new back wherever the hook is.
 * Records already made stay with their greenlets. */
void btc_spawn_disable(void);
int btc_spawn_enabled(void);
/* The capacity given to the last btc_spawn_enable() (BTC_SPAWN_DEFAULT_CAPACITY
 * before any). */
int btc_spawn_capacity(void);
/* Watch greenlet creation (on) or stop (off): while watched, greenlet's
 * tp_new hook (the one spawn tracking uses) keeps a weak reference to each
 * greenlet made, for the builtin _spawn_take_created() (installed with the
 * others by btc_spawn_install): the profiler's way to find new greenlets
 * without scanning the gc's young generation at every tick.  Returns 0, or
 * -1 (not installed, no memory). */
int btc_spawn_watch_creation(int on);
/* The most generations a chain is read to (older ones are dropped, and a
 * live greenlet keeps at most twice as many records alive). */
int btc_spawn_generations(void);
/* Test-only: the hook's sites seen before (spawn.c): how many captures
 * their proofs answered without walking since the last call (the count
 * starts again), and in *last_place the place of the last capture (equal
 * places: the same sp and pc, innermost Python instruction and stop). */
uint64_t btc_test_spawn_memo(uintptr_t *last_place);
/* What a dump from outside (remote/rspawn.c) needs to read this process's
 * spawn records: where the live list is, the target's own type objects the
 * records, nodes and sites are checked against, and every field offset.
 * spawn.c fills the global btc_spawn_exported (found by that symbol in the
 * target's btcore module) at each btc_spawn_enable(); the reader copies the
 * target's and trusts nothing in it but the magic, which names this layout
 * (another btcore's records: not read). */
#define BTC_SPAWN_EXPORT_MAGIC 0x62746373706e0001ULL   /* "btcspn", layout 1 */
typedef struct {
    uint64_t magic;
    uintptr_t live;             /* the live list's head (a record, never a greenlet's) */
    uintptr_t record_type, tuple_type, bytearray_type, backtrace_type, true_object, ellipsis;
    uint32_t record_size, record_object, record_site, record_spawner, record_parent, record_next;
    uint32_t object_type, var_size, tuple_items, bytearray_start, backtrace_raw, backtrace_truncated;
    uint32_t generations;       /* links a chain is read to (btc_spawn_generations()) */
    uint32_t capacity;          /* frames of a whole chain's Backtrace (btc_spawn_capacity()) */
} btc_spawn_export;
/* Live records (one per tracked greenlet, and per spawner that was not
 * tracked itself) and interned sites, for tests and benchmarks. */
void btc_spawn_counts(int64_t *records, int64_t *sites);
/* Exception notes (spawn_notes.c).  Install the builtin
 * _note_if_kept(exception, greenlet) into namespace (capture/spawn_notes.py's
 * globals, where NOTE_HEADER and the kept texts _rendered are read): it adds
 * the greenlet's kept chain note, returning None, or returns the key the
 * text is to be kept under once rendered.  Returns 0, or -1. */
int btc_spawn_notes_install(uintptr_t namespace);
/* render != 0 (id of a callable render(exception, greenlet, key))
 * replaces greenlet_type's switch and throw methods by ones that note an
 * exception when the call raises because the greenlet it was made on died
 * with it: with the kept text, else through render; render == 0 puts
 * greenlet's own methods back.  Returns 0, or -1 if greenlet's methods are
 * not as expected (then greenlet's own methods are in place). */
int btc_spawn_notes(uintptr_t greenlet_type, uintptr_t render);
/* A type's tp_new slot, for tests: creation restored exactly. */
uintptr_t btc_type_new_slot(uintptr_t type);
/* ---- OS threads (threads.c) ---- */

/* The calling OS thread's ident (pthread_self(): threading's ident before
 * any monkey-patching replaced get_ident). */
uint64_t btc_os_thread_self(void);
typedef struct {
    uint64_t ident;                /* the thread state's thread_id (pthread_t) */
    int64_t native_id;             /* the kernel's thread id */
    uintptr_t stack_lo, stack_hi;  /* its stack, [lo, hi); 0, 0 if unknown */
} btc_os_thread;
/* The interpreter's threads (GIL held), at most max: how many were written,
 * or -1 if the calling thread has no thread state. */
int btc_os_threads(btc_os_thread *out, int max);
/* The CPU time, in ns, the thread of this interpreter whose ident is ident
 * has used (the kernel's per-thread clock: any instruction it ran since an
 * earlier read shows); -1 if there is no such thread or the GIL is not
 * held.  The profiler reuses an idle thread's last stack with it. */
int64_t btc_thread_cpu_ns(uint64_t ident);
/* Install the builtin _thread_clocks() (every other thread's CPU clock and
 * switch count at once: threads.c) into namespace (capture/threads.py's
 * globals).  0, or -1. */
int btc_install_thread_clocks(uintptr_t namespace);
/* An address inside the stack of the thread whose main greenlet is g (its
 * id): the stack pointer g was last suspended at; 0 if there is none (not a
 * main greenlet, never suspended, dead, greenlet's layout not learned, not
 * a greenlet). */
uintptr_t btc_greenlet_stack_mark(uintptr_t g);

/* ---- resolution ---- */

/* What names the code at pc across loads and unloads: the id of the module
 * containing it (unique in the process: a library loaded where another one
 * was gets a new id) and pc's offset in it; 0 and pc if no module contains
 * it.  Returns the module list's generation the answer belongs to: until
 * btc_modules_generation changes, the answer for pc stays the same. */
uint64_t btc_module_key(uintptr_t pc, uint64_t *module_id, uintptr_t *offset);
/* Changes whenever the module list is rebuilt (after dlopen/dlclose, seen
 * by the next capture or lookup). */
extern uint64_t btc_modules_generation;

/* Demangle a C++ (Itanium), Rust (legacy, v0) or Cython name; returns 0 and
 * fills buf on success, -1 when name is none of those (or buf too small). */
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

/* Test-only: btc_py_eval_call_address() of the interpreter frame of the
 * frame object at `frame` (id() of a frame of the calling thread): the
 * C-stack address that bounds a spawn site's walk, or 0. */
uintptr_t btc_test_eval_call_address(uintptr_t frame);

/* Test-only: btc_mem_read() through the stack view [lo, hi) (no spill):
 * 1 and *out set if the aligned 8-byte word at addr may be read, else 0. */
int btc_test_mem_read(uintptr_t lo, uintptr_t hi, uintptr_t addr, uintptr_t *out);
/* Test-only: btc_read_piped(): 1 and n bytes at src copied to out, or 0
 * (src not readable, or n above what a pipe takes). */
int btc_test_read_piped(uintptr_t src, size_t n, uint8_t *out);
/* Test-only: btc_main_stack_end(): the end of the main thread's stack if
 * addr lies in it, else 0. */
uintptr_t btc_test_main_stack_end(uintptr_t addr);

/* Test-only: btc_unwind() from the exact pc ip and stack pointer sp (fp,
 * aux zero) through the stack view [lo, hi); writes the frames' pcs (at most
 * max, <= 16) and returns how many. */
int btc_test_unwind(uintptr_t ip, uintptr_t sp, uintptr_t lo, uintptr_t hi, uintptr_t *pcs, int max);

/* Test-only: the walker's plain form of row (unwind.c: CFA = sp + K or fp + K, every
 * saved register in the frame) stepped against its rule interpreter, from
 * regs {ip, sp, fp, aux} through the stack view [lo, hi): -1 if row has no
 * plain form (and the plain step refuses it), 2 if its frame cannot be read
 * in place there (the interpreter steps it), 1 if both give the same
 * registers, CFA and answer, 0 if not (or a row with no plain form was
 * stepped as one).
 * out: {ip, sp, fp, aux, cfa} after the plain step. */
int btc_test_plain_step(const btc_cfi_row *row, const uintptr_t *regs, uintptr_t lo, uintptr_t hi, uintptr_t *out);
/* Test-only: the walker's row cache (unwind.c).  The set pc lies in; and
 * how many of pcs[0..n), looked up in turn as a walk looks them up, were not
 * in the cache. */
int btc_test_row_cache_set(uintptr_t pc);
int btc_test_row_cache_misses(const uintptr_t *pcs, int n);

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
/* The same for the file open as fd (from btc_open_regular(); path: its
 * name, where its .gnu_debuglink target is looked for): what is read is
 * the file fd is open on, whatever path names now.  fd -1: path itself. */
int btc_symbolize_fd(int fd, const char *path, uintptr_t vaddr, btc_srcframe *out, int max,
                     char *buf, size_t size);
/* Read ahead what naming the n module-relative addresses vaddrs[i] in the
 * files paths[i] will read (symbol tables, DWARF units, line tables), into
 * the cache the calls above share, returning nothing: a later
 * btc_symbolize_fd() / btc_file_symbol_fd() of them only looks up.  Made
 * for a thread of its own while the caller does other work (an outside
 * dump names its native frames while it groups and draws its stacks).
 * *stop (may be NULL) set by another thread: the addresses not reached yet
 * are left (the caller's work is done; it names what it still needs).
 * Thread-safe; releases the GIL; the cache's lock is taken per address, so
 * lookups of other threads interleave. */
void btc_symbolize_ahead(const char *const *paths, const uintptr_t *vaddrs, int n, const int *stop);

/* A descriptor open for reading (O_CLOEXEC) on the regular file path names
 * (symlinks followed), or -1 with errno set (EINVAL: not a regular file;
 * ENOEXEC: smaller than an ELF header, like procfs files, which say 0).
 * Nothing else is ever opened: path is resolved with O_PATH, the object is
 * checked with fstat() on that descriptor, and a regular file is opened
 * through it (/proc/self/fd/N), never through path again.  *mode (may be
 * NULL): the st_mode of what path names, 0 if it could not be stat'ed. */
int btc_open_regular(const char *path, uint32_t *mode);

typedef struct {
    const char *module;     /* path of the ELF object containing the pc */
    uintptr_t   module_base;/* its load bias */
    uint64_t    module_id;  /* its btc_module_key() identity */
    const char *symbol;     /* demangled name of the symbol covering the pc (the module's own
                               table, else its debug file's .symtab); NULL if none */
    uintptr_t   symbol_addr;/* absolute address of that symbol */
} btc_native_info;

/* Everything resolution needs for the native pc of a captured frame, in one
 * call (the GIL released once): its module, its symbol, and its source
 * levels as btc_symbolize_file() gives them, function names demangled.
 * flags: the frame's BTC_F_* (a return address is looked up at pc - 1, an
 * exact pc or a signal return stub at pc).  Strings are copied into buf.
 * Returns the number of levels written (0: no DWARF or symbol for pc), -1
 * when no loaded module contains pc, -2 when buf is too small.  Thread-safe,
 * usable without the GIL. */
int btc_resolve_native(uintptr_t pc, int flags, btc_native_info *out, btc_srcframe *levels, int max,
                       char *buf, size_t size);

/* Test-only: how many btc_elf (symbol tables, section headers) are open for
 * the file at path: 1 when the module list and the DWARF cache both use it. */
int btc_elf_instances(const char *path);
/* Test-only: how many times the DWARF cache's entry for path read a compile
 * unit's DIE bytes (its top DIE and every later decode of the unit); -1
 * when path has no entry. */
long btc_symbolize_units_read(const char *path);

/* Bytes held by the per-file DWARF caches. */
size_t btc_symbolize_memory(void);
/* Bound those bytes (default BTC_SYMBOLIZE_DEFAULT_BUDGET): after every
 * lookup, decoded compile units are given back, least recently used first,
 * then whole files, until at most `bytes` are held (the latest lookup's
 * unit and file are kept even if they alone exceed it).  A unit given back
 * is decoded again when next needed. */
#define BTC_SYMBOLIZE_DEFAULT_BUDGET 6291456
void btc_symbolize_budget(size_t bytes);
/* Keep at most max_files files decoded (default 16, clamped to 1..64);
 * the least recently used one is dropped first. */
void btc_symbolize_limit(int max_files);
/* Drop every cached file. */
void btc_symbolize_reset(void);
/* Where separate debug files live (default /usr/lib/debug); drops the cache. */
void btc_symbolize_debug_root(const char *dir);

/* ---- ELF files: what the dump of another process reads (symbols/elf.c, elf_core.c) ---- */

/* An ELF file's sections and symbols (symbols/elf.h): the file at path,
 * opened as btc_open_regular() opens it, read once and shared while open
 * (the same file opened twice is one btc_elf); NULL if it is not a 64-bit
 * little-endian ELF file with readable section headers. */
typedef struct btc_elf btc_elf;
btc_elf *btc_elf_open(const char *path);
void btc_elf_close(btc_elf *e);
/* The value of the defined symbol (any type) named `name`, .dynsym first,
 * then .symtab: 0 and *value, or -1 if there is none. */
int btc_elf_symbol_value(btc_elf *e, const char *name, uint64_t *value);
/* The first bytes (at most max) of section `name`, stored plain: how many
 * were copied to out, or -1 if there is no such section, it is compressed,
 * or it cannot be read. */
int btc_elf_section_head(btc_elf *e, const char *name, uint8_t *out, int max);
/* The GNU build-id of the file open as fd, from its PT_NOTE segments (what
 * the loader maps): its full length (its first max bytes copied to out), 0
 * if it has none, -1 if fd is not a 64-bit little-endian ELF file. */
int btc_elf_file_build_id(int fd, uint8_t *out, int max);

/* A core file: its PT_LOAD segments and its notes.  The caller gives the
 * arrays and their capacities; the counts say how many the core has (more
 * than the capacity: only that many written, call again with room). */
typedef struct {
    uint64_t vaddr, filesz, memsz, offset;
} btc_core_segment;
typedef struct {
    int32_t tid;
    uintptr_t regs[4];   /* ip, sp, rbp, rbx (NT_PRSTATUS) */
} btc_core_thread;
typedef struct {
    uint64_t lo, hi, offset;   /* offset: bytes into the file (NT_FILE gives pages) */
    uint32_t path_at;          /* its NUL-terminated path: paths + path_at */
} btc_core_file;
typedef struct {
    btc_core_segment *segments;
    int max_segments, nsegments;
    btc_core_thread *threads;   /* in the note's order: the first is the process's */
    int max_threads, nthreads;
    btc_core_file *files;
    int max_files, nfiles;
    char *paths;
    size_t paths_size, paths_used;
    uintptr_t vdso;             /* AT_SYSINFO_EHDR (NT_AUXV), 0 if absent */
} btc_core;
/* 0; -1 fd is not a 64-bit little-endian ELF file (or its program headers
 * lie outside it); -2 it is not an x86-64 core file; -3 a count exceeds
 * its capacity or paths is too small (counts and paths_used say how much
 * is needed).  Bounded: a malformed note is skipped, never read past. */
int btc_core_read(int fd, btc_core *out);

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
 * vaddr in the ELF file at path (its own table, else its debug file's), as
 * btc_resolve_native() names a loaded module's pc; copied into buf.  *sym_vaddr: the symbol's start.  Returns 0,
 * or -1 when no symbol covers vaddr or the file cannot be read.  The last
 * few files are kept open (keyed by path, device, inode, size and mtime). */
int btc_file_symbol(const char *path, uintptr_t vaddr, char *buf, size_t size, uintptr_t *sym_vaddr);
/* The same for the file open as fd (see btc_symbolize_fd()); fd -1: path. */
int btc_file_symbol_fd(int fd, const char *path, uintptr_t vaddr, char *buf, size_t size, uintptr_t *sym_vaddr);

/* ---- codec: the token encoder (codec/encode.c) ---- */

#define BTC_TOKEN_VERSION 4          /* tokens are "btc4." + base64url (btcore/codec.py also reads "btc2." and "btc3.") */
#define BTC_TOKEN_BUILD_ID_BYTES 4   /* the build-id prefix a token keeps per module */

#define BTC_ENCODE_NEED_MODULE  -2   /* teach need->module_id[0..count) with btc_encode_module(), call again */
#define BTC_ENCODE_ELSEWHERE    -4   /* what this encoder does not write: use btcore/codec.py's */
#define BTC_ENCODE_MAX_NEED 16

typedef struct {
    int       count;
    uint64_t  module_id[BTC_ENCODE_MAX_NEED];
    uintptr_t pc[BTC_ENCODE_MAX_NEED];   /* an address inside each of them (look it up as exact) */
} btc_encode_need;

/* The token of the btcore.Backtrace at address backtrace (CPython's id();
 * the caller keeps it alive), as a str appended to the list at address
 * into: returns its length, or a BTC_ENCODE_* code (nothing appended).
 * Runs with the GIL held. */
int btc_encode(uintptr_t backtrace, uintptr_t into, btc_encode_need *need);
/* The module table entry (nbits bits, design.md format 3) of the module
 * with id module_id (btc_module_key()), kept for every later token
 * (bounded).  Returns 0, or -1 if refused (already known, too long). */
int btc_encode_module(uint64_t module_id, const uint8_t *entry, size_t nbits);
/* Forget the module entries (modules != 0) and what is cached of Python
 * objects, lines and coded strings (objects != 0): tests and benchmarks of
 * a cold encoder.  Runs with the GIL held. */
void btc_encode_forget(int modules, int objects);
/* Make Backtrace.encode() (of backtrace_type) a builtin method doing what
 * btc_encode() does and handing every other call to python_impl(bt)
 * (codec.encode()); doc is its __doc__ (copied).  Returns 0 or -1. */
int btc_install_encode(uintptr_t backtrace_type, uintptr_t python_impl, const char *doc);

/* ---- signal-context capture and the watchdog (capture/signal_capture.c, watch/) ---- */

/* Why a signal-context sample is partial (bits of btc_sigsample.partial). */
#define BTC_PARTIAL_LOCKED    1   /* the module list was busy: Python frames only */
#define BTC_PARTIAL_NO_TABLE  2   /* the walk stopped at a module whose CFI table was not built yet */
#define BTC_PARTIAL_NO_MODULE 4   /* the walk stopped at a pc in no module known (loaded since?) */
#define BTC_PARTIAL_TRUNCATED 8   /* more frames than the sample holds */
#define BTC_PARTIAL_OFF_STACK 16  /* the stack pointer lies outside the thread's stack: Python frames only */
#define BTC_PARTIAL_PYTHON    32  /* the Python frame chain could not be read to its end */
#define BTC_PARTIAL_SWITCHING 64  /* interrupted inside a greenlet switch: its innermost native frames only */
#define BTC_PARTIAL_CUT      128  /* the walk stopped before the stack's end (a caller not recovered) */

#define BTC_SIGNAL_FRAMES 128

/* One capture made by a signal handler on the thread it interrupted: raw
 * frames as collect() records them, but no reference held on the code
 * objects named (resolve them while the thread is still where it was). */
typedef struct {
    btc_frame frames[BTC_SIGNAL_FRAMES];
    int n;
    unsigned partial;       /* BTC_PARTIAL_* */
    uintptr_t pending_pc;   /* BTC_PARTIAL_NO_TABLE: a pc in the module whose table is missing */
} btc_sigsample;

/* Make the calling thread samplable from other threads (GIL held): note its
 * thread state and stack, learn greenlet's start-up stub and the eval loop,
 * build the CFI tables of the interpreter and libc, and install the capture
 * signal's handler.  Idempotent.  Returns the thread's slot (>= 0) or a
 * BTC_E_* code (btc_last_error() says why: no free slot, the signal taken). */
int btc_thread_register(void);
/* btc_thread_register(), then every other thread of the interpreter that
 * is not registered yet, from here (GIL held): each one's state and stack
 * noted, its kernel thread id for the signal.  Such a thread has no exit
 * hook: it is forgotten at the next call once it is gone (a sample asked
 * of it meanwhile gets no answer).  The count added, or a BTC_E_* code. */
int btc_thread_register_others(void);
/* Forget the calling thread (on thread exit). */
void btc_thread_unregister(void);
/* Sample a registered thread (its threading ident) through the capture
 * signal, waiting at most timeout_ms per ask; a partial sample is asked
 * again (a few times at most), after building the table the handler missed.  Releases the
 * GIL while it waits.  Returns 0, or -1 (not registered, or no answer in
 * time: a thread blocking the signal). */
int btc_signal_sample(uint64_t thread_ident, int timeout_ms, btc_sigsample *out);
/* The sample as text, innermost frame first, one frame a line (native:
 * "  [module] function+0xoff", then " (file:line)" where DWARF has it;
 * Python: "  File "f", line N, in name"),
 * named without the GIL: symbol tables in C, code objects read raw (call
 * it while the sampled thread still runs those frames).  Returns the
 * length written (truncated to size - 1, NUL-terminated). */
int btc_sigsample_format(const btc_sigsample *s, char *buf, size_t size);
/* Crash report (watch/crash.c): handlers for SIGSEGV, SIGBUS, SIGILL, SIGFPE
 * and SIGABRT that write the crashing thread's backtrace to fd (async-signal-
 * safe, on an alternate stack given to the calling thread), then hand the
 * signal to the dispositions found at installation.  The calling thread must
 * be registered (btc_thread_register) for its frames to be shown.  Calling it
 * again changes fd and gives the calling thread an alternate stack.
 * Returns 0 or -1. */
int btc_crash_enable(int fd);
/* The command that writes the rest of the report from outside (argc
 * arguments, argv[0] a path; the crashed process's pid is appended at crash
 * time), run after the crashing thread's frames and waited for at most
 * timeout_ms; argc 0: none.  0, or -1 (over 8 arguments or 8 KiB). */
int btc_crash_set_helper(const char *const *argv, int argc, int timeout_ms);
/* What the crash handler found, kept for the helper, which reads it from
 * the stopped process (its address is one of the helper's arguments):
 * stacks[0] the crashing thread at the fault (partial: BTC_PARTIAL_*),
 * then the crashing greenlet's spawn sites, newest first (object: the
 * spawner's repr, a str).  Frames as collect() records them: a Python
 * frame's addr is the crashed process's code object. */
#define BTC_CRASH_MAGIC 0x3168736172637462ULL
#define BTC_CRASH_SITES 16      /* generations of a spawn chain in the report */
#define BTC_CRASH_FRAMES 4224   /* a sample (128) and 16 sites of 256 */
typedef struct {
    uint32_t first, n;      /* frames[first : first + n] */
    uint32_t truncated, partial;
    uint64_t object;
} btc_crash_stack;
typedef struct {
    uint64_t magic;         /* BTC_CRASH_MAGIC once written, 0 before */
    uint64_t greenlet;      /* the crashing greenlet (0: the thread's main greenlet, or not found) */
    uint64_t greenlet_type; /* its type's tp_name, a C string */
    uint32_t nstacks, signal;
    btc_crash_stack stacks[1 + BTC_CRASH_SITES];
    btc_frame frames[BTC_CRASH_FRAMES];
} btc_crash_record;
/* The handler's record (written at a crash only). */
uint64_t btc_crash_record_address(void);
/* Put the previous dispositions back where our handler still is. */
void btc_crash_disable(void);
int btc_crash_enabled(void);
/* Tests: does SIGSEGV run our handler now? */
int btc_test_crash_handler_is_ours(void);
/* Tests: the crash handler's search for the running greenlet's spawn
 * chain, from here (the calling thread, registered): its sites, -1 if no
 * record, -2 if the thread is not registered; the greenlet in *greenlet. */
int btc_test_crash_chain_here(uint64_t *greenlet);
/* Tests: fault inside the report (a second crash while reporting). */
void btc_test_crash_fault_in_report(int on);
/* Tests: fault while holding the module list lock, as a crash inside a
 * capture (a walk holds it) would. */
void btc_test_crash_holding_modules_lock(void);
/* The signal the handler captures on (a real-time signal). */
int btc_capture_signal(void);

/* Watch the calling thread (registers it): the watchdog reads its switch
 * count (btc_switch_count) without the GIL.  idle_code: the code object
 * a thread waiting for events is sampled in, as its innermost Python
 * frame (gevent's Hub.run, an asyncio selector's select(); 0: none): it is
 * not stuck.  [wait_lo, wait_hi): empty, or the code of an event loop
 * written in C (uvloop), whose wait has no Python frame of its own: idle
 * then also needs the call the signal interrupted to be made from there.
 * Its slot or a BTC_E_* code. */
int btc_watch_thread(uintptr_t idle_code, uintptr_t wait_lo, uintptr_t wait_hi);
/* Stop watching the calling thread. */
void btc_unwatch_thread(void);
/* The calling thread's switch count as greenlet keeps it: the thread
 * state's context_ver, which every switch into a greenlet increments
 * (contextvars' Context.run too).  No GIL needed. */
uint64_t btc_switch_count(void);
/* The switch count of the thread of this interpreter whose ident
 * (threading.get_ident()) is ident; -1 if there is none, or the GIL is not
 * held (it walks the thread states). */
int64_t btc_thread_switch_count(uint64_t ident);
/* Start the watchdog thread (C, never takes the GIL): a watched thread
 * whose greenlets have not switched for threshold_s is sampled and
 * reported to fd (dup'ed), again after 2x, 4x, ... while stuck (repeat),
 * and a line is written when it switches again.  0, or -1 if running. */
int btc_watchdog_start(double threshold_s, int fd, int repeat);
/* Stop it and wait for it (the GIL released meanwhile); 0 if it was not running. */
int btc_watchdog_stop(void);
/* Reports written since start (for tests). */
int btc_watchdog_reports(void);

/* register_dump_signal(stuck=True): on signal signum, a C thread samples
 * the main thread (which must call this) and writes its stack to fd
 * (dup'ed); chain: also run the handler installed before.  0 or -1. */
int btc_dump_signal_install(int signum, int fd, int chain);
/* Put the previous handler back; 0 if none was installed for signum. */
int btc_dump_signal_uninstall(int signum);

/* register_dump_signal(): signum's handler (Python's, installed just
 * before, from the main thread) wrapped so that a main thread blocked in a
 * wait is interrupted until its Python handler has started (seen).
 * 0 or -1. */
int btc_prompt_signal_install(int signum);
/* Called first thing by that Python handler. */
void btc_prompt_signal_seen(int signum);
/* Python's handler back, no nudge left queued; 1, 0 if not installed, -1
 * from a thread other than the one that installed. */
int btc_prompt_signal_uninstall(int signum);

/* Test-only: a handler on signal signum (a timer) that captures the
 * interrupted thread (registered here) and checks each sample inside the
 * handler, until btc_test_signal_stress_stop(), which writes 12 counts:
 * complete, partial, invalid samples, partial ones per BTC_PARTIAL_* bit
 * (1, 2, 4, ...), complete ones with Python frames; and the last invalid
 * sample. */
int btc_test_signal_stress_start(int signum);
void btc_test_signal_stress_stop(int64_t *counts, btc_sigsample *last_invalid);
/* Benchmark-only: the handler's capture of the calling registered thread,
 * from getcontext()'s registers, without a signal.  0, or -1 if the thread
 * is not registered. */
int btc_test_capture_here(btc_sigsample *out);
/* Test-only: the watchdog's text of a repeat report of a stuck call (the
 * second), after a first report of `first` at first_at seconds; its length
 * (cut at size - 1). */
int btc_test_watchdog_repeat(const btc_sigsample *first, double first_at, const btc_sigsample *then,
                             double then_at, char *buf, size_t size);
/* ---- another process, from outside (native/remote/) ---- */

/* Its memory: a live process (process_vm_readv, else /proc/PID/mem) or
 * segments of files (a core file and the files it names), through a bounded
 * chunk cache that keeps what it read (the dump's snapshot). */
typedef struct btc_rmem btc_rmem;
btc_rmem *btc_rmem_open_pid(int pid);
btc_rmem *btc_rmem_open_segments(void);
/* [vaddr, vaddr + size) is the file fd's bytes from offset (segments are
 * searched in the order added). */
int btc_rmem_add_segment(btc_rmem *m, uintptr_t vaddr, uint64_t size, int fd, uint64_t offset);
/* 0, or -1 if any byte of [addr, addr + n) is unreadable. */
int btc_rmem_read(btc_rmem *m, uintptr_t addr, void *buf, size_t n);
void btc_rmem_forget(btc_rmem *m);
/* The addresses of the chunks the cache holds (at most max): what a walk
 * read, to be read again together (btc_rmem_prefetch) after forgetting. */
int btc_rmem_chunk_bases(btc_rmem *m, uintptr_t *out, int max);
/* Fill the cache's chunks under the n addresses (0s are skipped) in
 * batches of one syscall; later reads there are cache hits. */
void btc_rmem_prefetch(btc_rmem *m, const uintptr_t *addr, int n);
/* n ranges [addr[i], addr[i] + size[i]) into dest[i], past the cache
 * (each is read once), in batches of one syscall where the process allows
 * it; ok[i] says whether range i was read whole.  A large job of a live
 * process is read by two threads at once (rmem.c, "two readers"). */
void btc_rmem_read_many(btc_rmem *m, const uintptr_t *addr, const size_t *size, uint8_t *const *dest, int n,
                        uint8_t *ok);
/* n ranges of one size, [addr[i], addr[i] + size) into dest + i * size,
 * through the cache, the chunks under them prefetched together first
 * (many small objects, which lie near each other: a few syscalls); ok[i]
 * says whether range i was read whole. */
void btc_rmem_read_each(btc_rmem *m, const uintptr_t *addr, int n, size_t size, uint8_t *dest, uint8_t *ok);
void btc_rmem_close(btc_rmem *m);
int btc_rmem_last_errno(btc_rmem *m);
uint64_t btc_rmem_syscalls(btc_rmem *m);

/* Stop thread tid (PTRACE_SEIZE + PTRACE_INTERRUPT, waiting at most
 * timeout_ms) and read regs = {ip, sp, rbp, rbx}; 0 or -errno.  After any
 * return but -EPERM/-ESRCH from the seize, the caller must detach, handing
 * back *pending_signal (a signal that arrived meanwhile). */
int btc_ptrace_stop(int tid, int timeout_ms, uintptr_t *regs, int *pending_signal);
int btc_ptrace_detach(int tid, int signal);

/* Its modules, from the files on disk. */
typedef struct btc_rmodules btc_rmodules;
btc_rmodules *btc_rmodules_new(void);
void btc_rmodules_free(btc_rmodules *s);
/* Add the ELF file at path, whose file offset map_offset the target mapped
 * at map_start; mem (may be NULL: not checked) must show the file's build-id
 * there.  0 (*bias: the load bias), -1 unreadable or not ELF, -2 no segment
 * maps that offset (or it overlaps a module added), -3 build-id differs. */
int btc_rmodules_add(btc_rmodules *s, btc_rmem *mem, const char *path, uintptr_t map_start,
                     uint64_t map_offset, uintptr_t *bias);
/* How many module images this process has read from files, all sets
 * together: a file's image and table are shared by the sets that add it,
 * and kept for the next (tests, benchmarks). */
uint64_t btc_rmodules_images_read(void);
/* greenlet's switching code in the target (from the module containing
 * `inside`): where a suspended greenlet resumes, where slp_switch stored
 * rbp/rbx (relative to its saved sp), g_initialstub's ranges. */
typedef struct {
    uintptr_t resume_pc;
    int bp_slot, bx_slot;
    uintptr_t stub_lo[2], stub_hi[2];
    int nstub;
} btc_remote_greenlet_code;
int btc_rmodules_greenlet_shape(btc_rmodules *s, uintptr_t inside, btc_remote_greenlet_code *out);
/* The target's eval-loop code, in the interpreter module that holds
 * `inside`: the parts its symbols name, then the unnamed parts their
 * direct jumps land in (a stripped interpreter: capture/evalloop.c), as
 * [lo[i], hi[i]) target addresses, at most max; the count. */
int btc_rmodules_eval_ranges(btc_rmodules *s, uintptr_t inside, uintptr_t *lo, uintptr_t *hi, int max);

/* CPython's layout, the one table every reader of another process's
 * interpreter uses (offsets in bytes; native/remote/pylayout.c holds the
 * known values per version family).  btc_remote_layout_of() fills it for a
 * target of version_hex: 0 complete (3.11: its layout is known, and pinned
 * to 3.11's own headers by static assertions where btcore is built for
 * 3.11); 1 the family's constants only, the rest to be read from the
 * target's _Py_DebugOffsets (3.13-3.15: btcore/remote/debug_offsets.py fills the
 * fields marked D; the gc fields it receives relative to the interpreter's
 * gc state, which it adds); -1 a version btcore cannot read. */
typedef struct {
    uint64_t version_hex;
    uint32_t runtime_interp_head, interp_next, interp_threads_head;                       /* D */
    uint32_t interp_gc_generations, interp_gc_permanent, gc_generation_size, gc_ngenerations;
    uint32_t tstate_next, tstate_thread_id, tstate_native_thread_id;                      /* D */
    int32_t tstate_cframe;          /* 3.11: the current frame is tstate->cframe->current_frame; else -1 */
    uint32_t tstate_current_frame;  /* in the thread state, or in _PyCFrame (3.11); D */
    uint32_t frame_previous, frame_executable, frame_instr_ptr, frame_owner;              /* D */
    int32_t frame_is_entry;         /* 3.11: the frame says whether it is its eval-loop call's entry; else -1 */
    uint32_t frame_frame_obj;       /* _PyInterpreterFrame.frame_obj */
    uint32_t shim_owner;            /* owners from this one up are the eval loop's shims (0: none, 3.11) */
    uint32_t executable_tag_bits;   /* 3.14+: f_executable is a tagged _PyStackRef */
    uint32_t frame_object_f_frame, frame_object_data;   /* PyFrameObject.f_frame, ._f_frame_data */
    uint32_t code_filename, code_qualname, code_firstlineno, code_linetable, code_size, code_adaptive; /* D */
    uint32_t type_name;                                                                   /* D */
    uint32_t unicode_state, unicode_length, ascii_data, compact_data;                     /* D */
    uint32_t bytes_size, bytes_data;                                                      /* D */
    uintptr_t code_type;            /* the target's PyCode_Type: a frame's code must have it (0: unchecked) */
} btc_remote_layout;
int btc_remote_layout_of(uint64_t version_hex, btc_remote_layout *out);
/* For tests: the fields marked D as the in-process readers of this build
 * compile them in (offsetof on its headers): 0 on a 3.13-3.15 build, whose
 * table from its own _Py_DebugOffsets must equal them; -1 elsewhere (3.11's
 * table is pinned to them at compile time). */
int btc_remote_layout_compiled(btc_remote_layout *out);

typedef struct {
    uintptr_t code;   /* the target's code object */
    int32_t lasti;    /* instruction offset in bytes (INT32_MIN: it fits no int32) */
    uint8_t entry;    /* first frame of its eval-loop call */
} btc_remote_pyframe;
/* Python frames, innermost first: of a thread state, or from a frame object
 * (a suspended greenlet's top frame, read without its view of its stack).
 * The one walker of another process's frames, for any filled layout: shim
 * frames are skipped and mark the frame they called as its eval-loop call's
 * entry.  Returns how many (at most max).  A chain cut short by garbage ends
 * in a frame whose code is 0 and whose lasti says why: */
#define BTC_REMOTE_CUT_UNREADABLE 1   /* a frame unreadable or misaligned */
#define BTC_REMOTE_CUT_LOOP 2         /* the chain comes back to a frame it passed */
#define BTC_REMOTE_CUT_SKIPPED 3      /* a frame without a code object was left out */
int btc_remote_thread_frames(btc_rmem *m, const btc_remote_layout *lay, uintptr_t tstate, btc_remote_pyframe *out,
                             int max);
int btc_remote_object_frames(btc_rmem *m, const btc_remote_layout *lay, uintptr_t frame_object,
                             btc_remote_pyframe *out, int max);
/* The chain from interpreter frame `frame` (the same walker): a coroutine's
 * own frame, which lives in its object. */
int btc_remote_frame_chain(btc_rmem *m, const btc_remote_layout *lay, uintptr_t frame, btc_remote_pyframe *out,
                           int max);

/* asyncio tasks of another process (remote/rtasks.c, btcore/remote/tasks.py).
 * Where the target keeps them: btc_remote_task_layout_of() fills the known
 * offsets of a version family (measured per family, pinned by
 * tests/test_remote_tasks.py against each version's own objects); the
 * caller adds the target's type objects and, on 3.14+, the task lists'
 * offsets from _asyncio's .AsyncioDebug section.  0, or -1 for a version
 * whose asyncio objects btcore does not know. */
#define BTC_REMOTE_TASK_TYPES 4        /* task (future) types told apart: 0-ended lists */
#define BTC_REMOTE_TASK_AWAITERS 4     /* tasks awaiting one task, kept */
typedef struct {
    uint64_t version_hex;
    uint32_t fut_loop, fut_callback0, fut_callbacks, fut_state;   /* FutureObj */
    uint32_t task_coro, task_name, task_node;                      /* TaskObj (task_node: 3.14+'s list link) */
    uint32_t gen_qualname, gen_frame_state, gen_iframe;             /* a coroutine's name, state and own frame */
    int32_t frame_created, frame_suspended, frame_yield_from, frame_executing;   /* gi_frame_state values */
    int32_t frame_stacktop;        /* 3.11, 3.13: the int index past the stack's top, in localsplus; else -1 */
    int32_t frame_stackpointer;    /* 3.14+: the pointer past the stack's top; else -1 */
    uint32_t frame_localsplus;
    uint32_t yield_from_depth;     /* where the awaited object lies below the stack's top, in words */
    uint32_t resume_opcode, resume_quick;   /* 3.11 (no yield-from state): RESUME (or its quickened form)
                                               with oparg >= 2 follows a yield from */
    uint32_t thread_running_loop;  /* 3.13+: the thread state's running loop (0: not known) */
    uint32_t interp_tasks_head, thread_tasks_head;   /* 3.14+: the task lists' heads (0: none) */
    uintptr_t task_types[BTC_REMOTE_TASK_TYPES], future_types[BTC_REMOTE_TASK_TYPES];
    uintptr_t coro_type, gen_type, cfunction_type, function_type, tuple_type, list_type, cell_type, set_type,
              weakref_type, method_type;
    uint32_t method_self, partial_args;   /* PyMethodObject.im_self, partialobject.args */
} btc_remote_tasklayout;
int btc_remote_task_layout_of(uint64_t version_hex, btc_remote_tasklayout *out);
/* The tasks linked in the list whose head (an llist_node) is at `head`
 * (3.14+), at most max, each once; -1 if more (a loop ends the list). */
int btc_remote_task_list(btc_rmem *m, const btc_remote_tasklayout *T, uintptr_t head, uintptr_t *out, int max);
/* The tasks a set object holds (3.11-3.13: asyncio's registry, a WeakSet,
 * keeps them in a set of weak references; a plain set holds them
 * directly): at most max, -1 if more; 0 for no set. */
int btc_remote_set_tasks(btc_rmem *m, const btc_remote_tasklayout *T, uintptr_t set, uintptr_t *out, int max);
#define BTC_REMOTE_TASK_NOT_STARTED 1
#define BTC_REMOTE_TASK_SUSPENDED 2
#define BTC_REMOTE_TASK_RUNNING 3
typedef struct {
    uintptr_t address, type, loop, name, coro, qualname;   /* objects of the target (name: str, or int N) */
    uintptr_t awaiters[BTC_REMOTE_TASK_AWAITERS];          /* tasks awaiting it (through a wakeup, or gather) */
    int32_t state;                 /* BTC_REMOTE_TASK_* */
    int32_t frames_at, nframes;    /* its await chain in frames, innermost first (running: its thread's
                                      frames from its coroutine's own outwards) */
    int32_t truncated;             /* outer frames left out (per_task), or no room left in frames */
    uintptr_t holder;              /* the object a done-callback of it is a method of (not a task; 0: none) */
    uintptr_t self;                /* a suspended task: the first local (self) of its innermost coroutine */
} btc_remote_task;
/* Of the objects at tasks (each checked: a task type's instance, pending,
 * its coroutine not ended), the pending tasks with their state, awaiters
 * and await chains (at most per_task frames each, the innermost); returns
 * how many were written to out. */
int btc_remote_tasks(btc_rmem *m, const btc_remote_layout *lay, const btc_remote_tasklayout *T,
                     const uintptr_t *tasks, int n, int per_task, btc_remote_task *out, btc_remote_pyframe *frames,
                     int max_frames);
/* Which thread runs each loop of the tasks where the thread state does not
 * say (3.11): their distinct loops (at most max_loops) into loops, and for
 * each the thread (an index into tstates) one of whose frames has the loop
 * as its first local (self: run_forever() runs there), or -1.  Returns how
 * many loops. */
int btc_remote_loop_threads(btc_rmem *m, const btc_remote_layout *lay, const btc_remote_tasklayout *T,
                            const uintptr_t *tstates, int nthreads, const btc_remote_task *tasks, int ntasks,
                            uintptr_t *loops, int *thread_of, int max_loops);

/* The target's stacks, walked over their local copies and merged with
 * their Python frames by collect()'s merge (capture.c): the same records
 * a Backtrace holds, a Python frame's addr being the target's code object. */
#define BTC_REMOTE_MAX_NATIVE 256      /* native frames walked per stack */
#define BTC_REMOTE_MAX_PYFRAMES 4096   /* Python frames merged per stack (bounds.MAX_FRAMES) */
#define BTC_REMOTE_MAX_FRAMES 4352       /* BTC_REMOTE_MAX_NATIVE + BTC_REMOTE_MAX_PYFRAMES */
#define BTC_REMOTE_MAX_EVAL 16
typedef struct {
    uintptr_t eval_lo[BTC_REMOTE_MAX_EVAL], eval_hi[BTC_REMOTE_MAX_EVAL];   /* its eval loop's code */
    int32_t neval;
    uintptr_t greenlet_lo, greenlet_hi;   /* greenlet's module (0, 0: none) */
    uintptr_t stub_lo[2], stub_hi[2];     /* greenlet's start-up stub: a thread's walk ends there */
    int32_t nstub;
    uintptr_t resume_pc;                  /* a suspended greenlet's: btc_remote_greenlet_code's */
    int32_t bp_slot, bx_slot;
    int32_t want;                         /* BTC_WANT_NATIVE | BTC_WANT_PYTHON */
    int32_t capacity;                     /* records per stack (at most BTC_REMOTE_MAX_FRAMES) */
} btc_remote_target;
typedef struct {
    uintptr_t regs[4];          /* ip, sp, rbp, rbx (a greenlet's: from t and its copy, at lo) */
    uintptr_t lo, last_cfa;     /* the copy holds [lo, lo + size) of the target; last_cfa as in a btc_context */
    const uint8_t *copy;
    uint64_t size;              /* 0: Python frames only */
    const btc_remote_pyframe *py;
    int32_t npy;
    int32_t greenlet;           /* a suspended greenlet (else a thread's running stack) */
    int32_t at, n;              /* out: its records in out */
    int32_t truncated;          /* out */
    int32_t cut;                /* out: why its Python chain was cut short (BTC_REMOTE_CUT_*), or 0 */
    int32_t unwalked;           /* out: a greenlet whose copy lacks slp_switch's saved registers */
} btc_remote_stack;
/* Merge stacks in order while out has room for t->capacity more records;
 * returns how many stacks were done (call again with the rest). */
int btc_remote_stacks(btc_rmodules *s, const btc_remote_target *t, btc_remote_stack *stacks, int n,
                      btc_frame *out, int max);

/* Objects of type `wanted` or a subtype, in the gc lists at heads (the
 * addresses of their PyGC_Head list heads).  Returns how many (written to
 * out), -1 if more than max; *visited: objects walked (at most
 * BTC_REMOTE_MAX_OBJECTS); *broken: lists that end before their head (an
 * unreadable or misaligned link, a loop, a link into another list). */
#define BTC_REMOTE_MAX_OBJECTS 50000000
int btc_remote_gc_instances(btc_rmem *m, const uintptr_t *heads, int nheads, uintptr_t wanted,
                            uintptr_t *out, int max, uint64_t *visited, int *broken);
/* The same set, found without walking every list (the stop of a dump, a
 * profiler's sample): the objects of the nwalk lists at walk (some of the
 * heads), then those of known (found by an earlier walk) that are still
 * alive and of that type, each once.  The caller makes sure no object
 * entered the other lists since known was walked (btcore/remote/snapshot.py: their
 * heads and counts unchanged). */
int btc_remote_gc_known(btc_rmem *m, const uintptr_t *heads, int nheads, const uintptr_t *walk, int nwalk,
                        uintptr_t wanted, const uintptr_t *known, int nknown, uintptr_t *out, int max,
                        uint64_t *visited, int *broken);

/* The suspended greenlets among greenlet objects, with their saved state
 * (offsets: PyGreenlet.pimpl, StackState and the top frame in greenlet's C++
 * object, as learned here from greenlets in known states); running, dead,
 * unstarted and unreadable ones are left out.  Returns how many were
 * written. */
typedef struct {
    uintptr_t address, type;
    uintptr_t start, stop, copy;
    intptr_t saved;
    uintptr_t frame;     /* the top frame object, 0 if none saved */
    size_t spill_at;     /* btc_remote_greenlet_spills(): where its heap copy went */
    int32_t frames_at, nframes;   /* btc_remote_greenlet_frames(): its Python frames */
    int32_t copied;      /* its heap copy was read (BTC_REMOTE_COPIED_BEFORE: taken from the previous stop's) */
    int32_t bad;         /* its state is garbage (BTC_REMOTE_BAD_*): nothing of it is read */
} btc_remote_greenlet;
#define BTC_REMOTE_BAD_UNREADABLE 1     /* greenlet's C++ object or its StackState */
#define BTC_REMOTE_BAD_INCONSISTENT 2   /* a StackState greenlet never writes (or a misaligned frame, copy) */
#define BTC_REMOTE_BAD_SKIPPED 3        /* set by the caller: its saved stack is not to be copied */
#define BTC_REMOTE_BAD_FRAME 4          /* set by btc_remote_greenlet_frames(): its top frame gives no frame */
int btc_remote_greenlet_states(btc_rmem *m, const uintptr_t *greenlets, int n, const size_t *offsets,
                               btc_remote_greenlet *out);
/* Fill out[i] for the suspended greenlet states[rows[i]] (i < n): its Python
 * frames (in frames, nframes records), and when walk is set and its state is
 * sound, its saved stack when its heap copy (in spill, spill_size bytes) is
 * all of it.  A row pointing outside those buffers gets nothing from them.
 * Returns how many greenlets to be walked were left to the caller (their i
 * in left): a main greenlet, or one whose stack lies partly in place on its
 * thread's stack. */
int btc_remote_greenlet_stacks(const btc_remote_greenlet *states, const int32_t *rows, int n, const uint8_t *spill,
                               size_t spill_size, const btc_remote_pyframe *frames, int nframes, int32_t walk,
                               btc_remote_stack *out, int32_t *left);
/* Mark BTC_REMOTE_BAD_SKIPPED the greenlets whose saved stack is not to
 * be copied: its stack ([start, stop), or from start what it saved for a
 * main greenlet) not inside one of the nmaps sorted mappings [lo[i], hi[i]),
 * or past budget bytes for all of them, in order.  Returns the bytes of
 * those to copy (the spill size btc_remote_greenlet_copies() then needs). */
size_t btc_remote_greenlet_fit(btc_remote_greenlet *gs, int n, const uintptr_t *lo, const uintptr_t *hi, int nmaps,
                               size_t budget);
/* Copy each greenlet's heap copy of its stack into spill (packed, in
 * order, at most spill_size bytes): what a dump's stop must read.  prev
 * (nprev states, their copies in prev_spill; NULL: none): the previous
 * stop's, as these calls left them; a greenlet whose state is the one it
 * had then (stack, heap copy's address and size, top frame) is not read
 * again (copied = BTC_REMOTE_COPIED_BEFORE): btc_remote_greenlet_reuse()
 * copies that stop's copy into its place once the target runs again (a
 * local copy: nothing in the stop).  A profiler's samples (the caller
 * checks the greenlet's Python frames did not change either). */
#define BTC_REMOTE_COPIED_BEFORE 2
void btc_remote_greenlet_spills(btc_rmem *m, btc_remote_greenlet *gs, int n, uint8_t *spill, size_t spill_size,
                                const btc_remote_greenlet *prev, int nprev, const uint8_t *prev_spill,
                                size_t prev_spill_size);
void btc_remote_greenlet_reuse(btc_remote_greenlet *gs, int n, uint8_t *spill, const btc_remote_greenlet *prev,
                               int nprev, const uint8_t *prev_spill, size_t prev_spill_size);
/* Each greenlet's Python frames into frames (after spills(): a dump walks
 * them once the target runs again, from the chunks its stop read); returns
 * the frames written.  A greenlet's frames are read through its view of
 * memory (what greenlet copied to the heap from that copy): from 3.12 on
 * the eval loop's shims lie on its C stack, and greenlet "exposes" its
 * frames past them (the saved links tell the entry frames).  A main
 * greenlet's stack ends at the end of the mapping among the nmaps sorted
 * [lo[i], hi[i]) that holds it. */
int btc_remote_greenlet_frames(btc_rmem *m, const btc_remote_layout *lay, btc_remote_greenlet *gs, int n,
                               const uint8_t *spill, btc_remote_pyframe *frames, int max_frames,
                               const uintptr_t *lo, const uintptr_t *hi, int nmaps);
/* Both, in one call. */
int btc_remote_greenlet_copies(btc_rmem *m, const btc_remote_layout *lay, btc_remote_greenlet *gs, int n,
                               uint8_t *spill, size_t spill_size, btc_remote_pyframe *frames, int max_frames,
                               const uintptr_t *lo, const uintptr_t *hi, int nmaps);

/* Where the target keeps what names its greenlets (btcore/remote/names.py):
 * offsets in bytes for a target of CPython version_hex (3.11, 3.13-3.15:
 * native/remote/robjects.c's table); -1 when that version's are not known
 * here (the dump then names greenlets by type and address only). */
typedef struct {
    uint64_t version_hex;
    uint32_t type_dictoffset, type_dict, type_flags, type_base, heaptype_qualname;
    uint64_t heaptype_flag;
    uint32_t dict_keys, dict_values, values_values;
    uint32_t keys_log2_index_bytes, keys_kind, keys_nentries, keys_indices, kind_general;
    uint32_t entry_size, entry_key, entry_value;
    uint32_t unicode_entry_size, unicode_entry_key, unicode_entry_value;
    uint32_t func_name, method_func, cfunc_def, methoddef_name, code_name;
    uint32_t long_size;       /* 3.11: ob_size, a signed count of digits; 3.12+: lv_tag */
    uint32_t long_tag_bits;   /* 3.12+: lv_tag's bits below the count of digits (its sign), else 0 */
    uint32_t long_digits, long_shift;
    uint32_t weakref_object;
    uint32_t interp_modules, module_dict;   /* sys.modules in the interpreter state; a module's dict */
    uint32_t type_basicsize, heaptype_cached_keys;
    uint64_t managed_dict_flag, inline_values_flag;   /* 0: no such flag */
    uint32_t managed_dict_before;     /* a managed dict's pointer lies this far before the object */
    uint32_t values_pointer_before;   /* 3.11: the pointer to its values, this far before (0: inline values) */
    uint32_t values_valid;            /* 3.13+: PyDictValues.valid (inline values in use) */
} btc_remote_objlayout;
int btc_remote_pyobjects(uint64_t version_hex, btc_remote_objlayout *out);
/* A greenlet's label parts (remote/rlabels.c), read in one pass over the
 * greenlet objects at greenlets: what btcore/remote/names.py makes labels
 * of.  Addresses are the target's, unchecked where marked: the caller
 * checks those few (remembered per address).  Returns n, or -1 for a spec
 * out of bounds. */
typedef struct {
    uintptr_t str_type, dict_type, int_type, function_type, method_type, builtin_type, weakref_type;  /* 0: none */
    uint32_t span;           /* words of a greenlet object read (its fields below lie within them) */
    uint32_t short_span;     /* PyGreenlet's words: read when the span is not */
    int32_t pimpl_at, parent_at;      /* PyGreenlet.pimpl, the parent in greenlet's C++ object (-1: not known) */
    int32_t ident_at, spawner_at;     /* gevent's Greenlet's ident and spawner fields (-1: not known) */
} btc_remote_label_spec;
typedef struct {
    uintptr_t type;        /* its ob_type, read now */
    uintptr_t parent;      /* its parent, as greenlet's C++ object holds it (unchecked; 0: none) */
    uintptr_t spawner;     /* what gevent's weak reference to its spawner points at (unchecked; 0: none) */
    uintptr_t name;        /* the value under "name" in its instance dict (unchecked; 0: none) */
    uintptr_t function;    /* its `_run`'s name: a str object (unchecked), or a builtin's C string; 0: none */
    int64_t ident;         /* gevent's ident (a small int's value), -1: none */
    int32_t read;          /* its object was read (else only the stop's type name is known) */
    int32_t gevent;        /* gevent's Greenlet or a subclass, its fields read */
    int32_t function_is_cstring;
} btc_remote_label;
int btc_remote_greenlet_labels(btc_rmem *m, const btc_remote_layout *lay, const btc_remote_objlayout *obj,
                               const btc_remote_label_spec *spec, const uintptr_t *greenlets, int n,
                               btc_remote_label *out);
/* The spawn chains a target's btcore recorded (remote/rspawn.c): its live
 * records walked from x (the target's btc_spawn_exported, copied), each
 * record's chain followed as spawn_chain() follows it, each site read once
 * (sites are interned: many chains share them).  Every object is checked
 * against the target's types before its fields are used; the walks are
 * bounded and stop at a loop. */
typedef struct {
    uintptr_t object;        /* the greenlet or task of the record */
    int32_t first, n;        /* its links in links[], newest generation first */
    int32_t cut;             /* older generations exist and are not in links */
} btc_remote_chain;
typedef struct {
    int32_t site;            /* its site in sites[] */
    uintptr_t spawner;       /* the spawner's repr: a str of the target (unchecked) */
    uintptr_t creator;       /* the spawner, where its record says (unchecked; 0: not known) */
} btc_remote_link;
typedef struct {
    uintptr_t address;       /* the site: a btcore.Backtrace of the target */
    int32_t first, n;        /* its records in frames[] */
    int32_t truncated;       /* it holds only its innermost frames, or this copy does */
    int32_t read;            /* it was read (else n is 0) */
} btc_remote_site;
typedef struct {
    btc_remote_chain *chains;
    btc_remote_link *links;
    btc_remote_site *sites;
    btc_frame *frames;
    int32_t max_chains, max_links, max_sites, max_frames;
    int32_t nchains, nlinks, nsites, nframes;   /* written */
    int32_t more;            /* the live list held more records than max_chains */
} btc_remote_spawn_out;
int btc_remote_spawn_chains(btc_rmem *m, const btc_spawn_export *x, btc_remote_spawn_out *out);
/* The (key, value) entries of a dict's keys object (values: its split
 * values array, or 0), at most most: how many, or -1 (unreadable, more
 * than most, or not a keys object's shape). */
#define BTC_REMOTE_ENTRIES_AT_ONCE 256
int btc_remote_dict_entries(btc_rmem *m, const btc_remote_objlayout *obj, uintptr_t keys, uintptr_t values, int most,
                            uintptr_t *out_keys, uintptr_t *out_values);
/* Is type tp named name (its tp_name, read whole)? */
int btc_remote_type_named(btc_rmem *m, const btc_remote_layout *lay, uintptr_t tp, const char *name);
/* Is type tp, or a base on its tp_base chain (at most 32 deep), named name (tp_name)? */
int btc_remote_type_inherits(btc_rmem *m, const btc_remote_layout *lay, const btc_remote_objlayout *obj, uintptr_t tp,
                             const char *name);
/* The value of a small non-negative int object (at most 2 digits) of type int_type, or -1. */
int64_t btc_remote_small_int(btc_rmem *m, const btc_remote_objlayout *obj, uintptr_t int_type, uintptr_t address);
