# MariaDB (mariadbd, a thread per connection, run as the unprivileged user
# mysql: it reaches vm2's socket through its group, E2E_GROUP: suite.sh)
# in vm2, sysbench oltp_read_only from vm1 (8 threads, 10 s), both
# preloaded, under the default policy and under always. Checked: sysbench
# ran with no error, a 10,000-row table read through the preloaded client
# is byte-exact (sha256 of its rows against the same query through a client
# without the library), the reports of both sides
# (tests/e2e/apps/report_summary.py; under the default policy each side's
# mode/reason is recorded) and the leak check (suite.sh).

case_mariadb() {
  local name=$1 policy=$2
  local -x VSOCKET_UPGRADE=$policy
  local port d=$WORK/$name srep=$WORK/$name.srv.jsonl crep=$WORK/$name.cli.jsonl lib sock
  command -v mariadbd >/dev/null && command -v sysbench >/dev/null ||
    { fail $name "mariadb-server/sysbench not installed (deploy/install-deps.sh)"; return; }
  port=$(alloc_port)
  lib=$(shared_lib)
  mkdir -p "$d/data" "$d/run" && chmod a+rx "$d" && chown mysql "$d/data" "$d/run"
  touch "$srep" && chmod 0666 "$srep"
  sock=$(bash $TB socket vm2)
  [ "$(stat -c '%a %G' "$sock")" = "660 $E2E_GROUP" ] ||
    { fail $name "vm2's socket is not 0660 in group $E2E_GROUP (group =): $(stat -c '%a %U:%G' "$sock")"; return; }
  if ! timeout 60 mariadb-install-db --no-defaults --user=mysql --datadir="$d/data" --skip-test-db \
    --auth-root-authentication-method=socket >"$WORK/$name.init" 2>&1; then
    fail $name "mariadb-install-db: $(tail -2 "$WORK/$name.init" | tr '\n' ' ')"
    return
  fi
  leak_begin
  E2E_TIMEOUT=150 vm_bg vm2 plain /dev/null "$WORK/$name.srv" runuser -u mysql -- env LD_PRELOAD="$lib" \
    VSOCKET_REPORT="$srep" VSOCKET_SOCKET="$sock" VSOCKET_UPGRADE="$policy" \
    mariadbd --no-defaults --datadir="$d/data" --bind-address="$A2" --port="$port" --socket="$d/run/mysqld.sock" \
    --pid-file="$d/run/mysqld.pid" --skip-name-resolve --skip-log-bin --max-connections=64 \
    --innodb-buffer-pool-size=128M --innodb-flush-log-at-trx-commit=0 --log-error="$WORK/$name-error.log"
  local srv=$BG
  if ! wait_listen vm2 "$port"; then
    kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
    fail $name "mariadbd did not listen within 30 s: $(tail -3 "$WORK/$name-error.log" | tr '\n' ' ')"
    return
  fi
  # (Everything without the library goes through the server's Unix socket
  # in vm2, so every TCP connection on the port is a preloaded client's.)
  local bad="" sb=(sysbench oltp_read_only --db-driver=mysql --mysql-user=sb --mysql-password=sb --mysql-db=sbtest
    --tables=2 --table-size=10000)
  vm_run vm2 plain /dev/null mariadb --socket="$d/run/mysqld.sock" -uroot -e \
    "CREATE DATABASE sbtest; CREATE USER sb@'%' IDENTIFIED BY 'sb'; GRANT ALL ON sbtest.* TO sb@'%';" \
    >"$WORK/$name.sql" 2>&1 || bad+="creating the database: $(tail -1 "$WORK/$name.sql"); "
  [ -n "$bad" ] || vm_run vm2 plain /dev/null "${sb[@]}" --mysql-socket="$d/run/mysqld.sock" prepare >"$WORK/$name.prep" 2>&1 ||
    bad+="sysbench prepare: $(tail -2 "$WORK/$name.prep" | tr '\n' ' '); "
  local tps qps errs sum=""
  if [ -z "$bad" ]; then
    vm_run vm1 preload "$crep" "${sb[@]}" --mysql-host="$A2" --mysql-port="$port" --threads=8 --time=10 --report-interval=0 run >"$WORK/$name.run" 2>&1 ||
      bad+="sysbench run (rc $?): $(grep -iE 'error|fatal' "$WORK/$name.run" | head -2 | tr '\n' ' '); "
    tps=$(awk '/transactions:/ {print $2 " (" substr($3, 2) "/s)"}' "$WORK/$name.run")
    qps=$(awk '/queries:/ {print $3}' "$WORK/$name.run" | tr -d '(')
    errs=$(awk '/ignored errors:/ {print $3}' "$WORK/$name.run")
    [ "${errs:-x}" = 0 ] && [ -n "$tps" ] || bad+="sysbench: transactions '${tps}', ignored errors '${errs}'; "
    sum="sysbench oltp_read_only 8 threads 10 s: transactions ${tps:-?}, ${qps:-?} queries/s, ${errs:-?} errors"
    # Byte check: 10,000 rows (about 1.9 MB) through the preloaded client
    # and through one without the library (Unix socket).
    local q="SELECT id, k, c, pad FROM sbtest1 ORDER BY id" got want
    got=$(vm_run vm1 preload "$crep" mariadb -h "$A2" -P "$port" -usb -psb -N -B sbtest -e "$q" | sha256sum)
    want=$(vm_run vm2 plain /dev/null mariadb --socket="$d/run/mysqld.sock" -usb -psb -N -B sbtest -e "$q" | sha256sum)
    local rows
    rows=$(vm_run vm2 plain /dev/null mariadb --socket="$d/run/mysqld.sock" -usb -psb -N -B sbtest -e "SELECT COUNT(*) FROM sbtest1")
    [ "$got" = "$want" ] && [ "$rows" = 10000 ] || bad+="the 10,000-row read differs (preloaded ${got%% *}, plain ${want%% *}, rows '$rows'); "
    sum+="; $rows rows byte-exact through the preloaded client"
  fi
  leak_untracked "$port"
  vm_run vm2 plain /dev/null mariadb-admin --socket="$d/run/mysqld.sock" -uroot shutdown >/dev/null 2>&1 ||
    kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  leak_verdict "$WORK/$name-error.log" "$WORK/$name.srv" "$WORK/$name.run"
  local out
  local min=0
  [ "$policy" = always ] && min=16
  out=$(python3 "$APPS/report_summary.py" --port "$port" --policy "$policy" --server "$srep" --client "$crep" \
    --min-accel $min --both-ends) || bad+="reports: "
  if [ -n "$bad" ]; then
    fail $name "$bad | $sum; reports: $out; $LEAK_MSG"
    return
  fi
  pass "$name (server as user mysql; $sum; $out; $LEAK_MSG)"
}

# app: MariaDB (mariadbd as the user mysql) | sysbench oltp_read_only, 8 threads | a 10,000-row read byte-exact; sysbench without error; leak check | mariadb_sysbench
register_case mariadb_sysbench_auto case_mariadb mariadb_sysbench_auto auto
register_case mariadb_sysbench_always case_mariadb mariadb_sysbench_always always
