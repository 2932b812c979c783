/*
 * libtiershim.so - LD_PRELOAD interposer of tiering.
 *
 * Redirects read-only opens of catalogued data-set files to the copy that the
 * placement daemon published in a local tier, answers stat and access(F_OK)
 * of catalogued paths from what the scan recorded, and posts open/close
 * events to the shared ring.  Everything else passes straight to libc.
 *
 * Rules (docs/design.md): never block, never allocate or lock on the hot
 * path, keep no fd of our own open, fall back to the original path with errno
 * untouched on any failure, pass writes through and invalidate the file under
 * every path it has (NOTE [alias invalidation]), and so renames, unlinks and
 * truncates by path (NOTE [namespace changes]) and descriptors inherited open
 * for writing (NOTE [inherited writes]).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <dirent.h>
#include <grp.h>
#include <sys/file.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <sys/xattr.h>
#include <utime.h>

#include "tiering.h"

#define EXPORT __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#ifndef MAX_TRACKED_FDS
#define MAX_TRACKED_FDS 65536 /* the fd book's size (a test build makes it small) */
#endif

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* Flags with which a read-only open is never served from a tier copy: they
 * could behave differently on the copy (O_DIRECTORY, O_PATH, O_DIRECT, sync
 * flags, O_NOATIME, which fails on a file of another user), so the open
 * goes to the PFS.  O_NONBLOCK, O_NOCTTY and O_CLOEXEC change nothing for a
 * regular file; O_NOFOLLOW is served unless the catalogued path itself is a
 * symlink (route()). */
#define REDIRECT_DENY (O_DIRECTORY | O_PATH | O_DIRECT | O_TMPFILE | O_NOATIME | \
                       O_CREAT | O_EXCL | O_TRUNC | O_APPEND | O_SYNC | O_DSYNC | O_ASYNC)

/* ---- real functions ---------------------------------------------------- */

/* Every interposed symbol: name, return type, parameter types.  The table
 * gives the pointer types, the struct of real functions and the resolver. */
#define INTERPOSED(X)                                          \
    X(open, int, (const char *, int, ...))                     \
    X(open64, int, (const char *, int, ...))                   \
    X(openat, int, (int, const char *, int, ...))              \
    X(openat64, int, (int, const char *, int, ...))            \
    X(__open_2, int, (const char *, int))                      \
    X(__open64_2, int, (const char *, int))                    \
    X(__openat_2, int, (int, const char *, int))               \
    X(__openat64_2, int, (int, const char *, int))             \
    X(creat, int, (const char *, mode_t))                      \
    X(creat64, int, (const char *, mode_t))                    \
    X(fopen, FILE *, (const char *, const char *))             \
    X(fopen64, FILE *, (const char *, const char *))           \
    X(freopen, FILE *, (const char *, const char *, FILE *))   \
    X(freopen64, FILE *, (const char *, const char *, FILE *)) \
    X(close, int, (int))                                       \
    X(fclose, int, (FILE *))                                   \
    X(closedir, int, (DIR *))                                  \
    X(close_range, int, (unsigned int, unsigned int, int))     \
    X(dup, int, (int))                                         \
    X(dup2, int, (int, int))                                   \
    X(dup3, int, (int, int, int))                              \
    X(fcntl, int, (int, int, ...))                             \
    X(fcntl64, int, (int, int, ...))                           \
    NAMESPACE(X)                                               \
    METADATA(X)                                                \
    FD_OPERATIONS(X)                                           \
    CREDENTIALS(X)

/* NOTE [namespace changes]: calls that change what a path names, or a file
 * (its bytes, mode, owner, times, attributes) by its path, without opening
 * it: they invalidate what they reach. */
#define NAMESPACE(X)                                                      \
    X(rename, int, (const char *, const char *))                          \
    X(renameat, int, (int, const char *, int, const char *))              \
    X(renameat2, int, (int, const char *, int, const char *, unsigned int)) \
    X(unlink, int, (const char *))                                        \
    X(unlinkat, int, (int, const char *, int))                            \
    X(remove, int, (const char *))                                        \
    X(truncate, int, (const char *, off_t))                               \
    X(truncate64, int, (const char *, off64_t))                           \
    X(link, int, (const char *, const char *))                            \
    X(linkat, int, (int, const char *, int, const char *, int))           \
    X(chmod, int, (const char *, mode_t))                                 \
    X(fchmodat, int, (int, const char *, mode_t, int))                    \
    X(chown, int, (const char *, uid_t, gid_t))                           \
    X(lchown, int, (const char *, uid_t, gid_t))                          \
    X(utime, int, (const char *, const struct utimbuf *))                 \
    X(utimes, int, (const char *, const struct timeval *))                \
    X(lutimes, int, (const char *, const struct timeval *))               \
    X(futimesat, int, (int, const char *, const struct timeval *))        \
    X(setxattr, int, (const char *, const char *, const void *, size_t, int)) \
    X(lsetxattr, int, (const char *, const char *, const void *, size_t, int)) \
    X(removexattr, int, (const char *, const char *))                     \
    X(lremovexattr, int, (const char *, const char *))

/* NOTE [stat from the index]: the stat family and access, answered from the
 * index for catalogued paths (and for descriptors opened on a tier copy). */
#define METADATA(X)                                                        \
    X(stat, int, (const char *, struct stat *))                            \
    X(stat64, int, (const char *, struct stat64 *))                        \
    X(lstat, int, (const char *, struct stat *))                           \
    X(lstat64, int, (const char *, struct stat64 *))                       \
    X(fstat, int, (int, struct stat *))                                    \
    X(fstat64, int, (int, struct stat64 *))                                \
    X(fstatat, int, (int, const char *, struct stat *, int))               \
    X(fstatat64, int, (int, const char *, struct stat64 *, int))           \
    X(__xstat, int, (int, const char *, struct stat *))                    \
    X(__xstat64, int, (int, const char *, struct stat64 *))                \
    X(__lxstat, int, (int, const char *, struct stat *))                   \
    X(__lxstat64, int, (int, const char *, struct stat64 *))               \
    X(__fxstat, int, (int, int, struct stat *))                            \
    X(__fxstat64, int, (int, int, struct stat64 *))                        \
    X(__fxstatat, int, (int, int, const char *, struct stat *, int))       \
    X(__fxstatat64, int, (int, int, const char *, struct stat64 *, int))   \
    X(statx, int, (int, const char *, int, unsigned int, struct statx *))  \
    X(access, int, (const char *, int))                                    \
    X(faccessat, int, (int, const char *, int, int))                       \
    X(euidaccess, int, (const char *, int))                                \
    X(eaccess, int, (const char *, int))

/* NOTE [served descriptors]: operations on a descriptor that a tier copy
 * cannot stand for (locks, changes of mode, owner, times or extended
 * attributes, extended attributes read, the file system's figures): a
 * served descriptor is moved onto the data file first; the path forms of
 * the queries, given a path that names a copy (a descriptor's link), ask
 * about the data path. */
#define FD_OPERATIONS(X)                                                      \
    X(fchmod, int, (int, mode_t))                                             \
    X(fchown, int, (int, uid_t, gid_t))                                       \
    X(fchownat, int, (int, const char *, uid_t, gid_t, int))                  \
    X(futimens, int, (int, const struct timespec *))                          \
    X(futimes, int, (int, const struct timeval *))                            \
    X(utimensat, int, (int, const char *, const struct timespec *, int))      \
    X(fsetxattr, int, (int, const char *, const void *, size_t, int))         \
    X(fremovexattr, int, (int, const char *))                                 \
    X(fgetxattr, ssize_t, (int, const char *, void *, size_t))                \
    X(flistxattr, ssize_t, (int, char *, size_t))                             \
    X(flock, int, (int, int))                                                 \
    X(lockf, int, (int, int, off_t))                                          \
    X(lockf64, int, (int, int, off64_t))                                      \
    X(fstatfs, int, (int, struct statfs *))                                   \
    X(fstatfs64, int, (int, struct statfs64 *))                               \
    X(fstatvfs, int, (int, struct statvfs *))                                 \
    X(fstatvfs64, int, (int, struct statvfs64 *))                             \
    X(statfs, int, (const char *, struct statfs *))                           \
    X(statfs64, int, (const char *, struct statfs64 *))                       \
    X(statvfs, int, (const char *, struct statvfs *))                         \
    X(statvfs64, int, (const char *, struct statvfs64 *))                     \
    X(getxattr, ssize_t, (const char *, const char *, void *, size_t))        \
    X(listxattr, ssize_t, (const char *, char *, size_t))

/* Calls that change the process's credentials: afterwards it may no longer
 * reach what the scan reached, so it answers no stat from the index and is
 * served no copy (NOTE [served descriptors]). */
#define CREDENTIALS(X)                                      \
    X(setuid, int, (uid_t))                                 \
    X(setgid, int, (gid_t))                                 \
    X(seteuid, int, (uid_t))                                \
    X(setegid, int, (gid_t))                                \
    X(setreuid, int, (uid_t, uid_t))                        \
    X(setregid, int, (gid_t, gid_t))                        \
    X(setresuid, int, (uid_t, uid_t, uid_t))                \
    X(setresgid, int, (gid_t, gid_t, gid_t))                \
    X(setgroups, int, (size_t, const gid_t *))              \
    X(initgroups, int, (const char *, gid_t))               \
    X(setfsuid, int, (uid_t))                               \
    X(setfsgid, int, (gid_t))                               \
    X(capset, int, (void *, const void *))

#define POINTER_TYPE(name, ret, params) typedef ret(*name##_fn) params;
INTERPOSED(POINTER_TYPE)

#define FIELD(name, ret, params) name##_fn name;
static struct {
    INTERPOSED(FIELD)
} real;

enum which {
    W_OPEN, W_OPEN64, W_OPENAT, W_OPENAT64, W_OPEN_2, W_OPEN64_2, W_OPENAT_2,
    W_OPENAT64_2, W_CREAT, W_CREAT64
};

/* ---- state --------------------------------------------------------------- */

static struct tiering_header *idx;     /* NULL: pass everything through */
static struct tiering_entry *entries;
static struct tiering_file *files;
static uint32_t *idents;
static struct tiering_event *ring;
static uint32_t redirect_tiers;        /* 0 when a tier root failed its check */
static uint64_t slot_mask, ring_mask, nfiles;
static uint32_t my_pid;
static int debug;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static volatile int ready;
static __thread int in_init __attribute__((tls_model("initial-exec")));
/* NOTE [open tags]: the calling thread's tag, posted with its events */
static __thread uint32_t thread_tag __attribute__((tls_model("initial-exec")));
/* What each fd was opened on: slot + 1 of the catalogued file in the low 32
 * bits (0: none), tier + 1 above them when a tier copy was opened (0: the
 * PFS); see fd_book_value(). */
static uint64_t fd_book[MAX_TRACKED_FDS];
/* The process has the scan's credentials (NOTE [stat from the index]):
 * its real and effective ids and its groups are the scanner's; cleared for
 * good by a call that changes them. */
static int scanners_ids;

/* A wrapper whose libc function was not found and that has no one system
 * call to stand for it (it would change one thread only, or libc computes
 * the answer): ENOSYS. */
static int without_libc(void)
{
    errno = ENOSYS;
    return -1;
}

static void logmsg(const char *fmt, ...)
{
    if (!debug)
        return;
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "tiershim[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t ignored = syscall(SYS_write, 2, buf, (size_t)n);
    (void)ignored;
}

/* ---- fingerprint: 128-bit, 8 bytes at a time (murmur3-style mixing) ------ */

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t fmix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

EXPORT void tiering_fingerprint(uint32_t root, const char *s, size_t len, uint64_t out[2])
{
    const uint64_t c1 = 0x87c37b91114253d5ULL, c2 = 0x4cf5ad432745937fULL;
    uint64_t h1 = 0x9e3779b97f4a7c15ULL ^ root ^ ((uint64_t)len << 32);
    uint64_t h2 = 0xc2b2ae3d27d4eb4fULL + root + len;
    for (size_t i = 0; i < len; i += 8) {
        /* the next 8 bytes as a word, the last one zero-padded as a
         * little-endian load would; a constant-size memcpy is one load, a
         * variable-size one a call into libc */
        uint64_t w = 0;
        if (len - i >= 8)
            memcpy(&w, s + i, 8);
        else
            for (size_t j = len - i; j-- > 0;)
                w = (w << 8) | (unsigned char)s[i + j];
        uint64_t k1 = rotl(w * c1, 31) * c2, k2 = rotl(w * c2, 33) * c1;
        h1 = (rotl(h1 ^ k1, 27) + h2) * 5 + 0x52dce729;
        h2 = (rotl(h2 ^ k2, 31) + h1) * 5 + 0x38495ab5;
    }
    h1 += h2;
    h2 += h1;
    h1 = fmix(h1);
    h2 = fmix(h2);
    h1 += h2;
    h2 += h1;
    if (!h1 && !h2)
        h1 = 1; /* (0, 0) marks an empty slot */
    out[0] = h1;
    out[1] = h2;
}

/* ---- helpers for the daemon ----------------------------------------------- */

/* The tables of an index, as the daemon (at base) and the shim (its mapping)
 * both walk them: the identity lookup and the ring of a file's aliases are
 * written once, for both. */
struct table {
    struct tiering_entry *tab;
    const struct tiering_file *recs;
    const uint32_t *ids;
    uint64_t mask, nrecs;
};

static inline struct table table_of(void *base)
{
    struct tiering_header *h = base;
    return (struct table){tiering_entries(base), tiering_files(base), tiering_idents(base), h->nslots - 1, h->nfiles};
}

/* The next entry of the ring of slot s's file (complete or not: a record
 * being filled is linked in with a release after its own next_alias). */
static inline uint64_t ring_next(const struct table *t, uint64_t s)
{
    uint32_t f = t->tab[s].file;
    return f < t->nrecs ? __atomic_load_n(&t->recs[f].next_alias, __ATOMIC_ACQUIRE) & t->mask : s;
}

/* The entry of the file (dev, ino) whose record is complete, or -1. */
static int64_t find_identity(const struct table *t, uint32_t dev, uint64_t ino)
{
    uint64_t s = tiering_identity_hash(dev, ino) & t->mask;
    for (uint64_t n = 0; n <= t->mask; n++, s = (s + 1) & t->mask) {
        uint32_t v = __atomic_load_n(&t->ids[s], __ATOMIC_ACQUIRE);
        if (!v)
            return -1;
        uint64_t e = (v - 1) & t->mask;
        uint32_t f = t->tab[e].file;
        if (f < t->nrecs && (__atomic_load_n(&t->recs[f].flags, __ATOMIC_ACQUIRE) & TIERING_FILE_COMPLETE) &&
            t->recs[f].ino == ino && t->recs[f].dev == dev)
            return (int64_t)e;
    }
    return -1;
}

/* Marks the file of slot invalid under every path it has (sequentially
 * consistent: NOTE [linearizable redirect]); how many were not already. */
static int64_t invalidate_file(const struct table *t, uint64_t slot)
{
    int64_t changed = 0;
    uint64_t s = slot;
    for (uint64_t n = 0; n <= t->mask; n++) {
        uint32_t was = __atomic_exchange_n(&t->tab[s].state, TIERING_STATE_INVALID, __ATOMIC_SEQ_CST);
        if (was != TIERING_STATE_INVALID)
            changed++;
        if (was & TIERING_STATE_PENDING) /* opens waiting for its copy: the PFS now */
            tiering_wake(&t->tab[s].state);
        if ((s = ring_next(t, s)) == slot)
            break;
    }
    return changed;
}

/* Puts the entry in slot s into the identity table, or, when an entry of
 * the same file is there already, into that entry's ring of aliases.  The
 * stores that make it reachable are releases (after its record's identity
 * and next_alias), so a shim reading the table while an index written from
 * names first is filled sees whole records (NOTE [names first]). */
static void link_identity(void *base, uint64_t s)
{
    struct tiering_entry *tab = tiering_entries(base);
    struct tiering_file *recs = tiering_files(base), *f = &recs[tab[s].file];
    uint32_t *ids = tiering_idents(base);
    uint64_t mask = ((struct tiering_header *)base)->nslots - 1;
    for (uint64_t k = tiering_identity_hash(f->dev, f->ino) & mask;; k = (k + 1) & mask) {
        if (!ids[k]) {
            __atomic_store_n(&ids[k], (uint32_t)s + 1, __ATOMIC_RELEASE);
            return;
        }
        struct tiering_file *first = &recs[tab[ids[k] - 1].file];
        if (first->ino == f->ino && first->dev == f->dev) {
            f->next_alias = first->next_alias;
            __atomic_store_n(&first->next_alias, (uint32_t)s, __ATOMIC_RELEASE);
            return;
        }
    }
}

/* Fills the entry table from n paths (NUL-terminated in blob) with their
 * data-root ids and sizes; path i gets file record i, which the caller has
 * written already (its identity links the entries of one file).  slots[i]
 * is where path i went.  Returns n, -1 when the table is too small or the
 * blob too short, -2 - i when path i is there twice.
 *
 * Each path's fingerprint is computed FILL_AHEAD paths before its insertion
 * and its slots in both tables are asked for then: at 1.28 M paths the
 * tables are ~90 MB, and a probe's first load would otherwise wait for
 * memory twice per path (NOTE [index fill] in docs/design.md). */
