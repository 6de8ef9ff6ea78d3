// Parameter-server ops (Paddle's names; docs/parameter-server.md, transpiler/ps_pass.h writes
// them): on a trainer, send (a gradient's row blocks to their servers), send_barrier (the step's
// gradients have reached the servers), recv (a parameter's row blocks from their servers) and
// fetch_barrier (they have arrived); on a server, listen_and_serv (the server's whole loop). They
// move bytes through the parameter-server transport (framework/ps/ps_transport.h), which the
// first of them connects. CPU only: a CUDA place finds no kernel and is refused naming the op.
//
// Blocks are whole rows: a tensor of dims [R, ...] is cut into sections (rows per block), block i
// going to (or coming from) server epmap[i] under plan index slots[i].
#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include <glog/logging.h>

#include "framework/comm/comm_context.h"
#include "framework/fault_point.h"
#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/ps/ps_transport.h"

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

// Connects this process (its global rank from the job's CommContext) on first use.
Transport& Connected(const OpDesc& op) {
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
    int64_t rows = 0;
    for (int64_t r : sections) rows += r;
    KEEL_ENFORCE(rows == (x.dims().size() == 0 ? 1 : x.dims()[0]), "op send of ", name,
                 ": the sections hold ", rows, " rows but ", name, " is ", x.dims());
    Transport& t = Connected(op);
    t.BeginStepOnce();
    const int64_t row_bytes = RowBytes(x.dims(), x.nbytes());
    const char* p = static_cast<const char*>(x.raw_data());
    for (size_t i = 0; i < epmap.size(); ++i) {
      const size_t bytes = static_cast<size_t>(sections[i] * row_bytes);
      t.KeepSend(t.PostSend(epmap[i], Slot(Kind::kGrad, slots[i], t.step()), p, bytes,
                            StrCat("send of ", name, " block ", i, " (step ", t.step(), ") to ",
                                   t.PeerName(epmap[i]))));
      p += bytes;
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
    for (size_t i = 0; i < outs.size(); ++i) {
      std::vector<int64_t> dims = shape;
      if (!dims.empty()) dims[0] = sections[i];
      outs[i]->Resize(DDim(dims));
      T* data = outs[i]->mutable_data<T>(ctx.place());
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
  void Compute(ExecutionContext& ctx) override { Connected(ctx.op()).WaitSends(); }
};

template <typename T>
class FetchBarrierKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override { Connected(ctx.op()).WaitRecvs(); }
};

// The server's loop (Paddle's listen_and_serv, synchronous mode): serve the initial parameters
// (step 0); then per step: every trainer's header, every trainer's gradient of each block (into
// Grads, block-major: Grads[i * Fanin + t] is trainer t's gradient of X[i]), the learning-rate
// block, each block's optimize block (which sums the trainers' gradients, scales by 1/Fanin and
// updates X[i]), then the new parameters to every trainer. Ends when every trainer says it is
// done; a trainer that stops while another starts a step ends the job, naming both.
template <typename T>
class ListenAndServKernel : public OpKernel {
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
    const std::vector<Tensor*> grads = ctx.MultiOutput("Grads");
    const bool async = op.Attr<int>("mode") >= 1;  // GEO's deltas are served the same way
    KEEL_ENFORCE(slots.size() == params.size() && blocks.size() == params.size() &&
                     grads.size() == params.size() * static_cast<size_t>(async ? 1 : fanin),
                 "op listen_and_serv: ", params.size(),
                 " parameter blocks need as many slots and "
                 "optimize_blocks and ",
                 async ? 1 : fanin, " Grads each");
    const int first = t.nservers();
    std::vector<int> trainers;
    for (int r = 0; r < fanin; ++r) trainers.push_back(first + r);
    const std::string me = t.PeerName(t.rank());
    Serve(t, op, params, trainers, 0);
    if (async) return ServeAsync(t, ctx, params, grads, trainers);
    std::vector<std::vector<char>> staging(static_cast<size_t>(fanin));
    for (int64_t step = 1;; ++step) {
      if (step == 3) FaultPoint("listen_and_serv_step3");  // tests: a server dies mid-training
      // Headers: who starts this step, who is done.
      std::vector<ps::Header> h(static_cast<size_t>(fanin));
      std::vector<std::unique_ptr<Transport::Transfer>> pending;
      for (int r = 0; r < fanin; ++r)
        pending.push_back(
            t.PostRecv({trainers[r]}, t.HeaderSlot(step), &h[r], sizeof(ps::Header),
                       StrCat(me, ": waiting for ", t.PeerName(trainers[r]), " to start step ",
                              step, " or stop (fleet::stop_worker)")));
      for (int r = 0; r < fanin; ++r) {
        t.Wait(*pending[r]);
        // A trainer asking for a checkpoint (between two steps): send it State, then wait for
        // its next header of this step.
        while (h[r].step == ps::kSave) {
          SendState(t, ctx, trainers[r], step);
          auto again = t.PostRecv({trainers[r]}, t.HeaderSlot(step), &h[r], sizeof(ps::Header),
                                  StrCat(me, ": waiting for ", t.PeerName(trainers[r]),
                                         " to start step ", step, " after its checkpoint"));
          t.Wait(*again);
        }
      }
      std::vector<int> done, running;
      for (int r = 0; r < fanin; ++r) (h[r].step == ps::kDone ? done : running).push_back(r);
      if (running.empty()) return;
      if (!done.empty()) {
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
      // Gradients: for each block, Fanin receives from any trainer.
      for (size_t i = 0; i < params.size(); ++i) {
        const size_t bytes = params[i]->nbytes();
        pending.clear();
        for (int r = 0; r < fanin; ++r) {
          staging[r].resize(bytes);
          pending.push_back(
              t.PostRecv(trainers, Slot(Kind::kGrad, slots[i], step), staging[r].data(), bytes,
                         StrCat(me, ": step ", step, "'s gradients of ", op.Input("X")[i])));
        }
        std::vector<bool> got(static_cast<size_t>(fanin), false);
        for (int r = 0; r < fanin; ++r) {
          const int from = t.Wait(*pending[r]) - first;
          KEEL_ENFORCE(from >= 0 && from < fanin && !got[from], me, ": step ", step,
                       ": a second gradient of ", op.Input("X")[i], " from trainer ", from);
          got[from] = true;
          Tensor* g = grads[i * fanin + from];
          g->Resize(params[i]->dims());
          std::memcpy(g->mutable_data<T>(ctx.place()), staging[r].data(), bytes);
        }
      }
      if (lr_block >= 0) ctx.RunBlock(lr_block);
      for (int b : blocks) ctx.RunBlock(b);
      Serve(t, op, params, trainers, step);
    }
  }

 private:
  // Asynchronous mode: whichever trainer's header comes next, its step is served alone: its
  // gradient of each block (Grads[i]), the learning-rate block, the optimize blocks (one update
  // with this trainer's gradient), its new parameters. No trainer waits for another; the loop
  // ends once every trainer has stopped (in any order, after any number of steps).
  static void ServeAsync(Transport& t, ExecutionContext& ctx,
                         const std::vector<const Tensor*>& params,
                         const std::vector<Tensor*>& grads, std::vector<int> live) {
    const OpDesc& op = ctx.op();
    const auto& slots = op.Attr<std::vector<int>>("slots");
    const auto& blocks = op.Attr<std::vector<int>>("optimize_blocks");
    const int lr_block = op.Attr<int>("lr_decay_block_id");
    KEEL_ENFORCE(grads.size() == params.size(), "op listen_and_serv (async): ", params.size(),
                 " parameter blocks need one Grads each, got ", grads.size());
    const std::string me = t.PeerName(t.rank());
    // Replies to each trainer are posted, not waited for: a trainer takes them only once every
    // server took its step's gradients, and another server may be busy replying to another
    // trainer (waiting here would close a cycle). They are waited for before the next reply to
    // the same trainer (which by then has them) and at the end.
    std::map<int, std::vector<std::unique_ptr<Transport::Transfer>>> replies;
    auto settle = [&](int trainer) {
      for (auto& r : replies[trainer]) t.Wait(*r);
      replies[trainer].clear();
    };
    int64_t served = 0;
    while (!live.empty()) {
      if (served == 2 * static_cast<int64_t>(t.ntrainers()))
        FaultPoint("listen_and_serv_step3");  // tests: a server dies mid-training
      ps::Header h;
      auto head = t.PostRecv(live, t.HeaderSlot(0), &h, sizeof(h),
                             StrCat(me, ": waiting for a trainer to start a step or stop"));
      const int from = t.Wait(*head);
      settle(from);
      if (h.step == ps::kDone) {
        live.erase(std::find(live.begin(), live.end(), from));
        continue;
      }
      if (h.step == ps::kSave) {
        replies[from] = PostState(t, ctx, from, h.steps + 1);
        continue;
      }
      std::vector<std::unique_ptr<Transport::Transfer>> pending;
      for (size_t i = 0; i < params.size(); ++i) {
        grads[i]->Resize(params[i]->dims());
        pending.push_back(t.PostRecv({from}, Slot(Kind::kGrad, slots[i], h.step),
                                     grads[i]->mutable_data<T>(ctx.place()), params[i]->nbytes(),
                                     StrCat(me, ": ", t.PeerName(from), "'s gradient of ",
                                            op.Input("X")[i], " (its step ", h.step, ")")));
      }
      for (auto& p : pending) t.Wait(*p);
      if (lr_block >= 0) ctx.RunBlock(lr_block);
      for (int b : blocks) ctx.RunBlock(b);
      replies[from] = PostServe(t, op, params, {from}, h.step);
      ++served;
    }
  }

  static void SendState(Transport& t, ExecutionContext& ctx, int trainer, int64_t step) {
    for (auto& s : PostState(t, ctx, trainer, step)) t.Wait(*s);
  }

  static std::vector<std::unique_ptr<Transport::Transfer>> PostState(Transport& t,
                                                                     ExecutionContext& ctx,
                                                                     int trainer, int64_t step) {
    const std::vector<const Tensor*> state = ctx.MultiInput("State");
    std::vector<std::unique_ptr<Transport::Transfer>> sends;
    for (size_t i = 0; i < state.size(); ++i)
      sends.push_back(t.PostSend(trainer, Slot(Kind::kState, static_cast<int>(i), step),
                                 state[i]->raw_data(), state[i]->nbytes(),
                                 StrCat(t.PeerName(t.rank()), ": ", ctx.op().Input("State")[i],
                                        " for a checkpoint to ", t.PeerName(trainer))));
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
    const auto& slots = op.Attr<std::vector<int>>("slots");
    std::vector<std::unique_ptr<Transport::Transfer>> sends;
    for (size_t i = 0; i < params.size(); ++i)
      for (int r : trainers)
        sends.push_back(t.PostSend(r, Slot(Kind::kParam, slots[i], step), params[i]->raw_data(),
                                   params[i]->nbytes(),
                                   StrCat(t.PeerName(t.rank()), ": ", op.Input("X")[i],
                                          " after step ", step, " to ", t.PeerName(r))));
    return sends;
  }
};

// GEO (Paddle's GeoCommunicator; transpiler/ps_pass.h): every k_steps-th run, for each block of
// each parameter, sends delta = (Param - Old) / trainers to its server (which adds it), receives
// the server's block into Param and sets Old = Param. Other runs do nothing. The runs are counted
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
        t.KeepRecv(t.PostRecv({epmap[b]}, Slot(Kind::kParam, slots[b], t.step()), cur + at,
                              n * sizeof(T),
                              StrCat("GEO pull of ", op.Input("Param")[p], " block ", i, " (push ",
                                     t.step(), ") from ", t.PeerName(epmap[b]))));
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
        .Attr<std::vector<std::string>>("send_varnames", {}, "the blocks' names on the servers"));
