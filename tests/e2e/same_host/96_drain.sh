# vsocketctl drain under load, then undrain or a restart by SIGTERM. These
# and the daemon restarts (98_daemon_restart.sh) run last: they stop the
# daemon or take every connection off the rings.

# vsocketctl drain during a 4 GiB byte-checked stream and four
# request/response connections, then undrain (or a restart by SIGTERM, which
# drains too): every connection leaves the rings with clean fences (no byte
# resent: resent_bytes 0 in every report line; the daemon counts the
# drains), nothing moves on the rings while drained (the daemon's
# moved_bytes stand still for half a second), and afterwards the
# connections register again and re-upgrade (report: re-upgraded, last
# downgrade "operator"; bytes moved on the rings again).
case_drain() {  # case_drain NAME undrain|restart
  local name=$1 port how=$2 rep=$WORK/$1.jsonl conns=4 bad
  port=$(alloc_port 2)
  bulk_and_rounds $name "$rep" "$port" 500 || { fail $name "not every connection was accelerated before the drain"; return; }
  sleep "0.$((RANDOM % 4))$((RANDOM % 10))"
  local drains0 drained a0 a1 t0 took
  drains0=$(ctl_counter drains_done)
  t0=$(date +%s.%N)
  if ! drained=$(bash $TB ctl drain --wait 10 2>&1); then
    fail $name "vsocketctl drain --wait 10: $drained"
    bash $TB ctl undrain >/dev/null 2>&1  # (the cases after this one)
    kill $BR_PIDS 2>/dev/null
    return
  fi
  took=$(python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.2f}')" "$t0")
  sleep 0.2
  a0=$(moved_bytes)
  sleep 0.5
  a1=$(moved_bytes)
  bad=""
  [ "$a0" = "$a1" ] || bad+="$((a1 - a0)) B moved on the rings while drained; "
  if [ "$how" = restart ]; then
    bash $TB restart TERM >"$WORK/$name.restart" 2>&1 || bad+="restart: $(tail -1 "$WORK/$name.restart"); "
  else
    bash $TB ctl undrain >"$WORK/$name.undrain" 2>&1 || bad+="undrain: $(cat "$WORK/$name.undrain"); "
  fi
  bulk_and_rounds_wait $name
  bad+=$BR_BAD
  [ -z "$bad" ] || { fail $name "$bad"; return; }
  local out out2 after drains
  out=$(python3 $CHECK "$rep" --port "$port" --expect-conns 2 --resynced --downgrade-cause operator --no-resend) ||
    bad+="bulk: $out; "
  out2=$(python3 $CHECK "$rep" --port $((port + 1)) --expect-conns $((2 * conns)) --reupgraded --downgrade-cause operator \
    --no-resend) || bad+="request/response: $out2; "
  [ -z "$bad" ] || { fail $name "$bad"; return; }
  after=$(moved_bytes)
  drains=$(ctl_counter drains_done)
  if [ "$how" = restart ]; then
    [ "$after" -gt 0 ] || { fail $name "the new vsocketd moved no bytes"; return; }
  else
    [ "$after" -gt "$a1" ] || { fail $name "no byte moved on the rings after the undrain"; return; }
    [ "$drains" -ge $((drains0 + 1 + conns)) ] ||
      { fail $name "drains_done went from $drains0 to $drains, expected +$((1 + conns))"; return; }
  fi
  pass "$name (drained in $took s mid-transfer: ${drained%%$'\n'*}; nothing moved on the rings while drained; $how: 4 GiB bulk byte-exact ($out); $conns request/response connections byte-exact and re-upgraded ($out2))"
}

register_case drain_undrain case_drain drain_undrain undrain
register_case drain_restart case_drain drain_restart restart
