/*
 * tiering.h - the one definition of the shared index and event ring.
 *
 * The placement daemon (Python, tiering/placement/index.py) writes this layout into one
 * file under a private 0700 directory in /dev/shm; every process of the job
 * maps it read-mostly through libtiershim.so.  Python does not keep a copy of
 * these definitions: it reads the text between the CDEF markers below and
 * hands it to cffi's cdef, so this header is the single source of truth.
 * Everything between the markers must therefore stay plain C that cffi
 * understands: integer #defines, fixed-width types, no expressions.
 *
 * File layout: the header, the entry table (nslots entries, open addressing
 * on the path fingerprint), the identity table (nslots uint32 words, open
 * addressing on the file's device and inode), the file records (nfiles, one
 * per catalogued path, in the order the catalog gave them; an entry names
 * its record), the event ring.
 *
 * Concurrency rules:
 *  - The header, the root and tier tables, the identity table, the file
 *    records and every entry field but state and opens are written once,
 *    before the command starts, and never change; except in an index
 *    written from names first (header.filling set, NOTE [names first] in
 *    docs/design.md): there the entries' sizes, the records, the identity
 *    table and the alias rings are filled while the command runs, each
 *    record's TIERING_FILE_COMPLETE flag stored last.
 *  - Afterwards only entry.state, entry.opens, the counters, the write log
 *    and the ring change, with atomic operations (__atomic builtins in C,
 *    tiering_* helpers from Python).
 */
#ifndef TIERING_H
#define TIERING_H
#include <stdint.h>
#include <stddef.h>
#include <time.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

/* BEGIN CDEF */
#define TIERING_MAGIC 0x5845444e49524954
#define TIERING_VERSION 11
#define TIERING_MAX_ROOTS 16
#define TIERING_MAX_TIERS 4
#define TIERING_PATH_MAX 512

/* entry.state: 0 = no copy; 1..TIERING_MAX_TIERS = a complete copy is in tier
 * (state - 1); TIERING_STATE_INVALID = the file was opened for writing during
 * the job, through any of its paths: never serve a copy of it again (sticky);
 * TIERING_STATE_COPYING | (tier + 1) = a copy to that tier is being read from
 * the PFS: a read-only open waits for it (a futex on the state word, at most
 * header.copy_wait_ns) instead of reading the file a second time (NOTE [one
 * read per file], docs/design.md); TIERING_STATE_QUEUED | (tier + 1) = a copy
 * to that tier is queued near the head of the tier's queue (the next to be
 * made): a read-only open steps back its open count and waits for it (at
 * most header.queue_wait_ns), so that the copy, not the open, reads the file
 * (NOTE [queued copies]); the copy's claim takes it from QUEUED or NONE. */
#define TIERING_STATE_NONE 0
#define TIERING_STATE_INVALID 255
#define TIERING_STATE_COPYING 0x100
#define TIERING_STATE_QUEUED 0x200
#define TIERING_STATE_TIER 0xff   /* the tier + 1 of a COPYING or QUEUED state */
#define TIERING_STATE_PENDING 0x300  /* COPYING | QUEUED: an open may wait on it */

/* root.flags (informational: the shim resolves ".." only into real paths) */
#define TIERING_ROOT_HAS_DIR_LINKS 1

/* file.flags */
#define TIERING_FILE_STAT 1     /* the stat fields are this job's own scan of
                                   the path: stat, fstatat, statx and
                                   access(F_OK) are answered from them (NOTE
                                   [stat from the index], docs/design.md) */
#define TIERING_FILE_NO_LINK 2  /* the catalogued path itself is not a symlink:
                                   an O_NOFOLLOW open may be served from a
                                   tier and an lstat from the index (unset:
                                   a symlink, or not known) */
#define TIERING_FILE_COMPLETE 4 /* the record is filled (stored last, with
                                   release; read first, with acquire): an
                                   entry whose record is not complete is
                                   not catalogued for redirects and stat
                                   answers (NOTE [names first]) */
#define TIERING_FILE_VERIFIED 8 /* the daemon's last copy of the file found
                                   its source as the record says (identity,
                                   mode, owner, links, size, times): the fstat
                                   of a descriptor served from a tier is
                                   answered from the record (atomic or / and,
                                   set before the copy is published; NOTE
                                   [served descriptors], docs/design.md) */

