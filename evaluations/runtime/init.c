/*
 * te-init: the first process of a live sandbox (SPEC §24). It starts each exec the host asks for
 * and reports how it ended; nothing else. Built static (no library of the image's is loaded) by
 * evaluations/runtime/initbin.py; the sandbox runs it from a descriptor it inherits
 * (/proc/self/fd/N), so it has no path, and no mount point, inside.
 *
 * The host holds the other end of a SOCK_SEQPACKET socket, passed as the descriptor named by
 * argv[1] (never a path inside the sandbox). Messages are one packet each:
 *
 *   host -> init   "E <id>"        + 4 descriptors: the request (a memfd of NUL-separated
 *                                    fields: uid, gid, cwd, argc, argv..., envc, env...), then the
 *                                    exec's stdin, stdout and stderr
 *                  "K <id> <sig>"  signal the exec's process group
 *   init -> host   "S <id> <pid>"  started (its pid in the sandbox)
 *                  "X <id> <st>"   ended; <st> is waitpid's status
 *                  "F <id> <errno>" could not start
 *
 * "te-init --as UID GID PROGRAM ARGS...": no init at all, a switch. Started as the sandbox's root
 * (which bubblewrap needs to set the sandbox up), it drops the supplementary groups, takes the
 * group and user given and execs the program (PATH searched) with every descriptor but 0-2 closed:
 * a process of the sandbox as a user that is neither root nor the one bubblewrap can switch to by
 * itself (runtime/spawner.py's background: an image's first process as its User).
 *
 * "te-init --userns UID": no init either, the maker of a user namespace for runtime/idmap.py, which
 * would otherwise fork the executor's whole address space for it. It takes UID (as --as does, when
 * it is not already), unshares a user namespace, writes "1" on its stdout and waits for "1" on its
 * stdin (the host has written the maps: it is root there now, with every capability), forbids
 * nested namespaces in it (max_user_namespaces 0), writes "2", and exits at the end of its stdin
 * (the host has opened /proc/PID/ns/user by then). Anything else: an exit status, and no "2".
 *
 * "te-init --launch [OPTIONS] -- PROGRAM ARGS...": no init either, the chain the host puts before a
 * command or its bubblewrap (runtime/policy.py's launch prefix) in one exec of a static program where
 * the system's tools take four of dynamic ones (sh for the cgroup, nsenter, setpriv, prlimit, nice).
 * In this order, as those do it: as root, join each cgroup (--cgroup FILE, its cgroup.procs) and a
 * network namespace (--netns PATH); then take --uid N as user and group, with no supplementary
 * groups; then no_new_privs (--no-new-privs), the rlimits as the new user (--fsize, --nproc, --core:
 * soft and hard, so never above what the service has), the niceness (--nice N, added); then exec
 * PROGRAM (PATH searched). Descriptors stay as they are (bwrap's --info-fd, a phase's init and its
 * socket pass through it). A step that fails: one line on stderr and exit 125, nothing run.
 * With --hold FD (and no program): join the cgroups, then wait on FD for the rest of the launch
 * (``held`` below says how it is sent); the spawner starts the next command's launcher so, while
 * the command before it runs, since a cgroup move can wait for an RCU grace period.
 *
 * "te-init --relay PORT SOCKET -- PROGRAM ARGS...": no init either, the egress relay of a sandbox with
 * network (runtime/policy.py puts it before the command, or before the init of a phase's sandbox,
 * from the init's folder bound at /run/egress-relay). It listens on 127.0.0.1:PORT of the sandbox's
 * own loopback, then starts the relay as a process of its own (named te-relay; not the program's
 * child: a program that waits for all its children never waits for it) and execs PROGRAM, so the
 * program keeps this pid, and its first connection finds the relay listening. The relay forks one
 * process per connection, which connects to the Unix socket SOCKET (the evaluation's proxy) and
 * copies both ways: 256 KiB reads, the other side's writing half shut when one side ends, and at
 * most 60 s more for the other side to end (a client that half-closes after its request still gets
 * the answer). A connection the proxy refuses is closed, with one line on stderr. The port taken
 * (a network namespace shared with the phase before, whose relay is going, or with a process of the
 * task's): bind is retried for 5 s, then the program runs without a relay of its own, after one
 * line on stderr. Any other failure to listen: one line on stderr and exit 125, nothing run. The
 * relay dies with the sandbox's pid namespace.
 *
 * This process is not dumpable (no process of the sandbox can ptrace it without CAP_SYS_PTRACE,
 * which none has); still, the host treats its answers as the sandbox's own word (an exec's exit
 * status), never as something the host's own safety rests on. When the host's
 * end closes, init exits, and with it the sandbox (bubblewrap ends the pid namespace).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_EXECS 1024
#define MAX_REQUEST (64 << 20)

struct running {
    unsigned long id;
    pid_t pid;
};

static struct running table[MAX_EXECS];
static int control = -1;
static long monotonic_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec * 1000L + now.tv_nsec / 1000000;
}

static void say(const char *text) {
    if (send(control, text, strlen(text), MSG_NOSIGNAL) < 0 && errno != EINTR) _exit(0);
}

/* One message on ``fd`` (its text NUL-terminated in ``buf``, cut to fit) with up to ``max`` of
 * its descriptors (close-on-exec; the others closed): its length, 0 at end of file, -1 on error. */
