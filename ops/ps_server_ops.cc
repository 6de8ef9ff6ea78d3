// The parameter server's loop, listen_and_serv (Paddle's name; docs/parameter-server.md,
// transpiler/ps_pass.h writes it; ops/ps_ops.cc has the trainer's side): serves the parameters,
// merges the trainers' gradients (dense blocks, row-sparse blocks of is_sparse embeddings, and the
// row gradients of the distributed tables it holds a shard of), runs the optimize blocks. CPU
// only: a CUDA place finds no kernel and is refused naming the op.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include <glog/logging.h>

#include "framework/fault_point.h"
#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/ps/ps_transport.h"
#include "framework/ps/sparse_shard.h"
#include "ops/ps_ops.h"

namespace keel {

namespace {

using ps::Kind;
using ps::Slot;
using ps::Transport;

std::string NonNegative(const Attribute& a) { return std::get<int>(a) >= 0 ? "" : "must be >= 0"; }
std::string Positive(const Attribute& a) { return std::get<int>(a) >= 1 ? "" : "must be >= 1"; }
std::string Mode(const Attribute& a) {
  const int m = std::get<int>(a);
  return m >= 0 && m <= 2 ? "" : "must be 0 (sync), 1 (async) or 2 (geo)";
}

Transport& Connected(const OpDesc& op) { return PsConnected(op); }

// The variables of a list slot: none when it holds @EMPTY@ alone (a slot the op does not use).
size_t Count(const OpDesc& op, const std::string& slot) {
  const std::vector<std::string>& args = op.Output(slot);
  return args.size() == 1 && args[0] == kEmptyVarName ? 0 : args.size();
}

// The server's loop (Paddle's listen_and_serv, synchronous mode): serve the initial parameters
// (step 0); then per step: every trainer's header, every trainer's gradient of each block (into
// Grads, block-major: Grads[i * Fanin + t] is trainer t's gradient of X[i]), the learning-rate
// block, each block's optimize block (which sums the trainers' gradients, scales by 1/Fanin and
// updates X[i]), then the new parameters to every trainer. Ends when every trainer says it is
// done; a trainer that stops while another starts a step ends the job, naming both.
template <typename T>
class ListenAndServKernel : public OpKernel {
 private:
  // Per X block, its gradient variables: Grads (dense) or RowGrads (row-sparse; the blocks
  // listed in sparse_blocks), `per` each (Fanin in sync mode, else 1), in X's order.
  class GradSlots {
   public:
    GradSlots(ExecutionContext& ctx, int per) : per_(per) {
      const OpDesc& op = ctx.op();
      const size_t n = op.Input("X").size();
      sparse_.assign(n, false);
      for (int i : op.Attr<std::vector<int>>("sparse_blocks")) {
        KEEL_ENFORCE(i >= 0 && static_cast<size_t>(i) < n && !sparse_[i],
                     "op listen_and_serv: sparse_blocks holds ", i, " (X has ", n, " blocks)");
        sparse_[i] = true;
      }
      size_t nd = 0, ns = 0;
      for (size_t i = 0; i < n; ++i) {
        pos_.push_back(sparse_[i] ? ns++ : nd++);
      }
      const size_t got_d = Count(op, "Grads");
      const size_t got_s = Count(op, "RowGrads");
      KEEL_ENFORCE(got_d == nd * per && got_s >= ns * per, "op listen_and_serv: ", nd,
                   " dense and ", ns, " row-sparse blocks need ", nd * per, " Grads and ", ns * per,
                   " RowGrads (", per, " each), got ", got_d, " and ", got_s);
      for (size_t k = 0; k < got_d; ++k) dense_.push_back(ctx.OutputVar("Grads", k));
      for (size_t k = 0; k < ns * per; ++k) rows_.push_back(ctx.OutputVar("RowGrads", k));
    }
    bool sparse(size_t i) const { return sparse_[i]; }
    size_t sparse_vars() const { return rows_.size(); }
    // Trainer r's gradient of X[i] (r = 0 with one per block).
    Variable* Var(size_t i, int r) const {
      return (sparse_[i] ? rows_ : dense_)[pos_[i] * per_ + r];
    }

   private:
    int per_;
    std::vector<bool> sparse_;
    std::vector<size_t> pos_;
    std::vector<Variable*> dense_, rows_;
  };

  // A row-sparse gradient block to receive from `peer` into `var`, which stands for a tensor of
  // `dims` (the block's).
  struct RowsIn {
    int peer;
    int slot;
    Variable* var;
    DDim dims;
    std::string what;
    int64_t height() const { return dims.size() == 0 ? 1 : dims[0]; }
    int64_t width() const { return height() == 0 ? 0 : dims.numel() / height(); }
    // The most bytes a row count, rows and their values take.
    int64_t most_bytes() const {
      return static_cast<int64_t>(sizeof(int64_t)) +
             height() * static_cast<int64_t>(sizeof(int64_t) + width() * sizeof(T));
    }
  };

