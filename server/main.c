/* ivserve entry point: subcommands (check, export) and the server. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int main(int argc, char **argv)
{
    if (argc >= 2 && iv_cli_is_command(argv[1])) return iv_cli_main(argc, argv);
    fprintf(stderr, "usage: ivserve check FILE | export FILE [--obs SEL] [--var SEL] -o OUT.npz\n");
    return 2;
}
