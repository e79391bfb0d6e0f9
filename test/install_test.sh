#!/usr/bin/env bash
# test/install_test.sh INSTALL VERSION_BZL — installs blobpipe with //:install into a
# scratch PREFIX, then compiles, links and runs a small program against the
# installed tree twice: with pkg-config (blobpipe.pc) and with CMake
# (find_package(blobpipe), blobpipe::blobpipe). The program uses the codec,
# the pickle writer and URL parsing, and streams a blob through a sender and
# a consumer over loopback, TCP and UCX (so the pipeline, protocol and
# transport libraries must be in libblobpipe.a, and the link flags for UCX,
# OpenSSL and libsodium must be right); it exits 0 only when all of that works. UCX
# that cannot start on this machine is a SKIPPED line, not a failure. Without g++, pkg-config or
# cmake the part that needs it prints `SKIPPED: <target> <part>: <reason>`.
set -uo pipefail

install=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")  # a path, not a name PATH resolves
# find_package asks for this MAJOR.MINOR, from the one place it is written.
version=$(sed -n 's/^BLOBPIPE_VERSION = "\([0-9]*\.[0-9]*\)\..*"$/\1/p' "$2")
[[ -n $version ]] || { echo "FAILED: no BLOBPIPE_VERSION in $2"; exit 1; }
target=${TEST_TARGET:-install_test.sh}
work=${TEST_TMPDIR:-$(mktemp -d)}/install_test
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
failures=0
fail() { echo "FAILED: $*"; failures=$((failures + 1)); }

if ! command -v g++ >/dev/null; then
  echo "SKIPPED: $target (every part): g++ is not installed"
  echo "ALL SKIPPED: $target: every part"
  exit 0
fi
"$install" "$prefix" || { echo "FAILED: //:install $prefix"; exit 1; }
for f in include/blobpipe/format.hpp include/blobpipe/cluster/server.hpp lib/libblobpipe.a \
         lib/pkgconfig/blobpipe.pc lib/cmake/blobpipe/blobpipeConfig.cmake; do
  [[ -f $prefix/$f ]] || fail "$f not installed"
done

mkdir -p "$work/app"
cat >"$work/app/main.cpp" <<'CPP'
// Uses the installed library as an application would: the codec, the
// pickle writer, URLs, and a blob streamed through a sender and a consumer
// (//lib/pipeline, //lib/protocol with OpenSSL's SHA-256, the transports)
// over each transport named on the command line: loopback, tcp, ucx.
// Prints one line per transport, "<name>: streamed", "<name>: SKIPPED
// <why>" (UCX could not start here) or "<name>: FAILED <why>".
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include "blobpipe/format.hpp"
#include "blobpipe/pipeline.hpp"
#include "blobpipe/transport/url.hpp"

