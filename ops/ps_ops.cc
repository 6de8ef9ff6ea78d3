// Parameter-server ops (Paddle's names; docs/parameter-server.md, transpiler/ps_pass.h writes
// them): on a trainer, send (a gradient's row blocks to their servers), send_barrier (the step's
// gradients have reached the servers), recv (a parameter's row blocks from their servers) and
// fetch_barrier (they have arrived), geo_communicate; the server's loop, listen_and_serv, is in
// ops/ps_server_ops.cc. They
// move bytes through the parameter-server transport (framework/ps/ps_transport.h), which the
// first of them connects. CPU only: a CUDA place finds no kernel and is refused naming the op.
//
// Blocks are whole rows: a tensor of dims [R, ...] is cut into sections (rows per block), block i
// going to (or coming from) server epmap[i] under plan index slots[i].
#include <algorithm>
#include <cstring>

#include "framework/comm/comm_context.h"
#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/ps/async_communicator.h"
#include "framework/ps/ps_transport.h"
#include "ops/ps_ops.h"

namespace keel {

namespace {

using ps::Kind;
using ps::Slot;
using ps::Transport;

std::string Positive(const Attribute& a) { return std::get<int>(a) >= 1 ? "" : "must be >= 1"; }
std::string Mode(const Attribute& a) {
  const int m = std::get<int>(a);
  return m >= 0 && m <= 2 ? "" : "must be 0 (sync), 1 (async) or 2 (geo)";
}

}  // namespace

// Connects this process (its global rank from the job's CommContext) on first use.
Transport& PsConnected(const OpDesc& op) {
  Transport& t = Transport::Get();
  if (t.connected()) {
    if (op.HasAttr("mode")) t.SetAsync(op.Attr<int>("mode") >= 1, op.type());
    return t;
  }
  CommContext& cc = CommContext::Get();
  KEEL_ENFORCE(cc.initialized(), "op ", op.type(),
               ": communication is not initialized; call fleet::init(CloudRoleMaker(false)) "
               "(or run under keel launch --server_num --worker_num)");
  t.Connect(cc.config().rank, cc.config().nranks, op.Attr<int>("pserver_num"));
  if (op.HasAttr("mode")) t.SetAsync(op.Attr<int>("mode") >= 1, op.type());
  return t;
}

namespace {

Transport& Connected(const OpDesc& op) { return PsConnected(op); }

// Bytes per row of `dims` (a 0-d or 1-element tensor is one row).
int64_t RowBytes(const DDim& dims, size_t nbytes) {
  const int64_t rows = dims.size() == 0 ? 1 : dims[0];
  return rows == 0 ? 0 : static_cast<int64_t>(nbytes) / rows;
}

void CheckBlocks(const OpDesc& op, size_t n) {
  KEEL_ENFORCE(op.Attr<std::vector<int>>("epmap").size() == n &&
                   op.Attr<std::vector<int64_t>>("sections").size() == n &&
                   op.Attr<std::vector<int>>("slots").size() == n,
               "op ", op.type(), ": epmap, sections and slots must have one entry per block (", n,
               ")");
}

template <typename T>
class PsSendKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const OpDesc& op = ctx.op();
    const auto& epmap = op.Attr<std::vector<int>>("epmap");
    const auto& sections = op.Attr<std::vector<int64_t>>("sections");
    const auto& slots = op.Attr<std::vector<int>>("slots");
    CheckBlocks(op, epmap.size());
    const Tensor& x = ctx.Input("X");
    const std::string& name = op.Input("X")[0];
    const Variable* var = ctx.InputVar("X");
    if (var != nullptr && var->is_row_sparse()) return SendRows(ctx, *var);
    KEEL_ENFORCE(!op.Attr<bool>("is_distributed"), "op send of ", name,
                 ": is_distributed is set but ", name, " holds a dense tensor");
    int64_t rows = 0;
    for (int64_t r : sections) rows += r;
    KEEL_ENFORCE(rows == (x.dims().size() == 0 ? 1 : x.dims()[0]), "op send of ", name,
                 ": the sections hold ", rows, " rows but ", name, " is ", x.dims());
    Transport& t = Connected(op);
    const int64_t row_bytes = RowBytes(x.dims(), x.nbytes());
    const char* p = static_cast<const char*>(x.raw_data());
    if (t.communicating()) {  // async mode after the first step: the communicator pushes
      for (size_t i = 0; i < epmap.size(); ++i) {
        const size_t bytes = static_cast<size_t>(sections[i] * row_bytes);
        t.communicator().AddDense(
            epmap[i], slots[i], x.dtype(), p, bytes, op.Attr<bool>("merge_sum"),
            StrCat("send of ", name, " block ", i, " to ", t.PeerName(epmap[i])));
        p += bytes;
      }
      return;
    }
    t.BeginStepOnce();
    for (size_t i = 0; i < epmap.size(); ++i) {
      const size_t bytes = static_cast<size_t>(sections[i] * row_bytes);
      t.KeepSend(t.PostSend(epmap[i], Slot(Kind::kGrad, slots[i], t.step()), p, bytes,
                            StrCat("send of ", name, " block ", i, " (step ", t.step(), ") to ",
                                   t.PeerName(epmap[i]))));
      p += bytes;
    }
  }

