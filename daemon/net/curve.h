// CURVE key pairs (libsodium via libzmq) in Z85 text: generation, files, validation.
//
// Files written by `dilococtl keygen --out DIR`:
//   DIR/key.public  the 40-character Z85 public key and a newline (mode 0644): give it to peers
//                   for their allowlists;
//   DIR/key.secret  the 40-character Z85 secret key and a newline (mode 0600): never leaves the site.
#pragma once

#include <string>

#include "daemon/util/status.h"

namespace diloco::net {

inline constexpr size_t kZ85KeyChars = 40;  // a 32-byte CURVE key in Z85

struct CurveKeyPair {
  std::string public_z85;  // 40 chars
  std::string secret_z85;  // 40 chars
};

// True when libzmq was built with CURVE (libsodium).
bool CurveAvailable();

// A fresh key pair from libsodium's CSPRNG.
Status GenerateCurveKeyPair(CurveKeyPair* out);

// OK when key is 40 chars of the Z85 alphabet (decodes to 32 bytes); the message names what.
Status ValidateZ85Key(const std::string& key, const char* what);

// The public key that belongs to secret_z85.
Status CurvePublicFromSecret(const std::string& secret_z85, std::string* public_z85);

// Writes DIR/key.public and DIR/key.secret (0600), creating DIR (0700) when missing.
// Refuses when either file exists unless overwrite.
Status WriteCurveKeyPair(const std::string& dir, const CurveKeyPair& keys, bool overwrite);

// Reads DIR/key.public and DIR/key.secret, checks they are valid and belong together, and that the
// secret file is not readable by group or others.
Status LoadCurveKeyPair(const std::string& dir, CurveKeyPair* out);

// Reads one Z85 public key from a file (surrounding whitespace ignored).
Status LoadCurvePublicKey(const std::string& path, std::string* out);

// Z85 of 32 raw key bytes (for ZAP credentials).
std::string Z85EncodeKey(const unsigned char key[32]);

}  // namespace diloco::net
