"""libFuzzer targets. Build with --config=fuzz for coverage-guided fuzzing;
without it the binary still links libFuzzer's driver and replays a corpus."""

def vs_fuzz_target(name, srcs, deps, copts = [], testonly = False):
    native.cc_binary(
        name = name,
        srcs = srcs,
        copts = copts,
        deps = deps,
        linkopts = ["-fsanitize=fuzzer"],
        testonly = testonly,
        visibility = ["//visibility:public"],
    )
