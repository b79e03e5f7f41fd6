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
and always: no line counts kernel bytes after its upgrade.
--exact-total B: for every line, kernel_tx + accel_tx == B or
kernel_rx + accel_rx == B (each connection carried B bytes one way,
wherever they went).
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
a = p.parse_args()

try:
    lines = [json.loads(l) for l in open(a.file) if l.strip()]
except FileNotFoundError:
    lines = []

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
    if a.reason and l["reason"] != a.reason:
        errors.append(f'{who}: reason {l["reason"]}, expected {a.reason}')
    if l.get("kernel_tx_after_upgrade", 0) or l.get("kernel_rx_after_upgrade", 0):
        errors.append(f"{who}: kernel-path bytes after the upgrade")
    if a.accel_min is not None and l["accel_tx"] + l["accel_rx"] < a.accel_min:
        errors.append(f'{who}: only {l["accel_tx"] + l["accel_rx"]} bytes accelerated')
    if a.exact_total is not None:
        tx = l["kernel_tx"] + l["accel_tx"]
        rx = l["kernel_rx"] + l["accel_rx"]
        if a.exact_total not in (tx, rx):
            errors.append(f"{who}: carried {tx} out / {rx} in, expected {a.exact_total}")
if errors:
    print("; ".join(errors[:5]) + (f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""))
    sys.exit(1)
print(f"{len(sel)} connections ok")