KEEL_REGISTER_CPU_KERNEL(send, PsSendKernel, float, double);

[[maybe_unused]] static OpSchema& keel_schema_recv =
    BlockAttrs(OpRegistry::Register("recv")
                   .Doc("Receives each Out block from its server (posted; fetch_barrier waits): "
                        "the server's values after the trainer's latest step (startup: the "
                        "initial values)")
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
    .InputList("X", "the sent gradients (documentation)")
    .Attr<int>("pserver_num", 1, "servers in the job", Positive)
    .Barrier("every send of the step must have been posted before it waits")
    .NotCapturable("waits for the network");
KEEL_REGISTER_CPU_KERNEL(send_barrier, SendBarrierKernel, float);

KEEL_REGISTER_OP(fetch_barrier)
    .Doc("Waits until every block the recv ops posted has arrived")
    .InputList("X", "the received blocks (documentation)")
    .Attr<int>("pserver_num", 1, "servers in the job", Positive)
    .Barrier("the received blocks are read only after it")
    .NotCapturable("waits for the network");
KEEL_REGISTER_CPU_KERNEL(fetch_barrier, FetchBarrierKernel, float);

KEEL_REGISTER_OP(listen_and_serv)
    .Doc(
        "A parameter server's loop (synchronous): serves X, merges the trainers' gradients "
        "into Grads, runs the optimize blocks, until every trainer stops")
    .InputList("X", "this server's parameter blocks")
    .InputList("State",
               "what else it holds (learning rate, optimizer state blocks), sent to a trainer "
               "that asks for a checkpoint")
    .OutputList("Grads", "per block, each trainer's gradient (block-major)")
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
