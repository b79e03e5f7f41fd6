#!/usr/bin/env python3
"""Cross-host benchmark: vSocket vs kernel TCP between VMs on the two hosts
of deploy/testbed2.sh (client vmA1 on hostA, server vmB1 on hostB, both
tenant 1), in the same run, over the tcp fabric.

  bench/cross_host_bench.py [--bin DIR] [--seconds N] [--reps N] [--out DIR]

DIR holds the binaries, as a Bazel output tree (default
bazel-out/k8-opt/bin) or flat (libvsocket.so, vsocketd, vsocketctl,
netload). VSOCKETD, VSOCKETCTL, VSOCKET_TESTBED2_NS_PREFIX and
VSOCKET_TESTBED2_DIR are passed to the test bed as they are.

Per mode (kernel TCP; vSocket = libvsocket.so preloaded on both ends), the
modes alternating per measurement (kernel TCP then vSocket, the other way
round in the next repetition), so drift during the run falls on both alike:
  - RTT p50/p99/p99.9: sockperf ping-pong, 16 B
  - message rate 16 B, one connection: sockperf and netload
  - message rate 16 B, 64 connections: netload (one epoll loop, aggregate)
  - message rate 1 KiB, one connection: sockperf
  - bandwidth: iperf3, one stream, 64 KiB writes
  - connect to first byte echoed: netload connect (p50, p99)
  - applications, with same_host_bench's runners (--no-apps: not): redis
    (1 and 50 clients, 100 clients pipelined 16), nginx 4 KiB under wrk
    (keep-alive and "Connection: close"), PostgreSQL pgbench (TPC-B,
    select-only with 1 and 8 clients; the server as the user postgres,
    through vmB1's group), socat 1 GiB one way
  - CPU per million 16 B messages: client + server + both vsocketd
    (/proc/PID/stat), over netload's measuring window
  - adaptive batching: hostA's fabric link counters (frames, writev calls,
    payload bytes) over the same window, at 1 and 64 connections
Each vSocket measurement records both daemons' fabric_bytes_out and
remote_upgrades before and after; one whose fabric carried less than half of
the application's bytes is INVALID (excluded from the medians). Kernel
measurements must leave the fabric untouched.

Results: OUT/cross-host-latest.{json,md} (replacing the previous run's; older
runs are in git history) and cross-host-latest-{latency,rates}.{dat,png}.
"""
import argparse
import os
import re
import statistics
import subprocess
import time

import benchlib as bl
import same_host_bench as sh
from render_docs import held_note

CLIENT_VM, SERVER_VM = "vmA1", "vmB1"
HZ = os.sysconf("SC_CLK_TCK")
GUEST_POLL_ENV = {"VSOCKET_POLL_AUTO": "0"}
VALID_FRACTION = 0.5  # of the application's bytes that must cross the fabric


class FabricProbe:
    """Both daemons' fabric counters and hostA's link counters, before and
    after one measurement."""
    COUNTERS = ("fabric_bytes_out", "remote_upgrades", "worker_wakeups")
    LINK = ("frames_out", "write_calls", "data_bytes_out")

    def __init__(self, bed):
        self.bed = bed
        self.c0 = {h: bed.counters(h) for h in ("hostA", "hostB")}
        self.m0 = bl.machine_ticks()

    def delta(self):
        m1 = bl.machine_ticks()
        c1 = {h: self.bed.counters(h) for h in ("hostA", "hostB")}
        d = {f"{h}_{k}": c1[h].get(k, 0) - self.c0[h].get(k, 0) for h in c1 for k in self.COUNTERS}
        d["fabric_bytes"] = d["hostA_fabric_bytes_out"] + d["hostB_fabric_bytes_out"]
        # How busy the whole machine was (others' tests included), in CPUs.
        d["machine_busy_cpus"] = (m1[0] - self.m0[0]) / max(1, m1[1] - self.m0[1]) * (os.cpu_count() or 1)
        return d


def judge(res, accel, app_bytes, applies=True, held_ok=False):
    """Marks a measurement valid or INVALID from its fabric counters.
    held_ok: a measurement the default upgrade policy may keep on kernel
    TCP (request/response where vsocketd shares the CPUs, decision 51; a
    bulk stream across the tcp fabric, decision 62): valid either way, and
    res["path"] says which it took."""
    f = res["fabric"]
    res["app_bytes"] = app_bytes
    if accel and held_ok:
        res["path"] = "fabric" if app_bytes > 0 and f["fabric_bytes"] >= VALID_FRACTION * app_bytes else "kernel"
    if not accel:
        res["valid"] = f["fabric_bytes"] == 0
    elif held_ok and res["path"] == "kernel":
        res["valid"] = app_bytes > 0 and f["fabric_bytes"] == 0
    elif not applies:
        res["valid"] = True  # first bytes precede the pairing by design; see remote_upgrades
    else:
        res["valid"] = app_bytes > 0 and f["fabric_bytes"] >= VALID_FRACTION * app_bytes
    return res