  // This server's shards of the distributed tables (is_distributed embeddings): the rows of the
  // ids it owns, created on first touch (framework/ps/sparse_shard.h). Trainers ask for rows
  // (Prefetch) and push row gradients by id; RowGrads hold them renumbered to the shard's rows,
  // which the tables' optimize blocks update.
  class Tables {
   public:
    Tables(ExecutionContext& ctx, Transport& t, int per, size_t sparse_grads)
        : per_(per), me_(t.rank()) {
      const OpDesc& op = ctx.op();
      slots_ = op.Attr<std::vector<int>>("table_slots");
      blocks_ = op.Attr<std::vector<int>>("table_blocks");
      const auto& heights = op.Attr<std::vector<int64_t>>("table_heights");
      const auto& widths = op.Attr<std::vector<int64_t>>("table_widths");
      const auto& counts = op.Attr<std::vector<int>>("table_state_counts");
      const auto& values = op.Attr<std::vector<float>>("table_state_values");
      const auto& dist = op.Attr<std::vector<int>>("table_dists");
      const auto& a = op.Attr<std::vector<float>>("table_as");
      const auto& b = op.Attr<std::vector<float>>("table_bs");
      const auto& seeds = op.Attr<std::vector<int64_t>>("table_seeds");
      const size_t n = slots_.size();
      size_t nstate = 0;
      for (int c : counts) nstate += static_cast<size_t>(c);
      KEEL_ENFORCE(blocks_.size() == n && heights.size() == n && widths.size() == n &&
                       counts.size() == n && dist.size() == n && a.size() == n && b.size() == n &&
                       seeds.size() == n && Count(op, "TableVars") == 2 * n + nstate &&
                       Count(op, "RowGrads") == sparse_grads + n * per && values.size() == nstate,
                   "op listen_and_serv: ", n,
                   " distributed tables need one entry each in table_slots, table_blocks, "
                   "table_heights, table_widths, table_state_counts, table_dists, table_as, "
                   "table_bs and table_seeds; TableVars (per table: the shard, its ids, its "
                   "state), ",
                   per,
                   " RowGrads each after the row-sparse blocks'; table_state_values as "
                   "counted");
      size_t at = 0, value = 0;
      for (size_t k = 0; k < n; ++k) {
        Variable* table = ctx.OutputVar("TableVars", static_cast<int>(at++));
        Variable* ids = ctx.OutputVar("TableVars", static_cast<int>(at++));
        std::vector<Variable*> state;
        std::vector<float> init;
        for (int j = 0; j < counts[k]; ++j) {
          state.push_back(ctx.OutputVar("TableVars", static_cast<int>(at++)));
          init.push_back(values[value++]);
        }
        RowInitRule rule;
        rule.dist = dist[k];
        rule.a = a[k];
        rule.b = b[k];
        rule.seed = seeds[k];
        shards_.push_back(std::make_unique<ps::SparseShard>(
            op.Output("TableVars")[at - 2 - counts[k]], table, state, init, ids, widths[k], rule,
            DTypeOf<T>::value));
        heights_.push_back(heights[k]);
        widths_.push_back(widths[k]);
        for (int r = 0; r < per; ++r)
          grads_.push_back(ctx.OutputVar("RowGrads", static_cast<int>(sparse_grads + k * per + r)));
      }
    }

    // A trainer's request (header h): h.count ids of table h.table; replies with their rows.
    void Prefetch(Transport& t, int trainer, const ps::HeaderWithIds& got) {
      const ps::Header& h = got.h;
      const size_t k = Index(h.table, t, trainer);
      ps::SparseShard& sh = *shards_[k];
      const std::string what = StrCat(t.PeerName(me_), ": ", h.count, " rows of ", sh.name(),
                                      " for ", t.PeerName(trainer));
      KEEL_ENFORCE(h.count >= 0 && h.count <= heights_[k], what, ": a request of ", h.count,
                   " rows from a table of ", heights_[k]);
      std::vector<int64_t> ids(static_cast<size_t>(h.count));
      if (h.count <= ps::kInlineIds) {
        std::copy_n(got.ids, h.count, ids.begin());
      } else {
        auto in = t.PostRecv({trainer}, Slot(Kind::kIds, static_cast<int>(h.table), h.steps),
                             ids.data(), ids.size() * sizeof(int64_t), what);
        t.Wait(*in);
      }
      const int64_t D = widths_[k];
      std::vector<T> rows(ids.size() * D);
      for (size_t i = 0; i < ids.size(); ++i) {
        KEEL_ENFORCE(ids[i] < heights_[k], what, ": id ", ids[i], " is outside [0, ", heights_[k],
                     ")");
        const int64_t r = Own(sh, ids[i], t, what);
        std::memcpy(rows.data() + i * D, sh.table()->tensor().data<T>() + r * D, D * sizeof(T));
      }
      auto reply = t.PostSend(trainer, Slot(Kind::kPrefetch, static_cast<int>(h.table), h.steps),
                              rows.data(), rows.size() * sizeof(T), what);
      t.Wait(*reply);
    }

    // Appends the row-gradient receives of a step (per table, per trainer in `from`); returns
    // where they start in `jobs`.
    size_t AddJobs(std::vector<RowsIn>* jobs, const std::vector<int>& from, int64_t step) {
      const size_t first = jobs->size();
      for (size_t k = 0; k < shards_.size(); ++k)
        for (size_t r = 0; r < from.size(); ++r)
          jobs->push_back({from[r], slots_[k], grads_[k * per_ + r],
                           DDim({heights_[k], widths_[k]}),
                           StrCat("server ", me_, ": step ", step, "'s gradient of ",
                                  shards_[k]->name(), " from rank ", from[r])});
      return first;
    }

