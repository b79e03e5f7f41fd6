# The upgrade policy's busy-loop rule (decision 83): under the default
# policy, with the applications on one CPU that vsocketd also runs on
# (taskset: so on any machine), a busy event loop's long-lived
# request/response connections are accelerated when the peer's process is
# a busy event loop too, and stay on kernel TCP (tentative registration
# withdrawn, reason peer-not-registered) when it is not. Every answer is
# checked byte for byte (tests/e2e/apps/busy_loop.py); the reports and
# vsocketd's counters prove the path.

# busy_report_check FILE PORT WANT: every connection to or from PORT in the
# report FILE matches WANT ("busy-accelerated": registered for the busy loop
# and accelerated with bytes on the rings; "busy-withdrawn": registered for
# the busy loop and withdrawn at least once, nothing on the rings, on
# kernel TCP (held again: peer-not-registered) or pending again at the end
# (a later try); "held": never registered, request-response). Prints a
# summary, or what is wrong (and fails).
busy_report_check() {
  python3 - "$1" "$2" "$3" <<'PY' 2>&1
import collections, json, sys
path, port, want = sys.argv[1], sys.argv[2], sys.argv[3]
lines = [json.loads(l) for l in open(path) if l.strip()]
mine = [l for l in lines if l["local"].endswith(":" + port) or l["peer"].endswith(":" + port)]
mine = [l for l in mine if l["event"] in ("close", "exit", "signal")]
if not mine:
    raise SystemExit("no connection of port %s reported" % port)
bad = []
for l in mine:
    f = l.get("registered_for", "?")
    accel = l["accel_tx"] + l["accel_rx"]
    if want == "busy-accelerated":
        ok = f == "busy-loop" and l["mode"] == "accelerated" and accel > 0
    elif want == "busy-withdrawn":
        ok = (f == "busy-loop" and l["withdrawals"] >= 1 and accel == 0 and
              (l["mode"], l["reason"]) in (("kernel", "peer-not-registered"), ("kernel-pending", "peer-not-registered")))
    else:
        ok = f == "" and l["mode"] == "kernel" and l["reason"] == "request-response"
    if not ok:
        bad.append("%s->%s mode=%s reason=%s registered_for=%s withdrawals=%s accel=%d" % (l["local"], l["peer"], l["mode"], l["reason"], f, l.get("withdrawals"), accel))
kinds = collections.Counter((l["mode"], l["reason"], l.get("registered_for", "?")) for l in mine)
summary = ", ".join("%d %s/%s/%s" % (n, m, r, f or "-") for (m, r, f), n in sorted(kinds.items()))
if bad:
    raise SystemExit("%d of %d not %s: %s; all: %s" % (len(bad), len(mine), want, "; ".join(bad[:3]), summary))
print("%d connection ends %s (%s)" % (len(mine), want, summary))
PY
}

# busy_run NAME PORT SERVER-CONNS SERVER-REPORT CLIENT-REPORT CLIENT-ARGS...:
# busy_loop.py's epoll server in vm2, its client in vm1 (both on CPU 0,
# default policy); the client's output in BUSY_OUT. Fails NAME (status 1)
# if the client failed.
busy_run() {
  local name=$1 port=$2 sconns=$3 srep=$4 crep=$5
  shift 5
  VSOCKET_UPGRADE=auto vm_bg vm2 preload "$srep" "$WORK/$name.srv" taskset -c 0 python3 "$APPS/busy_loop.py" server "$A2" "$port" "$sconns"
  local srv=$BG
  if ! BUSY_OUT=$(VSOCKET_UPGRADE=auto E2E_TIMEOUT=120 vm_run vm1 preload "$crep" taskset -c 0 python3 "$APPS/busy_loop.py" "$1" "$A2" "$port" "${@:2}" 2>&1); then
    fail $name "client: $BUSY_OUT"
    kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
    return 1
  fi
  wait "$srv" 2>/dev/null
}

