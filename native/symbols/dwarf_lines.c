/* Line programs: a unit's rows, sorted by address, and its file table
 * (dwarf_internal.h). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symbols/dwarf_internal.h"
#include "common/search.h"

/* ---- line programs ---- */

typedef struct {
    uint8_t version, offset_size, addr_size, min_inst, max_ops, default_is_stmt, line_range, opcode_base;
    int8_t line_base;
    const uint8_t *standard_lengths;
} line_header;

static bool is_absolute(const char *p) { return p && p[0] == '/'; }

/* dir/name resolved the way binutils prints it: no normalisation, relative
 * directories under the unit's compilation directory. */
static char *join_path(const char *comp_dir, const char *dir, const char *name)
{
    if (!name)
        return NULL;
    const char *parts[3] = {NULL, NULL, name};
    if (!is_absolute(name) && dir) {
        parts[1] = dir;
        if (!is_absolute(dir) && comp_dir)
            parts[0] = comp_dir;
    }
    size_t len = 1;
    for (int i = 0; i < 3; i++)
        len += parts[i] ? strlen(parts[i]) + 1 : 0;
    char *path = malloc(len), *p = path;
    if (!path)
        return NULL;
    for (int i = 0; i < 3; i++) {
        if (!parts[i])
            continue;
        size_t n = strlen(parts[i]);
        memcpy(p, parts[i], n);
        p += n;
        *p++ = i < 2 ? '/' : 0;
    }
    return path;
}

enum { LNCT_path = 1, LNCT_directory_index = 2 };

/* Bound on directory/file entries and entry formats in one header. */
#define MAX_LINE_ENTRIES (1 << 20)
#define MAX_ENTRY_FORMATS 32

/* A DWARF 5 entry list (directories or files): formats, then entries;
 * each entry's path and directory index go to the callback's arrays. */
static bool read_v5_entries(btc_dwarf *d, reader *r, const unit *u, form_ctx c, const char ***paths,
                            uint64_t **dirs, size_t *count)
{
    uint8_t nformats = read_u8(r);
    uint64_t types[MAX_ENTRY_FORMATS], forms[MAX_ENTRY_FORMATS];
    if (nformats > MAX_ENTRY_FORMATS)
        return false;
    for (int i = 0; i < nformats; i++) {
        types[i] = read_uleb(r);
        forms[i] = read_uleb(r);
    }
    uint64_t n = read_uleb(r);
    if (r->bad || n > MAX_LINE_ENTRIES || n > (uint64_t)(r->end - r->p))
        return false;
    *paths = calloc(n + 1, sizeof **paths);
    *dirs = calloc(n + 1, sizeof **dirs);
    if (!*paths || !*dirs)
        return false;
    for (uint64_t k = 0; k < n && !r->bad; k++) {
        for (int i = 0; i < nformats; i++) {
            attr_value v;
            dwarf_read_form(d, r, c, 0, forms[i], 0, &v);
            if (types[i] == LNCT_path)
                (*paths)[k] = dwarf_value_string(d, u, &v);
            else if (types[i] == LNCT_directory_index)
                (*dirs)[k] = v.u;
        }
    }
    *count = (size_t)n;
    return !r->bad;
}

/* DWARF 2-4: NUL-terminated lists; directory 0 is the compilation directory
 * and file numbers start at 1, so slot 0 of each array stays empty. */
static bool read_v4_entries(reader *r, const char ***paths, uint64_t **dirs, size_t *count, bool files)
{
    size_t cap = 0, dir_cap = 0, ndirs = 0;
    *paths = NULL;
    *dirs = NULL;
    *count = 0;
    const char *name = NULL;
    uint64_t dir = 0;
    while (*count <= MAX_LINE_ENTRIES) {
        if (!PUSH(*paths, *count, cap, name) || !PUSH(*dirs, ndirs, dir_cap, dir))
            return false;
        name = read_cstr(r);
        if (!name || !*name)
            break;
        if (files) {
            dir = read_uleb(r);
            read_uleb(r);   /* mtime */
            read_uleb(r);   /* length */
        }
    }
    return !r->bad;
}

