// The fabric: one link per peer host, shared by every connection of every
// tenant between the two hosts. A link carries proto/fabric.h frames in
// order, never loses one while it is up, and never buffers more than one
// batch: senders only write what the receiver's credit window allows, so the
// receiver always has room and the link needs no queue of its own.
//
// Implementations: StreamLink over kernel TCP (tcp fabric) or over an
// in-memory pipe (the fake, for unit tests), and RdmaLink (rdma fabric).
// host-backend/fabric/link_conformance_test.cc runs one suite against each.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

#include "base/status.h"
#include "proto/fabric.h"

namespace vsocket::fabric {

// Where a DATA frame's payload is to land at the receiver: at most two
// pieces (a ring may wrap). n == 0 discards the payload.
struct PayloadDest {
  iovec iov[2] = {};
  int n = 0;
};

// One-sided targets (RDMA): where the payload goes in the peer's memory.
// Stream links ignore it and let the receiver place the bytes.
struct RemoteBuffer {
  uint64_t addr = 0;
  uint32_t rkey = 0;
};

class FrameSink {
 public:
  virtual ~FrameSink() = default;
  // A frame header arrived (structurally valid, not yet checked against any
  // connection). For DATA, return where its payload lands; a stream link
  // reads the bytes straight there.
  virtual PayloadDest OnHeader(const proto::FrameHeader& h) = 0;
  // A DATA payload that did not fully arrive in one Poll() continues in the
  // next: where its remaining bytes (after the first `landed`) go now. The
  // sink's memory may have moved or gone in between (a device paused and
  // resumed, a guest that exited): a link never keeps a destination across
  // Poll() calls. n == 0 discards the rest.
  virtual PayloadDest OnResume(const proto::FrameHeader& h, uint32_t landed) = 0;
  // The whole frame arrived (a DATA payload has landed). `payload` holds a
  // small control payload (never DATA's).
  virtual void OnFrame(const proto::FrameHeader& h, std::span<const uint8_t> payload) = 0;
};

struct LinkStats {
  std::atomic<uint64_t> frames_out{0};
  std::atomic<uint64_t> frames_in{0};
  std::atomic<uint64_t> data_bytes_out{0};
  std::atomic<uint64_t> data_bytes_in{0};
  std::atomic<uint64_t> write_calls{0};  // syscalls (or work requests) that sent frames
  std::atomic<uint64_t> read_calls{0};
  std::atomic<uint64_t> backlog_bytes{0};  // payload copied because the transport was full
  std::atomic<uint64_t> inplace_bytes{0};  // DATA payload the transport read where the caller had it (rdma)
  std::atomic<uint64_t> busy{0};           // Send refused: link full, caller retries later
};

class Link {
 public:
  virtual ~Link() = default;

  // Queues one frame for the next Flush(). `payload` (DATA only) is read no
  // later than the Flush() that follows; whatever the transport cannot take
  // then is copied, so the caller may reuse the memory after Flush().
  // Returns false, queuing nothing, while the link is full (a batch is
  // waiting for the transport): retry after the link became writable.
  virtual bool Send(const proto::FrameHeader& h, std::span<const iovec> payload,
                    const RemoteBuffer* remote = nullptr) = 0;
  // Hands queued frames to the transport, without blocking. An idle link
  // sends a frame as soon as it is flushed; a busy one coalesces everything
  // queued meanwhile into one write (adaptive batching).
  virtual Status Flush() = 0;
  // Whether Send() would take a frame now.
  virtual bool Writable() const = 0;
  // When the caller's payload memory is its own again. Every frame Send()
  // took is numbered: it got the value NextFrameNumber() had before the
  // call. The link no longer reads the payload memory of frames numbered
  // below ReleasedThrough(). A stream link reads or copies every payload in
  // the Flush() that follows; an rdma link reads payloads in registered
  // memory in place until the frame's work requests complete (an RC
  // retransmission reads them again). Only destroying a link ends every
  // read for certain (a dead rdma link's queue pair lives until then).
  virtual uint64_t NextFrameNumber() const = 0;
  virtual uint64_t ReleasedThrough() const = 0;
  // Reads and dispatches up to `max_frames` frames, without blocking. An
  // error means the link is dead (peer closed, transport error, or a frame
  // that breaks the protocol).
  virtual Status Poll(FrameSink& sink, int max_frames) = 0;
  // Readable when frames (or completions) may be waiting.
  virtual int wake_fd() const = 0;
  // Whether the link waits for its transport to accept more (then sleep on
  // wake_fd for writability too).
  virtual bool WantsWritable() const = 0;

  const LinkStats& stats() const { return stats_; }

 protected:
  LinkStats stats_;
};

// A byte stream a StreamLink runs on. Both calls are non-blocking:
// -1/EAGAIN when nothing can be done now, 0 from Readv at end of stream.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual ssize_t Writev(const iovec* iov, int n) = 0;
  virtual ssize_t Readv(const iovec* iov, int n) = 0;
  virtual int fd() const = 0;
};

// A connected, non-blocking kernel socket.
std::unique_ptr<Transport> MakeFdTransport(int fd);  // takes ownership
// Two ends of an in-memory pipe holding at most `capacity` bytes per
// direction (the fake fabric for unit tests; small capacities exercise
// backpressure). `fd()` is an eventfd that is readable while data waits.
std::pair<std::unique_ptr<Transport>, std::unique_ptr<Transport>> MakeMemoryTransportPair(size_t capacity);

std::unique_ptr<Link> MakeStreamLink(std::unique_ptr<Transport> transport);

}  // namespace vsocket::fabric
