// tools/stdout_status.hpp — a program's exit status counts its stdout.
//
// Output to a full disk (or /dev/full) fails only when stdio flushes it,
// often after main has decided to succeed. Like coreutils, the programs
// (blobpipe, the examples) check once at the end:
//
//   int main(int argc, char** argv) {
//     return blobpipe::cli::finish_stdout("custom_pipeline", run(argc, argv), 1);
//   }
#pragma once

#include <string>
#include <string_view>

namespace blobpipe::cli {

/// "write error: REASON" for errno value `err`; "write error" when `err`
/// is 0 (no reason known). The words finish_stdout prints after its prefix.
std::string write_error_text(int err);

/// Flushes std::cout and stdout. When they could not be written and
/// `status` is 0, prints one line `prefix: write error: REASON` to stderr
/// and returns `failure`; otherwise returns `status` (a program that has
/// already failed has said why). REASON is known when the failing write was
/// this flush; an earlier failure leaves std::cout bad without one.
int finish_stdout(std::string_view prefix, int status, int failure) noexcept;

}  // namespace blobpipe::cli