 private:
  // A row-sparse X (an is_sparse embedding's gradient): per block, its row count (kGrad) then its
  // rows and their values (kRows: n int64 rows, then n rows of values). Row blocks: the rows in
  // each block's range, numbered within the block. is_distributed: block s is server s's, the
  // rows with id % pserver_num == s, numbered by id.
  static void SendRows(ExecutionContext& ctx, const Variable& var) {
    const OpDesc& op = ctx.op();
    const auto& epmap = op.Attr<std::vector<int>>("epmap");
    const auto& sections = op.Attr<std::vector<int64_t>>("sections");
    const auto& slots = op.Attr<std::vector<int>>("slots");
    const std::string& name = op.Input("X")[0];
    const bool distributed = op.Attr<bool>("is_distributed");
    KEEL_ENFORCE(op.Attr<bool>("is_sparse"), "op send of ", name,
                 " reads a row-sparse gradient but its attr is_sparse is false");
    const Tensor& x = ctx.Input("X");
    const int64_t n = static_cast<int64_t>(var.rows().size());
    const int64_t width = n == 0 ? 0 : x.numel() / n;
    int64_t height = 0;
    for (int64_t r : sections) height += r;
    KEEL_ENFORCE(distributed || height == var.height(), "op send of ", name, ": the sections hold ",
                 height, " rows but ", name, " stands for ", var.height());
    const int S = static_cast<int>(epmap.size());
    if (distributed)
      for (int s = 0; s < S; ++s)
        KEEL_ENFORCE(epmap[s] == s, "op send of ", name,
                     ": is_distributed needs epmap = [0, ..., pserver_num - 1]");
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(S));
    std::vector<std::vector<T>> values(static_cast<size_t>(S));
    std::vector<int64_t> row0(static_cast<size_t>(S), 0);
    for (int i = 1; i < S; ++i) row0[i] = row0[i - 1] + sections[i - 1];
    const T* xd = x.data<T>();
    for (int64_t k = 0; k < n; ++k) {
      const int64_t r = var.rows()[k];
      int b = 0;
      int64_t local = r;
      if (distributed) {
        b = static_cast<int>(r % S);
      } else {
        b = static_cast<int>(std::upper_bound(row0.begin(), row0.end(), r) - row0.begin()) - 1;
        local = r - row0[b];
      }
      rows[b].push_back(local);
      values[b].insert(values[b].end(), xd + k * width, xd + (k + 1) * width);
    }
    Transport& t = Connected(op);
    if (t.communicating()) {
      for (int i = 0; i < S; ++i)
        t.communicator().AddRows(
            epmap[i], slots[i], DTypeOf<T>::value, std::move(rows[i]), values[i].data(), width,
            op.Attr<bool>("merge_sum"),
            StrCat("send of ", name, " block ", i, " to ", t.PeerName(epmap[i])));
      return;
    }
    t.BeginStepOnce();
    for (int i = 0; i < S; ++i) {
      const int64_t count = static_cast<int64_t>(rows[i].size());
      const std::string what = StrCat("send of ", name, " block ", i, " (", count, " rows, step ",
                                      t.step(), ") to ", t.PeerName(epmap[i]));
      t.KeepSend(
          t.PostSend(epmap[i], Slot(Kind::kGrad, slots[i], t.step()), &count, sizeof(count), what));
      std::vector<char> payload(static_cast<size_t>(count) * (sizeof(int64_t) + width * sizeof(T)));
      std::memcpy(payload.data(), rows[i].data(), count * sizeof(int64_t));
      std::memcpy(payload.data() + count * sizeof(int64_t), values[i].data(),
                  values[i].size() * sizeof(T));
      t.KeepSend(t.PostSend(epmap[i], Slot(Kind::kRows, slots[i], t.step()), payload.data(),
                            payload.size(), what));
    }
  }
};