/* header.scan_caps: CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, as bits of
 * the kernel's capability sets */
#define TIERING_CAP_DAC_OVERRIDE 1
#define TIERING_CAP_DAC_READ_SEARCH 2

/* event.kind */
#define TIERING_EV_OPEN_PFS 1
#define TIERING_EV_OPEN_TIER 2
#define TIERING_EV_CLOSE 3
#define TIERING_EV_WRITE 4

struct tiering_root {
    uint32_t len;    /* strlen(path), no trailing slash (except "/") */
    uint32_t id;     /* data-root id; an alias (realpath of a symlinked root)
                        carries the id of the root it stands for */
    uint32_t flags;  /* TIERING_ROOT_* */
    uint32_t reserved;
    uint64_t dev;    /* tier roots: st_dev and st_ino of the directory the   */
    uint64_t ino;    /* daemon made, checked by the shim; 0 for data roots   */
    char path[512];
};

/* One slot of the path table: what an open needs, in 40 bytes. */
struct tiering_entry {
    uint64_t fp_lo;      /* 128-bit fingerprint of the path relative to its */
    uint64_t fp_hi;      /* root; (0, 0) marks an empty slot                */
    uint32_t state;      /* atomic, see TIERING_STATE_*                     */
    uint32_t root;       /* data-root id                                    */
    uint64_t size;       /* bytes, from the scan                            */
    uint32_t file;       /* the path's record in the file records           */
    uint32_t opens;      /* successful read-only opens of this path, from a */
                         /* tier or the PFS (relaxed atomic add; wraps at   */
                         /* 2^32): NOTE [open counters], docs/design.md     */
};

/* What the scan's stat of one catalogued path (symlinks followed) saw, and
 * the ring of the paths of the same file; 72 bytes, one per path. */
struct tiering_file {
    uint64_t ino;        /* st_ino (0: unknown identity)                    */
    int64_t mtime_ns;    /* st_mtim, st_atim, st_ctim in ns since the epoch */
    int64_t atime_ns;
    int64_t ctime_ns;
    int64_t blocks;      /* st_blocks                                       */
    uint32_t dev;        /* st_dev (32 bits: all of it on Linux)            */
    uint32_t mode;       /* st_mode                                         */
    uint32_t uid;
    uint32_t gid;
    uint32_t nlink;
    uint32_t blksize;
    uint32_t next_alias; /* slot of the next entry of a file with the same  */
                         /* identity (a hard link, a symlink): a ring,      */
                         /* its own slot when alone (NOTE [alias            */
                         /* invalidation], docs/design.md)                  */
    uint32_t flags;      /* TIERING_FILE_*                                  */
};

/* The identity of a file opened for writing while the index was filled
 * (NOTE [names first]): looked up again once the identity table is whole. */
struct tiering_written {
    uint64_t ino;
    uint32_t dev;
    uint32_t pad;
};

struct tiering_event {
    uint64_t seq;    /* position + 1 once the record is complete; 0 while it
                        is written (seqlock) */
    uint32_t entry;  /* slot index in the entry table */
    uint32_t pid;
    uint16_t kind;   /* TIERING_EV_* */
    uint16_t tier;   /* tier index for TIERING_EV_OPEN_TIER; for
                        TIERING_EV_CLOSE where the descriptor was opened:
                        0 the PFS, k + 1 tier k */
    uint32_t tag;    /* the posting thread's tag (tiering_set_tag), 0: none */
    uint64_t bytes;  /* TIERING_EV_CLOSE: bytes read through the descriptor's
                        open file, by its file position, not yet posted by an
                        earlier close of a duplicate (NOTE [read counters]) */
};

