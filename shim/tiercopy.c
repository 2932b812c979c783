/*
 * tiercopy.c - the daemon's copy of one data-set file onto a tier, in C
 * (NOTE [copy in C], docs/design.md).  Part of libtiershim.so, called by the
 * daemon through cffi with the GIL released; never reached by the
 * interposed functions.
 *
 * System calls only (syscall(2)): the library also interposes open, close and
 * stat, and a daemon that runs under another job's LD_PRELOAD must read the
 * real source, never a redirected copy.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tiering.h"

#define EXPORT __attribute__((visibility("default")))
#define STEP (8u << 20)      /* bytes per system call, and between progress calls */
#define BOUNCE (1u << 20)    /* buffer of the read/write fallback */

enum { VIA_RANGE, VIA_SENDFILE, VIA_BUFFER };

static long sys_close(int fd) { return syscall(SYS_close, fd); }
static long sys_fstat(int fd, struct stat *st) { return syscall(SYS_newfstatat, fd, "", st, AT_EMPTY_PATH); }

/* One step of at most want bytes from in at offset at to the same offset of
 * out; *via falls back to *fallback when the file systems cannot copy a
 * range (sendfile writes at out's file position: only for a copy that
 * starts at 0 on an fd of its own; the others use pread and pwrite). */
static ssize_t step(int in, int out, uint64_t at, size_t want, int *via, int fallback, char **buf)
{
    for (;;) {
        if (*via == VIA_RANGE) {
            loff_t oi = (loff_t)at, oo = (loff_t)at;
            ssize_t n = syscall(SYS_copy_file_range, in, &oi, out, &oo, want, 0);
            if (n >= 0 || (errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP))
                return n;
            *via = at == 0 ? fallback : VIA_BUFFER;
        } else if (*via == VIA_SENDFILE) {
            off_t oi = (off_t)at;
            ssize_t n = syscall(SYS_sendfile, out, in, &oi, want);
            if (n >= 0 || (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP))
                return n;
            *via = VIA_BUFFER;
        } else {
            if (!*buf && !(*buf = malloc(BOUNCE)))
                return -1;
            ssize_t n = syscall(SYS_pread64, in, *buf, want < BOUNCE ? want : BOUNCE, (off_t)at);
            for (ssize_t w = 0; n > 0 && w < n;) {
                ssize_t k = syscall(SYS_pwrite64, out, *buf + w, (size_t)(n - w), (off_t)(at + w));
                if (k < 0)
                    return -1;
                w += k;
            }
            return n;
        }
    }
}

/* via_io: where the way to copy starts and is left for the next copy
 * between the same file systems (NULL: copy_file_range first).  A whole
 * file is asked for size + 1 bytes and read until a step returns 0: the
 * extra read sees bytes beyond a size the fstat may not show yet (cached
 * attributes of a network or FUSE file system). */
static int64_t copy_range(int in, int out, uint64_t off, uint64_t len, tiering_progress_fn progress,
                          void *arg, int fallback, int *via_io)
{
    int via = via_io ? *via_io : VIA_RANGE;
    char *buf = NULL;
    uint64_t done = 0;
    int64_t r = 0;
    while (done < len) {
        size_t want = len - done < STEP ? (size_t)(len - done) : STEP;
        ssize_t n = step(in, out, off + done, want, &via, fallback, &buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = -1;
            break;
        }
        if (n == 0)
            break;
        done += (uint64_t)n;
        if (progress && progress(arg, (uint64_t)n)) {
            r = -2;
            break;
        }
    }
    int saved = errno;
    free(buf);
    if (via_io)
        *via_io = via;
    errno = saved;
    return r < 0 ? r : (int64_t)done;
}

/* Copies [off, off + len) of in to the same offsets of out, or less at end
 * of file; progress(arg, n) after each step, which stops the copy by
 * returning non-zero.  Returns the bytes copied, -1 (errno) on error, -2 when
 * stopped.  Threads may copy ranges of one file into one fd at once. */
EXPORT int64_t tiering_copy_range(int in, int out, uint64_t off, uint64_t len,
                                  tiering_progress_fn progress, void *arg)
{
    return copy_range(in, out, off, len, progress, arg, VIA_BUFFER, NULL);
}

/* The source is the regular file of the catalog: same size and mtime (st:
 * its fstat); its identity is kept in c (dev, ino). */
