/*
 * ivserve entry point.  `ivserve check ...` and `ivserve export ...` are
 * command-line tools (server/cli.c); anything else starts the server with
 * settings from --config, IVSERVE_* variables and flags (config/config.h).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "config.h"
#include "server.h"
#include "version.h"

extern char **environ;

/* The command line, kept for reloads: SIGHUP reads the same sources again. */
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

int main(int argc, char **argv)
{
    if (argc >= 2 && iv_cli_is_command(argv[1])) return iv_cli_main(argc, argv);
    iv_config_t cfg;
    iv_config_init(&cfg);
    iv_err_t err;
    iv_err_clear(&err);
    int rc = iv_config_from_args(&cfg, argc, argv, environ, &err);
    if (rc == 1) {
        int version = 0;
        for (int i = 1; i < argc; i++) version |= !strcmp(argv[i], "--version");
        if (version) printf("ivserve %s\n", iv_version());
        else fputs(iv_config_usage(), stdout);
        iv_config_free(&cfg);
        return 0;
    }
    if (rc != 0) {
        /* The message says what to change; the usage text would bury it.
         * With no arguments at all, the usage is what the user needs. */
        fprintf(stderr, "ivserve: %s\n%s", err.msg, argc == 1 ? iv_config_usage() : "");
        iv_config_free(&cfg);
        return 2;
    }
    struct args a = {argc, argv};
    int code = iv_server_run_with(&cfg, reread_config, &a);
    iv_config_free(&cfg);
    return code;
}
