/* The planner's core: Planner._advance, _quiet_until and the reader of
 * simulate() over the Planner's own arrays, one position and one file at a
 * time (NOTE [planner core] in docs/design.md).  Every rule is the one of
 * tiering/clairvoyant/planner.py, which stays the reference and the fallback;
 * the tests compare the two action for action. */
#include <stdlib.h>
#include <string.h>

#include "plancore.h"

#define TP_INF ((int64_t)1 << 62)
#define TP_SCAN 64
#define TP_AHEAD 16   /* positions ahead whose file's entries the loops ask the caches for */
#define TP_FETCH 0
#define TP_EVICT 1

/* ---- the 64-ary bit trees of bitset.py ---- */

static void bits_add(tp_bits *b, int64_t i)
{
    for (int32_t k = 0; k < b->levels; k++) {
        int64_t w = i >> 6;
        uint64_t old = b->lv[k][w];
        b->lv[k][w] = old | (UINT64_C(1) << (i & 63));
        if (old)
            return;
        i = w;
    }
}

static void bits_discard(tp_bits *b, int64_t i)
{
    for (int32_t k = 0; k < b->levels; k++) {
        int64_t w = i >> 6;
        uint64_t left = b->lv[k][w] & ~(UINT64_C(1) << (i & 63));
        b->lv[k][w] = left;
        if (left)
            return;
        i = w;
    }
}

static int64_t bits_max(const tp_bits *b)
{
    uint64_t top = b->lv[b->levels - 1][0];
    if (!top)
        return -1;
    int64_t i = 63 - __builtin_clzll(top);
    for (int32_t k = b->levels - 2; k >= 0; k--)
        i = (i << 6) | (63 - __builtin_clzll(b->lv[k][i]));
    return i;
}

static int64_t bits_min(const tp_bits *b)
{
    uint64_t top = b->lv[b->levels - 1][0];
    if (!top)
        return -1;
    int64_t i = __builtin_ctzll(top);
    for (int32_t k = b->levels - 2; k >= 0; k--)
        i = (i << 6) | __builtin_ctzll(b->lv[k][i]);
    return i;
}

/* ---- the log and the scratch list ---- */

static int grow(void **ptr, int64_t n, size_t each)
{
    void *q = realloc(*ptr, (size_t)n * each);
    if (!q)
        return -1;
    *ptr = q;
    return 0;
}

static int log_one(tp_plan *p, int kind, int64_t f, int tier, int64_t position, int64_t need)
{
    if (kind == TP_FETCH) {
        p->fetches++;
        p->fetch_bytes += p->size[f];
    } else {
        p->evictions++;
    }
    if (!p->keep_log)
        return 0;
    if (p->log_n == p->log_cap) {
        int64_t cap = p->log_cap ? 2 * p->log_cap : 4096;
        if (grow((void **)&p->log_kind, cap, 1) || grow((void **)&p->log_tier, cap, 1) ||
            grow((void **)&p->log_file, cap, 8) || grow((void **)&p->log_position, cap, 8) ||
            grow((void **)&p->log_need, cap, 8))
            return -1;
        p->log_cap = cap;
    }
    int64_t k = p->log_n++;
    p->log_kind[k] = (int8_t)kind;
    p->log_tier[k] = (int8_t)tier;
    p->log_file[k] = f;
    p->log_position[k] = position;
    p->log_need[k] = need;
    return 0;
}

size_t tp_plan_size(void)
{
    return sizeof(tp_plan);
}

void tp_free(tp_plan *p)
{
    free(p->log_kind);
    free(p->log_tier);
    free(p->log_file);
    free(p->log_position);
    free(p->log_need);
    free(p->victims);
    p->log_kind = p->log_tier = NULL;
    p->log_file = p->log_position = p->log_need = p->victims = NULL;
    p->log_n = p->log_cap = p->victims_cap = 0;
}

