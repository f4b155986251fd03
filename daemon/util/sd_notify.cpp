#include "daemon/util/sd_notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

namespace diloco {

Status SdNotify(const std::string& state) {
  const char* env = getenv("NOTIFY_SOCKET");
  if (env == nullptr || env[0] == '\0') return Status::Ok();
  const std::string socket_path = env;
  if (socket_path[0] != '/' && socket_path[0] != '@')
    return Status::Error("NOTIFY_SOCKET='" + socket_path +
                         "' is neither an absolute path nor an abstract name ('@...')");

  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() > sizeof(addr.sun_path) - 1)
    return Status::Error("NOTIFY_SOCKET='" + socket_path + "' is longer than a unix socket path may be");
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  // Abstract names start with a NUL byte and are exactly as long as given.
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';
  const socklen_t addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_path.size());

  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Error(std::string("sd_notify: cannot create a socket: ") + std::strerror(errno));
  const ssize_t sent = sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                              reinterpret_cast<const sockaddr*>(&addr), addr_len);
  const int err = errno;
  close(fd);
  if (sent < 0)
    return Status::Error("sd_notify: cannot send to NOTIFY_SOCKET='" + socket_path + "': " + std::strerror(err));
  if (static_cast<size_t>(sent) != state.size())
    return Status::Error("sd_notify: short send to NOTIFY_SOCKET='" + socket_path + "'");
  return Status::Ok();
}

}  // namespace diloco
