#include "meshflow/core/glob.h"

namespace meshflow {

bool glob_match(const std::string& pat, const std::string& name) {
  // Iterative matcher with backtracking to the last '*'.
  size_t p = 0, s = 0, star = std::string::npos, mark = 0;
  while (s < name.size()) {
    if (p < pat.size() && (pat[p] == '?' || pat[p] == name[s])) {
      ++p;
      ++s;
    } else if (p < pat.size() && pat[p] == '*') {
      star = p++;
      mark = s;
    } else if (star != std::string::npos) {
      p = star + 1;
      s = ++mark;
    } else {
      return false;
    }
  }
  while (p < pat.size() && pat[p] == '*') ++p;
  return p == pat.size();
}

}  // namespace meshflow
