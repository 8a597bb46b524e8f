#ifndef IV_VERSION_H
#define IV_VERSION_H
/* The ivserve version string (static storage). */
const char *iv_version(void);
#endif
