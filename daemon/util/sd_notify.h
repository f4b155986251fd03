// The systemd notify protocol, spoken directly (no libsystemd): one datagram
// "KEY=VALUE\n..." to the unix socket named by $NOTIFY_SOCKET, which systemd
// sets for a Type=notify service. A leading '@' names a socket in the
// abstract namespace. Without $NOTIFY_SOCKET (not under systemd) it does
// nothing and returns Ok.
//   SdNotify("READY=1\nSTATUS=2 jobs running");
//   SdNotify("STOPPING=1");
#pragma once

#include <string>

#include "daemon/util/status.h"

namespace diloco {

Status SdNotify(const std::string& state);

}  // namespace diloco
