#include "daemon/export/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "daemon/util/atomic_file.h"

namespace diloco {
namespace {

// Floats are written as their in-memory bytes.
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

std::string Quoted(const std::string& path) { return "'" + path + "'"; }

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Reads exactly n bytes at offset.
Status PreadAll(int fd, void* data, size_t n, uint64_t offset, const std::string& name) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, p + got, n - got, (off_t)(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::Error("cannot read " + name + ": " + std::strerror(errno));
    if (r == 0) return Status::Error(name + " was truncated while being read");
    got += (size_t)r;
  }
  return Status::Ok();
}

// Parses one tensor's header entry.
Status ParseEntry(const std::string& name, const nlohmann::json& j, const std::string& file,
                  SafetensorsEntry* e) {
  const std::string where = file + ": tensor '" + name + "'";
  if (!j.is_object()) return Status::Error(where + " is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!j.contains(key)) return Status::Error(where + " has no \"" + key + "\"");
  for (const auto& [key, value] : j.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      return Status::Error(where + " has an unknown key \"" + key + "\"");
  if (!j["dtype"].is_string()) return Status::Error(where + ": dtype is not a string");
  e->name = name;
  e->dtype = j["dtype"].get<std::string>();
  const size_t elem = SafetensorsDtypeBytes(e->dtype);
  if (elem == 0) return Status::Error(where + " has unknown dtype \"" + e->dtype + "\"");
  if (!j["shape"].is_array()) return Status::Error(where + ": shape is not an array");
  unsigned __int128 numel = 1;
  for (const auto& d : j["shape"]) {
    if (!d.is_number_unsigned())
      return Status::Error(where + ": shape " + j["shape"].dump() + " holds a non-integer or negative size");
    e->shape.push_back((int64_t)d.get<uint64_t>());
    numel *= d.get<uint64_t>();
    if (numel > ((unsigned __int128)1 << 80)) return Status::Error(where + ": shape " + j["shape"].dump() + " is absurdly large");
  }
  const auto& off = j["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    return Status::Error(where + ": data_offsets " + off.dump() + " is not [begin, end] with non-negative integers");
  e->begin = off[0].get<uint64_t>();
  e->end = off[1].get<uint64_t>();
  if (e->end < e->begin)
    return Status::Error(where + ": data_offsets [" + std::to_string(e->begin) + ", " + std::to_string(e->end) +
                         "] end before they begin");
  if ((unsigned __int128)(e->end - e->begin) != numel * elem)
    return Status::Error(where + ": data_offsets [" + std::to_string(e->begin) + ", " + std::to_string(e->end) + "] span " +
                         std::to_string(e->end - e->begin) + " bytes, but shape " + ShapeText(e->shape) + " of " +
                         e->dtype + " needs " + std::to_string((uint64_t)(numel * elem)));
  return Status::Ok();
}

Status ParseIndex(int fd, const std::string& path, SafetensorsIndex* out) {
  const std::string name = "safetensors file " + Quoted(path);
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::Error("cannot stat " + name + ": " + std::strerror(errno));
  SafetensorsIndex idx;
  idx.file_bytes = (uint64_t)st.st_size;
  if (idx.file_bytes < 8)
    return Status::Error(name + " is truncated: " + std::to_string(idx.file_bytes) +
                         " bytes, not even the 8-byte header length");
  uint8_t len_bytes[8];
  DL_RETURN_IF_ERROR(PreadAll(fd, len_bytes, 8, 0, name));
  for (int i = 0; i < 8; i++) idx.header_bytes |= (uint64_t)len_bytes[i] << (8 * i);
  if (idx.header_bytes < 2)
    return Status::Error(name + " has header length " + std::to_string(idx.header_bytes) +
                         ": too short for a JSON object");
  if (idx.header_bytes > kSafetensorsMaxHeaderBytes)
    return Status::Error(name + " has header length " + std::to_string(idx.header_bytes) + " bytes, over the " +
                         std::to_string(kSafetensorsMaxHeaderBytes) + "-byte limit: not a safetensors file or corrupt");
  if (idx.header_bytes > idx.file_bytes - 8)
    return Status::Error(name + " is truncated or corrupt: header length " + std::to_string(idx.header_bytes) +
                         " but only " + std::to_string(idx.file_bytes - 8) + " bytes follow it");
  idx.data_offset = 8 + idx.header_bytes;

  std::string header(idx.header_bytes, '\0');
  DL_RETURN_IF_ERROR(PreadAll(fd, header.data(), header.size(), 8, name));
  if (header[0] != '{') return Status::Error(name + ": the header does not start with '{'");
  nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Error(name + ": the header is not valid JSON");
  if (!j.is_object()) return Status::Error(name + ": the header is not a JSON object");

  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return Status::Error(name + ": __metadata__ is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          return Status::Error(name + ": __metadata__ \"" + mk + "\" is not a string (safetensors allows strings only)");
        idx.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e;
    DL_RETURN_IF_ERROR(ParseEntry(key, value, name, &e));
    idx.entries.push_back(std::move(e));
  }

  std::sort(idx.entries.begin(), idx.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t data_bytes = idx.file_bytes - idx.data_offset;
  uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : idx.entries) {
    if (e.begin < covered)
      return Status::Error(name + ": tensor '" + e.name + "' [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                           ") overlaps tensor '" + prev->name + "' [" + std::to_string(prev->begin) + ", " +
                           std::to_string(prev->end) + ")");
    if (e.begin > covered)
      return Status::Error(name + ": " + std::to_string(e.begin - covered) + " bytes before tensor '" + e.name +
                           "' (at " + std::to_string(covered) + ") belong to no tensor");
    covered = e.end;
    prev = &e;
  }
  if (covered > data_bytes)
    return Status::Error(name + " is truncated: its tensors need " + std::to_string(covered) + " data bytes, the file has " +
                         std::to_string(data_bytes) + " after the header");
  if (covered < data_bytes)
    return Status::Error(name + " has " + std::to_string(data_bytes - covered) +
                         " bytes after its last tensor that belong to no tensor: corrupt");
  *out = std::move(idx);
  return Status::Ok();
}

}  // namespace

const SafetensorsEntry* SafetensorsIndex::find(const std::string& name) const {
  for (const SafetensorsEntry& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

size_t SafetensorsDtypeBytes(const std::string& dtype) {
  static const std::map<std::string, size_t> kBytes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2}, {"I16", 2},
      {"F16", 2},  {"BF16", 2}, {"U32", 4}, {"I32", 4},     {"F32", 4},     {"U64", 8}, {"I64", 8},
      {"F64", 8}};
  auto it = kBytes.find(dtype);
  return it == kBytes.end() ? 0 : it->second;
}

Status WriteSafetensors(const std::string& path, const TensorTable& table, const float* params,
                        const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps __metadata__ first and the tensors in table order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = nlohmann::ordered_json::object();
  for (const auto& [k, v] : metadata) header["__metadata__"][k] = v;
  for (const TensorInfo& t : table.tensors()) {
    const uint64_t begin = (uint64_t)t.offset * sizeof(float);
    header[t.name] = {{"dtype", "F32"},
                      {"shape", t.shape},
                      {"data_offsets", {begin, begin + (uint64_t)t.numel * sizeof(float)}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)text.size() >> (8 * i));
  return WriteFileAtomically(path,
                             {{len, sizeof(len)},
                              {text.data(), text.size()},
                              {params, table.total_numel() * sizeof(float)}},
                             "safetensors file");
}

Status ReadSafetensorsIndex(const std::string& path, SafetensorsIndex* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return Status::Error("cannot open safetensors file " + Quoted(path) + ": " + std::strerror(err) +
                         (err == ENOENT ? ": check the path" : ""));
  }
  const Status st = ParseIndex(fd, path, out);
  ::close(fd);
  return st;
}

Status CheckSafetensorsMatchesTable(const SafetensorsIndex& index, const TensorTable& table) {
  const auto& tensors = table.tensors();
  if (index.entries.size() != tensors.size())
    return Status::Error("the file has " + std::to_string(index.entries.size()) + " tensors, the model " +
                         std::to_string(tensors.size()));
  for (size_t i = 0; i < tensors.size(); i++) {
    const SafetensorsEntry& e = index.entries[i];
    const TensorInfo& t = tensors[i];
    const std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
    if (e.name != t.name)
      return Status::Error("tensor " + std::to_string(i) + " is '" + e.name + "' in the file, '" + t.name +
                           "' in the model");
    if (e.dtype != "F32") return Status::Error("tensor '" + e.name + "' is " + e.dtype + ", expected F32");
    if (e.shape != shape)
      return Status::Error("tensor '" + e.name + "' has shape " + ShapeText(e.shape) + " in the file, " +
                           ShapeText(shape) + " in the model");
  }
  return Status::Ok();
}

}  // namespace diloco