namespace {

const std::vector<float> x = {0, 1, 2, 3, 4, 5};
const std::vector<std::int64_t> ids = {101, 2023, 102};

// Outside the coroutine: GCC 12 rejects a braced shape inside one.
blobpipe::value x_value() { return blobpipe::value::tensor(x, {2, 3}); }
blobpipe::value ids_value() { return blobpipe::value::tensor(ids); }

struct outcome {
  std::string error;  // the first thing that went wrong
  int entries_ok = 0;
  bool complete = false;
};

asio::awaitable<void> send(std::unique_ptr<blobpipe::transport> t, outcome& o) {
  auto [ec, s] = co_await blobpipe::sender::start(std::move(t));
  if (!ec) {
    auto blob = s.open_blob();
    ec = co_await blob.emit("x", x_value());
    if (!ec) ec = co_await blob.emit("ids", ids_value());
    if (!ec) ec = co_await blob.finish();
    if (!ec) ec = co_await s.shutdown();
  }
  if (ec && o.error.empty()) o.error = "sender: " + ec.message();
}

asio::awaitable<void> receive(std::unique_ptr<blobpipe::transport> t, outcome& o) {
  auto [ec, c] = co_await blobpipe::consumer::start(std::move(t));
  if (ec) {
    if (o.error.empty()) o.error = "consumer: " + ec.message();
    co_return;
  }
  for (;;) {
    auto ev = co_await c.next();
    if (ev.kind == blobpipe::event_kind::entry_ready) {
      const auto& v = ev.entry->view;
      const auto& want = ev.entry->entry.key == "x" ? std::as_bytes(std::span(x))
                                                    : std::as_bytes(std::span(ids));
      if (v.bytes.size() == want.size() &&
          std::memcmp(v.bytes.data(), want.data(), want.size()) == 0)
        ++o.entries_ok;
    } else if (ev.kind == blobpipe::event_kind::blob_complete) {
      o.complete = ev.blob->index.entries.size() == 2;
    } else if (ev.kind == blobpipe::event_kind::blob_aborted) {
      if (o.error.empty()) o.error = "blob aborted: " + ev.reason;
    } else {
      if (ev.error && o.error.empty()) o.error = "stream: " + ev.reason;
      co_return;
    }
  }
}

/// Connects to `l`'s URL and sends; closes `l` when the connect fails, so
/// that its accept ends too.
asio::awaitable<void> connect_and_send(blobpipe::url_listener* l, outcome& o) {
  auto ex = co_await asio::this_coro::executor;
  auto [ec, t] = co_await blobpipe::connect(ex, l->url());
  if (ec) {
    o.error = "connect " + l->url() + ": " + ec.message();
    l->close();
    co_return;
  }
  co_await send(std::move(t), o);
}

asio::awaitable<void> over_url(std::string url, outcome& o, bool& skipped) {
  auto ex = co_await asio::this_coro::executor;
  auto l = blobpipe::listen(ex, url);
  if (!l) {
    // UCX that cannot start here (no transport it may use) is a skip.
    skipped = url.starts_with("ucx:");
    o.error = "listen " + url + ": " + l.message();
    co_return;
  }
  asio::co_spawn(ex, connect_and_send(l->get(), o), asio::detached);
  auto [ec, t] = co_await (*l)->accept();
  if (ec) {
    if (o.error.empty()) o.error = "accept: " + ec.message();
    co_return;
  }
  co_await receive(std::move(t), o);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<float> xs = {0, 1, 2, 3, 4, 5};
  auto meta = blobpipe::pickle(blobpipe::pickle_value::dict{{"idx", 7}}).value();
  auto p = blobpipe::plan({"x", "meta"}, {blobpipe::value::tensor(xs, {2, 3}),
                                          blobpipe::value::pickle(meta)});
  std::vector<std::byte> blob(p->nbytes);
  blobpipe::write(*p, blob).value();
  auto idx = blobpipe::read_index(blob);
  auto v = blobpipe::decode_entry(blob, idx->entries[0]);
  auto u = blobpipe::parse_url("tcp://127.0.0.1:5555");
  const bool ok = v->at<float>(5) == 5.0f && idx->entries.size() == 2 && u && u->port == 5555;
  std::printf("%s\n", ok ? "blobpipe works" : "blobpipe is broken");
  int status = ok ? 0 : 1;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    asio::io_context ctx;
    outcome o;
    bool skipped = false;
    if (name == "loopback") {
      auto [a, b] = blobpipe::loopback::make_pair(ctx.get_executor());
      asio::co_spawn(ctx, send(std::move(a), o), asio::detached);
      asio::co_spawn(ctx, receive(std::move(b), o), asio::detached);
    } else {
      asio::co_spawn(ctx, over_url(name + "://127.0.0.1:0", o, skipped), asio::detached);
    }
    ctx.run();
    if (skipped) {
      std::printf("%s: SKIPPED %s\n", name.c_str(), o.error.c_str());
    } else if (o.error.empty() && o.complete && o.entries_ok == 2) {
      std::printf("%s: streamed\n", name.c_str());
    } else {
      std::printf("%s: FAILED %s (entries intact %d of 2, blob %s)\n", name.c_str(),
                  o.error.c_str(), o.entries_ok, o.complete ? "complete" : "not complete");
      status = 1;
    }
  }
  return status;
}
CPP

# check_run PART PROGRAM: runs the program over every transport; the codec
# line and a "streamed" line for loopback and tcp are required; ucx may
# say SKIPPED (UCX could not start here), which becomes our SKIPPED line.
check_run() {
  local part=$1 program=$2 out
  out=$("$program" loopback tcp ucx 2>&1)
  echo "$out" | sed "s/^/  $part: /"
  echo "$out" | grep -qx "blobpipe works" || fail "$part build: the codec does not work"
  for t in loopback tcp; do
    echo "$out" | grep -qx "$t: streamed" || fail "$part build: no blob streamed over $t"
  done
  if echo "$out" | grep -q "^ucx: SKIPPED "; then
    echo "SKIPPED: $target $part ucx: $(echo "$out" | sed -n 's/^ucx: SKIPPED //p')"
  else
    echo "$out" | grep -qx "ucx: streamed" || fail "$part build: no blob streamed over ucx"
  fi
}

# pkg-config
if command -v pkg-config >/dev/null; then
  if flags=$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs blobpipe); then
    # shellcheck disable=SC2086  # flags are words
    if g++ -o "$work/app/by_pkgconfig" "$work/app/main.cpp" $flags; then
      check_run pkg-config "$work/app/by_pkgconfig"
    else
      fail "g++ with pkg-config's flags ($flags)"
    fi
  else
    fail "pkg-config --cflags --libs blobpipe"
  fi
else
  echo "SKIPPED: $target pkg-config: pkg-config is not installed (Debian: pkg-config)"
fi

# CMake
if command -v cmake >/dev/null; then
  cat >"$work/app/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(blobpipe_user LANGUAGES CXX)
find_package(blobpipe $version REQUIRED)
add_executable(by_cmake main.cpp)
target_link_libraries(by_cmake PRIVATE blobpipe::blobpipe)
CMAKE
  if cmake -S "$work/app" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" >"$work/cmake.log" 2>&1 &&
     cmake --build "$work/build" >>"$work/cmake.log" 2>&1; then
    check_run cmake "$work/build/by_cmake"
  else
    cat "$work/cmake.log"
    fail "cmake configure or build against $prefix"
  fi
else
  echo "SKIPPED: $target cmake: cmake is not installed (Debian: cmake; bazel/bazelw installs it)"
fi

echo "install_test: $failures failed"
[[ $failures -eq 0 ]]