# ---- measurements -------------------------------------------------------------------


def pin(pid, cpus):
    """All threads of `pid` onto `cpus` (taskset; None: nothing)."""
    if pid:
        subprocess.run(["taskset", "-a", "-p", "-c", str(cpus), str(pid)], check=True, capture_output=True)


def sockperf(bed, accel, mode, size, seconds, port, env=None, place=None):
    """place: (client CPU, server CPU) or None (the scheduler decides)."""
    # info: the library says whether its blocked calls sleep at once
    # (vsocketd shares the guest's CPUs) or poll first.
    env = {"VSOCKET_LOG_LEVEL": "info", **(env or {})}
    srv = bed.start(SERVER_VM, accel, ["sockperf", "sr", "--tcp", "-i", bed.server_addr, "-p", str(port)],
                    seconds + 30, extra_env=env)
    try:
        bed.wait_listening(SERVER_VM, port)
        if place:
            pin(srv.child(), place[1])
        probe = FabricProbe(bed)
        cli = bed.start(CLIENT_VM, accel, ["sockperf", mode, "--tcp", "-i", bed.server_addr, "-p", str(port),
                                           "-t", str(seconds), "-m", str(size)] + bl.SOCKPERF_PP_CAP.get(mode, []),
                        seconds + 20, extra_env=env)
        if place:
            pin(cli.child(), place[0])  # (sockperf's first ~0.4 s is warm-up, not measured)
        cli.finish()
        res = bl.parse_sockperf(cli.text)
        res["fabric"] = probe.delta()
        if accel:
            res["guest_wait"] = "sleep at once" if "blocked calls sleep at once" in cli.text else "poll first"
    finally:
        srv.stop()
    m = re.search(r"Total of ([0-9]+) messages sent", cli.text)
    if m:
        res["messages_total"] = int(m.group(1))
    sent = res.get("messages_total") or res.get("messages", 0)
    # A ping-pong moves each message both ways.
    return judge(res, accel, sent * size * (2 if mode == "pp" else 1), held_ok=(mode == "pp" and accel != "always"))


def netload_rate(bed, accel, conns, size, seconds, port):
    srv = bed.start(SERVER_VM, accel, [bed.netload, "server", bed.server_addr, str(port), "--sink",
                                       "--conns", str(conns), "--max-seconds", str(seconds + 25)], seconds + 30)
    try:
        srv.expect("listening", 10)
        probe = FabricProbe(bed)
        cli = bed.start(CLIENT_VM, accel, [bed.netload, "rate", bed.server_addr, str(port), "--conns", str(conns),
                                           "--size", str(size), "--seconds", str(seconds), "--warmup", "0.5",
                                           "--linger", "10"], seconds + 20, stdin=True)
        # The client lingers after "window end" until told, so all four
        # processes are still there when /proc is read.
        pids = {"client": cli.child(), "server": srv.child(), **bed.daemons}
        cli.expect("window start", 15)
        t0, m0, l0 = bl.ticks_per_process(pids.values()), bl.machine_ticks(), bed.link("hostA")
        cli.expect("window end", seconds + 10)
        t1, m1, l1 = bl.ticks_per_process(pids.values()), bl.machine_ticks(), bed.link("hostA")
        cli.send("done")
        cli.finish(20)
        res = cli.json_line() or {"error": cli.text[-500:]}
        srv.finish(20)
        res["server"] = srv.json_line() or {"error": srv.text[-500:]}
        res["fabric"] = probe.delta()
    finally:
        srv.stop()
    res["cpu_ticks"] = {name: t1[str(pid)] - t0[str(pid)] for name, pid in pids.items()}
    res["cpu_s"] = {n: t / HZ for n, t in res["cpu_ticks"].items()}
    # Machine-wide irq + softirq time: mostly our packets' receive path
    # (charged to no process), but other tests' too.
    res["softirq_s"] = (m1[2] - m0[2]) / HZ
    msgs = res.get("window_messages", 0)
    res["softirq_s_per_million"] = res["softirq_s"] / (msgs / 1e6) if msgs else float("nan")
    res["machine_busy_cpus_window"] = (m1[0] - m0[0]) / max(1, m1[1] - m0[1]) * (os.cpu_count() or 1)
    msgs = res.get("window_messages", 0)
    res["cpu_s_per_million"] = sum(res["cpu_s"].values()) / (msgs / 1e6) if msgs else float("nan")
    res["link_window"] = {k: l1.get(k, 0) - l0.get(k, 0) for k in FabricProbe.LINK}
    res["delivered"] = res["server"].get("bytes_in") == res.get("bytes_total")
    return judge(res, accel, res.get("bytes_total", 0))