    // The received gradients (rows: ids) renumbered to their shards' rows, created if new.
    void Translate(const std::vector<RowsIn>& jobs, size_t first) {
      if (shards_.empty()) return;
      Transport& t = Transport::Get();
      const size_t per = (jobs.size() - first) / shards_.size();
      std::vector<std::vector<int64_t>> local(jobs.size() - first);
      for (size_t j = first; j < jobs.size(); ++j) {
        ps::SparseShard& sh = *shards_[(j - first) / per];
        Variable* v = jobs[j].var;
        const int64_t n = static_cast<int64_t>(v->rows().size());
        const int64_t D = n == 0 ? 0 : v->tensor().numel() / n;
        std::vector<std::pair<int64_t, int64_t>> order;  // (shard row, position)
        for (int64_t i = 0; i < n; ++i)
          order.emplace_back(Own(sh, v->rows()[i], t, jobs[j].what), i);
        std::sort(order.begin(), order.end());
        std::vector<T> values(static_cast<size_t>(n * D));
        const T* src = v->tensor().data<T>();
        for (int64_t i = 0; i < n; ++i) {
          std::memcpy(values.data() + i * D, src + order[i].second * D, D * sizeof(T));
          local[j - first].push_back(order[i].first);
        }
        if (n > 0)
          std::memcpy(v->mutable_tensor()->mutable_data<T>(), values.data(), n * D * sizeof(T));
      }
      // The height: the shard's rows once every part's ids exist.
      for (size_t j = first; j < jobs.size(); ++j)
        jobs[j].var->SetRows(shards_[(j - first) / per]->rows(), std::move(local[j - first]));
    }

    void RunBlocks(ExecutionContext& ctx) {
      for (int b : blocks_) ctx.RunBlock(b);
    }

    // For a checkpoint, after the State list (slots from `first` on): per shard, its header
    // (ps::ShardHeader: row count, rule, state vars' initial values), then its ids, its rows and
    // each state var's rows (fleet/ps_checkpoint.cc takes them in that order).
    void PostShards(Transport& t, int trainer, int64_t step, int first,
                    std::vector<std::unique_ptr<Transport::Transfer>>* sends) const {
      int at = first;
      for (const auto& sh : shards_) {
        const std::string what = StrCat(t.PeerName(me_), ": the rows of ", sh->name(),
                                        " for a checkpoint to ", t.PeerName(trainer));
        const std::vector<int64_t> meta =
            ps::ShardHeader{sh->rows(), sh->rule(), sh->state_init()}.Encode();
        sends->push_back(t.PostSend(trainer, Slot(Kind::kState, at++, step), meta.data(),
                                    meta.size() * sizeof(int64_t), what));
        std::vector<const Variable*> vars = {sh->ids(), sh->table()};
        for (const Variable* v : sh->state()) vars.push_back(v);
        for (const Variable* v : vars) {
          const Tensor& x = v->tensor();
          const size_t bytes = sh->rows() == 0 ? 0 : x.nbytes();
          sends->push_back(t.PostSend(trainer, Slot(Kind::kState, at++, step),
                                      bytes == 0 ? nullptr : x.raw_data(), bytes, what));
        }
      }
    }

   private:
    size_t Index(int64_t slot, Transport& t, int trainer) const {
      for (size_t k = 0; k < slots_.size(); ++k)
        if (slots_[k] == slot) return k;
      KEEL_THROW(t.PeerName(me_), ": ", t.PeerName(trainer), " asked for rows of table slot ", slot,
                 ", which this server does not hold");
    }
    // Row id's number in `sh`, created if new; the id must be this server's.
    int64_t Own(ps::SparseShard& sh, int64_t id, Transport& t, const std::string& what) {
      KEEL_ENFORCE(id >= 0 && id % t.nservers() == me_, what, ": id ", id, " of ", sh.name(),
                   " is not this server's (id % ", t.nservers(), " != ", me_, ")");
      return sh.Row(id);
    }

    int per_, me_;
    std::vector<int> slots_, blocks_;
    std::vector<int64_t> heights_, widths_;
    std::vector<std::unique_ptr<ps::SparseShard>> shards_;
    std::vector<Variable*> grads_;
  };

  // Receives each job's row count (kGrad), then its rows and values (kRows; send's SendRows), and
  // makes its var row-sparse: [n, width] values, rows within the block.
  static void RecvRows(Transport& t, ExecutionContext& ctx, const std::vector<RowsIn>& jobs,
                       int64_t step) {
    std::vector<int64_t> counts(jobs.size(), 0);
    std::vector<std::unique_ptr<Transport::Transfer>> pending;
    for (size_t j = 0; j < jobs.size(); ++j)
      pending.push_back(t.PostRecv({jobs[j].peer}, Slot(Kind::kGrad, jobs[j].slot, step),
                                   &counts[j], sizeof(int64_t), jobs[j].what));
    for (auto& p : pending) t.Wait(*p);
    pending.clear();
    std::vector<std::vector<char>> payload(jobs.size());
    for (size_t j = 0; j < jobs.size(); ++j) {
      const int64_t height = jobs[j].height(), width = jobs[j].width();
      KEEL_ENFORCE(counts[j] >= 0 && counts[j] <= height, jobs[j].what, ": ", counts[j],
                   " rows announced for a block of ", height);
      payload[j].resize(static_cast<size_t>(counts[j]) * (sizeof(int64_t) + width * sizeof(T)));
      pending.push_back(t.PostRecv({jobs[j].peer}, Slot(Kind::kRows, jobs[j].slot, step),
                                   payload[j].data(), payload[j].size(), jobs[j].what));
    }
    for (auto& p : pending) t.Wait(*p);
    for (size_t j = 0; j < jobs.size(); ++j) FillRows(ctx, jobs[j], counts[j], payload[j].data());
  }