struct tiering_counters {
    /* opens of catalogued files: the sum of entry.opens (NOTE [open
       counters]); those served from the PFS: that sum less opens_tier's */
    uint64_t opens_tier[4];          /* served from tier k                  */
    uint64_t bytes_tier;             /* sizes of the files served from tiers */
    uint64_t fallbacks;              /* copy vanished between lookup and open */
    uint64_t writes;                 /* write opens, renames, unlinks,
                                        truncates and inherited write fds
                                        that reached catalogued files (by
                                        path or by identity)                */
    uint64_t events_dropped;         /* ring full (counted by the daemon)   */
    /* NOTE [read counters], docs/design.md: the bytes read through the
       descriptors of catalogued files, by their file position when they
       are closed (a pread or mmap reader leaves it at 0) */
    uint64_t read_pfs;               /* opened on the PFS                   */
    uint64_t read_tier;              /* opened on a tier copy               */
    uint64_t closed_at_zero;         /* open files closed at position 0     */
    uint64_t closed_at_zero_bytes;   /* their catalogued sizes              */
};

struct tiering_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_size;    /* sizeof(struct tiering_header) */
    uint32_t entry_size;     /* sizeof(struct tiering_entry)  */
    uint32_t event_size;     /* sizeof(struct tiering_event)  */
    uint64_t nslots;         /* entry table slots, a power of two */
    uint64_t nentries;       /* slots in use */
    uint64_t nevents;        /* ring slots, a power of two */
    uint64_t entries_offset; /* from the start of the file */
    uint64_t idents_offset;  /* nslots uint32: slot + 1 of one entry of each
                                identity (0: empty), probed by identity_hash */
    uint64_t ring_offset;
    uint64_t total_size;
    uint32_t nroots;
    uint32_t ntiers;
    uint32_t daemon_pid;
    uint32_t disabled;       /* atomic; non-zero: the shim redirects nothing
                                and answers no stat */
    uint64_t files_offset;   /* nfiles struct tiering_file */
    uint64_t nfiles;
    uint32_t file_size;      /* sizeof(struct tiering_file) */
    uint32_t scan_uid;       /* the credentials the scan ran with: a stat is */
    uint32_t scan_gid;       /* answered only to a process with the same     */
    uint32_t filling;        /* (NOTE [stat from the index]); atomic: non-zero
                                while the records are filled (NOTE [names
                                first]): write opens log their identities */
    uint64_t scan_groups;    /* tiering_groups_hash of its supplementary groups */
    uint64_t wlog_offset;    /* wlog_size struct tiering_written */
    uint64_t wlog_size;
    uint64_t wlog_head;      /* atomic; identities logged (more than wlog_size: lost) */
    uint32_t fill_writers;   /* atomic; write opens between their load of
                                filling and the end of their log entry */
    uint32_t scan_caps;      /* the scan's effective capabilities that pass
                                permission checks (TIERING_CAP_*): a copy is
                                served only to a process that has them all
                                (NOTE [served descriptors]) */
    struct tiering_root roots[16];
    struct tiering_root tiers[4];  /* physical prefixes, fastest first */
    struct tiering_counters counters;
    uint64_t copy_wait_ns;   /* atomic, set by the daemon: how long an open
                                waits for a copy in flight (TIERING_STATE_COPYING);
                                0: it does not wait (NOTE [one read per file]) */
    uint64_t copy_waits;     /* atomic; opens that waited for a copy in flight or queued */
    uint64_t queue_wait_ns;  /* atomic, set by the daemon: how long an open waits
                                for a queued copy (TIERING_STATE_QUEUED) to be made;
                                0: it does not wait (NOTE [queued copies]) */
    uint64_t pad[4];
    uint64_t ring_head;      /* atomic; next position a producer takes (= events
                                posted), on a cache line of its own */
    uint64_t pad2[7];
};

/* Helpers exported by libtiershim.so for the daemon (loaded with dlopen). */
void tiering_fingerprint(uint32_t root, const char *rel, size_t len, uint64_t out[2]);
int64_t tiering_index_fill(void *base, const char *blob, uint64_t blob_len,
                           const uint32_t *roots, const uint64_t *sizes, uint64_t n,
                           uint64_t *slots);
/* An index written from names first (NOTE [names first]): fills the size
 * and the record of the entries in slots from recs (every field but
 * next_alias; flags gets TIERING_FILE_COMPLETE, stored last), linking each
 * into the identity table; then, once every record is in, filled() ends the
 * fill: the files opened for writing meanwhile are invalidated by identity.
 * filled returns how many entries that invalidated, -1 when a writer did not
 * finish its log entry within wait_ns, -2 when the log overflowed (the
 * caller then disables the index). */
