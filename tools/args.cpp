// tools/args.cpp — the `blobpipe` command-line grammar.
#include "tools/args.hpp"

#include <charconv>
#include <optional>
#include <string_view>
#include <vector>

namespace blobpipe::cli {
namespace {

// Strict unsigned decimal: no sign, no spaces, no suffix, no overflow, so a
// typo such as `--offset 1k` is a usage error rather than offset 1. On
// failure, `why` says which: not such a number, or one above 2^64 - 1.
std::optional<std::uint64_t> parse_u64(std::string_view s, std::string& why) {
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (!s.empty() && end == s.data() + s.size()) {
    if (ec == std::errc{}) return v;
    if (ec == std::errc::result_out_of_range) {
      why = "is out of range (at most 18446744073709551615)";
      return std::nullopt;
    }
  }
  why = "is not an unsigned decimal integer";
  return std::nullopt;
}

}  // namespace

const char* usage_line() noexcept {
  return "usage: blobpipe inspect FILE [--offset N] [--nbytes N] [--json] [--digest]; "
         "blobpipe verify FILE [--offset N] [--nbytes N]; blobpipe --help; blobpipe --version";
}

const char* help_text() noexcept {
  return R"(usage: blobpipe inspect FILE [--offset N] [--nbytes N] [--json] [--digest]
       blobpipe verify  FILE [--offset N] [--nbytes N]
       blobpipe --help
       blobpipe --version

Reads an NVDP blob (format v3, or legacy v2) stored in FILE. A relative
FILE is relative to the working directory, or under `bazel run` to where
the command was typed (BUILD_WORKING_DIRECTORY).

commands:
  inspect   print the footer (version, tag, index_off, index_len, nbytes),
            any layout findings (below), and one row per index entry (off,
            len, kind, dtype, shape, key; keys in quotes, control
            characters escaped). Reads only the footer and index unless
            --digest is given.
  verify    check every entry (range, dtype, shape x itemsize == len),
            read each one's bytes, and print a one-line summary. A layout
            the reference never writes fails (exit 2): bytes between the
            index and the footer (index_out_of_range), entries that
            overlap or run out of order (entry_out_of_range).

Both read the footer and the index first (two reads), then entry bytes a
piece (1 MiB) at a time: memory follows the index, not the blob.

options:
  --offset N  the blob starts N bytes into FILE (default 0), e.g. one blob
              of a checkpoint shard
  --nbytes N  the blob is N bytes long (default 0: to the end of FILE)
  --json      inspect: print one JSON object {footer_version, tag_hex,
              index_off, index_len, nbytes, entries: [{key, off, len, kind,
              dtype, shape[, sha256]}], findings: [{kind, category, count,
              message}]}; dtype and shape are null where the index has nil;
              ASCII only (other characters as \u escapes)
  --digest    inspect: add the SHA-256 (hex) of each entry's bytes; a blob
              whose entries overlap is refused (exit 2, entry_out_of_range),
              so the bytes read stay within the blob's size
  --help      print this text
  --version   print `blobpipe VERSION` (the library's, blobpipe/version.hpp)

exit status:
  0  success
  1  usage error (unknown command or flag, missing FILE, N not an
     unsigned decimal integer or above 18446744073709551615)
  2  FILE holds no valid blob at the given range, or verify found a
     layout the reference never writes (inspect --digest: entries that
     overlap), or the blob needs more memory
     than the process may allocate (too_large); stderr has exactly one
     line `blobpipe: CATEGORY: message`, CATEGORY one of too_small,
     bad_footer, index_out_of_range, malformed_index, entry_out_of_range,
     shape_mismatch, unknown_kind, unknown_dtype, too_large
  3  FILE cannot be opened or read (missing, unreadable, a directory, or
     not a regular file: a pipe, FIFO or device is refused, since the
     footer is at the blob's end and FILE must be seekable), or stdout
     cannot be written (the report, or this text); stderr has one line
     `blobpipe: io: message`
)";
}

std::variant<options, usage_error> parse_args(int argc, const char* const* argv) {
  std::vector<std::string_view> args(argv + (argc > 0 ? 1 : 0), argv + argc);
  for (auto a : args) {
    if (a == "--") break;
    if (a == "--help" || a == "-h") return options{};  // cmd = help
  }
  for (auto a : args) {
    if (a == "--") break;
    if (a == "--version") {
      options v;
      v.cmd = command::version;
      return v;
    }
  }
  if (args.empty()) return usage_error{"missing command"};

  options o;
  if (args[0] == "inspect") {
    o.cmd = command::inspect;
  } else if (args[0] == "verify") {
    o.cmd = command::verify;
  } else {
    return usage_error{"unknown command '" + std::string(args[0]) + "'"};
  }

  std::optional<std::string> file;
  bool flags_done = false;
  for (std::size_t i = 1; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (flags_done || !a.starts_with("-") || a == "-") {
      if (file) return usage_error{"more than one FILE given"};
      file = std::string(a);
      continue;
    }
    if (a == "--") {
      flags_done = true;
      continue;
    }
    std::string_view name = a;
    std::optional<std::string_view> inline_value;
    if (auto eq = a.find('='); eq != std::string_view::npos) {
      name = a.substr(0, eq);
      inline_value = a.substr(eq + 1);
    }
    if (name == "--offset" || name == "--nbytes") {
      std::string_view text;
      if (inline_value) {
        text = *inline_value;
      } else if (i + 1 < args.size()) {
        text = args[++i];
      } else {
        return usage_error{std::string(name) + " needs a value"};
      }
      std::string why;
      auto n = parse_u64(text, why);
      if (!n) return usage_error{std::string(name) + ": '" + std::string(text) + "' " + why};
      (name == "--offset" ? o.offset : o.nbytes) = *n;
      continue;
    }
    // --json and --digest only change what inspect prints; verify refuses
    // them rather than silently ignoring them.
    if (o.cmd == command::inspect && !inline_value && name == "--json") {
      o.json = true;
      continue;
    }
    if (o.cmd == command::inspect && !inline_value && name == "--digest") {
      o.digest = true;
      continue;
    }
    return usage_error{"unknown flag '" + std::string(a) + "'"};
  }
  if (!file) return usage_error{"missing FILE"};
  o.file = std::move(*file);
  return o;
}

}  // namespace blobpipe::cli