# case_busy_loop NAME CLIENT-MODE CONNS WANT-SERVER WANT-CLIENT: an epoll
# server of CONNS connections; the client is an epoll loop of CONNS (busy
# from 16) or CONNS blocking threads (never busy).
case_busy_loop() {
  local name=$1 mode=$2 conns=$3 want_srv=$4 want_cli=$5
  local port srep=$WORK/$name.srv.jsonl crep=$WORK/$name.cli.jsonl out bad=""
  port=$(alloc_port)
  local reg0 exp0 reg1 exp1 fb0 fb1
  reg0=$(stat_field tentative_registered)
  exp0=$(stat_field tentative_expired)
  fb0=$(vm_fallbacks vm2 peer_not_registered)
  busy_run "$name" "$port" "$conns" "$srep" "$crep" "$mode" "$conns" 1500 || return
  out=$BUSY_OUT
  reg1=$(stat_field tentative_registered)
  exp1=$(stat_field tentative_expired)
  fb1=$(vm_fallbacks vm2 peer_not_registered)
  local srv_sum cli_sum
  srv_sum=$(busy_report_check "$srep" "$port" "$want_srv") || bad+="server: $srv_sum; "
  cli_sum=$(busy_report_check "$crep" "$port" "$want_cli") || bad+="client: $cli_sum; "
  local reg=$((reg1 - reg0)) exp=$((exp1 - exp0))
  case $want_srv in
    busy-withdrawn)
      # Each connection withdrawn once at least; a later try (held again,
      # after a pause) may still be waiting when the client ends.
      [ "$exp" -ge "$conns" ] && [ "$exp" -le "$reg" ] && [ $((reg - exp)) -le "$conns" ] ||
        bad+="vsocketd: $reg tentative registrations, $exp withdrawn (want each withdrawn, none accelerated); "
      # One fallback (peer-not-registered) per withdrawal, and per try still
      # pending when the server closed: counted once each.
      [ $((fb1 - fb0)) -ge "$exp" ] && [ $((fb1 - fb0)) -le "$reg" ] ||
        bad+="vsocketd: vm2's peer-not-registered fallbacks grew by $((fb1 - fb0)) for $exp withdrawals of $reg tentative registrations; " ;;
    busy-accelerated)
      [ "$reg" = $((2 * conns)) ] && [ "$exp" = 0 ] ||
        bad+="vsocketd: $reg tentative registrations, $exp withdrawn (want $((2 * conns)), none withdrawn); " ;;
    held) [ "$reg" = 0 ] || bad+="vsocketd: $reg tentative registrations (want none); " ;;
  esac
  if [ -n "$bad" ]; then
    fail $name "$bad client: $out"
    return
  fi
  pass "$name ($out; server: $srv_sum; client: $cli_sum; vsocketd: $reg tentative registrations, $exp withdrawn)"
}

register_case policy_busy_loops_accelerate through_vsocketd case_busy_loop policy_busy_loops_accelerate loop 32 busy-accelerated busy-accelerated
register_case policy_busy_loop_one_sided_withdrawn through_vsocketd case_busy_loop policy_busy_loop_one_sided_withdrawn threads 32 busy-withdrawn held
# Eight connections in a loop (redis-benchmark -c 8: the rings lose there,
# 0.4-0.8x): held, however many ready each wait finds.
register_case policy_small_loop_held through_vsocketd case_busy_loop policy_small_loop_held loop 8 held held

# A busy server whose client becomes busy late (32 blocking threads for
# 1.5 s, then one epoll loop on the same connections for 3 s): the server's
# first, tentative registrations are withdrawn (the client is not a loop
# yet), its connections are held again, and once the client is a busy
# loop both ends register and are accelerated (decision 83).
case_busy_loop_late_peer() {
  local name=policy_busy_loop_withdrawn_then_accelerated
  local port srep=$WORK/$name.srv.jsonl crep=$WORK/$name.cli.jsonl out bad=""
  port=$(alloc_port)
  local exp0 exp1
  exp0=$(stat_field tentative_expired)
  busy_run "$name" "$port" 32 "$srep" "$crep" threads-then-loop 32 1.5 || return
  out=$BUSY_OUT
  exp1=$(stat_field tentative_expired)
  local sum
  sum=$(python3 - "$srep" "$crep" "$port" <<'PY'
import json, sys
srv = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cli = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
port = sys.argv[3]
srv = [l for l in srv if l["local"].endswith(":" + port) and l["event"] == "close"]
cli = [l for l in cli if l["peer"].endswith(":" + port) and l["event"] in ("close", "exit")]
bad = []
if len(srv) != 32 or len(cli) != 32:
    bad.append("%d server and %d client connection ends reported (want 32 each)" % (len(srv), len(cli)))
again = [l for l in srv if l["withdrawals"] >= 1 and l["mode"] == "accelerated" and l["registered_for"] == "busy-loop" and l["accel_rx"] > 0]
if len(again) < 24:
    bad.append("%d of the server's connections withdrawn then accelerated (want >= 24): %s" % (len(again), sorted(set((l["mode"], l["reason"], l["withdrawals"]) for l in srv))))
acc = [l for l in cli if l["mode"] == "accelerated" and l["accel_tx"] > 0]
if len(acc) < len(again):
    bad.append("%d client connections accelerated" % len(acc))
if bad:
    raise SystemExit("; ".join(bad))
print("%d server connections withdrawn (%d times in all), then accelerated; %d client connections accelerated" % (len(again), sum(l["withdrawals"] for l in srv), len(acc)))
PY
) || bad+="reports: $sum; "
  [ $((exp1 - exp0)) -ge 24 ] || bad+="vsocketd withdrew $((exp1 - exp0)) tentative registrations (want >= 24); "
  if [ -n "$bad" ]; then
    fail $name "$bad client: $out"
    return
  fi
  pass "$name ($out; $sum; vsocketd withdrew $((exp1 - exp0)))"
}

