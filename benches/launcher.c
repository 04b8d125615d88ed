#include <fcntl.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* launcher PROGRAM ARGS...: runs PROGRAM with stderr discarded, then prints
   "<wall ns> <ru_maxrss KiB> <wait status>" on its own stderr. */
int main(int argc, char **argv) {
    struct timespec start, end;
    struct rusage usage;
    int status;
    if (argc < 2)
        return 2;
    clock_gettime(CLOCK_MONOTONIC, &start);
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 2);
        execv(argv[1], argv + 1);
        _exit(127);
    }
    if (pid < 0 || wait4(pid, &status, 0, &usage) < 0)
        return 1;
    clock_gettime(CLOCK_MONOTONIC, &end);
    fprintf(stderr, "%lld %ld %d\n",
            (long long)(end.tv_sec - start.tv_sec) * 1000000000LL + (end.tv_nsec - start.tv_nsec),
            usage.ru_maxrss, status);
    return 0;
}
