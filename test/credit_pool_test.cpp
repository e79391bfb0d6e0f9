// blobpipe/pipeline/credit_pool.hpp: the grant policy, driven directly
// (members are counters standing in for consumers and their senders).
#define BOOST_TEST_MODULE credit_pool_test
#include <boost/test/unit_test.hpp>

#include <map>
#include <random>

#include "blobpipe/pipeline/credit_pool.hpp"

using namespace blobpipe;

namespace {

/// A member as the pool sees it: what it was granted (beyond its initial
/// grant) and what it holds buffered.
struct fake {
  std::uint64_t id = 0;
  std::uint64_t granted = 0;   // initial + grants
  std::uint64_t buffered = 0;
  std::uint64_t allowance() const { return granted - buffered - released; }
  std::uint64_t released = 0;
};

struct harness {
  credit_pool pool;
  std::map<int, fake> m;
  explicit harness(std::uint64_t budget, std::uint64_t initial = 1 << 20,
                   std::uint64_t stream = credit_pool::default_stream_bytes)
      : pool(budget, initial, stream) {}

  fake& join(int k) {
    fake& f = m[k];
    auto [id, first] = pool.join([&f](std::uint64_t g) { f.granted += g; },
                                 [&f] { return f.buffered; });
    f.id = id;
    f.granted = first;
    return f;
  }
  /// The sender uses `n` of its allowance (an item decoded).
  void use(fake& f, std::uint64_t n) {
    BOOST_TEST_REQUIRE(f.allowance() >= n);
    f.buffered += n;
  }
  /// The application drops `n` buffered bytes.
  void drop(fake& f, std::uint64_t n) {
    f.buffered -= n;
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

BOOST_AUTO_TEST_CASE(requests_are_granted_whole_and_oldest_first) {
  harness h(1000, 16);  // initial grants: 16 each
  auto& a = h.join(1);
  auto& b = h.join(2);
  auto& c = h.join(3);
  // c takes most of the budget.
  h.pool.request(c.id, 800);
  BOOST_TEST(c.allowance() == 800u);
  h.use(c, 800);
  // a asks for more than is free (1000 - 816 - 32 = 152), then b for little.
  h.pool.request(a.id, 400);
  BOOST_TEST(a.granted == 16u);
  h.pool.request(b.id, 50);
  BOOST_TEST(b.granted == 16u);  // behind a: not starving the larger request
  BOOST_TEST(h.pool.stats().requests_waiting == 2u);
  h.drop(c, 300);  // free: 452 >= a's 384
  BOOST_TEST(a.allowance() == 400u);
  BOOST_TEST(b.allowance() == 50u);  // then b's, from what is left
  BOOST_TEST(h.pool.stats().requests_waiting == 0u);
  BOOST_TEST(h.pool.stats().committed_high_water <= 1000u);
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

BOOST_AUTO_TEST_CASE(an_item_no_release_can_make_room_for_is_granted_beyond_the_budget) {
  harness h(1000, 16);
  auto& a = h.join(1);
  auto& b = h.join(2);
  h.pool.request(b.id, 100);
  h.use(b, 100);
  h.pool.request(a.id, 5000);
  BOOST_TEST(a.granted == 16u);  // b's bytes may still be released
  BOOST_TEST(h.pool.stats().overcommits == 0u);
  h.drop(b, 100);  // nothing buffered anywhere: no release can help
  BOOST_TEST(a.allowance() == 5000u);
  BOOST_TEST(h.pool.stats().overcommits == 1u);
  h.use(a, 5000);
  h.pool.request(b.id, 5000);  // a second one waits while the first is buffered
  BOOST_TEST(h.pool.stats().overcommits == 1u);
  h.drop(a, 5000);
  BOOST_TEST(h.pool.stats().overcommits == 2u);
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
        if (f.buffered) h.drop(f, 1 + rng() % f.buffered);
        break;
      case 2:  // a waiting sender whose credit came
        if (auto it = want.find(f.id); it != want.end() && f.allowance() >= it->second) {
          h.use(f, it->second);
          want.erase(it);
        }
        break;
    }
    std::uint64_t buffered = 0;
    for (auto* m : members) buffered += m->buffered;
    const auto st = h.pool.stats();
    BOOST_TEST_REQUIRE(buffered <= st.committed_bytes);
    BOOST_TEST_REQUIRE(st.committed_bytes <= budget);
  }
  BOOST_TEST(h.pool.stats().overcommits == 0u);
  BOOST_TEST(h.pool.stats().grants > 100u);
}
