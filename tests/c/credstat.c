/* credstat PATH: prints the mtime (ns) that stat gives for PATH three times:
 * first; after a vfork child called setgid (the child shares this process's
 * memory: that changes nothing here); after this process called setgid. */
#define _GNU_SOURCE
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int show(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return 1;
    printf("%lld\n", (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2 || show(argv[1]))
        return 2;
    pid_t pid = vfork();
    if (pid == 0) {
        setgid(getgid());
        _exit(0);
    }
    if (pid < 0 || waitpid(pid, NULL, 0) != pid || show(argv[1]))
        return 1;
    if (setgid(getgid()) != 0 || show(argv[1]))
        return 1;
    return 0;
}
