/* The one DWARF CFI walker: every context (current thread, suspended greenlet,
 * signal handler) goes through btc_unwind(); only the context differs. */
#include <string.h>

#include "capture/evalloop.h"
#include "capture/modules.h"
#include "capture/unwind.h"

BTC_HOT uintptr_t reg_value(const btc_regs *r, unsigned dwarf_reg, bool *ok)
{
    switch (dwarf_reg) {
    case BTC_DWARF_SP: return r->sp;
    case BTC_DWARF_FP: return r->fp;
    case BTC_DWARF_AUX: return r->aux;
    case BTC_DWARF_IP: return r->ip;
    default: *ok = false; return 0;
    }
}

BTC_HOT bool compute_cfa(const btc_cfi_row *row, const btc_regs *r, const btc_memview *m,
                        uintptr_t *cfa)
{
    bool ok = true;
    switch (row->cfa_kind) {
    case BTC_CFA_REG:
        *cfa = reg_value(r, row->cfa_reg, &ok) + row->cfa_off;
        return ok;
    case BTC_CFA_REG_DEREF:
        return btc_mem_read(m, reg_value(r, row->cfa_reg, &ok) + row->cfa_off, cfa) && ok;
    case BTC_CFA_PLT:
        /* The expression every PLT section carries: the stub pushes 8 bytes
         * once the pc passes a fixed offset within its 16-byte slot. */
        *cfa = r->sp + row->cfa_off + (((r->ip & 15) >= row->cfa_reg) ? 8 : 0);
        return true;
    default:
        return false;
    }
}

/* Apply one register rule; the value is unchanged for BTC_RULE_SAME. */
BTC_HOT bool apply_rule(uint8_t rule, int16_t off, uintptr_t cfa, const btc_regs *r,
                       const btc_memview *m, uintptr_t *value)
{
    bool ok = true;
    switch (rule & 15) {
    case BTC_RULE_SAME:
        return true;
    case BTC_RULE_AT_CFA:
        return btc_mem_read(m, cfa + off, value);
    case BTC_RULE_AT_REG:
        return btc_mem_read(m, reg_value(r, rule >> 4, &ok) + off, value) && ok;
    default:
        return false;
    }
}

/* The return address still in the link register: only in a frame stopped
 * at an exact pc (the innermost one, or one a signal interrupted) on an
 * architecture that has one (a leaf function, or a prologue not yet run).
 * Anywhere else "same value" would return to the frame itself. */
BTC_HOT bool ra_in_register(const btc_cfi_row *row, bool exact)
{
    return BTC_LINK_REGISTER && exact && row->ra_rule == BTC_RULE_SAME;
}

/* One step from callee registers r to caller registers; false ends the walk.
 * exact: r->ip is where the frame stopped, not a return address. */
BTC_HOT bool step(const btc_cfi_row *row, const btc_context *ctx, bool exact, btc_regs *r,
                  uintptr_t *cfa_out)
{
    const btc_memview *m = &ctx->mem;
    uintptr_t cfa;
    if (!compute_cfa(row, r, m, &cfa))
        return false;
    *cfa_out = cfa;   /* even if the step fails: the caller checks whose frame this is */
    bool leaf = ra_in_register(row, exact);
    /* A frame's CFA lies above its sp (at it, for a leaf that moved no sp);
     * a signal frame's CFA is the sp the interrupted code had, which may be
     * anywhere in the view. */
    if (!(row->flags & BTC_ROW_SIGNAL) && (leaf ? cfa < r->sp : cfa <= r->sp))
        return false;
    if (cfa < m->lo || cfa > m->hi)
        return false;
    if (row->ra_rule == BTC_RULE_UNDEFINED)
        return false;   /* the outermost frame (_start, clone, thread start) */
    btc_regs next = *r;
    if (leaf)
        next.ip = r->aux;
    else if (!apply_rule(row->ra_rule, row->ra_off, cfa, r, m, &next.ip) || row->ra_rule == BTC_RULE_SAME)
        return false;
    if (row->flags & BTC_ROW_RA_SIGNED)
        next.ip = btc_strip_ra(next.ip);
    if (!apply_rule(row->fp_rule, row->fp_off, cfa, r, m, &next.fp) ||
        !apply_rule(row->aux_rule, row->aux_off, cfa, r, m, &next.aux))
        return false;
    if (BTC_LINK_REGISTER)
        next.aux = next.ip;   /* the caller's lr: the return address it was given back */
    next.sp = cfa;
    *r = next;
    return next.ip != 0;
}

