/*
 * seccomp-run: runs a command under the seccomp filters that systemd builds for
 * the unit's SystemCallFilter= (an allow list, EPERM otherwise, as
 * SystemCallErrorNumber=EPERM), MemoryDenyWriteExecute=yes and
 * RestrictAddressFamilies=AF_UNIX, for hosts where systemd is not PID 1
 * (tests/packaging/gpu-host-check.sh). Same rules as systemd 252's
 * seccomp-util.c, with the same library (libseccomp).
 *
 *   seccomp-run ALLOWED_SYSCALLS_FILE COMMAND [ARG]...
 *
 * ALLOWED_SYSCALLS_FILE: one syscall name a line (names this libseccomp does not
 * know are skipped, as systemd does).
 *
 * Build: cc -O2 -static -o seccomp-run seccomp-run.c -lseccomp
 */
#include <errno.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <unistd.h>

static void load(scmp_filter_ctx ctx, const char *what) {
    int r = seccomp_load(ctx);
    if (r < 0) {
        fprintf(stderr, "seccomp-run: loading the %s filter: %s\n", what, strerror(-r));
        exit(125);
    }
    seccomp_release(ctx);
}

static void rule(scmp_filter_ctx ctx, uint32_t action, const char *name, unsigned count,
                 struct scmp_arg_cmp cmp) {
    int nr = seccomp_syscall_resolve_name(name);
    if (nr < 0) /* unknown, or not a syscall of this architecture */
        return;
    int r = count ? seccomp_rule_add_exact(ctx, action, nr, 1, cmp)
                  : seccomp_rule_add_exact(ctx, action, nr, 0);
    if (r < 0) {
        fprintf(stderr, "seccomp-run: rule for %s: %s\n", name, strerror(-r));
        exit(125);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s ALLOWED_SYSCALLS_FILE COMMAND [ARG]...\n", argv[0]);
        return 125;
    }
    FILE *list = fopen(argv[1], "r");
    if (!list) {
        perror(argv[1]);
        return 125;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
        perror("PR_SET_NO_NEW_PRIVS");
        return 125;
    }

    /* SystemCallFilter= allow list, SystemCallErrorNumber=EPERM. */
    scmp_filter_ctx allow = seccomp_init(SCMP_ACT_ERRNO(EPERM));
    char name[128];
    unsigned allowed = 0;
    while (fscanf(list, "%127s", name) == 1) {
        if (seccomp_syscall_resolve_name(name) < 0)
            continue;
        rule(allow, SCMP_ACT_ALLOW, name, 0, SCMP_A0(SCMP_CMP_EQ, 0));
        allowed++;
    }
    fclose(list);
    /* The exec below must pass; systemd allows it in every filter too. */
    rule(allow, SCMP_ACT_ALLOW, "execve", 0, SCMP_A0(SCMP_CMP_EQ, 0));

    /* MemoryDenyWriteExecute=yes. */
    scmp_filter_ctx mdwe = seccomp_init(SCMP_ACT_ALLOW);
    rule(mdwe, SCMP_ACT_ERRNO(EPERM), "mmap", 1,
         SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC | PROT_WRITE, PROT_EXEC | PROT_WRITE));
    rule(mdwe, SCMP_ACT_ERRNO(EPERM), "mprotect", 1,
         SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC));
    rule(mdwe, SCMP_ACT_ERRNO(EPERM), "pkey_mprotect", 1,
         SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC));
    rule(mdwe, SCMP_ACT_ERRNO(EPERM), "shmat", 1,
         SCMP_A2(SCMP_CMP_MASKED_EQ, SHM_EXEC, SHM_EXEC));

    /* RestrictAddressFamilies=AF_UNIX. */
    scmp_filter_ctx families = seccomp_init(SCMP_ACT_ALLOW);
    rule(families, SCMP_ACT_ERRNO(EAFNOSUPPORT), "socket", 1, SCMP_A0(SCMP_CMP_LT, AF_UNIX));
    rule(families, SCMP_ACT_ERRNO(EAFNOSUPPORT), "socket", 1, SCMP_A0(SCMP_CMP_GT, AF_UNIX));

    fprintf(stderr, "seccomp-run: %u syscalls allowed, W^X and AF_UNIX-only filters on\n", allowed);
    load(mdwe, "MemoryDenyWriteExecute");
    load(families, "RestrictAddressFamilies");
    load(allow, "SystemCallFilter");
    execvp(argv[2], argv + 2);
    perror(argv[2]);
    return 127;
}
