/* The planner's core in C (NOTE [planner core] in docs/design.md): the
 * fetch/evict loop and the reader's consumption over the arrays of
 * tiering/clairvoyant/planner.py's Planner, making the decisions its Python
 * code makes.  Python owns every array; this code only reads and writes them.
 * Between the CDEF markers: what cffi is given. */
#ifndef TIERPLAN_H
#define TIERPLAN_H
#include <stddef.h>
#include <stdint.h>

/* BEGIN CDEF */
typedef struct {
    int32_t levels;            /* levels of the 64-ary tree, level 0 first */
    uint64_t *lv[8];           /* the bit words of each level */
} tp_bits;

/* What the loops read of a file, one record: a position's reading, a fetch,
 * an eviction and a link each touch one cache line of it rather than one
 * per array (NOTE [planner records] in docs/design.md).  Planner._need,
 * _done, _last and _alloc are its columns (32-byte aligned). */
typedef struct {
    int64_t need;              /* next unconsumed use, TP_INF: none known */
    int64_t done;              /* latest position consumed or skipped */
    int64_t last;              /* latest position known (extend) */
    int64_t alloc;             /* bytes a copy takes in a tier */
} tp_file;

typedef struct {
    /* per file */
    int8_t *tier;              /* tier holding it, -1: none */
    tp_file *file;
    const int32_t *uses;       /* known uses */
    const int64_t *size;       /* bytes read from the PFS */
    const uint8_t *pin;        /* kept once held: never a victim (NULL: none is) */
    /* per stream position held (base .. base + n) */
    int32_t *stream;
    int64_t *next;
    uint8_t *cons;
    int64_t base, n, cursor, reader, window;   /* window < 0: none */
    int64_t trim_min, n_resident;
    /* per tier */
    int32_t tiers;
    const int64_t *cap;
    int64_t *used;
    int64_t *idle_n;
    int64_t pos0;
    tp_bits *by_need;          /* [tiers]: need positions - pos0 of the tier's files */
    int32_t n_uses;            /* idle sets per tier, one per value of uses */
    const int32_t *idle_uses;  /* [n_uses] the values, ascending */
    const int32_t *uses_slot;  /* [max uses + 1] value -> index in idle_uses */
    tp_bits *idle;             /* [tiers * n_uses]: files with no known next use */
    /* the actions taken, counted, and logged when keep_log (the log is
     * grown by the C code; tp_free releases it) */
    int64_t fetches, evictions, fetch_bytes;
    int32_t keep_log;
    int64_t log_n, log_cap;
    int8_t *log_kind, *log_tier;
    int64_t *log_file, *log_position, *log_need;
    /* the reader's figures (simulate) */
    int64_t accesses, pfs_reads, pfs_bytes;
    int64_t *hits;             /* [tiers] */
    int64_t *victims;          /* scratch, grown by the C code */
    int64_t victims_cap;
} tp_plan;

int tp_advance(tp_plan *p);
int64_t tp_run(tp_plan *p, int64_t pos, int64_t stop, int64_t log_limit);
void tp_free(tp_plan *p);
size_t tp_plan_size(void);   /* what Python checks its view of tp_plan against */
/* extend: for the k positions from start (already in stream): each one's
 * link from the file's previous position (its record's last, updated); the
 * files whose first known use it is, with that position, into fresh_*;
 * returns how many */
int64_t tp_link(tp_plan *p, int64_t start, int64_t k, int64_t *fresh_file, int64_t *fresh_pos);
/* uses[f] += 1 for each of the k files of stream */
void tp_count(int32_t *uses, const int32_t *stream, int64_t k);
/* END CDEF */

#endif
