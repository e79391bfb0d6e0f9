// tools/args.hpp — command-line parsing for the `blobpipe` CLI.
//
// Parsing is separate from the commands so the grammar (and its exit code
// 1 for usage errors) lives in one place:
//
//   auto parsed = blobpipe::cli::parse_args(argc, argv);
//   if (auto* err = std::get_if<blobpipe::cli::usage_error>(&parsed)) ...
#pragma once

#include <cstdint>
#include <string>
#include <variant>

namespace blobpipe::cli {

/// Process exit codes; --help documents them.
inline constexpr int exit_ok = 0;
inline constexpr int exit_usage = 1;    ///< bad command line
inline constexpr int exit_invalid = 2;  ///< the blob is not a valid NVDP blob
inline constexpr int exit_io = 3;       ///< FILE cannot be opened or read, or is not a regular file

enum class command { help, version, inspect, verify };

/// A parsed command line.
struct options {
  command cmd = command::help;
  std::string file;
  std::uint64_t offset = 0;  ///< bytes from file start where the blob begins
  std::uint64_t nbytes = 0;  ///< blob length in bytes; 0 = to end of file
  bool json = false;         ///< inspect only
  bool digest = false;       ///< inspect only
};

/// Why the command line was refused (one line, no trailing newline).
struct usage_error {
  std::string message;
};

/// Parses argv. Flags may come before or after FILE; `--flag=N` and
/// `--flag N` are both accepted; `--` ends the flags. `--help` anywhere
/// wins over everything else, then `--version`.
std::variant<options, usage_error> parse_args(int argc, const char* const* argv);

/// The usage synopsis, exit codes and flags, as --help prints them.
const char* help_text() noexcept;

/// The one-line synopsis printed after a usage error.
const char* usage_line() noexcept;

}  // namespace blobpipe::cli