def iperf(bed, accel, seconds, port, place=None):
    """place: (client CPU, server CPU) or None (the scheduler decides)."""
    srv = bed.start(SERVER_VM, accel, ["iperf3", "-s", "-B", bed.server_addr, "-p", str(port), "-1"], seconds + 30)
    try:
        bed.wait_listening(SERVER_VM, port)
        if place:
            pin(srv.child(), place[1])
        probe = FabricProbe(bed)
        cli = bed.start(CLIENT_VM, accel, ["iperf3", "-c", bed.server_addr, "-p", str(port), "-t", str(seconds),
                                           "-l", "64K", "-J"], seconds + 20)
        if place:
            pin(cli.child(), place[0])
        cli.finish()
        res = bl.parse_iperf(cli.text)
        res["fabric"] = probe.delta()
    finally:
        srv.stop()
    # Under the default policy a bulk stream across the tcp fabric stays on
    # kernel TCP (decision 62): valid either way, the path says which.
    return judge(res, accel, res.get("bytes", 0), held_ok=accel != "always")


def connect_time(bed, accel, count, port):
    srv = bed.start(SERVER_VM, accel, [bed.netload, "server", bed.server_addr, str(port), "--conns", str(count),
                                       "--max-seconds", "40"], 45)
    try:
        srv.expect("listening", 10)
        probe = FabricProbe(bed)
        cli = bed.start(CLIENT_VM, accel, [bed.netload, "connect", bed.server_addr, str(port), "--count", str(count),
                                           "--max-seconds", "30"], 40)
        cli.finish()
        res = cli.json_line() or {"error": cli.text[-500:]}
        srv.finish(10)
        res["fabric"] = probe.delta()
    finally:
        srv.stop()
    return judge(res, accel, count, applies=False)


def guarded(fn, *args):
    """One measurement; a failure is recorded (and invalid), not fatal."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - any failure of one measurement
        print(f"   {fn.__name__}: {e}", flush=True)
        return {"error": str(e)[-1000:], "valid": False, "app_bytes": 0,
                "fabric": {"fabric_bytes": 0, "hostA_fabric_bytes_out": 0, "hostB_fabric_bytes_out": 0,
                           "hostA_remote_upgrades": 0, "hostB_remote_upgrades": 0}}


# (name, function, which upgrade policy it runs under, port offset, extra
# arguments after (bed, policy, ...) up to the port, and after it). The
# policy: "auto" runs it under the default policy, "always" accelerates every
# connection (VSOCKET_UPGRADE=always); kernel TCP runs every one plainly (for
# it the *_always rows are just more samples).
MEASUREMENTS = [
    ("pingpong_16", sockperf, "auto", 0, ("pp", 16, "S"), ()),
    ("pingpong_16_always", sockperf, "always", 8, ("pp", 16, "S"), ()),
    # Accelerated, with the guests' libraries made to poll first even though
    # vsocketd shares their CPUs (by default they sleep at once there:
    # guest/core/cpu_share.h).
    ("pingpong_16_poll", sockperf, "always", 7, ("pp", 16, "S"), (GUEST_POLL_ENV,)),
    ("rate_16_sockperf", sockperf, "auto", 1, ("tp", 16, "S"), ()),
    ("rate_16_c1", netload_rate, "auto", 2, (1, 16, "S"), ()),
    ("rate_16_c64", netload_rate, "auto", 3, (64, 16, "S"), ()),
    ("rate_1k_sockperf", sockperf, "auto", 4, ("tp", 1024, "S"), ()),
    ("bandwidth_64k", iperf, "auto", 5, ("S",), ()),
    ("connect", connect_time, "auto", 6, (200,), ()),
]


# Real applications across hosts (issue 15: the same workloads as on one
# host, same_host_bench's runners on the two-host bed): (name, runner(bed,
# accel, port, pg, seconds)). Under the default policy only; what vsocketd
# did with them shows in its counters, not in a fabric check (held
# request/response traffic stays on kernel TCP by design).
APPS = [
    ("redis", lambda bed, accel, port, pg, s: sh.redis(bed, accel, port)),
    ("nginx_keepalive", lambda bed, accel, port, pg, s: sh.nginx(bed, accel, port, close=False, seconds=s)),
    ("nginx_keepalive_32", lambda bed, accel, port, pg, s: sh.nginx(bed, accel, port, close=False, seconds=s, conns=32)),
    ("node_keepalive_32", lambda bed, accel, port, pg, s: sh.node_http(bed, accel, port, seconds=s)),
    ("nginx_close", lambda bed, accel, port, pg, s: sh.nginx(bed, accel, port, close=True, seconds=s)),
    ("pgbench", lambda bed, accel, port, pg, s: sh.pgbench(bed, pg, accel, max(3, s))),
    ("socat", lambda bed, accel, port, pg, s: sh.socat(bed, accel, port)),
]


def run_app(fn, *args):
    """One application measurement; a failure is recorded, not fatal."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - any failure of one measurement
        print(f"   app: {e}", flush=True)
        return {"error": str(e)[-1000:]}


