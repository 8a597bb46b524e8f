/*
 * Command-line subcommands of the ivserve binary that need no server:
 * `ivserve check FILE` and `ivserve export FILE ... -o OUT.npz`.
 */
#ifndef IV_CLI_H
#define IV_CLI_H

/* Returns non-zero when argv[1] names a CLI subcommand ("check", "export"). */
int iv_cli_is_command(const char *name);

/* Runs the subcommand in argv[1]; returns the process exit status
 * (0 ok, 1 error reported on stderr, 2 usage). */
int iv_cli_main(int argc, char **argv);

#endif
