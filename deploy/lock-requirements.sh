#!/bin/sh
# Re-pin requirements.lock: resolve the project's runtime dependencies afresh in a throw-away
# virtualenv, with the Python of the Dockerfile's base image, and freeze what got installed.
#
#   deploy/lock-requirements.sh        (or: make lock; PYTHON=python3.11 picks the interpreter)
#
# Run it after changing [project].dependencies in pyproject.toml, or to take newer releases;
# then `make test` (the venv is reinstalled at the new pins) and commit requirements.lock.
set -eu
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}

want=$(sed -n 's/^FROM python:\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' Dockerfile | head -n 1)
have=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$want" != "$have" ]; then
    echo "$0: the image runs Python $want but $python is $have; set PYTHON=python$want" >&2
    exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Only what a build reads, so no build/ or egg-info lands in the working tree.
mkdir "$tmp/src"
cp -R pyproject.toml README.md queue_server client "$tmp/src/"
"$python" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --quiet --upgrade pip
# The SDK's distribution beside the server, so its pin comes from this checkout, not an index.
"$tmp/venv/bin/python" -m pip install --quiet "$tmp/src/client" "$tmp/src"
{
    sed -n '/^#/!q; p' requirements.lock
    "$tmp/venv/bin/python" -m pip freeze --exclude queue-server --exclude queue-server-client
} >"$tmp/requirements.lock"
mv "$tmp/requirements.lock" requirements.lock
echo "requirements.lock: $(grep -vc '^#' requirements.lock) packages pinned"
