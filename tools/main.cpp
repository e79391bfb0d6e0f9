// tools/main.cpp — entry point of the `blobpipe` CLI (see `blobpipe --help`).
#include <iostream>
#include <new>
#include <stdexcept>
#include <variant>

#include "blobpipe/version.hpp"
#include "tools/args.hpp"
#include "tools/commands.hpp"
#include "tools/stdout_status.hpp"

namespace {

int run(int argc, char** argv) {
  using namespace blobpipe::cli;
  auto parsed = parse_args(argc, argv);
  if (auto* bad = std::get_if<usage_error>(&parsed)) {
    std::cerr << "blobpipe: " << bad->message << '\n' << usage_line() << '\n';
    return exit_usage;
  }
  const options& o = std::get<options>(parsed);
  switch (o.cmd) {
    case command::help:
      std::cout << help_text();
      return exit_ok;
    case command::version:
      std::cout << "blobpipe " << blobpipe::version() << '\n';
      return exit_ok;
    case command::inspect:
      return run_inspect(o, std::cout, std::cerr);
    case command::verify:
      return run_verify(o, std::cout, std::cerr);
  }
  return exit_usage;
}

// run(), with an allocation that fails anywhere (a huge index's entries,
// the report of millions of rows) ending in exit 2 and the usual one line,
// `blobpipe: too_large: ...`, instead of std::terminate. The parsers
// report their own (too_large) before this is needed.
int run_within_memory(int argc, char** argv) {
  const char* what = nullptr;
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc&) {
    what = "out of memory";
  } catch (const std::length_error&) {  // a size past what a container can hold
    what = "out of memory (a size past what a container can hold)";
  }
  // Printed without allocating: the memory may still be short.
  std::cerr << "blobpipe: too_large: " << what << " while processing the blob\n";
  return blobpipe::cli::exit_invalid;
}

}  // namespace

int main(int argc, char** argv) {
  // A write error is an I/O failure: exit 3, `blobpipe: io: write error: ...`.
  return blobpipe::cli::finish_stdout("blobpipe: io", run_within_memory(argc, argv),
                                      blobpipe::cli::exit_io);
}
