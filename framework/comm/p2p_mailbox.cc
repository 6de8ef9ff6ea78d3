// Point-to-point transfers of CPU rings (Communicator::Send / Recv) through the job's store.
//
// A send writes one store key, "<prefix><src>to<dst>/t<tag>/<n>", holding a small header (dtype,
// rank, dims) and the tensor's bytes, and returns: sends are buffered, so a schedule in which both
// sides send before they receive (1F1B's steady state) cannot deadlock. The receive waits for
// exactly that key, so a transfer matches only the send of the same peer, tag and ordinal, and
// deletes it. The wait goes to the store in slices (the store client serves one request at a
// time, and the sends of other threads must not queue behind a long wait); each slice gives up at
// once when the peer's store connection has closed (its process died), naming it.
#include <cstring>
#include <string>
#include <thread>

#include "framework/comm/communicator.h"
#include "framework/comm/store.h"
#include "framework/error.h"

namespace keel {

namespace {

constexpr uint32_t kMailboxMagic = 0x6b703270;  // "kp2p"

void PutU32(std::string* s, uint32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); }
void PutI64(std::string* s, int64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }

std::string Key(const std::string& prefix, int src, int dst, int tag, uint64_t n) {
  return StrCat(prefix, src, "to", dst, "/t", tag, "/", n);
}

}  // namespace

void Communicator::UseStoreMailbox(StoreClient* store, std::string prefix,
                                   std::chrono::milliseconds timeout) {
  mailbox_ = store;
  mailbox_prefix_ = std::move(prefix);
  mailbox_timeout_ = timeout;
}

std::string Communicator::P2PWhere(const char* what, int peer, int tag, uint64_t n) const {
  return StrCat(what, " rank ", peer, " (tag ", tag, ", transfer #", n + 1, ") on ", name_,
                " (rank ", rank_, " of ", nranks_, ")");
}

uint64_t Communicator::NextP2P(bool send, int peer, int tag) {
  KEEL_ENFORCE(peer >= 0 && peer < nranks_ && peer != rank_, send ? "send_v2" : "recv_v2",
               ": peer ", peer, " is not another rank of ", name_, " (rank ", rank_, " of ",
               nranks_, ")");
  std::lock_guard<std::mutex> lk(p2p_mu_);
  return p2p_count_[std::make_tuple(send, peer, tag)]++;
}

void Communicator::Send(const Tensor& t, int peer, int tag) {
  MailboxSend(t, peer, tag, NextP2P(true, peer, tag));
}

void Communicator::Recv(Tensor* t, int peer, int tag) {
  MailboxRecv(t, peer, tag, NextP2P(false, peer, tag));
}

void Communicator::MailboxSend(const Tensor& t, int peer, int tag, uint64_t n) {
  KEEL_ENFORCE(mailbox_ != nullptr, P2PWhere("send to", peer, tag, n), ": the ", backend(),
               " backend has no point-to-point transfers");
  KEEL_ENFORCE(t.place().is_cpu(), P2PWhere("send to", peer, tag, n),
               ": a CPU ring cannot send a tensor on ", t.place().str());
  KEEL_ENFORCE(t.nbytes() + 256 < kMaxFrameBytes, P2PWhere("send to", peer, tag, n), ": ",
               t.nbytes(), " bytes is over the store's frame limit of ", kMaxFrameBytes,
               " (use smaller micro-batches)");
  CommTimer timer(&comm_ns_);
  std::string v;
  v.reserve(16 + 8 * t.dims().size() + t.nbytes());
  PutU32(&v, kMailboxMagic);
  PutU32(&v, static_cast<uint32_t>(t.dtype()));
  PutU32(&v, static_cast<uint32_t>(t.dims().size()));
  for (int64_t d : t.dims().vec()) PutI64(&v, d);
  if (t.nbytes() > 0) v.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  mailbox_->Set(Key(mailbox_prefix_, rank_, peer, tag, n), v);
}

void Communicator::MailboxRecv(Tensor* t, int peer, int tag, uint64_t n) {
  KEEL_ENFORCE(mailbox_ != nullptr, P2PWhere("receive from", peer, tag, n), ": the ", backend(),
               " backend has no point-to-point transfers");
  CommTimer timer(&comm_ns_);
  const std::string key = Key(mailbox_prefix_, peer, rank_, tag, n);
  const auto deadline = std::chrono::steady_clock::now() + mailbox_timeout_;
  std::string v;
  for (;;) {
    if (mailbox_->Check(key)) {
      v = mailbox_->Get(key);
      break;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    KEEL_ENFORCE(left.count() > 0, P2PWhere("receive from", peer, tag, n), ": no send arrived in ",
                 mailbox_timeout_.count() / 1000.0, " s (--comm_timeout_s; did rank ", peer,
                 " stop, or send under another tag or in another order?)");
    try {
      v = mailbox_->GetUnlessPeerGone(key, std::min(left, std::chrono::milliseconds(100)));
      break;
    } catch (const Error& e) {
      const std::string why = e.what();
      KEEL_ENFORCE(why.find("stopped waiting") == std::string::npos,
                   P2PWhere("receive from", peer, tag, n), ": ", why);
    }
  }
  mailbox_->Delete(key);
  const char* p = v.data();
  auto u32 = [&] {
    uint32_t x;
    std::memcpy(&x, p, 4);
    p += 4;
    return x;
  };
  KEEL_ENFORCE(v.size() >= 12, P2PWhere("receive from", peer, tag, n), ": malformed message");
  KEEL_ENFORCE(u32() == kMailboxMagic, P2PWhere("receive from", peer, tag, n),
               ": malformed message");
  const DType dtype = static_cast<DType>(u32());
  const uint32_t rank = u32();
  KEEL_ENFORCE(v.size() >= 12 + 8 * size_t{rank}, P2PWhere("receive from", peer, tag, n),
               ": malformed message");
  std::vector<int64_t> dims(rank);
  for (auto& d : dims) {
    std::memcpy(&d, p, 8);
    p += 8;
  }
  t->Resize(DDim(dims));
  t->mutable_data(dtype, CPUPlace());
  KEEL_ENFORCE(static_cast<size_t>(v.data() + v.size() - p) == t->nbytes(),
               P2PWhere("receive from", peer, tag, n), ": ", v.data() + v.size() - p,
               " bytes for a tensor of ", t->nbytes());
  if (t->nbytes() > 0) std::memcpy(t->raw_data(), p, t->nbytes());
}

}  // namespace keel
