/* The shim's per-open-file cells (NOTE [read counters]) when, between a
 * dup's system call and its bookkeeping, another thread closes the source
 * and opens the file again, on the same descriptor and the same cell.  The
 * shim is built into this program, whose dup system call does just that
 * (deterministically, no threads): run it with TIERING_INDEX and without
 * LD_PRELOAD.
 *
 *   dupreopen PATH   open PATH and read 10 bytes (fd A); dup A to B, and
 *                    meanwhile close A and open PATH again (C, A's number);
 *                    read 5 bytes through C, close it; read 1 byte through
 *                    B (the first open file), close it.
 *
 * Prints the bytes read and 1 when C took A's number (the race happened).
 */
#include "../../shim/tiershim.c"

static const char *path;
static int reopened = -1;

/* dup's system call, then the other thread's close and open */
static int racing_dup(int fd)
{
    int r = (int)syscall(SYS_dup, fd);
    close(fd);
    reopened = open(path, O_RDONLY);
    return r;
}

int main(int argc, char **argv)
{
    char b[10];
    if (argc < 2)
        return 2;
    path = argv[1];
    int a = open(path, O_RDONLY);
    if (a < 0 || read(a, b, 10) != 10)
        return 1;
    real.dup = racing_dup;
    int copy = dup(a);
    if (copy < 0 || reopened < 0 || read(reopened, b, 5) != 5 || read(copy, b, 1) != 1)
        return 1;
    close(reopened);
    close(copy);
    printf("16 %d\n", reopened == a);
    return 0;
}