  // Makes job.var row-sparse from `n` rows (int64, at `data`) and their values after them.
  static void FillRows(ExecutionContext& ctx, const RowsIn& job, int64_t n, const char* data) {
    DDim d = job.dims;
    const int64_t height = job.height();
    std::vector<int64_t> rows(static_cast<size_t>(n));
    std::memcpy(rows.data(), data, n * sizeof(int64_t));
    for (int64_t k = 0; k < n; ++k)
      KEEL_ENFORCE(rows[k] >= 0 && rows[k] < height && (k == 0 || rows[k - 1] < rows[k]), job.what,
                   ": rows are not sorted, distinct and below ", height);
    if (d.size() == 0) d = DDim({1});
    d[0] = n;
    Tensor* g = job.var->mutable_tensor();
    g->Resize(d);
    T* out = g->mutable_data<T>(ctx.place());
    if (g->numel() > 0) std::memcpy(out, data + n * sizeof(int64_t), g->numel() * sizeof(T));
    job.var->SetRows(height, std::move(rows));
  }

  // Asynchronous mode: receives trainer `from`'s push of header `h` as one message (into `bytes`,
  // reused; ps::PushSection's): each dense block's gradient into its Grads var, each row-sparse
  // one's (`sparse`: the jobs) into its var. Every block of this server must be there once.
  static void RecvPush(Transport& t, ExecutionContext& ctx, int from, const ps::Header& h,
                       const std::vector<const Tensor*>& params, const GradSlots& grads,
                       const std::vector<RowsIn>& sparse, std::vector<char>* message) {
    const std::string what =
        StrCat(t.PeerName(t.rank()), ": ", t.PeerName(from), "'s push ", h.step);
    int64_t most = 0;  // every block in it, each row-sparse one with every row
    for (size_t i = 0; i < params.size(); ++i)
      if (!grads.sparse(i))
        most += static_cast<int64_t>(sizeof(ps::PushSection) + params[i]->nbytes());
    for (const RowsIn& job : sparse)
      most += static_cast<int64_t>(sizeof(ps::PushSection)) + job.most_bytes();
    KEEL_ENFORCE(h.count <= most, what, " announces ", h.count,
                 " bytes; this server's blocks take at most ", most);
    message->resize(static_cast<size_t>(h.count));
    auto in =
        t.PostRecv({from}, Slot(Kind::kBundle, 0, h.step), message->data(), message->size(), what);
    t.Wait(*in);
    const std::vector<char>& bytes = *message;
    const auto& slots = ctx.op().Attr<std::vector<int>>("slots");
    std::map<int64_t, size_t> dense, rows;  // slot -> X index / job index
    for (size_t i = 0; i < params.size(); ++i)
      if (!grads.sparse(i)) dense[slots[i]] = i;
    for (size_t j = 0; j < sparse.size(); ++j) rows[sparse[j].slot] = j;
    const size_t want = dense.size() + rows.size();
    size_t got = 0, at = 0;
    while (at < bytes.size()) {
      ps::PushSection s;
      KEEL_ENFORCE(at + sizeof(s) <= bytes.size(), what, ": a section cut short");
      std::memcpy(&s, bytes.data() + at, sizeof(s));
      at += sizeof(s);
      KEEL_ENFORCE(s.bytes >= 0 && at + static_cast<size_t>(s.bytes) <= bytes.size(), what,
                   ": block ", s.slot, "'s ", s.bytes, " bytes run past the push");
      const char* p = bytes.data() + at;
      at += static_cast<size_t>(s.bytes);
      auto d = dense.find(s.slot);
      if (s.rows == 0 && d != dense.end()) {
        const size_t i = d->second;
        Tensor* g = grads.Var(i, 0)->mutable_tensor();
        g->Resize(params[i]->dims());
        KEEL_ENFORCE(static_cast<size_t>(s.bytes) == params[i]->nbytes(), what, ": block ", s.slot,
                     " (", ctx.op().Input("X")[i], ") is ", params[i]->nbytes(), " bytes, got ",
                     s.bytes);
        std::memcpy(g->mutable_data<T>(ctx.place()), p, params[i]->nbytes());
        dense.erase(d);
        ++got;
        continue;
      }
      auto r = rows.find(s.slot);
      KEEL_ENFORCE(s.rows == 1 && r != rows.end(), what, ": block ", s.slot,
                   " is not a block of this server, or came twice");
      const RowsIn& job = sparse[r->second];
      const int64_t height = job.height(), width = job.width();
      int64_t n = -1;
      if (s.bytes >= static_cast<int64_t>(sizeof(n))) std::memcpy(&n, p, sizeof(n));
      KEEL_ENFORCE(
          n >= 0 && n <= height &&
              s.bytes ==
                  static_cast<int64_t>(sizeof(n) + n * (sizeof(int64_t) + width * sizeof(T))),
          job.what, ": a section of ", s.bytes, " bytes does not hold ", n, " rows of ", width);
      FillRows(ctx, job, n, p + sizeof(n));
      rows.erase(r);
      ++got;
    }
    KEEL_ENFORCE(got == want, what, ": ", want - got, " of this server's ", want,
                 " blocks are missing from the push");
  }

