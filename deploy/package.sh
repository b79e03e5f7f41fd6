#!/usr/bin/env bash
# Builds the Debian packages vsocketd, libvsocket and vsocket-guest from this
# tree:
#
#   deploy/package.sh [--out DIR] [--version VERSION]
#
# Bazel builds the binaries (-c opt, offline, as every other build here);
# then a staging copy of debian/ and of the files the packages ship, with the
# binaries in prebuilt/, goes through dpkg-buildpackage (debhelper: Depends
# from the binaries' libraries, maintainer scripts, conffiles, the unit's
# enable/start). Nothing is written into the tree but Bazel's own outputs.
# The .debs land in DIR (default /tmp/vsocket-packages); their paths are
# printed, one a line, on stdout.
#
# VERSION defaults to debian/changelog's, plus "+git<commit time>.<hash>"
# (so that a later commit's packages upgrade an earlier one's), plus ".dirty"
# when the tree has uncommitted changes.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."

die() {
  echo "package: error: $*" >&2
  exit 1
}
say() { echo "package: $*" >&2; }

usage() {
  sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'
}

OUT=/tmp/vsocket-packages
VERSION=""
while [ $# -gt 0 ]; do
  case $1 in
    --out) [ $# -ge 2 ] || die "--out wants a directory"; OUT=$2; shift 2 ;;
    --version) [ $# -ge 2 ] || die "--version wants a version"; VERSION=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
for tool in bazel dpkg-buildpackage dh dpkg-architecture; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found (bash deploy/install-deps.sh)"
done

if [ -z "$VERSION" ]; then
  VERSION=$(dpkg-parsechangelog -l debian/changelog -S Version)
  if git rev-parse --git-dir >/dev/null 2>&1; then
    VERSION+="+git$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S).$(git rev-parse --short=8 HEAD)"
    [ -z "$(git status --porcelain --untracked-files=no)" ] || VERSION+=".dirty"
  fi
fi
[[ $VERSION =~ ^[0-9][A-Za-z0-9.+~]*$ ]] || die "bad version '$VERSION' (a native package: no '-')"

WORK=$(mktemp -d /tmp/vsocket-package-XXXXXX)
trap 'rm -rf -- "$WORK"' EXIT

say "bazel build -c opt"
TARGETS=(//host-backend:vsocketd //host-backend:vsocketctl //guest:libvsocket.so //guest/agent:vsocket-guestd)
if ! bazel build -c opt "${TARGETS[@]}" >"$WORK/bazel.log" 2>&1; then
  tail -30 "$WORK/bazel.log" >&2
  die "bazel build failed"
fi
BIN=$(bazel info -c opt bazel-bin 2>/dev/null)
for f in host-backend/vsocketd host-backend/vsocketctl guest/libvsocket.so guest/agent/vsocket-guestd; do
  [ -f "$BIN/$f" ] || die "bazel did not produce $BIN/$f"
done
SRC=$WORK/vsocket-$VERSION
mkdir -p "$SRC/prebuilt" "$SRC/docs" "$SRC/deploy" "$SRC/guest/agent"
cp -r debian "$SRC/"
cp -r deploy/systemd deploy/config deploy/libvirt "$SRC/deploy/"
cp guest/vsocket-run "$SRC/guest/"
cp guest/agent/vsocket-guest-setup "$SRC/guest/agent/"
cp README.md "$SRC/"
cp docs/*.md "$SRC/docs/"
install -m 0755 "$BIN/host-backend/vsocketd" "$BIN/host-backend/vsocketctl" "$BIN/guest/agent/vsocket-guestd" "$SRC/prebuilt/"
install -m 0644 "$BIN/guest/libvsocket.so" "$SRC/prebuilt/"
# The staged changelog names the version being built.
{
  echo "vsocket ($VERSION) unstable; urgency=medium"
  echo
  echo "  * Built by deploy/package.sh from $(git rev-parse --short=12 HEAD 2>/dev/null || echo 'a tree without git')."
  echo
  echo " -- $(dpkg-parsechangelog -l debian/changelog -S Maintainer)  $(date -R)"
  echo
  cat debian/changelog
} >"$SRC/debian/changelog"

say "dpkg-buildpackage (vsocket $VERSION)"
if ! (cd "$SRC" && dpkg-buildpackage -b -uc -us >"$WORK/build.log" 2>&1); then
  tail -40 "$WORK/build.log" >&2
  die "dpkg-buildpackage failed"
fi
mkdir -p -- "$OUT"
shopt -s nullglob
debs=("$WORK"/*.deb)
[ "${#debs[@]}" -eq 3 ] || die "expected 3 packages, got: ${debs[*]##*/}"
for d in "${debs[@]}"; do
  cp -- "$d" "$OUT/"
  echo "$OUT/${d##*/}"
done
