/* The one DWARF CFI walker: every context (current thread, suspended greenlet,
 * signal handler) goes through btc_unwind(); only the context differs. */
#include <string.h>

#include "capture/modules.h"
#include "capture/unwind.h"

#define BTC_HOT static inline __attribute__((always_inline))

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

/* pc -> CFI row, direct-mapped: a stack is walked again and again through
 * the same call sites, and the row tables are large (1.4 MB for libpython),
 * so a hit here saves the module search and the table's cache misses.
 * Rows live as long as their table: the cache is emptied whenever the
 * module list was rebuilt since it was filled (btc_modules_generation), so
 * the module list never calls back into the walker.  Used under the module
 * lock. */
#define ROW_CACHE_BITS 10
/* The row is copied into the entry: a hit then reads one cache line, not
 * the entry and a row somewhere in a table of megabytes (a second cache and
 * TLB miss per frame). */
static struct {
    uintptr_t pc;
    btc_cfi_row row;
    bool found;   /* false: no module or no FDE covers pc */
} row_cache[1 << ROW_CACHE_BITS];
static uint64_t row_cache_generation;

/* Drop the rows of a previous module list: their tables may be freed. */
static void row_cache_follow_modules(void)
{
    if (BTC_LIKELY(row_cache_generation == btc_modules_generation))
        return;
    memset(row_cache, 0, sizeof row_cache);
    row_cache_generation = btc_modules_generation;
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

/* The row for pc, valid until the next call. */
BTC_HOT const btc_cfi_row *cached_row(uintptr_t pc)
{
    size_t i = (pc * 0x9E3779B97F4A7C15ull) >> (64 - ROW_CACHE_BITS);
    if (row_cache[i].pc != pc) {
        bool lasting;
        const btc_cfi_row *row = find_row(pc, &lasting);
        if (!lasting)
            return NULL;   /* not cached: the table is built later */
        row_cache[i].found = row != NULL;
        if (row)
            row_cache[i].row = *row;
        row_cache[i].pc = pc;
    }
    return row_cache[i].found ? &row_cache[i].row : NULL;
}

/* Another process's modules (ctx->rows) are looked up without the row
 * cache, which holds this process's rows. */
BTC_HOT const btc_cfi_row *find_row_for(const btc_context *ctx, uintptr_t pc)
{
    bool ignored;
    return BTC_LIKELY(!ctx->rows) ? cached_row(pc) : ctx->rows->find(ctx->rows, pc, &ignored);
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

int btc_unwind(const btc_context *ctx, btc_native_frame *out, int max)
{
    btc_regs r = ctx->regs;
    bool exact = ctx->ip_is_exact;
    int n = 0;
    row_cache_follow_modules();
    while (n < max) {
        /* A return address points after the call: look up the call itself. */
        uintptr_t pc = exact ? r.ip : r.ip - 1;
        const btc_cfi_row *row = pc ? find_row_for(ctx, pc) : NULL;
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
        out[n].pc = exact ? pc : pc + 1;
        out[n].cfa = cfa;
        out[n].exact = exact;
        out[n].signal = signal;
        n++;
        if (!more || ends_walk(ctx, pc))
            break;
        exact = signal;   /* the frame a signal interrupted resumes at its exact pc */
    }
    return n;
}
