#include <cstdio>

#include "daemon/ctl/commands.h"
#include "daemon/net/curve.h"

namespace diloco {

int RunKeygenCommand(const KeygenCommand& cmd) {
  if (cmd.out_dir.empty()) {
    std::fprintf(stderr, "dilococtl keygen: --out DIR is required\n");
    return 2;
  }
  net::CurveKeyPair keys;
  Status st = net::GenerateCurveKeyPair(&keys);
  if (st.ok()) st = net::WriteCurveKeyPair(cmd.out_dir, keys, cmd.force);
  if (!st.ok()) {
    std::fprintf(stderr, "dilococtl keygen: %s\n", st.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "dilococtl keygen: wrote %s/key.public and %s/key.secret (0600); add the public key to the peers' allowlists\n",
               cmd.out_dir.c_str(), cmd.out_dir.c_str());
  std::printf("%s\n", keys.public_z85.c_str());
  return 0;
}

}  // namespace diloco