def run_rep(bed, seconds, port, order, pg=None):
    """One repetition: every measurement under each mode of `order`
    (("kernel", False), ("vsocket", "auto")) before the next measurement, so
    drift during a run (another tenant of the machine, a slow phase) falls
    on both modes alike instead of on whichever ran in that stretch."""
    rep = {mode: {} for mode, _ in order}
    for name, fn, policy, off, before, after in MEASUREMENTS:
        for mode, accel in order:
            args = [seconds if a == "S" else a for a in before]
            rep[mode][name] = guarded(fn, bed, accel and policy, *args, port + off + (50 if accel else 0), *after)
    if pg is not None:
        for i, (name, fn) in enumerate(APPS):
            for mode, accel in order:
                before = bed.counters("hostA")
                app = run_app(fn, bed, accel, port + 20 + i + (50 if accel else 0), pg, seconds)
                after = bed.counters("hostA")
                app["hostA_upgrades"] = after.get("upgrades", 0) - before.get("upgrades", 0)
                rep[mode].setdefault("apps", {})[name] = app
    return rep


def pinned_rtt(bed, reps, seconds):
    """Ping-pong and one iperf3 stream again with one CPU per host
    (taskset): hostA's vsocketd and the client on CPU 0, hostB's vsocketd
    and the server on CPU 1, kernel TCP placed the same. Two hosts on one
    machine otherwise compete for each other's CPUs, which two real hosts
    never do; this is the faithful placement, and it is repeatable where
    the floating one is not."""
    out = {"cpu": None, "kernel": [], "vsocket": [], "always": [],
           "bandwidth": {"kernel": [], "vsocket": [], "always": []}}
    ncpu = os.cpu_count() or 1
    if reps <= 0 or ncpu < 2:
        return out
    out["cpu"] = "0 (hostA), 1 (hostB)"
    pin(bed.daemons["hostA"], 0)
    pin(bed.daemons["hostB"], 1)
    try:
        for i in range(reps):
            for k, (mode, accel) in enumerate((("kernel", False), ("vsocket", "auto"), ("always", "always"))):
                print(f"== pinned rep {i} {mode}", flush=True)
                out[mode].append(guarded(sockperf, bed, accel, "pp", 16, seconds, 13000 + 10 * i + 3 * k, None,
                                         (0, 1)))
                out["bandwidth"][mode].append(guarded(iperf, bed, accel, seconds, 13500 + 10 * i + 3 * k, (0, 1)))
    finally:
        for pid in bed.daemons.values():
            subprocess.run(["taskset", "-a", "-p", "-c", f"0-{ncpu - 1}", str(pid)], capture_output=True)
    return out


# ---- summary ------------------------------------------------------------------------

# (label, measurement, value, goal (ratio), goal test, lower is better)
METRICS = [
    ("RTT p50, 16 B (us)", "pingpong_16", lambda r: 2 * r.get("p50", 0), "<= 1", lambda x: x <= 1),
    ("RTT p99, 16 B (us)", "pingpong_16", lambda r: 2 * r.get("p99", 0), "<= 1.2", lambda x: x <= 1.2),
    ("RTT p99.9, 16 B (us)", "pingpong_16", lambda r: 2 * r.get("p99.9", 0), "", None),
    ("RTT p50, 16 B, --upgrade always (us)", "pingpong_16_always", lambda r: 2 * r.get("p50", 0), "", None),
    ("RTT p99, 16 B, --upgrade always (us)", "pingpong_16_always", lambda r: 2 * r.get("p99", 0), "", None),
    ("RTT p50, 16 B, --upgrade always, guests made to poll (us)", "pingpong_16_poll", lambda r: 2 * r.get("p50", 0),
     "", None),
    ("RTT p99, 16 B, --upgrade always, guests made to poll (us)", "pingpong_16_poll", lambda r: 2 * r.get("p99", 0),
     "", None),
    ("msg rate 16 B, 1 conn, sockperf (msg/s)", "rate_16_sockperf", lambda r: r.get("msg_per_s", 0), "", None),
    ("msg rate 16 B, 1 conn, netload (msg/s)", "rate_16_c1", lambda r: r.get("msg_per_s", 0), "", None),
    ("msg rate 16 B, 64 conns, netload (msg/s)", "rate_16_c64", lambda r: r.get("msg_per_s", 0), ">= 3",
     lambda x: x >= 3),
    ("msg rate 1 KiB, 1 conn, sockperf (msg/s)", "rate_1k_sockperf", lambda r: r.get("msg_per_s", 0), "", None),
    ("bandwidth, iperf3 1 stream (Gbit/s)", "bandwidth_64k", lambda r: r.get("gbit_per_s", 0), ">= 1",
     lambda x: x >= 1),
    ("connect to first byte echoed, p50 (us)", "connect", lambda r: r.get("p50_us", 0), "<= 1.5", lambda x: x <= 1.5),
    ("connect to first byte echoed, p99 (us)", "connect", lambda r: r.get("p99_us", 0), "", None),
    ("CPU s / million 16 B msgs, 1 conn", "rate_16_c1", lambda r: r.get("cpu_s_per_million", 0), "", None),
    ("CPU s / million 16 B msgs, 64 conns", "rate_16_c64", lambda r: r.get("cpu_s_per_million", 0), "", None),
]


