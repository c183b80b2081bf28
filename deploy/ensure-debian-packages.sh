#!/bin/sh
# Install the Debian packages a suite or a deployment script needs, when they are missing.
#
#   deploy/ensure-debian-packages.sh PACKAGE...
#
# Installed packages are left alone. Missing ones are installed with apt-get when we
# run as root (the package lists are refreshed once if apt-get cannot find a package);
# otherwise the script names them, says how to install them, and exits 1.
# Service start-up is never asked for: on a systemd host the caller stops what the
# packages start if it needs the ports.
set -eu

if [ "$#" -eq 0 ]; then
    echo "usage: $0 PACKAGE..." >&2
    exit 2
fi

installed() {
    dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null | grep -qx installed
}

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    echo "error: this is not a Debian-like system (no dpkg-query/apt-get); install by hand: $*" >&2
    exit 1
fi

missing=""
for package in "$@"; do
    installed "$package" || missing="$missing $package"
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "error: missing Debian packages:$missing" >&2
    echo "       install them as root: apt-get install -y --no-install-recommends$missing" >&2
    exit 1
fi

echo "installing Debian packages:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086  # one word per package
if ! apt-get install -y --no-install-recommends $missing >&2; then
    echo "apt-get could not install them with the current package lists; updating them" >&2
    apt-get update >&2
    # shellcheck disable=SC2086
    apt-get install -y --no-install-recommends $missing >&2
fi

for package in $missing; do
    if ! installed "$package"; then
        echo "error: $package is still not installed after apt-get" >&2
        exit 1
    fi
done
