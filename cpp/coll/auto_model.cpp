// The model of codec "auto" (adaptive.h): a collective's time both ways, piecewise linear in
// the size, and the decisions read from it. Pure arithmetic, the same on every rank that holds
// the same numbers.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "adaptive.h"

namespace mpicomp {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Linear through (x0, y0) and (x1, y1), at x.
double line(double x0, double y0, double x1, double y1, double x) {
  return x1 == x0 ? y1 : y0 + (y1 - y0) * (x - x0) / (x1 - x0);
}

}  // namespace

std::string size_text(double b) {
  char s[32];
  if (b < 1024) std::snprintf(s, sizeof s, "%.0f B", b);
  else if (b < 1 << 20) std::snprintf(s, sizeof s, "%.1f KiB", b / 1024);
  else std::snprintf(s, sizeof s, "%.1f MiB", b / (1 << 20));
  return s;
}

double AutoModel::predict(const std::vector<double>& t, double b) const {
  const size_t n = bytes.size();
  if (b <= bytes[0] || n == 1) return t[0];
  for (size_t i = 1; i < n; ++i)
    if (b <= bytes[i]) return line(bytes[i - 1], t[i - 1], bytes[i], t[i], b);
  const double slope = std::max(0.0, (t[n - 1] - t[n - 2]) / (bytes[n - 1] - bytes[n - 2]));
  return t[n - 1] + slope * (b - bytes[n - 1]);
}

double AutoModel::predict(bool compressed, bool flat, double b) const {
  return predict(times(compressed, flat && has_flat(compressed) && (compressed || b <= plain_same)), b);
}

double AutoModel::predict(bool compressed, double b) const {
  return std::min(predict(compressed, false, b), predict(compressed, true, b));
}

bool AutoModel::flat(bool compressed, double b) const {
  if (!has_flat(compressed)) return false;
  return (!compressed && b > plain_same) || predict(compressed, true, b) < predict(compressed, false, b);
}

double AutoModel::best(bool compressed, size_t i) const {
  const double t = times(compressed, false)[i];
  return has_flat(compressed) ? std::min(t, times(compressed, true)[i]) : t;
}

std::optional<Skip> AutoModel::decide(double b) const {
  if (predict(true, b) < predict(false, b)) return std::nullopt;
  // Below a size where compressing wins, or where it would win at every size from some on
  // (the codec's time per byte below the wire's)?
  const size_t n = bytes.size();
  for (size_t i = 0; i < n; ++i)
    if (bytes[i] > b && best(true, i) < best(false, i)) return Skip::auto_small;
  const bool gains = n >= 2 && (best(true, n - 1) - best(true, n - 2)) < (best(false, n - 1) - best(false, n - 2));
  return gains ? Skip::auto_small : Skip::auto_link;
}

double AutoModel::break_even() const {
  // The difference plain - packed is linear between points and beyond the last: its first
  // rise above zero.
  auto gain = [&](double b) { return predict(false, b) - predict(true, b); };
  if (gain(bytes[0]) > 0) return 0;
  for (size_t i = 1; i < bytes.size(); ++i)
    if (gain(bytes[i]) > 0) {
      const double g0 = gain(bytes[i - 1]), g1 = gain(bytes[i]);
      return bytes[i - 1] + (bytes[i] - bytes[i - 1]) * (-g0) / (g1 - g0);
    }
  const double last = bytes.back(), g = gain(last), slope = gain(2 * last) - g;
  return slope > 0 ? last * (1 - g / slope) : kInf;
}

void AutoModel::set(bool compressed, bool flat, double b, double t) {
  size_t i = std::lower_bound(bytes.begin(), bytes.end(), b * 0.99) - bytes.begin();
  if (i == bytes.size() || bytes[i] > b * 1.01) {  // a size of its own, the other times as predicted
    for (std::vector<double>* v : {&plain, &packed, &plain_flat, &packed_flat})
      if (!v->empty()) v->insert(v->begin() + i, predict(*v, b));
    bytes.insert(bytes.begin() + i, b);
  }
  times(compressed, flat && has_flat(compressed))[i] = t;
}

bool AutoModel::well_formed() const {
  const size_t n = bytes.size();
  auto fits = [&](const std::vector<double>& v, bool optional) { return v.size() == n || (optional && v.empty()); };
  return n && fits(plain, false) && fits(packed, false) && fits(plain_flat, true) && fits(packed_flat, true);
}

std::string AutoModel::describe(const char* codec) const {
  const double b = break_even();
  std::string d = std::isinf(b) ? std::string("never compresses: the link is faster than ") + codec
                                : std::string(codec) + (b == 0 ? " at every size" : " from " + size_text(b));
  // The measured sizes where a way went flat, as runs of neighbours: "; flat: uncompressed
  // 1.0 KiB-32.0 KiB, int8 4.0 MiB".
  std::string runs;
  for (int c = 0; c < 2; ++c) {
    if (!has_flat(c)) continue;
    std::string mine;
    for (size_t i = 0, j; i < bytes.size(); i = j + 1) {
      for (j = i; j < bytes.size() && flat(c, bytes[j]); ++j) {}
      if (j == i) continue;
      mine += (mine.empty() ? "" : ", ") + size_text(bytes[i]) + (j - 1 > i ? "-" + size_text(bytes[j - 1]) : "");
    }
    if (!mine.empty()) runs += (runs.empty() ? "" : "; ") + std::string(c ? codec : "uncompressed") + " " + mine;
  }
  return runs.empty() ? d : d + "; flat hierarchy: " + runs;
}

}  // namespace mpicomp
