// serve_missing.c - `specdec serve` in a build without libmicrohttpd and
// jansson (the Makefile links this file instead of tools/serve/*.c).
#include "cli_common.h"

int cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("serve: this specdec was built without libmicrohttpd and jansson; install them "
                     "(apt-get install libmicrohttpd-dev libjansson-dev pkg-config) and run make again");
}