 public:
  void Compute(ExecutionContext& ctx) override {
    const OpDesc& op = ctx.op();
    Transport& t = Connected(op);
    const int fanin = op.Attr<int>("Fanin");
    KEEL_ENFORCE(fanin == t.ntrainers(), "op listen_and_serv: Fanin=", fanin, " but the job has ",
                 t.ntrainers(), " trainers");
    const auto& slots = op.Attr<std::vector<int>>("slots");
    const auto& blocks = op.Attr<std::vector<int>>("optimize_blocks");
    const int lr_block = op.Attr<int>("lr_decay_block_id");
    const std::vector<const Tensor*> params = ctx.MultiInput("X");
    const bool async = op.Attr<int>("mode") >= 1;  // GEO's deltas are served the same way
    const GradSlots grads(ctx, async ? 1 : fanin);
    KEEL_ENFORCE(slots.size() == params.size() && blocks.size() == params.size(),
                 "op listen_and_serv: ", params.size(),
                 " parameter blocks need as many slots and optimize_blocks");
    const int first = t.nservers();
    std::vector<int> trainers;
    for (int r = 0; r < fanin; ++r) trainers.push_back(first + r);
    const std::string me = t.PeerName(t.rank());
    Tables tables(ctx, t, async ? 1 : fanin, grads.sparse_vars());
    Serve(t, op, params, trainers, 0);
    if (async) return ServeAsync(t, ctx, params, grads, tables, trainers);
    // The previous step's replies, posted, not waited for: a trainer takes its parameters in its
    // recv ops, and meanwhile the other may already ask for rows (a prefetch) of its next step.
    auto header = std::make_unique<ps::HeaderWithIds>();  // a header, or a request and its ids
    std::vector<std::unique_ptr<Transport::Transfer>> replies;
    for (int64_t step = 1;; ++step) {
      if (step == 3) FaultPoint("listen_and_serv_step3");  // tests: a server dies mid-training
      // Headers: who starts this step, who is done, from whichever trainer sends next. A trainer
      // may first ask for a checkpoint (between two steps: it gets State) or for rows of a
      // distributed table (before its step, or while it evaluates): served at once, whatever the
      // other trainers are doing (waiting for one trainer's header first would hang a trainer
      // that evaluates while the other waits for it in the evaluation's all-reduce).
      std::vector<ps::Header> h(static_cast<size_t>(fanin));
      std::vector<bool> have(static_cast<size_t>(fanin), false);
      // Each trainer's dense gradients, received straight into its Grads as soon as its header
      // says the step started: its sends (posted during its backward) then flow while the other
      // trainer still computes (Gloo hands data over only once the receive is posted).
      std::vector<std::vector<std::unique_ptr<Transport::Transfer>>> dense(params.size());
      auto post_dense = [&](int r) {
        for (size_t i = 0; i < params.size(); ++i) {
          if (grads.sparse(i)) continue;
          Tensor* g = grads.Var(i, r)->mutable_tensor();
          g->Resize(params[i]->dims());
          dense[i].push_back(
              t.PostRecv({trainers[r]}, Slot(Kind::kGrad, slots[i], step),
                         g->mutable_data<T>(ctx.place()), params[i]->nbytes(),
                         StrCat(me, ": step ", step, "'s gradient of ", op.Input("X")[i], " from ",
                                t.PeerName(trainers[r]))));
        }
      };
      for (int missing = fanin; missing > 0;) {
        std::vector<int> owe;
        std::string names;
        for (int r = 0; r < fanin; ++r)
          if (!have[r]) {
            owe.push_back(trainers[r]);
            names += (names.empty() ? "" : ", ") + t.PeerName(trainers[r]);
          }
        ps::HeaderWithIds& with = *header;
        ps::Header& got = with.h;
        auto head = t.PostRecv(owe, t.HeaderSlot(step), &with, sizeof(with),
                               StrCat(me, ": waiting for ", names, " to start step ", step,
                                      " or stop (fleet::stop_worker)"));
        const int r = t.Wait(*head) - first;
        KEEL_ENFORCE(r >= 0 && r < fanin && !have[r], me, ": step ", step,
                     ": a second header from trainer ", r);
        if (got.step == ps::kSave) {
          SendState(t, ctx, tables, trainers[r], step);
        } else if (got.step == ps::kPrefetch) {
          tables.Prefetch(t, trainers[r], with);
        } else {
          h[r] = got;
          have[r] = true;
          --missing;
          if (got.step != ps::kDone) post_dense(r);
        }
      }
      for (auto& x : replies) t.Wait(*x);
      replies.clear();
      std::vector<int> done, running;
      for (int r = 0; r < fanin; ++r) (h[r].step == ps::kDone ? done : running).push_back(r);
      if (running.empty()) return;
      if (!done.empty()) {
        // The running trainers' receives go before the connections do, once they are in: a
        // running trainer posted every gradient of its step with its header, and a receive
        // destroyed while Gloo's thread completes it races with it (ThreadSanitizer).
        for (auto& block : dense)
          for (auto& x : block) {
            try {
              t.Wait(*x);
            } catch (const std::exception&) {
              // That trainer died too: its receive failed and is done with.
            }
          }
        dense.clear();
        const std::string why = StrCat(
            "synchronous parameter-server training: trainer ", done[0], " stopped after ",
            h[done[0]].steps, " steps while trainer ", running[0], " started step ", step,
            "; in sync mode every trainer must run the same number of steps (give each trainer "
            "the same number of batches)");
        LOG(ERROR) << me << ": " << why;
        t.PostAbort(why);
        t.Reset();  // closes the connections: the trainers' transfers fail now
        std::this_thread::sleep_for(std::chrono::seconds(1));  // they quote `why` from the store
        KEEL_THROW(me, ": ", why);
      }
      // Each dense block is updated once every trainer's gradient of it is in, in the order the
      // trainers send them (their backward: the last blocks first), while the rest still arrive.
      // The blocks update disjoint parameters, so the order changes no value; the learning-rate
      // block goes first. The new values go to each trainer as one message (a bundle) once the
      // last block is updated: before the row-sparse gradients are received when every block is
      // dense (a distributed table's rows are not sent back).
      if (lr_block >= 0) ctx.RunBlock(lr_block);
      bool any_sparse = false;
      for (size_t i = params.size(); i-- > 0;) {
        if (grads.sparse(i)) {
          any_sparse = true;
          continue;
        }
        for (auto& x : dense[i]) t.Wait(*x);
        ctx.RunBlock(blocks[i]);
      }
      if (!any_sparse) PostBundle(t, op, params, trainers, step, &replies);
      // Then the row-sparse gradients, from each trainer in turn (their sizes differ).
      std::vector<RowsIn> sparse;
      for (size_t i = 0; i < params.size(); ++i)
        for (int r = 0; grads.sparse(i) && r < fanin; ++r)
          sparse.push_back({trainers[r], slots[i], grads.Var(i, r), params[i]->dims(),
                            StrCat(me, ": step ", step, "'s gradient of ", op.Input("X")[i],
                                   " from ", t.PeerName(trainers[r]))});
      const size_t ntable = tables.AddJobs(&sparse, trainers, step);
      RecvRows(t, ctx, sparse, step);
      tables.Translate(sparse, ntable);
      for (size_t i = 0; i < params.size(); ++i)
        if (grads.sparse(i)) ctx.RunBlock(blocks[i]);
      if (any_sparse) PostBundle(t, op, params, trainers, step, &replies);
      tables.RunBlocks(ctx);
    }
  }

