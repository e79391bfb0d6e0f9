// blobpipe/pipeline/credit_pool.hpp: the grant policy, driven directly
// (members are counters standing in for consumers and their senders).
#define BOOST_TEST_MODULE credit_pool_test
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <random>

#include "blobpipe/pipeline/credit_pool.hpp"

using namespace blobpipe;

namespace {

/// A member as the pool sees it: what it was granted (beyond its initial
/// grant) and what it holds buffered.
struct fake {
  std::uint64_t id = 0;
  std::uint64_t granted = 0;   // initial + grants
  // What the member's session publishes (consumer_session::buffered_published).
  std::shared_ptr<std::atomic<std::uint64_t>> buffered =
      std::make_shared<std::atomic<std::uint64_t>>(0);
  std::uint64_t allowance() const { return granted - *buffered - released; }
  std::uint64_t released = 0;
};

struct harness {
  credit_pool pool;
  std::map<int, fake> m;
  explicit harness(std::uint64_t budget, std::uint64_t initial = 1 << 20,
                   std::uint64_t stream = credit_pool::default_stream_bytes,
                   std::uint64_t max_item = credit_pool::default_max_item_bytes)
      : pool(budget, initial, stream, max_item) {}

  fake& join(int k) {
    fake& f = m[k];
    auto [id, first] = pool.join([&f](std::uint64_t g) { f.granted += g; }, f.buffered);
    f.id = id;
    f.granted = first;
    return f;
  }
  /// The sender uses `n` of its allowance (an item decoded).
  void use(fake& f, std::uint64_t n) {
    BOOST_TEST_REQUIRE(f.allowance() >= n);
    *f.buffered += n;
  }
  /// The application drops `n` buffered bytes.
  void drop(fake& f, std::uint64_t n) {
    *f.buffered -= n;
    f.released += n;
    pool.released(f.id, n);
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(initial_grants_are_small_and_within_the_budget) {
  harness h(1600, 1000);
  auto& a = h.join(1);
  BOOST_TEST(a.granted == 100u);  // budget / 16
  harness big(1 << 30, 4096);
  BOOST_TEST(big.join(1).granted == 4096u);  // initial_grant_bytes
  harness tiny(10);
  BOOST_TEST(tiny.join(1).granted == 0u);  // it will ask
  BOOST_TEST(tiny.pool.stats().committed_bytes == 0u);
}

BOOST_AUTO_TEST_CASE(a_request_that_cannot_be_met_now_does_not_hold_up_the_ones_behind_it) {
  harness h(1000, 16);  // initial grants: 16 each
  auto& a = h.join(1);
  auto& b = h.join(2);
  auto& c = h.join(3);
  // c alone is active: its share is the whole budget.
  h.pool.request(c.id, 900);
  BOOST_TEST(c.allowance() == 900u);
  h.use(c, 900);
  // a asks for more than is free (1000 - 916 - 32 = 52), within its share.
  h.pool.request(a.id, 200);
  BOOST_TEST(a.granted == 16u);
  h.pool.request(b.id, 40);
  BOOST_TEST(b.allowance() == 40u);  // not behind a
  BOOST_TEST(a.granted == 16u);
  BOOST_TEST(h.pool.stats().requests_waiting == 1u);
  h.drop(c, 300);  // free: 328 >= a's 184
  BOOST_TEST(a.allowance() == 200u);
  BOOST_TEST(h.pool.stats().requests_waiting == 0u);
  BOOST_TEST(h.pool.stats().committed_high_water <= 1000u);
  BOOST_TEST(h.pool.stats().overcommits == 0u);
}

// Requests that wait for free budget are granted oldest first, whatever
// the order in which their connections joined.
BOOST_AUTO_TEST_CASE(waiting_requests_are_granted_oldest_first) {
  harness h(1200, 0);  // no initial grants
  auto& a = h.join(1);
  auto& b = h.join(2);
  auto& later = h.join(3);    // joined before `earlier`, asks after it
  auto& earlier = h.join(4);
  h.pool.request(a.id, 500);
  h.use(a, 500);
  h.pool.request(b.id, 500);
  h.use(b, 500);  // 200 free; four active members: shares of 300
  h.pool.request(earlier.id, 300);
  h.pool.request(later.id, 300);
  BOOST_TEST_REQUIRE(h.pool.stats().requests_waiting == 2u);
  h.drop(a, 300);  // 500 free: room for one request of 300
  BOOST_TEST(earlier.allowance() == 300u);
  BOOST_TEST(later.allowance() == 0u);
  BOOST_TEST(h.pool.stats().requests_waiting == 1u);
}

BOOST_AUTO_TEST_CASE(outstanding_credit_is_capped_by_the_share_of_the_active_members) {
  harness h(1000, 0);  // no initial grants
  auto& a = h.join(1);
  auto& b = h.join(2);
  h.pool.request(b.id, 100);
  h.use(b, 100);  // b active: shares of 500
  h.pool.request(a.id, 300);
  h.use(a, 300);
  // a asks for 300 more: 600 outstanding would exceed its share (its item
  // is within the share: its own buffered bytes must go first).
  h.pool.request(a.id, 300);
  BOOST_TEST(a.allowance() == 0u);
  BOOST_TEST(h.pool.stats().requests_waiting == 1u);
  h.drop(a, 200);  // 100 buffered: 400 fits the share (and what it released comes back up to it)
  BOOST_TEST(a.allowance() >= 300u);
  BOOST_TEST(a.granted - a.released == 500u);
  BOOST_TEST(h.pool.stats().overcommits == 0u);
}

BOOST_AUTO_TEST_CASE(released_credit_returns_to_its_member_up_to_the_active_share) {
  harness h(1000, 16);
  auto& a = h.join(1);
  auto& b = h.join(2);
  h.pool.request(a.id, 600);
  BOOST_TEST(a.allowance() == 600u);  // what it asked for in all
  h.use(a, 600);
  h.drop(a, 600);  // the only active member: its share is the whole budget
  BOOST_TEST(a.allowance() == 600u);  // what it released comes back, no more
  // Both active: shares of 500.
  h.use(a, 600);
  h.pool.request(b.id, 100);
  h.use(b, 100);
  const auto before = a.granted;
  h.drop(a, 50);  // 550 outstanding, above its share: what it released stays free
  BOOST_TEST(a.granted == before);
  h.drop(a, 250);  // 300: below its share again; it is filled up to it (500)
  BOOST_TEST(a.granted == before + 200);
  BOOST_TEST(h.pool.stats().committed_bytes <= 1000u);
}

BOOST_AUTO_TEST_CASE(active_members_share_the_stream_target_not_the_budget) {
  constexpr std::uint64_t stream = 1 << 20;
  harness h(1ull << 30, 1 << 20, stream);  // a budget that never binds
  auto& a = h.join(1);
  BOOST_TEST(a.granted == stream);  // alone: the whole stream target
  auto& b = h.join(2);
  auto& c = h.join(3);
  auto& d = h.join(4);
  BOOST_TEST(b.granted == stream / 2);  // each joins with its target among the open ones
  BOOST_TEST(c.granted == stream / 3);
  BOOST_TEST(d.granted == stream / 4);
  for (fake* f : {&b, &c, &d}) h.use(*f, 1000);  // busy: four active members
  h.use(a, stream);
  h.drop(a, stream);  // a now holds nothing: its target among b, c, d comes back
  const std::uint64_t goal = stream / 3;
  BOOST_TEST(a.allowance() == goal);
  // Busy again (a fourth active member), a holds more than stream / 4.
  // A request is still granted whole (the application
  // may hold all a has), and what a releases beyond its target stays free,
  // so its window shrinks back.
  h.use(a, goal);
  h.pool.request(a.id, 100'000);
  BOOST_TEST(a.allowance() == 100'000u);
  BOOST_TEST(h.pool.stats().requests_waiting == 0u);
  h.use(a, 100'000);
  const std::uint64_t committed = h.pool.stats().committed_bytes;
  h.drop(a, goal + 100'000);  // all of it: idle again, a's target is stream / 3
  BOOST_TEST(a.granted - a.released == goal);  // back to its target, no more
  BOOST_TEST(h.pool.stats().committed_bytes == committed - 100'000);
  // An item larger than the target is granted whole.
  h.pool.request(a.id, 4 * stream);
  BOOST_TEST(a.allowance() == 4 * stream);
  BOOST_TEST(h.pool.stats().overcommits == 0u);
}

BOOST_AUTO_TEST_CASE(the_target_never_falls_below_its_floor_nor_exceeds_the_budget_share) {
  harness many(1ull << 30, 1 << 20, 1 << 20);
  for (int k = 1; k <= 64; ++k) many.join(k);
  BOOST_TEST(many.m[64].granted == credit_pool::min_target_bytes);  // 1 MiB / 64 < the floor
  harness tight(1000, 1 << 20, 1 << 20);
  BOOST_TEST(tight.join(1).granted == 1000u / 16);  // the budget binds first
}

BOOST_AUTO_TEST_CASE(stream_bytes_zero_lets_a_member_hold_its_budget_share) {
  harness h(1ull << 30, 1 << 20, 0);  // no stream target
  auto& a = h.join(1);
  BOOST_TEST(a.granted == std::uint64_t{1} << 20);  // initial_grant_bytes, not a 64 KiB target
  h.pool.request(a.id, 300 << 20);
  h.use(a, 300 << 20);
  h.drop(a, 300 << 20);  // the only member: its share, the whole budget, comes back
  BOOST_TEST(a.allowance() == std::uint64_t{300} << 20);
}

BOOST_AUTO_TEST_CASE(an_item_larger_than_a_share_is_granted_beyond_the_budget_one_at_a_time) {
  constexpr std::uint64_t budget = 1000, max_item = 5000;
  harness h(budget, 16, credit_pool::default_stream_bytes, max_item);
  auto& a = h.join(1);
  auto& b = h.join(2);
  auto& c = h.join(3);
  h.pool.request(b.id, 100);
  h.use(b, 100);
  h.pool.request(a.id, 5000);  // larger than a's share (500) and the budget
  BOOST_TEST(a.allowance() == 5000u);
  BOOST_TEST(h.pool.stats().overcommits == 1u);
  BOOST_TEST(h.pool.stats().oversized_bytes == 4984u);
  h.pool.request(c.id, 600);  // larger than its share: a holds the oversized grant
  BOOST_TEST(c.granted == 16u);
  h.pool.request(b.id, 200);  // within b's share: not held up by either
  BOOST_TEST(b.allowance() == 200u);
  BOOST_TEST(h.pool.stats().committed_bytes <= budget + max_item);
  h.use(a, 5000);
  h.drop(a, 5000);  // released: c's turn
  BOOST_TEST(c.allowance() == 600u);
  BOOST_TEST(h.pool.stats().overcommits == 2u);
  BOOST_TEST(h.pool.stats().committed_high_water <= budget + max_item);
}

BOOST_AUTO_TEST_CASE(a_request_for_2_to_the_64_minus_1_gets_at_most_one_item) {
  constexpr std::uint64_t budget = 1000, max_item = 5000;
  harness h(budget, 16, credit_pool::default_stream_bytes, max_item);
  auto& a = h.join(1);
  auto& b = h.join(2);
  h.pool.request(a.id, ~std::uint64_t{0});
  BOOST_TEST(a.allowance() == max_item);
  h.pool.request(a.id, ~std::uint64_t{0});  // again: it has what one item needs
  BOOST_TEST(a.allowance() == max_item);
  h.pool.request(b.id, ~std::uint64_t{0} - 7);  // the oversized grant is a's
  BOOST_TEST(b.granted == 16u);
  h.pool.request(b.id, 100);  // an honest request replaces it
  BOOST_TEST(b.allowance() == 100u);
  BOOST_TEST(h.pool.stats().committed_high_water <= budget + max_item);
}

BOOST_AUTO_TEST_CASE(a_member_holding_unused_credit_others_wait_for_is_pressed) {
  harness h(1000, 16, 64);  // stream_bytes 64: an idle member may keep 64
  auto& a = h.join(1);
  auto& b = h.join(2);
  h.pool.request(a.id, 900);  // a alone active: its share is the budget
  BOOST_TEST(a.allowance() == 900u);
  BOOST_TEST(!h.pool.pressed(a.id));  // nobody waits
  h.pool.request(b.id, 200);  // within b's share, but not free
  BOOST_TEST(b.granted == 16u);
  BOOST_TEST(h.pool.pressed(a.id));
  BOOST_TEST(!h.pool.pressed(b.id));  // its own request is no pressure
  h.use(a, 850);  // a uses it: 50 unused, below max(initial, stream)
  BOOST_TEST(!h.pool.pressed(a.id));
  h.pool.close(a.id);  // (or its consumer ends it): the unused comes back
  BOOST_TEST(!h.pool.pressed(a.id));
}

BOOST_AUTO_TEST_CASE(a_request_waiting_for_free_budget_starves_the_pool_and_calls_its_owner) {
  harness h(1000, 16);
  int calls = 0;
  h.pool.on_starved([&calls] { ++calls; });
  auto& a = h.join(1);
  auto& b = h.join(2);
  h.pool.request(a.id, 984);  // a alone active: all that is free
  BOOST_TEST(a.allowance() == 984u);
  BOOST_TEST(h.pool.unused_bytes(a.id) == 984u);
  BOOST_TEST(!h.pool.starved());
  BOOST_TEST(calls == 0);
  h.use(a, 84);
  BOOST_TEST(h.pool.unused_bytes(a.id) == 900u);  // granted, not buffered
  // b asks within its share, and nothing is free: only credit a holds can
  // meet it.
  h.pool.request(b.id, 100);
  BOOST_TEST(b.granted == 16u);
  BOOST_TEST(h.pool.starved());
  BOOST_TEST(calls == 1);
  // a's connection is closed (a server reclaims it): its unused credit
  // meets b's request at once.
  h.pool.close(a.id);
  BOOST_TEST(b.allowance() == 100u);
  BOOST_TEST(!h.pool.starved());
  BOOST_TEST(h.pool.unused_bytes(a.id) == 0u);
}

BOOST_AUTO_TEST_CASE(a_request_waiting_for_its_own_buffered_bytes_does_not_starve_the_pool) {
  harness h(1000, 16);
  auto& a = h.join(1);
  h.pool.request(a.id, 600);
  h.use(a, 600);
  // 600 more would take it past its share (1000): its own buffered bytes
  // must go first, and free budget would not help.
  h.pool.request(a.id, 600);
  BOOST_TEST(h.pool.stats().requests_waiting == 1u);
  BOOST_TEST(!h.pool.starved());
}

BOOST_AUTO_TEST_CASE(close_returns_unused_credit_and_forget_drops_the_rest) {
  harness h(1000, 16);
  auto& a = h.join(1);
  h.pool.request(a.id, 500);
  h.use(a, 200);
  h.pool.close(a.id);  // 300 unused come back; 200 stay until released
  BOOST_TEST(h.pool.stats().committed_bytes == 200u);
  h.drop(a, 100);
  BOOST_TEST(h.pool.stats().committed_bytes == 100u);
  BOOST_TEST(h.pool.stats().connections == 1u);
  h.drop(a, 100);
  BOOST_TEST(h.pool.stats().committed_bytes == 0u);
  BOOST_TEST(h.pool.stats().connections == 0u);
  auto& b = h.join(2);
  h.pool.request(b.id, 300);
  h.use(b, 300);
  h.pool.forget(b.id);
  BOOST_TEST(h.pool.stats().committed_bytes == 0u);
}

BOOST_AUTO_TEST_CASE(random_traffic_never_commits_beyond_the_budget_without_an_oversized_item) {
  constexpr std::uint64_t budget = 10'000;
  harness h(budget, 64);
  std::mt19937 rng(12345);
  std::vector<fake*> members;
  for (int k = 0; k < 6; ++k) members.push_back(&h.join(k));
  std::map<std::uint64_t, std::uint64_t> want;  // member id -> item waiting
  for (int step = 0; step < 20'000; ++step) {
    fake& f = *members[rng() % members.size()];
    switch (rng() % 3) {
      case 0: {  // the sender has an item (<= 1500: never oversized here)
        const std::uint64_t n = 1 + rng() % 1500;
        if (f.allowance() >= n) {
          h.use(f, n);
        } else if (!want.count(f.id)) {
          want[f.id] = n;
          h.pool.request(f.id, n);
        }
        break;
      }
      case 1:  // the application drops some
        if (*f.buffered) h.drop(f, 1 + rng() % *f.buffered);
        break;
      case 2:  // a waiting sender whose credit came
        if (auto it = want.find(f.id); it != want.end() && f.allowance() >= it->second) {
          h.use(f, it->second);
          want.erase(it);
        }
        break;
    }
    std::uint64_t buffered = 0;
    for (auto* m : members) buffered += *m->buffered;
    const auto st = h.pool.stats();
    BOOST_TEST_REQUIRE(buffered <= st.committed_bytes);
    BOOST_TEST_REQUIRE(st.committed_bytes <= budget);
  }
  BOOST_TEST(h.pool.stats().overcommits == 0u);
  BOOST_TEST(h.pool.stats().grants > 100u);
}

// forget() gives what the member held back to the pool at once: a
// request waiting for it is granted in the same call, not at the next
// release or request (credit_pool.hpp forget).
BOOST_AUTO_TEST_CASE(a_forgotten_members_credit_meets_a_waiting_request_at_once) {
  harness h(1000, 16);
  auto& a = h.join(1);
  auto& b = h.join(2);
  h.pool.request(a.id, 984);  // all that is free
  h.use(a, 584);              // 584 buffered, 400 unused
  h.pool.request(b.id, 300);  // within its share, and nothing is free
  BOOST_TEST(b.granted == 16u);
  h.pool.forget(a.id);  // a's consumer is gone with all it held
  BOOST_TEST(b.allowance() == 300u);
  BOOST_TEST(h.pool.stats().requests_waiting == 0u);
}
