/* The vDSO as a file.
 *
 * Samples land in the vDSO often (an event loop reads its clock all the
 * time: clock_gettime, gettimeofday), and the symbolizer names modules by
 * reading their files.  The vDSO has none, but the kernel maps its whole
 * image, section headers and .dynsym included, so a copy of the mapping is
 * an ELF file the reader takes as any other.  The copy goes into an
 * anonymous file (memfd_create): nothing is written to disk, nothing is
 * left behind, and a fork child holds the same (its vDSO is the same).
 * The mapping is found in /proc/self/maps (its exact bounds) and copied
 * with process_vm_readv, which fails rather than faults if it were ever
 * unmapped; where either is missing (qemu-user has no vDSO for its guest)
 * the vDSO stays unnamed, as before. */
#include <stdlib.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "capture/context.h"
#include "symbols/vdso.h"

/* x86-64's image is two pages, aarch64's about the same: a bigger one is not the vDSO. */
#define MAX_IMAGE ((size_t)1 << 20)

static int image_fd = -1;
static struct stat image;   /* the memfd's identity: a program may close every descriptor (a daemon does) */
static bool tried;

bool btc_vdso_holds(uintptr_t lo, uintptr_t hi)
{
    uintptr_t at = (uintptr_t)getauxval(AT_SYSINFO_EHDR);
    return at && lo <= at && at < hi;
}

static bool write_all(int fd, const unsigned char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

static int copy_image(void)
{
    uintptr_t at = (uintptr_t)getauxval(AT_SYSINFO_EHDR), lo, hi;
    if (!at || !btc_mapping_readable(at, &lo, &hi) || lo != at || hi - lo > MAX_IMAGE)
        return -1;
    size_t n = hi - lo;
    unsigned char *image = malloc(n);
    struct iovec local = {image, n}, remote = {(void *)lo, n};
    int fd = -1;
    if (image && process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)n)
        fd = memfd_create("btcore-vdso", MFD_CLOEXEC);
    if (fd >= 0 && !write_all(fd, image, n)) {
        close(fd);
        fd = -1;
    }
    free(image);
    return fd;
}

/* Is image_fd still the copy made (not closed, nor its number reused for another file)? */
static bool still_ours(void)
{
    struct stat now;
    return fstat(image_fd, &now) == 0 && now.st_dev == image.st_dev && now.st_ino == image.st_ino;
}

int btc_vdso_fd(void)
{
    if (image_fd >= 0 && !still_ours()) {
        image_fd = -1;   /* not closed here: the number is someone else's now */
        tried = false;
    }
    if (!tried) {
        tried = true;
        image_fd = copy_image();
        if (image_fd >= 0 && fstat(image_fd, &image) != 0) {
            close(image_fd);
            image_fd = -1;
        }
    }
    return image_fd;
}