template <typename T>
class PsRecvKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const OpDesc& op = ctx.op();
    const auto& epmap = op.Attr<std::vector<int>>("epmap");
    const auto& sections = op.Attr<std::vector<int64_t>>("sections");
    const auto& slots = op.Attr<std::vector<int>>("slots");
    const auto& shape = op.Attr<std::vector<int64_t>>("shape");
    const std::vector<Tensor*> outs = ctx.MultiOutput("Out");
    CheckBlocks(op, outs.size());
    Transport& t = Connected(op);
    // Async mode: the trainer's startup says which blocks the communicator pulls (and where their
    // initial values land); its steps take the latest it pulled.
    const bool pulls = op.Attr<int>("mode") == 1 && !t.communicating();
    for (size_t i = 0; i < outs.size(); ++i) {
      std::vector<int64_t> dims = shape;
      if (!dims.empty()) dims[0] = sections[i];
      outs[i]->Resize(DDim(dims));
      T* data = outs[i]->mutable_data<T>(ctx.place());
      const std::string what =
          StrCat("recv of ", op.Output("Out")[i], " from ", t.PeerName(epmap[i]));
      if (pulls)
        t.communicator().AddPull(epmap[i], slots[i], outs[i]->nbytes(), what,
                                 t.step() == 0 ? data : nullptr);
      if (t.communicating()) {
        t.communicator().CopyLatest(epmap[i], slots[i], data, outs[i]->nbytes(), what);
        continue;
      }
      // After a step the block comes in its server's bundle (fetch_barrier), which holds every
      // block of that server.
      if (t.step() >= 1) {
        t.AddBundleBlock(epmap[i], slots[i], data, outs[i]->nbytes(), what);
        continue;
      }
      t.KeepRecv(t.PostRecv({epmap[i]}, Slot(Kind::kParam, slots[i], t.step()), data,
                            outs[i]->nbytes(),
                            StrCat("recv of ", op.Output("Out")[i], " (after step ", t.step(),
                                   ") from ", t.PeerName(epmap[i]))));
    }
  }
};

template <typename T>
class SendBarrierKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    Transport& t = Connected(ctx.op());
    if (t.communicating()) return t.communicator().Submit();
    t.WaitSends();
  }
};

template <typename T>
class FetchBarrierKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    Transport& t = Connected(ctx.op());
    if (t.communicating()) return t.communicator().Check();
    t.WaitRecvs();
    // Async mode, the trainer's startup: the communicator takes over from the first step on (the
    // recv ops registered every block to pull, and their initial values have arrived).
    const OpDesc& op = ctx.op();
    if (op.Attr<int>("send_queue_size") > 0 && t.async() && t.step() == 0 && t.has_communicator())
      t.StartCommunicating(op.Attr<int>("send_queue_size"), op.Attr<int>("max_merge_var_num"),
                           op.Attr<int>("max_staleness"));
  }
};

