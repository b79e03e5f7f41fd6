#!/usr/bin/env python3
"""Checks libvsocket's per-connection report (VSOCKET_REPORT, JSON lines).

  check_report.py FILE [--port P] [--expect-conns N] [--mode M] [--reason R]
                       [--accel-min BYTES] [--exact-total BYTES]

Selects 'close' and 'exit' lines whose local or peer port is P (all lines if
no --port), and fails (exit 1, with the reason) unless:
  --expect-conns N   exactly N such lines,
  --mode M           every line has mode M (accelerated, kernel, kernel-pending),
  --reason R         every line has reason R,
  --accel-min B      every line moved at least B bytes accelerated (tx+rx),
  --path P           every line's path is P (direct, backend, kernel),
and always: no line counts kernel bytes after its upgrade, and no line
counts a missed wake-up (late_wakeups: a wait that slept on data that had
arrived, guest/core/wait.h NoteLateWakeup).
--min-accel N: at least N lines are accelerated and moved bytes that way
(many simultaneous connections on a loaded machine: a pairing may complete
only after a short exchange ended; those stay on kernel TCP, still exact).
--resynced: every line was upgraded (or went back to kernel TCP through
RESYNC after a link loss), and at least one did go through RESYNC.
--reupgraded: every line went through RESYNC, registered again and ended
accelerated.
--downgrade-cause R: every line that went through RESYNC names R as its
last downgrade (always: such a line counts at least one downgrade).
--no-resend: no line resent a byte (resent_bytes 0: every downgrade was
a clean drain, never a RESYNC that repeats bytes).
--exact-total B: for every line, kernel_tx + accel_tx == B or
kernel_rx + accel_rx == B (each connection carried B bytes one way,
wherever they went).
--exact-sum S: for every line, kernel_tx + accel_tx + kernel_rx +
accel_rx == S (what the connection carried both ways, each byte counted
once by each end: a byte resent through RESYNC, or a RESYNC header,
counted twice would show; xfer each way: 2 x length + its 16 B header).
"""
import argparse
import json
import sys

p = argparse.ArgumentParser()
p.add_argument("file")
p.add_argument("--port", type=int)
p.add_argument("--expect-conns", type=int)
p.add_argument("--mode")
p.add_argument("--reason")
p.add_argument("--accel-min", type=int)
p.add_argument("--exact-total", type=int)
p.add_argument("--exact-sum", type=int)
p.add_argument("--min-accel", type=int)
p.add_argument("--path", help="every line's path (direct, backend, kernel)")
p.add_argument("--resynced", action="store_true")
p.add_argument("--reupgraded", action="store_true")
p.add_argument("--no-resend", action="store_true")
p.add_argument("--moves", type=int, metavar="N",
               help="every connection left the rings and re-upgraded at least N times (a guest that moved)")
p.add_argument("--downgrade-cause",
               help="every connection that went through RESYNC counts a downgrade whose last reason is this "
                    "(fabric-down: the link; backend-unavailable: vsocketd; operator: a drain; migration: a move)")
p.add_argument("--aggregate", action="store_true",
               help="with --bulk-accel: judge the sum over all connections, not each one")
p.add_argument("--bulk-accel", type=int, metavar="BYTES",
               help="every connection that carried more than BYTES moved most of them accelerated "
                    "(short exchanges may finish on kernel TCP before a cross-host pairing completes)")
a = p.parse_args()

try:
    lines = [json.loads(l) for l in open(a.file) if l.strip()]
except FileNotFoundError:
    lines = []
# (vsocket-run's line for a program it could not preload names no connection.)
lines = [l for l in lines if "local" in l]

def port_of(ep):
    return int(ep.rsplit(":", 1)[1])

sel = [l for l in lines if a.port is None or a.port in (port_of(l["local"]), port_of(l["peer"]))]
errors = []
if a.expect_conns is not None and len(sel) != a.expect_conns:
    errors.append(f"{len(sel)} connections reported, expected {a.expect_conns}")
