/* Exercises the shim's per-fd bookkeeping: fdbook PATH opens PATH once and
 * then duplicates and closes the descriptor every way libc offers.  Every
 * descriptor it creates on PATH is closed exactly once. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2) return 2;
    int fd = open(argv[1], O_RDONLY);          /* open 1 */
    if (fd < 0) return 1;
    int a = dup(fd);                            /* 2 fds */
    int b = fcntl(fd, F_DUPFD_CLOEXEC, 100);    /* 3 fds */
    int c = dup2(fd, 200);                      /* 4 fds */
    int d = dup3(fd, 201, O_CLOEXEC);           /* 5 fds */
    int e = fcntl(fd, F_DUPFD, 300);            /* 6 fds */
    int g = open(argv[1], O_RDONLY);            /* open 2 -> 7 fds */
    dup2(a, c);                                 /* c replaced by a copy of a: close + dup */
    close(fd);
    close(a);
    close(b);
    close(c);
    close_range(201, 201, 0);                   /* d */
    close_range(300, 300, CLOSE_RANGE_CLOEXEC); /* only flags e, does not close */
    close(e);
    FILE *f = fdopen(g, "r");
    fclose(f);                                  /* g */
    FILE *s = fopen(argv[1], "r");              /* open 3 */
    fclose(s);
    printf("ok\n");
    return 0;
}
