#!/usr/bin/env bash
# gpu-deps.sh - puts what scripts/gpu-check.sh needs to build specdec on a
# device machine that has a CUDA toolkit but no package registry into
# .gpudeps/ (ignored by git; name it in the device call's `carry`): jansson's
# headers and static library, from this Debian machine's libjansson-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f /usr/include/jansson.h ] || [ ! -f /usr/lib/x86_64-linux-gnu/libjansson.a ]; then
    echo "gpu-deps: libjansson-dev is not installed here (apt-get install libjansson-dev)" >&2
    exit 1
fi
rm -rf .gpudeps
mkdir -p .gpudeps/include
cp /usr/include/jansson.h /usr/include/jansson_config.h .gpudeps/include/
cp /usr/lib/x86_64-linux-gnu/libjansson.a .gpudeps/
echo "gpu-deps: .gpudeps/ ($(du -sh .gpudeps | cut -f1)): jansson $(sed -n 's/.*JANSSON_VERSION *"\(.*\)".*/\1/p' .gpudeps/include/jansson.h)"
