"""Compiler flags for translation units that include DPDK headers."""

DPDK_COPTS = [
    "-march=corei7",
    "-include",
    "rte_config.h",
    "-DALLOW_EXPERIMENTAL_API",
    # rte_spinlock.h and friends use volatile in ways C++20 deprecates.
    "-Wno-deprecated-volatile",
    "-Wno-volatile",
    "-Wno-unknown-warning-option",
    "-Wno-zero-length-array",
    "-Wno-gnu-zero-variable-length-array",
]