static ssize_t receive_on(int fd, char *buf, size_t size, int *fds, int max, int *nfds) {
    struct iovec iov = {buf, size - 1};
    char cbuf[CMSG_SPACE(sizeof(int) * 32)];
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    ssize_t n;
    do n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    *nfds = 0;
    if (n <= 0) return n;
    buf[n] = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        int count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (int i = 0; i < count; i++) {
            int got = ((int *)CMSG_DATA(c))[i];
            if (*nfds < max) fds[(*nfds)++] = got;
            else close(got);
        }
    }
    return n;
}

static int receive(char *buf, size_t size, int fds[4], int *nfds) {
    return receive_on(control, buf, size, fds, 4, nfds) > 0 ? 0 : -1;
}

/* The request's fields, in place: returns the count, or -1. */
static char *request;
static int split(char *data, size_t size, char **fields, int max) {
    int count = 0;
    size_t start = 0;
    for (size_t i = 0; i < size; i++) {
        if (data[i] == 0) {
            if (count == max) return -1;
            fields[count++] = data + start;
            start = i + 1;
        }
    }
    return start == size ? count : -1;
}

/* A request (a memfd of NUL-separated fields) read whole, into a new buffer one byte longer; NULL
 * when it is empty, larger than MAX_REQUEST or cannot be read. */
static char *read_request(int fd, size_t *size) {
    struct stat st;
    if (fstat(fd, &st) < 0 || st.st_size <= 0 || st.st_size > MAX_REQUEST) return NULL;
    *size = st.st_size;
    char *data = malloc(*size + 1);
    if (!data) return NULL;
    for (size_t got = 0; got < *size;) {
        ssize_t n = pread(fd, data + got, *size - got, got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) { free(data); return NULL; }
        got += n;
    }
    return data;
}

/* Exec ``program`` (PATH searched); if that fails, one line "WHO: PROGRAM: why" on stderr and the
 * shell's status: 127 not found, 126 otherwise. */
static int exec_or_say(const char *who, char **program) {
    execvp(program[0], program);
    int code = errno == ENOENT ? 127 : 126;
    fprintf(stderr, "%s: %s: %s\n", who, program[0], strerror(errno));
    return code;
}

static void fail_child(int out, const char *what, const char *arg, int code) {
    dprintf(out, "term-executor: %s %s: %s\n", what, arg, strerror(errno));
    _exit(code);
}

