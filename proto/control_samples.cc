#include "proto/control_samples.h"

namespace vsocket::proto {

const std::vector<Message>& SampleMessages() {
  static const uint8_t kPayload[] = {'p', 'i', 'n', 'g', 0, 1, 2, 3};
  static const std::vector<Message> kSamples = [] {
    Endpoint local{Family::kIpv4, {192, 0, 2, 1}, 40000};
    Endpoint peer{Family::kIpv4, {192, 0, 2, 2}, 6379};
    Endpoint local6{Family::kIpv6, {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 1};
    Endpoint peer6 = local6;
    peer6.addr[15] = 2;
    return std::vector<Message>{
        {MsgType::kHello, 1, Hello{1, 0, 4242, 0x3}},
        {MsgType::kHelloAck, 1, HelloAck{WireError::kOk, 7, 4096, 64, 0x3}},
        {MsgType::kRegisterConn, 2, RegisterConn{11, Role::kClient, local, peer, 0x10000, 0x20000, 65536, 65536}},
        {MsgType::kRegisterConn, 3,
         RegisterConn{12, Role::kServer, local6, peer6, 0x40000, 0x80000, 4096, 1u << 20, kRegisterBulk}},
        {MsgType::kRegisterAck, 2, RegisterAck{11, WireError::kOk, Reason::kPending, 65536}},
        {MsgType::kUpgrade, 0, Upgrade{11, 65536, 64}},
        {MsgType::kFence, 4, ConnCounter{11, 12345}},
        {MsgType::kTxTail, 5, ConnCounter{11, 1ull << 40}},
        {MsgType::kRxTail, 0, ConnCounter{11, 77}},
        {MsgType::kConsumed, 6, ConnCounter{11, 64}},
        {MsgType::kPairingQuery, 9, ConnCounter{11, 0}},
        {MsgType::kCredit, 0, ConnCounter{11, 64}},
        {MsgType::kShutdown, 7, Shutdown{11, ShutdownHow::kWrite}},
        {MsgType::kDowngrade, 8, Downgrade{11, Reason::kMigration, 999, 0}},
        {MsgType::kDowngrade, 9, Downgrade{12, Reason::kFabricDown, 4096, kDowngradeFenceAcked}},
        {MsgType::kError, 0, Error{11, WireError::kCreditViolation, Reason::kProtocolError}},
        {MsgType::kEcho, 9, Echo{Crc32c(kPayload), kPayload}},
        {MsgType::kUnregister, 10, Unregister{11}},
        {MsgType::kRegisterAck, 10, RegisterAck{11, WireError::kOk, Reason::kRingsHeld, 0}},
        {MsgType::kRingsReleased, 0, ConnCounter{11, 0}},
        {MsgType::kFenceDelivered, 0, ConnCounter{11, 4096}},
        {MsgType::kDirect, 0, ConnCounter{11, 0x5eed5eed5eed5eedull}},
        {MsgType::kVouch, 11, Vouch{0x1a0000, local, peer}},
        {MsgType::kLimitMemory, 12, [] {
           LimitMemory l{0x1a0000, 2, {}};
           l.ranges[0] = {0x1a00000, 0x400000};
           l.ranges[1] = {0x40000000, 0x200000};
           return l;
         }()},
    };
  }();
  return kSamples;
}

}  // namespace vsocket::proto
