#!/usr/bin/env python3
"""Generates the headline tables of docs/benchmarks.md from the latest
results in bench/results/, so that no table in the docs is typed by hand.

  bench/render_docs.py            rewrite docs/benchmarks.md in place
  bench/render_docs.py --check    exit 1 (with a diff) if it is not what the
                                  results give; //bench:benchmarks_doc_test

Each generated block sits between `<!-- generated: NAME -->` and
`<!-- end generated -->` and starts with the date and the machine of the
run, as the result file records them. Everything outside the markers is
left alone. Blocks: channel (channel-latest.md), same-host, cross-host,
conn-scale and quick (NAME-latest.json), days (days.json), and the
Markdown tables other scripts write (directory, direct, migration, vm).
"""
import argparse
import difflib
import json
import os
import re
import sys

from benchlib import ratio_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench/results")
DOC = os.path.join(ROOT, "docs/benchmarks.md")
BLOCK = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end generated -->)", re.S)


# ---- formatting ---------------------------------------------------------------------


def num(x):
    """1,234,567 / 123.4 / 1.23: thousands as integers, else 3-4 figures."""
    if x != x:  # NaN
        return "–"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def label(metric):
    return metric.replace("(us)", "(µs)")


def goal(text):
    return text.replace("<=", "≤").replace(">=", "≥")


def spread(median, lo, hi):
    """median, and (min–max) when the repetitions differ."""
    if lo == hi:
        return num(median)
    return f"{num(median)} ({num(lo)}–{num(hi)})"


RATIO_NOTE = (" (vSocket/kernel: the median, and min–max, of the repetitions' own ratios, each vSocket run "
              "against the kernel TCP run next to it)")


def paired(rows):
    """Whether a result's ratios are the median of per-repetition ratios."""
    return any("ratio_range" in r for r in rows)


def rtext(row):
    return ratio_text(row, dash="–", nan="–")


def when_where(res, source):
    """The first line of every block: when, on what, from which file. A date
    may carry a note in parentheses (where it came from)."""
    date = res.get("date", "?")
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)[.0-9]*Z?(.*)", date)
    if m:
        date = m.group(1) + "Z" + m.group(2)
    mach = res.get("machine")
    if isinstance(mach, str):
        where = mach
    elif mach:
        where = f"{mach['hostname']} ({mach['cpu_model'] or 'CPU model unknown'}, {mach['cpus']} CPUs, " \
                f"Linux {mach['kernel']})"
    else:
        where = f"a {res.get('cpus', '?')}-CPU machine (host name, CPU model and kernel not recorded by this run)"
    return f"Measured {date} on {where}; from `bench/results/{source}`."


def load(name):
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


# ---- the blocks ---------------------------------------------------------------------