static void start(unsigned long id, int fds[4]) {
    char reply[96];
    size_t size;
    free(request);
    request = read_request(fds[0], &size);
    if (!request) goto bad;
    size_t max = size / 1 + 1;
    char **fields = calloc(max, sizeof(char *));
    if (!fields) goto bad;
    int count = split(request, size, fields, max);
    if (count < 5) { free(fields); goto bad; }
    uid_t uid = strtoul(fields[0], NULL, 10);
    gid_t gid = strtoul(fields[1], NULL, 10);
    const char *cwd = fields[2];
    int argc = atoi(fields[3]);
    if (argc < 1 || 4 + argc >= count) { free(fields); goto bad; }
    char **argv = fields + 4;
    int envc = atoi(fields[4 + argc]);
    if (envc < 0 || 5 + argc + envc != count) { free(fields); goto bad; }
    char **envp = fields + 5 + argc;
    /* NUL-terminated lists: the field after each list is overwritten by NULL in a copy. */
    char **args = calloc(argc + 1, sizeof(char *));
    char **env = calloc(envc + 1, sizeof(char *));
    if (!args || !env) { free(fields); free(args); free(env); goto bad; }
    memcpy(args, argv, argc * sizeof(char *));
    memcpy(env, envp, envc * sizeof(char *));
    int slot = -1;
    for (int i = 0; i < MAX_EXECS; i++)
        if (table[i].pid == 0) { slot = i; break; }
    if (slot < 0) { errno = EAGAIN; free(fields); free(args); free(env); goto failed; }
    pid_t pid = fork();
    if (pid < 0) { free(fields); free(args); free(env); goto failed; }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
        setsid();
        if (dup2(fds[1], 0) < 0 || dup2(fds[2], 1) < 0 || dup2(fds[3], 2) < 0) _exit(126);
        syscall(SYS_close_range, 3, ~0U, 0);
        umask(022);
        if (getuid() != uid || getgid() != gid) {
            if (setgroups(0, NULL) < 0 && errno != EPERM) fail_child(2, "setgroups", "", 126);
            if (setgid(gid) < 0) fail_child(2, "setgid", fields[1], 126);
            if (setuid(uid) < 0) fail_child(2, "setuid", fields[0], 126);
        }
        if (chdir(cwd) < 0) fail_child(2, "chdir", cwd, 126);
        environ = env;
        execvp(args[0], args);
        fail_child(2, "exec", args[0], errno == ENOENT ? 127 : 126);
    }
    free(fields);
    free(args);
    free(env);
    table[slot].id = id;
    table[slot].pid = pid;
    for (int i = 0; i < 4; i++) close(fds[i]);
    snprintf(reply, sizeof reply, "S %lu %d", id, pid);
    say(reply);
    return;
bad:
    errno = EINVAL;
failed:
    snprintf(reply, sizeof reply, "F %lu %d", id, errno);
    for (int i = 0; i < 4; i++) close(fds[i]);
    say(reply);
}

static void reap(void) {
    int status;
    pid_t pid;
    char reply[64];
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < MAX_EXECS; i++) {
            if (table[i].pid == pid) {
                snprintf(reply, sizeof reply, "X %lu %d", table[i].id, status);
                table[i].pid = 0;
                say(reply);
                break;
            }
        }
    }
}

static void signal_exec(unsigned long id, int sig) {
    for (int i = 0; i < MAX_EXECS; i++)
        if (table[i].pid > 0 && table[i].id == id) kill(-table[i].pid, sig);
}

/* "--as UID GID PROGRAM ARGS...": become UID:GID (no supplementary groups), then exec. */
static int switch_and_exec(int argc, char **argv) {
    if (argc < 5) return 2;
    char *end;
    unsigned long uid = strtoul(argv[2], &end, 10);
    if (*argv[2] == 0 || *end) return 2;
    unsigned long gid = strtoul(argv[3], &end, 10);
    if (*argv[3] == 0 || *end) return 2;
    syscall(SYS_close_range, 3, ~0U, 0);  /* the descriptor it was run from among them */
    if (setgroups(0, NULL) < 0 && errno != EPERM) { perror("te-init: setgroups"); return 126; }
    if (setgid((gid_t)gid) < 0) { perror("te-init: setgid"); return 126; }
    if (setuid((uid_t)uid) < 0) { perror("te-init: setuid"); return 126; }
    if (getuid() != (uid_t)uid || geteuid() != (uid_t)uid) { fputs("te-init: the switch did not hold\n", stderr); return 126; }
    return exec_or_say("te-init", argv + 4);
}

static int launch_failed(const char *what, const char *arg) {
    fprintf(stderr, "term-executor: launch: %s %s: %s\n", what, arg, strerror(errno));
    return 125;
}

static int launch_number(const char *text, unsigned long long *value) {
    char *end;
    errno = 0;
    *value = strtoull(text, &end, 10);
    return *text && !*end && *text != '-' && errno == 0;
}

#define MAX_HELD_FDS 16

static int launch(int argc, char **argv);

static int held_refused(const char *what) {
    fprintf(stderr, "term-executor: launch: the held launch %s\n", what);
    return 125;
}

/* "--hold FD", once the cgroups are joined: the rest of the launch, sent on FD (a SOCK_SEQPACKET
 * socket) as one message "G" with descriptors: first a memfd of NUL-separated fields (cwd, envc,
 * env..., fdc, the fdc target numbers, argc, argv...: a whole "--launch" line without --cgroup or
 * --hold), then fdc descriptors, each put at its target number (the numbers the line names). Then
 * the launch goes on as any (the network namespace, the uid, the limits, the exec), in that cwd
 * with that environment. End of file on FD (the host ended it unused): exit 0, nothing run. */