/* A handler's return into a signal trampoline whose CFI cannot restore the
 * interrupted sp: the architecture reads the kernel's signal frame (arch.h). */
BTC_HOT bool read_signal_frame(const btc_cfi_row *row, const btc_memview *m, btc_regs *r, uintptr_t *cfa)
{
#if BTC_ARCH_READS_SIGNAL_FRAMES
    return btc_signal_frame(row, m, r, cfa);
#else
    (void)row, (void)m, (void)r, (void)cfa;
    return false;
#endif
}

/* A row in the form the walk steps without the rule interpreter: nearly
 * every row of compiled code says CFA = sp + K, or CFA = fp + K in code
 * built with frame pointers (Debian's python3.15: ~20 ns a frame through the
 * interpreter), the return address saved at CFA + off, fp and aux unchanged
 * or saved at CFA + off.  Kept only when every slot lies 8-aligned below
 * the CFA, within the frame [CFA - K, CFA - 8] when from sp (within a span
 * of PLAIN_FP_SPAN from fp, whose frame reaches below it: the registers a
 * function saves after setting fp up): then one test of the frame against
 * the view (step_plain) bounds all its reads. */
typedef struct {
    uint64_t size;             /* CFA = sp + size (> 0, a multiple of 8), or fp + the size PLAIN_FROM_FP tags;
                                  PLAIN_NEVER: no plain form */
    int16_t ra_word;           /* return address at CFA + 8 * ra_word (< 0) */
    int16_t fp_word, aux_word; /* 0: unchanged, else saved at CFA + 8 * word */
    uint16_t span;             /* bytes from the lowest slot to the CFA (8 * the largest -word) */
} plain_rule;

/* The size of a row with no plain form, and the tag of a size from fp:
 * both larger than any view (region_at refuses a view reaching the tag), so
 * sp + size never fits and the one bound test of a plain step from sp also
 * tells the rows from sp from the others (from fp: fp_frame(); none). */
#define PLAIN_NEVER ((uint64_t)1 << 62)
#define PLAIN_FROM_FP ((uint64_t)1 << 60)
#define PLAIN_FP_SPAN 4096

/* off, a slot within limit bytes below the CFA, in words from it (-1 the
 * highest); span grows to reach it. */
static bool slot_below_cfa(int32_t limit, int off, int16_t *word, uint16_t *span)
{
    *word = (int16_t)(off / 8);
    if (!(off < 0 && -off <= limit && (off & 7) == 0))
        return false;
    if (-off > *span)
        *span = (uint16_t)-off;
    return true;
}

static bool saved_or_same(uint8_t rule, int16_t off, int32_t limit, int16_t *word, uint16_t *span)
{
    *word = 0;
    return rule == BTC_RULE_SAME || (rule == BTC_RULE_AT_CFA && slot_below_cfa(limit, off, word, span));
}

/* The plain form of row, if it has one (else p->size is PLAIN_NEVER). */
static bool plain_form(const btc_cfi_row *row, plain_rule *p)
{
    bool from_fp = row->cfa_reg == BTC_DWARF_FP;
    p->span = 0;
    int32_t limit = from_fp ? PLAIN_FP_SPAN : row->cfa_off;
    bool plain = row->cfa_kind == BTC_CFA_REG && (row->cfa_reg == BTC_DWARF_SP || from_fp) &&
                 row->flags == 0 &&
                 row->cfa_off > 0 && (row->cfa_off & 7) == 0 && row->ra_rule == BTC_RULE_AT_CFA &&
                 slot_below_cfa(limit, row->ra_off, &p->ra_word, &p->span) &&
                 saved_or_same(row->fp_rule, row->fp_off, limit, &p->fp_word, &p->span) &&
                 saved_or_same(row->aux_rule, row->aux_off, limit, &p->aux_word, &p->span);
    p->size = !plain ? PLAIN_NEVER : (uint64_t)row->cfa_off | (from_fp ? PLAIN_FROM_FP : 0);
    return plain;
}

