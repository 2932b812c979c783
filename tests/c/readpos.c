/* Reads PATH through the shim in one of several ways and prints, on one
 * line, the bytes it read through the open file by its own count:
 *
 *   readpos PATH head N    open, read N bytes, close
 *   readpos PATH whole     open, read to the end, close
 *   readpos PATH dups      open, read through the fd and its duplicates (dup,
 *                          F_DUPFD, dup2 over another duplicate), close all
 *   readpos PATH stdio     open, fdopen, fread 100 bytes, fclose; then fopen,
 *                          fread to the end, fclose (stdio reads ahead: the
 *                          count is the file position before each fclose)
 *   readpos PATH pread     open, pread the whole file, close (position 0)
 *   readpos PATH fork      open, read 100, fork: the child closes its copy of
 *                          the fd and exits, the parent reads 100 more, closes
 *   readpos PATH threads   open; 4 threads at once, 5,000 times each: dup the
 *                          fd, read 1 byte through the duplicate, close it;
 *                          then close the fd
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char buf[1 << 16];

static long take(int fd, long n)
{
    long got = 0;
    while (n < 0 || got < n) {
        size_t want = n < 0 || n - got > (long)sizeof buf ? sizeof buf : (size_t)(n - got);
        ssize_t r = read(fd, buf, want);
        if (r <= 0)
            break;
        got += r;
    }
    return got;
}

#define THREADS 4
#define ROUNDS 5000

static int shared_fd;

static void *dup_read_close(void *got)
{
    char c;
    for (int k = 0; k < ROUNDS; k++) {
        int d = dup(shared_fd);
        if (d < 0)
            break;
        *(long *)got += read(d, &c, 1) == 1;
        close(d);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    const char *path = argv[1], *mode = argv[2];
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return 1;
    long total = 0;
    if (strcmp(mode, "head") == 0 && argc > 3) {
        total = take(fd, atol(argv[3]));
        close(fd);
    } else if (strcmp(mode, "whole") == 0) {
        total = take(fd, -1);
        close(fd);
    } else if (strcmp(mode, "dups") == 0) {
        total = take(fd, 1000);
        int a = dup(fd);
        total += take(a, 500);
        int b = fcntl(fd, F_DUPFD_CLOEXEC, 100);
        close(a);                      /* at 1500 */
        total += take(b, 300);
        int c = dup(fd);
        dup2(b, c);                    /* c replaced by another copy: closed at 1800 */
        total += take(c, 200);
        close(b);
        close(fd);
        close(c);                      /* the last: at 2000 */
    } else if (strcmp(mode, "stdio") == 0) {
        FILE *f = fdopen(fd, "r");
        if (!f || fread(buf, 1, 100, f) != 100)
            return 1;
        total = (long)lseek(fileno(f), 0, SEEK_CUR);
        fclose(f);
        FILE *g = fopen(path, "r");
        if (!g)
            return 1;
        while (fread(buf, 1, sizeof buf, g) > 0)
            ;
        total += (long)lseek(fileno(g), 0, SEEK_CUR);
        fclose(g);
    } else if (strcmp(mode, "pread") == 0) {
        off_t off = 0;
        ssize_t r;
        while ((r = pread(fd, buf, sizeof buf, off)) > 0)
            off += r;
        total = (long)off;
        close(fd);
    } else if (strcmp(mode, "fork") == 0) {
        total = take(fd, 100);
        pid_t pid = fork();
        if (pid == 0) {
            close(fd);
            _exit(0);
        }
        int status;
        waitpid(pid, &status, 0);
        total += take(fd, 100);
        close(fd);
    } else if (strcmp(mode, "threads") == 0) {
        pthread_t t[THREADS];
        long got[THREADS] = {0};
        shared_fd = fd;
        for (int k = 0; k < THREADS; k++)
            if (pthread_create(&t[k], NULL, dup_read_close, &got[k]) != 0)
                return 1;
        for (int k = 0; k < THREADS; k++) {
            pthread_join(t[k], NULL);
            total += got[k];
        }
        close(fd);
    } else {
        return 2;
    }
    printf("%ld\n", total);
    return 0;
}
