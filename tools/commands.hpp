// tools/commands.hpp — the `inspect` and `verify` commands of the CLI.
//
// Each command writes its report to `out`, and on failure exactly one line
// `blobpipe: CATEGORY: message` to `err`, and returns the process exit code
// (see tools/args.hpp).
#pragma once

#include <iosfwd>

#include "tools/args.hpp"

namespace blobpipe::cli {

/// Prints the footer, the layout findings (layout_check.hpp) and the index
/// rows (text, or JSON with --json), with each entry's SHA-256 under
/// --digest (entry bytes read through a 1 MiB buffer).
int run_inspect(const options& o, std::ostream& out, std::ostream& err);

/// Fails (exit 2) on a layout finding, then reads every entry's bytes
/// through a 1 MiB buffer and prints a one-line summary.
int run_verify(const options& o, std::ostream& out, std::ostream& err);

}  // namespace blobpipe::cli