/* A stretch of the view whose words lie in one place: the stack itself, or
 * greenlet's heap copy of part of it.  A frame [sp, CFA) with CFA <= hi,
 * sp at or above where the region was found, is read at address + delta. */
typedef struct {
    uintptr_t hi;
    uintptr_t delta;   /* added (mod 2^64) to an address: where its word is */
} plain_region;

/* The region the frames from sp on are read in, as far as they lie wholly
 * on one side of the spill; false if sp is misaligned or outside the view
 * (or the view reaches PLAIN_NEVER).  A walk's sp only grows, by multiples
 * of 8, so these tests hold for every later frame of the region. */
BTC_HOT bool region_at(const btc_memview *m, uintptr_t sp, plain_region *g)
{
    if ((sp & 7) || sp < m->lo || sp >= m->hi || m->hi >= PLAIN_FROM_FP)
        return false;
    if (sp < m->spill_lo)
        *g = (plain_region){.hi = m->spill_lo < m->hi ? m->spill_lo : m->hi};
    else if (sp < m->spill_hi)
        *g = (plain_region){.hi = m->spill_hi < m->hi ? m->spill_hi : m->hi,
                            .delta = (uintptr_t)m->spill - m->spill_lo};
    else
        *g = (plain_region){.hi = m->hi};
    return true;
}

/* The CFA of a plain frame from fp (p's size tagged PLAIN_FROM_FP), if it
 * fits in g: fp aligned and below g's end (so the CFA cannot wrap: g ends
 * below PLAIN_FROM_FP), the CFA at most g's end, and the lowest slot at or
 * above sp (so in g, and the CFA above sp, as step() requires); else 0. */
static inline uintptr_t fp_frame(const plain_rule *p, const plain_region *g, const btc_regs *r)
{
    if ((p->size & (PLAIN_FROM_FP | PLAIN_NEVER)) != PLAIN_FROM_FP)
        return 0;
    uintptr_t cfa = r->fp + (p->size - PLAIN_FROM_FP);
    return r->fp < g->hi && !(r->fp & 7) && cfa <= g->hi && cfa >= r->sp + p->span ? cfa : 0;
}

/* step() for a plain rule whose frame fits in g: the same answer, with no
 * rule to interpret and no read to check (the return address is never in
 * a register here: its rule is AT_CFA, so no leaf case; no signal frame).
 * False, r unchanged, if the frame does not fit (or p has no plain form).
 * A frame from sp fits when CFA = sp + size <= g's end (its slots lie in
 * [sp, CFA)): one add and one test; a frame from fp, whose tagged size
 * fails that test, is tried second. */
BTC_HOT bool step_plain(const plain_rule *p, const plain_region *g, btc_regs *r)
{
    uintptr_t cfa = r->sp + p->size;
    if (BTC_UNLIKELY(cfa > g->hi) && !(cfa = fp_frame(p, g, r)))
        return false;
    const uintptr_t *at = (const uintptr_t *)(cfa + g->delta);
    uintptr_t ip = at[p->ra_word];
    *r = (btc_regs){.ip = ip, .sp = cfa, .fp = p->fp_word ? at[p->fp_word] : r->fp,
                    .aux = BTC_LINK_REGISTER ? ip : p->aux_word ? at[p->aux_word] : r->aux};
    return true;
}

/* What the walk needs to know about a pc, precomputed once per pc. */
enum { PC_NO_ROW, PC_ROW };
typedef struct {
    plain_rule plain;   /* the row's plain form (size PLAIN_NEVER: none, or no row) */
    uint8_t kind;       /* PC_NO_ROW: no module or no FDE covers pc */
    bool eval;          /* pc runs the interpreter's eval loop (btc_in_eval_loop) */
    btc_cfi_row row;
} pc_info;

