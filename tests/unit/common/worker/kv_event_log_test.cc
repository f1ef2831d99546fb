// KvEventLog: what a watcher of a worker's prefix cache sees from its cursor.

#include "common/worker/kv_event_log.h"

#include <algorithm>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

TEST(KvEventLogTest, FirstReadIsASnapshotOfTheLiveSet) {
  KvEventLog log;
  log.Stored(1);
  log.Stored(2);
  log.Stored(3);
  log.Removed(2);
  KvEventLog::Delta d = log.Read(0);
  EXPECT_TRUE(d.snapshot);
  EXPECT_THAT(d.stored, UnorderedElementsAre(1, 3));
  EXPECT_THAT(d.removed, IsEmpty());
  EXPECT_EQ(d.next_cursor, 5u);  // four events, numbered from 1
}

TEST(KvEventLogTest, LaterReadsGetTheEventsSinceTheCursorInOrder) {
  KvEventLog log;
  log.Stored(1);
  const uint64_t cursor = log.Read(0).next_cursor;
  log.Stored(7);
  log.Removed(1);
  log.Stored(8);
  KvEventLog::Delta d = log.Read(cursor);
  EXPECT_FALSE(d.snapshot);
  EXPECT_THAT(d.stored, ElementsAre(7, 8));
  EXPECT_THAT(d.removed, ElementsAre(1));
  // Nothing new: an empty delta with the same cursor.
  KvEventLog::Delta again = log.Read(d.next_cursor);
  EXPECT_FALSE(again.snapshot);
  EXPECT_THAT(again.stored, IsEmpty());
  EXPECT_THAT(again.removed, IsEmpty());
  EXPECT_EQ(again.next_cursor, d.next_cursor);
}

TEST(KvEventLogTest, ACursorOutsideTheRetainedWindowGetsASnapshot) {
  KvEventLog log(/*max_events=*/4);
  log.Stored(1);
  const uint64_t old_cursor = log.Read(0).next_cursor;  // 2
  for (BlockHash h = 10; h < 16; ++h) log.Stored(h);    // events 2..7; 1..3 fall out
  log.Removed(10);
  KvEventLog::Delta d = log.Read(old_cursor);
  EXPECT_TRUE(d.snapshot);  // events it missed are gone: it must drop what it had
  EXPECT_THAT(d.stored, UnorderedElementsAre(1, 11, 12, 13, 14, 15));
  EXPECT_EQ(d.next_cursor, 9u);
  // A cursor still inside the window reads the tail only.
  KvEventLog::Delta tail = log.Read(7);
  EXPECT_FALSE(tail.snapshot);
  EXPECT_THAT(tail.stored, ElementsAre(15));
  EXPECT_THAT(tail.removed, ElementsAre(10));
}

TEST(KvEventLogTest, AWatcherFollowingTheCursorRebuildsTheLiveSet) {
  // Writer and reader on two threads (as the engine thread and the watch ticker are): applying
  // the deltas in order reproduces the final live set exactly.
  KvEventLog log(/*max_events=*/64);
  std::thread writer([&] {
    for (BlockHash h = 1; h <= 2000; ++h) {
      log.Stored(h);
      if (h % 3 == 0) log.Removed(h - 1);
    }
  });
  std::vector<BlockHash> view;
  uint64_t cursor = 0;
  auto apply = [&](const KvEventLog::Delta& d) {
    if (d.snapshot) view.clear();
    for (BlockHash h : d.stored) view.push_back(h);
    for (BlockHash h : d.removed) view.erase(std::find(view.begin(), view.end(), h));
    cursor = d.next_cursor;
  };
  for (int i = 0; i < 200; ++i) apply(log.Read(cursor));
  writer.join();
  apply(log.Read(cursor));
  KvEventLog::Delta truth = log.Read(0);
  std::sort(view.begin(), view.end());
  std::sort(truth.stored.begin(), truth.stored.end());
  EXPECT_EQ(view, truth.stored);
  EXPECT_EQ(view.size(), 2000u - 666u);
}

TEST(KvEventLogTest, TierEventsKeepTheirMediumApartFromThePool) {
  KvEventLog log;
  log.Stored(1);
  log.Stored(2, KvMedium::kHost);
  log.Stored(3, KvMedium::kDisk);
  log.Stored(1, KvMedium::kDisk);  // the same block in the pool and on disk
  KvEventLog::Delta snap = log.Read(0);
  EXPECT_TRUE(snap.snapshot);
  EXPECT_THAT(snap.stored, UnorderedElementsAre(1));
  EXPECT_THAT(snap.tier_stored[0], UnorderedElementsAre(2));
  EXPECT_THAT(snap.tier_stored[1], UnorderedElementsAre(3, 1));
  log.Removed(1);  // evicted from the pool, still on disk
  log.Removed(2, KvMedium::kHost);
  log.Stored(2, KvMedium::kDisk);
  KvEventLog::Delta d = log.Read(snap.next_cursor);
  EXPECT_FALSE(d.snapshot);
  EXPECT_THAT(d.removed, ElementsAre(1));
  EXPECT_THAT(d.stored, IsEmpty());
  EXPECT_THAT(d.tier_removed[0], ElementsAre(2));
  EXPECT_THAT(d.tier_stored[1], ElementsAre(2));
  EXPECT_THAT(log.Read(0).tier_stored[1], UnorderedElementsAre(1, 2, 3));
  EXPECT_THAT(log.Read(0).stored, IsEmpty());
}

}  // namespace
}  // namespace tandem
