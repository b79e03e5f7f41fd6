"""docs/benchmarks.md's generated tables equal what bench/render_docs.py makes
of the committed bench/results/ files. Prints a GoogleTest-style summary so
that tests/run_all.sh counts it as one case."""
import sys

import render_docs


def main():
    print("[ RUN      ] BenchmarksDoc.TablesMatchResults", flush=True)
    doc = open(render_docs.DOC).read()
    ok = render_docs.render(doc) == doc
    if not ok:
        sys.argv = [sys.argv[0], "--check"]
        render_docs.main()  # prints the diff
    print(f"[{'       OK' if ok else '  FAILED '} ] BenchmarksDoc.TablesMatchResults")
    print("[==========] 1 test from 1 test suite ran.")
    print(f"[  {'PASSED' if ok else 'FAILED'}  ] 1 test.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
