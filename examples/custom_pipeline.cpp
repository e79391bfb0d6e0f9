// examples/custom_pipeline.cpp — composing stages between a producer and a
// trainer.
//
//   producer ──▶ filter ──▶ cast ──▶ trainer      (each arrow: a loopback
//                                                   transport, in-process)
//
// A stage is a consumer on its input and a sender on its output, with a
// function in between that sees each complete blob (one sample) and says
// what to send on: the same entries, changed ones, or nothing. Here:
//   filter — drops samples whose reward is below a threshold;
//   cast   — sends generation_logprobs as bfloat16 instead of float32,
//            halving those bytes; every other entry goes on as it came.
// Forwarded entries are not copied: the outgoing value points into the
// received buffer and keeps it alive (value::owner) until it is sent.
//
//   bazel/bazelw run //examples:custom_pipeline
//
// It takes no options but a lone --help; anything else is a usage error
// (exit 2).
#include <bit>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <string_view>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include "blobpipe/pipeline.hpp"
#include "examples/rollout/reporting.hpp"
#include "examples/rollout/sample.hpp"
#include "tools/stdout_status.hpp"

namespace {

using blobpipe::event_kind;
using entry_ptr = std::shared_ptr<const blobpipe::received_entry>;

constexpr int exit_ok = 0;
constexpr int exit_mismatch = 1;  // the trainer got other samples than pass the filter
constexpr int exit_usage = 2;     // bad command line

constexpr std::int64_t samples = 12;
constexpr float min_reward = 0.85f;

void print_help(std::ostream& out) {
  out << "usage: custom_pipeline [--help]\n\n"
      << "Streams " << samples << " rollout samples, in one process, through two stages:\n"
      << "  producer -> filter -> cast -> trainer   (each arrow a loopback transport)\n"
      << "filter drops samples whose reward is below " << min_reward << "; cast sends\n"
      << "generation_logprobs as bfloat16 instead of float32. The trainer prints each\n"
      << "logprobs entry it receives and how many samples arrived.\n\n"
      << "options:\n"
      << "  --help   this text\n\n"
      << "exit status: 0 the trainer received exactly the samples that pass the\n"
      << "filter; 1 it did not, or stdout could not be written; 2 bad command line.\n";
}

struct out_entry {
  std::string key;
  blobpipe::value value;
};
// Given one complete blob, what to send on; nullopt drops the blob.
using stage_fn = std::function<std::optional<std::vector<out_entry>>(const std::vector<entry_ptr>&)>;

// An entry sent on unchanged: a value over the received bytes that holds
// the entry (and so its bytes) until the send has completed.
out_entry forward(const entry_ptr& e) {
  const blobpipe::Entry& row = e->entry;
  blobpipe::value v;
  if (row.kind == blobpipe::KIND_PICKLE) {
    v = blobpipe::value::pickle(e->view.bytes);
  } else {
    v = blobpipe::value::tensor_bytes(e->view.bytes, row.dtype.value_or("float32"),
                                      row.shape.value_or(blobpipe::shape_t{}));
  }
  v.owner = e;
  return {row.key, std::move(v)};
}

bool has_field(const entry_ptr& e, std::string_view name) {
  auto k = rollout::parse_sample_key(e->entry.key);
  return k && rollout::field_names[k->field] == name;
}

// float32 -> bfloat16, rounding to nearest even (NaN stays NaN).
std::uint16_t to_bfloat16(float f) {
  auto u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

std::optional<std::vector<out_entry>> filter_low_reward(const std::vector<entry_ptr>& blob) {
  for (const auto& e : blob) {
    if (!has_field(e, "reward")) continue;
    float r = e->view.at<float>(0);
    if (r < min_reward) {
      std::cout << "  filter: " << blobpipe::quote(e->entry.key) << " = " << r << " < " << min_reward
                << ", sample dropped\n";
      return std::nullopt;
    }
  }
  std::vector<out_entry> out;
  for (const auto& e : blob) out.push_back(forward(e));
  return out;
}

std::optional<std::vector<out_entry>> cast_logprobs(const std::vector<entry_ptr>& blob) {
  std::vector<out_entry> out;
  for (const auto& e : blob) {
    if (!has_field(e, "generation_logprobs")) {
      out.push_back(forward(e));
      continue;
    }
    auto bf16 = std::make_shared<std::vector<std::uint16_t>>();
    for (std::uint64_t i = 0; i < e->view.numel(); ++i)
      bf16->push_back(to_bfloat16(e->view.at<float>(i)));
    auto v = blobpipe::value::tensor_bytes(std::as_bytes(std::span(*bf16)), "bfloat16",
                                           *e->entry.shape);
    v.owner = bf16;  // the new bytes live until they are sent
    std::cout << "  cast:   " << blobpipe::quote(e->entry.key) << " float32 -> bfloat16 (" << e->entry.len
              << " -> " << bf16->size() * 2 << " bytes)\n";
    out.push_back({e->entry.key, std::move(v)});
  }
  return out;
}

// A stage: receive whole blobs on `in`, send what `fn` returns on `out`.
asio::awaitable<void> run_stage(std::unique_ptr<blobpipe::transport> in,
                                std::unique_ptr<blobpipe::transport> out, stage_fn fn) {
  auto [ec_in, c] = co_await blobpipe::consumer::start(std::move(in));
  auto [ec_out, s] = co_await blobpipe::sender::start(std::move(out));
  if (ec_in || ec_out) co_return;  // the closed ends tell the neighbours

  std::map<std::uint64_t, std::vector<entry_ptr>> open;  // by blob id
  for (;;) {
    blobpipe::event ev = co_await c.next();
    if (ev.kind == event_kind::end_of_stream) break;
    if (ev.kind == event_kind::entry_ready) {
      open[ev.blob_id].push_back(ev.entry);
      continue;
    }
    auto entries = std::move(open[ev.blob_id]);
    open.erase(ev.blob_id);
    if (ev.kind != event_kind::blob_complete) continue;  // aborted upstream
    auto next = fn(entries);
    if (!next) continue;
    auto blob = s.open_blob(ev.tag);
    for (auto& o : *next) {
      if (co_await blob.emit(o.key, o.value)) co_return;
    }
    if (co_await blob.finish()) co_return;
  }
  co_await s.shutdown();
}

asio::awaitable<void> produce(std::unique_ptr<blobpipe::transport> t) {
  auto [ec, s] = co_await blobpipe::sender::start(std::move(t));
  if (ec) co_return;
  rollout::sample_builder builder(rollout::corpus::embedded());
  for (std::int64_t n = 0; n < samples; ++n) {
    const rollout::sample smp = builder.make(n);
    auto blob = s.open_blob();
    for (const auto& f : rollout::fields(smp))
      if (co_await blob.emit(f.key, f.value)) co_return;
    if (co_await blob.finish()) co_return;
  }
  co_await s.shutdown();
}

asio::awaitable<void> train(std::unique_ptr<blobpipe::transport> t, int& received) {
  auto [ec, c] = co_await blobpipe::consumer::start(std::move(t));
  if (ec) co_return;
  for (;;) {
    blobpipe::event ev = co_await c.next();
    if (ev.kind == event_kind::end_of_stream) break;
    if (ev.kind == event_kind::blob_complete) ++received;
    if (ev.kind != event_kind::entry_ready || !has_field(ev.entry, "generation_logprobs")) continue;
    const auto& v = ev.entry->view;
    double sum = 0;
    for (std::uint64_t i = 0; i < v.numel(); ++i) sum += v.as_double(i).value();
    std::cout << "  trainer: " << blobpipe::quote(ev.entry->entry.key) << " " << v.type.name << "["
              << v.numel() << "], mean " << std::setprecision(3) << sum / v.numel() << "\n";
  }
}

int program(int argc, char** argv) {
  const auto is_help = [](std::string_view a) { return a == "--help" || a == "-h"; };
  if (argc == 2 && is_help(argv[1])) {
    print_help(std::cout);
    return exit_ok;
  }
  if (argc > 1) {
    // Anything but a lone --help is a usage error: name the first
    // argument that is not --help.
    std::string_view bad = argv[1];
    for (int i = 1; i < argc; ++i) {
      if (!is_help(argv[i])) {
        bad = argv[i];
        break;
      }
    }
    std::cerr << "custom_pipeline: unknown argument '" << bad
              << "' (it takes only --help)\nusage: custom_pipeline [--help]\n";
    return exit_usage;
  }

  asio::io_context ctx;
  auto ex = ctx.get_executor();
  auto [prod_out, filter_in] = blobpipe::loopback::make_pair(ex);
  auto [filter_out, cast_in] = blobpipe::loopback::make_pair(ex);
  auto [cast_out, train_in] = blobpipe::loopback::make_pair(ex);

  std::cout << "producer -> filter (reward >= " << min_reward
            << ") -> cast (logprobs to bfloat16) -> trainer, " << samples << " samples\n";
  int received = 0;
  // A stage that throws ends (its transports close, so its neighbours see
  // the stream end) and says why; the run then fails.
  std::string failure;
  auto spawn = [&](const char* stage, asio::awaitable<void> a) {
    asio::co_spawn(ex, rollout::reporting(std::move(a), [&failure, stage](std::string what) {
                     if (failure.empty()) failure = std::string(stage) + ": " + what;
                   }), asio::detached);
  };
  spawn("producer", produce(std::move(prod_out)));
  spawn("filter", run_stage(std::move(filter_in), std::move(filter_out), filter_low_reward));
  spawn("cast", run_stage(std::move(cast_in), std::move(cast_out), cast_logprobs));
  spawn("trainer", train(std::move(train_in), received));
  ctx.run();
  if (!failure.empty()) {
    std::cerr << "custom_pipeline: " << failure << "\n";
    return exit_mismatch;
  }

  // What should have arrived: the samples whose reward passes the filter.
  rollout::sample_builder builder(rollout::corpus::embedded());
  int expected = 0;
  for (std::int64_t n = 0; n < samples; ++n) expected += builder.make(n).reward >= min_reward;
  std::cout << "trainer received " << received << " of " << samples << " samples ("
            << expected << " pass the filter)\n";
  return received == expected ? exit_ok : exit_mismatch;
}

}  // namespace

int main(int argc, char** argv) {
  return blobpipe::cli::finish_stdout("custom_pipeline", program(argc, argv), exit_mismatch);
}
