/* Build identity, reported by the CLI and the server. */
#include "version.h"

const char *iv_version(void)
{
    return "0.1.0";
}
