// Runs one function per rank on N threads of this process, over the `local`
// transport, and gathers what each returned. This is how `meshflow train
// --ranks N`, the communicator tests and the benchmarks start their ranks.
//
//   Status s = run_local_ranks(4, [&](const std::shared_ptr<Transport>& t) -> Status {
//     auto comm = Communicator::world(t);
//     return comm->all_reduce(grad.data(), grad.size(), ReduceOp::kSum);
//   });
//
// When one rank's function returns an error or throws, the transport is
// aborted with that message, so every other rank's pending and future
// communication fails at once ("rank 2 failed: ...") instead of hanging;
// the returned Status is that first failure, "rank 2: <message>".
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "meshflow/comm/transport.h"
#include "meshflow/core/status.h"

namespace meshflow {

// One rank's work; t->rank() says which rank it is.
using RankFn = std::function<Status(const std::shared_ptr<Transport>& t)>;

// Runs fn on world_size threads and returns OK or the first failure. When
// per_rank is given it receives what each rank returned (a throw becomes
// Status::internal naming the exception).
Status run_local_ranks(int world_size, const RankFn& fn, const LocalTransportOptions& options = {},
                       std::vector<Status>* per_rank = nullptr);

}  // namespace meshflow
