/* pyfork: `python3` for the test scripts, through a server that has the
 * judges' modules loaded (tests/support/py_server.py, whose comment gives
 * the protocol). Used as python3 is: `pyfork SCRIPT ARGS...`, `pyfork -c
 * CODE ARGS...`, `pyfork - ARGS...`; it ends as the command ended (its exit
 * status, or its signal), and passes the signals it gets to the command.
 *
 * Environment: TP_PYFORK_DIR, a directory of the test's own for the
 * server's socket (DIR/sock) and lock; TP_PYFORK_PYTHON, the real
 * interpreter (default /usr/bin/python3); TP_PYFORK_SERVER, py_server.py.
 * Without TP_PYFORK_DIR, for any other form of arguments, when the server
 * cannot be had, or when it answers "fallback", pyfork becomes the real
 * interpreter (exec): the command runs as it would have, only slower. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static const char *real_python(void)
{
    const char *python = getenv("TP_PYFORK_PYTHON");
    return python && *python ? python : "/usr/bin/python3";
}

static void become_python(char **argv)
{
    const char *python = real_python();
    argv[0] = (char *)python;
    execv(python, argv);
    fprintf(stderr, "pyfork: cannot run %s: %s\n", python, strerror(errno));
    exit(127);
}

static int connect_to(const char *path)
{
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof address.sun_path) return -1;
    strcpy(address.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&address, sizeof address) == 0) return fd;
    close(fd);
    return -1;
}

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* The server's socket, the server started first when there is none (one
 * client starts it, under the directory's lock; the others wait for it).
 * -1 when it cannot be had within 60 s. */
static int server_socket(const char *dir)
{
    char sock[4096], lock[4096];
    snprintf(sock, sizeof sock, "%s/sock", dir);
    snprintf(lock, sizeof lock, "%s/lock", dir);
    int fd = connect_to(sock);
    if (fd >= 0) return fd;
    const char *server = getenv("TP_PYFORK_SERVER");
    if (!server || !*server) return -1;
    int lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd < 0 || flock(lock_fd, LOCK_EX) != 0) {
        if (lock_fd >= 0) close(lock_fd);
        return -1;
    }
    fd = connect_to(sock);
    if (fd < 0) {
        /* Started under the lock: one server per directory. Its output goes
         * nowhere (a test's captured output must not hold it). */
        pid_t pid = fork();
        if (pid == 0) {
            int null = open("/dev/null", O_RDWR);
            if (null >= 0) {
                dup2(null, 0), dup2(null, 1), dup2(null, 2);
                if (null > 2) close(null);
            }
            execl(real_python(), real_python(), server, (char *)NULL); /* the directory: TP_PYFORK_DIR */
            _exit(127);
        }
        for (int i = 0; pid > 0 && i < 6000 && fd < 0; i++) {
            if (waitpid(pid, NULL, WNOHANG) == pid) break; /* it failed */
            sleep_ms(10);
            fd = connect_to(sock);
        }
    }
    flock(lock_fd, LOCK_UN);
    close(lock_fd);
    return fd;
}

static int send_request(int fd, int argc, char **argv)
{
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) return -1;
    size_t length = strlen(cwd) + 1 + 16;
    for (int i = 1; i < argc; i++) length += strlen(argv[i]) + 1;
    for (char **e = environ; *e; e++) length += strlen(*e) + 1;
    char *body = malloc(4 + length);
    if (!body) return -1;
    char *at = body + 4;
    at += sprintf(at, "%s", cwd) + 1;
    at += sprintf(at, "%d", argc - 1) + 1;
    for (int i = 1; i < argc; i++) at += sprintf(at, "%s", argv[i]) + 1;
    for (char **e = environ; *e; e++) at += sprintf(at, "%s", *e) + 1;
    uint32_t n = (uint32_t)(at - body - 4);
    for (int i = 0; i < 4; i++) body[i] = (char)((n >> (8 * i)) & 0xff);

    /* The body, with descriptors 0, 1 and 2 riding on its first bytes. */
    int fds[3] = {0, 1, 2};
    char control[CMSG_SPACE(sizeof fds)];
    memset(control, 0, sizeof control);
    struct iovec iov = {body, (size_t)(at - body)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
    size_t done = sent > 0 ? (size_t)sent : 0;
    while (sent >= 0 && done < (size_t)(at - body)) {
        sent = send(fd, body + done, (size_t)(at - body) - done, MSG_NOSIGNAL);
        if (sent > 0) done += (size_t)sent;
    }
    free(body);
    return sent < 0 ? -1 : 0;
}

static int server_fd = -1;

/* A signal for the command: "kill S" to the server (write is async-signal-safe). */
static void relay(int sig)
{
    char line[32];
    int n = 0;
    const char *prefix = "kill ";
    while (prefix[n]) line[n] = prefix[n], n++;
    char digits[12];
    int d = 0;
    for (int v = sig; v > 0 || d == 0; v /= 10) digits[d++] = (char)('0' + v % 10);
    while (d) line[n++] = digits[--d];
    line[n++] = '\n';
    if (write(server_fd, line, (size_t)n) < 0) { /* the server is gone: the command with it */
    }
}

/* The next line from the server into line (without its newline); 0 at its end. */
static int read_line(int fd, char *line, size_t size)
{
    size_t n = 0;
    for (;;) {
        char ch;
        ssize_t got = read(fd, &ch, 1);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return 0;
        if (ch == '\n') break;
        if (n + 1 < size) line[n++] = ch;
    }
    line[n] = 0;
    return 1;
}

int main(int argc, char **argv)
{
    const char *dir = getenv("TP_PYFORK_DIR");
    int form_known = argc > 1 && (strcmp(argv[1], "-") == 0 || (strcmp(argv[1], "-c") == 0 && argc > 2) ||
                                  argv[1][0] != '-');
    if (!dir || !*dir || !form_known) become_python(argv);
    server_fd = server_socket(dir);
    if (server_fd < 0 || send_request(server_fd, argc, argv) != 0) become_python(argv);
    char line[64];
    if (!read_line(server_fd, line, sizeof line) || strncmp(line, "pid ", 4) != 0) {
        close(server_fd);
        become_python(argv); /* "fallback", or a server that went away before starting it */
    }
    int relayed[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    struct sigaction action = {.sa_handler = relay};
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < sizeof relayed / sizeof *relayed; i++) sigaction(relayed[i], &action, NULL);
    if (!read_line(server_fd, line, sizeof line)) {
        fprintf(stderr, "pyfork: the Python server went away before %s ended\n", argc > 1 ? argv[1] : "the command");
        return 1;
    }
    if (strncmp(line, "exit ", 5) == 0) return atoi(line + 5);
    if (strncmp(line, "signal ", 7) == 0) { /* end as the command did */
        int sig = atoi(line + 7);
        signal(sig, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        raise(sig);
        return 128 + sig;
    }
    fprintf(stderr, "pyfork: unexpected answer from the Python server: %s\n", line);
    return 1;
}