def channel():
    """channel-latest.md: channel_bench's table, then `date:` and `machine:`
    lines that bench/run_channel_bench.sh appends."""
    text = open(os.path.join(RESULTS, "channel-latest.md")).read()
    lines = text.splitlines()
    res = dict(re.findall(r"^(date|machine): (.*)$", text, re.M))
    m = re.search(r"(\d+) CPUs", lines[0])
    res["cpus"] = m.group(1) if m else "?"
    out = [when_where(res, "channel-latest.md"), "",
           "| measurement | raw SPSC ring | channel, polling | channel, eventfd |", "|---|--:|--:|--:|"]
    for line in [l for l in lines if l.startswith("|")][2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        vals = [num(float(c)) if re.fullmatch(r"[0-9.]+", c) else c for c in cells[1:]]
        out.append(f"| {label(cells[0])} | " + " | ".join(vals) + " |")
    out.append("")
    out += [f"- {l.strip()}" for l in lines if l.startswith(("channel/raw", "vsocketd CPU"))]
    return out


def same_host():
    res = load("same-host-latest.json")
    out = [when_where(res, "same-host-latest.json") + " Kernel TCP and vSocket in the same run.",
           f"{res.get('reps_n', 1)} repetitions of {res.get('seconds', '?')} s per test, "
           f"{'the modes alternating per test' if res.get('interleaved') else 'modes in turn'}, medians "
           f"(min–max){RATIO_NOTE if paired(res['table']) else ''}; load average {res.get('loadavg_before', '?')} "
           f"before, {res.get('loadavg_after', '?')} after. "
           "vSocket: the default upgrade policy (what a user gets); *--upgrade always*: every connection "
           "accelerated (the accelerated path's own cost).", "",
           "| metric | kernel TCP | vSocket | vSocket/kernel | do-no-harm goal |", "|---|--:|--:|--:|---|"]
    for r in res["table"]:
        g = f"{goal(r['goal'])}: **{'met' if r['met'] else 'missed'}**" if r.get("goal") else ""
        name = label(r["metric"]).replace(", --upgrade always", ", *--upgrade always*")
        out.append(f"| {name} | {spread(r['kernel'], *r['kernel_range'])} "
                   f"| {spread(r['vsocket'], *r['vsocket_range'])} | {rtext(r)} | {g} |")
    rows = {r["metric"]: r for r in res["table"]}
    base = rows.get("socat 1 GiB one way (Gbit/s)")
    big = rows.get("socat 1 GiB one way, 512 KiB rings (Gbit/s)")
    if base and big and base.get("vsocket") and big.get("vsocket"):
        out += ["", f"What holding the sender's ring costs (issue 16: a byte stays in its sender's ring until "
                f"the receiving library consumed it, so that a vsocketd restart loses nothing): socat through "
                f"vSocket moved {num(big['vsocket'])} Gbit/s with 512 KiB rings — as many bytes in flight as "
                f"freeing the ring at the copy would allow — against {num(base['vsocket'])} with the default "
                f"256 KiB ({big['vsocket'] / base['vsocket']:.2f}x; medians of this run)."]
    return out


def held_note(row):
    """A row whose vSocket runs all stayed on kernel TCP by the default
    policy: request/response held (decision 51), a bulk stream kept off the
    tcp fabric (decision 62)."""
    return " (kernel TCP: kept there by the default policy)" if row.get("paths") == ["kernel"] else ""


def cross_host():
    res = load("cross-host-latest.json")
    out = [when_where(res, "cross-host-latest.json"),
           f"{res['reps_n']} repetitions of {res['seconds']} s per test, kernel TCP and vSocket alternating"
           f"{' per test' if res.get('interleaved') else ' per repetition'}, "
           f"medians (min–max){RATIO_NOTE if paired(res['table']) else ''}; load average {res['loadavg_before']} "
           f"before, {res['loadavg_after']} after.", ""]
    out += ["| metric | kernel TCP | vSocket | vSocket/kernel | goal | vSocket runs valid (fabric check) |",
            "|---|--:|--:|--:|---|--:|"]
    for r in res.get("pinned_table") or []:
        k, v = r["kernel"], r["vsocket"]
        g = "" if r["met"] is None else f"{goal(r.get('goal', '<= 1'))}: **{'met' if r['met'] else 'missed'}**"
        held = held_note(r)
        name = label(r["metric"])
        unit = name.rindex(" (")
        out.append(f"| {name[:unit]}, one CPU per host{name[unit:]} | {spread(*k)} "
                   f"| {spread(*v)} | {rtext(r)} | {g} | {r['valid']}/{r['reps']}{held} |")
    for r in res["table"]:
        g = ""
        if r["goal"]:
            g = f"{goal(r['goal'])}: **{'met' if r['met'] else 'missed'}**"
        name = label(r["metric"])
        if r["measurement"] == "pingpong_16":
            name = name.replace(" (µs)", ", all floating (µs)")
        held = held_note(r)
        out.append(f"| {name} | {spread(r['kernel'], *r['kernel_range'])} "
                   f"| {spread(r['vsocket'], *r['vsocket_range'])} | {rtext(r)} | {g} "
                   f"| {r['vsocket_valid_reps']}/{r['reps']}{held} |")
    if res.get("apps_table"):
        out += ["", "Applications, client in vmA1 and server in vmB1, default policy (same runners as on one host):",
                "", "| metric | kernel TCP | vSocket | vSocket/kernel | do-no-harm goal |", "|---|--:|--:|--:|---|"]
        for r in res["apps_table"]:
            out.append(f"| {label(r['metric'])} | {spread(*r['kernel'])} | {spread(*r['vsocket'])} "
                       f"| {rtext(r)} | {goal(r['goal'])}: **{'met' if r['met'] else 'missed'}** |")
    if res.get("batching"):
        out += ["", "Adaptive batching on the fabric link (hostA → hostB, netload 16 B, vSocket):", "",
                "| connections | frames per writev | payload bytes per writev | 16 B messages per frame | writev/s |",
                "|--:|--:|--:|--:|--:|"]
        for b in res["batching"]:
            out.append(f"| {b['conns']} | {b['frames_per_write']:.1f} | {b['bytes_per_write']:,.0f} "
                       f"| {b['messages_per_frame']:.1f} | {b['writes_per_s']:,.0f} |")
    return out


# Rows of the memory table: (label, memory key prefix).
MEMORY_ROWS = [("vsocketd, hostA", "vsocketd hostA"), ("vsocketd, hostB", "vsocketd hostB"),
               ("guest clients (vmA1)", "guest clients (vmA1)"), ("guest servers (vmB1)", "guest servers (vmB1)")]


def conn_scale():
    res = load("conn-scale-latest.json")
    out = [when_where(res, "conn-scale-latest.json"), "",
           "| run | connections | result | wall time (s) |", "|---|--:|---|--:|"]
    for r in res["runs"]:
        what = f"ring {r['ring_kb']} KiB" if r["accel"] else "kernel TCP, no preload"
        t = r["steps"][-1]["t_s"] if r.get("steps") else float("nan")
        out.append(f"| {what} | {r['conns']:,} | {'OK' if r['ok'] else '**FAILED**'} | {num(t)} |")
    # The last successful run of each configuration.
    last = {}
    for r in res["runs"]:
        if r["ok"] and r.get("memory"):
            last[r["ring_kb"] if r["accel"] else None] = r
    rings = sorted(k for k in last if k is not None)
    if not rings:
        return out
    cols = [f"ring {k} KiB" for k in rings] + (["kernel TCP"] if None in last else [])
    out += ["", "Memory per connection, bytes (RSS delta / connections): private (RssAnon) / guest ring pages "
            "touched (RssShmem); kernel TCP: VmRSS.", "",
            "| process | when | " + " | ".join(cols) + " |", "|---|---|" + "--:|" * len(cols)]
    for name, key in MEMORY_ROWS:
        for when in ("idle", "after the message"):
            cells = []
            for k in rings:
                m = last[k]["memory"].get(f"{key}, {when}", {})
                cells.append(f"{m.get('RssAnon', 0):,.0f} / {m.get('RssShmem', 0):,.0f}")
            if None in last:
                m = last[None]["memory"].get(f"{key}, {when}", {})
                cells.append(f"{m.get('VmRSS', 0):,.0f}")
            out.append(f"| {name} | {when} | " + " | ".join(cells) + " |")
    return out


def quick():
    res = load("quick-latest.json")
    out = [when_where(res, "quick-latest.json") + f" Kernel TCP and vSocket alternating, median of {res['reps']}"
           f"{RATIO_NOTE if paired(res['table']) else ''}.", "",
           "| metric | kernel TCP | vSocket | vSocket/kernel | do-no-harm goal |", "|---|--:|--:|--:|---|"]
    for r in res["table"]:
        out.append(f"| {label(r['metric'])} | {num(r['kernel'])} | {num(r['vsocket'])} | {rtext(r)} "
                   f"| {goal(r['goal'])}: **{'met' if r['ok'] else 'missed'}** |")
    daemon = [R["daemon"] for R in res["vsocket"] if "daemon" in R]
    if daemon:
        out += ["", "What vsocketd counted during the vSocket repetitions: " + "; ".join(
            f"{d['upgrades']} upgrades, {d['accel_bytes'] / 1e6:.1f} MB accelerated, "
            f"{d['rejected_spoofed'] + d['rejected_unproven'] + d['rejected_other']} registrations refused"
            for d in daemon) + "."]
    return out


def meets(ratio, goal_text):
    """Whether a ratio meets a goal written "<= 1.2" or ">= 1"."""
    op, limit = goal_text.split()
    return ratio == ratio and (ratio <= float(limit) if op == "<=" else ratio >= float(limit))


def days():
    """The goal rows of each benchmark, day by day (bench/results/days.json:
    the last run of each UTC day), the last three days, and whether the
    last two both met each goal (the issue's "reproduced on two days")."""
    record = load("days.json")
    out = ["From `bench/results/days.json`: each benchmark records its last run of each UTC day and the commit it "
           "ran on (`git describe`; for the days before 2026-11-28, taken from the results' git history, the commit "
           "that committed the result). A day's figure is the ratio vSocket/kernel TCP of that day's run under the "
           "default policy (what a user gets), judged against the goal as it stands now; older days ran older code.", ""]
    titles = {"same-host": "Same host (`bench/same_host_bench.py`)", "cross-host": "Across hosts "
              "(`bench/cross_host_bench.py`)", "quick": "The guard (`bench/quick.sh`)"}
    for name in ("same-host", "cross-host", "quick"):
        per_day = record.get(name) or {}
        shown = sorted(per_day)[-3:]
        if not shown:
            continue
        last = per_day[shown[-1]]["rows"]
        by_day = {d: {r["metric"]: r for r in per_day[d]["rows"]} for d in shown}
        out += [f"{titles[name]}, runs of " + ", ".join(f"{d} ({per_day[d]['date'][11:16]} UTC, "
                                                          f"{per_day[d]['commit']})" for d in shown) + ":", "",
                "| metric | goal | " + " | ".join(shown) + " | the last two days |",
                "|---|---|" + "--:|" * len(shown) + "---|"]
        for r in last:
            cells, mets = [], []
            for d in shown:
                x = by_day[d].get(r["metric"])
                if x is None or x.get("ratio") is None:
                    cells.append("–")
                    mets.append(None)
                else:
                    # Against today's goal (a benchmark's goals may have been
                    # restated since: cross-host p99, 2026-11-28).
                    met = meets(x["ratio"], r["goal"])
                    cells.append(f"{x['ratio']:.2f}{'' if met else ' (missed)'}")
                    mets.append(met)
            two = mets[-2:]
            verdict = ("–" if len(two) < 2 or None in two else "**met both**" if all(two) else
                       "missed on " + ", ".join(d for d, m in zip(shown[-2:], two) if not m))
            out.append(f"| {label(r['metric'])} | {goal(r['goal'])} | " + " | ".join(cells) + f" | {verdict} |")
        out.append("")
    return out[:-1]


def placement():
    res = load("placement-latest.json")
    out = [when_where(res, "placement-latest.json") + f" vsocketd on CPU {res['daemon_cpus']} (`VSOCKET_CPUS`: its "
           f"worker polls), the applications of both VMs on CPU {res['app_cpus']}; kernel TCP with the applications on "
           f"the same CPUs in the same run, and with them free to run anywhere for reference. {res['reps_n']} "
           f"repetitions of {res['seconds']} s per test, the modes alternating; medians (min–max){RATIO_NOTE}.", "",
           "| metric | kernel TCP, same CPUs | vSocket | vSocket/kernel | production goal | kernel TCP, any CPU "
           "| vSocket/that |", "|---|--:|--:|--:|---|--:|--:|"]
    for r in res["table"]:
        g = f"{goal(r['goal'])}: **{'met' if r['met'] else 'missed'}**" if r.get("goal") else ""
        out.append(f"| {label(r['metric'])} | {spread(r['kernel'], *r['kernel_range'])} "
                   f"| {spread(r['vsocket'], *r['vsocket_range'])} | {rtext(r)} | {g} "
                   f"| {spread(r['kernel_anywhere'], *r['kernel_anywhere_range'])} | {num(r['ratio_anywhere'])} |")
    upg = [R["daemon"].get("upgrades", 0) for R in res["reps"]["vsocket"]]
    out += ["", f"vsocketd counted {min(upg)}-{max(upg)} upgrades per vSocket repetition (every connection "
            "accelerated: the daemon has a CPU of its own, decision 51)."]
    return out


def directory():
    """directory-load-latest.md (bench/directory_load.py): its line saying
    when and on what, and its table."""
    text = open(os.path.join(RESULTS, "directory-load-latest.md")).read()
    lines = text.splitlines()
    when = next((l for l in lines if l and not l.startswith(("#", "|"))), "")
    return [f"{when} From `bench/results/directory-load-latest.md`.", ""] + [l for l in lines if l.startswith("|")]


def direct():
    """direct-latest.md (bench/direct_bench.py): its line saying when and on
    what, and its table."""
    text = open(os.path.join(RESULTS, "direct-latest.md")).read()
    lines = text.splitlines()
    when = next((l for l in lines if l and not l.startswith(("#", "|"))), "")
    return [f"{when} From `bench/results/direct-latest.md`.", ""] + [l for l in lines if l.startswith("|")]


def migration():
    """migration-latest.md (bench/migration_bench.sh): its whole text (the
    line saying when and on what, the table, the per-migration line)."""
    text = open(os.path.join(RESULTS, "migration-latest.md")).read().strip()
    return text.splitlines() + ["", "From `bench/results/migration-latest.md`."]


def vm():
    """vm-latest.md (bench/vm_bench.sh): its whole text (the line saying
    when and on what, the table, the line on what was accelerated)."""
    text = open(os.path.join(RESULTS, "vm-latest.md")).read().strip()
    return text.splitlines() + ["", "From `bench/results/vm-latest.md`."]


BLOCKS = {"channel": channel, "same-host": same_host, "cross-host": cross_host, "conn-scale": conn_scale,
          "quick": quick, "days": days, "placement": placement, "directory": directory,
          "direct": direct, "migration": migration, "vm": vm}


def render(doc):
    seen = set()

    def block(m):
        name = m.group(2)
        if name not in BLOCKS:
            raise SystemExit(f"docs/benchmarks.md: unknown generated block '{name}' (known: {', '.join(BLOCKS)})")
        seen.add(name)
        return m.group(1) + "\n".join(BLOCKS[name]()) + "\n" + m.group(4)

    out = BLOCK.sub(block, doc)
    missing = set(BLOCKS) - seen
    if missing:
        raise SystemExit(f"docs/benchmarks.md: no generated block for {', '.join(sorted(missing))}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 if different")
    a = ap.parse_args()
    doc = open(DOC).read()
    new = render(doc)
    if not a.check:
        if new != doc:
            with open(DOC, "w") as f:
                f.write(new)
            print("docs/benchmarks.md: tables regenerated")
        return 0
    if new == doc:
        print("docs/benchmarks.md: tables match bench/results/")
        return 0
    sys.stdout.writelines(difflib.unified_diff(doc.splitlines(True), new.splitlines(True),
                                               "docs/benchmarks.md (committed)", "docs/benchmarks.md (rendered)"))
    print("docs/benchmarks.md differs from what bench/results/ give: run bench/render_docs.py")
    return 1


if __name__ == "__main__":
    sys.exit(main())
