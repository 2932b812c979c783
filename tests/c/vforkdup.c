/* vforkdup PATH: opens PATH (a catalogued file), then a vfork child
 * duplicates the descriptor with dup, dup2, dup3 and fcntl before it exits,
 * as a child does before exec.  The child shares the parent's memory: the
 * shim must leave the parent's bookkeeping alone.  The parent then reuses
 * the numbers the child's duplicates took and closes PATH once: exactly one
 * open and one close event are posted.  Prints "ok". */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0)
        return 1;
    pid_t pid = vfork();
    if (pid == 0) {
        dup(fd);                          /* the lowest free number, N */
        fcntl(fd, F_DUPFD, 100);
        fcntl(fd, F_DUPFD_CLOEXEC, 101);
        dup2(fd, 102);
        dup3(fd, 103, O_CLOEXEC);
        _exit(0);
    }
    if (pid < 0 || waitpid(pid, NULL, 0) != pid)
        return 1;
    int n = open("/dev/null", O_RDONLY);  /* N again, in the parent */
    for (int k = 100; k <= 103; k++)
        dup2(n, k);
    for (int k = 100; k <= 103; k++)
        close(k);
    close(n);
    close(fd);
    printf("ok\n");
    return 0;
}