static bool read_file_table(btc_dwarf *d, unit *u, reader *r, const line_header *h)
{
    const char **dir_paths = NULL, **file_paths = NULL;
    uint64_t *dir_unused = NULL, *file_dirs = NULL;
    size_t ndirs = 0, nfiles = 0;
    form_ctx c = {h->version, h->addr_size, h->offset_size};
    bool ok = h->version >= 5
                  ? read_v5_entries(d, r, u, c, &dir_paths, &dir_unused, &ndirs) &&
                        read_v5_entries(d, r, u, c, &file_paths, &file_dirs, &nfiles)
                  : read_v4_entries(r, &dir_paths, &dir_unused, &ndirs, false) &&
                        read_v4_entries(r, &file_paths, &file_dirs, &nfiles, true);
    if (ok && h->version < 5 && ndirs > 0)
        dir_paths[0] = u->comp_dir;
    if (ok)
        u->files = calloc(nfiles ? nfiles : 1, sizeof *u->files);
    for (size_t i = 0; ok && u->files && i < nfiles; i++) {
        const char *dir = file_dirs[i] < ndirs ? dir_paths[file_dirs[i]] : NULL;
        u->files[i] = join_path(u->comp_dir, dir, file_paths[i]);
    }
    if (u->files)
        u->nfiles = nfiles;
    free(dir_paths);
    free(dir_unused);
    free(file_paths);
    free(file_dirs);
    return ok && u->files;
}

static bool read_line_header(reader *r, const unit *u, line_header *h, reader *program)
{
    int offset_size;
    uint64_t len = read_initial_length(r, &offset_size);
    *r = sub_reader(r, len);
    h->offset_size = (uint8_t)offset_size;
    h->version = (uint8_t)read_uint(r, 2);
    h->addr_size = u->addr_size;
    if (h->version >= 5) {
        h->addr_size = read_u8(r);
        read_u8(r);   /* segment selector size */
    }
    uint64_t header_len = read_uint(r, offset_size);
    *program = *r;
    skip(program, header_len);   /* the program starts after the header */
    h->min_inst = read_u8(r);
    h->max_ops = h->version >= 4 ? read_u8(r) : 1;
    h->default_is_stmt = read_u8(r);
    h->line_base = (int8_t)read_u8(r);
    h->line_range = read_u8(r);
    h->opcode_base = read_u8(r);
    h->standard_lengths = r->p;
    skip(r, h->opcode_base ? h->opcode_base - 1u : 0);
    return !r->bad && !program->bad && h->version >= 2 && h->version <= 5 && h->line_range != 0 &&
           h->max_ops != 0 && h->opcode_base != 0 && (h->addr_size == 4 || h->addr_size == 8);
}

typedef struct {
    uint64_t addr, file, line;
    uint64_t op_index;
} line_state;

typedef struct {
    line_row *rows;
    size_t count, cap;
    size_t sequence_start;
} row_list;

/* binutils keeps only the last row of several at one address in a sequence
 * (PR ld/4986); doing the same makes addr2line our exact oracle. */
static bool emit_row(row_list *l, const line_state *s, bool end_sequence)
{
    line_row row = {s->addr, (uint32_t)s->file, (uint32_t)s->line, end_sequence};
    if (l->count > l->sequence_start && l->rows[l->count - 1].addr == s->addr && !end_sequence) {
        l->rows[l->count - 1] = row;
        return true;
    }
    if (!PUSH(l->rows, l->count, l->cap, row))
        return false;
    if (end_sequence) {
        /* A sequence at address 0 is code the linker discarded. */
        if (l->rows[l->sequence_start].addr == 0)
            l->count = l->sequence_start;
        l->sequence_start = l->count;
    }
    return true;
}

static void advance(line_state *s, const line_header *h, uint64_t operation_advance)
{
    if (h->max_ops == 1) {
        s->addr += h->min_inst * operation_advance;
        return;
    }
    s->addr += h->min_inst * ((s->op_index + operation_advance) / h->max_ops);
    s->op_index = (s->op_index + operation_advance) % h->max_ops;
}

enum { LNS_copy = 1, LNS_advance_pc, LNS_advance_line, LNS_set_file, LNS_set_column, LNS_negate_stmt,
       LNS_set_basic_block, LNS_const_add_pc, LNS_fixed_advance_pc };
enum { LNE_end_sequence = 1, LNE_set_address = 2 };

static bool run_extended_op(reader *r, line_state *s, row_list *rows)
{
    reader op = sub_reader(r, read_uleb(r));
    switch (read_u8(&op)) {
    case LNE_end_sequence:
        if (!emit_row(rows, s, true))
            return false;
        *s = (line_state){0, 1, 1, 0};
        return true;
    case LNE_set_address: {
        uint64_t size = (uint64_t)(op.end - op.p);
        if (size == 4 || size == 8)
            s->addr = read_uint(&op, (int)size);
        s->op_index = 0;
        return true;
    }
    default:
        return true;   /* define_file, set_discriminator, vendor ops: nothing we keep */
    }
}

