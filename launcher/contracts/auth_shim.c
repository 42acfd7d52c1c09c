/*
 * hpc-serve's access-token shim for tritonserver (launcher/contracts/auth.py builds it and documents why).
 *
 * tritonserver takes the key of its restricted APIs only as a command-line value
 * (--http-restricted-api=<apis>:<header>=<value>), and a process's arguments are readable by every user of
 * the node (/proc/<pid>/cmdline, ps). Preloaded into tritonserver, this shim wraps __libc_start_main and
 * hands main() the original arguments plus one flag per prefix named in HPC_SERVE_AUTH_FLAGS (one per line),
 * each completed with the token read from the 0600 file HPC_SERVE_AUTH_FILE. The kernel's view of the
 * arguments is the original memory, which never holds the token. Before main() runs, the shim removes its
 * variables and itself from LD_PRELOAD, so the python backend stubs tritonserver starts inherit neither.
 *
 * Fails closed: whatever goes wrong (no file, a file others may read, a malformed token) ends the process
 * with a message and exit status 78 before the server could listen unprotected. A process that is not
 * tritonserver (a wrapper script on the way to it) is left alone, variables included, so the tritonserver
 * it starts still gets them.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILE_VAR "HPC_SERVE_AUTH_FILE"
#define FLAGS_VAR "HPC_SERVE_AUTH_FLAGS"
#define EXIT_SETUP 78 /* EX_CONFIG */
#define MAX_TOKEN 512
#define MAX_FLAGS 8

typedef int (*main_fn)(int, char **, char **);
typedef int (*start_fn)(main_fn, int, char **, void (*)(void), void (*)(void), void (*)(void), void *);

extern char **environ;
static main_fn real_main;

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "[hpc-serve auth] %s%s%s; tritonserver not started\n", what, detail ? ": " : "",
            detail ? detail : "");
    _exit(EXIT_SETUP);
}

static int token_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.' || c == '~';
}

/* The token: the file's one line, trailing whitespace removed; only URL-safe characters, since it becomes an
 * HTTP header value and part of tritonserver's <key>=<value> option. */
static void read_token(const char *path, char *token) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) fail("cannot open the token file", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) fail("the token file is not a regular file", path);
    if (st.st_uid != geteuid()) fail("the token file belongs to another user", path);
    if (st.st_mode & 077) fail("the token file may be read by others (chmod 600 it)", path);
    ssize_t n = read(fd, token, MAX_TOKEN);
    close(fd);
    if (n < 0) fail("cannot read the token file", strerror(errno));
    if (n >= MAX_TOKEN) fail("the token file is too long", path);
    while (n > 0 && (token[n - 1] == '\n' || token[n - 1] == '\r' || token[n - 1] == ' ' || token[n - 1] == '\t')) n--;
    token[n] = '\0';
    if (n < 16) fail("the token file holds no token of 16 characters or more", path);
    for (ssize_t i = 0; i < n; i++)
        if (!token_char(token[i])) fail("the token has a character other than A-Z a-z 0-9 - _ . ~", path);
}

/* LD_PRELOAD without this library (entries are separated by ':' or spaces). */
static void drop_self_from_preload(void) {
    const char *preload = getenv("LD_PRELOAD");
    Dl_info self;
    if (!preload || !dladdr((void *)drop_self_from_preload, &self) || !self.dli_fname) return;
    char *copy = strdup(preload), *kept = calloc(strlen(preload) + 1, 1), *save = NULL;
    if (!copy || !kept) fail("out of memory", NULL);
    for (char *entry = strtok_r(copy, ": ", &save); entry; entry = strtok_r(NULL, ": ", &save)) {
        if (strcmp(entry, self.dli_fname) == 0) continue;
        if (*kept) strcat(kept, ":");
        strcat(kept, entry);
    }
    if (*kept)
        setenv("LD_PRELOAD", kept, 1);
    else
        unsetenv("LD_PRELOAD");
    free(copy);
    free(kept);
}

static int is_tritonserver(void) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 0;
    exe[n] = '\0';
    const char *base = strrchr(exe, '/');
    return strcmp(base ? base + 1 : exe, "tritonserver") == 0;
}

static int wrapped_main(int argc, char **argv, char **envp) {
    const char *path = getenv(FILE_VAR), *flags = getenv(FLAGS_VAR);
    if (!is_tritonserver()) return real_main(argc, argv, envp);
    if (!path || !*path || !flags || !*flags) fail(FILE_VAR " and " FLAGS_VAR " must both be set", NULL);
    static char token[MAX_TOKEN + 1];
    read_token(path, token);

    char **args = calloc((size_t)argc + MAX_FLAGS + 1, sizeof(char *));
    char *prefixes = strdup(flags), *save = NULL;
    if (!args || !prefixes) fail("out of memory", NULL);
    int n = 0;
    for (; n < argc; n++) args[n] = argv[n];
    for (char *prefix = strtok_r(prefixes, "\n", &save); prefix; prefix = strtok_r(NULL, "\n", &save)) {
        if (n == argc + MAX_FLAGS) fail("too many flags in " FLAGS_VAR, NULL);
        if (strncmp(prefix, "--", 2) != 0) fail("a line of " FLAGS_VAR " is not a --flag", prefix);
        size_t size = strlen(prefix) + strlen(token) + 1;
        if (!(args[n] = malloc(size))) fail("out of memory", NULL);
        snprintf(args[n++], size, "%s%s", prefix, token);
    }
    args[n] = NULL;
    unsetenv(FILE_VAR);
    unsetenv(FLAGS_VAR);
    drop_self_from_preload();
    return real_main(n, args, environ);
}

int __libc_start_main(main_fn main, int argc, char **argv, void (*init)(void), void (*fini)(void),
                      void (*rtld_fini)(void), void *stack_end) {
    start_fn real = (start_fn)dlsym(RTLD_NEXT, "__libc_start_main");
    if (!real) fail("cannot find the C library's __libc_start_main", dlerror());
    real_main = main;
    return real(wrapped_main, argc, argv, init, fini, rtld_fini, stack_end);
}