static void pc_info_set(pc_info *info, const btc_cfi_row *row, bool eval)
{
    info->kind = row ? PC_ROW : PC_NO_ROW;
    info->plain.size = PLAIN_NEVER;
    if (row)
        plain_form(row, &info->plain);
    info->eval = eval;
    if (row)
        info->row = *row;
}

/* pc -> pc_info, two-way set-associative: a stack is walked again and again
 * through the same call sites, and the row tables are large (1.4 MB for
 * libpython), so a hit here saves the module search, the table's binary
 * search and its cache misses, the row's classification and the eval-loop
 * test (~36 ns).  Two ways: direct-mapped, two call sites of one stack that
 * share a slot (~9% of 14-frame stacks, ~30 pairs in a 250-frame one) both
 * missed at every walk of it (Debian's python3.14 in bench_capture: 243
 * against libunwind's 114 ns).  A miss puts its pc in way 0 and moves way 0's
 * to way 1: two pcs of a set are then both kept.
 * Rows live as long as their table: the cache is emptied whenever the
 * module list was rebuilt since it was filled (btc_modules_generation), so
 * the module list never calls back into the walker, and once the eval
 * loop's ranges are found (the eval flags filled before are wrong).  Used
 * under the module lock. */
#define ROW_CACHE_BITS 10   /* sets */
#define ROW_CACHE_WAYS 2
/* The row is copied into the entry: a hit then reads one cache line, not
 * the entry and a row somewhere in a table of megabytes (a second cache and
 * TLB miss per frame). */
typedef struct {
    uintptr_t pc;
    pc_info info;
} __attribute__((aligned(64))) row_entry;   /* one cache line */
static row_entry row_cache[1 << ROW_CACHE_BITS][ROW_CACHE_WAYS];
static uint64_t row_cache_generation = UINT64_MAX;   /* none yet: the first walk clears the cache */
static int row_cache_eval_ranges;

/* Every entry empty: pc 0 (never looked up: a return address of 1 is not
 * a call), no row, no plain form. */
static void row_cache_clear(void)
{
    for (size_t i = 0; i < sizeof row_cache / sizeof row_cache[0]; i++)
        for (int w = 0; w < ROW_CACHE_WAYS; w++)
            row_cache[i][w] = (row_entry){.info = {.plain.size = PLAIN_NEVER}};
}

/* Drop the rows of a previous module list: their tables may be freed. */
static void row_cache_follow_modules(void)
{
    int eval_ranges = btc_eval_ranges_found();
    if (BTC_LIKELY(row_cache_generation == btc_modules_generation && row_cache_eval_ranges == eval_ranges))
        return;
    row_cache_clear();
    row_cache_generation = btc_modules_generation;
    row_cache_eval_ranges = eval_ranges;
}

/* *lasting: the answer holds until the module list changes (false when a
 * signal handler found the module's table not built yet). */
static const btc_cfi_row *find_row(uintptr_t pc, bool *lasting)
{
    btc_module *m = btc_module_find(pc);
    const btc_table *t = m ? btc_module_table(m) : NULL;
    *lasting = t || !m || !btc_module_table_pending(m);
    return t ? btc_table_lookup(t, (uint32_t)(pc - m->bias)) : NULL;
}

/* pc's set; its entry there is the way whose pc is pc, if any. */
BTC_HOT row_entry *row_cache_set(uintptr_t pc)
{
    return row_cache[(pc * 0x9E3779B97F4A7C15ull) >> (64 - ROW_CACHE_BITS)];
}

/* The entry of set that holds pc if one does, else way 1 (whose pc is not
 * pc: the caller checks). */
BTC_HOT row_entry *row_cache_way(row_entry *set, uintptr_t pc)
{
    return set[0].pc == pc ? &set[0] : &set[1];
}

/* What the walk knows about pc, valid until the next call; NULL: nothing
 * yet (the table is built later). */
BTC_HOT const pc_info *cached_info(uintptr_t pc)
{
    row_entry *set = row_cache_set(pc), *e = row_cache_way(set, pc);
    if (e->pc != pc) {
        bool lasting;
        const btc_cfi_row *row = find_row(pc, &lasting);
        if (!lasting)
            return NULL;   /* not cached: the table is built later */
        set[1] = set[0];
        e = &set[0];
        pc_info_set(&e->info, row, btc_in_eval_loop(pc));
        e->pc = pc;
    }
    return &e->info;
}

