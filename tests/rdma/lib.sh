# Shared by the QEMU/Soft-RoCE wrappers (smoke.sh, fabric_in_qemu.sh,
# cross_host_in_qemu.sh). Source it, then:
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