/* ---- the victim sets: _mark (hold, unhold), _enter, _leave, _victim ---- */

static tp_bits *idle_set(tp_plan *p, int64_t f, int tier)
{
    return &p->idle[(int64_t)tier * p->n_uses + p->uses_slot[p->uses[f]]];
}

static void hold(tp_plan *p, int64_t f, int tier, int64_t need)
{
    if (p->pin && p->pin[f])
        return;
    if (need != TP_INF) {
        bits_add(&p->by_need[tier], need - p->pos0);
    } else {
        bits_add(idle_set(p, f, tier), f);
        p->idle_n[tier]++;
    }
}

static void unhold(tp_plan *p, int64_t f, int tier, int64_t need)
{
    if (p->pin && p->pin[f])
        return;
    if (need != TP_INF) {
        bits_discard(&p->by_need[tier], need - p->pos0);
    } else {
        bits_discard(idle_set(p, f, tier), f);
        p->idle_n[tier]--;
    }
}

static void enter(tp_plan *p, int64_t f, int tier)
{
    p->tier[f] = (int8_t)tier;
    p->used[tier] += p->file[f].alloc;
    p->n_resident++;
    hold(p, f, tier, p->file[f].need);
}

/* f leaves the tier it is in, whose need is `need` (the victim's, known
 * from the victim set: its entries are not read again) */
static void leave(tp_plan *p, int64_t f, int tier, int64_t need)
{
    unhold(p, f, tier, need);
    p->tier[f] = -1;
    p->used[tier] -= p->file[f].alloc;
    p->n_resident--;
}

/* The file to evict first among these tiers: no known next use (fewest
 * uses, then lowest id), else the farthest need.  0 when there is none. */
static int victim(tp_plan *p, const int32_t *cand, int ncand, int64_t *file, int *tier, int64_t *need)
{
    int64_t best_f = -1;
    int32_t best_u = 0;
    for (int c = 0; c < ncand; c++) {
        int t = cand[c];
        if (!p->idle_n[t])
            continue;
        for (int32_t s = 0; s < p->n_uses; s++) {
            int64_t f = bits_min(&p->idle[(int64_t)t * p->n_uses + s]);
            if (f < 0)
                continue;
            int32_t u = p->idle_uses[s];
            if (best_f < 0 || u < best_u || (u == best_u && f < best_f)) {
                best_f = f;
                best_u = u;
                *tier = t;
            }
            break;
        }
    }
    if (best_f >= 0) {
        *file = best_f;
        *need = TP_INF;
        return 1;
    }
    int64_t far = -1;
    for (int c = 0; c < ncand; c++) {
        int64_t q = bits_max(&p->by_need[cand[c]]);
        if (q > far) {
            far = q;
            *tier = cand[c];
        }
    }
    if (far < 0)
        return 0;
    *need = far + p->pos0;
    int64_t r = *need - p->base, f = p->stream[r];
    /* the victim's entries are cold (it is the file needed last): the two
     * leave() reads overlap instead of following each other.  The next
     * victim is most often the file needed just before it, the next bit of
     * its word of the set: that file's entries are asked for a make_room()
     * ahead.  Its need is not read: it is the position found here. */
    __builtin_prefetch(&p->file[f], 1);
    __builtin_prefetch(&p->tier[f], 1);
    uint64_t below = p->by_need[*tier].lv[0][far >> 6] & ((UINT64_C(1) << (far & 63)) - 1);
    if (below) {
        int64_t g = p->stream[(far & ~(int64_t)63) + 63 - __builtin_clzll(below) + p->pos0 - p->base];
        __builtin_prefetch(&p->file[g], 1);
        __builtin_prefetch(&p->tier[g], 1);
    }
    *file = f;
    return 1;
}

/* ---- placement: _make_room, _next_wanted, _fill_free, _advance ---- */

/* The tier f goes to once room is made (evictions logged), -1 when every
 * resident file is needed sooner than `need`, -2 when out of memory. */