#define FILL_AHEAD 16

EXPORT int64_t tiering_index_fill(void *base, const char *blob, uint64_t blob_len,
                                  const uint32_t *roots, const uint64_t *sizes, uint64_t n,
                                  uint64_t *slots)
{
    struct tiering_header *h = base;
    struct tiering_entry *tab = tiering_entries(base);
    struct tiering_file *recs = tiering_files(base);
    uint32_t *ids = tiering_idents(base);
    uint64_t mask = h->nslots - 1, off = 0, ahead = 0, short_at = n;
    uint64_t fps[FILL_AHEAD][2], idk[FILL_AHEAD]; /* fingerprints, identity probes' starts */
    if (n >= h->nslots || n > h->nfiles)
        return -1; /* the tables need an empty slot, and a record per path */
    for (uint64_t i = 0; i < n; i++) {
        for (; ahead < n && ahead < i + FILL_AHEAD && ahead < short_at; ahead++) {
            const char *rel = blob + off;
            size_t len = strnlen(rel, blob_len - off);
            if (off + len >= blob_len) {
                short_at = ahead; /* blob shorter than n strings */
                break;
            }
            off += len + 1;
            uint64_t *fp = fps[ahead % FILL_AHEAD], *start = &idk[ahead % FILL_AHEAD];
            tiering_fingerprint(roots[ahead], rel, len, fp);
            __builtin_prefetch(&tab[fp[0] & mask], 1);
            *start = recs[ahead].ino ? tiering_identity_hash(recs[ahead].dev, recs[ahead].ino) & mask : UINT64_MAX;
            if (*start != UINT64_MAX)
                __builtin_prefetch(&ids[*start], 1);
        }
        if (i == short_at)
            return -1;
        /* most identity probes meet another file's entry first: its entry,
         * then its record, are asked for on the way */
        uint64_t j = i + FILL_AHEAD / 2, k;
        if (j < ahead && (k = idk[j % FILL_AHEAD]) != UINT64_MAX && ids[k])
            __builtin_prefetch(&tab[ids[k] - 1]);
        j = i + FILL_AHEAD / 4;
        if (j < ahead && (k = idk[j % FILL_AHEAD]) != UINT64_MAX && ids[k])
            __builtin_prefetch(&recs[tab[ids[k] - 1].file]);
        const uint64_t *fp = fps[i % FILL_AHEAD];
        uint64_t s = fp[0] & mask;
        for (;; s = (s + 1) & mask) {
            struct tiering_entry *e = &tab[s];
            if (!e->fp_lo && !e->fp_hi)
                break;
            if (e->fp_lo == fp[0] && e->fp_hi == fp[1])
                return -2 - (int64_t)i; /* duplicate path */
        }
        struct tiering_entry *e = &tab[s];
        e->fp_lo = fp[0];
        e->fp_hi = fp[1];
        e->state = TIERING_STATE_NONE;
        e->root = roots[i];
        e->size = sizes[i];
        e->file = (uint32_t)i;
        e->opens = 0;
        recs[i].next_alias = (uint32_t)s;
        if (recs[i].ino)
            link_identity(base, s);
        slots[i] = s;
        h->nentries++;
    }
    return (int64_t)n;
}

/* NOTE [names first]: the sizes and records of entries listed by name only,
 * each record's flags (TIERING_FILE_COMPLETE) stored last. */
EXPORT int64_t tiering_index_complete(void *base, const uint64_t *slots, const struct tiering_file *recs,
                                      const uint64_t *sizes, uint64_t n)
{
    struct tiering_header *h = base;
    struct tiering_entry *tab = tiering_entries(base);
    struct tiering_file *files_ = tiering_files(base);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t s = slots[i] & (h->nslots - 1);
        struct tiering_file *f = &files_[tab[s].file];
        if (__atomic_load_n(&f->flags, __ATOMIC_RELAXED) & TIERING_FILE_COMPLETE)
            continue; /* filled once only: the ring links it once */
        uint32_t next = f->next_alias;
        struct tiering_file r = recs[i];
        r.next_alias = next;
        r.flags = 0;
        *f = r;
        __atomic_store_n(&tab[s].size, sizes[i], __ATOMIC_RELAXED);
        if (f->ino)
            link_identity(base, s);
        __atomic_store_n(&f->flags, recs[i].flags | TIERING_FILE_COMPLETE, __ATOMIC_RELEASE);
    }
    return (int64_t)n;
}

/* Ends the fill of an index written from names first: from now on write
 * opens find every file by identity; those that may not have (they loaded
 * filling while it was set) logged their identities, looked up here once
 * the last of them is done with its entry.  Each file found is invalidated
 * under every path it has (no copy exists yet: the daemon starts after). */
EXPORT int64_t tiering_index_filled(void *base, uint64_t wait_ns)
{
    struct tiering_header *h = base;
    const struct tiering_written *wlog = (const struct tiering_written *)((char *)base + h->wlog_offset);
    const struct table t = table_of(base);
    uint64_t waited = 0;
    __atomic_store_n(&h->filling, 0, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&h->fill_writers, __ATOMIC_SEQ_CST)) {
        if (waited >= wait_ns)
            return -1; /* a writer killed inside its few instructions, or stopped there */
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
        waited += 100000;
    }
    uint64_t logged = __atomic_load_n(&h->wlog_head, __ATOMIC_SEQ_CST);
    if (logged > h->wlog_size)
        return -2;
    int64_t invalidated = 0;
    for (uint64_t k = 0; k < logged; k++) {
        int64_t first = find_identity(&t, wlog[k].dev, wlog[k].ino);
        if (first >= 0)
            invalidated += invalidate_file(&t, (uint64_t)first);
    }
    return invalidated;
}

/* FNV-1a over a sorted list of group ids without repeats: the same set of
 * supplementary groups hashes the same in the daemon and in the shim. */
