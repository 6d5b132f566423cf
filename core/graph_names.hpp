// Name helpers shared by the model loader and the INI linter: edit distance and "did you mean".
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace fusion {

/// Edit distance counting insertions, deletions, substitutions and swaps of two adjacent
/// characters as 1 each (optimal string alignment), so "trian" is 1 away from "train".
inline size_t edit_distance(std::string_view a, std::string_view b) {
  const size_t n = a.size(), m = b.size();
  std::vector<size_t> d((n + 1) * (m + 1));
  auto at = [m, &d](size_t i, size_t j) -> size_t& { return d[i * (m + 1) + j]; };
  for (size_t i = 0; i <= n; ++i) at(i, 0) = i;
  for (size_t j = 0; j <= m; ++j) at(0, j) = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      at(i, j) = std::min({at(i - 1, j) + 1, at(i, j - 1) + 1, at(i - 1, j - 1) + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        at(i, j) = std::min(at(i, j), at(i - 2, j - 2) + 1);
    }
  return at(n, m);
}

/// The candidate closest to `word`, or "" when none is close enough to be a plausible typo
/// (distance at most max(1, |word| / 3), and less than |word|: one-letter names get no advice).
inline std::string closest_name(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::min(std::max<size_t>(1, word.size() / 3) + 1, word.size());
  for (auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

/// " (did you mean 'x'?)" or "".
inline std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  auto best = closest_name(word, candidates);
  return best.empty() ? std::string{} : " (did you mean '" + best + "'?)";
}

}  // namespace fusion