static int held(int control_fd) {
    char tag[8];
    int fds[MAX_HELD_FDS + 1], nfds = 0;
    ssize_t n = receive_on(control_fd, tag, sizeof tag, fds, MAX_HELD_FDS + 1, &nfds);
    if (n == 0) return 0;
    if (n < 0 || tag[0] != 'G' || nfds < 1) return held_refused("was not sent");
    size_t size;
    char *data = read_request(fds[0], &size);
    if (!data) return held_refused("cannot be read (empty, too large or unreadable)");
    close(fds[0]);
    char **field = calloc(size + 1, sizeof(char *));
    if (!field) return held_refused("is too large");
    int count = split(data, size, field, size + 1), at = 0;
    if (count < 4) return held_refused("is not a launch");
    const char *cwd = field[at++];
    int envc = atoi(field[at++]);
    if (envc < 0 || at + envc + 1 > count) return held_refused("is not a launch");
    char **env = field + at;
    at += envc;
    int fdc = atoi(field[at++]);
    if (fdc != nfds - 1 || at + fdc + 1 > count) return held_refused("names other descriptors than it sent");
    char **targets = field + at;
    at += fdc;
    int launch_argc = atoi(field[at++]);
    if (launch_argc < 4 || at + launch_argc != count || strcmp(field[at + 1], "--launch") != 0) return held_refused("is not a launch");
    char **launch_argv = field + at;
    for (int k = 2; k < launch_argc && strcmp(launch_argv[k], "--") != 0; k++)
        if (!strcmp(launch_argv[k], "--cgroup") || !strcmp(launch_argv[k], "--hold")) return held_refused("joins again");
    /* Each descriptor at its number: first all above every target (and the socket), then down. */
    int above = control_fd + 1;
    for (int k = 0; k < fdc; k++) {
        unsigned long long target;
        if (!launch_number(targets[k], &target) || target < 3 || target > 65535) return held_refused("names a bad descriptor");
        if ((int)target >= above) above = (int)target + 1;
    }
    int moved[MAX_HELD_FDS];
    for (int k = 0; k < fdc; k++) {
        moved[k] = fcntl(fds[1 + k], F_DUPFD_CLOEXEC, above);
        if (moved[k] < 0) return held_refused("cannot keep its descriptors");
        close(fds[1 + k]);
    }
    close(control_fd);
    for (int k = 0; k < fdc; k++) {
        if (dup2(moved[k], atoi(targets[k])) < 0) return held_refused("cannot place its descriptors");
        close(moved[k]);
    }
    if (chdir(cwd) < 0) return launch_failed("cannot enter", cwd);
    env[envc] = NULL;  /* the field after the list (fdc) is read already */
    environ = env;
    launch_argv[launch_argc] = NULL;  /* past the last field: calloc'd */
    return launch(launch_argc, launch_argv);
}

/* "--launch [OPTIONS] -- PROGRAM ARGS...": see the top of this file. Every option is read (and a
 * bad one refused, exit 2) before any step is taken. */
