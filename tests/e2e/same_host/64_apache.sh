# Apache httpd with mpm_prefork (a process per connection at a time, workers
# forked by a root parent and run as www-data, which reaches vm2's socket
# through its group, E2E_GROUP: suite.sh) serving files from vm2 to ab in
# vm1, both preloaded, under the default policy and under always: ab -n
# 20000 -c 64 on a 4 KiB file without keep-alive (a connection per request:
# apache shuts down its side and lingers, reading until the client's FIN,
# before it closes) and with -k. Checked: files of every size byte-exact
# through curl, every ab request complete and of the same length, the
# reports (tests/e2e/apps/report_summary.py), and the leak check (suite.sh:
# nothing left tracked by vsocketd after the load, devices and active
# connections back after the stop, no "shared region full"); under the
# default policy without keep-alive, at most 4 of apache's processes hold a
# session with vsocketd (decision 132).

# apache_conf TAG PORT WWW: $WORK/TAG.conf from tests/e2e/apps/apache_prefork.conf
# (prefork with 72 workers from the start, as www-data).
apache_conf() {
  local tag=$1 port=$2 www=$3
  mkdir -p "$WORK/$tag-run"
  sed -e "s|@LISTEN@|$A2:$port|" -e "s|@PIDFILE@|$WORK/$tag.pid|" -e "s|@RUNDIR@|$WORK/$tag-run|" \
    -e "s|@ERRORLOG@|$WORK/$tag-error.log|" -e "s|@WWW@|$www|g" "$APPS/apache_prefork.conf" >"$WORK/$tag.conf"
}

# case_apache NAME POLICY KEEPALIVE: KEEPALIVE is "" (a connection per
# request) or -k.
case_apache() {
  local name=$1 policy=$2 k=$3
  local -x VSOCKET_UPGRADE=$policy
  local port www=$WORK/$name-www srep=$WORK/$name.srv.jsonl crep=$WORK/$name.cli.jsonl lib s f
  port=$(alloc_port)
  command -v apache2 >/dev/null && command -v ab >/dev/null ||
    { fail $name "apache2/ab not installed (deploy/install-deps.sh)"; return; }
  lib=$(shared_lib)
  mkdir -p "$www" "$WORK/$name-got"
  chmod a+rx "$www"
  for s in 0 4095 300000 4194304; do head -c $s /dev/urandom >"$www/f$s"; done
  chmod a+r "$www"/*
  touch "$srep" && chmod 0666 "$srep"
  apache_conf "$name" "$port" "$www"
  leak_begin
  # (-DFOREGROUND: the parent stays in the foreground, stopped by SIGTERM.)
  vm_bg vm2 plain /dev/null "$WORK/$name.srv" env LD_PRELOAD="$lib" VSOCKET_REPORT="$srep" \
    apache2 -f "$WORK/$name.conf" -DFOREGROUND
  local srv=$BG
  if ! wait_listen vm2 "$port"; then
    kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
    fail $name "apache did not listen within 30 s: $(tail -3 "$WORK/$name.srv" "$WORK/$name-error.log" 2>/dev/null | tr '\n' ' ')"
    return
  fi
  local bad="" url=http://$A2:$port
  vm_run vm1 preload "$crep" curl -sf -o "$WORK/$name-got/f0" "$url/f0" -o "$WORK/$name-got/f4095" "$url/f4095" \
    -o "$WORK/$name-got/f300000" "$url/f300000" -o "$WORK/$name-got/f4194304" "$url/f4194304" >/dev/null 2>&1 ||
    bad+="curl of the files failed; "
  for f in f0 f4095 f300000 f4194304; do cmp -s "$www/$f" "$WORK/$name-got/$f" || bad+="$f not byte-exact; "; done
  # ab: -s 10, a request unanswered for 10 s fails it (a hang shows as
  # ab's timeout, within E2E_TIMEOUT).
  local t0 t1 done_n failed_n rps
  t0=$(date +%s%N)
  # shellcheck disable=SC2086  # k is empty or -k
  vm_run vm1 preload "$crep" ab -q -s 10 -n 20000 -c 64 $k "$url/f4095" >"$WORK/$name.ab" 2>&1
  local rc=$?
  t1=$(date +%s%N)
  done_n=$(awk '/^Complete requests:/ {print $3}' "$WORK/$name.ab")
  failed_n=$(awk '/^Failed requests:/ {print $3}' "$WORK/$name.ab")
  rps=$(awk '/^Requests per second:/ {print $4}' "$WORK/$name.ab")
  local ab_sum="ab -n 20000 -c 64 ${k:-(a connection per request)}: ${done_n:-?} complete, ${failed_n:-?} failed, ${rps:-?} req/s"
  if [ $rc -ne 0 ] || [ "$done_n" != 20000 ] || [ "$failed_n" != 0 ] || grep -q "^Non-2xx" "$WORK/$name.ab"; then
    bad+="ab (rc $rc after $(((t1 - t0) / 1000000)) ms): $(grep -vE '^\s*$' "$WORK/$name.ab" | grep -iE 'error|timeout|failed|complete|Non-2xx|apr_' | head -4 | tr '\n' ' ')"
    # (the state of apache's sockets once ab gave up)
    bash $TB exec vm2 ss -Htan "sport = :$port" | awk '{print $1}' | sort | uniq -c | tr '\n' ' ' >"$WORK/$name.ss"
    bad+="; vm2 sockets on :$port after ab: $(cat "$WORK/$name.ss"); "
  fi
  ab_sum+=" ($(grep -E '^Document Length' "$WORK/$name.ab" | tr -s ' '))"
  # Held by the default policy, a connection needs no session: the workers
  # know the rule from their parent (decision 132). The devices apache holds
  # now (ab has exited): the parent's, and those of the workers whose
  # connection streamed (curl's 4 MiB file), not one per worker that served.
  local c_now=($(daemon_counts)) sessions
  sessions=$((c_now[1] - LEAK0[1]))
  ab_sum+="; apache's sessions with vsocketd: $sessions"
  [ "$policy" = auto ] && [ -z "$k" ] && [ "$sessions" -gt 4 ] &&
    bad+="$sessions sessions with vsocketd after ab (workers opened sessions for held connections); "
  leak_untracked "$port"
  kill "$srv" 2>/dev/null  # (SIGTERM: apache stops its workers, then exits)
  wait "$srv" 2>/dev/null
  leak_verdict "$WORK/$name.srv" "$WORK/$name-error.log"
  local out
  local min=0
  [ "$policy" = always ] && min=64
  out=$(python3 "$APPS/report_summary.py" --port "$port" --policy "$policy" --server "$srep" --client "$crep" \
    --min-accel $min --both-ends) || bad+="reports: "
  if [ -n "$bad" ]; then
    fail $name "$bad | $ab_sum; reports: $out; $LEAK_MSG"
    return
  fi
  pass "$name (files 0 B..4 MiB byte-exact; $ab_sum; $out; $LEAK_MSG)"
}

# app: Apache httpd, mpm_prefork, no keep-alive | ab -n 20000 -c 64 (a connection per request, lingering close) | files byte-exact (curl), every request complete and of one length; leak check | apache_prefork_close
# app: Apache httpd, mpm_prefork, keep-alive | ab -n 20000 -c 64 -k | as above | apache_prefork_keepalive
register_case apache_prefork_close_auto case_apache apache_prefork_close_auto auto ""
register_case apache_prefork_close_always case_apache apache_prefork_close_always always ""
register_case apache_prefork_keepalive_auto case_apache apache_prefork_keepalive_auto auto -k
register_case apache_prefork_keepalive_always case_apache apache_prefork_keepalive_always always -k