register_case policy_busy_loop_withdrawn_then_accelerated through_vsocketd case_busy_loop_late_peer

# A busy loop whose activity changes shape (decision 92), the client's
# connections driven by busy_loop.py MODE (32 connections, SECONDS),
# every answer checked byte for byte; WANT says what the reports must show:
#   moved-back (loop-then-one: 32 connections in one epoll loop for 2 s,
#     both ends registered for the busy loop and accelerated, then 31
#     closed and the first driven alone for 4 s). A lone request/response
#     connection is faster on kernel TCP where vsocketd shares the CPUs:
#     once the loops have not been busy for 250 ms, it goes back to kernel
#     TCP at both ends with clean fences (a drain, reason kernel-faster,
#     nothing resent) and is held again: its ends report a downgrade
#     kernel-faster, a withdrawal (held again) and bytes on the rings
#     before it, kernel TCP at the end; the 31 others ended accelerated.
#   back-again (loop-one-loop: busy 1.5 s, the first alone 3 s with the 31
#     others open and idle, then all 32 again for 3 s). The lone connection
#     moves back and, once the loop is busy again and its pause (1 s) is
#     over, is accelerated again: three paths in turn. The 31 idle ones,
#     active again while the busy signal still says quiet (it lags by a
#     window), do not move: they had not turned while it was quiet.
# Either way vsocketd counted the move (moved_back).
case_busy_moves() {
  local name=$1 mode=$2 seconds=$3 want=$4
  local port srep=$WORK/$name.srv.jsonl crep=$WORK/$name.cli.jsonl out bad=""
  port=$(alloc_port)
  local mb0 mb1
  mb0=$(stat_field moved_back)
  busy_run "$name" "$port" 32 "$srep" "$crep" "$mode" 32 "$seconds" || return
  out=$BUSY_OUT
  mb1=$(stat_field moved_back)
  local sum
  sum=$(python3 - "$srep" "$crep" "$port" "$want" 2>&1 <<'PY'
import json, sys
port, want = sys.argv[3], sys.argv[4]
def ends(path, side):
    ls = [json.loads(l) for l in open(path) if l.strip()]
    key = "local" if side == "server" else "peer"
    return [l for l in ls if l[key].endswith(":" + port) and l["event"] in ("close", "exit")]
srv, cli = ends(sys.argv[1], "server"), ends(sys.argv[2], "client")
bad = []
if len(srv) != 32 or len(cli) != 32:
    bad.append("%d server and %d client connection ends reported (want 32 each)" % (len(srv), len(cli)))
if want == "moved-back":
    def moved(l):
        return (l["last_downgrade"] == "kernel-faster" and l["downgrades"] >= 1 and l["withdrawals"] >= 1 and
                l["mode"] == "kernel" and l["accel_rx"] + l["accel_tx"] > 0)
    mv_s, mv_c = [l for l in srv if moved(l)], [l for l in cli if moved(l)]
    acc_s = [l for l in srv if l["mode"] == "accelerated" and l["accel_rx"] > 0]
    acc_c = [l for l in cli if l["mode"] == "accelerated" and l["accel_tx"] > 0]
    if len(mv_s) != 1 or len(mv_c) != 1:
        bad.append("%d server and %d client ends moved back (want 1 each): %s" % (len(mv_s), len(mv_c),
                   sorted(set((l["mode"], l["reason"], l["last_downgrade"], l["withdrawals"]) for l in srv + cli))))
    if len(acc_s) < 31 or len(acc_c) < 31:
        bad.append("%d server and %d client ends accelerated (want 31 each)" % (len(acc_s), len(acc_c)))
    if not bad:
        l = mv_c[0]
        summary = ("the lone connection moved back (client: %d B on the rings, then kernel TCP, %d downgrade(s), "
                   "%d hold(s)); 31 others accelerated" % (l["accel_tx"] + l["accel_rx"], l["downgrades"], l["withdrawals"]))
elif want == "stays-direct":
    direct = [l for l in srv + cli if l["mode"] == "accelerated" and l.get("path") == "direct" and
              l["downgrades"] == 0 and l["accel_rx"] + l["accel_tx"] > 0]
    busy = [l for l in srv + cli if l["registered_for"] == "busy-loop"]
    if len(direct) != 64:
        bad.append("%d of 64 ends direct to the end, never moved (others: %s)" % (len(direct), sorted(set(
            (l["mode"], l.get("path"), l["reason"], l["last_downgrade"], l["downgrades"]) for l in srv + cli
            if l not in direct))))
    if len(busy) < 2:
        bad.append("%d ends registered for the busy loop (want the late ones')" % len(busy))
    summary = ("the lone connection stayed direct (64 ends direct to the end, none moved; %d registered for the "
               "busy loop)" % len(busy))
else:
    back = [l for l in srv + cli if l["last_downgrade"] == "kernel-faster" and l["withdrawals"] >= 1 and
            l["mode"] == "accelerated" and l["reupgrades"] == 0 and l["accel_rx"] + l["accel_tx"] > 0]
    moved = [l for l in srv + cli if l["downgrades"] >= 1]
    acc = [l for l in srv + cli if l["mode"] == "accelerated" and l["accel_rx"] + l["accel_tx"] > 0]
    if len(back) != 2:
        bad.append("%d connection ends moved back and accelerated again (want the lone connection's 2): %s" %
                   (len(back), sorted(set((l["mode"], l["last_downgrade"], l["withdrawals"], l["downgrades"]) for l in moved))))
    if len(moved) != 2:
        bad.append("%d connection ends moved at all (want 2)" % len(moved))
    if len(acc) != 64:
        bad.append("%d of 64 ends accelerated at the end" % len(acc))
    summary = ("the lone connection moved back and was accelerated again (both ends); 62 others never moved; "
               "64 ends accelerated at the end")
if bad:
    raise SystemExit("; ".join(bad))
print(summary)
PY
) || bad+="reports: $sum; "
  if [ "$want" = stays-direct ]; then
    [ $((mb1 - mb0)) -eq 0 ] || bad+="vsocketd moved back $((mb1 - mb0)) connections (want 0); "
  else
    [ $((mb1 - mb0)) -ge 1 ] || bad+="vsocketd moved back $((mb1 - mb0)) connections (want >= 1); "
  fi
  if [ -n "$bad" ]; then
    fail $name "$bad client: $out"
    return
  fi
  pass "$name ($out; $sum; vsocketd moved back $((mb1 - mb0)))"
}

register_case policy_busy_loop_goes_quiet_moves_back through_vsocketd case_busy_moves policy_busy_loop_goes_quiet_moves_back \
  loop-then-one 2 moved-back
# stays-direct (late-then-one, direct pairs as the default makes them: the
# late connections register for the busy loop, and their pairs go direct):
# a direct pair costs one wake-up per one-way like kernel TCP and none when
# the reader polls, so a lone request/response connection is not faster on
# kernel TCP: it stays direct (decision 112; moving direct pairs back once
# left wrk's connections to aiohttp with read errors in CI, 2026-11-29).
register_case policy_busy_loop_quiet_direct_stays case_busy_moves policy_busy_loop_quiet_direct_stays \
  late-then-one 2 stays-direct
register_case policy_busy_loop_quiet_then_busy_again through_vsocketd case_busy_moves policy_busy_loop_quiet_then_busy_again \
  loop-one-loop 1.5 back-again