static int launch(int argc, char **argv) {
    const char *cgroups[8], *netns = NULL, *uid_text = NULL;
    long long nice_by = 0;
    unsigned long long uid = 0, hold = 0;
    int joins = 0, no_new_privs = 0, limits = 0, holding = 0, i = 2;
    struct { int resource; unsigned long long value; const char *option; } rlimits[3];
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *option = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned long long number = 0;
        if (strcmp(option, "--no-new-privs") == 0) { no_new_privs = 1; continue; }
        if (value == NULL) { fprintf(stderr, "term-executor: launch: %s needs a value\n", option); return 2; }
        i++;
        if (strcmp(option, "--cgroup") == 0 && joins < 8) {
            cgroups[joins++] = value;
        } else if (strcmp(option, "--netns") == 0) {
            netns = value;
        } else if (strcmp(option, "--hold") == 0) {
            if (!launch_number(value, &hold) || hold < 3 || hold > 65535) {
                fprintf(stderr, "term-executor: launch: bad option --hold %s\n", value);
                return 2;
            }
            holding = 1;
        } else if (strcmp(option, "--nice") == 0) {
            char *end;
            nice_by = strtoll(value, &end, 10);
            if (!*value || *end) { fprintf(stderr, "term-executor: launch: bad option --nice %s\n", value); return 2; }
        } else {
            int resource = strcmp(option, "--uid") == 0     ? -2
                           : strcmp(option, "--fsize") == 0 ? RLIMIT_FSIZE
                           : strcmp(option, "--nproc") == 0 ? RLIMIT_NPROC
                           : strcmp(option, "--core") == 0  ? RLIMIT_CORE
                                                            : -1;
            if (resource == -1 || !launch_number(value, &number) || (resource != -2 && limits == 3)) {
                fprintf(stderr, "term-executor: launch: bad option %s %s\n", option, value);
                return 2;
            }
            if (resource == -2) { uid = number; uid_text = value; }
            else { rlimits[limits].resource = resource; rlimits[limits].value = number; rlimits[limits].option = option; limits++; }
        }
    }
    if (holding && i < argc) { fputs("term-executor: launch: --hold takes no program\n", stderr); return 2; }
    if (!holding && i + 1 >= argc) { fputs("term-executor: launch: no program after --\n", stderr); return 2; }
    char **program = argv + i + 1;
    /* As root, before anything else: every process of the command is counted from its start. */
    for (int k = 0; k < joins; k++) {
        int fd = open(cgroups[k], O_WRONLY | O_CLOEXEC);
        char pid[32];
        int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
        if (fd < 0 || write(fd, pid, n) != n) return launch_failed("cannot join cgroup", cgroups[k]);
        close(fd);
    }
    if (holding) return held((int)hold);
    if (netns != NULL) {  /* as root too: setns takes CAP_SYS_ADMIN */
        int fd = open(netns, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) return launch_failed("cannot join the network namespace", netns);
        close(fd);
    }
    if (uid_text != NULL) {
        uid_t id = (uid_t)uid, r, e, s;
        if (setgroups(0, NULL) < 0) return launch_failed("cannot drop the supplementary groups for", uid_text);
        if (setresgid(id, id, id) < 0) return launch_failed("cannot take the group", uid_text);
        if (setresuid(id, id, id) < 0) return launch_failed("cannot take the user", uid_text);
        if (getresuid(&r, &e, &s) < 0 || r != id || e != id || s != id) {
            fputs("term-executor: launch: the uid switch did not hold\n", stderr);
            return 125;
        }
    }
    if (no_new_privs && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return launch_failed("cannot set", "no_new_privs");
    for (int k = 0; k < limits; k++) {
        struct rlimit limit = {(rlim_t)rlimits[k].value, (rlim_t)rlimits[k].value};
        if (setrlimit(rlimits[k].resource, &limit) < 0) return launch_failed("cannot set", rlimits[k].option);
    }
    if (nice_by != 0) {
        errno = 0;
        if (nice((int)nice_by) == -1 && errno != 0) return launch_failed("cannot set", "--nice");
    }
    return exec_or_say("term-executor: launch", program);
}

/* -- the egress relay ("--relay") ----------------------------------------------------------- */

#define RELAY_BUFFER (256 * 1024)  /* socat's -b of the relay it replaces: 8 KiB reads cost 4x the calls */
#define RELAY_HALF_CLOSE_MS 60000  /* socat's -t: after one side ends, how long the other may go on */
#define RELAY_TAKEN_WAIT_MS 5000   /* the port taken: how long the one holding it may take to go */

struct direction {
    int from, to;
    char *buffer;
    size_t length, offset; /* what is read and not yet written */
    int ended;             /* ``from`` reached its end, and ``to``'s writing half is shut */
};

/* One step of a direction that poll found ready: read when nothing waits to be written, else write.
 * Returns 0 on success or a pause (EAGAIN), -1 when the connection is over (an error). */
static int relay_step(struct direction *d, int readable, int writable) {
    if (d->length == 0 && readable && !d->ended) {
        ssize_t n = read(d->from, d->buffer, RELAY_BUFFER);
        if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
        if (n == 0) {
            d->ended = 1;
            shutdown(d->to, SHUT_WR);
            return 0;
        }
        d->length = n;
        d->offset = 0;
        writable = 1; /* try at once: the other side is usually ready */
    }
    if (d->length > 0 && writable) {
        ssize_t n = write(d->to, d->buffer + d->offset, d->length - d->offset);
        if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
        d->offset += n;
        if (d->offset == d->length) d->length = 0;
    }
    return 0;
}

