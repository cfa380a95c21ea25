/* ELF files on disk: section contents and function symbols.
 *
 * Everything is read with pread() into heap buffers, never mmap()ed: a file
 * truncated or rewritten under us must show up as a short read (an error
 * here), not as a SIGBUS in the middle of a backtrace.  Every header, offset,
 * size, index and string taken from the file is checked before use, and
 * every allocation is bounded by the file's size (or by MAX_SECTION for
 * decompressed data), so garbage input yields NULL/0, never a crash.
 *
 * Only 64-bit little-endian ELF (the x86-64 ABI btcore supports) is read.
 */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "symbols/elf.h"
#include "common/search.h"

/* No section we need is anywhere near this; a bigger one is garbage. */
#define MAX_SECTION ((uint64_t)1 << 30)
/* ELF allows up to 2^32 sections through extended numbering; real files
 * have a few dozen, huge objects a few thousand. */
#define MAX_SECTIONS 65536
/* How many sorted symbols before a miss we look back through for a larger
 * symbol that still covers the address (nested or overlapping symbols). */
#define CONTAINER_LOOKBACK 8

typedef struct {
    uint64_t lo, size;
    const char *name;     /* points into a string table the btc_elf keeps */
    uint16_t shndx;
    uint8_t from_symtab;  /* .symtab names are preferred over .dynsym aliases */
} elf_sym;

struct btc_elf {
    int fd;
    uint64_t file_size;
    dev_t dev;                  /* the file's identity, to share one btc_elf per file */
    ino_t ino;
    struct timespec mtime;
    int refs;                   /* btc_elf_open() calls not yet closed (shared_lock) */
    struct btc_elf *next_shared;
    Elf64_Shdr *shdrs;
    uint32_t shnum;
    btc_bytes shstrtab;
    btc_bytes strtab, dynstr;   /* the string tables symbol names point into */
    elf_sym *syms;              /* sorted by lo, preferred alias first */
    size_t nsyms;
};

/* ---- reading the file ---- */

