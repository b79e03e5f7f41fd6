# The rsync daemon (rsync://, a process forked per connection) in vm2 and
# an rsync client in vm1 pulling a tree of 320 files (0 B..1 MiB, in 16
# directories), both preloaded, under the default policy and under always.
# The client forks: its receiver reads the socket its generator writes (one
# connection used by two processes). Checked: rsync's exit status, the
# copied tree file by file (sha256 of every file, sizes, names), the
# reports (tests/e2e/apps/report_summary.py) and the leak check (suite.sh).

# rsync_tree DIR: 320 files of random bytes, sizes 0 B..1 MiB.
rsync_tree() {
  local d=$1 i j size
  for i in $(seq -w 0 15); do
    mkdir -p "$d/dir$i"
    for j in $(seq -w 0 19); do
      size=$(((10#$i * 20 + 10#$j) * 3271 % 65536))
      [ $((10#$j)) -eq 0 ] && size=$((10#$i * 65536))  # (one larger file a directory, up to 960 KiB)
      [ $((10#$j)) -eq 1 ] && size=0
      head -c "$size" /dev/urandom >"$d/dir$i/f$j"
    done
  done
  head -c 1048576 /dev/urandom >"$d/dir00/big"
  rm -f "$d/dir00/f02"  # (320 files in all)
}

# tree_sums DIR: one "sha256  ./path" line per file, sorted.
tree_sums() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }

case_rsync() {
  local name=$1 policy=$2
  local -x VSOCKET_UPGRADE=$policy
  local port src=$WORK/$name-src dst=$WORK/$name-dst srep=$WORK/$name.srv.jsonl crep=$WORK/$name.cli.jsonl
  command -v rsync >/dev/null || { fail $name "rsync not installed (deploy/install-deps.sh)"; return; }
  port=$(alloc_port)
  rsync_tree "$src"
  mkdir -p "$dst"
  cat >"$WORK/$name.conf" <<CONF
use chroot = no
uid = root
gid = root
pid file = $WORK/$name.pid
log file = $WORK/$name-daemon.log
[data]
  path = $src
  read only = yes
CONF
  local forks0
  forks0=$(daemon_counter fork_resyncs)
  leak_begin
  vm_bg vm2 preload "$srep" "$WORK/$name.srv" rsync --daemon --no-detach --config="$WORK/$name.conf" \
    --address="$A2" --port="$port"
  local srv=$BG
  if ! wait_listen vm2 "$port"; then
    kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
    fail $name "rsyncd did not listen within 30 s: $(tail -3 "$WORK/$name.srv" | tr '\n' ' ')"
    return
  fi
  local bad="" rc t0 t1 nsrc ndst
  t0=$(date +%s%N)
  # (--timeout: no I/O for 20 s ends it; E2E_TIMEOUT bounds the whole)
  vm_run vm1 preload "$crep" rsync -a --stats --timeout=20 --contimeout=10 "rsync://$A2:$port/data/" "$dst/" \
    >"$WORK/$name.cli" 2>&1
  rc=$?
  t1=$(date +%s%N)
  nsrc=$(find "$src" -type f | wc -l)
  ndst=$(find "$dst" -type f | wc -l)
  [ $rc -eq 0 ] || bad+="rsync rc $rc after $(((t1 - t0) / 1000000)) ms ($ndst of $nsrc files there): $(grep -iE 'error|timeout|rsync:' "$WORK/$name.cli" | head -3 | tr '\n' ' '); "
  tree_sums "$src" >"$WORK/$name.src.sums"
  tree_sums "$dst" >"$WORK/$name.dst.sums"
  if ! cmp -s "$WORK/$name.src.sums" "$WORK/$name.dst.sums"; then
    bad+="the copied tree differs: $(diff "$WORK/$name.src.sums" "$WORK/$name.dst.sums" | grep -c '^[<>]') lines of sha256sum differ; "
  fi
  local bytes
  bytes=$(awk -F': ' '/^Total file size/ {print $2}' "$WORK/$name.cli" | cut -d' ' -f1)
  leak_untracked "$port"
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  leak_verdict "$WORK/$name.srv" "$WORK/$name.cli"
  local out
  # Under always the connection is upgraded before the client forks its
  # receiver, and goes back to kernel TCP at the fork, at both ends, each
  # saying so (decision 85); vsocketd counts it.
  local -a want=()
  [ "$policy" = always ] && want=(--forked 2)
  out=$(python3 "$APPS/report_summary.py" --port "$port" --policy "$policy" --server "$srep" --client "$crep" \
    --both-ends "${want[@]}") || bad+="reports: "
  local forks=$(($(daemon_counter fork_resyncs) - forks0))
  [ "$policy" = always ] && [ "$forks" -lt 1 ] && bad+="vsocketd counted $forks connections taken back to kernel TCP at a fork; "
  out+="; daemon: $forks fork resync(s)"
  local sum="rsync:// pull of $nsrc files (${bytes:-?} B) in $(((t1 - t0) / 1000000)) ms, $ndst copied"
  if [ -n "$bad" ]; then
    fail $name "$bad | $sum; reports: $out; $LEAK_MSG"
    return
  fi
  pass "$name ($sum, every sha256 equal; $out; $LEAK_MSG)"
}

# app: rsync daemon (`rsync://`; the client forks its receiver onto the connection) | a pull of 320 files (18 MB) | sha256 of every file; under always both ends `forked` (decision 85); leak check | rsync_daemon
register_case rsync_daemon_auto case_rsync rsync_daemon_auto auto
register_case rsync_daemon_always case_rsync rsync_daemon_always always
