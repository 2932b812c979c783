/* Preloaded after libtiershim.so, this library is the shim's "real" open,
 * open64, creat, fopen and fopen64: it acts on entry N of the index
 * $TIERING_INDEX at the instant the shim's open reaches libc, then opens.
 *   STATE_SLOT=N            prints "state-at-open=S" (S: the state word) to
 *                           stderr: shows that a truncating open invalidated
 *                           the file before the open itself;
 *   FLIP_SLOT=N FLIP_TIER=D when the path is under D (the shim is opening a
 *                           tier copy), marks the entry invalid first, as a
 *                           write open elsewhere could at that instant.
 * NOTE [linearizable redirect] in docs/design.md. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../../shim/tiering.h"

static uint32_t *state_word(const char *slot, void **base, size_t *size)
{
    const char *index = getenv("TIERING_INDEX");
    int fd = index ? (int)syscall(SYS_openat, AT_FDCWD, index, O_RDWR | O_CLOEXEC) : -1;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        abort();
    *size = (size_t)st.st_size;
    *base = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    syscall(SYS_close, fd);
    if (*base == MAP_FAILED)
        abort();
    return &tiering_entries(*base)[atoi(slot)].state;
}

static void act(const char *path)
{
    const char *report = getenv("STATE_SLOT"), *flip = getenv("FLIP_SLOT"), *tier = getenv("FLIP_TIER");
    void *base;
    size_t size;
    if (report) {
        uint32_t *s = state_word(report, &base, &size);
        dprintf(2, "state-at-open=%u\n", __atomic_load_n(s, __ATOMIC_SEQ_CST));
        munmap(base, size);
    }
    if (flip && tier && strncmp(path, tier, strlen(tier)) == 0) {
        uint32_t *s = state_word(flip, &base, &size);
        __atomic_store_n(s, TIERING_STATE_INVALID, __ATOMIC_SEQ_CST);
        munmap(base, size);
    }
}

#define OPEN_LIKE(name)                                                      \
    int name(const char *path, int flags, ...)                               \
    {                                                                        \
        va_list ap;                                                          \
        va_start(ap, flags);                                                 \
        mode_t mode = (mode_t)va_arg(ap, int);                               \
        va_end(ap);                                                          \
        act(path);                                                           \
        int (*next)(const char *, int, ...) = dlsym(RTLD_NEXT, #name);       \
        return next(path, flags, mode);                                      \
    }

#define FOPEN_LIKE(name)                                                     \
    FILE *name(const char *path, const char *mode)                           \
    {                                                                        \
        act(path);                                                           \
        FILE *(*next)(const char *, const char *) = dlsym(RTLD_NEXT, #name); \
        return next(path, mode);                                             \
    }

OPEN_LIKE(open)
OPEN_LIKE(open64)
FOPEN_LIKE(fopen)
FOPEN_LIKE(fopen64)

int creat(const char *path, mode_t mode)
{
    act(path);
    int (*next)(const char *, mode_t) = dlsym(RTLD_NEXT, "creat");
    return next(path, mode);
}
