#!/usr/bin/env bash
# setup.sh - install what specdec needs on a Debian machine, and say what.
#
#   scripts/setup.sh build   what `make run` needs: compiler, make, pkg-config,
#                            jansson, libmicrohttpd, libcurl (the split
#                            client), python3 with pip (the model download)
#   scripts/setup.sh test    the above, plus what the tests use: Chromium (the
#                            page test), python3-doc (the training-data test)
#                            and the `openai` Python client (the server tests),
#                            Open MPI (make test-mpi: openmpi-bin, libopenmpi-dev)
#
# `make run`, `make test` and .ci/run all call it. It installs nothing when
# everything is present (and then prints nothing). It runs apt-get as root, or
# through sudo when sudo works without a password; otherwise it prints the one
# command to run and exits 1. SPECDEC_NO_SETUP=1 skips it entirely.
set -u
mode="${1:-build}"
case "$mode" in
  build|test) ;;
  -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "setup: unknown mode '$mode' (build or test)" >&2; exit 2 ;;
esac
[ "${SPECDEC_NO_SETUP:-0}" = 1 ] && exit 0

say() { echo "setup: $*" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }

need=()
have cc || have gcc || need+=(gcc)
have make || need+=(make)
have python3 || need+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
have pkg-config || need+=(pkg-config)
# pkg-config itself may be what is missing: then the libraries are checked by
# their headers.
pc() { if have pkg-config; then pkg-config --exists "$1" 2>/dev/null; else [ -e "$2" ]; fi; }
pc jansson /usr/include/jansson.h || need+=(libjansson-dev)
pc libmicrohttpd /usr/include/microhttpd.h || need+=(libmicrohttpd-dev)
# the split client (specdec client, docs/split.md)
pc libcurl /usr/include/x86_64-linux-gnu/curl/curl.h || need+=(libcurl4-openssl-dev)
if [ "$mode" = test ]; then
  # tests/serve/test_page.py drives the chat page in headless Chromium
  have chromium || need+=(chromium)
  # tests/train/test_train_data.py reads Python's HTML documentation
  [ -d /usr/share/doc/python3-doc/html ] || need+=(python3-doc)
  # make test-mpi (tests/mpi): Open MPI's mpicc and mpirun (docs/mpi.md)
  have mpicc || need+=(libopenmpi-dev)
  have mpirun || need+=(openmpi-bin)
fi

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then sudo=""
  elif have sudo && sudo -n true 2>/dev/null; then sudo="sudo"
  else
    say "missing Debian packages: ${need[*]}"
    say "install them with:  sudo apt-get install -y ${need[*]}"
    exit 1
  fi
  say "installing Debian packages: ${need[*]}"
  $sudo apt-get update -q >/dev/null &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null ||
    { say "apt-get install failed; run: sudo apt-get install -y ${need[*]}"; exit 1; }
fi

if [ "$mode" = test ] && ! python3 -c 'import openai' >/dev/null 2>&1; then
  say "installing the Python package openai (the server tests' client)"
  python3 -m pip install -q openai >/dev/null 2>&1 ||
    python3 -m pip install -q --break-system-packages openai >/dev/null 2>&1 ||
    python3 -m pip install -q --user openai >/dev/null 2>&1 ||
    say "could not install openai (pip install openai); the server tests will be skipped"
fi
exit 0
