#!/usr/bin/env bash
# Runs every test program given on the command line from the repository root
# and counts the PASS / FAIL / SKIP lines they print. A program that exits
# non-zero without printing a FAIL line (a crash) counts as one failure.
# The last line is "N passed, N failed, N skipped".
# Programs that exercise the compute kernels run their cases once per kernel
# family the CPU has (tests/t.h, t_families): their lines end in " [family]",
# and a family the CPU or build lacks is one "SKIP kernels [family]: why"
# line. SD_TEST_KERNELS=<family> runs one family only; SD_TEST_SLOW=1 adds
# the default model's cases under the scalar family.
set -u
cd "$(dirname "$0")/.." || exit 2
pass=0; fail=0; skip=0
for t in "$@"; do
  name=$(basename "$t")
  echo "== $name"
  out=$("$t" 2>&1); rc=$?
  printf '%s\n' "$out" | sed 's/^/   /'
  p=$(printf '%s\n' "$out" | grep -c '^PASS ')
  f=$(printf '%s\n' "$out" | grep -c '^FAIL ')
  s=$(printf '%s\n' "$out" | grep -c '^SKIP ')
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "   FAIL $name: exited with status $rc"
    f=1
  fi
  pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
done
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
