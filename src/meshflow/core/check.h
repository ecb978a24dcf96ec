// MF_CHECK: a broken internal invariant. Prints file:line, the condition and
// any streamed message, then aborts. Always on (release builds too): a check
// that checks nothing is worse than none.
//
//   MF_CHECK(a.rank() == b.rank()) << "node " << node.name;
//   MF_CHECK_EQ(n, m);
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace meshflow::detail {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond) {
    stream_ << file << ":" << line << ": check failed: " << cond << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::fprintf(stderr, "meshflow: %s\n", stream_.str().c_str());
    std::fflush(stderr);
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Makes `MF_CHECK(x) << ...` an expression of type void in both branches.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace meshflow::detail

#define MF_CHECK(cond)                     \
  (cond) ? (void)0                         \
         : ::meshflow::detail::Voidify() & \
               ::meshflow::detail::CheckFailure(__FILE__, __LINE__, #cond).stream()

#define MF_CHECK_OP(a, b, op) MF_CHECK((a)op(b)) << "(" << (a) << " vs " << (b) << ") "
#define MF_CHECK_EQ(a, b) MF_CHECK_OP(a, b, ==)
#define MF_CHECK_NE(a, b) MF_CHECK_OP(a, b, !=)
#define MF_CHECK_LT(a, b) MF_CHECK_OP(a, b, <)
#define MF_CHECK_LE(a, b) MF_CHECK_OP(a, b, <=)
#define MF_CHECK_GE(a, b) MF_CHECK_OP(a, b, >=)
#define MF_CHECK_GT(a, b) MF_CHECK_OP(a, b, >)
