/* Races write opens against read opens of the same files, for the shim's
 * linearizability test (tests/test_concurrency.py):
 *
 *   racer DATA TIER NFILES READERS
 *
 * DATA/fNNNNN.bin hold NFILES files of SIZE bytes 'o' (old), each with a
 * published copy TIER/0/fNNNNN.bin of the same bytes.  One writer thread
 * takes the files in turn: it waits until every reader is reading the file,
 * opens it for writing (O_WRONLY, O_TRUNC, fopen "r+" or "w", in turn),
 * writes SIZE bytes 'n' (new), closes it and marks the write done.  Then it
 * renames a file of 'p' (poison) over the copy, so that a reader that opens
 * the copy only after the write was done sees 'p' instead of 'o'.  READERS
 * threads read the current file again and again (open and fopen in turn).
 *
 * A read is "racing" when it began before the write was done and ended after
 * the writer began to open.  Printed on one line (key=value):
 *   reads racing old new torn poison stale_after_done
 * old: served the copy opened before the write; new: the PFS after the write;
 * torn: the PFS during the write (a mix, or empty after a truncation);
 * poison: a copy opened after the write was done (the shim served a stale
 * decision); stale_after_done: anything but 'n' for a read that began after
 * the write was done.  Exit status 0 unless the set-up failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SIZE 4096
#define WAIT_NS 2000000000LL /* generous bound on each wait for the readers */

static const char *data_dir, *tier_dir;
static int nfiles, nreaders;
static int cur;            /* the file being raced over */
static int finished;
static int *wbegun, *done; /* per file: the writer began its open; the write is done */
static int *started, *after;
static long long n_reads, n_racing, n_old, n_new, n_torn, n_poison, n_stale;

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void die(const char *what, const char *path)
{
    fprintf(stderr, "racer: %s %s: %s\n", what, path, strerror(errno));
    exit(2);
}

static void source_path(char *out, int i) { snprintf(out, 4096, "%s/f%05d.bin", data_dir, i); }

static int load(int *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static void store(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static void add(long long *p) { __atomic_fetch_add(p, 1, __ATOMIC_RELAXED); }

/* spins until *p >= want or the bound passes */
static void await_count(int *p, int want)
{
    long long end = now_ns() + WAIT_NS;
    while (load(p) < want && now_ns() < end)
        sched_yield();
}

static void write_new(int i)
{
    char path[4096], buf[SIZE];
    memset(buf, 'n', sizeof buf);
    source_path(path, i);
    store(&wbegun[i], 1);
    if (i % 4 < 2) {
        int fd = open(path, i % 4 == 0 ? O_WRONLY : O_WRONLY | O_TRUNC);
        if (fd < 0 || pwrite(fd, buf, SIZE, 0) != SIZE || close(fd) != 0)
            die("write", path);
    } else {
        FILE *f = fopen(path, i % 4 == 2 ? "r+" : "w");
        if (!f || fwrite(buf, 1, SIZE, f) != SIZE || fclose(f) != 0)
            die("fopen for writing", path);
    }
    store(&done[i], 1);
}

/* what the daemon does later (it unlinks the copy), made visible */
static void poison_copy(int i)
{
    char tmp[4096], copy[4096], buf[SIZE];
    memset(buf, 'p', sizeof buf);
    snprintf(tmp, sizeof tmp, "%s/poison", tier_dir);
    snprintf(copy, sizeof copy, "%s/0/f%05d.bin", tier_dir, i);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, buf, SIZE) != SIZE || close(fd) != 0 || rename(tmp, copy) != 0)
        die("poison", copy);
}

static void *writer(void *arg)
{
    (void)arg;
    for (int i = 0; i < nfiles; i++) {
        store(&cur, i);
        await_count(&started[i], nreaders);
        write_new(i);
        poison_copy(i);
        await_count(&after[i], nreaders);
    }
    store(&finished, 1);
    return NULL;
}

static ssize_t read_file(const char *path, int use_stdio, char *buf, size_t cap)
{
    if (use_stdio) {
        FILE *f = fopen(path, "r");
        if (!f)
            return -1;
        size_t n = fread(buf, 1, cap, f);
        fclose(f);
        return (ssize_t)n;
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = 0, r;
    while ((size_t)n < cap && (r = read(fd, buf + n, cap - (size_t)n)) > 0)
        n += r;
    close(fd);
    return n;
}

static int all(const char *buf, ssize_t n, char c)
{
    if (n != SIZE)
        return 0;
    for (ssize_t k = 0; k < n; k++)
        if (buf[k] != c)
            return 0;
    return 1;
}

static void *reader(void *arg)
{
    long k = (long)arg;
    char path[4096], buf[2 * SIZE];
    while (!load(&finished)) {
        int i = load(&cur);
        int began_after = load(&done[i]);
        __atomic_fetch_add(&started[i], 1, __ATOMIC_SEQ_CST);
        source_path(path, i);
        ssize_t n = read_file(path, (int)(k++ & 1), buf, sizeof buf);
        if (n < 0)
            die("read", path);
        int racing = !began_after && load(&wbegun[i]);
        add(&n_reads);
        if (racing)
            add(&n_racing);
        if (all(buf, n, 'o'))
            add(&n_old);
        else if (all(buf, n, 'n'))
            add(&n_new);
        else if (all(buf, n, 'p'))
            add(&n_poison);
        else
            add(&n_torn);
        if (began_after) {
            if (!all(buf, n, 'n'))
                add(&n_stale);
            __atomic_fetch_add(&after[i], 1, __ATOMIC_SEQ_CST);
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: racer DATA TIER NFILES READERS\n");
        return 2;
    }
    data_dir = argv[1];
    tier_dir = argv[2];
    nfiles = atoi(argv[3]);
    nreaders = atoi(argv[4]);
    wbegun = calloc((size_t)nfiles, sizeof *wbegun);
    done = calloc((size_t)nfiles, sizeof *done);
    started = calloc((size_t)nfiles, sizeof *started);
    after = calloc((size_t)nfiles, sizeof *after);
    pthread_t w, r[64];
    if (nreaders < 1 || nreaders > 64 || !wbegun || !done || !started || !after)
        return 2;
    for (long k = 0; k < nreaders; k++)
        pthread_create(&r[k], NULL, reader, (void *)k);
    pthread_create(&w, NULL, writer, NULL);
    pthread_join(w, NULL);
    for (int k = 0; k < nreaders; k++)
        pthread_join(r[k], NULL);
    printf("reads=%lld racing=%lld old=%lld new=%lld torn=%lld poison=%lld stale_after_done=%lld\n",
           n_reads, n_racing, n_old, n_new, n_torn, n_poison, n_stale);
    return 0;
}
