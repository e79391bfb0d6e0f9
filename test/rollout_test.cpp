// test/rollout_test.cpp — the rollout example's building blocks
// (examples/rollout: corpus split, sample keys and values, options),
// and the trainer's handling of an exception in a connection.
#define BOOST_TEST_MODULE rollout_test
#include <boost/test/unit_test.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "blobpipe/pipeline.hpp"
#include "blobpipe/transport/loopback.hpp"
#include "examples/rollout/check.hpp"
#include "examples/rollout/corpus.hpp"
#include "examples/rollout/error_text.hpp"
#include "examples/rollout/options.hpp"
#include "examples/rollout/sample.hpp"
#include "examples/rollout/trainer.hpp"

BOOST_AUTO_TEST_CASE(split_entry_puts_the_answer_in_the_response) {
  auto p = rollout::split_entry("Q:\tWhat is purple and commutes?\nA:\tAn Abelian grape.");
  BOOST_TEST(p.prompt == "Q:\tWhat is purple and commutes?\n");
  BOOST_TEST(p.response == "A:\tAn Abelian grape.");
  BOOST_TEST(p.source == "riddles");
}

BOOST_AUTO_TEST_CASE(split_entry_splits_one_line_after_its_first_sentence) {
  auto p = rollout::split_entry("Bank error in your favor.  Collect $200.");
  BOOST_TEST(p.prompt == "Bank error in your favor.  ");
  BOOST_TEST(p.response == "Collect $200.");
  auto q = rollout::split_entry("Chess tonight.");
  BOOST_TEST(q.prompt + q.response == "Chess tonight.");
  BOOST_TEST(!q.response.empty());
}

BOOST_AUTO_TEST_CASE(embedded_corpus_has_every_entry_with_a_response) {
  const auto& c = rollout::corpus::embedded();
  BOOST_TEST(c.size() == 187u);
  for (const auto& p : c.pairs()) {
    BOOST_TEST(!p.prompt.empty());
    BOOST_TEST(!p.response.empty());
  }
}

BOOST_AUTO_TEST_CASE(sample_masks_prompt_and_scores_response) {
  rollout::sample_builder b(rollout::corpus::embedded());
  auto s = b.make(3);
  const auto T = s.input_ids.size();
  BOOST_TEST(s.logprobs.size() == T);
  BOOST_TEST(s.token_mask.size() == T);
  for (std::size_t i = 0; i < T; ++i) {
    BOOST_TEST(s.token_mask[i] == (i >= s.prompt_tokens ? 1 : 0));
    if (i < s.prompt_tokens) BOOST_TEST(s.logprobs[i] == 0.0f);
    else BOOST_TEST(s.logprobs[i] < 0.0f);
  }
  BOOST_TEST(s.reward >= 0.0f);
  BOOST_TEST(s.reward <= 1.0f);
  // Same index, same bytes: the trainer rebuilds samples to check them.
  auto again = b.make(3);
  BOOST_TEST(again.input_ids == s.input_ids);
  BOOST_TEST(again.meta == s.meta);
}

BOOST_AUTO_TEST_CASE(fields_use_the_data_plane_keys_and_dtypes) {
  rollout::sample_builder b(rollout::corpus::embedded());
  auto s = b.make(12);
  auto f = rollout::fields(s);
  BOOST_TEST_REQUIRE(f.size() == 5u);
  BOOST_TEST(f[0].key == "12@input_ids");
  BOOST_TEST(f[0].value.dtype == "int64");
  BOOST_TEST(f[1].key == "12@generation_logprobs");
  BOOST_TEST(f[1].value.dtype == "float32");
  BOOST_TEST(f[2].key == "12@token_mask");
  BOOST_TEST(f[2].value.dtype == "bool");
  BOOST_TEST(f[3].key == "12@reward");
  BOOST_TEST(f[3].value.shape.empty());  // a 0-d tensor
  BOOST_TEST(f[3].bytes.size() == 4u);
  BOOST_TEST(f[4].key == "12@meta");
  BOOST_TEST(f[4].value.kind == 'p');
}

BOOST_AUTO_TEST_CASE(parse_sample_key_accepts_only_known_fields) {
  auto k = rollout::parse_sample_key("41@token_mask");
  BOOST_TEST_REQUIRE(k.has_value());
  BOOST_TEST(k->idx == 41);
  BOOST_TEST(k->field == 2u);
  BOOST_TEST(!rollout::parse_sample_key("41@advantages").has_value());
  BOOST_TEST(!rollout::parse_sample_key("x@reward").has_value());
  BOOST_TEST(!rollout::parse_sample_key("@reward").has_value());
  BOOST_TEST(!rollout::parse_sample_key("reward").has_value());
}

BOOST_AUTO_TEST_CASE(options_reject_unknown_transport_and_both_roles) {
  const char* rdma[] = {"x", "--transport", "rdma"};
  BOOST_TEST(std::holds_alternative<rollout::usage_error>(rollout::parse_options(3, rdma)));
  const char* ucx[] = {"x", "--transport", "ucx"};
  BOOST_TEST(std::holds_alternative<rollout::options>(rollout::parse_options(3, ucx)));
  const char* both[] = {"x", "--listen", "5555", "--connect", "h:5555"};
  BOOST_TEST(std::holds_alternative<rollout::usage_error>(rollout::parse_options(5, both)));
  const char* ok[] = {"x", "--connect=example.org:5555", "--batch", "32"};
  auto o = rollout::parse_options(4, ok);
  BOOST_TEST_REQUIRE(std::holds_alternative<rollout::options>(o));
  const auto& opt = std::get<rollout::options>(o);
  BOOST_TEST((opt.mode == rollout::role::workers));
  BOOST_TEST(opt.host == "example.org");
  BOOST_TEST(opt.port == 5555);
  BOOST_TEST(opt.batch == 32u);
}

