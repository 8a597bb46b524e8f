/*
 * `ivserve token-hash NAME [SCOPE]`: reads a token on stdin and prints the
 * tokens-file line for it ("NAME SHA256HEX [SCOPE]"), so an operator can
 * add a token without the token ever being written to the file, the
 * command line or the shell's history.
 */
#ifndef IV_CLI_TOKEN_H
#define IV_CLI_TOKEN_H

/* argv[1] is "token-hash".  Exit status: 0, 1 (bad input), 2 (usage). */
int iv_cli_token_main(int argc, char **argv);

#endif
