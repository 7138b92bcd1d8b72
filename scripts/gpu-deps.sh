#!/usr/bin/env bash
# gpu-deps.sh - puts what scripts/gpu-check.sh needs to build specdec on a
# device machine that has a CUDA toolkit but no package registry into
# .gpudeps/ (ignored by git; name it in the device call's `carry`): jansson's
# headers and static library, from this Debian machine's libjansson-dev, and
# with --bin a CUDA build made here (x86-64-v3, or GPU_DEPS_MARCH; in a copy of the tree) that
# gpu-check.sh unpacks if its own build fails there.
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
if [ "${1:-}" = --bin ]; then
    tmp=$(mktemp -d)
    git clone -q . "$tmp/t" && cp -r .gpudeps "$tmp/t/"
    (cd "$tmp/t" && make -j"$(nproc)" CUDA=1 OPT="-O3 -march=${GPU_DEPS_MARCH:-x86-64-v3}" HAVE_SERVE= HAVE_CLIENT= HAVE_JSON=1 \
        "JSON_CFLAGS=-I$PWD/.gpudeps/include" "JSON_LIBS=$PWD/.gpudeps/libjansson.a" \
        build/specdec build/tests/gpu/test_gpu build/tests/tool_synth_shape build/tests/tool_random_head >/dev/null &&
        tar czf bin.tgz build/specdec build/tests/gpu/test_gpu build/tests/tool_synth_shape build/tests/tool_random_head) &&
        cp "$tmp/t/bin.tgz" .gpudeps/
    rm -rf "$tmp"
    echo "gpu-deps: .gpudeps/bin.tgz ($(du -sh .gpudeps/bin.tgz | cut -f1))"
fi