def values_of(reps, mode, meas, fn):
    """One value per repetition; None for an invalid run, NaN or missing."""
    vals = [fn(rep[mode][meas]) if rep[mode][meas].get("valid") else None for rep in reps]
    return [v if v is not None and v == v and v else None for v in vals]


def spread_of(vals):
    vals = [v for v in vals if v is not None]
    return (statistics.median(vals), min(vals), max(vals)) if vals else (0.0, 0.0, 0.0)


def summarize(results):
    reps = results["reps"]
    table = []
    for label, meas, fn, goal, test in METRICS:
        kv, vv = values_of(reps, "kernel", meas, fn), values_of(reps, "vsocket", meas, fn)
        k, kmin, kmax = spread_of(kv)
        v, vmin, vmax = spread_of(vv)
        valid = [rep["vsocket"][meas]["valid"] for rep in reps]
        r, rmin, rmax = bl.paired_ratio(kv, vv)
        paths = sorted({rep["vsocket"][meas].get("path") for rep in reps} - {None})
        table.append({"metric": label, "measurement": meas, "kernel": k, "kernel_range": [kmin, kmax],
                      "vsocket": v, "vsocket_range": [vmin, vmax], "ratio": r, "ratio_range": [rmin, rmax],
                      "goal": goal,
                      "met": None if test is None else bool(r == r and test(r)),
                      "vsocket_valid_reps": sum(valid), "reps": len(valid), "paths": paths})
    batching = []
    for meas, conns in (("rate_16_c1", 1), ("rate_16_c64", 64)):
        runs = [rep["vsocket"][meas] for rep in reps if rep["vsocket"][meas].get("valid")]
        lw = [r["link_window"] for r in runs if r["link_window"].get("write_calls")]
        if not lw:
            continue
        med = lambda f: statistics.median(f(w, r) for w, r in zip(lw, runs))
        batching.append({"conns": conns,
                         "frames_per_write": med(lambda w, r: w["frames_out"] / w["write_calls"]),
                         "bytes_per_write": med(lambda w, r: w["data_bytes_out"] / w["write_calls"]),
                         "messages_per_frame": med(lambda w, r: r["window_messages"] / max(1, w["frames_out"])),
                         "writes_per_s": med(lambda w, r: w["write_calls"] / r["window_s"])})
    cpu = []
    for meas, conns in (("rate_16_c1", 1), ("rate_16_c64", 64)):
        for mode in ("kernel", "vsocket"):
            runs = [rep[mode][meas] for rep in reps if rep[mode][meas].get("valid") and rep[mode][meas].get("cpu_s")]
            if runs:
                cpu.append({"conns": conns, "mode": mode, **{
                    who: statistics.median(r["cpu_s"][who] / (r["window_messages"] / 1e6) for r in runs)
                    for who in ("client", "server", "hostA", "hostB")},
                    "softirq": statistics.median(r["softirq_s_per_million"] for r in runs)})
    # Does a round trip find the daemons' workers asleep? (epoll wake-ups per
    # ping-pong message, each daemon; the worker polls poll_us before sleeping)
    wake = {}
    for mode in ("kernel", "vsocket"):
        runs = [rep[mode]["pingpong_16"] for rep in reps if rep[mode]["pingpong_16"].get("messages")]
        if runs:
            wake[mode] = {h: statistics.median(r["fabric"].get(f"{h}_worker_wakeups", 0) / r["messages"] for r in runs)
                          for h in ("hostA", "hostB")}
    pinned = results.get("pinned") or {}
    prow = []
    if pinned.get("cpu") is not None:
        for mode_v, suffix in (("vsocket", ""), ("always", ", --upgrade always")):
            if not pinned.get(mode_v):
                continue
            for label, q, limit in (("RTT p50, 16 B (us)", "p50", 1.0), ("RTT p99, 16 B (us)", "p99", 1.2),
                                    ("RTT p99.9, 16 B (us)", "p99.9", None)):
                xs = {mode: [2 * r[q] if r.get("valid") and r.get(q) else None for r in pinned[mode]]
                      for mode in ("kernel", mode_v)}
                vals = {mode: spread_of(xs[mode]) for mode in xs}
                r, rmin, rmax = bl.paired_ratio(xs["kernel"], xs[mode_v])
                prow.append({"metric": label.replace(" (us)", suffix + " (us)"), "kernel": vals["kernel"],
                             "vsocket": vals[mode_v], "ratio": r, "ratio_range": [rmin, rmax],
                             "goal": f"<= {limit:g}" if limit else "",
                             "met": bool(r == r and r <= limit) if mode_v == "vsocket" and limit else None,
                             "valid": sum(1 for x in pinned[mode_v] if x.get("valid")), "reps": len(pinned[mode_v]),
                             "paths": sorted({x.get("path") for x in pinned[mode_v]} - {None})})
            bw = pinned.get("bandwidth") or {}
            if bw.get(mode_v):
                xs = {mode: [r["gbit_per_s"] if r.get("valid") and r.get("gbit_per_s") else None for r in bw[mode]]
                      for mode in ("kernel", mode_v)}
                vals = {mode: spread_of(xs[mode]) for mode in xs}
                r, rmin, rmax = bl.paired_ratio(xs["kernel"], xs[mode_v])
                prow.append({"metric": "bandwidth, iperf3 1 stream" + suffix + " (Gbit/s)", "kernel": vals["kernel"],
                             "vsocket": vals[mode_v], "ratio": r, "ratio_range": [rmin, rmax], "goal": ">= 1",
                             "met": bool(r == r and r >= 1) if mode_v == "vsocket" else None,
                             "valid": sum(1 for x in bw[mode_v] if x.get("valid")), "reps": len(bw[mode_v]),
                             "paths": sorted({x.get("path") for x in bw[mode_v]} - {None})})
    results["pinned_table"] = prow
    results["apps_table"] = app_table(reps)
    results["table"], results["batching"], results["cpu_breakdown"] = table, batching, cpu
    results["pingpong_wakeups_per_message"] = wake
    # How the client's library waited, per ping-pong measurement (its own
    # decision, from its log line).
    results["guest_wait"] = {meas: sorted({rep["vsocket"][meas].get("guest_wait", "?") for rep in reps
                                           if rep["vsocket"][meas].get("messages")})
                             for meas in ("pingpong_16", "pingpong_16_always", "pingpong_16_poll")}


