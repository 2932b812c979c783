/* Preloaded after libtiershim.so, this library is the shim's "real" open,
 * open64, creat, fopen and fopen64.  Each call prints to stderr the state
 * word of entry $STATE_SLOT of the index $TIERING_INDEX as the call reaches
 * libc: "state-at-open=N".  Shows that a truncating open invalidated the
 * file before the open itself (NOTE [linearizable redirect]). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../../shim/tiering.h"

static void report(void)
{
    const char *slot = getenv("STATE_SLOT"), *index = getenv("TIERING_INDEX");
    if (!slot || !index)
        return;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, index, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        abort();
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    syscall(SYS_close, fd);
    if (base == MAP_FAILED)
        abort();
    dprintf(2, "state-at-open=%u\n",
            __atomic_load_n(&tiering_entries(base)[atoi(slot)].state, __ATOMIC_SEQ_CST));
    munmap(base, (size_t)st.st_size);
}

#define OPEN_LIKE(name)                                                      \
    int name(const char *path, int flags, ...)                               \
    {                                                                        \
        va_list ap;                                                          \
        va_start(ap, flags);                                                 \
        mode_t mode = (mode_t)va_arg(ap, int);                               \
        va_end(ap);                                                          \
        report();                                                            \
        int (*next)(const char *, int, ...) = dlsym(RTLD_NEXT, #name);       \
        return next(path, flags, mode);                                      \
    }

#define FOPEN_LIKE(name)                                                     \
    FILE *name(const char *path, const char *mode)                           \
    {                                                                        \
        report();                                                            \
        FILE *(*next)(const char *, const char *) = dlsym(RTLD_NEXT, #name); \
        return next(path, mode);                                             \
    }

OPEN_LIKE(open)
OPEN_LIKE(open64)
FOPEN_LIKE(fopen)
FOPEN_LIKE(fopen64)

int creat(const char *path, mode_t mode)
{
    report();
    int (*next)(const char *, mode_t) = dlsym(RTLD_NEXT, "creat");
    return next(path, mode);
}
