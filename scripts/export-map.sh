#!/bin/sh
# export-map.sh - the linker version script of build/libspecdec.so: the
# functions that include/*.h declare are global, everything else is local.
# usage: scripts/export-map.sh include/*.h > build/specdec.map
set -e
echo "SPECDEC_0 {"
echo "  global:"
grep -hE '^[^/ #].*\bsd_[a-z0-9_]+\(' "$@" | grep -v '^typedef' |
  sed -E 's/^([^(]*[ *])?(sd_[a-z0-9_]+)\(.*/    \2;/' | sort -u
echo "  local: *;"
echo "};"