/* Another process's modules (ctx->rows) are looked up without the row
 * cache, which holds this process's rows; their pcs are never in this
 * process's eval loop (eval false: the remote dump merges in Python). */
BTC_HOT const pc_info *find_info(const btc_context *ctx, uintptr_t pc, pc_info *scratch)
{
    if (BTC_LIKELY(!ctx->rows))
        return cached_info(pc);
    bool ignored;
    pc_info_set(scratch, ctx->rows->find(ctx->rows, pc, &ignored), false);
    return scratch;
}

static bool in_some_module(const btc_context *ctx, uintptr_t pc)
{
    bool in_module = false;
    if (!ctx->rows)
        return btc_module_find(pc) != NULL;
    ctx->rows->find(ctx->rows, pc, &in_module);
    return in_module;
}

static bool ends_walk(const btc_context *ctx, uintptr_t pc)
{
    for (int i = 0; i < ctx->nend; i++)
        if (pc >= ctx->end_lo[i] && pc < ctx->end_hi[i])
            return true;
    return false;
}

/* The walk's common case in a loop of its own: a return address whose pc
 * the row cache holds with a plain rule, its frame inside region g.  Stops
 * at the first frame that is not, for btc_unwind's general step to take it;
 * *done: the walk ended at a frame recorded here.  check_ends: ctx has end
 * ranges (a constant in each call, so each gets a loop of its own).  This
 * process's modules only (the row cache), after row_cache_follow_modules(). */
BTC_HOT int walk_region(const btc_context *ctx, const plain_region *g, btc_regs *r, btc_native_frame *out, int n,
                        int max, bool *done, bool check_ends)
{
    btc_regs regs = *r;
    while (n < max) {
        uintptr_t pc = regs.ip - 1;
        const row_entry *e = row_cache_way(row_cache_set(pc), pc);
        /* Read before the store to out (which might alias the cache, as
         * far as the compiler knows): the entry is loaded once. */
        plain_rule plain = e->info.plain;
        bool eval = e->info.eval;
        if (e->pc != pc || !step_plain(&plain, g, &regs))
            break;
        out[n++] = (btc_native_frame){.pc = pc + 1, .eval = eval};
        if (!regs.ip || (check_ends && BTC_UNLIKELY(ends_walk(ctx, pc)))) {
            *done = true;
            break;
        }
    }
    *r = regs;
    return n;
}

/* walk_region from the region r->sp lies in (none: nothing walked).  Not
 * inlined into btc_unwind: the loop's registers then stay in registers. */
static __attribute__((noinline)) int walk_plain(const btc_context *ctx, const btc_memview *mem, btc_regs *r, btc_native_frame *out, int n,
                      int max, bool *done)
{
    plain_region g;
    if (!region_at(mem, r->sp, &g))
        return n;
    if (ctx->nend)
        return walk_region(ctx, &g, r, out, n, max, done, true);
    return walk_region(ctx, &g, r, out, n, max, done, false);
}

