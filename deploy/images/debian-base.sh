#!/usr/bin/env bash
# Makes the image every tidemq image starts from, debian:bookworm-slim, when no registry can give
# it: `debootstrap --variant=minbase bookworm` from the same Debian mirror the host's apt uses,
# trimmed the way Debian's official slim image is (no docs, man pages or locales; apt cleans its
# cache), then `docker import`. Needs root and debootstrap; talks to the daemon of DOCKER_HOST.
#
#   deploy/images/debian-base.sh [TAG]        # TAG: debian:bookworm-slim
#
# DEBIAN_MIRROR / DEBIAN_SECURITY_MIRROR override the mirrors read from /etc/apt/sources.list*.
set -euo pipefail
TAG=${1:-debian:bookworm-slim}
SUITE=bookworm

# The first URI of the host's apt sources (deb822 or one-line format) whose path matches $1.
host_mirror() {
    local want=$1 files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list
                         /etc/apt/sources.list.d/*.sources)
    cat "${files[@]}" 2>/dev/null | sed -nE \
        -e "s#^URIs:[[:space:]]*(.*)#\1#p" \
        -e "s#^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+).*#\2#p" \
        | tr ' ' '\n' | grep -E "^https?://[^ ]+/${want}/?$" | head -n1 | sed 's#/$##' || true
}
MIRROR=${DEBIAN_MIRROR:-$(host_mirror debian)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY_MIRROR:-$(host_mirror debian-security)}
SECURITY=${SECURITY:-http://deb.debian.org/debian-security}

ROOT=$(mktemp -d "${TMPDIR:-/tmp}/tidemq-debian-base.XXXXXX")
LOG=$ROOT.log
unmount() { grep -o " $ROOT/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l || true; }
trap 'unmount; rm -rf "$ROOT" "$LOG"' EXIT
echo "debootstrap --variant=minbase $SUITE from $MIRROR" >&2
# in two stages, so that dpkg installs without an fsync per file (as Debian's official images
# configure it: docker-apt-speedup, kept for the images' own apt-get installs); half the time
fail() { tail -n 30 "$LOG" >&2; exit 1; }
debootstrap --foreign --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >"$LOG" 2>&1 || fail
echo force-unsafe-io >"$ROOT/etc/dpkg/dpkg.cfg.d/docker-apt-speedup"
chroot "$ROOT" /debootstrap/debootstrap --second-stage >>"$LOG" 2>&1 || fail
unmount

# apt inside the images uses the host's mirror, with the updates and security suites
rm -f "$ROOT/etc/apt/sources.list"
cat >"$ROOT/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
# as Debian's docker images: services are not started by package scripts; apt keeps no
# downloaded packages, lists in one language only; dpkg leaves out documentation (copyright
# files kept), man pages and translations
printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
chmod 755 "$ROOT/usr/sbin/policy-rc.d"
cat >"$ROOT/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";
EOF
echo 'Acquire::Languages "none";' >"$ROOT/etc/apt/apt.conf.d/docker-no-languages"
cat >"$ROOT/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
find "$ROOT/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$ROOT/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$ROOT"/usr/share/{man,info,locale,lintian}/* "$ROOT"/var/cache/apt/*.bin \
    "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/log/*.log \
    "$ROOT"/var/log/apt/* "$ROOT"/tmp/*

tar --numeric-owner -C "$ROOT" -c . \
    | docker import --change 'CMD ["bash"]' --change 'ENV LANG=C.UTF-8' - "$TAG" >/dev/null
echo "imported $TAG ($(docker image inspect -f '{{.Size}}' "$TAG") bytes)" >&2