def fabric_runs(mode_runs):
    """(measurement, result) of one mode's repetition, without the
    applications (they carry no fabric check)."""
    return [(k, r) for k, r in mode_runs.items() if k != "apps"]


def app_table(reps):
    """Medians (min-max) of the application rows, kernel TCP and vSocket
    (default policy), against the do-no-harm goal (>= 1)."""
    rows = []
    for label, meas, field in sh.APP_METRICS:
        xs = {}
        for mode in ("kernel", "vsocket"):
            xs[mode] = []
            for rep in reps:
                try:
                    x = float(rep[mode]["apps"][meas].get(field, 0))
                except (KeyError, TypeError, ValueError):
                    x = None
                xs[mode].append(x if x is not None and x == x and x > 0 else None)
        vals = {mode: spread_of(xs[mode]) for mode in xs}
        if not vals["kernel"][0] and not vals["vsocket"][0]:
            continue
        r, rmin, rmax = bl.paired_ratio(xs["kernel"], xs["vsocket"])
        rows.append({"metric": label, "kernel": vals["kernel"], "vsocket": vals["vsocket"], "ratio": r,
                     "ratio_range": [rmin, rmax], "goal": ">= 1", "met": bool(r == r and r >= 1)})
    return rows


def fmt(x):
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.2f}"


