// cli_run.h - run the specdec command-line binary from a test and capture its output.
#ifndef SD_TEST_CLI_RUN_H
#define SD_TEST_CLI_RUN_H

#include <stddef.h>

// Runs `bin args` through the shell with stdout and stderr together (or only
// stdout when merge == 0), storing at most outlen - 1 bytes of its output,
// NUL-terminated, in out (out[0] = 0 if it could not be started). Returns the
// exit status, -1 if it did not exit.
int cli_run(const char *bin, const char *args, int merge, char *out, size_t outlen);

#endif