int btc_unwind(const btc_context *ctx, btc_native_frame *out, int max)
{
    btc_regs r = ctx->regs;
    bool exact = ctx->ip_is_exact;
    int n = 0;
    pc_info scratch;
    /* walk_plain's view: a frame above last_cfa is not recorded (the
     * general step ends the walk there), so such frames are left to it. */
    btc_memview plain_view = ctx->mem;
    if (ctx->last_cfa && ctx->last_cfa < plain_view.hi)
        plain_view.hi = ctx->last_cfa;
    row_cache_follow_modules();
    while (n < max) {
        if (!exact && BTC_LIKELY(!ctx->rows)) {
            bool done = false;
            n = walk_plain(ctx, &plain_view, &r, out, n, max, &done);
            if (done || n == max)
                break;
        }
        /* A return address points after the call: look up the call itself. */
        uintptr_t pc = exact ? r.ip : r.ip - 1;
        const pc_info *info = pc ? find_info(ctx, pc, &scratch) : NULL;
        const btc_cfi_row *row = info && info->kind != PC_NO_ROW ? &info->row : NULL;
        uintptr_t cfa = 0;
        bool more, signal;
        if (!exact && read_signal_frame(row, &ctx->mem, &r, &cfa)) {
            more = signal = true;
        } else {
            if (!row && !in_some_module(ctx, pc))
                break;   /* in no module: not a frame at all */
            more = row && step(row, ctx, exact, &r, &cfa);
            signal = row && (row->flags & BTC_ROW_SIGNAL);
        }
        if (cfa && ctx->last_cfa && cfa > ctx->last_cfa)
            break;  /* this frame belongs to whoever is below the target's stack */
        out[n] = (btc_native_frame){.pc = exact ? pc : pc + 1, .exact = exact, .signal = signal,
                                    .eval = info ? info->eval : btc_in_eval_loop(pc)};
        n++;
        if (!more || ends_walk(ctx, pc))
            break;
        exact = signal;   /* the frame a signal interrupted resumes at its exact pc */
    }
    return n;
}

/* The CFA of a plain frame at r, whether it fits a region or not. */
static uintptr_t plain_cfa(const plain_rule *p, const btc_regs *r)
{
    return p->size & PLAIN_FROM_FP ? r->fp + (p->size - PLAIN_FROM_FP) : r->sp + p->size;
}

/* The thread's first frame (_start, clone): a row that restores no return
 * address, whose CFA the rule interpreter computes without a read; its
 * step then ends the walk, reading nothing. */
static bool outermost(const pc_info *info)
{
    return info->kind == PC_ROW && info->row.ra_rule == BTC_RULE_UNDEFINED && info->row.cfa_kind == BTC_CFA_REG &&
           !(info->row.flags & BTC_ROW_SIGNAL);
}

/* The plain form a replay steps info's frame with: its row's, or for a
 * row whose only difference from a plain one is a signed return address
 * (aarch64's pointer authentication), that of the row unsigned: the rule
 * interpreter reads the same slots, then strips the address.  False if
 * neither. */
static bool replay_rule(const pc_info *info, plain_rule *p, bool *signed_ra)
{
    *p = info->plain;
    *signed_ra = false;
    if (p->size != PLAIN_NEVER)
        return true;
    if (info->kind != PC_ROW || !(info->row.flags & BTC_ROW_RA_SIGNED))
        return false;
    btc_cfi_row row = info->row;
    row.flags &= (uint8_t)~BTC_ROW_RA_SIGNED;
    *signed_ra = true;
    return plain_form(&row, p);
}

/* Note the word at `at` and the value the replay read there; false when
 * the proof is full. */
static bool note_word(btc_walk_proof *proof, uintptr_t at, uintptr_t value)
{
    if (proof->n == BTC_WALK_PROOF_WORDS)
        return false;
    proof->at[proof->n] = at;
    proof->value[proof->n++] = value;
    return true;
}

/* Replays the walk with step_plain, from the row cache (which holds every
 * pc the walk just met), noting each word a step reads that decides the
 * walk: every return address, and a saved fp only where a later CFA is
 * computed from it (the other saved registers decide nothing a plain step
 * does).  A frame whose plain step fails must be the last, its CFA beyond
 * the view, or the thread's outermost: the rule interpreter then ends the
 * walk too, reading nothing (a step that fails otherwise, from a
 * misaligned fp say, is not replayed: the interpreter could still take it,
 * through other reads). */