 private:
  // Asynchronous and GEO mode: a server thread of its own serves the trainers' requests for rows
  // of distributed tables (their own header slot), so that a request does not wait behind
  // another trainer's push in the server's loop; the tables are locked (`mu`) while it reads them
  // and while a push updates them. It ends once every trainer said on that slot that it is done
  // (fleet::stop_worker); Stop (the destructor) aborts its wait, for the server's error paths.
  class PrefetchLoop {
   public:
    PrefetchLoop(Transport& t, Tables& tables, std::mutex& mu, std::vector<int> live)
        : t_(t), tables_(tables), mu_(mu), live_(std::move(live)) {
      thread_ = std::thread([this] { Run(); });
    }
    ~PrefetchLoop() { Stop(); }
    // Its error, if it stopped on one (a dead trainer): the server stops with it.
    void Check() {
      std::lock_guard<std::mutex> lk(state_mu_);
      KEEL_ENFORCE(error_.empty(), error_);
    }
    // Every trainer is done: waits for the loop to end.
    void Finish() {
      if (thread_.joinable()) thread_.join();
      Check();
    }

   private:
    void Run() {
      const std::string me = t_.PeerName(t_.rank());
      try {
        while (!live_.empty()) {
          ps::HeaderWithIds& with = *header_;
          const ps::Header& h = with.h;
          std::unique_ptr<Transport::Transfer> head;
          {
            std::lock_guard<std::mutex> lk(state_mu_);
            if (stop_) return;
            head = t_.PostRecv(live_, t_.PrefetchHeaderSlot(), &with, sizeof(with),
                               StrCat(me, ": waiting for a trainer to ask for rows or stop"));
            current_ = head.get();
          }
          int from = -1;
          try {
            from = t_.Wait(*head);
          } catch (...) {
            std::lock_guard<std::mutex> lk(state_mu_);
            current_ = nullptr;
            throw;
          }
          {
            std::lock_guard<std::mutex> lk(state_mu_);
            current_ = nullptr;
            if (stop_) return;
          }
          if (h.step == ps::kDone) {
            live_.erase(std::find(live_.begin(), live_.end(), from));
            continue;
          }
          KEEL_ENFORCE(h.step == ps::kPrefetch, me, ": ", t_.PeerName(from), " sent header ",
                       h.step, " where it asks for rows");
          std::lock_guard<std::mutex> lk(mu_);
          tables_.Prefetch(t_, from, with);
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(state_mu_);
        error_ = e.what();
      }
    }
    void Stop() {
      if (!thread_.joinable()) return;
      {
        std::lock_guard<std::mutex> lk(state_mu_);
        stop_ = true;
        if (current_ != nullptr) t_.AbortRecv(*current_);
      }
      thread_.join();
    }

    Transport& t_;
    Tables& tables_;
    std::mutex& mu_;
    std::vector<int> live_;
    std::mutex state_mu_;  // stop_, current_, error_
    bool stop_ = false;
    Transport::Transfer* current_ = nullptr;
    std::string error_;
    std::unique_ptr<ps::HeaderWithIds> header_ = std::make_unique<ps::HeaderWithIds>();
    std::thread thread_;
  };