def markdown(results):
    t = results["table"]
    md = [f"# Cross-host benchmark (tcp fabric), {results['date']}",
          "",
          f"vmA1 (hostA) -> vmB1 (hostB), tenant 1; {results['cpus']} CPUs, load average "
          f"{results['loadavg_before']} before / {results['loadavg_after']} after; {results['reps_n']} repetitions "
          f"of {results['seconds']} s per test, kernel TCP and vSocket alternating per test; medians (min-max); "
          "vSocket/kernel: the median (min-max) of each repetition's ratio.",
          "", "Binaries: " + ", ".join(f"{k} {v['sha256']} ({v['mtime']})" for k, v in results["binaries"].items())
          + f"; wall time {results['wall_s']} s.", "",
          "| metric | kernel TCP | vSocket | vSocket/kernel | goal | fabric check (vSocket) |",
          "|---|--:|--:|--:|---|---|"]
    for row in t:
        goal = ""
        if row["goal"]:
            goal = f"{row['goal']}: **{'met' if row['met'] else 'missed'}**"
        check = (f"valid {row['vsocket_valid_reps']}/{row['reps']}" if row["vsocket_valid_reps"] == row["reps"]
                 else f"**INVALID** in {row['reps'] - row['vsocket_valid_reps']}/{row['reps']} (excluded)")
        if row["measurement"] == "connect":
            check += " (1 B before pairing: kernel by design)"
        check += held_note(row)
        md.append(f"| {row['metric']} | {fmt(row['kernel'])} ({fmt(row['kernel_range'][0])}-{fmt(row['kernel_range'][1])}) "
                  f"| {fmt(row['vsocket'])} ({fmt(row['vsocket_range'][0])}-{fmt(row['vsocket_range'][1])}) "
                  f"| {bl.ratio_text(row)} | {goal} | {check} |")
    if results.get("apps_table"):
        md += ["", "## Applications (default policy)", "",
               "| metric | kernel TCP | vSocket | vSocket/kernel | goal |", "|---|--:|--:|--:|---|"]
        for row in results["apps_table"]:
            k, v = row["kernel"], row["vsocket"]
            md.append(f"| {row['metric']} | {fmt(k[0])} ({fmt(k[1])}-{fmt(k[2])}) | {fmt(v[0])} ({fmt(v[1])}-"
                      f"{fmt(v[2])}) | {bl.ratio_text(row)} | {row['goal']}: **{'met' if row['met'] else 'missed'}** |")
    if results.get("pinned_table"):
        md += ["", "## RTT and bandwidth with one CPU per host (hostA's vsocketd and the client on CPU 0, hostB's "
               "and the server on CPU 1)", "",
               "Above, two daemons and two applications float over two CPUs, so a process of one \"host\" "
               "often waits for a CPU held by the other's, which two real hosts never do, and the RTT "
               "depends on where the scheduler put whom (see the min-max ranges). Here each host has a CPU "
               "of its own (taskset; kernel TCP's client and server placed the same), the faithful model of "
               "two machines. Same run: ping-pong and one iperf3 stream.", "",
               "| metric | kernel TCP | vSocket | vSocket/kernel | goal | fabric check (vSocket) |",
               "|---|--:|--:|--:|---|---|"]
        for row in results["pinned_table"]:
            k, v = row["kernel"], row["vsocket"]
            g = "" if row["met"] is None else f"{row.get('goal', '<= 1')}: **{'met' if row['met'] else 'missed'}**"
            md.append(f"| {row['metric']} | {fmt(k[0])} ({fmt(k[1])}-{fmt(k[2])}) | {fmt(v[0])} ({fmt(v[1])}-{fmt(v[2])}) "
                      f"| {bl.ratio_text(row)} | {g} | valid {row['valid']}/{row['reps']}"
                      f"{held_note(row)} |")
    md += ["", "## Adaptive batching on the fabric link (hostA -> hostB, netload 16 B, vSocket)", "",
           "| connections | frames per writev | payload bytes per writev | 16 B messages per frame | writev/s |",
           "|--:|--:|--:|--:|--:|"]
    for b in results["batching"]:
        md.append(f"| {b['conns']} | {b['frames_per_write']:.1f} | {b['bytes_per_write']:,.0f} | "
                  f"{b['messages_per_frame']:.1f} | {b['writes_per_s']:,.0f} |")
    gw = results.get("guest_wait") or {}
    if gw:
        md += ["", "How the client's library waited in the ping-pong (its info log): default rows "
               f"{', '.join(gw.get('pingpong_16', [])) or '-'}; \"guests made to poll\" rows "
               f"{', '.join(gw.get('pingpong_16_poll', [])) or '-'}."]
    w = results.get("pingpong_wakeups_per_message", {}).get("vsocket")
    if w:
        md += ["", f"Ping-pong, vSocket: vsocketd worker wake-ups from epoll per round trip: hostA {w['hostA']:.2f}, "
               f"hostB {w['hostB']:.2f} (1 = the worker slept before every message)."]
    md += ["", "## CPU seconds per million 16 B messages, by process (netload window, medians)", "",
           "| connections | mode | client | server | vsocketd hostA | vsocketd hostB | sum (table above) "
           "| + machine irq/softirq (not per process) |", "|--:|---|--:|--:|--:|--:|--:|--:|"]
    for c in results["cpu_breakdown"]:
        total = c["client"] + c["server"] + c["hostA"] + c["hostB"]
        md.append(f"| {c['conns']} | {c['mode']} | {c['client']:.2f} | {c['server']:.2f} | {c['hostA']:.2f} | "
                  f"{c['hostB']:.2f} | {total:.2f} | {c['softirq']:.2f} |")
    md += ["", "## Fabric proof per vSocket measurement (every repetition)", "",
           "| rep | measurement | app bytes | fabric bytes A->B + B->A | remote_upgrades A/B | valid |",
           "|--:|---|--:|--:|--:|---|"]
    for i, rep in enumerate(results["reps"]):
        for meas, r in fabric_runs(rep["vsocket"]):
            f = r["fabric"]
            md.append(f"| {i} | {meas} | {r['app_bytes']:,} | {f['hostA_fabric_bytes_out']:,} + "
                      f"{f['hostB_fabric_bytes_out']:,} | {f['hostA_remote_upgrades']}/{f['hostB_remote_upgrades']} "
                      f"| {'yes' if r['valid'] else '**INVALID**'} |")
    md += ["", "## Machine load (the machine is shared: other tests ran alongside)", "",
           "| rep | mode | whole machine busy, mean over measurements (CPUs of "
           f"{results['cpus']}) | whole machine busy in the 16 B windows, 1 / 64 conns | of which ours "
           "(client + server + 2 vsocketd), 1 / 64 conns |",
           "|--:|---|--:|--:|--:|"]
    for i, rep in enumerate(results["reps"]):
        for mode in ("kernel", "vsocket"):
            busy = [r["fabric"].get("machine_busy_cpus", 0) for _, r in fabric_runs(rep[mode])]
            runs = [rep[mode][m] for m in ("rate_16_c1", "rate_16_c64")]
            mb = [r.get("machine_busy_cpus_window", float("nan")) for r in runs]
            ours = [sum(r.get("cpu_s", {}).values()) / max(1e-3, r.get("window_s", 1)) for r in runs]
            md.append(f"| {i} | {mode} | {statistics.mean(busy):.2f} | {mb[0]:.2f} / {mb[1]:.2f} | "
                      f"{ours[0]:.2f} / {ours[1]:.2f} |")
    kernel_fabric = sum(r["fabric"]["fabric_bytes"] for rep in results["reps"] for _, r in fabric_runs(rep["kernel"]))
    md += ["", f"Kernel TCP measurements moved {kernel_fabric} bytes over the fabric (must be 0)."]
    return "\n".join(md) + "\n"


