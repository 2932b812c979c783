/*
 * tierscan.c - the catalog scan's listing and stat of one directory, in C
 * (NOTE [scan in C], docs/design.md).  Part of libtiershim.so, called by the
 * scan (tiering/catalog/scan.py) through cffi with the GIL released; never
 * reached by the interposed functions.
 *
 * System calls only (syscall(2)), as in tiercopy.c: the library also
 * interposes open and stat, and a scan that runs under another job's
 * LD_PRELOAD must see the real tree.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tiering.h"

#define EXPORT __attribute__((visibility("default")))
#define DENTS (64u << 10)    /* bytes of directory entries per getdents64 */

struct dirent64_raw {        /* what getdents64 returns, entry by entry */
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

static int open_dir(const char *path)
{
    return (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

/* Appends n bytes to a growing buffer; -1 when memory runs out. */
static int append(char **buf, uint64_t *len, uint64_t *cap, const void *src, uint64_t n)
{
    if (*len + n > *cap) {
        uint64_t want = *cap ? *cap * 2 : 4096;
        while (want < *len + n)
            want *= 2;
        char *p = realloc(*buf, want);
        if (!p)
            return -1;
        *buf = p;
        *cap = want;
    }
    memcpy(*buf + *len, src, n);
    *len += n;
    return 0;
}

EXPORT void tiering_scan_list_free(struct tiering_scan_list *l)
{
    free(l->names);
    free(l->types);
    l->names = NULL;
    l->types = NULL;
    l->bytes = l->count = 0;
}

struct named {
    const char *name;
    uint8_t type;
};

static int by_name(const void *a, const void *b)
{
    /* strcmp compares unsigned bytes: UTF-8's code point order */
    return strcmp(((const struct named *)a)->name, ((const struct named *)b)->name);
}

/* Puts a listing in name order (byte order), names and types together; -1
 * when memory runs out (the listing is left as it was). */
static int sort_list(struct tiering_scan_list *l)
{
    if (l->count < 2)
        return 0;
    struct named *at = malloc(l->count * sizeof *at);
    char *names = malloc(l->bytes);
    int err = !at || !names;
    if (!err) {
        const char *p = l->names;
        for (uint64_t k = 0; k < l->count; k++, p += strlen(p) + 1)
            at[k] = (struct named){p, l->types[k]};
        qsort(at, l->count, sizeof *at, by_name);
        char *q = names;
        for (uint64_t k = 0; k < l->count; k++) {
            size_t n = strlen(at[k].name) + 1;
            memcpy(q, at[k].name, n);
            q += n;
            l->types[k] = at[k].type;
        }
        free(l->names);
        l->names = names;
        names = NULL;
    }
    free(at);
    free(names);
    return err ? -1 : 0;
}

EXPORT int tiering_scan_list(const char *dir, struct tiering_scan_list *out)
{
    uint64_t ncap = 0, tcap = 0;
    memset(out, 0, sizeof *out);
    int fd = open_dir(dir);
    if (fd < 0)
        return errno;
    char *dents = malloc(DENTS);
    int err = dents ? 0 : ENOMEM;
    for (long got; !err && (got = syscall(SYS_getdents64, fd, dents, DENTS)) != 0;) {
        if (got < 0) {
            err = errno;
            break;
        }
        for (long at = 0; at < got && !err;) {
            struct dirent64_raw *d = (struct dirent64_raw *)(dents + at);
            at += d->d_reclen;
            const char *name = d->d_name;
            if (name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0)))
                continue;
            if (append(&out->names, &out->bytes, &ncap, name, strlen(name) + 1) ||
                append((char **)&out->types, &out->count, &tcap, &d->d_type, 1))
                err = ENOMEM;
        }
    }
    free(dents);
    syscall(SYS_close, fd);
    if (!err && sort_list(out))
        err = ENOMEM;
    if (err)
        tiering_scan_list_free(out);
    return err;
}

EXPORT int tiering_scan_stat(const char *dir, const char *names, const uint8_t *types, uint64_t count,
                             struct tiering_scan_stat *out)
{
    memset(out, 0, count * sizeof *out);
    int fd = open_dir(dir);
    if (fd < 0)
        return errno;      /* every entry stays ok = 0: cannot be stat'ed */
    for (uint64_t k = 0; k < count; k++, names += strlen(names) + 1) {
        struct tiering_scan_stat *o = &out[k];
        struct stat st;
        int have = 0; /* st holds the entry's stat: the lstat of one that is no symlink */
        if (types[k] == DT_LNK)
            o->link = 1;
        else if (types[k] == DT_UNKNOWN && syscall(SYS_newfstatat, fd, names, &st, AT_SYMLINK_NOFOLLOW) == 0)
            have = !(o->link = S_ISLNK(st.st_mode));
        if (!have && syscall(SYS_newfstatat, fd, names, &st, 0) != 0)
            continue;
        o->ok = 1;
        o->size = st.st_size;
        o->mtime_ns = tiering_ns(st.st_mtim);
        o->atime_ns = tiering_ns(st.st_atim);
        o->ctime_ns = tiering_ns(st.st_ctim);
        o->blocks = st.st_blocks;
        o->blksize = st.st_blksize;
        o->dev = st.st_dev;
        o->ino = st.st_ino;
        o->nlink = st.st_nlink;
        o->mode = st.st_mode;
        o->uid = st.st_uid;
        o->gid = st.st_gid;
    }
    syscall(SYS_close, fd);
    return 0;
}

EXPORT int64_t tiering_scan_ascending(const uint8_t *blob, const int64_t *offsets, int64_t n)
{
    for (int64_t k = 0; k + 1 < n; k++) {
        uint64_t a = (uint64_t)(offsets[k + 1] - offsets[k]), b = (uint64_t)(offsets[k + 2] - offsets[k + 1]);
        int c = memcmp(blob + offsets[k], blob + offsets[k + 1], a < b ? a : b);
        if (c > 0 || (c == 0 && a >= b))
            return k;
    }
    return -1;
}
