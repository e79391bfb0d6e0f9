// tools/commands.hpp — the `inspect` and `verify` commands of the CLI.
//
// Each command writes its report to `out`, and on failure exactly one line
// `blobpipe: CATEGORY: message` to `err`, and returns the process exit code
// (see tools/args.hpp).
#pragma once

#include <iosfwd>

#include "tools/args.hpp"

namespace blobpipe::cli {

/// Prints the footer and index rows (text, or JSON with --json), with each
/// entry's SHA-256 under --digest.
int run_inspect(const options& o, std::ostream& out, std::ostream& err);

/// Decodes every entry of the blob and prints a one-line summary.
int run_verify(const options& o, std::ostream& out, std::ostream& err);

}  // namespace blobpipe::cli
