#include "python_free_cli/text_diff.h"

#include <algorithm>
#include <sstream>
#include <vector>

namespace keel {
namespace cli {

namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

enum class Edit { kKeep, kDelete, kInsert };

// Myers' greedy forward search; keeps V of every round d to walk the path back.
std::vector<Edit> ShortestEdit(const std::vector<std::string>& a,
                               const std::vector<std::string>& b) {
  const int n = static_cast<int>(a.size()), m = static_cast<int>(b.size()), max = n + m;
  const int off = max + 1;
  std::vector<int> v(2 * max + 3, 0);
  std::vector<std::vector<int>> trace;
  for (int d = 0; d <= max; ++d) {
    trace.push_back(v);
    for (int k = -d; k <= d; k += 2) {
      int x = (k == -d || (k != d && v[off + k - 1] < v[off + k + 1])) ? v[off + k + 1]
                                                                       : v[off + k - 1] + 1;
      int y = x - k;
      while (x < n && y < m && a[x] == b[y]) ++x, ++y;
      v[off + k] = x;
      if (x >= n && y >= m) {
        // Walk back through the rounds.
        std::vector<Edit> edits;
        int cx = n, cy = m;
        for (int dd = d; dd > 0; --dd) {
          const std::vector<int>& pv = trace[dd];
          int kk = cx - cy;
          bool down = kk == -dd || (kk != dd && pv[off + kk - 1] < pv[off + kk + 1]);
          int pk = down ? kk + 1 : kk - 1;
          int px = pv[off + pk], py = px - pk;
          while (cx > px + (down ? 0 : 1) && cy > py + (down ? 1 : 0)) {
            edits.push_back(Edit::kKeep);
            --cx, --cy;
          }
          edits.push_back(down ? Edit::kInsert : Edit::kDelete);
          cx = px, cy = py;
        }
        while (cx > 0 && cy > 0) {
          edits.push_back(Edit::kKeep);
          --cx, --cy;
        }
        std::reverse(edits.begin(), edits.end());
        return edits;
      }
    }
  }
  return {};
}

}  // namespace

std::string LineDiff(const std::string& before, const std::string& after, int context) {
  const std::vector<std::string> a = Lines(before), b = Lines(after);
  const std::vector<Edit> edits = ShortestEdit(a, b);
  // Mark which edit positions are shown: changes and `context` kept lines around them.
  const int e = static_cast<int>(edits.size());
  std::vector<bool> show(e, false);
  for (int i = 0; i < e; ++i)
    if (edits[i] != Edit::kKeep)
      for (int j = std::max(0, i - context); j <= std::min(e - 1, i + context); ++j) show[j] = true;
  std::ostringstream out;
  int ai = 0, bi = 0;
  for (int i = 0; i < e;) {
    if (!show[i]) {
      if (edits[i] != Edit::kInsert) ++ai;
      if (edits[i] != Edit::kDelete) ++bi;
      ++i;
      continue;
    }
    int j = i, na = 0, nb = 0;
    while (j < e && show[j]) {
      if (edits[j] != Edit::kInsert) ++na;
      if (edits[j] != Edit::kDelete) ++nb;
      ++j;
    }
    out << "@@ -" << ai + 1 << "," << na << " +" << bi + 1 << "," << nb << " @@\n";
    for (; i < j; ++i) {
      if (edits[i] == Edit::kKeep)
        out << " " << a[ai++] << "\n", ++bi;
      else if (edits[i] == Edit::kDelete)
        out << "-" << a[ai++] << "\n";
      else
        out << "+" << b[bi++] << "\n";
    }
  }
  return out.str();
}

}  // namespace cli
}  // namespace keel
