// Transport: the point-to-point layer a communication backend provides.
// Collective algorithms (communicator.h) are written once on top of it, so
// every backend runs the same algorithm in the same order and gives the same
// bits: `local` (ranks are threads of one process, messages pass through
// shared memory) and `mpi` (ranks are processes, messages are MPI_Send/Recv).
//
//   std::vector<std::shared_ptr<Transport>> ranks = make_local_transports(4);
//   // on rank r's thread:
//   ranks[r]->send(peer, tag, data, bytes);  ranks[r]->recv(peer, tag, data, bytes);
//
// Semantics: send and recv are blocking and matched by (source, destination,
// tag); messages between one pair with one tag arrive in order. A send may
// complete before the matching recv is posted (the backend buffers) or wait
// for it (rendezvous); algorithms must not rely on either.
// Sending to oneself is an error; a zero-byte message (data may be null) is
// a valid message that still has to be matched; when send or send_recv
// returns, the send buffer may be reused.
// Threads: several threads of one rank call in at once (each communicator's
// progress thread and the caller), always with different tags. A size mismatch between a matched
// send and recv fails both calls. Failure: abort(reason) on any rank makes every blocked and future
// call on every rank return Status::unavailable("rank R failed: reason"), so no rank hangs when
// another dies. Independently, a call blocked longer than the timeout (comm_timeout_s():
// MESHFLOW_COMM_TIMEOUT_S, default 30 s) fails with a message naming the call, the peer and the
// tag.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshflow/core/status.h"

namespace meshflow {

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;             // in the world
  virtual int size() const = 0;             // world size
  virtual std::string backend() const = 0;  // "local" | "mpi"

  // Tags: the communicator puts its group id and a sequence number in them so
  // concurrent collectives of different groups never match each other.
  virtual Status send(int peer, uint64_t tag, const void* data, size_t bytes) = 0;
  virtual Status recv(int peer, uint64_t tag, void* data, size_t bytes) = 0;
  // Sends to one peer while receiving from another (the step of a ring);
  // must not deadlock when every rank calls it at once.
  virtual Status send_recv(int send_peer, const void* send_data, size_t send_bytes, int recv_peer,
                           void* recv_data, size_t recv_bytes, uint64_t tag) = 0;

  // A send in two phases, for overlap without a progress thread: start_send
  // posts it and returns at once; the caller computes, and then finish()
  // returns once the message has left `data` (the receiver copied it, or the
  // network took it). `data` must stay valid and unchanged until then. A
  // handle destroyed unfinished withdraws its send if nobody took it yet.
  // finish(true) does the same and returns an error: for a caller whose
  // matching receive failed.
  class PendingSend {
   public:
    virtual ~PendingSend() = default;
    virtual Status finish(bool give_up) = 0;
  };
  virtual Result<std::unique_ptr<PendingSend>> start_send(int peer, uint64_t tag, const void* data,
                                                          size_t bytes) = 0;

  // Marks this rank failed; every rank's pending and future calls fail with
  // a message naming `rank()` and `reason`.
  virtual void abort(const std::string& reason) = 0;
  // Status::ok() while no rank has aborted.
  virtual Status health() const = 0;

  // How many world groups were made on this transport before (used by
  // Communicator::world, so two world groups of one transport never share tags).
  int next_world_index() { return worlds_.fetch_add(1); }

 private:
  std::atomic<int> worlds_{0};
};

// Seconds a blocked send/recv waits for its peer before failing:
// MESHFLOW_COMM_TIMEOUT_S when set to a positive number, else 30.
double comm_timeout_s();

struct LocalTransportOptions {
  double timeout_s = 0;  // wait limit of a blocked call; <= 0: comm_timeout_s()
  // Microseconds a waiting rank polls (yielding its core) before it sleeps.
  double spin_us = 50;
};

// N transports sharing one process (the embedded default): transport i is
// used by the thread(s) that run rank i. Messages are handed over by
// rendezvous: the receiver copies straight from the sender's buffer (one copy
// per message), and send returns once the receiver has copied it.
std::vector<std::shared_ptr<Transport>> make_local_transports(
    int world_size, const LocalTransportOptions& options = {});

}  // namespace meshflow