  // Asynchronous mode: whichever trainer's header comes next, its step is served alone: its
  // gradient of each block (Grads[i]), the learning-rate block, the optimize blocks (one update
  // with this trainer's gradient), its new parameters. No trainer waits for another; the loop
  // ends once every trainer has stopped (in any order, after any number of steps).
  static void ServeAsync(Transport& t, ExecutionContext& ctx,
                         const std::vector<const Tensor*>& params, const GradSlots& grads,
                         Tables& tables, std::vector<int> live) {
    const OpDesc& op = ctx.op();
    const auto& slots = op.Attr<std::vector<int>>("slots");
    const auto& blocks = op.Attr<std::vector<int>>("optimize_blocks");
    const int lr_block = op.Attr<int>("lr_decay_block_id");
    const std::string me = t.PeerName(t.rank());
    // Replies to each trainer are posted, not waited for: a trainer takes them only once every
    // server took its step's gradients, and another server may be busy replying to another
    // trainer (waiting here would close a cycle). They are waited for before the next reply to
    // the same trainer (which by then has them) and at the end; not before serving a prefetch:
    // a trainer asks for its next batch's rows while its communicator still pushes the previous
    // step to the other servers, and takes the replies only once every server took that push
    // (waiting would close the same cycle through two servers and two trainers).
    std::map<int, std::vector<std::unique_ptr<Transport::Transfer>>> replies;
    auto settle = [&](int trainer) {
      for (auto& r : replies[trainer]) t.Wait(*r);
      replies[trainer].clear();
    };
    std::mutex table_mu;
    PrefetchLoop prefetches(t, tables, table_mu, live);
    std::vector<char> push;  // a push's message (reused)
    int64_t served = 0;
    while (!live.empty()) {
      if (served == 2 * static_cast<int64_t>(t.ntrainers()))
        FaultPoint("listen_and_serv_step3");  // tests: a server dies mid-training
      ps::Header h;
      auto head = t.PostRecv(live, t.HeaderSlot(0), &h, sizeof(h),
                             StrCat(me, ": waiting for a trainer to start a step or stop"));
      const int from = t.Wait(*head);
      prefetches.Check();
      settle(from);
      if (h.step == ps::kDone) {
        live.erase(std::find(live.begin(), live.end(), from));
        continue;
      }
      if (h.step == ps::kSave) {
        std::lock_guard<std::mutex> lk(table_mu);
        replies[from] = PostState(t, ctx, tables, from, h.steps + 1);
        continue;
      }
      KEEL_ENFORCE(h.step >= 1, me, ": ", t.PeerName(from), " sent header ", h.step,
                   " where it starts a step or stops");
      std::vector<std::unique_ptr<Transport::Transfer>> pending;
      std::vector<RowsIn> sparse;
      const bool bundled = h.count > 0;  // the communicator's push (GEO: a message per block)
      for (size_t i = 0; i < params.size(); ++i) {
        if (grads.sparse(i)) {
          sparse.push_back({from, slots[i], grads.Var(i, 0), params[i]->dims(),
                            StrCat(me, ": ", t.PeerName(from), "'s gradient of ", op.Input("X")[i],
                                   " (its step ", h.step, ")")});
          continue;
        }
        if (bundled) continue;
        Tensor* g = grads.Var(i, 0)->mutable_tensor();
        g->Resize(params[i]->dims());
        pending.push_back(t.PostRecv({from}, Slot(Kind::kGrad, slots[i], h.step),
                                     g->mutable_data<T>(ctx.place()), params[i]->nbytes(),
                                     StrCat(me, ": ", t.PeerName(from), "'s gradient of ",
                                            op.Input("X")[i], " (its step ", h.step, ")")));
      }
      const size_t ntable = tables.AddJobs(&sparse, {from}, h.step);
      if (bundled) {
        RecvPush(t, ctx, from, h, params, grads, sparse, &push);
      } else {
        RecvRows(t, ctx, sparse, h.step);
      }
      for (auto& p : pending) t.Wait(*p);
      if (lr_block >= 0) ctx.RunBlock(lr_block);
      for (int b : blocks) ctx.RunBlock(b);
      {
        // The rows renumbered to the shards' and updated with no prefetch between (a prefetch
        // may create rows, and the update wants the shard as the renumbering saw it).
        std::lock_guard<std::mutex> lk(table_mu);
        tables.Translate(sparse, ntable);
        tables.RunBlocks(ctx);
      }
      replies[from].clear();
      PostBundle(t, op, params, {from}, h.step, &replies[from]);
      ++served;
    }
    prefetches.Finish();
  }

  static void SendState(Transport& t, ExecutionContext& ctx, const Tables& tables, int trainer,
                        int64_t step) {
    for (auto& s : PostState(t, ctx, tables, trainer, step)) t.Wait(*s);
  }

  // The State list, then the distributed tables' shards (Tables::PostShards).
  static std::vector<std::unique_ptr<Transport::Transfer>> PostState(Transport& t,
                                                                     ExecutionContext& ctx,
                                                                     const Tables& tables,
                                                                     int trainer, int64_t step) {
    const std::vector<const Tensor*> state = ctx.MultiInput("State");
    std::vector<std::unique_ptr<Transport::Transfer>> sends;
    for (size_t i = 0; i < state.size(); ++i)
      sends.push_back(t.PostSend(trainer, Slot(Kind::kState, static_cast<int>(i), step),
                                 state[i]->raw_data(), state[i]->nbytes(),
                                 StrCat(t.PeerName(t.rank()), ": ", ctx.op().Input("State")[i],
                                        " for a checkpoint to ", t.PeerName(trainer))));
    tables.PostShards(t, trainer, step, static_cast<int>(state.size()), &sends);
    return sends;
  }

  static void Serve(Transport& t, const OpDesc& op, const std::vector<const Tensor*>& params,
                    const std::vector<int>& trainers, int64_t step) {
    for (auto& s : PostServe(t, op, params, trainers, step)) t.Wait(*s);
  }

  // Posts X (copies) to `trainers` as the values after `step`.
  static std::vector<std::unique_ptr<Transport::Transfer>> PostServe(
      Transport& t, const OpDesc& op, const std::vector<const Tensor*>& params,
      const std::vector<int>& trainers, int64_t step) {
    std::vector<std::unique_ptr<Transport::Transfer>> sends;
    for (size_t i = 0; i < params.size(); ++i)
      PostServeBlock(t, op, params, i, trainers, step, &sends);
    return sends;
  }

