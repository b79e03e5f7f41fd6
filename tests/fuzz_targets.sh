# Every libFuzzer target, as TARGET:SEED_CORPUS; sourced by tests/fuzz.sh
# and tests/run_all.sh (one list: a new target is added here only).
FUZZ_TARGETS=(
  //proto/fuzz:control_fuzz:proto/fuzz/corpus/control
  //vhost/fuzz:vring_fuzz:vhost/fuzz/corpus/vring
  //proto/fuzz:fabric_fuzz:proto/fuzz/corpus/fabric
  //host-backend/fabric/fuzz:stream_link_fuzz:host-backend/fabric/fuzz/corpus/stream_link
  //host-backend/peering/fuzz:tls_channel_fuzz:host-backend/peering/fuzz/corpus/tls_channel
  //host-backend/remote/fuzz:peer_frames_fuzz:host-backend/remote/fuzz/corpus/peer_frames
  //host-backend/fabric/fuzz:locator_fuzz:host-backend/fabric/fuzz/corpus/locator
  //host-backend/fuzz:config_fuzz:host-backend/fuzz/corpus/config
)
