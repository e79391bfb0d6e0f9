// Writes the wire protocol's test vectors (test/wire_vectors.hpp) into a
// folder: one .bin file each, and vectors.txt with what a version-3
// consumer decodes from each (docs/wire.md "Test vectors").
//
//   bazel/bazelw run //test:wire_vectors_gen -- test/wire_vectors
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "test/wire_vectors.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: wire_vectors_gen DIR\n");
    return 2;
  }
  namespace fs = std::filesystem;
  fs::path dir = argv[1];
  if (dir.is_relative() && std::getenv("BUILD_WORKING_DIRECTORY"))
    dir = fs::path(std::getenv("BUILD_WORKING_DIRECTORY")) / dir;
  fs::create_directories(dir);
  std::ofstream txt(dir / "vectors.txt");
  txt << "# blobpipe wire protocol version 3: test vectors (docs/wire.md \"Test vectors\").\n"
         "# For each file: what a version-3 consumer with default limits decodes from it,\n"
         "# one event per line, or the error that ends the stream.\n";
  for (const auto& v : blobpipe::testing::build_vectors()) {
    std::ofstream bin(dir / v.name, std::ios::binary);
    bin.write(reinterpret_cast<const char*>(v.bytes.data()),
              static_cast<std::streamsize>(v.bytes.size()));
    txt << "== " << v.name << "\n";
    for (const auto& line : blobpipe::testing::decode_vector(v.bytes)) txt << line << "\n";
  }
  std::printf("wrote %s\n", dir.c_str());
  return 0;
}
