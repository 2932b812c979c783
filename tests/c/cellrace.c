/* The shim's per-open-file cells (NOTE [read counters]) when a dup races
 * with a close of its source.  The shim is built into this program (its
 * wrappers are this program's open, dup and close), so that its cells can
 * be looked at: run it with TIERING_INDEX and without LD_PRELOAD.
 *
 *   cellrace PATH ROUNDS   each round: open PATH and read 10 bytes; then at
 *                          once one thread dups the fd and reads 1 byte
 *                          through the copy, one closes the fd, and one
 *                          opens PATH, reads 5 bytes and closes it (an open
 *                          that may take a cell just let go); then the copy
 *                          is closed.
 *
 * Prints the bytes read and how many cells are still held once every
 * descriptor is closed (0: none leaked).
 */
#include "../../shim/tiershim.c"

#include <pthread.h>

static const char *path;
static int shared_fd, copy_fd;
static long got_dup, got_other;
static pthread_barrier_t go, done;

static void *duper(void *rounds)
{
    char c;
    for (long k = 0; k < (long)rounds; k++) {
        pthread_barrier_wait(&go);
        copy_fd = dup(shared_fd);
        if (copy_fd >= 0 && read(copy_fd, &c, 1) == 1)
            got_dup++;
        pthread_barrier_wait(&done);
    }
    return NULL;
}

static void *closer(void *rounds)
{
    for (long k = 0; k < (long)rounds; k++) {
        pthread_barrier_wait(&go);
        close(shared_fd);
        pthread_barrier_wait(&done);
    }
    return NULL;
}

static void *opener(void *rounds)
{
    char b[5];
    for (long k = 0; k < (long)rounds; k++) {
        pthread_barrier_wait(&go);
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            got_other += read(fd, b, sizeof b) == (ssize_t)sizeof b ? (long)sizeof b : 0;
            close(fd);
        }
        pthread_barrier_wait(&done);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    path = argv[1];
    long rounds = atol(argv[2]), got = 0;
    char b[10];
    void *(*role[3])(void *) = {duper, closer, opener};
    pthread_t t[3];
    pthread_barrier_init(&go, NULL, 4);
    pthread_barrier_init(&done, NULL, 4);
    for (int i = 0; i < 3; i++)
        if (pthread_create(&t[i], NULL, role[i], (void *)rounds) != 0)
            return 1;
    for (long k = 0; k < rounds; k++) {
        shared_fd = open(path, O_RDONLY);
        if (shared_fd < 0 || read(shared_fd, b, sizeof b) != (ssize_t)sizeof b)
            return 1;
        got += (long)sizeof b;
        pthread_barrier_wait(&go);
        pthread_barrier_wait(&done);
        if (copy_fd >= 0)
            close(copy_fd);
    }
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    long held = 0;
    for (int k = 0; k < MAX_TRACKED_FDS; k++)
        held += refs(__atomic_load_n(&open_files[k].held, __ATOMIC_RELAXED)) != 0;
    printf("%ld %ld\n", got + got_dup + got_other, held);
    return 0;
}
