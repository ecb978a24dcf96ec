// The `mpi` backend: a Transport (transport.h) whose ranks are the processes
// of an MPI job, so `mpirun -np N meshflow ...` runs one rank per process and
// the collectives of communicator.h run unchanged on top of it.
//
//   if (launched_by_mpirun()) {
//     MF_ASSIGN_OR_RETURN(std::shared_ptr<Transport> t, make_mpi_transport());
//     auto world = Communicator::world(t);
//     ...
//     if (!st.is_ok()) t->abort(st.message());   // never returns: the whole job stops
//   }
//
// Lifetime: MPI is initialized (MPI_THREAD_MULTIPLE, because communicators
// run collectives on their own progress threads) by the first call and
// finalized when the process exits. A process that exits with a non-zero
// status calls MPI_Abort instead, so the other ranks stop rather than wait in
// MPI_Finalize for a rank that has gone: on a failure, call abort(reason), or
// return non-zero from main; both end every rank of the job with a message
// naming the failed rank.
//
// A rank that is killed ends the job through mpirun; a rank that is alive but
// stops communicating makes its peers' calls fail after comm_timeout_s()
// (MESHFLOW_COMM_TIMEOUT_S, 30 s by default) with a Status naming it, as in
// the local backend. Waits poll MPI, flat out at first, then yielding and
// sleeping, so a progress thread waiting on a slow peer leaves the cores to
// the computation it overlaps.
//
// Messages: each carries a 16-byte header (the 64-bit tag and the byte
// count), so a receive that does not match what was sent (ranks calling
// collectives in different orders or sizes) is an error naming both, never
// silent garbage. The 64-bit tag is hashed into MPI's tag range (MPI_TAG_UB
// can be as small as 2^15-1; Open MPI's ob1 has 2^31-1); the header verifies
// it: two tags in flight at once between one pair that hash alike (odds about
// 2^-bits) fail as a mismatch, they are never mixed up. Payloads over 1 GiB
// go as several messages (MPI counts are int).
// Built without MPI (MESHFLOW_HAVE_MPI undefined), make_mpi_transport()
// returns an error saying so.
#pragma once

#include <memory>

#include "meshflow/comm/transport.h"
#include "meshflow/core/status.h"

namespace meshflow {

// True when this process was started by mpirun/mpiexec (Open MPI sets
// OMPI_COMM_WORLD_SIZE; PMI_SIZE / PMIX_RANK cover other launchers): the CLI
// then picks the mpi backend.
bool launched_by_mpirun();

// True when meshflow was built with MPI.
bool mpi_compiled();

// The transport over all processes of the MPI job (a private duplicate of
// MPI_COMM_WORLD). Initializes MPI on the first call; later calls return the
// same transport. Fails when built without MPI or when MPI cannot provide
// MPI_THREAD_MULTIPLE.
Result<std::shared_ptr<Transport>> make_mpi_transport();

}  // namespace meshflow