for l in sel:
    who = f'{l["local"]}->{l["peer"]} (pid {l["pid"]})'
    if a.mode and l["mode"] != a.mode:
        errors.append(f'{who}: mode {l["mode"]}, expected {a.mode}')
    if a.path and l.get("path") != a.path:
        errors.append(f'{who}: path {l.get("path")}, expected {a.path}')
    if a.reason and l["reason"] != a.reason:
        errors.append(f'{who}: reason {l["reason"]}, expected {a.reason}')
    if a.resynced and not (l["upgraded"] or l.get("resynced")):
        errors.append(f"{who}: never upgraded")
    if a.reupgraded and not (l.get("resynced") and l.get("reupgrades", 0) >= 1 and l["mode"] == "accelerated"):
        errors.append(f'{who}: did not resync and re-upgrade (mode {l["mode"]}, reupgrades {l.get("reupgrades")})')
    if l.get("resynced") and (l.get("downgrades", 0) < 1 or not l.get("last_downgrade")):
        errors.append(f"{who}: went through RESYNC but counts no downgrade")
    if a.downgrade_cause and l.get("resynced") and l.get("last_downgrade") != a.downgrade_cause:
        errors.append(f'{who}: last downgrade {l.get("last_downgrade")!r}, expected {a.downgrade_cause}')
    if a.moves is not None and (l.get("downgrades", 0) < a.moves or l.get("reupgrades", 0) < a.moves):
        errors.append(f'{who}: {l.get("downgrades", 0)} downgrade(s), {l.get("reupgrades", 0)} re-upgrade(s), '
                      f'expected {a.moves} of each')
    if a.no_resend and l.get("resent_bytes", 0):
        errors.append(f'{who}: resent {l["resent_bytes"]} B (expected a clean drain)')
    # A RESYNC puts bytes on kernel TCP after the upgrade by design.
    if not l.get("resynced") and (l.get("kernel_tx_after_upgrade", 0) or l.get("kernel_rx_after_upgrade", 0)):
        errors.append(f"{who}: kernel-path bytes after the upgrade")
    if l.get("late_wakeups", 0):
        errors.append(f'{who}: {l["late_wakeups"]} missed wake-up(s): slept on data that had arrived')
    if a.accel_min is not None and l["accel_tx"] + l["accel_rx"] < a.accel_min:
        errors.append(f'{who}: only {l["accel_tx"] + l["accel_rx"]} bytes accelerated')
    total = l["kernel_tx"] + l["accel_tx"] + l["kernel_rx"] + l["accel_rx"]
    if a.bulk_accel is not None and not a.aggregate and total > a.bulk_accel and 2 * (l["accel_tx"] + l["accel_rx"]) < total:
        errors.append(f'{who}: only {l["accel_tx"] + l["accel_rx"]} of {total} bytes accelerated')
    if a.exact_total is not None:
        tx = l["kernel_tx"] + l["accel_tx"]
        rx = l["kernel_rx"] + l["accel_rx"]
        if a.exact_total not in (tx, rx):
            errors.append(f"{who}: carried {tx} out / {rx} in, expected {a.exact_total}")
    if a.exact_sum is not None and total != a.exact_sum:
        errors.append(f'{who}: counted {l["kernel_tx"] + l["accel_tx"]} out + {l["kernel_rx"] + l["accel_rx"]} in = {total} B, '
                      f'expected {a.exact_sum} (resent_bytes {l.get("resent_bytes", 0)})')
if errors:
    print("; ".join(errors[:5]) + (f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""))
    sys.exit(1)
if a.resynced and not any(l.get("resynced") for l in sel):
    print("no connection went through RESYNC")
    sys.exit(1)
if a.min_accel is not None:
    n = sum(l["mode"] == "accelerated" and l["accel_tx"] + l["accel_rx"] > 0 for l in sel)
    if n < a.min_accel:
        # Name the ends that stayed on kernel TCP and why: a pairing that
        # came late (reason pending/accelerated, all bytes on kernel TCP)
        # is not a refusal (any other reason).
        from collections import Counter
        why = Counter(f'{l["mode"]}/{l["reason"] or "-"}'
                      f'{"/upgraded" if l["upgraded"] else ""}'
                      for l in sel if not (l["mode"] == "accelerated" and l["accel_tx"] + l["accel_rx"] > 0))
        print(f"only {n} connection ends accelerated, want at least {a.min_accel}; the others (mode/reason): "
              + ", ".join(f"{k} x{v}" for k, v in sorted(why.items())))
        sys.exit(1)
if a.bulk_accel is not None and not any(l["mode"] == "accelerated" and l["accel_tx"] + l["accel_rx"] > 0 for l in sel):
    print("no connection moved any byte accelerated")
    sys.exit(1)
if a.aggregate:
    tot = sum(l["kernel_tx"] + l["accel_tx"] + l["kernel_rx"] + l["accel_rx"] for l in sel)
    acc = sum(l["accel_tx"] + l["accel_rx"] for l in sel)
    if 2 * acc < tot:
        print(f"only {acc} of {tot} bytes accelerated over all connections")
        sys.exit(1)
accel = sum(l["mode"] == "accelerated" for l in sel)
res = sum(bool(l.get("resynced")) for l in sel)
resent = sum(l.get("resent_bytes", 0) for l in sel)
kernel_ms = max((l.get("kernel_ms_after_downgrade", 0) for l in sel), default=0)
print(f"{len(sel)} connections ok ({accel} accelerated"
      + (f", {res} went through RESYNC: {resent} B resent, up to {kernel_ms} ms on kernel TCP)" if res else ")"))
