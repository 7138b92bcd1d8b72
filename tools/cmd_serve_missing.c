// cmd_serve_missing.c - `specdec serve` in a build without libmicrohttpd (the
// Makefile links this file instead of tools/serve/*.c).
#include "cli_common.h"

int cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("serve: this specdec was built without libmicrohttpd; install it "
                     "(apt-get install libmicrohttpd-dev pkg-config) and run make again");
}