static void relay_connection(int client, const char *socket_path) {
    int proxy = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strncpy(address.sun_path, socket_path, sizeof address.sun_path - 1);
    if (proxy < 0 || connect(proxy, (struct sockaddr *)&address, sizeof address) < 0) {
        fprintf(stderr, "egress-relay: cannot reach the proxy at %s: %s\n", socket_path, strerror(errno));
        _exit(1);
    }
    int one = 1;
    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(client, F_SETFL, O_NONBLOCK);
    fcntl(proxy, F_SETFL, O_NONBLOCK);
    struct direction way[2] = {{client, proxy, malloc(RELAY_BUFFER), 0, 0, 0},
                               {proxy, client, malloc(RELAY_BUFFER), 0, 0, 0}};
    if (!way[0].buffer || !way[1].buffer) _exit(1);
    long deadline = -1;
    for (;;) {
        if (way[0].ended && way[1].ended) _exit(0);
        if (deadline < 0 && (way[0].ended || way[1].ended)) deadline = monotonic_ms() + RELAY_HALF_CLOSE_MS;
        struct pollfd p[2] = {{client, 0, 0}, {proxy, 0, 0}}; /* p[k].fd is way[k].from and way[1-k].to */
        for (int k = 0; k < 2; k++) {
            if (way[k].length == 0 && !way[k].ended) p[k].events |= POLLIN;
            if (way[k].length > 0) p[1 - k].events |= POLLOUT;
        }
        int timeout = deadline < 0 ? -1 : (int)(deadline - monotonic_ms());
        if (deadline >= 0 && timeout <= 0) _exit(0);
        int ready = poll(p, 2, timeout);
        if (ready < 0 && errno != EINTR) _exit(1);
        if (ready <= 0) continue;
        for (int k = 0; k < 2; k++) {
            /* an error or hang-up is seen by the read or write it wakes */
            int readable = p[k].revents & (POLLIN | POLLHUP | POLLERR);
            int writable = p[1 - k].revents & (POLLOUT | POLLERR);
            if (relay_step(&way[k], readable, writable) < 0) _exit(1);
        }
    }
}

static void relay_serve(int listener, const char *socket_path) {
    signal(SIGCHLD, SIG_IGN); /* a connection's process is reaped by the kernel */
    signal(SIGPIPE, SIG_IGN);
    for (;;) {
        int client = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0) {
            if (errno == EBADF || errno == EINVAL || errno == ENOTSOCK) _exit(1); /* no listener: never spin */
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
                struct timespec pause = {0, 10000000};
                nanosleep(&pause, NULL); /* out of something: the backlog waits, nothing spins */
            }
            continue;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(listener);
            relay_connection(client, socket_path);
        }
        close(client); /* and if the fork failed, this connection is refused */
    }
}

static int relay_failed(const char *what, const char *arg) {
    fprintf(stderr, "egress relay: %s%s: %s\n", what, arg, strerror(errno));
    return 125;
}

