#!/usr/bin/env python3
"""Compares two guest RAM images (QMP pmemsave) page by page.

Usage: compare_ram.py SOURCE DESTINATION [--describe N] [--save DIR]

Prints one line on stdout, "PAGES DIFFERING FIRST...": the 4 KiB pages
compared, how many differ, and the guest-physical addresses of the first 12
that differ (0x...), or "-" for none. On stderr, for the first N differing
pages (default 3), the byte runs that differ, source against destination
(tests/vm/migrate.sh, tests/vm/migrate_hosts.sh). --save DIR: the first
64 differing pages of both, as DIR/src-0xADDR.page and DIR/dst-0xADDR.page,
for a failed case's files (the whole images are too large to keep).
"""
import argparse
import os
import sys

PAGE = 4096


def runs_of(x, y):
    runs, i = [], 0
    while i < len(x):
        if x[i] != y[i]:
            j = i
            while j < len(x) and x[j] != y[j]:
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    return runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("destination")
    ap.add_argument("--describe", type=int, default=3)
    ap.add_argument("--save")
    args = ap.parse_args()
    pages, diff = 0, []
    with open(args.source, "rb") as a, open(args.destination, "rb") as b:
        while True:
            x, y = a.read(PAGE), b.read(PAGE)
            if not x and not y:
                break
            if x != y:
                diff.append(pages)
                if args.save and len(diff) <= 64:
                    os.makedirs(args.save, exist_ok=True)
                    for side, data in (("src", x), ("dst", y)):
                        with open(os.path.join(args.save, "%s-0x%x.page" % (side, pages * PAGE)), "wb") as f:
                            f.write(data)
                if len(diff) <= args.describe and len(x) == len(y):
                    runs = runs_of(x, y)
                    desc = ", ".join("+0x%x..0x%x src %s dst %s" % (i, j, x[i:min(j, i + 16)].hex(), y[i:min(j, i + 16)].hex())
                                     for i, j in runs[:6])
                    print("  page 0x%x: %d bytes differ in %d runs: %s" % (pages * PAGE, sum(j - i for i, j in runs),
                                                                         len(runs), desc), file=sys.stderr)
            pages += 1
    print(pages, len(diff), " ".join("0x%x" % (p * PAGE) for p in diff[:12]) or "-")


if __name__ == "__main__":
    main()
