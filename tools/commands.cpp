// tools/commands.cpp — `blobpipe inspect` and `blobpipe verify`.
//
// Both read the footer and index with read_index_file, which validates
// every number before use; only then are entry bytes read, and only as many
// as the validated index says exist (never more than the file holds).
#include "tools/commands.hpp"

#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "blobpipe/format.hpp"
#include "tools/stdout_status.hpp"
#include "tools/user_path.hpp"

namespace blobpipe::cli {
namespace {

using json = nlohmann::ordered_json;

// The category and message go on one line whatever the message holds, so
// scripts can rely on `blobpipe: CATEGORY: ` being the whole of stderr.
std::string one_line(std::string s) {
  std::replace_if(s.begin(), s.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
  return s;
}

// A file that cannot be read (errc::io) exits 3, anything the blob's bytes
// got wrong exits 2.
int fail(std::ostream& err, const error& e) {
  err << "blobpipe: " << errc_name(e.code) << ": " << one_line(e.message) << '\n';
  return e.code == errc::io ? exit_io : exit_invalid;
}

int fail_io(std::ostream& err, const std::string& what) {
  err << "blobpipe: io: " << one_line(what) << '\n';
  return exit_io;
}

// Flushes the report; when it could not be written (a full disk, a closed
// stdout), says why in the words main uses for --help (stdout_status.hpp).
// errno is the failed write's: once `out` has failed it writes nothing
// more, and formatting sets no errno.
int finish_report(std::ostream& out, std::ostream& err) {
  out.flush();
  if (!out) return fail_io(err, write_error_text(errno));
  return exit_ok;
}

// Reads `len` bytes at absolute file offset `off` into `out`. The caller
// has bounded `len` by the validated index, so the allocation matches bytes
// read_index_file saw on disk. pread leaves the stdio position alone.
bool read_at(std::FILE* f, std::uint64_t off, std::uint64_t len,
             std::vector<std::byte>& out, std::string& why) {
  out.resize(static_cast<std::size_t>(len));
  const int fd = ::fileno(f);
  std::size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done,
                        static_cast<off_t>(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      why = std::string("read failed: ") + std::strerror(errno);
      return false;
    }
    if (n == 0) {
      why = "file ended after " + std::to_string(done) + " of " + std::to_string(len) +
            " bytes at offset " + std::to_string(off);
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

std::string sha256_hex(std::span<const std::byte> bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &md_len, EVP_sha256(), nullptr);
  static constexpr char digits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * md_len);
  for (unsigned int i = 0; i < md_len; ++i) {
    hex += digits[md[i] >> 4];
    hex += digits[md[i] & 0xf];
  }
  return hex;
}

// Keys are arbitrary UTF-8 (possibly empty or with control characters):
// print them as JSON string literals so each row stays one line.
std::string quoted(const std::string& s) {
  return json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string shape_text(const std::optional<shape_t>& shape) {
  if (!shape) return "-";
  std::string s = "[";
  for (std::size_t i = 0; i < shape->size(); ++i) {
    if (i) s += ',';
    s += std::to_string((*shape)[i]);
  }
  return s + "]";
}

// What both commands share: the open file and its validated index.
struct blob_session {
  file_ptr file;
  blob_index index;
};

// Opens FILE and reads footer + index. Returns a nonzero exit code, having
// printed the one stderr line, on failure.
// A relative FILE is relative to where the user typed the command, also
// under `bazel run` (user_path); reports name FILE as it was typed.
int open_and_index(const options& o, std::ostream& err, blob_session& s) {
  auto file = open_blob_file(user_path(o.file));
  if (!file) return fail(err, file.err());
  s.file = std::move(*file);
  auto idx = read_index_file(s.file.get(), o.offset, o.nbytes);
  if (!idx) return fail(err, idx.err());
  s.index = std::move(*idx);
  return exit_ok;
}

// Reads `len` bytes starting `off` bytes into the blob.
int read_blob_range(const options& o, const blob_session& s, std::uint64_t off,
                    std::uint64_t len, std::vector<std::byte>& out, std::ostream& err) {
  std::string why;
  if (!read_at(s.file.get(), o.offset + off, len, out, why)) {
    return fail_io(err, "'" + o.file + "': " + why);
  }
  return exit_ok;
}

json entry_json(const Entry& e, const std::string* digest) {
  json j;
  j["key"] = e.key;
  j["off"] = e.off;
  j["len"] = e.len;
  j["kind"] = std::string(1, e.kind);
  j["dtype"] = e.dtype ? json(*e.dtype) : json(nullptr);
  j["shape"] = e.shape ? json(*e.shape) : json(nullptr);
  if (digest) j["sha256"] = *digest;
  return j;
}

void print_json(const blob_index& idx, const std::vector<std::string>& digests,
                std::ostream& out) {
  json j;
  j["footer_version"] = idx.foot.version;
  j["tag_hex"] = tag_hex(idx.foot.tag);
  j["index_off"] = idx.foot.index_off;
  j["index_len"] = idx.foot.index_len;
  j["nbytes"] = idx.nbytes;
  json entries = json::array();
  for (std::size_t i = 0; i < idx.entries.size(); ++i) {
    entries.push_back(entry_json(idx.entries[i], digests.empty() ? nullptr : &digests[i]));
  }
  j["entries"] = std::move(entries);
  out << j.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
}

void print_text(const blob_index& idx, const std::vector<std::string>& digests,
                std::ostream& out) {
  out << "footer_version  " << idx.foot.version << '\n'
      << "tag_hex         " << tag_hex(idx.foot.tag) << '\n'
      << "index_off       " << idx.foot.index_off << '\n'
      << "index_len       " << idx.foot.index_len << '\n'
      << "nbytes          " << idx.nbytes << '\n'
      << "entries         " << idx.entries.size() << '\n';
  if (idx.entries.empty()) return;

  // Columns are padded to their widest cell; the key goes last because it
  // is the only unbounded one.
  std::vector<std::vector<std::string>> rows;
  rows.reserve(idx.entries.size() + 1);
  rows.push_back({"#", "off", "len", "kind", "dtype", "shape"});
  if (!digests.empty()) rows.back().push_back("sha256");
  rows.back().push_back("key");
  for (std::size_t i = 0; i < idx.entries.size(); ++i) {
    const Entry& e = idx.entries[i];
    rows.push_back({std::to_string(i), std::to_string(e.off), std::to_string(e.len),
                    std::string(1, e.kind), e.dtype ? *e.dtype : "-", shape_text(e.shape)});
    if (!digests.empty()) rows.back().push_back(digests[i]);
    rows.back().push_back(quoted(e.key));
  }
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line.append(width[c] - r[c].size() + 2, ' ');
    }
    out << line << '\n';
  }
}

}  // namespace

int run_inspect(const options& o, std::ostream& out, std::ostream& err) {
  blob_session s;
  if (int rc = open_and_index(o, err, s)) return rc;

  std::vector<std::string> digests;
  if (o.digest) {
    // One entry at a time, so memory is bounded by the largest entry (whose
    // range parse_index already checked against the data region) rather
    // than by the blob; view_entry rechecks dtype and shape against it.
    std::vector<std::byte> bytes;
    digests.reserve(s.index.entries.size());
    for (const Entry& e : s.index.entries) {
      if (int rc = read_blob_range(o, s, e.off, e.len, bytes, err)) return rc;
      auto v = view_entry(e, bytes);
      if (!v) return fail(err, v.err());
      digests.push_back(sha256_hex(v->bytes));
    }
  }
  errno = 0;  // finish_report reads the reason of a failed write here
  if (o.json) {
    print_json(s.index, digests, out);
  } else {
    print_text(s.index, digests, out);
  }
  return finish_report(out, err);
}

int run_verify(const options& o, std::ostream& out, std::ostream& err) {
  blob_session s;
  if (int rc = open_and_index(o, err, s)) return rc;
  // The whole blob, as a reader that received it would hold it; its size
  // was checked against the file by read_index_file.
  std::vector<std::byte> blob;
  if (int rc = read_blob_range(o, s, 0, s.index.nbytes, blob, err)) return rc;

  std::uint64_t data_bytes = 0;
  for (const Entry& e : s.index.entries) {
    auto v = decode_entry(blob, e);
    if (!v) return fail(err, v.err());
    data_bytes += e.len;
  }
  errno = 0;  // finish_report reads the reason of a failed write here
  out << o.file << ": ok: " << s.index.entries.size() << " entries, " << data_bytes
      << " data bytes, blob " << s.index.nbytes << " bytes, footer v"
      << s.index.foot.version << ", tag " << tag_hex(s.index.foot.tag) << '\n';
  return finish_report(out, err);
}

}  // namespace blobpipe::cli