EXPORT uint64_t tiering_groups_hash(const uint32_t *groups, uint64_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (uint64_t i = 0; i < n; i++) {
        h ^= groups[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

EXPORT void tiering_set_tag(uint32_t tag) { thread_tag = tag; }
EXPORT uint32_t tiering_get_tag(void) { return thread_tag; }

EXPORT int tiering_state_cas(void *base, uint64_t slot, uint32_t expected, uint32_t desired)
{
    struct tiering_entry *e = &tiering_entries(base)[slot];
    uint32_t was = expected;
    int swapped = __atomic_compare_exchange_n(&e->state, &expected, desired, 0, __ATOMIC_SEQ_CST,
                                              __ATOMIC_SEQ_CST);
    if (swapped && (was & TIERING_STATE_PENDING)) /* opens may wait on it: NOTE [one read per file] */
        tiering_wake(&e->state);
    return swapped;
}

EXPORT uint64_t tiering_state_cas_many(void *base, const uint64_t *slots, uint64_t n, uint32_t expected,
                                       uint32_t desired, uint8_t *swapped)
{
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++) {
        swapped[i] = (uint8_t)tiering_state_cas(base, slots[i], expected, desired);
        k += swapped[i];
    }
    return k;
}

/* Copies complete events from *tail on into out (at most max).  Stops at a
 * record still being written unless force is set, in which case it is skipped
 * and counted as dropped (its writer died or is very slow). */
EXPORT uint64_t tiering_ring_drain(void *base, uint64_t *tail, struct tiering_event *out,
                                   uint64_t max, int force, uint64_t *dropped)
{
    struct tiering_header *h = base;
    struct tiering_event *r = tiering_ring(base);
    uint64_t head = __atomic_load_n(&h->ring_head, __ATOMIC_ACQUIRE), n = 0;
    while (*tail < head && n < max) {
        if (head - *tail > h->nevents) { /* lapped: the oldest records are gone */
            *dropped += head - h->nevents - *tail;
            *tail = head - h->nevents;
        }
        struct tiering_event *ev = &r[*tail & (h->nevents - 1)];
        uint64_t s1 = __atomic_load_n(&ev->seq, __ATOMIC_ACQUIRE);
        if (s1 == *tail + 1) {
            struct tiering_event copy = *ev;
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            if (__atomic_load_n(&ev->seq, __ATOMIC_RELAXED) == s1)
                out[n++] = copy;
            else
                (*dropped)++;
        } else if (s1 > *tail + 1 || force) {
            (*dropped)++;
        } else {
            break; /* being written right now */
        }
        (*tail)++;
    }
    return n;
}

/* ---- events and fd bookkeeping ------------------------------------------ */

static void post(uint16_t kind, uint32_t slot, uint16_t tier, uint64_t bytes)
{
    uint64_t pos = __atomic_fetch_add(&idx->ring_head, 1, __ATOMIC_RELAXED);
    struct tiering_event *ev = &ring[pos & ring_mask];
    __atomic_store_n(&ev->seq, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    ev->entry = slot;
    ev->pid = my_pid;
    ev->kind = kind;
    ev->tier = tier;
    ev->tag = thread_tag;
    ev->bytes = bytes;
    __atomic_store_n(&ev->seq, pos + 1, __ATOMIC_RELEASE);
}

static inline void count(uint64_t *c, uint64_t v) { __atomic_fetch_add(c, v, __ATOMIC_RELAXED); }

/* The fd book's word for an fd opened on the file of slot, from tier
 * (-1: from the PFS). */
static inline uint64_t fd_book_value(int64_t slot, int tier)
{
    return (uint64_t)(tier + 1) << 32 | (uint64_t)(slot + 1);
}

static inline void track(int fd, uint64_t value)
{
    if (fd >= 0 && fd < MAX_TRACKED_FDS)
        __atomic_store_n(&fd_book[fd], value, __ATOMIC_RELAXED);
}

static inline uint64_t tracked(int fd)
{
    return (fd >= 0 && fd < MAX_TRACKED_FDS) ? __atomic_load_n(&fd_book[fd], __ATOMIC_RELAXED) : 0;
}

/* NOTE [read counters]: each open file a catalogued open made (an fd and
 * its duplicates share it) has a cell: how many booked descriptors of this
 * process refer to it (refs), the process that opened it (owner) and the
 * file position up to which its reads were booked (credited, only raised,
 * atomically, by the closes).  fd_cell[fd] names the cell of a booked fd
 * (NO_CELL: none).  No lock, no walk: threads that dup and close one file
 * at once book its bytes once.  refs is only ever changed atomically, and
 * a dup joins a cell only while it is held (refs > 0) and still its
 * source's, so a close racing with the dup never frees a cell a descriptor
 * still holds, nor does the dup join a cell another open has taken.  The
 * cell's word `held` is its generation (high 32 bits, raised each time an
 * open takes the cell) and its count of descriptors (low 32 bits, refs):
 * a dup joins only the generation its source had before the dup's system
 * call, so not an open that took the cell while the dup was made. */
struct open_file {
    uint64_t held;
    uint64_t credited;
    uint32_t owner;
};
#define NO_CELL UINT32_MAX
#define NO_SEEN UINT64_MAX
static inline uint32_t refs(uint64_t held) { return (uint32_t)held; }
static struct open_file open_files[MAX_TRACKED_FDS];
static uint32_t fd_cell[MAX_TRACKED_FDS];
/* fd_cell is read and written atomically (relaxed): a dup of a descriptor
 * reads its source's word while another thread closes the source and an
 * open takes its number again (NOTE [sanitizers]). */
static inline uint32_t cell_of(int fd) { return __atomic_load_n(&fd_cell[fd], __ATOMIC_RELAXED); }
static inline void set_cell(int fd, uint32_t k) { __atomic_store_n(&fd_cell[fd], k, __ATOMIC_RELAXED); }

/* fd (booked, in range) is an open file of its own, opened here: it takes
 * a free cell, fd's own number first.  A cell is held by a booked fd each,
 * fd not among them: one is free but after races of dup with close. */
static inline void file_opened(int fd)
{
    uint32_t k = (uint32_t)fd;
    for (int n = 0; n < MAX_TRACKED_FDS; n++, k = (k + 1) % MAX_TRACKED_FDS) {
        uint64_t h = __atomic_load_n(&open_files[k].held, __ATOMIC_RELAXED);
        if (!refs(h) && __atomic_compare_exchange_n(&open_files[k].held, &h, ((h >> 32) + 1) << 32 | 1, 0,
                                                    __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
            open_files[k].owner = my_pid;
            __atomic_store_n(&open_files[k].credited, 0, __ATOMIC_RELAXED);
            set_cell(fd, k);
            return;
        }
    }
    set_cell(fd, NO_CELL);
}

/* The cell of fd (booked as s) and its generation, before a dup of fd:
 * generation << 32 | cell (NO_SEEN: none) */
static inline uint64_t cell_seen(int fd, uint64_t s)
{
    uint32_t k = s && fd >= 0 && fd < MAX_TRACKED_FDS ? cell_of(fd) : NO_CELL;
    if (k == NO_CELL)
        return NO_SEEN;
    return (__atomic_load_n(&open_files[k].held, __ATOMIC_ACQUIRE) >> 32) << 32 | k;
}

/* One more reference to the cell seen (cell_seen), unless it is free (refs
 * 0) or another open has taken it since: 1 if taken */
static inline int hold_cell(uint64_t seen)
{
    uint64_t *held = &open_files[(uint32_t)seen].held;
    uint64_t n = __atomic_load_n(held, __ATOMIC_RELAXED);
    while (refs(n) && n >> 32 == seen >> 32 &&
           !__atomic_compare_exchange_n(held, &n, n + 1, 1, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        ;
    return refs(n) && n >> 32 == seen >> 32;
}

/* One reference to cell k less: 1 when it was the last (the cell is free) */
static inline int drop_cell(uint32_t k)
{
    return refs(__atomic_sub_fetch(&open_files[k].held, 1, __ATOMIC_ACQ_REL)) == 0;
}

/* newfd, a duplicate of oldfd (both in range; oldfd was booked as s, on
 * the cell seen, when the dup was made), shares its cell.  A close of
 * oldfd racing with the dup may have let the cell go (and another open
 * taken it, even on oldfd's number): newfd then has no cell, and its close
 * books no bytes (a program that dups a descriptor another thread closes
 * cannot tell which file it duplicates either). */
static inline void file_duplicated(int newfd, int oldfd, uint64_t s, uint64_t seen)
{
    uint32_t k = (uint32_t)seen;
    set_cell(newfd, NO_CELL);
    if (seen == NO_SEEN || !hold_cell(seen))
        return;
    if (tracked(oldfd) == s && cell_of(oldfd) == k)
        set_cell(newfd, k);
    else
        drop_cell(k);
}

/* Whether the close of fd (booked, in range) books the bytes read through
 * its open file, and so needs its position: its file was opened by this
 * process (a descriptor inherited from the parent books nothing) */
static inline int books_bytes(int fd)
{
    uint32_t k = cell_of(fd);
    return k != NO_CELL && open_files[k].owner == my_pid;
}

/* The file position of fd, 0 when it has none (errno untouched). */
static inline uint64_t position(int fd)
{
    int saved = errno;
    int64_t pos = (int64_t)syscall(SYS_lseek, fd, (off_t)0, SEEK_CUR);
    errno = saved;
    return pos > 0 ? (uint64_t)pos : 0;
}

/* The descriptor fd, booked as v, is closed at file position pos (0 when
 * it books no bytes, books_bytes): books the bytes read through its open
 * file since the last close of one of its duplicates, and posts the close.
 * A descriptor inherited from the parent (a forked child) books no bytes:
 * the parent's own close does. */
static __attribute__((noinline)) void closed_at(int fd, uint64_t v, uint64_t pos)
{
    uint32_t slot = (uint32_t)v - 1, where = (uint32_t)(v >> 32), k = cell_of(fd);
    uint64_t bytes = 0;
    if (k != NO_CELL) {
        struct open_file *o = &open_files[k];
        /* credited is raised before the cell is let go: a dup may join it
         * until then, so even a close that looks like the last one races */
        int mine = o->owner == my_pid, last;
        uint64_t done = __atomic_load_n(&o->credited, __ATOMIC_RELAXED);
        while (mine && pos > done &&
               !__atomic_compare_exchange_n(&o->credited, &done, pos, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            ;
        if (mine && pos > done) {
            bytes = pos - done;
            count(where ? &idx->counters.read_tier : &idx->counters.read_pfs, bytes);
        }
        last = drop_cell(k); /* the cell is free for another open once refs drops to 0 */
        if (last && mine && !pos && !done) {
            count(&idx->counters.closed_at_zero, 1);
            count(&idx->counters.closed_at_zero_bytes, entries[slot].size);
        }
    }
    post(TIERING_EV_CLOSE, slot, (uint16_t)where, bytes);
}

/* What the fd book held for fd, now cleared (0: nothing; the book is
 * written only when it held something). */
static inline uint64_t unbook(int fd)
{
    if (idx && fd >= 0 && fd < MAX_TRACKED_FDS && __atomic_load_n(&fd_book[fd], __ATOMIC_RELAXED))
        return __atomic_exchange_n(&fd_book[fd], 0, __ATOMIC_RELAXED);
    return 0;
}

/* A vfork child shares our memory: what it closes or duplicates before exec
 * (subprocess does just that) must not change the parent's bookkeeping. */
static inline int in_vfork_child(void) { return (uint32_t)syscall(SYS_getpid) != my_pid; }

/* fd, booked as v (0: nothing), is about to be closed (not in a vfork
 * child) and no longer booked: book what was read through it and post a
 * close event */
static inline void closed(int fd, uint64_t v)
{
    if ((uint32_t)v)
        closed_at(fd, v, books_bytes(fd) ? position(fd) : 0);
}

/* closed(fd), unless in a vfork child, whose close leaves the parent's
 * descriptor open (one getpid, only for a descriptor the book holds; the
 * book read once before, then cleared) */
static inline void closing(int fd)
{
    if (idx && tracked(fd) && !in_vfork_child())
        closed(fd, __atomic_exchange_n(&fd_book[fd], 0, __ATOMIC_RELAXED));
}

/* fd's number now names another file (its file was closed behind our back,
 * with no position left to read): forget it and post a close event */
static inline void untrack(int fd)
{
    uint64_t v = unbook(fd);
    if ((uint32_t)v) {
        uint32_t k = cell_of(fd);
        if (k != NO_CELL)
            drop_cell(k);
        post(TIERING_EV_CLOSE, (uint32_t)v - 1, (uint16_t)(v >> 32), 0);
    }
}

/* ---- initialisation ------------------------------------------------------- */

#define RESOLVE(name, ret, params) real.name = (name##_fn)dlsym(RTLD_NEXT, #name);

/* System calls made directly: they must not reach wrappers (ours included) */
static inline int stat_at(int atfd, const char *path, struct stat *st, int flags)
{
    return (int)syscall(SYS_newfstatat, atfd, path, st, flags);
}

static inline int stat_fd(int fd, struct stat *st) { return (int)syscall(SYS_fstat, fd, st); }

static void atfork_child(void) { my_pid = (uint32_t)syscall(SYS_getpid); }

static int valid_prefix(const struct tiering_root *r)
{
    return r->len > 0 && r->len < TIERING_PATH_MAX && r->path[r->len] == '\0' &&
           r->path[0] == '/' && strlen(r->path) == r->len;
}

/* NOTE [tier roots]: a copy is opened only under a tier root that is still
 * the private directory the daemon made: a directory of this user, mode
 * 0700, with the device and inode recorded in the index.  NULL when it is,
 * else what is wrong. */
static const char *tier_root_flaw(const struct tiering_root *t)
{
    struct stat st;
    if (stat_at(AT_FDCWD, t->path, &st, 0) != 0)
        return "cannot be stat'ed";
    if (!S_ISDIR(st.st_mode))
        return "is not a directory";
    if (st.st_uid != geteuid())
        return "belongs to another user";
    if ((st.st_mode & 07777) != 0700)
        return "is not of mode 0700";
    if ((uint64_t)st.st_dev != t->dev || (uint64_t)st.st_ino != t->ino)
        return "is not the directory the daemon made (another inode)";
    return NULL;
}

/* The TIERING_CAP_* capabilities in the process's effective set (a root
 * process that dropped CAP_DAC_OVERRIDE no longer reads other users' files). */
static uint32_t dac_capabilities(void)
{
    struct { uint32_t version; int pid; } head = {0x20080522, 0}; /* _LINUX_CAPABILITY_VERSION_3 */
    struct { uint32_t effective, permitted, inheritable; } data[2];
    if (syscall(SYS_capget, &head, data) != 0)
        return 0;
    return ((data[0].effective >> 1) & 1 ? TIERING_CAP_DAC_OVERRIDE : 0) |
           ((data[0].effective >> 2) & 1 ? TIERING_CAP_DAC_READ_SEARCH : 0);
}

/* NOTE [stat from the index]: a stat is answered from the index only to a
 * process with the credentials of the scan (the same user, group and
 * supplementary groups reach the same paths), real and effective alike:
 * access() walks the path with the real ids, the rest with the effective
 * ones.  (A process started with real ids other than its effective ones
 * runs in secure mode, where the loader ignores LD_PRELOAD.) */
static void same_credentials(const struct tiering_header *h)
{
    gid_t list[1024];
    uint32_t sorted[1024];
    int n = (int)syscall(SYS_getgroups, 1024, list);
    uint64_t k = 0;
    for (int i = 0; i < n; i++) { /* insertion sort, repeats dropped */
        uint64_t j = k;
        while (j > 0 && sorted[j - 1] > (uint32_t)list[i])
            j--;
        if (j > 0 && sorted[j - 1] == (uint32_t)list[i])
            continue;
        memmove(&sorted[j + 1], &sorted[j], (k - j) * sizeof *sorted);
        sorted[j] = (uint32_t)list[i];
        k++;
    }
    scanners_ids = n >= 0 && tiering_groups_hash(sorted, k) == h->scan_groups && geteuid() == h->scan_uid &&
                   getuid() == h->scan_uid && getegid() == h->scan_gid && getgid() == h->scan_gid &&
                   (dac_capabilities() & h->scan_caps) == h->scan_caps;
    if (!scanners_ids)
        logmsg("credentials differ from the scan's: catalogued paths are opened and stat'ed on the PFS");
}

static void map_index(const char *path)
{
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        logmsg("index %s: cannot open (errno %d), passing through", path, errno);
        return;
    }
    struct stat st, dst;
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    int ok = stat_fd(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
             (st.st_mode & 077) == 0 && (size_t)st.st_size >= sizeof(struct tiering_header);
    if (ok && dlen > 0 && dlen < sizeof dir) {
        memcpy(dir, path, dlen);
        dir[dlen] = '\0';
        ok = stat_at(AT_FDCWD, dir, &dst, 0) == 0 && S_ISDIR(dst.st_mode) && dst.st_uid == geteuid() &&
             (dst.st_mode & 077) == 0;
    } else {
        ok = 0;
    }
    if (!ok) {
        logmsg("index %s: not a private file and directory of this user, passing through", path);
        syscall(SYS_close, fd);
        return;
    }
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    syscall(SYS_close, fd);
    if (base == MAP_FAILED) {
        logmsg("index %s: mmap failed (errno %d), passing through", path, errno);
        return;
    }
    struct tiering_header *h = base;
    int good = h->magic == TIERING_MAGIC && h->version == TIERING_VERSION &&
               h->header_size == sizeof *h && h->entry_size == sizeof(struct tiering_entry) &&
               h->event_size == sizeof(struct tiering_event) && h->total_size == (uint64_t)st.st_size &&
               h->nslots && !(h->nslots & (h->nslots - 1)) && h->nslots <= UINT32_MAX &&
               h->nevents && !(h->nevents & (h->nevents - 1)) && h->nroots <= TIERING_MAX_ROOTS &&
               h->ntiers <= TIERING_MAX_TIERS &&
               h->entries_offset >= sizeof *h &&
               h->file_size == sizeof(struct tiering_file) && h->nfiles <= h->nslots &&
               h->entries_offset + h->nslots * sizeof(struct tiering_entry) <= h->idents_offset &&
               h->idents_offset + h->nslots * sizeof(uint32_t) <= h->files_offset &&
               h->files_offset + h->nfiles * sizeof(struct tiering_file) <= h->ring_offset &&
               h->ring_offset + h->nevents * sizeof(struct tiering_event) <= h->total_size &&
               h->wlog_size <= h->total_size / sizeof(struct tiering_written) &&
               h->wlog_offset + h->wlog_size * sizeof(struct tiering_written) <= h->total_size;
    for (uint32_t i = 0; good && i < h->nroots; i++)
        good = valid_prefix(&h->roots[i]);
    for (uint32_t i = 0; good && i < h->ntiers; i++)
        good = valid_prefix(&h->tiers[i]);
    if (!good) {
        logmsg("index %s: malformed or of another version, passing through", path);
        munmap(base, (size_t)st.st_size);
        return;
    }
    redirect_tiers = h->ntiers;
    for (uint32_t i = 0; i < h->ntiers; i++) {
        const char *flaw = tier_root_flaw(&h->tiers[i]);
        if (flaw) {
            logmsg("tier root %s %s: not redirecting any open (write opens still invalidate)",
                   h->tiers[i].path, flaw);
            redirect_tiers = 0;
        }
    }
    entries = tiering_entries(base);
    idents = tiering_idents(base);
    files = tiering_files(base);
    ring = tiering_ring(base);
    slot_mask = h->nslots - 1;
    ring_mask = h->nevents - 1;
    nfiles = h->nfiles;
    same_credentials(h);
    __atomic_store_n(&idx, h, __ATOMIC_RELEASE);
    logmsg("index %s: %llu entries, %u roots, %u tiers", path,
           (unsigned long long)h->nentries, h->nroots, h->ntiers);
}

static void inherited_writes(void); /* NOTE [inherited writes] */

static void init(void)
{
    in_init = 1;
    INTERPOSED(RESOLVE)
    my_pid = (uint32_t)syscall(SYS_getpid);
    pthread_atfork(NULL, NULL, atfork_child);
    debug = getenv("TIERING_DEBUG") != NULL;
    const char *disable = getenv("TIERING_DISABLE");
    const char *path = getenv("TIERING_INDEX");
    if (disable && strcmp(disable, "1") == 0)
        logmsg("TIERING_DISABLE=1, passing through");
    else if (!path || !*path)
        logmsg("no TIERING_INDEX, passing through");
    else
        map_index(path);
    if (idx)
        inherited_writes();
    ready = 1;
    in_init = 0;
}

static inline void ensure_init(void)
{
    if (UNLIKELY(!ready) && !in_init)
        pthread_once(&once, init);
}

__attribute__((constructor)) static void shim_constructor(void) { ensure_init(); }

/* ---- path resolution ------------------------------------------------------- */

/* Appends the components of src to out[*len], resolving ".", ".." and "//"
 * lexically.  Returns 1 when a ".." removed a component that src itself
 * brought (then the text is not the kernel's answer: "missing/.." fails with
 * ENOENT, "file/.." with ENOTDIR, "link/.." leaves the link's target), 0
 * when every ".." only climbed into what out held before (a real path from
 * getcwd or /proc/self/fd, where text and kernel agree), -1 when too long. */
static int append_components(char *out, size_t *len, const char *src)
{
    const char *p = src;
    size_t floor = *len;
    int popped_own = 0;
    while (*p) {
        while (*p == '/')
            p++;
        if (!*p)
            break;
        const char *q = p;
        while (*q && *q != '/')
            q++;
        size_t clen = (size_t)(q - p);
        if (clen == 1 && p[0] == '.') {
            /* nothing */
        } else if (clen == 2 && p[0] == '.' && p[1] == '.') {
            if (*len > floor)
                popped_own = 1;
            while (*len > 1 && out[*len - 1] != '/')
                (*len)--;
            if (*len > 1)
                (*len)--; /* drop the slash too, keep "/" for the root */
            if (*len < floor)
                floor = *len;
        } else {
            if (*len + 1 + clen >= PATH_MAX)
                return -1;
            if (*len > 1)
                out[(*len)++] = '/';
            memcpy(out + *len, p, clen);
            *len += clen;
        }
        p = q;
    }
    out[*len] = '\0';
    return popped_own;
}

/* A path whose last component is "", "." or ".." names a directory: such an
 * open must fail or succeed exactly as on the PFS, so it is never redirected. */
static int names_directory(const char *path)
{
    size_t n = strlen(path);
    if (n == 0 || path[n - 1] == '/')
        return 1;
    const char *last = strrchr(path, '/');
    last = last ? last + 1 : path;
    return strcmp(last, ".") == 0 || strcmp(last, "..") == 0;
}

/* The length of s when it is a plain relative path, the form the catalog
 * stores (no leading or trailing "/", no empty, "." or ".." component), so
 * usable as it is; 0 otherwise. */
static size_t plain_len(const char *s)
{
    const char *p = s;
    for (;;) {
        if (p[0] == '/' || p[0] == '\0')
            return 0;
        if (p[0] == '.' && (p[1] == '/' || p[1] == '\0' || (p[1] == '.' && (p[2] == '/' || p[2] == '\0'))))
            return 0;
        while (*p && *p != '/')
            p++;
        if (!*p)
            return (size_t)(p - s);
        p++;
    }
}

static int64_t probe(uint32_t root_id, const char *rel, size_t len)
{
    uint64_t fp[2];
    tiering_fingerprint(root_id, rel, len, fp);
    for (uint64_t s = fp[0] & slot_mask;; s = (s + 1) & slot_mask) {
        const struct tiering_entry *e = &entries[s];
        if (e->fp_lo == fp[0] && e->fp_hi == fp[1])
            return (int64_t)s;
        if (!e->fp_lo && !e->fp_hi)
            return -1;
    }
}

/* The index of the data root an absolute path starts with, followed by
 * "/", or -1; *rl is that root's length without a trailing slash (0 for "/").
 * strncmp stops at the end of a shorter path. */
static inline int root_prefix(const struct tiering_header *h, const char *path, size_t *rl)
{
    for (uint32_t i = 0; i < h->nroots; i++) {
        const struct tiering_root *r = &h->roots[i];
        size_t l = r->len == 1 ? 0 : r->len;
        if (l == 0 || (path[1] == r->path[1] && strncmp(path, r->path, l) == 0 && path[l] == '/')) {
            *rl = l;
            return (int)i;
        }
    }
    return -1;
}

/* May path name a catalogued file?  Only a
 * relative path or one under a data root (*root, *rl) can. */
static inline int maybe_catalogued(const struct tiering_header *h, const char *path, int *root, size_t *rl)
{
    *root = -1;
    *rl = 0;
    return h && path && (path[0] != '/' || (*root = root_prefix(h, path, rl)) >= 0);
}

/* The absolute path of path (relative to atfd) into abs_path (*len its
 * length), resolved by text as append_components does: 0, or -1 when the
 * text cannot tell it (a ".." of its own, too long, no cwd; errno untouched). */
static int absolute(int atfd, const char *path, char *abs_path, size_t *len)
{
    *len = 1;
    abs_path[0] = '/';
    abs_path[1] = '\0';
    if (path[0] != '/') {
        char base[PATH_MAX];
        int saved = errno; /* a failure here leaves the call to the kernel, errno untouched */
        if (atfd == AT_FDCWD) {
            if (!getcwd(base, sizeof base)) {
                errno = saved;
                return -1;
            }
        } else {
            char fd_link[32];
            snprintf(fd_link, sizeof fd_link, "/proc/self/fd/%d", atfd);
            ssize_t n = readlink(fd_link, base, sizeof base - 1);
            errno = saved;
            if (n <= 0 || base[0] != '/')
                return -1;
            base[n] = '\0';
        }
        if (append_components(abs_path, len, base) != 0)
            return -1;
    }
    return append_components(abs_path, len, path) != 0 ? -1 : 0; /* too long, or a ".." of its own */
}

/* Finds the catalogued entry that path (relative to atfd) names; root is
 * root_prefix()'s answer (root length rl) for an absolute path.  An absolute
 * path outside every root is not looked up: "//root/x" or "/a/../root/x" may
 * still lead into a root, but they are rare and simply read the PFS.  On
 * success returns the slot and sets *rel (and *rel_len) to the part below the
 * data root, in path itself when it is plain, else in abs_path. */
static int64_t lookup(int atfd, const char *path, int root, size_t rl, char *abs_path, const char **rel,
                      size_t *rel_len)
{
    if (path[0] == '/') {
        if (root < 0)
            return -1;
        /* The common case first: the text below the root as it is.  The
         * catalog holds plain paths only (plain_len), and no other text can
         * equal one, so a hit needs no further check. */
        const char *r = path + rl + 1;
        size_t n = strlen(r);
        int64_t slot = probe(idx->roots[root].id, r, n);
        if (slot >= 0) {
            *rel = r;
            *rel_len = n;
            return slot;
        }
        if (plain_len(r) == n)
            return -1; /* plain, and not catalogued */
    }
    size_t len;
    if (names_directory(path) || absolute(atfd, path, abs_path, &len) < 0)
        return -1;
    int r = root_prefix(idx, abs_path, &rl);
    if (r < 0 || len == rl + 1)
        return -1; /* outside every root, or the root itself */
    *rel = abs_path + rl + 1;
    *rel_len = len - rl - 1;
    return probe(idx->roots[r].id, *rel, *rel_len);
}

/* ---- the open path -------------------------------------------------------- */

static int call_real(enum which w, int atfd, const char *path, int flags, mode_t mode)
{
    switch (w) {
    case W_OPEN: if (real.open) return real.open(path, flags, mode); break;
    case W_OPEN64: if (real.open64) return real.open64(path, flags, mode); break;
    case W_OPENAT: if (real.openat) return real.openat(atfd, path, flags, mode); break;
    case W_OPENAT64: if (real.openat64) return real.openat64(atfd, path, flags, mode); break;
    case W_OPEN_2: if (real.__open_2) return real.__open_2(path, flags); break;
    case W_OPEN64_2: if (real.__open64_2) return real.__open64_2(path, flags); break;
    case W_OPENAT_2: if (real.__openat_2) return real.__openat_2(atfd, path, flags); break;
    case W_OPENAT64_2: if (real.__openat64_2) return real.__openat64_2(atfd, path, flags); break;
    case W_CREAT: if (real.creat) return real.creat(path, mode); break;
    case W_CREAT64: if (real.creat64) return real.creat64(path, mode); break;
    }
    /* not resolved (re-entered from dlsym): the raw system call */
    return (int)syscall(SYS_openat, atfd, path, flags, mode);
}

/* An open that may change the file: for writing, creating, truncating or a
 * temporary file (whose own bit, without O_DIRECTORY, says it).  O_PATH
 * opens never do: the kernel ignores their other flags. */
#define WRITE_FLAGS (O_ACCMODE | O_CREAT | O_TRUNC | (O_TMPFILE & ~O_DIRECTORY))

static inline int opens_for_writing(int flags) { return (flags & WRITE_FLAGS) && !(flags & O_PATH); }

/* Builds tier root + "/" + data-root id + "/" + rel into out (two data roots
 * may hold the same relative path); 0 on success. */
static int tier_path(uint32_t tier, uint32_t root, const char *rel, size_t rel_len, char *out)
{
    const struct tiering_root *t = &idx->tiers[tier];
    char digits[12], id[16];
    int nd = 0, n = 0;
    do
        digits[nd++] = (char)('0' + root % 10);
    while ((root /= 10) && nd < 11);
    id[n++] = '/';
    while (nd)
        id[n++] = digits[--nd];
    id[n++] = '/';
    if (t->len + (size_t)n + rel_len >= PATH_MAX)
        return -1;
    memcpy(out, t->path, t->len);
    memcpy(out + t->len, id, (size_t)n);
    memcpy(out + t->len + n, rel, rel_len + 1);
    return 0;
}

/* The file record of the entry in slot, NULL if it names none or is not
 * complete yet (an index written from names first, NOTE [names first]):
 * such an entry is not catalogued for redirects and stat answers.  The
 * flag is read first, with acquire: the fields after it are whole. */
static inline const struct tiering_file *record(int64_t slot)
{
    uint32_t f = entries[slot].file;
    if (f >= nfiles || !(__atomic_load_n(&files[f].flags, __ATOMIC_ACQUIRE) & TIERING_FILE_COMPLETE))
        return NULL;
    return &files[f];
}

/* ---- served descriptors: NOTE [served descriptors] ------------------------ */

/* The entries this process is served no copy of any more (NOTE [served
 * descriptors]): one bit a slot, mapped when a descriptor is first moved
 * onto its data file (not on the hot path); NULL: none.  A later open of
 * such a file in this process goes to the PFS, so no copy's descriptor is
 * moved while the process holds locks on the data file. */
static uint64_t *not_served;

static inline int served_no_more(int64_t slot)
{
    uint64_t *m = __atomic_load_n(&not_served, __ATOMIC_ACQUIRE);
    return UNLIKELY(m != NULL) && (__atomic_load_n(&m[slot >> 6], __ATOMIC_RELAXED) >> (slot & 63) & 1);
}

static void serve_no_more(int64_t slot)
{
    uint64_t *m = __atomic_load_n(&not_served, __ATOMIC_ACQUIRE);
    if (!m) {
        size_t bytes = ((size_t)idx->nslots + 63) / 64 * 8;
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return;
        if (!__atomic_compare_exchange_n(&not_served, &m, p, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            munmap(p, bytes); /* another thread's is in place: m */
        else
            m = p;
    }
    __atomic_fetch_or(&m[slot >> 6], 1ULL << (slot & 63), __ATOMIC_RELAXED);
}

/* The data path of the tier copy phys names (tier root + "/" + data-root id
 * + "/" + rel, tier_path's form) into out, and its entry in *slot (-1: not
 * catalogued); 1 when phys is under a tier root in that form, else 0. */
static int copy_to_data(const char *phys, char *out, int64_t *slot)
{
    *slot = -1;
    for (uint32_t t = 0; t < idx->ntiers; t++) {
        const struct tiering_root *r = &idx->tiers[t];
        if (strncmp(phys, r->path, r->len) != 0 || phys[r->len] != '/')
            continue;
        const char *p = phys + r->len + 1;
        uint64_t id = 0;
        int nd = 0;
        while (*p >= '0' && *p <= '9' && nd < 10)
            id = id * 10 + (uint64_t)(*p++ - '0'), nd++;
        if (!nd || *p != '/' || !p[1])
            return 0;
        const char *rel = p + 1;
        size_t rel_len = strlen(rel);
        for (uint32_t i = 0; i < idx->nroots; i++) {
            const struct tiering_root *d = &idx->roots[i];
            size_t l = d->len == 1 ? 0 : d->len;
            if (d->id != id || l + 1 + rel_len >= PATH_MAX)
                continue;
            memcpy(out, d->path, l);
            out[l] = '/';
            memcpy(out + l + 1, rel, rel_len + 1);
            *slot = probe((uint32_t)id, rel, rel_len);
            return 1;
        }
        return 0;
    }
    return 0;
}

/* readlink of link into buf (PATH_MAX), errno untouched; its length or -1. */
static ssize_t link_text(const char *name, char *buf)
{
    int saved = errno;
    ssize_t n = syscall(SYS_readlinkat, AT_FDCWD, name, buf, PATH_MAX - 1);
    errno = saved;
    if (n <= 0 || buf[0] != '/')
        return -1;
    buf[n] = '\0';
    return n;
}

/* copy_to_data of what the kernel's link (/proc/self/fd/N and the like)
 * names: the copy, or, once evicted, the copy's name + " (deleted)". */
static int link_to_data(const char *name, char *out, int64_t *slot)
{
    static const char deleted[] = " (deleted)";
    const size_t dl = sizeof deleted - 1;
    char phys[PATH_MAX];
    ssize_t n = link_text(name, phys);
    if (n < 0)
        return 0;
    struct stat st;
    int saved = errno;
    int gone = (size_t)n > dl && strcmp(phys + n - dl, deleted) == 0 && stat_at(AT_FDCWD, name, &st, 0) == 0 &&
               st.st_nlink == 0; /* evicted, not a name that ends so */
    errno = saved;
    if (gone) {
        phys[n - dl] = '\0';
        if (copy_to_data(phys, out, slot) && *slot >= 0)
            return 1;
        phys[n - dl] = ' ';
    }
    return copy_to_data(phys, out, slot);
}

/* The data path of the copy fd is open on, as link_to_data. */
static int fd_to_data(int fd, char *out, int64_t *slot)
{
    char fd_link[32];
    snprintf(fd_link, sizeof fd_link, "/proc/self/fd/%d", fd);
    return link_to_data(fd_link, out, slot);
}

/* Is dev a tier's device? */
static int on_tier_device(uint64_t dev)
{
    for (uint32_t t = 0; t < idx->ntiers; t++)
        if (idx->tiers[t].dev == dev)
            return 1;
    return 0;
}

/* What the kernel's stat of a tier copy shows: a regular file of this user,
 * mode 0400, on a tier's device. */
static inline int copy_like(uint64_t dev, int is_reg, uint32_t mode, uint32_t uid)
{
    return is_reg && (mode & 07777) == 0400 && uid == geteuid() && on_tier_device(dev);
}

/* Might fd (the kernel's stat of it: dev, is_reg, mode, uid) be open on a
 * tier copy?  A regular file on a tier's device, booked as opened from a
 * tier, or else (a descriptor inherited across exec, or above the fd book)
 * copy_like. */
static int maybe_copy(int fd, uint64_t dev, int is_reg, uint32_t mode, uint32_t uid)
{
    return is_reg && on_tier_device(dev) && ((tracked(fd) >> 32) != 0 || copy_like(dev, is_reg, mode, uid));
}

/* Does (dev, ino) name the file of slot's record?  A record of unknown
 * identity says yes. */
static int is_the_file(int64_t slot, uint64_t dev, uint64_t ino)
{
    const struct tiering_file *f = slot >= 0 ? record(slot) : NULL;
    return f && (!f->ino || ((uint32_t)dev == f->dev && ino == f->ino));
}

/* NOTE [served descriptors]: the data path of slot's copy (copy_to_data's
 * text) still names the file the copy was made of?  A rename, an unlink or
 * a moved directory may since have given that path to another file, or to
 * none. */
static int still_names(int64_t slot, const char *path)
{
    int saved = errno;
    struct stat st;
    int ok = slot >= 0 && stat_at(AT_FDCWD, path, &st, 0) == 0 && is_the_file(slot, (uint64_t)st.st_dev, (uint64_t)st.st_ino);
    errno = saved;
    return ok;
}

/* May a call through a copy's link (a reopen, a change) be taken to the
 * data path?  When the path still names the file; or, when it does not,
 * unless the shim knows the file left it (written, renamed over, unlinked:
 * invalid; a moved directory: the index disabled): then the descriptor's
 * file is the copy's alone, as an unlinked file is its descriptors' alone. */
static int to_data_path(int64_t slot, const char *path)
{
    return slot < 0 || still_names(slot, path) ||
           (__atomic_load_n(&entries[slot].state, __ATOMIC_SEQ_CST) != TIERING_STATE_INVALID &&
            !__atomic_load_n(&idx->disabled, __ATOMIC_RELAXED));
}

/* Does path (relative to atfd; symlinks followed unless nofollow) name a
 * tier copy, however it is spelt (a descriptor's link, "//proc/...", a
 * relative name in /proc/self/fd, the copy's own path)?  Its data path into
 * out, else NULL.  For calls that would change or describe the copy. */
static __attribute__((noinline)) const char *named_copy(int atfd, const char *path, int nofollow, char *out)
{
    int saved = errno;
    struct stat st;
    const char *r = NULL;
    int64_t slot;
    if (path && path[0] && stat_at(atfd, path, &st, nofollow ? AT_SYMLINK_NOFOLLOW : 0) == 0 &&
        copy_like((uint64_t)st.st_dev, S_ISREG(st.st_mode), st.st_mode, st.st_uid)) {
        int fd = (int)syscall(SYS_openat, atfd, path, O_PATH | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0));
        if (fd >= 0) {
            if (fd_to_data(fd, out, &slot) && to_data_path(slot, out))
                r = out;
            syscall(SYS_close, fd);
        }
    }
    errno = saved;
    return r;
}

/* Is path a link of /proc that names a descriptor (/proc/self/fd/N,
 * /proc/PID/fd/N, /proc/thread-self/fd/N, /dev/fd/N, /dev/stdin...)?  The
 * text alone says: such a link is never under a data root. */
static inline int fd_link_path(const char *p)
{
    if (p[0] != '/')
        return 0;
    if (p[1] == 'p') /* "/proc/" ... "/fd/" */
        return p[2] == 'r' && p[3] == 'o' && p[4] == 'c' && p[5] == '/' && strstr(p + 6, "/fd/");
    if (p[1] == 'd') /* "/dev/fd/", "/dev/std" */
        return p[2] == 'e' && p[3] == 'v' && p[4] == '/' &&
               ((p[5] == 'f' && p[6] == 'd' && p[7] == '/') || (p[5] == 's' && p[6] == 't' && p[7] == 'd'));
    return 0;
}

/* The data path a reopen through a descriptor's link reaches (into out), or
 * NULL when the link does not lead to a tier copy: a reopen of a served
 * file through /proc/self/fd/N opens the data file, as without the shim.
 * /dev/stdin and /dev/fd/N lead to /proc/self/fd/N first. */
static __attribute__((noinline)) const char *reopened_copy(const char *path, char *out)
{
    char hop[PATH_MAX];
    int64_t slot;
    if (strncmp(path, "/dev/std", 8) == 0) {
        if (link_text(path, hop) < 0 || !fd_link_path(hop))
            return NULL;
        path = hop;
    }
    return link_to_data(path, out, &slot) && to_data_path(slot, out) ? out : NULL;
}

/* ---- write opens: NOTE [alias invalidation] ------------------------------- */

/* The shim's own index as a table (write opens only: not the hot path). */
static inline struct table shim_table(void)
{
    return (struct table){entries, files, idents, slot_mask, nfiles};
}

/* The entry of a regular file with the identity st, or -1. */
static int64_t by_identity(const struct stat *st)
{
    if (!S_ISREG(st->st_mode) || st->st_ino == 0)
        return -1;
    const struct table t = shim_table();
    return find_identity(&t, (uint32_t)st->st_dev, (uint64_t)st->st_ino);
}

/* The log entries this process wrote last (k + 1; 0: none), the oldest
 * replaced first: a file opened for writing again and again (a log appended
 * to line by line) is logged once, not once per open, so such a program
 * does not fill the log; all of them are looked at, so up to
 * LOGGED_RECENT files written in turn are each logged once.  An entry is
 * stored here (release) after its fields, and the log is only appended to:
 * an entry found here that names the file is in the log, and
 * tiering_index_filled sees it (its writer was counted in fill_writers
 * until after the store). */
#define LOGGED_RECENT 16
static uint64_t logged_recent[LOGGED_RECENT];
static unsigned logged_next;

static inline int logged_already(const struct tiering_written *wlog, uint32_t dev, uint64_t ino)
{
    for (int i = 0; i < LOGGED_RECENT; i++) {
        uint64_t j = __atomic_load_n(&logged_recent[i], __ATOMIC_ACQUIRE);
        if (j && j <= idx->wlog_size && wlog[j - 1].ino == ino && wlog[j - 1].dev == dev)
            return 1;
    }
    return 0;
}

/* by_identity for a write open: while the index is filled (NOTE [names
 * first]) the identity table may not hold the file yet, so its identity is
 * logged, for tiering_index_filled to look up once the table is whole. */
static int64_t written_identity(const struct stat *st)
{
    if (S_ISREG(st->st_mode) && st->st_ino && __atomic_load_n(&idx->filling, __ATOMIC_ACQUIRE)) {
        struct tiering_written *wlog = (struct tiering_written *)((char *)idx + idx->wlog_offset);
        uint32_t dev = (uint32_t)st->st_dev;
        uint64_t ino = (uint64_t)st->st_ino;
        if (logged_already(wlog, dev, ino))
            return by_identity(st);
        __atomic_fetch_add(&idx->fill_writers, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&idx->filling, __ATOMIC_SEQ_CST)) {
            uint64_t k = __atomic_fetch_add(&idx->wlog_head, 1, __ATOMIC_RELAXED);
            if (k < idx->wlog_size) {
                wlog[k].ino = ino;
                wlog[k].dev = dev;
                unsigned r = __atomic_fetch_add(&logged_next, 1, __ATOMIC_RELAXED) % LOGGED_RECENT;
                __atomic_store_n(&logged_recent[r], k + 1, __ATOMIC_RELEASE);
            }
        }
        __atomic_fetch_sub(&idx->fill_writers, 1, __ATOMIC_SEQ_CST);
    }
    return by_identity(st);
}

static int same_file(uint64_t a, uint64_t b)
{
    const struct table t = shim_table();
    uint64_t s = a;
    for (uint64_t n = 0; n <= slot_mask; n++) {
        if (s == b)
            return 1;
        if ((s = ring_next(&t, s)) == a)
            return 0;
    }
    return 0;
}

/* The files one write open reached: by its path, by the identity of the file
 * it truncates, of the file it opened.  Each is invalidated once. */
struct written {
    int64_t slot[3];
    int n;
};

/* Marks the file of slot invalid under every path it has and posts one WRITE
 * event.  The stores are sequentially consistent: NOTE [linearizable
 * redirect]. */
static void reached(struct written *wr, int64_t slot)
{
    if (slot < 0)
        return;
    for (int i = 0; i < wr->n; i++)
        if (same_file((uint64_t)wr->slot[i], (uint64_t)slot))
            return;
    if (wr->n == 0)
        count(&idx->counters.writes, 1);
    if (wr->n < 3)
        wr->slot[wr->n++] = slot;
    const struct table t = shim_table();
    invalidate_file(&t, (uint64_t)slot);
    post(TIERING_EV_WRITE, (uint32_t)slot, 0, 0);
}

/* The catalogued entry path (relative to atfd; NULL: none) names, or -1. */
static int64_t path_entry(int atfd, const char *path)
{
    int root;
    size_t rl;
    if (!maybe_catalogued(idx, path, &root, &rl))
        return -1;
    char abs_path[PATH_MAX];
    const char *rel;
    size_t rel_len;
    return lookup(atfd, path, root, rl, abs_path, &rel, &rel_len);
}

/* Before a write open of path (NULL: the file open on oldfd, as freopen
 * without a path): the catalogued entry the path names and, when the open
 * truncates, the file it is about to truncate, invalidated now since the
 * open itself changes it.  Returns the path's entry or -1. */
static __attribute__((noinline)) int64_t write_begin(struct written *wr, int atfd, const char *path,
                                                     int oldfd, int flags)
{
    int saved = errno;
    int64_t by_path = path_entry(atfd, path);
    /* O_CREAT | O_EXCL fails on an existing file: nothing to truncate */
    if ((flags & O_TRUNC) && (flags & (O_CREAT | O_EXCL)) != (O_CREAT | O_EXCL)) {
        struct stat st;
        reached(wr, by_path);
        if ((path ? stat_at(atfd, path, &st, (flags & O_NOFOLLOW) ? AT_SYMLINK_NOFOLLOW : 0)
                  : stat_fd(oldfd, &st)) == 0)
            reached(wr, written_identity(&st));
    }
    errno = saved;
    return by_path;
}

/* After a write open returned fd: the file it opened, before the caller can
 * write to it. */
static void write_end(struct written *wr, int fd, int64_t by_path)
{
    int saved = errno;
    struct stat st;
    untrack(fd); /* a stale slot: its file was closed behind our back */
    reached(wr, by_path);
    if (stat_fd(fd, &st) == 0)
        reached(wr, written_identity(&st));
    errno = saved;
}

static __attribute__((noinline)) int open_write(enum which w, int atfd, const char *path, int flags,
                                                mode_t mode)
{
    char data[PATH_MAX];
    if (named_copy(atfd, path, flags & O_NOFOLLOW, data)) { /* never write a copy: NOTE [served descriptors] */
        atfd = AT_FDCWD;
        path = data;
    }
    struct written wr = {.n = 0};
    int64_t by_path = write_begin(&wr, atfd, path, -1, flags);
    int fd = call_real(w, atfd, path, flags, mode);
    if (fd >= 0)
        write_end(&wr, fd, by_path);
    return fd;
}

/* NOTE [inherited writes]: a descriptor the process was started with, open
 * for writing on a catalogued file (a shell's `>> D/train.log`, a file
 * action of posix_spawn): the file is invalidated as a write open would,
 * before the program can write through it.  Raw system calls: the
 * descriptors of /proc/self/fd, one fcntl each, an fstat of each writable
 * one.  Without /proc nothing is seen. */
static void inherited_writes(void)
{
    int dir = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) {
        logmsg("/proc/self/fd cannot be read (errno %d): inherited write descriptors are not seen", errno);
        return;
    }
    char buf[4096] __attribute__((aligned(8)));
    long n;
    while ((n = syscall(SYS_getdents64, dir, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n;) {
            const struct dirent64 *d = (const struct dirent64 *)(buf + off);
            off += d->d_reclen;
            int fd = 0;
            const char *c = d->d_name;
            for (; *c >= '0' && *c <= '9' && fd < (1 << 24); c++)
                fd = fd * 10 + (*c - '0');
            if (*c || c == d->d_name || fd == dir)
                continue; /* ".", "..", our own */
            int flags = (int)syscall(SYS_fcntl, fd, F_GETFL);
            struct stat st;
            if (flags < 0 || (flags & O_PATH) || (flags & O_ACCMODE) == O_RDONLY || stat_fd(fd, &st) != 0)
                continue;
            int64_t slot = written_identity(&st);
            if (slot >= 0 && __atomic_load_n(&entries[slot].state, __ATOMIC_SEQ_CST) != TIERING_STATE_INVALID) {
                struct written wr = {.n = 0};
                reached(&wr, slot);
                logmsg("descriptor %d, inherited open for writing, is a data-set file: invalidated", fd);
            }
        }
    }
    syscall(SYS_close, dir);
}

/* ---- namespace changes: NOTE [namespace changes] ---------------------------- */

/* May the directory path (relative to atfd) hold data-set paths: is it a
 * data root, above one or below one?  Yes when its absolute path cannot be
 * told from the text. */
static int holds_data(int atfd, const char *path)
{
    char abs_path[PATH_MAX];
    size_t len;
    if (absolute(atfd, path, abs_path, &len) < 0)
        return 1;
    for (uint32_t i = 0; i < idx->nroots; i++) {
        const struct tiering_root *r = &idx->roots[i];
        size_t l = r->len, m = len < l ? len : l;
        if (l == 1 || len == 1 || (memcmp(abs_path, r->path, m) == 0 &&
                                   (len == l || (len < l ? r->path[len] : abs_path[l]) == '/')))
            return 1;
    }
    return 0;
}

/* Before a call that changes what path (relative to atfd) names, or the
 * file it names: invalidates the path's entry and the file it names now
 * (symlinks followed: a path that reaches the file through this one has its
 * identity).  When a directory is moved (moves: a rename's source, or either
 * side of an exchange) that may hold data-set paths, the shim redirects
 * nothing more for the rest of the job: the index has no directories to find
 * the entries below it by. */
static __attribute__((noinline)) void name_changes(struct written *wr, int atfd, const char *path, int moves)
{
    if (!path)
        return;
    int saved = errno;
    reached(wr, path_entry(atfd, path));
    struct stat st;
    if (stat_at(atfd, path, &st, 0) == 0) {
        reached(wr, written_identity(&st));
        if (moves && S_ISDIR(st.st_mode) && holds_data(atfd, path) &&
            !__atomic_exchange_n(&idx->disabled, 1, __ATOMIC_SEQ_CST))
            logmsg("directory %s renamed: redirecting nothing more in this job", path);
    }
    errno = saved;
}

static void renamed(int olddir, const char *old, int newdir, const char *new_, unsigned int flags)
{
    ensure_init();
    if (!idx)
        return;
    struct written wr = {.n = 0};
    name_changes(&wr, olddir, old, 1);
    name_changes(&wr, newdir, new_, (flags & RENAME_EXCHANGE) != 0); /* else an empty directory */
}

static void name_changed(int atfd, const char *path)
{
    ensure_init();
    if (!idx)
        return;
    struct written wr = {.n = 0};
    name_changes(&wr, atfd, path, 0); /* a directory removed is empty */
}

/* The path a call that follows symlinks should act on: the data path when
 * path names a tier copy (then *atfd is AT_FDCWD; NOTE [served
 * descriptors]), else path itself; with changes, the change is noted first
 * (name_changed).  nofollow: the call acts on a symlink itself. */
static const char *acting_on(int *atfd, const char *path, char *buf, int nofollow, int changes)
{
    ensure_init();
    if (!idx)
        return path;
    if (!nofollow && named_copy(*atfd, path, 0, buf)) {
        *atfd = AT_FDCWD;
        path = buf;
    }
    if (changes)
        name_changed(*atfd, path);
    return path;
}

/* Each wrapper invalidates before the call: the call itself changes what
 * later opens find (NOTE [linearizable redirect]); a call that fails has
 * only cost the copies.  Without libc's function, the system call. */
EXPORT int rename(const char *old, const char *new_)
{
    renamed(AT_FDCWD, old, AT_FDCWD, new_, 0);
    return real.rename ? real.rename(old, new_) : (int)syscall(SYS_renameat2, AT_FDCWD, old, AT_FDCWD, new_, 0);
}

EXPORT int renameat(int olddir, const char *old, int newdir, const char *new_)
{
    renamed(olddir, old, newdir, new_, 0);
    return real.renameat ? real.renameat(olddir, old, newdir, new_)
                         : (int)syscall(SYS_renameat2, olddir, old, newdir, new_, 0);
}

EXPORT int renameat2(int olddir, const char *old, int newdir, const char *new_, unsigned int flags)
{
    renamed(olddir, old, newdir, new_, flags);
    return real.renameat2 ? real.renameat2(olddir, old, newdir, new_, flags)
                          : (int)syscall(SYS_renameat2, olddir, old, newdir, new_, flags);
}

EXPORT int unlink(const char *path)
{
    name_changed(AT_FDCWD, path);
    return real.unlink ? real.unlink(path) : (int)syscall(SYS_unlinkat, AT_FDCWD, path, 0);
}

EXPORT int unlinkat(int atfd, const char *path, int flags)
{
    name_changed(atfd, path);
    return real.unlinkat ? real.unlinkat(atfd, path, flags) : (int)syscall(SYS_unlinkat, atfd, path, flags);
}

/* libc's remove calls its own unlink and rmdir, not ours */
EXPORT int remove(const char *path)
{
    name_changed(AT_FDCWD, path);
    if (real.remove)
        return real.remove(path);
    int r = (int)syscall(SYS_unlinkat, AT_FDCWD, path, 0);
    return r < 0 && errno == EISDIR ? (int)syscall(SYS_unlinkat, AT_FDCWD, path, AT_REMOVEDIR) : r;
}

EXPORT int truncate(const char *path, off_t length)
{
    char buf[PATH_MAX];
    int at = AT_FDCWD;
    path = acting_on(&at, path, buf, 0, 1);
    return real.truncate ? real.truncate(path, length) : (int)syscall(SYS_truncate, path, length);
}

EXPORT int truncate64(const char *path, off64_t length)
{
    char buf[PATH_MAX];
    int at = AT_FDCWD;
    path = acting_on(&at, path, buf, 0, 1);
    return real.truncate64 ? real.truncate64(path, length) : (int)syscall(SYS_truncate, path, length);
}

/* A new name of a file changes its link count and ctime, which a stat
 * answered from its record would not show; a new name of a copy is one of
 * its data file (link's old path is not followed: a copy's is its own). */
EXPORT int link(const char *old, const char *new_)
{
    char buf[PATH_MAX];
    int at = AT_FDCWD;
    old = acting_on(&at, old, buf, 0, 1);
    return real.link ? real.link(old, new_) : (int)syscall(SYS_linkat, at, old, AT_FDCWD, new_, 0);
}

EXPORT int linkat(int olddir, const char *old, int newdir, const char *new_, int flags)
{
    char buf[PATH_MAX];
    int at = olddir;
    const char *o = acting_on(&at, old, buf, 0, 1);
    if (o != old)
        flags &= ~AT_EMPTY_PATH;
    return real.linkat ? real.linkat(at, o, newdir, new_, flags) : (int)syscall(SYS_linkat, at, o, newdir, new_, flags);
}

/* A change of a file's mode, owner, times or attributes by path: a stat
 * answered from its record would no longer be the kernel's. */
EXPORT int chmod(const char *path, mode_t mode)
{
    char buf[PATH_MAX];
    int at = AT_FDCWD;
    path = acting_on(&at, path, buf, 0, 1);
    return real.chmod ? real.chmod(path, mode) : (int)syscall(SYS_fchmodat, AT_FDCWD, path, mode);
}

EXPORT int fchmodat(int atfd, const char *path, mode_t mode, int flags)
{
    char buf[PATH_MAX];
    path = acting_on(&atfd, path, buf, flags & AT_SYMLINK_NOFOLLOW, 1);
    return real.fchmodat ? real.fchmodat(atfd, path, mode, flags) : without_libc();
}

EXPORT int chown(const char *path, uid_t u, gid_t g)
{
    char buf[PATH_MAX];
    int at = AT_FDCWD;
    path = acting_on(&at, path, buf, 0, 1);
    return real.chown ? real.chown(path, u, g) : (int)syscall(SYS_fchownat, AT_FDCWD, path, u, g, 0);
}

EXPORT int lchown(const char *path, uid_t u, gid_t g)
{
    name_changed(AT_FDCWD, path);
    return real.lchown ? real.lchown(path, u, g)
                       : (int)syscall(SYS_fchownat, AT_FDCWD, path, u, g, AT_SYMLINK_NOFOLLOW);
}

EXPORT int utime(const char *path, const struct utimbuf *ub)
{
    char buf[PATH_MAX];
    int at = AT_FDCWD;
    path = acting_on(&at, path, buf, 0, 1);
    return real.utime ? real.utime(path, ub) : without_libc();
}

EXPORT int utimes(const char *path, const struct timeval tv[2])
{
    char buf[PATH_MAX];
    int at = AT_FDCWD;
    path = acting_on(&at, path, buf, 0, 1);
    return real.utimes ? real.utimes(path, tv) : without_libc();
}

EXPORT int lutimes(const char *path, const struct timeval tv[2])
{
    name_changed(AT_FDCWD, path);
    return real.lutimes ? real.lutimes(path, tv) : without_libc();
}

EXPORT int futimesat(int atfd, const char *path, const struct timeval tv[2])
{
    char buf[PATH_MAX];
    path = acting_on(&atfd, path, buf, 0, 1);
    return real.futimesat ? real.futimesat(atfd, path, tv) : without_libc();
}

EXPORT int setxattr(const char *path, const char *name, const void *value, size_t size, int flags)
{
    char buf[PATH_MAX];
    int at = AT_FDCWD;
    path = acting_on(&at, path, buf, 0, 1);
    return real.setxattr ? real.setxattr(path, name, value, size, flags)
                         : (int)syscall(SYS_setxattr, path, name, value, size, flags);
}

EXPORT int lsetxattr(const char *path, const char *name, const void *value, size_t size, int flags)
{
    name_changed(AT_FDCWD, path);
    return real.lsetxattr ? real.lsetxattr(path, name, value, size, flags)
                          : (int)syscall(SYS_lsetxattr, path, name, value, size, flags);
}

EXPORT int removexattr(const char *path, const char *name)
{
    char buf[PATH_MAX];
    int at = AT_FDCWD;
    path = acting_on(&at, path, buf, 0, 1);
    return real.removexattr ? real.removexattr(path, name) : (int)syscall(SYS_removexattr, path, name);
}

EXPORT int lremovexattr(const char *path, const char *name)
{
    name_changed(AT_FDCWD, path);
    return real.lremovexattr ? real.lremovexattr(path, name) : (int)syscall(SYS_lremovexattr, path, name);
}

/* ---- read opens: NOTE [linearizable redirect] ---------------------------- */

/* Decides where a catalogued read-only open goes: fills phys and returns
 * the tier, or returns -1 for the original path. */
/* The state word of e once a copy in flight (TIERING_STATE_COPYING) has
 * ended, or after header.copy_wait_ns, whichever comes first: the open then
 * takes the copy instead of reading the file from the PFS a second time
 * (NOTE [one read per file], docs/design.md).  A shared futex: the copy
 * wakes it in the daemon's process.  A queued copy (TIERING_STATE_QUEUED) is
 * waited for at most header.queue_wait_ns, and copy_wait_ns more once it
 * runs, with the open's count stepped back meanwhile: the claim then finds
 * no open and makes the copy, which is the file's one read (NOTE [queued
 * copies]). */
static uint32_t wait_copy(struct tiering_entry *e, uint32_t st)
{
    uint64_t copy_bound = __atomic_load_n(&idx->copy_wait_ns, __ATOMIC_RELAXED);
    uint64_t bound = (st & TIERING_STATE_QUEUED) ? __atomic_load_n(&idx->queue_wait_ns, __ATOMIC_RELAXED)
                                                 : copy_bound;
    struct timespec now;
    if (!bound || !copy_bound || clock_gettime(CLOCK_MONOTONIC, &now) < 0)
        return st;
    int stepped = (st & TIERING_STATE_QUEUED) != 0;
    if (stepped) /* sequentially consistent, as open_begins: NOTE [queued copies] */
        __atomic_fetch_sub(&e->opens, 1, __ATOMIC_SEQ_CST);
    int64_t left = (int64_t)bound, extended = !stepped;
    int64_t began = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
    count(&idx->copy_waits, 1);
    for (;;) {
        if (!(st & TIERING_STATE_PENDING)) {
            if (!stepped)
                break;
            /* counted again before the state is loaded again, as an open begins */
            __atomic_fetch_add(&e->opens, 1, __ATOMIC_SEQ_CST);
            stepped = 0;
            st = __atomic_load_n(&e->state, __ATOMIC_SEQ_CST);
            continue; /* a claim between the two: its copy is waited for */
        }
        if (left <= 0) {
            if (!extended && (st & TIERING_STATE_COPYING)) { /* queued, then started: one copy's time more */
                extended = 1, left = (int64_t)copy_bound;
                began = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
                continue;
            }
            if (!stepped)
                break;
            __atomic_fetch_add(&e->opens, 1, __ATOMIC_SEQ_CST); /* the open reads the PFS: the claim sees it */
            return __atomic_load_n(&e->state, __ATOMIC_SEQ_CST);
        }
        struct timespec rel = {(time_t)(left / 1000000000), (long)(left % 1000000000)};
        syscall(SYS_futex, &e->state, FUTEX_WAIT, st, &rel, NULL, 0);
        st = __atomic_load_n(&e->state, __ATOMIC_ACQUIRE);
        if (clock_gettime(CLOCK_MONOTONIC, &now) < 0)
            left = 0, extended = 1;
        else
            left = (int64_t)(extended ? copy_bound : bound) - ((int64_t)now.tv_sec * 1000000000 + now.tv_nsec - began);
    }
    return st;
}

/* An open of slot begins: counted before the state word is read (NOTE [one
 * read per file]: a copy that claims the file after this sees it, one that
 * claimed it before is seen); open_failed() takes it back. */
static inline void open_begins(int64_t slot)
{
    __atomic_fetch_add(&entries[slot].opens, 1, __ATOMIC_SEQ_CST); /* NOTE [open counters] */
}

static inline void open_failed(int64_t slot)
{
    __atomic_fetch_sub(&entries[slot].opens, 1, __ATOMIC_RELAXED);
}

/* Whether an open may be served a copy at all, whatever the state word says. */
static int servable(int64_t slot, int flags, const struct tiering_file *f)
{
    if ((flags & REDIRECT_DENY) || __atomic_load_n(&idx->disabled, __ATOMIC_RELAXED) ||
        !__atomic_load_n(&scanners_ids, __ATOMIC_RELAXED))
        return 0; /* a process without the scan's credentials may not read the file: NOTE [served descriptors] */
    if (!f || served_no_more(slot))
        return 0; /* not complete yet: not catalogued for redirects; or locked by this process */
    if ((flags & O_NOFOLLOW) && !(f->flags & TIERING_FILE_NO_LINK))
        return 0; /* the PFS fails it with ELOOP */
    return 1;
}

/* Whether the daemon that claimed copies is alive: a claim of a daemon that
 * was killed is never released (NOTE [one read per file]). */
static int daemon_alive(void)
{
    uint32_t pid = __atomic_load_n(&idx->daemon_pid, __ATOMIC_RELAXED);
    return pid && (syscall(SYS_kill, (pid_t)pid, 0) == 0 || errno == EPERM);
}

static int route(int64_t slot, int flags, const char *rel, size_t rel_len, char *phys, int may_wait)
{
    struct tiering_entry *e = &entries[slot];
    uint32_t st = __atomic_load_n(&e->state, __ATOMIC_SEQ_CST);
    if (st == TIERING_STATE_NONE)
        return -1; /* no copy, none in flight: the common miss costs no more */
    const struct tiering_file *f = record(slot);
    if (!servable(slot, flags, f))
        return -1;
    if (UNLIKELY(st & TIERING_STATE_PENDING)) {
        int saved = errno;
        /* wait only for a copy this open could be served, of a daemon still there */
        if (may_wait && (st & TIERING_STATE_TIER) <= redirect_tiers && daemon_alive())
            st = wait_copy(e, st);
        errno = saved;
        if (!servable(slot, flags, f))
            return -1;
    }
    if (st == TIERING_STATE_NONE || st > redirect_tiers)
        return -1;
    if (tier_path(st - 1, e->root, rel, rel_len, phys) < 0)
        return -1;
    return (int)st - 1;
}

/* After the copy is open: may it be served?  Not when a write open
 * invalidated the file meanwhile (an eviction or a move to another tier
 * leaves a complete copy of the same bytes). */
static inline int still_valid(int64_t slot)
{
    return __atomic_load_n(&entries[slot].state, __ATOMIC_SEQ_CST) != TIERING_STATE_INVALID;
}

/* Books a successful open of a catalogued file (tier -1: its source). */
static void opened(int fd, int64_t slot, int tier)
{
    untrack(fd); /* a stale slot: its file was closed behind our back */
    if (tier >= 0) {
        count(&idx->counters.opens_tier[tier], 1);
        count(&idx->counters.bytes_tier, entries[slot].size);
        post(TIERING_EV_OPEN_TIER, (uint32_t)slot, (uint16_t)tier, 0);
    } else {
        post(TIERING_EV_OPEN_PFS, (uint32_t)slot, 0, 0);
    }
    if (fd >= 0 && fd < MAX_TRACKED_FDS)
        file_opened(fd);
    track(fd, fd_book_value(slot, tier));
}

/* The catalogued part of a read-only open: everything below a data root,
 * and every relative path.  Kept out of line so that its 8 KiB of path
 * buffers do not weigh on opens outside the roots. */
static __attribute__((noinline)) int open_read(enum which w, int atfd, const char *path, int flags,
                                               mode_t mode, int root, size_t rl)
{
    char abs_path[PATH_MAX], phys[PATH_MAX];
    const char *rel;
    size_t rel_len;
    int64_t slot = lookup(atfd, path, root, rl, abs_path, &rel, &rel_len);
    if (slot < 0) {
        int fd = call_real(w, atfd, path, flags, mode);
        untrack(fd); /* a stale slot: its file was closed behind our back */
        return fd;
    }
    open_begins(slot);
    int tier = route(slot, flags, rel, rel_len, phys, 1);
    if (tier >= 0) {
        int saved = errno;
        int fd = call_real(w, AT_FDCWD, phys, flags, mode);
        if (fd >= 0 && still_valid(slot)) {
            opened(fd, slot, tier);
            logmsg("open %s -> %s", path, phys);
            return fd;
        }
        if (fd >= 0)
            syscall(SYS_close, fd);
        errno = saved; /* evicted between lookup and open, or written: the PFS */
        count(&idx->counters.fallbacks, 1);
    }
    int fd = call_real(w, atfd, path, flags, mode);
    if (fd >= 0)
        opened(fd, slot, -1);
    else
        open_failed(slot);
    return fd;
}

/* The tier a read-only open of path would be served from now, or -1 (the
 * path itself: not catalogued, no copy published, or no index).  Opens
 * nothing and posts no event: for a program that must know a copy is
 * published, not only present (a copy is renamed into place before it is
 * published: NOTE [publish after rename]). */
EXPORT int tiering_where(const char *path)
{
    int saved = errno;
    ensure_init();
    struct tiering_header *h = __atomic_load_n(&idx, __ATOMIC_ACQUIRE);
    char abs_path[PATH_MAX], phys[PATH_MAX];
    const char *rel;
    size_t rel_len;
    int root;
    size_t rl;
    int tier = -1;
    if (maybe_catalogued(h, path, &root, &rl)) {
        int64_t slot = lookup(AT_FDCWD, path, root, rl, abs_path, &rel, &rel_len);
        if (slot >= 0)
            tier = route(slot, O_RDONLY, rel, rel_len, phys, 0);
    }
    errno = saved;
    return tier;
}

static inline int open_path(enum which w, int atfd, const char *path, int flags, mode_t mode,
                            const struct tiering_header *h)
{
    int root;
    size_t rl;
    if (h && UNLIKELY(opens_for_writing(flags)))
        return open_write(w, atfd, path, flags, mode);
    if (maybe_catalogued(h, path, &root, &rl))
        return open_read(w, atfd, path, flags, mode, root, rl);
    int fd = call_real(w, atfd, path, flags, mode);
    if (h)
        untrack(fd);
    return fd;
}

/* An open of a descriptor's link: of the data path when it leads to a tier
 * copy (NOTE [served descriptors]).  Out of line, as are the other path
 * buffers: opens of other paths do not carry it. */
static __attribute__((noinline)) int open_link(enum which w, int atfd, const char *path, int flags, mode_t mode,
                                               const struct tiering_header *h)
{
    char data[PATH_MAX];
    if (reopened_copy(path, data))
        return open_path(w, AT_FDCWD, data, flags, mode, h);
    return open_path(w, atfd, path, flags, mode, h);
}

static inline int do_open(enum which w, int atfd, const char *path, int flags, mode_t mode)
{
    ensure_init();
    struct tiering_header *h = __atomic_load_n(&idx, __ATOMIC_ACQUIRE);
    if (h && path && UNLIKELY(fd_link_path(path)))
        return open_link(w, atfd, path, flags, mode, h);
    return open_path(w, atfd, path, flags, mode, h);
}

static inline int needs_mode(int flags)
{
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE;
}

#define MODE_ARG(flags)                                 \
    mode_t mode = 0;                                    \
    if (needs_mode(flags)) {                            \
        va_list ap;                                     \
        va_start(ap, flags);                            \
        mode = (mode_t)va_arg(ap, int);                 \
        va_end(ap);                                     \
    }

EXPORT int open(const char *path, int flags, ...)
{
    MODE_ARG(flags);
    return do_open(W_OPEN, AT_FDCWD, path, flags, mode);
}

EXPORT int open64(const char *path, int flags, ...)
{
    MODE_ARG(flags);
    return do_open(W_OPEN64, AT_FDCWD, path, flags, mode);
}

EXPORT int openat(int atfd, const char *path, int flags, ...)
{
    MODE_ARG(flags);
    return do_open(W_OPENAT, atfd, path, flags, mode);
}

EXPORT int openat64(int atfd, const char *path, int flags, ...)
{
    MODE_ARG(flags);
    return do_open(W_OPENAT64, atfd, path, flags, mode);
}

EXPORT int __open_2(const char *path, int flags) { return do_open(W_OPEN_2, AT_FDCWD, path, flags, 0); }
EXPORT int __open64_2(const char *path, int flags) { return do_open(W_OPEN64_2, AT_FDCWD, path, flags, 0); }
EXPORT int __openat_2(int atfd, const char *path, int flags) { return do_open(W_OPENAT_2, atfd, path, flags, 0); }
EXPORT int __openat64_2(int atfd, const char *path, int flags) { return do_open(W_OPENAT64_2, atfd, path, flags, 0); }
EXPORT int creat(const char *path, mode_t mode) { return do_open(W_CREAT, AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode); }
EXPORT int creat64(const char *path, mode_t mode) { return do_open(W_CREAT64, AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode); }

/* ---- stdio ------------------------------------------------------------------ */

/* The open flags of an fopen mode as glibc reads it: "r", "w" or "a", then
 * "+" and "x" count ("b", "e", "m", "c" do not; what follows "," is the
 * character set).  Anything else fails in fopen: taken as a write. */
static int mode_flags(const char *mode)
{
    int flags;
    if (mode && mode[0] == 'r')
        flags = O_RDONLY;
    else if (mode && mode[0] == 'w')
        flags = O_WRONLY | O_CREAT | O_TRUNC;
    else if (mode && mode[0] == 'a')
        flags = O_WRONLY | O_CREAT | O_APPEND;
    else
        return O_RDWR;
    for (const char *m = mode + 1; *m && *m != ','; m++) {
        if (*m == '+')
            flags = (flags & ~O_ACCMODE) | O_RDWR;
        else if (*m == 'x')
            flags |= O_EXCL;
    }
    return flags;
}

static FILE *call_fopen(int is64, const char *path, const char *mode, FILE *stream)
{
    if (stream) {
        freopen_fn f = is64 ? real.freopen64 : real.freopen;
        if (f)
            return f(path, mode, stream);
    } else {
        fopen_fn f = is64 ? real.fopen64 : real.fopen;
        if (f)
            return f(path, mode);
    }
    errno = ENOSYS; /* only reachable while dlsym itself opens a stream */
    return NULL;
}

static __attribute__((noinline)) FILE *fopen_write(int is64, const char *path, const char *mode,
                                                   FILE *stream, int flags)
{
    char data[PATH_MAX];
    if (named_copy(AT_FDCWD, path, 0, data)) /* never write a copy: NOTE [served descriptors] */
        path = data;
    struct written wr = {.n = 0};
    int64_t by_path = write_begin(&wr, AT_FDCWD, path, stream ? fileno(stream) : -1, flags);
    FILE *f = call_fopen(is64, path, mode, stream);
    if (f)
        write_end(&wr, fileno(f), by_path);
    return f;
}

static __attribute__((noinline)) FILE *fopen_read(int is64, const char *path, const char *mode,
                                                  FILE *stream, int root, size_t rl)
{
    char abs_path[PATH_MAX], phys[PATH_MAX];
    const char *rel;
    size_t rel_len;
    int64_t slot = lookup(AT_FDCWD, path, root, rl, abs_path, &rel, &rel_len);
    if (slot < 0) {
        FILE *f = call_fopen(is64, path, mode, stream);
        if (f)
            untrack(fileno(f));
        return f;
    }
    open_begins(slot);
    int tier = route(slot, O_RDONLY, rel, rel_len, phys, 1);
    if (tier >= 0) {
        int saved = errno;
        FILE *f = call_fopen(is64, phys, mode, stream);
        if (f && still_valid(slot)) {
            opened(fileno(f), slot, tier);
            logmsg("fopen %s -> %s", path, phys);
            return f;
        }
        if (f && !stream && real.fclose)
            real.fclose(f); /* freopen below reopens stream over the copy */
        errno = saved;
        count(&idx->counters.fallbacks, 1);
    }
    FILE *f = call_fopen(is64, path, mode, stream);
    if (f)
        opened(fileno(f), slot, -1);
    else
        open_failed(slot);
    return f;
}

static FILE *do_fopen(int is64, const char *path, const char *mode, FILE *stream)
{
    ensure_init();
    struct tiering_header *h = __atomic_load_n(&idx, __ATOMIC_ACQUIRE);
    char data[PATH_MAX];
    int64_t slot;
    if (h && path && UNLIKELY(fd_link_path(path)) && reopened_copy(path, data))
        path = data;
    else if (h && !path && stream && fd_to_data(fileno(stream), data, &slot))
        path = data; /* freopen(NULL) reopens the file: the data file, not the copy */
    if (stream && path && h)
        closing(fileno(stream)); /* freopen closes the old fd */
    int flags = mode_flags(mode), root;
    size_t rl;
    if (h && UNLIKELY(opens_for_writing(flags)))
        return fopen_write(is64, path, mode, stream, flags);
    if (maybe_catalogued(h, path, &root, &rl))
        return fopen_read(is64, path, mode, stream, root, rl);
    FILE *f = call_fopen(is64, path, mode, stream);
    if (f && h)
        untrack(fileno(f));
    return f;
}

EXPORT FILE *fopen(const char *path, const char *mode) { return do_fopen(0, path, mode, NULL); }
EXPORT FILE *fopen64(const char *path, const char *mode) { return do_fopen(1, path, mode, NULL); }

EXPORT FILE *freopen(const char *path, const char *mode, FILE *stream)
{
    return do_fopen(0, path, mode, stream);
}

EXPORT FILE *freopen64(const char *path, const char *mode, FILE *stream)
{
    return do_fopen(1, path, mode, stream);
}

/* ---- closing and duplicating ------------------------------------------------ */

/* Each wrapper calls libc's function, or, when dlsym did not find it, the
 * system call itself (ENOSYS where only libc can do the job). */

EXPORT int close(int fd)
{
    ensure_init();
    closing(fd);
    return real.close ? real.close(fd) : (int)syscall(SYS_close, fd);
}

EXPORT int fclose(FILE *stream)
{
    ensure_init();
    if (stream)
        closing(fileno(stream));
    if (real.fclose)
        return real.fclose(stream);
    errno = ENOSYS;
    return EOF;
}

EXPORT int closedir(DIR *dir)
{
    ensure_init();
    if (dir)
        untrack(dirfd(dir));
    if (real.closedir)
        return real.closedir(dir);
    errno = ENOSYS;
    return -1;
}

EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
    ensure_init();
    if (idx && !(flags & (int)CLOSE_RANGE_CLOEXEC) && !in_vfork_child())
        for (unsigned int fd = first; fd <= last && fd < MAX_TRACKED_FDS; fd++)
            closed((int)fd, unbook((int)fd));
    if (real.close_range)
        return real.close_range(first, last, flags);
    return (int)syscall(SYS_close_range, first, last, flags);
}

/* A descriptor newfd that becomes a copy of one booked as s changes the fd
 * book: not when neither is booked (then no system call is made), nor in a
 * vfork child. */
static inline int rebooks(int newfd, uint64_t s)
{
    return idx && newfd >= 0 && (s || tracked(newfd)) && !in_vfork_child();
}

/* newfd, a copy of oldfd, now tracks what oldfd tracked (s, on the cell
 * seen: cell_seen before the copy was made) */
static inline void duplicated(int newfd, int oldfd, uint64_t s, uint64_t seen)
{
    if (rebooks(newfd, s)) {
        untrack(newfd); /* a stale slot (dup2's target was booked by replaced()) */
        if (s && newfd < MAX_TRACKED_FDS && oldfd >= 0 && oldfd < MAX_TRACKED_FDS)
            file_duplicated(newfd, oldfd, s, seen);
        track(newfd, s);
    }
}

EXPORT int dup(int fd)
{
    ensure_init();
    uint64_t s = tracked(fd), seen = cell_seen(fd, s);
    int nfd = real.dup ? real.dup(fd) : (int)syscall(SYS_dup, fd);
    duplicated(nfd, fd, s, seen);
    return nfd;
}

/* dup2 or dup3 made newfd a copy of another descriptor: the file newfd was
 * booked on (v) was closed at position pos, read before the call */
static inline void replaced(int newfd, uint64_t v, uint64_t pos)
{
    if (v && __atomic_compare_exchange_n(&fd_book[newfd], &v, 0, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED) &&
        (uint32_t)v)
        closed_at(newfd, v, pos);
}

static int dup_to(int oldfd, int newfd, int flags, int use3)
{
    ensure_init();
    uint64_t s = tracked(oldfd), seen = cell_seen(oldfd, s);
    uint64_t v = oldfd != newfd && rebooks(newfd, 0) ? tracked(newfd) : 0;
    uint64_t pos = v && books_bytes(newfd) ? position(newfd) : 0;
    int r;
    if (use3)
        r = real.dup3 ? real.dup3(oldfd, newfd, flags) : (int)syscall(SYS_dup3, oldfd, newfd, flags);
    else if (real.dup2)
        r = real.dup2(oldfd, newfd);
    else if (oldfd == newfd) /* dup3 refuses this case: dup2 checks oldfd */
        r = syscall(SYS_fcntl, oldfd, F_GETFD) < 0 ? -1 : newfd;
    else
        r = (int)syscall(SYS_dup3, oldfd, newfd, 0);
    if (oldfd != newfd && r >= 0) {
        replaced(r, v, pos);
        duplicated(r, oldfd, s, seen);
    }
    return r;
}

EXPORT int dup2(int oldfd, int newfd) { return dup_to(oldfd, newfd, 0, 0); }
EXPORT int dup3(int oldfd, int newfd, int flags) { return dup_to(oldfd, newfd, flags, 1); }

/* fcntl's third argument is an int or a pointer; both travel in one register
 * on the ABIs glibc supports, so it is forwarded as a pointer-sized value. */
static void unserve(int fd);

/* fcntl's commands that act on the file, not the descriptor: locks and leases */
static inline int locks(int cmd)
{
    return cmd == F_GETLK || cmd == F_SETLK || cmd == F_SETLKW || cmd == F_OFD_GETLK || cmd == F_OFD_SETLK ||
           cmd == F_OFD_SETLKW || cmd == F_SETLEASE || cmd == F_GETLEASE;
}

static int do_fcntl(fcntl_fn f, int fd, int cmd, void *arg)
{
    if (UNLIKELY(locks(cmd)) && idx)
        unserve(fd);
    uint64_t s = tracked(fd), seen = cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC ? cell_seen(fd, s) : NO_SEEN;
    int r = f ? f(fd, cmd, arg) : (int)syscall(SYS_fcntl, fd, cmd, arg);
    if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)
        duplicated(r, fd, s, seen);
    return r;
}

EXPORT int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    ensure_init();
    return do_fcntl(real.fcntl, fd, cmd, arg);
}

EXPORT int fcntl64(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    ensure_init();
    return do_fcntl(real.fcntl64 ? real.fcntl64 : real.fcntl, fd, cmd, arg);
}

/* ---- stat and access: NOTE [stat from the index] ----------------------------- */

/* The version argument of the __xstat family whose struct stat is the one
 * glibc's stat fills; any other passes through. */
#if defined(__x86_64__)
#define STAT_VER 1
#elif defined(__aarch64__)
#define STAT_VER 0
#else
#define STAT_VER -1
#endif

_Static_assert(sizeof(struct stat) == sizeof(struct stat64), "struct stat is struct stat64");

/* Flags with which a stat of a path may be answered from the index
 * (AT_EMPTY_PATH matters only with an empty path: a descriptor's stat). */
#define STAT_FLAGS (AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_EMPTY_PATH)
#define STATX_FLAGS (STAT_FLAGS | AT_STATX_DONT_SYNC)
#define ACCESS_FLAGS (AT_EACCESS | AT_SYMLINK_NOFOLLOW)

enum stat_which {
    SW_STAT, SW_STAT64, SW_LSTAT, SW_LSTAT64, SW_FSTATAT, SW_FSTATAT64, SW_XSTAT, SW_XSTAT64,
    SW_LXSTAT, SW_LXSTAT64, SW_FXSTATAT, SW_FXSTATAT64, SW_FSTAT, SW_FSTAT64, SW_FXSTAT, SW_FXSTAT64
};

/* libc's function w; a descriptor's stat has path NULL and the fd in atfd */
static int real_stat(enum stat_which w, int ver, int atfd, const char *path, struct stat *st, int flags)
{
    struct stat64 *st64 = (struct stat64 *)st;
    switch (w) {
    case SW_STAT: if (real.stat) return real.stat(path, st); break;
    case SW_STAT64: if (real.stat64) return real.stat64(path, st64); break;
    case SW_LSTAT: if (real.lstat) return real.lstat(path, st); break;
    case SW_LSTAT64: if (real.lstat64) return real.lstat64(path, st64); break;
    case SW_FSTATAT: if (real.fstatat) return real.fstatat(atfd, path, st, flags); break;
    case SW_FSTATAT64: if (real.fstatat64) return real.fstatat64(atfd, path, st64, flags); break;
    case SW_XSTAT: if (real.__xstat) return real.__xstat(ver, path, st); break;
    case SW_XSTAT64: if (real.__xstat64) return real.__xstat64(ver, path, st64); break;
    case SW_LXSTAT: if (real.__lxstat) return real.__lxstat(ver, path, st); break;
    case SW_LXSTAT64: if (real.__lxstat64) return real.__lxstat64(ver, path, st64); break;
    case SW_FXSTATAT: if (real.__fxstatat) return real.__fxstatat(ver, atfd, path, st, flags); break;
    case SW_FXSTATAT64: if (real.__fxstatat64) return real.__fxstatat64(ver, atfd, path, st64, flags); break;
    case SW_FSTAT: if (real.fstat) return real.fstat(atfd, st); break;
    case SW_FSTAT64: if (real.fstat64) return real.fstat64(atfd, st64); break;
    case SW_FXSTAT: if (real.__fxstat) return real.__fxstat(ver, atfd, st); break;
    case SW_FXSTAT64: if (real.__fxstat64) return real.__fxstat64(ver, atfd, st64); break;
    }
    if (ver != STAT_VER) {
        errno = EINVAL;
        return -1;
    }
    return path ? stat_at(atfd, path, st, flags) : stat_fd(atfd, st);
}

static inline struct timespec timespec_of(int64_t ns)
{
    struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
    if (ts.tv_nsec < 0) { /* before 1970: the kernel's nanoseconds are never negative */
        ts.tv_nsec += 1000000000;
        ts.tv_sec--;
    }
    return ts;
}

/* struct stat as the kernel fills it for the file the scan saw */
static void fill_stat(struct stat *st, const struct tiering_entry *e, const struct tiering_file *f)
{
    memset(st, 0, sizeof *st);
    st->st_dev = f->dev;
    st->st_ino = f->ino;
    st->st_nlink = f->nlink;
    st->st_mode = f->mode;
    st->st_uid = f->uid;
    st->st_gid = f->gid;
    st->st_size = (off_t)e->size;
    st->st_blksize = (blksize_t)f->blksize;
    st->st_blocks = (blkcnt_t)f->blocks;
    st->st_atim = timespec_of(f->atime_ns);
    st->st_mtim = timespec_of(f->mtime_ns);
    st->st_ctim = timespec_of(f->ctime_ns);
}

static inline struct statx_timestamp statx_time_of(int64_t ns)
{
    struct timespec ts = timespec_of(ns);
    return (struct statx_timestamp){.tv_sec = ts.tv_sec, .tv_nsec = (uint32_t)ts.tv_nsec};
}

/* The basic fields of statx, and only those (stx_mask says so) */
static void fill_statx(struct statx *sx, const struct tiering_entry *e, const struct tiering_file *f)
{
    memset(sx, 0, sizeof *sx);
    sx->stx_mask = STATX_BASIC_STATS;
    sx->stx_blksize = f->blksize;
    sx->stx_nlink = f->nlink;
    sx->stx_uid = f->uid;
    sx->stx_gid = f->gid;
    sx->stx_mode = (uint16_t)f->mode;
    sx->stx_ino = f->ino;
    sx->stx_size = e->size;
    sx->stx_blocks = (uint64_t)f->blocks;
    sx->stx_atime = statx_time_of(f->atime_ns);
    sx->stx_ctime = statx_time_of(f->ctime_ns);
    sx->stx_mtime = statx_time_of(f->mtime_ns);
    sx->stx_dev_major = major(f->dev);
    sx->stx_dev_minor = minor(f->dev);
}

/* The slot whose record answers a stat or access(F_OK) of path (relative
 * to atfd; root as maybe_catalogued() found it), or -1 when the kernel
 * must: another process's credentials than the scanner's, not catalogued,
 * written during the job, recorded by an earlier scan, or, with nofollow, a
 * path that is itself a symlink. */
static __attribute__((noinline)) int64_t answering_slot(int atfd, const char *path, int root, size_t rl,
                                                        int nofollow)
{
    if (!__atomic_load_n(&scanners_ids, __ATOMIC_RELAXED) ||
        __atomic_load_n(&idx->disabled, __ATOMIC_RELAXED))
        return -1;
    char abs_path[PATH_MAX];
    const char *rel;
    size_t rel_len;
    int64_t slot = lookup(atfd, path, root, rl, abs_path, &rel, &rel_len);
    if (slot < 0 || __atomic_load_n(&entries[slot].state, __ATOMIC_SEQ_CST) == TIERING_STATE_INVALID)
        return -1;
    const struct tiering_file *f = record(slot);
    if (!f || !(f->flags & TIERING_FILE_STAT) || (nofollow && !(f->flags & TIERING_FILE_NO_LINK)))
        return -1;
    return slot;
}

/* NOTE [served descriptors]: the catalogued file whose tier copy fd is
 * open on (the kernel's stat of fd: dev, size), or -1; *mapped says whether
 * path holds its data path already.  Booked opens are known by the fd book;
 * the others (inherited across exec, above the book) by their link. */
static int64_t copy_on_fd(int fd, uint64_t dev, uint64_t size, char *path, int *mapped)
{
    uint64_t v = tracked(fd);
    uint32_t tier = (uint32_t)(v >> 32), s = (uint32_t)v;
    int64_t slot = -1;
    *mapped = 0;
    if (tier && s && tier <= idx->ntiers && dev == idx->tiers[tier - 1].dev)
        slot = (int64_t)(s - 1);
    else if (!(*mapped = fd_to_data(fd, path, &slot)))
        return -1;
    return slot >= 0 && entries[slot].size == size ? slot : -1;
}

/* The record that answers the stat of a descriptor open on slot's copy:
 * this job's scan made it, or the copy found its source as it says; else
 * NULL (then the data path is stat'ed). */
static const struct tiering_file *exact_record(int64_t slot)
{
    const struct tiering_file *f = slot >= 0 ? record(slot) : NULL;
    return f && (f->flags & (TIERING_FILE_STAT | TIERING_FILE_VERIFIED)) ? f : NULL;
}

/* fd's stat, which the kernel gave as st: when it is a tier copy's, the
 * data file's instead. */
static __attribute__((noinline)) void served_stat(int fd, struct stat *st)
{
    char path[PATH_MAX];
    int mapped;
    int64_t slot;
    if (!maybe_copy(fd, (uint64_t)st->st_dev, S_ISREG(st->st_mode), st->st_mode, st->st_uid) ||
        ((slot = copy_on_fd(fd, (uint64_t)st->st_dev, (uint64_t)st->st_size, path, &mapped)) < 0 && !mapped))
        return;
    int saved = errno;
    if (slot >= 0 && __atomic_load_n(&entries[slot].state, __ATOMIC_SEQ_CST) == TIERING_STATE_INVALID &&
        (mapped || fd_to_data(fd, path, &slot)) && still_names(slot, path)) {
        unserve(fd); /* written in place during the job: from now on the data file's bytes and stat */
        if (stat_fd(fd, st) != 0)
            errno = saved;
        return;
    }
    const struct tiering_file *f = exact_record(slot);
    struct stat ds;
    if (!f && (mapped || fd_to_data(fd, path, &slot)) && stat_at(AT_FDCWD, path, &ds, 0) == 0 &&
        S_ISREG(ds.st_mode) && is_the_file(slot, (uint64_t)ds.st_dev, (uint64_t)ds.st_ino))
        *st = ds;
    else if ((f = slot >= 0 ? record(slot) : NULL)) /* the path names another file now: the record's */
        fill_stat(st, &entries[slot], f);
    errno = saved;
}

static inline int stat_path(enum stat_which w, int ver, int atfd, const char *path, struct stat *st, int flags,
                            const struct tiering_header *h)
{
    int root;
    size_t rl;
    if (maybe_catalogued(h, path, &root, &rl) && path[0] && ver == STAT_VER && !(flags & ~STAT_FLAGS)) {
        int64_t slot = answering_slot(atfd, path, root, rl, flags & AT_SYMLINK_NOFOLLOW);
        if (slot >= 0) {
            fill_stat(st, &entries[slot], record(slot));
            return 0;
        }
    }
    int r = real_stat(w, ver, atfd, path, st, flags);
    if (r == 0 && h && ver == STAT_VER && (!path || (!path[0] && (flags & AT_EMPTY_PATH))))
        served_stat(atfd, st);
    return r;
}

/* A stat of a descriptor's link: of the data path when it leads to a tier
 * copy (out of line, as open_link). */
static __attribute__((noinline)) int stat_link(enum stat_which w, int ver, int atfd, const char *path,
                                               struct stat *st, int flags, const struct tiering_header *h)
{
    char data[PATH_MAX];
    if (reopened_copy(path, data))
        return stat_path(w, ver, AT_FDCWD, data, st, flags, h);
    return stat_path(w, ver, atfd, path, st, flags, h);
}

static inline int do_stat(enum stat_which w, int ver, int atfd, const char *path, struct stat *st, int flags)
{
    ensure_init();
    struct tiering_header *h = __atomic_load_n(&idx, __ATOMIC_ACQUIRE);
    if (h && path && UNLIKELY(fd_link_path(path)) && !(flags & AT_SYMLINK_NOFOLLOW))
        return stat_link(w, ver, atfd, path, st, flags, h);
    return stat_path(w, ver, atfd, path, st, flags, h);
}

EXPORT int stat(const char *path, struct stat *st) { return do_stat(SW_STAT, STAT_VER, AT_FDCWD, path, st, 0); }
EXPORT int stat64(const char *path, struct stat64 *st)
{
    return do_stat(SW_STAT64, STAT_VER, AT_FDCWD, path, (struct stat *)st, 0);
}
EXPORT int lstat(const char *path, struct stat *st)
{
    return do_stat(SW_LSTAT, STAT_VER, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
}
EXPORT int lstat64(const char *path, struct stat64 *st)
{
    return do_stat(SW_LSTAT64, STAT_VER, AT_FDCWD, path, (struct stat *)st, AT_SYMLINK_NOFOLLOW);
}
EXPORT int fstatat(int atfd, const char *path, struct stat *st, int flags)
{
    return do_stat(SW_FSTATAT, STAT_VER, atfd, path, st, flags);
}
EXPORT int fstatat64(int atfd, const char *path, struct stat64 *st, int flags)
{
    return do_stat(SW_FSTATAT64, STAT_VER, atfd, path, (struct stat *)st, flags);
}
EXPORT int __xstat(int ver, const char *path, struct stat *st) { return do_stat(SW_XSTAT, ver, AT_FDCWD, path, st, 0); }
EXPORT int __xstat64(int ver, const char *path, struct stat64 *st)
{
    return do_stat(SW_XSTAT64, ver, AT_FDCWD, path, (struct stat *)st, 0);
}
EXPORT int __lxstat(int ver, const char *path, struct stat *st)
{
    return do_stat(SW_LXSTAT, ver, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
}
EXPORT int __lxstat64(int ver, const char *path, struct stat64 *st)
{
    return do_stat(SW_LXSTAT64, ver, AT_FDCWD, path, (struct stat *)st, AT_SYMLINK_NOFOLLOW);
}
EXPORT int __fxstatat(int ver, int atfd, const char *path, struct stat *st, int flags)
{
    return do_stat(SW_FXSTATAT, ver, atfd, path, st, flags);
}
EXPORT int __fxstatat64(int ver, int atfd, const char *path, struct stat64 *st, int flags)
{
    return do_stat(SW_FXSTATAT64, ver, atfd, path, (struct stat *)st, flags);
}
EXPORT int fstat(int fd, struct stat *st) { return do_stat(SW_FSTAT, STAT_VER, fd, NULL, st, 0); }
EXPORT int fstat64(int fd, struct stat64 *st) { return do_stat(SW_FSTAT64, STAT_VER, fd, NULL, (struct stat *)st, 0); }
EXPORT int __fxstat(int ver, int fd, struct stat *st) { return do_stat(SW_FXSTAT, ver, fd, NULL, st, 0); }
EXPORT int __fxstat64(int ver, int fd, struct stat64 *st)
{
    return do_stat(SW_FXSTAT64, ver, fd, NULL, (struct stat *)st, 0);
}

static int real_statx(int atfd, const char *path, int flags, unsigned int mask, struct statx *sx)
{
    return real.statx ? real.statx(atfd, path, flags, mask, sx) : (int)syscall(SYS_statx, atfd, path, flags, mask, sx);
}

/* served_stat for statx: the record answers the basic fields; more (birth
 * time, mount id, attributes) the data path's statx does. */
static __attribute__((noinline)) void served_statx(int fd, int flags, unsigned int mask, struct statx *sx)
{
    const unsigned int need = STATX_TYPE | STATX_MODE | STATX_UID | STATX_SIZE;
    char path[PATH_MAX];
    int mapped;
    int64_t slot;
    uint64_t dev = (uint64_t)makedev(sx->stx_dev_major, sx->stx_dev_minor);
    if ((sx->stx_mask & need) != need || !maybe_copy(fd, dev, S_ISREG(sx->stx_mode), sx->stx_mode, sx->stx_uid) ||
        ((slot = copy_on_fd(fd, dev, sx->stx_size, path, &mapped)) < 0 && !mapped))
        return;
    int saved = errno;
    if (slot >= 0 && __atomic_load_n(&entries[slot].state, __ATOMIC_SEQ_CST) == TIERING_STATE_INVALID &&
        (mapped || fd_to_data(fd, path, &slot)) && still_names(slot, path)) {
        unserve(fd); /* as served_stat */
        if (real_statx(fd, "", flags, mask, sx) != 0)
            errno = saved;
        return;
    }
    const struct tiering_file *f = exact_record(slot);
    if (f && !(mask & ~(unsigned int)STATX_BASIC_STATS)) {
        fill_statx(sx, &entries[slot], f);
        return;
    }
    struct statx dx;
    if ((mapped || fd_to_data(fd, path, &slot)) && real_statx(AT_FDCWD, path, flags & ~AT_EMPTY_PATH, mask, &dx) == 0 &&
        S_ISREG(dx.stx_mode) && is_the_file(slot, makedev(dx.stx_dev_major, dx.stx_dev_minor), dx.stx_ino))
        *sx = dx;
    else if ((f = slot >= 0 ? record(slot) : NULL)) /* the path names another file now: the record's */
        fill_statx(sx, &entries[slot], f);
    errno = saved;
}

/* statx: answered when the caller asks for no more than the basic fields
 * (birth time, mount id, attributes and AT_STATX_FORCE_SYNC are the PFS's) */
static inline int statx_path(int atfd, const char *path, int flags, unsigned int mask, struct statx *sx,
                             const struct tiering_header *h)
{
    int root;
    size_t rl;
    if (!(mask & ~(unsigned int)STATX_BASIC_STATS) && !(flags & ~STATX_FLAGS) &&
        maybe_catalogued(h, path, &root, &rl) && path[0]) {
        int64_t slot = answering_slot(atfd, path, root, rl, flags & AT_SYMLINK_NOFOLLOW);
        if (slot >= 0) {
            fill_statx(sx, &entries[slot], record(slot));
            return 0;
        }
    }
    int r = real_statx(atfd, path, flags, mask, sx);
    if (r == 0 && h && path && !path[0] && (flags & AT_EMPTY_PATH))
        served_statx(atfd, flags, mask, sx);
    return r;
}

static __attribute__((noinline)) int statx_link(int atfd, const char *path, int flags, unsigned int mask,
                                                struct statx *sx, const struct tiering_header *h)
{
    char data[PATH_MAX];
    if (reopened_copy(path, data))
        return statx_path(AT_FDCWD, data, flags, mask, sx, h);
    return statx_path(atfd, path, flags, mask, sx, h);
}

EXPORT int statx(int atfd, const char *path, int flags, unsigned int mask, struct statx *sx)
{
    ensure_init();
    struct tiering_header *h = __atomic_load_n(&idx, __ATOMIC_ACQUIRE);
    if (h && path && UNLIKELY(fd_link_path(path)) && !(flags & AT_SYMLINK_NOFOLLOW))
        return statx_link(atfd, path, flags, mask, sx, h);
    return statx_path(atfd, path, flags, mask, sx, h);
}

enum access_which { AW_ACCESS, AW_FACCESSAT, AW_EUIDACCESS, AW_EACCESS };

/* access(F_OK) of a catalogued path is a stat that the index answers; a
 * permission (R_OK, W_OK, X_OK) is always the kernel's: ACLs, read-only
 * mounts, root squash and server-side checks are not in the index. */
static int do_access(enum access_which w, int atfd, const char *path, int mode, int flags)
{
    ensure_init();
    struct tiering_header *h = __atomic_load_n(&idx, __ATOMIC_ACQUIRE);
    int root;
    size_t rl;
    char data[PATH_MAX];
    if (h && path && UNLIKELY(fd_link_path(path)) && !(flags & AT_SYMLINK_NOFOLLOW) && reopened_copy(path, data))
        return do_access(w, AT_FDCWD, data, mode, flags);
    if (mode == F_OK && !(flags & ~ACCESS_FLAGS) && maybe_catalogued(h, path, &root, &rl) && path[0] &&
        answering_slot(atfd, path, root, rl, flags & AT_SYMLINK_NOFOLLOW) >= 0)
        return 0;
    switch (w) {
    case AW_ACCESS: if (real.access) return real.access(path, mode); break;
    case AW_FACCESSAT: if (real.faccessat) return real.faccessat(atfd, path, mode, flags); break;
    case AW_EUIDACCESS: if (real.euidaccess) return real.euidaccess(path, mode); break;
    case AW_EACCESS: if (real.eaccess) return real.eaccess(path, mode); break;
    }
    return flags ? (int)syscall(SYS_faccessat2, atfd, path, mode, flags)
                 : (int)syscall(SYS_faccessat, atfd, path, mode);
}

EXPORT int access(const char *path, int mode) { return do_access(AW_ACCESS, AT_FDCWD, path, mode, 0); }
EXPORT int faccessat(int atfd, const char *path, int mode, int flags)
{
    return do_access(AW_FACCESSAT, atfd, path, mode, flags);
}
EXPORT int euidaccess(const char *path, int mode) { return do_access(AW_EUIDACCESS, AT_FDCWD, path, mode, AT_EACCESS); }
EXPORT int eaccess(const char *path, int mode) { return do_access(AW_EACCESS, AT_FDCWD, path, mode, AT_EACCESS); }

/* ---- operations on a descriptor: NOTE [served descriptors] ----------------- */

/* Moves fd, open on the copy st (dev, ino) of slot's file at the data
 * file's path, onto a new open of the data file (when the path still names
 * that file): opened with fd's access mode and O_NONBLOCK,
 * at fd's offset, dup3'ed over fd with its close-on-exec flag; a read of
 * another thread that moved the old offset meanwhile moves the new one
 * too.  0 on success. */
static int move_onto(int fd, const struct stat *st, const char *path, int64_t slot)
{
    int fl = (int)syscall(SYS_fcntl, fd, F_GETFL), fdfl = (int)syscall(SYS_fcntl, fd, F_GETFD);
    int old = (int)syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 0); /* the copy's description, kept a moment */
    int nfd = fl < 0 || fdfl < 0 || old < 0
                  ? -1
                  : (int)syscall(SYS_openat, AT_FDCWD, path, (fl & (O_ACCMODE | O_NONBLOCK)) | O_CLOEXEC | O_NOCTTY);
    int r = -1;
    struct stat now, opened_st;
    off_t pos = old >= 0 ? (off_t)syscall(SYS_lseek, old, 0, SEEK_CUR) : -1;
    if (nfd >= 0 && pos >= 0 && syscall(SYS_lseek, nfd, pos, SEEK_SET) == pos &&
        stat_fd(nfd, &opened_st) == 0 && (slot < 0 || is_the_file(slot, (uint64_t)opened_st.st_dev,
                                                                  (uint64_t)opened_st.st_ino)) && /* not another file at the path */
        stat_fd(fd, &now) == 0 && now.st_dev == st->st_dev && now.st_ino == st->st_ino && /* fd is still the copy */
        syscall(SYS_dup3, nfd, fd, (fdfl & FD_CLOEXEC) ? O_CLOEXEC : 0) == fd) {
        off_t after = (off_t)syscall(SYS_lseek, old, 0, SEEK_CUR);
        if (after > pos)
            syscall(SYS_lseek, fd, after, SEEK_SET);
        r = 0;
    }
    if (nfd >= 0)
        syscall(SYS_close, nfd);
    if (old >= 0)
        syscall(SYS_close, old);
    return r;
}

/* Before an operation on fd that the copy cannot stand for: when fd is open
 * on a tier copy, it and every booked descriptor of this process open on a
 * copy of the same file are moved onto the data file (move_onto; their
 * later reads come from the PFS, the same bytes), and the file is served to
 * this process no more.  When that fails nothing changes: the operation
 * acts on the copy. */
static __attribute__((noinline)) void unserve(int fd)
{
    int saved = errno;
    struct stat st, other;
    char path[PATH_MAX], path2[PATH_MAX];
    int64_t slot, slot2;
    if (stat_fd(fd, &st) == 0 && maybe_copy(fd, (uint64_t)st.st_dev, S_ISREG(st.st_mode), st.st_mode, st.st_uid) &&
        fd_to_data(fd, path, &slot)) {
        if (slot >= 0)
            serve_no_more(slot);
        int moved = move_onto(fd, &st, path, slot) == 0;
        if (moved)
            logmsg("fd %d moved from its tier copy to %s", fd, path);
        uint32_t cell = fd < MAX_TRACKED_FDS ? cell_of(fd) : NO_CELL;
        for (int k = 0; moved && slot >= 0 && k < MAX_TRACKED_FDS; k++) {
            uint64_t v = tracked(k);
            if (k == fd || !(v >> 32) || (int64_t)(uint32_t)v - 1 != slot || stat_fd(k, &other) != 0 ||
                !maybe_copy(k, (uint64_t)other.st_dev, S_ISREG(other.st_mode), other.st_mode, other.st_uid) ||
                !fd_to_data(k, path2, &slot2) || slot2 != slot)
                continue;
            if (cell != NO_CELL && cell_of(k) == cell) { /* a duplicate of fd: the same description again */
                int fdfl = (int)syscall(SYS_fcntl, k, F_GETFD);
                if (fdfl >= 0)
                    syscall(SYS_dup3, fd, k, (fdfl & FD_CLOEXEC) ? O_CLOEXEC : 0);
            } else {
                move_onto(k, &other, path2, slot);
            }
        }
    }
    errno = saved;
}

/* After fd's file changed (mode, owner, times, attributes): its record no
 * longer answers a stat, nor may a copy stand for it. */
static __attribute__((noinline)) void changed(int fd)
{
    int saved = errno;
    struct stat st;
    struct written wr = {.n = 0};
    if (stat_fd(fd, &st) == 0)
        reached(&wr, written_identity(&st));
    errno = saved;
}

#define ON_DATA(fd) (ensure_init(), idx ? unserve(fd) : (void)0)
#define CHANGED(r, fd) ((r) == 0 && idx ? changed(fd) : (void)0, (r))

EXPORT int fchmod(int fd, mode_t mode)
{
    ON_DATA(fd);
    int r = real.fchmod ? real.fchmod(fd, mode) : (int)syscall(SYS_fchmod, fd, mode);
    return CHANGED(r, fd);
}

EXPORT int fchown(int fd, uid_t u, gid_t g)
{
    ON_DATA(fd);
    int r = real.fchown ? real.fchown(fd, u, g) : (int)syscall(SYS_fchown, fd, u, g);
    return CHANGED(r, fd);
}

EXPORT int fchownat(int atfd, const char *path, uid_t u, gid_t g, int flags)
{
    int on_fd = path && !path[0] && (flags & AT_EMPTY_PATH);
    char buf[PATH_MAX];
    if (on_fd)
        ON_DATA(atfd);
    else
        path = acting_on(&atfd, path, buf, flags & AT_SYMLINK_NOFOLLOW, 1);
    int r = real.fchownat ? real.fchownat(atfd, path, u, g, flags) : (int)syscall(SYS_fchownat, atfd, path, u, g, flags);
    return on_fd ? CHANGED(r, atfd) : r;
}

EXPORT int futimens(int fd, const struct timespec ts[2])
{
    ON_DATA(fd);
    int r = real.futimens ? real.futimens(fd, ts) : (int)syscall(SYS_utimensat, fd, NULL, ts, 0);
    return CHANGED(r, fd);
}

EXPORT int futimes(int fd, const struct timeval tv[2])
{
    ON_DATA(fd);
    int r = real.futimes ? real.futimes(fd, tv) : without_libc();
    return CHANGED(r, fd);
}

EXPORT int utimensat(int atfd, const char *path, const struct timespec ts[2], int flags)
{
    char buf[PATH_MAX];
    if (!path)
        ON_DATA(atfd);
    else
        path = acting_on(&atfd, path, buf, flags & AT_SYMLINK_NOFOLLOW, 1);
    int r = real.utimensat ? real.utimensat(atfd, path, ts, flags)
                           : (int)syscall(SYS_utimensat, atfd, path, ts, flags);
    return !path ? CHANGED(r, atfd) : r;
}

EXPORT int fsetxattr(int fd, const char *name, const void *value, size_t size, int flags)
{
    ON_DATA(fd);
    int r = real.fsetxattr ? real.fsetxattr(fd, name, value, size, flags)
                           : (int)syscall(SYS_fsetxattr, fd, name, value, size, flags);
    return CHANGED(r, fd);
}

EXPORT int fremovexattr(int fd, const char *name)
{
    ON_DATA(fd);
    int r = real.fremovexattr ? real.fremovexattr(fd, name) : (int)syscall(SYS_fremovexattr, fd, name);
    return CHANGED(r, fd);
}

EXPORT ssize_t fgetxattr(int fd, const char *name, void *value, size_t size)
{
    ON_DATA(fd);
    return real.fgetxattr ? real.fgetxattr(fd, name, value, size) : syscall(SYS_fgetxattr, fd, name, value, size);
}

EXPORT ssize_t flistxattr(int fd, char *list, size_t size)
{
    ON_DATA(fd);
    return real.flistxattr ? real.flistxattr(fd, list, size) : syscall(SYS_flistxattr, fd, list, size);
}

EXPORT int flock(int fd, int op)
{
    ON_DATA(fd);
    return real.flock ? real.flock(fd, op) : (int)syscall(SYS_flock, fd, op);
}

EXPORT int lockf(int fd, int cmd, off_t len)
{
    ON_DATA(fd);
    return real.lockf ? real.lockf(fd, cmd, len) : without_libc();
}

EXPORT int lockf64(int fd, int cmd, off64_t len)
{
    ON_DATA(fd);
    return real.lockf64 ? real.lockf64(fd, cmd, len) : without_libc();
}

EXPORT int fstatfs(int fd, struct statfs *buf)
{
    ON_DATA(fd);
    return real.fstatfs ? real.fstatfs(fd, buf) : (int)syscall(SYS_fstatfs, fd, buf);
}

EXPORT int fstatfs64(int fd, struct statfs64 *buf)
{
    ON_DATA(fd);
    return real.fstatfs64 ? real.fstatfs64(fd, buf) : (int)syscall(SYS_fstatfs, fd, buf);
}

EXPORT int fstatvfs(int fd, struct statvfs *buf)
{
    ON_DATA(fd);
    return real.fstatvfs ? real.fstatvfs(fd, buf) : without_libc();
}

EXPORT int fstatvfs64(int fd, struct statvfs64 *buf)
{
    ON_DATA(fd);
    return real.fstatvfs64 ? real.fstatvfs64(fd, buf) : without_libc();
}

#define ON_DATA_PATH(path) \
    char data_[PATH_MAX];  \
    int at_ = AT_FDCWD;    \
    path = acting_on(&at_, path, data_, 0, 0)

EXPORT int statfs(const char *path, struct statfs *buf)
{
    ON_DATA_PATH(path);
    return real.statfs ? real.statfs(path, buf) : (int)syscall(SYS_statfs, path, buf);
}

EXPORT int statfs64(const char *path, struct statfs64 *buf)
{
    ON_DATA_PATH(path);
    return real.statfs64 ? real.statfs64(path, buf) : (int)syscall(SYS_statfs, path, buf);
}

EXPORT int statvfs(const char *path, struct statvfs *buf)
{
    ON_DATA_PATH(path);
    return real.statvfs ? real.statvfs(path, buf) : without_libc();
}

EXPORT int statvfs64(const char *path, struct statvfs64 *buf)
{
    ON_DATA_PATH(path);
    return real.statvfs64 ? real.statvfs64(path, buf) : without_libc();
}

EXPORT ssize_t getxattr(const char *path, const char *name, void *value, size_t size)
{
    ON_DATA_PATH(path);
    return real.getxattr ? real.getxattr(path, name, value, size) : syscall(SYS_getxattr, path, name, value, size);
}

EXPORT ssize_t listxattr(const char *path, char *list, size_t size)
{
    ON_DATA_PATH(path);
    return real.listxattr ? real.listxattr(path, list, size) : syscall(SYS_listxattr, path, list, size);
}

/* ---- credentials ------------------------------------------------------------- */

/* The process is changing its credentials: from now on it may reach other
 * paths than the scan did, so stats go to the kernel (not in a vfork child,
 * which shares our memory and is about to exec). */
static void credentials_change(void)
{
    ensure_init();
    if (!in_vfork_child())
        __atomic_store_n(&scanners_ids, 0, __ATOMIC_RELAXED);
}


#define CALL_REAL(name, ...) (credentials_change(), real.name ? real.name(__VA_ARGS__) : without_libc())
EXPORT int setuid(uid_t u) { return CALL_REAL(setuid, u); }
EXPORT int setgid(gid_t g) { return CALL_REAL(setgid, g); }
EXPORT int seteuid(uid_t u) { return CALL_REAL(seteuid, u); }
EXPORT int setegid(gid_t g) { return CALL_REAL(setegid, g); }
EXPORT int setreuid(uid_t r, uid_t e) { return CALL_REAL(setreuid, r, e); }
EXPORT int setregid(gid_t r, gid_t e) { return CALL_REAL(setregid, r, e); }
EXPORT int setresuid(uid_t r, uid_t e, uid_t s) { return CALL_REAL(setresuid, r, e, s); }
EXPORT int setresgid(gid_t r, gid_t e, gid_t s) { return CALL_REAL(setresgid, r, e, s); }
EXPORT int setgroups(size_t n, const gid_t *list) { return CALL_REAL(setgroups, n, list); }
EXPORT int initgroups(const char *user, gid_t g) { return CALL_REAL(initgroups, user, g); }
EXPORT int setfsuid(uid_t u) { return CALL_REAL(setfsuid, u); }
EXPORT int setfsgid(gid_t g) { return CALL_REAL(setfsgid, g); }
EXPORT int capset(void *head, const void *data)
{
    credentials_change();
    return real.capset ? real.capset(head, data) : (int)syscall(SYS_capset, head, data);
}
