#!/usr/bin/env python3
"""daemon_view.py counts|who [PORT...] | counter NAME < STATS-JSON (deploy/testbed.sh status):

  counts  "CONNS DEVICES ACTIVE REGISTERED UPGRADES": the connections
          vsocketd tracks to or from those ports (any mode; every one
          without ports), the devices (attached guest processes) of vm1 and
          vm2, and the counters active, registered and upgrades
          (-1 -1 -1 -1 -1 if the JSON cannot be read);
  who     those connections by VM, end (server: the local port is one of
          PORTs) and mode/reason: "vm2 server end accelerated/accelerated x33".
"""
import collections
import json
import sys

what = sys.argv[1]
text = sys.stdin.read()
try:
    d = json.loads(text[text.index("{"):])
except Exception:
    print({"counts": "-1 -1 -1 -1 -1", "counter": "-1"}.get(what, "(no stats)"))
    sys.exit()
if what == "counter":
    print(d.get("conn_counters", {}).get(sys.argv[2], -1))
    sys.exit()
ports = {int(p) for p in sys.argv[2:]}


def port(ep):
    return int(ep.rsplit(":", 1)[1])


conns = [c for c in d.get("connections", []) if not ports or port(c["local"]) in ports or port(c["peer"]) in ports]
if what == "counts":
    devs = sum(1 for v in d.get("devices", []) if v.get("vm") in ("vm1", "vm2"))
    cc = d.get("conn_counters", {})
    print(len(conns), devs, cc.get("active", -1), cc.get("registered", -1), cc.get("upgrades", -1))
else:
    n = collections.Counter(
        "%s %s end %s/%s" % (c["vm"], "server" if port(c["local"]) in ports else "client", c["mode"], c["reason"])
        for c in conns)
    print(", ".join(f"{k} x{v}" for k, v in sorted(n.items())))