bool btc_unwind_proof(const btc_context *ctx, const btc_native_frame *nat, int n, btc_walk_proof *proof)
{
    btc_regs r = ctx->regs;
    plain_region g;
    /* Where fp came from: the walk's start (uses_fp then says it decides),
     * or a slot noted once a CFA is computed from it (fp_noted). */
    uintptr_t fp_from = 0;
    bool fp_noted = false;
    *proof = (btc_walk_proof){.modules = btc_modules_generation, .eval_ranges = btc_eval_ranges_found()};
    if (ctx->ip_is_exact || ctx->rows || ctx->last_cfa || !region_at(&ctx->mem, r.sp, &g) || g.delta ||
        g.hi != ctx->mem.hi)
        return false;
    for (int i = 0; i < n; i++) {
        const pc_info *info = nat[i].pc == r.ip && !nat[i].exact && !nat[i].signal ? cached_info(r.ip - 1) : NULL;
        if (info && i == n - 1 && outermost(info))
            return true;
        plain_rule rule, *p = &rule;
        bool signed_ra;
        if (!info || !replay_rule(info, p, &signed_ra))
            return false;
        bool from_fp = p->size & PLAIN_FROM_FP;
        if (from_fp && !fp_from)
            proof->uses_fp = true;
        else if (from_fp && !fp_noted && !(fp_noted = note_word(proof, fp_from, r.fp)))
            return false;
        if (!step_plain(p, &g, &r))
            return i == n - 1 && plain_cfa(p, &r) > g.hi;
        if (!note_word(proof, r.sp + 8 * (intptr_t)p->ra_word, r.ip))
            return false;
        if (signed_ra) {   /* as step() strips it (and a link register gets it back stripped) */
            r.ip = btc_strip_ra(r.ip);
            if (BTC_LINK_REGISTER)
                r.aux = r.ip;
        }
        if (p->fp_word) {
            fp_from = r.sp + 8 * (intptr_t)p->fp_word;
            fp_noted = false;
        }
    }
    return true;
}

bool btc_unwind_proven(const btc_walk_proof *proof, uintptr_t lo, uintptr_t hi)
{
    /* The rows and eval flags a walk would use now are those of the proof's
     * walk while the module list is the same one (as for the row cache). */
    if (proof->modules != btc_modules_generation || proof->eval_ranges != btc_eval_ranges_found())
        return false;
    uintptr_t differ = 0;
    for (int i = 0; i < proof->n; i++) {
        uintptr_t at = proof->at[i];
        if ((at & 7) || at < lo || at > hi - 8)
            return false;
        differ |= *(const uintptr_t *)at ^ proof->value[i];
    }
    return differ == 0;
}

/* Test-only (btcore_api.h): a row's plain form against the rule
 * interpreter, on one frame; a row with no plain form must be refused by
 * the plain step (its size, PLAIN_NEVER, fits no view). */
int btc_test_plain_step(const btc_cfi_row *row, const uintptr_t *regs, uintptr_t lo, uintptr_t hi, uintptr_t *out)
{
    plain_rule p;
    plain_region g;
    btc_context ctx = {.mem = {.lo = lo, .hi = hi}};
    btc_regs fast = {.ip = regs[0], .sp = regs[1], .fp = regs[2], .aux = regs[3]}, slow = fast;
    bool plain = plain_form(row, &p);
    bool stepped = region_at(&ctx.mem, fast.sp, &g) && step_plain(&p, &g, &fast);
    if (!plain)
        return stepped ? 0 : -1;   /* a row with no plain form is never stepped as one */
    if (!stepped)
        return 2;
    uintptr_t cfa_slow = 0;
    bool more_slow = step(row, &ctx, false, &slow, &cfa_slow);
    out[0] = fast.ip, out[1] = fast.sp, out[2] = fast.fp, out[3] = fast.aux, out[4] = fast.sp;
    return (fast.ip != 0) == more_slow && fast.sp == cfa_slow && fast.ip == slow.ip && fast.sp == slow.sp &&
           fast.fp == slow.fp && fast.aux == slow.aux;
}

int btc_test_row_cache_set(uintptr_t pc)
{
    return (int)((row_cache_set(pc) - &row_cache[0][0]) / ROW_CACHE_WAYS);
}

int btc_test_row_cache_misses(const uintptr_t *pcs, int n)
{
    int misses = 0;
    btc_modules_acquire();
    row_cache_follow_modules();
    for (int i = 0; i < n; i++) {
        misses += row_cache_way(row_cache_set(pcs[i]), pcs[i])->pc != pcs[i];
        cached_info(pcs[i]);
    }
    btc_modules_release();
    return misses;
}
