// Replay results (renaissance/replay_case.h, renaissance/fingerprint.h): the expected-fingerprint
// check and combine_fingerprints, the comparison with expected.safetensors and the result file.
// None of it runs a Task, so it lives in renaissance_core; loading and running a case is in
// replay.cc (the runtime).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/src/io/file_checks.h"
#include "renaissance/error.h"
#include "renaissance/fingerprint.h"
#include "renaissance/math/precision.h"
#include "renaissance/replay_case.h"

namespace renaissance {

namespace {

std::string sq(const std::string& s) { return "'" + s + "'"; }

}  // namespace

bool fingerprint_matches(const ReplayCase& rc, const ReplayResult& result) {
  return rc.expected_fingerprint.empty() || rc.expected_fingerprint == result.fingerprint;
}

bool is_fingerprint_text(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string combine_fingerprints(const std::vector<std::string>& fps) {
  if (fps.empty()) throw_invalid("combine_fingerprints: no fingerprints (a case has at least one group)");
  for (size_t i = 0; i < fps.size(); ++i) {
    if (!is_fingerprint_text(fps[i])) {
      throw_invalid("combine_fingerprints: entry " + std::to_string(i) + " " + sq(io::printable(fps[i])) +
                    " is not 16 lowercase hex digits");
    }
  }
  if (fps.size() == 1) return fps.front();
  std::string joined;
  for (size_t i = 0; i < fps.size(); ++i) joined += (i ? "\n" : "") + fps[i];
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(XXH3_64bits(joined.data(), joined.size())));
  return text;
}

std::vector<TensorComparison> compare_replay(const ReplayCase& rc, const ReplayResult& result) {
  std::vector<TensorComparison> out;
  if (!rc.has_expected) return out;
  auto compare = [&](const std::string& name, const std::vector<float>& got) {
    auto it = rc.expected.find(name);
    if (it == rc.expected.end()) return;
    const std::vector<double>& ref = it->second;
    TensorComparison c;
    c.name = name;
    c.numel = static_cast<int64_t>(got.size());
    double diff2 = 0.0, ref2 = 0.0;
    for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
      const double d = static_cast<double>(got[i]) - ref[i];
      diff2 += d * d;
      ref2 += ref[i] * ref[i];
      c.max_abs = std::max(c.max_abs, std::fabs(d));
      if (!std::isfinite(got[i])) c.finite = false;
    }
    c.rel_l2 = ref2 > 0.0 ? std::sqrt(diff2) / std::sqrt(ref2) : std::sqrt(diff2);
    // A NaN anywhere must fail any tolerance, and comparisons with NaN are false.
    if (!c.finite || std::isnan(c.rel_l2)) c.rel_l2 = INFINITY;
    out.push_back(c);
  };
  for (size_t id = 0; id < rc.params.size(); ++id) compare(rc.params[id].name, result.w[id]);
  for (size_t id = 0; id < rc.params.size(); ++id) {
    if (result.param_has_m[id]) compare("m/" + rc.params[id].name, result.m[id]);
  }
  for (size_t id = 0; id < rc.params.size(); ++id) {
    if (result.param_has_v[id]) compare("v/" + rc.params[id].name, result.v[id]);
  }
  // The model copy, bit for bit (rounding is exact: there is no tolerance to speak of).
  for (size_t id = 0; id < rc.params.size() && id < result.c.size(); ++id) {
    auto it = rc.expected_copy.find("c/" + rc.params[id].name);
    if (it == rc.expected_copy.end()) continue;
    TensorComparison c;
    c.name = it->first;
    c.numel = static_cast<int64_t>(result.c[id].size());
    c.bitwise = true;
    for (size_t i = 0; i < result.c[id].size() && i < it->second.size(); ++i) c.mismatched += result.c[id][i] != it->second[i];
    c.rel_l2 = c.mismatched == 0 ? 0.0 : INFINITY;
    c.finite = c.mismatched == 0;
    out.push_back(c);
  }
  return out;
}

void write_replay_result(const std::string& path, const ReplayCase& rc, const ReplayResult& result) {
  std::vector<StTensorView> views;
  // The copies packed at the encoding's bytes per element (precision.h's table), as the file holds them.
  std::vector<std::vector<char>> packed(rc.params.size());
  for (size_t id = 0; id < rc.params.size(); ++id) {
    const ParamSpec& p = rc.params[id];
    views.push_back({p.name, StDtype::kF32, p.shape, result.w[id].data()});
    if (result.param_has_m[id]) views.push_back({"m/" + p.name, StDtype::kF32, p.shape, result.m[id].data()});
    if (result.param_has_v[id]) views.push_back({"v/" + p.name, StDtype::kF32, p.shape, result.v[id].data()});
    if (result.precision != Precision::kFp32) {
      const std::vector<uint16_t>& c = result.c[id];
      packed[id].resize(c.size() * precision_bytes(result.precision));
      for (size_t i = 0; i < c.size(); ++i) math::store_encoding(result.precision, packed[id].data(), i, c[i]);
      views.push_back({"c/" + p.name, st_dtype_of(result.precision), p.shape, packed[id].data()});
    }
  }
  write_safetensors(path, views,
                    {{"format", "renaissance-replay-result/1"},
                     {"case", rc.name},
                     {"backend", result.backend},
                     {"steps_applied", std::to_string(result.steps_applied)},
                     {"steps_skipped", std::to_string(result.steps_skipped)},
                     {"fingerprint", result.fingerprint}});
}

}  // namespace renaissance