int64_t tiering_index_complete(void *base, const uint64_t *slots, const struct tiering_file *recs,
                               const uint64_t *sizes, uint64_t n);
int64_t tiering_index_filled(void *base, uint64_t wait_ns);
/* Compare-and-swap of a state word; a swap from a TIERING_STATE_COPYING
 * state wakes the opens waiting on it. */
int tiering_state_cas(void *base, uint64_t slot, uint32_t expected, uint32_t desired);
/* tiering_state_cas of each of n slots; swapped[i]: whether slots[i] was
 * swapped; returns how many were (the daemon's publication of a batch) */
uint64_t tiering_state_cas_many(void *base, const uint64_t *slots, uint64_t n, uint32_t expected,
                                uint32_t desired, uint8_t *swapped);
uint64_t tiering_ring_drain(void *base, uint64_t *tail, struct tiering_event *out,
                            uint64_t max, int force, uint64_t *dropped);
uint64_t tiering_groups_hash(const uint32_t *groups, uint64_t n);
/* The daemon's copy of one file (shim/tiercopy.c, NOTE [copy in C]). */
#define TIERING_COPY_OK 0
#define TIERING_COPY_STOPPED 1       /* progress() asked to stop */
#define TIERING_COPY_NOT_REGULAR 2   /* not a regular file (now a symlink, fifo, directory...) */
#define TIERING_COPY_CHANGED 3       /* another size or mtime than the catalog's */
#define TIERING_COPY_GREW 4          /* more than the catalogued size could be read */
#define TIERING_COPY_SHRANK 5
#define TIERING_COPY_SOURCE_ERROR 6  /* the source could not be opened or checked: errno in error */
#define TIERING_COPY_NO_STAGING 7    /* the staging directory is gone (ENOENT) */
#define TIERING_COPY_TARGET_ERROR 8  /* the staging file or the rename failed: errno in error */
#define TIERING_COPY_IO_ERROR 9      /* reading or writing failed (ENOSPC...): errno in error */
#define TIERING_COPY_REPLACED 10     /* the path names another file, or none, after the copy */
#define TIERING_COPY_TAKEN 11        /* claims: the state word was not NONE (placed, copying, invalid) */
#define TIERING_COPY_READ 12         /* claims: the file was opened since it was queued: the reader's
                                      * own read is its one PFS read (NOTE [one read per file]) */

struct tiering_copy {
    uint64_t size;       /* in: the catalog's size and mtime of the source  */
    int64_t mtime_ns;
    uint32_t follow;     /* in: the catalogued path is a symlink: follow it */
    int32_t error;       /* out: errno of the *_ERROR results               */
    uint64_t copied;     /* out: bytes read from the source                 */
    int64_t blocks;      /* out: st_blocks of the finished copy             */
    int32_t fd_in;       /* out of tiering_copy_open: the source's fd ...    */
    int32_t fd_out;      /* ... and the staging file's, until finish        */
    uint64_t dev;        /* out of tiering_copy_open: the source's identity, */
    uint64_t ino;        /* which its path must still name at finish        */
    int64_t source_blocks; /* out of tiering_copy_open: the source's st_blocks */
                         /* (fewer than its size needs: a sparse file)     */
    struct tiering_file *record; /* in: the file's record in the index, whose */
                         /* TIERING_FILE_VERIFIED finish sets or clears    */
                         /* (NULL: none)                                   */
};

/* Called after each step of a copy with the bytes it read; non-zero stops it. */
typedef int (*tiering_progress_fn)(void *arg, uint64_t n);
int64_t tiering_copy_range(int in, int out, uint64_t off, uint64_t len,
                           tiering_progress_fn progress, void *arg);
int tiering_copy_file(const char *src, int staging_fd, const char *name, int dst_fd,
                      const char *leaf, struct tiering_copy *c, tiering_progress_fn progress,
                      void *arg);
