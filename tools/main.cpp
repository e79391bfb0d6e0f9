// tools/main.cpp — entry point of the `blobpipe` CLI (see `blobpipe --help`).
#include <iostream>
#include <variant>

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
    case command::inspect:
      return run_inspect(o, std::cout, std::cerr);
    case command::verify:
      return run_verify(o, std::cout, std::cerr);
  }
  return exit_usage;
}

}  // namespace

int main(int argc, char** argv) {
  // A write error is an I/O failure: exit 3, `blobpipe: io: write error: ...`.
  return blobpipe::cli::finish_stdout("blobpipe: io", run(argc, argv), blobpipe::cli::exit_io);
}
