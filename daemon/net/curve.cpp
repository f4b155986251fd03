#include "daemon/net/curve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace diloco::net {
namespace {

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

Status ReadSmallFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error("cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (ss.str().size() > 4096) return Status::Error(path + " is too large for a key file");
  *out = Trim(ss.str());
  return Status::Ok();
}

// Writes text to path with the given mode, never following an existing file unless overwrite.
Status WriteKeyFile(const std::string& path, const std::string& text, mode_t mode, bool overwrite) {
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return Status::Error("cannot create " + tmp + ": " + std::strerror(errno));
  ::fchmod(fd, mode);  // umask may have narrowed it; the secret must be exactly 0600
  const ssize_t n = ::write(fd, text.data(), text.size());
  const bool ok = n == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    return Status::Error("cannot write " + tmp + ": " + std::strerror(errno));
  }
  if (!overwrite) {
    // link() fails with EEXIST instead of replacing: no race with a concurrent keygen.
    if (::link(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      if (err == EEXIST) return Status::Error(path + " exists; pass --force to replace the key pair");
      return Status::Error("cannot create " + path + ": " + std::strerror(err));
    }
    ::unlink(tmp.c_str());
  } else if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return Status::Error("cannot replace " + path + ": " + std::strerror(err));
  }
  return Status::Ok();
}

}  // namespace

bool CurveAvailable() { return zmq_has("curve") == 1; }

Status GenerateCurveKeyPair(CurveKeyPair* out) {
  if (!CurveAvailable()) return Status::Error("libzmq was built without CURVE (libsodium); install a libzmq with it");
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) return Status::Error(std::string("zmq_curve_keypair: ") + zmq_strerror(errno));
  out->public_z85.assign(pub, 40);
  out->secret_z85.assign(sec, 40);
  return Status::Ok();
}

Status ValidateZ85Key(const std::string& key, const char* what) {
  if (key.size() != kZ85KeyChars) {
    return Status::Error(std::string(what) + " must be a 40-character Z85 key (got " + std::to_string(key.size()) +
                         " characters); generate one with `dilococtl keygen`");
  }
  unsigned char raw[32];
  if (zmq_z85_decode(raw, key.c_str()) == nullptr) {
    return Status::Error(std::string(what) + " is not valid Z85 text");
  }
  return Status::Ok();
}

Status CurvePublicFromSecret(const std::string& secret_z85, std::string* public_z85) {
  DL_RETURN_IF_ERROR(ValidateZ85Key(secret_z85, "secret key"));
  char pub[41];
  if (zmq_curve_public(pub, secret_z85.c_str()) != 0) {
    return Status::Error(std::string("zmq_curve_public: ") + zmq_strerror(errno));
  }
  public_z85->assign(pub, 40);
  return Status::Ok();
}

Status WriteCurveKeyPair(const std::string& dir, const CurveKeyPair& keys, bool overwrite) {
  DL_RETURN_IF_ERROR(ValidateZ85Key(keys.public_z85, "public key"));
  DL_RETURN_IF_ERROR(ValidateZ85Key(keys.secret_z85, "secret key"));
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::Error("cannot create " + dir + ": " + ec.message());
    ::chmod(dir.c_str(), 0700);
  }
  const std::string pub_path = dir + "/key.public";
  const std::string sec_path = dir + "/key.secret";
  if (!overwrite) {
    for (const std::string& p : {pub_path, sec_path}) {
      if (std::filesystem::exists(p, ec)) return Status::Error(p + " exists; pass --force to replace the key pair");
    }
  }
  // Secret first: a crash in between leaves no public key without its secret.
  DL_RETURN_IF_ERROR(WriteKeyFile(sec_path, keys.secret_z85 + "\n", 0600, overwrite));
  DL_RETURN_IF_ERROR(WriteKeyFile(pub_path, keys.public_z85 + "\n", 0644, overwrite));
  return Status::Ok();
}

Status LoadCurvePublicKey(const std::string& path, std::string* out) {
  std::string key;
  DL_RETURN_IF_ERROR(ReadSmallFile(path, &key));
  DL_RETURN_IF_ERROR(ValidateZ85Key(key, path.c_str()));
  *out = key;
  return Status::Ok();
}

Status LoadCurveKeyPair(const std::string& dir, CurveKeyPair* out) {
  const std::string pub_path = dir + "/key.public";
  const std::string sec_path = dir + "/key.secret";
  struct stat st;
  if (::stat(sec_path.c_str(), &st) != 0) {
    return Status::Error("cannot read " + sec_path + ": " + std::strerror(errno) +
                         "; create a key pair with `dilococtl keygen --out " + dir + "`");
  }
  if (st.st_mode & 077) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return Status::Error(sec_path + " is readable by group or others (mode " + mode + "); run chmod 600 " + sec_path);
  }
  CurveKeyPair keys;
  DL_RETURN_IF_ERROR(LoadCurvePublicKey(pub_path, &keys.public_z85));
  DL_RETURN_IF_ERROR(ReadSmallFile(sec_path, &keys.secret_z85));
  DL_RETURN_IF_ERROR(ValidateZ85Key(keys.secret_z85, sec_path.c_str()));
  std::string derived;
  DL_RETURN_IF_ERROR(CurvePublicFromSecret(keys.secret_z85, &derived));
  if (derived != keys.public_z85) {
    return Status::Error(pub_path + " does not belong to " + sec_path + "; regenerate with `dilococtl keygen --force`");
  }
  *out = keys;
  return Status::Ok();
}

std::string Z85EncodeKey(const unsigned char key[32]) {
  char buf[41];
  zmq_z85_encode(buf, key, 32);
  return std::string(buf, 40);
}

}  // namespace diloco::net