/* "--relay PORT SOCKET -- PROGRAM ARGS...": see the top of this file. */
static int relay_and_exec(int argc, char **argv) {
    unsigned long long port = 0;
    if (argc < 6 || strcmp(argv[4], "--") != 0 || !launch_number(argv[2], &port) || port < 1 || port > 65535 ||
        argv[3][0] != '/' || strlen(argv[3]) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
        fputs("egress relay: usage: te-init --relay PORT /SOCKET -- PROGRAM ARGS...\n", stderr);
        return 2;
    }
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (listener < 0) return relay_failed("cannot make a socket", "");
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* Taken: in a network namespace shared with others (SPEC §23), the relay of the phase before,
     * whose sandbox is ending, or a process of the task's. Wait for the one to go; past the bound,
     * the command runs without a relay of its own, as it would behind a relay that could not bind. */
    long deadline = monotonic_ms() + RELAY_TAKEN_WAIT_MS;
    int bound;
    while ((bound = bind(listener, (struct sockaddr *)&address, sizeof address)) < 0 && errno == EADDRINUSE &&
           monotonic_ms() < deadline) {
        struct timespec step = {0, 2000000};
        nanosleep(&step, NULL);
    }
    if (bound < 0 && errno == EADDRINUSE) {
        fprintf(stderr, "egress relay: 127.0.0.1:%s is taken (a process of this network namespace listens there): "
                        "the command runs without a relay of its own\n", argv[2]);
        close(listener);
        return exec_or_say("egress relay", argv + 5);
    }
    if (bound < 0) return relay_failed("cannot listen on 127.0.0.1:", argv[2]);
    if (listen(listener, 128) < 0) return relay_failed("cannot listen on 127.0.0.1:", argv[2]); /* npm opens 16 at once */
    pid_t middle = fork();
    if (middle < 0) return relay_failed("cannot start", "");
    if (middle == 0) {
        /* The relay: a grandchild, so that the program is not its parent. It keeps nothing of the
         * program's (the init's socket and binary, in a phase's sandbox) but the listener and stderr. */
        prctl(PR_SET_NAME, "te-relay"); /* before the fork: the relay has its name once the prefix goes on */
        if (fork() != 0) _exit(0);
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(listener, 3) < 0) _exit(1);
        syscall(SYS_close_range, 4, ~0U, 0);
        relay_serve(3, argv[3]);
    }
    int status;
    while (waitpid(middle, &status, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return relay_failed("cannot start", "");
    close(listener);
    return exec_or_say("egress relay", argv + 5);
}

static int make_userns(int argc, char **argv) {
    if (argc != 3) return 2;
    long owner = atol(argv[2]);
    if (owner < 0) return 2;
    if ((uid_t)owner != geteuid()) {
        if (setgroups(0, NULL) < 0) return 126;
        if (setresgid((gid_t)owner, (gid_t)owner, (gid_t)owner) < 0) return 126;
        if (setresuid((uid_t)owner, (uid_t)owner, (uid_t)owner) < 0) return 126;
    }
    if (unshare(CLONE_NEWUSER) < 0) return 1;
    char go = 0;
    if (write(1, "1", 1) != 1) return 1;
    if (read(0, &go, 1) != 1 || go != '1') return 1;
    int limit = open("/proc/sys/user/max_user_namespaces", O_WRONLY | O_CLOEXEC);
    if (limit < 0) return 1;
    if (write(limit, "0", 1) != 1) return 1;
    close(limit);
    if (write(1, "2", 1) != 1) return 1;
    while (read(0, &go, 1) > 0) {}
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (strcmp(argv[1], "--as") == 0) return switch_and_exec(argc, argv);
    if (strcmp(argv[1], "--userns") == 0) return make_userns(argc, argv);
    if (strcmp(argv[1], "--launch") == 0) return launch(argc, argv);
    if (strcmp(argv[1], "--relay") == 0) return relay_and_exec(argc, argv);
    control = atoi(argv[1]);
    /* Run from a descriptor (/proc/self/fd/N: initbin.exec_path), this process would be named N:
     * the host finds it by its name. Nothing inherited but the socket stays open (the descriptor
     * it was run from among them). */
    prctl(PR_SET_NAME, "te-init");
    if (control > 3) syscall(SYS_close_range, 3, control - 1, 0);
    syscall(SYS_close_range, control + 1, ~0U, 0);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    /* Not dumpable: a process of the sandbox without CAP_SYS_PTRACE there (none has it) cannot
     * ptrace this one, so the exit statuses it reports are the commands' own. An exec's program
     * is dumpable again after its execve, as any. */
    prctl(PR_SET_DUMPABLE, 0);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) return 3;
    signal(SIGPIPE, SIG_IGN);
    say("R 0 0");
    for (;;) {
        struct pollfd p[2] = {{control, POLLIN, 0}, {sfd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return 4;
        }
        if (p[1].revents & POLLIN) {
            struct signalfd_siginfo info;
            while (read(sfd, &info, sizeof info) > 0) {}
            reap();
        }
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            char buf[256];
            int fds[4], nfds = 0;
            if (receive(buf, sizeof buf, fds, &nfds) < 0) return 0;
            unsigned long id = 0;
            int sig = 0;
            if (buf[0] == 'E' && sscanf(buf + 1, "%lu", &id) == 1) {
                if (nfds == 4) start(id, fds);
                else {
                    for (int i = 0; i < nfds; i++) close(fds[i]);
                    char reply[64];
                    snprintf(reply, sizeof reply, "F %lu %d", id, EINVAL);
                    say(reply);
                }
            } else {
                for (int i = 0; i < nfds; i++) close(fds[i]);
                if (buf[0] == 'K' && sscanf(buf + 1, "%lu %d", &id, &sig) == 2) signal_exec(id, sig);
            }
        }
    }
}
