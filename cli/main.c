/*
 * ivserve entry point.  `ivserve check ...`, `export`, `pack` and
 * `token-hash` are command-line tools (cli/cli.c); `ivserve serve ...`,
 * or anything else, starts the server with settings from --config,
 * IVSERVE_* variables and flags (config/config.h).  `ivserve help`, -h
 * and --help list the commands, then the server's options.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "config.h"
#include "server.h"
#include "version.h"

extern char **environ;

/* One line a command; the server's options follow (iv_config_usage). */
static const char commands_help[] =
    "ivserve serves .h5ad count matrices over HTTP.  Commands:\n"
    "  serve [options] FILE.h5ad ...    serve the files (the default: 'serve' may be left out)\n"
    "  check FILE [--group G]           validate a file as the server loads it; print shape, codec, times\n"
    "  pack IN.h5ad OUT.h5ad [options]  write the packed layout the server reads (ivserve pack --help)\n"
    "  export FILE [selection] -o OUT   write a selection as .npz or .h5ad\n"
    "  token-hash NAME [SCOPE] < token  print a tokens-file line for a bearer token\n"
    "  help                             this text\n"
    "\n";

/* A heap copy of the command line (NULL out of memory). */
static char **argv_dup(int argc, char *const *argv)
{
    char **v = calloc((size_t)argc + 1, sizeof *v);
    for (int i = 0; v && i < argc; i++) {
        if (!(v[i] = strdup(argv[i]))) {
            while (i-- > 0) free(v[i]);
            free(v);
            v = NULL;
        }
    }
    return v;
}

static void argv_free(int argc, char **v)
{
    for (int i = 0; v && i < argc; i++) free(v[i]);
    free(v);
}

/* The command line (the heap copy), kept for reloads: SIGHUP reads the
 * same sources again. */
struct args {
    int argc;
    char **argv;
};

static int reread_config(void *arg, iv_config_t *out, iv_err_t *err)
{
    const struct args *a = arg;
    int rc = iv_config_from_args(out, a->argc, a->argv, environ, err);
    return rc == 1 ? iv_fail(err, IV_EINVALID_ARG, "--help or --version on the command line") : rc;
}

/*
 * The signals are held back from the program's first instruction: an ELF
 * .preinit_array entry of the executable runs once the dynamic loader has
 * relocated everything, before any library's constructors (about 5 ms
 * here, with libhdf5's dependencies) and main.  The loader's own time
 * before it cannot be covered from inside the process; a supervisor that
 * must not lose a signal sent at exec starts the server with them blocked,
 * and a blocked signal is honoured too.  Commands (check, export, pack,
 * token-hash) keep the default dispositions.
 */
static void block_early(int argc, char **argv, char **envp)
{
    (void)envp;
    if (!(argc >= 2 && argv && iv_cli_is_command(argv[1]))) iv_server_block_signals();
}
__attribute__((section(".preinit_array"), used))
static void (*const iv_preinit)(int, char **, char **) = block_early;

int main(int argc, char **argv_in)
{
    if (argc >= 2 && iv_cli_is_command(argv_in[1])) return iv_cli_main(argc, argv_in);
    if (argc >= 2 && !strcmp(argv_in[1], "serve")) {
        /* `ivserve serve ARGS` is `ivserve ARGS`: the program name moves
         * into the command's slot and argv starts one later (still ending
         * with NULL; what ps shows is not changed). */
        argv_in[1] = argv_in[0];
        argv_in++;
        argc--;
    }
    if (argc >= 2 && !strcmp(argv_in[1], "help")) {
        fputs(commands_help, stdout);
        fputs(iv_config_usage(), stdout);
        return 0;
    }
    /* Until the server's handlers are in place, SIGTERM or SIGHUP would
     * kill the process by their default action; held back, they are
     * honoured once the server runs (see iv_server_block_signals).  Done
     * again here for a build where .preinit_array is not run. */
    iv_server_block_signals();
    /* Settings are read from a copy of the command line, which a reload
     * can read again: the original is what ps shows, and its --token
     * values are wiped below. */
    char **argv = argv_dup(argc, argv_in);
    if (!argv) {
        fprintf(stderr, "ivserve: out of memory\n");
        return 1;
    }
    if (iv_config_scrub_argv(argc, argv_in) > 0)
        fprintf(stderr, "ivserve: warning: --token is deprecated: other users of this machine can "
                        "read it (ps, /proc) until start-up overwrites it; use --token-file or "
                        "IVSERVE_TOKENS\n");
    iv_config_t cfg;
    iv_config_init(&cfg);
    iv_err_t err;
    iv_err_clear(&err);
    int rc = iv_config_from_args(&cfg, argc, argv, environ, &err);
    int code;
    if (rc == 1) {
        int version = 0;
        for (int i = 1; i < argc; i++) version |= !strcmp(argv[i], "--version");
        if (version) {
            printf("ivserve %s\n", iv_version());
        } else {  /* --help or -h */
            fputs(commands_help, stdout);
            fputs(iv_config_usage(), stdout);
        }
        code = 0;
    } else if (rc != 0) {
        /* The message says what to change; the usage text would bury it.
         * With no arguments at all, the usage is what the user needs. */
        fprintf(stderr, "ivserve: %s\n%s", err.msg, argc == 1 ? iv_config_usage() : "");
        code = 2;
    } else {
        struct args args = {argc, argv};
        code = iv_server_run_with(&cfg, reread_config, &args);
    }
    iv_config_free(&cfg);
    argv_free(argc, argv);
    return code;
}
