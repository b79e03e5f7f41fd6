#!/usr/bin/env python3
"""Judges the per-connection reports of one application case (the
application matrix: tests/e2e/same_host/6x_*.sh, 7x_*.sh).

  report_summary.py --port P --policy always|auto [--server FILE]
                    [--client FILE] [--min-accel N] [--both-ends]
                    [--slack FRACTION] [--forked N]

Reads libvsocket's JSON-lines reports (VSOCKET_REPORT) of the server's
processes (--server) and of the client's (--client); selects the lines of
connections whose local (server) or peer (client) port is P. Prints one
line: the ends reported per side, how many ended accelerated, the bytes
each path carried, and every other mode/reason seen with its count (those
are what a run under the default policy records). Exits 1, saying why,
when:
  * a line counts a missed wake-up (late_wakeups) or kernel bytes after its
    upgrade without a RESYNC (as check_report.py);
  * a line names a reason that is a failure under any policy:
    resource-limit (a region or a daemon limit ran out), protocol-error,
    spoofed-address (vsocketd refused the VM's own address);
  * --policy always: more than SLACK (default 1%, at least 2 ends) of the
    ends that carried data are not accelerated, or fewer than N
    (--min-accel) ends are;
  * --forked N: fewer than N ends report reason "forked" (a connection
    shared with a forked child goes back to kernel TCP at the fork, at both
    ends: decision 85); such ends are not counted as "not accelerated";
  * --both-ends: the server reported fewer connection ends than the client
    (beyond the same slack): connections the server's library lost track of
    (closed behind its back, e.g. syscall(SYS_close)) write no line.
"""
import argparse
import collections
import json
import sys

BAD_REASONS = ("resource-limit", "protocol-error", "spoofed-address")

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--policy", choices=("always", "auto"), required=True)
p.add_argument("--server", action="append", default=[])
p.add_argument("--client", action="append", default=[])
p.add_argument("--min-accel", type=int, default=0)
p.add_argument("--both-ends", action="store_true")
p.add_argument("--slack", type=float, default=0.01)
p.add_argument("--forked", type=int, default=0)
a = p.parse_args()


def load(files):
    out = []
    for f in files:
        try:
            out += [json.loads(l) for l in open(f) if l.strip()]
        except FileNotFoundError:
            pass
    return [l for l in out if "local" in l]


def port_of(ep):
    return int(ep.rsplit(":", 1)[1])


srv = [l for l in load(a.server) if port_of(l["local"]) == a.port]
cli = [l for l in load(a.client) if port_of(l["peer"]) == a.port]
ends = srv + cli
errors = []


def total(l):
    return l["kernel_tx"] + l["kernel_rx"] + l["accel_tx"] + l["accel_rx"]


def accelerated(l):
    return l["mode"] == "accelerated" and l["accel_tx"] + l["accel_rx"] > 0


for l in ends:
    who = f'{l["local"]}->{l["peer"]} (pid {l["pid"]})'
    if l.get("late_wakeups", 0):
        errors.append(f'{who}: {l["late_wakeups"]} missed wake-up(s)')
    if not l.get("resynced") and (l.get("kernel_tx_after_upgrade", 0) or l.get("kernel_rx_after_upgrade", 0)):
        errors.append(f"{who}: kernel-path bytes after the upgrade")
bad = collections.Counter(l["reason"] for l in ends if l["reason"] in BAD_REASONS)
if bad:
    errors.append("reasons that are failures: " + ", ".join(f"{r} x{n}" for r, n in sorted(bad.items())))


def side(lines, name):
    acc = sum(accelerated(l) for l in lines)
    why = collections.Counter(f'{l["mode"]}/{l["reason"] or "-"}' for l in lines if not accelerated(l))
    others = ", ".join(f"{k} x{v}" for k, v in sorted(why.items()))
    return acc, f"{name} {len(lines)} ends, {acc} accelerated" + (f" (others: {others})" if others else "")


sacc, stext = side(srv, "server")
cacc, ctext = side(cli, "client")
abytes = sum(l["accel_tx"] + l["accel_rx"] for l in ends)
kbytes = sum(l["kernel_tx"] + l["kernel_rx"] for l in ends)
carrying = [l for l in ends if total(l) > 0]
slack = max(2, int(a.slack * len(carrying)))
if a.policy == "always":
    # (An end upgraded whose every byte went before the upgrade landed, a
    # short connection at the end of a load, was accelerated all the same:
    # under "always" only an end the rings never took is slow.)
    slow = [l for l in carrying if l["mode"] != "accelerated" and not (a.forked and l["reason"] == "forked")]
    if len(slow) > slack:
        errors.append(f"{len(slow)} of {len(carrying)} data-carrying ends not accelerated (allowed {slack})")
    if sacc + cacc < a.min_accel:
        errors.append(f"only {sacc + cacc} ends accelerated, want at least {a.min_accel}")
forked = sum(l["reason"] == "forked" for l in ends)
if forked < a.forked:
    errors.append(f"{forked} ends report reason forked, want at least {a.forked}")
if a.both_ends and len(srv) + max(2, int(a.slack * len(cli))) < len(cli):
    errors.append(f"the server reported {len(srv)} connection ends, the client {len(cli)}")
summary = (f"{stext}; {ctext}; {abytes / 1048576:.1f} MiB accelerated, {kbytes / 1048576:.1f} MiB on kernel TCP "
           f"(both ends counted)")
if errors:
    print("; ".join(errors[:4]) + (f" (+{len(errors) - 4} more)" if len(errors) > 4 else "") + " | " + summary)
    sys.exit(1)
print(summary)
