/*
 * `ivserve pack IN.h5ad OUT.h5ad ...`: argument parsing, progress display
 * and the summary line around core/matrix/pack.c.
 */
#ifndef IV_CLI_PACK_H
#define IV_CLI_PACK_H

/* Runs `ivserve pack` (argv[1] == "pack"); returns the exit status
 * (0 ok, 1 error reported on stderr, 2 usage). */
int iv_cli_pack_main(int argc, char **argv);

#endif