static int make_room(tp_plan *p, int64_t f, int64_t need)
{
    int64_t size = p->file[f].alloc;
    int32_t cand[128];
    int ncand = 0;
    for (int k = 0; k < p->tiers && ncand < 128; k++)
        if (size <= p->cap[k])
            cand[ncand++] = k;
    int64_t nv = 0;
    for (;;) {
        for (int c = 0; c < ncand; c++) {
            int k = cand[c];
            if (p->cap[k] - p->used[k] < size)
                continue;
            for (int64_t i = 0; i < nv; i++) {
                int64_t v = p->victims[2 * i];
                int t = (int)p->victims[2 * i + 1];
                if (t == k) {
                    if (log_one(p, TP_EVICT, v, t, p->reader, -1))
                        return -2;
                } else {
                    enter(p, v, t);   /* it made no room where f goes: it stays */
                }
            }
            return k;
        }
        int64_t v, vneed;
        int vt;
        if (!victim(p, cand, ncand, &v, &vt, &vneed) || vneed <= need) {
            for (int64_t i = 0; i < nv; i++)
                enter(p, p->victims[2 * i], (int)p->victims[2 * i + 1]);
            return -1;
        }
        if (nv == p->victims_cap) {
            int64_t cap = nv ? 2 * nv : 64;
            if (grow((void **)&p->victims, 2 * cap, 8))
                return -2;
            p->victims_cap = cap;
        }
        p->victims[2 * nv] = v;
        p->victims[2 * nv + 1] = vt;
        leave(p, v, vt, vneed);
        nv++;
    }
}

/* The largest capacity: a file fits some tier when its allocation is no
 * larger (Planner._fits), checked on alloc[], which the fetch reads anyway,
 * instead of a line of one more array per position scanned. */
static int64_t largest_cap(const tp_plan *p)
{
    int64_t m = -1;
    for (int k = 0; k < p->tiers; k++)
        if (p->cap[k] > m)
            m = p->cap[k];
    return m;
}

static int64_t next_wanted(const tp_plan *p, int64_t pos)
{
    int64_t end = p->base + p->n, fits = largest_cap(p);
    for (; pos < end; pos++) {
        int64_t r = pos - p->base, f = p->stream[r];
        /* the entries of the files fetched next are cold: tier[] of the
         * file TP_AHEAD positions on, and once that is in, the entries a
         * fetch reads of the one TP_AHEAD / 2 on, if it is not placed (asking
         * for those of every file kept the loads waiting for room to ask) */
        if (pos + TP_AHEAD < end)
            __builtin_prefetch(&p->tier[p->stream[r + TP_AHEAD]]);
        if (pos + TP_AHEAD / 2 < end) {
            int64_t g = p->stream[r + TP_AHEAD / 2];
            if (p->tier[g] < 0) {
                __builtin_prefetch(&p->file[g]);
                __builtin_prefetch(&p->size[g]);
            }
        }
        if (p->tier[f] < 0 && !p->cons[r] && p->file[f].alloc <= fits)
            return pos;
    }
    return end;
}

static int room_for(const tp_plan *p, int64_t a)
{
    for (int k = 0; k < p->tiers; k++)
        if (p->cap[k] - p->used[k] >= a)
            return k;
    return -1;
}

/* Fetches into free room from pos on; the first position whose file finds
 * none (or the end); -2 when out of memory. */
static int64_t fill_free(tp_plan *p, int64_t pos)
{
    int64_t end = p->base + p->n;
    for (;;) {
        pos = next_wanted(p, pos);
        if (pos >= end)
            return end;
        int64_t f = p->stream[pos - p->base];
        int tier = room_for(p, p->file[f].alloc);
        if (tier < 0)
            return pos;
        enter(p, f, tier);
        if (log_one(p, TP_FETCH, f, tier, p->reader, pos))
            return -2;
        pos++;
    }
}

