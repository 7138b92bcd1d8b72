// cmd_client_missing.c - `specdec client` in a build without libcurl (the
// Makefile links this file instead of tools/client/*.c).
#include "cli_common.h"

int cmd_client(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("client: this specdec was built without libcurl; install it "
                     "(apt-get install libcurl4-openssl-dev pkg-config) and run make again");
}
