// Keeps NCCL's traffic on a site's private ring network. A GPU ring across hosts
// (kernels/cuda/nccl_comm.h) talks plain TCP, unauthenticated, on the interface the
// NCCL_SOCKET_IFNAME environment variable names (NCCL picks one itself when it is unset, possibly
// a public one). dilocod calls PinNcclToRingInterface at start, before any thread, with its
// host's ring_address (daemon config site_hosts): NCCL then uses exactly the interface that holds
// that address, as Gloo's CPU rings do. A value the operator set is left alone.
#pragma once

#include <string>

#include "daemon/util/status.h"

namespace diloco {

// The name of the local network interface that holds address (an IPv4/IPv6 literal or a name
// that resolves to one), e.g. "lo" for 127.0.0.1. An error names the address when no interface
// holds it.
Status InterfaceOfAddress(const std::string& address, std::string* name);

// Sets NCCL_SOCKET_IFNAME to "=<interface of ring_address>" unless it is already set. *said: one
// line for the log (what was set, or kept). Not thread-safe (setenv): call before threads start.
Status PinNcclToRingInterface(const std::string& ring_address, std::string* said);

}  // namespace diloco