// GEO (Paddle's GeoCommunicator; transpiler/ps_pass.h): every k_steps-th run, for each block of
// each parameter, sends delta = (Param - Old) / trainers to its server (which adds it), receives
// the server's blocks (one message per server, Transport::WaitRecvs) into Param and sets
// Old = Param. Other runs do nothing. The runs are counted
// by the transport (this process's main-program runs since it connected).
template <typename T>
class GeoCommunicateKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const OpDesc& op = ctx.op();
    const auto& epmap = op.Attr<std::vector<int>>("epmap");
    const auto& sections = op.Attr<std::vector<int64_t>>("sections");
    const auto& slots = op.Attr<std::vector<int>>("slots");
    const auto& nblocks = op.Attr<std::vector<int>>("blocks");
    const int k = op.Attr<int>("k_steps");
    const T scale = T(1) / static_cast<T>(op.Attr<int>("trainers"));
    CheckBlocks(op, epmap.size());
    const std::vector<Tensor*> params = ctx.MultiOutput("ParamOut");
    const std::vector<Tensor*> olds = ctx.MultiOutput("OldOut");
    KEEL_ENFORCE(params.size() == nblocks.size() && olds.size() == params.size() &&
                     ctx.MultiInput("Param").size() == params.size(),
                 "op geo_communicate: ", params.size(),
                 " parameters need as many Old and "
                 "blocks entries");
    Transport& t = Connected(op);
    if (t.NextGeoRun() % k != 0) return;
    t.BeginStepOnce();
    size_t b = 0;
    for (size_t p = 0; p < params.size(); ++p) {
      const std::string& name = op.Input("Param")[p];
      KEEL_ENFORCE(olds[p]->dims() == params[p]->dims(), "op geo_communicate: ", op.Input("Old")[p],
                   " is ", olds[p]->dims(), " but ", name, " is ", params[p]->dims());
      const int64_t row = RowBytes(params[p]->dims(), params[p]->nbytes()) / sizeof(T);
      const T* cur = params[p]->data<T>();
      const T* old = olds[p]->data<T>();
      int64_t at = 0;
      for (int i = 0; i < nblocks[p]; ++i, ++b) {
        KEEL_ENFORCE(b < epmap.size(), "op geo_communicate: more blocks than epmap entries");
        const int64_t n = sections[b] * row;
        KEEL_ENFORCE(at + n <= params[p]->numel(), "op geo_communicate: the sections of ", name,
                     " hold more than its ", params[p]->numel(), " elements");
        std::vector<T> delta(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) delta[j] = (cur[at + j] - old[at + j]) * scale;
        t.KeepSend(t.PostSend(epmap[b], Slot(Kind::kGrad, slots[b], t.step()), delta.data(),
                              n * sizeof(T),
                              StrCat("GEO delta of ", name, " block ", i, " (push ", t.step(),
                                     ") to ", t.PeerName(epmap[b]))));
        at += n;
      }
    }
    t.WaitSends();
    b = 0;
    for (size_t p = 0; p < params.size(); ++p) {
      const int64_t row = RowBytes(params[p]->dims(), params[p]->nbytes()) / sizeof(T);
      T* cur = params[p]->mutable_data<T>(ctx.place());
      int64_t at = 0;
      for (int i = 0; i < nblocks[p]; ++i, ++b) {
        const int64_t n = sections[b] * row;
        // The server's reply is every block it holds in one message (its bundle).
        t.AddBundleBlock(epmap[b], slots[b], cur + at, n * sizeof(T),
                         StrCat("GEO pull of ", op.Input("Param")[p], " block ", i, " (push ",
                                t.step(), ") from ", t.PeerName(epmap[b])));
        at += n;
      }
    }
    t.WaitRecvs();
    for (size_t p = 0; p < params.size(); ++p)
      std::memcpy(olds[p]->mutable_data<T>(ctx.place()), params[p]->data<T>(), params[p]->nbytes());
  }
};

OpSchema& BlockAttrs(OpSchema& s) {
  return s.RequiredAttr<std::vector<int>>("epmap", "the server (index) of each block")
      .RequiredAttr<std::vector<int64_t>>("sections", "rows of each block")
      .RequiredAttr<std::vector<int>>("slots", "each block's index in the transpiler's plan")
      .Attr<int>("pserver_num", 1, "servers in the job (ranks 0..pserver_num-1)", Positive)
      .Attr<int>("mode", 0, "0: synchronous, 1: asynchronous, 2: GEO (transpiler/ps_pass.h)", Mode);
}

}  // namespace

[[maybe_unused]] static OpSchema& keel_schema_send = BlockAttrs(
    OpRegistry::Register("send")
        .Doc("Sends X's row blocks to their servers (posted; send_barrier waits); the "
             "first send of a step tells every server the step starts")
        .Input("X", "the gradient")
        .Attr<std::vector<std::string>>("send_varnames", {}, "the blocks' names on the servers")
        .Attr<bool>("is_sparse", false,
                    "X is row-sparse (an is_sparse embedding's gradient): each block goes as its "
                    "row count, then its rows and their values")
        .Attr<bool>("is_distributed", false,
                    "X is a distributed table's row-sparse gradient: row id goes to server id % "
                    "pserver_num (epmap [0, ..., pserver_num - 1]), under its id")
        .Attr<bool>("merge_sum", false,
                    "asynchronous mode: when several steps of X wait in the communicator's queue "
                    "they merge by sum (the parameter's update is SGD) instead of the average")
        .AcceptsRowSparse("X", "is_sparse"));
KEEL_REGISTER_CPU_KERNEL(send, PsSendKernel, float, double);

