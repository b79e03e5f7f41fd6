"""docs/socket-compatibility.md's application table is the one
tests/e2e/apps/app_table.py makes of the same-host suite, and every
application case there runs under both policies. Prints a GoogleTest-style
summary so that tests/run_all.sh counts it as one case."""
import sys

import app_table


def main():
    print("[ RUN      ] AppTable.DocumentIsTheSuites", flush=True)
    sys.argv = [sys.argv[0], "--check"]
    ok = app_table.main() == 0
    print(f"[{'       OK' if ok else '  FAILED '} ] AppTable.DocumentIsTheSuites")
    print("[==========] 1 test from 1 test suite ran.")
    print(f"[  {'PASSED' if ok else 'FAILED'}  ] 1 test.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