int tp_advance(tp_plan *p)
{
    int64_t end = p->base + p->n;
    int64_t window_end = p->window < 0 ? TP_INF : p->reader + p->window;
    if (p->cursor < p->reader)
        p->cursor = p->reader;
    while (p->cursor < end) {
        int64_t pos = fill_free(p, p->cursor);
        if (pos < 0)
            return -1;
        p->cursor = pos;
        if (pos >= end || pos >= window_end)
            return 0;
        int64_t f = p->stream[pos - p->base];
        int tier = make_room(p, f, pos);
        if (tier == -2)
            return -1;
        if (tier < 0)
            return 0;
        enter(p, f, tier);
        if (log_one(p, TP_FETCH, f, tier, p->reader, pos))
            return -1;
        p->cursor = pos + 1;
    }
    return 0;
}

/* ---- extend: the links of the positions appended ---- */

/* The loop reads a file's last use and need (one record) and writes
 * next[] of its last use at random for each position: two cache misses on
 * a catalog of a million files.  It asks for them ahead (the stream is read
 * in order): the record of the file TP_AHEAD positions on, next[] of the one
 * TP_AHEAD / 2 on (its record asked for before); hints only. */

int64_t tp_link(tp_plan *p, int64_t start, int64_t k, int64_t *fresh_file, int64_t *fresh_pos)
{
    int64_t fresh = 0;
    const int32_t *s = p->stream + (start - p->base);
    for (int64_t i = 0; i < k; i++) {
        if (i + TP_AHEAD < k) {
            __builtin_prefetch(&p->file[s[i + TP_AHEAD]], 1);
        }
        if (i + TP_AHEAD / 2 < k) {
            int64_t q = p->file[s[i + TP_AHEAD / 2]].last;
            if (q >= p->base)
                __builtin_prefetch(&p->next[q - p->base], 1);
        }
        int64_t pos = start + i, f = s[i], prev = p->file[f].last;
        if (prev >= p->base)
            p->next[prev - p->base] = pos;
        if (prev < start && p->file[f].need == TP_INF) {   /* its first use in these k, none known before */
            fresh_file[fresh] = f;
            fresh_pos[fresh++] = pos;
        }
        p->file[f].last = pos;
    }
    return fresh;
}

void tp_count(int32_t *uses, const int32_t *stream, int64_t k)
{
    for (int64_t i = 0; i < k; i++) {
        if (i + TP_AHEAD < k)
            __builtin_prefetch(&uses[stream[i + TP_AHEAD]], 1);
        uses[stream[i]]++;
    }
}

/* ---- the reader: consume, _trim, _quiet_until, _read ---- */

static void trim(tp_plan *p)
{
    int64_t k = p->reader - p->base;
    if (k < p->trim_min || k < p->n - k)
        return;
    int64_t n = p->n - k;
    memmove(p->stream, p->stream + k, (size_t)n * sizeof *p->stream);
    memmove(p->next, p->next + k, (size_t)n * sizeof *p->next);
    memmove(p->cons, p->cons + k, (size_t)n * sizeof *p->cons);
    p->n = n;
    p->base += k;
}

/* walk: some position after pos may be consumed already (read out of
 * order), so the next use is the first unconsumed one of the file's links;
 * 0 when none is, and the next link is the next use (no load of its flag) */
static void consume(tp_plan *p, int64_t pos, int walk)
{
    int64_t base = p->base, end = base + p->n;
    if (pos < p->reader || pos >= end || p->cons[pos - base])
        return;
    p->cons[pos - base] = 1;
    int64_t f = p->stream[pos - base];
    if (p->file[f].done < pos)
        p->file[f].done = pos;
    if (p->file[f].need == pos) {
        int64_t q = p->next[pos - base];
        while (walk && q != TP_INF && p->cons[q - base])
            q = p->next[q - base];
        int t = p->tier[f];
        if (t >= 0) {
            unhold(p, f, t, pos);
            hold(p, f, t, q);
        }
        p->file[f].need = q;
    }
    if (pos == p->reader) {
        int64_t r = pos + 1;
        while (r < end && p->cons[r - base])
            r++;
        p->reader = r;
        trim(p);
    }
}

