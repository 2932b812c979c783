/* vforkdup PATH: opens PATH (a catalogued file), then a vfork child
 * duplicates the descriptor with dup, dup2, dup3 and fcntl and closes it
 * before it exits, as a child does before exec.  The child shares the
 * parent's memory: the shim must leave the parent's bookkeeping alone.  The
 * parent reads 100 bytes before the vfork and 50 after it, then reuses the
 * numbers the child's duplicates took and closes PATH once: exactly one open
 * and one close event are posted, the close with the 150 bytes read.
 * Prints "ok". */
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
    char buf[100];
    if (fd < 0 || read(fd, buf, 100) != 100)
        return 1;
    pid_t pid = vfork();
    if (pid == 0) {
        dup(fd);                          /* the lowest free number, N */
        fcntl(fd, F_DUPFD, 100);
        fcntl(fd, F_DUPFD_CLOEXEC, 101);
        dup2(fd, 102);
        dup3(fd, 103, O_CLOEXEC);
        close(fd);
        _exit(0);
    }
    if (pid < 0 || waitpid(pid, NULL, 0) != pid || read(fd, buf, 50) != 50)
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