static bool run_line_program(reader *r, const line_header *h, row_list *rows)
{
    line_state s = {0, 1, 1, 0};
    while (!r->bad && r->p < r->end) {
        uint8_t op = read_u8(r);
        if (op >= h->opcode_base) {
            unsigned adjusted = op - h->opcode_base;
            advance(&s, h, adjusted / h->line_range);
            s.line += (uint64_t)(int64_t)(h->line_base + (int)(adjusted % h->line_range));
            if (!emit_row(rows, &s, false))
                return false;
            continue;
        }
        switch (op) {
        case 0: if (!run_extended_op(r, &s, rows)) return false; break;
        case LNS_copy: if (!emit_row(rows, &s, false)) return false; break;
        case LNS_advance_pc: advance(&s, h, read_uleb(r)); break;
        case LNS_advance_line: s.line += (uint64_t)read_sleb(r); break;
        case LNS_set_file: s.file = read_uleb(r); break;
        case LNS_const_add_pc: advance(&s, h, (255u - h->opcode_base) / h->line_range); break;
        case LNS_fixed_advance_pc: s.addr += read_uint(r, 2); s.op_index = 0; break;
        default:
            /* Skip the operands the header declares for this opcode. */
            for (unsigned k = 0; k < h->standard_lengths[op - 1]; k++)
                read_uleb(r);
        }
    }
    return true;
}

static int compare_rows(const void *a, const void *b)
{
    const line_row *x = a, *y = b;
    if (x->addr != y->addr)
        return x->addr < y->addr ? -1 : 1;
    /* A sequence ending where the next begins: the end comes first, so a
     * lookup at that address lands on the new sequence's row. */
    return (int)y->end_sequence - (int)x->end_sequence;
}

/* Bytes read at once for a line program: most are shorter. */
#define PROGRAM_GUESS ((uint64_t)64 << 10)

/* The length-prefixed line program at `at` in .debug_line, read alone (the
 * section is never held whole; a compressed one is indexed on first use). */
static bool read_program_bytes(btc_dwarf *d, uint64_t at, btc_bytes *out)
{
    if (!d->line_indexed) {
        d->line_indexed = true;
        btc_bytes whole;
        if (btc_elf_section_compressed(d->debug, ".debug_line") &&
            btc_elf_read_section_indexed(d->debug, ".debug_line", &whole, &d->line_index))
            btc_bytes_free_transient(&whole);
    }
    if (!btc_elf_read_section_part(d->debug, ".debug_line", d->line_index, at, PROGRAM_GUESS, out))
        return false;
    reader h = reader_at(out, 0, out->size);
    int offset_size;
    uint64_t len = read_initial_length(&h, &offset_size);
    uint64_t whole = (uint64_t)(h.p - out->data) + len;
    if (!h.bad && whole <= out->size)
        return true;
    btc_bytes_free(out);
    return !h.bad && len < UINT64_MAX / 2 && btc_elf_read_section_part(d->debug, ".debug_line", d->line_index, at,
                                                                     whole, out) && out->size == whole;
}

/* Decode the program into u's rows and file table. */
static void decode_program(btc_dwarf *d, unit *u, const btc_bytes *bytes)
{
    reader r = reader_at(bytes, 0, bytes->size);
    reader program;
    line_header h;
    if (!read_line_header(&r, u, &h, &program) || !read_file_table(d, u, &r, &h))
        return;
    row_list rows = {0};
    if (!run_line_program(&program, &h, &rows)) {
        free(rows.rows);
        return;
    }
    /* Sequences come in any order; rows within one are already ascending,
     * so a stable order only matters for the tie rule above. */
    if (rows.count > 1)
        qsort(rows.rows, rows.count, sizeof *rows.rows, compare_rows);
    u->rows = rows.rows;
    u->nrows = rows.count;
}

void dwarf_decode_lines(btc_dwarf *d, unit *u)
{
    u->lines_done = true;
    dwarf_decoded++;
    btc_bytes bytes;
    if (!u->has_stmt_list || !read_program_bytes(d, u->stmt_list, &bytes))
        return;
    decode_program(d, u, &bytes);
    btc_bytes_free(&bytes);
}

const line_row *dwarf_row_for(const unit *u, uint64_t addr)
{
    size_t lo = BTC_PARTITION_POINT(u->nrows, i, u->rows[i].addr <= addr);
    return lo > 0 && !u->rows[lo - 1].end_sequence ? &u->rows[lo - 1] : NULL;
}

const char *dwarf_file_name(const unit *u, uint64_t index)
{
    return index < u->nfiles ? u->files[index] : NULL;
}
