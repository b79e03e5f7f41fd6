#include <gtest/gtest.h>
#include <sys/mman.h>

#include "vhost/region/guest_memory.h"
#include "vhost/region/shm_region.h"

namespace vsocket::vhost {
namespace {

TEST(GuestMemoryTest, TranslatesInsideAndRejectsOutside) {
  static uint8_t a[4096], b[4096];
  auto m = GuestMemory::Create({{0x10000, sizeof(a), a}, {0x40000, sizeof(b), b}});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->Translate(0x10000, 4096), a);
  EXPECT_EQ(m->Translate(0x40010, 16), b + 16);
  EXPECT_EQ(m->Translate(0x10000 + 4096, 0), a + 4096);  // empty range at the end
  EXPECT_EQ(m->Translate(0x10000 + 4095, 2), nullptr);   // straddles the end
  EXPECT_EQ(m->Translate(0x10ffff, 1), nullptr);         // between regions
  EXPECT_EQ(m->Translate(0xfff, 1), nullptr);
  EXPECT_EQ(m->Translate(~uint64_t{0}, 2), nullptr);  // wraps
  EXPECT_EQ(m->Translate(0x10000, ~uint64_t{0}), nullptr);
  EXPECT_TRUE(m->ContainsLocal(b + 100, 3996));
  EXPECT_FALSE(m->ContainsLocal(b + 100, 3997));
}

// Decision 130: a device limited to the pages its agent gave it reaches
// nothing else of the same memory, though it is mapped.
TEST(GuestMemoryTest, WindowLimitsEveryTranslation) {
  static uint8_t a[16384];
  auto m = GuestMemory::Create({{0x10000, sizeof(a), a}});
  ASSERT_TRUE(m.ok());
  auto w = MemWindow::Create({{0x11000, 0x1000}, {0x13000, 0x800}, {0x12000, 0x1000}});
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(w->ranges().size(), 1u) << "adjacent ranges merge";
  m->set_window(&*w);
  EXPECT_EQ(m->Translate(0x11000, 0x2800), a + 0x1000);  // the merged window, whole
  EXPECT_EQ(m->Translate(0x10fff, 1), nullptr);           // mapped, but before the window
  EXPECT_EQ(m->Translate(0x11000 + 0x27ff, 2), nullptr);  // straddles its end
  EXPECT_EQ(m->Translate(0x13800, 1), nullptr);           // mapped, after it
  EXPECT_EQ(m->Translate(0x13800, 0), a + 0x3800);        // empty range at its very end
  EXPECT_TRUE(m->ContainsLocal(a + 0x1000, 0x2800));
  EXPECT_FALSE(m->ContainsLocal(a, 16));
  EXPECT_FALSE(m->ContainsLocal(a + 0x3000, 0x1000));
  GuestMemory copy = *m;  // (a reload keeps the window)
  EXPECT_EQ(copy.Translate(0x10000, 1), nullptr);
  m->set_window(nullptr);
  EXPECT_EQ(m->Translate(0x10000, 1), a);
  EXPECT_FALSE(MemWindow::Create({{0x1000, 0x1000}, {0x1800, 0x1000}}).ok()) << "overlap";
  EXPECT_FALSE(MemWindow::Create({{0x1000, 0}}).ok()) << "empty";
  EXPECT_FALSE(MemWindow::Create({{~uint64_t{0} - 10, 0x1000}}).ok()) << "wraps";
  EXPECT_FALSE(MemWindow::Create({}).ok());
}

TEST(GuestMemoryTest, RejectsOverlappingAndEmptyRegions) {
  static uint8_t a[4096];
  EXPECT_FALSE(GuestMemory::Create({{0, 4096, a}, {4095, 10, a}}).ok());
  EXPECT_FALSE(GuestMemory::Create({{0, 0, a}}).ok());
  EXPECT_FALSE(GuestMemory::Create({{~uint64_t{0} - 10, 4096, a}}).ok());
}

TEST(ShmRegionTest, MemfdIsSharedBetweenMappings) {
  auto r = ShmRegion::Create("test", 10000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->size(), 12288u);  // page-rounded
  (*r)->base()[5] = 42;
  void* second = mmap(nullptr, (*r)->size(), PROT_READ, MAP_SHARED, (*r)->fd(), 0);
  ASSERT_NE(second, MAP_FAILED);
  EXPECT_EQ(static_cast<uint8_t*>(second)[5], 42);
  munmap(second, (*r)->size());
}

TEST(ShmRegionTest, HugePagesFallBackWhenUnavailable) {
  auto r = ShmRegion::Create("test", 4096, ShmRegion::Pages::kHugeIfAvailable);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  if ((*r)->huge_pages()) EXPECT_EQ((*r)->size() % (2u << 20), 0u);
  (*r)->base()[0] = 1;
}

TEST(RegionAllocatorTest, NoChunkCrossesTheBoundary) {
  alignas(64) static uint8_t mem[4096];
  RegionAllocator a(mem, sizeof(mem), 1024);
  uint8_t* p = a.Allocate(700);
  uint8_t* q = a.Allocate(700);  // would cross 1024: starts there
  uint8_t* r = a.Allocate(200);  // fits before 1024 again
  ASSERT_NE(p, nullptr);
  ASSERT_NE(q, nullptr);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(p, mem);
  EXPECT_EQ(q, mem + 1024);
  EXPECT_EQ(r, mem + 704);
  EXPECT_EQ(a.Allocate(1025), nullptr) << "larger than the boundary";
  for (uint8_t* x : {p, q, r}) {
    size_t off = static_cast<size_t>(x - mem);
    EXPECT_EQ(off / 1024, (off + 199) / 1024);
  }
  EXPECT_NE(a.Allocate(1024), nullptr);
}

TEST(RegionAllocatorTest, FirstFitAlignedNoOverlapAndReuse) {
  alignas(64) static uint8_t mem[4096];
  RegionAllocator a(mem, sizeof(mem));
  uint8_t* x = a.Allocate(100);
  uint8_t* y = a.Allocate(100);
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(y) % 64, 0u);
  EXPECT_GE(y, x + 100);
  EXPECT_EQ(a.Allocate(8192), nullptr);
  a.Free(x);
  EXPECT_EQ(a.Allocate(64), x);  // hole reused
  EXPECT_EQ(a.bytes_in_use(), 164u);
}

}  // namespace
}  // namespace vsocket::vhost