static int64_t quiet_until(const tp_plan *p, int64_t stop)
{
    int64_t r = p->reader, c = p->cursor, end = p->base + p->n;
    if (c >= end)
        return stop;
    if (p->window >= 0 && c >= r + p->window) {
        int64_t q = c - p->window + 1 < stop ? c - p->window + 1 : stop;
        return q > r + 1 ? q : r + 1;
    }
    int64_t hi = stop < c ? stop : c;
    if (r + TP_SCAN < hi)
        hi = r + TP_SCAN;
    for (int64_t q = r; q < hi; q++)
        if (p->next[q - p->base] > c && p->tier[p->stream[q - p->base]] >= 0)
            return q + 1;
    return hi > r + 1 ? hi : r + 1;
}

static void read_range(tp_plan *p, int64_t start, int64_t stop, int walk)
{
    int64_t end = p->base + p->n;
    for (int64_t pos = start; pos < stop; pos++) {
        /* the files of the positions ahead (read by this call or the next:
         * a range is often one position long): random entries, cache misses;
         * only the entries this loop reads (asking for those the fetch loop
         * reads too made the plans of NOTE [planner core] a third slower) */
        if (pos + TP_AHEAD < end) {
            int64_t g = p->stream[pos + TP_AHEAD - p->base];
            __builtin_prefetch(&p->tier[g]);
            __builtin_prefetch(&p->file[g], 1);
            /* consume() then checks the file's next use (at random in the
             * next epoch), and moves its bit in the victim set there, or,
             * with none known (a node's share: most files), into the idle
             * set of its number of uses */
            int64_t q = p->next[pos + TP_AHEAD - p->base];
            if (walk && q != TP_INF)
                __builtin_prefetch(&p->cons[q - p->base]);
            if (q == TP_INF)
                __builtin_prefetch(&p->uses[g]);
        }
        if (pos + TP_AHEAD / 2 < end) {
            int64_t r = pos + TP_AHEAD / 2 - p->base, q = p->next[r], g = p->stream[r];
            int t = p->tier[g];
            if (q != TP_INF && t >= 0 && q >= p->pos0)
                __builtin_prefetch(&p->by_need[t].lv[0][(q - p->pos0) >> 6], 1);
            else if (q == TP_INF && t >= 0)
                __builtin_prefetch(&idle_set(p, g, t)->lv[0][g >> 6], 1);
        }
        int64_t f = p->stream[pos - p->base];
        int t = p->tier[f];
        if (t < 0) {
            p->pfs_reads++;
            p->pfs_bytes += p->size[f];
        } else {
            p->hits[t]++;
        }
        consume(p, pos, walk);
    }
    p->accesses += stop - start;
}

/* simulate()'s loop over one epoch's positions pos..stop: advance, read
 * until advance may act again, and so on; returns where it stopped (stop, or
 * earlier once log_limit actions are logged), -1 when out of memory. */
int64_t tp_run(tp_plan *p, int64_t pos, int64_t stop, int64_t log_limit)
{
    /* positions after pos consumed already (by the Python code: simulate()
     * reads in order, so never there): the reader's loop walks past them;
     * none, and no load of a flag at each next use is needed */
    int64_t end = p->base + p->n;
    int walk = pos < end && memchr(p->cons + (pos - p->base), 1, (size_t)(end - pos)) != NULL;
    while (pos < stop) {
        if (tp_advance(p))
            return -1;
        int64_t quiet = quiet_until(p, stop);
        read_range(p, pos, quiet, walk);
        pos = quiet;
        if (p->log_n >= log_limit)
            break;
    }
    return pos;
}