/* The steps of tiering_copy_file around its copy, for a copy made in parts
 * (NOTE [chunked copy]): open and check the source and create the staging
 * file; then, with the bytes copied (-1: failed, errno in c->error; -2:
 * stopped), check (the fd, and that the path src still names the file
 * copied), close and rename (or remove). */
int tiering_copy_open(const char *src, int staging_fd, const char *name, struct tiering_copy *c);
int tiering_copy_finish(struct tiering_copy *c, int64_t copied, const char *src, int staging_fd,
                        const char *name, int dst_fd, const char *leaf);
/* Many small files copied in one call (NOTE [batch copy]): the catalog's
 * columns (paths blob cut by offsets, root ids, sizes, mtimes, link flags),
 * the data roots by id, the tier's staging and data/ directories.  Each copy
 * is tiering_copy_file's, into data/<root id>/<parent>/<leaf>, the
 * directories made (0700) and opened one component at a time, never through
 * a symlink.  progress(arg, n) after each step; NULL: the copy stops when
 * *stop is non-zero (checked before each file too). */
struct tiering_batch {
    const uint8_t *paths;
    const int64_t *offsets;
    const int32_t *root;
    const int64_t *size;
    const int64_t *mtime_ns;
    const uint8_t *link;
    const char *const *roots;
    int32_t nroots;
    int32_t staging_fd;
    int32_t data_fd;
    int32_t pad;
    int64_t budget_ns;       /* return after the file that ends this long after the call began (0: never) */
    int64_t waits;           /* out: times the calling thread waited in the call (voluntary context
                              * switches: a PFS or a device to answer), NOTE [batch share] */
    const char *name;        /* the staging file's name */
    struct tiering_file *records; /* the index's file records by id (TIERING_FILE_VERIFIED), or NULL */
    const int32_t *stop;
    tiering_progress_fn progress;
    void *arg;
    /* claims (NOTE [one read per file]), when entries is not NULL: before its
     * copy each file's state word (entries[slots[id]]) goes from NONE to
     * TIERING_STATE_COPYING | claim (or from TIERING_STATE_QUEUED | claim, the
     * daemon's mark: NOTE [queued copies]), or the file is not copied (TAKEN); its
     * open counter is then compared with the file's `opens` (a changed one:
     * READ, the claim is undone); a complete copy is published by the copy
     * itself (COPYING -> claim, the waiting opens woken), a failed one goes
     * back to NONE.  Each outcome's `published` says which. */
    struct tiering_entry *entries;
    const int64_t *slots;
    uint32_t claim;          /* tier + 1 */
    uint32_t pad2;
};
/* One file of a batch: id and opens in; the rest out. */
struct tiering_batch_file {
    int64_t id;
    int32_t status;          /* TIERING_COPY_* */
    int32_t error;           /* errno of the *_ERROR statuses */
    int64_t copied;          /* bytes read from the source */
    int64_t blocks;          /* st_blocks of the copy */
    uint32_t opens;          /* in: the entry's open counter when the copy was queued */
    uint32_t published;      /* out: the copy published its state word itself */
};
/* Copies files[0..n) in order and returns k: files[0..k) have their
 * outcome; files[k..n) were not tried, because the time budget was spent
 * (they are left as they were), the batch was stopped (they say
 * TIERING_COPY_STOPPED) or files[k] found the staging directory gone (it
 * says TIERING_COPY_NO_STAGING, the rest are left as they were). */
int64_t tiering_copy_batch(struct tiering_batch *b, struct tiering_batch_file *files, int64_t n);
/* A copy's staging file `name` in staging_fd (NOTE [staging files]): its fd,
 * or -errno (-ENOENT: the staging directory is gone). */
int tiering_staging_create(int staging_fd, const char *name);
/* The catalog scan (shim/tierscan.c, NOTE [scan in C]): the entries of one
 * directory but "." and "..", in name order (bytes compared unsigned), their
 * names NUL-terminated one after another and their d_type; freed with
 * tiering_scan_list_free. */
