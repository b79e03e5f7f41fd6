#!/bin/bash
# The lock rules are checked: every CASE_n of thread_safety_violations.cc
# fails to compile with the message its "expect:" comment names, and the
# file without a case compiles cleanly (clang; the build's own flags).
set -u
dir=$(dirname "$0")
src="$dir/thread_safety_violations.cc"
[[ -f $src ]] || src=base/thread_safety_violations.cc
cxx=${CXX:-clang++}
flags=(-std=c++20 -fsyntax-only -Wthread-safety -Werror=thread-safety -I "$(dirname "$src")/..")
fail=0

if ! out=$("$cxx" "${flags[@]}" "$src" 2>&1); then
  echo "FAIL: the file without a violation does not compile:"
  echo "$out"
  fail=1
fi
cases=$(grep -o 'CASE_[0-9]*  // expect: .*' "$src")
[[ -n $cases ]] || { echo "FAIL: no cases in $src"; exit 1; }
while IFS= read -r line; do
  case=${line%%  *}
  expect=${line#*expect: }
  if out=$("$cxx" "${flags[@]}" -D"$case" "$src" 2>&1); then
    echo "FAIL: $case compiled; expected: $expect"
    fail=1
  elif ! grep -qF "error: $expect" <<<"$out"; then
    echo "FAIL: $case failed, but not with: $expect"
    echo "$out"
    fail=1
  else
    echo "ok: $case: $(grep -F "error: $expect" <<<"$out" | head -1)"
  fi
done <<<"$cases"
exit $fail
