#!/usr/bin/env python3
"""The application table of docs/socket-compatibility.md, made from the
suite that proves it (issue 34: the application matrix).

Each application case file of the same-host suite (tests/e2e/same_host/*.sh)
says what it runs in lines of the form

    # app: APPLICATION | WHAT RUNS | WHAT IS CHECKED | CASE

and registers CASE_auto (the default policy) and CASE_always
(--upgrade always). The table has a row per such line; a line whose two
cases are not both registered is an error (every application case runs
under both policies).

  app_table.py            print the table
  app_table.py --check    exit 1 (with a diff) unless the document's table,
                          between its app-table markers, is that table
  app_table.py --write    put the table into the document
Paths are relative to the repository root (or to the runfiles: the test).
"""
import difflib
import glob
import os
import re
import sys

DOC = "docs/socket-compatibility.md"
BEGIN = "<!-- app-table begin: tests/e2e/apps/app_table.py --write -->"
END = "<!-- app-table end -->"
APP = re.compile(r"^# app: (.*)$")
REG = re.compile(r"^register_case (\S+)")


def rows(root="."):
    out, errors = [], []
    files = sorted(glob.glob(os.path.join(root, "tests/e2e/same_host/*.sh")))
    registered = set()
    apps = []
    for f in files:
        for line in open(f):
            m = REG.match(line)
            if m:
                registered.add(m.group(1))
            m = APP.match(line.rstrip("\n"))
            if m:
                parts = [p.strip() for p in m.group(1).split("|")]
                if len(parts) != 4:
                    errors.append(f"{os.path.basename(f)}: '# app:' wants 4 fields: {line.strip()}")
                    continue
                apps.append((os.path.basename(f), parts))
    for f, (app, runs, checked, case) in apps:
        missing = [f"{case}_{p}" for p in ("auto", "always") if f"{case}_{p}" not in registered]
        if missing:
            errors.append(f"{f}: {app}: not registered: {', '.join(missing)}")
        out.append(f"| {app} | {runs} | {checked} | `{case}_auto`, `{case}_always` |")
    if not files:
        errors.append("no case files under tests/e2e/same_host")
    return out, errors


def table(root="."):
    body, errors = rows(root)
    head = ["| application | what runs | what is checked (besides the reports of both ends) | cases |",
            "|---|---|---|---|"]
    return "\n".join(head + body) + "\n", errors


def current(doc_text):
    if BEGIN not in doc_text or END not in doc_text:
        return None
    start = doc_text.index(BEGIN) + len(BEGIN) + 1
    return doc_text[start:doc_text.index(END)]


def main():
    root = os.environ.get("APP_TABLE_ROOT", ".")
    want, errors = table(root)
    for e in errors:
        print("error:", e)
    doc_path = os.path.join(root, DOC)
    if "--write" in sys.argv:
        text = open(doc_path).read()
        if current(text) is None:
            print(f"error: {DOC} has no app-table markers")
            return 1
        start = text.index(BEGIN) + len(BEGIN) + 1
        open(doc_path, "w").write(text[:start] + want + text[text.index(END):])
        return 1 if errors else 0
    if "--check" in sys.argv:
        have = current(open(doc_path).read())
        if have is None:
            print(f"error: {DOC} has no app-table markers")
            return 1
        if have != want:
            sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), want.splitlines(True), DOC, "generated"))
            print(f"{DOC}'s application table is not the suite's: run tests/e2e/apps/app_table.py --write")
            return 1
        return 1 if errors else 0
    sys.stdout.write(want)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