static int check_source(int fd, struct tiering_copy *c, struct stat *st)
{
    if (sys_fstat(fd, st) < 0)
        return TIERING_COPY_SOURCE_ERROR;
    if (!S_ISREG(st->st_mode))
        return TIERING_COPY_NOT_REGULAR;
    if ((uint64_t)st->st_size != c->size || tiering_ns(st->st_mtim) != c->mtime_ns)
        return TIERING_COPY_CHANGED;
    c->dev = (uint64_t)st->st_dev;
    c->ino = (uint64_t)st->st_ino;
    return TIERING_COPY_OK;
}

/* NOTE [renamed while copied]: the source's path (relative to at) still
 * names the file that was copied: not renamed over, nor removed, meanwhile.
 * One stat of the path, following a symlink only where the open did. */
static int same_path(int at, const char *src, const struct tiering_copy *c)
{
    struct stat st;
    if (syscall(SYS_newfstatat, at, src, &st, c->follow ? 0 : AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT || errno == ENOTDIR ? TIERING_COPY_REPLACED : TIERING_COPY_SOURCE_ERROR;
    return (uint64_t)st.st_dev == c->dev && (uint64_t)st.st_ino == c->ino ? TIERING_COPY_OK : TIERING_COPY_REPLACED;
}

/* NOTE [served descriptors]: after the copy, the source's fstat against the
 * file's record: when they agree on everything a stat shows but the access
 * time (which reading changes), the record may answer the fstat of a
 * descriptor served from the copy.  Set or cleared before the copy is
 * published (the daemon's state word is stored after this returns). */
static void verify_record(struct tiering_file *rec, const struct stat *st)
{
    if (!rec)
        return;
    uint32_t flags = __atomic_load_n(&rec->flags, __ATOMIC_ACQUIRE);
    int same = (flags & TIERING_FILE_COMPLETE) && rec->ino && rec->ino == (uint64_t)st->st_ino &&
               (uint64_t)rec->dev == (uint64_t)st->st_dev && rec->mode == st->st_mode &&
               rec->uid == st->st_uid && rec->gid == st->st_gid && rec->nlink == st->st_nlink &&
               rec->mtime_ns == tiering_ns(st->st_mtim) && rec->ctime_ns == tiering_ns(st->st_ctim) &&
               rec->blocks == (int64_t)st->st_blocks && rec->blksize == (uint32_t)st->st_blksize;
    if (same)
        __atomic_fetch_or(&rec->flags, TIERING_FILE_VERIFIED, __ATOMIC_RELEASE);
    else if (flags & TIERING_FILE_VERIFIED)
        __atomic_fetch_and(&rec->flags, ~(uint32_t)TIERING_FILE_VERIFIED, __ATOMIC_RELEASE);
}

/* NOTE [staging files]: the one way a copy's staging file is made, for the
 * daemon's copies and the peer tier's: write-only, O_EXCL, never through a
 * symlink, close-on-exec, mode 0400 (written only through this fd: a copy
 * is read-only from its start); one left by an earlier copy under the same
 * name is removed first.  The fd, or -errno (-ENOENT: the staging
 * directory is gone). */
EXPORT int tiering_staging_create(int staging_fd, const char *name)
{
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    int out = (int)syscall(SYS_openat, staging_fd, name, flags, 0400);
    if (out < 0 && errno == EEXIST) { /* left by an earlier copy of this thread */
        syscall(SYS_unlinkat, staging_fd, name, 0);
        out = (int)syscall(SYS_openat, staging_fd, name, flags, 0400);
    }
    return out < 0 ? -errno : out;
}

/* Opens src (O_NOFOLLOW unless c->follow, O_NONBLOCK so a fifo cannot
 * block), checks it against c->size and c->mtime_ns and creates the new
 * staging file name in staging_fd (O_EXCL; one left by an earlier copy is
 * replaced): c->fd_in and c->fd_out on TIERING_COPY_OK, nothing left open else.
 * src is relative to the directory fd at (AT_FDCWD: the current directory). */
static int copy_open(int at, const char *src, int staging_fd, const char *name, struct tiering_copy *c)
{
    c->error = 0;
    c->copied = 0;
    c->blocks = 0;
    c->fd_in = c->fd_out = -1;
    int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | (c->follow ? 0 : O_NOFOLLOW);
    int in = (int)syscall(SYS_openat, at, src, flags);
    if (in < 0) {
        c->error = errno;
        return errno == ELOOP || errno == ENXIO ? TIERING_COPY_NOT_REGULAR : TIERING_COPY_SOURCE_ERROR;
    }
    struct stat st;
    int r = check_source(in, c, &st);
    if (r != TIERING_COPY_OK) {
        c->error = errno;
        sys_close(in);
        return r;
    }
    syscall(SYS_fcntl, in, F_SETFL, O_RDONLY); /* blocking reads from here on */
    int out = tiering_staging_create(staging_fd, name);
    if (out < 0) {
        c->error = -out;
        sys_close(in);
        return out == -ENOENT ? TIERING_COPY_NO_STAGING : TIERING_COPY_TARGET_ERROR;
    }
    c->fd_in = in;
    c->fd_out = out;
    c->source_blocks = (int64_t)st.st_blocks;
    return TIERING_COPY_OK;
}

/* NOTE [sparse copies]: the data extents of a sparse source (SEEK_DATA,
 * SEEK_HOLE) copied to the same offsets, the holes left holes and the size
 * set; then one byte past the size is tried, as a whole copy reads size + 1
 * (growth).  The bytes copied (size + 1: it grew), -1 (errno), -2 stopped,
 * -3 when the file system cannot tell its extents (then a whole copy). */
static int64_t copy_extents(int in, int out, uint64_t size, tiering_progress_fn progress, void *arg)
{
    uint64_t off = 0;
    while (off < size) {
        off_t d = (off_t)syscall(SYS_lseek, in, (off_t)off, SEEK_DATA);
        if (d < 0 && errno == ENXIO)
            break; /* a hole to the end */
        off_t h = d < 0 ? -1 : (off_t)syscall(SYS_lseek, in, d, SEEK_HOLE);
        if (h < 0)
            return off == 0 ? -3 : -1;
        if ((uint64_t)h > size)
            h = (off_t)size;
        int64_t n = (uint64_t)d < size ? copy_range(in, out, (uint64_t)d, (uint64_t)(h - d), progress, arg, VIA_BUFFER, NULL) : 0;
        if (n < 0)
            return n;
        if (n < h - d)
            return (int64_t)d + n; /* shrank: the size check says so */
        off = (uint64_t)h;
    }
    if (syscall(SYS_ftruncate, out, (off_t)size) < 0)
        return -1;
    char b;
    ssize_t more = syscall(SYS_pread64, in, &b, 1, (off_t)size);
    return more < 0 ? -1 : (int64_t)size + (more > 0);
}

/* A whole source into the staging file: at most size + 1 bytes in one
 * range, or a sparse one's extents (copy_extents). */
static int64_t copy_whole(struct tiering_copy *c, tiering_progress_fn progress, void *arg, int *via_io)
{
    if ((uint64_t)c->source_blocks * 512 < c->size) {
        int64_t n = copy_extents(c->fd_in, c->fd_out, c->size, progress, arg);
        if (n != -3)
            return n;
    }
    return copy_range(c->fd_in, c->fd_out, 0, c->size + 1, progress, arg, VIA_SENDFILE, via_io);
}

/* After the copy of `copied` bytes (at most size + 1 were tried; -1: failed,
 * errno in c->error; -2: stopped): checks the size and the source again
 * (its fd, and that its path src, relative to at, still names it), closes
 * both fds and renames the staging file (read-only since made) to leaf in
 * dst_fd.  Anything but TIERING_COPY_OK removes the staging file. */
static int copy_finish(struct tiering_copy *c, int64_t copied, int at, const char *src, int staging_fd,
                       const char *name, int dst_fd, const char *leaf)
{
    struct stat st, source = {0};
    int r;
    if (copied == -1) {
        r = TIERING_COPY_IO_ERROR;
    } else if (copied == -2) {
        r = TIERING_COPY_STOPPED;
    } else {
        c->copied = (uint64_t)copied;
        if ((uint64_t)copied != c->size)
            r = (uint64_t)copied > c->size ? TIERING_COPY_GREW : TIERING_COPY_SHRANK;
        else if ((r = check_source(c->fd_in, c, &source)) != TIERING_COPY_OK ||
                 (r = same_path(at, src, c)) != TIERING_COPY_OK)
            c->error = errno;
        else if (sys_fstat(c->fd_out, &st) < 0)
            r = TIERING_COPY_TARGET_ERROR, c->error = errno;
        else
            c->blocks = (int64_t)st.st_blocks;
    }
    sys_close(c->fd_in);
    if (sys_close(c->fd_out) < 0 && r == TIERING_COPY_OK)
        r = TIERING_COPY_TARGET_ERROR, c->error = errno;
    c->fd_in = c->fd_out = -1;
    if (r == TIERING_COPY_OK && dst_fd >= 0 && syscall(SYS_renameat2, staging_fd, name, dst_fd, leaf, 0) < 0)
        r = TIERING_COPY_TARGET_ERROR, c->error = errno;
    if (r == TIERING_COPY_OK)
        verify_record(c->record, &source);
    if (r != TIERING_COPY_OK)
        syscall(SYS_unlinkat, staging_fd, name, 0);
    return r;
}

EXPORT int tiering_copy_open(const char *src, int staging_fd, const char *name, struct tiering_copy *c)
{
    return copy_open(AT_FDCWD, src, staging_fd, name, c);
}

EXPORT int tiering_copy_finish(struct tiering_copy *c, int64_t copied, const char *src, int staging_fd,
                               const char *name, int dst_fd, const char *leaf)
{
    return copy_finish(c, copied, AT_FDCWD, src, staging_fd, name, dst_fd, leaf);
}

/* NOTE [copy in C]: copy_open, the copy of at most size + 1 bytes in one
 * range, copy_finish.  Anything but TIERING_COPY_OK leaves no staging file
 * behind; c->error holds errno for the *_ERROR results, c->copied the bytes
 * read and c->blocks the copy's st_blocks. */
EXPORT int tiering_copy_file(const char *src, int staging_fd, const char *name, int dst_fd,
                             const char *leaf, struct tiering_copy *c, tiering_progress_fn progress,
                             void *arg)
{
    int r = copy_open(AT_FDCWD, src, staging_fd, name, c);
    if (r != TIERING_COPY_OK)
        return r;
    int64_t n = copy_whole(c, progress, arg, NULL);
    if (n == -1)
        c->error = errno;
    return copy_finish(c, n, AT_FDCWD, src, staging_fd, name, dst_fd, leaf);
}

/* NOTE [batch copy]: the directory data/<root id>/<parent of rel> of a
 * batch's file, made (0700, whatever the umask) and opened one component
 * at a time with O_NOFOLLOW, as TierDirs does: a symlink in the tier is
 * never followed.  The batch keeps the last one open (files of one
 * directory often follow each other); -1 with errno set on failure.  The
 * sources are opened relative to their data root, which the batch opens
 * once (O_PATH): the root's own path is not looked up again per file. */
struct parent_cache {
    char key[PATH_MAX];
    size_t len;
    int fd;
    int root_fd[TIERING_MAX_ROOTS];   /* data/<root id> */
    int via[TIERING_MAX_ROOTS];       /* how the last copy from that root went (copy_range) */
    int src_fd[TIERING_MAX_ROOTS];    /* the data root (-1: not opened yet; -2: could not be: paths in full) */
};

static int open_component(int at, const char *name)
{
    const int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    int fd = (int)syscall(SYS_openat, at, name, flags);
    if (fd >= 0 || errno != ENOENT)
        return fd;
    int made = syscall(SYS_mkdirat, at, name, 0700) == 0;
    if (!made && errno != EEXIST)
        return -1;
    fd = (int)syscall(SYS_openat, at, name, flags);
    if (fd >= 0 && made)
        syscall(SYS_fchmod, fd, 0700);
    return fd;
}

/* key: "<root id>" or "<root id>/<parent>" (root < TIERING_MAX_ROOTS). */
static int parent_fd(int data_fd, int root, const char *key, size_t len, struct parent_cache *pc)
{
    if (pc->fd >= 0 && pc->len == len && memcmp(pc->key, key, len) == 0)
        return pc->fd;
    if (pc->root_fd[root] < 0) {
        char name[16];
        snprintf(name, sizeof name, "%d", root);
        if ((pc->root_fd[root] = open_component(data_fd, name)) < 0)
            return -1;
    }
    const char *slash = memchr(key, '/', len);
    if (!slash)
        return pc->root_fd[root];
    if (pc->fd >= 0)
        sys_close(pc->fd);
    pc->fd = -1;
    char part[PATH_MAX];
    size_t rest = len - (size_t)(slash + 1 - key);
    memcpy(part, slash + 1, rest);
    part[rest] = 0;
    int at = pc->root_fd[root];
    for (char *name = part, *next; name; name = next) {
        if ((next = strchr(name, '/')))
            *next++ = 0;
        int fd = open_component(at, name);
        if (at != pc->root_fd[root])
            sys_close(at);
        if (fd < 0)
            return -1;
        at = fd;
    }
    memcpy(pc->key, key, len);
    pc->len = len;
    return pc->fd = at;
}

static int stop_flag(void *arg, uint64_t n)
{
    (void)n;
    return __atomic_load_n((const int32_t *)arg, __ATOMIC_RELAXED) != 0;
}

/* One file of a batch: its source path and destination built from the
 * catalog's columns, then tiering_copy_file's steps. */
static int copy_one(const struct tiering_batch *b, struct tiering_batch_file *f, struct parent_cache *pc)
{
    struct tiering_copy c = {0};
    int64_t id = f->id;
    const char *rel = (const char *)b->paths + b->offsets[id];
    size_t rel_len = (size_t)(b->offsets[id + 1] - b->offsets[id]);
    int32_t root = b->root[id];
    c.size = (uint64_t)b->size[id];
    c.mtime_ns = b->mtime_ns[id];
    c.follow = b->link[id] != 0;
    c.record = b->records ? &b->records[id] : NULL;
    f->copied = 0;
    f->blocks = 0;
    f->error = 0;
    if (root < 0 || root >= b->nroots || root >= TIERING_MAX_ROOTS) {
        f->error = EINVAL;
        return TIERING_COPY_SOURCE_ERROR;
    }
    /* source: root + "/" + rel; key: "<root id>/<parent>"; leaf: after the last "/" */
    char src[PATH_MAX], key[PATH_MAX];
    size_t root_len = strlen(b->roots[root]);
    int sep = root_len > 0 && b->roots[root][root_len - 1] != '/';
    const char *last = memrchr(rel, '/', rel_len);
    size_t leaf_at = last ? (size_t)(last - rel) + 1 : 0;
    int key_len = snprintf(key, sizeof key, "%d%s%.*s", (int)root, last ? "/" : "",
                           (int)(last ? leaf_at - 1 : 0), rel);
    if (root_len + 1 + rel_len >= sizeof src || key_len < 0 || (size_t)key_len >= sizeof key
        || rel_len == leaf_at) {
        f->error = ENAMETOOLONG;
        return TIERING_COPY_SOURCE_ERROR;
    }
    memcpy(src, b->roots[root], root_len);
    if (sep)
        src[root_len++] = '/';
    memcpy(src + root_len, rel, rel_len);
    src[root_len + rel_len] = 0;
    const char *leaf = src + root_len + leaf_at;
    if (pc->src_fd[root] == -1) {
        int fd = (int)syscall(SYS_openat, AT_FDCWD, b->roots[root], O_PATH | O_DIRECTORY | O_CLOEXEC);
        pc->src_fd[root] = fd < 0 ? -2 : fd;
    }
    int relative = pc->src_fd[root] >= 0 && rel[0] != '/';   /* rel_len > 0: checked above */
    int at = relative ? pc->src_fd[root] : AT_FDCWD;
    const char *from = relative ? src + root_len : src;
    int r = copy_open(at, from, b->staging_fd, b->name, &c);
    if (r == TIERING_COPY_OK) {
        tiering_progress_fn progress = b->progress ? b->progress : stop_flag;
        void *arg = b->progress ? b->arg : (void *)b->stop;
        int64_t n = copy_whole(&c, progress, arg, &pc->via[root]);
        if (n == -1)
            c.error = errno;
        int dst = n >= 0 ? parent_fd(b->data_fd, root, key, (size_t)key_len, pc) : -1;
        if (n >= 0 && dst < 0) {
            int e = errno;
            copy_finish(&c, -2, at, from, b->staging_fd, b->name, -1, "");
            c.error = e;
            r = TIERING_COPY_TARGET_ERROR;
        } else {
            r = copy_finish(&c, n, at, from, b->staging_fd, b->name, dst, leaf);
        }
    }
    f->error = c.error;
    f->copied = (int64_t)c.copied;
    f->blocks = c.blocks;
    return r;
}

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return tiering_ns(t);
}

/* The calling thread's voluntary context switches so far (-1: unknown):
 * copies that wait for their PFS are told from copies that only wait for
 * the CPU (NOTE [batch share]). */
static int64_t voluntary_switches(void)
{
    struct rusage ru;
    return syscall(SYS_getrusage, RUSAGE_THREAD, &ru) == 0 ? (int64_t)ru.ru_nvcsw : -1;
}

/* Claims file f for its copy (NOTE [one read per file], docs/design.md):
 * NONE or QUEUED | claim -> COPYING | claim, then the open counter compared with the one it
 * had when queued.  The order is what makes one of the two sides see the
 * other: an open adds to the counter before it loads the state word, the
 * claim stores the state word before it loads the counter (both
 * sequentially consistent), so an open that did not see the claim is seen
 * by it.  TIERING_COPY_OK: claimed. */
static int claim(const struct tiering_batch *b, const struct tiering_batch_file *f)
{
    struct tiering_entry *e = &b->entries[b->slots[f->id]];
    uint32_t was = TIERING_STATE_QUEUED | b->claim; /* marked by the daemon: NOTE [queued copies] */
    if (!__atomic_compare_exchange_n(&e->state, &was, TIERING_STATE_COPYING | b->claim, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST)) {
        uint32_t none = TIERING_STATE_NONE;
        if (!__atomic_compare_exchange_n(&e->state, &none, TIERING_STATE_COPYING | b->claim, 0,
                                         __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            return TIERING_COPY_TAKEN;
    }
    if (__atomic_load_n(&e->opens, __ATOMIC_SEQ_CST) != f->opens) {
        uint32_t mine = TIERING_STATE_COPYING | b->claim;
        __atomic_compare_exchange_n(&e->state, &mine, TIERING_STATE_NONE, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        tiering_wake(&e->state);
        return TIERING_COPY_READ;
    }
    return TIERING_COPY_OK;
}

/* Ends a claimed copy: published (COPYING -> claim) when complete, else
 * back to NONE; the waiting opens woken.  A write open that invalidated the
 * file meanwhile wins: its state stays INVALID and the copy is not
 * published (the daemon removes it).  1: published. */
static int unclaim(const struct tiering_batch *b, const struct tiering_batch_file *f, int complete)
{
    struct tiering_entry *e = &b->entries[b->slots[f->id]];
    uint32_t mine = TIERING_STATE_COPYING | b->claim;
    int done = __atomic_compare_exchange_n(&e->state, &mine, complete ? b->claim : TIERING_STATE_NONE, 0,
                                           __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    tiering_wake(&e->state);
    return done && complete;
}

EXPORT int64_t tiering_copy_batch(struct tiering_batch *b, struct tiering_batch_file *files, int64_t n)
{
    struct parent_cache pc = {.len = 0, .fd = -1};
    for (int r = 0; r < TIERING_MAX_ROOTS; r++)
        pc.root_fd[r] = -1, pc.via[r] = VIA_RANGE, pc.src_fd[r] = -1;
    int64_t end = b->budget_ns > 0 ? now_ns() + b->budget_ns : 0;
    int64_t waited = voluntary_switches();
    int64_t k = 0;
    while (k < n) {
        if (b->stop && __atomic_load_n(b->stop, __ATOMIC_RELAXED)) {
            for (int64_t j = k; j < n; j++)
                files[j].status = TIERING_COPY_STOPPED, files[j].error = 0, files[j].copied = files[j].blocks = 0;
            break;
        }
        files[k].published = 0;
        int r = b->entries ? claim(b, &files[k]) : TIERING_COPY_OK;
        if (r == TIERING_COPY_OK) {
            r = copy_one(b, &files[k], &pc);
            /* a stopped daemon may have unmapped the index meanwhile (a copy stuck
             * on a hung PFS that it gave up on): its entries are not touched again;
             * the index is disabled then, so no open waits on the claim left */
            if (b->entries && !(b->stop && __atomic_load_n(b->stop, __ATOMIC_SEQ_CST)))
                files[k].published = (uint32_t)unclaim(b, &files[k], r == TIERING_COPY_OK);
        } else {
            files[k].copied = files[k].blocks = 0, files[k].error = 0;
        }
        files[k].status = r;
        if (r == TIERING_COPY_NO_STAGING)
            break;
        k++;
        if (end && now_ns() >= end)
            break;
    }
    if (pc.fd >= 0)
        sys_close(pc.fd);
    for (int r = 0; r < TIERING_MAX_ROOTS; r++) {
        if (pc.root_fd[r] >= 0)
            sys_close(pc.root_fd[r]);
        if (pc.src_fd[r] >= 0)
            sys_close(pc.src_fd[r]);
    }
    b->waits = waited >= 0 ? voluntary_switches() - waited : -1;
    return k;
}
