// The sink a fabric link delivers a peer host's frames into.
#pragma once

#include <cstdint>
#include <span>

#include "host-backend/conn/conn_manager.h"
#include "host-backend/fabric/link.h"
#include "proto/fabric.h"

namespace vsocket::backend {

// Routes one link's frames into the manager, remembering between a DATA
// header and its arrival whether the payload was accepted (so each link of
// a host pair has its own: their frames interleave).
class ConnManager::Sink : public fabric::FrameSink {
 public:
  Sink(ConnManager* m, uint32_t host) : m_(m), host_(host) {}
  fabric::PayloadDest OnHeader(const proto::FrameHeader& h) override {
    fabric::PayloadDest d = m_->OnLinkData(host_, h);
    data_ok_ = d.n > 0;
    header_seen_ = true;
    return d;
  }
  fabric::PayloadDest OnResume(const proto::FrameHeader& h, uint32_t landed) override {
    fabric::PayloadDest d = m_->OnLinkDataResume(host_, h, landed);
    data_ok_ = data_ok_ && d.n > 0;
    return d;
  }
  // A new link starts with no frame half-received.
  void Reset() { data_ok_ = header_seen_ = false; }
  uint32_t host() const { return host_; }
  void OnFrame(const proto::FrameHeader& h, std::span<const uint8_t>) override {
    bool via_header = header_seen_;
    header_seen_ = false;
    if (h.type == proto::FrameType::kData) {
      // No OnHeader: the rdma link wrote the payload one-sided into our RX
      // ring (its rkey was ours to give); still checked like any DATA.
      if (!via_header) return m_->OnPlacedData(host_, h);
      if (!data_ok_) return;
    }
    m_->OnLinkFrame(host_, h);
  }

 private:
  ConnManager* m_;
  uint32_t host_;
  bool data_ok_ = false;
  bool header_seen_ = false;  // OnHeader was called for the frame now arriving
};

}  // namespace vsocket::backend
