// CUDA tensors and the backend facade: device queries that must never crash without a GPU,
// clear errors, and (with a device) upload/download round trips, copies, zero and fill.
#include <doctest/doctest.h>

#include <numeric>
#include <random>
#include <stdexcept>

#include "ops/backend.hpp"
#include "tests/cuda/cuda_test_util.hpp"

namespace fusion::test {

TEST_CASE("cuda device queries never crash, with or without a GPU") {
  const int n = cuda_device_count();
  CHECK(n >= 0);
  CHECK(cuda_compiled() == (FUSION_HAVE_CUDA != 0));
  MESSAGE("CUDA compiled in: " << cuda_compiled() << ", devices: " << n);
  CHECK(make_backend("cpu")->kind() == device_kind::cpu);
  CHECK_THROWS_AS(make_backend("gpu"), std::runtime_error);
  CHECK_THROWS_AS(make_backend("cuda:x"), std::runtime_error);
  CHECK_THROWS_AS(make_backend("cuda:"), std::runtime_error);
  if (n == 0) {
    try {
      make_backend("cuda");
      FAIL("make_backend(cuda) succeeded without a device");
    } catch (const std::runtime_error& e) {
      MESSAGE("make_backend(cuda) without a device: " << std::string(e.what()));
      CHECK(std::string(e.what()).find("cuda") != std::string::npos);
    }
    // A CUDA tensor cannot be made, but asking is an exception, not a crash.
    register_cuda_backend();
    CHECK_THROWS(tensor({4}, dtype::f32, device_kind::cuda));
    CHECK_THROWS(tensor({4}, dtype::f32).to_device(device_kind::cuda));
  }
  CHECK_THROWS(make_backend("cuda:1000"));
}

TEST_CASE("cuda tensor upload and download round trips") {
  FUSION_GPU_OR_SKIP(g);
  CHECK(g.kind() == device_kind::cuda);
  MESSAGE("testing on " << g.name());
  std::mt19937 rng(1);
  // Bigger than the 8 MiB pinned staging buffer: the download goes in chunks.
  for (const shape_t& s : {shape_t{}, shape_t{0}, shape_t{3, 5}, shape_t{3, 1024, 1024}}) {
    const tensor h = random_f32(s, rng);
    tensor d = g.upload(h);
    CHECK(d.device() == device_kind::cuda);
    CHECK(d.shape() == s);
    const tensor back = g.download(d);
    CHECK(back.device() == device_kind::cpu);
    REQUIRE(back.shape() == s);
    CHECK(std::equal(h.f32(), h.f32() + h.numel(), back.f32()));
    // The same through tensor's own transfers.
    const tensor back2 = h.to_device(device_kind::cuda).to_cpu();
    CHECK(std::equal(h.f32(), h.f32() + h.numel(), back2.f32()));
  }
  std::vector<int32_t> ids(1000);
  std::iota(ids.begin(), ids.end(), -500);
  const tensor hi = tensor::from_i32({10, 100}, ids);
  const tensor bi = g.download(g.upload(hi));
  CHECK(bi.type() == dtype::i32);
  CHECK(std::equal(hi.i32(), hi.i32() + 1000, bi.i32()));
}

TEST_CASE("cuda tensor copies, moves, zero and fill") {
  FUSION_GPU_OR_SKIP(g);
  std::mt19937 rng(2);
  const tensor h = random_f32({7, 9}, rng);
  tensor d = g.upload(h);
  const uint64_t before = tensor::copies();
  tensor c = d;  // device-to-device deep copy, counted like a host copy
  CHECK(tensor::copies() == before + 1);
  CHECK(c.device() == device_kind::cuda);
  CHECK(c.f32() != d.f32());
  d.fill(2.5f);
  const tensor hc = c.to_cpu(), hd = d.to_cpu();
  CHECK(std::equal(h.f32(), h.f32() + h.numel(), hc.f32()));
  for (int64_t i = 0; i < hd.numel(); ++i) CHECK(hd.f32()[i] == 2.5f);
  tensor moved = std::move(d).to_device(device_kind::cuda);  // already there: a move
  CHECK(tensor::copies() == before + 1);
  moved.zero();
  const tensor hz = g.download(moved);
  for (int64_t i = 0; i < hz.numel(); ++i) CHECK(hz.f32()[i] == 0.0f);
  const tensor z = g.zeros({5, 3}, dtype::f32);
  CHECK(max_rel_diff(z, tensor({5, 3})) == 0);  // max_rel_diff reads device tensors too
  CHECK_THROWS_AS(c.to(dtype::f64), std::logic_error);
}

}  // namespace fusion::test
