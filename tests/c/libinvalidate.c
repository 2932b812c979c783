/* Preloaded after libtiershim.so, this library is the shim's "real" open,
 * open64, fopen and fopen64.  When the path starts with $FLIP_TIER (the shim
 * is opening a tier copy) it first marks entry $FLIP_SLOT of the index
 * $TIERING_INDEX invalid, as a write open in another process could at that
 * instant, then opens the path.  Deterministic test of the re-check that
 * follows the copy's open (NOTE [linearizable redirect]). */
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

static void flip(const char *path)
{
    const char *tier = getenv("FLIP_TIER"), *slot = getenv("FLIP_SLOT"), *index = getenv("TIERING_INDEX");
    if (!tier || !slot || !index || strncmp(path, tier, strlen(tier)) != 0)
        return;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, index, O_RDWR | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        abort();
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    syscall(SYS_close, fd);
    if (base == MAP_FAILED)
        abort();
    __atomic_store_n(&tiering_entries(base)[atoi(slot)].state, TIERING_STATE_INVALID, __ATOMIC_SEQ_CST);
    munmap(base, (size_t)st.st_size);
}

#define OPEN_LIKE(name)                                                      \
    int name(const char *path, int flags, ...)                               \
    {                                                                        \
        va_list ap;                                                          \
        va_start(ap, flags);                                                 \
        mode_t mode = (mode_t)va_arg(ap, int);                               \
        va_end(ap);                                                          \
        flip(path);                                                          \
        int (*next)(const char *, int, ...) = dlsym(RTLD_NEXT, #name);       \
        return next(path, flags, mode);                                      \
    }

#define FOPEN_LIKE(name)                                                     \
    FILE *name(const char *path, const char *mode)                           \
    {                                                                        \
        flip(path);                                                          \
        FILE *(*next)(const char *, const char *) = dlsym(RTLD_NEXT, #name); \
        return next(path, mode);                                             \
    }

OPEN_LIKE(open)
OPEN_LIKE(open64)
FOPEN_LIKE(fopen)
FOPEN_LIKE(fopen64)
