#include "daemon/util/ring_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace diloco {

namespace {

// An address as comparable bytes: family + the raw IPv4/IPv6 address.
std::string AddressKey(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    return "4" + std::string(reinterpret_cast<const char*>(&in->sin_addr), sizeof(in->sin_addr));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    return "6" + std::string(reinterpret_cast<const char*>(&in6->sin6_addr), sizeof(in6->sin6_addr));
  }
  return "";
}

// The addresses address stands for: itself when it is a literal, else what it resolves to.
Status ResolveAddress(const std::string& address, std::vector<std::string>* keys) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(address.c_str(), nullptr, &hints, &found); rc != 0)
    return Status::Error("ring_address '" + address + "' does not resolve (" + gai_strerror(rc) + ")");
  for (addrinfo* a = found; a; a = a->ai_next)
    if (std::string key = AddressKey(a->ai_addr); !key.empty()) keys->push_back(key);
  freeaddrinfo(found);
  return Status::Ok();
}

// Whether address key k lies on the network of an interface address key with mask (all three
// AddressKey's of one family).
bool OnNetwork(const std::string& k, const std::string& key, const std::string& mask) {
  if (k.size() != key.size() || mask.size() != key.size()) return false;
  for (size_t b = 1; b < key.size(); b++)
    if (((key[b] ^ k[b]) & mask[b]) != 0) return false;
  return true;
}

}  // namespace

Status InterfaceOfAddress(const std::string& address, std::string* name) {
  std::vector<std::string> keys;
  DL_RETURN_IF_ERROR(ResolveAddress(address, &keys));
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    return Status::Error("listing this host's network interfaces failed: " + std::string(std::strerror(errno)));
  // The interface that holds the address; failing that, one whose network contains it (127.0.0.2
  // on lo's 127.0.0.1/8).
  name->clear();
  std::string on_network;
  for (ifaddrs* i = list; i && name->empty(); i = i->ifa_next) {
    if (!i->ifa_addr || !i->ifa_netmask) continue;
    const std::string key = AddressKey(i->ifa_addr), mask = AddressKey(i->ifa_netmask);
    for (const std::string& k : keys) {
      if (!key.empty() && key == k) *name = i->ifa_name;
      if (on_network.empty() && !key.empty() && OnNetwork(k, key, mask)) on_network = i->ifa_name;
    }
  }
  freeifaddrs(list);
  if (name->empty()) *name = on_network;
  if (name->empty())
    return Status::Error("no network interface of this host holds ring_address '" + address +
                         "': set it to this host's address on the site's private network (ip -brief address)");
  return Status::Ok();
}

Status PinNcclToRingInterface(const std::string& ring_address, std::string* said) {
  if (const char* set = std::getenv("NCCL_SOCKET_IFNAME"); set && *set) {
    *said = "NCCL_SOCKET_IFNAME=" + std::string(set) + " (set by the environment; ring_address " + ring_address +
            " not consulted)";
    return Status::Ok();
  }
  std::string name;
  DL_RETURN_IF_ERROR(InterfaceOfAddress(ring_address, &name));
  const std::string value = "=" + name;  // '=': exactly this interface, not every one starting so
  if (setenv("NCCL_SOCKET_IFNAME", value.c_str(), 1) != 0)
    return Status::Error("setting NCCL_SOCKET_IFNAME failed: " + std::string(std::strerror(errno)));
  *said = "NCCL_SOCKET_IFNAME=" + value + " (the interface of ring_address " + ring_address + ")";
  return Status::Ok();
}

}  // namespace diloco