  // Synchronous mode: posts every X block to `trainers` as their values after `step`, as one
  // message (ps::PackBundle; Transport::WaitRecvs and the communicator take it apart).
  static void PostBundle(Transport& t, const OpDesc& op, const std::vector<const Tensor*>& params,
                         const std::vector<int>& trainers, int64_t step,
                         std::vector<std::unique_ptr<Transport::Transfer>>* sends) {
    if (params.empty()) return;
    const auto& slots = op.Attr<std::vector<int>>("slots");
    std::vector<ps::BundleSource> blocks;
    for (size_t i = 0; i < params.size(); ++i)
      blocks.push_back(
          {slots[i], static_cast<const char*>(params[i]->raw_data()), params[i]->nbytes()});
    std::vector<char> bytes = ps::PackBundle(std::move(blocks));
    for (size_t k = 0; k < trainers.size(); ++k) {
      const int r = trainers[k];
      std::vector<char> copy = k + 1 < trainers.size() ? bytes : std::move(bytes);
      sends->push_back(
          t.PostSend(r, Slot(Kind::kBundle, 0, step), std::move(copy),
                     StrCat(t.PeerName(t.rank()), ": its ", params.size(),
                            " parameter blocks after step ", step, " to ", t.PeerName(r))));
    }
  }

  // Posts X[i] (a copy) to `trainers` as its value after `step`, into `sends`.
  static void PostServeBlock(Transport& t, const OpDesc& op,
                             const std::vector<const Tensor*>& params, size_t i,
                             const std::vector<int>& trainers, int64_t step,
                             std::vector<std::unique_ptr<Transport::Transfer>>* sends) {
    const int slot = op.Attr<std::vector<int>>("slots")[i];
    for (int r : trainers)
      sends->push_back(t.PostSend(r, Slot(Kind::kParam, slot, step), params[i]->raw_data(),
                                  params[i]->nbytes(),
                                  StrCat(t.PeerName(t.rank()), ": ", op.Input("X")[i],
                                         " after step ", step, " to ", t.PeerName(r))));
  }
};

}  // namespace

KEEL_REGISTER_OP(listen_and_serv)
    .Doc(
        "A parameter server's loop (synchronous): serves X, merges the trainers' gradients "
        "into Grads, runs the optimize blocks, until every trainer stops")
    .InputList("X", "this server's parameter blocks")
    .InputList("State",
               "what else it holds (learning rate, optimizer state blocks), sent to a trainer "
               "that asks for a checkpoint")
    .OutputList("Grads",
                "per dense block, each trainer's gradient (block-major); @EMPTY@ when none")
    .OutputList("RowGrads",
                "per row-sparse block (sparse_blocks), then per distributed table, each "
                "trainer's gradient (block-major; a table's rows renumbered to its shard's); "
                "@EMPTY@ when none")
    .OutputList("TableVars",
                "per distributed table (is_distributed) of which this server holds a shard: the "
                "shard (the rows of its ids, created on first touch), their ids (int64) and its "
                "optimizer state with the table's rows, grown with it; @EMPTY@ when none")
    .Attr<std::vector<int>>("sparse_blocks", {},
                            "the X blocks (indices) whose gradients come row-sparse (is_sparse "
                            "embeddings), into RowGrads")
    .Attr<bool>("row_sparse", false,
                "there are sparse_blocks or distributed tables (RowGrads are row-sparse)")
    .WritesRowSparseWhen("RowGrads", "row_sparse")
    .Attr<std::vector<int>>("table_slots", {}, "each table's index in the transpiler's plan")
    .Attr<std::vector<int>>("table_blocks", {}, "the block updating each table")
    .Attr<std::vector<int64_t>>("table_heights", {}, "each table's rows (V)")
    .Attr<std::vector<int64_t>>("table_widths", {}, "each table's row width (D)")
    .Attr<std::vector<int>>("table_state_counts", {},
                            "how many state vars each table has in TableVars")
    .Attr<std::vector<float>>("table_state_values", {}, "each table state var's value in a new row")
    .Attr<std::vector<int>>("table_dists", {},
                            "each table's row initializer (row_seeded_random's dist)")
    .Attr<std::vector<float>>("table_as", {}, "row_seeded_random's a, per table")
    .Attr<std::vector<float>>("table_bs", {}, "row_seeded_random's b, per table")
    .Attr<std::vector<int64_t>>("table_seeds", {}, "row_seeded_random's seed, per table")
    .RequiredAttr<std::vector<int>>("slots", "each X block's index in the transpiler's plan")
    .RequiredAttr<std::vector<int>>("optimize_blocks", "the block updating each X")
    .Attr<int>("lr_decay_block_id", -1, "the learning-rate block run once per step; -1: none")
    .Attr<int>("Fanin", 1, "trainers in the job", Positive)
    .Attr<int>("pserver_num", 1, "servers in the job", Positive)
    .Attr<int>("server_index", 0, "this server", NonNegative)
    .Attr<int>("mode", 0,
               "0: synchronous (Grads: Fanin per block, merged); 1: asynchronous (Grads: one per "
               "block, each trainer's step applied as it arrives); 2: GEO (Grads: one delta per "
               "block, added as it arrives)",
               Mode)
    .Barrier("runs the server's whole loop")
    .NotCapturable("waits for the network");
KEEL_REGISTER_CPU_KERNEL(listen_and_serv, ListenAndServKernel, float, double);

}  // namespace keel