struct tiering_scan_list {
    char *names;
    uint64_t bytes;      /* of names, NULs included */
    uint8_t *types;      /* d_type per entry (DT_UNKNOWN: the file system does not say) */
    uint64_t count;
};
/* The stat of one entry, symlinks followed (ok = 0: it cannot be stat'ed). */
struct tiering_scan_stat {
    int64_t size;
    int64_t mtime_ns;
    int64_t atime_ns;
    int64_t ctime_ns;
    int64_t blocks;
    int64_t blksize;
    uint64_t dev;
    uint64_t ino;
    uint64_t nlink;
    uint32_t mode;
    uint32_t uid;
    uint32_t gid;
    uint8_t ok;
    uint8_t link;        /* the entry itself is a symlink */
    uint16_t pad;
};
/* 0 or the errno of opening or reading the directory. */
int tiering_scan_list(const char *dir, struct tiering_scan_list *out);
void tiering_scan_list_free(struct tiering_scan_list *l);
/* count entries of a list (names, types) stat'ed from dir into out; 0, or the
 * errno of opening dir (then every entry has ok = 0). */
int tiering_scan_stat(const char *dir, const char *names, const uint8_t *types, uint64_t count,
                      struct tiering_scan_stat *out);
/* The first k (0 <= k < n - 1) whose path is not below path k + 1 in byte
 * order (bytes compared unsigned, a prefix first), or -1 when the n paths
 * (path k: blob[offsets[k]..offsets[k + 1])) ascend strictly: a cached catalog
 * names no file twice (NOTE [catalog cache format]). */
int64_t tiering_scan_ascending(const uint8_t *blob, const int64_t *offsets, int64_t n);
/* The calling thread's tag, posted with each of its events (NOTE [open tags]). */
void tiering_set_tag(uint32_t tag);
uint32_t tiering_get_tag(void);
/* The tier a read-only open of path would be served from now, or -1 (the
 * path itself); opens nothing, posts nothing. */
int tiering_where(const char *path);
/* END CDEF */

/* C-only checks that the literal array sizes above match the constants. */
_Static_assert(sizeof(((struct tiering_root *)0)->path) == TIERING_PATH_MAX, "path size");
_Static_assert(sizeof(((struct tiering_header *)0)->roots) ==
               TIERING_MAX_ROOTS * sizeof(struct tiering_root), "roots size");
_Static_assert(sizeof(((struct tiering_header *)0)->tiers) ==
               TIERING_MAX_TIERS * sizeof(struct tiering_root), "tiers size");
_Static_assert(sizeof(((struct tiering_counters *)0)->opens_tier) ==
               TIERING_MAX_TIERS * sizeof(uint64_t), "opens_tier size");
_Static_assert(sizeof(struct tiering_entry) == 40, "entry size");
_Static_assert(sizeof(struct tiering_file) == 72, "file record size");
_Static_assert(sizeof(struct tiering_event) == 32, "event size");
_Static_assert(offsetof(struct tiering_header, ring_head) % 64 == 0, "ring_head on a cache line of its own");

/* The opens waiting on a state word (TIERING_STATE_COPYING) woken: a shared
 * futex, they are other processes (NOTE [one read per file]). */
static inline void tiering_wake(uint32_t *state)
{
    syscall(SYS_futex, state, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

static inline struct tiering_entry *tiering_entries(void *base)
{
    return (struct tiering_entry *)((char *)base +
                                    ((struct tiering_header *)base)->entries_offset);
}

static inline struct tiering_file *tiering_files(void *base)
{
    return (struct tiering_file *)((char *)base + ((struct tiering_header *)base)->files_offset);
}

static inline uint32_t *tiering_idents(void *base)
{
    return (uint32_t *)((char *)base + ((struct tiering_header *)base)->idents_offset);
}

/* Where the identity table's probe for (dev, ino) starts, before the mask. */
static inline uint64_t tiering_identity_hash(uint32_t dev, uint64_t ino)
{
    uint64_t k = ino ^ ((uint64_t)dev << 32 | dev) * 0x9e3779b97f4a7c15ULL;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

/* A time of the kernel's stat in nanoseconds since the epoch (the catalog's unit). */
static inline int64_t tiering_ns(struct timespec t)
{
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline struct tiering_event *tiering_ring(void *base)
{
    return (struct tiering_event *)((char *)base +
                                    ((struct tiering_header *)base)->ring_offset);
}

#endif
