/* ivserve entry point: subcommands (check, export) and the server. */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: ivserve check FILE | export FILE [--obs SEL] [--var SEL] -o OUT.npz\n");
        return 2;
    }
    fprintf(stderr, "ivserve: unknown command '%s'\n", argv[1]);
    return 2;
}
