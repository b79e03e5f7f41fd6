"""libFuzzer targets. Build with --config=fuzz for coverage-guided fuzzing;
without it the binary still links libFuzzer's driver and replays a corpus."""

def vs_fuzz_target(name, srcs, deps):
    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps,
        linkopts = ["-fsanitize=fuzzer"],
        visibility = ["//visibility:public"],
    )
