#!/usr/bin/env python3
"""A minimal QMP client for the VM tests: one command per call.

  qmp.py SOCKET COMMAND [JSON-ARGUMENTS]

Connects to QEMU's QMP socket (-qmp unix:SOCKET,server=on,wait=off),
negotiates capabilities, runs COMMAND and prints its "return" value as
JSON. Exit 1 (the error on stderr) if QEMU answers with an error or does
not answer within 30 s. Events that arrive meanwhile are skipped.
"""
import json
import socket
import sys


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path, command = sys.argv[1], sys.argv[2]
    args = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(path)
    f = s.makefile("rwb")

    def reply():
        while True:
            line = f.readline()
            if not line:
                raise EOFError("QEMU closed the QMP socket")
            msg = json.loads(line)
            if "return" in msg or "error" in msg:
                return msg

    def run(cmd, arguments=None):
        req = {"execute": cmd}
        if arguments is not None:
            req["arguments"] = arguments
        f.write(json.dumps(req).encode() + b"\n")
        f.flush()
        return reply()

    json.loads(f.readline())  # the greeting
    run("qmp_capabilities")
    msg = run(command, args)
    if "error" in msg:
        print("qmp %s: %s" % (command, msg["error"].get("desc", msg["error"])), file=sys.stderr)
        return 1
    print(json.dumps(msg["return"]))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, EOFError, ValueError) as e:
        print("qmp: %s" % e, file=sys.stderr)
        sys.exit(1)