// ---- the trainer loses no exception ---------------------------------------

namespace {

// Hands out one transport, then waits in accept() until closed.
class one_connection : public blobpipe::listener {
 public:
  one_connection(asio::any_io_executor ex, std::unique_ptr<blobpipe::transport> t)
      : t_(std::move(t)), closed_(ex, asio::steady_timer::time_point::max()) {}
  std::uint16_t port() const noexcept override { return 0; }
  asio::awaitable<std::tuple<std::error_code, std::unique_ptr<blobpipe::transport>>> accept(
      blobpipe::transport_options) override {
    if (t_) co_return std::tuple{std::error_code{}, std::move(t_)};
    co_await closed_.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    co_return std::tuple{make_error_code(blobpipe::errc::closed),
                         std::unique_ptr<blobpipe::transport>()};
  }
  void close() noexcept override { closed_.cancel(); }

 private:
  std::unique_ptr<blobpipe::transport> t_;
  asio::steady_timer closed_;
};

// A checker that runs out of memory at the first entry.
class throwing_check final : public rollout::checker {
 public:
  void on_entry(std::size_t, const blobpipe::received_entry&) override { throw std::bad_alloc(); }
  void on_blob(std::size_t, const blobpipe::completed_blob&, const blobpipe::tag_t&) override {}
  void on_aborted(std::size_t, const blobpipe::event&) override {}
  std::uint64_t done() const noexcept override { return 0; }
  std::uint64_t total() const noexcept override { return 1; }
  const char* unit() const noexcept override { return "blobs"; }
  std::uint64_t entries() const noexcept override { return 0; }
  std::uint64_t bytes() const noexcept override { return 0; }
  bool report(std::ostream&) const override { return false; }
  std::string ok_text() const override { return "never"; }
};

}  // namespace

// An exception that ends a connection's coroutine is reported as a problem
// of that connection and the trainer ends at once. Lost in a detached
// co_spawn, it would leave a closer pointing at the destroyed consumer:
// the trainer would wait for its timeout, then crash calling it.
BOOST_AUTO_TEST_CASE(trainer_reports_an_exception_in_a_connection_and_ends) {
  asio::io_context ctx;
  auto ex = ctx.get_executor();
  auto [client, server] = blobpipe::loopback::make_pair(ex);
  std::ostringstream out;
  auto tr = std::make_shared<rollout::trainer>(
      ex, std::make_unique<one_connection>(ex, std::move(server)),
      std::make_unique<throwing_check>(),
      rollout::trainer_config{.connections = 1, .timeout = std::chrono::seconds(20)}, out);
  std::optional<bool> ok;
  asio::co_spawn(ex, tr->run(), [&](std::exception_ptr e, bool r) {
    BOOST_TEST(!e);
    ok = r;
  });
  asio::co_spawn(
      ex,
      [&]() -> asio::awaitable<void> {
        auto [ec, s] = co_await blobpipe::sender::start(std::move(client));
        if (ec) co_return;
        auto blob = s.open_blob();
        const std::vector<float> x = {1, 2, 3};
        if (co_await blob.emit("x", blobpipe::value::tensor(x))) co_return;
        (void)co_await blob.finish();
        (void)co_await s.shutdown();
      },
      asio::detached);
  ctx.run();
  BOOST_TEST_REQUIRE(ok.has_value());
  BOOST_TEST(!*ok);
  BOOST_TEST(out.str().find("connection 0: std::bad_alloc") != std::string::npos, out.str());
  // Ended by the exception, not by the watchdog.
  BOOST_TEST(out.str().find("timed out") == std::string::npos, out.str());
}

// A blob_abort reason is the peer's text: a newline in it must not start a
// line of the trainer's report, so "\n OK: every sample arrived" cannot
// forge the pass line; an escape sequence reaches no terminal.
BOOST_AUTO_TEST_CASE(abort_reason_cannot_forge_a_report_line) {
  auto builder = std::make_shared<const rollout::sample_builder>(rollout::corpus::embedded());
  auto check = rollout::make_batch_check(builder, 2);
  blobpipe::event ev;
  ev.kind = blobpipe::event_kind::blob_aborted;
  ev.error = make_error_code(blobpipe::errc::aborted);
  ev.reason = "gone\n OK: every sample arrived\r\x1b[2J";
  check->on_aborted(0, ev);
  std::ostringstream out;
  BOOST_TEST(!check->report(out));
  const std::string text = out.str();
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    BOOST_TEST(line.find("OK:") != 0u, text);
    BOOST_TEST(line.find(" OK:") != 0u, text);
  }
  BOOST_TEST(text.find("gone\\n OK: every sample arrived\\r\\x1b[2J") != std::string::npos, text);
  BOOST_TEST(text.find('\r') == std::string::npos, text);
  BOOST_TEST(text.find('\x1b') == std::string::npos, text);
  // The error text the trainer prints for a connection's end, too.
  BOOST_TEST(rollout::error_text(ev.error, ev.reason).find('\n') == std::string::npos);
}
