# Shared by the QEMU/Soft-RoCE wrappers (smoke.sh, fabric_in_qemu.sh,
# cross_host_in_qemu.sh). Source it, then (qemu_build: below):
#   qemu_args DEFAULT_TIMEOUT "$@"
# parses [--no-build] [--timeout SECS] [-v] [-h] into BUILD (1/0), TIMEOUT
# and ARGS (extra run-in-qemu.sh arguments); --help prints the caller's
# header comment.
qemu_args() {
  BUILD=1
  TIMEOUT=$1
  ARGS=()
  shift
  local me
  me=$(basename "$0")
  while [ $# -gt 0 ]; do
    case "$1" in
      --no-build) BUILD=0 ;;
      --timeout) TIMEOUT=${2:?}; shift ;;
      -v|--verbose) ARGS+=(-v) ;;
      -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
      *) echo "$me: unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
  done
}

# qemu_build LABEL...: from the repository root, builds the Bazel targets
# (unless --no-build), then checks that each one's output
# (bazel-out/k8-opt/bin/PACKAGE/NAME, which the guest sees through the
# shared repository) exists; exit 2 naming the first missing one.
qemu_build() {
  if [ "$BUILD" = 1 ]; then
    bazel build "$@"
  fi
  local t p
  for t in "$@"; do
    p=${t#//}
    p=bazel-out/k8-opt/bin/${p/://}
    [ -e "$p" ] || { echo "$(basename "$0"): $p not built" >&2; exit 2; }
  done
}
