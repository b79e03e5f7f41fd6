# PostgreSQL, server run as the unprivileged user postgres (it refuses
# root), pgbench TPC-B with 8 clients on 2 threads: backends wait for each
# other's row locks, so every transaction needs the right wake-up at the
# right time. A missed one stalls pgbench until its timeout (two threads
# sharing one session once slept through a dispatch done by the other).
# Checked: every transaction ran, the balances add up (accounts, tellers,
# branches and history agree), the connections were accelerated, and no
# wait slept on data that had arrived (late_wakeups, check_report.py).
case_postgres() {
  local name=$1 policy=$2 rep=$WORK/$1.jsonl port d=$WORK/$1
  local -x VSOCKET_UPGRADE=$policy
  port=$(alloc_port)
  local pgbin sock lib
  pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -x "$pgbin/postgres" ] || { fail $name "PostgreSQL not installed (deploy/install-deps.sh)"; return; }
  # The server runs as postgres: it needs a library it can load, the report
  # and the VM's vhost-user socket (through vm2's group, E2E_GROUP: suite.sh).
  mkdir -p "$d" && chmod a+rx "$WORK" "$d"
  lib=$(shared_lib)
  touch "$rep" && chmod 0666 "$rep"
  sock=$(bash $TB socket vm2)
  [ "$(stat -c '%a %G' "$sock")" = "660 $E2E_GROUP" ] ||
    { fail $name "vm2's socket is not 0660 in group $E2E_GROUP (group =): $(stat -c '%a %U:%G' "$sock")"; return; }
  mkdir -p "$d/data" "$d/run" && chown postgres "$d/data" "$d/run"
  if ! runuser -u postgres -- "$pgbin/initdb" -D "$d/data" -A trust --no-sync >"$WORK/$name.init" 2>&1; then
    fail $name "initdb: $(tail -2 "$WORK/$name.init" | tr '\n' ' ')"
    return
  fi
  printf "listen_addresses = '%s'\nport = %d\nunix_socket_directories = '%s'\nmax_connections = 40\n" \
    "$A2" $port "$d/run" >>"$d/data/postgresql.conf"
  echo "host all all 0.0.0.0/0 trust" >>"$d/data/pg_hba.conf"
  vm_bg vm2 plain /dev/null "$WORK/$name.srv" runuser -u postgres -- env LD_PRELOAD="$lib" \
    VSOCKET_REPORT="$rep" VSOCKET_SOCKET="$sock" "$pgbin/postgres" -D "$d/data"
  local srv=$BG
  wait_listen vm2 $port
  local ok=1 msg="" tpcb sel sums
  vm_run vm1 plain /dev/null pgbench -h "$A2" -p $port -U postgres -i -s 1 -q postgres >"$WORK/$name.pgi" 2>&1 ||
    { ok=0; msg="pgbench -i: $(tail -2 "$WORK/$name.pgi" | tr '\n' ' ')"; }
  if [ $ok -eq 1 ]; then
    vm_run vm1 preload "$rep" pgbench -h "$A2" -p $port -U postgres -n -c 8 -j 2 -t 100 postgres >"$WORK/$name.tpcb" 2>&1 ||
      { ok=0; msg="pgbench TPC-B (timeout ${E2E_TIMEOUT:-60} s: a missed wake-up?): $(grep -v '^$' "$WORK/$name.tpcb" | tail -2 | tr '\n' ' ')"; }
    tpcb=$(grep -oE "tps = [0-9.]+" "$WORK/$name.tpcb" | head -1)
    grep -q "number of transactions actually processed: 800/800" "$WORK/$name.tpcb" ||
      { [ $ok -eq 0 ] || msg="TPC-B: not every transaction ran: $(grep processed "$WORK/$name.tpcb")"; ok=0; }
  fi
  if [ $ok -eq 1 ]; then
    vm_run vm1 preload "$rep" pgbench -h "$A2" -p $port -U postgres -n -S -c 8 -j 2 -t 500 postgres >"$WORK/$name.sel" 2>&1 ||
      { ok=0; msg="pgbench select-only: $(grep -v '^$' "$WORK/$name.sel" | tail -2 | tr '\n' ' ')"; }
    sel=$(grep -oE "tps = [0-9.]+" "$WORK/$name.sel" | head -1)
  fi
  if [ $ok -eq 1 ]; then
    # TPC-B's invariant: every delta went to one account, teller and branch.
    sums=$(vm_run vm1 plain /dev/null psql -h "$A2" -p $port -U postgres -At -c \
      "select (select sum(abalance) from pgbench_accounts), (select sum(tbalance) from pgbench_tellers),
              (select sum(bbalance) from pgbench_branches), (select sum(delta) from pgbench_history),
              (select count(*) from pgbench_history)" postgres 2>&1)
    local a t b h n
    IFS='|' read -r a t b h n <<<"$sums"
    if [ -z "$n" ] || [ "$n" != 800 ] || [ "$a" != "$t" ] || [ "$t" != "$b" ] || [ "$b" != "$h" ]; then
      ok=0
      msg="balances do not add up (accounts|tellers|branches|history|rows): $sums"
    fi
  fi
  runuser -u postgres -- "$pgbin/pg_ctl" -D "$d/data" stop -m fast >/dev/null 2>&1
  wait "$srv" 2>/dev/null
  [ $ok -eq 1 ] || { fail $name "$msg"; return; }
  local out
  # 8 + 8 connection ends of each run (pgbench -i and psql are not preloaded).
  if [ "$policy" = auto ]; then
    out=$(judge_auto "$rep" $port) || { fail $name "$out"; return; }
  elif ! out=$(python3 $CHECK "$rep" --port $port --min-accel 32); then
    fail $name "$out"
    return
  fi
  pass "$name (server as user postgres through vm2's group; TPC-B 8 clients x 100 transactions, $tpcb, balances add up ($a); select-only $sel; $out)"
}

# app: PostgreSQL (server as the user postgres) | pgbench TPC-B 8 clients x 100 transactions; select-only 8 x 500 | every transaction ran; the balances add up | postgres_pgbench
register_case postgres_pgbench_always case_postgres postgres_pgbench_always always
register_case postgres_pgbench_auto case_postgres postgres_pgbench_auto auto