bool btc_read_exact(int fd, uint64_t off, void *buf, size_t size)
{
    uint8_t *p = buf;
    while (size) {
        ssize_t n = pread(fd, p, size, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        p += n;
        off += (uint64_t)n;
        size -= (size_t)n;
    }
    return true;
}

static bool range_in_file(const btc_elf *e, uint64_t off, uint64_t size)
{
    return off <= e->file_size && size <= e->file_size - off;
}

/* A heap copy of [off, off+size) with a NUL byte after it, so string tables
 * and strings at their end are always terminated. */
static bool read_bytes(const btc_elf *e, uint64_t off, uint64_t size, btc_bytes *out)
{
    if (size > MAX_SECTION || !range_in_file(e, off, size))
        return false;
    uint8_t *data = malloc(size + 1);
    if (!data)
        return false;
    if (!btc_read_exact(e->fd, off, data, size)) {
        free(data);
        return false;
    }
    data[size] = 0;
    out->data = data;
    out->size = size;
    return true;
}

void btc_bytes_free(btc_bytes *b)
{
    free(b->data);
    b->data = NULL;
    b->size = 0;
}

/* Transient buffers this big are given back to the system at once. */
#define LARGE_TRANSIENT ((size_t)1 << 20)

void btc_bytes_free_transient(btc_bytes *b)
{
    bool large = b->size >= LARGE_TRANSIENT;
    btc_bytes_free(b);
#ifdef __GLIBC__
    if (large)
        malloc_trim(0);
#endif
}

/* ---- headers and sections ---- */

static bool valid_ehdr(const Elf64_Ehdr *h)
{
    return memcmp(h->e_ident, ELFMAG, SELFMAG) == 0 && h->e_ident[EI_CLASS] == ELFCLASS64 &&
           h->e_ident[EI_DATA] == ELFDATA2LSB && h->e_shentsize == sizeof(Elf64_Shdr);
}

/* Section headers, with extended numbering (e_shnum == 0 and
 * e_shstrndx == SHN_XINDEX keep the real values in section 0). */
static bool read_section_headers(btc_elf *e, const Elf64_Ehdr *h)
{
    Elf64_Shdr first;
    if (h->e_shoff == 0 || !range_in_file(e, h->e_shoff, sizeof first) ||
        !btc_read_exact(e->fd, h->e_shoff, &first, sizeof first))
        return false;
    uint64_t shnum = h->e_shnum ? h->e_shnum : first.sh_size;
    uint64_t shstrndx = h->e_shstrndx == SHN_XINDEX ? first.sh_link : h->e_shstrndx;
    if (shnum == 0 || shnum > MAX_SECTIONS || shstrndx >= shnum ||
        !range_in_file(e, h->e_shoff, shnum * sizeof(Elf64_Shdr)))
        return false;
    e->shdrs = malloc(shnum * sizeof(Elf64_Shdr));
    if (!e->shdrs || !btc_read_exact(e->fd, h->e_shoff, e->shdrs, shnum * sizeof(Elf64_Shdr)))
        return false;
    e->shnum = (uint32_t)shnum;
    const Elf64_Shdr *s = &e->shdrs[shstrndx];
    return s->sh_type == SHT_STRTAB && read_bytes(e, s->sh_offset, s->sh_size, &e->shstrtab);
}

static const char *section_name(const btc_elf *e, const Elf64_Shdr *s)
{
    return s->sh_name < e->shstrtab.size ? (const char *)e->shstrtab.data + s->sh_name : "";
}

static const Elf64_Shdr *find_section(const btc_elf *e, const char *name)
{
    for (uint32_t i = 1; i < e->shnum; i++)
        if (e->shdrs[i].sh_type != SHT_NOBITS && strcmp(section_name(e, &e->shdrs[i]), name) == 0)
            return &e->shdrs[i];
    return NULL;
}

static bool read_section(const btc_elf *e, const Elf64_Shdr *s, btc_bytes *out)
{
    return s->sh_type != SHT_NOBITS && read_bytes(e, s->sh_offset, s->sh_size, out);
}

/* ---- compressed sections (SHF_COMPRESSED and legacy .zdebug_*) ----
 *
 * zlib is loaded with dlopen() rather than linked, so the extension needs
 * no extra library at link time and still loads where libz is missing:
 * compressed debug sections then simply count as absent. */

#if __has_include(<zlib.h>)
#include <zlib.h>   /* types and constants only: the functions come from dlsym */

static struct {
    pthread_once_t once;
    int (*init_raw)(z_streamp, int, const char *, int);
    int (*inflate)(z_streamp, int);
    int (*end)(z_streamp);
    int (*prime)(z_streamp, int, int);
    int (*set_dictionary)(z_streamp, const Bytef *, uInt);
} zlib = {.once = PTHREAD_ONCE_INIT};

static void resolve_zlib(void)
{
    void *h = dlopen("libz.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h)
        return;
    zlib.inflate = (int (*)(z_streamp, int))dlsym(h, "inflate");
    zlib.end = (int (*)(z_streamp))dlsym(h, "inflateEnd");
    zlib.init_raw = (int (*)(z_streamp, int, const char *, int))dlsym(h, "inflateInit2_");
    zlib.prime = (int (*)(z_streamp, int, int))dlsym(h, "inflatePrime");
    zlib.set_dictionary = (int (*)(z_streamp, const Bytef *, uInt))dlsym(h, "inflateSetDictionary");
    if (!zlib.inflate || !zlib.end || !zlib.prime || !zlib.set_dictionary)
        zlib.init_raw = NULL;
}

static bool load_zlib(void)
{
    pthread_once(&zlib.once, resolve_zlib);
    return zlib.init_raw != NULL;
}

/* ---- random access into a compressed section ----
 *
 * A zlib stream can only be inflated from its start.  The first whole read
 * of a section also records access points, one per ZINDEX_SPAN bytes of
 * output at deflate block boundaries: where the compressed bit stream
 * stands and the 32 KiB of output before it (the method of zlib's
 * examples/zran.c).  A part of the section is then inflated from the
 * nearest point before it, never from the start, and the section is never
 * held whole again. */

#define ZWINDOW 32768
#define ZLIB_HEADER 2   /* a zlib stream's header: its deflate data starts after it */
#define ZINDEX_SPAN ((uint64_t)256 << 10)

typedef struct {
    uint64_t in, out;   /* compressed bytes consumed, output bytes produced, at the point */
    int bits;           /* bits of byte in - 1 not consumed yet */
    uint8_t window[ZWINDOW];
} zpoint;

struct btc_zindex {
    zpoint *points;     /* by out */
    size_t n;
};

static bool add_point(btc_zindex *ix, const z_stream *z, const uint8_t *out)
{
    zpoint *grown = realloc(ix->points, (ix->n + 1) * sizeof *grown);
    if (!grown)
        return false;
    ix->points = grown;
    zpoint *p = &grown[ix->n++];
    p->in = ZLIB_HEADER + z->total_in;
    p->out = z->total_out;
    p->bits = z->total_out ? z->data_type & 7 : 0;   /* (at the start, data_type is not set yet) */
    size_t have = p->out < ZWINDOW ? (size_t)p->out : ZWINDOW;
    memset(p->window, 0, ZWINDOW - have);
    memcpy(p->window + ZWINDOW - have, out + p->out - have, have);
    return true;
}

/* A zlib stream's 2-byte header: deflate, no preset dictionary, its check bits right. */
static bool zlib_header(const uint8_t *in, size_t in_size)
{
    return in_size >= 2 && (in[0] & 0x0f) == Z_DEFLATED && (in[0] >> 4) <= 7 && !(in[1] & 0x20) &&
           ((unsigned)in[0] << 8 | in[1]) % 31 == 0;
}


/* Inflate a zlib stream into exactly out_size bytes; with ix, record its
 * access points on the way.  Its deflate data is inflated raw, past the
 * header: the trailing Adler-32 is not computed (~15% of the inflate of a
 * debug file's .debug_info; what is inflated is parsed with bounds anyway),
 * and the points' offsets count from the stream's start, header included,
 * as inflate_from() reads them. */
static bool inflate_exact(const uint8_t *in, size_t in_size, uint8_t *out, size_t out_size, btc_zindex *ix)
{
    if (in_size > UINT32_MAX || out_size > UINT32_MAX || !load_zlib() || !zlib_header(in, in_size))
        return false;
    z_stream z;
    memset(&z, 0, sizeof z);
    z.next_in = (Bytef *)in + ZLIB_HEADER;
    z.avail_in = (uInt)(in_size - ZLIB_HEADER);
    z.next_out = out;
    z.avail_out = (uInt)out_size;
    if (zlib.init_raw(&z, -15, ZLIB_VERSION, (int)sizeof z) != Z_OK)
        return false;
    int rc = Z_OK;
    bool ok = !ix || add_point(ix, &z, out);   /* the start: raw inflate stops at no boundary before a block's end */
    uint64_t last = 0;
    while (rc == Z_OK && ok) {
        rc = zlib.inflate(&z, ix ? Z_BLOCK : Z_FINISH);
        bool block_boundary = (z.data_type & 128) && !(z.data_type & 64);
        if (ix && rc == Z_OK && block_boundary && z.total_out - last >= ZINDEX_SPAN) {
            ok = add_point(ix, &z, out);
            last = z.total_out;
        }
    }
    zlib.end(&z);
    return ok && rc == Z_STREAM_END && z.total_out == out_size;
}

/* The compressed stream of a section: where it starts in the file, how
 * long it is. */
typedef struct {
    const btc_elf *e;
    uint64_t at, size;
} zstream_in;

#define ZINPUT_CHUNK ((size_t)1 << 16)

/* Feed z the next chunk of the stream from file offset *next. */
static bool feed(z_stream *z, const zstream_in *s, uint64_t *next, uint8_t *chunk)
{
    uint64_t left = s->at + s->size - *next;
    size_t n = left < ZINPUT_CHUNK ? (size_t)left : ZINPUT_CHUNK;
    if (n == 0 || !btc_read_exact(s->e->fd, *next, chunk, n))
        return false;
    *next += n;
    z->next_in = chunk;
    z->avail_in = (uInt)n;
    return true;
}

/* [off, off + size) of the stream's output into dst, inflated from point p
 * (raw deflate from there, primed with p's pending bits and window); the
 * compressed bytes are read from the file as needed, a chunk at a time. */
static bool inflate_from(const zstream_in *s, const zpoint *p, uint64_t off, uint8_t *dst, size_t size)
{
    if (p->in > s->size || (p->bits && p->in == 0) || !load_zlib())
        return false;
    uint8_t *scratch = malloc(ZWINDOW + ZINPUT_CHUNK), *chunk = scratch + ZWINDOW;
    uint8_t pending = 0;
    uint64_t next = s->at + p->in;
    z_stream z;
    memset(&z, 0, sizeof z);
    if (!scratch || (p->bits && !btc_read_exact(s->e->fd, next - 1, &pending, 1)) ||
        zlib.init_raw(&z, -15, ZLIB_VERSION, (int)sizeof z) != Z_OK) {
        free(scratch);
        return false;
    }
    int rc = p->bits ? zlib.prime(&z, p->bits, pending >> (8 - p->bits)) : Z_OK;
    if (rc == Z_OK)
        rc = zlib.set_dictionary(&z, p->window, ZWINDOW);
    uint64_t produced = p->out;
    while (rc == Z_OK && produced < off + size) {
        if (z.avail_in == 0 && !feed(&z, s, &next, chunk))
            break;
        bool skipping = produced < off;
        z.next_out = skipping ? scratch : dst + (produced - off);
        z.avail_out = (uInt)(skipping ? (off - produced < ZWINDOW ? off - produced : ZWINDOW) : off + size - produced);
        uInt room = z.avail_out;
        rc = zlib.inflate(&z, Z_NO_FLUSH);
        produced += room - z.avail_out;
    }
    zlib.end(&z);
    free(scratch);
    return produced >= off + size;
}
#else
/* Built without zlib's header (Debian: zlib1g-dev): compressed sections
 * count as absent. */
struct btc_zindex {
    size_t n;
};

static bool inflate_exact(const uint8_t *in BTC_UNUSED, size_t in_size BTC_UNUSED, uint8_t *out BTC_UNUSED,
                          size_t out_size BTC_UNUSED, btc_zindex *ix BTC_UNUSED)
{
    return false;
}
#endif

void btc_zindex_free(btc_zindex *ix)
{
    if (!ix)
        return;
#if __has_include(<zlib.h>)
    free(ix->points);
#endif
    free(ix);
}

size_t btc_zindex_memory(const btc_zindex *ix)
{
#if __has_include(<zlib.h>)
    return ix ? sizeof *ix + ix->n * sizeof *ix->points : 0;
#else
    return 0;
#endif
}

/* Replace a compressed section image by its contents (recording ix's points). */
static bool decompress(btc_bytes *b, size_t header_size, uint64_t out_size, btc_zindex *ix)
{
    if (header_size > b->size || out_size > MAX_SECTION)
        return false;
    uint8_t *out = malloc(out_size + 1);
    if (!out)
        return false;
    if (!inflate_exact(b->data + header_size, b->size - header_size, out, out_size, ix)) {
        free(out);
        return false;
    }
    out[out_size] = 0;
    free(b->data);
    b->data = out;
    b->size = out_size;
    return true;
}

/* Where a compressed section image's zlib stream starts, and its contents'
 * size: after an Elf64_Chdr (SHF_COMPRESSED), or after "ZLIB" and an 8-byte
 * big-endian size (.zdebug_*).  False if b is neither. */
static bool compressed_layout(const btc_bytes *b, bool shf, size_t *header, uint64_t *size)
{
    if (shf) {
        Elf64_Chdr ch;
        if (b->size < sizeof ch)
            return false;
        memcpy(&ch, b->data, sizeof ch);
        *header = sizeof ch;
        *size = ch.ch_size;
        return ch.ch_type == ELFCOMPRESS_ZLIB;
    }
    if (b->size < 12 || memcmp(b->data, "ZLIB", 4) != 0)
        return false;
    *header = 12;
    *size = 0;
    for (int i = 4; i < 12; i++)
        *size = *size << 8 | b->data[i];
    return true;
}

/* The section `name`, or its legacy .zdebug_ twin (*zdebug set). */
static const Elf64_Shdr *find_debug_section(const btc_elf *e, const char *name, bool *zdebug)
{
    const Elf64_Shdr *s = find_section(e, name);
    char zname[64];
    *zdebug = !s;
    if (!s && strncmp(name, ".debug_", 7) == 0 &&
        (size_t)snprintf(zname, sizeof zname, ".zdebug_%s", name + 7) < sizeof zname)
        s = find_section(e, zname);
    return s;
}

static bool is_compressed(const Elf64_Shdr *s, bool zdebug)
{
    return zdebug || (s->sh_flags & SHF_COMPRESSED);
}

bool btc_elf_section_compressed(btc_elf *e, const char *name)
{
    bool zdebug;
    const Elf64_Shdr *s = find_debug_section(e, name, &zdebug);
    return s && is_compressed(s, zdebug);
}

bool btc_elf_read_section_indexed(btc_elf *e, const char *name, btc_bytes *out, btc_zindex **index)
{
    out->data = NULL;
    out->size = 0;
    if (index)
        *index = NULL;
    bool zdebug;
    const Elf64_Shdr *s = find_debug_section(e, name, &zdebug);
    if (!s || !read_section(e, s, out))
        return false;
    if (!is_compressed(s, zdebug))
        return true;
    size_t header;
    uint64_t size;
    btc_zindex *ix = index ? calloc(1, sizeof *ix) : NULL;
    bool ok = (!index || ix) && compressed_layout(out, !zdebug, &header, &size) &&
              (size || !zdebug) && decompress(out, header, size, ix);
    if (!ok) {
        btc_bytes_free(out);
        btc_zindex_free(ix);
        ix = NULL;
    }
    if (index)
        *index = ix;
    return ok;
}

bool btc_elf_read_section(btc_elf *e, const char *name, btc_bytes *out)
{
    return btc_elf_read_section_indexed(e, name, out, NULL);
}

/* [off, off + size) of compressed section s's contents, from ix's nearest
 * point (size: clipped to the contents' end). */
static bool inflate_part(const btc_elf *e, const Elf64_Shdr *s, bool shf, const btc_zindex *ix, uint64_t off,
                         uint64_t *size, btc_bytes *out)
{
#if __has_include(<zlib.h>)
    uint8_t head[sizeof(Elf64_Chdr)];
    btc_bytes first = {head, sizeof head < s->sh_size ? sizeof head : (size_t)s->sh_size};
    size_t header;
    uint64_t total;
    if (!ix || ix->n == 0 || !range_in_file(e, s->sh_offset, s->sh_size) ||
        !btc_read_exact(e->fd, s->sh_offset, head, first.size) || !compressed_layout(&first, shf, &header, &total) ||
        off > total || total > MAX_SECTION || header > s->sh_size)
        return false;
    if (*size > total - off)
        *size = total - off;
    size_t k = BTC_PARTITION_POINT(ix->n, i, ix->points[i].out <= off);
    zstream_in in = {e, s->sh_offset + header, s->sh_size - header};
    out->data = k ? malloc(*size + 1) : NULL;
    if (!out->data || !inflate_from(&in, &ix->points[k - 1], off, out->data, (size_t)*size)) {
        btc_bytes_free(out);
        return false;
    }
    return true;
#else
    (void)e, (void)s, (void)shf, (void)ix, (void)off, (void)size, (void)out;
    return false;
#endif
}

bool btc_elf_read_section_part(btc_elf *e, const char *name, const btc_zindex *index, uint64_t off, uint64_t size,
                               btc_bytes *out)
{
    out->data = NULL;
    out->size = 0;
    bool zdebug;
    const Elf64_Shdr *s = find_debug_section(e, name, &zdebug);
    if (!s || s->sh_type == SHT_NOBITS)
        return false;
    if (!is_compressed(s, zdebug)) {
        if (off > s->sh_size)
            return false;
        return read_bytes(e, s->sh_offset + off, size < s->sh_size - off ? size : s->sh_size - off, out);
    }
    bool ok = inflate_part(e, s, !zdebug, index, off, &size, out);
    if (ok) {
        out->data[size] = 0;
        out->size = size;
    }
    return ok;
}

int btc_elf_section_head(btc_elf *e, const char *name, uint8_t *out, int max)
{
    btc_bytes b;
    if (max < 0 || !btc_elf_read_section_part(e, name, NULL, 0, (uint64_t)max, &b))
        return -1;   /* absent, unreadable, or compressed (read whole only) */
    int n = (int)b.size;   /* at most max */
    memcpy(out, b.data, b.size);
    btc_bytes_free(&b);
    return n;
}

/* ---- symbols ---- */

static bool is_function(const btc_elf *e, const Elf64_Sym *s)
{
    int type = ELF64_ST_TYPE(s->st_info);
    if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s->st_value == 0)
        return false;
    if (s->st_shndx == SHN_UNDEF || s->st_shndx >= e->shnum)
        return false;   /* also rejects SHN_ABS, SHN_COMMON and SHN_XINDEX */
    return (e->shdrs[s->st_shndx].sh_flags & SHF_EXECINSTR) != 0;
}

/* The symbol table of `type` (SHT_SYMTAB, SHT_DYNSYM) if it is well formed. */
static const Elf64_Shdr *symbol_table(const btc_elf *e, uint32_t type)
{
    const Elf64_Shdr *tab = NULL;
    for (uint32_t i = 1; i < e->shnum && !tab; i++)
        if (e->shdrs[i].sh_type == type)
            tab = &e->shdrs[i];
    if (!tab || tab->sh_entsize != sizeof(Elf64_Sym) || tab->sh_link == 0 || tab->sh_link >= e->shnum ||
        e->shdrs[tab->sh_link].sh_type != SHT_STRTAB)
        return NULL;
    return tab;
}

/* Append the function symbols of one symbol table; its string table is kept
 * in *strings.  A missing or malformed table adds nothing. */
static bool load_symbols(btc_elf *e, uint32_t type, btc_bytes *strings)
{
    const Elf64_Shdr *tab = symbol_table(e, type);
    if (!tab)
        return true;
    btc_bytes raw;
    if (!read_section(e, tab, &raw))
        return true;
    if (!read_section(e, &e->shdrs[tab->sh_link], strings)) {
        btc_bytes_free(&raw);
        return true;
    }
    size_t count = raw.size / sizeof(Elf64_Sym);
    elf_sym *grown = realloc(e->syms, (e->nsyms + count + 1) * sizeof *grown);
    if (!grown) {
        btc_bytes_free(&raw);
        return false;
    }
    e->syms = grown;
    for (size_t i = 0; i < count; i++) {
        Elf64_Sym s;
        memcpy(&s, raw.data + i * sizeof s, sizeof s);
        if (!is_function(e, &s) || s.st_name >= strings->size || strings->data[s.st_name] == 0)
            continue;
        e->syms[e->nsyms++] = (elf_sym){
            .lo = s.st_value,
            .size = s.st_size,
            .name = (const char *)strings->data + s.st_name,
            .shndx = s.st_shndx,
            .from_symtab = type == SHT_SYMTAB,
        };
    }
    btc_bytes_free(&raw);
    return true;
}

/* By address; among aliases the one to report first: sized, from .symtab,
 * the public spelling (fewest leading underscores: clone3, not glibc's
 * internal __GI___clone3 that a debug file's .symtab lists beside it), then
 * by name so the order does not depend on qsort. */
static int compare_syms(const void *pa, const void *pb)
{
    const elf_sym *a = pa, *b = pb;
    if (a->lo != b->lo)
        return a->lo < b->lo ? -1 : 1;
    if ((a->size != 0) != (b->size != 0))
        return a->size ? -1 : 1;
    if (a->from_symtab != b->from_symtab)
        return a->from_symtab ? -1 : 1;
    size_t a_under = strspn(a->name, "_"), b_under = strspn(b->name, "_");
    if (a_under != b_under)
        return a_under < b_under ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* ---- reading one file ---- */

static void elf_free(btc_elf *e);

/* The file open as fd (owned from now on: closed on failure too), whose
 * fstat() is st. */
static btc_elf *elf_read(int fd, const struct stat *st)
{
    btc_elf *e = calloc(1, sizeof *e);
    if (!e) {
        close(fd);
        return NULL;
    }
    e->fd = fd;
    e->file_size = (uint64_t)st->st_size;
    e->dev = st->st_dev;
    e->ino = st->st_ino;
    e->mtime = st->st_mtim;
    Elf64_Ehdr h;
    if (!range_in_file(e, 0, sizeof h) || !btc_read_exact(e->fd, 0, &h, sizeof h) || !valid_ehdr(&h) ||
        !read_section_headers(e, &h))
        goto fail;
    if (!load_symbols(e, SHT_SYMTAB, &e->strtab) || !load_symbols(e, SHT_DYNSYM, &e->dynstr))
        goto fail;
    if (e->nsyms)
        qsort(e->syms, e->nsyms, sizeof *e->syms, compare_syms);
    return e;
fail:
    elf_free(e);
    return NULL;
}

/* ---- opening a file someone else named ----
 *
 * Paths reach this reader from tokens (untrusted), another process's maps,
 * debug links and build-id directories; any may name a FIFO or a device,
 * and the object a path names may be swapped between a check and a use.
 * Opening is what has side effects (a FIFO's blocked writer wakes up, a
 * device's driver runs; a blocking open of a FIFO never returns), so the
 * path is first resolved without opening anything (O_PATH: no driver, no
 * FIFO semantics), the object is checked on that descriptor, and only a
 * regular file is opened, through the descriptor itself: /proc/self/fd/N
 * names the object already checked, not the path, so a swap after the
 * check changes nothing.  Symlinks are followed (libraries are named
 * through them: libstdc++.so.6 -> libstdc++.so.6.0.30): what is checked is
 * the object reached, and every caller checks its build-id after.  A file
 * smaller than an ELF header is not opened either: procfs reports size 0
 * for files whose reads have side effects (/proc/kmsg consumes messages,
 * tracefs' trace_pipe consumes events). */

/* A read descriptor on the object `at` (O_PATH) refers to, whose fstat()
 * is st; -1 if it cannot be had. */
static int reopen_checked(int at, const char *path, const struct stat *st)
{
    char self[40];
    snprintf(self, sizeof self, "/proc/self/fd/%d", at);
    int fd = open(self, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    /* No /proc mounted: the path once more, never blocking, and kept only
     * if it still names the object checked. */
    if (fd < 0 && errno == ENOENT)
        fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat now;
    if (fd >= 0 && (fstat(fd, &now) != 0 || now.st_dev != st->st_dev || now.st_ino != st->st_ino)) {
        close(fd);
        errno = ESTALE;
        return -1;
    }
    return fd;
}

int btc_open_regular(const char *path, uint32_t *mode)
{
    if (mode)
        *mode = 0;
    if (!path)
        return -1;
    int at = open(path, O_PATH | O_CLOEXEC);
    if (at < 0)
        return -1;
    struct stat st;
    int fd = -1;
    if (fstat(at, &st) == 0) {
        if (mode)
            *mode = (uint32_t)st.st_mode;
        if (!S_ISREG(st.st_mode))
            errno = EINVAL;
        else if (st.st_size < (off_t)sizeof(Elf64_Ehdr))   /* procfs files say 0: /proc/kmsg's reads consume */
            errno = ENOEXEC;
        else
            fd = reopen_checked(at, path, &st);
    }
    int saved = errno;
    close(at);
    errno = saved;
    return fd;
}

/* ---- one btc_elf per file ----
 *
 * The module list (capture/modules.c: eval-loop and greenlet function
 * ranges) and the DWARF file cache (symbols/symbolize.c) open the same
 * files; their symbol tables are the biggest part of a btc_elf, so an open
 * file is shared, counted, and freed by its last close.  A btc_elf never
 * changes after it is read (reads are pread() on its fd), so holders use it
 * at once without a lock.  The list's lock is held only for a few pointer
 * and counter updates, never for I/O or allocation, and it is taken inside
 * the module lock and the file cache's lock: a prepare handler taking it at
 * fork() could wait for a thread that waits for the module lock, which the
 * module list's own prepare handler holds.  So the child deals with it:
 * found held there, the lock is made anew; the list is whole after each
 * single update, so at worst a file opened then is not shared. */

static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static btc_elf *shared;

static void shared_lock_after_fork_child(void)
{
    if (pthread_mutex_trylock(&shared_lock) == 0)
        pthread_mutex_unlock(&shared_lock);
    else
        pthread_mutex_init(&shared_lock, NULL);
}

__attribute__((constructor)) static void shared_fork_safe(void)
{
    pthread_atfork(NULL, NULL, shared_lock_after_fork_child);
}

static bool same_file(const btc_elf *e, const struct stat *st)
{
    return e->dev == st->st_dev && e->ino == st->st_ino && e->file_size == (uint64_t)st->st_size &&
           e->mtime.tv_sec == st->st_mtim.tv_sec && e->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

/* The open btc_elf of the file st describes, with one more reference; shared_lock held. */
static btc_elf *take_shared(const struct stat *st)
{
    for (btc_elf *e = shared; e; e = e->next_shared)
        if (same_file(e, st)) {
            e->refs++;
            return e;
        }
    return NULL;
}

/* ---- public interface ---- */

btc_elf *btc_elf_open_fd(int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return NULL;
    pthread_mutex_lock(&shared_lock);
    btc_elf *e = take_shared(&st);
    pthread_mutex_unlock(&shared_lock);
    if (e)
        return e;
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0 || !(e = elf_read(own, &st)))
        return NULL;
    pthread_mutex_lock(&shared_lock);
    btc_elf *other = take_shared(&st);   /* opened by another thread meanwhile */
    if (!other) {
        e->refs = 1;
        e->next_shared = shared;
        shared = e;
    }
    pthread_mutex_unlock(&shared_lock);
    if (other)
        elf_free(e);
    return other ? other : e;
}

btc_elf *btc_elf_open(const char *path)
{
    int fd = btc_open_regular(path, NULL);
    if (fd < 0)
        return NULL;
    btc_elf *e = btc_elf_open_fd(fd);
    close(fd);
    return e;
}

void btc_elf_close(btc_elf *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&shared_lock);
    bool last = --e->refs == 0;
    for (btc_elf **p = &shared; last && *p; p = &(*p)->next_shared)
        if (*p == e) {
            *p = e->next_shared;
            break;
        }
    pthread_mutex_unlock(&shared_lock);
    if (last)
        elf_free(e);
}

int btc_elf_instances(const char *path)
{
    struct stat st;
    int n = 0;
    if (stat(path, &st) != 0)
        return 0;
    pthread_mutex_lock(&shared_lock);
    for (btc_elf *e = shared; e; e = e->next_shared)
        n += same_file(e, &st);
    pthread_mutex_unlock(&shared_lock);
    return n;
}

static void elf_free(btc_elf *e)
{
    if (e->fd >= 0)
        close(e->fd);
    free(e->shdrs);
    btc_bytes_free(&e->shstrtab);
    btc_bytes_free(&e->strtab);
    btc_bytes_free(&e->dynstr);
    free(e->syms);
    free(e);
}

/* Index of the last symbol with lo <= vaddr, moved back to the first
 * (preferred) of its aliases; -1 if every symbol lies above vaddr. */
static ptrdiff_t preceding_symbol(const btc_elf *e, uint64_t vaddr)
{
    size_t lo = BTC_PARTITION_POINT(e->nsyms, i, e->syms[i].lo <= vaddr);
    if (lo == 0)
        return -1;
    size_t i = lo - 1;
    while (i > 0 && e->syms[i - 1].lo == e->syms[i].lo)
        i--;
    return (ptrdiff_t)i;
}

static bool sym_covers(const elf_sym *s, uint64_t vaddr)
{
    return vaddr >= s->lo && vaddr - s->lo < s->size;
}

static bool section_covers(const btc_elf *e, uint16_t shndx, uint64_t vaddr)
{
    const Elf64_Shdr *s = &e->shdrs[shndx];
    return vaddr >= s->sh_addr && vaddr - s->sh_addr < s->sh_size;
}

const char *btc_elf_symbolize(btc_elf *e, uintptr_t vaddr, uintptr_t *sym_vaddr)
{
    if (!e)
        return NULL;
    ptrdiff_t i = preceding_symbol(e, vaddr);
    if (i < 0)
        return NULL;
    const elf_sym *found = NULL;
    /* A sized symbol that contains vaddr; usually the nearest one, but a
     * larger symbol may enclose a smaller one that ends before vaddr. */
    for (ptrdiff_t k = i; k >= 0 && k > i - CONTAINER_LOOKBACK && !found; k--)
        if (sym_covers(&e->syms[k], vaddr))
            found = &e->syms[k];
    /* Otherwise the nearest preceding function, if its extent is unknown
     * (size 0) and it is in the same section.  A sized symbol that ends
     * before vaddr is not vaddr's function (stripped files keep only
     * .dynsym, whose neighbours are unrelated exports): no name then. */
    if (!found && e->syms[i].size == 0 && section_covers(e, e->syms[i].shndx, vaddr))
        found = &e->syms[i];
    if (!found)
        return NULL;
    if (sym_vaddr)
        *sym_vaddr = (uintptr_t)found->lo;
    return found->name;
}

/* name itself, or name followed by '.' and a clone suffix (".cold", ".part.0"). */
static bool names_function(const char *sym, const char *name, size_t len)
{
    return strncmp(sym, name, len) == 0 && (sym[len] == 0 || sym[len] == '.');
}

static bool range_listed(const uintptr_t *lo, const uintptr_t *hi, int n, uint64_t l, uint64_t h)
{
    for (int k = 0; k < n; k++)
        if (lo[k] == l && hi[k] == h)
            return true;
    return false;
}

int btc_elf_function_ranges(btc_elf *e, const char *name, uintptr_t *lo, uintptr_t *hi, int max)
{
    if (!e || !name)
        return 0;
    size_t len = strlen(name);
    int n = 0;
    for (size_t i = 0; i < e->nsyms && n < max; i++) {
        const elf_sym *s = &e->syms[i];
        if (s->size == 0 || !names_function(s->name, name, len))
            continue;
        /* The same function often appears in both .symtab and .dynsym. */
        if (range_listed(lo, hi, n, s->lo, s->lo + s->size))
            continue;
        lo[n] = (uintptr_t)s->lo;
        hi[n] = (uintptr_t)(s->lo + s->size);
        n++;
    }
    return n;
}

/* ---- separate debug files ----
 *
 * Distributions strip DWARF into a second file and leave a pointer behind:
 * the build-id note (looked up under <root>/.build-id/xx/rest.debug) and
 * the .gnu_debuglink section (a file name and the CRC-32 of that file). */

#define MAX_BUILD_ID 64

bool btc_elf_has_section(btc_elf *e, const char *name)
{
    return find_section(e, name) != NULL;
}

/* The bytes of the NT_GNU_BUILD_ID note in the .note.gnu.build-id section; 0 when there is none. */
static size_t read_build_id(btc_elf *e, uint8_t out[MAX_BUILD_ID])
{
    btc_bytes notes;
    if (!btc_elf_read_section(e, ".note.gnu.build-id", &notes))
        return 0;
    size_t found = btc_note_build_id(notes.data, notes.size, out, MAX_BUILD_ID);
    btc_bytes_free(&notes);
    return found <= MAX_BUILD_ID ? found : 0;
}

static uint32_t crc_table[256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void fill_crc_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

/* zlib's CRC-32, which is what .gnu_debuglink records. */
static uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t n)
{
    pthread_once(&crc_table_once, fill_crc_table);
    crc = ~crc;
    while (n--)
        crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* The CRC-32 of a whole file. */
static bool file_crc32(const btc_elf *e, uint32_t *crc)
{
    enum { CHUNK = 1 << 16 };
    uint8_t *buf = malloc(CHUNK);
    if (!buf)
        return false;
    uint32_t c = 0;
    uint64_t off = 0;
    bool ok = true;
    while (ok && off < e->file_size) {
        size_t n = e->file_size - off < CHUNK ? (size_t)(e->file_size - off) : CHUNK;
        ok = btc_read_exact(e->fd, off, buf, n);
        c = crc32_update(c, buf, n);
        off += n;
    }
    free(buf);
    *crc = c;
    return ok;
}

/* A candidate debug file is accepted only if it has DWARF and provably
 * belongs to e: same build-id when both have one, else the recorded CRC. */
static btc_elf *open_matching(const char *path, const uint8_t *id, size_t id_len, const uint32_t *crc)
{
    btc_elf *d = btc_elf_open(path);
    if (!d)
        return NULL;
    uint8_t did[MAX_BUILD_ID];
    size_t did_len = read_build_id(d, did);
    bool same;
    uint32_t dcrc;
    if (id_len && did_len)
        same = id_len == did_len && memcmp(id, did, id_len) == 0;
    else
        same = crc && file_crc32(d, &dcrc) && dcrc == *crc;
    if (same && (btc_elf_has_section(d, ".debug_info") || btc_elf_has_section(d, ".zdebug_info")))
        return d;
    btc_elf_close(d);
    return NULL;
}

static btc_elf *open_by_build_id(const uint8_t *id, size_t len, const char *root)
{
    if (len < 2)
        return NULL;
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/.build-id/%02x/", root, id[0]);
    for (size_t i = 1; i < len && n > 0 && (size_t)n < sizeof path - 3; i++)
        n += snprintf(path + n, sizeof path - (size_t)n, "%02x", id[i]);
    if (n <= 0 || (size_t)n + sizeof ".debug" > sizeof path)
        return NULL;
    strcpy(path + n, ".debug");
    return open_matching(path, id, len, NULL);
}

/* .gnu_debuglink: the file name and the CRC that follows it (4-aligned). */
static bool read_debuglink(btc_elf *e, char *name, size_t size, uint32_t *crc)
{
    btc_bytes link;
    if (!btc_elf_read_section(e, ".gnu_debuglink", &link))
        return false;
    size_t len = strnlen((const char *)link.data, link.size);
    size_t crc_at = (len + 4) & ~(size_t)3;
    bool ok = len > 0 && len < size && crc_at + 4 <= link.size;
    if (ok) {
        memcpy(name, link.data, len + 1);
        memcpy(crc, link.data + crc_at, 4);
    }
    btc_bytes_free(&link);
    return ok;
}

/* Where GDB looks for a debuglink target: beside the file, in .debug/
 * beside it, and under the debug root with the file's directory. */
static btc_elf *open_by_debuglink(btc_elf *e, const char *path, const char *root, const uint8_t *id,
                                  size_t id_len)
{
    char name[256];
    uint32_t crc;
    if (!read_debuglink(e, name, sizeof name, &crc))
        return NULL;
    const char *slash = strrchr(path, '/');
    int dir_len = slash ? (int)(slash - path) : 1;
    const char *dir = slash ? path : ".";
    const char *forms[] = {"%.*s/%s", "%.*s/.debug/%s", "%s%.*s/%s"};
    for (size_t k = 0; k < sizeof forms / sizeof *forms; k++) {
        char candidate[4096];
        int n = k < 2 ? snprintf(candidate, sizeof candidate, forms[k], dir_len, dir, name)
                      : snprintf(candidate, sizeof candidate, forms[k], root, dir_len, dir, name);
        if (n <= 0 || (size_t)n >= sizeof candidate || strcmp(candidate, path) == 0)
            continue;
        btc_elf *d = open_matching(candidate, id, id_len, &crc);
        if (d)
            return d;
    }
    return NULL;
}

btc_elf *btc_elf_open_debug_file(btc_elf *e, const char *path, const char *debug_root)
{
    uint8_t id[MAX_BUILD_ID];
    size_t id_len = read_build_id(e, id);
    btc_elf *d = open_by_build_id(id, id_len, debug_root);
    return d ? d : open_by_debuglink(e, path, debug_root, id, id_len);
}

/* ---- notes and program headers ----
 *
 * What a file's sections do not give: the build-id as the loader maps it
 * (PT_NOTE segments: a module loaded here, another process's, a file a
 * token names) and a core file's segments and notes (symbols/elf_core.c).
 * Notes come from memory the caller bounded (a mapped segment, a buffer
 * read from a file or another process): one walker reads them all. */

bool btc_elf_next_note(reader *r, btc_elf_note *n)
{
    n->namesz = read_u32(r);
    n->descsz = read_u32(r);
    n->type = read_u32(r);
    n->name = r->p;
    skip(r, ((uint64_t)n->namesz + 3) & ~3ull);
    n->desc = r->p;
    skip(r, n->descsz);
    if (r->bad)
        return false;
    /* The last note's padding may be cut off: the note is still whole. */
    size_t pad = (size_t)(-n->descsz & 3u), left = (size_t)(r->end - r->p);
    r->p += pad < left ? pad : left;
    return true;
}

bool btc_elf_note_named(const btc_elf_note *n, const char *name)
{
    size_t len = strlen(name) + 1;
    return n->namesz == len && memcmp(n->name, name, len) == 0;
}

size_t btc_note_build_id(const uint8_t *a, size_t n, uint8_t *out, size_t max)
{
    reader r = reader_over(a, a + n);
    btc_elf_note note;
    while (btc_elf_next_note(&r, &note))
        if (note.type == NT_GNU_BUILD_ID && btc_elf_note_named(&note, "GNU") && note.descsz) {
            memcpy(out, note.desc, note.descsz < max ? note.descsz : max);
            return note.descsz;
        }
    return 0;
}

/* More than any file or core has (a core has one per mapping); with
 * PN_XNUM extended numbering up to 2^32 could be claimed. */
#define MAX_PHDRS_TOTAL (1 << 20)

int btc_elf_phdrs(int fd, Elf64_Ehdr *eh, Elf64_Phdr *out, int max)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof *eh || !btc_read_exact(fd, 0, eh, sizeof *eh) ||
        memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_ident[EI_DATA] != ELFDATA2LSB || eh->e_phentsize != sizeof(Elf64_Phdr))
        return -1;
    uint64_t size = (uint64_t)st.st_size, count = eh->e_phnum;
    if (count == PN_XNUM) {   /* the real count is section 0's sh_info */
        Elf64_Shdr first;
        if (eh->e_shoff > size || size - eh->e_shoff < sizeof first || !btc_read_exact(fd, eh->e_shoff, &first, sizeof first))
            return -1;
        count = first.sh_info;
    }
    if (count > MAX_PHDRS_TOTAL || eh->e_phoff > size || count * sizeof *out > size - eh->e_phoff)
        return -1;
    uint64_t n = count < (uint64_t)(max > 0 ? max : 0) ? count : (uint64_t)(max > 0 ? max : 0);
    return btc_read_exact(fd, eh->e_phoff, out, n * sizeof *out) ? (int)count : -1;
}

/* The notes of one PT_NOTE segment larger than this are not read. */
#define MAX_NOTE_SEGMENT (1u << 16)

size_t btc_elf_phdrs_build_id(int fd, const Elf64_Phdr *ph, int n, uint8_t *out, size_t max)
{
    uint8_t *notes = malloc(MAX_NOTE_SEGMENT);
    size_t found = 0;
    for (int i = 0; notes && i < n && !found; i++)
        if (ph[i].p_type == PT_NOTE && ph[i].p_filesz <= MAX_NOTE_SEGMENT &&
            btc_read_exact(fd, ph[i].p_offset, notes, ph[i].p_filesz))
            found = btc_note_build_id(notes, ph[i].p_filesz, out, max);
    free(notes);
    return found;
}

#define MAX_FILE_PHDRS 64

int btc_elf_file_build_id(int fd, uint8_t *out, int max)
{
    Elf64_Ehdr eh;
    Elf64_Phdr ph[MAX_FILE_PHDRS];
    int n = btc_elf_phdrs(fd, &eh, ph, MAX_FILE_PHDRS);
    if (n < 0)
        return -1;
    return (int)btc_elf_phdrs_build_id(fd, ph, n < MAX_FILE_PHDRS ? n : MAX_FILE_PHDRS, out,
                                       max > 0 ? (size_t)max : 0);
}

/* ---- a symbol by name ---- */

/* The defined symbol `name` in one table, whose names are in strings. */
static bool find_symbol(const btc_elf *e, uint32_t type, const btc_bytes *strings, const char *name, uint64_t *value)
{
    const Elf64_Shdr *tab = symbol_table(e, type);
    btc_bytes raw;
    if (!tab || !strings->data || !read_section(e, tab, &raw))
        return false;
    bool found = false;
    for (size_t i = 0; !found && i < raw.size / sizeof(Elf64_Sym); i++) {
        Elf64_Sym s;
        memcpy(&s, raw.data + i * sizeof s, sizeof s);
        if (s.st_shndx != SHN_UNDEF && s.st_name < strings->size &&
            strcmp((const char *)strings->data + s.st_name, name) == 0) {
            *value = s.st_value;
            found = true;
        }
    }
    btc_bytes_free(&raw);
    return found;
}

int btc_elf_symbol_value(btc_elf *e, const char *name, uint64_t *value)
{
    if (!e || !name || !*name)
        return -1;
    return find_symbol(e, SHT_DYNSYM, &e->dynstr, name, value) || find_symbol(e, SHT_SYMTAB, &e->strtab, name, value)
               ? 0 : -1;
}