[[maybe_unused]] static OpSchema& keel_schema_recv =
    BlockAttrs(OpRegistry::Register("recv")
                   .Doc("Receives each Out block from its server: the server's values after "
                        "the trainer's latest step, in the server's one message of all its "
                        "blocks, which fetch_barrier receives and takes apart (startup: the "
                        "initial values, a message per block)")
                   .OutputList("Out", "the blocks, in row order")
                   .RequiredAttr<std::vector<int64_t>>("shape", "the whole parameter's dims")
                   .Shape([](InferShapeContext& ctx) {
                     const auto& shape = ctx.Attr<std::vector<int64_t>>("shape");
                     const auto& sections = ctx.Attr<std::vector<int64_t>>("sections");
                     const int n = static_cast<int>(sections.size());
                     for (int i = 0; i < n && i < ctx.NumOutputs("Out"); ++i) {
                       std::vector<int64_t> d = shape;
                       if (!d.empty()) d[0] = sections[i];
                       ctx.SetOutputDim("Out", DDim(d), i);
                     }
                   }));
KEEL_REGISTER_CPU_KERNEL(recv, PsRecvKernel, float, double);

KEEL_REGISTER_OP(geo_communicate)
    .Doc(
        "GEO parameter-server training: every k_steps-th run, sends each parameter block's "
        "(Param - Old) / trainers to its server, receives the server's block into Param and "
        "sets Old = Param")
    .InputList("Param", "the trainer's parameters (after its local optimizer step)")
    .InputList("Old", "each parameter's value at the last exchange (<param>@GEO_OLD)")
    .OutputList("ParamOut", "= Param (in place)")
    .OutputList("OldOut", "= Old (in place)")
    .RequiredAttr<std::vector<int>>("epmap", "the server of each block, parameters in order")
    .RequiredAttr<std::vector<int64_t>>("sections", "rows of each block")
    .RequiredAttr<std::vector<int>>("slots", "each block's index in the transpiler's plan")
    .RequiredAttr<std::vector<int>>("blocks", "blocks per parameter")
    .Attr<int>("k_steps", 1, "exchange every k_steps runs", Positive)
    .Attr<int>("trainers", 1, "trainers in the job (the delta's divisor)", Positive)
    .Attr<int>("pserver_num", 1, "servers in the job", Positive)
    .Attr<int>("mode", 2, "2 (GEO)", Mode)
    .Barrier("reads every parameter after the local update")
    .NotCapturable("waits for the network");
KEEL_REGISTER_CPU_KERNEL(geo_communicate, GeoCommunicateKernel, float, double);

KEEL_REGISTER_OP(send_barrier)
    .Doc("Waits until every block this step's send ops posted has reached its server")
    .InputList("X", "the sent gradients (documentation; not read)")
    .Attr<int>("pserver_num", 1, "servers in the job", Positive)
    .AcceptsRowSparse("X")
    .Barrier("every send of the step must have been posted before it waits")
    .NotCapturable("waits for the network");
KEEL_REGISTER_CPU_KERNEL(send_barrier, SendBarrierKernel, float);

KEEL_REGISTER_OP(fetch_barrier)
    .Doc(
        "Waits until every block the recv ops posted has arrived; in an asynchronous "
        "trainer's startup program with send_queue_size > 0, then hands the pushes and pulls "
        "of its steps to the trainer's communicator (framework/ps/async_communicator.h)")
    .InputList("X", "the received blocks (documentation)")
    .Attr<int>("pserver_num", 1, "servers in the job", Positive)
    .Attr<int>("send_queue_size", 0,
               "asynchronous mode: steps that may wait in the communicator (0: no communicator)",
               [](const Attribute& a) { return std::get<int>(a) >= 0 ? "" : "must be >= 0"; })
    .Attr<int>("max_merge_var_num", 1, "asynchronous mode: the most queued steps merged in a push",
               Positive)
    .Attr<int>("max_staleness", 0,
               "asynchronous mode: how many of its own latest steps a trainer's step may lack "
               "(recv waits for the pulls until then); -1: never waits",
               [](const Attribute& a) { return std::get<int>(a) >= -1 ? "" : "must be >= -1"; })
    .Barrier("the received blocks are read only after it")
    .NotCapturable("waits for the network");
KEEL_REGISTER_CPU_KERNEL(fetch_barrier, FetchBarrierKernel, float);

}  // namespace keel