def plot(results, base):
    t = results["table"]
    lat = [r for r in t if r["metric"].startswith(("RTT", "connect"))]
    bl.plot_histogram(base, "latency", "vSocket vs kernel TCP, cross host over the tcp fabric (absolute)",
                      "microseconds (lower is better)", [r["metric"] for r in lat],
                      [("kernel TCP", [r["kernel"] for r in lat]), ("vSocket", [r["vsocket"] for r in lat])],
                      logscale=True)
    rates = [r for r in t if not r["metric"].startswith(("RTT", "connect", "CPU"))]
    bl.plot_histogram(base, "rates", "vSocket vs kernel TCP, cross host over the tcp fabric (ratio)",
                      "vSocket / kernel TCP (higher is better)", [r["metric"] for r in rates],
                      [("vSocket / kernel TCP", [r["ratio"] for r in rates])], logscale=True,
                      hline=(1, "kernel TCP = 1"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=bl.DEFAULT_BIN)
    ap.add_argument("--seconds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pinned-reps", type=int, default=3,
                    help="extra ping-pong repetitions with one CPU per host (0: none)")
    ap.add_argument("--out", default=os.path.join(bl.ROOT, "bench/results"))
    ap.add_argument("--no-apps", action="store_true", help="skip redis, nginx, PostgreSQL and socat")
    a = ap.parse_args()
    bed = bl.TwoHostBed(a.bin)
    pg = None
    if not a.no_apps:
        # PostgreSQL runs as the user postgres and reaches vmB1's socket
        # through a group of the run's own (as in same_host_bench).
        sh.add_pg_group(bed, SERVER_VM)
    results = {"date": bl.utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"), "cpus": os.cpu_count(), "machine": bl.machine(),
               "seconds": a.seconds, "reps_n": a.reps, "bin": os.path.abspath(a.bin),
               "binaries": bed.binaries(), "loadavg_before": open("/proc/loadavg").read().split()[0], "reps": [],
               "interleaved": True}
    started = time.monotonic()
    bed.up(CLIENT_VM, SERVER_VM)
    if not a.no_apps:
        pg = sh.Postgres(bed, bed.lib)
        err = pg.init()
        if err:
            print("PostgreSQL rows skipped: " + err, flush=True)
    try:
        for i in range(a.reps):
            modes = [("kernel", False), ("vsocket", "auto")]
            print(f"== rep {i}", flush=True)
            results["reps"].append(run_rep(bed, a.seconds, 12000 + 100 * i, modes if i % 2 == 0 else modes[::-1], pg))
        results["pinned"] = pinned_rtt(bed, a.pinned_reps, a.seconds)
    finally:
        bed.down()
        if pg is not None:
            pg.remove()
        if not a.no_apps:
            sh.remove_pg_group()
    results["loadavg_after"] = open("/proc/loadavg").read().split()[0]
    results["wall_s"] = round(time.monotonic() - started, 1)
    summarize(results)
    text = markdown(results)
    latest = bl.save_results(a.out, "cross-host", results, text)
    print(text)
    plot(results, latest)
    print(f"{results['wall_s']} s")


if __name__ == "__main__":
    main()
